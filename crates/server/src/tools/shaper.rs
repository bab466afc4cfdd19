//! [`Shaper`]: a choice's text, piece by piece, into [`Delta`]s (content, reasoning, tool calls)
//! through the reasoning split and a call machine (the format's under `auto`, the constrained
//! shapes under `required` or a named function); the same machine for the stream and the
//! collected answer, so the two agree by construction.

use super::array::ArrayCalls;
use super::format::{CallMachine, Ev};
use super::gpt_oss::Harmony;
use super::parser::{ChatParsers, ReasoningParser, ToolParser};
use super::request::{ToolChoice, ToolRequest};
use super::think::Think;
use crate::reqlog::LogTag;

/// What a piece of a choice's text adds to its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    /// Answer text (`content`).
    Content(String),
    /// Reasoning text (`reasoning_content`).
    Reasoning(String),
    /// A tool call begins: its index among the choice's calls, id and function name.
    CallStart {
        /// From 0.
        index: usize,
        /// `call_` and 24 hex digits.
        id: String,
        /// The function.
        name: String,
    },
    /// More of call `index`'s `arguments` string.
    CallArgs {
        /// From 0.
        index: usize,
        /// The next characters of the arguments JSON.
        text: String,
    },
}

/// A finished choice's message, folded from its [`Delta`]s.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Message {
    /// The answer text.
    pub content: String,
    /// The reasoning text, when a reasoning parser ran.
    pub reasoning: Option<String>,
    /// `(id, name, arguments)` of each call.
    pub calls: Vec<(String, String, String)>,
}

impl Message {
    /// Folds deltas into the message.
    pub fn add(&mut self, d: &[Delta]) {
        for d in d {
            match d {
                Delta::Content(t) => self.content.push_str(t),
                Delta::Reasoning(t) => self.reasoning.get_or_insert_with(String::new).push_str(t),
                Delta::CallStart { id, name, .. } => self.calls.push((id.clone(), name.clone(), String::new())),
                Delta::CallArgs { index, text } => {
                    if let Some(c) = self.calls.get_mut(*index) {
                        c.2.push_str(text);
                    }
                }
            }
        }
    }
}

/// A fresh OpenAI-style tool call id.
fn call_id() -> String {
    format!("call_{:024x}", rand::random::<u128>() >> 32)
}

/// The per-choice machine: reasoning split, then tool calls.
#[derive(Debug)]
pub struct Shaper {
    think: Option<Think>,
    /// `None`: plain content.
    calls: Option<Box<dyn CallMachine>>,
    out: Vec<Delta>,
    made: usize,
    parallel: bool,
    /// The request log's tag, and the call being parsed: `(name, arguments so far)`.
    log: Option<(LogTag, Option<(String, String)>)>,
}

impl Shaper {
    /// The machine for one choice of a request with `tools` under the server's `parsers`.
    /// `separate_reasoning: false` (SGLang's field) keeps reasoning in the content.
    pub fn new(parsers: ChatParsers, tools: Option<&ToolRequest>, separate_reasoning: bool) -> Shaper {
        let constrained = tools.is_some_and(|t| matches!(t.choice, ToolChoice::Required | ToolChoice::Named(_)));
        // gpt-oss: one machine splits reasoning, content and calls (a required or named
        // tool_choice's grammar forces plain JSON instead).
        let harmony = parsers.harmony() && !constrained;
        let calls: Option<Box<dyn CallMachine>> = match tools.map(|t| (&t.choice, t)) {
            _ if harmony => Some(Box::new(Harmony::new(
                parsers.reasoning == Some(ReasoningParser::GptOss) && separate_reasoning,
                parsers.tool_call == Some(ToolParser::GptOss) && tools.is_some_and(|t| t.choice == ToolChoice::Auto),
            ))),
            None | Some((ToolChoice::None, _)) => None,
            Some((ToolChoice::Auto, t)) => parsers.tool_call.map(|p| p.format().machine(&t.tools)),
            Some((ToolChoice::Required, _)) => Some(Box::<ArrayCalls>::default()),
            Some((ToolChoice::Named(n), _)) => Some(Box::new(Named { name: n.clone(), started: false })),
        };
        let think = if harmony {
            None
        } else {
            parsers.reasoning.filter(|_| separate_reasoning).map(|p| Think::new(p.starts_inside()))
        };
        Shaper { think, calls, out: Vec::new(), made: 0, parallel: tools.is_none_or(|t| t.parallel), log: None }
    }

    /// `true`: the prompt opened `<think>`, so the answer starts inside the reasoning
    /// (`crate::chat::opens_think`) whatever the parser's default.
    pub fn opened(mut self, yes: bool) -> Shaper {
        if yes && self.think.is_some() {
            self.think = Some(Think::new(true));
        }
        self
    }

    /// Logs every call it parses under `tag` (the request log), when given.
    pub fn logged(mut self, tag: Option<LogTag>) -> Shaper {
        self.log = tag.map(|t| (t, None));
        self
    }

    /// Logs the call parsed last, if any.
    fn log_call(&mut self) {
        if let Some((t, Some((name, args)))) = &mut self.log {
            t.call(name, args);
            self.log = Some((*t, None));
        }
    }

    /// True when the shaper does nothing (plain content), so callers can skip it.
    pub fn is_plain(&self) -> bool {
        self.think.is_none() && self.calls.is_none()
    }

    /// Whether a reasoning parser runs (the message then carries `reasoning_content`).
    pub fn reasons(&self) -> bool {
        self.think.is_some() || self.calls.as_ref().is_some_and(|c| c.reasons())
    }

    /// How many tool calls have started.
    pub fn calls_made(&self) -> usize {
        self.made
    }

    /// Feeds the next text; returns what it adds.
    pub fn push(&mut self, text: &str) -> Vec<Delta> {
        let mut content = String::new();
        match &mut self.think {
            Some(t) => {
                let mut r = String::new();
                t.push(text, &mut r, &mut content);
                if !r.is_empty() {
                    self.out.push(Delta::Reasoning(r));
                }
            }
            None => content.push_str(text),
        }
        self.calls_text(&content, false);
        std::mem::take(&mut self.out)
    }

    /// Flushes what was held back at the end of the text.
    pub fn finish(&mut self) -> Vec<Delta> {
        let mut content = String::new();
        if let Some(t) = &mut self.think {
            let mut r = String::new();
            t.finish(&mut r, &mut content);
            if !r.is_empty() {
                self.out.push(Delta::Reasoning(r));
            }
        }
        self.calls_text(&content, true);
        self.log_call();
        std::mem::take(&mut self.out)
    }

    fn calls_text(&mut self, text: &str, end: bool) {
        let mut ev = Vec::new();
        match &mut self.calls {
            None if !text.is_empty() => ev.push(Ev::Content(text.to_owned())),
            None => {}
            Some(c) => c.push(text, end, &mut ev),
        }
        // A machine's reasoning comes first, as one piece.
        let reasoning: String =
            ev.iter().filter_map(|e| if let Ev::Reasoning(r) = e { Some(r.as_str()) } else { None }).collect();
        if !reasoning.is_empty() {
            self.out.push(Delta::Reasoning(reasoning));
        }
        for e in ev {
            match e {
                Ev::Content(t) => self.out.push(Delta::Content(t)),
                Ev::Reasoning(_) => {}
                Ev::Start(name) => {
                    self.log_call();
                    if let Some((_, call)) = &mut self.log {
                        *call = Some((name.clone(), String::new()));
                    }
                    if self.parallel || self.made == 0 {
                        self.out.push(Delta::CallStart { index: self.made, id: call_id(), name });
                    }
                    self.made += 1;
                }
                Ev::Args(text) => {
                    if let Some((_, Some((_, args)))) = &mut self.log {
                        args.push_str(&text);
                    }
                    if self.parallel || self.made == 1 {
                        self.out.push(Delta::CallArgs { index: self.made - 1, text });
                    }
                }
            }
        }
    }
}

/// A named `tool_choice`: all the text is that function's arguments (its grammar makes them).
#[derive(Debug)]
struct Named {
    name: String,
    started: bool,
}

impl CallMachine for Named {
    fn push(&mut self, text: &str, end: bool, ev: &mut Vec<Ev>) {
        if !self.started && (!text.is_empty() || end) {
            self.started = true;
            ev.push(Ev::Start(self.name.clone()));
        }
        if !text.is_empty() {
            ev.push(Ev::Args(text.to_owned()));
        }
    }
}
