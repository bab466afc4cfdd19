//! Snapshots of the exact bytes on the wire: the request bodies `sparrow bench` sends
//! (`client::build_body`, serialized as `run` sends it) and every answer the mock server
//! gives, pinned in `fixtures/wire/`. They pin key order, absent against `null` fields and
//! number formatting, which the parsing tests cannot see. `UPDATE_SNAPSHOTS=1 cargo test -p
//! sparrow-bench --test it wire_bytes` rewrites the files from what the code produces.

use std::path::PathBuf;

use serde_json::{json, Map, Value};
use sparrow_bench::client::{build_body, Api, LogprobOptions, PromptInput, RequestOptions};
use sparrow_bench::mock::{self, FailMode, MockScript, UsageMode};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wire").join(name)
}

/// Compares `got` with the fixture `name` (or writes it, with `UPDATE_SNAPSHOTS`).
fn check(name: &str, got: &str) {
    let path = fixture(name);
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::create_dir_all(fixture("")).expect("creating the fixture directory");
        std::fs::write(&path, got).expect("writing a snapshot");
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(want == got, "{name} differs\n--- want\n{want}\n--- got\n{got}");
}

#[test]
fn request_bodies() {
    let messages = [json!({"role": "system", "content": "Be brief."}), json!({"role": "user", "content": "Hi"})];
    let inputs = [
        ("text", PromptInput::Text("hello \"world\"\n")),
        ("ids", PromptInput::Ids(&[1, 2, 3])),
        ("messages", PromptInput::Messages(&messages)),
    ];
    let extra: Map<String, Value> = serde_json::from_str(r#"{"temperature": 0.5, "top_k": 5}"#).expect("json");
    let row: Map<String, Value> = serde_json::from_str(r#"{"max_tokens": 3, "tools": []}"#).expect("json");
    let mut out = String::new();
    for api in [Api::Generate, Api::Completions, Api::Chat, Api::Trt] {
        for (variant, temperature, top_p, ignore_eos, with_extra) in [
            ("greedy", 0.0, 1.0, true, false),
            ("sampled", 0.7, 0.9, false, false),
            ("extra", 0.0, 1.0, true, true),
            ("logprob", 0.0, 1.0, true, false),
        ] {
            for stream in [true, false] {
                let o = RequestOptions {
                    api,
                    model: "m".into(),
                    stream,
                    ignore_eos,
                    temperature,
                    top_p,
                    logprobs: if variant == "logprob" {
                        LogprobOptions {
                            return_logprob: true,
                            top_logprobs_num: 3,
                            token_ids_logprob: Some(vec![5, 7]),
                            logprob_start_len: 0,
                        }
                    } else {
                        LogprobOptions { logprob_start_len: -1, ..Default::default() }
                    },
                    extra_body: if with_extra { extra.clone() } else { Map::new() },
                };
                for (input_name, input) in inputs {
                    let row = if with_extra { row.clone() } else { Map::new() };
                    let body = build_body(&o, input, 16, &row).to_string();
                    out += &format!("{api:?} {variant} stream={stream} {input_name}: {body}\n");
                }
            }
        }
    }
    check("request_bodies.txt", &out);
}

/// One mock answer as the snapshot holds it: status, content type, body.
async fn answer(url: &str, path: &str, body: Option<Value>) -> String {
    let c = reqwest::Client::new();
    let r = match body {
        Some(b) => c.post(format!("{url}{path}")).json(&b).send().await,
        None => c.get(format!("{url}{path}")).send().await,
    }
    .expect("request");
    let status = r.status().as_u16();
    let ct = r.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let text = r.text().await.expect("body");
    format!("== {path} {status} {ct}\n{text}\n")
}

/// A generation request of each dialect, streamed with and without `include_usage`, and not.
async fn generations(url: &str) -> String {
    let mut out = String::new();
    for stream in [Some(true), Some(false), None] {
        let opts = |mut b: Value| {
            match stream {
                Some(include_usage) => {
                    b["stream"] = json!(true);
                    if b.get("sampling_params").is_none() {
                        b["stream_options"] = json!({"include_usage": include_usage});
                    }
                }
                None => b["stream"] = json!(false),
            }
            b
        };
        out +=
            &answer(url, "/generate", Some(opts(json!({"text": "x", "sampling_params": {"max_new_tokens": 3}})))).await;
        out += &answer(url, "/v1/completions", Some(opts(json!({"prompt": "x", "max_tokens": 3})))).await;
        let chat = json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 3});
        out += &answer(url, "/v1/chat/completions", Some(opts(chat))).await;
        if stream == Some(true) {
            let trt = json!({"text_input": "x", "max_tokens": 3, "stream": true});
            out += &answer(url, "/v2/models/ensemble/generate_stream", Some(trt)).await;
        }
    }
    out
}

#[tokio::test]
async fn mock_answers() {
    let scripts = [
        ("mock_continuous.txt", MockScript::default()),
        ("mock_final_usage.txt", MockScript { usage: UsageMode::Final, ..MockScript::default() }),
        ("mock_no_usage.txt", MockScript { usage: UsageMode::None, ..MockScript::default() }),
        ("mock_early_stop.txt", MockScript { output_tokens: Some(2), tokens_per_chunk: 2, ..MockScript::default() }),
        ("mock_http500.txt", MockScript { fail_every: Some(1), ..MockScript::default() }),
        (
            "mock_in_band_error.txt",
            MockScript { fail_every: Some(1), fail_modes: vec![FailMode::InBandError], ..MockScript::default() },
        ),
        (
            "mock_no_done.txt",
            MockScript { fail_every: Some(1), fail_modes: vec![FailMode::NoDone], ..MockScript::default() },
        ),
    ];
    for (name, script) in scripts {
        let tokenizer = script.tokenizer_path.is_none().then(|| "/tok.json".to_owned());
        let server =
            mock::start("127.0.0.1:0".parse().expect("addr"), MockScript { tokenizer_path: tokenizer, ..script })
                .await
                .expect("mock server starts");
        let url = server.url();
        let mut out = String::new();
        if name == "mock_continuous.txt" {
            for path in ["/v1/models", "/get_model_info", "/get_server_info", "/health", "/metrics"] {
                out += &answer(&url, path, None).await;
            }
            out += &answer(&url, "/flush_cache", Some(json!({}))).await;
        }
        out += &generations(&url).await;
        check(name, &out);
        server.shutdown().await;
    }
}
