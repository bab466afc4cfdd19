//! Every case of `../shared/cases/server.md`, named after its id, against a real server running
//! SmolLM2-135M-Instruct on the CPU. Each test ends by checking that once the load drains every
//! KV page is free again. Tests on the shared server hold `lock()` so that their page counts
//! are not disturbed by each other.
#![allow(clippy::await_holding_lock)]

use std::time::Duration;

use crate::common::*;
use futures_util::StreamExt;
use serde_json::{json, Value};

const PARIS: &str = "The capital of France is";

/// S01: an empty prompt is a 400 (documented policy), and the server keeps serving.
#[tokio::test]
async fn s01_empty_prompt_and_empty_messages() {
    let s = shared();
    let _g = lock();
    let (st, v) = post(s, "/v1/completions", json!({"prompt": "", "max_tokens": 4})).await;
    assert_eq!(st, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap_or("").contains("empty"), "{v}");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let (st, v) = post(s, "/v1/completions", json!({"prompt": [], "max_tokens": 4})).await;
    assert_eq!(st, 400, "{v}");
    let (st, v) = post(s, "/v1/completions", json!({"prompt": PARIS, "max_tokens": 3, "temperature": 0})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    let (st, v) = post(s, "/v1/chat/completions", json!({"messages": [], "max_tokens": 4})).await;
    assert_eq!(st, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap_or("").contains("messages"), "{v}");
    let (st, _) =
        post(s, "/v1/chat/completions", json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}))
            .await;
    assert_eq!(st, 200);
    assert_drained(s).await;
}

/// S02: prompts longer than the context get a 400 naming both numbers; no truncation.
#[tokio::test]
async fn s02_prompt_longer_than_context() {
    let s = shared();
    let _g = lock();
    let ctx = get_json(s, "/v1/models").await["data"][0]["max_model_len"].as_u64().expect("ctx") as usize;
    for len in [ctx + 1, 3 * ctx] {
        let (st, v) = post(s, "/v1/completions", json!({"prompt": vec![100u32; len], "max_tokens": 4})).await;
        assert_eq!(st, 400, "{v}");
        let m = v["error"]["message"].as_str().unwrap_or("");
        assert!(m.contains(&len.to_string()) && m.contains(&ctx.to_string()), "{m}");
        let (st, v) =
            post(s, "/generate", json!({"input_ids": vec![100u32; len], "sampling_params": {"max_new_tokens": 4}}))
                .await;
        assert_eq!(st, 400, "{v}");
    }
    let (st, _) = post(s, "/v1/completions", json!({"prompt": PARIS, "max_tokens": 2})).await;
    assert_eq!(st, 200);
    assert_drained(s).await;
}

/// S03: prompt of ctx−20 tokens: max_tokens 16, 17, 20 run to exactly that many tokens with
/// `length`; 21 and 40 are a 400 (prompt + max_tokens must fit the context; no clamping).
#[tokio::test]
async fn s03_max_tokens_at_the_context_edge() {
    let s = TestServer::start(Opts { context_length: Some(96), ..Opts::default() });
    let prompt: Vec<u32> = (0..76u32).map(|i| 300 + i * 7).collect();
    for m in [16usize, 17, 20] {
        let (_, n, fin) = greedy_ids(&s, &prompt, m).await;
        assert_eq!((n, fin.as_str()), (m as u64, "length"), "max_tokens {m}");
    }
    for m in [21usize, 40] {
        let (st, v) = post(
            &s,
            "/v1/completions",
            json!({"prompt": prompt, "max_tokens": m, "temperature": 0, "ignore_eos": true}),
        )
        .await;
        assert_eq!(st, 400, "{v}");
        let msg = v["error"]["message"].as_str().unwrap_or("");
        assert!(msg.contains("76") && msg.contains(&m.to_string()) && msg.contains("96"), "{msg}");
    }
    // SGLang's /generate: an absent max_new_tokens is a default of 128, capped by the context.
    let (st, v) =
        post(&s, "/generate", json!({"input_ids": prompt, "sampling_params": {"temperature": 0, "ignore_eos": true}}))
            .await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["meta_info"]["completion_tokens"], 20);
    let (st, v) = post(&s, "/generate", json!({"input_ids": prompt, "sampling_params": {"max_new_tokens": 21}})).await;
    assert_eq!(st, 400);
    assert!(v["error"]["message"].as_str().unwrap_or("").contains("max_new_tokens is 21"), "{v}");
    // Without max_tokens the rest of the context is the limit: exactly 20 tokens.
    let (st, v) = post(&s, "/v1/completions", json!({"prompt": prompt, "temperature": 0, "ignore_eos": true})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 20);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_drained(&s).await;
}

/// S04: `max_tokens: 0` with `echo` returns the prompt, 0 tokens, `length`, and uses no pages;
/// with `logprobs: 1` too, plus the prompt's logprobs (the first `null`) from one prefill and no
/// sampled token.
#[tokio::test]
async fn s04_zero_max_tokens_with_echo() {
    let s = shared();
    let _g = lock();
    let before = stats(s).await;
    let (st, v) = post(s, "/v1/completions", json!({"prompt": PARIS, "max_tokens": 0, "echo": true})).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(text0(&v), PARIS);
    assert_eq!(v["usage"]["completion_tokens"], 0);
    assert_eq!(v["usage"]["prompt_tokens"], 5);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert!(v["choices"][0]["logprobs"].is_null());
    let after = stats(s).await;
    assert_eq!(before["generation_tokens_total"], after["generation_tokens_total"], "a token was sampled");
    assert_eq!(before["free_pages"], after["free_pages"]);
    let (_, _, frames) =
        post_sse(s, "/v1/completions", json!({"prompt": PARIS, "max_tokens": 0, "echo": true, "stream": true})).await;
    assert_eq!(stream_text(&frames, 0), PARIS);
    let body = json!({"prompt": PARIS, "max_tokens": 0, "echo": true, "logprobs": 1});
    let (st, v) = post(s, "/v1/completions", body.clone()).await;
    assert_eq!(st, 200, "{v}");
    assert_eq!(text0(&v), PARIS);
    assert_eq!(v["usage"]["completion_tokens"], 0);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let lp = &v["choices"][0]["logprobs"];
    let toks: Vec<&str> = lp["tokens"].as_array().expect("tokens").iter().filter_map(Value::as_str).collect();
    assert_eq!(toks.concat(), PARIS, "the prompt's tokens spell the prompt");
    let vals = lp["token_logprobs"].as_array().expect("values");
    assert_eq!(vals.len(), 5);
    assert!(vals[0].is_null() && lp["top_logprobs"][0].is_null());
    assert!(vals[1..].iter().all(|x| x.as_f64().is_some_and(|x| x <= 0.0)), "{lp}");
    assert_eq!(lp["text_offset"], json!([0, 3, 11, 14, 21]));
    assert_eq!(stats(s).await["generation_tokens_total"], after["generation_tokens_total"], "a token was sampled");
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let (_, _, frames) = post_sse(s, "/v1/completions", sb).await;
    assert_eq!(stream_text(&frames, 0), PARIS);
    let streamed: Vec<&Value> =
        frames.iter().filter_map(|f| f["choices"][0]["logprobs"]["token_logprobs"].as_array()).flatten().collect();
    assert_eq!(streamed, vals.iter().collect::<Vec<_>>(), "streamed prompt logprobs equal the whole answer's");
    assert_drained(s).await;
}

/// S05: `max_tokens: null` and absent both run to EOS or the remaining context.
#[tokio::test]
async fn s05_null_and_absent_max_tokens() {
    let s = TestServer::start(Opts { context_length: Some(64), ..Opts::default() });
    for body in
        [json!({"prompt": PARIS, "max_tokens": null, "temperature": 0}), json!({"prompt": PARIS, "temperature": 0})]
    {
        let (st, v) = post(&s, "/v1/completions", body).await;
        assert_eq!(st, 200, "{v}");
        let n = v["usage"]["completion_tokens"].as_u64().expect("count");
        let fin = v["choices"][0]["finish_reason"].as_str().expect("finish");
        assert!(fin == "stop" || (fin == "length" && n == 64 - 5), "{fin} after {n}");
    }
    let (st, v) =
        post(&s, "/v1/chat/completions", json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": null}))
            .await;
    assert_eq!(st, 200, "{v}");
    assert_drained(&s).await;
}

/// S06: temperature 0 with top_p 0 or 1 is greedy; out-of-range values are a JSON 400 before
/// any SSE byte, streaming or not.
#[tokio::test]
async fn s06_sampling_ranges() {
    let s = shared();
    let _g = lock();
    let (_, a) =
        post(s, "/v1/completions", json!({"prompt": PARIS, "max_tokens": 6, "temperature": 0, "top_p": 0})).await;
    let (_, b) =
        post(s, "/v1/completions", json!({"prompt": PARIS, "max_tokens": 6, "temperature": 0, "top_p": 1})).await;
    assert_eq!(text0(&a), text0(&b));
    assert!(text0(&a).starts_with(" Paris"), "{a}");
    for bad in [json!({"top_p": 1.5}), json!({"temperature": -1}), json!({"top_p": "NaN"})] {
        for stream in [false, true] {
            let mut body = json!({"prompt": PARIS, "max_tokens": 4, "stream": stream});
            for (k, v) in bad.as_object().expect("object") {
                body[k] = v.clone();
            }
            let (st, ct, frames) = post_sse(s, "/v1/completions", body).await;
            assert_eq!(st, 400, "{bad} stream={stream}");
            assert!(ct.starts_with("application/json"), "{ct}");
            let field = bad.as_object().and_then(|o| o.keys().next().cloned()).unwrap_or_default();
            assert!(frames[0]["error"]["message"].as_str().unwrap_or("").contains(&field), "{:?}", frames[0]);
        }
    }
    let (st, _) = post(
        s,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "x"}], "top_p": 2, "stream": true}),
    )
    .await;
    assert_eq!(st, 400);
    // A temperature too small for 1/t is greedy, not a crash of the engine.
    let (st, c) =
        post(s, "/v1/completions", json!({"prompt": PARIS, "max_tokens": 6, "temperature": 1e-39, "min_p": 0.1})).await;
    assert_eq!(st, 200, "{c}");
    assert_eq!(text0(&c), text0(&a));
    assert_drained(s).await;
}

/// S07: stop strings inside one multi-character token and across three tokens, streamed and
/// not: the text ends where the stop string begins, and both ways agree.
#[tokio::test]
async fn s07_stop_strings() {
    let s = shared();
    let _g = lock();
    // The greedy continuation starts " Paris.\n\n" (" Paris" is one token, then "." and "\n"
    // twice); later tokens are taken from the run itself rather than hard-coded.
    let (_, g) =
        post(s, "/v1/completions", json!({"prompt": PARIS, "max_tokens": 20, "temperature": 0, "ignore_eos": true}))
            .await;
    let g = text0(&g);
    assert!(g.starts_with(" Paris.\n\n") && g.is_ascii() && g.len() > 16, "{g:?}");
    let late = g[12..16].to_owned();
    let late_want = g[..g.find(late.as_str()).unwrap_or(0)].to_owned();
    for (stop, want) in [("ar", " P".to_owned()), ("s.\n", " Pari".to_owned()), (late.as_str(), late_want)] {
        let body = json!({"prompt": PARIS, "max_tokens": 20, "temperature": 0, "stop": [stop], "ignore_eos": true});
        let (st, v) = post(s, "/v1/completions", body.clone()).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(text0(&v), want, "stop {stop:?}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        assert_eq!(v["choices"][0]["matched_stop"], stop);
        let mut sb = body.clone();
        sb["stream"] = json!(true);
        let (_, _, frames) = post_sse(s, "/v1/completions", sb).await;
        assert_eq!(stream_text(&frames, 0), want, "streamed, stop {stop:?}");
        let fins: Vec<&Value> =
            frames.iter().filter_map(|f| f["choices"].get(0)).filter(|c| !c["finish_reason"].is_null()).collect();
        assert_eq!(fins.len(), 1);
        assert_eq!(fins[0]["finish_reason"], "stop");
    }
    // A stop token id (".", 30) ends the text before it, as SGLang trims it, and is counted.
    let body = json!({"prompt": PARIS, "max_tokens": 20, "temperature": 0, "stop_token_ids": [30]});
    let (_, v) = post(s, "/v1/completions", body.clone()).await;
    assert_eq!(text0(&v), " Paris");
    assert_eq!(v["choices"][0]["matched_stop"], 30);
    assert_eq!(v["usage"]["completion_tokens"], 2);
    let mut sb = body;
    sb["stream"] = json!(true);
    let (_, _, frames) = post_sse(s, "/v1/completions", sb).await;
    assert_eq!(stream_text(&frames, 0), " Paris");
    assert_drained(s).await;
}

/// S08: forced byte tokens that never form valid UTF-8 keep flowing as U+FFFD, at most one
/// incomplete character held back.
#[tokio::test]
async fn s08_invalid_utf8_bytes_keep_flowing() {
    let s = shared();
    let _g = lock();
    let tok = sparrow_tokenizer::Tokenizer::load(&gguf()).expect("tokenizer");
    let bytes = tok.token_bytes(false).expect("byte-level vocabulary");
    // A lone continuation byte (never valid) and a lead byte that never gets its continuation.
    for ch in [0x80u8, 0xE2] {
        let id = bytes.iter().position(|b| b == &[ch]).expect("single-byte token");
        let body = json!({"prompt": PARIS, "max_tokens": 12, "temperature": 0, "logit_bias": {id.to_string(): 100}, "stream": true, "ignore_eos": true});
        let (st, _, frames) = post_sse(s, "/v1/completions", body.clone()).await;
        assert_eq!(st, 200);
        let text = stream_text(&frames, 0);
        assert_eq!(text, "\u{FFFD}".repeat(12), "{ch}");
        let pieces = frames.iter().filter(|f| f["choices"][0]["text"].as_str().is_some_and(|t| !t.is_empty())).count();
        assert!(pieces >= 11, "{ch}: text held back ({pieces} non-empty chunks)");
        let mut nb = body;
        nb["stream"] = json!(false);
        let (_, v) = post(s, "/v1/completions", nb).await;
        assert_eq!(text0(&v), text);
    }
    assert_drained(s).await;
}

/// S09: `logprobs: 5` with `top_p: 0.3`: the alternatives outside the nucleus keep their raw
/// (finite) logprobs; every number is finite and ≤ 0, each dict has the top 5 plus the sampled
/// token; chat's `top_logprobs: 5` likewise.
#[tokio::test]
async fn s09_logprobs_with_top_p() {
    let s = shared();
    let _g = lock();
    let (st, v) = post(
        s,
        "/v1/completions",
        json!({"prompt": PARIS, "max_tokens": 6, "logprobs": 5, "top_p": 0.3, "seed": 1, "ignore_eos": true}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    let vals = lp["token_logprobs"].as_array().expect("values");
    assert_eq!(vals.len(), 6);
    for (i, top) in lp["top_logprobs"].as_array().expect("tops").iter().enumerate() {
        let top = top.as_object().expect("a dict per token");
        assert!((5..=6).contains(&top.len()), "{top:?}");
        assert!(top.values().all(|x| x.as_f64().is_some_and(|x| x.is_finite() && x <= 0.0)), "{top:?}");
        let own = &lp["tokens"][i].as_str().expect("token");
        assert_eq!(top.get(*own), Some(&vals[i]), "the sampled token is in its dict");
    }
    assert!(vals.iter().all(|x| x.as_f64().is_some_and(|x| x.is_finite() && x <= 0.0)));
    let (st, v) = post(
        s,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 5, "top_p": 0.3, "max_tokens": 4}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"].as_array().expect("content");
    assert_eq!(content.len() as u64, v["usage"]["completion_tokens"].as_u64().expect("count"));
    for c in content {
        assert_eq!(c["top_logprobs"].as_array().expect("top").len(), 5);
        assert!(c["logprob"].as_f64().is_some_and(|x| x.is_finite() && x <= 0.0));
    }
    assert_drained(s).await;
}

/// S10: n=3 streamed with include_usage: each index gets deltas and one finish_reason, then one
/// usage chunk whose completion_tokens sums all three, then [DONE].
#[tokio::test]
async fn s10_n3_stream_with_usage() {
    let s = shared();
    let _g = lock();
    for path in ["/v1/completions", "/v1/chat/completions"] {
        let mut body = json!({"max_tokens": 7, "temperature": 0.8, "seed": 3, "n": 3, "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true});
        if path.contains("chat") {
            body["messages"] = json!([{"role": "user", "content": "Tell me a story."}]);
        } else {
            body["prompt"] = json!(PARIS);
        }
        let (st, _, frames) = post_sse(s, path, body).await;
        assert_eq!(st, 200);
        assert_eq!(frames.last(), Some(&json!("[DONE]")));
        let usage_chunks: Vec<&Value> =
            frames.iter().filter(|f| f["choices"].as_array().is_some_and(Vec::is_empty)).collect();
        assert_eq!(usage_chunks.len(), 1, "{path}");
        assert!(std::ptr::eq(usage_chunks[0], &frames[frames.len() - 2]), "usage chunk must come last before [DONE]");
        assert_eq!(usage_chunks[0]["usage"]["completion_tokens"], 21, "{path}");
        for i in 0..3u64 {
            let fins = frames
                .iter()
                .filter_map(|f| f["choices"].as_array())
                .flatten()
                .filter(|c| c["index"] == i && !c["finish_reason"].is_null())
                .count();
            assert_eq!(fins, 1, "{path}: choice {i}");
            assert!(!stream_text(&frames, i).is_empty(), "{path}: choice {i} got no text");
        }
    }
    assert_drained(s).await;
}

/// S11: a client that leaves mid-stream, and one that leaves while queued: both aborted within
/// a step, pages returned, the queued one never run.
#[tokio::test]
async fn s11_disconnects_abort_and_free_pages() {
    let s = TestServer::start(Opts { max_running_requests: Some(1), ..Opts::default() });
    let c = client();
    let long = json!({"prompt": PARIS, "max_tokens": 2000, "ignore_eos": true, "temperature": 0, "stream": true});
    let resp = c.post(s.url("/v1/completions")).json(&long).send().await.expect("send");
    let mut body = resp.bytes_stream();
    let mut tokens = 0;
    while tokens < 5 {
        let chunk = body.next().await.expect("stream open").expect("bytes");
        tokens += String::from_utf8_lossy(&chunk).matches("\"text\"").count();
    }
    // A second request queues behind the first (max_running_requests = 1) and leaves.
    let before = stats(&s).await;
    let queued_prompt: Vec<u32> = (0..50).map(|i| 400 + i).collect();
    let q = c
        .post(s.url("/v1/completions"))
        .json(&json!({"prompt": queued_prompt, "max_tokens": 10, "stream": true}))
        .send();
    let _ = tokio::time::timeout(Duration::from_millis(300), q).await;
    let st = stats(&s).await;
    assert_eq!(st["num_running_reqs"], 1, "{st}");
    // SGLang's `/get_load` (sglang-router's power_of_two reads `num_tokens`): the stream
    // still open holds its prompt and generated tokens; the queued one has left.
    let load = get_json(&s, "/get_load").await;
    assert_eq!(load[0]["num_reqs"], 1, "{load}");
    assert_eq!(load[0]["num_waiting_reqs"], 0, "{load}");
    let held = load[0]["num_tokens"].as_u64().expect("num_tokens");
    assert!(held >= 5, "the running request's KV tokens: {load}");
    drop(body);
    let mut ok = false;
    for _ in 0..200 {
        let m = c.get(s.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
        if m.lines().any(|l| l == "sglang:num_running_reqs 0") && stats(&s).await["num_queue_reqs"] == 0 {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(ok, "running requests did not drop to 0");
    let after = stats(&s).await;
    assert_eq!(after["prompt_tokens_total"], before["prompt_tokens_total"], "the queued request ran");
    assert!(after["generation_tokens_total"].as_u64() < Some(100), "the aborted stream kept generating: {after}");
    assert_drained(&s).await;
}

/// S12: a cached prefix of exactly k·page tokens (and k·page ± 1) beside uncached requests: every
/// output equals the request alone with the radix cache off.
#[tokio::test]
async fn s12_prefix_at_page_boundaries() {
    let page = 16;
    let cached = TestServer::start(Opts { page_size: page, ..Opts::default() });
    let plain = TestServer::start(Opts { page_size: page, disable_radix_cache: true, ..Opts::default() });
    let base: Vec<u32> = (0..80u32).map(|i| 1000 + i * 13).collect();
    for prefix in [2 * page - 1, 2 * page, 2 * page + 1] {
        // Prime the cache with the prefix alone.
        greedy_ids(&cached, &base[..prefix], 1).await;
        let mut prompts: Vec<Vec<u32>> = vec![[&base[..prefix], &[7, 8, 9][..]].concat()];
        prompts.extend((0..3u32).map(|j| (0..20 + j).map(|i| 2000 + i * 3 + j).collect::<Vec<u32>>()));
        let alone: Vec<(String, u64, String)> = {
            let mut v = Vec::new();
            for p in &prompts {
                v.push(greedy_ids(&plain, p, 10).await);
            }
            v
        };
        let batched = futures_util::future::join_all(prompts.iter().map(|p| greedy_ids(&cached, p, 10))).await;
        assert_eq!(batched, alone, "prefix {prefix}");
    }
    assert_drained(&cached).await;
    assert_drained(&plain).await;
}

/// S13: the same chat prompt five times with the radix cache on: identical outputs, and the
/// repeats are served from the cache (a full hit still computes the last token).
#[tokio::test]
async fn s13_repeated_prompt_full_cache_hit() {
    let s = shared();
    let _g = lock();
    let body =
        json!({"messages": [{"role": "user", "content": "Name three colors."}], "max_tokens": 12, "temperature": 0});
    let (_, first) = post(s, "/v1/chat/completions", body.clone()).await;
    let cached_metric = || async {
        let m = client().get(s.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
        m.lines()
            .find_map(|l| l.strip_prefix("sglang:cached_tokens_total "))
            .and_then(|v| v.parse::<f64>().ok())
            .expect("sglang:cached_tokens_total")
    };
    let metric_before = cached_metric().await;
    let mut cached_sum = 0;
    for _ in 0..4 {
        let (st, v) = post(s, "/v1/chat/completions", body.clone()).await;
        assert_eq!(st, 200);
        assert_eq!(text0(&v), text0(&first));
        let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
        let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
        assert_eq!(cached, prompt - 1, "a full hit reuses all but the last prompt token");
        cached_sum += cached;
    }
    // The counter a fleet's hit rate is summed from agrees with the usage reports.
    assert_eq!(cached_metric().await - metric_before, cached_sum as f64);
    assert_drained(s).await;
}

/// S14: 64 concurrent requests on a pool that cannot hold them all: none fails, outputs equal a
/// large-pool run; a request that alone can never fit is refused at admission.
#[tokio::test]
async fn s14_small_pool_waits_and_retracts() {
    let _g = lock();
    let small = TestServer::start(Opts { max_total_tokens: Some(400), chunked_prefill_size: 32, ..Opts::default() });
    let prompts: Vec<Vec<u32>> =
        (0..64u32).map(|j| (0..12 + j % 9).map(|i| 500 + (i * 31 + j * 17) % 3000).collect()).collect();
    let big = futures_util::future::join_all(prompts.iter().map(|p| greedy_ids(shared(), p, 24))).await;
    let got = futures_util::future::join_all(prompts.iter().map(|p| greedy_ids(&small, p, 24))).await;
    assert_eq!(got, big);
    let (st, v) = post(&small, "/v1/completions", json!({"prompt": vec![700u32; 300], "max_tokens": 200})).await;
    assert_eq!(st, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap_or("").contains("KV pool"), "{v}");
    let (st, _) = post(&small, "/v1/completions", json!({"prompt": PARIS, "max_tokens": 3})).await;
    assert_eq!(st, 200);
    assert_drained(&small).await;
}

/// S15: a seeded request samples the same tokens alone and beside other requests.
#[tokio::test]
async fn s15_seeded_sampling_is_batch_independent() {
    let s = shared();
    let _g = lock();
    let a = json!({"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0.8, "seed": 42, "ignore_eos": true});
    let b = json!({"prompt": "The weather today", "max_tokens": 16, "temperature": 0.8, "ignore_eos": true});
    let c =
        json!({"prompt": "In a galaxy far away", "max_tokens": 16, "temperature": 0.9, "seed": 7, "ignore_eos": true});
    let (r1, _) = tokio::join!(post(s, "/v1/completions", a.clone()), post(s, "/v1/completions", b));
    let r2 = post(s, "/v1/completions", a.clone()).await;
    let (r3, _) = tokio::join!(post(s, "/v1/completions", a), post(s, "/v1/completions", c));
    assert_eq!(text0(&r1.1), text0(&r2.1));
    assert_eq!(text0(&r1.1), text0(&r3.1));
    assert_drained(s).await;
}

/// S16: requests whose prompt lengths differ by one token, arriving while another decodes, each
/// equal their output alone.
#[tokio::test]
async fn s16_off_by_one_prompt_lengths_beside_decoding() {
    let s = shared();
    let _g = lock();
    let base: Vec<u32> = (0..60u32).map(|i| 3000 + i * 11).collect();
    let prompts: Vec<Vec<u32>> = (0..6).map(|k| base[..30 + k].to_vec()).collect();
    let mut alone = Vec::new();
    for p in &prompts {
        alone.push(greedy_ids(s, p, 8).await);
    }
    assert_drained(s).await; // no cached prefixes from the alone runs
    let background = post(s, "/v1/completions", json!({"prompt": PARIS, "max_tokens": 60, "ignore_eos": true}));
    let burst = async {
        tokio::time::sleep(Duration::from_millis(150)).await;
        futures_util::future::join_all(prompts.iter().map(|p| greedy_ids(s, p, 8))).await
    };
    let (bg, got) = tokio::join!(background, burst);
    assert_eq!(bg.0, 200);
    assert_eq!(got, alone);
    assert_drained(s).await;
}

/// S17: without stream_options there is no `choices: []` chunk and no usage; with
/// include_usage exactly one usage-only chunk precedes [DONE].
#[tokio::test]
async fn s17_usage_chunk_only_when_asked() {
    let s = shared();
    let _g = lock();
    // Sampled at the default temperature: `ignore_eos` so that an early EOS cannot make the
    // count below fewer than 5.
    let body = json!({"prompt": PARIS, "max_tokens": 5, "stream": true, "ignore_eos": true});
    let (_, _, frames) = post_sse(s, "/v1/completions", body.clone()).await;
    assert!(frames.iter().all(|f| f == "[DONE]" || f["choices"].as_array().is_some_and(|c| !c.is_empty())));
    assert!(frames.iter().all(|f| f.get("usage").is_none()));
    let mut with = body;
    with["stream_options"] = json!({"include_usage": true});
    let (_, _, frames) = post_sse(s, "/v1/completions", with).await;
    let empty: Vec<usize> = frames
        .iter()
        .enumerate()
        .filter(|(_, f)| f["choices"].as_array().is_some_and(Vec::is_empty))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(empty, vec![frames.len() - 2]);
    assert_eq!(frames[frames.len() - 2]["usage"]["completion_tokens"], 5);
    assert_drained(s).await;
}

/// Bad input of every kind gets OpenAI error JSON with the right status, and nothing else is
/// lost: wrong method, oversized body, malformed JSON, unknown route, out-of-vocabulary ids,
/// unknown or unsupported parameters.
#[tokio::test]
async fn bad_input_gets_openai_error_json() {
    let s = shared();
    let _g = lock();
    let c = client();
    let r = c.get(s.url("/v1/completions")).send().await.expect("send");
    assert_eq!(r.status().as_u16(), 405);
    let v: Value = r.json().await.expect("405 is JSON");
    assert_eq!(v["error"]["code"], 405);
    // An oversized body gets a 413 JSON. Sent raw and exactly one byte over the limit, so the
    // server has read all of it when it answers (no half-written body, no broken pipe).
    let addr = s.base.trim_start_matches("http://").to_owned();
    let mut tcp = tokio::net::TcpStream::connect(&addr).await.expect("connect");
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        (16usize << 20) + 1
    );
    tokio::io::AsyncWriteExt::write_all(&mut tcp, head.as_bytes()).await.expect("write");
    tokio::io::AsyncWriteExt::write_all(&mut tcp, &vec![b' '; (16usize << 20) + 1]).await.expect("write body");
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(30), tokio::io::AsyncReadExt::read(&mut tcp, &mut buf))
        .await
        .expect("an answer")
        .expect("read");
    let resp = String::from_utf8_lossy(&buf[..n]);
    assert!(resp.starts_with("HTTP/1.1 413"), "{resp}");
    assert!(resp.contains("application/json") && resp.contains("MiB"), "{resp}");
    let r = c
        .post(s.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body("{\"messages\": [")
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 400);
    let r = c.get(s.url("/no/such/route")).send().await.expect("send");
    assert_eq!(r.status().as_u16(), 404);
    let r: Value = r.json().await.expect("404 is JSON");
    assert!(r["error"]["message"].is_string());
    for (path, body, field) in [
        ("/v1/completions", json!({"prompt": "hi", "logit_bias": {"999999": 1}}), "logit_bias"),
        ("/v1/completions", json!({"prompt": [999999]}), "prompt"),
        ("/v1/completions", json!({"prompt": "hi", "max_tokens": -1}), "max_tokens"),
        ("/v1/completions", json!({"prompt": "hi", "stream": "yes"}), "stream"),
        ("/generate", json!({"text": "hi", "sampling_params": {"foo": 1}}), "sampling_params"),
        ("/generate", json!({"text": "hi", "return_logprob": true, "top_logprobs_num": 21}), "top_logprobs_num"),
        (
            "/generate",
            json!({"text": "hi", "return_logprob": true, "token_ids_logprob": [999999]}),
            "token_ids_logprob",
        ),
        ("/v1/completions", json!({"prompt": "hi", "logprobs": 21}), "logprobs"),
        ("/v1/completions", json!({"prompt": ["hi", ""]}), "prompt"),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}),
            "tools",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "yaml"}}),
            "response_format",
        ),
        ("/detokenize", json!({"tokens": [999999]}), "tokens"),
        ("/tokenize", json!({}), "text"),
    ] {
        let (st, v) = post(s, path, body.clone()).await;
        assert_eq!(st, 400, "{path} {body}: {v}");
        assert_eq!(v["error"]["param"], field, "{path} {body}: {v}");
    }
    let (st, _) = post(s, "/v1/completions", json!({"prompt": PARIS, "max_tokens": 2})).await;
    assert_eq!(st, 200);
    assert_drained(s).await;
}

/// `--api-key`, as SGLang checks it: `/health*` and `/metrics` stay open, every other route
/// needs `Authorization: Bearer <key>` or answers 401 with OpenAI's error JSON. sglang-router
/// sends its own `Authorization` beside the client's: one right value among them passes.
#[tokio::test]
async fn api_key_guards_every_route_but_health_and_metrics() {
    let _g = lock();
    let s = TestServer::start(Opts { api_key: Some("sk-sparrow".into()), ..Opts::default() });
    let c = client();
    let get = |path: &'static str, auth: &'static [&'static str]| {
        let mut r = c.get(s.url(path));
        for a in auth {
            r = r.header(reqwest::header::AUTHORIZATION, *a);
        }
        async move { r.send().await.expect("send") }
    };
    for path in ["/health", "/health_generate", "/metrics"] {
        assert_eq!(get(path, &[]).await.status(), 200, "{path} needs no key");
    }
    for (auth, want) in [
        (&[][..], 401),
        (&["Bearer wrong"][..], 401),
        (&["sk-sparrow"][..], 401),
        (&["Bearer sk-sparrow"][..], 200),
        (&["Bearer wrong", "Bearer sk-sparrow"][..], 200),
    ] {
        let r = get("/v1/models", auth).await;
        assert_eq!(r.status(), want, "Authorization {auth:?}");
        if want == 401 {
            let v: Value = r.json().await.expect("json");
            assert_eq!(v["error"]["code"], 401, "{v}");
            assert!(v["error"]["message"].as_str().unwrap_or("").contains("API key"), "{v}");
        }
    }
    // Generation too, and a refused request leaves nothing behind in the engine.
    let body = json!({"text": "Hello", "sampling_params": {"max_new_tokens": 2}});
    let r = c.post(s.url("/generate")).json(&body).send().await.expect("send");
    assert_eq!(r.status(), 401);
    let r = c.post(s.url("/generate")).bearer_auth("sk-sparrow").json(&body).send().await.expect("send");
    assert_eq!(r.status(), 200);
    let st: Value = c
        .get(s.url("/get_server_info"))
        .bearer_auth("sk-sparrow")
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    assert_eq!(st["internal_states"][0]["num_running_reqs"], 0, "{st}");
}
