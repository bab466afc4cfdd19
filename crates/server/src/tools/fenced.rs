//! Hermes calls written without their `<tool_call>` tags: small Qwen2.5-Coder models, given
//! Claude Code's or Codex's long tool lists, answer with
//! ```` ```json {"name": "Write", "arguments": {…}} ``` ```` (or a list of such objects), or
//! with the bare object on a line of its own, more often than with the tags their template asks
//! for. llama.cpp's Hermes 2 Pro parser took the same openings (`common/chat.cpp` before its
//! PEG rewrite: an optional ```` ```json ```` or ```` ```xml ```` fence, an optional tag, then
//! `{"name"`); so does [`Fenced`], in front of the tagged machine.
//!
//! Only a fence whose whole body is JSON naming offered tools (with their arguments, or none),
//! or a bare object at a line start that begins `{"name": <an offered tool>, "arguments"`, is a
//! call; any other fence or object (code, JSON that is not a call, a name that is not a tool)
//! is content, given back unchanged. Text is held back only while it can still turn out to be a
//! call: a fence's language tag must be empty or `json` and its body must open with `{` or `[`;
//! a name that is not offered releases it at once.

use std::sync::Arc;

use serde_json::Value;

use super::format::{partial_suffix, CallMachine, Ev, ToolSpec};
use super::json_scan::{call_header, Header, ValueScan};
use super::tagged::{CALL_END, CALL_START};

const FENCE: &str = "```";

/// What a held fence turned out to be, so far.
enum Verdict {
    /// Not decided: more text is needed.
    Wait,
    /// Not a call: the first `n` bytes of the buffer are content.
    Content(usize),
    /// Calls `(name, arguments JSON)`, and the bytes of the buffer they took.
    Calls(Vec<(String, String)>, usize),
}

/// `auto` for Hermes formats: fenced JSON calls, the rest through `inner` (the tagged machine).
#[derive(Debug)]
pub(super) struct Fenced {
    tools: Arc<[ToolSpec]>,
    inner: Box<dyn CallMachine>,
    buf: String,
    /// `buf` starts with a fence that may be a call.
    holding: bool,
    /// `<tool_call>` blocks opened minus closed in the text given to `inner` (a fence inside a
    /// tagged call is the call's business).
    open_tags: isize,
    /// Whitespace before a held fence: dropped if the fence is a call (as the tagged machine
    /// drops the whitespace around calls), else content.
    ws: String,
    /// Right after a fenced call: leading whitespace is dropped.
    after_call: bool,
    /// The text given out so far ends a line (or none was): a `{` here may open a bare call.
    line_start: bool,
    /// The last characters given out, so a tag split across pieces is counted.
    tail: String,
}

impl Fenced {
    /// Fenced calls to `tools` in front of `inner`.
    pub(super) fn new(tools: Arc<[ToolSpec]>, inner: Box<dyn CallMachine>) -> Fenced {
        Fenced {
            tools,
            inner,
            buf: String::new(),
            holding: false,
            open_tags: 0,
            ws: String::new(),
            after_call: false,
            line_start: true,
            tail: String::new(),
        }
    }

    /// Gives the held whitespace and the first `n` bytes of the buffer to the inner machine.
    fn pass(&mut self, n: usize, ev: &mut Vec<Ev>) {
        let mut text = std::mem::take(&mut self.ws);
        text.extend(self.buf.drain(..n));
        if let Some(c) = text.chars().last() {
            self.line_start = c == '\n';
        }
        let joined = format!("{}{text}", self.tail);
        self.open_tags += tag_balance(&joined) - tag_balance(&self.tail);
        let keep = joined.char_indices().rev().nth(CALL_END.len() - 2).map_or(0, |(i, _)| i);
        self.tail = joined[keep..].to_owned();
        if !text.is_empty() {
            self.inner.push(&text, false, ev);
        }
    }

    fn offered(&self, name: &str) -> bool {
        self.tools.iter().any(|t| t.name == name)
    }

    /// Where the next possible call opens: a fence, or `{` with only whitespace before it on its
    /// line; never inside a tagged call.
    fn candidate(&self) -> Option<usize> {
        let held_line_start = self.ws.contains('\n') || self.line_start;
        let bare = self.buf.match_indices('{').map(|(i, _)| i).filter(|&i| {
            let (line, starts) = match self.buf[..i].rfind('\n') {
                Some(nl) => (&self.buf[nl + 1..i], true),
                None => (&self.buf[..i], held_line_start),
            };
            starts && line.trim().is_empty()
        });
        let mut at: Vec<usize> = self.buf.match_indices(FENCE).map(|(i, _)| i).chain(bare).collect();
        at.sort_unstable();
        at.into_iter().find(|&p| self.open_tags + tag_balance(&self.buf[..p]) <= 0)
    }

    /// A held bare object (the buffer starts with `{`) read as far as it goes.
    fn bare_verdict(&self, end: bool) -> Verdict {
        match call_header(&self.buf) {
            Header::Yes { name, .. } if self.offered(&name) => {}
            Header::More if !end => return Verdict::Wait,
            _ => return Verdict::Content(1),
        }
        let mut scan = ValueScan::default();
        let n = scan.feed(&self.buf);
        if !scan.done {
            return if end { Verdict::Content(self.buf.len()) } else { Verdict::Wait };
        }
        match self.calls(&self.buf[..n]) {
            Some(calls) => Verdict::Calls(calls, n),
            None => Verdict::Content(n),
        }
    }

    /// The held text (a fence, or a bare object) read as far as it goes.
    fn verdict(&self, end: bool) -> Verdict {
        if self.buf.starts_with('{') {
            return self.bare_verdict(end);
        }
        let after = &self.buf[FENCE.len()..];
        let lang_len = after.find(|c: char| !c.is_ascii_alphanumeric()).unwrap_or(after.len());
        let lang = &after[..lang_len];
        let opener = FENCE.len() + lang_len;
        if !"json".starts_with(&lang.to_ascii_lowercase()) {
            return Verdict::Content(opener);
        }
        let rest = &after[lang_len..];
        let body = rest.trim_start();
        if body.is_empty() || (lang.len() < 4 && rest.is_empty()) {
            return if end { Verdict::Content(self.buf.len()) } else { Verdict::Wait };
        }
        if !body.starts_with('{') && !body.starts_with('[') {
            return Verdict::Content(opener);
        }
        let start = self.buf.len() - body.len();
        if let Header::Yes { name, .. } = call_header(body) {
            if !self.offered(&name) {
                return Verdict::Content(opener);
            }
        }
        let (json, took) = match body.find(FENCE) {
            Some(q) => (&body[..q], start + q + FENCE.len()),
            None if end => (body, self.buf.len()),
            None => return Verdict::Wait,
        };
        // The fence's first JSON value is read: stray closers a small model adds after a
        // complete call (`}]}`) are dropped with the fence.
        let mut scan = ValueScan::default();
        let first = &json[..scan.feed(json)];
        match self.calls(first).or_else(|| self.calls(json)) {
            Some(calls) => Verdict::Calls(calls, took),
            None => Verdict::Content(took),
        }
    }

    /// `json` as calls to offered tools: one `{"name", "arguments"|"parameters"}` object or a
    /// list of them (a call with neither key has no arguments, `{}`: small models write
    /// `{"name": "TaskStop"}`); `None` when it is anything else (an object with other keys too).
    fn calls(&self, json: &str) -> Option<Vec<(String, String)>> {
        let one = |v: &Value| -> Option<(String, String)> {
            let o = v.as_object()?;
            let name = o.get("name").and_then(Value::as_str).filter(|n| self.offered(n))?;
            match o.get("arguments").or_else(|| o.get("parameters")) {
                Some(a) if a.is_object() => Some((name.to_owned(), a.to_string())),
                None if o.len() == 1 => Some((name.to_owned(), "{}".to_owned())),
                _ => None,
            }
        };
        match serde_json::from_str::<Value>(json.trim()).ok()? {
            Value::Array(a) if !a.is_empty() => a.iter().map(one).collect(),
            v @ Value::Object(_) => one(&v).map(|c| vec![c]),
            _ => None,
        }
    }
}

/// `<tool_call>` tags opened minus closed in `text`.
fn tag_balance(text: &str) -> isize {
    text.matches(CALL_START).count() as isize - text.matches(CALL_END).count() as isize
}

impl CallMachine for Fenced {
    fn push(&mut self, text: &str, end: bool, ev: &mut Vec<Ev>) {
        self.buf.push_str(text);
        loop {
            if self.after_call {
                let t = self.buf.trim_start().len();
                self.buf.drain(..self.buf.len() - t);
                if self.buf.is_empty() {
                    break;
                }
                self.after_call = false;
            }
            if !self.holding {
                match self.candidate() {
                    Some(p) => {
                        let content = self.buf[..p].trim_end().len();
                        if content > 0 {
                            self.pass(content, ev);
                        }
                        let w: String = self.buf.drain(..p - content).collect();
                        self.ws.push_str(&w);
                        self.holding = true;
                    }
                    None => {
                        let keep = if end || self.open_tags > 0 { 0 } else { partial_suffix(&self.buf, FENCE) };
                        let upto = self.buf.len() - keep;
                        if end {
                            self.pass(upto, ev);
                        } else {
                            // Trailing whitespace waits: it is dropped if a fenced call follows.
                            let content = self.buf[..upto].trim_end().len();
                            if content > 0 {
                                self.pass(content, ev);
                            }
                            let w: String = self.buf.drain(..upto - content).collect();
                            self.ws.push_str(&w);
                        }
                        break;
                    }
                }
            }
            match self.verdict(end) {
                Verdict::Wait => break,
                Verdict::Content(n) => {
                    self.holding = false;
                    self.pass(n, ev);
                }
                Verdict::Calls(calls, took) => {
                    self.holding = false;
                    self.after_call = true;
                    self.ws.clear();
                    self.buf.drain(..took);
                    for (name, args) in calls {
                        ev.push(Ev::Start(name));
                        ev.push(Ev::Args(args));
                    }
                }
            }
        }
        if end {
            self.inner.push("", true, ev);
        }
    }
}
