//! A Messages API answer: content blocks (`thinking`, `text`, `tool_use`) built from a
//! choice's [`Delta`]s, with the stream events each step makes (`content_block_start`,
//! `content_block_delta` with `text_delta` / `thinking_delta` / `input_json_delta`,
//! `content_block_stop`) between `message_start` + `ping` and `message_delta` +
//! `message_stop`. The non-streamed message is the same machine's final state.

use super::super::frames::sse_response;
use crate::chat::ChatShape;
use crate::error::ApiError;
use crate::gen::{ChoiceEvent, EndReason, Finish};
use crate::tools::{Delta, Shaper};
use axum::response::Response;
use futures_util::stream::{self, BoxStream, StreamExt};
use serde_json::{json, Value};
use sparrow_protocol::anthropic::ErrorBody;
use sparrow_protocol::openai::MatchedStop;
use sparrow_protocol::sse;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Thinking,
    Text,
    ToolUse,
}

/// One message being built.
pub(super) struct Render {
    id: String,
    model: String,
    content: Vec<Value>,
    /// The open tool_use block's arguments text (parsed into `input` when it closes).
    args: String,
    open: Option<Open>,
    shaper: Shaper,
    events: Vec<(&'static str, Value)>,
    prompt_tokens: usize,
    stop_reason: Option<&'static str>,
    stop_sequence: Option<String>,
    usage: Value,
}

impl Render {
    /// A message answered as `model` (the request's name for the served model).
    pub(super) fn new(model: String, prompt_tokens: usize, shape: ChatShape) -> Self {
        Render {
            id: format!("msg_{:024x}", rand::random::<u128>() >> 32),
            model,
            content: Vec::new(),
            args: String::new(),
            open: None,
            shaper: shape.shaper(),
            events: Vec::new(),
            prompt_tokens,
            stop_reason: None,
            stop_sequence: None,
            usage: json!({"input_tokens": prompt_tokens, "output_tokens": 0,
                          "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}),
        }
    }

    /// The message object now.
    pub(super) fn message(&self) -> Value {
        json!({
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": self.content,
            "stop_reason": self.stop_reason,
            "stop_sequence": self.stop_sequence,
            "usage": self.usage,
        })
    }

    fn open(&mut self, kind: Open, block: Value) {
        self.close();
        self.content.push(block.clone());
        self.open = Some(kind);
        let index = self.content.len() - 1;
        self.event("content_block_start", json!({"index": index, "content_block": block}));
    }

    fn close(&mut self) {
        let Some(kind) = self.open.take() else { return };
        let index = self.content.len() - 1;
        if kind == Open::ToolUse {
            let args = std::mem::take(&mut self.args);
            let input = serde_json::from_str::<Value>(&args).ok().filter(Value::is_object).unwrap_or_else(|| json!({}));
            if let Some(b) = self.content.last_mut() {
                b["input"] = input;
            }
        }
        self.event("content_block_stop", json!({"index": index}));
    }

    fn event(&mut self, kind: &'static str, body: Value) {
        self.events.push((kind, body));
    }

    fn delta(&mut self, d: &Delta) {
        let index = self.content.len().saturating_sub(1);
        match d {
            Delta::Content(t) | Delta::Reasoning(t) if t.is_empty() => {}
            Delta::Content(t) => {
                if self.open != Some(Open::Text) {
                    self.open(Open::Text, json!({"type": "text", "text": ""}));
                }
                let index = self.content.len() - 1;
                if let Some(Value::String(s)) = self.content.last_mut().and_then(|b| b.get_mut("text")) {
                    s.push_str(t);
                }
                self.event("content_block_delta", json!({"index": index, "delta": {"type": "text_delta", "text": t}}));
            }
            Delta::Reasoning(t) => {
                if self.open != Some(Open::Thinking) {
                    self.open(Open::Thinking, json!({"type": "thinking", "thinking": "", "signature": ""}));
                }
                let index = self.content.len() - 1;
                if let Some(Value::String(s)) = self.content.last_mut().and_then(|b| b.get_mut("thinking")) {
                    s.push_str(t);
                }
                self.event(
                    "content_block_delta",
                    json!({"index": index, "delta": {"type": "thinking_delta", "thinking": t}}),
                );
            }
            Delta::CallStart { id, name, .. } => {
                let id = id.replacen("call_", "toolu_", 1);
                self.open(Open::ToolUse, json!({"type": "tool_use", "id": id, "name": name, "input": {}}));
            }
            Delta::CallArgs { text, .. } => {
                self.args.push_str(text);
                self.event(
                    "content_block_delta",
                    json!({"index": index, "delta": {"type": "input_json_delta", "partial_json": text}}),
                );
            }
        }
    }

    fn text(&mut self, text: &str) {
        for d in self.shaper.push(text) {
            self.delta(&d);
        }
    }

    /// Feeds one event of the choice; the finish when it is the last.
    pub(super) fn feed(&mut self, e: ChoiceEvent) -> Option<Finish> {
        match e {
            ChoiceEvent::Text { text, .. } => {
                self.text(&text);
                None
            }
            ChoiceEvent::Started { cached_tokens, .. } => {
                self.usage = self.usage_with(cached_tokens, 0);
                None
            }
            ChoiceEvent::Prompt { .. } => None,
            ChoiceEvent::Done { finish, .. } => Some(finish),
        }
    }

    /// Ends the message: blocks closed, `stop_reason`, usage.
    pub(super) fn finish(&mut self, f: &Finish) {
        for d in self.shaper.finish() {
            self.delta(&d);
        }
        self.close();
        let calls = self.content.iter().any(|b| b["type"] == "tool_use");
        self.stop_reason = Some(match (f.reason, &f.matched) {
            (EndReason::Length, _) => "max_tokens",
            (_, _) if calls => "tool_use",
            (EndReason::Stop, Some(MatchedStop::Text(s))) => {
                self.stop_sequence = Some(s.clone());
                "stop_sequence"
            }
            _ => "end_turn",
        });
        self.usage = self.usage_with(f.cached_tokens, f.completion_tokens);
    }

    /// `usage`: Anthropic's `input_tokens` are the uncached prompt tokens; cached ones are a read.
    fn usage_with(&self, cached: usize, output: usize) -> Value {
        let cached = cached.min(self.prompt_tokens);
        json!({"input_tokens": self.prompt_tokens - cached, "output_tokens": output,
               "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached})
    }

    fn drain(&mut self, out: &mut Vec<u8>) {
        for (kind, mut body) in std::mem::take(&mut self.events) {
            if let Value::Object(o) = &mut body {
                o.insert("type".into(), json!(kind));
            }
            push_event(out, kind, &body);
        }
    }
}

fn push_event(out: &mut Vec<u8>, kind: &str, body: &Value) {
    out.extend_from_slice(format!("event: {kind}\n").as_bytes());
    // A `Value` always serializes.
    let _ = sse::push_json(out, body);
}

/// Streams the message's events.
pub(super) fn stream(render: Render, events: BoxStream<'static, ChoiceEvent>) -> Response {
    struct St {
        r: Render,
        events: BoxStream<'static, ChoiceEvent>,
        started: bool,
        done: bool,
    }
    let st = St { r: render, events, started: false, done: false };
    let body = stream::unfold(st, |mut st| async move {
        if st.done {
            return None;
        }
        let mut out = Vec::new();
        let mut next = st.events.next().await;
        if !st.started {
            // `message_start` waits for the request's first event (normally `Started`, once the
            // request is scheduled), so its usage already splits cached from uncached input as
            // `message_delta` and the non-streamed body do.
            st.started = true;
            let first_is_start = matches!(next, Some(ChoiceEvent::Started { .. }));
            if let Some(e) = next.take_if(|e| matches!(e, ChoiceEvent::Started { .. })) {
                st.r.feed(e);
            }
            let msg = st.r.message();
            st.r.event("message_start", json!({"message": msg}));
            st.r.event("ping", json!({}));
            st.r.drain(&mut out);
            if first_is_start {
                return Some((out, st));
            }
        }
        let finish = match next {
            Some(e) => st.r.feed(e).map(Some),
            None => Some(None),
        };
        match finish {
            None => {}
            Some(Some(finish)) if finish.error.is_none() => {
                st.done = true;
                st.r.finish(&finish);
                let delta = json!({"delta": {"stop_reason": st.r.stop_reason, "stop_sequence": st.r.stop_sequence},
                                   "usage": st.r.usage});
                st.r.event("message_delta", delta);
                st.r.event("message_stop", json!({}));
            }
            Some(other) => {
                st.done = true;
                st.r.drain(&mut out);
                let e = match other {
                    Some(finish) => finish.api_error().unwrap_or(ApiError::Engine(String::new())),
                    None => ApiError::Engine("the engine stopped before the request finished".into()),
                };
                let err =
                    serde_json::to_value(ErrorBody::new(super::error_type(&e), e.to_string())).unwrap_or(Value::Null);
                push_event(&mut out, "error", &err);
                return Some((out, st));
            }
        }
        st.r.drain(&mut out);
        Some((out, st))
    })
    .filter(|s| std::future::ready(!s.is_empty()))
    .boxed();
    sse_response(body)
}
