//! The OpenAI request bodies as the server reads them: `/v1/chat/completions`
//! ([`ChatBody`]) and `/v1/completions` ([`CompletionBody`]), per the OpenAI API reference.
//!
//! These carry the fields whose *shape* is the API's (messages, prompts, stream flags); the
//! sampling fields every route shares (`temperature`, `top_p`, `stop`, penalties, structured
//! output, logprobs) are checked once, for all APIs, by the server's parameter reader, which
//! names the field and its range. Deserialized leniently: unknown fields are ignored; a known
//! field of the wrong shape is a serde error naming its path. (The bench's request bodies are
//! the borrowed, serialize-only types of [`crate::openai`].)

use serde::Deserialize;
use serde_json::{Map, Value};

/// `stream_options`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct StreamOptionsIn {
    /// One final chunk with `choices: []` and the usage.
    pub include_usage: Option<bool>,
    /// vLLM: the cumulative usage on every chunk.
    pub continuous_usage_stats: Option<bool>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ChatBody {
    /// The conversation (required, non-empty).
    pub messages: Option<Vec<InMessage>>,
    /// Stream chunks.
    pub stream: Option<bool>,
    /// Streaming options (only with `stream: true`).
    pub stream_options: Option<StreamOptionsIn>,
    /// SGLang: split reasoning into `reasoning_content` (default true).
    pub separate_reasoning: Option<bool>,
    /// Extra chat-template variables (`enable_thinking`, …).
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// vLLM: continue the final assistant message instead of starting a new turn.
    pub continue_final_message: Option<bool>,
}

/// One message of `messages`.
#[derive(Debug, Clone, Deserialize)]
pub struct InMessage {
    /// `system`, `user`, `assistant`, `developer` or `tool`.
    pub role: String,
    /// A string, text parts, or null.
    #[serde(default)]
    pub content: InContent,
    /// An assistant message's calls (`[{"id", "type", "function": {"name", "arguments"}}]`),
    /// passed to the template.
    pub tool_calls: Option<Vec<Value>>,
    /// A tool message's call id.
    pub tool_call_id: Option<String>,
    /// A tool message's function name.
    pub name: Option<String>,
    /// An assistant message's reasoning (SGLang's and vLLM's field).
    pub reasoning_content: Option<String>,
    /// The same, vLLM's newer spelling.
    pub reasoning: Option<String>,
    /// Phi-4-mini: a system message's tools as a JSON string.
    pub tools: Option<String>,
}

/// A message's `content`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(try_from = "Value")]
pub enum InContent {
    /// Absent or null.
    #[default]
    Null,
    /// Plain text.
    Text(String),
    /// Content parts, as sent.
    Parts(Vec<Value>),
}

impl TryFrom<Value> for InContent {
    type Error = String;
    fn try_from(v: Value) -> Result<Self, String> {
        match v {
            Value::Null => Ok(InContent::Null),
            Value::String(s) => Ok(InContent::Text(s)),
            Value::Array(a) => Ok(InContent::Parts(a)),
            _ => Err("content must be a string or a list of parts".into()),
        }
    }
}

impl InContent {
    /// The text: a string, or the `text` of every part; `None` when a part is not text.
    pub fn text(&self) -> Option<String> {
        match self {
            InContent::Null => Some(String::new()),
            InContent::Text(s) => Some(s.clone()),
            InContent::Parts(parts) => parts
                .iter()
                .map(|p| match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => Some(t),
                    _ => None,
                })
                .collect(),
        }
    }
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CompletionBody {
    /// The prompt(s) (required).
    pub prompt: Option<PromptIn>,
    /// Stream chunks.
    pub stream: Option<bool>,
    /// Streaming options (only with `stream: true`).
    pub stream_options: Option<StreamOptionsIn>,
    /// Put the prompt before the answer.
    pub echo: Option<bool>,
}

/// `prompt`: a string, token ids, or a list of either (a batch).
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "Value")]
pub enum PromptIn {
    /// One prompt.
    One(OnePrompt),
    /// A batch, answered prompt-major.
    Batch(Vec<OnePrompt>),
}

/// One prompt of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnePrompt {
    /// Text, tokenized by the server.
    Text(String),
    /// Token ids (empty: refused by the server with its own message).
    Ids(Vec<u32>),
}

fn ids(a: &[Value]) -> Option<Vec<u32>> {
    a.iter().map(|x| x.as_u64().filter(|&t| t <= u32::MAX as u64).map(|t| t as u32)).collect()
}

impl TryFrom<Value> for PromptIn {
    type Error = String;
    fn try_from(v: Value) -> Result<Self, String> {
        let one = |v: &Value, at: &str| match v {
            Value::String(s) => Ok(OnePrompt::Text(s.clone())),
            Value::Array(a) => {
                ids(a).map(OnePrompt::Ids).ok_or_else(|| "prompt must be a list of token ids".to_owned())
            }
            _ => Err(format!("{at}a prompt must be a string or a list of token ids")),
        };
        match &v {
            Value::Array(a) if a.is_empty() => Ok(PromptIn::One(OnePrompt::Ids(Vec::new()))),
            Value::Array(a) if a.iter().all(Value::is_number) => Ok(PromptIn::One(one(&v, "")?)),
            Value::Array(a) => a
                .iter()
                .enumerate()
                .map(|(i, p)| one(p, &format!("prompt[{i}]: ")))
                .collect::<Result<_, _>>()
                .map(PromptIn::Batch),
            _ => Ok(PromptIn::One(one(&v, "")?)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompts_take_the_apis_four_forms() {
        let p = |s: &str| serde_json::from_str::<CompletionBody>(s).map(|b| b.prompt);
        assert!(matches!(p(r#"{"prompt": "hi"}"#), Ok(Some(PromptIn::One(OnePrompt::Text(_))))));
        assert!(matches!(p(r#"{"prompt": [1, 2]}"#), Ok(Some(PromptIn::One(OnePrompt::Ids(v)))) if v == [1, 2]));
        let batch = p(r#"{"prompt": ["a", [3]], "unknown": 1}"#);
        assert!(
            matches!(batch, Ok(Some(PromptIn::Batch(b))) if b == [OnePrompt::Text("a".into()), OnePrompt::Ids(vec![3])])
        );
        assert!(p(r#"{"prompt": 5}"#).is_err());
        assert!(p(r#"{"prompt": [1, -2]}"#).is_err());
        let m = serde_json::from_str::<ChatBody>(
            r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}"#,
        );
        let m = m.ok().and_then(|b| b.messages).unwrap_or_default();
        assert_eq!(m[0].content.text().as_deref(), Some("ab"));
        let img = InContent::Parts(vec![serde_json::json!({"type": "image_url"})]);
        assert_eq!(img.text(), None);
    }
}
