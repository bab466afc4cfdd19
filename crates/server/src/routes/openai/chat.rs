//! `POST /v1/chat/completions`: messages rendered by the model's chat template, tools and
//! their calls through the family's parser, reasoning split.

use super::{oai_respond, stream_opts, ChatShape, Kind};
use crate::error::ApiError;
use crate::gen::{self};
use crate::params::{self, Api, Fields};
use crate::routes::json_object;
use crate::tools::{self, ToolRequest};
use crate::AppState;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::Response;
use serde_json::{Map, Value};
use sparrow_tokenizer::{ChatMessage, TemplateTools};

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
    let mut p = params::parse(&m, Api::Chat)?;
    if let Some(c) = tools.as_ref().and_then(ToolRequest::constraint) {
        if let Some((_, field)) = &p.constraint {
            return Err(ApiError::bad(
                field,
                format!("{field} cannot be combined with a required or named tool_choice"),
            ));
        }
        p.constraint = Some((c, "tools"));
    }
    let msgs = m
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::bad("messages", "messages must be a list"))?;
    if msgs.is_empty() {
        return Err(ApiError::bad("messages", "messages must not be empty"));
    }
    let where_tools = s.tokenizer.template_tools();
    let native_tools = where_tools == TemplateTools::Argument;
    let mut conv = Vec::with_capacity(msgs.len() + 1);
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
        let mut content = message_text(msg.get("content").unwrap_or(&Value::Null), i)?;
        let tool_calls = match msg.get("tool_calls") {
            Some(v) if role == "assistant" && !v.is_null() => Some(template_calls(v, i)?),
            _ => None,
        };
        if let (false, Some(calls)) = (native_tools, &tool_calls) {
            // The template cannot show calls: write them as the parser's format reads them.
            content.push_str(&tools::history_calls(calls, s.parsers.tool_call));
        }
        let str_field = |k: &str| msg.get(k).and_then(Value::as_str).map(str::to_owned);
        conv.push(ChatMessage {
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
        });
    }
    let shown = tools.as_ref().filter(|t| t.shown());
    if let (Some(t), TemplateTools::SystemMessage) = (shown, where_tools) {
        // Phi-4-mini's way: the tools ride on the system message, one is added if none.
        if conv.first().is_none_or(|m| m.role != "system") {
            conv.insert(0, ChatMessage::new("system", ""));
        }
        if let Some(first) = conv.first_mut() {
            first.tools = Some(tools::py_json(&t.raw));
        }
    } else if let (Some(t), false) = (shown, native_tools) {
        let prompt = tools::tools_system_prompt(&t.raw, s.parsers.tool_call);
        match conv.first_mut() {
            Some(first) if first.role == "system" => first.content = format!("{}\n\n{prompt}", first.content),
            _ => conv.insert(0, ChatMessage::new("system", prompt)),
        }
    }
    let text = s
        .tokenizer
        .apply_chat_template_with(&conv, shown.filter(|_| native_tools).map(|t| &t.raw), &kwargs, true)
        .map_err(|e| ApiError::bad("messages", e.to_string()))?;
    let ids = s.tokenizer.encode(&text, false).map_err(|e| ApiError::bad("messages", e.to_string()))?;
    p.logprobs = ask.spec(ids.len());
    // A grammar forces the answer's shape from the first token: there is no reasoning to split
    // off (a `deepseek-r1` parser would otherwise take the constrained JSON for reasoning).
    let separate_reasoning = separate_reasoning && p.constraint.is_none();
    let prep = gen::prepare(&s, ids, p)?;
    let shape = ChatShape { parsers: s.parsers, tools, separate_reasoning };
    oai_respond(&s, Kind::Chat, vec![(prep, None)], ask, shape, stream, opts).await
}
