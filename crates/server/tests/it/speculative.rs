//! Speculative decoding through the HTTP API of a real server (SmolLM2-135M-Instruct): NGRAM
//! on code-editing prompts (the prompt holds a file, the answer rewrites it) and chat prompts
//! gives the same greedy text, finish reasons and logprobs as the same server without it, alone
//! and in a batch of 16 where speculating rows share steps with rows that cannot speculate
//! (a JSON grammar), rows with penalties, stop strings and logprobs; the proposals are really
//! accepted (`meta_info`, `/metrics`), and no KV page is leaked.

use crate::common::*;
use serde_json::{json, Value};

/// Code-editing prompts built from this repository's own sources (real code, real edits) and
/// a few chat prompts; each with its own mix of request options.
fn bodies() -> Vec<Value> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let files = [
        "engine/src/kv/radix.rs",
        "engine/src/batch.rs",
        "engine/src/spec/ngram.rs",
        "engine/src/sampler.rs",
        "server/src/detok.rs",
        "cpu/src/pool.rs",
    ];
    let edits = [
        "renaming `self` helpers to short names",
        "adding a comment above each function",
        "changing every `u32` to `u64`",
    ];
    let mut out = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let text = std::fs::read_to_string(root.join(f)).expect("a source file");
        let start = (i * 997) % text.len().saturating_sub(1200).max(1);
        let cut: String = text.chars().skip(start).take(900).collect();
        for (j, e) in edits.iter().enumerate().take(2) {
            let content = format!("Rewrite this Rust code, {e}. Output the whole code.\n\n```rust\n{cut}\n```");
            out.push(json!({"messages": [{"role": "user", "content": content}], "max_tokens": 32 + 8 * j}));
        }
    }
    for q in [
        "List the planets of the solar system in order, one per line.",
        "Write a haiku about caches.",
        "What is a radix tree?",
        "Count from 1 to 30, separated by commas.",
    ] {
        out.push(json!({"messages": [{"role": "user", "content": q}], "max_tokens": 40}));
    }
    for (i, b) in out.iter_mut().enumerate() {
        b["temperature"] = json!(0);
        match i % 5 {
            1 => b["frequency_penalty"] = json!(0.4),
            2 => {
                b["logprobs"] = json!(true);
                b["top_logprobs"] = json!(2);
            }
            3 => b["stop"] = json!(["}\n", "Mars"]),
            4 => b["response_format"] = json!({"type": "json_object"}),
            _ => {}
        }
    }
    out
}

/// What must not change: text, finish reason, token count, logprobs.
fn essence(v: &Value) -> Value {
    let c = &v["choices"][0];
    json!([c["message"]["content"], c["finish_reason"], v["usage"]["completion_tokens"], c["logprobs"]])
}

#[tokio::test]
async fn ngram_greedy_outputs_equal_plain_decoding_alone_and_batched() {
    let plain = TestServer::start(Opts::default());
    let spec =
        TestServer::start(Opts { speculative: Some(sparrow_engine::spec::SpecConfig::ngram(6)), ..Opts::default() });
    let bodies = bodies();
    let mut want = Vec::new();
    for b in &bodies {
        let (st, v) = post(&plain, "/v1/chat/completions", b.clone()).await;
        assert_eq!(st, 200, "{v}");
        want.push(essence(&v));
    }
    for (i, b) in bodies.iter().enumerate() {
        let (st, v) = post(&spec, "/v1/chat/completions", b.clone()).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(essence(&v), want[i], "request {i} alone");
    }
    let batched =
        futures_util::future::join_all(bodies.iter().take(16).map(|b| post(&spec, "/v1/chat/completions", b.clone())))
            .await;
    for (i, (st, v)) in batched.iter().enumerate() {
        assert_eq!(*st, 200, "{v}");
        assert_eq!(essence(v), want[i], "request {i} in a batch of 16");
    }
    // The proposals were used: a code edit accepts several tokens per verify step.
    let (st, v) = post(&spec, "/generate", json!({"text": bodies[0]["messages"][0]["content"], "sampling_params": {"max_new_tokens": 40, "temperature": 0}})).await;
    assert_eq!(st, 200, "{v}");
    let m = &v["meta_info"];
    let (verify, accepted) =
        (m["spec_verify_ct"].as_u64().unwrap_or(0), m["spec_accept_token_num"].as_u64().unwrap_or(0));
    assert!(verify > 0 && accepted > 0, "{m}");
    assert_eq!(m["spec_accept_length"].as_f64(), Some(m["completion_tokens"].as_f64().unwrap_or(0.0) / verify as f64));
    let st = stats(&spec).await;
    assert!(st["avg_spec_accept_length"].as_f64().unwrap_or(0.0) > 1.2, "{st}");
    let metrics = client().get(spec.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    assert!(
        metrics.contains("sglang:spec_accept_length") && metrics.contains("sparrow:spec_accepted_tokens_total"),
        "{metrics}"
    );
    assert_drained(&spec).await;
}
