//! Llama 3.1–3.3 JSON calls (`llama3`, SGLang's `llama32_detector.py`): the reply is
//! `{"name": …, "parameters": {…}}` after an optional `<|python_tag|>`, several separated by `;`.

use super::array::ArrayCalls;
use super::json_scan::{call_header, Header};
use super::shaper::Ev;

/// Llama 3's calls: a reply that starts (after whitespace and an optional `<|python_tag|>`)
/// with a call header `{"name": …, "parameters"|"arguments": …` is calls, read as the
/// `required` array's elements are (`;` or anything else between them is skipped); any other
/// reply is content, unchanged. Held back until the start decides.
#[derive(Debug, Default)]
pub(super) struct Llama3Calls {
    pub(super) buf: String,
    pub(super) mode: Option<bool>,
    pub(super) calls: ArrayCalls,
}

/// The token Llama 3.1 writes before a call to a built-in or JSON tool.
pub(super) const PYTHON_TAG: &str = "<|python_tag|>";

impl Llama3Calls {
    pub(super) fn push(&mut self, text: &str, end: bool, ev: &mut Vec<Ev>) {
        match self.mode {
            Some(true) => return self.calls.push(text, ev),
            Some(false) => {
                if !text.is_empty() {
                    ev.push(Ev::Content(text.to_owned()));
                }
                return;
            }
            None => self.buf.push_str(text),
        }
        let start = self.buf.trim_start();
        let body = start.strip_prefix(PYTHON_TAG).map_or(start, str::trim_start);
        // Whitespace only, or the tag still arriving.
        let waiting = start.is_empty() || (start.len() < PYTHON_TAG.len() && PYTHON_TAG.starts_with(start));
        let decided = if waiting || body.is_empty() {
            end.then_some(false)
        } else {
            match call_header(body) {
                Header::Yes { .. } => Some(true),
                Header::More if !end => None,
                _ => Some(false),
            }
        };
        match decided {
            None => {}
            Some(true) => {
                self.mode = Some(true);
                let body = body.to_owned();
                self.buf.clear();
                self.calls.push(&body, ev);
            }
            Some(false) => {
                self.mode = Some(false);
                let all = std::mem::take(&mut self.buf);
                if !all.is_empty() {
                    ev.push(Ev::Content(all));
                }
            }
        }
    }
}
