//! Hermes / Qwen 2.5 calls (`qwen25`, also `qwen` and `hermes`; SGLang's
//! `qwen25_detector.py`): `<tool_call>{"name": …, "arguments": {…}}</tool_call>` blocks in the
//! content, the arguments streamed as the model writes them, or the same JSON in a Markdown
//! fence ([`Fenced`], as llama.cpp's Hermes parser took it). Its prompt forms are the Hermes
//! ones every format starts from ([`ToolFormat`]'s provided methods).

use std::sync::Arc;

use serde_json::Value;

use super::fenced::Fenced;
use super::format::{CallMachine, Ev, ToolFormat, ToolSpec};
use super::json_scan::{call_header, Header, ValueScan};
use super::tagged::{Block, Tagged, CALL_END, CALL_START};

/// The `qwen25` row.
pub(super) struct Qwen25;

impl ToolFormat for Qwen25 {
    fn names(&self) -> &'static [&'static str] {
        &["qwen25", "qwen", "hermes"]
    }

    fn machine(&self, tools: &Arc<[ToolSpec]>) -> Box<dyn CallMachine> {
        Box::new(Fenced::new(tools.clone(), Box::new(Tagged::<JsonCall>::new(tools.clone()))))
    }
}

/// The inside of one block: `{"name": …, "arguments"|"parameters": …}`, streamed when the name
/// comes first; a block in another key order is parsed whole when it closes; anything else is
/// no call (given back as content).
#[derive(Debug, Default)]
struct JsonCall {
    /// Text taken by the header (kept for a block cut off before its name).
    raw: String,
    /// Text not yet taken.
    pending: String,
    started: bool,
    /// Inside the arguments value.
    value: Option<ValueScan>,
    /// After the arguments, until `</tool_call>`.
    tail: bool,
}

impl Block for JsonCall {
    fn push(&mut self, text: &str, _tools: &[ToolSpec], ev: &mut Vec<Ev>) -> Option<String> {
        self.pending.push_str(text);
        loop {
            if self.tail {
                let p = self.pending.find(CALL_END)?;
                return Some(self.pending[p + CALL_END.len()..].to_owned());
            }
            if let Some(scan) = &mut self.value {
                let n = scan.feed(&self.pending);
                if n > 0 {
                    ev.push(Ev::Args(self.pending[..n].to_owned()));
                }
                let done = scan.done;
                self.raw.extend(self.pending.drain(..n));
                if !done {
                    return None;
                }
                self.tail = true;
                continue;
            }
            let close = self.pending.find(CALL_END);
            let region = &self.pending[..close.unwrap_or(self.pending.len())];
            if let Header::Yes { name, used } = call_header(region) {
                self.started = true;
                ev.push(Ev::Start(name));
                self.raw.extend(self.pending.drain(..used));
                self.value = Some(ValueScan::default());
                continue;
            }
            let p = close?;
            let inner = self.pending[..p].to_owned();
            let left = self.pending[p + CALL_END.len()..].to_owned();
            match whole(&inner) {
                Some((n, a)) => {
                    self.started = true;
                    ev.push(Ev::Start(n));
                    ev.push(Ev::Args(a));
                }
                None => ev.push(Ev::Content(format!("{CALL_START}{inner}{CALL_END}"))),
            }
            return Some(left);
        }
    }

    fn cut(&mut self, _tools: &[ToolSpec], ev: &mut Vec<Ev>) {
        // A started call stays (truncated), one that never got a name is content.
        if !self.started {
            ev.push(Ev::Content(format!("{CALL_START}{}{}", self.raw, self.pending)));
        }
    }
}

/// A closed block's call read whole: `name` and `arguments` (or `parameters`) in any order.
fn whole(inner: &str) -> Option<(String, String)> {
    let Ok(Value::Object(o)) = serde_json::from_str::<Value>(inner.trim()) else { return None };
    let name = o.get("name").and_then(Value::as_str)?;
    let args = o.get("arguments").or_else(|| o.get("parameters"))?;
    Some((name.to_owned(), args.to_string()))
}
