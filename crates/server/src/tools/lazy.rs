//! A lazy grammar for `tool_choice: auto` (llama.cpp's `grammar_lazy` with its trigger
//! patterns): generation is free until the model opens a Hermes call — `{"name"` right after
//! `<tool_call>`, after a ```` ``` ````/```` ```json ```` fence, or at a line start — and from
//! there the rest of the call is constrained to `: "<an offered tool>", "arguments": <that
//! tool's parameters schema>}`. A small model then cannot misname a tool or break its
//! arguments' JSON once it has decided to call; what surrounds the call (the closing tag or
//! fence, more text, another call) is free again.

use std::sync::Arc;

use serde_json::{json, Value};
use sparrow_engine::scheduler::TokenConstraint;

use super::format::ToolSpec;
use crate::grammar::Compiled;

/// The key a Hermes call opens with.
const NAME_KEY: &str = "\"name\"";

/// The characters of recent text kept to find a trigger in.
const WINDOW: usize = 96;

/// The Lark grammar of a call's rest after its `{"name"`: the name of one of `tools` and its
/// arguments object under the tool's schema, then the closing `}`.
pub fn rest_of_call(tools: &[ToolSpec]) -> String {
    let lark_str = |s: &str| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
    let mut g = String::from("start: WS? \":\" WS? call\ncall: ");
    g.push_str(&(0..tools.len()).map(|i| format!("c{i}")).collect::<Vec<_>>().join(" | "));
    g.push('\n');
    for (i, t) in tools.iter().enumerate() {
        let mut schema = t.parameters.clone();
        if let Value::Object(o) = &mut schema {
            o.insert("x-guidance".into(), json!({"whitespace_flexible": true}));
        }
        let name = lark_str(&Value::from(t.name.as_str()).to_string());
        g.push_str(&format!(
            "c{i}: {name} WS? \",\" WS? \"\\\"arguments\\\"\" WS? \":\" WS? a{i} WS? \"}}\"\na{i}: %json {schema}\n"
        ));
    }
    g.push_str("WS: /[ \\t\\r\\n]+/\n");
    g
}

/// Text → token ids (the request's tokenizer).
pub type Encode = Arc<dyn Fn(&str) -> Vec<u32> + Send + Sync>;

/// One choice's lazy call grammar, as a [`TokenConstraint`].
pub struct LazyCalls {
    grammar: Arc<Compiled>,
    /// Token id → bytes (special tokens spelled out).
    bytes: Arc<Vec<Vec<u8>>>,
    /// Text → token ids, for the part of a token past the trigger.
    encode: Encode,
    /// The last [`WINDOW`] characters generated while free.
    recent: String,
    /// Nothing but whitespace generated yet.
    at_start: bool,
    /// The call being constrained.
    active: Option<Box<dyn TokenConstraint>>,
}

impl std::fmt::Debug for LazyCalls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyCalls").field("recent", &self.recent).field("active", &self.active.is_some()).finish()
    }
}

impl LazyCalls {
    /// The lazy grammar of [`rest_of_call`] compiled as `grammar`, over the vocabulary `bytes`.
    pub fn new(grammar: Arc<Compiled>, bytes: Arc<Vec<Vec<u8>>>, encode: Encode) -> LazyCalls {
        LazyCalls { grammar, bytes, encode, recent: String::new(), at_start: true, active: None }
    }

    /// Where a call's constrained rest begins in `recent`, if its `{"name"` ended within the
    /// last `new` bytes.
    fn trigger(&self, new: usize) -> Option<usize> {
        let from = self.recent.len().saturating_sub(new + NAME_KEY.len() - 1);
        let from = (0..=from).rev().find(|&i| self.recent.is_char_boundary(i)).unwrap_or(0);
        let q = from + self.recent[from..].find(NAME_KEY)?;
        let before = &self.recent[..q];
        let brace = before.trim_end().strip_suffix('{')?;
        let lead = brace.trim_end();
        let line_start = brace[lead.len()..].contains('\n') || (lead.is_empty() && self.at_start);
        let opens = lead.ends_with("<tool_call>") || lead.ends_with("```json") || lead.ends_with("```");
        (opens || line_start).then_some(q + NAME_KEY.len())
    }
}

impl TokenConstraint for LazyCalls {
    fn allowed(&mut self, allowed: &mut [bool]) -> Result<(), String> {
        match &mut self.active {
            Some(c) => c.allowed(allowed),
            None => {
                allowed.fill(true);
                Ok(())
            }
        }
    }

    fn advance(&mut self, token: u32) -> Result<bool, String> {
        if let Some(c) = &mut self.active {
            if c.advance(token)? {
                self.active = None;
                self.recent.clear();
                self.at_start = false;
            }
            return Ok(false);
        }
        let piece = String::from_utf8_lossy(self.bytes.get(token as usize).map_or(&[][..], Vec::as_slice)).into_owned();
        let start_before = self.at_start && self.recent.trim().is_empty();
        self.recent.push_str(&piece);
        if let Some(rest) = self.trigger(piece.len()) {
            let left = self.recent[rest..].to_owned();
            let mut c = self.grammar.instance();
            // The part of the token past `"name"` goes through the grammar; a token that
            // already broke it leaves the call free.
            if (self.encode)(&left).into_iter().try_for_each(|t| c.advance(t).map(|_| ())).is_ok() {
                self.active = Some(c);
            }
            self.recent.clear();
            self.at_start = false;
            return Ok(false);
        }
        self.at_start = start_before && self.recent.trim().is_empty();
        if self.recent.len() > WINDOW {
            let mut cut = self.recent.len() - WINDOW;
            while !self.recent.is_char_boundary(cut) {
                cut += 1;
            }
            self.recent.drain(..cut);
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grammar::Grammars;

    /// A byte-level vocabulary (token `b` is byte `b`, 256 is EOS).
    fn vocab() -> (Grammars, Arc<Vec<Vec<u8>>>) {
        let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        words.push(b"<eos>".to_vec());
        let special: Vec<bool> = (0..words.len()).map(|i| i == 256).collect();
        (Grammars::new(&words, &special, 256).expect("grammars"), Arc::new(words))
    }

    /// Generates `wish` through `c`: each step takes the wished byte if allowed (then the next
    /// wish), else a quote if allowed, else the smallest allowed byte that is not whitespace
    /// (the wish waits).
    fn generate(c: &mut dyn TokenConstraint, wish: &str) -> String {
        let mut out = Vec::new();
        let mut w = wish.bytes().peekable();
        let mut steps = 0;
        while let Some(&b) = w.peek() {
            steps += 1;
            assert!(steps < 4 * wish.len(), "runaway: {}", String::from_utf8_lossy(&out));
            let mut mask = vec![false; 257];
            c.allowed(&mut mask).expect("mask");
            let t = if mask[b as usize] {
                w.next();
                b
            } else {
                let ok = |x: u8| mask[x as usize];
                if ok(b'"') {
                    b'"'
                } else {
                    (0..=255u8).find(|&x| ok(x) && !x.is_ascii_whitespace()).expect("something allowed")
                }
            };
            c.advance(t as u32).expect("advance");
            out.push(t);
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn an_opened_call_is_held_to_the_tools() {
        let (g, bytes) = vocab();
        let tools = vec![ToolSpec {
            name: "get_weather".into(),
            parameters: json!({"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}),
        }];
        let schemas: Vec<&Value> = tools.iter().map(|t| &t.parameters).collect();
        let compiled = Arc::new(g.compiled(&rest_of_call(&tools), &schemas).expect("compiles"));
        let encode: Encode = Arc::new(|s: &str| s.bytes().map(u32::from).collect());
        let mut c = LazyCalls::new(compiled.clone(), bytes.clone(), encode.clone());
        // A misspelt name is held to the offered one; the rest stays free.
        let out = generate(
            &mut c,
            "I'll check.\n<tool_call>\n{\"name\": \"get_wether\", \"arguments\": {\"location\": \"Paris\"}}\n</tool_call> done",
        );
        assert_eq!(
            out,
            "I'll check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n</tool_call> done"
        );
        // Fenced, and at the start of the reply.
        let mut c = LazyCalls::new(compiled.clone(), bytes.clone(), encode.clone());
        let out = generate(&mut c, "```json\n{\"name\": \"get_wether\", \"arguments\": {\"location\": \"Oslo\"}}\n```");
        assert_eq!(out, "```json\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Oslo\"}}\n```");
        // Not at a call's opening: free.
        let mut c = LazyCalls::new(compiled, bytes, encode);
        let free = "Say {\"name\": \"anything\"} here.";
        assert_eq!(generate(&mut c, free), free);
    }
}
