//! The Responses API (`/v1/responses`) and Anthropic's Messages API (`/v1/messages`) on the
//! wire: every malformed field is a 400 in the API's own error shape naming the field, sent
//! before any stream byte, with nothing reaching the engine; unknown stored ids are 404s; the
//! streamed frames carry their `event:` names and numbering. (The official SDKs drive both APIs
//! end to end in the `sparrow` crate's `agent_apis` test.)
#![allow(clippy::await_holding_lock)]

use crate::common::*;
use serde_json::{json, Value};
use sparrow_engine::batch::ForwardBatch;
use sparrow_engine::kv::KvStore;
use sparrow_engine::model::{AttentionNeeds, Model, ModelInfo};
use sparrow_engine::EngineError;
use sparrow_server::tools::{ChatParsers, ReasoningParser, ToolParser};
use std::sync::{Arc, Mutex};

/// A counter of `/metrics`.
async fn counter(s: &TestServer, name: &str) -> f64 {
    let text = client().get(s.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} in /metrics"))
}

/// `sglang:num_requests_total`: requests that reached generation.
async fn requests_total(s: &TestServer) -> f64 {
    counter(s, "sglang:num_requests_total").await
}

async fn post_raw(s: &TestServer, path: &str, body: &Value) -> (u16, String, Value) {
    let r = client().post(s.url(path)).json(body).send().await.expect("request");
    let status = r.status().as_u16();
    let ct = r.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let text = r.text().await.expect("body");
    (status, ct, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

#[tokio::test]
async fn malformed_fields_are_400s_in_each_apis_shape_before_any_stream_byte() {
    let s = shared();
    let _g = lock();
    let hi = json!([{"role": "user", "content": "hi"}]);
    let responses: Vec<(Value, &str)> = vec![
        (json!({}), "input"),
        (json!({"input": 5}), "input"),
        (json!({"input": [{"type": "message", "role": "user", "content": 7}]}), "input"),
        (json!({"input": [{"type": "message", "role": "user", "content": [{"type": "input_image"}]}]}), "input"),
        (json!({"input": [{"type": "computer_call"}]}), "input"),
        (json!({"input": [{"role": "robot", "content": "x"}]}), "input"),
        (json!({"input": "hi", "max_output_tokens": -1}), "max_output_tokens"),
        (json!({"input": "hi", "max_output_tokens": 0}), "max_output_tokens"),
        (json!({"input": "hi", "max_output_tokens": 100000}), "max_output_tokens"),
        (json!({"input": "hi", "temperature": "hot"}), "temperature"),
        (json!({"input": "hi", "top_p": 1.5}), "top_p"),
        (json!({"input": "hi", "stop": [""]}), "stop"),
        (json!({"input": "hi", "tools": [{"type": "namespace", "tools": []}]}), "tools"),
        (json!({"input": [{"type": "function_call_output", "output": "x"}]}), "input"),
        (json!({"input": "hi", "tool_choice": "required"}), "tool_choice"),
        (json!({"input": "hi", "text": {"format": {"type": "json_schema"}}}), "text.format"),
        (json!({"input": "hi", "text": {"format": {"type": "yaml"}}}), "text.format"),
        (json!({"input": "hi", "reasoning": {"effort": "max"}}), "reasoning.effort"),
        (json!({"input": "hi", "include": ["message.output_text.logprobs"], "top_logprobs": 50}), "top_logprobs"),
        (json!({"input": "hi", "previous_response_id": 5}), "previous_response_id"),
        (json!({"input": "hi", "store": "yes"}), "store"),
        (json!({"input": "hi", "include": ["everything"]}), "include"),
        (json!({"input": "hi", "tools": [{"type": "function", "parameters": {}}]}), "name"),
        (
            json!({"input": "hi", "tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function"}}),
            "tool_choice",
        ),
        (
            json!({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "bogus"}}}}),
            "text.format",
        ),
        (json!({"input": "hi", "conversation": "conv_1"}), "conversation"),
        (json!({"input": "hi", "background": true}), "background"),
        (json!({"input": "hi", "truncation": "auto"}), "truncation"),
        (json!({"input": "hi", "prompt": {"id": "pmpt_1"}}), "prompt"),
        (json!({"input": "hi", "metadata": {"a": 1}}), "metadata"),
    ];
    let messages: Vec<(Value, &str)> = vec![
        (json!({"messages": hi}), "max_tokens"),
        (json!({"max_tokens": 8}), "messages"),
        (json!({"max_tokens": 8, "messages": []}), "messages"),
        (json!({"max_tokens": 0, "messages": hi}), "max_tokens"),
        (json!({"max_tokens": 8, "messages": [{"role": "robot", "content": "x"}]}), "role"),
        (json!({"max_tokens": 8, "messages": [{"role": "user", "content": 5}]}), "content"),
        (
            json!({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}),
            "image",
        ),
        (json!({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "video"}]}]}), "content"),
        (json!({"max_tokens": 8, "messages": hi, "system": 3}), "system"),
        (json!({"max_tokens": 8, "messages": hi, "temperature": "hot"}), "temperature"),
        (json!({"max_tokens": 8, "messages": hi, "top_k": -5}), "top_k"),
        (json!({"max_tokens": 8, "messages": hi, "stop_sequences": [""]}), "stop_sequences"),
        (json!({"max_tokens": 8, "messages": hi, "stop_sequences": "."}), "stop_sequences"),
        (
            json!({"max_tokens": 8, "messages": hi, "tools": [{"name": "f", "input_schema": {}}],
                   "tool_choice": {"type": "tool", "name": "nope"}}),
            "tool_choice",
        ),
        (json!({"max_tokens": 8, "messages": hi, "tool_choice": {"type": "sometimes"}}), "tool_choice"),
        (json!({"max_tokens": 8, "messages": hi, "tools": [{"type": "web_search_20250305", "name": "w"}]}), "tools"),
        (
            json!({"max_tokens": 8, "messages": hi, "thinking": {"type": "enabled", "budget_tokens": 10}}),
            "budget_tokens",
        ),
        (
            json!({"max_tokens": 2000, "messages": hi, "thinking": {"type": "enabled", "budget_tokens": 4000}}),
            "budget_tokens",
        ),
        (json!({"max_tokens": 8, "messages": hi, "output_config": {"effort": "ultra"}}), "effort"),
        (json!({"max_tokens": 8, "messages": hi, "output_config": {"format": {"type": "xml"}}}), "format"),
        (
            json!({"max_tokens": 8, "messages": hi, "output_config": {"format": {"type": "json_schema", "schema": {"type": "bogus"}}}}),
            "output_config.format",
        ),
        (json!({"max_tokens": 8, "messages": [{"role": "user", "content": []}]}), "content"),
        (
            json!({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "search_result"}]}]}),
            "search_result",
        ),
        (json!({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}), "block 0"),
        (json!({"max_tokens": 8, "messages": hi, "temperature": 1.5}), "temperature"),
        (json!({"max_tokens": 8, "messages": hi, "tools": [{"name": "f"}]}), "input_schema"),
        (json!({"max_tokens": 8, "messages": hi, "tools": [{"name": "", "input_schema": {}}]}), "name"),
        (json!({"max_tokens": 8, "messages": hi, "mcp_servers": [{"url": "x"}]}), "mcp_servers"),
    ];
    let before = requests_total(s).await;
    for stream in [false, true] {
        for (body, field) in &responses {
            let mut b = body.clone();
            b["stream"] = json!(stream);
            let (st, ct, v) = post_raw(s, "/v1/responses", &b).await;
            assert_eq!((st, ct.as_str()), (400, "application/json"), "{b} -> {v}");
            assert_eq!(v["error"]["type"], "invalid_request_error", "{b} -> {v}");
            let (param, message) = (v["error"]["param"].as_str().unwrap_or(""), v["error"]["message"].as_str());
            assert!(param == *field || message.is_some_and(|m| m.contains(field)), "{b} names {field}: {v}");
        }
        for (body, field) in &messages {
            let mut b = body.clone();
            b["stream"] = json!(stream);
            let (st, ct, v) = post_raw(s, "/v1/messages", &b).await;
            assert_eq!((st, ct.as_str()), (400, "application/json"), "{b} -> {v}");
            assert_eq!((&v["type"], &v["error"]["type"]), (&json!("error"), &json!("invalid_request_error")), "{v}");
            assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains(field)), "{b} names {field}: {v}");
            assert!(v.get("param").is_none() && v["error"].get("param").is_none(), "Anthropic's shape only: {v}");
        }
    }
    let (st, _, v) = post_raw(s, "/v1/messages/count_tokens", &json!({"messages": []})).await;
    assert_eq!((st, &v["error"]["type"]), (400, &json!("invalid_request_error")), "{v}");
    // Unknown routes and methods under /v1/messages answer in Anthropic's shape too.
    let (st, _, v) = post_raw(s, "/v1/messages/batches", &json!({})).await;
    assert_eq!((st, &v["type"], &v["error"]["type"]), (404, &json!("error"), &json!("not_found_error")), "{v}");
    let r = client().get(s.url("/v1/messages")).send().await.expect("get");
    assert_eq!(r.status().as_u16(), 405);
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["type"], "error", "{v}");
    assert_eq!(requests_total(s).await, before, "a malformed request reached the engine");
    assert_drained(s).await;
}

/// Valid values the server has nothing to add for are accepted (agent SDKs send them), and an
/// Anthropic prefill (a final assistant message) is continued, not closed: the prompt ends with
/// the prefill's text, where a new turn would add the end-of-turn and the assistant header.
#[tokio::test]
async fn accepted_extras_and_anthropic_prefill() {
    let s = shared();
    let _g = lock();
    let body = json!({"input": "hi", "max_output_tokens": 2, "store": false,
                      "include": ["reasoning.encrypted_content"], "metadata": {"k": "v"}, "truncation": "disabled"});
    let (st, _, v) = post_raw(s, "/v1/responses", &body).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["metadata"], json!({"k": "v"}));
    let user = json!({"role": "user", "content": "Count to five."});
    let count = |messages: Value| async move {
        let (st, _, v) = post_raw(s, "/v1/messages/count_tokens", &json!({"messages": messages})).await;
        assert_eq!(st, 200, "{v}");
        v["input_tokens"].as_u64().expect("input_tokens")
    };
    let plain = count(json!([user])).await;
    let prefilled = count(json!([user, {"role": "assistant", "content": "One, two,"}])).await;
    let tok = sparrow_tokenizer::Tokenizer::load(&gguf()).expect("tokenizer");
    let prefill = tok.encode("One, two,", false).expect("encode").len() as u64;
    assert_eq!(prefilled, plain + prefill, "the prompt ends inside the assistant's turn");
    let (st, _, m) = post_raw(
        s,
        "/v1/messages",
        &json!({"max_tokens": 3, "messages": [user, {"role": "assistant", "content": "One, two,"}], "temperature": 0}),
    )
    .await;
    assert_eq!(st, 200, "{m}");
    assert_eq!(
        m["usage"]["input_tokens"].as_u64().unwrap_or(0) + m["usage"]["cache_read_input_tokens"].as_u64().unwrap_or(0),
        prefilled
    );
    // Claude Code's shape: its own model name (echoed back), a `system` message between the
    // turns (in the prompt, at its place), thinking, context management, effort and metadata.
    let note = "Answer in French, and keep it short.";
    let system = json!({"role": "system", "content": [{"type": "text", "text": note}]});
    let with_system = count(json!([user, system])).await;
    let note_tokens = tok.encode(note, false).expect("encode").len() as u64;
    assert!(with_system >= plain + note_tokens, "{with_system} tokens against {plain} + {note_tokens}");
    let (st, _, m) = post_raw(
        s,
        "/v1/messages?beta=true",
        &json!({"model": "claude-opus-5-5", "max_tokens": 3, "messages": [user, system], "temperature": 0,
                "thinking": {"type": "adaptive", "display": "omitted"},
                "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
                "output_config": {"effort": "medium"}, "metadata": {"user_id": "u"}}),
    )
    .await;
    assert_eq!(st, 200, "{m}");
    assert_eq!(m["model"], "claude-opus-5-5", "the client's model name is echoed");
    assert!(m["usage"]["output_tokens"].as_u64().is_some_and(|n| n > 0), "{m}");
    assert_eq!(
        m["usage"]["input_tokens"].as_u64().unwrap_or(0) + m["usage"]["cache_read_input_tokens"].as_u64().unwrap_or(0),
        with_system
    );
    assert_drained(s).await;
}

#[tokio::test]
async fn unknown_response_ids_are_404s_in_openais_shape() {
    let s = shared();
    let _g = lock();
    let (st, _, v) = post_raw(s, "/v1/responses", &json!({"input": "hi", "previous_response_id": "resp_nope"})).await;
    assert_eq!(st, 404, "{v}");
    assert!(v["error"]["message"].as_str().is_some_and(|m| m.contains("resp_nope")), "{v}");
    let r = client().get(s.url("/v1/responses/resp_nope")).send().await.expect("get");
    assert_eq!(r.status().as_u16(), 404);
    let r = client().delete(s.url("/v1/responses/resp_nope")).send().await.expect("delete");
    assert_eq!(r.status().as_u16(), 404);
    // A stored one: retrieved as returned, deleted once, then gone.
    let (st, _, made) = post_raw(s, "/v1/responses", &json!({"input": "hi", "max_output_tokens": 2})).await;
    assert_eq!(st, 200, "{made}");
    let id = made["id"].as_str().expect("id");
    assert_eq!(get_json(s, &format!("/v1/responses/{id}")).await, made);
    let r = client().delete(s.url(&format!("/v1/responses/{id}"))).send().await.expect("delete");
    let v: Value = r.json().await.expect("json");
    assert_eq!(v, json!({"id": id, "object": "response", "deleted": true}));
    let r = client().get(s.url(&format!("/v1/responses/{id}"))).send().await.expect("get");
    assert_eq!(r.status().as_u16(), 404);
    // `store: false` keeps nothing.
    let (_, _, unstored) =
        post_raw(s, "/v1/responses", &json!({"input": "hi", "max_output_tokens": 2, "store": false})).await;
    let r = client().get(s.url(&format!("/v1/responses/{}", unstored["id"].as_str().unwrap_or("")))).send().await;
    assert_eq!(r.expect("get").status().as_u16(), 404);
    assert_drained(s).await;
}

/// SSE frames as `(event name, data)`.
async fn frames(s: &TestServer, path: &str, body: Value) -> Vec<(String, Value)> {
    let r = client().post(s.url(path)).json(&body).send().await.expect("request");
    assert_eq!(r.status().as_u16(), 200);
    let text = r.text().await.expect("body");
    text.split("\n\n")
        .filter(|f| !f.trim().is_empty())
        .map(|f| {
            let event = f.lines().find_map(|l| l.strip_prefix("event: ")).unwrap_or("").to_owned();
            let data = f.lines().find_map(|l| l.strip_prefix("data: ")).expect("data line");
            (event, serde_json::from_str(data).expect("JSON data"))
        })
        .collect()
}

/// Every frame's `event:` names its data's `type`; Responses events are numbered from 0; the
/// stream's last state equals the non-streamed answer; Anthropic's stream opens with
/// `message_start` and `ping` and its blocks open and close in order.
#[tokio::test]
async fn streamed_frames_are_named_numbered_and_equal_the_whole_answer() {
    let s = shared();
    let _g = lock();
    let body = json!({"input": "The capital of France is", "max_output_tokens": 6, "temperature": 0});
    let (_, _, whole) = post_raw(s, "/v1/responses", &body).await;
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let f = frames(s, "/v1/responses", sb).await;
    for (i, (event, data)) in f.iter().enumerate() {
        assert_eq!(data["type"].as_str(), Some(event.as_str()), "{data}");
        assert_eq!(data["sequence_number"], i, "{data}");
    }
    let last = &f.last().expect("frames").1["response"];
    let strip = |v: &Value| {
        let mut v = v.clone();
        for k in ["id", "created_at", "completed_at"] {
            v[k] = Value::Null;
        }
        for o in v["output"].as_array_mut().into_iter().flatten() {
            o["id"] = Value::Null;
        }
        v["usage"]["input_tokens_details"]["cached_tokens"] = Value::Null;
        v
    };
    assert_eq!(strip(last), strip(&whole), "the stream's final response ≠ the non-streamed one");
    assert_eq!(f[0].1["response"]["status"], "in_progress");

    let body = json!({"max_tokens": 6, "temperature": 0, "stream": true,
                      "messages": [{"role": "user", "content": "The capital of France is"}]});
    let f = frames(s, "/v1/messages", body.clone()).await;
    let names: Vec<&str> = f.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(&names[..3], ["message_start", "ping", "content_block_start"], "{names:?}");
    assert_eq!(&names[names.len() - 3..], ["content_block_stop", "message_delta", "message_stop"], "{names:?}");
    for (event, data) in &f {
        assert_eq!(data["type"].as_str(), Some(event.as_str()), "{data}");
    }
    assert_eq!(f[f.len() - 2].1["delta"]["stop_reason"], "max_tokens");
    assert_eq!(f[f.len() - 2].1["usage"]["output_tokens"], 6);
    // The same prompt again hits the radix cache: `message_start` already reports the split
    // `message_delta` reports (it waits until the request is scheduled).
    let f = frames(s, "/v1/messages", body).await;
    let (start, end) = (&f[0].1["message"]["usage"], &f[f.len() - 2].1["usage"]);
    assert!(start["cache_read_input_tokens"].as_u64() > Some(0), "{start}");
    for k in ["input_tokens", "cache_read_input_tokens"] {
        assert_eq!(start[k], end[k], "message_start and message_delta disagree on {k}");
    }
    assert_drained(s).await;
}

/// SmolLM2 made to say a script: after the prompt, greedy decoding emits `script`'s tokens in
/// order, then EOS (the real forward still runs, so KV and batching are as in serving). The
/// rows are told apart by position: a prefill sets the start, each later position takes the
/// next script token. A token fed back that is not the one the script said (the server forced
/// another) moves the script on to that token's next occurrence, as a model reading its own
/// forced text would go on from it. One request at a time, radix cache off (so a prefill is
/// never one token).
struct Scripted {
    inner: Box<dyn Model>,
    script: Arc<Mutex<Vec<u32>>>,
    eos: u32,
    start: u32,
}

impl Model for Scripted {
    fn info(&self) -> &ModelInfo {
        self.inner.info()
    }

    fn attention_needs(&self) -> AttentionNeeds {
        self.inner.attention_needs()
    }

    fn forward(&mut self, batch: &ForwardBatch, kv: &mut KvStore) -> Result<Vec<f32>, EngineError> {
        let mut logits = self.inner.forward(batch, kv)?;
        let vocab = self.inner.info().vocab_size;
        let script = self.script.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let mut out_row = 0;
        for s in batch.seqs.iter().filter(|s| s.num_logits > 0) {
            let last = (s.token_start + s.extend_len - 1) as usize;
            let pos = batch.positions[last];
            if s.extend_len > 1 {
                self.start = pos;
            }
            let mut i = pos.wrapping_sub(self.start) as usize;
            let fed = batch.input_ids[last];
            if s.extend_len == 1 && i > 0 && script.get(i - 1).is_some_and(|&t| t != fed) {
                if let Some(j) = script.iter().skip(i - 1).position(|&t| t == fed) {
                    i += j;
                    self.start = pos.wrapping_sub(i as u32);
                }
            }
            let want = script.get(i).copied().unwrap_or(self.eos) as usize;
            let row = out_row + s.num_logits as usize - 1;
            let l = &mut logits[row * vocab..(row + 1) * vocab];
            l.fill(-1e4);
            l[want] = 1e4;
            out_row += s.num_logits as usize;
        }
        Ok(logits)
    }
}

fn scripted_server(script: Arc<Mutex<Vec<u32>>>) -> TestServer {
    scripted_server_with(
        script,
        ChatParsers { tool_call: Some(ToolParser::Qwen25), reasoning: Some(ReasoningParser::Qwen3) },
    )
}

fn scripted_server_with(script: Arc<Mutex<Vec<u32>>>, parsers: ChatParsers) -> TestServer {
    let tok = sparrow_tokenizer::Tokenizer::load(&gguf()).expect("tokenizer");
    let eos = tok.eos().map_or(0, |e| e.0);
    let opts = Opts { disable_radix_cache: true, parsers, ..Opts::default() };
    TestServer::start_wrapped(opts, move |inner| Box::new(Scripted { inner, script, eos, start: 0 }))
}

/// Ids and positions of the non-streamed answer erased, to compare it with a stream's end.
fn strip(v: &Value) -> Value {
    let mut v = v.clone();
    for k in ["id", "created_at", "completed_at"] {
        if v.get(k).is_some() {
            v[k] = Value::Null;
        }
    }
    for o in v["output"].as_array_mut().into_iter().flatten() {
        o["id"] = Value::Null;
        if o.get("call_id").is_some() {
            o["call_id"] = Value::Null;
        }
    }
    for b in v["content"].as_array_mut().into_iter().flatten() {
        if b.get("id").is_some() {
            b["id"] = Value::Null;
        }
    }
    v
}

/// The Anthropic stream folded into its final message (as the SDK's accumulator does).
fn fold_messages(f: &[(String, Value)]) -> Value {
    let mut msg = f[0].1["message"].clone();
    let mut json_parts: Vec<String> = Vec::new();
    for (event, d) in f {
        match event.as_str() {
            "content_block_start" => {
                msg["content"].as_array_mut().expect("content").push(d["content_block"].clone());
                json_parts.push(String::new());
            }
            "content_block_delta" => {
                let i = d["index"].as_u64().expect("index") as usize;
                let b = &mut msg["content"][i];
                match d["delta"]["type"].as_str() {
                    Some("text_delta") => {
                        b["text"] = json!(format!(
                            "{}{}",
                            b["text"].as_str().unwrap_or(""),
                            d["delta"]["text"].as_str().unwrap_or("")
                        ))
                    }
                    Some("thinking_delta") => {
                        b["thinking"] = json!(format!(
                            "{}{}",
                            b["thinking"].as_str().unwrap_or(""),
                            d["delta"]["thinking"].as_str().unwrap_or("")
                        ))
                    }
                    Some("input_json_delta") => {
                        json_parts[i].push_str(d["delta"]["partial_json"].as_str().unwrap_or(""))
                    }
                    other => panic!("unknown delta {other:?}"),
                }
            }
            "content_block_stop" => {
                let i = d["index"].as_u64().expect("index") as usize;
                if msg["content"][i]["type"] == "tool_use" {
                    msg["content"][i]["input"] = serde_json::from_str(&json_parts[i]).expect("input JSON");
                }
            }
            "message_delta" => {
                msg["stop_reason"] = d["delta"]["stop_reason"].clone();
                msg["stop_sequence"] = d["delta"]["stop_sequence"].clone();
                msg["usage"] = d["usage"].clone();
            }
            _ => {}
        }
    }
    msg
}

/// Reasoning and tool calls through the family's parsers (`qwen3`, `qwen25`) on a scripted
/// answer: Responses `reasoning` / `message` / `function_call` items and Anthropic `thinking` /
/// `text` / `tool_use` blocks, streamed equal to non-streamed, and the same split as chat's.
#[tokio::test]
async fn reasoning_and_calls_become_items_and_blocks() {
    let script = Arc::new(Mutex::new(Vec::new()));
    let s = scripted_server(script.clone());
    let tok = sparrow_tokenizer::Tokenizer::load(&gguf()).expect("tokenizer");
    let say = |text: &str| {
        *script.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = tok.encode(text, false).expect("encode");
    };
    let q = json!([{"role": "user", "content": "What is the capital of France?"}]);

    say("<think>Recall the capital.</think>It is Paris.");
    let (st, _, r) = post_raw(&s, "/v1/responses", &json!({"input": q, "max_output_tokens": 40})).await;
    assert_eq!(st, 200, "{r}");
    let out = r["output"].as_array().expect("output");
    assert_eq!((out.len(), &out[0]["type"], &out[1]["type"]), (2, &json!("reasoning"), &json!("message")), "{r}");
    assert_eq!(out[0]["content"][0]["text"], "Recall the capital.", "{r}");
    assert_eq!(out[1]["content"][0]["text"], "It is Paris.", "{r}");
    assert_eq!(r["status"], "completed");
    let reasoning_tokens = r["usage"]["output_tokens_details"]["reasoning_tokens"].as_u64().unwrap_or(0);
    assert!(reasoning_tokens > 0 && reasoning_tokens < r["usage"]["output_tokens"].as_u64().unwrap_or(0), "{r}");
    let f = frames(&s, "/v1/responses", json!({"input": q, "max_output_tokens": 40, "stream": true})).await;
    let types: Vec<&str> = f.iter().map(|(e, _)| e.as_str()).collect();
    let first_msg = types.iter().position(|t| *t == "response.output_text.delta").expect("text deltas");
    let last_reasoning = types.iter().rposition(|t| *t == "response.reasoning_text.delta").expect("reasoning deltas");
    assert!(last_reasoning < first_msg, "reasoning item before the message: {types:?}");
    for t in ["response.reasoning_text.done", "response.output_text.done", "response.completed"] {
        assert!(types.contains(&t), "{t} in {types:?}");
    }
    assert_eq!(strip(&f.last().expect("frames").1["response"]), strip(&r), "stream end ≠ non-streamed");

    let body = json!({"messages": q, "max_tokens": 40});
    let (st, _, m) = post_raw(&s, "/v1/messages", &body).await;
    assert_eq!(st, 200, "{m}");
    let blocks = m["content"].as_array().expect("content");
    assert_eq!(blocks[0], json!({"type": "thinking", "thinking": "Recall the capital.", "signature": ""}), "{m}");
    assert_eq!(blocks[1], json!({"type": "text", "text": "It is Paris."}), "{m}");
    assert_eq!(m["stop_reason"], "end_turn");
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let f = frames(&s, "/v1/messages", sb).await;
    assert_eq!(strip(&fold_messages(&f)), strip(&m), "folded stream ≠ non-streamed");
    let (_, c) = post(&s, "/v1/chat/completions", json!({"messages": q, "max_tokens": 40})).await;
    assert_eq!(c["choices"][0]["message"]["reasoning_content"], "Recall the capital.", "one split for all APIs: {c}");

    say("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
    let tools = json!([{"type": "function", "name": "get_weather",
                        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let body = json!({"input": q, "tools": tools, "max_output_tokens": 60});
    let (st, _, r) = post_raw(&s, "/v1/responses", &body).await;
    assert_eq!(st, 200, "{r}");
    let call = &r["output"][0];
    assert_eq!((&call["type"], &call["name"]), (&json!("function_call"), &json!("get_weather")), "{r}");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap_or("")).expect("arguments JSON");
    assert_eq!(args, json!({"city": "Paris"}));
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let f = frames(&s, "/v1/responses", sb).await;
    assert!(f.iter().filter(|(e, _)| e == "response.function_call_arguments.delta").count() > 1, "pieces");
    assert_eq!(strip(&f.last().expect("frames").1["response"]), strip(&r), "stream end ≠ non-streamed");

    let atools = json!([{"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]);
    let body = json!({"messages": q, "tools": atools, "max_tokens": 60});
    let (_, _, m) = post_raw(&s, "/v1/messages", &body).await;
    assert_eq!(m["content"][0]["type"], "tool_use", "{m}");
    assert_eq!((&m["content"][0]["input"], &m["stop_reason"]), (&json!({"city": "Paris"}), &json!("tool_use")), "{m}");
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let f = frames(&s, "/v1/messages", sb).await;
    assert_eq!(strip(&fold_messages(&f)), strip(&m), "folded stream ≠ non-streamed");
}

/// A client that leaves a Responses or Messages stream aborts its request: the engine stops
/// it within a step and every KV page returns (the answer here would run 400 tokens).
#[tokio::test]
async fn leaving_a_stream_aborts_the_request() {
    let script = Arc::new(Mutex::new(Vec::new()));
    let s = scripted_server(script.clone());
    let tok = sparrow_tokenizer::Tokenizer::load(&gguf()).expect("tokenizer");
    let long = tok.encode(&" one two three four".repeat(100), false).expect("encode");
    *script.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = long;
    let q = json!([{"role": "user", "content": "Count."}]);
    let before = counter(&s, "sglang:generation_tokens_total").await;
    for (path, body) in [
        ("/v1/responses", json!({"input": q, "max_output_tokens": 450, "stream": true})),
        ("/v1/messages", json!({"messages": q, "max_tokens": 450, "stream": true})),
    ] {
        let mut r = client().post(s.url(path)).json(&body).send().await.expect("request");
        let mut seen = 0;
        while seen < 5 {
            seen += usize::from(r.chunk().await.expect("chunk").is_some());
        }
        drop(r);
        let mut running = Value::Null;
        for _ in 0..200 {
            running = stats(&s).await["num_running_reqs"].clone();
            if running == 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        assert_eq!(running, 0, "{path}: the request still runs after its client left");
        assert_drained(&s).await;
    }
    let generated = counter(&s, "sglang:generation_tokens_total").await - before;
    assert!(generated < 300.0, "{generated} tokens generated for two requests left after 5 chunks");
}

/// A chat stream folded: reasoning, content and each call's (id, name, arguments) by index.
fn fold_chat(frames: &[Value]) -> (String, String, Vec<(String, String, String)>) {
    let (mut reasoning, mut content, mut calls) =
        (String::new(), String::new(), Vec::<(String, String, String)>::new());
    for f in frames.iter().filter(|f| f.is_object()) {
        let d = &f["choices"][0]["delta"];
        reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
        content.push_str(d["content"].as_str().unwrap_or(""));
        for c in d["tool_calls"].as_array().into_iter().flatten() {
            let i = c["index"].as_u64().expect("index") as usize;
            if i == calls.len() {
                let name = c["function"]["name"].as_str().expect("a call's first delta names it");
                calls.push((c["id"].as_str().unwrap_or("").to_owned(), name.to_owned(), String::new()));
            }
            calls[i].2.push_str(c["function"]["arguments"].as_str().unwrap_or(""));
        }
    }
    (reasoning, content, calls)
}

/// gpt-oss's harmony answer (`--reasoning-parser gpt-oss --tool-call-parser gpt-oss`) on the
/// wire: the analysis channel is `reasoning_content`, the final channel `content`, a
/// `commentary to=functions.*` message a `tool_calls` entry; streamed equals non-streamed.
/// (The scripted model spells the markers with ordinary tokens; a gpt-oss vocabulary has them
/// as special tokens, which the server keeps in the text when a harmony parser runs.)
#[tokio::test]
async fn harmony_answers_split_into_reasoning_content_and_calls() {
    let script = Arc::new(Mutex::new(Vec::new()));
    let parsers = ChatParsers { tool_call: Some(ToolParser::GptOss), reasoning: Some(ReasoningParser::GptOss) };
    let s = scripted_server_with(script.clone(), parsers);
    let tok = sparrow_tokenizer::Tokenizer::load(&gguf()).expect("tokenizer");
    let say = |text: &str| {
        *script.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = tok.encode(text, false).expect("encode");
    };
    let q = json!([{"role": "user", "content": "What is the weather in Paris?"}]);
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
                        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);

    say("<|channel|>analysis<|message|>The user wants a capital.<|end|><|start|>assistant<|channel|>final<|message|>It is Paris.<|return|>");
    let body = json!({"messages": q, "max_tokens": 80});
    let (st, c) = post(&s, "/v1/chat/completions", body.clone()).await;
    assert_eq!(st, 200, "{c}");
    let msg = &c["choices"][0]["message"];
    assert_eq!(
        (&msg["reasoning_content"], &msg["content"]),
        (&json!("The user wants a capital."), &json!("It is Paris.")),
        "{c}"
    );
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let (_, _, frames) = post_sse(&s, "/v1/chat/completions", sb).await;
    let (r, t, calls) = fold_chat(&frames);
    assert_eq!((r.as_str(), t.as_str(), calls.len()), ("The user wants a capital.", "It is Paris.", 0));

    say("<|channel|>analysis<|message|>Call the tool.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>");
    let body = json!({"messages": q, "tools": tools, "max_tokens": 80});
    let (st, c) = post(&s, "/v1/chat/completions", body.clone()).await;
    assert_eq!(st, 200, "{c}");
    let msg = &c["choices"][0]["message"];
    assert_eq!(msg["reasoning_content"], "Call the tool.", "{c}");
    let call = &msg["tool_calls"][0];
    assert_eq!((&call["type"], &call["function"]["name"]), (&json!("function"), &json!("get_weather")), "{c}");
    assert_eq!(call["function"]["arguments"], "{\"city\": \"Paris\"}");
    assert_eq!(c["choices"][0]["finish_reason"], "tool_calls", "{c}");
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let (_, _, frames) = post_sse(&s, "/v1/chat/completions", sb).await;
    let (r, t, calls) = fold_chat(&frames);
    assert_eq!((r.as_str(), t.as_str()), ("Call the tool.", ""));
    let streamed: Vec<(&str, &str)> = calls.iter().map(|c| (c.1.as_str(), c.2.as_str())).collect();
    assert_eq!(streamed, vec![("get_weather", "{\"city\": \"Paris\"}")], "streamed calls ≠ non-streamed");
    assert!(calls[0].0.starts_with("call_"));
}

/// Anthropic's `thinking.budget_tokens`: a model that would think for 1,500 tokens has its
/// thinking cut at the budget (1,024 tokens of it, then `</think>` forced) and its answer
/// follows; without a budget the same script thinks until `max_tokens`.
#[tokio::test]
async fn thinking_is_cut_at_the_budget_and_the_answer_follows() {
    let script = Arc::new(Mutex::new(Vec::new()));
    let s = scripted_server(script.clone());
    let tok = sparrow_tokenizer::Tokenizer::load(&gguf()).expect("tokenizer");
    let enc = |t: &str| tok.encode(t, false).expect("encode");
    let a = enc(" a");
    assert_eq!(a.len(), 1, "\" a\" is one token");
    let mut say = enc("<think>");
    say.extend(std::iter::repeat_n(a[0], 1500));
    say.extend(enc("</think>It is Paris."));
    *script.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = say;
    let q = json!([{"role": "user", "content": "What is the capital of France?"}]);
    let body = |thinking: Value| json!({"messages": q, "max_tokens": 1100, "thinking": thinking});
    let (st, _, m) = post_raw(&s, "/v1/messages", &body(json!({"type": "enabled", "budget_tokens": 1024}))).await;
    assert_eq!(st, 200, "{m}");
    let blocks = m["content"].as_array().expect("content");
    assert_eq!(blocks[0]["type"], "thinking", "{m}");
    let thought = blocks[0]["thinking"].as_str().unwrap_or("");
    assert_eq!(thought.matches('a').count(), 1024, "thinking cut at the budget");
    assert_eq!(blocks[1], json!({"type": "text", "text": "It is Paris."}), "{m}");
    assert_eq!(m["stop_reason"], "end_turn", "{m}");
    // The same script with thinking on but no budget runs into max_tokens while thinking.
    let (_, _, m) = post_raw(&s, "/v1/messages", &body(json!({"type": "adaptive"}))).await;
    assert_eq!(m["stop_reason"], "max_tokens", "{m}");
    assert_eq!(m["content"].as_array().map(Vec::len), Some(1), "{m}");
}

/// Codex's tools on `/v1/responses`: a `namespace` tool's functions are offered flat as
/// `{namespace}__{name}` and a call to one comes back with its own `name` and `namespace`; a
/// hosted tool (`web_search`) is not offered and is named in `x-sparrow-tools-not-offered`, not
/// a 400; a `function_call` input item with a `namespace` is read back.
#[tokio::test]
async fn namespace_tools_are_flattened_and_hosted_tools_left_out() {
    let script = Arc::new(Mutex::new(Vec::new()));
    let s = scripted_server(script.clone());
    let tok = sparrow_tokenizer::Tokenizer::load(&gguf()).expect("tokenizer");
    *script.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = tok
        .encode(
            "<tool_call>\n{\"name\": \"multi_agent_v1__spawn_agent\", \"arguments\": {\"task\": \"lint\"}}\n</tool_call>",
            false,
        )
        .expect("encode");
    let params = json!({"type": "object", "properties": {"task": {"type": "string"}}});
    let tools = json!([
        {"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {}}},
        {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.",
         "tools": [{"type": "function", "name": "spawn_agent", "description": "Start one.", "parameters": params}]},
        {"type": "web_search", "external_web_access": true},
    ]);
    let input = json!([
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Lint it."}]},
        {"type": "function_call", "call_id": "call_1", "name": "spawn_agent", "namespace": "multi_agent_v1",
         "arguments": "{\"task\": \"look\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "done"},
        // Codex's goal context: an output of no call, named instead.
        {"type": "function_call_output", "name": "goal_objective", "namespace": "agent", "output": "Lint it."},
    ]);
    let body = json!({"input": input, "tools": tools, "tool_choice": "auto", "parallel_tool_calls": false,
                      "reasoning": {"summary": "auto"}, "store": false, "include": ["reasoning.encrypted_content"],
                      "prompt_cache_key": "k", "client_metadata": {"a": "b"}, "max_output_tokens": 60});
    let r = client().post(s.url("/v1/responses")).json(&body).send().await.expect("request");
    assert_eq!(r.status().as_u16(), 200);
    let header = r.headers().get("x-sparrow-tools-not-offered").and_then(|v| v.to_str().ok()).map(str::to_owned);
    assert_eq!(header.as_deref(), Some("web_search"));
    let v: Value = r.json().await.expect("JSON");
    let call = &v["output"][0];
    assert_eq!(
        (&call["type"], &call["name"], &call["namespace"]),
        (&json!("function_call"), &json!("spawn_agent"), &json!("multi_agent_v1")),
        "{v}"
    );
    assert_eq!(
        serde_json::from_str::<Value>(call["arguments"].as_str().unwrap_or("")).ok(),
        Some(json!({"task": "lint"}))
    );
    // Forcing a hosted tool is refused by name; a namespace's function can be named.
    let mut b = body.clone();
    b["tool_choice"] = json!({"type": "web_search"});
    let (st, _, e) = post_raw(&s, "/v1/responses", &b).await;
    assert_eq!(st, 400, "{e}");
    assert!(e["error"]["message"].as_str().unwrap_or("").contains("hosted tool \"web_search\""), "{e}");
    b["tool_choice"] = json!({"type": "function", "name": "spawn_agent", "namespace": "multi_agent_v1"});
    let (st, _, e) = post_raw(&s, "/v1/responses", &b).await;
    assert_eq!(st, 200, "{e}");
    assert_eq!(e["output"][0]["namespace"], "multi_agent_v1", "{e}");
}
