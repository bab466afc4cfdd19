//! The `<think>…</think>` split of `--reasoning-parser` (SGLang's `reasoning_parser.py`).

use super::format::partial_suffix;

/// The tag that opens the reasoning.
pub const THINK_START: &str = "<think>";

/// The tag that closes the reasoning.
pub const THINK_END: &str = "</think>";

/// The `<think>…</think>` split, as SGLang's `BaseReasoningFormatDetector`: reasoning and the
/// answer after it are stripped of surrounding whitespace.
#[derive(Debug)]
pub(super) struct Think {
    pub(super) force: bool,
    pub(super) state: ThinkState,
    pub(super) buf: String,
    /// Reasoning whitespace held until more reasoning follows (dropped before `</think>`).
    pub(super) ws: String,
    pub(super) emitted: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ThinkState {
    Undecided,
    In,
    AfterEnd,
    Out,
}

impl Think {
    /// The split of one choice; `starts_inside`: the template opened `<think>`
    /// (`ReasoningParser::starts_inside`).
    pub(super) fn new(starts_inside: bool) -> Think {
        Think {
            force: starts_inside,
            state: ThinkState::Undecided,
            buf: String::new(),
            ws: String::new(),
            emitted: false,
        }
    }

    pub(super) fn push(&mut self, text: &str, reasoning: &mut String, content: &mut String) {
        self.buf.push_str(text);
        loop {
            match self.state {
                ThinkState::Undecided => {
                    let t = self.buf.trim_start();
                    if let Some(rest) = t.strip_prefix(THINK_START) {
                        self.buf = rest.to_owned();
                        self.state = ThinkState::In;
                    } else if THINK_START.starts_with(t) {
                        return;
                    } else {
                        self.state = if self.force { ThinkState::In } else { ThinkState::Out };
                    }
                }
                ThinkState::In => {
                    if !self.emitted {
                        self.buf = self.buf.trim_start().to_owned();
                    }
                    if let Some(p) = self.buf.find(THINK_END) {
                        let r = self.buf[..p].trim_end();
                        if !r.is_empty() {
                            reasoning.push_str(&std::mem::take(&mut self.ws));
                            reasoning.push_str(r);
                        }
                        self.ws.clear();
                        self.buf = self.buf[p + THINK_END.len()..].to_owned();
                        self.state = ThinkState::AfterEnd;
                        continue;
                    }
                    let keep = partial_suffix(&self.buf, THINK_END);
                    let safe = &self.buf[..self.buf.len() - keep];
                    let body = safe.trim_end();
                    if !body.is_empty() {
                        reasoning.push_str(&std::mem::take(&mut self.ws));
                        reasoning.push_str(body);
                        self.emitted = true;
                    }
                    self.ws.push_str(&safe[body.len()..]);
                    self.buf = self.buf[self.buf.len() - keep..].to_owned();
                    return;
                }
                ThinkState::AfterEnd => {
                    let t = self.buf.trim_start();
                    if t.is_empty() {
                        self.buf.clear();
                        return;
                    }
                    self.buf = t.to_owned();
                    self.state = ThinkState::Out;
                }
                ThinkState::Out => {
                    content.push_str(&self.buf);
                    self.buf.clear();
                    return;
                }
            }
        }
    }

    pub(super) fn finish(&mut self, reasoning: &mut String, content: &mut String) {
        match self.state {
            ThinkState::Undecided if self.force => {
                reasoning.push_str(self.buf.trim());
            }
            ThinkState::In => {
                let r = self.buf.trim_end();
                if !r.is_empty() {
                    reasoning.push_str(&self.ws);
                    reasoning.push_str(r);
                }
            }
            ThinkState::Undecided | ThinkState::Out => content.push_str(&self.buf),
            ThinkState::AfterEnd => {}
        }
        self.buf.clear();
        self.ws.clear();
    }
}
