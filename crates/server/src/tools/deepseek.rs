//! DeepSeek's block of tool calls, shared by `deepseekv3` and `deepseekv31` (each reads its own
//! call body, [`CallBody`]): `<｜tool▁calls▁begin｜>` … `<｜tool▁calls▁end｜>` around calls
//! `<｜tool▁call▁begin｜>` … `<｜tool▁call▁end｜>` (SGLang's `deepseekv3_detector.py` and
//! `deepseekv31_detector.py`).
//!
//! Text before the block (and after it) is content, without the whitespace that only
//! separates it from the block (SGLang strips the text around the calls). Each call is given whole when its end
//! marker arrives; a reply cut off inside a call that has its name keeps it with the arguments
//! so far (the finish reason says `length`), one cut off before the name gives its text back as
//! content.

use super::format::{partial_suffix, CallMachine, Ev};

/// Opens the block of calls.
pub(super) const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
/// Closes the block.
pub(super) const CALLS_END: &str = "<｜tool▁calls▁end｜>";
/// Opens one call.
pub(super) const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
/// Closes one call.
pub(super) const CALL_END: &str = "<｜tool▁call▁end｜>";
/// Separates a call's type (V3) or name (V3.1) from the rest.
pub(super) const TOOL_SEP: &str = "<｜tool▁sep｜>";

/// A call's `(name, arguments)` from its body (between the call markers); `whole`: the body is
/// complete, else cut off. `None`: no call (its text is content).
pub(super) type CallBody = fn(body: &str, whole: bool) -> Option<(String, String)>;

/// The call machine of a DeepSeek format, its calls read by `body`.
#[derive(Debug)]
pub(super) struct DeepseekCalls {
    body: CallBody,
    /// Text not yet given out: content that may begin the block, or the block so far.
    held: String,
    /// Trailing content whitespace, held until it is known not to precede the block (SGLang
    /// strips the text before the calls).
    ws: String,
    /// Whether the block is open.
    inside: bool,
    /// After the block: whitespace is dropped until the text resumes (however it arrives).
    after: bool,
}

impl DeepseekCalls {
    pub(super) fn new(body: CallBody) -> DeepseekCalls {
        DeepseekCalls { body, held: String::new(), ws: String::new(), inside: false, after: false }
    }
}

impl CallMachine for DeepseekCalls {
    fn push(&mut self, text: &str, end: bool, ev: &mut Vec<Ev>) {
        self.held.push_str(text);
        loop {
            if !self.inside {
                if self.after {
                    let rest = self.held.trim_start().len();
                    self.held.drain(..self.held.len() - rest);
                    if self.held.is_empty() {
                        return;
                    }
                    self.after = false;
                }
                if let Some(p) = self.held.find(CALLS_BEGIN) {
                    let before = self.held[..p].trim_end();
                    if !before.is_empty() {
                        ev.push(Ev::Content(format!("{}{before}", std::mem::take(&mut self.ws))));
                    }
                    self.ws.clear();
                    self.held.drain(..p + CALLS_BEGIN.len());
                    self.inside = true;
                    continue;
                }
                let keep = if end { 0 } else { partial_suffix(&self.held, CALLS_BEGIN) };
                let out = self.held.len() - keep;
                let text: String = self.held.drain(..out).collect();
                let body = if end { text.as_str() } else { text.trim_end() };
                if !body.is_empty() {
                    ev.push(Ev::Content(format!("{}{body}", std::mem::take(&mut self.ws))));
                }
                self.ws.push_str(&text[body.len()..]);
                if end && !self.ws.is_empty() {
                    ev.push(Ev::Content(std::mem::take(&mut self.ws)));
                }
                return;
            }
            let lead = self.held.len() - self.held.trim_start().len();
            let body = &self.held[lead..];
            if body.starts_with(CALLS_END) {
                self.held.drain(..lead + CALLS_END.len());
                self.inside = false;
                self.after = true;
                continue;
            }
            if let Some(p) = body.find(CALL_END) {
                let call = body[..p].strip_prefix(CALL_BEGIN).unwrap_or(&body[..p]);
                match (self.body)(call, true) {
                    Some((name, args)) => {
                        ev.push(Ev::Start(name));
                        ev.push(Ev::Args(args));
                    }
                    None => ev.push(Ev::Content(call.to_owned())),
                }
                self.held.drain(..lead + p + CALL_END.len());
                continue;
            }
            if end {
                let call = body.strip_prefix(CALL_BEGIN).unwrap_or(body);
                match (self.body)(call, false) {
                    Some((name, args)) => {
                        ev.push(Ev::Start(name));
                        ev.push(Ev::Args(args));
                    }
                    None if !call.trim().is_empty() => ev.push(Ev::Content(call.to_owned())),
                    None => {}
                }
                self.held.clear();
            }
            return;
        }
    }
}

/// Earlier calls, each already in its format's body, written as one block, `sep` between calls.
pub(super) fn history_block(calls: impl Iterator<Item = String>, sep: &str) -> String {
    let body: Vec<String> = calls.map(|c| format!("{CALL_BEGIN}{c}{CALL_END}")).collect();
    format!("\n{CALLS_BEGIN}{}{CALLS_END}", body.join(sep))
}
