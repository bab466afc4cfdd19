//! The connection layer under [`crate::routes::app`]: accepting sockets, the per-connection
//! timeouts and the cap on open connections.
//!
//! Built from hyper's HTTP/1 server machinery rather than `axum::serve`, which exposes none of
//! these knobs:
//! - **header-read timeout**: hyper's `http1::Builder::header_read_timeout` with a tokio timer.
//!   Its clock starts whenever the connection waits for a request head (a new connection, and
//!   again after each response), so a client that sends half a header, or opens a socket and
//!   says nothing, is closed when it runs out. It never runs while a response is being written,
//!   so a 10-minute stream is not cut.
//! - **idle keep-alive timeout** (uvicorn's `timeout_keep_alive`, which SGLang and vLLM serve
//!   with): a connection that finished a response and has sent no byte since is closed after
//!   this long, with hyper's graceful shutdown.
//! - **body-read timeout**: tower-http's `RequestBodyTimeout`, an inactivity timeout per body
//!   frame (the body size is capped separately); a stalled upload gets a 408.
//! - **`--max-connections`**: a semaphore of open connections. Past it, a connection is served
//!   one 503 JSON error (`ApiError::TooManyConnections`) and closed; a bounded number of such
//!   refusals run at once, beyond that the socket is closed unanswered, so refusing never costs
//!   more descriptors than [`REFUSAL_SLOTS`].

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::IntoResponse;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tower::ServiceExt;

use crate::error::ApiError;

/// Connections that may be receiving their 503 at one time; more are closed unanswered.
pub const REFUSAL_SLOTS: usize = 64;

/// Descriptors `--max-connections` leaves to everything else (model file, logs, the engine,
/// refusals) when derived from the fd limit.
pub const RESERVED_FDS: u64 = 256 + REFUSAL_SLOTS as u64;

/// The longest a refused connection may take to send its request head before it is dropped.
const REFUSAL_HEADER_TIMEOUT: Duration = Duration::from_secs(2);

/// Timeouts and limits of [`serve`]. `None` turns a timeout off.
#[derive(Debug, Clone)]
pub struct ConnLimits {
    /// Longest wait for a complete request head, from the connection's first wait for it.
    pub header_read_timeout: Option<Duration>,
    /// Longest silence after a response before an idle keep-alive connection is closed.
    pub keep_alive_timeout: Option<Duration>,
    /// Longest gap between two frames of a request body (408 past it).
    pub body_read_timeout: Option<Duration>,
    /// Connections served at once; later ones get a 503 until one closes. At least 1.
    pub max_connections: usize,
}

impl Default for ConnLimits {
    /// hyper's 30 s header timeout, uvicorn's 5 s keep-alive, 60 s body gaps, and
    /// [`default_max_connections`] of the current fd limit.
    fn default() -> Self {
        ConnLimits {
            header_read_timeout: Some(Duration::from_secs(30)),
            keep_alive_timeout: Some(Duration::from_secs(5)),
            body_read_timeout: Some(Duration::from_secs(60)),
            max_connections: default_max_connections(fd_limit().unwrap_or(1024)),
        }
    }
}

/// `--max-connections` when not given: the fd limit less [`RESERVED_FDS`], at least 16.
pub fn default_max_connections(fd_limit: u64) -> usize {
    fd_limit.saturating_sub(RESERVED_FDS).clamp(16, 1 << 20) as usize
}

/// The soft `RLIMIT_NOFILE` of this process, or `None` where it cannot be read.
pub fn fd_limit() -> Option<u64> {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).ok().map(|(soft, _)| soft)
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit, as SGLang's `set_ulimit` does at start-up
/// (a 1024 soft limit is common and too low for a server). Returns the soft limit after.
pub fn raise_fd_limit() -> Option<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            // Failing leaves the old limit, which fd_limit then reports.
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
    fd_limit()
}

/// Whether a body rejection came from the body-read timeout (`tower_http`'s `TimeoutError`
/// somewhere in its source chain).
pub fn is_body_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        cur = err.source();
    }
    false
}

/// Serves `app` on `listener` under `limits` until `shutdown` resolves, then stops accepting,
/// asks every connection to close after its response in flight, and returns when all have.
/// Sets TCP_NODELAY on every connection: without it Nagle's algorithm holds small SSE frames
/// until the client's delayed ACK (~40 ms), bunching tokens and faking inter-token latencies.
///
/// `open` and `refused` are the `/metrics` gauge of connections being served and counter of
/// connections refused past the cap.
///
/// # Errors
/// None today: accept errors are logged and retried (a full fd table clears as connections
/// close), so the result is for the caller's `?`.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    open: prometheus_client::metrics::gauge::Gauge,
    refused: prometheus_client::metrics::counter::Counter,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let max = limits.max_connections.max(1);
    let slots = Arc::new(Semaphore::new(max));
    let refusals = Arc::new(Semaphore::new(REFUSAL_SLOTS));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let body_timeout = limits.body_read_timeout.unwrap_or(Duration::from_secs(100 * 365 * 86_400));
    let app = tower_http::timeout::RequestBodyTimeout::new(app, body_timeout);
    tokio::pin!(shutdown);
    loop {
        let (tcp, _) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    if !matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionAborted
                            | std::io::ErrorKind::ConnectionReset
                            | std::io::ErrorKind::ConnectionRefused
                    ) {
                        // EMFILE and the like: wait for connections to close rather than spin.
                        eprintln!("sparrow serve: accept failed ({e}); retrying in 1 s");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = tcp.set_nodelay(true);
        match slots.clone().try_acquire_owned() {
            Ok(permit) => {
                let app = app.clone();
                let limits = limits.clone();
                let stop = stop_rx.clone();
                let open = open.clone();
                tokio::spawn(async move {
                    open.inc();
                    serve_one(tcp, app, &limits, stop).await;
                    open.dec();
                    drop(permit);
                });
            }
            Err(_) => {
                refused.inc();
                if let Ok(permit) = refusals.clone().try_acquire_owned() {
                    tokio::spawn(async move {
                        refuse(tcp, max).await;
                        drop(permit);
                    });
                }
                // else: dropping `tcp` closes it unanswered.
            }
        }
    }
    let _ = stop_tx.send(true);
    // Every connection task holds one permit until it ends.
    let _ = slots.acquire_many(max as u32).await;
    Ok(())
}

/// Serves one admitted connection to its end.
async fn serve_one<S>(tcp: TcpStream, app: S, limits: &ConnLimits, mut stop: tokio::sync::watch::Receiver<bool>)
where
    S: tower::Service<hyper::Request<Incoming>, Response = axum::response::Response, Error = std::convert::Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let activity = Arc::new(Activity::default());
    let io = TokioIo::new(Tracked { inner: tcp, activity: activity.clone() });
    let act = activity.clone();
    let svc = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let guard = InFlight::begin(act.clone());
        let app = app.clone();
        async move {
            let resp = app.oneshot(req).await?;
            Ok::<_, std::convert::Infallible>(resp.map(|b| Body::new(Guarded { inner: b, _guard: guard })))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    let conn = builder.serve_connection(io, svc);
    tokio::pin!(conn);
    let mut closing = false;
    loop {
        tokio::select! {
            _ = conn.as_mut() => break,
            _ = activity.idle_for(limits.keep_alive_timeout), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            _ = stop.wait_for(|s| *s), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
        }
    }
}

/// Answers one request on a connection past `--max-connections` with a 503 and closes it.
async fn refuse(tcp: TcpStream, max: usize) {
    let svc = hyper::service::service_fn(move |_req: hyper::Request<Incoming>| async move {
        let mut resp = ApiError::TooManyConnections(max).into_response();
        // Clients back off on Retry-After (seconds).
        resp.headers_mut().insert(hyper::header::RETRY_AFTER, hyper::header::HeaderValue::from_static("1"));
        Ok::<_, std::convert::Infallible>(resp)
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(REFUSAL_HEADER_TIMEOUT).keep_alive(false);
    let _ = tokio::time::timeout(REFUSAL_HEADER_TIMEOUT * 2, builder.serve_connection(TokioIo::new(tcp), svc)).await;
}

/// What the idle keep-alive timer watches on one connection.
#[derive(Default)]
struct Activity {
    /// Requests whose response has not finished (or been dropped).
    in_flight: AtomicUsize,
    /// A byte arrived since the last response ended (the next request has begun; the
    /// header-read timeout owns it).
    read_since_idle: AtomicBool,
    /// When the last response ended; `None` before the first (the header-read timeout owns a
    /// new connection).
    idle_since: Mutex<Option<Instant>>,
    changed: Notify,
}

impl Activity {
    /// Resolves once the connection has been idle for `timeout`: no request in flight, a
    /// response finished, and no byte read since. Pending forever when `timeout` is `None`.
    async fn idle_for(&self, timeout: Option<Duration>) {
        let Some(timeout) = timeout else { return std::future::pending().await };
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let since = self.idle_since.lock().map(|g| *g).unwrap_or(None);
            let idle = self.in_flight.load(Ordering::Acquire) == 0 && !self.read_since_idle.load(Ordering::Acquire);
            match since {
                Some(t) if idle => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(t + timeout) => {
                            let same = self.idle_since.lock().map(|g| *g == Some(t)).unwrap_or(false);
                            if same
                                && self.in_flight.load(Ordering::Acquire) == 0
                                && !self.read_since_idle.load(Ordering::Acquire)
                            {
                                return;
                            }
                        }
                        _ = changed => {}
                    }
                }
                _ => changed.await,
            }
        }
    }
}

/// Counts one request in flight from its head to the end (or drop) of its response body.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn begin(a: Arc<Activity>) -> Self {
        a.in_flight.fetch_add(1, Ordering::AcqRel);
        a.changed.notify_waiters();
        InFlight(a)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(mut g) = self.0.idle_since.lock() {
            *g = Some(Instant::now());
        }
        self.0.read_since_idle.store(false, Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.changed.notify_waiters();
    }
}

/// A response body that ends its request's [`InFlight`] when it is finished or dropped.
struct Guarded {
    inner: Body,
    _guard: InFlight,
}

impl http_body::Body for Guarded {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The socket, noting reads for the idle timer.
struct Tracked {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before && !this.activity.read_since_idle.swap(true, Ordering::AcqRel) {
            this.activity.changed.notify_waiters();
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
