//! OpenAI-compatible request and stream-chunk types (OpenAI API reference: Completions,
//! Chat Completions, "The chat completion chunk object", `stream_options`).
//!
//! Requests keep unknown fields in `extra` so a server can refuse them by name and a client can
//! merge `--extra-request-body` into them.

use serde::{Deserialize, Serialize};

use crate::Usage;

/// `stream_options` of a streaming request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamOptions {
    /// Ask for one final chunk with `choices: []` and the request's `usage`.
    #[serde(default)]
    pub include_usage: bool,
    /// vLLM extension: a cumulative `usage` on every chunk, which tells how many tokens each
    /// chunk carries.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub continuous_usage_stats: bool,
}

/// Body of `POST /v1/completions`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CompletionRequest {
    /// Model id from `/v1/models`.
    #[serde(default)]
    pub model: String,
    /// A string, a list of strings, a list of token ids or a list of lists of ids.
    pub prompt: serde_json::Value,
    /// Upper bound on generated tokens; `None` means up to the context limit.
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// Stream the answer as SSE chunks.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// One message of a chat request; `content` is a string or a list of content parts.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The message content.
    #[serde(default)]
    pub content: serde_json::Value,
}

/// Body of `POST /v1/chat/completions`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ChatCompletionRequest {
    /// Model id from `/v1/models`.
    #[serde(default)]
    pub model: String,
    /// The conversation so far.
    pub messages: Vec<ChatMessage>,
    /// Upper bound on generated tokens (legacy name).
    #[serde(default)]
    pub max_tokens: Option<u64>,
    /// Upper bound on generated tokens (current name; wins over `max_tokens`).
    #[serde(default)]
    pub max_completion_tokens: Option<u64>,
    /// Stream the answer as SSE chunks.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// One choice inside a `text_completion` chunk.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CompletionChoice {
    /// Which of the `n` choices this is.
    pub index: u32,
    /// New text of this chunk (the whole text when not streaming).
    pub text: String,
    /// `stop` or `length` on the choice's last chunk, else null.
    pub finish_reason: Option<String>,
}

/// A `text_completion` object: a streamed chunk or a whole non-streamed answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CompletionResponse {
    /// Request id, the same on every chunk.
    pub id: String,
    /// Always `text_completion`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// Model id.
    pub model: String,
    /// The choices this chunk carries; empty on a usage-only chunk.
    pub choices: Vec<CompletionChoice>,
    /// Token counts: on the usage-only chunk, or on every chunk with `continuous_usage_stats`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// The `delta` of a chat chunk.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ChatDelta {
    /// `assistant` on the first chunk of a choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// New answer text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// New reasoning text (DeepSeek/SGLang/vLLM reasoning parsers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

/// One choice inside a `chat.completion.chunk`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChatChunkChoice {
    /// Which of the `n` choices this is.
    pub index: u32,
    /// What this chunk adds.
    pub delta: ChatDelta,
    /// `stop` or `length` on the choice's last chunk, else null.
    pub finish_reason: Option<String>,
}

/// A `chat.completion.chunk` object.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChatChunk {
    /// Request id, the same on every chunk.
    pub id: String,
    /// Always `chat.completion.chunk`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    /// Model id.
    pub model: String,
    /// The choices this chunk carries; empty on a usage-only chunk.
    pub choices: Vec<ChatChunkChoice>,
    /// Token counts, as for [`CompletionResponse::usage`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// One entry of `GET /v1/models`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelCard {
    /// Model id to put in requests.
    pub id: String,
    /// Always `model`.
    #[serde(default)]
    pub object: String,
    /// Owner string.
    #[serde(default)]
    pub owned_by: String,
    /// Longest prompt + output the server accepts, in tokens (vLLM/SGLang extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<u64>,
}

/// Body of `GET /v1/models`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelList {
    /// Always `list`.
    pub object: String,
    /// The served models.
    pub data: Vec<ModelCard>,
}
