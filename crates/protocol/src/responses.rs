//! OpenAI's Responses API request (`POST /v1/responses`), as the OpenAI API reference
//! ("Create a model response") and the `openai` Python SDK's `ResponseCreateParams` define it.
//!
//! Deserialized leniently: fields the server does not read are ignored (as the rest of the
//! server does); a field of the wrong shape is a serde error that names its path (the server
//! reads bodies through `serde_path_to_error`). Unsupported kinds (an image part, a built-in tool)
//! deserialize into their own variant so the server can refuse them by name.

use serde::Deserialize;
use serde_json::{Map, Value};

/// The request body.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ResponsesRequest {
    /// The model id (any value is accepted; the server serves one model).
    pub model: Option<String>,
    /// The input: a user message as a string, or a list of items.
    pub input: Option<Input>,
    /// A system (developer) message put first; not carried to a later `previous_response_id`.
    pub instructions: Option<String>,
    /// Function tools (`{"type": "function", "name", "description", "parameters", "strict"}`).
    pub tools: Option<Vec<Tool>>,
    /// `"none"`, `"auto"`, `"required"` or `{"type": "function", "name"}`.
    pub tool_choice: Option<Value>,
    /// Whether the model may make several calls in one turn (default true).
    pub parallel_tool_calls: Option<bool>,
    /// `text.format`: structured output.
    pub text: Option<TextConfig>,
    /// `reasoning.effort`.
    pub reasoning: Option<ReasoningConfig>,
    /// Most output tokens, reasoning included.
    pub max_output_tokens: Option<u32>,
    /// Stream typed events.
    pub stream: Option<bool>,
    /// Keep the response for `GET`, `DELETE` and `previous_response_id` (default true).
    pub store: Option<bool>,
    /// Continue from a stored response: its input and output come before this input.
    pub previous_response_id: Option<String>,
    /// Up to 16 string pairs, echoed back.
    pub metadata: Option<Map<String, Value>>,
    /// End-user id, echoed back.
    pub user: Option<String>,
    /// Alternatives per output token (0–20), with `include: ["message.output_text.logprobs"]`.
    pub top_logprobs: Option<u32>,
    /// Extra output: `message.output_text.logprobs` puts token logprobs on `output_text`.
    pub include: Option<Vec<String>>,
    /// A stored conversation (refused: `previous_response_id` is the supported chaining).
    pub conversation: Option<Value>,
    /// Run in the background (refused).
    pub background: Option<bool>,
    /// A stored prompt template (refused).
    pub prompt: Option<Value>,
    /// `disabled` (the default) or `auto` (refused: inputs are never cut).
    pub truncation: Option<String>,
    /// Sampling temperature (0 is greedy).
    pub temperature: Option<f64>,
    /// Nucleus sampling.
    pub top_p: Option<f64>,
    /// Top-k sampling (vLLM's and SGLang's extension, as on chat).
    pub top_k: Option<i64>,
    /// Min-p sampling (extension, as on chat).
    pub min_p: Option<f64>,
    /// Sampling seed (extension, as on chat).
    pub seed: Option<i64>,
    /// Stop strings (extension, as on chat).
    pub stop: Option<Stop>,
    /// OpenAI's presence penalty (extension, as on chat).
    pub presence_penalty: Option<f64>,
    /// OpenAI's frequency penalty (extension, as on chat).
    pub frequency_penalty: Option<f64>,
    /// vLLM's and SGLang's repetition penalty (extension, as on chat).
    pub repetition_penalty: Option<f64>,
}

/// `stop`: one string or a list of strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "Value")]
pub struct Stop(pub Vec<String>);

impl TryFrom<Value> for Stop {
    type Error = String;
    fn try_from(v: Value) -> Result<Self, String> {
        let bad = || "must be a string or a list of strings".to_owned();
        match v {
            Value::String(s) => Ok(Stop(vec![s])),
            Value::Array(a) => {
                a.into_iter().map(|x| x.as_str().map(str::to_owned).ok_or_else(bad)).collect::<Result<_, _>>().map(Stop)
            }
            _ => Err(bad()),
        }
    }
}

/// `input`.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "Value")]
pub enum Input {
    /// One user message.
    Text(String),
    /// Conversation items.
    Items(Vec<Item>),
}

impl TryFrom<Value> for Input {
    type Error = String;
    fn try_from(v: Value) -> Result<Self, String> {
        match v {
            Value::String(s) => Ok(Input::Text(s)),
            Value::Array(a) => a
                .into_iter()
                .enumerate()
                .map(|(i, x)| Item::try_from(x).map_err(|e| format!("item {i}: {e}")))
                .collect::<Result<_, _>>()
                .map(Input::Items),
            _ => Err("input must be a string or a list of items".into()),
        }
    }
}

/// One input item. A `{"role", "content"}` object without a `type` is a message, as the API
/// takes it ("easy input message").
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "Value")]
pub enum Item {
    /// A message of `user`, `system`, `developer` or `assistant`.
    Message(MessageItem),
    /// A call the model made in an earlier turn.
    FunctionCall(FunctionCallItem),
    /// The result of a call, sent back by the client.
    FunctionCallOutput(FunctionCallOutputItem),
    /// An earlier turn's reasoning.
    Reasoning(ReasoningItem),
}

impl TryFrom<Value> for Item {
    type Error = String;
    fn try_from(mut v: Value) -> Result<Self, String> {
        let kind = match v.get("type") {
            None if v.get("role").is_some() => "message".to_owned(),
            Some(Value::String(t)) => t.clone(),
            _ => return Err("an input item needs a `type` (or a `role` for a message)".into()),
        };
        if let Value::Object(o) = &mut v {
            o.remove("type");
        }
        let r = match kind.as_str() {
            "message" => serde_json::from_value(v).map(Item::Message),
            "function_call" => serde_json::from_value(v).map(Item::FunctionCall),
            "function_call_output" => serde_json::from_value(v).map(Item::FunctionCallOutput),
            "reasoning" => serde_json::from_value(v).map(Item::Reasoning),
            other => {
                return Err(format!(
                    "input items of type {other:?} are not supported by this server \
                     (message, function_call, function_call_output, reasoning are)"
                ))
            }
        };
        r.map_err(|e| format!("{kind} item: {e}"))
    }
}

/// A message item.
#[derive(Debug, Clone, Deserialize)]
pub struct MessageItem {
    /// `user`, `system`, `developer` or `assistant`.
    pub role: String,
    /// A string or content parts.
    pub content: Content,
}

/// A message's `content`.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "Value")]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Parts.
    Parts(Vec<Part>),
}

impl TryFrom<Value> for Content {
    type Error = String;
    fn try_from(v: Value) -> Result<Self, String> {
        match v {
            Value::String(s) => Ok(Content::Text(s)),
            Value::Array(_) => serde_json::from_value(v).map(Content::Parts).map_err(|e| format!("content parts: {e}")),
            _ => Err("content must be a string or a list of parts".into()),
        }
    }
}

impl Content {
    /// The text: a string, or the parts' text ([`parts_text`]).
    pub fn text(&self) -> Result<String, String> {
        match self {
            Content::Text(t) => Ok(t.clone()),
            Content::Parts(parts) => parts_text(parts),
        }
    }
}

/// The text parts joined by newlines (as vLLM joins text parts); `Err` names the first part of
/// another kind.
pub fn parts_text(parts: &[Part]) -> Result<String, String> {
    let mut out = String::new();
    for p in parts {
        if !out.is_empty() {
            out.push('\n');
        }
        match p {
            Part::InputText { text } | Part::OutputText { text } | Part::ReasoningText { text } => out.push_str(text),
            Part::Refusal { refusal } => out.push_str(refusal),
            Part::InputImage | Part::InputFile | Part::InputAudio => {
                return Err("image, file and audio input parts are not supported by this server".into())
            }
        }
    }
    Ok(out)
}

/// A content part.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    /// `input_text`.
    InputText {
        /// The text.
        text: String,
    },
    /// `output_text` (an earlier assistant answer).
    OutputText {
        /// The text.
        text: String,
    },
    /// `reasoning_text`.
    ReasoningText {
        /// The text.
        text: String,
    },
    /// `refusal`.
    Refusal {
        /// The text.
        refusal: String,
    },
    /// `input_image` (refused).
    InputImage,
    /// `input_file` (refused).
    InputFile,
    /// `input_audio` (refused).
    InputAudio,
}

/// A `function_call` item.
#[derive(Debug, Clone, Deserialize)]
pub struct FunctionCallItem {
    /// The id the model gave the call; its output refers to it.
    pub call_id: String,
    /// The function.
    pub name: String,
    /// The arguments, a JSON string.
    pub arguments: String,
    /// The item id (`fc_…`).
    pub id: Option<String>,
    /// The `namespace` tool the function belongs to (Codex's MCP and multi-agent tools), absent
    /// for a top-level function tool.
    pub namespace: Option<String>,
}

/// A `function_call_output` item.
#[derive(Debug, Clone, Deserialize)]
pub struct FunctionCallOutputItem {
    /// The call answered. Codex also sends outputs of no call (its goal tools' context, named
    /// by `name` and `namespace` instead).
    pub call_id: Option<String>,
    /// The function, on an output of no call.
    pub name: Option<String>,
    /// Its namespace.
    pub namespace: Option<String>,
    /// The result: a string or text parts.
    pub output: Content,
}

/// A `reasoning` item.
#[derive(Debug, Clone, Deserialize)]
pub struct ReasoningItem {
    /// `reasoning_text` parts.
    #[serde(default)]
    pub content: Option<Vec<Part>>,
    /// `summary_text` parts (used when there is no `content`).
    #[serde(default)]
    pub summary: Vec<SummaryPart>,
}

/// A reasoning summary part.
#[derive(Debug, Clone, Deserialize)]
pub struct SummaryPart {
    /// The text.
    pub text: String,
}

/// A tool: a `function`, a `namespace` holding function tools (the API's grouping, which Codex
/// uses for its MCP servers and sub-agent tools), or a hosted tool's type (`web_search`,
/// `file_search`, …), which the server does not run.
#[derive(Debug, Clone, Deserialize)]
pub struct Tool {
    /// `function`, `namespace`, or a hosted tool's type.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function's (or the namespace's) name.
    pub name: Option<String>,
    /// What it does.
    pub description: Option<String>,
    /// Its arguments' JSON schema.
    pub parameters: Option<Value>,
    /// Strict schema adherence (our calls are constrained only under `required` or a name).
    pub strict: Option<bool>,
    /// A `namespace` tool's members.
    pub tools: Option<Vec<Tool>>,
}

/// `text`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct TextConfig {
    /// `text.format`.
    pub format: Option<TextFormat>,
}

/// `text.format`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum TextFormat {
    /// Free text.
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON matching `schema`.
    JsonSchema {
        /// The schema's name.
        #[serde(default)]
        name: Option<String>,
        /// The JSON schema.
        schema: Value,
        /// Strict adherence (always, here: the output is constrained by the schema).
        #[serde(default)]
        strict: Option<bool>,
    },
}

/// `reasoning`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ReasoningConfig {
    /// `none`, `minimal`, `low`, `medium`, `high` or `xhigh`.
    pub effort: Option<String>,
    /// Summary request (accepted; reasoning is returned as `reasoning_text`).
    pub summary: Option<String>,
}
