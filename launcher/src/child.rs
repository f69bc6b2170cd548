//! Child processes of the launcher: spawned so they cannot outlive it, their output re-emitted into
//! the launcher's log stream (with a stderr tail kept for error reports), stopped with SIGTERM then SIGKILL.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::fmt;
use std::future::Future;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt as _, AsyncRead, BufReader};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tracing::{Instrument as _, Span};

use crate::logging;

/// Lines of each child's stderr kept for the report when it fails.
pub const TAIL_LINES: usize = 200;
/// A single runaway line (a tensor dump) must not make the kept tail huge.
const MAX_TAIL_LINE_CHARS: usize = 4096;
/// After a child exits, how long its output pipes may take to drain before it is reported.
/// Grandchildren can hold the pipes open forever; the report must not wait for them.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// What to start, described as data so the argv of every child can be checked by a test.
#[derive(Debug, Clone)]
pub struct ChildSpec {
    /// Used in logs and error reports: "shard 0", "router".
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// Set in the child's environment only (secrets go here, never into `args`).
    pub env: Vec<(String, String)>,
    /// Removed from the environment the child inherits.
    pub env_remove: Vec<String>,
    /// Every line the child writes is emitted inside this span, which tags it with the child's name.
    pub span: Span,
}

/// How a child ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
    /// The launcher could not observe the end (waitpid failed).
    Unknown(String),
}

impl Exit {
    pub fn success(&self) -> bool {
        *self == Exit::Code(0)
    }

    fn from_status(status: ExitStatus) -> Self {
        match (status.code(), status.signal()) {
            (Some(code), _) => Exit::Code(code),
            (None, Some(signal)) => Exit::Signal(signal),
            (None, None) => Exit::Unknown(status.to_string()),
        }
    }
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exit::Code(code) => write!(f, "exit status {code}"),
            Exit::Signal(signal) => match signal_name(*signal) {
                Some(name) => write!(f, "killed by signal {signal} ({name})"),
                None => write!(f, "killed by signal {signal}"),
            },
            Exit::Unknown(why) => write!(f, "unknown exit ({why})"),
        }
    }
}

fn signal_name(signal: i32) -> Option<&'static str> {
    Some(match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGTERM => "SIGTERM",
        _ => return None,
    })
}

/// A child that ended, with what it last said on stderr: everything an error report needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildExit {
    pub name: String,
    pub exit: Exit,
    pub stderr_tail: Vec<String>,
}

impl fmt::Display for ChildExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} exited ({})", self.name, self.exit)?;
        if self.stderr_tail.is_empty() {
            return write!(f, "; it wrote nothing on stderr");
        }
        write!(f, "; last lines of its stderr:")?;
        // Entries can span lines (a traceback after its log message); every line gets the indent.
        for line in self.stderr_tail.iter().flat_map(|entry| entry.lines()) {
            write!(f, "\n  {line}")?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("cannot start {name} ({}): {source}", program.display())]
pub struct SpawnError {
    pub name: String,
    pub program: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// The last lines of a child's stderr, shared between its reader task and whoever reports on it.
#[derive(Clone, Default, Debug)]
pub struct Tail(Arc<Mutex<VecDeque<String>>>);

impl Tail {
    fn push(&self, line: &str) {
        let mut lines = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if lines.len() == TAIL_LINES {
            lines.pop_front();
        }
        lines.push_back(truncate_chars(line, MAX_TAIL_LINE_CHARS));
    }

    pub fn lines(&self) -> Vec<String> {
        let lines = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        lines.iter().cloned().collect()
    }
}

fn truncate_chars(line: &str, max: usize) -> String {
    match line.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &line[..cut]),
        None => line.to_owned(),
    }
}

/// Handle on one supervised child. The process itself is owned by a monitor task that reaps it.
#[derive(Debug)]
pub struct Supervised {
    name: String,
    pid: i32,
    /// Set the moment the process is reaped: from then on its pid may be reused, so no more signals.
    reaped: Arc<AtomicBool>,
    /// Set once the child is reaped and its output drained: the report is then complete.
    exit: watch::Receiver<Option<Exit>>,
    tail: Tail,
    /// A one-off command (`run_to_end`): its exit is the expected result, not news for `next_exit`.
    one_off: bool,
}

impl Supervised {
    #[cfg(test)]
    pub fn name(&self) -> &str {
        &self.name
    }

    #[cfg(test)]
    pub fn tail(&self) -> Vec<String> {
        self.tail.lines()
    }

    /// Resolves when the child has ended and its output has been read; never if it keeps running.
    pub fn exited(&self) -> impl Future<Output = ChildExit> + Send + 'static {
        let mut exit = self.exit.clone();
        let name = self.name.clone();
        let tail = self.tail.clone();
        async move {
            let exit = match exit.wait_for(Option::is_some).await {
                Ok(exit) => exit
                    .clone()
                    .unwrap_or_else(|| Exit::Unknown("no status".into())),
                // The monitor task is gone without a word: only possible while the runtime shuts down.
                Err(_) => Exit::Unknown("monitor task ended".into()),
            };
            ChildExit {
                name,
                exit,
                stderr_tail: tail.lines(),
            }
        }
    }

    fn has_ended(&self) -> bool {
        self.reaped.load(Ordering::SeqCst)
    }

    /// Signals the child's whole process group (the child and whatever it started).
    fn signal(&self, signal: i32) {
        if self.has_ended() {
            return;
        }
        // SAFETY: killpg only sends a signal; the group id is our child's pid (it leads its own group).
        let rc = unsafe { libc::killpg(self.pid, signal) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::ESRCH) {
                tracing::warn!(child = %self.name, pid = self.pid, "cannot signal: {err}");
            }
        }
    }
}

/// The children that live and die together: one exiting is news, `terminate_all` ends them all.
pub struct Children {
    members: Vec<Supervised>,
    exits_tx: mpsc::UnboundedSender<usize>,
    exits_rx: mpsc::UnboundedReceiver<usize>,
}

impl Default for Children {
    fn default() -> Self {
        Self::new()
    }
}

impl Children {
    pub fn new() -> Self {
        let (exits_tx, exits_rx) = mpsc::unbounded_channel();
        Children {
            members: Vec::new(),
            exits_tx,
            exits_rx,
        }
    }

    /// Starts a child and begins re-emitting its output.
    pub fn spawn(&mut self, spec: ChildSpec) -> Result<&Supervised, SpawnError> {
        let spawn_error = |source| SpawnError {
            name: spec.name.clone(),
            program: spec.program.clone(),
            source,
        };
        let mut command = std::process::Command::new(&spec.program);
        command
            .args(&spec.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group: a terminal's Ctrl-C reaches only the launcher, which then stops
            // the children in order, and a signal to the group also reaches the child's own helpers.
            .process_group(0);
        for name in &spec.env_remove {
            command.env_remove(name);
        }
        for (name, value) in &spec.env {
            command.env(name, value);
        }
        die_with_launcher(&mut command);
        let mut command = tokio::process::Command::from(command);
        // Dropping the handle (a panic unwinding, the runtime shutting down) kills the child too.
        command.kill_on_drop(true);
        let mut process = command.spawn().map_err(spawn_error)?;
        let pid = process
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .ok_or_else(|| spawn_error(std::io::Error::other("child has no pid")))?;

        let tail = Tail::default();
        let mut pumps = Vec::new();
        if let Some(stdout) = process.stdout.take() {
            pumps.push(tokio::spawn(pump_lines(stdout, spec.span.clone(), None)));
        }
        if let Some(stderr) = process.stderr.take() {
            let tail = tail.clone();
            pumps.push(tokio::spawn(pump_lines(
                stderr,
                spec.span.clone(),
                Some(tail),
            )));
        }

        let index = self.members.len();
        let reaped = Arc::new(AtomicBool::new(false));
        let (exit_tx, exit_rx) = watch::channel(None);
        let exits_tx = self.exits_tx.clone();
        let monitor = monitor(process, pumps, reaped.clone(), exit_tx, exits_tx, index);
        tokio::spawn(monitor.instrument(spec.span.clone()));
        tracing::debug!(child = %spec.name, pid, "started {}", spec.program.display());
        self.members.push(Supervised {
            name: spec.name,
            pid,
            reaped,
            exit: exit_rx,
            tail,
            one_off: false,
        });
        Ok(&self.members[index])
    }

    /// Runs a one-off command to its end. Until then it is a member like any other (a shutdown
    /// stops it too), but its exit is returned here rather than reported by `next_exit`.
    pub async fn run_to_end(&mut self, spec: ChildSpec) -> Result<ChildExit, SpawnError> {
        let exited = self.spawn(spec)?.exited();
        if let Some(member) = self.members.last_mut() {
            member.one_off = true;
        }
        Ok(exited.await)
    }

    /// The next child to end, with its report. Pending forever while all keep running.
    pub async fn next_exit(&mut self) -> ChildExit {
        loop {
            let Some(index) = self.exits_rx.recv().await else {
                // Unreachable: we hold a sender. Park rather than report a fake exit.
                return std::future::pending().await;
            };
            match self.members.get(index) {
                Some(member) if !member.one_off => return member.exited().await,
                _ => {}
            }
        }
    }

    /// Stops the running children in reverse start order, each with SIGTERM and waited for before
    /// the next is signalled, all within one `grace` (cut short if `hurry` resolves: a second
    /// Ctrl-C); then SIGKILL to whatever remains. Reverse order matters: the router, started last,
    /// drains its in-flight requests while the shards it waits on are still running.
    /// Returns once all have ended.
    pub async fn terminate_all(&mut self, grace: Duration, hurry: impl Future<Output = ()>) {
        let running: Vec<&Supervised> = self.members.iter().filter(|c| !c.has_ended()).collect();
        if running.is_empty() {
            return;
        }
        tracing::info!(count = running.len(), "stopping the running children");
        let in_order = async {
            for child in running.iter().rev() {
                tracing::info!(child = %child.name, "sending SIGTERM");
                child.signal(libc::SIGTERM);
                child.exited().await;
            }
        };
        tokio::select! {
            () = in_order => return,
            () = tokio::time::sleep(grace) => {}
            () = hurry => tracing::warn!("asked again: not waiting for a graceful exit"),
        }
        for child in running.iter().filter(|c| !c.has_ended()) {
            tracing::warn!(child = %child.name, grace_secs = grace.as_secs_f32(), "still running; sending SIGKILL");
            child.signal(libc::SIGKILL);
        }
        // SIGKILL cannot be ignored; the bound only guards against a process stuck in the kernel.
        if tokio::time::timeout(Duration::from_secs(5), wait_all(&running))
            .await
            .is_err()
        {
            tracing::error!("some children did not end even after SIGKILL");
        }
    }
}

async fn wait_all(children: &[&Supervised]) {
    for child in children {
        child.exited().await;
    }
}

/// Makes the kernel SIGKILL the child when the launcher dies, even by SIGKILL or a crash, when no
/// code of ours runs to stop it. Without this, a shard holding gigabytes of GPU memory would stay
/// behind as an orphan. SIGKILL rather than SIGTERM: nobody is left to escalate if the child ignored it.
///
/// PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not the process. The launcher
/// therefore runs a current-thread runtime, so every spawn happens on the main thread, which lives as
/// long as the launcher.
fn die_with_launcher(command: &mut std::process::Command) {
    // SAFETY: getpid is async-signal-safe and runs here, before the fork.
    let launcher = unsafe { libc::getpid() };
    let hook = move || {
        // SAFETY: between fork and exec only async-signal-safe calls are allowed: prctl, getppid,
        // and building an io::Error from a raw code (no allocation).
        unsafe {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The launcher may have died before prctl took effect: then the signal will never come.
            if libc::getppid() != launcher {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
        }
        Ok(())
    };
    // SAFETY: the hook only makes async-signal-safe calls (see above).
    unsafe {
        command.pre_exec(hook);
    }
}

/// Reaps the child, lets its output drain, then publishes how it ended.
async fn monitor(
    mut process: tokio::process::Child,
    pumps: Vec<JoinHandle<()>>,
    reaped: Arc<AtomicBool>,
    exit_tx: watch::Sender<Option<Exit>>,
    exits_tx: mpsc::UnboundedSender<usize>,
    index: usize,
) {
    let exit = match process.wait().await {
        Ok(status) => Exit::from_status(status),
        Err(err) => Exit::Unknown(format!("waiting for it failed: {err}")),
    };
    reaped.store(true, Ordering::SeqCst);
    let drained = async {
        for pump in pumps {
            // A pump only fails by panicking; its lines are lost either way.
            let _ = pump.await;
        }
    };
    if tokio::time::timeout(DRAIN_TIMEOUT, drained).await.is_err() {
        // Typically a process the child started still holds its stdout/stderr.
        tracing::debug!("output still open {DRAIN_TIMEOUT:?} after the exit; reporting without it");
    }
    // Receivers may all be gone during shutdown; nobody is waiting for the news then.
    let _ = exit_tx.send(Some(exit));
    let _ = exits_tx.send(index);
}

/// Re-emits each line as a log event in the child's span; stderr lines also go to the tail.
async fn pump_lines(reader: impl AsyncRead + Unpin, span: Span, tail: Option<Tail>) {
    let mut reader = BufReader::new(reader);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf).await {
            Ok(0) => return,
            Ok(_) => {}
            Err(err) => {
                span.in_scope(|| tracing::warn!("cannot read child output: {err}"));
                return;
            }
        }
        let raw = String::from_utf8_lossy(&buf);
        let Some(line) = last_redraw(&raw) else {
            continue;
        };
        let line = logging::strip_ansi(line);
        if let Some(tail) = &tail {
            tail.push(&logging::readable(&line));
        }
        span.in_scope(|| logging::emit_child_line(&line));
    }
}

/// A line holding `\r` redraws (progress bars): what the terminal would finally show is its last
/// non-empty segment. Empty lines carry nothing worth a log event.
fn last_redraw(raw: &str) -> Option<&str> {
    raw.trim_end_matches(['\n', '\r'])
        .rsplit('\r')
        .find(|segment| !segment.trim().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn sh(name: &str, script: &str) -> ChildSpec {
        ChildSpec {
            name: name.into(),
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            env: Vec::new(),
            env_remove: Vec::new(),
            span: tracing::info_span!("test"),
        }
    }

    async fn wait_for_tail(child: &Supervised, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !child.tail().iter().any(|l| l.contains(needle)) {
            assert!(
                Instant::now() < deadline,
                "{} never wrote {needle:?}",
                child.name()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn failing_child_is_reported_with_status_and_stderr() {
        let mut children = Children::new();
        children
            .spawn(sh("shard 0", "echo starting; echo boom >&2; exit 3"))
            .expect("spawns");
        let exit = tokio::time::timeout(Duration::from_secs(10), children.next_exit())
            .await
            .expect("child ends");
        assert_eq!(exit.name, "shard 0");
        assert_eq!(exit.exit, Exit::Code(3));
        assert_eq!(
            exit.stderr_tail,
            vec!["boom".to_owned()],
            "stdout is not part of the tail"
        );
        let report = exit.to_string();
        assert!(
            report.contains("shard 0 exited (exit status 3)"),
            "{report}"
        );
        assert!(report.contains("boom"), "{report}");
    }

    #[tokio::test]
    async fn first_of_several_children_to_die_is_the_one_reported() {
        let mut children = Children::new();
        children.spawn(sh("router", "sleep 100")).expect("spawns");
        children.spawn(sh("shard 0", "exit 7")).expect("spawns");
        let exit = tokio::time::timeout(Duration::from_secs(10), children.next_exit())
            .await
            .expect("one child ends");
        assert_eq!(
            (exit.name.as_str(), exit.exit.clone()),
            ("shard 0", Exit::Code(7))
        );
        children
            .terminate_all(Duration::from_secs(5), std::future::pending())
            .await;
    }

    #[tokio::test]
    async fn a_one_off_command_ending_is_not_reported_as_a_death() {
        let mut children = Children::new();
        let done = children
            .run_to_end(sh("export", "exit 0"))
            .await
            .expect("spawns");
        assert_eq!(done.exit, Exit::Code(0));
        children.spawn(sh("router", "exit 5")).expect("spawns");
        let exit = tokio::time::timeout(Duration::from_secs(10), children.next_exit())
            .await
            .expect("router ends");
        assert_eq!((exit.name.as_str(), exit.exit), ("router", Exit::Code(5)));
    }

    #[tokio::test]
    async fn sigterm_stops_a_child_well_within_the_grace_period() {
        let mut children = Children::new();
        let exited = children
            .spawn(sh("sleeper", "exec sleep 100"))
            .expect("spawns")
            .exited();
        let grace = Duration::from_secs(5);
        let started = Instant::now();
        children.terminate_all(grace, std::future::pending()).await;
        assert!(started.elapsed() < grace, "took {:?}", started.elapsed());
        let exit = exited.await;
        assert_eq!(exit.exit, Exit::Signal(libc::SIGTERM));
        assert_eq!(exit.exit.to_string(), "killed by signal 15 (SIGTERM)");
    }

    /// The router drains while its shards still run: the last started is stopped, and has ended,
    /// before the first started is even signalled.
    #[tokio::test]
    async fn children_stop_in_reverse_start_order_each_after_the_next_has_ended() {
        let dir = std::env::temp_dir().join(format!("di-order-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let log = dir.join("log");
        let mut children = Children::new();
        // The shard notes its SIGTERM; the router takes 300 ms to drain, then notes it is done.
        let shard = format!(
            "trap 'echo shard-term >> {0}; exit 0' TERM; echo ready >&2; while :; do sleep 0.05; done",
            log.display()
        );
        let router = format!(
            "trap 'sleep 0.3; echo router-done >> {0}; exit 0' TERM; echo ready >&2; while :; do sleep 0.05; done",
            log.display()
        );
        let first = children.spawn(sh("shard 0", &shard)).expect("spawns");
        wait_for_tail(first, "ready").await;
        let second = children.spawn(sh("router", &router)).expect("spawns");
        wait_for_tail(second, "ready").await;
        children
            .terminate_all(Duration::from_secs(10), std::future::pending())
            .await;
        let order = std::fs::read_to_string(&log).expect("log written");
        assert_eq!(order, "router-done\nshard-term\n");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[tokio::test]
    async fn sigterm_reaches_the_childs_own_children() {
        let mut children = Children::new();
        // `sh` waits for `sleep`: only a signal to the whole group ends it promptly.
        let exited = children
            .spawn(sh("wrapper", "sleep 100; echo after"))
            .expect("spawns")
            .exited();
        let started = Instant::now();
        children
            .terminate_all(Duration::from_secs(5), std::future::pending())
            .await;
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "took {:?}",
            started.elapsed()
        );
        let exit = exited.await;
        assert_eq!(exit.exit, Exit::Signal(libc::SIGTERM));
    }

    #[tokio::test]
    async fn a_child_ignoring_sigterm_is_killed_after_the_grace_period() {
        let mut children = Children::new();
        let child = children
            .spawn(sh("stubborn", "trap '' TERM; echo ready >&2; sleep 100"))
            .expect("spawns");
        wait_for_tail(child, "ready").await;
        let exited = child.exited();
        let grace = Duration::from_millis(300);
        let started = Instant::now();
        children.terminate_all(grace, std::future::pending()).await;
        let took = started.elapsed();
        assert!(
            took >= grace && took < Duration::from_secs(5),
            "took {took:?}"
        );
        let exit = exited.await;
        assert_eq!(exit.exit, Exit::Signal(libc::SIGKILL));
    }

    #[tokio::test]
    async fn hurry_skips_the_rest_of_the_grace_period() {
        let mut children = Children::new();
        let child = children
            .spawn(sh("stubborn", "trap '' TERM; echo ready >&2; sleep 100"))
            .expect("spawns");
        wait_for_tail(child, "ready").await;
        let started = Instant::now();
        children
            .terminate_all(
                Duration::from_secs(60),
                tokio::time::sleep(Duration::from_millis(50)),
            )
            .await;
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "took {:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn env_is_set_and_removed_as_specified() {
        let mut children = Children::new();
        let mut spec = sh("env", r#"echo "key=$DI_TEST_KEY home=${HOME:-unset}" >&2"#);
        spec.env.push(("DI_TEST_KEY".into(), "k1".into()));
        spec.env_remove.push("HOME".into());
        children.spawn(spec).expect("spawns");
        let exit = children.next_exit().await;
        assert_eq!(exit.stderr_tail, vec!["key=k1 home=unset".to_owned()]);
    }

    #[tokio::test]
    async fn missing_program_is_a_spawn_error_naming_it() {
        let mut children = Children::new();
        let mut spec = sh("shard 0", "");
        spec.program = "/nonexistent/decision-server".into();
        let err = children.spawn(spec).expect_err("no such program");
        let message = err.to_string();
        assert!(message.contains("shard 0"), "{message}");
        assert!(
            message.contains("/nonexistent/decision-server"),
            "{message}"
        );
    }

    #[tokio::test]
    async fn tail_keeps_the_last_lines_and_progress_redraws_collapse() {
        let mut children = Children::new();
        let script = format!(
            r"i=0; while [ $i -lt {} ]; do echo line$i >&2; i=$((i+1)); done; printf '10%%\r50%%\r100%%\n' >&2",
            TAIL_LINES + 50
        );
        children.spawn(sh("noisy", &script)).expect("spawns");
        let exit = children.next_exit().await;
        assert_eq!(exit.stderr_tail.len(), TAIL_LINES);
        assert_eq!(exit.stderr_tail.first().map(String::as_str), Some("line51"));
        assert_eq!(exit.stderr_tail.last().map(String::as_str), Some("100%"));
    }

    #[test]
    fn long_lines_are_truncated_on_a_char_boundary() {
        let line = "é".repeat(MAX_TAIL_LINE_CHARS + 10);
        let kept = truncate_chars(&line, MAX_TAIL_LINE_CHARS);
        assert_eq!(kept.chars().count(), MAX_TAIL_LINE_CHARS + 1);
        assert!(kept.ends_with('…'));
    }
}
