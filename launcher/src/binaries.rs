//! Finds the programs the launcher starts: next to the launcher's own executable first (an install
//! puts all three side by side), then on PATH, so a stray older copy on PATH never wins.

use std::ffi::OsStr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

pub const SHARD_BINARY: &str = "decision-server";
pub const ROUTER_BINARY: &str = "decision-router";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "cannot find the `{name}` executable next to the launcher ({}) or on PATH; {hint}",
    beside.as_ref().map_or_else(|| "unknown location".to_owned(), |d| d.display().to_string())
)]
pub struct MissingBinary {
    pub name: &'static str,
    pub beside: Option<PathBuf>,
    pub hint: &'static str,
}

/// The launcher's own folder, where an install also puts the library it preloads into the shards.
pub fn own_dir() -> PathBuf {
    beside_launcher().unwrap_or_default()
}

fn beside_launcher() -> Option<PathBuf> {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf))
}

/// The launcher's own folder, then each PATH entry.
pub fn locate(name: &'static str, hint: &'static str) -> Result<PathBuf, MissingBinary> {
    let beside = beside_launcher();
    let path = std::env::var_os("PATH").unwrap_or_default();
    find_in(name, beside.as_deref(), &path).ok_or(MissingBinary { name, beside, hint })
}

fn find_in(name: &str, beside: Option<&Path>, path: &OsStr) -> Option<PathBuf> {
    beside
        .into_iter()
        .map(Path::to_path_buf)
        .chain(std::env::split_paths(path))
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn write_program(dir: &Path, name: &str, mode: u32) -> PathBuf {
        fs::create_dir_all(dir).expect("mkdir");
        let path = dir.join(name);
        fs::write(&path, "#!/bin/sh\n").expect("write");
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).expect("chmod");
        path
    }

    #[test]
    fn beside_the_launcher_wins_over_path() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let beside = tmp.path().join("bin");
        let on_path = tmp.path().join("path");
        let expected = write_program(&beside, "decision-server", 0o755);
        write_program(&on_path, "decision-server", 0o755);
        let path = std::env::join_paths([&on_path]).expect("join");
        assert_eq!(
            find_in("decision-server", Some(&beside), &path),
            Some(expected)
        );
    }

    #[test]
    fn path_is_searched_in_order_and_non_executables_are_skipped() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let first = tmp.path().join("a");
        let second = tmp.path().join("b");
        write_program(&first, "decision-router", 0o644);
        let expected = write_program(&second, "decision-router", 0o755);
        let path = std::env::join_paths([&first, &second]).expect("join");
        assert_eq!(
            find_in("decision-router", Some(tmp.path()), &path),
            Some(expected)
        );
    }

    #[test]
    fn missing_binary_error_names_it() {
        let err = MissingBinary {
            name: "decision-server",
            beside: Some(PathBuf::from("/opt/di/bin")),
            hint: "install the Python package",
        };
        let message = err.to_string();
        assert!(message.contains("`decision-server`"), "{message}");
        assert!(message.contains("/opt/di/bin"), "{message}");
        assert_eq!(find_in("decision-nothing", None, OsStr::new("")), None);
    }
}
