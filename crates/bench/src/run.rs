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

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::Value;
use sparrow_tokenizer::Tokenizer;
use tokio::sync::{mpsc, Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::args::{BenchConfig, DatasetName, GroupDistribution};
use crate::client::{self, ClientCtx, PromptInput, RequestOptions};
use crate::dataset::{self, DatasetRow, GspSpec, MooncakeSpec, RandomSpec, ShareGptSpec};
use crate::metrics::{self, BenchmarkMetrics};
use crate::record::{Failure, FailureKind, RequestRecord, TokenCountSource, Turn};
use crate::report::{self, RunSummary, ServerDown};
use crate::schedule;

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

/// How long requests in flight may go on after the server is declared down.
const ABANDON_GRACE: Duration = Duration::from_secs(5);

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

fn http_client() -> Result<reqwest::Client, BenchError> {
    reqwest::Client::builder()
        .pool_max_idle_per_host(usize::MAX)
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(10))
        .no_proxy()
        .build()
        .map_err(|e| BenchError::Setup(format!("cannot build HTTP client: {e}")))
}

/// GET `url` as JSON with a short timeout; `None` on any failure (calls made outside the timed
/// run must never abort it).
async fn get_json(http: &reqwest::Client, url: &str, headers: &reqwest::header::HeaderMap) -> Result<Value, String> {
    let resp = http
        .get(url)
        .headers(headers.clone())
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("HTTP {}", resp.status()));
    }
    resp.json::<Value>().await.map_err(|e| e.to_string())
}

fn header_map(cfg: &BenchConfig) -> Result<reqwest::header::HeaderMap, BenchError> {
    use reqwest::header::{HeaderName, HeaderValue};
    let mut h = reqwest::header::HeaderMap::new();
    if let Ok(key) = std::env::var("OPENAI_API_KEY") {
        if let Ok(v) = HeaderValue::from_str(&format!("Bearer {key}")) {
            h.insert(reqwest::header::AUTHORIZATION, v);
        }
    }
    for (k, v) in &cfg.headers {
        let name = HeaderName::from_bytes(k.as_bytes()).map_err(|e| BenchError::Setup(format!("--header {k}: {e}")))?;
        let value = HeaderValue::from_str(v).map_err(|e| BenchError::Setup(format!("--header {k}: {e}")))?;
        h.insert(name, value);
    }
    Ok(h)
}

/// Picks the tokenizer: `--tokenizer`, else `--model` when it is a local path, else the path
/// the server reports in `/get_model_info` when this machine can read it.
async fn resolve_tokenizer(
    cfg: &BenchConfig,
    http: &reqwest::Client,
    headers: &reqwest::header::HeaderMap,
) -> Result<Tokenizer, BenchError> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(t) = &cfg.args.tokenizer {
        candidates.push(t.clone());
    } else {
        if let Some(m) = cfg.args.model.as_deref().map(PathBuf::from).filter(|p| p.exists()) {
            candidates.push(m);
        }
        if let Ok(info) = get_json(http, &format!("{}/get_model_info", cfg.base_url), headers).await {
            for key in ["tokenizer_path", "model_path"] {
                if let Some(p) = info.get(key).and_then(Value::as_str).map(PathBuf::from).filter(|p| p.exists()) {
                    candidates.push(p);
                }
            }
        }
    }
    let Some(path) = candidates.first() else {
        return Err(BenchError::Setup(
            "no tokenizer: pass --tokenizer (a tokenizer.json, a directory holding one, or a GGUF file)".into(),
        ));
    };
    Tokenizer::load(path).map_err(|e| BenchError::Setup(format!("--tokenizer {}: {e}", path.display())))
}

fn sharegpt_path(cfg: &BenchConfig) -> Result<PathBuf, BenchError> {
    if cfg.args.dataset_path.is_empty() {
        sparrow_assets::ensure(sparrow_assets::SHAREGPT_JSON)
            .map_err(|e| BenchError::Setup(format!("ShareGPT dataset: {e}")))
    } else {
        Ok(PathBuf::from(&cfg.args.dataset_path))
    }
}

/// Builds every prompt of the run.
///
/// # Errors
/// [`BenchError::Dataset`] or [`BenchError::Setup`] when the dataset cannot be built.
pub fn build_dataset(cfg: &BenchConfig, tok: &Tokenizer) -> Result<Vec<DatasetRow>, BenchError> {
    let a = &cfg.args;
    let mut rng = StdRng::seed_from_u64(a.seed);
    let rspec = RandomSpec {
        num_prompts: a.num_prompts,
        input_len: a.random_input_len,
        output_len: a.random_output_len,
        range_ratio: a.random_range_ratio,
    };
    Ok(match a.dataset_name {
        DatasetName::Random => {
            // Check the flags before the (slow) dataset load.
            dataset::check_room(tok, rspec.input_len)?;
            let mut pairs = dataset::load_sharegpt(&sharegpt_path(cfg)?)?;
            dataset::rotate(&mut pairs, a.dataset_offset);
            dataset::random(tok, &pairs, rspec, &mut rng)?
        }
        DatasetName::RandomIds => dataset::random_ids(tok, rspec, &mut rng)?,
        DatasetName::ShareGpt => {
            let mut pairs = dataset::load_sharegpt(&sharegpt_path(cfg)?)?;
            dataset::rotate(&mut pairs, a.dataset_offset);
            let spec = ShareGptSpec {
                num_prompts: a.num_prompts,
                output_len: a.sharegpt_output_len,
                context_len: a.sharegpt_context_len,
                apply_chat_template: a.apply_chat_template,
            };
            dataset::sharegpt(tok, &pairs, spec, &mut rng)?
        }
        DatasetName::GeneratedSharedPrefix => {
            let spec = GspSpec {
                num_groups: a.gsp_num_groups,
                prompts_per_group: a.gsp_prompts_per_group,
                system_prompt_len: a.gsp_system_prompt_len,
                question_len: a.gsp_question_len,
                output_len: a.gsp_output_len,
                range_ratio: a.gsp_range_ratio,
                num_turns: a.gsp_num_turns,
                ordered: a.gsp_ordered,
                zipf_alpha: a.gsp_zipf_alpha.filter(|_| a.gsp_group_distribution == GroupDistribution::Zipf),
                fast_prepare: a.gsp_fast_prepare,
                routing_key_prefix: a.gsp_send_routing_key.then(routing_key_prefix),
                seed: a.seed,
            };
            dataset::generated_shared_prefix(tok, spec, &mut rng)?
        }
        DatasetName::Custom => dataset::custom(
            tok,
            Path::new(&a.dataset_path),
            a.num_prompts,
            a.sharegpt_output_len,
            a.apply_chat_template,
            a.dataset_offset,
        )?,
        DatasetName::OpenAi => {
            dataset::openai(tok, Path::new(&a.dataset_path), a.num_prompts, a.sharegpt_output_len, a.dataset_offset)?
        }
        DatasetName::Mooncake => {
            let path = mooncake_path(cfg)?;
            let spec = MooncakeSpec {
                num_sessions: a.num_prompts,
                num_rounds: a.mooncake_num_rounds,
                slowdown: a.mooncake_slowdown_factor,
                offset: a.dataset_offset,
            };
            dataset::mooncake(tok, &path, spec)?
        }
        other => {
            return Err(BenchError::Setup(format!("--dataset-name {} is not supported by sparrow bench", other.name())))
        }
    })
}

/// The trace file of a `mooncake` run: `--dataset-path`, else SGLang's download location
/// `/tmp/<workload>_trace.jsonl` (sparrow bench does not download it).
fn mooncake_path(cfg: &BenchConfig) -> Result<PathBuf, BenchError> {
    let a = &cfg.args;
    let path = if a.dataset_path.is_empty() {
        PathBuf::from(format!("/tmp/{}_trace.jsonl", a.mooncake_workload.name()))
    } else {
        PathBuf::from(&a.dataset_path)
    };
    if !path.exists() {
        return Err(BenchError::Setup(format!(
            "mooncake trace {} not found: pass --dataset-path, or save the {} trace of the Mooncake \
             repository (FAST25-release/traces) there",
            path.display(),
            a.mooncake_workload.name()
        )));
    }
    Ok(path)
}

/// The run's routing-key prefix, `<8 hex digits>_<UTC yyyymmddHHMMSS>`, as SGLang builds it
/// (it uses local time) so keys differ between runs.
fn routing_key_prefix() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = now.as_secs() as i64;
    let (y, mo, d) = civil_from_days(secs.div_euclid(86_400));
    let tod = secs.rem_euclid(86_400);
    let r: u32 = rand::random();
    format!("{r:08x}_{y:04}{mo:02}{d:02}{:02}{:02}{:02}", tod / 3600, tod % 3600 / 60, tod % 60)
}

/// SGLang's default output file name: `{backend}_{MMDD}_{n}_{in}_{out}.jsonl` for the random
/// datasets, else `{backend}_{MMDD}_{n}_{dataset}.jsonl` (date in UTC).
pub fn default_output_file(cfg: &BenchConfig) -> PathBuf {
    let days =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() / 86_400) as i64;
    let (_, m, d) = civil_from_days(days);
    let a = &cfg.args;
    let b = a.backend.name();
    PathBuf::from(match a.dataset_name {
        DatasetName::Random | DatasetName::RandomIds => {
            format!("{b}_{m:02}{d:02}_{}_{}_{}.jsonl", a.num_prompts, a.random_input_len, a.random_output_len)
        }
        other => format!("{b}_{m:02}{d:02}_{}_{}.jsonl", a.num_prompts, other.name()),
    })
}

/// Proleptic Gregorian date of a day count since 1970-01-01 (H. Hinnant, "chrono-Compatible
/// Low-Level Date Algorithms", `civil_from_days`).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// The details file beside `output`: `x.jsonl` → `x.requests.jsonl`.
pub fn default_details_file(output: &Path) -> PathBuf {
    let stem = output.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    output.with_file_name(format!("{stem}.requests.jsonl"))
}

fn new_record(index: usize, prompt_len: u64, output_len: u64, scheduled_s: f64) -> RequestRecord {
    RequestRecord {
        index,
        turn: None,
        prompt_len,
        requested_output_len: output_len,
        scheduled_s,
        dispatched_s: -1.0,
        sent_s: scheduled_s,
        first_byte_s: None,
        chunks: Vec::new(),
        end_s: scheduled_s,
        output_tokens: 0,
        output_tokens_source: TokenCountSource::Server,
        finish_reason: None,
        text: String::new(),
        failure: None,
    }
}

/// Shared state of the server-liveness watch.
#[derive(Debug, Default)]
struct Liveness {
    /// Set once the server is judged down; no further request is sent.
    down: CancellationToken,
    /// (seconds since start, reason) of the first sign, and of the verdict.
    first_sign: Mutex<Option<(f64, String)>>,
    verdict: Mutex<Option<String>>,
    /// Wakes the monitor for an immediate probe.
    probe_now: Notify,
}

impl Liveness {
    fn sign(&self, t: f64, reason: String) {
        if let Ok(mut s) = self.first_sign.lock() {
            if s.as_ref().is_none_or(|(t0, _)| t < *t0) {
                *s = Some((t, reason));
            }
        }
    }
    fn declare(&self, reason: String) {
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
async fn probe(ctx: &ClientCtx, url: &str, timeout: Duration) -> Result<bool, FailureKind> {
    match ctx.http.get(url).headers(ctx.headers.clone()).timeout(timeout).send().await {
        Ok(r) => Ok(r.status() != reqwest::StatusCode::NOT_FOUND),
        Err(e) => Err(client::classify(&e)),
    }
}

async fn health_monitor(ctx: ClientCtx, url: String, interval: Duration, live: Arc<Liveness>, stop: CancellationToken) {
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

/// Runs warmup requests (concurrently) with the first prompt, at most 32 output tokens.
async fn warmup(
    ctx: &ClientCtx,
    body: Bytes,
    row: &DatasetRow,
    n: usize,
    stop: &CancellationToken,
) -> Result<(), BenchError> {
    if n == 0 {
        return Ok(());
    }
    crate::outln!("Starting warmup with {n} sequences...");
    let never = CancellationToken::new();
    let futs = (0..n).map(|i| {
        let body = body.clone();
        let never = never.clone();
        async move {
            let mut rec = new_record(i, row.prompt_len, row.output_len.min(32), 0.0);
            client::send(ctx, body, &mut rec, stop, &never, row.routing_key.as_deref()).await;
            rec
        }
    });
    let recs = futures_util::future::join_all(futs).await;
    if let Some(f) = recs.iter().find_map(|r| r.failure.clone()).filter(|_| recs.iter().all(|r| !r.success())) {
        return Err(BenchError::Warmup(f));
    }
    crate::outln!("Warmup completed with {n} sequences. Starting main benchmark run...");
    Ok(())
}

/// The body of the first (or only) round of `row`; `ids` with `--tokenize-prompt`.
fn first_body(opts: &RequestOptions, row: &DatasetRow, ids: Option<&[u32]>, max_tokens: u64) -> Bytes {
    let input = match (ids, &row.messages) {
        (Some(ids), _) => PromptInput::Ids(ids),
        (None, Some(m)) => PromptInput::Messages(m),
        (None, None) => PromptInput::Text(&row.prompt),
    };
    Bytes::from(client::build_body(opts, input, max_tokens, &row.extra_body).to_string())
}

/// Waits until `GET {base}/v1/models` (Triton: `/v2/health/ready`) answers 200 (SGLang's
/// `wait_for_endpoint`), polling once a second.
async fn wait_ready(
    http: &reqwest::Client,
    base: &str,
    api: crate::client::Api,
    headers: &reqwest::header::HeaderMap,
    limit: Duration,
) -> Result<(), BenchError> {
    // Triton (TensorRT-LLM) has no OpenAI routes; its readiness route is /v2/health/ready.
    let path = if api == crate::client::Api::Trt { "/v2/health/ready" } else { "/v1/models" };
    let url = format!("{base}{path}");
    let start = Instant::now();
    crate::outln!("Waiting up to {}s for {url} to become ready...", limit.as_secs());
    loop {
        let ok = http
            .get(&url)
            .headers(headers.clone())
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .is_ok_and(|r| r.status() == reqwest::StatusCode::OK);
        if ok {
            crate::outln!("Server ready in {:.1}s.", start.elapsed().as_secs_f64());
            return Ok(());
        }
        if start.elapsed() >= limit {
            return Err(BenchError::Setup(format!(
                "server at {url} is not ready after {}s (--ready-check-timeout-sec)",
                limit.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_secs(1).min(limit.saturating_sub(start.elapsed()))).await;
    }
}

/// POSTs a control endpoint (`/flush_cache`, `/start_profile`, ...); a failure is a warning,
/// never the end of the run.
async fn post_control(http: &reqwest::Client, url: &str, headers: &reqwest::header::HeaderMap, timeout: Duration) -> bool {
    match http.post(url).headers(headers.clone()).timeout(timeout).send().await {
        Ok(r) if r.status().is_success() => true,
        Ok(r) => {
            crate::errln!("warning: POST {url}: HTTP {}", r.status());
            false
        }
        Err(e) => {
            crate::errln!("warning: POST {url} failed: {e}");
            false
        }
    }
}

/// Unix time in seconds, for `--print-requests` lines.
fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
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

/// One details-file line: the record plus its derived latencies, serialized straight from the
/// record (no `Value` tree: this runs once per finished request while the run goes on).
fn details_line(r: &RequestRecord) -> String {
    #[derive(serde::Serialize)]
    struct Line<'a> {
        #[serde(flatten)]
        record: &'a RequestRecord,
        success: bool,
        ttft: Option<f64>,
        e2e: f64,
        itl: Vec<f64>,
    }
    let line = Line { record: r, success: r.success(), ttft: r.ttft(), e2e: r.e2e(), itl: r.itl().0 };
    serde_json::to_string(&line).unwrap_or_default()
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
    let http = http_client()?;
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
    if a.flush_cache {
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
    if a.profile {
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
    let details =
        std::fs::File::create(&details_file).map_err(|source| BenchError::Io { path: details_file.clone(), source })?;
    let mut details = std::io::BufWriter::new(details);

    let mut rng = StdRng::seed_from_u64(a.seed ^ 0x5eed_a441);
    let offsets = if trace {
        rows.iter().map(|r| r.arrival_s.unwrap_or(0.0)).collect()
    } else {
        schedule::arrival_offsets(rows.len(), a.request_rate, a.burstiness, &mut rng)
    };
    // Every round of a conversation is a record of its own: row i's rounds are records
    // first_index[i] .. first_index[i] + 1 + turns.
    let mut first_index = Vec::with_capacity(rows.len());
    let mut n_records = 0usize;
    for r in &rows {
        first_index.push(n_records);
        n_records += 1 + r.turns.len();
    }
    let rows = Arc::new(rows);
    let sem = a.max_concurrency.map(|c| Arc::new(Semaphore::new(c)));
    let cancel = CancellationToken::new();
    let live = Arc::new(Liveness::default());
    let stop_monitor = CancellationToken::new();
    let (tx, mut rx) = mpsc::unbounded_channel::<RequestRecord>();

    ctx.t0 = Instant::now();
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
    {
        let (cancel, interrupt, hooks, done) = (cancel.clone(), interrupt.clone(), hooks.clone(), stop_monitor.clone());
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
    // Once the server is declared down, requests still in flight get a grace period to end
    // by themselves (a dead process resets them at once), then are abandoned, so a hung server
    // cannot hold the report back for a whole --read-timeout.
    let abandon = CancellationToken::new();
    {
        let (live, abandon, stop) = (live.clone(), abandon.clone(), stop_monitor.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = live.down.cancelled() => {
                    tokio::time::sleep(ABANDON_GRACE).await;
                    abandon.cancel();
                }
                () = stop.cancelled() => {}
            }
        });
    }
    let print_requests = a.print_requests;
    for (i, body) in bodies.into_iter().enumerate() {
        let (ctx, tx, sem, cancel, live, abandon, rows, opts) = (
            ctx.clone(),
            tx.clone(),
            sem.clone(),
            cancel.clone(),
            live.clone(),
            abandon.clone(),
            rows.clone(),
            opts.clone(),
        );
        let base = first_index[i];
        let mut rec = new_record(base, rows[i].prompt_len, rows[i].output_len, offsets[i]);
        rec.turn = (!rows[i].turns.is_empty()).then_some(Turn { conversation: i, round: 0 });
        let due = ctx.t0 + Duration::from_secs_f64(offsets[i]);
        tokio::spawn(async move {
            let row = &rows[i];
            // A conversation that cannot start takes all its rounds with it.
            let not_sent = |mut rec: RequestRecord, kind: FailureKind, msg: &str| {
                let end = ctx.now();
                for r in 0..=row.turns.len() {
                    if r > 0 {
                        rec = new_record(base + r, 0, row.output_len, rec.scheduled_s);
                        rec.turn = Some(Turn { conversation: i, round: r });
                    }
                    rec.end_s = end;
                    rec.failure = Some(Failure { kind, message: msg.into() });
                    let _ = tx.send(rec.clone());
                }
            };
            tokio::select! {
                () = tokio::time::sleep_until(due.into()) => {},
                () = cancel.cancelled() => { not_sent(rec, FailureKind::NotSentInterrupted, "interrupted before send"); return; }
                () = live.down.cancelled() => { not_sent(rec, FailureKind::NotSent, "server down before send"); return; }
            }
            rec.dispatched_s = ctx.now();
            // One slot per conversation, held through all its rounds (as SGLang's client).
            let _permit = match &sem {
                None => None,
                Some(s) => tokio::select! {
                    p = s.clone().acquire_owned() => p.ok(),
                    () = cancel.cancelled() => { not_sent(rec, FailureKind::NotSentInterrupted, "interrupted before send"); return; }
                    () = live.down.cancelled() => { not_sent(rec, FailureKind::NotSent, "server down before send"); return; }
                },
            };
            let mut history: Vec<Value> = Vec::new();
            let mut body = body;
            for round in 0..=row.turns.len() {
                if round > 0 {
                    // The earlier rounds and their answers, then this round's question.
                    history.push(serde_json::json!({"role": "user", "content": row.turns[round - 1]}));
                    let t = ctx.now();
                    let msgs: Vec<sparrow_tokenizer::ChatMessage> = history
                        .iter()
                        .map(|m| sparrow_tokenizer::ChatMessage {
                            role: m["role"].as_str().unwrap_or("user").to_owned(),
                            content: m["content"].as_str().unwrap_or("").to_owned(),
                        })
                        .collect();
                    // An estimate (the templated history, else its contents); the server's own
                    // count replaces it when it reports one.
                    let tok = &ctx.tokenizer;
                    let prompt_len = match tok.apply_chat_template(&msgs, true) {
                        Ok(text) => tok.encode(&text, false).map_or(0, |ids| ids.len() as u64),
                        Err(_) => msgs.iter().map(|m| tok.encode(&m.content, false).map_or(0, |ids| ids.len() as u64)).sum(),
                    };
                    rec = new_record(base + round, prompt_len, row.output_len, t);
                    rec.turn = Some(Turn { conversation: i, round });
                    rec.dispatched_s = t;
                    body = Bytes::from(
                        client::build_body(&opts, PromptInput::Messages(&history), row.output_len, &row.extra_body)
                            .to_string(),
                    );
                }
                let start_unix = unix_now();
                if print_requests {
                    crate::outln!(
                        "rid={} time={start_unix:.6} message=\"request start\" prompt_len={} output_len={}",
                        rec.index, rec.prompt_len, rec.requested_output_len
                    );
                }
                if live.down.is_cancelled() {
                    rec.end_s = ctx.now();
                    rec.failure = Some(Failure { kind: FailureKind::NotSent, message: "server down before send".into() });
                } else if cancel.is_cancelled() {
                    rec.end_s = ctx.now();
                    rec.failure = Some(Failure { kind: FailureKind::NotSentInterrupted, message: "interrupted before send".into() });
                } else {
                    client::send(&ctx, std::mem::take(&mut body), &mut rec, &cancel, &abandon, row.routing_key.as_deref())
                        .await;
                }
                if print_requests {
                    let now = unix_now();
                    crate::outln!(
                        "rid={} time={now:.6} time_delta={:.6} message=\"request end\" success={} output_tokens={} ttft={} error={:?}",
                        rec.index,
                        now - start_unix,
                        rec.success(),
                        rec.output_tokens,
                        rec.ttft().map_or("none".into(), |t| format!("{t:.6}")),
                        rec.failure.as_ref().map_or(String::new(), |f| format!("{}: {}", f.kind.label(), f.message)),
                    );
                }
                if let Some(f) = &rec.failure {
                    if f.kind.is_connection_level() {
                        live.sign(rec.end_s, format!("request {}: {}", rec.index, f.kind.label()));
                        live.probe_now.notify_one();
                    }
                    if f.kind == FailureKind::ConnectionRefused {
                        live.declare("requests: connection refused".into());
                    }
                }
                if round < row.turns.len() {
                    // Only a conversation with rounds to come keeps a history.
                    if round == 0 {
                        history = match &row.messages {
                            Some(m) => m.clone(),
                            None => vec![serde_json::json!({"role": "user", "content": row.prompt})],
                        };
                    }
                    // A failed round's answer is empty, and the conversation goes on (as SGLang's).
                    history.push(serde_json::json!({"role": "assistant", "content": rec.text}));
                }
                let _ = tx.send(std::mem::replace(&mut rec, new_record(0, 0, 0, 0.0)));
            }
        });
    }
    drop(tx);

    let pb = progress_bar(n_records, a.disable_tqdm, &hooks.bar_prefix);
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
            let line = details_line(&rec);
            // Flushed whenever no other record is waiting: a crash loses nothing that finished,
            // and a burst of completions costs one write.
            let res = writeln!(details, "{line}").and_then(|()| if rx.is_empty() { details.flush() } else { Ok(()) });
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
        records[idx] = Some(rec);
    }
    let duration_s = ctx.now();
    if details_ok && details.flush().is_err() {
        crate::errln!("warning: cannot write {}", details_file.display());
    }
    stop_monitor.cancel();
    if a.profile {
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
    let server_down = live.verdict.lock().ok().and_then(|v| v.clone()).map(|verdict| {
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
    });
    let server_info = if server_down.is_some() {
        None
    } else {
        match get_json(&http, &format!("{}/server_info", cfg.base_url), &headers).await {
            Ok(v) => Some(v),
            Err(_) => get_json(&http, &format!("{}/get_server_info", cfg.base_url), &headers).await.ok(),
        }
    };
    let metrics =
        metrics::calculate(&records, duration_s, |t| tokenizer.encode(t, false).map_or(0, |ids| ids.len() as u64));
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
    };
    crate::out!("{}", report::render_block(&summary, &metrics));
    let mut pairs = report::result_pairs(&summary, &metrics);
    if a.output_details {
        use serde_json::json;
        let d = |f: &dyn Fn(&RequestRecord) -> Value| -> report::JVal {
            Value::Array(records.iter().map(f).collect()).into()
        };
        pairs.push(("input_lens".into(), d(&|r| json!(r.prompt_len))));
        pairs.push(("output_lens".into(), d(&|r| json!(r.output_tokens))));
        pairs.push(("ttfts".into(), d(&|r| json!(r.ttft().unwrap_or(0.0)))));
        pairs.push(("itls".into(), d(&|r| json!(r.itl().0))));
        pairs.push(("generated_texts".into(), d(&|r| json!(r.text))));
        pairs.push((
            "errors".into(),
            d(&|r| json!(r.failure.as_ref().map_or(String::new(), |f| format!("{}: {}", f.kind.label(), f.message)))),
        ));
    }
    let line = report::to_json_line(&pairs, a.strict_json);
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&output_file)
        .and_then(|mut f| writeln!(f, "{line}"))
        .map_err(|source| BenchError::Io { path: output_file.clone(), source })?;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_786), (2026, 11, 29));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn details_file_beside_output() {
        assert_eq!(default_details_file(Path::new("out/x.jsonl")), PathBuf::from("out/x.requests.jsonl"));
    }
}
