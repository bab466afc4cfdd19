//! A whole benchmark: set-up (model, tokenizer, prompts, warmup), the timed run, the report.
//!
//! The timed run spawns one task per request. Each sleeps until its absolute due time, then
//! waits for a `--max-concurrency` slot, then sends; the three moments are recorded apart so
//! client send lag and concurrency wait never hide inside latency figures. Finished records
//! go through one channel to a collector that appends them to the details file at once (so a
//! crash of the client or the server loses nothing that finished) and drives the progress bar.
//!
//! A health monitor probes `GET /health` during the run. When the server stops answering
//! (a refused connection, or three probes in a row without an answer) no further request is
//! sent, the ones in flight end by themselves (reset or read timeout), and the report says
//! when it happened and how many were in flight. Ctrl-C or SIGTERM cancels everything and
//! reports what finished.
//!
//! - `setup`: HTTP client, headers, tokenizer, readiness wait, warmup, control POSTs;
//! - `prompts`: the dataset of the run, from the flags;
//! - `request`: the task of one request (or one conversation, round by round);
//! - `collect`: the collector of finished records (details file, progress bar);
//! - `health`: the liveness watch, signals, and the server-down verdict;
//! - `output`: file names and the result line.

mod collect;
mod health;
mod output;
mod prompts;
mod request;
mod setup;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::Value;
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::args::{BenchConfig, DatasetName};
use crate::arrivals;
use crate::client::{self, ClientCtx, LogprobOptions, RequestOptions};
use crate::dataset;
use crate::metrics::{self, BenchmarkMetrics};
use crate::record::{Failure, RequestRecord};
use crate::report::{self, RunSummary};

pub use health::interrupted;
pub(crate) use output::{append_result_line, details_line};
pub use output::{civil_from_days, default_details_file, default_output_file, unix_now};
pub use prompts::build_dataset;

use health::{health_monitor, probe, Liveness};
use prompts::mooncake_path;
use setup::{first_body, get_json, header_map, http_clients, post_control, resolve_tokenizer, wait_ready, warmup};

/// Exit status of a run (also documented in `sparrow bench --help`).
pub mod exit {
    /// Every request succeeded, or failures stayed within `--max-failure-rate`.
    pub const OK: i32 = 0;
    /// More requests failed than `--max-failure-rate` allows.
    pub const FAILURES: i32 = 1;
    /// Bad flags, or set-up failed before the run (no server, no tokenizer, no dataset).
    pub const SETUP: i32 = 2;
    /// The server stopped answering during the run.
    pub const SERVER_DOWN: i32 = 3;
    /// Interrupted by SIGINT.
    pub const SIGINT: i32 = 130;
    /// Interrupted by SIGTERM.
    pub const SIGTERM: i32 = 143;
    /// Stopped by the embedding caller through [`super::RunHooks::stop`] (the sweep, when it
    /// judges the server hung).
    pub const STOPPED: i32 = 4;
}

/// What a caller that embeds runs (the sweep) can see of a run and do to it.
#[derive(Debug, Clone, Default)]
pub struct RunHooks {
    /// Cancelling it ends the run as an interruption ([`exit::STOPPED`]) whose reason is
    /// `stop_reason`; everything finished so far is reported and saved.
    pub stop: CancellationToken,
    /// Why `stop` was cancelled, shown as the run's `interrupted` reason.
    pub stop_reason: Arc<Mutex<Option<String>>>,
    /// Stamped whenever any byte of any answer arrives.
    pub activity: Arc<client::Activity>,
    /// Printed before the progress bar (e.g. the sweep's step).
    pub bar_prefix: String,
    /// Appended to the progress bar's message, refreshed every second (e.g. server RSS).
    pub bar_status: Arc<Mutex<String>>,
    /// Leave SIGINT/SIGTERM to the caller, which stops the run through `stop` (so one owner
    /// decides what a signal means, and no race between two listeners decides it).
    pub ignore_signals: bool,
}

/// Failures before the timed run starts.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Set-up could not complete; the message says what to fix.
    #[error("{0}")]
    Setup(String),
    /// The dataset could not be built.
    #[error(transparent)]
    Dataset(#[from] dataset::DatasetError),
    /// The warmup requests all failed.
    #[error("warmup failed: {0}")]
    Warmup(Failure),
    /// The results could not be written.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

impl BenchError {
    /// The exit status for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            BenchError::Warmup(f) if f.kind.is_connection_level() => exit::SERVER_DOWN,
            _ => exit::SETUP,
        }
    }
}

/// What a finished run produced.
#[derive(Debug)]
pub struct RunOutcome {
    /// Exit status to end the process with.
    pub exit_code: i32,
    /// Run-level facts.
    pub summary: RunSummary,
    /// The figures.
    pub metrics: BenchmarkMetrics,
    /// Every request's record, in dataset order.
    pub records: Vec<RequestRecord>,
    /// The JSONL file the result line was appended to.
    pub output_file: PathBuf,
    /// The per-request details file.
    pub details_file: PathBuf,
}

/// Runs the whole benchmark described by `cfg`: set-up, warmup, timed run, report.
///
/// # Errors
/// [`BenchError`] when set-up fails before the timed run. Once the run has started, every
/// problem is a recorded result, not an error.
pub async fn run(cfg: BenchConfig) -> Result<RunOutcome, BenchError> {
    run_with(cfg, RunHooks::default()).await
}

/// [`run`], observed and stoppable through `hooks`.
///
/// # Errors
/// As [`run`].
pub async fn run_with(cfg: BenchConfig, hooks: RunHooks) -> Result<RunOutcome, BenchError> {
    let a = &cfg.args;
    let (http, fresh) = http_clients()?;
    let headers = header_map(&cfg)?;
    for w in &cfg.warnings {
        crate::errln!("warning: {w}");
    }
    // A missing dataset file is said before the wait for the server, not after it.
    if a.dataset_name == DatasetName::Mooncake {
        mooncake_path(&cfg)?;
    } else if !a.dataset_path.is_empty() && !Path::new(&a.dataset_path).exists() {
        return Err(BenchError::Setup(format!("--dataset-path {}: no such file", a.dataset_path)));
    }
    if let Some(limit) = cfg.ready_check {
        wait_ready(&http, &cfg.base_url, a.backend.api(), &headers, limit).await?;
    }

    let model = match &a.model {
        Some(m) => m.clone(),
        None => {
            let url = format!("{}/v1/models", cfg.base_url);
            let v = get_json(&http, &url, &headers).await.map_err(|e| {
                BenchError::Setup(format!("cannot list models at {url}: {e}; is the server up? (or pass --model)"))
            })?;
            v.pointer("/data/0/id")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| BenchError::Setup(format!("{url} lists no model; pass --model")))?
        }
    };
    let tokenizer = Arc::new(resolve_tokenizer(&cfg, &http, &headers).await?);
    let rows = build_dataset(&cfg, &tokenizer)?;
    if rows.is_empty() {
        return Err(BenchError::Setup("the dataset produced no prompts".into()));
    }
    crate::outln!("#Input tokens: {}", rows.iter().map(|r| r.prompt_len).sum::<u64>());
    crate::outln!("#Output tokens: {}", rows.iter().map(|r| r.output_len).sum::<u64>());

    let opts = Arc::new(RequestOptions {
        api: a.backend.api(),
        model: a.served_model_name.clone().unwrap_or(model),
        stream: !a.disable_stream,
        ignore_eos: !a.disable_ignore_eos,
        temperature: a.temperature,
        top_p: a.top_p,
        logprobs: LogprobOptions {
            return_logprob: a.return_logprob,
            top_logprobs_num: a.top_logprobs_num,
            token_ids_logprob: a.token_ids_logprob.clone(),
            logprob_start_len: a.logprob_start_len,
        },
        extra_body: cfg.extra_body.clone(),
    });
    let ids: Vec<Vec<u32>> = if a.tokenize_prompt {
        rows.iter()
            .map(|r| tokenizer.encode(&r.prompt, true))
            .collect::<Result<_, _>>()
            .map_err(|e| BenchError::Setup(format!("--tokenize-prompt: {e}")))?
    } else {
        Vec::new()
    };
    // Bodies are serialized before the clock starts so the send path does no JSON work
    // (later rounds of a conversation depend on the answers and are built when due).
    let bodies: Vec<Bytes> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| first_body(&opts, r, ids.get(i).map(Vec::as_slice), r.output_len))
        .collect();
    let mut ctx = ClientCtx {
        http: http.clone(),
        fresh,
        url: format!("{}{}", cfg.base_url, opts.api.path()),
        headers: headers.clone(),
        api: opts.api,
        stream: opts.stream,
        read_timeout: cfg.read_timeout,
        request_timeout: cfg.request_timeout,
        tokenizer: tokenizer.clone(),
        t0: Instant::now(),
        activity: hooks.activity.clone(),
    };
    let warm_body = first_body(&opts, &rows[0], ids.first().map(Vec::as_slice), rows[0].output_len.min(32));
    warmup(&ctx, warm_body, &rows[0], a.warmup_requests, &hooks.stop).await?;
    // Control calls are the run's, not each client's: only client 0 makes them (a late
    // client flushing the cache would wipe the others' prefixes mid-run).
    let past_start = a.start_at.is_some_and(|t| output::unix_now() > t);
    if a.flush_cache && a.client_index == 0 && past_start && a.client_count > 1 {
        crate::errln!("warning: --start-at has passed; not flushing the cache under the other clients' requests");
    } else if a.flush_cache && a.client_index == 0 {
        // SGLang's flush_server_cache: vLLM (and LMDeploy) reset their prefix cache elsewhere.
        let url = if a.backend.is_sglang() {
            format!("{}/flush_cache?timeout={}", cfg.base_url, cfg.flush_cache_timeout.as_secs_f64())
        } else if matches!(a.backend, crate::client::Backend::Vllm | crate::client::Backend::VllmChat) {
            format!("{}/reset_prefix_cache", cfg.base_url)
        } else {
            format!("{}/flush_cache", cfg.base_url)
        };
        post_control(&http, &url, &headers, cfg.flush_cache_timeout + Duration::from_secs(10)).await;
    }
    if a.profile && a.client_index == 0 {
        crate::outln!("Starting profiler...");
        if post_control(&http, &format!("{}/start_profile", cfg.base_url), &headers, Duration::from_secs(60)).await {
            crate::outln!("Profiler started");
        }
    }
    let trace = a.dataset_name == DatasetName::Mooncake;
    if trace {
        crate::outln!(
            "Replaying the Mooncake trace at its timestamps (slowdown {}), ignoring --request-rate.",
            a.mooncake_slowdown_factor
        );
    }

    let output_file = a.output_file.clone().unwrap_or_else(|| default_output_file(&cfg));
    let details_file = a.details_file.clone().unwrap_or_else(|| default_details_file(&output_file));
    // One run per details file: a rerun with the same output name starts it afresh.
    // Unbuffered: the collector writes each record in one `write`, so nothing waits in memory.
    let mut details =
        std::fs::File::create(&details_file).map_err(|source| BenchError::Io { path: details_file.clone(), source })?;

    let mut rng = StdRng::seed_from_u64(a.seed ^ 0x5eed_a441);
    let offsets = if trace {
        rows.iter().map(|r| r.arrival_s.unwrap_or(0.0)).collect()
    } else {
        arrivals::arrival_offsets(rows.len(), a.request_rate, a.burstiness, &mut rng)
    };
    // Every round of a conversation is a record of its own: row i's rounds are records
    // first_index[i] .. first_index[i] + 1 + turns.
    let mut first_index = Vec::with_capacity(rows.len());
    let mut n_records = 0usize;
    for r in &rows {
        first_index.push(n_records);
        n_records += 1 + r.turns.len();
    }
    let owned: Vec<usize> = (0..rows.len()).filter(|&i| cfg.owns_row(i)).collect();
    let n_owned: usize = owned.iter().map(|&i| 1 + rows[i].turns.len()).sum();
    if cfg.args.client_count > 1 {
        crate::outln!(
            "Client {} of {}: {} of {} requests (dataset positions i with i % {} == {}).",
            a.client_index,
            a.client_count,
            n_owned,
            n_records,
            a.client_count,
            a.client_index
        );
    }
    let rows = Arc::new(rows);
    let sem = cfg.client_max_concurrency().map(|c| Arc::new(Semaphore::new(c)));
    let cancel = CancellationToken::new();
    let live = Arc::new(Liveness::default());
    let stop_monitor = CancellationToken::new();
    let (tx, rx) = mpsc::unbounded_channel::<RequestRecord>();

    ctx.t0 = match a.start_at {
        None => Instant::now(),
        Some(at) => start_at(at, &hooks.stop).await,
    };
    let ctx = Arc::new(ctx);
    if let Some(interval) = cfg.health_interval {
        tokio::spawn(health_monitor(
            (*ctx).clone(),
            format!("{}/health", cfg.base_url),
            interval,
            live.clone(),
            stop_monitor.clone(),
        ));
    }
    let interrupt: Arc<Mutex<Option<(i32, String)>>> = Arc::default();
    health::watch_signals(cancel.clone(), interrupt.clone(), hooks.clone(), stop_monitor.clone());
    let abandon = health::abandon_when_down(live.clone(), stop_monitor.clone());
    let shared = request::Shared {
        ctx: ctx.clone(),
        tx,
        sem,
        cancel: cancel.clone(),
        live: live.clone(),
        abandon,
        rows,
        opts,
        print_requests: a.print_requests,
    };
    for (i, body) in bodies.into_iter().enumerate() {
        if cfg.owns_row(i) {
            request::spawn(shared.clone(), i, first_index[i], body, offsets[i]);
        }
    }
    // The collector ends when the last sender is gone: the tasks' clones, then this one.
    drop(shared);

    let (records, pb) =
        collect::collect(rx, n_records, n_owned, &ctx, &hooks, a.disable_tqdm, &mut details, &details_file).await;
    let duration_s = ctx.now();
    stop_monitor.cancel();
    if a.profile && a.client_index == 0 {
        crate::outln!("Stopping profiler...");
        if post_control(&http, &format!("{}/stop_profile", cfg.base_url), &headers, Duration::from_secs(300)).await {
            crate::outln!("Profiler stopped");
        }
    }
    // Requests broke at the connection level but the monitor had no time to look (e.g. all
    // streams were cut at once at the end): one last probe decides whether the server is gone.
    let signs = live.first_sign.lock().ok().is_some_and(|s| s.is_some());
    if signs && !live.down.is_cancelled() {
        if let Err(kind) = probe(&ctx, &format!("{}/health", cfg.base_url), Duration::from_secs(5)).await {
            live.declare(format!("health probe after the run: {}", kind.label()));
        }
    }
    pb.finish_and_clear();
    let records: Vec<RequestRecord> = records.into_iter().flatten().collect();

    let interrupted = interrupt.lock().ok().and_then(|i| i.clone());
    let server_down = health::server_down(&live, &records, duration_s);
    let server_info = if server_down.is_some() {
        None
    } else {
        match get_json(&http, &format!("{}/server_info", cfg.base_url), &headers).await {
            Ok(v) => Some(v),
            Err(_) => get_json(&http, &format!("{}/get_server_info", cfg.base_url), &headers).await.ok(),
        }
    };
    let metrics = metrics::calculate(&records, duration_s, |t| retokenized_len(&tokenizer, t));
    let summary = RunSummary {
        backend: a.backend.name().into(),
        dataset_name: a.dataset_name.name().into(),
        request_rate: a.request_rate,
        request_rate_trace: trace,
        goodput: (!cfg.goodput.is_empty()).then(|| metrics::goodput(&records, &cfg.goodput, duration_s)),
        max_concurrency: a.max_concurrency,
        sharegpt_output_len: a.sharegpt_output_len,
        random_input_len: a.random_input_len,
        random_output_len: a.random_output_len,
        random_range_ratio: a.random_range_ratio,
        tag: a.tag.clone(),
        duration_s,
        server_info,
        server_down,
        interrupted: interrupted.as_ref().map(|i| i.1.clone()),
        client: cfg.multi_client().then(|| report::ClientInfo {
            index: Some(a.client_index),
            count: a.client_count,
            start_at: a.start_at,
            max_concurrency: cfg.client_max_concurrency(),
            tokenizer: Some(tokenizer.source().to_path_buf()),
        }),
    };
    crate::out!("{}", report::render_block(&summary, &metrics));
    output::append_result_line(&summary, &metrics, &records, a.output_details, a.strict_json, &output_file)?;

    let total = records.len().max(1);
    let exit_code = if let Some((code, _)) = interrupted {
        code
    } else if summary.server_down.is_some() {
        exit::SERVER_DOWN
    } else if metrics.failed as f64 / total as f64 > a.max_failure_rate {
        exit::FAILURES
    } else {
        exit::OK
    };
    Ok(RunOutcome { exit_code, summary, metrics, records, output_file, details_file })
}

/// Tokens of a generated text counted by the client's tokenizer ("Total generated tokens
/// (retokenized)"); 0 when it cannot encode it.
pub(crate) fn retokenized_len(tokenizer: &sparrow_tokenizer::Tokenizer, text: &str) -> u64 {
    tokenizer.encode(text, false).map_or(0, |ids| ids.len() as u64)
}

/// Waits for `--start-at` (unix seconds) and returns the run's clock origin: that moment as
/// an `Instant`. A client that gets there late (a slow warmup) starts at once, with its
/// origin still at `at`, so its requests keep their places on the shared timeline and the
/// lateness shows as send lag instead of shifting every time.
async fn start_at(at: f64, stop: &CancellationToken) -> Instant {
    let wait = at - output::unix_now();
    if let Ok(d) = Duration::try_from_secs_f64(wait) {
        crate::outln!("Waiting {wait:.1} s for --start-at {at:.3}...");
        tokio::select! {
            () = tokio::time::sleep(d) => {}
            () = stop.cancelled() => {}
        }
    }
    let late = (output::unix_now() - at).max(0.0);
    if late > 1.0 {
        crate::errln!("warning: --start-at {at:.3} was {late:.1} s ago; the first requests go out late");
    }
    let now = Instant::now();
    match Duration::try_from_secs_f64(late).ok().and_then(|d| now.checked_sub(d)) {
        Some(t0) => t0,
        None => {
            crate::errln!("warning: cannot place the clock origin {late:.1} s back; counting from now");
            now
        }
    }
}
