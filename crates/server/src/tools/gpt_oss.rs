//! gpt-oss's harmony format (OpenAI's `harmony` response format; SGLang's `--reasoning-parser
//! gpt-oss` and `--tool-call-parser gpt-oss`, `srt/parser/harmony_parser.py`): the answer is a
//! run of messages, each `[<|start|>{role}[ to={recipient}]]<|channel|>{channel}[ to={recipient}]
//! [<|constrain|>{format}]<|message|>{body}` closed by `<|end|>`, `<|call|>` or `<|return|>` (or
//! by the next message's `<|start|>` / `<|channel|>`, or the end of the text).
//!
//! - `analysis`: reasoning (`reasoning_content`; dropped when reasoning is not split, as
//!   SGLang's tool parser drops it);
//! - `final`, and `commentary` without a recipient (a preamble): content;
//! - a recipient `functions.{name}`: a tool call `name` whose arguments are the body (when the
//!   request has tools; otherwise the message is content as written);
//! - another recipient (a built-in tool such as `browser.search`): dropped;
//! - text outside any message: content.
//!
//! One incremental machine: markers split across pieces are held back until they complete, so
//! the output does not depend on how the text was cut (tested char by char).

use std::sync::Arc;

use serde_json::Value;

use super::format::{partial_suffix, CallMachine, Ev, ToolFormat, ToolSpec};

/// The `gpt-oss` row: its calls under `auto`, without its reasoning split (the shaper builds
/// [`Harmony`] itself, reasoning included, whenever either parser is `gpt-oss`:
/// `ChatParsers::harmony`). Tools are described in the Hermes form.
pub(super) struct GptOss;

impl ToolFormat for GptOss {
    fn names(&self) -> &'static [&'static str] {
        &["gpt-oss"]
    }

    fn machine(&self, _tools: &Arc<[ToolSpec]>) -> Box<dyn CallMachine> {
        Box::new(Harmony::new(false, true))
    }

    /// Harmony's own messages (gpt-oss's template shows calls itself; this is for one that
    /// cannot).
    fn history(&self, calls: &[(&Value, &Value)]) -> String {
        calls
            .iter()
            .map(|(n, a)| {
                let name = n.as_str().unwrap_or_default();
                format!("{START}assistant{CHANNEL}commentary to=functions.{name} {CONSTRAIN}json{MESSAGE}{a}{CALL}")
            })
            .collect()
    }
}

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const CONSTRAIN: &str = "<|constrain|>";
const END: &str = "<|end|>";
const CALL: &str = "<|call|>";
const RETURN: &str = "<|return|>";
const MARKERS: [&str; 7] = [START, CHANNEL, MESSAGE, CONSTRAIN, END, CALL, RETURN];

/// Where a message's body goes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Body {
    Reasoning,
    Content,
    Call,
    Drop,
}

#[derive(Debug)]
enum State {
    /// Between messages.
    Idle,
    /// After `<|start|>` or `<|channel|>`, reading the header up to `<|message|>`.
    Header { text: String },
    /// Inside a message's body.
    Body(Body),
}

/// The harmony machine of one choice.
#[derive(Debug)]
pub(super) struct Harmony {
    state: State,
    buf: String,
    /// Reasoning goes to `reasoning_content` (else it is dropped).
    reasoning: bool,
    /// `functions.*` messages are tool calls (else content as written).
    calls: bool,
}

impl CallMachine for Harmony {
    /// Whether the analysis channel goes to `reasoning_content`.
    fn reasons(&self) -> bool {
        self.reasoning
    }

    fn push(&mut self, text: &str, end: bool, ev: &mut Vec<Ev>) {
        self.buf.push_str(text);
        loop {
            // The first full marker: the text before it, then the marker. Without one, the text
            // but a tail that may yet become a marker ("<", "<|cha"), held until more comes.
            let first = MARKERS.iter().filter_map(|m| self.buf.find(m).map(|p| (p, *m))).min_by_key(|&(p, _)| p);
            let Some((p, m)) = first else {
                let keep =
                    if end { 0 } else { MARKERS.iter().map(|m| partial_suffix(&self.buf, m)).max().unwrap_or(0) };
                let t: String = self.buf.drain(..self.buf.len() - keep).collect();
                self.text(&t, ev);
                return;
            };
            let t: String = self.buf.drain(..p).collect();
            self.text(&t, ev);
            self.buf.drain(..m.len());
            self.marker(m, ev);
        }
    }
}

impl Harmony {
    /// The machine of one choice: `reasoning` to `reasoning_content` (else dropped),
    /// `functions.*` messages as calls when `calls` (else content as written).
    pub(super) fn new(reasoning: bool, calls: bool) -> Harmony {
        Harmony { state: State::Idle, buf: String::new(), reasoning, calls }
    }

    /// Text in the current state.
    fn text(&mut self, t: &str, ev: &mut Vec<Ev>) {
        if t.is_empty() {
            return;
        }
        match &mut self.state {
            State::Idle => ev.push(Ev::Content(t.to_owned())),
            State::Header { text } => text.push_str(t),
            State::Body(Body::Reasoning) => ev.push(Ev::Reasoning(t.to_owned())),
            State::Body(Body::Content) => ev.push(Ev::Content(t.to_owned())),
            State::Body(Body::Call) => ev.push(Ev::Args(t.to_owned())),
            State::Body(Body::Drop) => {}
        }
    }

    fn marker(&mut self, m: &str, ev: &mut Vec<Ev>) {
        let state = std::mem::replace(&mut self.state, State::Idle);
        self.state = match (state, m) {
            // A header continues across `<|channel|>` (after `<|start|>assistant`) and
            // `<|constrain|>`; the channel marker is kept to find the channel name.
            (State::Header { mut text }, CHANNEL) => {
                text.push_str(CHANNEL);
                State::Header { text }
            }
            (State::Header { text }, CONSTRAIN) => State::Header { text: text + " " + CONSTRAIN },
            (State::Header { text }, MESSAGE) => State::Body(self.open(&text, ev)),
            // A message's end, or the next message starting without one (implicit close).
            (_, START) => State::Header { text: String::new() },
            (_, CHANNEL) => State::Header { text: CHANNEL.to_owned() },
            (_, END | CALL | RETURN) => State::Idle,
            // `<|message|>` with no header: plain content.
            (State::Idle, MESSAGE) => State::Body(Body::Content),
            (s, _) => s,
        };
    }

    /// The body kind of a message with header `h` (`assistant<|channel|>commentary to=…`).
    fn open(&self, h: &str, ev: &mut Vec<Ev>) -> Body {
        let recipient = h.split_whitespace().find_map(|w| w.strip_prefix("to=")).map(|r| {
            // `to=functions.f<|channel|>commentary`: the recipient ends at a marker.
            r.split("<|").next().unwrap_or(r).to_owned()
        });
        let channel = h
            .rsplit_once(CHANNEL)
            .map(|(_, c)| c.split_whitespace().next().unwrap_or("").split("<|").next().unwrap_or("").to_owned())
            .unwrap_or_default();
        match (recipient.as_deref(), channel.as_str()) {
            (Some(r), _) => match r.strip_prefix("functions.") {
                Some(name) if self.calls => {
                    ev.push(Ev::Start(name.to_owned()));
                    Body::Call
                }
                Some(_) => Body::Content,
                None => Body::Drop,
            },
            (None, "analysis") if self.reasoning => Body::Reasoning,
            (None, "final" | "commentary") => Body::Content,
            _ => Body::Drop,
        }
    }
}
