//! SGLang's native API: the `POST /generate` request (upstream
//! `python/sglang/srt/managers/io_struct.py`, `GenerateReqInput`) and answer
//! (`python/sglang/srt/managers/tokenizer_manager.py` builds its `meta_info`), and the bodies
//! of `/get_model_info`, `/get_server_info`, `/tokenize` and `/detokenize`
//! (`python/sglang/srt/entrypoints/http_server.py`).
//!
//! A streamed `/generate` sends SSE frames whose `text` is the whole text so far (not a
//! delta) and whose `meta_info.completion_tokens` counts every token so far; the stream ends
//! with `data: [DONE]`.
//!
//! As in [`crate::openai`], field order is key order on the wire, and the types borrow what
//! they render and only serialize.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::openai::MatchedStop;

/// `sampling_params` of a `/generate` request, with the fields a benchmark sets (SGLang's
/// `SamplingParams` names).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SamplingParams {
    /// Sampling temperature; 0 is greedy.
    pub temperature: f64,
    /// Upper bound on generated tokens.
    pub max_new_tokens: u64,
    /// Generate through EOS, up to `max_new_tokens`.
    pub ignore_eos: bool,
    /// Nucleus sampling mass; absent means 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
}

/// Body of `POST /generate`: exactly one of `text` and `input_ids`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct GenerateRequest<'a> {
    /// Sampling parameters.
    pub sampling_params: SamplingParams,
    /// Stream frames as tokens are produced.
    pub stream: bool,
    /// Prompt text, tokenized by the server.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<&'a str>,
    /// Prompt token ids.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_ids: Option<&'a [u32]>,
}

/// How a `/generate` choice ended (`meta_info.finish_reason`), tagged by `type` first:
/// `{"type": "stop", "matched": ...}`, `{"type": "length", "length": n}` or
/// `{"type": "abort", "message": ...}`.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum MetaFinishReason<'a> {
    /// A stop token or stop string ended it.
    Stop {
        /// The stop token id or string; `null` if unknown.
        matched: Option<&'a MatchedStop>,
    },
    /// It reached its token limit.
    Length {
        /// Tokens generated.
        length: usize,
    },
    /// The request was aborted or failed.
    Abort {
        /// The engine's error message, `null` for a plain abort.
        message: Option<&'a str>,
    },
}

/// `meta_info` of a `/generate` answer or stream frame.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct MetaInfo<'a> {
    /// Request id; with `n > 1`, the request id and `-<choice index>`.
    pub id: &'a str,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Tokens generated so far (cumulative).
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache (0 until the choice's last frame).
    pub cached_tokens: usize,
    /// With the hierarchical cache, on the choice's last frame: the cached tokens by tier.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cached_tokens_details: Option<crate::CachedTokensDetails>,
    /// `null` until the choice's last frame.
    pub finish_reason: Option<MetaFinishReason<'a>>,
    /// With `return_logprob`: one `[logprob, token_id, text]` per prompt position from
    /// `logprob_start_len` (default −1: the last prompt token), the first with `logprob`
    /// `null` as SGLang pads it; `text` is `null` unless `return_text_in_logprobs`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_token_logprobs: Option<&'a [LogprobTuple]>,
    /// With `return_logprob`: one `[logprob, token_id, text]` per generated token so far.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_token_logprobs: Option<&'a [LogprobTuple]>,
    /// With `top_logprobs_num > 0`: per prompt position the top tokens, best first (`null` for
    /// the first).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_top_logprobs: Option<&'a [Option<Vec<LogprobTuple>>]>,
    /// With `top_logprobs_num > 0`: per generated token the top tokens, best first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_top_logprobs: Option<&'a [Option<Vec<LogprobTuple>>]>,
    /// With `token_ids_logprob`: per prompt position the named tokens, in the order given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_token_ids_logprobs: Option<&'a [Option<Vec<LogprobTuple>>]>,
    /// With `token_ids_logprob`: per generated token the named tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_token_ids_logprobs: Option<&'a [Option<Vec<LogprobTuple>>]>,
    /// Speculative decoding counters, on a choice's last frame when the server speculates.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub spec: Option<SpecMeta>,
}

/// SGLang's speculative-decoding fields of `meta_info` (`tokenizer_manager.py`,
/// `_calculate_spec_decoding_metrics`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SpecMeta {
    /// Verify steps (decode forwards) of the request.
    pub spec_verify_ct: u64,
    /// `completion_tokens / spec_verify_ct`, as SGLang defines it (the first token, sampled
    /// after the prefill, counts as output but is no verify step).
    pub spec_accept_length: f64,
    /// `spec_accept_token_num / spec_draft_token_num` (0 with no proposals).
    pub spec_accept_rate: f64,
    /// Proposed tokens accepted.
    pub spec_accept_token_num: u64,
    /// Tokens proposed (the draft length adapts, so not `verify_ct × (num_draft_tokens − 1)`
    /// as SGLang's fixed-length count).
    pub spec_draft_token_num: u64,
}

impl SpecMeta {
    /// The fields for `completion_tokens` tokens from these counters; `None` without a verify
    /// step.
    pub fn new(completion_tokens: usize, verify_ct: u64, draft: u64, accepted: u64) -> Option<SpecMeta> {
        (verify_ct > 0).then(|| SpecMeta {
            spec_verify_ct: verify_ct,
            spec_accept_length: completion_tokens as f64 / verify_ct as f64,
            spec_accept_rate: if draft > 0 { accepted as f64 / draft as f64 } else { 0.0 },
            spec_accept_token_num: accepted,
            spec_draft_token_num: draft,
        })
    }
}

/// SGLang's logprob entry, `[logprob, token_id, text]` on the wire
/// (`tokenizer_manager.py`, `detokenize_logprob_tokens`).
pub type LogprobTuple = (Option<f32>, u32, Option<String>);

/// The `meta_info` logprob lists of one `/generate` choice, owned; [`MetaInfo`] borrows them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NativeLogprobs {
    /// `input_token_logprobs`.
    pub input_token_logprobs: Vec<LogprobTuple>,
    /// `output_token_logprobs`.
    pub output_token_logprobs: Vec<LogprobTuple>,
    /// `input_top_logprobs`.
    pub input_top_logprobs: Vec<Option<Vec<LogprobTuple>>>,
    /// `output_top_logprobs`.
    pub output_top_logprobs: Vec<Option<Vec<LogprobTuple>>>,
    /// `input_token_ids_logprobs`.
    pub input_token_ids_logprobs: Vec<Option<Vec<LogprobTuple>>>,
    /// `output_token_ids_logprobs`.
    pub output_token_ids_logprobs: Vec<Option<Vec<LogprobTuple>>>,
}

/// A `/generate` answer or one stream frame: `{"text", "meta_info", "index"}`. A whole answer
/// of `n > 1` choices is a JSON list of these.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct GenerateResponse<'a> {
    /// The whole generated text so far.
    pub text: &'a str,
    /// Token accounting and finish state.
    pub meta_info: MetaInfo<'a>,
    /// Which choice this is (streams of several choices interleave their frames).
    pub index: usize,
}

/// Body of `GET /get_model_info` (and `/model_info`): SGLang's fields, then the model's own facts.
#[derive(Debug, Clone, Serialize)]
pub struct ModelInfoResponse<'a> {
    /// The model file or directory the server loaded.
    pub model_path: &'a Path,
    /// Where the tokenizer came from.
    pub tokenizer_path: &'a Path,
    /// False when the server serves embeddings (an encoder, or `--is-embedding`).
    pub is_generation: bool,
    /// Architecture name from the checkpoint (e.g. `llama`).
    pub architecture: &'a str,
    /// Human name of the model.
    pub name: &'a str,
    /// Vocabulary size (logit width).
    pub vocab_size: usize,
    /// Longest prompt + output accepted, in tokens.
    pub context_length: usize,
    /// Hugging Face `model_type` (`llama`, `gemma3`, `glm_moe_dsa`); sglang-router labels its
    /// workers with it.
    pub model_type: &'a str,
    /// Hugging Face `architectures` (e.g. `["LlamaForCausalLM"]`); read by sglang-router.
    pub architectures: [&'a str; 1],
    /// SGLang's `--preferred-sampling-params`, as given (`null` without the flag).
    pub preferred_sampling_params: Option<serde_json::Value>,
    /// SGLang's weight version tag (`default` until weights are updated in place).
    pub weight_version: &'a str,
}

/// One entry of `GET /get_load` (SGLang's `GetLoadReqOutput`, one per data-parallel rank):
/// sglang-router's `power_of_two` policy sums `num_tokens` over the list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LoadReport {
    /// Data-parallel rank (always 0: one engine per server).
    pub dp_rank: usize,
    /// Requests running or waiting.
    pub num_reqs: usize,
    /// Of those, waiting for admission.
    pub num_waiting_reqs: usize,
    /// KV tokens held by requests (pages in use and not evictable, times the page size), as
    /// SGLang's scheduler counts them.
    pub num_tokens: usize,
}

/// Body of `GET /get_server_info`: the server's arguments and derived figures, as the server
/// chose them, then `internal_states`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ServerInfo<'a, S> {
    /// Flags and derived numbers (SGLang's `server_args` fields where they exist).
    #[serde(flatten)]
    pub args: &'a Map<String, Value>,
    /// Scheduler counters, one entry per data-parallel rank (SGLang's shape; we have one).
    pub internal_states: &'a [S],
}

/// Body of `POST /tokenize`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TokenizeResponse<'a> {
    /// Token ids of the text.
    pub tokens: &'a [u32],
    /// `tokens.len()`.
    pub count: usize,
    /// Longest prompt + output accepted, in tokens.
    pub max_model_len: usize,
}

/// Body of `POST /detokenize`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct DetokenizeResponse<'a> {
    /// The decoded text (invalid UTF-8 replaced by U+FFFD).
    pub text: &'a str,
}

/// `POST /generate` as the server reads it (SGLang's `GenerateReqInput`, one prompt): the
/// fields whose shape is SGLang's; `sampling_params` and the logprob fields are checked by the
/// server's parameter reader with the other APIs' fields.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct GenerateBody {
    /// The prompt as text (a batch of texts is refused).
    pub text: Option<GenerateText>,
    /// The prompt as token ids.
    pub input_ids: Option<Vec<u32>>,
    /// SGLang's `SamplingParams` fields.
    pub sampling_params: Option<Map<String, Value>>,
    /// Stream frames.
    pub stream: Option<bool>,
}

/// `text`: one string.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "Value")]
pub struct GenerateText(pub String);

impl TryFrom<Value> for GenerateText {
    type Error = &'static str;
    fn try_from(v: Value) -> Result<Self, Self::Error> {
        match v {
            Value::String(s) => Ok(GenerateText(s)),
            _ => Err("text must be a string (batched prompts are not supported)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finish_reason_is_tagged_by_type_first() {
        let m = MatchedStop::Token(7);
        let r = |f: MetaFinishReason<'_>| serde_json::to_string(&f).expect("serializes");
        assert_eq!(r(MetaFinishReason::Stop { matched: Some(&m) }), r#"{"type":"stop","matched":7}"#);
        assert_eq!(r(MetaFinishReason::Length { length: 3 }), r#"{"type":"length","length":3}"#);
        assert_eq!(r(MetaFinishReason::Abort { message: None }), r#"{"type":"abort","message":null}"#);
    }

    #[test]
    fn server_info_puts_internal_states_after_the_args() {
        let mut args = Map::new();
        args.insert("page_size".into(), 16.into());
        let info = ServerInfo { args: &args, internal_states: &[1] };
        assert_eq!(serde_json::to_string(&info).expect("serializes"), r#"{"page_size":16,"internal_states":[1]}"#);
    }
}
