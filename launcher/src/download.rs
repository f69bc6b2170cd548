//! `--model-id ORG/NAME[@REVISION]` missing from the Hugging Face cache: `decision-server download` fetches the files a
//! server loads into it, its progress lines re-emitted live; refused when `HF_HUB_OFFLINE` is set.

use std::path::Path;

use crate::child::{ChildExit, ChildSpec, Children, SpawnError};
use crate::model::{HubModel, ModelError};

#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    #[error(transparent)]
    Spawn(#[from] SpawnError),
    /// `HF_HUB_OFFLINE` forbids the download (`ModelError::OfflineNotCached`).
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The child's exit carries its last stderr lines, where it names the repository and the reason.
    #[error("downloading {model} failed: {exit}")]
    Failed { model: String, exit: ChildExit },
    #[error(
        "`decision-server download {model}` succeeded but {} holds no snapshot with a config.json for it",
        cache_repo.display()
    )]
    NotInCache {
        model: String,
        cache_repo: std::path::PathBuf,
    },
}

/// `decision-server download ORG/NAME [--revision REV]`: the environment (HF_TOKEN, HF_ENDPOINT, HF_HUB_CACHE) is
/// the launcher's own, which is where the user put them; the API key is not the Hub's business.
pub fn spec(program: &Path, model: &HubModel) -> ChildSpec {
    let mut args = vec!["download".into(), model.repo.clone().into()];
    if let Some(revision) = &model.revision {
        args.extend(["--revision".into(), revision.into()]);
    }
    ChildSpec {
        name: "model download".into(),
        program: program.to_owned(),
        args,
        env: Vec::new(),
        env_remove: vec!["API_KEY".into()],
        span: tracing::info_span!("download", model = %model.display()),
    }
}

/// Refuses under `HF_HUB_OFFLINE`, else runs the download to its end in `children` (a shutdown signal stops it
/// like any child; files already fetched stay in the cache and the next start goes on from them).
pub async fn run(
    children: &mut Children,
    program: &Path,
    model: &HubModel,
    offline: bool,
) -> Result<(), DownloadError> {
    if offline {
        return Err(ModelError::OfflineNotCached {
            id: model.display(),
            cache_repo: model.cache_repo.clone(),
        }
        .into());
    }
    tracing::info!(
        model = %model.display(),
        cache = %model.cache_repo.display(),
        "not in the Hugging Face cache: downloading it"
    );
    let exit = children
        .run_to_end(spec(program, model))
        .await
        .map_err(DownloadError::from)?;
    if !exit.exit.success() {
        return Err(DownloadError::Failed {
            model: model.display(),
            exit,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;
    use std::path::PathBuf;

    /// A stand-in `decision-server` running `script` with the launcher's arguments.
    fn fake_server(dir: &Path, script: &str) -> PathBuf {
        let program = dir.join("decision-server");
        std::fs::write(&program, format!("#!/bin/sh\n{script}\n")).expect("write");
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        program
    }

    fn hub_model(dir: &Path, revision: Option<&str>) -> HubModel {
        HubModel {
            repo: "org/tiny".into(),
            revision: revision.map(str::to_owned),
            cache_repo: dir.join("models--org--tiny"),
        }
    }

    #[tokio::test]
    async fn the_download_gets_the_repo_and_its_revision() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let args = tmp.path().join("args");
        let program = fake_server(
            tmp.path(),
            &format!(
                "echo \"$@\" > {}; echo 'downloading org/tiny@v1: 5.0 MB of 10.0 MB (50 %)' >&2",
                args.display()
            ),
        );
        let mut children = Children::new();
        run(
            &mut children,
            &program,
            &hub_model(tmp.path(), Some("v1")),
            false,
        )
        .await
        .expect("download succeeds");
        assert_eq!(
            std::fs::read_to_string(&args).expect("args"),
            "download org/tiny --revision v1\n"
        );
        run(&mut children, &program, &hub_model(tmp.path(), None), false)
            .await
            .expect("download succeeds");
        assert_eq!(
            std::fs::read_to_string(&args).expect("args"),
            "download org/tiny\n"
        );
    }

    #[tokio::test]
    async fn a_failed_download_reports_the_repo_and_the_reason() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let program = fake_server(
            tmp.path(),
            "echo 'decision-server download: org/tiny: no such model on https://huggingface.co (HTTP 404)' >&2; exit 3",
        );
        let mut children = Children::new();
        let err = run(&mut children, &program, &hub_model(tmp.path(), None), false)
            .await
            .expect_err("download fails");
        let message = err.to_string();
        assert!(matches!(err, DownloadError::Failed { .. }), "{message}");
        assert!(
            message.starts_with("downloading org/tiny@main failed"),
            "{message}"
        );
        assert!(
            message.contains("no such model on https://huggingface.co (HTTP 404)"),
            "{message}"
        );
    }

    #[tokio::test]
    async fn offline_nothing_runs_and_the_error_says_why() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let ran = tmp.path().join("ran");
        let program = fake_server(tmp.path(), &format!("touch {}", ran.display()));
        let mut children = Children::new();
        let err = run(
            &mut children,
            &program,
            &hub_model(tmp.path(), Some("v1")),
            true,
        )
        .await
        .expect_err("offline");
        assert!(!ran.exists(), "nothing may be started offline");
        let message = err.to_string();
        assert!(message.contains("org/tiny@v1"), "{message}");
        assert!(
            message.contains("HF_HUB_OFFLINE=1 forbids downloading it"),
            "{message}"
        );
        assert!(message.contains("models--org--tiny"), "{message}");
    }
}
