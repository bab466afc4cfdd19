//! [`Shaper`]: a choice's text, piece by piece, into [`Delta`]s (content, reasoning, tool calls)
//! through the reasoning split and the family's call format; the same machine for the stream and
//! the collected answer, so the two agree by construction.

use super::array::ArrayCalls;
use super::deepseek::DeepseekCalls;
use super::harmony::Harmony;
use super::llama3::Llama3Calls;
use super::phi4_mini::FunctoolsCalls;
use super::request::{ToolChoice, ToolRequest};
use super::tagged::Tagged;
use super::think::Think;
use super::{ChatParsers, ReasoningParser, ToolParser};

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
pub(super) fn call_id() -> String {
    format!("call_{:024x}", rand::random::<u128>() >> 32)
}

/// The per-choice machine: reasoning split, then tool calls.
#[derive(Debug)]
pub struct Shaper {
    pub(super) think: Option<Think>,
    pub(super) calls: Calls,
    pub(super) out: Vec<Delta>,
    pub(super) made: usize,
    pub(super) parallel: bool,
}

#[derive(Debug)]
pub(super) enum Calls {
    /// Plain content.
    Off,
    /// The model's own format.
    Tagged(Tagged),
    /// `required`: a JSON array of `{"name", "parameters"}`.
    Array(ArrayCalls),
    /// A named function: all text is its arguments.
    Named { name: String, started: bool },
    /// Llama 3's JSON calls.
    Llama3(Llama3Calls),
    /// Phi-4-mini's `functools[…]`.
    Functools(FunctoolsCalls),
    /// DeepSeek's `<｜tool▁calls▁begin｜>` block.
    Deepseek(DeepseekCalls),
    /// gpt-oss's harmony messages: reasoning, content and calls by channel and recipient.
    Harmony(Harmony),
}

impl Shaper {
    /// The machine for one choice of a request with `tools` under the server's `parsers`.
    /// `separate_reasoning: false` (SGLang's field) keeps reasoning in the content.
    pub fn new(parsers: ChatParsers, tools: Option<&ToolRequest>, separate_reasoning: bool) -> Shaper {
        let constrained = tools.is_some_and(|t| matches!(t.choice, ToolChoice::Required | ToolChoice::Named(_)));
        let calls = match tools.map(|t| (&t.choice, t)) {
            // gpt-oss: one machine splits reasoning, content and calls (a required or named
            // tool_choice's grammar forces plain JSON instead).
            _ if parsers.harmony() && !constrained => Calls::Harmony(Harmony::new(
                parsers.reasoning == Some(ReasoningParser::GptOss) && separate_reasoning,
                parsers.tool_call == Some(ToolParser::GptOss) && tools.is_some_and(|t| t.choice == ToolChoice::Auto),
            )),
            None | Some((ToolChoice::None, _)) => Calls::Off,
            Some((ToolChoice::Auto, t)) => match parsers.tool_call {
                Some(ToolParser::Llama3) => Calls::Llama3(Llama3Calls::default()),
                Some(ToolParser::Phi4Mini) => Calls::Functools(FunctoolsCalls::default()),
                Some(ToolParser::DeepseekV3) => Calls::Deepseek(DeepseekCalls::new(false)),
                Some(ToolParser::DeepseekV31) => Calls::Deepseek(DeepseekCalls::new(true)),
                Some(p) => Calls::Tagged(Tagged::new(p, t.tools.clone())),
                None => Calls::Off,
            },
            Some((ToolChoice::Required, _)) => Calls::Array(ArrayCalls::default()),
            Some((ToolChoice::Named(n), _)) => Calls::Named { name: n.clone(), started: false },
        };
        let think = match calls {
            Calls::Harmony(_) => None,
            _ => parsers.reasoning.filter(|_| separate_reasoning).map(Think::new),
        };
        Shaper { think, calls, out: Vec::new(), made: 0, parallel: tools.is_none_or(|t| t.parallel) }
    }

    /// True when the shaper does nothing (plain content), so callers can skip it.
    pub fn is_plain(&self) -> bool {
        self.think.is_none() && matches!(self.calls, Calls::Off)
    }

    /// Whether a reasoning parser runs (the message then carries `reasoning_content`).
    pub fn reasons(&self) -> bool {
        self.think.is_some() || matches!(&self.calls, Calls::Harmony(h) if h.reasons())
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
        std::mem::take(&mut self.out)
    }

    pub(super) fn calls_text(&mut self, text: &str, end: bool) {
        let mut ev = Vec::new();
        match &mut self.calls {
            Calls::Off => {
                if !text.is_empty() {
                    ev.push(Ev::Content(text.to_owned()));
                }
            }
            Calls::Tagged(t) => t.push(text, end, &mut ev),
            Calls::Array(a) => a.push(text, &mut ev),
            Calls::Llama3(l) => l.push(text, end, &mut ev),
            Calls::Functools(f) => f.push(text, end, &mut ev),
            Calls::Deepseek(d) => d.push(text, end, &mut ev),
            Calls::Harmony(h) => {
                let mut r = String::new();
                h.push(text, end, &mut r, &mut ev);
                if !r.is_empty() {
                    self.out.push(Delta::Reasoning(r));
                }
            }
            Calls::Named { name, started } => {
                if !*started && (!text.is_empty() || end) {
                    *started = true;
                    ev.push(Ev::Start(name.clone()));
                }
                if !text.is_empty() {
                    ev.push(Ev::Args(text.to_owned()));
                }
            }
        }
        for e in ev {
            match e {
                Ev::Content(t) => self.out.push(Delta::Content(t)),
                Ev::Start(name) => {
                    if self.parallel || self.made == 0 {
                        self.out.push(Delta::CallStart { index: self.made, id: call_id(), name });
                    }
                    self.made += 1;
                }
                Ev::Args(text) => {
                    if self.parallel || self.made == 1 {
                        self.out.push(Delta::CallArgs { index: self.made - 1, text });
                    }
                }
            }
        }
    }
}

/// Events of the call machines, before numbering.
pub(super) enum Ev {
    Content(String),
    Start(String),
    Args(String),
}

/// Length of the longest proper suffix of `s` that is a prefix of `tag` (text that may yet
/// become the tag, held back).
pub(super) fn partial_suffix(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&k| s.is_char_boundary(s.len() - k) && tag.starts_with(&s[s.len() - k..]))
        .unwrap_or(0)
}
