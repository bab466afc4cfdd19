//! Whether the server is still there, and whether the run was told to stop. A monitor probes
//! `GET /health` during the run; requests report connection-level failures as signs. When
//! the server is judged down no further request is sent, and the ones in flight get a short
//! grace before they are abandoned, so a hung server cannot hold the report back. SIGINT,
//! SIGTERM or the embedding caller's stop cancel the run; the report then says why.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{exit, RunHooks};
use crate::client::{self, ClientCtx};
use crate::record::{FailureKind, RequestRecord};
use crate::report::ServerDown;

/// How long requests in flight may go on after the server is declared down.
const ABANDON_GRACE: Duration = Duration::from_secs(5);

/// Shared state of the server-liveness watch.
#[derive(Debug, Default)]
pub(super) struct Liveness {
    /// Set once the server is judged down; no further request is sent.
    pub(super) down: CancellationToken,
    /// (seconds since start, reason) of the first sign, and of the verdict.
    pub(super) first_sign: Mutex<Option<(f64, String)>>,
    pub(super) verdict: Mutex<Option<String>>,
    /// Wakes the monitor for an immediate probe.
    pub(super) probe_now: Notify,
}

impl Liveness {
    pub(super) fn sign(&self, t: f64, reason: String) {
        if let Ok(mut s) = self.first_sign.lock() {
            if s.as_ref().is_none_or(|(t0, _)| t < *t0) {
                *s = Some((t, reason));
            }
        }
    }
    pub(super) fn declare(&self, reason: String) {
        if let Ok(mut v) = self.verdict.lock() {
            if v.is_none() {
                *v = Some(reason);
            }
        }
        self.down.cancel();
    }
}

/// One `GET /health`: `Ok(true)` answered, `Ok(false)` the endpoint does not exist (404),
/// `Err` no answer, with its cause.
pub(super) async fn probe(ctx: &ClientCtx, url: &str, timeout: Duration) -> Result<bool, FailureKind> {
    match ctx.http.get(url).headers(ctx.headers.clone()).timeout(timeout).send().await {
        Ok(r) => Ok(r.status() != reqwest::StatusCode::NOT_FOUND),
        Err(e) => Err(client::classify(&e)),
    }
}

pub(super) async fn health_monitor(
    ctx: ClientCtx,
    url: String,
    interval: Duration,
    live: Arc<Liveness>,
    stop: CancellationToken,
) {
    let mut misses = 0u32;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = live.down.cancelled() => return,
            () = tokio::time::sleep(interval) => {},
            () = live.probe_now.notified() => {},
        }
        let t = ctx.now();
        match probe(&ctx, &url, Duration::from_secs(5).max(interval * 2)).await {
            Ok(false) => return,
            Ok(true) => misses = 0,
            Err(kind) => {
                live.sign(t, format!("health probe: {}", kind.label()));
                misses += 1;
                if kind == FailureKind::ConnectionRefused {
                    live.declare("health probe: connection refused".into());
                    return;
                }
                if misses >= 3 {
                    live.declare(format!("{misses} health probes in a row got no answer ({})", kind.label()));
                    return;
                }
            }
        }
    }
}

/// Waits for SIGINT or SIGTERM; returns the exit status and a description.
pub async fn interrupted() -> (i32, String) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => return (exit::SIGINT, "SIGINT (Ctrl-C)".into()),
                _ = term.recv() => return (exit::SIGTERM, "SIGTERM".into()),
            }
        }
    }
    let _ = tokio::signal::ctrl_c().await;
    (exit::SIGINT, "SIGINT (Ctrl-C)".into())
}

/// Spawns the listener that turns SIGINT/SIGTERM (unless the caller owns signals) or the
/// caller's stop into an interruption: the reason goes to `interrupt`, and `cancel` is
/// cancelled. It ends with the run (`done`).
pub(super) fn watch_signals(
    cancel: CancellationToken,
    interrupt: Arc<Mutex<Option<(i32, String)>>>,
    hooks: RunHooks,
    done: CancellationToken,
) {
    tokio::spawn(async move {
        let signal = async {
            if hooks.ignore_signals {
                std::future::pending::<()>().await;
            }
            interrupted().await
        };
        let got = tokio::select! {
            got = signal => got,
            () = hooks.stop.cancelled() => {
                let why = hooks.stop_reason.lock().ok().and_then(|r| r.clone());
                (exit::STOPPED, why.unwrap_or_else(|| "stopped by the caller".into()))
            }
            // The run is over: no signal listener outlives it.
            () = done.cancelled() => return,
        };
        if let Ok(mut i) = interrupt.lock() {
            *i = Some(got);
        }
        cancel.cancel();
    });
}

/// The token that abandons requests in flight, cancelled [`ABANDON_GRACE`] after the server
/// is declared down (never if the run ends first, through `stop`).
pub(super) fn abandon_when_down(live: Arc<Liveness>, stop: CancellationToken) -> CancellationToken {
    // Requests still in flight get a grace period to end by themselves (a dead process resets
    // them at once), then are abandoned, so a hung server cannot hold the report back for a
    // whole --read-timeout.
    let abandon = CancellationToken::new();
    let token = abandon.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = live.down.cancelled() => {
                tokio::time::sleep(ABANDON_GRACE).await;
                abandon.cancel();
            }
            () = stop.cancelled() => {}
        }
    });
    token
}

/// The server-down verdict over the finished records: when the first sign was seen, and how
/// many requests were in flight then or never sent. `None` while the server is judged up.
pub(super) fn server_down(live: &Liveness, records: &[RequestRecord], duration_s: f64) -> Option<ServerDown> {
    live.verdict.lock().ok().and_then(|v| v.clone()).map(|verdict| {
        let (at_s, first) =
            live.first_sign.lock().ok().and_then(|s| s.clone()).unwrap_or((duration_s, verdict.clone()));
        ServerDown {
            at_s,
            in_flight: records
                .iter()
                .filter(|r| r.dispatched_s >= 0.0 && r.sent_s <= at_s && r.end_s >= at_s)
                .filter(|r| {
                    r.failure
                        .as_ref()
                        .is_none_or(|f| !matches!(f.kind, FailureKind::NotSent | FailureKind::NotSentInterrupted))
                })
                .count(),
            not_sent: records
                .iter()
                .filter(|r| r.failure.as_ref().is_some_and(|f| f.kind == FailureKind::NotSent))
                .count(),
            reason: if first == verdict { verdict } else { format!("{first}; then {verdict}") },
        }
    })
}
