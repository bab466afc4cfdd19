//! Tool calls and reasoning content through the HTTP API of a real server (SmolLM2-135M-Instruct):
//! `tool_choice: "required"` and a named function give valid calls in OpenAI's exact shapes,
//! streamed (`delta.tool_calls` with incremental `arguments`) and not, equal between the two;
//! `auto` runs the `qwen25` parser; tools and tool messages reach the prompt; bad tool fields
//! are 400s. The parsers themselves are tested on fixed model texts in `src/tools.rs`.
#![allow(clippy::await_holding_lock)]

use std::sync::OnceLock;

use crate::common::*;
use serde_json::{json, Value};
use sparrow_server::tools::{ChatParsers, ReasoningParser, ToolParser};

/// A server with `--tool-call-parser qwen25 --reasoning-parser qwen3`.
fn parsing() -> &'static TestServer {
    static S: OnceLock<TestServer> = OnceLock::new();
    S.get_or_init(|| {
        TestServer::start(Opts {
            parsers: ChatParsers { tool_call: Some(ToolParser::Qwen25), reasoning: Some(ReasoningParser::Qwen3) },
            ..Opts::default()
        })
    })
}

/// OpenAI's function-calling guide's example tools.
fn tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather",
            "description": "Get current temperature for a given location.",
            "parameters": {"type": "object", "properties": {
                "location": {"type": "string", "description": "City and country e.g. Bogotá, Colombia", "maxLength": 40},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                "required": ["location", "unit"], "additionalProperties": false},
            "strict": true}},
        {"type": "function", "function": {
            "name": "send_email",
            "description": "Send an email to a given recipient with a subject and message.",
            "parameters": {"type": "object", "properties": {
                "to": {"type": "string", "maxLength": 30}, "subject": {"type": "string", "maxLength": 30}},
                "required": ["to", "subject"], "additionalProperties": false}}}
    ])
}

fn ask(choice: Value) -> Value {
    json!({"messages": [{"role": "user", "content": "What is the weather like in Paris today?"}],
           "tools": tools(), "tool_choice": choice, "max_tokens": 120, "temperature": 0})
}

/// Checks one `tool_calls` entry's shape and arguments; returns (name, arguments).
fn check_call(c: &Value) -> (String, Value) {
    let o = c.as_object().expect("a call object");
    let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["function", "id", "type"], "{c}");
    assert_eq!(c["type"], "function");
    let id = c["id"].as_str().expect("id");
    assert!(id.starts_with("call_") && id.len() > 8, "{id}");
    let name = c["function"]["name"].as_str().expect("name").to_owned();
    let args: Value = serde_json::from_str(c["function"]["arguments"].as_str().expect("arguments is a string"))
        .unwrap_or_else(|e| panic!("arguments parse: {e}: {c}"));
    let want: &[&str] = match name.as_str() {
        "get_weather" => &["location", "unit"],
        "send_email" => &["subject", "to"],
        other => panic!("unknown function {other}"),
    };
    let mut got: Vec<&str> = args.as_object().expect("object arguments").keys().map(String::as_str).collect();
    got.sort_unstable();
    assert_eq!(got, want, "{args}");
    if name == "get_weather" {
        assert!(["celsius", "fahrenheit"].contains(&args["unit"].as_str().unwrap_or("")), "{args}");
    }
    (name, args)
}

/// Folds a chat stream's tool-call deltas, checking OpenAI's streamed shape: a call's first
/// entry has `index`, `id`, `type` and `function.name` with empty arguments, later entries
/// only `index` and `function.arguments`.
fn fold_stream(frames: &[Value]) -> (Vec<(String, String, String)>, String, String) {
    let mut calls: Vec<(String, String, String)> = Vec::new();
    let mut content = String::new();
    let mut finish = String::new();
    for f in frames.iter().filter(|f| f.is_object()) {
        for c in f["choices"].as_array().into_iter().flatten() {
            let d = &c["delta"];
            content.push_str(d["content"].as_str().unwrap_or(""));
            for t in d["tool_calls"].as_array().into_iter().flatten() {
                let i = t["index"].as_u64().expect("index") as usize;
                if let Some(id) = t.get("id") {
                    assert_eq!(i, calls.len(), "calls are numbered in order: {t}");
                    assert_eq!(
                        (t["type"].as_str(), t["function"]["arguments"].as_str()),
                        (Some("function"), Some("")),
                        "{t}"
                    );
                    calls.push((
                        id.as_str().expect("id").into(),
                        t["function"]["name"].as_str().expect("name").into(),
                        String::new(),
                    ));
                } else {
                    let keys: Vec<&String> = t.as_object().expect("entry").keys().collect();
                    assert_eq!(keys, ["index", "function"], "{t}");
                    assert!(t["function"].get("name").is_none(), "{t}");
                    calls[i].2.push_str(t["function"]["arguments"].as_str().expect("arguments"));
                }
            }
            if let Some(r) = c["finish_reason"].as_str() {
                finish = r.into();
            }
        }
    }
    (calls, content, finish)
}

#[tokio::test]
async fn required_and_named_calls_have_openais_shapes_streamed_and_not() {
    let s = shared();
    let _g = lock();
    let named = json!({"type": "function", "function": {"name": "send_email"}});
    // `required` with `parallel_tool_calls: false` is exactly one call; a named function is one
    // call of that function.
    for (choice, single) in [(json!("required"), "get_weather"), (named, "send_email")] {
        let mut body = ask(choice);
        body["parallel_tool_calls"] = json!(false);
        let (st, v) = post(s, "/v1/chat/completions", body.clone()).await;
        assert_eq!(st, 200, "{v}");
        let ch = &v["choices"][0];
        assert_eq!(ch["finish_reason"], "tool_calls", "{v}");
        assert_eq!(ch["message"]["role"], "assistant");
        assert!(ch["message"]["content"].is_null(), "content is null beside calls: {v}");
        assert!(ch["message"].get("reasoning_content").is_none(), "no reasoning parser, no field: {v}");
        let calls = ch["message"]["tool_calls"].as_array().expect("tool_calls");
        assert!(!calls.is_empty());
        let parsed: Vec<(String, Value)> = calls.iter().map(check_call).collect();
        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed[0].0, single);
        body["stream"] = json!(true);
        let (st, _, frames) = post_sse(s, "/v1/chat/completions", body).await;
        assert_eq!(st, 200);
        assert_eq!(frames[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
        let (streamed, content, finish) = fold_stream(&frames);
        assert_eq!((content.as_str(), finish.as_str()), ("", "tool_calls"));
        let arg_chunks = frames
            .iter()
            .filter(|f| {
                f["choices"][0]["delta"]["tool_calls"][0].get("id").is_none()
                    && f["choices"][0]["delta"].get("tool_calls").is_some()
            })
            .count();
        assert!(arg_chunks > 2, "arguments arrive in pieces ({arg_chunks} chunks)");
        // Greedy: the same calls as the non-streamed answer.
        let want: Vec<(String, String)> = calls
            .iter()
            .map(|c| {
                (
                    c["function"]["name"].as_str().unwrap_or("").into(),
                    c["function"]["arguments"].as_str().unwrap_or("").into(),
                )
            })
            .collect();
        let got: Vec<(String, String)> = streamed.iter().map(|c| (c.1.clone(), c.2.clone())).collect();
        assert_eq!(got, want);
    }
    // Parallel calls (the default): one or more, each valid but a last one cut by max_tokens.
    let (_, v) = post(s, "/v1/chat/completions", ask(json!("required"))).await;
    let calls = v["choices"][0]["message"]["tool_calls"].as_array().cloned().unwrap_or_default();
    let complete = if v["choices"][0]["finish_reason"] == "length" { calls.len() - 1 } else { calls.len() };
    assert!(complete >= 1, "{v}");
    calls[..complete].iter().for_each(|c| {
        check_call(c);
    });
    assert_drained(s).await;
}

#[tokio::test]
async fn tools_and_tool_messages_reach_the_prompt_and_bad_fields_are_400() {
    let s = shared();
    let _g = lock();
    let base = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "temperature": 0});
    let (_, plain) = post(s, "/v1/chat/completions", base.clone()).await;
    let mut with_tools = base.clone();
    with_tools["tools"] = tools();
    with_tools["tool_choice"] = json!("required");
    let (_, t) = post(s, "/v1/chat/completions", with_tools.clone()).await;
    let n = |v: &Value| v["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
    // SmolLM2's template has no tools: they arrive in a system message, names and all.
    assert!(n(&t) > n(&plain) + 100, "{} vs {}", n(&t), n(&plain));
    // `none` keeps them out.
    with_tools["tool_choice"] = json!("none");
    let (_, none) = post(s, "/v1/chat/completions", with_tools).await;
    assert_eq!(n(&none), n(&plain));
    // A call and its result in the history.
    let history = json!({"messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"location\": \"Paris, France\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "14 degrees celsius"}],
        "max_tokens": 1, "temperature": 0});
    let (st, h) = post(s, "/v1/chat/completions", history).await;
    assert_eq!(st, 200, "{h}");
    assert!(n(&h) > n(&plain) + 20, "the call and its result are in the prompt: {h}");
    for (mut body, field) in [
        (json!({"tools": tools()}), "tool_choice"), // auto, and this server has no parser
        (json!({"tools": tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}), "tool_choice"),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (
            json!({"tools": [{"type": "function", "function": {"description": "no name"}}], "tool_choice": "required"}),
            "tools",
        ),
        (
            json!({"tools": tools(), "tool_choice": "required", "response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nonsense"}}}],
                "tool_choice": "required", "stream": true}),
            "tools",
        ),
    ] {
        body["messages"] = json!([{"role": "user", "content": "Hi"}]);
        let (st, v) = post(s, "/v1/chat/completions", body.clone()).await;
        assert_eq!((st, v["error"]["param"].as_str()), (400, Some(field)), "{body}: {v}");
    }
    assert_drained(s).await;
}

#[tokio::test]
async fn auto_with_a_parser_and_reasoning_fields() {
    let s = parsing();
    let mut body = ask(json!("auto"));
    body["max_tokens"] = json!(60);
    let (st, v) = post(s, "/v1/chat/completions", body.clone()).await;
    assert_eq!(st, 200, "{v}");
    let m = &v["choices"][0]["message"];
    // The tiny model may or may not call: either way the message is well formed, and with a
    // reasoning parser `reasoning_content` is present (null when the model did not think).
    assert!(m.as_object().is_some_and(|o| o.contains_key("reasoning_content")), "{v}");
    let calls = m["tool_calls"].as_array().cloned().unwrap_or_default();
    calls.iter().for_each(|c| {
        check_call(c);
    });
    let reason = v["choices"][0]["finish_reason"].as_str().unwrap_or("");
    if calls.is_empty() {
        assert!(m["content"].is_string(), "{v}");
        assert!(["stop", "length"].contains(&reason), "{v}");
    } else {
        assert_eq!(reason, "tool_calls");
    }
    body["stream"] = json!(true);
    let (_, _, frames) = post_sse(s, "/v1/chat/completions", body).await;
    let (streamed, content, finish) = fold_stream(&frames);
    assert_eq!(content, m["content"].as_str().unwrap_or(""), "streamed content equals the message's");
    assert_eq!(streamed.len(), calls.len());
    assert_eq!(finish, reason);
    // A plain chat through the parsing server gives the same text as through the plain one.
    let q =
        json!({"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 24, "temperature": 0});
    let (_, a) = post(s, "/v1/chat/completions", q.clone()).await;
    let _g = lock();
    let (_, b) = post(shared(), "/v1/chat/completions", q).await;
    assert_eq!(a["choices"][0]["message"]["content"], b["choices"][0]["message"]["content"]);
    assert!(a["choices"][0]["message"]["reasoning_content"].is_null());
}
