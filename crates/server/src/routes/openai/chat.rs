//! `POST /v1/chat/completions`: messages rendered by the model's chat template, tools and
//! their calls through the family's parser, reasoning split.

use super::{oai_respond, stream_opts, Kind};
use crate::chat::{self, ChatRequest};
use crate::error::ApiError;
use crate::params::{self, Api, Fields};
use crate::routes::json_object;
use crate::tools::ToolRequest;
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::Response;
use serde_json::{Map, Value};
use sparrow_tokenizer::ChatMessage;

/// Text of a chat message's `content`: a string, or the `text` parts of a list.
fn message_text(v: &Value, i: usize) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    _ => {
                        return Err(ApiError::bad(
                            "messages",
                            format!("messages[{i}]: only text content parts are supported"),
                        ))
                    }
                }
            }
            Ok(out)
        }
        _ => Err(ApiError::bad("messages", format!("messages[{i}].content must be a string or a list of parts"))),
    }
}

/// An assistant message's `tool_calls` as templates take them: `arguments` parsed from the
/// API's JSON string into an object (vLLM does the same), kept as a string if it is not JSON.
fn template_calls(v: &Value, i: usize) -> Result<Value, ApiError> {
    let list =
        v.as_array().ok_or_else(|| ApiError::bad("messages", format!("messages[{i}].tool_calls must be a list")))?;
    let mut out = Vec::with_capacity(list.len());
    for c in list {
        let mut c = c.clone();
        let args = c.get("function").and_then(|f| f.get("arguments")).and_then(Value::as_str).map(str::to_owned);
        if let (Some(a), Some(f)) = (args, c.get_mut("function")) {
            if let Ok(parsed) = serde_json::from_str::<Value>(&a) {
                f["arguments"] = parsed;
            }
        }
        if c.get("function").and_then(|f| f.get("name")).and_then(Value::as_str).is_none() {
            return Err(ApiError::bad(
                "messages",
                format!("messages[{i}].tool_calls[].function.name must be a string"),
            ));
        }
        out.push(c);
    }
    Ok(Value::Array(out))
}

/// OpenAI's `POST /v1/chat/completions`.
pub(crate) async fn chat(State(s): State<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let m = json_object(&body)?;
    let f = Fields(&m);
    let stream = f.bool("stream")?.unwrap_or(false);
    let opts = stream_opts(&m, stream)?;
    let tools = ToolRequest::parse(&m, s.parsers)?;
    let separate_reasoning = f.bool("separate_reasoning")?.unwrap_or(true);
    let kwargs = match f.get("chat_template_kwargs") {
        None => Map::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(_) => return Err(ApiError::bad("chat_template_kwargs", "chat_template_kwargs must be an object")),
    };
    let ask = params::parse_logprobs(&m, Api::Chat, false)?;
    let mut params = params::parse(&m, Api::Chat)?;
    chat::add_tool_constraint(&mut params, tools.as_ref())?;
    let msgs = m
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::bad("messages", "messages must be a list"))?;
    if msgs.is_empty() {
        return Err(ApiError::bad("messages", "messages must not be empty"));
    }
    let mut messages = Vec::with_capacity(msgs.len() + 1);
    for (i, msg) in msgs.iter().enumerate() {
        let role = msg
            .get("role")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::bad("messages", format!("messages[{i}].role must be a string")))?;
        if !matches!(role, "system" | "user" | "assistant" | "developer" | "tool") {
            return Err(ApiError::bad(
                "messages",
                format!("messages[{i}].role {role:?} is not one of system, user, assistant, developer, tool"),
            ));
        }
        let content = message_text(msg.get("content").unwrap_or(&Value::Null), i)?;
        let tool_calls = match msg.get("tool_calls") {
            Some(v) if role == "assistant" && !v.is_null() => Some(template_calls(v, i)?),
            _ => None,
        };
        let str_field = |k: &str| msg.get(k).and_then(Value::as_str).map(str::to_owned);
        let mut m = ChatMessage {
            role: if role == "developer" { "system".into() } else { role.into() },
            content,
            tool_calls,
            tool_call_id: str_field("tool_call_id").filter(|_| role == "tool"),
            name: str_field("name").filter(|_| role == "tool"),
            // vLLM also reads the newer spelling `reasoning`.
            reasoning_content: str_field("reasoning_content")
                .or_else(|| str_field("reasoning"))
                .filter(|_| role == "assistant"),
            // Phi-4-mini's model card puts the tools, as a JSON string, on the system message.
            tools: str_field("tools").filter(|_| role == "system" || role == "developer"),
        };
        chat::calls_into_content(&s, &mut m);
        messages.push(m);
    }
    let req = ChatRequest { messages, tools, kwargs, params, ask: ask.clone(), separate_reasoning };
    let (prep, shape) = chat::lower(&s, req)?;
    oai_respond(&s, Kind::Chat, vec![(prep, None)], ask, shape, stream, opts).await
}
