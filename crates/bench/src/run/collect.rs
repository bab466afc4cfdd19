//! The collector of a run: the one place finished records arrive. It appends each to the
//! details file as it comes, one complete line per `write(2)`, so that a client killed even
//! with SIGKILL leaves every finished request on disk (a crash of the server loses nothing
//! either), and drives the progress bar; the records come back in dataset order for the
//! report.

use std::fs::File;
use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::sync::mpsc;

use super::output::details_line;
use super::RunHooks;
use crate::client::ClientCtx;
use crate::record::RequestRecord;

/// Receives every record until the last sender is dropped. `n_records` is the run's number
/// of records (their indices), `n_expected` how many this client sends (its progress bar).
/// Returns the records by index (a `None` for any that never arrived or another client
/// sent) and the bar (left on screen until the run's last probes are done). A details file
/// that refuses a line gets a warning, and no further lines.
#[allow(clippy::too_many_arguments)]
pub(super) async fn collect(
    mut rx: mpsc::UnboundedReceiver<RequestRecord>,
    n_records: usize,
    n_expected: usize,
    ctx: &ClientCtx,
    hooks: &RunHooks,
    hidden: bool,
    details: &mut File,
    details_file: &Path,
) -> (Vec<Option<RequestRecord>>, ProgressBar) {
    let pb = progress_bar(n_expected, hidden, &hooks.bar_prefix);
    let mut records: Vec<Option<RequestRecord>> = vec![None; n_records];
    let (mut failed, mut out_tokens) = (0usize, 0u64);
    let mut details_ok = true;
    let bar_message = |failed: usize, out_tokens: u64| {
        let el = ctx.now().max(1e-9);
        let extra = hooks.bar_status.lock().map(|s| s.clone()).unwrap_or_default();
        let sep = if extra.is_empty() { "" } else { " | " };
        format!("failed {failed} | out {:.0} tok/s{sep}{extra}", out_tokens as f64 / el)
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        let rec = tokio::select! {
            r = rx.recv() => match r { Some(r) => r, None => break },
            _ = tick.tick() => { pb.set_message(bar_message(failed, out_tokens)); continue; }
        };
        if details_ok {
            let mut line = details_line(&rec);
            line.push('\n');
            // One write(2) per record, made before the next record is taken: a SIGKILL at any
            // moment leaves every finished request's line whole on disk, and at most the line
            // being written torn (readers skip a torn last line). One syscall per request is
            // noise next to the request's own HTTP exchange.
            let res = details.write_all(line.as_bytes());
            if res.is_err() {
                details_ok = false;
                crate::errln!("warning: cannot write {}; per-request records stop here", details_file.display());
            }
        }
        failed += usize::from(!rec.success());
        out_tokens += rec.output_tokens;
        pb.set_message(bar_message(failed, out_tokens));
        pb.inc(1);
        let idx = rec.index;
        if let Some(slot) = records.get_mut(idx) {
            *slot = Some(rec);
        }
    }
    (records, pb)
}

fn progress_bar(n: usize, hidden: bool, prefix: &str) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(
        Some(n as u64),
        if hidden { ProgressDrawTarget::hidden() } else { ProgressDrawTarget::stderr() },
    );
    if let Ok(style) =
        ProgressStyle::with_template("{prefix}{bar:40} {pos}/{len} [{elapsed_precise}<{eta_precise}] {msg}")
    {
        pb.set_style(style);
    }
    if !prefix.is_empty() {
        pb.set_prefix(format!("{prefix} "));
    }
    pb
}
