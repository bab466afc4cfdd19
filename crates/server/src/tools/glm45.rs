//! GLM-4.5 / GLM-5 calls (`glm45`, also `glm47`; SGLang's `glm4_moe_detector.py`):
//! `<tool_call>name\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>…</tool_call>`, the arguments
//! object built pair by pair. Earlier calls are written in the Hermes form (GLM's templates
//! show calls themselves).

use std::sync::Arc;

use serde_json::Value;

use super::format::{CallMachine, Ev, ToolFormat, ToolSpec};
use super::tagged::{close_members, Block, Tagged, CALL_END, CALL_START};

/// The `glm45` row.
pub(super) struct Glm45;

impl ToolFormat for Glm45 {
    fn names(&self) -> &'static [&'static str] {
        &["glm45", "glm47"]
    }

    fn machine(&self, tools: &Arc<[ToolSpec]>) -> Box<dyn CallMachine> {
        Box::new(Tagged::<PairsCall>::new(tools.clone()))
    }

    fn how_to_call(&self) -> &'static str {
        "For each function call, output the function name and arguments within the following XML format:\n\
         <tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n...\n</tool_call>"
    }
}

/// The inside of one block: the function name up to a newline or the first `<arg_key>`, then
/// `<arg_key>`/`<arg_value>` pairs, each sent as one more member of the arguments object.
#[derive(Debug, Default)]
struct PairsCall {
    /// Text taken by the name and the pairs (kept for a block cut off before its name).
    raw: String,
    /// Text not yet taken.
    pending: String,
    /// The function, once known.
    name: Option<String>,
    /// Pairs sent.
    pairs: usize,
}

impl Block for PairsCall {
    fn push(&mut self, text: &str, tools: &[ToolSpec], ev: &mut Vec<Ev>) -> Option<String> {
        self.pending.push_str(text);
        let close = self.pending.find(CALL_END);
        if self.name.is_none() {
            let region = &self.pending[..close.unwrap_or(self.pending.len())];
            let cut = [region.find('\n'), region.find("<arg_key>")].into_iter().flatten().min();
            let name = cut.or(close).map(|c| (region[..c].trim().to_owned(), c));
            match name.filter(|(n, _)| !n.is_empty() && !n.contains('<')) {
                Some((name, used)) => {
                    ev.push(Ev::Start(name.clone()));
                    self.name = Some(name);
                    self.raw.extend(self.pending.drain(..used));
                }
                None => {
                    // The block closed without a name: no call (the caller keeps it as content).
                    let p = close?;
                    ev.push(Ev::Content(format!("{CALL_START}{}{CALL_END}", &self.pending[..p])));
                    return Some(self.pending[p + CALL_END.len()..].to_owned());
                }
            }
        }
        self.pairs(tools, self.pending.find(CALL_END), ev);
        let p = self.pending.find(CALL_END)?;
        ev.push(Ev::Args(close_members(self.pairs).to_owned()));
        Some(self.pending[p + CALL_END.len()..].to_owned())
    }

    fn cut(&mut self, tools: &[ToolSpec], ev: &mut Vec<Ev>) {
        if self.name.is_none() {
            ev.push(Ev::Content(format!("{CALL_START}{}{}", self.raw, self.pending)));
            return;
        }
        // The arguments are built here: close the object over the complete pairs, so they stay
        // valid JSON.
        self.pairs(tools, None, ev);
        ev.push(Ev::Args(close_members(self.pairs).to_owned()));
    }
}

impl PairsCall {
    /// The complete `<arg_key>k</arg_key><arg_value>v</arg_value>` pairs before `close`, each
    /// sent as one more member of the arguments object. A value is JSON when it parses as JSON
    /// and the tool's schema does not declare it a string (as SGLang's `glm4_moe_detector.py`
    /// does).
    fn pairs(&mut self, tools: &[ToolSpec], close: Option<usize>, ev: &mut Vec<Ev>) {
        let name = self.name.as_deref().unwrap_or_default();
        loop {
            let limit = self.pending.find(CALL_END).or(close).unwrap_or(self.pending.len());
            let rest = &self.pending[..limit];
            let (Some(k0), Some(k1), Some(v0), Some(v1)) =
                (rest.find("<arg_key>"), rest.find("</arg_key>"), rest.find("<arg_value>"), rest.find("</arg_value>"))
            else {
                return;
            };
            if !(k0 < k1 && k1 < v0 && v0 < v1) {
                return;
            }
            let key = rest[k0 + "<arg_key>".len()..k1].trim().to_owned();
            let raw_val = &rest[v0 + "<arg_value>".len()..v1];
            let is_string = tools
                .iter()
                .filter(|t| t.name == name)
                .find_map(|t| t.parameters.get("properties")?.get(&key)?.get("type")?.as_str())
                == Some("string");
            let value = if is_string {
                Value::from(raw_val)
            } else {
                serde_json::from_str::<Value>(raw_val.trim()).unwrap_or_else(|_| Value::from(raw_val))
            };
            let sep = if self.pairs == 0 { "{" } else { "," };
            ev.push(Ev::Args(format!("{sep}{}:{value}", Value::from(key))));
            self.pairs += 1;
            let used = v1 + "</arg_value>".len();
            self.raw.extend(self.pending.drain(..used));
        }
    }
}
