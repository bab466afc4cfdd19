//! Route handlers and wire rendering.
//!
//! Streaming follows the OpenAI reference and SGLang's `serving_completions.py` /
//! `serving_chat.py`: chunks of one `id`; each choice gets its deltas and exactly one chunk with
//! a `finish_reason`; with `stream_options.include_usage` one last chunk with `choices: []` and
//! the summed `usage` precedes `data: [DONE]`, and without it no `choices: []` chunk is ever sent
//! (clients that did not ask for one crash on it). With vLLM's
//! `stream_options.continuous_usage_stats` every chunk carries the cumulative usage. SGLang's
//! `/generate` streams the whole text so far with `meta_info` in every frame.
//!
//! Every validation error is returned before the first SSE byte, as a JSON error with its status.
//!
//! Bodies and chunks are the borrowed types of [`sparrow_protocol::openai`] and
//! [`sparrow_protocol::sglang`], serialized straight into the response bytes.

use std::convert::Infallible;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, BoxStream, StreamExt};
use serde::Serialize;
use serde_json::{Map, Value};
use sparrow_engine::scheduler::TokenLogprob;
use sparrow_protocol::openai::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatDelta, ChatLogprobs, Completion, CompletionLogprobs,
    FunctionCall, FunctionDelta, ModelCard, ModelList, PromptLogprob, TextChoice, ToolCall, ToolCallDelta,
    CHAT_COMPLETION, CHAT_COMPLETION_CHUNK, TEXT_COMPLETION,
};
use sparrow_protocol::sglang::{
    DetokenizeResponse, GenerateResponse, LoadReport, MetaFinishReason, MetaInfo, ModelInfoResponse, NativeLogprobs, ServerInfo,
    TokenizeResponse,
};
use sparrow_protocol::{sse, ErrorBody, Usage};
use sparrow_tokenizer::{ChatMessage, TemplateTools};

use crate::conn;
use crate::error::ApiError;
use crate::gen::{self, ChoiceEvent, Finish};
use crate::logprobs::{self, Legacy, TokenTexts};
use crate::params::{self, Api, Fields, LogprobAsk};
use crate::tools::{self, ChatParsers, Delta, Shaper, ToolRequest};
use crate::AppState;

/// Largest request body accepted (a prompt at the context limit is far smaller).
pub const BODY_LIMIT: usize = 16 << 20;

/// The router, apart from any socket.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/health_generate", get(health_generate))
        .route("/v1/models", get(models))
        .route("/get_model_info", get(model_info))
        // sglang-router asks `/model_info` first, then `/get_model_info`.
        .route("/model_info", get(model_info))
        .route("/get_load", get(get_load))
        .route("/get_server_info", get(server_info))
        .route("/server_info", get(server_info))
        .route("/flush_cache", post(flush_cache).get(flush_cache))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/metrics", get(metrics))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/generate", post(generate))
        .fallback(|| async { ApiError::NotFound("no such route".into()) })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(axum::middleware::from_fn_with_state(state.clone(), require_api_key))
        .with_state(state)
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Parses a JSON object body; malformed JSON is a 400, an oversized body a 413 and a stalled one
/// a 408, all as OpenAI error JSON (not axum's plain-text rejections).
fn json_object(body: &Result<Bytes, BytesRejection>) -> Result<Map<String, Value>, ApiError> {
    let body = match body {
        Ok(b) => b,
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            return Err(ApiError::TooLarge(format!("the request body is larger than {} MiB", BODY_LIMIT >> 20)))
        }
        Err(e) if conn::is_body_timeout(e) => return Err(ApiError::BodyTimeout),
        Err(e) => return Err(ApiError::bad_body(format!("cannot read the request body: {e}"))),
    };
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::bad_body("the request body must be a JSON object")),
        Err(e) => Err(ApiError::bad_body(format!("invalid JSON body: {e}"))),
    }
}

async fn health() -> StatusCode {
    StatusCode::OK
}

/// Runs one greedy token through the engine (SGLang's `/health_generate`).
async fn health_generate(State(s): State<AppState>) -> Response {
    let params = params::GenParams {
        max_tokens: Some(1),
        default_max: None,
        max_tokens_field: "max_tokens",
        sampling: sparrow_engine::sampler::SamplingParams { temperature: 0.0, ..Default::default() },
        stop: Vec::new(),
        stop_token_ids: Vec::new(),
        ignore_eos: true,
        n: 1,
        skip_special_tokens: true,
        no_stop_trim: false,
        logprobs: Default::default(),
        constraint: None,
    };
    let ids = s.tokenizer.encode("ping", false).unwrap_or_else(|_| vec![0]);
    let run = async {
        let prep = gen::prepare(&s, ids, params)?;
        let mut ev = gen::start(&s, prep)?;
        while let Some(e) = ev.next().await {
            if let ChoiceEvent::Done { finish, .. } = e {
                return match finish.error {
                    None => Ok(()),
                    Some(m) => Err(ApiError::Engine(m)),
                };
            }
        }
        Err(ApiError::Unavailable)
    };
    match tokio::time::timeout(Duration::from_secs(20), run).await {
        Ok(Ok(())) => StatusCode::OK.into_response(),
        Ok(Err(e)) => (StatusCode::SERVICE_UNAVAILABLE, Json(e.body())).into_response(),
        Err(_) => {
            (StatusCode::SERVICE_UNAVAILABLE, Json(ApiError::Engine("health generation timed out".into()).body()))
                .into_response()
        }
    }
}

async fn models(State(s): State<AppState>) -> Response {
    let card = ModelCard {
        id: &s.model_id,
        object: "model",
        created: now_secs(),
        owned_by: "sparrow",
        root: &s.model_id,
        max_model_len: s.engine.config().context_length,
    };
    Json(ModelList { object: "list", data: std::slice::from_ref(&card) }).into_response()
}

async fn model_info(State(s): State<AppState>) -> Response {
    let i = s.engine.info();
    Json(ModelInfoResponse {
        model_path: &s.model_path,
        tokenizer_path: s.tokenizer.source(),
        is_generation: true,
        architecture: &i.architecture,
        name: &i.name,
        vocab_size: i.vocab_size,
        context_length: s.engine.config().context_length,
        model_type: &i.architecture,
        architectures: [hf_architecture(&i.architecture)],
        preferred_sampling_params: None,
        weight_version: "default",
    })
    .into_response()
}

/// `--api-key`, as SGLang's `add_api_key_middleware` checks it: `OPTIONS`, `/health*` and
/// `/metrics*` pass (load balancers and scrapers hold no key), everything else needs
/// `Authorization: Bearer <key>` or gets a 401. sglang-router sends its own `Authorization`
/// and also forwards the client's, so a request passes when any of its values is right.
async fn require_api_key(
    State(s): State<AppState>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(key) = s.api_key.as_deref() else { return next.run(req).await };
    let path = req.uri().path();
    if req.method() == axum::http::Method::OPTIONS || path.starts_with("/health") || path.starts_with("/metrics") {
        return next.run(req).await;
    }
    let want = format!("Bearer {key}");
    let ok = req.headers().get_all(header::AUTHORIZATION).iter().any(|v| constant_time_eq(v.as_bytes(), want.as_bytes()));
    if ok {
        next.run(req).await
    } else {
        ApiError::Unauthorized.into_response()
    }
}

/// Byte equality whose time does not depend on where the inputs differ (only on their
/// lengths), so a wrong key cannot be found a byte at a time by timing.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The Hugging Face class name of a `model_type`, as `config.json` spells it.
fn hf_architecture(model_type: &str) -> &'static str {
    match model_type {
        "llama" => "LlamaForCausalLM",
        "mistral" => "MistralForCausalLM",
        "qwen2" => "Qwen2ForCausalLM",
        "qwen3" => "Qwen3ForCausalLM",
        "phi3" => "Phi3ForCausalLM",
        "smollm3" => "SmolLM3ForCausalLM",
        "gemma3" | "gemma3_text" => "Gemma3ForCausalLM",
        "glm_moe_dsa" => "GlmMoeDsaForCausalLM",
        _ => "unknown",
    }
}

/// SGLang's `GET /get_load`: a list with one [`LoadReport`] (one engine, dp rank 0).
async fn get_load(State(s): State<AppState>) -> Response {
    let st = s.engine.stats();
    let held = st.used_pages.saturating_sub(st.evictable_pages);
    Json([LoadReport {
        dp_rank: 0,
        num_reqs: st.num_running_reqs + st.num_queue_reqs,
        num_waiting_reqs: st.num_queue_reqs,
        num_tokens: held * s.engine.config().page_size,
    }])
    .into_response()
}

async fn server_info(State(s): State<AppState>) -> Response {
    match &s.server_info {
        Value::Object(args) => {
            let st = s.engine.stats();
            Json(ServerInfo { args, internal_states: std::slice::from_ref(&st) }).into_response()
        }
        // The binary always passes an object; anything else is shown as it is.
        other => Json(other).into_response(),
    }
}

async fn flush_cache(State(s): State<AppState>) -> Result<String, ApiError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    s.engine.flush_cache(Box::new(move |n| {
        let _ = tx.send(n);
    }))?;
    let n = rx.await.map_err(|_| ApiError::Unavailable)?;
    Ok(format!("Cache flushed: {n} pages freed.\n"))
}

async fn tokenize(State(s): State<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let m = json_object(&body)?;
    let text = m
        .get("text")
        .or_else(|| m.get("prompt"))
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad("text", "send the text to tokenize as a string in `text` (or `prompt`)"))?;
    let add = Fields(&m).bool("add_special_tokens")?.unwrap_or(true);
    let ids = s.tokenizer.encode(text, add).map_err(|e| ApiError::bad("text", e.to_string()))?;
    let max_model_len = s.engine.config().context_length;
    Ok(Json(TokenizeResponse { tokens: &ids, count: ids.len(), max_model_len }).into_response())
}

async fn detokenize(State(s): State<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let m = json_object(&body)?;
    let ids = token_ids(m.get("tokens").unwrap_or(&Value::Null), "tokens")?;
    let vocab = s.engine.info().vocab_size;
    if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::bad("tokens", format!("token id {bad} is outside the vocabulary (size {vocab})")));
    }
    let skip = Fields(&m).bool("skip_special_tokens")?.unwrap_or(false);
    let bytes = if skip { &s.bytes_skip } else { &s.bytes_all };
    let raw: Vec<u8> = ids.iter().flat_map(|&t| bytes.get(t as usize).into_iter().flatten().copied()).collect();
    Ok(Json(DetokenizeResponse { text: &String::from_utf8_lossy(&raw) }).into_response())
}

async fn metrics(State(s): State<AppState>) -> Response {
    let body = s.metrics.render(&s.engine.stats());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], body).into_response()
}

fn token_ids(v: &Value, field: &str) -> Result<Vec<u32>, ApiError> {
    let arr = v.as_array().ok_or_else(|| ApiError::bad(field, format!("{field} must be a list of token ids")))?;
    arr.iter()
        .map(|x| {
            x.as_u64()
                .filter(|&t| t <= u32::MAX as u64)
                .map(|t| t as u32)
                .ok_or_else(|| ApiError::bad(field, format!("{field} must be a list of token ids")))
        })
        .collect()
}

/// Most choices one `/v1/completions` request may ask for (prompts × `n`).
pub const MAX_CHOICES: usize = 1024;

/// The prompts of `/v1/completions`: a string, a list of token ids, or a list of either
/// (batched, answered prompt-major); each with the text `echo` shows.
fn completion_prompts(s: &AppState, v: Option<&Value>) -> Result<Vec<(Vec<u32>, String)>, ApiError> {
    let v = v.ok_or_else(|| ApiError::bad("prompt", "prompt is required"))?;
    let one = |v: &Value, i: Option<usize>| -> Result<(Vec<u32>, String), ApiError> {
        let at = i.map_or(String::new(), |i| format!("prompt[{i}]: "));
        match v {
            Value::String(t) if t.is_empty() => {
                Err(ApiError::bad("prompt", format!("{at}the prompt is empty; send at least one token")))
            }
            Value::String(t) => {
                let ids = s.tokenizer.encode(t, true).map_err(|e| ApiError::bad("prompt", format!("{at}{e}")))?;
                Ok((ids, t.clone()))
            }
            Value::Array(a) if a.is_empty() => {
                Err(ApiError::bad("prompt", format!("{at}the prompt is empty; send at least one token")))
            }
            Value::Array(_) => {
                let ids = token_ids(v, "prompt")?;
                let text = decode_all(s, &ids);
                Ok((ids, text))
            }
            _ => Err(ApiError::bad("prompt", format!("{at}a prompt must be a string or a list of token ids"))),
        }
    };
    match v {
        Value::Array(a) if a.is_empty() => Err(ApiError::bad("prompt", "the prompt is empty; send at least one token")),
        Value::Array(a) if a.iter().all(Value::is_number) => Ok(vec![one(v, None)?]),
        Value::Array(a) => a.iter().enumerate().map(|(i, p)| one(p, Some(i))).collect(),
        _ => Ok(vec![one(v, None)?]),
    }
}

fn decode_all(s: &AppState, ids: &[u32]) -> String {
    let raw: Vec<u8> = ids.iter().flat_map(|&t| s.bytes_all.get(t as usize).into_iter().flatten().copied()).collect();
    String::from_utf8_lossy(&raw).into_owned()
}

/// `stream_options` flags.
#[derive(Debug, Clone, Copy, Default)]
struct StreamOpts {
    include_usage: bool,
    continuous: bool,
}

fn stream_opts(m: &Map<String, Value>, stream: bool) -> Result<StreamOpts, ApiError> {
    match m.get("stream_options") {
        None | Some(Value::Null) => Ok(StreamOpts::default()),
        Some(Value::Object(o)) => {
            if !stream {
                return Err(ApiError::bad("stream_options", "stream_options is only allowed when stream is true"));
            }
            let f = Fields(o);
            Ok(StreamOpts {
                include_usage: f.bool("include_usage")?.unwrap_or(false),
                continuous: f.bool("continuous_usage_stats")?.unwrap_or(false),
            })
        }
        Some(_) => Err(ApiError::bad("stream_options", "stream_options must be an object")),
    }
}

/// Which OpenAI object a response is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Completion,
    Chat,
}

struct OaiRun {
    kind: Kind,
    id: String,
    model: String,
    created: u64,
    /// Prompt tokens of each prompt; choices `p·n … p·n + n − 1` belong to prompt `p`.
    prompt_tokens: Vec<usize>,
    /// Choices per prompt.
    n: usize,
    /// The `echo` text of each prompt.
    echo: Vec<Option<String>>,
    ask: LogprobAsk,
    texts: TokenTexts,
    /// How chat text becomes content, reasoning and tool calls.
    shape: ChatShape,
}

/// What a chat request's [`Shaper`]s are built from.
#[derive(Clone, Default)]
struct ChatShape {
    parsers: ChatParsers,
    tools: Option<ToolRequest>,
    separate_reasoning: bool,
}

impl ChatShape {
    fn shaper(&self) -> Shaper {
        Shaper::new(self.parsers, self.tools.as_ref(), self.separate_reasoning)
    }
}

/// A finished chat choice's reason: `tool_calls` when it made calls and ended by itself.
fn chat_reason(f: &Finish, calls: usize) -> &'static str {
    if calls > 0 && f.reason == "stop" {
        "tool_calls"
    } else {
        f.reason
    }
}

/// What one chunk says about one choice.
#[derive(Clone, Copy)]
enum Piece<'a> {
    /// The choice's opening chunk: the assistant role (chat, with this as its content) or the
    /// echoed prompt (completions).
    Start(&'a str),
    /// New text.
    Text(&'a str),
    /// New content, reasoning or tool-call text of a chat choice.
    Delta(&'a Delta),
    /// The choice's end, with its chat `finish_reason`.
    Finish(&'a Finish, &'a str),
}

/// The logprobs a chunk or choice carries.
#[derive(Clone, Copy, Default)]
struct ChunkLp<'a> {
    legacy: Option<&'a CompletionLogprobs>,
    chat: Option<&'a ChatLogprobs>,
    prompt: Option<&'a [Option<PromptLogprob>]>,
}

impl OaiRun {
    fn choices(&self) -> usize {
        self.prompt_tokens.len() * self.n
    }

    fn usage(&self, completion: usize, cached: usize) -> Usage {
        Usage::new(self.prompt_tokens.iter().sum::<usize>() as u64, completion as u64, cached as u64)
    }

    fn echo_of(&self, index: usize) -> Option<&str> {
        self.echo[index / self.n].as_deref()
    }

    /// True when a completions choice opens with its prompt's logprobs, so its first chunk
    /// waits for them.
    fn opens_with_prompt(&self) -> bool {
        self.kind == Kind::Completion && (self.ask.prompt.is_some() || self.ask.vllm_prompt.is_some())
    }

    fn object<'a, C>(&'a self, object: &'a str, choices: &'a [C], usage: Option<Usage>) -> Completion<'a, C> {
        Completion { id: &self.id, object, created: self.created, model: &self.model, choices, usage }
    }

    /// Appends the chunk that carries `piece` of choice `index`.
    fn push_chunk(&self, out: &mut Vec<u8>, index: usize, piece: Piece<'_>, usage: Option<Usage>, lp: ChunkLp<'_>) {
        match self.kind {
            Kind::Completion => {
                let (text, finish_reason, matched_stop) = match piece {
                    Piece::Start(t) | Piece::Text(t) => (t, None, None),
                    Piece::Delta(_) => ("", None, None),
                    Piece::Finish(f, _) => ("", Some(f.reason), Some(f.matched.as_ref())),
                };
                let c = TextChoice {
                    index,
                    text,
                    logprobs: lp.legacy,
                    finish_reason,
                    matched_stop,
                    prompt_logprobs: lp.prompt,
                };
                push_frame(out, &self.object(TEXT_COMPLETION, &[c], usage));
            }
            Kind::Chat => {
                let call;
                let (delta, finish_reason, matched_stop) = match piece {
                    Piece::Start(t) => (ChatDelta { role: Some("assistant"), content: Some(t), ..Default::default() }, None, None),
                    Piece::Text(t) => (ChatDelta { content: Some(t), ..Default::default() }, None, None),
                    Piece::Delta(Delta::Content(t)) => (ChatDelta { content: Some(t), ..Default::default() }, None, None),
                    Piece::Delta(Delta::Reasoning(t)) => {
                        (ChatDelta { reasoning_content: Some(t), ..Default::default() }, None, None)
                    }
                    Piece::Delta(Delta::CallStart { index, id, name }) => {
                        call = [ToolCallDelta {
                            index: *index,
                            id: Some(id),
                            kind: Some("function"),
                            function: FunctionDelta { name: Some(name), arguments: "" },
                        }];
                        (ChatDelta { tool_calls: Some(&call), ..Default::default() }, None, None)
                    }
                    Piece::Delta(Delta::CallArgs { index, text }) => {
                        call = [ToolCallDelta {
                            index: *index,
                            id: None,
                            kind: None,
                            function: FunctionDelta { name: None, arguments: text },
                        }];
                        (ChatDelta { tool_calls: Some(&call), ..Default::default() }, None, None)
                    }
                    Piece::Finish(f, reason) => (ChatDelta::default(), Some(reason), Some(f.matched.as_ref())),
                };
                let c = ChatChunkChoice { index, delta, logprobs: lp.chat, finish_reason, matched_stop };
                push_frame(out, &self.object(CHAT_COMPLETION_CHUNK, &[c], usage));
            }
        }
    }

    /// Appends the usage-only chunk (`choices: []`).
    fn push_usage(&self, out: &mut Vec<u8>, usage: Usage) {
        match self.kind {
            Kind::Completion => push_frame(out, &self.object::<TextChoice<'_>>(TEXT_COMPLETION, &[], Some(usage))),
            Kind::Chat => push_frame(out, &self.object::<ChatChunkChoice<'_>>(CHAT_COMPLETION_CHUNK, &[], Some(usage))),
        }
    }
}

/// Appends `v` as an SSE frame. Our bodies always serialize (string keys, no paths); were one
/// not to, the client would get an in-band error instead of a broken frame.
fn push_frame<T: Serialize>(out: &mut Vec<u8>, v: &T) {
    if let Err(e) = sse::push_json(out, v) {
        push_error(out, &format!("cannot render a response frame: {e}"));
    }
}

/// Appends an in-band error frame (OpenAI error JSON), for a failure after the stream started.
fn push_error(out: &mut Vec<u8>, message: &str) {
    // An `ErrorBody` has string fields only: it cannot fail to serialize.
    let _ = sse::push_json(out, &ErrorBody::new(message, "server_error", 500));
}

fn push_done(out: &mut Vec<u8>) {
    out.extend_from_slice(sse::frame(sse::DONE).as_bytes());
}

fn sse_response(body: BoxStream<'static, Vec<u8>>) -> Response {
    let body = Body::from_stream(body.map(|s| Ok::<_, Infallible>(Bytes::from(s))));
    ([(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}

/// Renders an OpenAI stream from choice events.
fn oai_stream(run: OaiRun, events: BoxStream<'static, ChoiceEvent>, opts: StreamOpts) -> Response {
    struct St {
        run: OaiRun,
        events: Option<BoxStream<'static, ChoiceEvent>>,
        opts: StreamOpts,
        tokens: Vec<usize>,
        /// Radix-cached prompt tokens of each prompt (the most any of its choices saw).
        cached: Vec<usize>,
        done: Vec<bool>,
        legacy: Vec<Legacy>,
        /// Chat choices' content / reasoning / tool-call machines.
        shapers: Vec<Shaper>,
        prologue: bool,
        finished: bool,
    }
    impl St {
        fn continuous(&self) -> Option<Usage> {
            self.opts.continuous.then(|| self.run.usage(self.tokens.iter().sum(), self.cached.iter().sum()))
        }
    }
    let total = run.choices();
    let st = St {
        events: Some(events),
        opts,
        tokens: vec![0; total],
        cached: vec![0; run.prompt_tokens.len()],
        done: vec![false; total],
        legacy: vec![Legacy::default(); total],
        shapers: (0..total).map(|_| run.shape.shaper()).collect(),
        prologue: true,
        finished: false,
        run,
    };
    let body = stream::unfold(st, |mut st| async move {
        if st.finished {
            return None;
        }
        let mut out = Vec::new();
        if st.prologue {
            st.prologue = false;
            let u = st.opts.continuous.then(|| st.run.usage(0, 0));
            for i in 0..st.run.choices() {
                let start = match st.run.kind {
                    Kind::Chat => Some(""),
                    Kind::Completion if st.run.opens_with_prompt() => None,
                    Kind::Completion => st.run.echo_of(i),
                };
                if let Some(text) = start {
                    st.run.push_chunk(&mut out, i, Piece::Start(text), u, ChunkLp::default());
                }
            }
            return Some((out, st));
        }
        let next = match st.events.as_mut() {
            Some(ev) => ev.next().await,
            None => None,
        };
        let texts = st.run.texts.clone();
        match next {
            Some(ChoiceEvent::Prompt { index, entries, .. }) => {
                if st.run.opens_with_prompt() {
                    let legacy = st.run.ask.prompt.map(|k| {
                        for e in &entries {
                            st.legacy[index].push(e, k, &texts);
                        }
                        st.legacy[index].take()
                    });
                    let prompt = st.run.ask.vllm_prompt.map(|k| logprobs::vllm_prompt(&entries, k, &texts));
                    let text = st.run.echo_of(index).unwrap_or("");
                    let lp = ChunkLp { legacy: legacy.as_ref(), prompt: prompt.as_deref(), chat: None };
                    st.run.push_chunk(&mut out, index, Piece::Start(text), st.continuous(), lp);
                }
            }
            Some(ChoiceEvent::Text { index, text, tokens, logprob }) => {
                st.tokens[index] = tokens;
                match (st.run.kind, logprob, st.run.ask.output) {
                    (Kind::Completion, Some(e), Some(k)) => {
                        st.legacy[index].push(&e, k, &texts);
                        let l = st.legacy[index].take();
                        let lp = ChunkLp { legacy: Some(&l), ..Default::default() };
                        st.run.push_chunk(&mut out, index, Piece::Text(&text), st.continuous(), lp);
                    }
                    (Kind::Chat, lpe, k) if !st.shapers[index].is_plain() => {
                        let c = lpe.zip(k).map(|(e, k)| ChatLogprobs {
                            content: vec![logprobs::chat_entry(&e, k, &texts)],
                            refusal: None,
                        });
                        let deltas = st.shapers[index].push(&text);
                        let u = st.continuous();
                        if deltas.is_empty() && c.is_some() {
                            let lp = ChunkLp { chat: c.as_ref(), ..Default::default() };
                            st.run.push_chunk(&mut out, index, Piece::Text(""), u, lp);
                        }
                        for (i, d) in deltas.iter().enumerate() {
                            let lp = ChunkLp { chat: c.as_ref().filter(|_| i == 0), ..Default::default() };
                            st.run.push_chunk(&mut out, index, Piece::Delta(d), u, lp);
                        }
                    }
                    (Kind::Chat, Some(e), Some(k)) => {
                        let c = ChatLogprobs { content: vec![logprobs::chat_entry(&e, k, &texts)], refusal: None };
                        let lp = ChunkLp { chat: Some(&c), ..Default::default() };
                        st.run.push_chunk(&mut out, index, Piece::Text(&text), st.continuous(), lp);
                    }
                    _ if !text.is_empty() => {
                        st.run.push_chunk(&mut out, index, Piece::Text(&text), st.continuous(), ChunkLp::default());
                    }
                    _ => {}
                }
            }
            Some(ChoiceEvent::Done { index, finish }) => {
                st.tokens[index] = finish.completion_tokens;
                let p = index / st.run.n;
                st.cached[p] = st.cached[p].max(finish.cached_tokens);
                st.done[index] = true;
                if let Some(e) = &finish.error {
                    push_error(&mut out, e);
                }
                let u = st.continuous();
                for d in st.shapers[index].finish() {
                    st.run.push_chunk(&mut out, index, Piece::Delta(&d), u, ChunkLp::default());
                }
                let reason = chat_reason(&finish, st.shapers[index].calls_made());
                st.run.push_chunk(&mut out, index, Piece::Finish(&finish, reason), u, ChunkLp::default());
            }
            None => {
                // All choices ended (or the engine went away mid-stream).
                st.events = None;
                st.finished = true;
                if st.done.iter().any(|d| !d) {
                    push_error(&mut out, "the engine stopped before the request finished");
                }
                if st.opts.include_usage {
                    st.run.push_usage(&mut out, st.run.usage(st.tokens.iter().sum(), st.cached.iter().sum()));
                }
                push_done(&mut out);
            }
        }
        Some((out, st))
    })
    .filter(|s| std::future::ready(!s.is_empty()))
    .boxed();
    sse_response(body)
}

/// One choice, drained: its whole text, its end, and the logprobs it got.
#[derive(Default)]
struct Collected {
    text: String,
    finish: Option<Finish>,
    prompt: Vec<TokenLogprob>,
    tokens: Vec<TokenLogprob>,
}

/// Drains a request's events into each of its `total` choices.
async fn collect(mut events: BoxStream<'static, ChoiceEvent>, total: usize) -> Vec<Collected> {
    let mut c: Vec<Collected> = (0..total).map(|_| Collected::default()).collect();
    while let Some(e) = events.next().await {
        match e {
            ChoiceEvent::Text { index, text, logprob, .. } => {
                c[index].text.push_str(&text);
                c[index].tokens.extend(logprob.map(|b| *b));
            }
            ChoiceEvent::Prompt { index, entries, .. } => c[index].prompt = entries,
            ChoiceEvent::Done { index, finish } => c[index].finish = Some(finish),
        }
    }
    c
}

/// Collects a non-streamed OpenAI answer.
async fn oai_collect(run: OaiRun, events: BoxStream<'static, ChoiceEvent>) -> Result<Response, ApiError> {
    let all = collect(events, run.choices()).await;
    let mut finishes = Vec::with_capacity(all.len());
    let mut completion = 0;
    let mut cached = vec![0; run.prompt_tokens.len()];
    for (i, c) in all.iter().enumerate() {
        let f = c.finish.clone().ok_or(ApiError::Unavailable)?;
        if let Some(e) = f.error {
            return Err(ApiError::Engine(e));
        }
        completion += f.completion_tokens;
        cached[i / run.n] = cached[i / run.n].max(f.cached_tokens);
        finishes.push(f);
    }
    let usage = Some(run.usage(completion, cached.iter().sum()));
    let texts = &run.texts;
    Ok(match run.kind {
        Kind::Completion => {
            let mut bodies = Vec::with_capacity(all.len());
            for (i, c) in all.iter().enumerate() {
                let text = format!("{}{}", run.echo_of(i).unwrap_or(""), c.text);
                let legacy = run.ask.output.map(|k| {
                    let mut l = Legacy::default();
                    if let Some(kp) = run.ask.prompt {
                        for e in &c.prompt {
                            l.push(e, kp, texts);
                        }
                    }
                    for e in &c.tokens {
                        l.push(e, k, texts);
                    }
                    l.take()
                });
                let prompt = run.ask.vllm_prompt.map(|k| logprobs::vllm_prompt(&c.prompt, k, texts));
                bodies.push((text, legacy, prompt));
            }
            let choices: Vec<TextChoice<'_>> = bodies
                .iter()
                .zip(&finishes)
                .enumerate()
                .map(|(index, ((text, legacy, prompt), f))| TextChoice {
                    index,
                    text,
                    logprobs: legacy.as_ref(),
                    finish_reason: Some(f.reason),
                    matched_stop: Some(f.matched.as_ref()),
                    prompt_logprobs: prompt.as_deref(),
                })
                .collect();
            Json(run.object(TEXT_COMPLETION, &choices, usage)).into_response()
        }
        Kind::Chat => {
            let lps: Vec<Option<ChatLogprobs>> = all
                .iter()
                .map(|c| {
                    run.ask.output.map(|k| ChatLogprobs {
                        content: c.tokens.iter().map(|e| logprobs::chat_entry(e, k, texts)).collect(),
                        refusal: None,
                    })
                })
                .collect();
            let shaped: Vec<(tools::Message, bool, Vec<ToolCall>)> = all
                .iter()
                .map(|c| {
                    let mut sh = run.shape.shaper();
                    let mut m = tools::Message::default();
                    m.add(&sh.push(&c.text));
                    m.add(&sh.finish());
                    let calls = m
                        .calls
                        .iter()
                        .map(|(id, name, arguments)| ToolCall {
                            id: id.clone(),
                            kind: "function",
                            function: FunctionCall { name: name.clone(), arguments: arguments.clone() },
                        })
                        .collect();
                    (m, sh.reasons(), calls)
                })
                .collect();
            let choices: Vec<ChatChoice<'_>> = shaped
                .iter()
                .zip(&finishes)
                .zip(&lps)
                .enumerate()
                .map(|(index, (((m, reasons, calls), f), lp))| ChatChoice {
                    index,
                    message: AssistantMessage {
                        role: "assistant",
                        content: Some(m.content.as_str()).filter(|c| !c.is_empty() || calls.is_empty()),
                        reasoning_content: reasons.then_some(m.reasoning.as_deref()),
                        tool_calls: (!calls.is_empty()).then_some(calls.as_slice()),
                    },
                    logprobs: lp.as_ref(),
                    finish_reason: chat_reason(f, calls.len()),
                    matched_stop: f.matched.as_ref(),
                })
                .collect();
            Json(run.object(CHAT_COMPLETION, &choices, usage)).into_response()
        }
    })
}

async fn completions(State(s): State<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let m = json_object(&body)?;
    let f = Fields(&m);
    let stream = f.bool("stream")?.unwrap_or(false);
    let opts = stream_opts(&m, stream)?;
    let echo = f.bool("echo")?.unwrap_or(false);
    let ask = params::parse_logprobs(&m, Api::Completions, echo)?;
    let p = params::parse(&m, Api::Completions)?;
    let prompts = completion_prompts(&s, m.get("prompt"))?;
    if prompts.len() * p.n > MAX_CHOICES {
        return Err(ApiError::bad(
            "prompt",
            format!("{} prompts × n = {} ask for more than {MAX_CHOICES} choices", prompts.len(), p.n),
        ));
    }
    let mut preps = Vec::with_capacity(prompts.len());
    for (ids, text) in prompts {
        let mut p = p.clone();
        p.logprobs = ask.spec(ids.len());
        preps.push((gen::prepare(&s, ids, p)?, echo.then_some(text)));
    }
    oai_respond(&s, Kind::Completion, preps, ask, ChatShape::default(), stream, opts).await
}

/// Starts prepared OpenAI requests (one per prompt, each with its `echo` text) and answers
/// them as one stream or one JSON body, choices numbered prompt-major.
async fn oai_respond(
    s: &AppState,
    kind: Kind,
    preps: Vec<(gen::Prepared, Option<String>)>,
    ask: LogprobAsk,
    shape: ChatShape,
    stream: bool,
    opts: StreamOpts,
) -> Result<Response, ApiError> {
    let prefix = match kind {
        Kind::Completion => "cmpl",
        Kind::Chat => "chatcmpl",
    };
    let n = preps.first().map_or(1, |p| p.0.params.n);
    let run = OaiRun {
        kind,
        id: format!("{prefix}-{:016x}", s.next_engine_id()),
        model: s.model_id.clone(),
        created: now_secs(),
        prompt_tokens: preps.iter().map(|p| p.0.prompt_ids.len()).collect(),
        n,
        echo: preps.iter().map(|p| p.1.clone()).collect(),
        ask,
        texts: TokenTexts(s.bytes_all.clone()),
        shape,
    };
    let mut streams = Vec::with_capacity(preps.len());
    for (i, (prep, _)) in preps.into_iter().enumerate() {
        let off = i * n;
        streams.push(gen::start(s, prep)?.map(move |e| e.offset(off)).boxed());
    }
    let events = stream::select_all(streams).boxed();
    if stream {
        Ok(oai_stream(run, events, opts))
    } else {
        oai_collect(run, events).await
    }
}

/// Text of a chat message's `content`: a string, or the `text` parts of a list.
fn message_text(v: &Value, i: usize) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    _ => {
                        return Err(ApiError::bad(
                            "messages",
                            format!("messages[{i}]: only text content parts are supported"),
                        ))
                    }
                }
            }
            Ok(out)
        }
        _ => Err(ApiError::bad("messages", format!("messages[{i}].content must be a string or a list of parts"))),
    }
}

/// An assistant message's `tool_calls` as templates take them: `arguments` parsed from the
/// API's JSON string into an object (vLLM does the same), kept as a string if it is not JSON.
fn template_calls(v: &Value, i: usize) -> Result<Value, ApiError> {
    let list = v.as_array().ok_or_else(|| ApiError::bad("messages", format!("messages[{i}].tool_calls must be a list")))?;
    let mut out = Vec::with_capacity(list.len());
    for c in list {
        let mut c = c.clone();
        let args = c.get("function").and_then(|f| f.get("arguments")).and_then(Value::as_str).map(str::to_owned);
        if let (Some(a), Some(f)) = (args, c.get_mut("function")) {
            if let Ok(parsed) = serde_json::from_str::<Value>(&a) {
                f["arguments"] = parsed;
            }
        }
        if c.get("function").and_then(|f| f.get("name")).and_then(Value::as_str).is_none() {
            return Err(ApiError::bad("messages", format!("messages[{i}].tool_calls[].function.name must be a string")));
        }
        out.push(c);
    }
    Ok(Value::Array(out))
}

async fn chat(State(s): State<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let m = json_object(&body)?;
    let f = Fields(&m);
    let stream = f.bool("stream")?.unwrap_or(false);
    let opts = stream_opts(&m, stream)?;
    let tools = ToolRequest::parse(&m, s.parsers)?;
    let separate_reasoning = f.bool("separate_reasoning")?.unwrap_or(true);
    let kwargs = match f.get("chat_template_kwargs") {
        None => Map::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(_) => return Err(ApiError::bad("chat_template_kwargs", "chat_template_kwargs must be an object")),
    };
    let ask = params::parse_logprobs(&m, Api::Chat, false)?;
    let mut p = params::parse(&m, Api::Chat)?;
    if let Some(c) = tools.as_ref().and_then(ToolRequest::constraint) {
        if let Some((_, field)) = &p.constraint {
            return Err(ApiError::bad(field, format!("{field} cannot be combined with a required or named tool_choice")));
        }
        p.constraint = Some((c, "tools"));
    }
    let msgs = m
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::bad("messages", "messages must be a list"))?;
    if msgs.is_empty() {
        return Err(ApiError::bad("messages", "messages must not be empty"));
    }
    let where_tools = s.tokenizer.template_tools();
    let native_tools = where_tools == TemplateTools::Argument;
    let mut conv = Vec::with_capacity(msgs.len() + 1);
    for (i, msg) in msgs.iter().enumerate() {
        let role = msg
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::bad("messages", format!("messages[{i}].role must be a string")))?;
        if !matches!(role, "system" | "user" | "assistant" | "developer" | "tool") {
            return Err(ApiError::bad(
                "messages",
                format!("messages[{i}].role {role:?} is not one of system, user, assistant, developer, tool"),
            ));
        }
        let mut content = message_text(msg.get("content").unwrap_or(&Value::Null), i)?;
        let tool_calls = match msg.get("tool_calls") {
            Some(v) if role == "assistant" && !v.is_null() => Some(template_calls(v, i)?),
            _ => None,
        };
        if let (false, Some(calls)) = (native_tools, &tool_calls) {
            // The template cannot show calls: write them as the parser's format reads them.
            content.push_str(&tools::history_calls(calls, s.parsers.tool_call));
        }
        let str_field = |k: &str| msg.get(k).and_then(Value::as_str).map(str::to_owned);
        conv.push(ChatMessage {
            role: if role == "developer" { "system".into() } else { role.into() },
            content,
            tool_calls,
            tool_call_id: str_field("tool_call_id").filter(|_| role == "tool"),
            name: str_field("name").filter(|_| role == "tool"),
            // vLLM also reads the newer spelling `reasoning`.
            reasoning_content: str_field("reasoning_content")
                .or_else(|| str_field("reasoning"))
                .filter(|_| role == "assistant"),
            // Phi-4-mini's model card puts the tools, as a JSON string, on the system message.
            tools: str_field("tools").filter(|_| role == "system" || role == "developer"),
        });
    }
    let shown = tools.as_ref().filter(|t| t.shown());
    if let (Some(t), TemplateTools::SystemMessage) = (shown, where_tools) {
        // Phi-4-mini's way: the tools ride on the system message, one is added if none.
        if conv.first().is_none_or(|m| m.role != "system") {
            conv.insert(0, ChatMessage::new("system", ""));
        }
        if let Some(first) = conv.first_mut() {
            first.tools = Some(tools::py_json(&t.raw));
        }
    } else if let (Some(t), false) = (shown, native_tools) {
        let prompt = tools::tools_system_prompt(&t.raw, s.parsers.tool_call);
        match conv.first_mut() {
            Some(first) if first.role == "system" => first.content = format!("{}\n\n{prompt}", first.content),
            _ => conv.insert(0, ChatMessage::new("system", prompt)),
        }
    }
    let text = s
        .tokenizer
        .apply_chat_template_with(&conv, shown.filter(|_| native_tools).map(|t| &t.raw), &kwargs, true)
        .map_err(|e| ApiError::bad("messages", e.to_string()))?;
    let ids = s.tokenizer.encode(&text, false).map_err(|e| ApiError::bad("messages", e.to_string()))?;
    p.logprobs = ask.spec(ids.len());
    // A grammar forces the answer's shape from the first token: there is no reasoning to split
    // off (a `deepseek-r1` parser would otherwise take the constrained JSON for reasoning).
    let separate_reasoning = separate_reasoning && p.constraint.is_none();
    let prep = gen::prepare(&s, ids, p)?;
    let shape = ChatShape { parsers: s.parsers, tools, separate_reasoning };
    oai_respond(&s, Kind::Chat, vec![(prep, None)], ask, shape, stream, opts).await
}

fn native_finish(f: &Finish) -> MetaFinishReason<'_> {
    match f.reason {
        "stop" => MetaFinishReason::Stop { matched: f.matched.as_ref() },
        "length" => MetaFinishReason::Length { length: f.completion_tokens },
        _ => MetaFinishReason::Abort { message: f.error.as_deref() },
    }
}

/// The per-request part of every `/generate` answer and frame.
struct NativeRun {
    /// `meta_info.id` of each choice.
    ids: Vec<String>,
    prompt_tokens: usize,
    ask: LogprobAsk,
    texts: TokenTexts,
    /// The token at `logprob_start_len`, whose input entry is `null` (SGLang pads it); `None`
    /// without `return_logprob` or with a start beyond the prompt.
    null_first: Option<u32>,
}

impl NativeRun {
    fn answer<'a>(
        &'a self,
        index: usize,
        text: &'a str,
        tokens: usize,
        fin: Option<&'a Finish>,
        lp: &'a NativeLogprobs,
    ) -> GenerateResponse<'a> {
        let on = self.ask.output.is_some();
        let top = on && self.ask.output.unwrap_or(0) > 0;
        let ids = on && !self.ask.token_ids.is_empty();
        let meta_info = MetaInfo {
            id: &self.ids[index],
            prompt_tokens: self.prompt_tokens,
            completion_tokens: tokens,
            // Reported on a choice's last frame; the frames before it say 0.
            cached_tokens: fin.map_or(0, |f| f.cached_tokens),
            finish_reason: fin.map(native_finish),
            input_token_logprobs: on.then_some(&lp.input_token_logprobs[..]),
            output_token_logprobs: on.then_some(&lp.output_token_logprobs[..]),
            input_top_logprobs: top.then_some(&lp.input_top_logprobs[..]),
            output_top_logprobs: top.then_some(&lp.output_top_logprobs[..]),
            input_token_ids_logprobs: ids.then_some(&lp.input_token_ids_logprobs[..]),
            output_token_ids_logprobs: ids.then_some(&lp.output_token_ids_logprobs[..]),
        };
        GenerateResponse { text, meta_info, index }
    }

    /// Adds prompt entries (after the `null` one at `logprob_start_len`) or one generated
    /// token's entry to a choice's lists.
    fn add(&self, acc: &mut NativeLogprobs, entries: &[TokenLogprob], input: bool) {
        if let Some(token) = self.null_first.filter(|_| input) {
            let null = TokenLogprob { token, logprob: None, rank: 0, top: Vec::new(), ids: Vec::new() };
            logprobs::native_push(acc, &null, true, &self.ask, &self.texts);
        }
        for e in entries {
            logprobs::native_push(acc, e, input, &self.ask, &self.texts);
        }
    }
}

/// SGLang's `POST /generate`.
async fn generate(State(s): State<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let m = json_object(&body)?;
    let f = Fields(&m);
    let stream = f.bool("stream")?.unwrap_or(false);
    let sp = match m.get("sampling_params") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(_) => return Err(ApiError::bad("sampling_params", "sampling_params must be an object")),
    };
    let ask = params::parse_logprobs(&m, Api::Native, false)?;
    let vocab = s.engine.info().vocab_size;
    if let Some(bad) = ask.token_ids.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::bad(
            "token_ids_logprob",
            format!("token id {bad} is outside the vocabulary (size {vocab})"),
        ));
    }
    if let Some(k) = sp.keys().find(|k| !params::NATIVE_SAMPLING_KEYS.contains(&k.as_str())) {
        return Err(ApiError::bad("sampling_params", format!("unknown sampling parameter {k:?}")));
    }
    let mut p = params::parse(&sp, Api::Native)?;
    let ids = match (m.get("text"), m.get("input_ids")) {
        (Some(Value::String(t)), None) => {
            if t.is_empty() {
                return Err(ApiError::bad("text", "the prompt is empty; send at least one token"));
            }
            s.tokenizer.encode(t, true).map_err(|e| ApiError::bad("text", e.to_string()))?
        }
        (None, Some(v)) => token_ids(v, "input_ids")?,
        (Some(_), Some(_)) => return Err(ApiError::bad_body("send either text or input_ids, not both")),
        (Some(_), None) => {
            return Err(ApiError::bad("text", "text must be a string (batched prompts are not supported)"))
        }
        (None, None) => return Err(ApiError::bad_body("text or input_ids is required")),
    };
    p.logprobs = ask.spec(ids.len());
    let null_first = ask.output.and_then(|_| ids.get(ask.start(ids.len())).copied());
    let prep = gen::prepare(&s, ids, p)?;
    let rid = format!("{:032x}", s.next_engine_id());
    let n = prep.params.n;
    let ids = if n > 1 { (0..n).map(|i| format!("{rid}-{i}")).collect() } else { vec![rid] };
    let texts = TokenTexts(s.bytes_all.clone());
    let run = NativeRun { ids, prompt_tokens: prep.prompt_ids.len(), ask, texts, null_first };
    let mut events = gen::start(&s, prep)?;
    if !stream {
        let all = collect(events, n).await;
        let mut done = Vec::with_capacity(n);
        let mut lps = Vec::with_capacity(n);
        for c in &all {
            let fin = c.finish.clone().ok_or(ApiError::Unavailable)?;
            if let Some(e) = &fin.error {
                return Err(ApiError::Engine(e.clone()));
            }
            done.push(fin);
            let mut acc = NativeLogprobs::default();
            run.add(&mut acc, &c.prompt, true);
            run.add(&mut acc, &c.tokens, false);
            lps.push(acc);
        }
        let outs: Vec<GenerateResponse<'_>> = all
            .iter()
            .zip(&done)
            .zip(&lps)
            .enumerate()
            .map(|(i, ((c, fin), lp))| run.answer(i, &c.text, fin.completion_tokens, Some(fin), lp))
            .collect();
        // One prompt, one choice: the object itself, as SGLang answers; else the list.
        return Ok(match outs.as_slice() {
            [one] => Json(one).into_response(),
            all => Json(all).into_response(),
        });
    }
    let mut acc: Vec<String> = vec![String::new(); n];
    let mut lps: Vec<NativeLogprobs> = vec![NativeLogprobs::default(); n];
    let mut ended = false;
    let body = stream::poll_fn(move |cx| {
        use std::task::Poll;
        if ended {
            return Poll::Ready(None);
        }
        let mut out = Vec::new();
        match events.poll_next_unpin(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Some(ChoiceEvent::Prompt { index, entries, .. })) => {
                run.add(&mut lps[index], &entries, true);
            }
            Poll::Ready(Some(ChoiceEvent::Text { index, text, tokens, logprob })) => {
                let has_lp = logprob.is_some();
                if let Some(e) = logprob {
                    run.add(&mut lps[index], std::slice::from_ref(&*e), false);
                }
                if !text.is_empty() || has_lp {
                    acc[index].push_str(&text);
                    push_frame(&mut out, &run.answer(index, &acc[index], tokens, None, &lps[index]));
                }
            }
            Poll::Ready(Some(ChoiceEvent::Done { index, finish })) => {
                if let Some(e) = &finish.error {
                    push_error(&mut out, e);
                }
                let frame = run.answer(index, &acc[index], finish.completion_tokens, Some(&finish), &lps[index]);
                push_frame(&mut out, &frame);
            }
            Poll::Ready(None) => {
                ended = true;
                push_done(&mut out);
            }
        }
        Poll::Ready(Some(out))
    })
    .filter(|s| std::future::ready(!s.is_empty()))
    .boxed();
    Ok(sse_response(body))
}
