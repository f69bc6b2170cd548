//! Turns `--model-id` into a local model folder and a served name: the embedded default, a folder
//! on disk, or a Hugging Face id (`ORG/NAME[@REVISION]`) found in the local HF cache, or else named
//! for download (`download.rs`). Nothing here touches the network.

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
    /// A Hub id the cache lacks (at that revision): `decision-server download` fetches it.
    NeedsDownload(HubModel),
}

/// A model on the Hugging Face Hub: its repository id and the revision asked for (a branch, tag or commit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubModel {
    pub repo: String,
    pub revision: Option<String>,
    /// The cache folder its snapshots go to (`{hub}/models--{org}--{name}`).
    pub cache_repo: PathBuf,
}

impl HubModel {
    /// `org/name@rev` as written in logs and errors (`@main` when no revision was named).
    pub fn display(&self) -> String {
        format!(
            "{}@{}",
            self.repo,
            self.revision.as_deref().unwrap_or("main")
        )
    }
}

/// Whether `HF_HUB_OFFLINE` forbids downloads, read as huggingface_hub reads it.
pub fn hub_offline(env: impl Fn(&str) -> Option<OsString>) -> bool {
    env("HF_HUB_OFFLINE").is_some_and(|v| {
        matches!(
            v.to_string_lossy().trim().to_ascii_uppercase().as_str(),
            "1" | "ON" | "YES" | "TRUE"
        )
    })
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ModelError {
    #[error("model folder {dir} has no config.json; is it a Hugging Face model folder?")]
    MissingConfig { dir: PathBuf },
    #[error("--model-id {id}: no such directory")]
    NoSuchDirectory { id: String },
    #[error(
        "--model-id {id}: not a local directory ({}), and there is no Hugging Face cache to find it in or \
         download it to: none of HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME, HOME is set",
        local.display()
    )]
    NoHubCache { id: String, local: PathBuf },
    #[error(
        "--model-id {id}: not in the Hugging Face cache ({}), and HF_HUB_OFFLINE=1 forbids downloading it; unset it \
         (make exports it) or download the model first",
        cache_repo.display()
    )]
    OfflineNotCached { id: String, cache_repo: PathBuf },
    #[error("--model-id {id} names revision {in_id:?} but --revision says {flag:?}")]
    ConflictingRevision {
        id: String,
        in_id: String,
        flag: String,
    },
    #[error("--revision {revision} applies to Hugging Face ids (ORG/NAME), not to {what}")]
    RevisionNotApplicable { revision: String, what: String },
    #[error("--model-id {id}: an empty revision after '@'")]
    EmptyRevision { id: String },
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

/// Resolves `--model-id` and `--revision` (or their absence) against the launcher cache and the HF hub cache.
pub fn resolve(
    model_id: Option<&str>,
    revision: Option<&str>,
    cache_dir: &Path,
    hub_cache: Option<&Path>,
) -> Result<Resolution, ModelError> {
    let not_for = |what: String| {
        revision.map_or(Ok(()), |revision| {
            Err(ModelError::RevisionNotApplicable {
                revision: revision.to_owned(),
                what,
            })
        })
    };
    let Some(id) = model_id else {
        not_for(format!("the embedded default ({DEFAULT_MODEL_NAME})"))?;
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
        not_for(format!("the local folder {id}"))?;
        return local_folder(as_path).map(Resolution::Ready);
    }
    // A revision may hold slashes (`refs/pr/1`); the repository part decides whether a path was meant.
    if looks_like_path(id.split('@').next().unwrap_or(id)) {
        return Err(ModelError::NoSuchDirectory { id: id.to_owned() });
    }
    let (repo, revision) = split_revision(id, revision)?;
    hub_snapshot(repo, revision, hub_cache)
}

/// `org/name@rev` → (`org/name`, `rev`); `--revision` may repeat the id's revision, not contradict it.
fn split_revision<'a>(
    id: &'a str,
    flag: Option<&'a str>,
) -> Result<(&'a str, Option<&'a str>), ModelError> {
    let Some((repo, in_id)) = id.split_once('@') else {
        return Ok((id, flag));
    };
    if in_id.is_empty() {
        return Err(ModelError::EmptyRevision { id: id.to_owned() });
    }
    match flag {
        Some(flag) if flag != in_id => Err(ModelError::ConflictingRevision {
            id: id.to_owned(),
            in_id: in_id.to_owned(),
            flag: flag.to_owned(),
        }),
        _ => Ok((repo, Some(in_id))),
    }
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

/// `{hub}/models--{org}--{name}/snapshots/{refs/REV}` (or `snapshots/REV` for a commit); without a revision
/// `refs/main`, else the newest snapshot with a config.json. None found: the model needs a download.
fn hub_snapshot(
    repo_id: &str,
    revision: Option<&str>,
    hub_cache: Option<&Path>,
) -> Result<Resolution, ModelError> {
    let Some(hub) = hub_cache else {
        // No cache huggingface_hub would write to either: nothing to download into.
        let local = std::env::current_dir()
            .map_or_else(|_| PathBuf::from(repo_id), |cwd| cwd.join(repo_id));
        return Err(ModelError::NoHubCache {
            id: repo_id.to_owned(),
            local,
        });
    };
    let repo = hub.join(format!("models--{}", repo_id.replace('/', "--")));
    let model = |dir: PathBuf| {
        Resolution::Ready(Model {
            dir,
            served_name: repo_id.to_owned(),
        })
    };
    let snapshots = repo.join("snapshots");
    let complete = |dir: &PathBuf| dir.join("config.json").is_file();
    let by_ref = |name: &str| {
        std::fs::read_to_string(repo.join("refs").join(name))
            .ok()
            .map(|rev| snapshots.join(rev.trim()))
            .filter(complete)
    };
    let download = || {
        Ok(Resolution::NeedsDownload(HubModel {
            repo: repo_id.to_owned(),
            revision: revision.map(str::to_owned),
            cache_repo: repo.clone(),
        }))
    };
    if let Some(revision) = revision {
        // A branch or tag has a ref file; a commit is a snapshot folder's own name.
        let found = by_ref(revision).or_else(|| {
            Some(snapshots.join(revision)).filter(|dir| !revision.contains('/') && complete(dir))
        });
        return found.map_or_else(download, |dir| Ok(model(dir)));
    }
    if let Some(dir) = by_ref("main") {
        return Ok(model(dir));
    }

    let newest = std::fs::read_dir(&snapshots)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .filter(complete)
        .max_by_key(|dir| {
            let modified = dir
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            (modified, dir.clone())
        });
    newest.map_or_else(download, |dir| Ok(model(dir)))
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
        let resolved = resolve(Some(id), None, tmp.path(), None).expect("resolves");
        assert_eq!(
            resolved,
            Resolution::Ready(Model {
                dir: dir.clone(),
                served_name: "my-model".into()
            })
        );

        let with_slash = format!("{id}/");
        let Resolution::Ready(model) =
            resolve(Some(&with_slash), None, tmp.path(), None).expect("resolves")
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
        let err = resolve(dir.to_str(), None, tmp.path(), None).expect_err("no config.json");
        assert_eq!(err, ModelError::MissingConfig { dir: dir.clone() });
        assert!(err.to_string().contains("config.json"));
        assert!(err.to_string().contains("weights-only"));
    }

    #[test]
    fn missing_path_is_not_looked_up_in_the_hub() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let missing = tmp.path().join("nope");
        let err =
            resolve(missing.to_str(), None, tmp.path(), Some(tmp.path())).expect_err("missing");
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
            None,
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
        let Resolution::Ready(model) = resolve(
            Some("org/name"),
            None,
            Path::new("/unused"),
            Some(hub.path()),
        )
        .expect("found") else {
            panic!("hub models never need an export");
        };
        assert_eq!(model.dir, snapshot);
    }

    #[test]
    fn hub_repo_without_usable_snapshot_needs_a_download() {
        // A download cut before its config.json (written last) left a snapshot without one.
        let hub = tempfile::tempdir().expect("tempdir");
        let repo = hub.path().join("models--org--name");
        fs::create_dir_all(repo.join("snapshots").join("x")).expect("mkdir");
        let resolved = resolve(
            Some("org/name"),
            None,
            Path::new("/unused"),
            Some(hub.path()),
        )
        .expect("resolves");
        assert_eq!(
            resolved,
            Resolution::NeedsDownload(HubModel {
                repo: "org/name".into(),
                revision: None,
                cache_repo: repo,
            })
        );
    }

    #[test]
    fn unknown_hub_id_needs_a_download_into_the_hub_cache() {
        let hub = tempfile::tempdir().expect("tempdir");
        let Resolution::NeedsDownload(model) = resolve(
            Some("org/absent@v2"),
            None,
            Path::new("/unused"),
            Some(hub.path()),
        )
        .expect("resolves") else {
            panic!("not in the cache")
        };
        assert_eq!(model.repo, "org/absent");
        assert_eq!(model.revision.as_deref(), Some("v2"));
        assert_eq!(model.display(), "org/absent@v2");
        assert_eq!(model.cache_repo, hub.path().join("models--org--absent"));
        let err = resolve(Some("org/absent"), None, Path::new("/unused"), None)
            .expect_err("no cache at all");
        assert!(matches!(err, ModelError::NoHubCache { .. }), "{err}");
        assert!(err.to_string().contains("org/absent"), "{err}");
    }

    #[test]
    fn a_revision_picks_its_ref_or_its_commit_and_never_another_snapshot() {
        let hub = tempfile::tempdir().expect("tempdir");
        let repo = hub.path().join("models--org--name");
        let main = "a".repeat(40);
        let old = "b".repeat(40);
        hf_folder(&repo.join("snapshots").join(&main));
        hf_folder(&repo.join("snapshots").join(&old));
        fs::create_dir_all(repo.join("refs")).expect("mkdir refs");
        fs::write(repo.join("refs").join("main"), &main).expect("write ref");
        fs::write(repo.join("refs").join("v1"), &old).expect("write ref");
        let dir_of = |id: &str, flag: Option<&str>| match resolve(
            Some(id),
            flag,
            Path::new("/unused"),
            Some(hub.path()),
        )
        .expect("resolves")
        {
            Resolution::Ready(model) => {
                assert_eq!(
                    model.served_name, "org/name",
                    "the revision is not in the name"
                );
                Some(model.dir)
            }
            Resolution::NeedsDownload(model) => {
                assert_eq!(model.repo, "org/name");
                None
            }
            other => panic!("{other:?}"),
        };
        let snapshot = |rev: &str| Some(repo.join("snapshots").join(rev));
        assert_eq!(dir_of("org/name", None), snapshot(&main));
        assert_eq!(dir_of("org/name@v1", None), snapshot(&old));
        assert_eq!(dir_of("org/name", Some("v1")), snapshot(&old));
        assert_eq!(dir_of("org/name@v1", Some("v1")), snapshot(&old));
        assert_eq!(dir_of(&format!("org/name@{old}"), None), snapshot(&old));
        assert_eq!(
            dir_of("org/name@v2", None),
            None,
            "an unknown tag is downloaded"
        );
        assert_eq!(dir_of("org/name", Some("../../x")), None);
        fs::create_dir_all(repo.join("refs").join("refs").join("pr")).expect("mkdir");
        fs::write(repo.join("refs").join("refs").join("pr").join("1"), &old).expect("ref");
        assert_eq!(
            dir_of("org/name@refs/pr/1", None),
            snapshot(&old),
            "a pull request's ref"
        );
        assert_eq!(dir_of("org/name@refs/pr/2", None), None);
    }

    #[test]
    fn a_revision_that_contradicts_or_does_not_apply_is_refused() {
        let hub = tempfile::tempdir().expect("tempdir");
        let err = resolve(
            Some("org/name@v1"),
            Some("v2"),
            Path::new("/u"),
            Some(hub.path()),
        )
        .expect_err("two revisions");
        assert_eq!(
            err.to_string(),
            "--model-id org/name@v1 names revision \"v1\" but --revision says \"v2\""
        );
        let err =
            resolve(Some("org/name@"), None, Path::new("/u"), Some(hub.path())).expect_err("empty");
        assert!(matches!(err, ModelError::EmptyRevision { .. }), "{err}");
        let err = resolve(None, Some("v1"), Path::new("/u"), None).expect_err("default model");
        assert!(err.to_string().contains("SmolLM2-135M-Instruct"), "{err}");
        let folder = tempfile::tempdir().expect("tempdir");
        hf_folder(folder.path());
        let err = resolve(folder.path().to_str(), Some("v1"), Path::new("/u"), None)
            .expect_err("local folder");
        assert!(
            matches!(err, ModelError::RevisionNotApplicable { .. }),
            "{err}"
        );
    }

    #[test]
    fn hf_hub_offline_is_read_as_huggingface_hub_reads_it() {
        let with = |value: &'static str| move |_: &str| Some(OsString::from(value));
        for on in ["1", "true", "TRUE", "yes", "On"] {
            assert!(hub_offline(with(on)), "{on}");
        }
        for off in ["0", "", "false", "no"] {
            assert!(!hub_offline(with(off)), "{off}");
        }
        assert!(!hub_offline(|_: &str| None));
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
            resolve(None, None, cache.path(), None),
            Ok(Resolution::NeedsExport(expected.clone()))
        );

        hf_folder(&dir);
        fs::write(dir.join("tokenizer.json"), "{}").expect("write tokenizer");
        assert_eq!(
            resolve(None, None, cache.path(), None),
            Ok(Resolution::NeedsExport(expected.clone())),
            "no weights yet"
        );

        fs::write(dir.join("model.safetensors"), b"").expect("write weights");
        assert_eq!(
            resolve(None, None, cache.path(), None),
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
