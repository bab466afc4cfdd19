//! The structured-output fields of a request read into one [`Constraint`]; [`json_schema`], the
//! schema reading every API's structured-output field shares.

use super::{Api, Fields};
use crate::error::ApiError;
use crate::grammar::Constraint;
use serde_json::Value;

/// A JSON schema given as an object (or `true` / `false`) or as a JSON string, as the
/// constraint it asks for; `field` names it in the error.
///
/// # Errors
/// A 400 naming `field`: a string that is not JSON, a value that is no schema.
pub fn json_schema(v: &Value, field: &'static str) -> Result<Constraint, ApiError> {
    match v {
        Value::String(s) => serde_json::from_str(s)
            .map(Constraint::Json)
            .map_err(|e| ApiError::bad(field, format!("{field} is not valid JSON: {e}"))),
        Value::Object(_) | Value::Bool(_) => Ok(Constraint::Json(v.clone())),
        _ => Err(ApiError::bad(field, format!("{field} must be a JSON schema"))),
    }
}

/// The structured-output fields, at most one of them:
/// - OpenAI's `response_format` (`text`, `json_object`, `json_schema` with its `schema`) on the
///   OpenAI routes;
/// - SGLang's `regex` and `ebnf` there and in `/generate`'s `sampling_params`, which also takes
///   `json_schema` (a JSON string);
/// - vLLM's `structured_outputs` object (`json`, `regex`, `choice`, `grammar`, `json_object`)
///   and its older `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar` fields.
///
/// A JSON schema may come as an object or as a JSON string; a grammar is GBNF when it has a
/// `::=` rule, else llguidance Lark ([`Constraint::grammar`]).
pub(super) fn parse_constraint(f: &Fields<'_>, api: Api) -> Result<Option<(Constraint, &'static str)>, ApiError> {
    fn string<'v>(v: &'v Value, field: &'static str) -> Result<&'v str, ApiError> {
        v.as_str().ok_or_else(|| ApiError::bad(field, format!("{field} must be a string")))
    }
    fn grammar(v: &Value, field: &'static str) -> Result<Constraint, ApiError> {
        Constraint::grammar(string(v, field)?).map_err(|e| ApiError::bad(field, format!("{field}: {e}")))
    }
    fn choice(v: &Value, field: &'static str) -> Result<Constraint, ApiError> {
        let bad = || ApiError::bad(field, format!("{field} must be a non-empty list of strings"));
        let list = v.as_array().filter(|a| !a.is_empty()).ok_or_else(bad)?;
        let c: Vec<String> =
            list.iter().map(|x| x.as_str().map(str::to_owned).ok_or_else(bad)).collect::<Result<_, _>>()?;
        Ok(Constraint::choice(&c))
    }
    let mut found: Vec<(Constraint, &'static str)> = Vec::new();
    if api != Api::Native {
        match f.get("response_format") {
            None => {}
            Some(v) => match v.get("type").and_then(Value::as_str) {
                Some("text") => {}
                Some("json_object") => {
                    found.push((Constraint::Json(serde_json::json!({"type": "object"})), "response_format"))
                }
                Some("json_schema") => {
                    let s = v.get("json_schema").and_then(|j| j.get("schema")).ok_or_else(|| {
                        ApiError::bad("response_format", "response_format.json_schema.schema is required")
                    })?;
                    found.push((json_schema(s, "response_format")?, "response_format"));
                }
                _ => {
                    return Err(ApiError::bad(
                        "response_format",
                        "response_format.type must be text, json_object or json_schema",
                    ))
                }
            },
        }
        if let Some(so) = f.get("structured_outputs") {
            const F: &str = "structured_outputs";
            let o = so.as_object().ok_or_else(|| ApiError::bad(F, "structured_outputs must be an object"))?;
            for (k, v) in o {
                if v.is_null() || v == &Value::Bool(false) {
                    continue;
                }
                let c = match k.as_str() {
                    "json" => json_schema(v, F)?,
                    "regex" => Constraint::Regex(string(v, F)?.to_owned()),
                    "choice" => choice(v, F)?,
                    "grammar" => grammar(v, F)?,
                    "json_object" => Constraint::Json(serde_json::json!({"type": "object"})),
                    // Our JSON is always compact and there is no fallback backend.
                    "disable_any_whitespace" | "disable_fallback" => continue,
                    other => {
                        return Err(ApiError::bad(
                            F,
                            format!("structured_outputs.{other} is not supported by this server"),
                        ))
                    }
                };
                found.push((c, F));
            }
        }
        if let Some(v) = f.get("guided_json") {
            found.push((json_schema(v, "guided_json")?, "guided_json"));
        }
        if let Some(v) = f.get("guided_regex") {
            found.push((Constraint::Regex(string(v, "guided_regex")?.to_owned()), "guided_regex"));
        }
        if let Some(v) = f.get("guided_choice") {
            found.push((choice(v, "guided_choice")?, "guided_choice"));
        }
        if let Some(v) = f.get("guided_grammar") {
            found.push((grammar(v, "guided_grammar")?, "guided_grammar"));
        }
    } else if let Some(v) = f.get("json_schema") {
        let s =
            string(v, "json_schema").map_err(|_| ApiError::bad("json_schema", "json_schema must be a JSON string"))?;
        found.push((json_schema(&Value::from(s), "json_schema")?, "json_schema"));
    }
    if let Some(v) = f.get("regex") {
        found.push((Constraint::Regex(string(v, "regex")?.to_owned()), "regex"));
    }
    if let Some(v) = f.get("ebnf") {
        found.push((grammar(v, "ebnf")?, "ebnf"));
    }
    if found.len() > 1 {
        return Err(ApiError::bad(found[1].1, "send one structured-output constraint (response_format, regex, ebnf, json_schema, structured_outputs or guided_*)"));
    }
    Ok(found.pop())
}
