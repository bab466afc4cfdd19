//! Anthropic's Messages API request (`POST /v1/messages` and `/v1/messages/count_tokens`), as
//! Anthropic's API reference ("Messages") and the `anthropic` Python SDK's
//! `MessageCreateParams` define it, and its error body.
//!
//! Deserialized leniently (unknown fields ignored); a field of the wrong shape is a serde error
//! naming its path. Block and tool kinds the server does not run (images, documents, server
//! tools) deserialize into their own variants so they are refused by name.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The request body of `/v1/messages` (and, without `max_tokens`, of `count_tokens`).
#[derive(Debug, Clone, Deserialize)]
pub struct MessagesRequest {
    /// The model id (any value is accepted; the server serves one model).
    pub model: Option<String>,
    /// Most output tokens (required by `/v1/messages`, thinking included).
    pub max_tokens: Option<u32>,
    /// The system prompt: a string or text blocks.
    pub system: Option<System>,
    /// The conversation, alternating `user` and `assistant`.
    pub messages: Vec<Message>,
    /// Client tools.
    pub tools: Option<Vec<Tool>>,
    /// How the model uses the tools.
    pub tool_choice: Option<ToolChoice>,
    /// Strings that end generation (reported as `stop_sequence`).
    pub stop_sequences: Option<Vec<String>>,
    /// Sampling temperature, 0–1.
    pub temperature: Option<f64>,
    /// Nucleus sampling.
    pub top_p: Option<f64>,
    /// Top-k sampling.
    pub top_k: Option<i64>,
    /// Extended thinking.
    pub thinking: Option<Thinking>,
    /// `format` (structured output) and `effort`.
    pub output_config: Option<OutputConfig>,
    /// `{"user_id"}`, accepted.
    pub metadata: Option<Value>,
    /// Stream Anthropic's events.
    pub stream: Option<bool>,
    /// MCP connectors (refused).
    pub mcp_servers: Option<Value>,
    /// Code-execution container (refused).
    pub container: Option<Value>,
}

/// `system`.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "Value")]
pub enum System {
    /// Plain text.
    Text(String),
    /// Text blocks.
    Blocks(Vec<Block>),
}

/// A string, or a list of blocks each read on its own so an error names the block.
fn text_or_blocks(v: Value) -> Result<Result<String, Vec<Block>>, String> {
    match v {
        Value::String(s) => Ok(Ok(s)),
        Value::Array(a) => a
            .into_iter()
            .enumerate()
            .map(|(i, b)| serde_json::from_value(b).map_err(|e| format!("block {i}: {e}")))
            .collect::<Result<_, _>>()
            .map(Err),
        _ => Err("must be a string or a list of content blocks".into()),
    }
}

impl TryFrom<Value> for System {
    type Error = String;
    fn try_from(v: Value) -> Result<Self, String> {
        text_or_blocks(v).map(|r| r.map_or_else(System::Blocks, System::Text))
    }
}

impl TryFrom<Value> for MessageContent {
    type Error = String;
    fn try_from(v: Value) -> Result<Self, String> {
        text_or_blocks(v).map(|r| r.map_or_else(MessageContent::Blocks, MessageContent::Text))
    }
}

impl TryFrom<Value> for ToolResultContent {
    type Error = String;
    fn try_from(v: Value) -> Result<Self, String> {
        text_or_blocks(v).map(|r| r.map_or_else(ToolResultContent::Blocks, ToolResultContent::Text))
    }
}

/// One message.
#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    /// `user` or `assistant`.
    pub role: String,
    /// A string or content blocks.
    pub content: MessageContent,
}

/// A message's `content`.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "Value")]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Blocks.
    Blocks(Vec<Block>),
}

/// A content block.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Block {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// A call the assistant made.
    ToolUse {
        /// `toolu_…`.
        id: String,
        /// The tool.
        name: String,
        /// The arguments object.
        input: Value,
    },
    /// A call's result, in a user message.
    ToolResult {
        /// The call answered.
        tool_use_id: String,
        /// A string or text blocks.
        #[serde(default)]
        content: Option<ToolResultContent>,
        /// The call failed.
        #[serde(default)]
        is_error: Option<bool>,
    },
    /// Earlier reasoning.
    Thinking {
        /// The text.
        thinking: String,
        /// Its signature (not checked here).
        #[serde(default)]
        signature: Option<String>,
    },
    /// Encrypted reasoning (dropped: nothing here can read it).
    RedactedThinking,
    /// An image (refused).
    Image,
    /// A document (refused).
    Document,
}

/// A `tool_result`'s `content`.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "Value")]
pub enum ToolResultContent {
    /// Plain text.
    Text(String),
    /// Blocks (text only here).
    Blocks(Vec<Block>),
}

/// A client tool (`type` absent or `custom`; server tools are refused by name).
#[derive(Debug, Clone, Deserialize)]
pub struct Tool {
    /// `custom`, or a server tool's type.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The tool's name.
    pub name: String,
    /// What it does.
    pub description: Option<String>,
    /// Its input's JSON schema.
    pub input_schema: Option<Value>,
}

/// `tool_choice`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides.
    Auto {
        /// At most one call.
        #[serde(default)]
        disable_parallel_tool_use: Option<bool>,
    },
    /// At least one call.
    Any {
        /// At most one call.
        #[serde(default)]
        disable_parallel_tool_use: Option<bool>,
    },
    /// This tool.
    Tool {
        /// The tool's name.
        name: String,
        /// At most one call.
        #[serde(default)]
        disable_parallel_tool_use: Option<bool>,
    },
    /// No calls.
    None,
}

/// `thinking`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Thinking {
    /// Think first, within `budget_tokens` (≥ 1024 and below `max_tokens`).
    Enabled {
        /// Tokens the reasoning may use.
        budget_tokens: u32,
    },
    /// Answer directly.
    Disabled,
    /// The model decides (the family's default).
    Adaptive,
    /// Thinking between tool calls (treated as enabled).
    BetweenTools,
}

/// `output_config`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct OutputConfig {
    /// `low`, `medium`, `high`, `xhigh` or `max`.
    pub effort: Option<String>,
    /// The answer's format.
    pub format: Option<OutputFormat>,
}

/// `output_config.format`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputFormat {
    /// JSON matching `schema`.
    JsonSchema {
        /// The JSON schema.
        schema: Value,
    },
}

/// Anthropic's error body: `{"type": "error", "error": {"type", "message"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Always `error`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The error.
    pub error: ErrorDetail,
}

/// The `error` of an [`ErrorBody`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// `invalid_request_error`, `authentication_error`, `not_found_error`,
    /// `request_too_large`, `api_error`, `overloaded_error`, ….
    #[serde(rename = "type")]
    pub kind: String,
    /// What went wrong.
    pub message: String,
}

impl ErrorBody {
    /// An error of `kind` saying `message`.
    pub fn new(kind: &str, message: impl Into<String>) -> Self {
        ErrorBody { kind: "error".into(), error: ErrorDetail { kind: kind.into(), message: message.into() } }
    }
}
