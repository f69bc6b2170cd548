//! Turns `--model-id` into a local model folder and a served name: the embedded default, a folder
//! on disk, or a Hugging Face id found offline in the local HF cache. Nothing here touches the network.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The model every install can serve: converted once from the GGUF shipped with the shard's package.
pub const DEFAULT_MODEL_NAME: &str = "SmolLM2-135M-Instruct";

/// A model folder the shard and router can load, with the name clients will use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model {
    pub dir: PathBuf,
    pub served_name: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// The folder holds a loadable model.
    Ready(Model),
    /// The embedded default has not been converted into `dir` yet (or a conversion was interrupted).
    NeedsExport(Model),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ModelError {
    #[error("model folder {dir} has no config.json; is it a Hugging Face model folder?")]
    MissingConfig { dir: PathBuf },
    #[error("--model-id {id}: no such directory")]
    NoSuchDirectory { id: String },
    #[error(
        "--model-id {id}: not found (models are only looked up offline); looked in:\n  {} (as a local directory)\n  {}",
        local.display(),
        hub_repo.as_ref().map_or_else(|| "no Hugging Face cache: none of HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME, HOME is set".to_owned(), |p| format!("{} (Hugging Face cache)", p.display()))
    )]
    NotFound {
        id: String,
        local: PathBuf,
        hub_repo: Option<PathBuf>,
    },
    #[error(
        "--model-id {id}: found {repo} in the Hugging Face cache, but it has no snapshot with a config.json"
    )]
    NoSnapshot { id: String, repo: PathBuf },
}

/// Where the Hugging Face hub cache lives, following huggingface_hub's own precedence:
/// `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `{$XDG_CACHE_HOME or ~/.cache}/huggingface/hub`.
pub fn hub_cache_dir(env: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    let var = |name: &str| env(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = var("HF_HUB_CACHE") {
        return Some(dir);
    }
    if let Some(home) = var("HF_HOME") {
        return Some(home.join("hub"));
    }
    let cache_root =
        var("XDG_CACHE_HOME").or_else(|| var("HOME").map(|home| home.join(".cache")))?;
    Some(cache_root.join("huggingface").join("hub"))
}

/// Resolves `--model-id` (or its absence) against the launcher cache and the HF hub cache.
pub fn resolve(
    model_id: Option<&str>,
    cache_dir: &Path,
    hub_cache: Option<&Path>,
) -> Result<Resolution, ModelError> {
    let Some(id) = model_id else {
        let model = Model {
            dir: cache_dir.join("models").join(DEFAULT_MODEL_NAME),
            served_name: DEFAULT_MODEL_NAME.to_owned(),
        };
        return Ok(if is_complete_export(&model.dir) {
            Resolution::Ready(model)
        } else {
            Resolution::NeedsExport(model)
        });
    };

    let as_path = Path::new(id);
    if as_path.is_dir() {
        return local_folder(as_path).map(Resolution::Ready);
    }
    if looks_like_path(id) {
        return Err(ModelError::NoSuchDirectory { id: id.to_owned() });
    }
    hub_snapshot(id, hub_cache).map(Resolution::Ready)
}

/// A converted default needs all three parts; a half-written folder is converted again.
pub fn is_complete_export(dir: &Path) -> bool {
    let has_safetensors = std::fs::read_dir(dir)
        .map(|entries| {
            entries.flatten().any(|e| {
                e.path().extension().is_some_and(|ext| ext == "safetensors") && e.path().is_file()
            })
        })
        .unwrap_or(false);
    has_safetensors && dir.join("config.json").is_file() && dir.join("tokenizer.json").is_file()
}

fn local_folder(dir: &Path) -> Result<Model, ModelError> {
    if !dir.join("config.json").is_file() {
        return Err(ModelError::MissingConfig {
            dir: dir.to_owned(),
        });
    }
    // The served name is the folder's own name, so "./models/foo/" serves as "foo".
    let canonical = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    let served_name = canonical
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| canonical.to_string_lossy().into_owned());
    Ok(Model {
        dir: dir.to_owned(),
        served_name,
    })
}

/// An id with path syntax was meant as a folder; reporting "not in the HF cache" would mislead.
fn looks_like_path(id: &str) -> bool {
    id.starts_with('/')
        || id.starts_with('.')
        || id.starts_with('~')
        || id.ends_with('/')
        || id.matches('/').count() > 1
}

/// `{hub}/models--{org}--{name}/snapshots/{refs/main}`, else the newest snapshot with a config.json.
fn hub_snapshot(id: &str, hub_cache: Option<&Path>) -> Result<Model, ModelError> {
    let not_found = |hub_repo: Option<PathBuf>| {
        let local = std::env::current_dir().map_or_else(|_| PathBuf::from(id), |cwd| cwd.join(id));
        ModelError::NotFound {
            id: id.to_owned(),
            local,
            hub_repo,
        }
    };
    let Some(hub) = hub_cache else {
        return Err(not_found(None));
    };
    let repo = hub.join(format!("models--{}", id.replace('/', "--")));
    if !repo.is_dir() {
        return Err(not_found(Some(repo)));
    }

    let model = |dir: PathBuf| Model {
        dir,
        served_name: id.to_owned(),
    };
    let snapshots = repo.join("snapshots");
    let pinned = std::fs::read_to_string(repo.join("refs").join("main"))
        .ok()
        .map(|rev| snapshots.join(rev.trim()))
        .filter(|dir| dir.join("config.json").is_file());
    if let Some(dir) = pinned {
        return Ok(model(dir));
    }

    let newest = std::fs::read_dir(&snapshots)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .filter(|dir| dir.join("config.json").is_file())
        .max_by_key(|dir| {
            let modified = dir
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            (modified, dir.clone())
        });
    newest.map(model).ok_or_else(|| ModelError::NoSnapshot {
        id: id.to_owned(),
        repo,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn hf_folder(dir: &Path) {
        fs::create_dir_all(dir).expect("create model dir");
        fs::write(dir.join("config.json"), "{}").expect("write config");
    }

    #[test]
    fn local_folder_is_used_as_is_and_named_after_itself() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("my-model");
        hf_folder(&dir);
        let id = dir.to_str().expect("utf-8 temp path");
        let resolved = resolve(Some(id), tmp.path(), None).expect("resolves");
        assert_eq!(
            resolved,
            Resolution::Ready(Model {
                dir: dir.clone(),
                served_name: "my-model".into()
            })
        );

        let with_slash = format!("{id}/");
        let Resolution::Ready(model) =
            resolve(Some(&with_slash), tmp.path(), None).expect("resolves")
        else {
            panic!("a local folder never needs an export");
        };
        assert_eq!(model.served_name, "my-model");
    }

    #[test]
    fn local_folder_without_config_is_a_clear_error() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("weights-only");
        fs::create_dir_all(&dir).expect("mkdir");
        let err = resolve(dir.to_str(), tmp.path(), None).expect_err("no config.json");
        assert_eq!(err, ModelError::MissingConfig { dir: dir.clone() });
        assert!(err.to_string().contains("config.json"));
        assert!(err.to_string().contains("weights-only"));
    }

    #[test]
    fn missing_path_is_not_looked_up_in_the_hub() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let missing = tmp.path().join("nope");
        let err = resolve(missing.to_str(), tmp.path(), Some(tmp.path())).expect_err("missing");
        assert!(matches!(err, ModelError::NoSuchDirectory { .. }), "{err}");
    }

    #[test]
    fn hub_id_resolves_to_the_snapshot_refs_main_points_at() {
        let hub = tempfile::tempdir().expect("tempdir");
        let repo = hub.path().join("models--Qwen--Qwen3-0.6B");
        hf_folder(&repo.join("snapshots").join("aaaa"));
        hf_folder(&repo.join("snapshots").join("bbbb"));
        fs::create_dir_all(repo.join("refs")).expect("mkdir refs");
        fs::write(repo.join("refs").join("main"), "aaaa\n").expect("write ref");

        let resolved = resolve(
            Some("Qwen/Qwen3-0.6B"),
            Path::new("/unused"),
            Some(hub.path()),
        )
        .expect("found in the hub cache");
        assert_eq!(
            resolved,
            Resolution::Ready(Model {
                dir: repo.join("snapshots").join("aaaa"),
                served_name: "Qwen/Qwen3-0.6B".into(),
            })
        );
    }

    #[test]
    fn hub_id_without_refs_main_uses_the_only_snapshot() {
        let hub = tempfile::tempdir().expect("tempdir");
        let snapshot = hub
            .path()
            .join("models--org--name")
            .join("snapshots")
            .join("cafe");
        hf_folder(&snapshot);
        let Resolution::Ready(model) =
            resolve(Some("org/name"), Path::new("/unused"), Some(hub.path())).expect("found")
        else {
            panic!("hub models never need an export");
        };
        assert_eq!(model.dir, snapshot);
    }

    #[test]
    fn hub_repo_without_usable_snapshot_says_so() {
        let hub = tempfile::tempdir().expect("tempdir");
        fs::create_dir_all(
            hub.path()
                .join("models--org--name")
                .join("snapshots")
                .join("x"),
        )
        .expect("mkdir");
        let err = resolve(Some("org/name"), Path::new("/unused"), Some(hub.path()))
            .expect_err("snapshot lacks config.json");
        assert!(matches!(err, ModelError::NoSnapshot { .. }), "{err}");
    }

    #[test]
    fn unknown_hub_id_lists_where_it_looked() {
        let hub = tempfile::tempdir().expect("tempdir");
        let err = resolve(Some("org/absent"), Path::new("/unused"), Some(hub.path()))
            .expect_err("not in the cache");
        let message = err.to_string();
        assert!(message.contains("org/absent"), "{message}");
        assert!(message.contains("offline"), "{message}");
        let expected = hub.path().join("models--org--absent");
        assert!(
            message.contains(&expected.display().to_string()),
            "{message}"
        );
    }

    #[test]
    fn default_model_needs_an_export_until_all_parts_exist() {
        let cache = tempfile::tempdir().expect("tempdir");
        let dir = cache.path().join("models").join(DEFAULT_MODEL_NAME);
        let expected = Model {
            dir: dir.clone(),
            served_name: DEFAULT_MODEL_NAME.into(),
        };
        assert_eq!(
            resolve(None, cache.path(), None),
            Ok(Resolution::NeedsExport(expected.clone()))
        );

        hf_folder(&dir);
        fs::write(dir.join("tokenizer.json"), "{}").expect("write tokenizer");
        assert_eq!(
            resolve(None, cache.path(), None),
            Ok(Resolution::NeedsExport(expected.clone())),
            "no weights yet"
        );

        fs::write(dir.join("model.safetensors"), b"").expect("write weights");
        assert_eq!(
            resolve(None, cache.path(), None),
            Ok(Resolution::Ready(expected))
        );
    }

    #[test]
    fn hub_cache_dir_follows_huggingface_precedence() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        assert_eq!(
            hub_cache_dir(env(&[
                ("HF_HUB_CACHE", "/hub"),
                ("HF_HOME", "/hf"),
                ("HOME", "/home/u")
            ])),
            Some(PathBuf::from("/hub"))
        );
        assert_eq!(
            hub_cache_dir(env(&[("HF_HOME", "/hf"), ("HOME", "/home/u")])),
            Some(PathBuf::from("/hf/hub"))
        );
        assert_eq!(
            hub_cache_dir(env(&[("XDG_CACHE_HOME", "/xdg"), ("HOME", "/home/u")])),
            Some(PathBuf::from("/xdg/huggingface/hub"))
        );
        assert_eq!(
            hub_cache_dir(env(&[("HOME", "/home/u")])),
            Some(PathBuf::from("/home/u/.cache/huggingface/hub"))
        );
        assert_eq!(hub_cache_dir(env(&[])), None);
    }
}
