//! The `<tool_call>…</tool_call>` block around a call, shared by the formats that use it
//! (`qwen25`'s JSON, `glm45`'s `<arg_key>`/`<arg_value>` pairs): [`Tagged`] finds the blocks in
//! the content and hands each block's inside to the format's [`Block`].

use std::sync::Arc;

use super::format::{partial_suffix, CallMachine, Ev, ToolSpec};

/// Opens a call.
pub(super) const CALL_START: &str = "<tool_call>";

/// Closes a call.
pub(super) const CALL_END: &str = "</tool_call>";

/// What closes an arguments object sent member by member (`glm45`'s pairs, `qwen3_coder`'s
/// parameters): `{}` when no member was sent, else `}`.
pub(super) fn close_members(sent: usize) -> &'static str {
    if sent == 0 {
        "{}"
    } else {
        "}"
    }
}

/// The inside of one `<tool_call>` block, in a format's dialect.
pub(super) trait Block: std::fmt::Debug + Default + Send {
    /// Feeds the block's text; returns what follows `</tool_call>` once the block closes.
    fn push(&mut self, text: &str, tools: &[ToolSpec], ev: &mut Vec<Ev>) -> Option<String>;

    /// The answer ended inside the block (cut off: the finish reason says `length`).
    fn cut(&mut self, tools: &[ToolSpec], ev: &mut Vec<Ev>);
}

/// `auto`: content with `<tool_call>…</tool_call>` blocks, their insides read by `B`.
/// Whitespace that only separates content from calls is dropped (SGLang strips the normal text
/// around calls); a reply with no call is passed through unchanged.
#[derive(Debug)]
pub(super) struct Tagged<B> {
    tools: Arc<[ToolSpec]>,
    buf: String,
    /// Trailing content whitespace, held until it is known not to precede a call.
    ws: String,
    in_call: Option<B>,
    after_call: bool,
}

impl<B: Block> Tagged<B> {
    /// The machine for one choice of a request with `tools`.
    pub(super) fn new(tools: Arc<[ToolSpec]>) -> Tagged<B> {
        Tagged { tools, buf: String::new(), ws: String::new(), in_call: None, after_call: false }
    }
}

impl<B: Block + 'static> CallMachine for Tagged<B> {
    fn push(&mut self, text: &str, end: bool, ev: &mut Vec<Ev>) {
        self.buf.push_str(text);
        loop {
            if let Some(body) = &mut self.in_call {
                let text = std::mem::take(&mut self.buf);
                match body.push(&text, &self.tools, ev) {
                    Some(left) => {
                        self.buf = left;
                        self.in_call = None;
                        self.after_call = true;
                        continue;
                    }
                    None => {
                        if end {
                            body.cut(&self.tools, ev);
                            self.in_call = None;
                        }
                        return;
                    }
                }
            }
            if self.after_call {
                let t = self.buf.trim_start().len();
                self.buf.drain(..self.buf.len() - t);
                if self.buf.is_empty() {
                    return;
                }
                self.after_call = false;
            }
            if let Some(p) = self.buf.find(CALL_START) {
                let before = self.buf[..p].trim_end();
                if !before.is_empty() {
                    ev.push(Ev::Content(format!("{}{before}", std::mem::take(&mut self.ws))));
                }
                self.ws.clear();
                self.buf.drain(..p + CALL_START.len());
                self.in_call = Some(B::default());
                continue;
            }
            let keep = if end { 0 } else { partial_suffix(&self.buf, CALL_START) };
            let safe = &self.buf[..self.buf.len() - keep];
            let body = safe.trim_end();
            if !body.is_empty() {
                ev.push(Ev::Content(format!("{}{body}", std::mem::take(&mut self.ws))));
            }
            self.ws.push_str(&safe[body.len()..]);
            let rest = self.buf[self.buf.len() - keep..].to_owned();
            self.buf = rest;
            if end && !self.ws.is_empty() && !self.after_call {
                // The reply ends in whitespace that precedes no call: it is content.
                ev.push(Ev::Content(std::mem::take(&mut self.ws)));
            }
            return;
        }
    }
}
