//! What every tool-call format is built from, imported by the formats and importing none of
//! them: the [`ToolFormat`] trait a format implements (its names, the machine that reads its
//! calls, how a prompt shows tools and earlier calls), the [`CallMachine`] its machine is, the
//! events a machine emits ([`Ev`]), the functions it reads ([`ToolSpec`]), [`partial_suffix`]
//! for held-back markers.

use std::fmt::Debug;
use std::sync::Arc;

use serde_json::{json, Value};
use sparrow_tokenizer::pyjson::{dumps, DumpsOptions};

use crate::error::ApiError;

/// One tool-call format, as SGLang's detector classes (`function_call/*_detector.py`) own
/// parsing, streaming and the prompt format: a row of the `--tool-call-parser` table
/// (`ToolParser`). The provided methods are the Hermes `<tool_call>` forms, so a format states
/// only where it differs.
pub trait ToolFormat: Sync {
    /// Its `--tool-call-parser` names: the first is the flag value shown, the others SGLang's
    /// aliases.
    fn names(&self) -> &'static [&'static str];

    /// A fresh machine reading one choice's calls under `tool_choice: auto` with `tools`.
    fn machine(&self, tools: &Arc<[ToolSpec]>) -> Box<dyn CallMachine>;

    /// How to call, closing the system prompt that lists the tools for a template that cannot
    /// show them (vLLM does the same).
    fn how_to_call(&self) -> &'static str {
        "For each function call, return a json object with function name and arguments within \
         <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>"
    }

    /// Earlier calls `(name, arguments)` (arguments as objects) written into an assistant
    /// message's text for a template that cannot show them, so that this format's machine reads
    /// them back as the same calls; starts with a newline. JSON as the model cards write it,
    /// with Python's `json.dumps` (`sparrow_tokenizer::pyjson`).
    fn history(&self, calls: &[(&Value, &Value)]) -> String {
        calls
            .iter()
            .map(|(n, a)| {
                format!(
                    "\n<tool_call>\n{}\n</tool_call>",
                    dumps(&json!({"name": n, "arguments": a}), &DumpsOptions::PYTHON)
                )
            })
            .collect()
    }
}

/// A format's machine for one choice: the answer's text, piece by piece, into [`Ev`]s. Its
/// output must not depend on how the text was cut (markers split across pieces are held back).
pub trait CallMachine: Debug + Send {
    /// Feeds the next text; `end`: the answer is over, nothing is held back any more.
    fn push(&mut self, text: &str, end: bool, ev: &mut Vec<Ev>);

    /// Whether it splits reasoning off itself ([`Ev::Reasoning`]; gpt-oss's harmony).
    fn reasons(&self) -> bool {
        false
    }
}

/// What a machine reads from the text, before calls are numbered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ev {
    /// Answer text.
    Content(String),
    /// Reasoning text.
    Reasoning(String),
    /// A call to this function begins.
    Start(String),
    /// More of the current call's arguments.
    Args(String),
}

/// One function of a request's `tools`.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// The function's name.
    pub name: String,
    /// Its arguments' JSON schema (`{"type": "object"}` when absent).
    pub parameters: Value,
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

/// Length of the longest proper suffix of `s` that is a prefix of `tag` (text that may yet
/// become the tag, held back).
pub(super) fn partial_suffix(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&k| s.is_char_boundary(s.len() - k) && tag.starts_with(&s[s.len() - k..]))
        .unwrap_or(0)
}
