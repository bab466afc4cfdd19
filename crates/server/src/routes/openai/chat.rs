//! `POST /v1/chat/completions`: messages rendered by the model's chat template, tools and
//! their calls through the family's parser, reasoning split.

use super::{oai_respond, stream_opts, Kind};
use crate::chat::{self, ChatRequest};
use crate::error::ApiError;
use crate::params::{self, Api};
use crate::routes::typed_body;
use crate::state::AppState;
use crate::tools::ToolRequest;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::Response;
use serde_json::Value;
use sparrow_protocol::openai_request::ChatBody;
use sparrow_tokenizer::ChatMessage;

/// An assistant message's `tool_calls` as templates take them: `arguments` parsed from the
/// API's JSON string into an object (vLLM does the same), kept as a string if it is not JSON.
fn template_calls(list: &[Value], i: usize) -> Result<Value, ApiError> {
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
    let (b, m): (ChatBody, _) = typed_body(&body)?;
    let stream = b.stream.unwrap_or(false);
    let opts = stream_opts(b.stream_options, stream)?;
    let tools = ToolRequest::parse(&m, s.parsers)?;
    let separate_reasoning = b.separate_reasoning.unwrap_or(true);
    let kwargs = b.chat_template_kwargs.unwrap_or_default();
    let ask = params::parse_logprobs(&m, Api::Chat, false)?;
    let mut params = params::parse(&m, Api::Chat, &s.sampling_defaults)?;
    chat::add_tool_constraint(&mut params, tools.as_ref())?;
    let msgs = b.messages.ok_or_else(|| ApiError::bad("messages", "messages must be a list"))?;
    if msgs.is_empty() {
        return Err(ApiError::bad("messages", "messages must not be empty"));
    }
    let mut messages = Vec::with_capacity(msgs.len() + 1);
    for (i, msg) in msgs.into_iter().enumerate() {
        let role = msg.role.as_str();
        if !matches!(role, "system" | "user" | "assistant" | "developer" | "tool") {
            return Err(ApiError::bad(
                "messages",
                format!("messages[{i}].role {role:?} is not one of system, user, assistant, developer, tool"),
            ));
        }
        let content = msg.content.text().ok_or_else(|| {
            ApiError::bad("messages", format!("messages[{i}]: only text content parts are supported"))
        })?;
        let tool_calls = match &msg.tool_calls {
            Some(v) if role == "assistant" => Some(template_calls(v, i)?),
            _ => None,
        };
        messages.push(ChatMessage {
            role: if role == "developer" { "system".into() } else { role.into() },
            content,
            tool_calls,
            tool_call_id: msg.tool_call_id.filter(|_| role == "tool"),
            name: msg.name.filter(|_| role == "tool"),
            // vLLM also reads the newer spelling `reasoning`.
            reasoning_content: msg.reasoning_content.or(msg.reasoning).filter(|_| role == "assistant"),
            // Phi-4-mini's model card puts the tools, as a JSON string, on the system message.
            tools: msg.tools.filter(|_| role == "system" || role == "developer"),
        });
    }
    let continue_final = b.continue_final_message.unwrap_or(false);
    let req = ChatRequest { messages, tools, kwargs, params, ask: ask.clone(), separate_reasoning, continue_final };
    let (prep, shape) = chat::lower(&s, req)?;
    oai_respond(&s, Kind::Chat, vec![(prep, None)], ask, shape, stream, opts).await
}
