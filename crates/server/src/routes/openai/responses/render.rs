//! The Responses API's answer: output items built from a choice's [`Delta`]s, with the typed
//! stream events each step makes (`response.output_item.added`, `.content_part.added`,
//! `.output_text.delta` / `.done`, `.reasoning_text.delta` / `.done`,
//! `.function_call_arguments.delta` / `.done`, `.content_part.done`, `.output_item.done`), each
//! with its `sequence_number`, between `response.created` / `response.in_progress` and
//! `response.completed` (or `.incomplete` at the token limit, `.failed` on an engine error).
//! The non-streamed object is the same machine's final state.

use super::super::super::frames::sse_response;
use super::tools::{flat_name, Offered};
use crate::chat::ChatShape;
use crate::gen::{ChoiceEvent, EndReason, Finish};
use crate::logprobs::{self, TokenTexts};
use crate::routes::now_secs;
use crate::state::AppState;
use crate::store::Stored;
use crate::tools::{Delta, Shaper};
use axum::response::Response;
use futures_util::stream::{self, BoxStream, StreamExt};
use serde_json::{json, Map, Value};
use sparrow_engine::scheduler::TokenLogprob;
use sparrow_protocol::responses::ResponsesRequest;
use sparrow_protocol::sse;
use sparrow_tokenizer::ChatMessage;

/// Which output item is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Reasoning,
    Message,
    Call,
}

/// One response being built.
pub(super) struct Render {
    /// The response object without `output`, `status` and `usage` (the request's echo).
    base: Map<String, Value>,
    id: String,
    output: Vec<Value>,
    open: Option<Open>,
    shaper: Shaper,
    /// Events not yet sent: `(type, body without type and sequence_number)`.
    events: Vec<(&'static str, Value)>,
    seq: u64,
    status: &'static str,
    prompt_tokens: usize,
    usage: Option<Value>,
    incomplete: Option<Value>,
    error: Option<Value>,
    /// Token counter for `reasoning_tokens`.
    state: AppState,
    /// Alternatives per token when logprobs were asked for (`include` names
    /// `message.output_text.logprobs`).
    top_logprobs: Option<usize>,
    texts: TokenTexts,
    /// Logprobs of tokens whose text has not reached the message yet.
    pending_lp: Vec<Value>,
    /// The tools as offered: a call to a namespace's function is named as the client knows it.
    offered: Offered,
}

fn hex_id(prefix: &str) -> String {
    format!("{prefix}_{:032x}", rand::random::<u128>())
}

impl Render {
    pub(super) fn new(
        s: &AppState,
        r: &ResponsesRequest,
        raw: &Map<String, Value>,
        prompt_tokens: usize,
        shape: ChatShape,
        top_logprobs: Option<usize>,
        offered: Offered,
    ) -> Self {
        let id = hex_id("resp");
        let echo = |k: &str| raw.get(k).cloned().unwrap_or(Value::Null);
        let mut base = Map::new();
        base.insert("id".into(), json!(id));
        base.insert("object".into(), json!("response"));
        base.insert("created_at".into(), json!(now_secs()));
        base.insert("model".into(), json!(s.model_id));
        base.insert("instructions".into(), echo("instructions"));
        base.insert("metadata".into(), raw.get("metadata").cloned().unwrap_or_else(|| json!({})));
        base.insert("parallel_tool_calls".into(), json!(r.parallel_tool_calls.unwrap_or(true)));
        base.insert("temperature".into(), echo("temperature"));
        base.insert("top_p".into(), echo("top_p"));
        base.insert("tool_choice".into(), raw.get("tool_choice").cloned().unwrap_or_else(|| json!("auto")));
        base.insert("tools".into(), raw.get("tools").cloned().unwrap_or_else(|| json!([])));
        base.insert("max_output_tokens".into(), echo("max_output_tokens"));
        base.insert("previous_response_id".into(), echo("previous_response_id"));
        base.insert("reasoning".into(), echo("reasoning"));
        base.insert("store".into(), json!(r.store.unwrap_or(true) && s.responses.enabled()));
        base.insert("text".into(), raw.get("text").cloned().unwrap_or_else(|| json!({"format": {"type": "text"}})));
        base.insert("top_logprobs".into(), echo("top_logprobs"));
        base.insert("truncation".into(), json!("disabled"));
        base.insert("background".into(), json!(false));
        base.insert("user".into(), echo("user"));
        Render {
            base,
            id,
            output: Vec::new(),
            open: None,
            shaper: shape.shaper(),
            events: Vec::new(),
            seq: 0,
            status: "in_progress",
            prompt_tokens,
            usage: None,
            incomplete: None,
            error: None,
            state: s.clone(),
            top_logprobs,
            texts: TokenTexts(s.bytes_all.clone()),
            pending_lp: Vec::new(),
            offered,
        }
    }

    /// The response object now.
    pub(super) fn response(&self) -> Value {
        let mut o = self.base.clone();
        o.insert("status".into(), json!(self.status));
        o.insert("output".into(), Value::Array(self.output.clone()));
        o.insert("incomplete_details".into(), self.incomplete.clone().unwrap_or(Value::Null));
        o.insert("error".into(), self.error.clone().unwrap_or(Value::Null));
        o.insert("usage".into(), self.usage.clone().unwrap_or(Value::Null));
        Value::Object(o)
    }

    fn event(&mut self, kind: &'static str, body: Value) {
        self.events.push((kind, body));
    }

    fn index(&self) -> usize {
        self.output.len() - 1
    }

    fn item_id(&self) -> Value {
        self.output.last().map_or(Value::Null, |i| i["id"].clone())
    }

    /// Opens a new output item of `kind`, closing the open one.
    fn open(&mut self, kind: Open, item: Value) {
        self.close("completed");
        self.output.push(item.clone());
        self.open = Some(kind);
        let output_index = self.index();
        self.event("response.output_item.added", json!({"output_index": output_index, "item": item}));
        let part = match kind {
            Open::Message => json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []}),

            Open::Reasoning => json!({"type": "reasoning_text", "text": ""}),
            Open::Call => return,
        };
        let item_id = self.item_id();
        if let Some(Value::Array(c)) = self.output.last_mut().and_then(|i| i.get_mut("content")) {
            c.push(part.clone());
        }
        self.event(
            "response.content_part.added",
            json!({"item_id": item_id, "output_index": output_index, "content_index": 0, "part": part}),
        );
    }

    /// Closes the open item with `status`.
    fn close(&mut self, status: &str) {
        let Some(kind) = self.open.take() else { return };
        let output_index = self.index();
        let item_id = self.item_id();
        let Some(item) = self.output.last_mut() else { return };
        item["status"] = json!(status);
        let item = item.clone();
        match kind {
            Open::Message => {
                let part = item["content"][0].clone();
                self.event(
                    "response.output_text.done",
                    json!({"item_id": item_id, "output_index": output_index, "content_index": 0,
                           "text": part["text"], "logprobs": part["logprobs"]}),
                );
                self.event(
                    "response.content_part.done",
                    json!({"item_id": item_id, "output_index": output_index, "content_index": 0, "part": part}),
                );
            }
            Open::Reasoning => {
                let part = item["content"][0].clone();
                self.event(
                    "response.reasoning_text.done",
                    json!({"item_id": item_id, "output_index": output_index, "content_index": 0,
                           "text": part["text"]}),
                );
                self.event(
                    "response.content_part.done",
                    json!({"item_id": item_id, "output_index": output_index, "content_index": 0, "part": part}),
                );
            }
            Open::Call => {
                self.event(
                    "response.function_call_arguments.done",
                    json!({"item_id": item_id, "output_index": output_index, "name": item["name"],
                           "arguments": item["arguments"]}),
                );
            }
        }
        self.event("response.output_item.done", json!({"output_index": output_index, "item": item}));
    }

    fn append(&mut self, pointer: &str, text: &str) {
        if let Some(Value::String(s)) = self.output.last_mut().and_then(|i| i.pointer_mut(pointer)) {
            s.push_str(text);
        }
    }

    fn delta(&mut self, d: &Delta) {
        match d {
            Delta::Content(t) | Delta::Reasoning(t) if t.is_empty() => {}
            Delta::Content(t) => {
                if self.open != Some(Open::Message) {
                    let item = json!({"id": hex_id("msg"), "type": "message", "role": "assistant",
                                      "status": "in_progress", "content": []});
                    self.open(Open::Message, item);
                }
                self.append("/content/0/text", t);
                let lps = std::mem::take(&mut self.pending_lp);
                if let Some(Value::Array(all)) =
                    self.output.last_mut().and_then(|i| i.pointer_mut("/content/0/logprobs"))
                {
                    all.extend(lps.iter().cloned());
                }
                let (item_id, output_index) = (self.item_id(), self.index());
                self.event(
                    "response.output_text.delta",
                    json!({"item_id": item_id, "output_index": output_index, "content_index": 0,
                           "delta": t, "logprobs": lps}),
                );
            }
            Delta::Reasoning(t) => {
                if self.open != Some(Open::Reasoning) {
                    let item = json!({"id": hex_id("rs"), "type": "reasoning", "summary": [],
                                      "content": [], "status": "in_progress"});
                    self.open(Open::Reasoning, item);
                }
                self.append("/content/0/text", t);
                let (item_id, output_index) = (self.item_id(), self.index());
                self.event(
                    "response.reasoning_text.delta",
                    json!({"item_id": item_id, "output_index": output_index, "content_index": 0, "delta": t}),
                );
            }
            Delta::CallStart { id, name, .. } => {
                let (name, namespace) = self.offered.call_name(name);
                let mut item = json!({"id": hex_id("fc"), "type": "function_call", "status": "in_progress",
                                      "call_id": id, "name": name, "arguments": ""});
                if let Some(ns) = namespace {
                    item["namespace"] = json!(ns);
                }
                self.open(Open::Call, item);
            }
            Delta::CallArgs { text, .. } => {
                self.append("/arguments", text);
                let (item_id, output_index) = (self.item_id(), self.index());
                self.event(
                    "response.function_call_arguments.delta",
                    json!({"item_id": item_id, "output_index": output_index, "delta": text}),
                );
            }
        }
    }

    /// Adds a piece of the choice's text and the logprobs of the token it came from. A token's
    /// logprobs ride on the next `output_text` delta; those of reasoning or call text are dropped.
    fn text(&mut self, text: &str, logprob: Option<&TokenLogprob>) {
        if let (Some(e), Some(k)) = (logprob, self.top_logprobs) {
            // Through text, so the f32 values print as chat prints them (`to_value` would widen
            // them to f64 digits).
            let entry = serde_json::to_string(&logprobs::chat_entry(e, k, &self.texts));
            self.pending_lp.push(entry.ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or(Value::Null));
        }
        let deltas = self.shaper.push(text);
        for d in &deltas {
            self.delta(d);
        }
        if deltas.iter().any(|d| !matches!(d, Delta::Content(_))) {
            self.pending_lp.clear();
        }
    }

    /// Feeds one event of the choice; the finish when it is the last.
    pub(super) fn feed(&mut self, e: ChoiceEvent) -> Option<Finish> {
        match e {
            ChoiceEvent::Text { text, logprob, .. } => {
                self.text(&text, logprob.as_deref());
                None
            }
            ChoiceEvent::Prompt { .. } | ChoiceEvent::Started { .. } => None,
            ChoiceEvent::Done { finish, .. } => Some(finish),
        }
    }

    /// Ends the response: open items closed, status, usage.
    pub(super) fn finish(&mut self, f: &Finish) {
        for d in self.shaper.finish() {
            self.delta(&d);
        }
        if self.output.is_empty() {
            // Every answer has a message, even an empty one.
            let item = json!({"id": hex_id("msg"), "type": "message", "role": "assistant", "status": "in_progress", "content": []});
            self.open(Open::Message, item);
        }
        let reasoning: String = self
            .output
            .iter()
            .filter(|i| i["type"] == "reasoning")
            .filter_map(|i| i["content"][0]["text"].as_str())
            .collect();
        let reasoning_tokens = if reasoning.is_empty() {
            0
        } else {
            self.state.tokenizer.encode(&reasoning, false).map_or(0, |v| v.len())
        };
        self.usage = Some(json!({
            "input_tokens": self.prompt_tokens,
            "input_tokens_details": {"cached_tokens": f.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": f.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens.min(f.completion_tokens)},
            "total_tokens": self.prompt_tokens + f.completion_tokens,
        }));
        match (&f.error, f.reason) {
            (Some(e), _) => {
                self.close("incomplete");
                self.status = "failed";
                self.error = Some(json!({"code": "server_error", "message": e}));
            }
            (None, EndReason::Length) => {
                self.close("incomplete");
                self.status = "incomplete";
                self.incomplete = Some(json!({"reason": "max_output_tokens"}));
            }
            (None, EndReason::Abort) => {
                self.close("incomplete");
                self.status = "failed";
                self.error = Some(json!({"code": "server_error", "message": "the request was aborted"}));
            }
            (None, EndReason::Stop) => {
                self.close("completed");
                self.status = "completed";
            }
        }
        self.base.insert("completed_at".into(), json!(now_secs()));
    }

    /// The closing event's type for the status reached.
    fn closing(&self) -> &'static str {
        match self.status {
            "completed" => "response.completed",
            "incomplete" => "response.incomplete",
            _ => "response.failed",
        }
    }

    /// Renders the pending events as SSE frames (`event:` line and typed `data:`).
    fn drain(&mut self, out: &mut Vec<u8>) {
        for (kind, mut body) in std::mem::take(&mut self.events) {
            if let Value::Object(o) = &mut body {
                o.insert("type".into(), json!(kind));
                o.insert("sequence_number".into(), json!(self.seq));
            }
            self.seq += 1;
            out.extend_from_slice(format!("event: {kind}\n").as_bytes());
            // A `Value` always serializes.
            let _ = sse::push_json(out, &body);
        }
    }

    /// The assistant turn as a chat message, for the stored conversation.
    fn as_message(&self) -> ChatMessage {
        let mut m = ChatMessage::new("assistant", "");
        let mut calls = Vec::new();
        for i in &self.output {
            match i["type"].as_str() {
                Some("message") => m.content.push_str(i["content"][0]["text"].as_str().unwrap_or("")),
                Some("reasoning") => m
                    .reasoning_content
                    .get_or_insert_with(String::new)
                    .push_str(i["content"][0]["text"].as_str().unwrap_or("")),
                Some("function_call") => {
                    let a = i["arguments"].as_str().unwrap_or("");
                    let args = serde_json::from_str::<Value>(a).unwrap_or_else(|_| json!(a));
                    let name = i["name"].as_str().unwrap_or("");
                    let name = match i["namespace"].as_str() {
                        Some(ns) => flat_name(ns, name),
                        None => name.to_owned(),
                    };
                    calls.push(json!({"id": i["call_id"], "type": "function",
                                      "function": {"name": name, "arguments": args}}));
                }
                _ => {}
            }
        }
        m.tool_calls = (!calls.is_empty()).then_some(Value::Array(calls));
        m
    }
}

/// Stores the finished `response` (the object [`Render::response`] made) and its conversation.
pub(super) fn keep(s: &AppState, r: &Render, response: Value, mut history: Vec<ChatMessage>) {
    history.push(r.as_message());
    s.responses.put(r.id.clone(), Stored { response, history });
}

/// Streams the response's events.
pub(super) fn stream(
    render: Render,
    events: BoxStream<'static, ChoiceEvent>,
    keep_as: Option<(AppState, Vec<ChatMessage>)>,
) -> Response {
    struct St {
        r: Render,
        events: BoxStream<'static, ChoiceEvent>,
        keep_as: Option<(AppState, Vec<ChatMessage>)>,
        started: bool,
        done: bool,
    }
    let st = St { r: render, events, keep_as, started: false, done: false };
    let body = stream::unfold(st, |mut st| async move {
        if st.done {
            return None;
        }
        let mut out = Vec::new();
        if !st.started {
            st.started = true;
            let resp = st.r.response();
            st.r.event("response.created", json!({"response": resp}));
            st.r.event("response.in_progress", json!({"response": resp}));
            st.r.drain(&mut out);
            return Some((out, st));
        }
        let finish = match st.events.next().await {
            Some(e) => st.r.feed(e),
            None => Some(Finish {
                reason: EndReason::Abort,
                matched: None,
                completion_tokens: 0,
                cached_tokens: 0,
                storage_cached_tokens: 0,
                spec: Default::default(),
                error: Some("the engine stopped before the request finished".into()),
                overloaded: false,
            }),
        };
        if let Some(f) = finish {
            st.done = true;
            st.r.finish(&f);
            let resp = st.r.response();
            if let (Some((s, history)), "completed" | "incomplete") = (st.keep_as.take(), st.r.status) {
                keep(&s, &st.r, resp.clone(), history);
            }
            let closing = st.r.closing();
            st.r.event(closing, json!({"response": resp}));
        }
        st.r.drain(&mut out);
        Some((out, st))
    })
    .filter(|s| std::future::ready(!s.is_empty()))
    .boxed();
    sse_response(body)
}
