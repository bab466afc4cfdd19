//! Tool calls and reasoning content on `/v1/chat/completions`.
//!
//! - [`ToolRequest::parse`] reads OpenAI's `tools`, `tool_choice` (`none`, `auto`, `required`,
//!   `{"type": "function", "function": {"name": ...}}`) and `parallel_tool_calls`. `required`
//!   and a named function constrain generation ([`ToolRequest::constraint`]) to vLLM's shapes: a
//!   JSON array of `{"name", "parameters"}` objects, or the named function's arguments object.
//! - `auto` parses the model's own format, chosen by `--tool-call-parser` with SGLang's names
//!   (`sglang/srt/function_call/`): `qwen25` (Hermes / Qwen 2.5:
//!   `<tool_call>{"name": …, "arguments": {…}}</tool_call>`) and `glm45` (GLM-4.5 / GLM-5:
//!   `<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value>…</tool_call>`).
//! - `--reasoning-parser` (`glm45`, `qwen3`, `deepseek-r1`, SGLang's `reasoning_parser.py`)
//!   splits `<think>…</think>` into `reasoning_content`; `deepseek-r1` starts inside the
//!   reasoning (its template opens the `<think>`).
//!
//! [`Shaper`] turns a choice's text, piece by piece, into [`Delta`]s. It is one incremental
//! machine for both the stream and the collected answer (fed all at once), so the two agree by
//! construction; its output does not depend on how the text was split (tested char by char).

use std::str::FromStr;
use std::sync::Arc;

use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::grammar::Constraint;
use crate::params::Fields;

/// A `--tool-call-parser` (SGLang's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolParser {
    /// Hermes / Qwen 2.5: `<tool_call>{"name": …, "arguments": {…}}</tool_call>`.
    Qwen25,
    /// GLM-4.5 / GLM-5: `<tool_call>name\n<arg_key>k</arg_key>\n<arg_value>v</arg_value>…</tool_call>`.
    Glm45,
    /// Llama 3.1–3.3 JSON calls: the reply is `{"name": …, "parameters": {…}}` (after an
    /// optional `<|python_tag|>`), several separated by `;` (SGLang's `llama3` detector,
    /// `llama32_detector.py`).
    Llama3,
    /// Phi-4-mini: `functools[{"name": …, "arguments": {…}}, …]`, text around the block is
    /// content (SGLang's `phi4mini_detector.py`, vLLM's `phi4_mini_json`).
    Phi4Mini,
}

impl ToolParser {
    /// The flag value.
    pub fn name(self) -> &'static str {
        match self {
            ToolParser::Qwen25 => "qwen25",
            ToolParser::Glm45 => "glm45",
            ToolParser::Llama3 => "llama3",
            ToolParser::Phi4Mini => "phi4_mini",
        }
    }
}

impl FromStr for ToolParser {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "qwen25" | "qwen" | "hermes" => Ok(ToolParser::Qwen25),
            "glm45" | "glm47" => Ok(ToolParser::Glm45),
            "llama3" => Ok(ToolParser::Llama3),
            "phi4_mini" => Ok(ToolParser::Phi4Mini),
            _ => Err("have: qwen25 (also qwen, hermes), glm45 (also glm47), llama3, phi4_mini".to_owned()),
        }
    }
}

/// A `--reasoning-parser` (SGLang's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningParser {
    /// GLM-4.5: the model opens `<think>` itself.
    Glm45,
    /// Qwen 3: the model opens `<think>` itself.
    Qwen3,
    /// DeepSeek-R1: the template opens `<think>`, the output starts inside the reasoning.
    DeepseekR1,
}

impl ReasoningParser {
    /// The flag value.
    pub fn name(self) -> &'static str {
        match self {
            ReasoningParser::Glm45 => "glm45",
            ReasoningParser::Qwen3 => "qwen3",
            ReasoningParser::DeepseekR1 => "deepseek-r1",
        }
    }
}

impl FromStr for ReasoningParser {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "glm45" => Ok(ReasoningParser::Glm45),
            "qwen3" => Ok(ReasoningParser::Qwen3),
            "deepseek-r1" => Ok(ReasoningParser::DeepseekR1),
            _ => Err("have: glm45, qwen3, deepseek-r1".to_owned()),
        }
    }
}

/// The server's parsers (from `--tool-call-parser` and `--reasoning-parser`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChatParsers {
    /// How `auto` tool calls are read from the text.
    pub tool_call: Option<ToolParser>,
    /// How reasoning is split from the answer.
    pub reasoning: Option<ReasoningParser>,
}

/// One function of `tools`.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// `function.name`.
    pub name: String,
    /// `function.parameters` (`{"type": "object"}` when absent).
    pub parameters: Value,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// Never call a tool (tools are not shown to the model).
    None,
    /// The model decides; its format is parsed.
    Auto,
    /// At least one call, generation constrained.
    Required,
    /// This function, generation constrained to its arguments.
    Named(String),
}

/// The tool fields of a chat request.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRequest {
    /// The functions, in order.
    pub tools: Arc<[ToolSpec]>,
    /// The request's `tools` as sent (for the chat template).
    pub raw: Value,
    /// `tool_choice`.
    pub choice: ToolChoice,
    /// `parallel_tool_calls` (default true).
    pub parallel: bool,
}

impl ToolRequest {
    /// Parses `tools`, `tool_choice` and `parallel_tool_calls`; `None` without tools.
    ///
    /// # Errors
    /// A 400 naming the field: a tool that is not a function with a name, a `tool_choice` that
    /// names no given function or is given without tools, `auto` with no `--tool-call-parser`.
    pub fn parse(m: &Map<String, Value>, parsers: ChatParsers) -> Result<Option<ToolRequest>, ApiError> {
        let f = Fields(m);
        let parallel = f.bool("parallel_tool_calls")?.unwrap_or(true);
        let list = match f.get("tools") {
            None => None,
            Some(Value::Array(a)) if a.is_empty() => None,
            Some(Value::Array(a)) => Some(a),
            Some(_) => return Err(ApiError::bad("tools", "tools must be a list")),
        };
        let choice = match f.get("tool_choice") {
            None => None,
            Some(Value::String(s)) => Some(match s.as_str() {
                "none" => ToolChoice::None,
                "auto" => ToolChoice::Auto,
                "required" => ToolChoice::Required,
                other => {
                    return Err(ApiError::bad(
                        "tool_choice",
                        format!("tool_choice {other:?} is not none, auto, required or a function"),
                    ))
                }
            }),
            Some(v) => {
                let name = v
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .filter(|_| v.get("type").and_then(Value::as_str) == Some("function"))
                    .ok_or_else(|| {
                        ApiError::bad(
                            "tool_choice",
                            "tool_choice must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                        )
                    })?;
                Some(ToolChoice::Named(name.to_owned()))
            }
        };
        let Some(list) = list else {
            return match choice {
                None | Some(ToolChoice::None) => Ok(None),
                Some(_) => Err(ApiError::bad("tool_choice", "tool_choice is only allowed when tools are given")),
            };
        };
        let mut tools = Vec::with_capacity(list.len());
        for (i, t) in list.iter().enumerate() {
            let func = t
                .get("function")
                .filter(|_| t.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| {
                    ApiError::bad(
                        "tools",
                        format!("tools[{i}] must be {{\"type\": \"function\", \"function\": {{...}}}}"),
                    )
                })?;
            let name = func.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()).ok_or_else(|| {
                ApiError::bad("tools", format!("tools[{i}].function.name must be a non-empty string"))
            })?;
            let parameters = match func.get("parameters") {
                None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
                Some(p @ Value::Object(_)) => p.clone(),
                Some(_) => {
                    return Err(ApiError::bad(
                        "tools",
                        format!("tools[{i}].function.parameters must be a JSON schema object"),
                    ))
                }
            };
            tools.push(ToolSpec { name: name.to_owned(), parameters });
        }
        let choice = choice.unwrap_or(ToolChoice::Auto);
        if let ToolChoice::Named(n) = &choice {
            if !tools.iter().any(|t| &t.name == n) {
                return Err(ApiError::bad("tool_choice", format!("tool_choice names {n:?}, which is not in tools")));
            }
        }
        if choice == ToolChoice::Auto && parsers.tool_call.is_none() {
            return Err(ApiError::bad(
                "tool_choice",
                "\"auto\" tool choice needs the server started with --tool-call-parser (qwen25, glm45, llama3, phi4_mini); \
                 \"required\" or a named function work without one",
            ));
        }
        Ok(Some(ToolRequest { tools: tools.into(), raw: Value::Array(list.clone()), choice, parallel }))
    }

    /// The grammar `required` and a named function impose (vLLM's shapes), if any.
    pub fn constraint(&self) -> Option<Constraint> {
        match &self.choice {
            ToolChoice::None | ToolChoice::Auto => None,
            ToolChoice::Named(n) => {
                self.tools.iter().find(|t| &t.name == n).map(|t| Constraint::Json(t.parameters.clone()))
            }
            ToolChoice::Required => {
                let any: Vec<Value> = self
                    .tools
                    .iter()
                    .map(|t| {
                        json!({
                            "type": "object",
                            "properties": {"name": {"type": "string", "enum": [t.name]}, "parameters": t.parameters},
                            "required": ["name", "parameters"],
                            "additionalProperties": false
                        })
                    })
                    .collect();
                let mut schema = json!({"type": "array", "minItems": 1, "items": {"anyOf": any}});
                if !self.parallel {
                    schema["maxItems"] = json!(1);
                }
                Some(Constraint::Json(schema))
            }
        }
    }

    /// Whether the tools go into the prompt (not for `none`).
    pub fn shown(&self) -> bool {
        self.choice != ToolChoice::None
    }
}

/// The system message that describes `tools` to a chat template that cannot (vLLM does the
/// same), in the format the server's parser reads.
pub fn tools_system_prompt(tools: &Value, parser: Option<ToolParser>) -> String {
    let mut out = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for t in tools.as_array().into_iter().flatten() {
        out.push('\n');
        out.push_str(&t.to_string());
    }
    out.push_str("\n</tools>\n\n");
    match parser {
        Some(ToolParser::Glm45) => out.push_str(
            "For each function call, output the function name and arguments within the following XML format:\n\
             <tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n<arg_value>{arg-value-1}</arg_value>\n...\n</tool_call>",
        ),
        // Llama 3.1's own wording of its JSON calls.
        Some(ToolParser::Llama3) => out.push_str(
            "To call a function, respond with only a JSON object in the format \
             {\"name\": function name, \"parameters\": dictionary of argument name and its value}, and nothing else.",
        ),
        Some(ToolParser::Phi4Mini) => out.push_str(
            "To call functions, respond with functools[{\"name\": <function-name>, \"arguments\": <args-json-object>}, ...].",
        ),
        _ => out.push_str(
            "For each function call, return a json object with function name and arguments within \
             <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
        ),
    }
    out
}

/// An assistant message's earlier `tool_calls` (`[{"function": {"name", "arguments"}}]`,
/// arguments as objects) written into its text in the format `parser` reads, for a template
/// that cannot show calls: Phi-4-mini's `functools[…]`, Llama 3's `;`-separated JSON objects,
/// otherwise (`qwen25`, no parser, and `glm45`, whose templates show calls themselves) Hermes
/// `<tool_call>` blocks. JSON as Python's `json.dumps` writes it ([`py_json`]), as the model
/// cards' examples do. Starts with a newline.
pub fn history_calls(calls: &Value, parser: Option<ToolParser>) -> String {
    let calls: Vec<(&Value, &Value)> =
        calls.as_array().into_iter().flatten().map(|c| (&c["function"]["name"], &c["function"]["arguments"])).collect();
    if calls.is_empty() {
        return String::new();
    }
    match parser {
        Some(ToolParser::Phi4Mini) => {
            let list: Vec<Value> = calls.iter().map(|(n, a)| json!({"name": n, "arguments": a})).collect();
            format!("\nfunctools{}", py_json(&Value::Array(list)))
        }
        Some(ToolParser::Llama3) => {
            let list: Vec<String> = calls.iter().map(|(n, a)| py_json(&json!({"name": n, "parameters": a}))).collect();
            format!("\n{}", list.join("; "))
        }
        _ => calls
            .iter()
            .map(|(n, a)| format!("\n<tool_call>\n{}\n</tool_call>", py_json(&json!({"name": n, "arguments": a}))))
            .collect(),
    }
}

/// `v` as Python's `json.dumps(v)` writes it: `", "` and `": "` separators, non-ASCII as
/// `\uXXXX` escapes (surrogate pairs above U+FFFF), keys in their given order. What a model
/// card's `json.dumps(tools)` puts in the prompt, and so what the model was shown in training.
pub fn py_json(v: &Value) -> String {
    use serde::Serialize;
    use std::io::Write;
    struct Py;
    impl serde_json::ser::Formatter for Py {
        fn begin_array_value<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
            if first {
                Ok(())
            } else {
                w.write_all(b", ")
            }
        }
        fn begin_object_key<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
            if first {
                Ok(())
            } else {
                w.write_all(b", ")
            }
        }
        fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
            w.write_all(b": ")
        }
        fn write_string_fragment<W: ?Sized + Write>(&mut self, w: &mut W, fragment: &str) -> std::io::Result<()> {
            for c in fragment.chars() {
                if c.is_ascii() {
                    w.write_all(&[c as u8])?;
                } else {
                    let mut units = [0u16; 2];
                    for u in c.encode_utf16(&mut units) {
                        write!(w, "\\u{u:04x}")?;
                    }
                }
            }
            Ok(())
        }
    }
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, Py);
    // Writing a `Value` into a Vec cannot fail, and the formatter writes only ASCII.
    match v.serialize(&mut ser) {
        Ok(()) => String::from_utf8(out).unwrap_or_default(),
        Err(_) => v.to_string(),
    }
}

/// What a piece of a choice's text adds to its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delta {
    /// Answer text (`content`).
    Content(String),
    /// Reasoning text (`reasoning_content`).
    Reasoning(String),
    /// A tool call begins: its index among the choice's calls, id and function name.
    CallStart {
        /// From 0.
        index: usize,
        /// `call_` and 24 hex digits.
        id: String,
        /// The function.
        name: String,
    },
    /// More of call `index`'s `arguments` string.
    CallArgs {
        /// From 0.
        index: usize,
        /// The next characters of the arguments JSON.
        text: String,
    },
}

/// A finished choice's message, folded from its [`Delta`]s.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Message {
    /// The answer text.
    pub content: String,
    /// The reasoning text, when a reasoning parser ran.
    pub reasoning: Option<String>,
    /// `(id, name, arguments)` of each call.
    pub calls: Vec<(String, String, String)>,
}

impl Message {
    /// Folds deltas into the message.
    pub fn add(&mut self, d: &[Delta]) {
        for d in d {
            match d {
                Delta::Content(t) => self.content.push_str(t),
                Delta::Reasoning(t) => self.reasoning.get_or_insert_with(String::new).push_str(t),
                Delta::CallStart { id, name, .. } => self.calls.push((id.clone(), name.clone(), String::new())),
                Delta::CallArgs { index, text } => {
                    if let Some(c) = self.calls.get_mut(*index) {
                        c.2.push_str(text);
                    }
                }
            }
        }
    }
}

/// A fresh OpenAI-style tool call id.
fn call_id() -> String {
    format!("call_{:024x}", rand::random::<u128>() >> 32)
}

/// The per-choice machine: reasoning split, then tool calls.
#[derive(Debug)]
pub struct Shaper {
    think: Option<Think>,
    calls: Calls,
    out: Vec<Delta>,
    made: usize,
    parallel: bool,
}

#[derive(Debug)]
enum Calls {
    /// Plain content.
    Off,
    /// The model's own format.
    Tagged(Tagged),
    /// `required`: a JSON array of `{"name", "parameters"}`.
    Array(ArrayCalls),
    /// A named function: all text is its arguments.
    Named { name: String, started: bool },
    /// Llama 3's JSON calls.
    Llama3(Llama3Calls),
    /// Phi-4-mini's `functools[…]`.
    Functools(FunctoolsCalls),
}

impl Shaper {
    /// The machine for one choice of a request with `tools` under the server's `parsers`.
    /// `separate_reasoning: false` (SGLang's field) keeps reasoning in the content.
    pub fn new(parsers: ChatParsers, tools: Option<&ToolRequest>, separate_reasoning: bool) -> Shaper {
        let calls = match tools.map(|t| (&t.choice, t)) {
            None | Some((ToolChoice::None, _)) => Calls::Off,
            Some((ToolChoice::Auto, t)) => match parsers.tool_call {
                Some(ToolParser::Llama3) => Calls::Llama3(Llama3Calls::default()),
                Some(ToolParser::Phi4Mini) => Calls::Functools(FunctoolsCalls::default()),
                Some(p) => Calls::Tagged(Tagged::new(p, t.tools.clone())),
                None => Calls::Off,
            },
            Some((ToolChoice::Required, _)) => Calls::Array(ArrayCalls::default()),
            Some((ToolChoice::Named(n), _)) => Calls::Named { name: n.clone(), started: false },
        };
        Shaper {
            think: parsers.reasoning.filter(|_| separate_reasoning).map(Think::new),
            calls,
            out: Vec::new(),
            made: 0,
            parallel: tools.is_none_or(|t| t.parallel),
        }
    }

    /// True when the shaper does nothing (plain content), so callers can skip it.
    pub fn is_plain(&self) -> bool {
        self.think.is_none() && matches!(self.calls, Calls::Off)
    }

    /// Whether a reasoning parser runs (the message then carries `reasoning_content`).
    pub fn reasons(&self) -> bool {
        self.think.is_some()
    }

    /// How many tool calls have started.
    pub fn calls_made(&self) -> usize {
        self.made
    }

    /// Feeds the next text; returns what it adds.
    pub fn push(&mut self, text: &str) -> Vec<Delta> {
        let mut content = String::new();
        match &mut self.think {
            Some(t) => {
                let mut r = String::new();
                t.push(text, &mut r, &mut content);
                if !r.is_empty() {
                    self.out.push(Delta::Reasoning(r));
                }
            }
            None => content.push_str(text),
        }
        self.calls_text(&content, false);
        std::mem::take(&mut self.out)
    }

    /// Flushes what was held back at the end of the text.
    pub fn finish(&mut self) -> Vec<Delta> {
        let mut content = String::new();
        if let Some(t) = &mut self.think {
            let mut r = String::new();
            t.finish(&mut r, &mut content);
            if !r.is_empty() {
                self.out.push(Delta::Reasoning(r));
            }
        }
        self.calls_text(&content, true);
        std::mem::take(&mut self.out)
    }

    fn calls_text(&mut self, text: &str, end: bool) {
        let mut ev = Vec::new();
        match &mut self.calls {
            Calls::Off => {
                if !text.is_empty() {
                    ev.push(Ev::Content(text.to_owned()));
                }
            }
            Calls::Tagged(t) => t.push(text, end, &mut ev),
            Calls::Array(a) => a.push(text, &mut ev),
            Calls::Llama3(l) => l.push(text, end, &mut ev),
            Calls::Functools(f) => f.push(text, end, &mut ev),
            Calls::Named { name, started } => {
                if !*started && (!text.is_empty() || end) {
                    *started = true;
                    ev.push(Ev::Start(name.clone()));
                }
                if !text.is_empty() {
                    ev.push(Ev::Args(text.to_owned()));
                }
            }
        }
        for e in ev {
            match e {
                Ev::Content(t) => self.out.push(Delta::Content(t)),
                Ev::Start(name) => {
                    if self.parallel || self.made == 0 {
                        self.out.push(Delta::CallStart { index: self.made, id: call_id(), name });
                    }
                    self.made += 1;
                }
                Ev::Args(text) => {
                    if self.parallel || self.made == 1 {
                        self.out.push(Delta::CallArgs { index: self.made - 1, text });
                    }
                }
            }
        }
    }
}

/// Events of the call machines, before numbering.
enum Ev {
    Content(String),
    Start(String),
    Args(String),
}

const THINK_START: &str = "<think>";
const THINK_END: &str = "</think>";

/// The `<think>…</think>` split, as SGLang's `BaseReasoningFormatDetector`: reasoning and the
/// answer after it are stripped of surrounding whitespace.
#[derive(Debug)]
struct Think {
    force: bool,
    state: ThinkState,
    buf: String,
    /// Reasoning whitespace held until more reasoning follows (dropped before `</think>`).
    ws: String,
    emitted: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ThinkState {
    Undecided,
    In,
    AfterEnd,
    Out,
}

impl Think {
    fn new(p: ReasoningParser) -> Think {
        Think {
            force: p == ReasoningParser::DeepseekR1,
            state: ThinkState::Undecided,
            buf: String::new(),
            ws: String::new(),
            emitted: false,
        }
    }

    fn push(&mut self, text: &str, reasoning: &mut String, content: &mut String) {
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

    fn finish(&mut self, reasoning: &mut String, content: &mut String) {
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

/// Length of the longest proper suffix of `s` that is a prefix of `tag` (text that may yet
/// become the tag, held back).
fn partial_suffix(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&k| s.is_char_boundary(s.len() - k) && tag.starts_with(&s[s.len() - k..]))
        .unwrap_or(0)
}

const CALL_START: &str = "<tool_call>";
const CALL_END: &str = "</tool_call>";

/// `auto`: content with `<tool_call>…</tool_call>` blocks. Whitespace that only separates
/// content from calls is dropped (SGLang strips the normal text around calls); a reply with no
/// call is passed through unchanged.
#[derive(Debug)]
struct Tagged {
    parser: ToolParser,
    tools: Arc<[ToolSpec]>,
    buf: String,
    /// Trailing content whitespace, held until it is known not to precede a call.
    ws: String,
    in_call: Option<Body>,
    after_call: bool,
}

impl Tagged {
    fn new(parser: ToolParser, tools: Arc<[ToolSpec]>) -> Tagged {
        Tagged { parser, tools, buf: String::new(), ws: String::new(), in_call: None, after_call: false }
    }

    fn push(&mut self, text: &str, end: bool, ev: &mut Vec<Ev>) {
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
struct Body {
    parser: ToolParser,
    /// Text taken by the header or the name (kept for a block that turns out not to be a call).
    raw: String,
    /// Text not yet taken.
    pending: String,
    started: bool,
    /// The function, once known.
    name: String,
    phase: Phase,
    glm_pairs: usize,
}

#[derive(Debug)]
enum Phase {
    /// Before the function name.
    Header,
    /// Qwen 2.5: inside the arguments value.
    Value(ValueScan),
    /// After the arguments (Qwen 2.5) or the name (GLM), until `</tool_call>`.
    Tail,
}

impl Body {
    fn new(parser: ToolParser) -> Body {
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
    fn push(&mut self, text: &str, tools: &[ToolSpec], ev: &mut Vec<Ev>) -> Option<String> {
        self.pending.push_str(text);
        loop {
            let close = self.pending.find(CALL_END);
            match &mut self.phase {
                Phase::Header => {
                    let region = &self.pending[..close.unwrap_or(self.pending.len())];
                    let name = match self.parser {
                        ToolParser::Qwen25 | ToolParser::Llama3 | ToolParser::Phi4Mini => match call_header(region) {
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
                            ToolParser::Qwen25 | ToolParser::Llama3 | ToolParser::Phi4Mini => {
                                Phase::Value(ValueScan::default())
                            }
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
    fn glm_pairs(&mut self, tools: &[ToolSpec], close: Option<usize>, ev: &mut Vec<Ev>) {
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

/// `required`: the constrained `[{"name": …, "parameters": …}, …]`.
#[derive(Debug, Default)]
struct ArrayCalls {
    raw: String,
    pos: usize,
    scan: Option<ValueScan>,
    /// Inside an element after its arguments, until its `}`.
    tail: bool,
}

impl ArrayCalls {
    fn push(&mut self, text: &str, ev: &mut Vec<Ev>) {
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

impl Llama3Calls {
    fn push(&mut self, text: &str, end: bool, ev: &mut Vec<Ev>) {
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

impl FunctoolsCalls {
    fn push(&mut self, text: &str, end: bool, ev: &mut Vec<Ev>) {
        let mut rest = text.to_owned();
        loop {
            if let Some(b) = &mut self.inside {
                let n = b.scan.feed(&rest);
                b.raw.push_str(&rest[..n]);
                let before = ev.len();
                b.calls.push(&rest[..n], ev);
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

enum Header {
    More,
    No,
    Yes { name: String, used: usize },
}

/// Matches `{ "name" : "<name>" , "arguments"|"parameters" :` with free whitespace at the start
/// of `s` (a call whose name comes first, as models and our grammar write it).
fn call_header(s: &str) -> Header {
    let b = s.as_bytes();
    let mut i = 0;
    let ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    // A JSON string at i: its decoded value and the index after it.
    let string = |i: usize| -> Result<Option<(String, usize)>, ()> {
        if i >= b.len() {
            return Ok(None);
        }
        if b[i] != b'"' {
            return Err(());
        }
        let mut j = i + 1;
        while j < b.len() {
            match b[j] {
                b'\\' => j += 2,
                b'"' => {
                    return serde_json::from_str::<String>(&s[i..=j]).map(|v| Some((v, j + 1))).map_err(|_| ());
                }
                _ => j += 1,
            }
        }
        Ok(None)
    };
    macro_rules! expect {
        ($c:expr) => {{
            ws(&mut i);
            if i >= b.len() {
                return Header::More;
            }
            if b[i] != $c {
                return Header::No;
            }
            i += 1;
        }};
    }
    macro_rules! string {
        () => {{
            ws(&mut i);
            match string(i) {
                Err(()) => return Header::No,
                Ok(None) => return Header::More,
                Ok(Some((v, j))) => {
                    i = j;
                    v
                }
            }
        }};
    }
    expect!(b'{');
    if string!() != "name" {
        return Header::No;
    }
    expect!(b':');
    let name = string!();
    expect!(b',');
    let key = string!();
    if key != "arguments" && key != "parameters" {
        return Header::No;
    }
    expect!(b':');
    ws(&mut i);
    if i >= b.len() {
        return Header::More;
    }
    Header::Yes { name, used: i }
}

/// Finds where one JSON value ends in text that arrives piece by piece (depth, strings and
/// escapes), so a call's arguments are streamed exactly as written.
#[derive(Debug, Default)]
struct ValueScan {
    started: bool,
    depth: u32,
    in_str: bool,
    esc: bool,
    prim: bool,
    done: bool,
}

impl ValueScan {
    /// Feeds `s`; returns how many of its bytes belong to the value.
    fn feed(&mut self, s: &str) -> usize {
        for (i, c) in s.char_indices() {
            if self.done {
                return i;
            }
            if !self.started {
                self.started = true;
                match c {
                    '{' | '[' => self.depth = 1,
                    '"' => self.in_str = true,
                    _ => self.prim = true,
                }
                continue;
            }
            if self.in_str {
                if self.esc {
                    self.esc = false;
                } else if c == '\\' {
                    self.esc = true;
                } else if c == '"' {
                    self.in_str = false;
                    if self.depth == 0 {
                        self.done = true;
                    }
                }
                continue;
            }
            if self.prim {
                if c.is_whitespace() || matches!(c, ',' | '}' | ']' | '<') {
                    self.done = true;
                    return i;
                }
                continue;
            }
            match c {
                '{' | '[' => self.depth += 1,
                '}' | ']' => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        self.done = true;
                    }
                }
                '"' => self.in_str = true,
                _ => {}
            }
        }
        s.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Arc<[ToolSpec]> {
        vec![ToolSpec {
            name: "get_weather".into(),
            parameters: json!({"type": "object", "properties": {"location": {"type": "string"}, "days": {"type": "integer"}}}),
        }]
        .into()
    }

    fn req(choice: ToolChoice, parallel: bool) -> ToolRequest {
        ToolRequest { tools: weather(), raw: json!([]), choice, parallel }
    }

    /// Runs `text` through a shaper whole and char by char; both must fold to one message.
    fn run(parsers: ChatParsers, tools: Option<&ToolRequest>, text: &str) -> Message {
        let mut whole = Shaper::new(parsers, tools, true);
        let mut a = Message::default();
        a.add(&whole.push(text));
        a.add(&whole.finish());
        let mut pieces = Shaper::new(parsers, tools, true);
        let mut b = Message::default();
        for (i, c) in text.char_indices() {
            b.add(&pieces.push(&text[i..i + c.len_utf8()]));
        }
        b.add(&pieces.finish());
        let strip = |m: &Message| m.calls.iter().map(|c| (c.1.clone(), c.2.clone())).collect::<Vec<_>>();
        assert_eq!((&a.content, &a.reasoning, strip(&a)), (&b.content, &b.reasoning, strip(&b)), "{text:?}");
        a
    }

    /// Each text is content as written, with no call.
    fn assert_plain(p: ChatParsers, r: &ToolRequest, texts: &[&str]) {
        for plain in texts {
            assert_eq!(run(p, Some(r), plain), Message { content: (*plain).into(), ..Default::default() }, "{plain:?}");
        }
    }

    fn calls(m: &Message) -> Vec<(&str, Value)> {
        m.calls.iter().map(|c| (c.1.as_str(), serde_json::from_str(&c.2).unwrap_or(Value::Null))).collect()
    }

    #[test]
    fn qwen25_calls_and_content() {
        let p = ChatParsers { tool_call: Some(ToolParser::Qwen25), reasoning: None };
        let r = req(ToolChoice::Auto, true);
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris, \\\"FR\\\" </tool_call>\", \"days\": 3}}\n</tool_call>\n<tool_call>\n{\"arguments\": {\"location\": \"Nice\"}, \"name\": \"get_weather\"}\n</tool_call>";
        let m = run(p, Some(&r), text);
        assert_eq!(m.content, "Let me check.");
        assert_eq!(
            calls(&m),
            vec![
                ("get_weather", json!({"location": "Paris, \"FR\" </tool_call>", "days": 3})),
                ("get_weather", json!({"location": "Nice"}))
            ]
        );
        // The streamed arguments are the model's own text.
        assert_eq!(m.calls[0].2, "{\"location\": \"Paris, \\\"FR\\\" </tool_call>\", \"days\": 3}");
        assert!(m.calls[0].0.starts_with("call_") && m.calls[0].0.len() == 29);
        // No call: the text is unchanged, whitespace and a lone `<` included.
        let plain = "  a < b\n\n";
        assert_eq!(run(p, Some(&r), plain), Message { content: plain.into(), ..Default::default() });
        // Not a call: the block is content.
        let m = run(p, Some(&r), "x <tool_call>oops</tool_call>");
        assert_eq!((m.content.as_str(), m.calls.len()), ("x<tool_call>oops</tool_call>", 0));
        // parallel_tool_calls: false keeps the first call.
        let m = run(p, Some(&req(ToolChoice::Auto, false)), text);
        assert_eq!(m.calls.len(), 1);
    }

    /// Llama 3's JSON calls (the shapes SGLang's `llama3` detector reads): after
    /// `<|python_tag|>` or bare, several separated by `;`, `parameters` or `arguments`; a reply
    /// that is not a call, even one that starts with JSON, is content.
    #[test]
    fn llama3_calls() {
        let p = ChatParsers { tool_call: Some(ToolParser::Llama3), reasoning: None };
        let r = req(ToolChoice::Auto, true);
        let text = "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Paris; FR\", \"days\": 2}}; {\"name\": \"get_weather\", \"arguments\": {\"location\": \"Oslo\"}}";
        let m = run(p, Some(&r), text);
        assert_eq!(m.content, "");
        assert_eq!(
            calls(&m),
            vec![
                ("get_weather", json!({"location": "Paris; FR", "days": 2})),
                ("get_weather", json!({"location": "Oslo"}))
            ]
        );
        assert_eq!(m.calls[0].2, "{\"location\": \"Paris; FR\", \"days\": 2}");
        let m = run(p, Some(&r), "\n {\"name\": \"get_weather\", \"parameters\": {}}");
        assert_eq!(calls(&m), vec![("get_weather", json!({}))]);
        assert_plain(p, &r, &["The weather is fine.", "{\"answer\": 4}", "  <|python", ""]);
    }

    /// Phi-4-mini's `functools[…]` (the shapes SGLang's `phi4_mini` detector reads): text
    /// before and after the block is content, brackets inside strings do not close it, and a
    /// text that only mentions "functools" is content.
    #[test]
    fn phi4_mini_calls() {
        let p = ChatParsers { tool_call: Some(ToolParser::Phi4Mini), reasoning: None };
        let r = req(ToolChoice::Auto, true);
        let text = "Checking. functools[{\"name\": \"get_weather\", \"arguments\": {\"location\": \"a]b [c\", \"days\": [1, 2]}}, {\"name\": \"get_weather\", \"parameters\": {\"location\": \"Oslo\"}}] Done.";
        let m = run(p, Some(&r), text);
        assert_eq!(m.content, "Checking.  Done.");
        assert_eq!(
            calls(&m),
            vec![
                ("get_weather", json!({"location": "a]b [c", "days": [1, 2]})),
                ("get_weather", json!({"location": "Oslo"}))
            ]
        );
        assert_eq!(m.calls[0].2, "{\"location\": \"a]b [c\", \"days\": [1, 2]}");
        // Not calls: a mention, a held-back prefix at the end, a block with no call in it
        // (closed or cut off) is content as written.
        assert_plain(
            p,
            &r,
            &[
                "No tools: functools is a Python module.",
                "ends on functool",
                "",
                "use functools[0] and x[1] then",
                "functools[ \"not a call ] yet\" ] after",
                "cut off: functools[{\"x\": [1, 2",
            ],
        );
        // parallel_tool_calls: false keeps the first call.
        assert_eq!(run(p, Some(&req(ToolChoice::Auto, false)), text).calls.len(), 1);
        // Cut off inside the block: the call it started, its arguments as far as they came.
        let m = run(p, Some(&r), "functools[{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Ro");
        assert_eq!((m.calls.len(), m.calls[0].2.as_str()), (1, "{\"location\": \"Ro"));
    }

    /// Earlier calls written into the history for a template that cannot show them read back,
    /// through the same parser, as the same calls.
    #[test]
    fn history_calls_read_back() {
        let r = req(ToolChoice::Auto, true);
        let sent = json!([
            {"function": {"name": "get_weather", "arguments": {"location": "Oslo"}}},
            {"function": {"name": "get_weather", "arguments": {"location": "Rome", "days": 2}}}
        ]);
        for parser in [ToolParser::Phi4Mini, ToolParser::Llama3, ToolParser::Qwen25] {
            let text = history_calls(&sent, Some(parser));
            let m = run(ChatParsers { tool_call: Some(parser), reasoning: None }, Some(&r), &text);
            assert_eq!(
                calls(&m),
                vec![
                    ("get_weather", json!({"location": "Oslo"})),
                    ("get_weather", json!({"location": "Rome", "days": 2}))
                ],
                "{parser:?}: {text}"
            );
        }
        assert_eq!(history_calls(&json!([]), Some(ToolParser::Phi4Mini)), "");
    }

    /// `py_json` writes what Python's `json.dumps` writes (strings checked against CPython 3.11:
    /// `json.dumps({"a": [1, 2.5, None], "b": "Zürich 🙂", "c": {"d": True}})`).
    #[test]
    fn py_json_is_json_dumps() {
        let v: Value =
            serde_json::from_str(r#"{"a": [1, 2.5, null], "b": "Zürich 🙂", "c": {"d": true}}"#).unwrap_or_default();
        assert_eq!(py_json(&v), r#"{"a": [1, 2.5, null], "b": "Z\u00fcrich \ud83d\ude42", "c": {"d": true}}"#);
        // The tools string of the template golden's Phi-4-mini conversation, made by
        // `json.dumps` in chat_template_golden.py: what the server puts on the system message.
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../tokenizer/tests/fixtures/chat_template_golden.json");
        let g: Value = serde_json::from_str(&std::fs::read_to_string(p).expect("fixture")).expect("JSON");
        let case = g["cases"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["conversation"] == "tools on the system message"))
            .expect("case");
        let sent = case["messages"][0]["tools"].as_str().expect("tools string");
        assert_eq!(py_json(&serde_json::from_str(sent).expect("tools JSON")), sent);
    }

    #[test]
    fn glm45_calls() {
        let p = ChatParsers { tool_call: Some(ToolParser::Glm45), reasoning: Some(ReasoningParser::Glm45) };
        let r = req(ToolChoice::Auto, true);
        let text = "<think>The user wants weather.\n</think>\n\nSure.<tool_call>get_weather\n<arg_key>location</arg_key>\n<arg_value>42</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call><tool_call>get_weather\n</tool_call>";
        let m = run(p, Some(&r), text);
        assert_eq!(m.reasoning.as_deref(), Some("The user wants weather."));
        assert_eq!(m.content, "Sure.");
        // `location` is a string in the schema: "42" stays a string; `days` is parsed.
        assert_eq!(calls(&m), vec![("get_weather", json!({"location": "42", "days": 3})), ("get_weather", json!({}))]);
        assert_eq!(m.calls[0].2, "{\"location\":\"42\",\"days\":3}");
        // Cut off inside a call (max_tokens): the complete pairs, closed.
        let m =
            run(p, Some(&r), "<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n<arg_key>loc");
        assert_eq!(calls(&m), vec![("get_weather", json!({"days": 2}))]);
    }

    #[test]
    fn reasoning_split() {
        let q = ChatParsers { tool_call: None, reasoning: Some(ReasoningParser::Qwen3) };
        let m = run(q, None, "\n<think>\nstep 1\n\nstep 2  \n</think>\n\nThe answer is 4.");
        assert_eq!((m.reasoning.as_deref(), m.content.as_str()), (Some("step 1\n\nstep 2"), "The answer is 4."));
        // Not forced: no <think>, no reasoning.
        let m = run(q, None, "<thin is not a tag");
        assert_eq!((m.reasoning, m.content.as_str()), (None, "<thin is not a tag"));
        // DeepSeek-R1 starts inside the reasoning; cut off before </think>, all is reasoning.
        let r1 = ChatParsers { tool_call: None, reasoning: Some(ReasoningParser::DeepseekR1) };
        let m = run(r1, None, "hmm </thi");
        assert_eq!((m.reasoning.as_deref(), m.content.as_str()), (Some("hmm </thi"), ""));
        let m = run(r1, None, "a</think>b");
        assert_eq!((m.reasoning.as_deref(), m.content.as_str()), (Some("a"), "b"));
    }

    #[test]
    fn constrained_shapes() {
        let none = ChatParsers::default();
        let m = run(none, Some(&req(ToolChoice::Required, true)), "[{\"name\":\"get_weather\",\"parameters\":{\"location\":\"a}\",\"days\":[1,{\"x\":2}]}},{\"name\":\"get_weather\",\"parameters\":{}}]");
        assert_eq!(
            calls(&m),
            vec![("get_weather", json!({"location": "a}", "days": [1, {"x": 2}]})), ("get_weather", json!({}))]
        );
        assert_eq!(m.content, "");
        let m = run(none, Some(&req(ToolChoice::Named("get_weather".into()), true)), "{\"location\":\"Paris\"}");
        assert_eq!(calls(&m), vec![("get_weather", json!({"location": "Paris"}))]);
        let c = req(ToolChoice::Required, false).constraint();
        let Some(Constraint::Json(s)) = c else { panic!("a schema") };
        assert_eq!((s["minItems"].clone(), s["maxItems"].clone()), (json!(1), json!(1)));
        assert_eq!(s["items"]["anyOf"][0]["properties"]["name"]["enum"], json!(["get_weather"]));
    }

    #[test]
    fn tool_fields() {
        let parse = |v: Value, p| ToolRequest::parse(v.as_object().expect("object"), p);
        let with = ChatParsers { tool_call: Some(ToolParser::Qwen25), reasoning: None };
        let tools = json!([{"type": "function", "function": {"name": "f"}}]);
        let r = parse(json!({"tools": tools}), with).expect("ok").expect("some");
        assert_eq!((r.choice.clone(), r.parallel), (ToolChoice::Auto, true));
        assert_eq!(r.tools[0].parameters, json!({"type": "object", "properties": {}}));
        for (body, field) in [
            (json!({"tools": tools}), "tool_choice"), // auto without a parser
            (json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "g"}}}), "tool_choice"),
            (json!({"tool_choice": "required"}), "tool_choice"),
            (json!({"tools": [{"type": "function", "function": {}}], "tool_choice": "required"}), "tools"),
            (json!({"tools": tools, "tool_choice": "sometimes"}), "tool_choice"),
        ] {
            match parse(body.clone(), ChatParsers::default()) {
                Err(ApiError::BadRequest { param, .. }) => assert_eq!(param.as_deref(), Some(field), "{body}"),
                other => panic!("{body}: {other:?}"),
            }
        }
        assert!(parse(json!({"tools": tools, "tool_choice": "required"}), ChatParsers::default()).is_ok());
        assert_eq!(parse(json!({"tool_choice": "none"}), with).expect("ok"), None);
    }
}
