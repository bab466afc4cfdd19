//! Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`.
//!
//! The request ([`sparrow_protocol::anthropic::MessagesRequest`]) is lowered into the internal
//! [`ChatRequest`]: `system` becomes the first system message; a user message's `tool_result`
//! blocks become tool messages and its text a user message; an assistant message's `text`,
//! `thinking` and `tool_use` blocks become its content, reasoning and calls; `tools`
//! (`input_schema`) and `tool_choice` (`auto`, `any` = required, `tool` = named, `none`,
//! `disable_parallel_tool_use`) become chat's; `stop_sequences` the stop strings; `thinking`
//! the template's `enable_thinking`. Errors use Anthropic's shape and its status codes
//! (`{"type": "error", "error": {"type": "invalid_request_error", "message"}}`).
//!
//! Follows Anthropic's API reference ("Messages", "Streaming Messages", "Errors") and the
//! `anthropic` Python SDK's types; SGLang and vLLM serve the same route.

use super::super::typed_body;
use super::render::{self, Render};
use super::AnthropicError;
use crate::chat::{self, ChatRequest};
use crate::error::ApiError;
use crate::gen::{self, EndReason};
use crate::params::{self, json_schema, LogprobAsk, ReasoningBudget, Sampling};
use crate::state::AppState;
use crate::tools::{template_tool, ToolChoice as Choice, ToolRequest, ToolSpec};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use serde_json::{json, Map, Value};
use sparrow_protocol::anthropic::{
    Block, MessageContent, MessagesRequest, OutputFormat, System, Thinking, ToolChoice, ToolResultContent,
};
use sparrow_tokenizer::ChatMessage;

/// Appends a text block: blocks are joined with a newline, as vLLM joins text parts (several
/// blocks per turn are common; joined bare, words would fuse at the seams).
fn push_block(out: &mut String, text: &str) {
    if !out.is_empty() {
        out.push('\n');
    }
    out.push_str(text);
}

/// A final assistant message is a prefill: the answer continues it (`chat::prompt_ids` continues
/// only a final, non-empty assistant message).
const PREFILL: bool = true;

/// Text of text blocks; other kinds are a 400 naming where they are.
fn blocks_text(blocks: &[Block], at: &str) -> Result<String, ApiError> {
    let mut out = String::new();
    for (j, b) in blocks.iter().enumerate() {
        match b {
            Block::Text { text } => push_block(&mut out, text),
            other => return Err(unsupported(other, &format!("{at}[{j}]"), "text blocks only")),
        }
    }
    Ok(out)
}

fn unsupported(b: &Block, at: &str, here: &str) -> ApiError {
    let kind = match b {
        Block::Image => "image blocks are not supported by this server".to_owned(),
        Block::Document => "document blocks are not supported by this server".to_owned(),
        Block::Text { .. } => format!("text is not allowed here ({here})"),
        Block::ToolUse { .. } => format!("tool_use is not allowed here ({here})"),
        Block::ToolResult { .. } => format!("tool_result is not allowed here ({here})"),
        Block::Thinking { .. } | Block::RedactedThinking => format!("thinking is not allowed here ({here})"),
    };
    ApiError::bad("messages", format!("{at}: {kind}"))
}

/// The conversation as chat messages.
fn lower_messages(r: &MessagesRequest) -> Result<Vec<ChatMessage>, ApiError> {
    let mut conv = Vec::with_capacity(r.messages.len() + 1);
    match &r.system {
        None => {}
        Some(System::Text(t)) => conv.push(ChatMessage::new("system", t.clone())),
        Some(System::Blocks(b)) => conv.push(ChatMessage::new("system", blocks_text(b, "system")?)),
    }
    if r.messages.is_empty() {
        return Err(ApiError::bad("messages", "messages must not be empty"));
    }
    for (i, m) in r.messages.iter().enumerate() {
        let blocks = match &m.content {
            MessageContent::Text(t) => vec![Block::Text { text: t.clone() }],
            MessageContent::Blocks(b) if b.is_empty() => {
                return Err(ApiError::bad("messages", format!("messages[{i}].content must not be empty")))
            }
            MessageContent::Blocks(b) => b.clone(),
        };
        match m.role.as_str() {
            "user" => {
                let mut text = String::new();
                for (j, b) in blocks.iter().enumerate() {
                    match b {
                        Block::Text { text: t } => push_block(&mut text, t),
                        Block::ToolResult { tool_use_id, content, is_error } => {
                            let mut out = match content {
                                None => String::new(),
                                Some(ToolResultContent::Text(t)) => t.clone(),
                                Some(ToolResultContent::Blocks(b)) => {
                                    blocks_text(b, &format!("messages[{i}].content[{j}].content"))?
                                }
                            };
                            if is_error == &Some(true) {
                                out = format!("Error: {out}");
                            }
                            conv.push(chat::tool_result(&conv, tool_use_id, out));
                        }
                        other => {
                            return Err(unsupported(other, &format!("messages[{i}].content[{j}]"), "a user message"))
                        }
                    }
                }
                if !text.is_empty() || matches!(m.content, MessageContent::Text(_)) {
                    conv.push(ChatMessage::new("user", text));
                }
            }
            "assistant" => {
                let mut msg = ChatMessage::new("assistant", "");
                let mut calls = Vec::new();
                for (j, b) in blocks.iter().enumerate() {
                    match b {
                        Block::Text { text } => push_block(&mut msg.content, text),
                        Block::Thinking { thinking, .. } => {
                            msg.reasoning_content.get_or_insert_with(String::new).push_str(thinking)
                        }
                        // Encrypted by another provider: nothing here can read it.
                        Block::RedactedThinking => {}
                        Block::ToolUse { id, name, input } => calls.push(
                            json!({"id": id, "type": "function", "function": {"name": name, "arguments": input}}),
                        ),
                        other => {
                            return Err(unsupported(
                                other,
                                &format!("messages[{i}].content[{j}]"),
                                "an assistant message",
                            ))
                        }
                    }
                }
                msg.tool_calls = (!calls.is_empty()).then_some(Value::Array(calls));
                conv.push(msg);
            }
            // Claude Code (2.1.3xx) sends its per-turn environment and instructions as `system`
            // messages between the turns: each is a system message at its place.
            "system" => conv.push(ChatMessage::new("system", blocks_text(&blocks, &format!("messages[{i}].content"))?)),
            other => {
                return Err(ApiError::bad(
                    "messages",
                    format!("messages[{i}].role {other:?} is not user, assistant or system"),
                ))
            }
        }
    }
    Ok(conv)
}

/// `tools` and `tool_choice` read from the typed request (`input_schema` is a function's
/// parameters, `any` is `required`, `disable_parallel_tool_use` the opposite of
/// `parallel_tool_calls`), then [`ToolRequest::new`]'s checks.
fn tool_fields(s: &AppState, r: &MessagesRequest) -> Result<Option<ToolRequest>, ApiError> {
    let tools = r.tools.as_deref().unwrap_or_default();
    let mut template = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        if let Some(k) = t.kind.as_deref().filter(|k| *k != "custom") {
            return Err(ApiError::bad(
                "tools",
                format!("tools[{i}]: {k:?} server tools are not supported by this server (client tools are)"),
            ));
        }
        if t.name.is_empty() {
            return Err(ApiError::bad("tools", format!("tools[{i}].name must be a non-empty string")));
        }
        if t.input_schema.is_none() {
            return Err(ApiError::bad("tools", format!("tools[{i}].input_schema is required")));
        }
        template.push(template_tool(&t.name, t.description.as_deref(), t.input_schema.as_ref()));
    }
    let specs = tools
        .iter()
        .enumerate()
        .map(|(i, t)| ToolSpec::new(&t.name, t.input_schema.as_ref(), &format!("tools[{i}].input_schema")))
        .collect::<Result<_, _>>()?;
    let (choice, no_parallel) = match &r.tool_choice {
        None => (None, None),
        Some(ToolChoice::Auto { disable_parallel_tool_use }) => (Some(Choice::Auto), *disable_parallel_tool_use),
        Some(ToolChoice::Any { disable_parallel_tool_use }) => (Some(Choice::Required), *disable_parallel_tool_use),
        Some(ToolChoice::Tool { name, disable_parallel_tool_use }) => {
            (Some(Choice::Named(name.clone())), *disable_parallel_tool_use)
        }
        Some(ToolChoice::None) => (Some(Choice::None), None),
    };
    ToolRequest::new(specs, Value::Array(template), choice, no_parallel != Some(true), s.parsers)
}

/// The template variables `thinking` sets (Qwen 3's `enable_thinking`).
fn thinking_kwargs(r: &MessagesRequest) -> Result<Map<String, Value>, ApiError> {
    let mut kwargs = Map::new();
    match &r.thinking {
        // The API thinks only when asked to; a template that thinks by default (Qwen 3) is told.
        None | Some(Thinking::Disabled) => {
            kwargs.insert("enable_thinking".into(), json!(false));
        }
        Some(Thinking::Adaptive) => {}
        Some(Thinking::BetweenTools) => {
            kwargs.insert("enable_thinking".into(), json!(true));
        }
        Some(Thinking::Enabled { budget_tokens }) => {
            if *budget_tokens < 1024 {
                return Err(ApiError::bad("thinking.budget_tokens", "thinking.budget_tokens must be at least 1024"));
            }
            if r.max_tokens.is_some_and(|m| *budget_tokens >= m) {
                return Err(ApiError::bad(
                    "thinking.budget_tokens",
                    "thinking.budget_tokens must be less than max_tokens",
                ));
            }
            kwargs.insert("enable_thinking".into(), json!(true));
        }
    }
    if let Some(effort) = r.output_config.as_ref().and_then(|o| o.effort.as_deref()) {
        const EFFORTS: &[&str] = &["low", "medium", "high", "xhigh", "max"];
        if !EFFORTS.contains(&effort) {
            return Err(ApiError::bad(
                "output_config.effort",
                format!("output_config.effort {effort:?} is not one of {}", EFFORTS.join(", ")),
            ));
        }
        kwargs.insert("reasoning_effort".into(), json!(effort));
    }
    Ok(kwargs)
}

/// The request's generation fields, typed, named as Anthropic names them (`stop_sequences`,
/// `output_config.format`).
fn sampling(r: &MessagesRequest, max_tokens: u32, raw: &Map<String, Value>) -> Sampling {
    let constraint = match r.output_config.as_ref().and_then(|o| o.format.as_ref()) {
        None => Ok(None),
        Some(OutputFormat::JsonSchema { schema }) => json_schema(schema, FORMAT).map(|c| Some((c, FORMAT))),
    };
    Sampling {
        // `max_tokens` is required here and agents send their Claude model's output limit
        // (Claude Code: 128,000), more than a local model's context holds: it is a ceiling,
        // clamped to the room the prompt leaves, as llama.cpp clamps `n_predict` (the other
        // APIs refuse an explicit limit that cannot fit; docs/api.md, "Lengths").
        max_tokens: Ok(None),
        default_max: Some(max_tokens as usize),
        temperature: Ok(r.temperature),
        top_p: Ok(r.top_p),
        top_k: Ok(r.top_k),
        stop: Ok(r.stop_sequences.clone()),
        stop_field: "stop_sequences",
        priority: params::priority(raw),
        constraint,
        ..Sampling::default()
    }
}

/// Anthropic's structured-output field.
const FORMAT: &str = "output_config.format";

fn lower(s: &AppState, r: &MessagesRequest, raw: &Map<String, Value>) -> Result<ChatRequest, ApiError> {
    let max = r.max_tokens.ok_or_else(|| ApiError::bad("max_tokens", "max_tokens: field required"))?;
    if max == 0 {
        return Err(ApiError::bad("max_tokens", "max_tokens must be at least 1"));
    }
    if let Some(t) = r.temperature.filter(|t| !(0.0..=1.0).contains(t)) {
        return Err(ApiError::bad("temperature", format!("temperature must be between 0 and 1, got {t}")));
    }
    for (field, v) in [("mcp_servers", &r.mcp_servers), ("container", &r.container)] {
        if v.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(ApiError::bad(field, format!("{field} is not supported by this server")));
        }
    }
    let tools = tool_fields(s, r)?;
    let mut params = sampling(r, max, raw).defaulted(&s.sampling_defaults).validate()?;
    if let Some(Thinking::Enabled { budget_tokens }) = &r.thinking {
        params.reasoning_budget = Some(ReasoningBudget { tokens: *budget_tokens as usize, inside: false });
    }
    chat::add_tool_constraint(&mut params, tools.as_ref())?;
    let kwargs = thinking_kwargs(r)?;
    let messages = lower_messages(r)?;
    let ask = LogprobAsk::default();
    Ok(ChatRequest { messages, tools, kwargs, params, ask, separate_reasoning: true, continue_final: PREFILL })
}

/// `POST /v1/messages`.
pub(crate) async fn messages(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AnthropicError> {
    let (r, raw): (MessagesRequest, _) = typed_body(&body)?;
    let req = lower(&s, &r, &raw)?;
    let (prep, shape) = chat::lower(&s, req)?;
    // Any model name is served by the one model, and echoed back (Claude Code names its own).
    let model = r.model.clone().filter(|m| !m.is_empty()).unwrap_or_else(|| s.model_id.clone());
    let render = Render::new(model, prep.prompt_ids.len(), shape);
    let mut prep = prep;
    prep.over_limit = gen::admit(&s)?;
    let mut events = gen::start(&s, prep)?;
    if r.stream.unwrap_or(false) {
        return Ok(render::stream(render, events));
    }
    let mut render = render;
    let mut finish = None;
    while let Some(e) = events.next().await {
        finish = render.feed(e).or(finish);
    }
    let finish = finish.ok_or(ApiError::Unavailable)?;
    if let Some(e) = finish.api_error() {
        return Err(e.into());
    }
    if finish.reason == EndReason::Abort {
        return Err(ApiError::Engine("the request was aborted".into()).into());
    }
    render.finish(&finish);
    Ok(Json(render.message()).into_response())
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens as `/v1/messages` would build it.
pub(crate) async fn count_tokens(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, AnthropicError> {
    let (r, _): (MessagesRequest, Map<String, Value>) = typed_body(&body)?;
    let tools = tool_fields(&s, &r)?;
    let kwargs = thinking_kwargs(&r)?;
    let messages = lower_messages(&r)?;
    let ids = chat::prompt_ids(&s, messages, tools.as_ref(), &kwargs, PREFILL)?;
    Ok(Json(json!({"input_tokens": ids.len()})).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `max_tokens` is a ceiling on this API: it reaches `gen::prepare` as the limit used when
    /// none is given (clamped there to the room the prompt leaves), not as an explicit limit
    /// (which would be a 400 once it passes the context).
    #[test]
    fn max_tokens_is_a_ceiling() {
        let r: MessagesRequest =
            serde_json::from_value(json!({"max_tokens": 128_000, "messages": [{"role": "user", "content": "hi"}]}))
                .expect("request");
        let p = sampling(&r, 128_000, &Map::new()).validate().expect("valid");
        assert_eq!((p.max_tokens, p.default_max), (None, Some(128_000)));
    }
}
