//! The JSON array of `{"name", "parameters"}` objects that `tool_choice: required` constrains
//! generation to (vLLM's shape), read as it streams.

use super::format::{CallMachine, Ev};
use super::json_scan::{call_header, Header, ValueScan};

/// `required`: the constrained `[{"name": …, "parameters": …}, …]`.
/// Also how Llama 3's and Phi-4-mini's formats read their calls' JSON objects.
#[derive(Debug, Default)]
pub(super) struct ArrayCalls {
    raw: String,
    pos: usize,
    scan: Option<ValueScan>,
    /// Inside an element after its arguments, until its `}`.
    tail: bool,
}

impl CallMachine for ArrayCalls {
    /// Nothing is held back: `end` changes nothing.
    fn push(&mut self, text: &str, _end: bool, ev: &mut Vec<Ev>) {
        self.raw.push_str(text);
        loop {
            if let Some(scan) = &mut self.scan {
                let rest = &self.raw[self.pos..];
                let n = scan.feed(rest);
                if n > 0 {
                    ev.push(Ev::Args(rest[..n].to_owned()));
                }
                self.pos += n;
                if !scan.done {
                    return;
                }
                self.scan = None;
                self.tail = true;
            }
            let rest = &self.raw[self.pos..];
            if self.tail {
                let Some(p) = rest.find('}') else { return };
                self.pos += p + 1;
                self.tail = false;
                continue;
            }
            let Some(p) = rest.find('{') else { return };
            match call_header(&rest[p..]) {
                Header::More => return,
                Header::No => {
                    self.pos += p + 1;
                }
                Header::Yes { name, used } => {
                    ev.push(Ev::Start(name));
                    self.pos += p + used;
                    self.scan = Some(ValueScan::default());
                }
            }
        }
    }
}
