//! Responses `tools` as the model sees them: `function` tools as they are, the functions of a
//! `namespace` tool flattened to `{namespace}__{name}` (Codex's own flat spelling, which it uses
//! for providers without namespaces), and hosted tools (`web_search`, `file_search`,
//! `code_interpreter`, `computer_use_preview`, `image_generation`, `mcp`, `custom`, …) left out
//! and reported, since this server cannot run them.
//!
//! A call the model makes to a flattened name goes back as a `function_call` item with the
//! function's own `name` and its `namespace`, which is how Codex routes it (its
//! `ToolCall::from_response_item` reads both); a `function_call` input item with a `namespace`
//! is shown to the model under the flat name again. Only names the request's own namespaces
//! produced are mapped back, so a function that merely has `__` in its name is left alone (the
//! review of vLLM's namespace support, vllm-project/vllm#46784, settled on the same rule).

use std::collections::HashMap;

use serde_json::{Map, Value};
use sparrow_protocol::responses::{ResponsesRequest, Tool};

use crate::error::ApiError;
use crate::state::AppState;
use crate::tools::{template_tool, ToolChoice, ToolRequest, ToolSpec};

/// The flat name of function `name` of namespace `ns`.
pub(super) fn flat_name(ns: &str, name: &str) -> String {
    format!("{ns}__{name}")
}

/// What the request's tools became.
#[derive(Debug, Default)]
pub(super) struct Offered {
    /// The function tools offered, `tool_choice` and `parallel_tool_calls`.
    pub tools: Option<ToolRequest>,
    /// Flat name → (namespace, function name), for the calls' items.
    pub namespaced: HashMap<String, (String, String)>,
    /// The tools left out, as `type` or `type name` (a hosted tool, a namespace's non-function
    /// member), in request order.
    pub not_offered: Vec<String>,
}

impl Offered {
    /// `(name, namespace)` of a call to `flat` as the client knows the function.
    pub fn call_name<'a>(&'a self, flat: &'a str) -> (&'a str, Option<&'a str>) {
        match self.namespaced.get(flat) {
            Some((ns, name)) => (name, Some(ns)),
            None => (flat, None),
        }
    }
}

/// Reads `tools`, `tool_choice` and `parallel_tool_calls`, then [`ToolRequest::new`]'s checks.
///
/// # Errors
/// A 400 naming the field: a function (or namespace) without a name, a `tool_choice` of
/// another shape than `none`/`auto`/`required`/`{"type": "function", "name"[, "namespace"]}`,
/// a `tool_choice` that forces a hosted tool, and [`ToolRequest::new`]'s.
pub(super) fn offered(s: &AppState, r: &ResponsesRequest) -> Result<Offered, ApiError> {
    let mut out = Offered::default();
    let mut specs: Vec<(String, Option<Value>)> = Vec::new();
    let mut template = Vec::new();
    let mut add = |name: String, t: &Tool, prefix: Option<&str>, specs: &mut Vec<(String, Option<Value>)>| {
        let description = match (prefix, t.description.as_deref()) {
            (Some(p), Some(d)) if !p.trim().is_empty() => Some(format!("{p}\n\n{d}")),
            (Some(p), None) if !p.trim().is_empty() => Some(p.to_owned()),
            (_, d) => d.map(str::to_owned),
        };
        template.push(template_tool(&name, description.as_deref(), t.parameters.as_ref()));
        specs.push((name, t.parameters.clone()));
    };
    let tools = r.tools.as_deref().unwrap_or_default();
    for (i, t) in tools.iter().enumerate() {
        let named = |what: &str| {
            t.name.as_deref().filter(|n| !n.is_empty()).map(str::to_owned).ok_or_else(|| {
                ApiError::bad("tools", format!("tools[{i}].name must be a non-empty string ({what} tools have one)"))
            })
        };
        match t.kind.as_str() {
            "function" => {
                let name = named("function")?;
                add(name, t, None, &mut specs);
            }
            "namespace" => {
                let ns = named("namespace")?;
                for (j, f) in t.tools.as_deref().unwrap_or_default().iter().enumerate() {
                    if f.kind != "function" {
                        out.not_offered.push(format!("{} {ns}.{}", f.kind, f.name.as_deref().unwrap_or("?")));
                        continue;
                    }
                    let Some(name) = f.name.as_deref().filter(|n| !n.is_empty()) else {
                        return Err(ApiError::bad(
                            "tools",
                            format!("tools[{i}].tools[{j}].name must be a non-empty string"),
                        ));
                    };
                    let flat = flat_name(&ns, name);
                    out.namespaced.insert(flat.clone(), (ns.clone(), name.to_owned()));
                    add(flat, f, t.description.as_deref(), &mut specs);
                }
            }
            hosted => out.not_offered.push(match t.name.as_deref() {
                Some(n) => format!("{hosted} {n}"),
                None => hosted.to_owned(),
            }),
        }
    }
    let choice = match &r.tool_choice {
        None => None,
        // Every offered tool may have been a hosted one: `auto` then offers nothing.
        Some(Value::String(w)) if specs.is_empty() && w == "auto" => None,
        Some(Value::String(w)) => Some(ToolChoice::word(w)?),
        Some(Value::Object(o)) => Some(named_choice(o, &out)?),
        Some(_) => return Err(bad_choice()),
    };
    let specs = specs
        .iter()
        .enumerate()
        .map(|(i, (name, p))| ToolSpec::new(name, p.as_ref(), &format!("tools[{i}].parameters")))
        .collect::<Result<_, _>>()?;
    out.tools =
        ToolRequest::new(specs, Value::Array(template), choice, r.parallel_tool_calls.unwrap_or(true), s.parsers)?;
    Ok(out)
}

fn bad_choice() -> ApiError {
    ApiError::bad(
        "tool_choice",
        "tool_choice must be none, auto, required or {\"type\": \"function\", \"name\": ...} \
         (with \"namespace\" for a namespace's function)",
    )
}

/// `{"type": "function", "name"[, "namespace"]}` as the flat name the model was offered.
fn named_choice(o: &Map<String, Value>, offered: &Offered) -> Result<ToolChoice, ApiError> {
    match o.get("type").and_then(Value::as_str) {
        Some("function") => {
            let name = o.get("name").and_then(Value::as_str).ok_or_else(bad_choice)?;
            Ok(ToolChoice::Named(match o.get("namespace").and_then(Value::as_str) {
                Some(ns) => flat_name(ns, name),
                None => name.to_owned(),
            }))
        }
        Some(hosted) if offered.not_offered.iter().any(|t| t.split(' ').next() == Some(hosted)) => Err(ApiError::bad(
            "tool_choice",
            format!("tool_choice forces the hosted tool {hosted:?}, which this server does not run"),
        )),
        _ => Err(bad_choice()),
    }
}
