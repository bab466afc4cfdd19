//! One request against the server: reading the answer (streamed or not) chunk by chunk with
//! per-read idle timeouts, and classifying failures. The body each backend sends is built in
//! [`crate::body`].
//!
//! Backends and their endpoints are SGLang's: `sglang` posts to the native `/generate`,
//! `sglang-oai`/`vllm` to `/v1/completions`, `sglang-oai-chat`/`vllm-chat` to
//! `/v1/chat/completions`. Unlike SGLang's client, OpenAI-style requests always ask for usage
//! (`stream_options.include_usage`, plus `continuous_usage_stats` so each chunk tells how many
//! tokens it carries), since output counts must come from the server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::Value;
use std::borrow::Cow;
use sparrow_protocol::sse::{SseDecoder, DONE};
use sparrow_tokenizer::Tokenizer;
use tokio_util::sync::CancellationToken;

pub use crate::body::{build_body, PromptInput, RequestOptions};
use crate::record::{Chunk, Failure, FailureKind, RequestRecord, TokenCountSource};

/// The API dialect a backend speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// SGLang native `/generate`.
    #[value(name = "sglang")]
    Sglang,
    /// SGLang's OpenAI completions endpoint.
    #[value(name = "sglang-oai")]
    SglangOai,
    /// SGLang's OpenAI chat endpoint.
    #[value(name = "sglang-oai-chat")]
    SglangOaiChat,
    /// vLLM's OpenAI completions endpoint.
    #[value(name = "vllm")]
    Vllm,
    /// vLLM's OpenAI chat endpoint.
    #[value(name = "vllm-chat")]
    VllmChat,
    /// SGLang's alias of `sglang`.
    #[value(name = "sglang-native")]
    SglangNative,
    /// LMDeploy's OpenAI completions endpoint.
    #[value(name = "lmdeploy")]
    Lmdeploy,
    /// LMDeploy's OpenAI chat endpoint.
    #[value(name = "lmdeploy-chat")]
    LmdeployChat,
    // SGLang backends sparrow bench refuses by name.
    /// Refused by name.
    #[value(name = "sglang-embedding", hide = true)]
    SglangEmbedding,
    /// Refused by name.
    #[value(name = "vllm-embedding", hide = true)]
    VllmEmbedding,
    /// TensorRT-LLM's Triton ensemble `generate_stream`.
    #[value(name = "trt")]
    Trt,
    /// Refused by name.
    #[value(name = "gserver", hide = true)]
    Gserver,
    /// Refused by name.
    #[value(name = "truss", hide = true)]
    Truss,
}

/// The request and answer shape of an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/generate`: cumulative `text`, `meta_info.completion_tokens`.
    Generate,
    /// `/v1/completions`: `choices[0].text` deltas.
    Completions,
    /// `/v1/chat/completions`: `choices[0].delta.content` deltas.
    Chat,
    /// TensorRT-LLM's Triton ensemble, `/v2/models/ensemble/generate_stream`: `text_output`
    /// deltas, no token counts, the stream ends with the body.
    Trt,
}

impl Backend {
    /// The name as spelled on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sglang => "sglang",
            Backend::SglangOai => "sglang-oai",
            Backend::SglangOaiChat => "sglang-oai-chat",
            Backend::Vllm => "vllm",
            Backend::VllmChat => "vllm-chat",
            Backend::SglangNative => "sglang-native",
            Backend::Lmdeploy => "lmdeploy",
            Backend::LmdeployChat => "lmdeploy-chat",
            Backend::SglangEmbedding => "sglang-embedding",
            Backend::VllmEmbedding => "vllm-embedding",
            Backend::Trt => "trt",
            Backend::Gserver => "gserver",
            Backend::Truss => "truss",
        }
    }

    /// Whether sparrow bench implements the backend (the others are SGLang names it refuses).
    pub fn supported(self) -> bool {
        !matches!(
            self,
            Backend::SglangEmbedding | Backend::VllmEmbedding | Backend::Gserver | Backend::Truss
        )
    }

    /// Whether the backend is one of SGLang's (as opposed to vLLM's or LMDeploy's), which
    /// decides the cache-flush endpoint.
    pub fn is_sglang(self) -> bool {
        matches!(self, Backend::Sglang | Backend::SglangNative | Backend::SglangOai | Backend::SglangOaiChat)
    }

    /// Which API the backend uses.
    pub fn api(self) -> Api {
        match self {
            Backend::Sglang | Backend::SglangNative => Api::Generate,
            Backend::SglangOai | Backend::Vllm | Backend::Lmdeploy => Api::Completions,
            Backend::SglangOaiChat | Backend::VllmChat | Backend::LmdeployChat => Api::Chat,
            Backend::Trt => Api::Trt,
            // Refused at validation; never sent.
            Backend::SglangEmbedding | Backend::VllmEmbedding | Backend::Gserver | Backend::Truss => Api::Completions,
        }
    }

    /// Default port of the server family (SGLang 30000, vLLM 8000).
    pub fn default_port(self) -> u16 {
        match self {
            Backend::Vllm | Backend::VllmChat | Backend::VllmEmbedding | Backend::Trt => 8000,
            Backend::Lmdeploy | Backend::LmdeployChat => 23333,
            _ => 30000,
        }
    }
}

impl Api {
    /// The endpoint path.
    pub fn path(self) -> &'static str {
        match self {
            Api::Generate => "/generate",
            Api::Completions => "/v1/completions",
            Api::Chat => "/v1/chat/completions",
            Api::Trt => "/v2/models/ensemble/generate_stream",
        }
    }
}

/// What every request of a run shares.
#[derive(Debug, Clone)]
pub struct ClientCtx {
    /// The pooled HTTP client.
    pub http: reqwest::Client,
    /// Full endpoint URL.
    pub url: String,
    /// Extra headers (`--header`, `OPENAI_API_KEY`).
    pub headers: reqwest::header::HeaderMap,
    /// The API dialect.
    pub api: Api,
    /// Whether answers are streamed.
    pub stream: bool,
    /// Longest wait for the next byte.
    pub read_timeout: Duration,
    /// Longest a whole request may take.
    pub request_timeout: Duration,
    /// Counts output tokens when the server reports none.
    pub tokenizer: Arc<Tokenizer>,
    /// The run's clock origin.
    pub t0: Instant,
    /// Stamped whenever any byte of any answer arrives, so an observer (the sweep's hang
    /// watch) can tell a silent server from a slow one without reading records.
    pub activity: Arc<Activity>,
}

/// The time of the latest byte received by any request of a run.
#[derive(Debug)]
pub struct Activity {
    origin: Instant,
    last_ms: std::sync::atomic::AtomicU64,
}

impl Default for Activity {
    fn default() -> Self {
        Activity { origin: Instant::now(), last_ms: std::sync::atomic::AtomicU64::new(0) }
    }
}

impl Activity {
    /// Records that a byte arrived now.
    pub fn touch(&self) {
        let ms = self.origin.elapsed().as_millis() as u64;
        self.last_ms.fetch_max(ms, std::sync::atomic::Ordering::Relaxed);
    }
    /// When the latest byte arrived (the creation time if none has).
    pub fn last(&self) -> Instant {
        self.origin + Duration::from_millis(self.last_ms.load(std::sync::atomic::Ordering::Relaxed))
    }
}

impl ClientCtx {
    /// Seconds since the run start.
    pub fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }
}

/// Sends `body` and fills `rec` (whose `index`, `prompt_len`, `requested_output_len`,
/// `scheduled_s` and `dispatched_s` the caller set) with what came back. Never returns an
/// error: a failure is recorded in `rec.failure`.
///
/// `cancel` interrupts the request (recorded as `interrupted`); `abandon` gives it up because
/// the server was declared down (recorded as `connection reset`). `routing_key` is sent as
/// `X-SMG-Routing-Key`.
pub async fn send(
    ctx: &ClientCtx,
    body: Bytes,
    rec: &mut RequestRecord,
    cancel: &CancellationToken,
    abandon: &CancellationToken,
    routing_key: Option<&str>,
) {
    rec.sent_s = ctx.now();
    let mut acc = Accumulator::default();
    let outcome = tokio::select! {
        r = tokio::time::timeout(ctx.request_timeout, exchange(ctx, body, rec, &mut acc, routing_key)) => match r {
            Ok(r) => r,
            Err(_) => Err(failure(FailureKind::Deadline, format!("no answer within {:?}", ctx.request_timeout))),
        },
        () = cancel.cancelled() => Err(failure(FailureKind::Interrupted, "run interrupted".into())),
        () = abandon.cancelled() => Err(failure(FailureKind::ConnectionReset, "abandoned: the server stopped answering".into())),
    };
    rec.end_s = ctx.now();
    rec.text = acc.text;
    rec.finish_reason = acc.finish_reason;
    if let Some(p) = acc.prompt_tokens.filter(|p| *p > 0) {
        rec.prompt_len = p;
    }
    match outcome {
        Ok(()) => {
            match acc.completion_tokens {
                Some(n) => {
                    rec.output_tokens = n;
                    rec.output_tokens_source = TokenCountSource::Server;
                }
                None => {
                    rec.output_tokens = ctx.tokenizer.encode(&rec.text, false).map_or(0, |ids| ids.len() as u64);
                    rec.output_tokens_source = TokenCountSource::Estimated;
                }
            }
            rec.failure = None;
        }
        Err(f) => {
            rec.output_tokens = 0;
            rec.failure = Some(f);
        }
    }
}

fn failure(kind: FailureKind, message: String) -> Failure {
    Failure { kind, message }
}

/// Classifies a transport error from reqwest/hyper.
pub fn classify(e: &reqwest::Error) -> FailureKind {
    if e.is_timeout() {
        return FailureKind::Timeout;
    }
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::ConnectionRefused {
                return FailureKind::ConnectionRefused;
            }
        }
        src = s.source();
    }
    if e.is_connect() {
        FailureKind::ConnectionFailed
    } else {
        FailureKind::ConnectionReset
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(x) = src {
        s.push_str(": ");
        s.push_str(&x.to_string());
        src = x.source();
    }
    s
}

/// One stream frame, parsed in place from the SSE data: only what the client reads, text
/// borrowed when it has no escapes. Every OpenAI and SGLang frame shape fits it; one that
/// does not (a field of an unexpected type) is read through [`Frame::from_value`] instead.
#[derive(Debug, Default, Deserialize)]
struct Frame<'a> {
    /// `choices[0]`; the other choices are skipped unread.
    #[serde(default, borrow, deserialize_with = "first_choice")]
    choices: Option<ChoiceF<'a>>,
    #[serde(default)]
    usage: Option<Counts>,
    #[serde(default)]
    meta_info: Option<MetaF>,
    /// `/generate`: the cumulative text.
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    /// TensorRT-LLM: the new text.
    #[serde(default, borrow)]
    text_output: Option<Cow<'a, str>>,
    /// An in-band error (`null` reads as none, as [`sparrow_protocol::in_band_error`]).
    #[serde(default)]
    error: Option<IgnoredAny>,
    #[serde(default, borrow)]
    object: Option<Cow<'a, str>>,
}

#[derive(Debug, Default, Deserialize)]
struct ChoiceF<'a> {
    #[serde(default, borrow)]
    text: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    delta: Option<DeltaF<'a>>,
    #[serde(default, borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Debug, Default, Deserialize)]
struct DeltaF<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning_content: Option<Cow<'a, str>>,
}

/// OpenAI `usage`, or the token counts of SGLang's `meta_info`.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
struct Counts {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
struct MetaF {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    /// `null`, or an object whose `type` names the reason.
    #[serde(default)]
    finish_reason: Option<Value>,
}

/// Deserializes only the first element of `choices` (or `null`).
fn first_choice<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<ChoiceF<'de>>, D::Error> {
    struct First;
    impl<'de> serde::de::Visitor<'de> for First {
        type Value = Option<ChoiceF<'de>>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a list of choices")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let first = seq.next_element::<ChoiceF<'de>>()?;
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(first)
        }
    }
    d.deserialize_any(First)
}

impl<'a> Frame<'a> {
    /// The lenient reading of a frame: fields of unexpected types count as absent.
    fn from_value(v: &'a Value) -> Frame<'a> {
        let s = |x: Option<&'a Value>| x.and_then(Value::as_str).map(Cow::Borrowed);
        let counts = |x: Option<&Value>| Counts {
            prompt_tokens: x.and_then(|u| u.get("prompt_tokens")).and_then(Value::as_u64),
            completion_tokens: x.and_then(|u| u.get("completion_tokens")).and_then(Value::as_u64),
        };
        let c = v.get("choices").and_then(|c| c.get(0));
        let d = c.and_then(|c| c.get("delta"));
        let m = v.get("meta_info").filter(|m| m.is_object());
        Frame {
            choices: c.map(|c| ChoiceF {
                text: s(c.get("text")),
                delta: d.map(|d| DeltaF { content: s(d.get("content")), reasoning_content: s(d.get("reasoning_content")) }),
                finish_reason: s(c.get("finish_reason")),
            }),
            usage: v.get("usage").filter(|u| !u.is_null()).map(|u| counts(Some(u))),
            meta_info: m.map(|m| {
                let Counts { prompt_tokens, completion_tokens } = counts(Some(m));
                MetaF { prompt_tokens, completion_tokens, finish_reason: m.get("finish_reason").cloned() }
            }),
            text: s(v.get("text")),
            text_output: s(v.get("text_output")),
            error: None,
            object: s(v.get("object")),
        }
    }

    /// Token counts: `usage` when present, else `meta_info`.
    fn counts(&self) -> Option<Counts> {
        self.usage.or_else(|| {
            self.meta_info.as_ref().map(|m| Counts { prompt_tokens: m.prompt_tokens, completion_tokens: m.completion_tokens })
        })
    }
}

/// Running state of one answer.
#[derive(Debug, Default)]
struct Accumulator {
    text: String,
    /// Latest cumulative completion-token count the server reported.
    completion_tokens: Option<u64>,
    /// Cumulative count at the previous content chunk.
    tokens_at_last_chunk: u64,
    prompt_tokens: Option<u64>,
    finish_reason: Option<String>,
    done: bool,
}

impl Accumulator {
    /// Applies one frame; returns whether it carried new content and, when the frame told
    /// it, the number of tokens that content carries.
    fn apply(&mut self, api: Api, f: &Frame<'_>) -> (bool, Option<u64>) {
        let counts = f.counts();
        let cum = counts.and_then(|u| u.completion_tokens);
        if let Some(p) = counts.and_then(|u| u.prompt_tokens) {
            self.prompt_tokens = Some(p);
        }
        let choice = f.choices.as_ref();
        let (new, finish): (bool, Option<&str>) = match api {
            Api::Generate => {
                let full = f.text.as_deref().unwrap_or("");
                let fin = f.meta_info.as_ref().and_then(|m| m.finish_reason.as_ref()).filter(|x| !x.is_null());
                let fin_s = fin.map(|x| x.get("type").and_then(Value::as_str).map_or_else(|| x.to_string(), str::to_owned));
                if fin_is_some(&fin_s) {
                    self.finish_reason = fin_s;
                }
                // `text` is cumulative; what is new is past what we have.
                let new = if let Some(rest) = full.strip_prefix(self.text.as_str()) {
                    self.text.push_str(rest);
                    !rest.is_empty()
                } else {
                    self.text.clear();
                    self.text.push_str(full);
                    !full.is_empty()
                };
                (new, None)
            }
            Api::Completions => {
                let t = choice.and_then(|c| c.text.as_deref()).unwrap_or("");
                self.text.push_str(t);
                (!t.is_empty(), choice.and_then(|c| c.finish_reason.as_deref()))
            }
            Api::Trt => {
                let t = f.text_output.as_deref().unwrap_or("");
                self.text.push_str(t);
                (!t.is_empty(), None)
            }
            Api::Chat => {
                let d = choice.and_then(|c| c.delta.as_ref());
                let content = d.and_then(|d| d.content.as_deref()).unwrap_or("");
                let reasoning = d.and_then(|d| d.reasoning_content.as_deref()).unwrap_or("");
                // Reasoning tokens are output tokens: keep them for counting.
                self.text.push_str(reasoning);
                self.text.push_str(content);
                (!content.is_empty() || !reasoning.is_empty(), choice.and_then(|c| c.finish_reason.as_deref()))
            }
        };
        if let Some(fin) = finish.filter(|f| !f.is_empty()) {
            self.finish_reason = Some(fin.to_owned());
        }
        let mut tokens = None;
        if let Some(c) = cum {
            if new {
                tokens = Some(c.saturating_sub(self.tokens_at_last_chunk));
                self.tokens_at_last_chunk = c;
            }
            self.completion_tokens = Some(c);
        }
        (new, tokens)
    }
}

/// Token accounting of a frame or answer: OpenAI `usage`, else SGLang `meta_info`.
fn usage_of(v: &Value) -> Option<&Value> {
    v.get("usage").filter(|u| !u.is_null()).or_else(|| v.get("meta_info"))
}

fn fin_is_some(f: &Option<String>) -> bool {
    f.as_deref().is_some_and(|s| !s.is_empty())
}

async fn next_or_timeout<T>(ctx: &ClientCtx, fut: impl std::future::Future<Output = T>) -> Result<T, Failure> {
    tokio::time::timeout(ctx.read_timeout, fut)
        .await
        .map_err(|_| failure(FailureKind::Timeout, format!("no data for {:.1}s", ctx.read_timeout.as_secs_f64())))
}

/// The header SGLang's client sends a prefix group's routing key in (`serving.py`).
pub const ROUTING_KEY_HEADER: &str = "X-SMG-Routing-Key";

async fn exchange(
    ctx: &ClientCtx,
    body: Bytes,
    rec: &mut RequestRecord,
    acc: &mut Accumulator,
    routing_key: Option<&str>,
) -> Result<(), Failure> {
    let mut req = ctx
        .http
        .post(&ctx.url)
        .headers(ctx.headers.clone())
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body);
    if let Some(k) = routing_key {
        req = req.header(ROUTING_KEY_HEADER, k);
    }
    // Without streaming the headers come only once the whole answer is generated, so only
    // the overall deadline applies to them.
    let resp = if ctx.stream { next_or_timeout(ctx, req.send()).await? } else { req.send().await }
        .map_err(|e| failure(classify(&e), error_chain(&e)))?;
    ctx.activity.touch();
    rec.first_byte_s = Some(ctx.now());
    let status = resp.status();
    if !status.is_success() {
        let text = next_or_timeout(ctx, resp.text()).await?.unwrap_or_default();
        let msg = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| sparrow_protocol::in_band_error(&v))
            .unwrap_or_else(|| text.chars().take(500).collect());
        return Err(failure(FailureKind::Http(status.as_u16()), msg));
    }
    if !ctx.stream {
        let bytes = next_or_timeout(ctx, resp.bytes()).await?.map_err(|e| failure(classify(&e), error_chain(&e)))?;
        let t = ctx.now();
        let v: Value =
            serde_json::from_slice(&bytes).map_err(|e| failure(FailureKind::InvalidResponse, e.to_string()))?;
        if let Some(msg) = sparrow_protocol::in_band_error(&v) {
            return Err(failure(FailureKind::InBandError, msg));
        }
        let text = match ctx.api {
            Api::Generate => v.get("text").and_then(Value::as_str),
            Api::Completions => v.pointer("/choices/0/text").and_then(Value::as_str),
            Api::Chat => v.pointer("/choices/0/message/content").and_then(Value::as_str),
            Api::Trt => v.get("text_output").and_then(Value::as_str),
        }
        .ok_or_else(|| failure(FailureKind::InvalidResponse, "answer has no text".into()))?;
        acc.text = text.to_owned();
        let usage = usage_of(&v);
        acc.completion_tokens = usage.and_then(|u| u.get("completion_tokens")).and_then(Value::as_u64);
        acc.prompt_tokens = usage.and_then(|u| u.get("prompt_tokens")).and_then(Value::as_u64);
        // The whole answer arrives at once: it is the first (and only) chunk.
        rec.chunks.push(Chunk { t, tokens: acc.completion_tokens });
        return Ok(());
    }
    let mut stream = resp.bytes_stream();
    let mut sse = SseDecoder::new();
    rec.chunks.reserve(rec.requested_output_len.min(1 << 16) as usize + 1);
    let mut err: Option<Failure> = None;
    loop {
        let Some(item) = next_or_timeout(ctx, stream.next()).await? else {
            break;
        };
        let bytes = item.map_err(|e| failure(classify(&e), error_chain(&e)))?;
        ctx.activity.touch();
        // Frames of one read arrived together: one timestamp for all of them.
        let t = ctx.now();
        sse.feed_with(&bytes, |data| {
            if err.is_some() || acc.done {
                return;
            }
            let data = data.trim();
            if data.is_empty() {
                return;
            }
            if data == DONE {
                // Some servers keep the connection open after [DONE]; nothing after it counts.
                acc.done = true;
                return;
            }
            let parsed = serde_json::from_str::<Frame<'_>>(data);
            let value;
            let frame = match parsed {
                Ok(f) if f.error.is_none() && f.object.as_deref() != Some("error") => f,
                _ => {
                    // Rare: an error frame, or a shape the fast reader does not take.
                    value = match serde_json::from_str::<Value>(data) {
                        Ok(v) => v,
                        Err(e) => {
                            let head: String = data.chars().take(200).collect();
                            err = Some(failure(FailureKind::InvalidResponse, format!("{e}: {head}")));
                            return;
                        }
                    };
                    if let Some(msg) = sparrow_protocol::in_band_error(&value) {
                        err = Some(failure(FailureKind::InBandError, msg));
                        return;
                    }
                    Frame::from_value(&value)
                }
            };
            let (content, tokens) = acc.apply(ctx.api, &frame);
            if content {
                rec.chunks.push(Chunk { t, tokens });
            }
            if acc.finish_reason.as_deref() == Some("abort") {
                // SGLang ends an aborted request with finish_reason "abort" (its message in
                // meta_info or the choice); it produced no complete answer.
                err = Some(failure(FailureKind::InBandError, format!("request aborted by the server: {data}")));
            }
        });
        if let Some(e) = err {
            return Err(e);
        }
        if acc.done {
            break;
        }
    }
    let cut = sse.finish();
    // TensorRT-LLM ends a stream with its body: a clean end is the answer's end.
    if acc.done || ((fin_is_some(&acc.finish_reason) || ctx.api == Api::Trt) && !cut) {
        Ok(())
    } else {
        Err(failure(
            FailureKind::StreamEndedEarly,
            if cut { "body ended mid-frame" } else { "body ended without [DONE] or finish_reason" }.into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Applies `v` through the fast reader, checking the lenient reader agrees.
    fn ap(a: &mut Accumulator, api: Api, v: &Value) -> (bool, Option<u64>) {
        let text = v.to_string();
        let fast: Frame<'_> = serde_json::from_str(&text).expect("fast reader takes it");
        let mut b = Accumulator { text: a.text.clone(), tokens_at_last_chunk: a.tokens_at_last_chunk, ..Default::default() };
        let slow = b.apply(api, &Frame::from_value(v));
        let got = a.apply(api, &fast);
        assert_eq!(got, slow, "fast and lenient readers agree on {v}");
        assert_eq!(a.text, b.text);
        got
    }

    #[test]
    fn generate_text_is_cumulative() {
        let mut a = Accumulator::default();
        let f = |t: &str, n: u64| json!({"text": t, "meta_info": {"completion_tokens": n, "prompt_tokens": 7, "finish_reason": null, "id": "x", "e2e_latency": 0.1}});
        assert_eq!(ap(&mut a, Api::Generate, &f("He", 1)), (true, Some(1)));
        assert_eq!(ap(&mut a, Api::Generate, &f("Hello wor", 3)), (true, Some(2)));
        // A frame with no new text adds no chunk; its tokens count towards the next one.
        assert_eq!(ap(&mut a, Api::Generate, &f("Hello wor", 4)), (false, None));
        assert_eq!(ap(&mut a, Api::Generate, &f("Hello world", 5)), (true, Some(2)));
        assert_eq!(a.text, "Hello world");
        assert_eq!(a.completion_tokens, Some(5));
        assert_eq!(a.prompt_tokens, Some(7));
        let end = json!({"text": "Hello world", "meta_info": {"completion_tokens": 5, "finish_reason": {"type": "length", "length": 5}}});
        assert_eq!(ap(&mut a, Api::Generate, &end), (false, None));
        assert_eq!(a.finish_reason.as_deref(), Some("length"));
    }

    #[test]
    fn completions_usage_only_chunk() {
        let mut a = Accumulator::default();
        assert_eq!(
            ap(&mut a, Api::Completions, &json!({"choices": [{"index": 0, "text": "a b", "finish_reason": null}, {"index": 1, "text": "other"}]})),
            (true, None)
        );
        assert_eq!(
            ap(&mut a, Api::Completions, &json!({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]})),
            (false, None)
        );
        assert_eq!(
            ap(
                &mut a,
                Api::Completions,
                &json!({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
            ),
            (false, None)
        );
        assert_eq!(a.text, "a b", "only the first choice counts");
        assert_eq!(a.completion_tokens, Some(2));
        assert_eq!(a.finish_reason.as_deref(), Some("stop"));
    }

    #[test]
    fn continuous_usage_counts_tokens_per_chunk_and_escapes_decode() {
        let mut a = Accumulator::default();
        let f = |t: &str, n: u64| json!({"choices": [{"index": 0, "text": t}], "usage": {"prompt_tokens": 4, "completion_tokens": n}});
        assert_eq!(ap(&mut a, Api::Completions, &f("x\"y", 2)), (true, Some(2)));
        assert_eq!(ap(&mut a, Api::Completions, &f("é", 3)), (true, Some(1)));
        assert_eq!(a.text, "x\"y\u{e9}");
    }

    #[test]
    fn odd_shapes_fall_back_to_the_lenient_reader() {
        // A completion count that is not an integer: the fast reader refuses, the lenient
        // one reads it as absent.
        let v = json!({"choices": [{"index": 0, "text": "a"}], "usage": {"completion_tokens": 1.5}});
        assert!(serde_json::from_str::<Frame<'_>>(&v.to_string()).is_err());
        let mut a = Accumulator::default();
        assert_eq!(a.apply(Api::Completions, &Frame::from_value(&v)), (true, None));
        // An error frame is seen by the fast reader, so the caller takes the slow path.
        let e: Frame<'_> = serde_json::from_str(r#"{"error": {"message": "boom"}}"#).expect("parses");
        assert!(e.error.is_some());
        let n: Frame<'_> = serde_json::from_str(r#"{"error": null, "choices": null}"#).expect("parses");
        assert!(n.error.is_none() && n.choices.is_none());
    }

    #[test]
    fn chat_reasoning_counts_as_content() {
        let mut a = Accumulator::default();
        let (c, _) = ap(
            &mut a,
            Api::Chat,
            &json!({"choices": [{"index": 0, "delta": {"reasoning_content": "think"}, "finish_reason": null}]}),
        );
        assert!(c);
        assert_eq!(a.text, "think", "reasoning tokens are counted as output");
    }
}
