//! What the client observed of one request: timestamps, content chunks, outcome.
//!
//! All times are seconds since the run start (one `Instant` taken just before the first send
//! is scheduled, or the `--start-at` moment every client of a multi-client run shares), so
//! records from one run share a clock and can be laid on one time line.

use serde::{Deserialize, Serialize};

/// Why a request failed. Each cause is counted separately in the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The server answered with a non-2xx status.
    Http(u16),
    /// The stream carried an `{"error": ...}` frame.
    InBandError,
    /// The body ended cleanly but without `[DONE]` or a `finish_reason`.
    StreamEndedEarly,
    /// No byte arrived for `--read-timeout` seconds.
    Timeout,
    /// The request ran past `--request-timeout` seconds in total.
    Deadline,
    /// The TCP connection was refused (nothing listening).
    ConnectionRefused,
    /// The connection could not be made for another reason (name lookup, unreachable host; a
    /// connect timeout is a `Timeout`).
    ConnectionFailed,
    /// The connection broke mid-request (reset, closed mid-frame, any transport error after
    /// the connection was made).
    ConnectionReset,
    /// A frame was not valid JSON or lacked the fields the backend's API defines.
    InvalidResponse,
    /// The run was interrupted (Ctrl-C / SIGTERM) while the request was in flight.
    Interrupted,
    /// Never sent: the server had stopped answering before its turn came.
    NotSent,
    /// Never sent: the run was interrupted (Ctrl-C / SIGTERM) before its turn came.
    NotSentInterrupted,
}

impl FailureKind {
    /// The label used in the report and in `errors_by_cause`.
    pub fn label(self) -> String {
        match self {
            FailureKind::Http(s) => format!("HTTP {s}"),
            FailureKind::InBandError => "in-band error".into(),
            FailureKind::StreamEndedEarly => "stream ended early".into(),
            FailureKind::Timeout => "timeout".into(),
            FailureKind::Deadline => "deadline exceeded".into(),
            FailureKind::ConnectionRefused => "connection refused".into(),
            FailureKind::ConnectionFailed => "connection failed".into(),
            FailureKind::ConnectionReset => "connection reset".into(),
            FailureKind::InvalidResponse => "invalid response".into(),
            FailureKind::Interrupted => "interrupted".into(),
            FailureKind::NotSent => "not sent (server down)".into(),
            FailureKind::NotSentInterrupted => "not sent (interrupted)".into(),
        }
    }

    /// True for causes that mean the server process is gone or unreachable.
    pub fn is_connection_level(self) -> bool {
        matches!(self, FailureKind::ConnectionRefused | FailureKind::ConnectionFailed | FailureKind::ConnectionReset)
    }
}

/// A failure: its cause and the detail the client saw (status body, error message).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    /// The counted cause.
    pub kind: FailureKind,
    /// Free text for the details file.
    pub message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind.label(), self.message)
    }
}

/// Where a request's output token count came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenCountSource {
    /// The server's `usage.completion_tokens` or `meta_info.completion_tokens`.
    Server,
    /// No usage arrived: the client tokenized the received text.
    Estimated,
}

/// One content-bearing chunk as received.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Chunk {
    /// Arrival time, seconds since the run start.
    pub t: f64,
    /// How many tokens it carries, when the server says so (native `meta_info`, or a
    /// cumulative `usage` on every chunk); `None` when only the chunk is known.
    pub tokens: Option<u64>,
}

/// Which round of which conversation a request was (multi-turn datasets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Turn {
    /// The conversation's position in the dataset.
    pub conversation: usize,
    /// 0-based round within it.
    pub round: usize,
}

/// Everything the client observed of one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Position in the run's records (a conversation's rounds take consecutive places).
    pub index: usize,
    /// The conversation and round, for multi-turn datasets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turn: Option<Turn>,
    /// Prompt length in tokens: the server's count when it reports one, else the client's.
    pub prompt_len: u64,
    /// `max_tokens` asked for.
    pub requested_output_len: u64,
    /// When the arrival schedule said to send.
    pub scheduled_s: f64,
    /// When the client got to it (send lag = `dispatched_s - scheduled_s`).
    pub dispatched_s: f64,
    /// When a concurrency slot was granted and the request written (`--max-concurrency`
    /// wait = `sent_s - dispatched_s`). Latencies are measured from here.
    pub sent_s: f64,
    /// First response byte (headers), if any came.
    pub first_byte_s: Option<f64>,
    /// Content chunks in arrival order.
    pub chunks: Vec<Chunk>,
    /// Last byte of the response, or the moment the failure was seen.
    pub end_s: f64,
    /// Output tokens (0 for a failed request).
    pub output_tokens: u64,
    /// Where [`Self::output_tokens`] came from.
    pub output_tokens_source: TokenCountSource,
    /// `finish_reason` as the server gave it.
    pub finish_reason: Option<String>,
    /// The generated text.
    pub text: String,
    /// `None` on success.
    pub failure: Option<Failure>,
    /// Times the request was sent again on a fresh connection because the connection it was
    /// written into closed at once, before any response byte (0 or 1; see
    /// [`crate::client::send`]). Never hidden: counted in the result line as
    /// `retried_requests` (warmup requests are not counted).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retries: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl RequestRecord {
    /// True when the request completed.
    pub fn success(&self) -> bool {
        self.failure.is_none()
    }

    /// Time to first token: first content chunk (reasoning content included) minus send time.
    /// For a non-streamed request the whole answer is its first chunk, so TTFT = E2E.
    pub fn ttft(&self) -> Option<f64> {
        self.chunks.first().map(|c| c.t - self.sent_s)
    }

    /// End-to-end latency: last byte minus send time.
    pub fn e2e(&self) -> f64 {
        self.end_s - self.sent_s
    }

    /// Time per output token after the first: `(E2E - TTFT) / (output_tokens - 1)`; `None`
    /// when fewer than two tokens came back.
    pub fn tpot(&self) -> Option<f64> {
        let ttft = self.ttft()?;
        (self.output_tokens > 1).then(|| (self.e2e() - ttft) / (self.output_tokens - 1) as f64)
    }

    /// Inter-token latencies and whether they are per token.
    ///
    /// Gaps are taken between consecutive content chunks, so there is one fewer gap than
    /// chunks and `TTFT + sum(ITL)` equals the last chunk's time minus the send time. When the
    /// server tells how many tokens each chunk carries, a chunk of `n` tokens contributes `n`
    /// entries of `gap / n` (SGLang's `adjust_itl`) and the list is per token; otherwise it
    /// is per chunk. A chunk that carries zero new tokens is merged into the next one.
    pub fn itl(&self) -> (Vec<f64>, bool) {
        let per_token = self.chunks.iter().skip(1).all(|c| c.tokens.is_some());
        let mut out = Vec::with_capacity(self.chunks.len());
        let Some(first) = self.chunks.first() else {
            return (out, per_token);
        };
        let mut prev = first.t;
        for c in &self.chunks[1..] {
            let gap = c.t - prev;
            match (per_token, c.tokens) {
                (true, Some(0)) => continue,
                (true, Some(n)) => out.extend(std::iter::repeat_n(gap / n as f64, n as usize)),
                _ => out.push(gap),
            }
            prev = c.t;
        }
        // A trailing chunk that carried no new token (a detokenizer flush) still took time:
        // its gap goes to the last token, so TTFT + sum(ITL) still reaches the last chunk.
        if let Some(last) = self.chunks.last().filter(|l| l.t > prev) {
            match out.last_mut() {
                Some(x) => *x += last.t - prev,
                None => out.push(last.t - prev),
            }
        }
        (out, per_token)
    }

    /// Arrival times of each output token, for per-second throughput buckets.
    ///
    /// With per-chunk counts each chunk's tokens land at its arrival time. Without them the
    /// request's token total is spread evenly over its chunks, so the buckets hold tokens,
    /// not chunks.
    pub fn token_arrivals(&self) -> Vec<(f64, f64)> {
        if self.chunks.is_empty() {
            return Vec::new();
        }
        if self.chunks.iter().all(|c| c.tokens.is_some()) {
            return self.chunks.iter().map(|c| (c.t, c.tokens.unwrap_or(0) as f64)).collect();
        }
        let each = self.output_tokens as f64 / self.chunks.len() as f64;
        self.chunks.iter().map(|c| (c.t, each)).collect()
    }
}
