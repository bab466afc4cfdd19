//! Structured output through the HTTP API of a real server (SmolLM2-135M-Instruct): outputs
//! constrained by `response_format` / `regex` / `sampling_params.json_schema` parse and match
//! their schema, greedy and sampled; a bad schema is a 400 before any byte of a stream; an
//! unconstrained request batched beside constrained ones gives the same text as alone.
#![allow(clippy::await_holding_lock)]

mod common;

use common::*;
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
    // json_object, a regex, and /generate's json_schema string.
    let (_, v) = post(s, "/v1/completions", json!({"prompt": "JSON:", "max_tokens": 40, "temperature": 0,
        "response_format": {"type": "json_object"}})).await;
    // A free-form object may run to the limit (the model may write an endless number): it must
    // start as an object, and parse as one whenever it ended by itself.
    let t = text0(&v);
    assert!(t.starts_with('{'), "{v}");
    if v["choices"][0]["finish_reason"] == "stop" {
        assert!(serde_json::from_str::<Value>(&t).is_ok_and(|x| x.is_object()), "{v}");
    }
    let (_, v) = post(s, "/v1/completions", json!({"prompt": "The year is", "max_tokens": 10, "temperature": 0,
        "regex": " (19|20)[0-9]{2}"})).await;
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
        (json!({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}, "stream": true}), "response_format"),
        (json!({"prompt": "x", "regex": "(unclosed"}), "regex"),
        (json!({"prompt": "x", "response_format": {"type": "xml"}}), "response_format"),
        (json!({"prompt": "x", "response_format": {"type": "json_object"}, "regex": "a"}), "regex"),
    ] {
        let (st, v) = post(s, "/v1/completions", body.clone()).await;
        assert_eq!(st, 400, "{body}: {v}");
        assert_eq!(v["error"]["param"], field, "{body}: {v}");
    }
    let plain = json!({"prompt": "The capital of France is", "max_tokens": 16, "temperature": 0, "ignore_eos": true});
    let (_, alone) = post(s, "/v1/completions", plain.clone()).await;
    let constrained = json!({"prompt": "Data:", "max_tokens": 60, "temperature": 0, "response_format": {"type": "json_object"}});
    let (a, b, c) = tokio::join!(
        post(s, "/v1/completions", constrained.clone()),
        post(s, "/v1/completions", plain),
        post(s, "/v1/completions", constrained)
    );
    assert_eq!(text0(&b.1), text0(&alone), "an unconstrained row batched with constrained ones");
    assert_eq!(text0(&a.1), text0(&c.1));
    assert_drained(s).await;
}
