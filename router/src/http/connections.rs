//! The accept loop: how many connections the router holds, how long a client may take to send a
//! request head or sit idle, and how connections end when the server stops.
//!
//! axum's own `serve` has no such limits: slow or idle clients could hold connections (and file
//! descriptors) for good. This loop is hyper-util's server with three bounds on top.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};
use tower::ServiceExt as _;

use crate::config::Config;

/// How long connections still open when the server stops get to finish before they are dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    /// Connections held at once; beyond it new ones wait in the listen backlog until one closes.
    pub max_connections: usize,
    /// From a request's first byte until its whole head has arrived.
    pub header_read_timeout: Duration,
    /// A connection on which nothing arrives while no request is in flight is closed after this.
    pub keep_alive_timeout: Duration,
}

/// What the loop is doing, for `/metrics` and tests.
#[derive(Default)]
pub struct ConnectionStats {
    pub open: AtomicUsize,
    /// Closed for sitting idle past the keep-alive timeout.
    pub closed_idle: AtomicU64,
    /// Closed for sending a request head slower than the header timeout.
    pub closed_slow: AtomicU64,
}

/// Serves `app` on `listener` until `shutdown` resolves, then stops accepting and gives the open
/// connections `CLOSE_GRACE` to finish (idle ones close at once).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    stats: Arc<ConnectionStats>,
    shutdown: impl Future<Output = ()>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // hyper's own header timer starts as soon as a connection waits for a request, so it would
    // also cut idle keep-alive connections at the header timeout; `ClientClock` keeps the two apart.
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(None);
    builder.http2().timer(TokioTimer::new());
    tokio::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors (EMFILE) or memory: back off instead of spinning.
                    if !is_connection_error(&e) {
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let activity = Arc::new(Activity::default());
        let io = TokioIo::new(ClientClock::new(
            stream,
            activity.clone(),
            limits,
            stats.clone(),
        ));
        let app = app.clone();
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let busy = activity.begin();
            let app = app.clone();
            async move {
                let response = app.oneshot(request.map(Body::new)).await;
                drop(busy);
                response
            }
        });
        let connection = builder
            .serve_connection_with_upgrades(io, service)
            .into_owned();
        let connection = graceful.watch(connection);
        let stats = stats.clone();
        stats.open.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            // Errors here are the client's (reset, timed out, malformed); nothing to report.
            let _ = connection.await;
            stats.open.fetch_sub(1, Ordering::Relaxed);
            drop(slot);
        });
    }
    drop(listener);
    if tokio::time::timeout(CLOSE_GRACE, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            "connections still open {CLOSE_GRACE:?} after the server stopped; dropping them"
        );
    }
}

/// Errors of one connection that never became one (the client reset it before we accepted).
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Whether a connection has a request in flight, and when the last one finished.
#[derive(Default)]
struct Activity {
    busy: AtomicUsize,
    /// Bumped each time a request finishes: the idle clock restarts then.
    finished: AtomicU64,
    /// The connection's task, parked in a read while a request was in flight.
    reader: std::sync::Mutex<Option<std::task::Waker>>,
}

impl Activity {
    fn begin(self: &Arc<Self>) -> Busy {
        self.busy.fetch_add(1, Ordering::SeqCst);
        Busy(self.clone())
    }

    fn wake_when_done(&self, waker: &std::task::Waker) {
        let mut reader = self.reader.lock().unwrap_or_else(|p| p.into_inner());
        match reader.as_ref() {
            Some(parked) if parked.will_wake(waker) => {}
            _ => *reader = Some(waker.clone()),
        }
    }
}

/// Held while a request is being answered (dropped too when the client goes away mid-request).
struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.finished.fetch_add(1, Ordering::SeqCst);
        if self.0.busy.fetch_sub(1, Ordering::SeqCst) == 1 {
            let parked = self
                .0
                .reader
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            if let Some(waker) = parked {
                waker.wake();
            }
        }
    }
}

/// Which limit the clock of an idle connection runs for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Waiting {
    /// Nothing has arrived since the last request finished (or the connection opened).
    ForRequest,
    /// Part of a request head has arrived; the rest must follow within the header timeout.
    ForHead,
}

/// A TCP stream whose reads fail, which makes hyper close it, when the client keeps the
/// connection without a request in flight for too long: nothing at all for the keep-alive
/// timeout, or a head not complete within the header timeout of its first byte.
struct ClientClock {
    inner: TcpStream,
    activity: Arc<Activity>,
    limits: ConnectionLimits,
    waiting: Waiting,
    deadline: Pin<Box<Sleep>>,
    seen_finished: u64,
    stats: Arc<ConnectionStats>,
}

impl ClientClock {
    fn new(
        inner: TcpStream,
        activity: Arc<Activity>,
        limits: ConnectionLimits,
        stats: Arc<ConnectionStats>,
    ) -> Self {
        ClientClock {
            inner,
            activity,
            limits,
            waiting: Waiting::ForRequest,
            deadline: Box::pin(tokio::time::sleep(limits.keep_alive_timeout)),
            seen_finished: 0,
            stats,
        }
    }

    fn wait(&mut self, waiting: Waiting) {
        let limit = match waiting {
            Waiting::ForRequest => self.limits.keep_alive_timeout,
            Waiting::ForHead => self.limits.header_read_timeout,
        };
        self.waiting = waiting;
        self.deadline.as_mut().reset(Instant::now() + limit);
    }

    fn idle(&self) -> bool {
        self.activity.busy.load(Ordering::SeqCst) == 0
    }
}

impl AsyncRead for ClientClock {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let finished = this.activity.finished.load(Ordering::SeqCst);
        if finished != this.seen_finished {
            this.seen_finished = finished;
            this.wait(Waiting::ForRequest);
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if buf.filled().len() > before && this.idle() && this.waiting == Waiting::ForRequest
                {
                    this.wait(Waiting::ForHead);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                if !this.idle() {
                    // hyper may not read again once the answer is written: have the end of the
                    // request wake us, so that the idle clock starts then.
                    this.activity.wake_when_done(cx.waker());
                    return Poll::Pending;
                }
                if this.deadline.as_mut().poll(cx).is_ready() {
                    let why = match this.waiting {
                        Waiting::ForRequest => {
                            this.stats.closed_idle.fetch_add(1, Ordering::Relaxed);
                            "idle connection (keep_alive_timeout_secs)"
                        }
                        Waiting::ForHead => {
                            this.stats.closed_slow.fetch_add(1, Ordering::Relaxed);
                            "request head too slow (header_read_timeout_secs)"
                        }
                    };
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, why)));
                }
                Poll::Pending
            }
        }
    }
}

impl AsyncWrite for ClientClock {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// The connection bounds from the flags, with the connection cap kept below the open-file limit
/// (the shard sockets, the tokenizer's files and the logs need descriptors too).
pub(super) fn connection_limits(config: &Config) -> ConnectionLimits {
    let mut max_connections = usize::try_from(config.flags.max_connections).unwrap_or(usize::MAX);
    if let Some(files) = open_file_limit() {
        let room = files.saturating_sub(64).max(1);
        if room < max_connections {
            tracing::warn!(
                max_connections,
                open_file_limit = files,
                "--max-connections is above what the open-file limit allows; holding at most {room}"
            );
            max_connections = room;
        }
    }
    ConnectionLimits {
        max_connections,
        header_read_timeout: Duration::from_secs(config.flags.header_read_timeout_secs),
        keep_alive_timeout: Duration::from_secs(config.flags.keep_alive_timeout_secs),
    }
}

/// The soft RLIMIT_NOFILE of this process.
fn open_file_limit() -> Option<usize> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct we pass.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    (rc == 0 && limit.rlim_cur != libc::RLIM_INFINITY)
        .then(|| usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    fn limits(max_connections: usize) -> ConnectionLimits {
        ConnectionLimits {
            max_connections,
            header_read_timeout: Duration::from_millis(1500),
            keep_alive_timeout: Duration::from_millis(600),
        }
    }

    /// A server whose `/slow` takes 1.2 s (longer than the idle timeout), on an ephemeral port.
    async fn start(
        limits: ConnectionLimits,
    ) -> (
        std::net::SocketAddr,
        Arc<ConnectionStats>,
        tokio::sync::oneshot::Sender<()>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().route("/", get(|| async { "ok" })).route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(1200)).await;
                "slow"
            }),
        );
        let stats = Arc::new(ConnectionStats::default());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = stats.clone();
        tokio::spawn(async move {
            serve(listener, app, limits, serving, async {
                let _ = stopped.await;
            })
            .await;
        });
        (addr, stats, stop)
    }

    /// Reads until the peer closes or `within` passes; true when it closed.
    async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
        let mut buf = [0u8; 4096];
        let started = Instant::now();
        loop {
            let left = within.saturating_sub(started.elapsed());
            match tokio::time::timeout(left, stream.read(&mut buf)).await {
                Err(_) => return false,
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
            }
        }
    }

    async fn get_ok(addr: std::net::SocketAddr, path: &str) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(
                format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
            )
            .await
            .unwrap();
        let mut out = String::new();
        stream.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn a_client_sending_its_head_a_byte_at_a_time_is_cut_off_at_the_header_timeout() {
        let limits = limits(16);
        let (addr, stats, _stop) = start(limits).await;
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let started = Instant::now();
        let head =
            b"GET / HTTP/1.1\r\nhost: x\r\nx-slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
        let mut closed = false;
        for byte in head {
            // Each byte keeps the idle clock from firing: only the header timeout can end it.
            if stream.write_all(&[*byte]).await.is_err() {
                closed = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            if started.elapsed() > Duration::from_secs(5) {
                break;
            }
        }
        let closed = closed || closed_within(&mut stream, Duration::from_secs(1)).await;
        let took = started.elapsed();
        assert!(closed, "still open after {took:?}");
        assert_eq!(stats.closed_slow.load(Ordering::Relaxed), 1);
        assert!(
            took >= limits.header_read_timeout
                && took < limits.header_read_timeout + Duration::from_secs(1),
            "closed after {took:?}"
        );
    }

    #[tokio::test]
    async fn an_idle_connection_is_closed_after_the_keep_alive_timeout_but_not_while_busy() {
        let limits = limits(16);
        let (addr, stats, _stop) = start(limits).await;
        // Never sends anything.
        let mut idle = TcpStream::connect(addr).await.unwrap();
        let started = Instant::now();
        assert!(closed_within(&mut idle, Duration::from_secs(3)).await);
        let took = started.elapsed();
        assert!(
            took >= limits.keep_alive_timeout && took < limits.header_read_timeout,
            "closed after {took:?}"
        );
        // An idle timeout longer than the header timeout holds too (hyper's own header timer
        // would have cut the connection at the header timeout).
        let long_idle = ConnectionLimits {
            keep_alive_timeout: Duration::from_millis(1500),
            header_read_timeout: Duration::from_millis(400),
            ..limits
        };
        let (other, _, _stop_other) = start(long_idle).await;
        let mut idle = TcpStream::connect(other).await.unwrap();
        let started = Instant::now();
        assert!(closed_within(&mut idle, Duration::from_secs(3)).await);
        assert!(
            started.elapsed() >= long_idle.keep_alive_timeout,
            "{:?}",
            started.elapsed()
        );
        // A request that takes longer than the idle timeout is answered; the connection then
        // stays for another request and closes only once idle again.
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = vec![0u8; 4096];
        let n = stream.read(&mut buf).await.unwrap();
        let answer = String::from_utf8_lossy(&buf[..n]).into_owned();
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with("slow"),
            "{answer}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        stream
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let n = stream.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).ends_with("ok"));
        let answered = Instant::now();
        assert!(closed_within(&mut stream, Duration::from_secs(3)).await);
        assert!(answered.elapsed() >= limits.keep_alive_timeout);
        assert!(stats.closed_idle.load(Ordering::Relaxed) >= 2);
    }

    #[tokio::test]
    async fn a_flood_of_idle_connections_is_held_to_the_cap_and_new_clients_are_served_after_it() {
        let limits = limits(8);
        let (addr, stats, _stop) = start(limits).await;
        let mut flood = Vec::new();
        for _ in 0..64 {
            flood.push(TcpStream::connect(addr).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(stats.open.load(Ordering::Relaxed), 8, "held beyond the cap");
        // A well-behaved client waits in the backlog while idle ones time out, then is answered.
        let started = Instant::now();
        let answer = tokio::time::timeout(Duration::from_secs(10), get_ok(addr, "/"))
            .await
            .expect("served once the idle flood timed out");
        assert!(answer.ends_with("ok"), "{answer}");
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(stats.open.load(Ordering::Relaxed) <= 8);
        drop(flood);
    }

    #[tokio::test]
    async fn stopping_closes_idle_connections_and_lets_a_busy_one_finish() {
        let limits = ConnectionLimits {
            keep_alive_timeout: Duration::from_secs(30),
            header_read_timeout: Duration::from_secs(30),
            ..limits(16)
        };
        let (addr, _, stop) = start(limits).await;
        let mut idle = TcpStream::connect(addr).await.unwrap();
        let busy = tokio::spawn(get_ok(addr, "/slow"));
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop.send(()).unwrap();
        assert!(closed_within(&mut idle, Duration::from_secs(1)).await);
        let answer = busy.await.unwrap();
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with("slow"),
            "{answer}"
        );
    }
}
