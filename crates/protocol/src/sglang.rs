//! SGLang's native `POST /generate` (upstream `python/sglang/srt/managers/io_struct.py`,
//! `GenerateReqInput`, and `tokenizer_manager.py` for the streamed `meta_info`).
//!
//! A streamed `/generate` sends SSE frames whose `text` is the whole text so far (not a
//! delta) and whose `meta_info.completion_tokens` counts every token so far; the stream ends
//! with `data: [DONE]`.

use serde::{Deserialize, Serialize};

/// Body of `POST /generate`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GenerateRequest {
    /// Prompt text (one of `text` and `input_ids` is required).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Prompt token ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_ids: Option<Vec<u32>>,
    /// Sampling parameters (`max_new_tokens`, `temperature`, `ignore_eos`, ...).
    #[serde(default)]
    pub sampling_params: serde_json::Map<String, serde_json::Value>,
    /// Stream frames as tokens are produced.
    #[serde(default)]
    pub stream: bool,
    /// Every other field, as sent.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// `meta_info` of a `/generate` answer or stream frame.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MetaInfo {
    /// Request id.
    #[serde(default)]
    pub id: String,
    /// Prompt length in tokens.
    #[serde(default)]
    pub prompt_tokens: u64,
    /// Tokens generated so far (cumulative).
    #[serde(default)]
    pub completion_tokens: u64,
    /// Prompt tokens served from the prefix cache.
    #[serde(default)]
    pub cached_tokens: u64,
    /// Null until the last frame, then e.g. `{"type": "length", "length": 128}` or
    /// `{"type": "stop", "matched": 2}`.
    #[serde(default)]
    pub finish_reason: Option<serde_json::Value>,
}

/// A `/generate` answer or one stream frame.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GenerateResponse {
    /// The whole generated text so far.
    pub text: String,
    /// Token accounting and finish state.
    pub meta_info: MetaInfo,
    /// Which of the batch's prompts this answers (streams of several prompts interleave).
    #[serde(default)]
    pub index: u32,
}
