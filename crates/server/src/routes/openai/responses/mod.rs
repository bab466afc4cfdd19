//! OpenAI's Responses API: `POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`.
//!
//! The request ([`sparrow_protocol::responses::ResponsesRequest`]) is lowered into the internal
//! [`ChatRequest`]: `instructions` become the first system message, input items become messages
//! (`function_call` items an assistant message's calls, `function_call_output` items tool
//! messages, `reasoning` items the next assistant message's reasoning), `tools` what
//! [`tools::offered`] offers the model (namespaces flattened, hosted tools left out), `text.format` the
//! structured-output constraint, `reasoning.effort` the template's `reasoning_effort` (and
//! `enable_thinking: false` for `none`, Qwen 3's switch). `previous_response_id` puts the stored
//! conversation before the new input. The answer is rendered by [`render::Render`], one machine
//! for the stream and the whole object, so the two agree by construction.
//!
//! Follows the OpenAI API reference ("Responses") and the `openai` Python SDK's types; vLLM's
//! `serving_responses.py` and SGLang's `serving_responses.py` serve the same shapes.

use super::super::typed_body;
use crate::chat::{self, ChatRequest};
use crate::error::ApiError;
use crate::gen;
use crate::grammar::Constraint;
use crate::params::{self, json_schema, top_logprobs, LogprobAsk, Sampling};
use crate::state::AppState;
use crate::store::Stored;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use render::Render;
use serde_json::{json, Map, Value};
use sparrow_protocol::responses::{parts_text, Input, Item, ResponsesRequest, TextFormat};
use sparrow_tokenizer::ChatMessage;

mod render;
mod tools;

use tools::Offered;

/// The `include` value that turns on `output_text` logprobs.
const INCLUDE_LOGPROBS: &str = "message.output_text.logprobs";

/// The API's other `include` values: accepted, with nothing to add (they ask for outputs of
/// built-in tools and images this server does not run, or for encrypted reasoning, which it
/// does not produce; agent SDKs send `reasoning.encrypted_content` whenever `store` is false).
const INCLUDE_NOTHING: &[&str] = &[
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
    "reasoning.encrypted_content",
];

/// `reasoning.effort` values the API defines.
const EFFORTS: &[&str] = &["none", "minimal", "low", "medium", "high", "xhigh"];

fn not_found(id: &str) -> ApiError {
    ApiError::NotFound(format!("Response with id '{id}' not found."))
}

/// The input items as chat messages, appended to `conv`.
fn lower_items(items: &[Item], conv: &mut Vec<ChatMessage>) -> Result<(), ApiError> {
    let mut reasoning: Option<String> = None;
    for (i, item) in items.iter().enumerate() {
        let bad = |m: String| ApiError::bad("input", format!("input[{i}]: {m}"));
        match item {
            Item::Message(m) => {
                let role = match m.role.as_str() {
                    "developer" | "system" => "system",
                    r @ ("user" | "assistant") => r,
                    other => {
                        return Err(bad(format!("role {other:?} is not one of user, assistant, system, developer")))
                    }
                };
                let content = m.content.text().map_err(bad)?;
                let mut msg = ChatMessage::new(role, content);
                if role == "assistant" {
                    msg.reasoning_content = reasoning.take();
                }
                conv.push(msg);
            }
            Item::FunctionCall(c) => {
                let args = serde_json::from_str::<Value>(&c.arguments).unwrap_or(Value::String(c.arguments.clone()));
                let name = match &c.namespace {
                    Some(ns) => tools::flat_name(ns, &c.name),
                    None => c.name.clone(),
                };
                let call = json!({"id": c.call_id, "type": "function", "function": {"name": name, "arguments": args}});
                match conv.last_mut() {
                    Some(last) if last.role == "assistant" && reasoning.is_none() => match &mut last.tool_calls {
                        Some(Value::Array(a)) => a.push(call),
                        _ => last.tool_calls = Some(Value::Array(vec![call])),
                    },
                    _ => {
                        let mut msg = ChatMessage::new("assistant", "");
                        msg.reasoning_content = reasoning.take();
                        msg.tool_calls = Some(Value::Array(vec![call]));
                        conv.push(msg);
                    }
                }
            }
            Item::FunctionCallOutput(o) => {
                let text = o.output.text().map_err(bad)?;
                let msg = match (&o.call_id, &o.name) {
                    (Some(id), _) => chat::tool_result(conv, id, text),
                    (None, Some(name)) => {
                        let mut m = ChatMessage::new("tool", text);
                        m.name = Some(match &o.namespace {
                            Some(ns) => tools::flat_name(ns, name),
                            None => name.clone(),
                        });
                        m
                    }
                    (None, None) => return Err(bad("a function_call_output item needs a call_id (or a name)".into())),
                };
                conv.push(msg);
            }
            Item::Reasoning(r) => {
                let text = match &r.content {
                    Some(parts) => parts_text(parts).map_err(bad)?,
                    None => r.summary.iter().map(|s| s.text.as_str()).collect::<Vec<_>>().join("\n"),
                };
                reasoning.get_or_insert_with(String::new).push_str(&text);
            }
        }
    }
    Ok(())
}

/// Refuses what this server does not do, by name, rather than answering as if it had.
fn refuse_unsupported(r: &ResponsesRequest) -> Result<(), ApiError> {
    let refuse =
        |field: &str, why: &str| Err(ApiError::bad(field, format!("{field} is not supported by this server ({why})")));
    if r.conversation.as_ref().is_some_and(|v| !v.is_null()) {
        return refuse("conversation", "use previous_response_id");
    }
    if r.background == Some(true) {
        return refuse("background", "responses are answered while the request is open");
    }
    if r.prompt.as_ref().is_some_and(|v| !v.is_null()) {
        return refuse("prompt", "stored prompt templates");
    }
    if r.truncation.as_deref().is_some_and(|t| t != "disabled") {
        return refuse("truncation", "an input past the context length is a 400, never cut");
    }
    if let Some(m) = &r.metadata {
        if m.len() > 16 || m.values().any(|v| !v.is_string()) {
            return Err(ApiError::bad("metadata", "metadata must hold at most 16 string values"));
        }
    }
    Ok(())
}

/// Responses' structured-output field.
const FORMAT: &str = "text.format";

/// The request's generation fields, typed, named as the Responses API names them
/// (`max_output_tokens`, `text.format`); the other sampling fields as chat spells them.
fn sampling(r: &ResponsesRequest, raw: &Map<String, Value>) -> Sampling {
    let constraint = match r.text.as_ref().and_then(|t| t.format.as_ref()) {
        None | Some(TextFormat::Text) => Ok(None),
        Some(TextFormat::JsonObject) => Ok(Some((Constraint::Json(json!({"type": "object"})), FORMAT))),
        Some(TextFormat::JsonSchema { schema, .. }) => json_schema(schema, FORMAT).map(|c| Some((c, FORMAT))),
    };
    Sampling {
        max_tokens: Ok(r.max_output_tokens.map(|m| m as usize)),
        max_tokens_field: "max_output_tokens",
        temperature: Ok(r.temperature),
        top_p: Ok(r.top_p),
        top_k: Ok(r.top_k),
        min_p: Ok(r.min_p),
        seed: Ok(r.seed),
        stop: Ok(r.stop.clone().map(|s| s.0)),
        presence_penalty: Ok(r.presence_penalty),
        frequency_penalty: Ok(r.frequency_penalty),
        repetition_penalty: Ok(r.repetition_penalty),
        priority: params::priority(raw),
        constraint,
        ..Sampling::default()
    }
}

/// The request lowered: the chat request, the conversation to store, and what became of the
/// tools (the chat request holds those offered).
fn lower(
    s: &AppState,
    r: &ResponsesRequest,
    raw: &Map<String, Value>,
) -> Result<(ChatRequest, Vec<ChatMessage>, Offered), ApiError> {
    refuse_unsupported(r)?;
    if r.max_output_tokens == Some(0) {
        return Err(ApiError::bad("max_output_tokens", "max_output_tokens must be at least 1"));
    }
    // Logprobs come back when `include` asks for them; `top_logprobs` sets the alternatives.
    let lp_on = r.include.iter().flatten().any(|i| i == INCLUDE_LOGPROBS);
    if let Some(bad) =
        r.include.iter().flatten().find(|i| *i != INCLUDE_LOGPROBS && !INCLUDE_NOTHING.contains(&i.as_str()))
    {
        return Err(ApiError::bad("include", format!("include {bad:?} is not one of the API's values")));
    }
    let mut offered = tools::offered(s, r)?;
    let tools = offered.tools.take();
    let mut params = sampling(r, raw).defaulted(&s.sampling_defaults).validate()?;
    chat::add_tool_constraint(&mut params, tools.as_ref())?;
    let mut kwargs = Map::new();
    if let Some(effort) = r.reasoning.as_ref().and_then(|x| x.effort.as_deref()) {
        if !EFFORTS.contains(&effort) {
            return Err(ApiError::bad(
                "reasoning.effort",
                format!("reasoning.effort {effort:?} is not one of {}", EFFORTS.join(", ")),
            ));
        }
        kwargs.insert("reasoning_effort".into(), json!(effort));
        kwargs.insert("enable_thinking".into(), json!(effort != "none"));
    }
    let mut history = match &r.previous_response_id {
        None => Vec::new(),
        Some(id) => s.responses.get(id).map(|st| st.history).ok_or_else(|| not_found(id))?,
    };
    match &r.input {
        None if r.previous_response_id.is_some() => {}
        None => return Err(ApiError::bad("input", "input is required")),
        Some(Input::Text(t)) => history.push(ChatMessage::new("user", t.clone())),
        Some(Input::Items(items)) => lower_items(items, &mut history)?,
    }
    if history.is_empty() {
        return Err(ApiError::bad("input", "input must not be empty"));
    }
    let mut messages = Vec::with_capacity(history.len() + 1);
    if let Some(i) = &r.instructions {
        messages.push(ChatMessage::new("system", i.clone()));
    }
    messages.extend(history.iter().cloned());
    let top = lp_on.then(|| top_logprobs("top_logprobs", r.top_logprobs.unwrap_or(0) as usize)).transpose()?;
    let ask = LogprobAsk { output: top, ..LogprobAsk::default() };
    let req = ChatRequest { messages, tools, kwargs, params, ask, separate_reasoning: true, continue_final: false };
    Ok((req, history, offered))
}

/// `POST /v1/responses`.
pub(crate) async fn create(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let (r, raw): (ResponsesRequest, _) = typed_body(&body)?;
    let (req, history, offered) = lower(&s, &r, &raw)?;
    let not_offered = not_offered_header(&offered);
    let store = r.store.unwrap_or(true) && s.responses.enabled();
    let top = req.ask.output;
    let (prep, shape) = chat::lower(&s, req)?;
    let prompt_tokens = prep.prompt_ids.len();
    let mut render = Render::new(&s, &r, &raw, prompt_tokens, shape, top, offered);
    let mut prep = prep;
    prep.over_limit = gen::admit(&s)?;
    let mut events = gen::start(&s, prep)?;
    let keep = store.then_some((s.clone(), history));
    if r.stream.unwrap_or(false) {
        return Ok(with_header(render::stream(render, events, keep), not_offered));
    }
    let mut finish = None;
    while let Some(e) = events.next().await {
        finish = render.feed(e).or(finish);
    }
    let finish = finish.ok_or(ApiError::Unavailable)?;
    if let Some(e) = finish.api_error() {
        return Err(e);
    }
    render.finish(&finish);
    let response = render.response();
    if let Some((s, history)) = keep {
        render::keep(&s, &render, response.clone(), history);
    }
    Ok(with_header(Json(response).into_response(), not_offered))
}

/// `resp` with [`NOT_OFFERED`] when some tool was left out.
fn with_header(mut resp: Response, not_offered: Option<HeaderValue>) -> Response {
    if let Some(h) = not_offered {
        resp.headers_mut().insert(NOT_OFFERED, h);
    }
    resp
}

/// The response header that names the tools the model was not offered (hosted tools this
/// server does not run), so a client can tell; the same list goes to the log.
const NOT_OFFERED: &str = "x-sparrow-tools-not-offered";

/// [`NOT_OFFERED`]'s value, and the log line, when some tool was left out.
fn not_offered_header(o: &Offered) -> Option<HeaderValue> {
    if o.not_offered.is_empty() {
        return None;
    }
    let list = o.not_offered.join(", ");
    eprintln!("sparrow serve: /v1/responses: tools not offered to the model (this server does not run them): {list}");
    HeaderValue::from_str(&list).ok()
}

/// `GET /v1/responses/{id}`.
pub(crate) async fn get(State(s): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let st: Stored = s.responses.get(&id).ok_or_else(|| not_found(&id))?;
    Ok(Json(st.response).into_response())
}

/// `DELETE /v1/responses/{id}`.
pub(crate) async fn delete(State(s): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    if !s.responses.delete(&id) {
        return Err(not_found(&id));
    }
    Ok(Json(json!({"id": id, "object": "response", "deleted": true})).into_response())
}
