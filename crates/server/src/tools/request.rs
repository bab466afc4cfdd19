//! A request's tools, `tool_choice` and `parallel_tool_calls` ([`ToolRequest`]): read at each
//! API's edge (chat's body by name, `ToolRequest::parse`; the typed Responses and Messages
//! requests by their routes) and checked in one place (`ToolRequest::new`); the constraint
//! `required` and a named function put on generation, and the text a template without tool
//! support gets: the tools in a system prompt, earlier calls in the parser's format.

use super::format::{ToolFormat, ToolSpec};
use super::parser::{ChatParsers, ToolParser};
use crate::error::ApiError;
use crate::grammar::Constraint;
use crate::params::Fields;
use serde_json::{json, Map, Value};
use std::sync::Arc;

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
    /// The request's `tools` in the chat template's form (chat's as sent).
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
                format!(
                    "\"auto\" tool choice needs the server started with --tool-call-parser ({}); \
                     \"required\" or a named function work without one",
                    ToolParser::ALL.iter().map(|p| p.name()).collect::<Vec<_>>().join(", ")
                ),
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
/// same), ending in how to call in the format the server's parser reads (without a parser, the
/// Hermes form).
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
    out.push_str(format_of(parser).how_to_call());
    out
}

/// An assistant message's earlier `tool_calls` (`[{"function": {"name", "arguments"}}]`,
/// arguments as objects) written into its text in the format `parser` reads
/// ([`ToolFormat::history`]), for a template that cannot show calls; empty without calls.
pub fn history_calls(calls: &Value, parser: Option<ToolParser>) -> String {
    let calls: Vec<(&Value, &Value)> =
        calls.as_array().into_iter().flatten().map(|c| (&c["function"]["name"], &c["function"]["arguments"])).collect();
    if calls.is_empty() {
        return String::new();
    }
    format_of(parser).history(&calls)
}

/// The format `parser` names; without one, the Hermes forms (`qwen25`'s).
fn format_of(parser: Option<ToolParser>) -> &'static dyn ToolFormat {
    parser.unwrap_or(ToolParser::Qwen25).format()
}
