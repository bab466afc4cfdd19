//! OpenAI-compatible response bodies and stream chunks (OpenAI API reference: "The completion
//! object", "The chat completion object", "The chat completion chunk object", "List models"),
//! with the fields SGLang adds (`matched_stop`, `max_model_len`; upstream
//! `python/sglang/srt/entrypoints/openai/protocol.py`), and the request bodies a benchmark
//! client sends.
//!
//! Field order is key order on the wire. These types only serialize and borrow what they
//! render, so a stream chunk costs one pass of the serializer and no intermediate JSON value:
//! a server keeps its text and ids and points at them. Requests are parsed field by field by
//! the server (to name the bad field in its errors), and clients read other servers' frames,
//! whose shapes vary, with their own lenient readers.

use serde::Serialize;

use crate::Usage;

/// `object` of a non-streamed `/v1/completions` answer and of each of its stream chunks.
pub const TEXT_COMPLETION: &str = "text_completion";
/// `object` of a non-streamed `/v1/chat/completions` answer.
pub const CHAT_COMPLETION: &str = "chat.completion";
/// `object` of each chunk of a streamed `/v1/chat/completions` answer.
pub const CHAT_COMPLETION_CHUNK: &str = "chat.completion.chunk";

/// A completion object of either API, whole or one stream chunk:
/// `{"id", "object", "created", "model", "choices", "usage"?}`.
///
/// `C` is the choice type: [`TextChoice`] (`text_completion`), [`ChatChoice`]
/// (`chat.completion`) or [`ChatChunkChoice`] (`chat.completion.chunk`).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Completion<'a, C> {
    /// Request id, the same on every chunk of a stream.
    pub id: &'a str,
    /// [`TEXT_COMPLETION`], [`CHAT_COMPLETION`] or [`CHAT_COMPLETION_CHUNK`].
    pub object: &'a str,
    /// Unix seconds at which the request was accepted.
    pub created: u64,
    /// Model id, as `/v1/models` lists it.
    pub model: &'a str,
    /// The choices this object carries: all `n` in a whole answer, one in a content or
    /// finish chunk, none in the usage-only chunk.
    pub choices: &'a [C],
    /// Token counts: always in a whole answer; in a stream on the usage-only chunk
    /// (`stream_options.include_usage`) and, cumulative, on every chunk with vLLM's
    /// `stream_options.continuous_usage_stats`; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// The stop that ended a choice (SGLang's `matched_stop`): a stop token id (EOS or one of
/// `stop_token_ids`) or the stop string that matched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum MatchedStop {
    /// A token id; renders as a number.
    Token(u32),
    /// A stop string; renders as a string.
    Text(String),
}

/// One choice of a `text_completion` object.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TextChoice<'a> {
    /// Which of the `n` choices this is, from 0.
    pub index: usize,
    /// New text of this chunk (empty on a finish chunk), or the whole text of a whole answer
    /// (with the prompt in front under `echo`).
    pub text: &'a str,
    /// The legacy logprobs of this chunk's tokens (of all tokens in a whole answer, the
    /// prompt's first under `echo`), when the request set `logprobs`; else `null`.
    pub logprobs: Option<&'a CompletionLogprobs>,
    /// `stop`, `length` or `abort` on the choice's last chunk and in a whole answer; `null`
    /// on content chunks.
    pub finish_reason: Option<&'a str>,
    /// Absent on content chunks (`None`); on the finish chunk and in a whole answer the
    /// [`MatchedStop`], or `null` (`Some(None)`) when no stop matched.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matched_stop: Option<Option<&'a MatchedStop>>,
    /// vLLM's `prompt_logprobs` (when the request set it): one entry per prompt token, `null`
    /// for the first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_logprobs: Option<&'a [Option<PromptLogprob>]>,
}

/// Entries serialized as a JSON object in their order (the first of equal keys wins, as the
/// builder [`KeyedLogprobs::insert`] keeps them).
#[derive(Debug, Clone, PartialEq)]
pub struct KeyedLogprobs<V>(pub Vec<(String, V)>);

impl<V> Default for KeyedLogprobs<V> {
    fn default() -> Self {
        KeyedLogprobs(Vec::new())
    }
}

impl<V> KeyedLogprobs<V> {
    /// Adds `(key, value)` unless `key` is present.
    pub fn insert(&mut self, key: String, value: V) {
        if !self.0.iter().any(|(k, _)| *k == key) {
            self.0.push((key, value));
        }
    }
}

impl<V: Serialize> Serialize for KeyedLogprobs<V> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

/// OpenAI's legacy completions `logprobs` object: per token its text, its logprob (`null` for
/// the first prompt token under `echo`), a dict of the top tokens (the `logprobs` most likely
/// plus the token itself, so up to `logprobs + 1` entries; `null` for the first prompt token)
/// and its character offset.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CompletionLogprobs {
    /// Token texts.
    pub tokens: Vec<String>,
    /// Natural-log probabilities.
    pub token_logprobs: Vec<Option<f32>>,
    /// Token text → logprob.
    pub top_logprobs: Vec<Option<KeyedLogprobs<f32>>>,
    /// Offset of each token, in characters of the concatenated token texts (as vLLM counts
    /// Python's `len`).
    pub text_offset: Vec<usize>,
}

/// One of vLLM's `prompt_logprobs` values: `{"logprob", "rank", "decoded_token"}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VllmLogprob {
    /// Natural-log probability.
    pub logprob: f32,
    /// 1 for the most likely token; for the prompt token, its rank in the distribution.
    pub rank: u32,
    /// The token's text.
    pub decoded_token: String,
}

/// One prompt position of vLLM's `prompt_logprobs`: token id (as a string key) → value, the
/// prompt token first, then the top alternatives.
pub type PromptLogprob = KeyedLogprobs<VllmLogprob>;

/// One alternative of a chat logprob: `{"token", "logprob", "bytes"}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatTopLogprob {
    /// Token text.
    pub token: String,
    /// Natural-log probability.
    pub logprob: f32,
    /// The token's UTF-8 bytes (a token may hold part of a character).
    pub bytes: Vec<u8>,
}

/// One token of a chat choice's `logprobs.content`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChatTokenLogprob {
    /// Token text.
    pub token: String,
    /// Natural-log probability.
    pub logprob: f32,
    /// The token's UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// The `top_logprobs` most likely tokens, best first (empty when not asked for).
    pub top_logprobs: Vec<ChatTopLogprob>,
}

/// A chat choice's `logprobs`: `{"content": [...], "refusal": null}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ChatLogprobs {
    /// One entry per generated token of this chunk or answer.
    pub content: Vec<ChatTokenLogprob>,
    /// Always `null` (no refusals).
    pub refusal: Option<String>,
}

/// The `message` of a [`ChatChoice`].
#[derive(Debug, Clone, Copy, Serialize)]
pub struct AssistantMessage<'a> {
    /// Always `assistant`.
    pub role: &'a str,
    /// The whole answer text; `null` when the answer is only tool calls (as OpenAI sends it).
    pub content: Option<&'a str>,
    /// The reasoning (`<think>` text) when the server runs a reasoning parser (SGLang's and
    /// vLLM's field), `null` when there was none; absent without a parser.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<Option<&'a str>>,
    /// The calls, when the model made any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<&'a [ToolCall]>,
}

/// One tool call of an assistant message, as OpenAI's chat API documents it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolCall {
    /// `call_…`, unique per call.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// What is called.
    pub function: FunctionCall,
}

/// The `function` of a [`ToolCall`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FunctionCall {
    /// The function's name.
    pub name: String,
    /// Its arguments as a JSON string (the model's text).
    pub arguments: String,
}

/// One entry of a streamed `delta.tool_calls`: the first for a call has its `index`, `id`,
/// `type` and `function.name` with empty `arguments`; later ones add `function.arguments` text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolCallDelta<'a> {
    /// Which of the choice's calls, from 0.
    pub index: usize,
    /// On the call's first entry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<&'a str>,
    /// `function`, on the call's first entry.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// The name (first entry) and arguments text.
    pub function: FunctionDelta<'a>,
}

/// The `function` of a [`ToolCallDelta`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FunctionDelta<'a> {
    /// On the call's first entry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<&'a str>,
    /// The next characters of the arguments JSON.
    pub arguments: &'a str,
}

/// One choice of a `chat.completion` object.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ChatChoice<'a> {
    /// Which of the `n` choices this is, from 0.
    pub index: usize,
    /// The answer.
    pub message: AssistantMessage<'a>,
    /// The answer's logprobs when the request set `logprobs: true`, else `null`.
    pub logprobs: Option<&'a ChatLogprobs>,
    /// `stop`, `length`, `tool_calls` or `abort`.
    pub finish_reason: &'a str,
    /// The [`MatchedStop`], or `null` when no stop matched.
    pub matched_stop: Option<&'a MatchedStop>,
}

/// The `delta` of a [`ChatChunkChoice`]: `{"role": "assistant", "content": ""}` on a choice's
/// first chunk, `{"content": ...}` on content chunks, `{}` on its finish chunk.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ChatDelta<'a> {
    /// `assistant` on the choice's first chunk, absent after.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'a str>,
    /// New answer text; absent on the finish chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<&'a str>,
    /// New reasoning text (a reasoning parser runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<&'a str>,
    /// Tool-call pieces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<&'a [ToolCallDelta<'a>]>,
}

/// One choice of a `chat.completion.chunk` object.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ChatChunkChoice<'a> {
    /// Which of the `n` choices this is, from 0.
    pub index: usize,
    /// What this chunk adds.
    pub delta: ChatDelta<'a>,
    /// This chunk's tokens' logprobs when the request set `logprobs: true`, else `null`.
    pub logprobs: Option<&'a ChatLogprobs>,
    /// `stop`, `length` or `abort` on the choice's finish chunk, else `null`.
    pub finish_reason: Option<&'a str>,
    /// As [`TextChoice::matched_stop`]: absent except on the finish chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub matched_stop: Option<Option<&'a MatchedStop>>,
}

/// One entry of `GET /v1/models`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ModelCard<'a> {
    /// Model id to put in requests.
    pub id: &'a str,
    /// Always `model`.
    pub object: &'a str,
    /// Unix seconds (the time of the listing: the model has no creation date of its own).
    pub created: u64,
    /// Owner string.
    pub owned_by: &'a str,
    /// The model this one derives from (vLLM/SGLang extension); the id itself for a base model.
    pub root: &'a str,
    /// Longest prompt + output the server accepts, in tokens (vLLM/SGLang extension).
    pub max_model_len: usize,
}

/// Body of `GET /v1/models`: `{"object": "list", "data": [...]}`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ModelList<'a> {
    /// Always `list`.
    pub object: &'a str,
    /// The served models.
    pub data: &'a [ModelCard<'a>],
}

/// `stream_options` of a streaming request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StreamOptions {
    /// Ask for one final chunk with `choices: []` and the request's `usage`.
    pub include_usage: bool,
    /// vLLM extension: a cumulative `usage` on every chunk, which tells how many tokens each
    /// chunk carries.
    pub continuous_usage_stats: bool,
}

/// The prompt of a `/v1/completions` request: a string or a list of token ids.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(untagged)]
pub enum Prompt<'a> {
    /// Text, tokenized by the server.
    Text(&'a str),
    /// Token ids, sent as they are.
    Ids(&'a [u32]),
}

/// Body of `POST /v1/completions` with the fields a benchmark sets (others are merged in by
/// the caller).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CompletionRequest<'a> {
    /// Model id from `/v1/models`.
    pub model: &'a str,
    /// Sampling temperature; 0 is greedy.
    pub temperature: f64,
    /// Upper bound on generated tokens.
    pub max_tokens: u64,
    /// Stream the answer as SSE chunks.
    pub stream: bool,
    /// SGLang/vLLM extension: generate through EOS, up to `max_tokens`.
    pub ignore_eos: bool,
    /// Nucleus sampling mass; absent means 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// The prompt.
    pub prompt: Prompt<'a>,
    /// Streaming options; absent on a non-streamed request (servers refuse them there).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
}

/// One chat message with text content: `{"role", "content"}`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ChatMessage<'a> {
    /// `system`, `user`, `assistant`, ...
    pub role: &'a str,
    /// The message text.
    pub content: &'a str,
}

/// Body of `POST /v1/chat/completions` with the fields a benchmark sets; `M` is the message
/// type ([`ChatMessage`], or a JSON value for messages passed through as a dataset has them).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ChatCompletionRequest<'a, M> {
    /// Model id from `/v1/models`.
    pub model: &'a str,
    /// Sampling temperature; 0 is greedy.
    pub temperature: f64,
    /// Upper bound on generated tokens.
    pub max_tokens: u64,
    /// Stream the answer as SSE chunks.
    pub stream: bool,
    /// SGLang/vLLM extension: generate through EOS, up to `max_tokens`.
    pub ignore_eos: bool,
    /// Nucleus sampling mass; absent means 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// The conversation so far.
    pub messages: &'a [M],
    /// Streaming options; absent on a non-streamed request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(c: ChatChunkChoice<'_>) -> String {
        let o =
            Completion { id: "x", object: CHAT_COMPLETION_CHUNK, created: 1, model: "m", choices: &[c], usage: None };
        serde_json::to_string(&o).expect("serializes")
    }

    #[test]
    fn matched_stop_is_absent_null_or_a_value() {
        let c = ChatChunkChoice {
            index: 0,
            delta: ChatDelta { content: Some("a"), ..Default::default() },
            logprobs: None,
            finish_reason: None,
            matched_stop: None,
        };
        assert_eq!(
            chunk(c),
            r#"{"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null}]}"#
        );
        let end = ChatChunkChoice {
            delta: ChatDelta::default(),
            finish_reason: Some("length"),
            matched_stop: Some(None),
            ..c
        };
        assert!(chunk(end).contains(r#""delta":{},"logprobs":null,"finish_reason":"length","matched_stop":null}"#));
        let t = MatchedStop::Token(2);
        let s = MatchedStop::Text("\n".into());
        assert!(chunk(ChatChunkChoice { matched_stop: Some(Some(&t)), ..end }).contains(r#""matched_stop":2}"#));
        assert!(chunk(ChatChunkChoice { matched_stop: Some(Some(&s)), ..end }).contains(r#""matched_stop":"\n"}"#));
    }

    #[test]
    fn usage_details_only_with_cache_hits() {
        let o = |u| {
            let e: &[TextChoice<'_>] = &[];
            serde_json::to_string(&Completion {
                id: "x",
                object: TEXT_COMPLETION,
                created: 0,
                model: "m",
                choices: e,
                usage: Some(u),
            })
            .expect("serializes")
        };
        assert!(o(Usage::new(5, 2, 0))
            .ends_with(r#""choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}"#));
        assert!(o(Usage::new(5, 2, 4)).ends_with(r#""total_tokens":7,"prompt_tokens_details":{"cached_tokens":4}}}"#));
    }

    /// OpenAI's documented shapes: a `chat.completion` message with a call (function-calling
    /// guide, "content": null beside `tool_calls`) and the two kinds of streamed
    /// `delta.tool_calls` entries (the call's first, then its arguments).
    #[test]
    fn tool_call_shapes_match_openais_examples() {
        let calls = [ToolCall {
            id: "call_12345xyz".into(),
            kind: "function",
            function: FunctionCall { name: "get_weather".into(), arguments: "{\"location\":\"Paris, France\"}".into() },
        }];
        let m =
            AssistantMessage { role: "assistant", content: None, reasoning_content: None, tool_calls: Some(&calls) };
        let want: serde_json::Value = serde_json::from_str(
            r#"{"role": "assistant", "content": null, "tool_calls": [{"id": "call_12345xyz", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"location\":\"Paris, France\"}"}}]}"#,
        )
        .expect("example");
        assert_eq!(serde_json::to_value(m).expect("serializes"), want);
        let first = [ToolCallDelta {
            index: 0,
            id: Some("call_DdmO9pD3xa9XTPNJ32zg2hcA"),
            kind: Some("function"),
            function: FunctionDelta { name: Some("get_weather"), arguments: "" },
        }];
        let more = [ToolCallDelta {
            index: 0,
            id: None,
            kind: None,
            function: FunctionDelta { name: None, arguments: "{\"" },
        }];
        let d =
            |c| serde_json::to_string(&ChatDelta { tool_calls: Some(c), ..Default::default() }).expect("serializes");
        assert_eq!(
            d(&first),
            r#"{"tool_calls":[{"index":0,"id":"call_DdmO9pD3xa9XTPNJ32zg2hcA","type":"function","function":{"name":"get_weather","arguments":""}}]}"#
        );
        assert_eq!(d(&more), r#"{"tool_calls":[{"index":0,"function":{"arguments":"{\""}}]}"#);
        let r =
            AssistantMessage { role: "assistant", content: Some("4"), reasoning_content: Some(None), tool_calls: None };
        assert_eq!(
            serde_json::to_string(&r).expect("serializes"),
            r#"{"role":"assistant","content":"4","reasoning_content":null}"#
        );
    }
}
