//! Llama 3.1–3.3 JSON calls (`llama3`, SGLang's `llama32_detector.py`): the reply is
//! `{"name": …, "parameters": {…}}` after an optional `<|python_tag|>`, several separated by `;`.

use std::sync::Arc;

use serde_json::{json, Value};
use sparrow_tokenizer::pyjson::{dumps, DumpsOptions};

use super::array::ArrayCalls;
use super::format::{CallMachine, Ev, ToolFormat, ToolSpec};
use super::json_scan::{call_header, Header};

/// The `llama3` row.
pub(super) struct Llama3;

impl ToolFormat for Llama3 {
    fn names(&self) -> &'static [&'static str] {
        &["llama3"]
    }

    fn machine(&self, _tools: &Arc<[ToolSpec]>) -> Box<dyn CallMachine> {
        Box::new(Llama3Calls::default())
    }

    /// Llama 3.1's own wording of its JSON calls.
    fn how_to_call(&self) -> &'static str {
        "To call a function, respond with only a JSON object in the format \
         {\"name\": function name, \"parameters\": dictionary of argument name and its value}, and nothing else."
    }

    /// `;`-separated JSON objects, as Llama 3.1's template writes them.
    fn history(&self, calls: &[(&Value, &Value)]) -> String {
        let list: Vec<String> =
            calls.iter().map(|(n, a)| dumps(&json!({"name": n, "parameters": a}), &DumpsOptions::PYTHON)).collect();
        format!("\n{}", list.join("; "))
    }
}

/// Llama 3's calls: a reply that starts (after whitespace and an optional `<|python_tag|>`)
/// with a call header `{"name": …, "parameters"|"arguments": …` is calls, read as the
/// `required` array's elements are (`;` or anything else between them is skipped); any other
/// reply is content, unchanged. Held back until the start decides.
#[derive(Debug, Default)]
struct Llama3Calls {
    buf: String,
    mode: Option<bool>,
    calls: ArrayCalls,
}

/// The token Llama 3.1 writes before a call to a built-in or JSON tool.
const PYTHON_TAG: &str = "<|python_tag|>";

impl CallMachine for Llama3Calls {
    fn push(&mut self, text: &str, end: bool, ev: &mut Vec<Ev>) {
        match self.mode {
            Some(true) => return self.calls.push(text, end, ev),
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
                self.calls.push(&body, end, ev);
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
