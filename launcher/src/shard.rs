//! Starting one model shard and deciding when it is ready: only a real Health RPC answering with a
//! finite probe counts, never the socket file appearing.

use std::ffi::OsString;
use std::future::Future;
use std::io::ErrorKind;
use std::os::unix::fs::FileTypeExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use decision_proto::v1::HealthRequest;

use crate::child::{ChildExit, ChildSpec};
use crate::config::{flag_value, Config};
use crate::model::Model;

/// How often readiness is polled; short against a model load, long against a busy-loop.
const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// One Health call that takes longer is abandoned and retried: the probe is a tiny op.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// How often "still waiting" is logged, so a slow load is visibly alive.
const PROGRESS_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error("shard {rank} did not become ready: {exit}")]
    ExitedDuringStartup { rank: u32, exit: ChildExit },
    #[error(
        "shard {rank} did not answer a Health RPC on {} within {timeout_secs} s (--shard-startup-timeout-secs); {last_error}",
        socket.display()
    )]
    StartupTimeout {
        rank: u32,
        socket: PathBuf,
        timeout_secs: u64,
        last_error: String,
    },
    #[error("shard {rank} answered Health with a non-finite probe ({probe}): its device computes garbage")]
    UnhealthyProbe { rank: u32, probe: f64 },
    #[error("{}: another server is listening there; stop it or choose another --uds-path", socket.display())]
    SocketInUse { socket: PathBuf },
    #[error("{}: exists and is not a socket; choose another --uds-path", socket.display())]
    SocketPathTaken { socket: PathBuf },
    #[error("{}: cannot remove the stale socket: {source}", socket.display())]
    StaleSocket {
        socket: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot find a free TCP port for the shards' rendezvous (set --master-port): {0}")]
    NoRendezvousPort(std::io::Error),
}

/// Where the tensor-parallel ranks of one launch meet; resolved once, passed to every rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendezvous {
    pub addr: String,
    pub port: u16,
}

impl Rendezvous {
    /// None with one shard (nothing to meet); else `--master-addr` and `--master-port`, or a port
    /// free right now on this machine when none was given.
    pub fn resolve(config: &Config) -> Result<Option<Self>, ShardError> {
        if config.num_shard <= 1 {
            return Ok(None);
        }
        let port = match config.master_port {
            Some(port) => port,
            None => std::net::TcpListener::bind(("127.0.0.1", 0))
                .and_then(|listener| listener.local_addr())
                .map(|addr| addr.port())
                .map_err(ShardError::NoRendezvousPort)?,
        };
        Ok(Some(Rendezvous {
            addr: config.master_addr.clone(),
            port,
        }))
    }
}

/// `decision-server --log-level L serve MODEL_DIR --uds-path SOCKET [every shard flag: --dtype D --read-mode M
/// --matmul X --compile C --cuda-graphs G [--threads T] --prefix-cache-mb C] --rank R --world-size N [--master-addr A --master-port P]
/// [--max-batch-prefill-tokens B] [--otlp-endpoint E]`: every rank's place in the group is an explicit flag, and
/// the shard flags come from their one declaration (`config::ShardFlags`).
pub fn spec(
    program: &Path,
    config: &Config,
    model: &Model,
    rank: u32,
    socket: &Path,
    rendezvous: Option<&Rendezvous>,
    env: &[(String, String)],
) -> ChildSpec {
    let mut args: Vec<OsString> = vec![
        // The CLI's own option: before the subcommand.
        "--log-level".into(),
        flag_value(&config.shard_log_level).into(),
        "serve".into(),
        model.dir.clone().into(),
        "--uds-path".into(),
        socket.into(),
    ];
    args.extend(config.shard_argv.iter().cloned());
    args.extend([
        "--rank".into(),
        rank.to_string().into(),
        "--world-size".into(),
        config.num_shard.to_string().into(),
    ]);
    if let Some(rendezvous) = rendezvous {
        args.extend([
            "--master-addr".into(),
            rendezvous.addr.clone().into(),
            "--master-port".into(),
            rendezvous.port.to_string().into(),
        ]);
    }
    // Unset, each shard chooses for its device and the router follows (router.rs).
    if let Some(tokens) = config.router.max_batch_prefill_tokens {
        args.extend([
            "--max-batch-prefill-tokens".into(),
            tokens.to_string().into(),
        ]);
    }
    if let Some(endpoint) = config.otlp_endpoint(|name| std::env::var(name).ok()) {
        args.extend(["--otlp-endpoint".into(), endpoint.into()]);
    }
    ChildSpec {
        name: format!("shard {rank}"),
        program: program.to_owned(),
        args,
        env: env.to_vec(),
        // The shard has no use for the API key the launcher may have read from its environment.
        env_remove: vec!["API_KEY".into()],
        span: tracing::info_span!("shard", rank),
    }
}

/// Makes `socket` free for a new shard: a stale file left by a killed shard is removed, but a
/// socket some live server answers on is left alone and reported.
pub fn prepare_socket(socket: &Path) -> Result<(), ShardError> {
    let metadata = match std::fs::symlink_metadata(socket) {
        Ok(metadata) => metadata,
        Err(err) if err.kind() == ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(ShardError::StaleSocket {
                socket: socket.to_owned(),
                source,
            })
        }
    };
    if !metadata.file_type().is_socket() {
        return Err(ShardError::SocketPathTaken {
            socket: socket.to_owned(),
        });
    }
    if std::os::unix::net::UnixStream::connect(socket).is_ok() {
        return Err(ShardError::SocketInUse {
            socket: socket.to_owned(),
        });
    }
    tracing::info!(socket = %socket.display(), "removing stale socket");
    std::fs::remove_file(socket)
        .or_else(|err| {
            if err.kind() == ErrorKind::NotFound {
                Ok(())
            } else {
                Err(err)
            }
        })
        .map_err(|source| ShardError::StaleSocket {
            socket: socket.to_owned(),
            source,
        })
}

/// Removes a socket file the shard left behind; anything that is not a socket is left alone.
pub fn remove_socket(socket: &Path) {
    let is_socket = std::fs::symlink_metadata(socket).is_ok_and(|m| m.file_type().is_socket());
    if is_socket {
        if let Err(err) = std::fs::remove_file(socket) {
            tracing::warn!(socket = %socket.display(), "cannot remove socket: {err}");
        }
    }
}

/// Polls Health on `socket` until it answers, the shard exits, or `timeout` passes.
pub async fn wait_ready(
    exited: impl Future<Output = ChildExit>,
    rank: u32,
    socket: &Path,
    timeout: Duration,
) -> Result<(), ShardError> {
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last_error = "none finished".to_owned();
    let mut last_progress = Instant::now();
    tokio::pin!(exited);
    tracing::info!(rank, socket = %socket.display(), "waiting for shard {rank} to answer Health…");
    loop {
        tokio::select! {
            exit = &mut exited => return Err(ShardError::ExitedDuringStartup { rank, exit }),
            () = tokio::time::sleep_until(deadline) => {
                return Err(ShardError::StartupTimeout {
                    rank,
                    socket: socket.to_owned(),
                    timeout_secs: timeout.as_secs(),
                    last_error: format!("a Health call was still unanswered; the one before: {last_error}"),
                });
            }
            attempt = tokio::time::timeout(ATTEMPT_TIMEOUT, health(socket)) => match attempt {
                Ok(Ok(probe)) if probe.is_finite() => {
                    tracing::info!(rank, elapsed_secs = started.elapsed().as_secs(), "shard {rank} is ready");
                    return Ok(());
                }
                Ok(Ok(probe)) => return Err(ShardError::UnhealthyProbe { rank, probe }),
                Ok(Err(err)) => last_error = err.to_string(),
                Err(_) => last_error = format!("Health RPC unanswered after {} s", ATTEMPT_TIMEOUT.as_secs()),
            },
        }
        if last_progress.elapsed() >= PROGRESS_INTERVAL {
            last_progress = Instant::now();
            tracing::info!(
                rank,
                elapsed_secs = started.elapsed().as_secs(),
                "still waiting for shard {rank}…"
            );
        }
        tokio::select! {
            exit = &mut exited => return Err(ShardError::ExitedDuringStartup { rank, exit }),
            () = tokio::time::sleep(POLL_INTERVAL) => {}
        }
    }
}

/// Why one readiness attempt failed: the step, and what it said.
#[derive(Debug, thiserror::Error)]
enum HealthAttemptError {
    /// The socket could not be connected to (the cause chain: no such file, refused).
    #[error("connect: {0}")]
    Connect(String),
    /// The call's gRPC status: its code as tonic writes it, and the shard's message.
    #[error("Health RPC: {code}: {message}")]
    Rpc { code: String, message: String },
}

/// One readiness attempt: connect and call Health.
async fn health(socket: &Path) -> Result<f64, HealthAttemptError> {
    let mut client = decision_proto::connect_uds(socket)
        .await
        .map_err(|err| HealthAttemptError::Connect(error_chain(&err)))?;
    let response =
        client
            .health(HealthRequest {})
            .await
            .map_err(|status| HealthAttemptError::Rpc {
                code: status.code().to_string(),
                message: status.message().to_owned(),
            })?;
    Ok(response.into_inner().probe)
}

/// tonic's transport errors say only "transport error"; the cause (no such file, refused) is below.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::child::{Children, Exit};
    use crate::config::parse_for_test as config;

    fn sh(script: &str) -> ChildSpec {
        ChildSpec {
            name: "shard 0".into(),
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            env: Vec::new(),
            env_remove: Vec::new(),
            span: tracing::info_span!("shard", rank = 0),
        }
    }

    /// The argument that follows `flag` in a shard's argv.
    fn value_after<'a>(args: &'a [OsString], flag: &str) -> &'a OsString {
        let at = args
            .iter()
            .position(|a| a == flag)
            .unwrap_or_else(|| panic!("{flag} passed to the shard"));
        &args[at + 1]
    }

    /// The argv of rank 0 of one shard, no rendezvous and no environment, launched with `flags`.
    fn rank0_args(model: &Model, socket: &Path, flags: &[&str]) -> Vec<OsString> {
        spec(
            Path::new("decision-server"),
            &config(flags),
            model,
            0,
            socket,
            None,
            &[],
        )
        .args
    }

    #[test]
    fn shard_argv_carries_model_socket_dtype_read_mode_matmul_and_threads() {
        let model = Model {
            dir: "/models/m".into(),
            served_name: "m".into(),
        };
        let socket = Path::new("/tmp/ds-0");
        let with_threads = spec(
            Path::new("/bin/decision-server"),
            &config(&[
                "--dtype",
                "bfloat16",
                "--read-mode",
                "naive",
                "--matmul",
                "fast",
                "--compile",
                "off",
                "--threads",
                "8",
            ]),
            &model,
            0,
            socket,
            None,
            &[],
        );
        assert_eq!(
            with_threads.args,
            [
                "--log-level",
                "info",
                "serve",
                "/models/m",
                "--uds-path",
                "/tmp/ds-0",
                "--dtype",
                "bfloat16",
                "--read-mode",
                "naive",
                "--matmul",
                "fast",
                "--compile",
                "off",
                "--cuda-graphs",
                "auto",
                "--threads",
                "8",
                "--prefix-cache-mb",
                "auto",
                "--rank",
                "0",
                "--world-size",
                "1"
            ]
            .map(OsString::from)
        );
        assert_eq!(with_threads.name, "shard 0");

        let default_threads = rank0_args(&model, socket, &[]);
        assert!(!default_threads.contains(&OsString::from("--threads")));
        assert!(default_threads.contains(&OsString::from("auto")));
        assert_eq!(value_after(&default_threads, "--matmul"), "auto");
        assert_eq!(value_after(&default_threads, "--compile"), "auto");
        assert_eq!(value_after(&default_threads, "--cuda-graphs"), "auto");
        let eager = rank0_args(&model, socket, &["--cuda-graphs", "off"]);
        assert_eq!(value_after(&eager, "--cuda-graphs"), "off");
        let split = rank0_args(&model, socket, &["--matmul", "split"]);
        assert_eq!(value_after(&split, "--matmul"), "split");
        let widen = rank0_args(&model, socket, &["--matmul", "widen"]);
        assert_eq!(value_after(&widen, "--matmul"), "widen");
        assert!(!default_threads.contains(&OsString::from("--master-port")));
        assert_eq!(value_after(&default_threads, "--prefix-cache-mb"), "auto");

        let cached = rank0_args(&model, socket, &["--prefix-cache-mb", "256"]);
        assert_eq!(value_after(&cached, "--prefix-cache-mb"), "256");
        let off = rank0_args(&model, socket, &["--prefix-cache-mb", "0"]);
        assert_eq!(value_after(&off, "--prefix-cache-mb"), "0");
        // The batch budget reaches the shard only when given (the router gets the same value).
        assert!(!default_threads.contains(&OsString::from("--max-batch-prefill-tokens")));
        let budget = rank0_args(&model, socket, &["--max-batch-prefill-tokens", "32768"]);
        assert_eq!(value_after(&budget, "--max-batch-prefill-tokens"), "32768");
        let debug = rank0_args(&model, socket, &["--shard-log-level", "debug"]);
        assert_eq!(value_after(&debug, "--log-level"), "debug");

        let preloaded = spec(
            Path::new("decision-server"),
            &config(&[]),
            &model,
            0,
            socket,
            None,
            &[("LD_PRELOAD".into(), "/usr/lib/libtcmalloc.so.4".into())],
        );
        assert_eq!(
            preloaded.env,
            [(
                "LD_PRELOAD".to_owned(),
                "/usr/lib/libtcmalloc.so.4".to_owned()
            )]
        );
        assert_eq!(preloaded.env_remove, ["API_KEY"]);
    }

    #[test]
    fn each_rank_gets_its_rank_the_world_size_and_the_shared_rendezvous() {
        let model = Model {
            dir: "/models/m".into(),
            served_name: "m".into(),
        };
        let two = config(&["--num-shard", "2", "--master-port", "29611"]);
        let rendezvous = Rendezvous::resolve(&two)
            .expect("resolves")
            .expect("two shards meet");
        assert_eq!(
            rendezvous,
            Rendezvous {
                addr: "127.0.0.1".into(),
                port: 29611
            }
        );
        let rank1 = spec(
            Path::new("decision-server"),
            &two,
            &model,
            1,
            Path::new("/tmp/ds-1"),
            Some(&rendezvous),
            &[],
        );
        assert_eq!(rank1.name, "shard 1");
        let rank_at = rank1
            .args
            .iter()
            .position(|a| a == "--rank")
            .expect("--rank");
        let tail: Vec<OsString> = rank1.args[rank_at..].to_vec();
        assert_eq!(
            tail,
            [
                "--rank",
                "1",
                "--world-size",
                "2",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                "29611"
            ]
            .map(OsString::from)
        );

        // No port given: a free one, the same for every rank because it is resolved once.
        let picked = Rendezvous::resolve(&config(&["--num-shard", "2"]))
            .expect("a free port exists")
            .expect("two shards meet");
        assert_ne!(picked.port, 0);
        assert_eq!(Rendezvous::resolve(&config(&[])).expect("resolves"), None);
    }

    #[tokio::test]
    async fn shard_dying_during_startup_is_reported_with_its_stderr() {
        let mut children = Children::new();
        let exited = children
            .spawn(sh(
                "echo 'loading weights'; echo 'FileNotFoundError: model.safetensors' >&2; exit 2",
            ))
            .expect("spawns")
            .exited();
        let tmp = tempfile::tempdir().expect("tempdir");
        let err = wait_ready(
            exited,
            0,
            &tmp.path().join("sock-0"),
            Duration::from_secs(30),
        )
        .await
        .expect_err("the shard exited");
        let ShardError::ExitedDuringStartup { rank: 0, exit } = &err else {
            panic!("unexpected error: {err}");
        };
        assert_eq!(exit.exit, Exit::Code(2));
        assert_eq!(
            exit.stderr_tail,
            vec!["FileNotFoundError: model.safetensors".to_owned()]
        );
        assert!(err.to_string().contains("FileNotFoundError"), "{err}");
    }

    #[tokio::test]
    async fn socket_file_alone_is_not_readiness() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let socket = tmp.path().join("sock-0");
        // Something listens on the socket but never speaks gRPC.
        let _listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
        let mut children = Children::new();
        let exited = children
            .spawn(sh("exec sleep 100"))
            .expect("spawns")
            .exited();
        let err = wait_ready(exited, 0, &socket, Duration::from_millis(700))
            .await
            .expect_err("no Health answer");
        assert!(
            matches!(err, ShardError::StartupTimeout { rank: 0, .. }),
            "{err}"
        );
        children
            .terminate_all(Duration::from_secs(5), std::future::pending())
            .await;
    }

    #[test]
    fn stale_socket_is_removed_but_live_one_and_other_files_are_kept() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let missing = tmp.path().join("none");
        assert!(prepare_socket(&missing).is_ok());

        let stale = tmp.path().join("stale");
        drop(std::os::unix::net::UnixListener::bind(&stale).expect("bind"));
        assert!(stale.exists(), "closing a listener leaves its file");
        prepare_socket(&stale).expect("stale socket removed");
        assert!(!stale.exists());

        let live = tmp.path().join("live");
        let _listener = std::os::unix::net::UnixListener::bind(&live).expect("bind");
        assert!(matches!(
            prepare_socket(&live),
            Err(ShardError::SocketInUse { .. })
        ));
        assert!(live.exists());

        let file = tmp.path().join("file");
        std::fs::write(&file, "data").expect("write");
        assert!(matches!(
            prepare_socket(&file),
            Err(ShardError::SocketPathTaken { .. })
        ));
        remove_socket(&file);
        assert!(file.exists(), "only sockets are removed");
    }
}
