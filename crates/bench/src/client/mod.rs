//! One request against the server: the body each backend sends, reading the answer (streamed
//! or not) chunk by chunk with per-read idle timeouts, and classifying failures.
//!
//! Backends and their endpoints are SGLang's: `sglang` posts to the native `/generate`,
//! `sglang-oai`/`vllm` to `/v1/completions`, `sglang-oai-chat`/`vllm-chat` to
//! `/v1/chat/completions`. Unlike SGLang's client, OpenAI-style requests always ask for usage
//! (`stream_options.include_usage`, plus `continuous_usage_stats` so each chunk tells how many
//! tokens it carries), since output counts must come from the server.
//!
//! - `body`: the JSON body of a request, per API dialect;
//! - `exchange`: one HTTP exchange: status, whole or streamed answer, per-read timeouts;
//! - `stream`: the answer's frames, parsed and accumulated (text, token counts, finish).

mod body;
mod exchange;
mod stream;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use sparrow_tokenizer::Tokenizer;
use tokio_util::sync::CancellationToken;

use crate::record::{Failure, FailureKind, RequestRecord, TokenCountSource};

pub use body::{build_body, LogprobOptions, PromptInput, RequestOptions};
pub use exchange::ROUTING_KEY_HEADER;

use exchange::{exchange, Exchange};
use stream::Accumulator;

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
        !matches!(self, Backend::SglangEmbedding | Backend::VllmEmbedding | Backend::Gserver | Backend::Truss)
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

/// How soon after its send a request's connection must have closed, with no response byte,
/// for the request to be sent again ([`send`]): the idle-close race fails within a round trip;
/// a later close is a failure of the request.
pub const RETRY_WINDOW: Duration = Duration::from_millis(250);

/// What every request of a run shares.
#[derive(Debug, Clone)]
pub struct ClientCtx {
    /// The pooled HTTP client.
    pub http: reqwest::Client,
    /// A client without a pool: every request on a new connection (the one retry of
    /// [`send`]).
    pub fresh: reqwest::Client,
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
///
/// A request whose connection closed before any response byte (hyper's "connection closed
/// before message completed", a reset or broken pipe) within [`RETRY_WINDOW`] of the send is
/// sent once more on a fresh connection, and `rec.retries` says so: that is how a pooled
/// connection the server closed while idle fails (the close crosses the request on the wire),
/// and such a request never reached the server's handler. reqwest does not say whether a
/// connection was pooled, hence the window: a connection that dies later had the request for
/// a while (a crash mid-generation, a proxy's reset), and that failure is the request's. When
/// the retry gets no response byte either (refused: the server went away), the first failure
/// is the record's, the retry's appended to its message. A failure after the first response
/// byte is never retried. Latencies of a retried request count from the first send.
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
    let sent = Instant::now();
    let attempts = async {
        match exchange(ctx, &ctx.http, body.clone(), rec, &mut acc, routing_key).await {
            Ok(()) => Ok(()),
            Err(Exchange::Unanswered(first)) if sent.elapsed() <= RETRY_WINDOW => {
                rec.retries += 1;
                exchange(ctx, &ctx.fresh, body, rec, &mut acc, routing_key).await.map_err(|e| {
                    let f = e.failure();
                    match rec.first_byte_s {
                        None => Failure {
                            message: format!("{}; retried on a fresh connection: {}", first.message, f.message),
                            ..first
                        },
                        Some(_) => f,
                    }
                })
            }
            Err(e) => Err(e.failure()),
        }
    };
    let outcome = tokio::select! {
        r = tokio::time::timeout(ctx.request_timeout, attempts) => match r {
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

/// Reads a streamed answer's body as a live exchange does (SSE framing under its bound, then
/// each event's frame through the same reader), the body arriving as `reads`. Returns the
/// text, the server's completion-token count and how many reads carried content. For the
/// fuzz target and tests: the client's stream path without HTTP.
///
/// # Errors
/// The failure a live exchange records for such a body (an invalid or oversized frame, an
/// in-band error, a body cut mid-frame).
pub fn read_stream(api: Api, reads: &[&[u8]]) -> Result<(String, Option<u64>, usize), Failure> {
    let mut acc = Accumulator::default();
    let mut sse = sparrow_protocol::sse::SseDecoder::new();
    let mut chunks = 0;
    for bytes in reads {
        let mut err = None;
        let mut content = false;
        let framed = sse.feed_with(bytes, |data| {
            if err.is_none() && !acc.done {
                match exchange::event(api, &mut acc, data) {
                    Ok((c, _)) => content |= c,
                    Err(f) => err = Some(f),
                }
            }
        });
        if let Some(f) = err {
            return Err(f);
        }
        framed.map_err(|e| failure(FailureKind::InvalidResponse, e.to_string()))?;
        chunks += usize::from(content);
        if acc.done {
            break;
        }
    }
    if !acc.done && sse.finish() {
        return Err(failure(FailureKind::StreamEndedEarly, "body ended mid-frame".into()));
    }
    Ok((acc.text, acc.completion_tokens, chunks))
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
