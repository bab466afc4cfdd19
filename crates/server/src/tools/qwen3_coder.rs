//! Qwen3-Coder / Qwen3.5 / Qwen3.6 XML calls (`qwen3_coder`; SGLang's
//! `qwen3_coder_detector.py`, vLLM's `qwen3_xml`):
//! `<tool_call>\n<function=name>\n<parameter=k>\nv\n</parameter>\n…</function>\n</tool_call>`,
//! the arguments object built parameter by parameter, each value typed by the tool's schema.
//! Earlier calls are written by the chat templates themselves (they read `arguments` as an
//! object).

use std::sync::Arc;

use serde_json::Value;

use super::format::{CallMachine, Ev, ToolFormat, ToolSpec};
use super::tagged::{close_members, Block, Tagged, CALL_END, CALL_START};

/// The `qwen3_coder` row.
pub(super) struct Qwen3Coder;

impl ToolFormat for Qwen3Coder {
    fn names(&self) -> &'static [&'static str] {
        &["qwen3_coder", "qwen3_xml"]
    }

    fn machine(&self, tools: &Arc<[ToolSpec]>) -> Box<dyn CallMachine> {
        Box::new(Tagged::<XmlCall>::new(tools.clone()))
    }

    fn how_to_call(&self) -> &'static str {
        "If you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n\
         <function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n</function>\n\
         </tool_call>"
    }
}

const FUNCTION: &str = "<function=";
const PARAM: &str = "<parameter=";
const PARAM_END: &str = "</parameter>";

/// The inside of one block: `<function=name>`, then `<parameter=k>v</parameter>` pairs, each
/// sent as one more member of the arguments object once its closing tag is in.
#[derive(Debug, Default)]
struct XmlCall {
    /// Text taken by the name and the parameters (kept for a block cut off before its name).
    raw: String,
    /// Text not yet taken.
    pending: String,
    /// The function, once known.
    name: Option<String>,
    /// Parameters sent.
    params: usize,
}

impl Block for XmlCall {
    fn push(&mut self, text: &str, tools: &[ToolSpec], ev: &mut Vec<Ev>) -> Option<String> {
        self.pending.push_str(text);
        let close = self.pending.find(CALL_END);
        if self.name.is_none() {
            let region = &self.pending[..close.unwrap_or(self.pending.len())];
            let name = region.find(FUNCTION).and_then(|f| {
                let from = f + FUNCTION.len();
                region[from..].find('>').map(|e| (region[from..from + e].trim().to_owned(), from + e + 1))
            });
            match name.filter(|(n, _)| !n.is_empty() && !n.contains('<')) {
                Some((name, used)) => {
                    ev.push(Ev::Start(name.clone()));
                    self.name = Some(name);
                    self.raw.extend(self.pending.drain(..used));
                }
                None => {
                    // The block closed without a function: no call (kept as content).
                    let p = close?;
                    ev.push(Ev::Content(format!("{CALL_START}{}{CALL_END}", &self.pending[..p])));
                    return Some(self.pending[p + CALL_END.len()..].to_owned());
                }
            }
        }
        self.params(tools, ev);
        let p = self.pending.find(CALL_END)?;
        ev.push(Ev::Args(close_members(self.params).to_owned()));
        Some(self.pending[p + CALL_END.len()..].to_owned())
    }

    fn cut(&mut self, tools: &[ToolSpec], ev: &mut Vec<Ev>) {
        if self.name.is_none() {
            ev.push(Ev::Content(format!("{CALL_START}{}{}", self.raw, self.pending)));
            return;
        }
        // Close the object over the complete parameters, so the arguments stay valid JSON.
        self.params(tools, ev);
        ev.push(Ev::Args(close_members(self.params).to_owned()));
    }
}

impl XmlCall {
    /// The complete `<parameter=k>v</parameter>` pairs before the block's end, each sent as one
    /// more member of the arguments object.
    fn params(&mut self, tools: &[ToolSpec], ev: &mut Vec<Ev>) {
        let name = self.name.as_deref().unwrap_or_default();
        loop {
            let limit = self.pending.find(CALL_END).unwrap_or(self.pending.len());
            let rest = &self.pending[..limit];
            let Some(p0) = rest.find(PARAM) else { return };
            let Some(k1) = rest[p0..].find('>').map(|e| p0 + e) else { return };
            let Some(v1) = rest[k1..].find(PARAM_END).map(|e| k1 + e) else { return };
            let key = rest[p0 + PARAM.len()..k1].trim().to_owned();
            let ty = tools
                .iter()
                .filter(|t| t.name == name)
                .find_map(|t| t.parameters.get("properties")?.get(&key)?.get("type").cloned());
            let value = typed(&rest[k1 + 1..v1], ty.as_ref());
            let sep = if self.params == 0 { "{" } else { "," };
            ev.push(Ev::Args(format!("{sep}{}:{value}", Value::from(key))));
            self.params += 1;
            let used = v1 + PARAM_END.len();
            self.raw.extend(self.pending.drain(..used));
        }
    }
}

/// A parameter's text as the schema's `type` says (SGLang's `_convert_param_value`): one
/// newline on each side dropped; `string` kept as text; `integer` / `number` / `boolean` parsed,
/// text when they do not parse; `object` / `array` and untyped values parsed as JSON when they
/// are, text otherwise; `null` is null.
fn typed(raw: &str, ty: Option<&Value>) -> Value {
    let v = raw.strip_prefix('\n').unwrap_or(raw);
    let v = v.strip_suffix('\n').unwrap_or(v);
    if v.trim() == "null" {
        return Value::Null;
    }
    let ty = match ty {
        Some(Value::String(t)) => t.as_str(),
        // A list of types (`["integer", "null"]`): the first that is not null.
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).find(|t| *t != "null").unwrap_or(""),
        _ => "",
    };
    let text = || Value::from(v);
    let t = v.trim();
    match ty {
        "string" | "str" | "text" => text(),
        "integer" | "int" => t.parse::<i64>().map(Value::from).unwrap_or_else(|_| text()),
        "number" | "float" => match t.parse::<i64>() {
            Ok(i) => Value::from(i),
            Err(_) => t
                .parse::<f64>()
                .ok()
                .and_then(|f| serde_json::Number::from_f64(f).map(Value::Number))
                .unwrap_or_else(text),
        },
        "boolean" | "bool" => match t.to_ascii_lowercase().as_str() {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => text(),
        },
        _ => serde_json::from_str::<Value>(t).unwrap_or_else(|_| text()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_follow_the_schema() {
        assert_eq!(typed("\nParis\n", Some(&json!("string"))), json!("Paris"));
        assert_eq!(typed("\n42\n", Some(&json!("string"))), json!("42"));
        assert_eq!(typed("\n42\n", Some(&json!("integer"))), json!(42));
        assert_eq!(typed("\n4.5\n", Some(&json!("number"))), json!(4.5));
        assert_eq!(typed("\nTrue\n", Some(&json!("boolean"))), json!(true));
        assert_eq!(typed("\n[1, 2]\n", Some(&json!("array"))), json!([1, 2]));
        assert_eq!(typed("\n{\"a\": 1}\n", None), json!({"a": 1}));
        assert_eq!(typed("\nline one\nline two\n", None), json!("line one\nline two"));
        assert_eq!(typed("\nnull\n", Some(&json!("string"))), Value::Null);
        assert_eq!(typed("\n7\n", Some(&json!(["integer", "null"]))), json!(7));
        assert_eq!(typed("\nseven\n", Some(&json!("integer"))), json!("seven"));
    }
}
