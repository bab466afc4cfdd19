//! A scripted OpenAI/SGLang-compatible server for testing `sparrow bench` (and for measuring
//! the client's own ceiling). It generates no text of its own: it answers every generation
//! request with `n` words, `k` tokens per chunk, with the delays, usage reporting and
//! failures its [`MockScript`] asks for.
//!
//! Prompts are not tokenized: `prompt_tokens` is always reported as 0, which clients treat as
//! "unknown".
//!
//! Endpoints: `POST /generate`, `/v1/completions`, `/v1/chat/completions`, `GET /v1/models`,
//! `/health`, `/get_model_info`, `/get_server_info`, `POST /flush_cache`.
//!
//! Failures are deterministic: generation requests are numbered from 0 in arrival order, and
//! when `fail_every = k`, requests `k-1, 2k-1, ...` fail, taking the modes of `fail_modes` in
//! turn. `die_after = n` makes the server "die" when request `n` arrives: every open stream
//! is cut mid-body and the listener closes, so later connections are refused.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use serde::Serialize;
use serde_json::{json, Value};
use sparrow_protocol::openai::{ChatDelta, Completion};
use sparrow_protocol::{sse, ErrorBody, Usage};
use tokio_util::sync::CancellationToken;

/// How (and whether) an OpenAI-style stream reports token usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum UsageMode {
    /// Cumulative `usage` on every chunk, plus the final usage-only chunk when asked.
    #[default]
    Continuous,
    /// Only one final chunk with empty `choices` and the usage, whether asked or not.
    Final,
    /// Never any usage (the native endpoint then omits `completion_tokens` too).
    None,
}

/// How a scripted failure looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FailMode {
    /// HTTP 500 with an OpenAI error body.
    Http500,
    /// One content chunk, then an `{"error": ...}` frame, then the body ends.
    InBandError,
    /// Every content chunk, then the body ends without `[DONE]` or a finish reason.
    NoDone,
    /// One content chunk, then nothing, forever.
    Stall,
}

/// How a mock server dies at `die_after` (each a real failure of this process, so the
/// sweep's crash forensics are tested on genuine logs and exit statuses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum DieHow {
    /// Cut every stream and close the listener; the `mock-server` process then exits 1.
    #[default]
    Cut,
    /// A Rust panic (the default hook prints `thread '…' panicked at <file>:<line>:<col>:`),
    /// then exit status 101, as a panic in `main` gives.
    Panic,
    /// SIGSEGV raised on the process itself (killed by signal 11).
    Segv,
    /// Allocate until the allocator fails (`memory allocation of N bytes failed`, then
    /// abort). Refused unless an address-space limit (`ulimit -v`) is set.
    Alloc,
    /// Stay alive but never answer again: streams in flight stall, `/health` too.
    Hang,
}

/// The behaviour of a mock server.
#[derive(Debug, Clone, clap::Args)]
pub struct MockScript {
    /// Tokens per answer; default: the request's max_tokens. A smaller value ends the answer
    /// early with `finish_reason: "stop"`, as an EOS would.
    #[arg(long)]
    pub output_tokens: Option<u64>,
    /// Tokens per chunk.
    #[arg(long, default_value_t = 1)]
    pub tokens_per_chunk: u64,
    /// Usage reporting of OpenAI-style streams.
    #[arg(long, value_enum, default_value = "continuous")]
    pub usage: UsageMode,
    /// Delay before the first chunk, ms.
    #[arg(long, default_value_t = 0)]
    pub first_chunk_delay_ms: u64,
    /// Delay before every later chunk, ms.
    #[arg(long, default_value_t = 0)]
    pub chunk_delay_ms: u64,
    /// Every this-many-th generation request fails.
    #[arg(long)]
    pub fail_every: Option<u64>,
    /// Failure modes, used in turn.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "http500")]
    pub fail_modes: Vec<FailMode>,
    /// Die when this generation request (0-based) arrives.
    #[arg(long)]
    pub die_after: Option<u64>,
    /// How to die at `--die-after`.
    #[arg(long, value_enum, default_value = "cut")]
    pub die_how: DieHow,
    /// Most answers generated at once; later requests wait for a slot (a server whose
    /// throughput saturates, so a sweep has a knee). `/metrics` reports the answers running
    /// and the requests waiting under SGLang's names, `/get_server_info` the cap.
    #[arg(long)]
    pub max_running: Option<usize>,
    /// Print every generation request's number and prompt (JSON) on stderr when it arrives
    /// (`mock request N prompt=…`), and `mock done N` when its streamed answer's last frame is sent.
    #[arg(long)]
    pub log_requests: bool,
    /// Tokenizer path reported by /get_model_info (so a client can find it).
    #[arg(long)]
    pub tokenizer_path: Option<String>,
    /// Model id served.
    #[arg(long, default_value = "mock-model")]
    pub model_id: String,
}

impl Default for MockScript {
    fn default() -> Self {
        MockScript {
            output_tokens: None,
            tokens_per_chunk: 1,
            usage: UsageMode::Continuous,
            first_chunk_delay_ms: 0,
            chunk_delay_ms: 0,
            fail_every: None,
            fail_modes: vec![FailMode::Http500],
            die_after: None,
            die_how: DieHow::Cut,
            max_running: None,
            log_requests: false,
            tokenizer_path: None,
            model_id: "mock-model".into(),
        }
    }
}

/// The words answers are made of; each is one token in common BPE vocabularies and in the
/// test word-level tokenizer.
pub const WORDS: [&str; 4] = [" hello", " world", " sparrow", " bench"];

#[derive(Debug)]
struct MockState {
    script: MockScript,
    received: AtomicU64,
    kill: CancellationToken,
    hang: CancellationToken,
    running: Option<Arc<tokio::sync::Semaphore>>,
    /// Answers being streamed, and requests waiting for a `--max-running` slot (its
    /// `/metrics`, under SGLang's names).
    active: Arc<AtomicI64>,
    waiting: AtomicI64,
}

/// An answer's hold on the server: its `--max-running` slot, if any, and its place in the
/// running count, both given back when the stream ends (or is dropped).
struct Slot {
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
    active: Arc<AtomicI64>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A running mock server.
#[derive(Debug)]
pub struct MockServer {
    /// Where it listens.
    pub addr: SocketAddr,
    state: Arc<MockState>,
    task: tokio::task::JoinHandle<()>,
}

impl MockServer {
    /// Base URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
    /// Generation requests received so far.
    pub fn received(&self) -> u64 {
        self.state.received.load(Ordering::SeqCst)
    }
    /// Resolves when the server has died (by `die_after` or [`Self::kill`]).
    pub async fn died(&self) {
        self.state.kill.cancelled().await;
    }
    /// Kills the server now: cuts every stream and stops listening.
    pub fn kill(&self) {
        self.state.kill.cancel();
    }
    /// Stops the server (same as [`Self::kill`]) and waits for the listener to close.
    pub async fn shutdown(self) {
        self.state.kill.cancel();
        let _ = self.task.await;
    }
}

/// The router, apart from any socket (tests can drive it with `oneshot`).
fn app(state: Arc<MockState>) -> Router {
    Router::new()
        .route("/generate", endpoint(Dialect::Generate))
        .route("/v1/completions", endpoint(Dialect::Completions))
        .route("/v1/chat/completions", endpoint(Dialect::Chat))
        .route("/v2/models/ensemble/generate_stream", endpoint(Dialect::Trt))
        .route("/v2/health/ready", get(|| async { "" }))
        .route("/v1/models", get(models))
        .route(
            "/health",
            get(|State(s): State<Arc<MockState>>| async move {
                if s.hang.is_cancelled() {
                    std::future::pending::<()>().await;
                }
                "ok"
            }),
        )
        .route("/get_model_info", get(model_info))
        .route(
            "/get_server_info",
            get(|State(s): State<Arc<MockState>>| async move {
                Json(json!({"mock": true, "model_id": s.script.model_id, "max_running_requests": s.script.max_running}))
            }),
        )
        .route("/metrics", get(metrics))
        .route("/flush_cache", post(|| async { "Cache flushed." }))
        .with_state(state)
}

/// `/metrics` in Prometheus' text format under SGLang's gauge names: answers streaming, and
/// requests waiting for a `--max-running` slot.
async fn metrics(State(s): State<Arc<MockState>>) -> Response {
    let label = format!("{{model_name=\"{}\"}}", s.script.model_id);
    let mut text = String::new();
    for (name, v) in [
        ("sglang:num_running_reqs", s.active.load(Ordering::SeqCst)),
        ("sglang:num_queue_reqs", s.waiting.load(Ordering::SeqCst)),
        ("sglang:token_usage", 0),
    ] {
        text.push_str(&format!("# TYPE {name} gauge\n{name}{label} {v}\n"));
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// Starts a mock server on `addr` (port 0 picks a free one).
///
/// # Errors
/// The bind error, if the address is taken or not local.
pub async fn start(addr: SocketAddr, script: MockScript) -> std::io::Result<MockServer> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let state = Arc::new(MockState {
        received: AtomicU64::new(0),
        kill: CancellationToken::new(),
        hang: CancellationToken::new(),
        running: script.max_running.map(|n| Arc::new(tokio::sync::Semaphore::new(n.max(1)))),
        active: Arc::default(),
        waiting: AtomicI64::new(0),
        script,
    });
    let router = app(state.clone());
    let kill = state.kill.clone();
    let task = tokio::spawn(async move {
        // On kill the listener closes (later connects are refused), idle keep-alive
        // connections are closed, and streams in flight are cut by their own kill branch.
        // Nagle's algorithm would hold small SSE frames back until the client's delayed ACK
        // (~40 ms), bunching chunks together and faking ITL figures.
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp: &mut tokio::net::TcpStream| {
            let _ = tcp.set_nodelay(true);
        });
        let _ = axum::serve(listener, router).with_graceful_shutdown(kill.cancelled_owned()).await;
    });
    Ok(MockServer { addr, state, task })
}

async fn models(State(s): State<Arc<MockState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [{"id": s.script.model_id, "object": "model", "owned_by": "sparrow-mock"}]}))
}

async fn model_info(State(s): State<Arc<MockState>>) -> Json<Value> {
    Json(json!({"model_path": s.script.model_id, "tokenizer_path": s.script.tokenizer_path, "is_generation": true}))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Dialect {
    Generate,
    Completions,
    Chat,
    /// TensorRT-LLM's Triton `generate_stream`: `text_output` deltas, no usage, no `[DONE]`.
    Trt,
}

/// What one request will get.
struct Plan {
    /// The request's number (arrival order, from 0).
    number: u64,
    dialect: Dialect,
    stream: bool,
    tokens: u64,
    finish: &'static str,
    include_usage: bool,
    fail: Option<FailMode>,
}

fn plan(s: &MockState, dialect: Dialect, headers: &HeaderMap, body: &Value) -> Plan {
    let n = s.received.fetch_add(1, Ordering::SeqCst);
    if s.script.log_requests {
        let prompt = body.get("prompt").or_else(|| body.get("text")).or_else(|| body.get("messages"));
        let key = headers.get("x-smg-routing-key").and_then(|v| v.to_str().ok()).unwrap_or("");
        eprintln!(
            "mock request {n} prompt={} routing_key={key} body={body}",
            prompt.map_or_else(String::new, Value::to_string)
        );
    }
    if s.script.die_after == Some(n) {
        die(s, n);
    }
    let max = match dialect {
        Dialect::Generate => body.pointer("/sampling_params/max_new_tokens").and_then(Value::as_u64),
        _ => body.get("max_completion_tokens").or_else(|| body.get("max_tokens")).and_then(Value::as_u64),
    }
    .unwrap_or(16);
    let tokens = s.script.output_tokens.map_or(max, |o| o.min(max));
    let fail = s.script.fail_every.filter(|k| *k > 0 && n % k == k - 1).map(|k| {
        let i = (n / k) as usize % s.script.fail_modes.len().max(1);
        s.script.fail_modes.get(i).copied().unwrap_or(FailMode::Http500)
    });
    Plan {
        number: n,
        dialect,
        stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
        tokens,
        finish: if tokens < max { "stop" } else { "length" },
        include_usage: body.pointer("/stream_options/include_usage").and_then(Value::as_bool).unwrap_or(false),
        fail,
    }
}

fn die(s: &MockState, n: u64) {
    match s.script.die_how {
        DieHow::Cut => s.kill.cancel(),
        DieHow::Hang => s.hang.cancel(),
        DieHow::Panic => {
            // A real panic through the default hook, on a thread of its own so that the
            // process, not just this task, ends the way a panicking `main` ends it.
            let _ = std::thread::Builder::new()
                .name("engine".into())
                .spawn(move || panic!("scripted defect at request {n}: index out of range"))
                .map(std::thread::JoinHandle::join);
            std::process::exit(101);
        }
        DieHow::Segv => {
            // Rust's runtime handles SIGSEGV to detect stack overflows: a fault outside a
            // guard page resets the default action and returns, so the second signal kills.
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSEGV);
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSEGV);
        }
        DieHow::Alloc => {
            use nix::sys::resource::{getrlimit, Resource, RLIM_INFINITY};
            if getrlimit(Resource::RLIMIT_AS).is_ok_and(|(soft, _)| soft == RLIM_INFINITY) {
                eprintln!("mock server: --die-how alloc needs an address-space limit (ulimit -v); cutting instead");
                s.kill.cancel();
                return;
            }
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                // Reserved, not touched: the address-space limit fails the allocation at
                // once, where touching every page took seconds on a loaded machine and read
                // as a hang. The allocator's failure prints `memory allocation of N bytes
                // failed` and aborts the process.
                let mut chunk = Vec::<u8>::with_capacity(64 << 20);
                chunk.push(1);
                hoard.push(std::hint::black_box(chunk));
            }
        }
    }
}

fn text_of(from: u64, to: u64) -> String {
    (from..to).map(|i| WORDS[(i % WORDS.len() as u64) as usize]).collect()
}

/// One frame of a scripted stream.
enum Step {
    Send(Duration, String),
    Stall,
}

/// A text choice with only the fields every OpenAI-compatible server sends (no `logprobs`, no
/// `matched_stop`), so that the client is tested against the least it can get.
#[derive(Serialize)]
struct BareTextChoice<'a> {
    index: u32,
    text: &'a str,
    finish_reason: Option<&'a str>,
}

/// A chat chunk choice, bare as [`BareTextChoice`].
#[derive(Serialize)]
struct BareChatChoice<'a> {
    index: u32,
    delta: ChatDelta<'a>,
    finish_reason: Option<&'a str>,
}

/// A stream chunk of the OpenAI dialects (`object` is a placeholder no client reads).
fn oai_chunk<C: Serialize>(s: &MockScript, choices: &[C], usage: Option<Usage>) -> String {
    let c = Completion { id: "mock", object: "chunk", created: 0, model: &s.model_id, choices, usage };
    // String keys only: serializing cannot fail.
    serde_json::to_string(&c).unwrap_or_default()
}

fn scripted_failure() -> ErrorBody {
    ErrorBody::new("scripted failure", "server_error", 500)
}

fn chunk_json(p: &Plan, s: &MockScript, text: &str, done_tokens: u64, finish: Option<&str>, full_text: &str) -> String {
    match p.dialect {
        Dialect::Generate => {
            let mut meta = json!({"id": "mock", "prompt_tokens": 0, "completion_tokens": done_tokens, "cached_tokens": 0,
                "finish_reason": finish.map(|f| json!({"type": f}))});
            if s.usage == UsageMode::None {
                if let Value::Object(m) = &mut meta {
                    m.remove("completion_tokens");
                }
            }
            json!({"text": full_text, "meta_info": meta, "index": 0}).to_string()
        }
        Dialect::Trt => json!({"model_name": "ensemble", "text_output": text}).to_string(),
        Dialect::Completions | Dialect::Chat => {
            let usage = (s.usage == UsageMode::Continuous).then(|| Usage::new(0, done_tokens, 0));
            if p.dialect == Dialect::Chat {
                let delta = ChatDelta { content: Some(text), ..Default::default() };
                oai_chunk(s, &[BareChatChoice { index: 0, delta, finish_reason: finish }], usage)
            } else {
                oai_chunk(s, &[BareTextChoice { index: 0, text, finish_reason: finish }], usage)
            }
        }
    }
}

fn steps(p: &Plan, s: &MockScript) -> Vec<Step> {
    let first = Duration::from_millis(s.first_chunk_delay_ms);
    let later = Duration::from_millis(s.chunk_delay_ms);
    let per = s.tokens_per_chunk.max(1);
    let mut out = Vec::new();
    let mut done = 0;
    while done < p.tokens {
        let next = (done + per).min(p.tokens);
        let last = next == p.tokens;
        let finish = (last && p.fail != Some(FailMode::NoDone)).then_some(p.finish);
        let v = chunk_json(p, s, &text_of(done, next), next, finish, &text_of(0, next));
        out.push(Step::Send(if done == 0 { first } else { later }, sse::frame(&v)));
        done = next;
        if done == next && out.len() == 1 {
            match p.fail {
                Some(FailMode::InBandError) => {
                    let e = serde_json::to_string(&scripted_failure()).unwrap_or_default();
                    out.push(Step::Send(later, sse::frame(&e)));
                    return out;
                }
                Some(FailMode::Stall) => {
                    out.push(Step::Stall);
                    return out;
                }
                _ => {}
            }
        }
    }
    if p.fail == Some(FailMode::NoDone) || p.dialect == Dialect::Trt {
        return out;
    }
    let wants_final_usage = match s.usage {
        UsageMode::Continuous => p.include_usage,
        UsageMode::Final => true,
        UsageMode::None => false,
    };
    if p.dialect != Dialect::Generate && wants_final_usage {
        let u = oai_chunk::<BareTextChoice<'_>>(s, &[], Some(Usage::new(0, p.tokens, 0)));
        out.push(Step::Send(Duration::ZERO, sse::frame(&u)));
    }
    out.push(Step::Send(Duration::ZERO, sse::frame(sse::DONE)));
    out
}

fn respond(state: Arc<MockState>, p: Plan, permit: Slot) -> Response {
    if p.fail == Some(FailMode::Http500) {
        return (StatusCode::INTERNAL_SERVER_ERROR, Json(scripted_failure())).into_response();
    }
    let s = &state.script;
    if !p.stream {
        let text = text_of(0, p.tokens);
        let usage = Usage::new(0, p.tokens, 0);
        let v = match p.dialect {
            Dialect::Generate => {
                json!({"text": text, "meta_info": {"prompt_tokens": 0, "completion_tokens": p.tokens, "finish_reason": {"type": p.finish}}})
            }
            Dialect::Completions => {
                json!({"id": "mock", "object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": p.finish}], "usage": usage})
            }
            Dialect::Trt => json!({"model_name": "ensemble", "text_output": text}),
            Dialect::Chat => {
                json!({"id": "mock", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": p.finish}], "usage": usage})
            }
        };
        return Json(v).into_response();
    }
    let steps = steps(&p, s);
    let kill = state.kill.clone();
    let hang = state.hang.clone();
    // `--log-requests`: the line once the last frame is handed to the connection, so a test
    // knows which answers a client could have finished.
    let done_line = s.log_requests.then(|| format!("mock done {}", p.number));
    // The `--max-running` slot is held until the stream ends.
    let stream = futures_util::stream::unfold((steps.into_iter(), kill, permit), move |(mut it, kill, permit)| {
        let hang = hang.clone();
        let done_line = done_line.clone();
        async move {
            if hang.is_cancelled() {
                std::future::pending::<()>().await;
            }
            let Some(step) = it.next() else {
                if let Some(l) = &done_line {
                    eprintln!("{l}");
                }
                return None;
            };
            let (delay, frame) = match step {
                Step::Send(d, f) => (d, Some(f)),
                Step::Stall => (Duration::from_secs(86_400), None),
            };
            tokio::select! {
                () = tokio::time::sleep(delay) => {},
                // Dying mid-stream: an error makes hyper abort the connection without the
                // terminating chunk, as a crashed process would.
                () = kill.cancelled() => return Some((Err(std::io::Error::other("server died")), (it, kill, permit))),
            }
            let frame = frame.unwrap_or_default();
            Some((Ok::<Bytes, std::io::Error>(Bytes::from(frame)), (it, kill, permit)))
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

async fn handle(
    state: Arc<MockState>,
    dialect: Dialect,
    headers: HeaderMap,
    body: Value,
) -> Result<Response, Infallible> {
    if state.kill.is_cancelled() {
        return Ok(StatusCode::SERVICE_UNAVAILABLE.into_response());
    }
    if state.hang.is_cancelled() {
        std::future::pending::<()>().await;
    }
    let p = plan(&state, dialect, &headers, &body);
    state.waiting.fetch_add(1, Ordering::SeqCst);
    let permit = match &state.running {
        Some(sem) => sem.clone().acquire_owned().await.ok(),
        None => None,
    };
    state.waiting.fetch_sub(1, Ordering::SeqCst);
    state.active.fetch_add(1, Ordering::SeqCst);
    let slot = Slot { _permit: permit, active: state.active.clone() };
    Ok(respond(state, p, slot))
}

/// The POST route of one dialect's endpoint.
fn endpoint(dialect: Dialect) -> axum::routing::MethodRouter<Arc<MockState>> {
    post(move |State(s): State<Arc<MockState>>, headers: HeaderMap, Json(body): Json<Value>| {
        handle(s, dialect, headers, body)
    })
}
