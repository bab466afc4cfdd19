//! `<tool_call>…</tool_call>` calls: Hermes / Qwen 2.5 JSON (`qwen25`) and GLM-4.5's
//! `<arg_key>`/`<arg_value>` pairs (`glm45`), SGLang's `qwen25_detector.py` and
//! `glm4_moe_detector.py`.

use serde_json::Value;
use std::sync::Arc;

use super::json_scan::{call_header, Header, ValueScan};
use super::request::ToolSpec;
use super::shaper::{partial_suffix, Ev};
use super::ToolParser;

pub(super) const CALL_START: &str = "<tool_call>";

pub(super) const CALL_END: &str = "</tool_call>";

/// `auto`: content with `<tool_call>…</tool_call>` blocks. Whitespace that only separates
/// content from calls is dropped (SGLang strips the normal text around calls); a reply with no
/// call is passed through unchanged.
#[derive(Debug)]
pub(super) struct Tagged {
    pub(super) parser: ToolParser,
    pub(super) tools: Arc<[ToolSpec]>,
    pub(super) buf: String,
    /// Trailing content whitespace, held until it is known not to precede a call.
    pub(super) ws: String,
    pub(super) in_call: Option<Body>,
    pub(super) after_call: bool,
}

impl Tagged {
    pub(super) fn new(parser: ToolParser, tools: Arc<[ToolSpec]>) -> Tagged {
        Tagged { parser, tools, buf: String::new(), ws: String::new(), in_call: None, after_call: false }
    }

    pub(super) fn push(&mut self, text: &str, end: bool, ev: &mut Vec<Ev>) {
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
                            // Cut off inside a block: a started call stays (truncated; the
                            // finish reason says `length`), one that never got a name is
                            // content.
                            if !body.started {
                                ev.push(Ev::Content(format!("{CALL_START}{}{}", body.raw, body.pending)));
                            } else if body.parser == ToolParser::Glm45 {
                                // GLM's arguments are built here: close the object over the
                                // complete pairs, so they stay valid JSON.
                                body.glm_pairs(&self.tools, None, ev);
                                ev.push(Ev::Args(if body.glm_pairs == 0 { "{}".to_owned() } else { "}".to_owned() }));
                            }
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
                self.in_call = Some(Body::new(self.parser));
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

/// The inside of one `<tool_call>` block.
#[derive(Debug)]
pub(super) struct Body {
    pub(super) parser: ToolParser,
    /// Text taken by the header or the name (kept for a block that turns out not to be a call).
    pub(super) raw: String,
    /// Text not yet taken.
    pub(super) pending: String,
    pub(super) started: bool,
    /// The function, once known.
    pub(super) name: String,
    pub(super) phase: Phase,
    pub(super) glm_pairs: usize,
}

#[derive(Debug)]
pub(super) enum Phase {
    /// Before the function name.
    Header,
    /// Qwen 2.5: inside the arguments value.
    Value(ValueScan),
    /// After the arguments (Qwen 2.5) or the name (GLM), until `</tool_call>`.
    Tail,
}

impl Body {
    pub(super) fn new(parser: ToolParser) -> Body {
        Body {
            parser,
            raw: String::new(),
            pending: String::new(),
            started: false,
            name: String::new(),
            phase: Phase::Header,
            glm_pairs: 0,
        }
    }

    /// Feeds text; returns what follows `</tool_call>` once the block closes.
    pub(super) fn push(&mut self, text: &str, tools: &[ToolSpec], ev: &mut Vec<Ev>) -> Option<String> {
        self.pending.push_str(text);
        loop {
            let close = self.pending.find(CALL_END);
            match &mut self.phase {
                Phase::Header => {
                    let region = &self.pending[..close.unwrap_or(self.pending.len())];
                    let name = match self.parser {
                        ToolParser::Qwen25
                        | ToolParser::Llama3
                        | ToolParser::Phi4Mini
                        | ToolParser::GptOss
                        | ToolParser::DeepseekV3
                        | ToolParser::DeepseekV31 => match call_header(region) {
                            Header::Yes { name, used } => Some((name, used)),
                            _ => None,
                        },
                        ToolParser::Glm45 => {
                            let cut = [region.find('\n'), region.find("<arg_key>")].into_iter().flatten().min();
                            match cut.or(close) {
                                Some(c) => Some((region[..c].trim().to_owned(), c))
                                    .filter(|(n, _)| !n.is_empty() && !n.contains('<')),
                                None => None,
                            }
                        }
                    };
                    if let Some((name, used)) = name {
                        self.started = true;
                        self.name.clone_from(&name);
                        ev.push(Ev::Start(name));
                        self.raw.extend(self.pending.drain(..used));
                        self.phase = match self.parser {
                            ToolParser::Qwen25
                            | ToolParser::Llama3
                            | ToolParser::Phi4Mini
                            | ToolParser::GptOss
                            | ToolParser::DeepseekV3
                            | ToolParser::DeepseekV31 => Phase::Value(ValueScan::default()),
                            ToolParser::Glm45 => Phase::Tail,
                        };
                        continue;
                    }
                    let p = close?;
                    // The block closed without a header we stream: a Qwen call in another key
                    // order is parsed whole; anything else is no call (the caller keeps it as
                    // content).
                    let inner = self.pending[..p].to_owned();
                    let left = self.pending[p + CALL_END.len()..].to_owned();
                    let parsed = match (self.parser, serde_json::from_str::<Value>(inner.trim())) {
                        (ToolParser::Qwen25, Ok(Value::Object(o))) => {
                            match (
                                o.get("name").and_then(Value::as_str),
                                o.get("arguments").or_else(|| o.get("parameters")),
                            ) {
                                (Some(n), Some(a)) => Some((n.to_owned(), a.to_string())),
                                _ => None,
                            }
                        }
                        _ => None,
                    };
                    match parsed {
                        Some((n, a)) => {
                            self.started = true;
                            ev.push(Ev::Start(n));
                            ev.push(Ev::Args(a));
                        }
                        None => ev.push(Ev::Content(format!("{CALL_START}{inner}{CALL_END}"))),
                    }
                    return Some(left);
                }
                Phase::Value(scan) => {
                    let n = scan.feed(&self.pending);
                    if n > 0 {
                        ev.push(Ev::Args(self.pending[..n].to_owned()));
                    }
                    let done = scan.done;
                    self.raw.extend(self.pending.drain(..n));
                    if !done {
                        return None;
                    }
                    self.phase = Phase::Tail;
                }
                Phase::Tail => {
                    if self.parser == ToolParser::Glm45 {
                        self.glm_pairs(tools, close, ev);
                    }
                    let p = self.pending.find(CALL_END)?;
                    if self.parser == ToolParser::Glm45 {
                        ev.push(Ev::Args(if self.glm_pairs == 0 { "{}".to_owned() } else { "}".to_owned() }));
                    }
                    return Some(self.pending[p + CALL_END.len()..].to_owned());
                }
            }
        }
    }

    /// GLM: the complete `<arg_key>k</arg_key><arg_value>v</arg_value>` pairs before `close`,
    /// each sent as one more member of the arguments object. A value is JSON when it parses as
    /// JSON and the tool's schema does not declare it a string (as SGLang's
    /// `glm4_moe_detector.py` does).
    pub(super) fn glm_pairs(&mut self, tools: &[ToolSpec], close: Option<usize>, ev: &mut Vec<Ev>) {
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
                .filter(|t| t.name == self.name)
                .find_map(|t| t.parameters.get("properties")?.get(&key)?.get("type")?.as_str())
                == Some("string");
            let value = if is_string {
                Value::from(raw_val)
            } else {
                serde_json::from_str::<Value>(raw_val.trim()).unwrap_or_else(|_| Value::from(raw_val))
            };
            let sep = if self.glm_pairs == 0 { "{" } else { "," };
            ev.push(Ev::Args(format!("{sep}{}:{value}", Value::from(key))));
            self.glm_pairs += 1;
            let used = v1 + "</arg_value>".len();
            self.raw.extend(self.pending.drain(..used));
        }
    }
}
