//! OpenAI's `tools`, `tool_choice` and `parallel_tool_calls` read and checked ([`ToolRequest`]),
//! the constraint `required` and a named function put on generation, and the text a template
//! without tool support gets: the tools in a system prompt, earlier calls in the parser's format.

use super::{ChatParsers, ToolParser};
use crate::error::ApiError;
use crate::grammar::Constraint;
use crate::params::Fields;
use serde_json::{json, Map, Value};
use std::sync::Arc;

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

impl ToolChoice {
    /// A `tool_choice` word: `none`, `auto` or `required`.
    ///
    /// # Errors
    /// A 400 naming `tool_choice` for another word.
    pub fn word(s: &str) -> Result<ToolChoice, ApiError> {
        match s {
            "none" => Ok(ToolChoice::None),
            "auto" => Ok(ToolChoice::Auto),
            "required" => Ok(ToolChoice::Required),
            other => Err(ApiError::bad(
                "tool_choice",
                format!("tool_choice {other:?} is not none, auto, required or a function"),
            )),
        }
    }
}

impl ToolSpec {
    /// Function `name` taking `parameters` (`{"type": "object", "properties": {}}` when absent
    /// or null); `at` is the schema's field as the API spells it (`tools[0].input_schema`).
    ///
    /// # Errors
    /// A 400 naming `tools` when the schema is not an object.
    pub fn new(name: &str, parameters: Option<&Value>, at: &str) -> Result<ToolSpec, ApiError> {
        let parameters = match parameters {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => return Err(ApiError::bad("tools", format!("{at} must be a JSON schema object"))),
        };
        Ok(ToolSpec { name: name.to_owned(), parameters })
    }
}

impl ToolRequest {
    /// The checks every API's tool fields share, on what its edge read: `tools` (and the same
    /// list in the chat template's form, `[{"type": "function", "function": {...}}]`), the
    /// choice and `parallel_tool_calls`. `None` without tools.
    ///
    /// # Errors
    /// A 400 naming `tool_choice`: a choice other than `none` without tools, a function that
    /// is not among the tools, `auto` with no `--tool-call-parser`.
    pub fn new(
        tools: Vec<ToolSpec>,
        template: Value,
        choice: Option<ToolChoice>,
        parallel: bool,
        parsers: ChatParsers,
    ) -> Result<Option<ToolRequest>, ApiError> {
        if tools.is_empty() {
            return match choice {
                None | Some(ToolChoice::None) => Ok(None),
                Some(_) => Err(ApiError::bad("tool_choice", "tool_choice is only allowed when tools are given")),
            };
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
        Ok(Some(ToolRequest { tools: tools.into(), raw: template, choice, parallel }))
    }

    /// Chat's edge: OpenAI's `tools`, `tool_choice` and `parallel_tool_calls` read by name,
    /// then [`ToolRequest::new`]; `None` without tools.
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
            Some(Value::String(s)) => Some(ToolChoice::word(s)?),
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
        let mut tools = Vec::new();
        for (i, t) in list.into_iter().flatten().enumerate() {
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
            tools.push(ToolSpec::new(name, func.get("parameters"), &format!("tools[{i}].function.parameters"))?);
        }
        let template = Value::Array(list.cloned().unwrap_or_default());
        ToolRequest::new(tools, template, choice, parallel, parsers)
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

/// One function tool in the chat template's form (`{"type": "function", "function": {"name",
/// "parameters", "description"}}`), for an API whose tools come in another shape.
pub fn template_tool(name: &str, description: Option<&str>, parameters: Option<&Value>) -> Value {
    let mut f = json!({"name": name, "parameters": parameters});
    if let Some(d) = description {
        f["description"] = json!(d);
    }
    json!({"type": "function", "function": f})
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
        // DeepSeek-V3's and V3.1's templates' own wording of their call formats.
        Some(ToolParser::DeepseekV3) => out.push_str(
            "To call functions, respond with <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>{function-name}\n\
             ```json\n{args-json-object}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ),
        Some(ToolParser::DeepseekV31) => out.push_str(
            "To call functions, respond with <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{function-name}<｜tool▁sep｜>\
             {args-json-object}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
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
        Some(ToolParser::DeepseekV3) => {
            let body: String = calls
                .iter()
                .map(|(n, a)| {
                    let name = n.as_str().unwrap_or_default();
                    format!("<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{}\n```<｜tool▁call▁end｜>", py_json(a))
                })
                .collect::<Vec<_>>()
                // DeepSeek-V3's template puts a newline between calls.
                .join("\n");
            format!("\n<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>")
        }
        Some(ToolParser::DeepseekV31) => {
            let body: String = calls
                .iter()
                .map(|(n, a)| {
                    let name = n.as_str().unwrap_or_default();
                    format!("<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{}<｜tool▁call▁end｜>", py_json(a))
                })
                .collect();
            format!("\n<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>")
        }
        // gpt-oss's template shows calls itself; for one that cannot, harmony's own messages.
        Some(ToolParser::GptOss) => calls
            .iter()
            .map(|(n, a)| {
                let name = n.as_str().unwrap_or_default();
                format!("<|start|>assistant<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{a}<|call|>")
            })
            .collect(),
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
