//! Phi-4-mini's `functools[{…}, …]` block (`phi4_mini`, SGLang's `phi4mini_detector.py`): text
//! around the block is content, brackets inside strings do not close it.

use std::sync::Arc;

use serde_json::{json, Value};
use sparrow_tokenizer::pyjson::{dumps, DumpsOptions};

use super::array::ArrayCalls;
use super::format::{partial_suffix, CallMachine, Ev, ToolFormat, ToolSpec};
use super::json_scan::ValueScan;

/// The `phi4_mini` row.
pub(super) struct Phi4Mini;

impl ToolFormat for Phi4Mini {
    fn names(&self) -> &'static [&'static str] {
        &["phi4_mini"]
    }

    fn machine(&self, _tools: &Arc<[ToolSpec]>) -> Box<dyn CallMachine> {
        Box::new(FunctoolsCalls::default())
    }

    fn how_to_call(&self) -> &'static str {
        "To call functions, respond with functools[{\"name\": <function-name>, \"arguments\": <args-json-object>}, ...]."
    }

    /// One `functools[…]` block, as Phi-4-mini's model card writes it.
    fn history(&self, calls: &[(&Value, &Value)]) -> String {
        let list: Vec<Value> = calls.iter().map(|(n, a)| json!({"name": n, "arguments": a})).collect();
        format!("\nfunctools{}", dumps(&Value::Array(list), &DumpsOptions::PYTHON))
    }
}

/// Phi-4-mini's calls: text outside `functools[…]` is content; inside, the array's elements
/// are read as the `required` array's are, until the `]` that closes it (brackets inside
/// strings do not count). A block in which no call starts (prose after the word, a code
/// sample) is given back as content when it closes or the text ends, as SGLang's detector
/// returns an unparseable block; a block cut off after a call started keeps that call.
#[derive(Debug, Default)]
struct FunctoolsCalls {
    /// Text outside a block held back because it may begin `functools[`.
    held: String,
    /// The block being read.
    inside: Option<Block>,
}

/// One `functools[…]` block being read.
#[derive(Debug, Default)]
struct Block {
    /// Where its array ends.
    scan: ValueScan,
    /// Its elements.
    calls: ArrayCalls,
    /// Its text so far, given back when no call starts in it.
    raw: String,
    /// Whether a call started in it.
    started: bool,
}

/// What opens Phi-4-mini's block of calls.
const FUNCTOOLS: &str = "functools[";

impl CallMachine for FunctoolsCalls {
    fn push(&mut self, text: &str, end: bool, ev: &mut Vec<Ev>) {
        let mut rest = text.to_owned();
        loop {
            if let Some(b) = &mut self.inside {
                let n = b.scan.feed(&rest);
                b.raw.push_str(&rest[..n]);
                let before = ev.len();
                b.calls.push(&rest[..n], end, ev);
                b.started |= ev[before..].iter().any(|e| matches!(e, Ev::Start(_)));
                rest.drain(..n);
                if !b.scan.done && !end {
                    return;
                }
                if !b.started {
                    ev.push(Ev::Content(format!("{FUNCTOOLS}{}", b.raw)));
                }
                self.inside = None;
            }
            self.held.push_str(&rest);
            rest.clear();
            if let Some(p) = self.held.find(FUNCTOOLS) {
                if p > 0 {
                    ev.push(Ev::Content(self.held[..p].to_owned()));
                }
                rest = self.held.split_off(p + FUNCTOOLS.len());
                self.held.clear();
                let mut b = Block::default();
                b.scan.feed("[");
                self.inside = Some(b);
                continue;
            }
            let keep = if end { 0 } else { partial_suffix(&self.held, FUNCTOOLS) };
            let out = self.held.len() - keep;
            if out > 0 {
                ev.push(Ev::Content(self.held[..out].to_owned()));
                self.held.drain(..out);
            }
            return;
        }
    }
}
