//! The APIs agents speak, driven by their official Python SDKs against `sparrow serve`:
//! OpenAI's Responses API (`openai` ≥ 2: `responses.create`, `.stream`, `.parse`, a function
//! tool loop, `previous_response_id`, retrieve / delete) and Anthropic's Messages API
//! (`anthropic`: `messages.create`, `.stream`, `.parse`, a `tool_use` → `tool_result` loop,
//! `count_tokens`, errors). The scripts live in `tests/sdk/`; the SDKs parse every event into
//! their own models, so a malformed or out-of-order event fails the script. `.ci/run` installs
//! both SDKs.

use super::serve::{serve_with, Server, PARSING_FLAGS};
use serde_json::Value;
use std::process::Command;

const KEY: &str = "sk-sparrow-test";

fn run_sdk(s: &Server, script: &str, what: &str) -> Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk").join(script);
    let out = Command::new("python3").arg(&path).args([&s.1.to_string(), KEY]).output().expect("python3 runs");
    assert!(
        out.status.success(),
        "{what} SDK script failed (.ci/run installs the `openai` and `anthropic` packages):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("script prints JSON")
}

fn check_responses(v: &Value) {
    let plain = &v["plain"];
    let text = plain["text"].as_str().expect("text");
    assert!(!text.is_empty(), "{v}");
    // One internal chat request: the Responses answer is chat's answer.
    assert_eq!(plain["text"], v["chat_text"], "Responses and chat lower differently");
    let st = &v["streamed"];
    assert_eq!((&st["text"], &st["final_text"]), (&plain["text"], &plain["text"]), "streamed ≠ non-streamed");
    assert_eq!(st["status"], plain["status"]);
    assert_eq!(plain["status"], "incomplete", "24 tokens cut this answer: {v}");
    assert_eq!(plain["incomplete"], "max_output_tokens");
    for k in ["input_tokens", "output_tokens", "total_tokens"] {
        assert_eq!(st["usage"][k], plain["usage"][k], "usage.{k}");
    }
    assert_eq!(plain["usage"]["output_tokens"], 24);
    let types: Vec<&str> = st["types"].as_array().expect("types").iter().filter_map(Value::as_str).collect();
    let n = types.len();
    assert_eq!(
        &types[..4],
        ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    );
    assert_eq!(
        &types[n - 4..],
        ["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete"]
    );
    assert!(types[4..n - 4].iter().all(|t| *t == "response.output_text.delta"), "{types:?}");
    let seqs: Vec<u64> = st["seqs"].as_array().expect("seqs").iter().filter_map(Value::as_u64).collect();
    assert_eq!(seqs, (0..n as u64).collect::<Vec<_>>(), "sequence_number counts every event from 0");

    // Logprobs: one per output token with two alternatives, the same streamed, the same as chat's.
    let lp = &v["logprobs"];
    let plain_lp = lp["plain"].as_array().expect("logprobs");
    assert_eq!(plain_lp.len() as u64, lp["tokens"].as_u64().unwrap_or(0), "{v}");
    assert!(plain_lp.iter().all(|e| e[2] == 2), "{v}");
    let pairs: Vec<Value> = plain_lp.iter().map(|e| Value::from(vec![e[0].clone(), e[1].clone()])).collect();
    assert_eq!(Value::from(pairs.clone()), lp["streamed"], "streamed logprobs ≠ non-streamed");
    assert_eq!(Value::from(pairs), lp["chat"], "Responses logprobs ≠ chat's");

    // Structured output: the pydantic model validated it; streamed equals non-streamed.
    let city = &v["parsed"]["city"];
    assert!(["Paris", "Lyon", "Nice"].contains(&city["name"].as_str().unwrap_or("")), "{v}");
    assert_eq!(v["parsed"]["status"], "completed");
    let ps = &v["parsed_stream"];
    assert_eq!(&ps["city"], city);
    assert_eq!(ps["output"], ps["nonstream_output"], "the SDK's accumulated output ≠ the non-streamed one");

    // The tool loop, and the same loop continued by previous_response_id.
    let t = &v["tools"];
    let calls = t["calls"].as_array().expect("calls");
    assert!(!calls.is_empty(), "{v}");
    for c in calls {
        assert_eq!(c["name"], "get_weather");
        assert!(["celsius", "fahrenheit"].contains(&c["args"]["unit"].as_str().unwrap_or("")), "{v}");
        assert!(c["call_id"].as_str().is_some_and(|i| i.starts_with("call_")));
    }
    assert_eq!(t["first_status"], "completed");
    assert!(t["second"].as_str().is_some_and(|s| !s.is_empty()), "{v}");
    assert_eq!(t["chained"], t["second"], "previous_response_id ≠ the same history sent as items");
    assert!(t["chained_prev"].as_str().is_some_and(|p| p.starts_with("resp_")));
    let sc = &v["streamed_call"];
    assert_eq!(sc["name"], "get_weather");
    assert!(sc["pieces"].as_u64() > Some(3), "arguments came in pieces: {v}");

    assert_eq!(v["retrieved_same"], true);
    assert_eq!((&v["after_delete"], &v["unknown_prev"]), (&Value::from(404), &Value::from(404)));
    assert_eq!((&v["bad_input"]["status"], &v["bad_input"]["param"]), (&Value::from(400), &Value::from("input")));
}

fn block_text(m: &Value) -> String {
    m["content"].as_array().into_iter().flatten().filter_map(|b| b["text"].as_str()).collect()
}

fn check_messages(v: &Value, responses: &Value) {
    let plain = &v["plain"];
    let text = block_text(plain);
    // One lowering for every chat-like API: the same greedy answer as the Responses API's.
    assert_eq!(Value::from(text.clone()), responses["plain"]["text"], "{v}");
    let st = &v["streamed"];
    assert_eq!(st["text"], Value::from(text.clone()));
    assert_eq!(st["final"]["content"], plain["content"], "the SDK's accumulated message ≠ the non-streamed one");
    assert_eq!(
        (&st["final"]["stop_reason"], &plain["stop_reason"]),
        (&Value::from("max_tokens"), &Value::from("max_tokens"))
    );
    let prompt =
        |u: &Value| u["input_tokens"].as_u64().unwrap_or(0) + u["cache_read_input_tokens"].as_u64().unwrap_or(0);
    assert_eq!(prompt(&st["final"]["usage"]), prompt(&plain["usage"]));
    assert_eq!(plain["usage"]["output_tokens"], 24);
    assert_eq!(
        v["count"].as_u64(),
        Some(prompt(&plain["usage"])),
        "count_tokens counts the prompt messages.create runs"
    );
    let raw: Vec<&str> = v["raw_types"].as_array().expect("raw").iter().filter_map(Value::as_str).collect();
    let n = raw.len();
    assert_eq!(&raw[..2], ["message_start", "content_block_start"]);
    assert_eq!(&raw[n - 3..], ["content_block_stop", "message_delta", "message_stop"]);
    assert!(raw[2..n - 3].iter().all(|t| *t == "content_block_delta"), "{raw:?}");

    let stopped = &v["stopped"];
    assert_eq!((&stopped["reason"], &stopped["seq"]), (&Value::from("stop_sequence"), &Value::from(",")));
    assert!(!stopped["text"].as_str().unwrap_or(",").contains(','), "{v}");
    assert!(text.starts_with(stopped["text"].as_str().unwrap_or("?")), "{v}");

    let t = &v["tools"];
    assert_eq!(t["first_reason"], "tool_use");
    let uses = t["uses"].as_array().expect("uses");
    assert_eq!(uses.len(), 1, "disable_parallel_tool_use: {v}");
    assert_eq!(uses[0]["name"], "get_weather");
    assert!(["celsius", "fahrenheit"].contains(&uses[0]["input"]["unit"].as_str().unwrap_or("")), "{v}");
    assert!(!block_text(&t["second"]).is_empty(), "{v}");
    assert_eq!(t["streamed"]["stop_reason"], "tool_use");
    assert!(t["json_pieces"].as_u64() > Some(3), "input_json deltas: {v}");
    assert!(t["streamed"]["content"].as_array().is_some_and(|c| c.iter().all(|b| b["type"] == "tool_use")), "{v}");
    assert!(v["count_tools"].as_u64() > v["count"].as_u64(), "tools are counted: {v}");

    assert!(["Paris", "Lyon", "Nice"].contains(&v["parsed"]["city"]["name"].as_str().unwrap_or("")), "{v}");
    assert_eq!(v["parsed"]["reason"], "end_turn");

    let err = |k: &str| (v[k]["status"].as_u64(), v[k]["body"]["error"]["type"].as_str().or(v[k]["type"].as_str()));
    for k in ["no_max_tokens", "bad_role", "bad_block", "bad_stream"] {
        assert_eq!(err(k), (Some(400), Some("invalid_request_error")), "{k}: {v}");
    }
    assert!(v["no_max_tokens"]["body"]["error"]["message"].as_str().is_some_and(|m| m.contains("max_tokens")));
    assert!(v["bad_block"]["message"].as_str().is_some_and(|m| m.contains("image")));
    assert!(v["bad_stream"]["message"].as_str().is_some_and(|m| m.contains("temperature")));
    assert_eq!(err("wrong_key"), (Some(401), Some("authentication_error")));
}

/// Both SDKs against one server (`--api-key`, the qwen25 tool parser, qwen3 reasoning split).
#[test]
fn responses_and_messages_through_the_official_sdks() {
    let s = serve_with(&[PARSING_FLAGS, &["--api-key", KEY]].concat());
    let responses = run_sdk(&s, "responses.py", "OpenAI Responses");
    check_responses(&responses);
    let messages = run_sdk(&s, "anthropic_messages.py", "Anthropic Messages");
    check_messages(&messages, &responses);
}
