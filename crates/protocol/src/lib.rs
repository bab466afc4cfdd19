//! Wire types shared by the Sparrow server and `sparrow bench`.
//!
//! - [`openai`]: `/v1/completions`, `/v1/chat/completions` and `/v1/models` response bodies and
//!   stream chunks, following the OpenAI API reference, and the request bodies `sparrow bench`
//!   sends.
//! - [`sglang`]: SGLang's native `/generate` request (sent by `sparrow bench`), answers and
//!   frames (`meta_info`), `/get_model_info`, `/get_server_info`, `/tokenize`, `/detokenize`.
//! - [`openai_request`]: the `/v1/completions` and `/v1/chat/completions` bodies as the server
//!   reads them.
//! - [`responses`]: OpenAI's Responses API request (`/v1/responses`).
//! - [`anthropic`]: Anthropic's Messages API request and error body (`/v1/messages`).
//! - [`embeddings`]: `/v1/embeddings`, SGLang's `/encode`, vLLM's `/v1/rerank` and `/v1/score`.
//! - [`sse`]: Server-Sent Events framing, per the WHATWG HTML "server-sent events" section.
//! - [`Usage`]: OpenAI `usage`; [`ErrorBody`]: OpenAI-style error JSON, also the shape of an
//!   in-band error frame.
//!
//! Response types render in their field order and borrow what they render (see [`openai`]).

pub mod anthropic;
pub mod embeddings;
pub mod openai;
pub mod openai_request;
pub mod responses;
pub mod sglang;
pub mod sse;

use serde::{Deserialize, Serialize};

/// Token accounting a server reports for one request (OpenAI `usage`):
/// `{"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"?}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens in the prompt.
    #[serde(default)]
    pub prompt_tokens: u64,
    /// Tokens generated so far (final value in the last usage report).
    #[serde(default)]
    pub completion_tokens: u64,
    /// `prompt_tokens + completion_tokens`.
    #[serde(default)]
    pub total_tokens: u64,
    /// Prompt tokens served from the prefix cache; absent when there were none, as vLLM and
    /// SGLang omit it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

impl Usage {
    /// Usage of a request with `prompt` prompt tokens (`cached` of them from the prefix cache)
    /// and `completion` generated tokens.
    pub fn new(prompt: u64, completion: u64, cached: u64) -> Self {
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            prompt_tokens_details: (cached > 0)
                .then_some(PromptTokensDetails { cached_tokens: cached, ..Default::default() }),
        }
    }

    /// The same usage with its cached tokens split by cache tier, `storage` of them from the
    /// hierarchical cache's file tier: a server with the tier always reports
    /// `prompt_tokens_details`, zeros included.
    pub fn with_storage(mut self, storage: u64) -> Self {
        let d = self.prompt_tokens_details.get_or_insert_with(PromptTokensDetails::default);
        d.cached_tokens_details = Some(CachedTokensDetails::new(d.cached_tokens, storage));
        self
    }
}

/// Cached prompt tokens by where their KV was found (SGLang's `cached_tokens_details` of
/// `meta_info` under HiCache; sparrow adds it to OpenAI's `prompt_tokens_details` too).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CachedTokensDetails {
    /// In the KV pool's radix cache.
    pub device: u64,
    /// Sparrow has no host-memory tier apart from the file tier: always 0.
    pub host: u64,
    /// Loaded from the file tier.
    pub storage: u64,
}

impl CachedTokensDetails {
    /// `cached` tokens, `storage` of them from the file tier.
    pub fn new(cached: u64, storage: u64) -> Self {
        CachedTokensDetails { device: cached.saturating_sub(storage), host: 0, storage: storage.min(cached) }
    }
}

/// `usage.prompt_tokens_details` (OpenAI API reference, "The completion object").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose KV came from the prefix cache instead of being computed.
    #[serde(default)]
    pub cached_tokens: u64,
    /// Of those, by cache tier (only from a server with the hierarchical cache).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens_details: Option<CachedTokensDetails>,
}

/// OpenAI-style error body: `{"error": {"message", "type", "param", "code"}}`.
///
/// Sent with a non-2xx status, or as an in-band SSE frame once a stream has started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error details.
    pub error: ErrorDetail,
}

/// The inside of [`ErrorBody`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// Human-readable message.
    pub message: String,
    /// Error class, e.g. `invalid_request_error`, `server_error`.
    #[serde(rename = "type", default)]
    pub kind: String,
    /// The request field the error is about, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param: Option<String>,
    /// The HTTP status code the error maps to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<u16>,
}

impl ErrorBody {
    /// A body with `message`, error class `kind` and status `code`.
    pub fn new(message: impl Into<String>, kind: impl Into<String>, code: u16) -> Self {
        ErrorBody { error: ErrorDetail { message: message.into(), kind: kind.into(), param: None, code: Some(code) } }
    }
}

/// If `frame` is an error report rather than data, its message.
///
/// Recognises OpenAI's `{"error": {...}}`, SGLang's `{"error": "..."}` and vLLM's
/// `{"object": "error", "message": ...}`.
pub fn in_band_error(frame: &serde_json::Value) -> Option<String> {
    if let Some(e) = frame.get("error") {
        if e.is_null() {
            return None;
        }
        return Some(
            e.get("message")
                .and_then(|m| m.as_str())
                .map(str::to_owned)
                .or_else(|| e.as_str().map(str::to_owned))
                .unwrap_or_else(|| e.to_string()),
        );
    }
    if frame.get("object").and_then(|o| o.as_str()) == Some("error") {
        return Some(frame.get("message").and_then(|m| m.as_str()).unwrap_or("error").to_owned());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn in_band_error_shapes() {
        assert_eq!(
            in_band_error(&json!({"error": {"message": "boom", "type": "server_error"}})),
            Some("boom".to_owned())
        );
        assert_eq!(in_band_error(&json!({"error": "oom"})), Some("oom".to_owned()));
        assert_eq!(in_band_error(&json!({"object": "error", "message": "bad"})), Some("bad".to_owned()));
        assert_eq!(in_band_error(&json!({"choices": [], "error": null})), None);
        assert_eq!(in_band_error(&json!({"choices": []})), None);
    }
}
