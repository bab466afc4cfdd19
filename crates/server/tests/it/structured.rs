//! Structured output through the HTTP API of a real server (SmolLM2-135M-Instruct): outputs
//! constrained by `response_format` / `regex` / `sampling_params.json_schema` parse and match
//! their schema, greedy and sampled; a bad schema is a 400 before any byte of a stream; an
//! unconstrained request batched beside constrained ones gives the same text as alone.
#![allow(clippy::await_holding_lock)]

use crate::common::*;
use serde_json::{json, Value};

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "Lyon", "Nice"]},
            "population": {"type": "integer", "minimum": 1000, "maximum": 99999999},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 3},
            "where": {"type": "object", "properties": {"lat": {"type": "integer", "minimum": -90, "maximum": 90}}, "required": ["lat"],
                "additionalProperties": false}
        },
        "required": ["city", "population", "tags", "where"],
        "additionalProperties": false
    })
}

/// The checks `schema()` asks for, by hand.
fn valid(v: &Value) -> Result<(), String> {
    let o = v.as_object().ok_or("not an object")?;
    let keys: Vec<&str> = o.keys().map(String::as_str).collect();
    if keys.iter().any(|k| !["city", "population", "tags", "where"].contains(k)) || keys.len() != 4 {
        return Err(format!("keys {keys:?}"));
    }
    if !["Paris", "Lyon", "Nice"].contains(&o["city"].as_str().unwrap_or("")) {
        return Err(format!("city {}", o["city"]));
    }
    let p = o["population"].as_i64().ok_or("population not an integer")?;
    if !(1000..=99_999_999).contains(&p) {
        return Err(format!("population {p}"));
    }
    let t = o["tags"].as_array().ok_or("tags not an array")?;
    if t.is_empty() || t.len() > 3 || t.iter().any(|x| x.as_str().is_none_or(|s| s.chars().count() > 8)) {
        return Err(format!("tags {t:?}"));
    }
    let w = o["where"].as_object().ok_or("where not an object")?;
    if w.len() != 1 || !w["lat"].as_i64().is_some_and(|l| (-90..=90).contains(&l)) {
        return Err(format!("where {w:?}"));
    }
    Ok(())
}

#[tokio::test]
async fn json_schema_outputs_parse_and_validate() {
    let s = shared();
    let _g = lock();
    let messages = json!([{"role": "user", "content": "Describe a French city as JSON."}]);
    let rf = json!({"type": "json_schema", "json_schema": {"name": "city", "schema": schema(), "strict": true}});
    for seed in [None, Some(1), Some(2), Some(3), Some(4)] {
        let mut body = json!({"messages": messages, "response_format": rf, "max_tokens": 120});
        match seed {
            None => body["temperature"] = json!(0),
            Some(sd) => {
                body["temperature"] = json!(1.0);
                body["seed"] = json!(sd);
            }
        }
        let (st, v) = post(s, "/v1/chat/completions", body).await;
        assert_eq!(st, 200, "{v}");
        let text = text0(&v);
        let parsed: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("seed {seed:?}: {e}: {text}"));
        valid(&parsed).unwrap_or_else(|e| panic!("seed {seed:?}: {e}: {text}"));
        assert!(!text.contains(": ") && !text.contains(", "), "compact JSON: {text}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    }
    // n choices share one compile (copies of the matcher): each follows the schema on its own.
    let body = json!({"messages": messages, "response_format": rf, "max_tokens": 120, "n": 4,
        "temperature": 1.0, "seed": 7});
    let (st, v) = post(s, "/v1/chat/completions", body).await;
    assert_eq!(st, 200, "{v}");
    let choices = v["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 4, "{v}");
    let mut texts = Vec::new();
    for c in choices {
        let text = c["message"]["content"].as_str().unwrap_or_default().to_string();
        let parsed: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("choice {}: {e}: {text}", c["index"]));
        valid(&parsed).unwrap_or_else(|e| panic!("choice {}: {e}: {text}", c["index"]));
        assert_eq!(c["finish_reason"], "stop", "{v}");
        texts.push(text);
    }
    texts.sort();
    texts.dedup();
    assert!(texts.len() > 1, "4 sampled choices are not all the same text: {texts:?}");
    // json_object, a regex, and /generate's json_schema string.
    let (_, v) = post(
        s,
        "/v1/completions",
        json!({"prompt": "JSON:", "max_tokens": 40, "temperature": 0,
        "response_format": {"type": "json_object"}}),
    )
    .await;
    // A free-form object may run to the limit (the model may write an endless number): it must
    // start as an object, and parse as one whenever it ended by itself.
    let t = text0(&v);
    assert!(t.starts_with('{'), "{v}");
    if v["choices"][0]["finish_reason"] == "stop" {
        assert!(serde_json::from_str::<Value>(&t).is_ok_and(|x| x.is_object()), "{v}");
    }
    let (_, v) = post(
        s,
        "/v1/completions",
        json!({"prompt": "The year is", "max_tokens": 10, "temperature": 0,
        "regex": " (19|20)[0-9]{2}"}),
    )
    .await;
    let t = text0(&v);
    assert!(t.len() == 5 && (t.starts_with(" 19") || t.starts_with(" 20")), "{t}");
    let g = json!({"text": "Cities:", "sampling_params": {"max_new_tokens": 120, "temperature": 0,
        "json_schema": schema().to_string()}});
    let (st, v) = post(s, "/generate", g).await;
    assert_eq!(st, 200, "{v}");
    valid(&serde_json::from_str(v["text"].as_str().unwrap_or("")).expect("JSON")).expect("valid");
    assert_drained(s).await;
}

#[tokio::test]
async fn bad_grammars_are_400_and_unconstrained_rows_are_unchanged() {
    let s = shared();
    let _g = lock();
    for (body, field) in [
        (
            json!({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}, "stream": true}),
            "response_format",
        ),
        (json!({"prompt": "x", "regex": "(unclosed"}), "regex"),
        (json!({"prompt": "x", "response_format": {"type": "xml"}}), "response_format"),
        (json!({"prompt": "x", "response_format": {"type": "json_object"}, "regex": "a"}), "regex"),
        // A flat body whose $ref chain once overflowed the compiler's stack and aborted the server.
        (
            json!({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": ref_chain(1500)}}}),
            "response_format",
        ),
    ] {
        let (st, v) = post(s, "/v1/completions", body.clone()).await;
        assert_eq!(st, 400, "{body}: {v}");
        assert_eq!(v["error"]["param"], field, "{body}: {v}");
    }
    let (st, v) = post(
        s,
        "/v1/completions",
        json!({"prompt": "x", "response_format": {"type": "json_schema",
        "json_schema": {"schema": ref_chain(1500)}}}),
    )
    .await;
    let msg = v["error"]["message"].as_str().unwrap_or("");
    assert!(st == 400 && msg.contains("nests 4503 levels deep") && msg.contains("at most 256"), "{v}");
    let plain = json!({"prompt": "The capital of France is", "max_tokens": 16, "temperature": 0, "ignore_eos": true});
    let (_, alone) = post(s, "/v1/completions", plain.clone()).await;
    let constrained =
        json!({"prompt": "Data:", "max_tokens": 60, "temperature": 0, "response_format": {"type": "json_object"}});
    let (a, b, c) = tokio::join!(
        post(s, "/v1/completions", constrained.clone()),
        post(s, "/v1/completions", plain),
        post(s, "/v1/completions", constrained)
    );
    assert_eq!(text0(&b.1), text0(&alone), "an unconstrained row batched with constrained ones");
    assert_eq!(text0(&a.1), text0(&c.1));
    assert_drained(s).await;
}

/// A schema whose `$ref`s chain `n` definitions (each an object holding the next).
fn ref_chain(n: usize) -> Value {
    let mut defs = serde_json::Map::new();
    for i in 0..n {
        defs.insert(
            format!("d{i}"),
            json!({"type": "object", "properties": {"a": {"$ref": format!("#/$defs/d{}", i + 1)}}}),
        );
    }
    defs.insert(format!("d{n}"), json!({"type": "string"}));
    json!({"$defs": defs, "$ref": "#/$defs/d0"})
}

/// A JSON Schema checker for the keywords the schema set uses, written from the JSON Schema
/// 2020-12 validation spec independently of llguidance (which produced the outputs).
fn conforms(v: &Value, s: &Value, path: &str) -> Result<(), String> {
    let err = |m: String| Err(format!("{path}: {m} (value {v})"));
    if let Some(any) = s.get("anyOf").and_then(Value::as_array) {
        if !any.iter().any(|a| conforms(v, a, path).is_ok()) {
            return err("matches no anyOf branch".into());
        }
    }
    if let Some(e) = s.get("enum").and_then(Value::as_array) {
        if !e.contains(v) {
            return err("not in enum".into());
        }
    }
    if let Some(c) = s.get("const") {
        if c != v {
            return err("not the const".into());
        }
    }
    let ty = s.get("type").and_then(Value::as_str);
    let ok = match ty {
        None => true,
        Some("object") => v.is_object(),
        Some("array") => v.is_array(),
        Some("string") => v.is_string(),
        Some("integer") => v.is_i64() || v.is_u64(),
        Some("number") => v.is_number(),
        Some("boolean") => v.is_boolean(),
        Some("null") => v.is_null(),
        Some(t) => return err(format!("unknown type {t}")),
    };
    if !ok {
        return err(format!("not of type {}", ty.unwrap_or("")));
    }
    if let Some(x) = v.as_f64().filter(|_| v.is_number()) {
        let num = |k: &str| s.get(k).and_then(Value::as_f64);
        if num("minimum").is_some_and(|m| x < m)
            || num("maximum").is_some_and(|m| x > m)
            || num("exclusiveMinimum").is_some_and(|m| x <= m)
            || num("exclusiveMaximum").is_some_and(|m| x >= m)
        {
            return err("out of range".into());
        }
    }
    if let Some(t) = v.as_str() {
        let n = t.chars().count() as u64;
        if s.get("minLength").and_then(Value::as_u64).is_some_and(|m| n < m)
            || s.get("maxLength").and_then(Value::as_u64).is_some_and(|m| n > m)
        {
            return err("length out of bounds".into());
        }
    }
    if let Some(a) = v.as_array() {
        let n = a.len() as u64;
        if s.get("minItems").and_then(Value::as_u64).is_some_and(|m| n < m)
            || s.get("maxItems").and_then(Value::as_u64).is_some_and(|m| n > m)
        {
            return err("item count out of bounds".into());
        }
        if let Some(items) = s.get("items") {
            for (i, x) in a.iter().enumerate() {
                conforms(x, items, &format!("{path}[{i}]"))?;
            }
        }
    }
    if let Some(o) = v.as_object() {
        let props = s.get("properties").and_then(Value::as_object);
        for r in s.get("required").and_then(Value::as_array).into_iter().flatten() {
            if !o.contains_key(r.as_str().unwrap_or("")) {
                return err(format!("missing {r}"));
            }
        }
        for (k, x) in o {
            match props.and_then(|p| p.get(k)) {
                Some(ps) => conforms(x, ps, &format!("{path}.{k}"))?,
                None if s.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    return err(format!("additional property {k}"))
                }
                None => {}
            }
        }
    }
    Ok(())
}

/// The schema set: nested objects, enums, arrays with length bounds, numbers with ranges,
/// `additionalProperties: false` with optional members. Strings are bounded so that sampled
/// outputs end within `max_tokens`.
fn schema_set() -> Vec<(&'static str, Value)> {
    vec![
        ("nested", schema()),
        (
            "enums",
            json!({"type": "object", "properties": {
            "colour": {"enum": ["red", "green", "blue"]},
            "size": {"type": "string", "enum": ["S", "M", "L", "XL"]},
            "in_stock": {"type": "boolean"},
            "kind": {"const": "shirt"}},
            "required": ["colour", "size", "in_stock", "kind"], "additionalProperties": false}),
        ),
        (
            "arrays",
            json!({"type": "object", "properties": {
            "scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 100}, "minItems": 2, "maxItems": 4},
            "names": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 6}, "minItems": 1, "maxItems": 2}},
            "required": ["scores", "names"], "additionalProperties": false}),
        ),
        (
            "numbers",
            json!({"type": "object", "properties": {
            "ratio": {"type": "number", "minimum": 0, "maximum": 1},
            "temp": {"type": "number", "exclusiveMinimum": -50, "exclusiveMaximum": 60},
            "year": {"type": "integer", "minimum": 1900, "maximum": 2100}},
            "required": ["ratio", "temp", "year"], "additionalProperties": false}),
        ),
        (
            "optional",
            json!({"type": "object", "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": 999},
            "note": {"type": "string", "maxLength": 10},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
            "required": ["id"], "additionalProperties": false}),
        ),
    ]
}

/// Every schema of the set, greedy and over 20 seeds, all 21 requests of a schema in flight at
/// once beside an unconstrained greedy request whose text must equal its text alone.
#[tokio::test]
async fn schema_set_greedy_and_20_seeds_batched_with_unconstrained_rows() {
    let s = shared();
    let _g = lock();
    let plain = json!({"prompt": "The history of Rome", "max_tokens": 48, "temperature": 0, "ignore_eos": true});
    let (_, alone) = post(s, "/v1/completions", plain.clone()).await;
    for (name, sc) in schema_set() {
        let rf = json!({"type": "json_schema", "json_schema": {"name": name, "schema": sc, "strict": true}});
        let bodies: Vec<Value> = (0..21)
            .map(|i| {
                let mut b = json!({"messages": [{"role": "user", "content": format!("Give me a {name} example as JSON.")}],
                    "response_format": rf, "max_tokens": 200});
                if i == 0 {
                    b["temperature"] = json!(0);
                } else {
                    b["temperature"] = json!(1.0);
                    b["seed"] = json!(i);
                }
                b
            })
            .collect();
        let constrained =
            futures_util::future::join_all(bodies.iter().map(|b| post(s, "/v1/chat/completions", b.clone())));
        let (outs, beside) = tokio::join!(constrained, post(s, "/v1/completions", plain.clone()));
        assert_eq!(text0(&beside.1), text0(&alone), "{name}: an unconstrained row batched with constrained ones");
        for (i, (st, v)) in outs.iter().enumerate() {
            assert_eq!(*st, 200, "{v}");
            let t = text0(v);
            assert_eq!(v["choices"][0]["finish_reason"], "stop", "{name} #{i} ended by the grammar: {t}");
            let parsed: Value = serde_json::from_str(&t).unwrap_or_else(|e| panic!("{name} #{i}: {e}: {t}"));
            conforms(&parsed, &sc, "$").unwrap_or_else(|e| panic!("{name} #{i}: {e}"));
        }
    }
    assert_drained(s).await;
}

/// The other spellings of a constraint: SGLang's `ebnf` (GBNF), vLLM's `structured_outputs`
/// and `guided_*` fields, `/generate`'s `ebnf` and `regex`.
#[tokio::test]
async fn ebnf_choice_and_vllm_aliases() {
    let s = shared();
    let _g = lock();
    let gbnf = r#"root ::= "The answer is " ("yes" | "no") "." "#;
    let chat = |extra: Value| {
        let mut b =
            json!({"messages": [{"role": "user", "content": "Is the sky blue?"}], "max_tokens": 20, "temperature": 0});
        for (k, v) in extra.as_object().into_iter().flatten() {
            b[k] = v.clone();
        }
        b
    };
    let answer = |v: &Value| v["choices"][0]["message"]["content"].as_str().unwrap_or("").to_owned();
    for extra in [
        json!({"ebnf": gbnf}),
        json!({"guided_grammar": gbnf}),
        json!({"structured_outputs": {"grammar": gbnf}}),
        json!({"structured_outputs": {"grammar": "start: \"The answer is \" (\"yes\" | \"no\") \".\""}}),
    ] {
        let (st, v) = post(s, "/v1/chat/completions", chat(extra.clone())).await;
        assert_eq!(st, 200, "{extra}: {v}");
        assert!(["The answer is yes.", "The answer is no."].contains(&answer(&v).as_str()), "{extra}: {v}");
    }
    for extra in [
        json!({"guided_choice": ["yes", "no", "maybe"]}),
        json!({"structured_outputs": {"choice": ["yes", "no", "maybe"]}}),
    ] {
        let (_, v) = post(s, "/v1/chat/completions", chat(extra.clone())).await;
        assert!(["yes", "no", "maybe"].contains(&answer(&v).as_str()), "{extra}: {v}");
    }
    let digits = json!({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"], "additionalProperties": false});
    for extra in [
        json!({"guided_json": digits}),
        json!({"guided_json": digits.to_string()}),
        json!({"structured_outputs": {"json": digits}}),
        json!({"guided_regex": "[0-9]{3}"}),
        json!({"structured_outputs": {"regex": "[0-9]{3}"}}),
    ] {
        let (st, v) = post(s, "/v1/chat/completions", chat(extra.clone())).await;
        assert_eq!(st, 200, "{extra}: {v}");
        let a = answer(&v);
        if extra.to_string().contains("regex") {
            assert!(a.len() == 3 && a.bytes().all(|b| b.is_ascii_digit()), "{extra}: {a}");
        } else {
            conforms(&serde_json::from_str(&a).expect("JSON"), &digits, "$").expect("valid");
        }
    }
    let g = json!({"text": "Q: Is fire hot? A:", "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ebnf": r#"root ::= " " [A-Z] [a-z]{1,4} "!""#}});
    let (st, v) = post(s, "/generate", g).await;
    assert_eq!(st, 200, "{v}");
    let t = v["text"].as_str().unwrap_or("");
    assert!(t.starts_with(' ') && t.ends_with('!') && (3..=7).contains(&t.len()), "{t:?}");
    for (body, field) in [
        (json!({"prompt": "x", "ebnf": "root ::= \"unterminated"}), "ebnf"),
        (json!({"prompt": "x", "ebnf": "item ::= \"a\""}), "ebnf"),
        (json!({"prompt": "x", "guided_choice": []}), "guided_choice"),
        (json!({"prompt": "x", "structured_outputs": {"structural_tag": "x"}}), "structured_outputs"),
        (json!({"prompt": "x", "guided_regex": "a", "regex": "b"}), "regex"),
        (json!({"prompt": "x", "structured_outputs": {"grammar": "start: nosuchrule"}}), "structured_outputs"),
    ] {
        let (st, v) = post(s, "/v1/completions", body.clone()).await;
        assert_eq!((st, v["error"]["param"].as_str()), (400, Some(field)), "{body}: {v}");
    }
    assert_drained(s).await;
}
