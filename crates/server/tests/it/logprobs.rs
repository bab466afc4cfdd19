//! Logprobs, batched prompts and `no_stop_trim` through the HTTP API of a real server
//! (SmolLM2-135M-Instruct): the shapes of OpenAI's legacy and chat objects, vLLM's
//! `prompt_logprobs` and SGLang's `meta_info`; lm-evaluation-harness's exact request; streamed
//! equal to non-streamed; batched equal to alone; the same values on every route.
//! The values themselves are checked against the exact f64 forward in the engine's
//! `logprobs_golden.rs`.
#![allow(clippy::await_holding_lock)]

use crate::common::*;
use serde_json::{json, Value};

const PARIS: &str = "The capital of France is";

fn floats(v: &Value) -> Vec<Option<f64>> {
    v.as_array().expect("list").iter().map(Value::as_f64).collect()
}

/// lm-evaluation-harness's `local-completions` loglikelihood request: a batch of token-id
/// prompts, `echo`, `logprobs: 1`, `max_tokens: 1`; it reads `token_logprobs[ctxlen:-1]` and
/// `top_logprobs`. One choice per prompt in order, every prompt position present (the first
/// `null`), plus the one generated token; each prompt's values equal the prompt sent alone.
#[tokio::test]
async fn lm_eval_batch_of_token_id_prompts() {
    let s = shared();
    let _g = lock();
    let prompts: Vec<Vec<u32>> =
        vec![vec![504, 3575, 282, 4649, 314, 7042], vec![1, 2, 3], vec![9690, 30, 378, 28, 436]];
    let body = json!({"prompt": prompts, "echo": true, "logprobs": 1, "max_tokens": 1, "temperature": 0});
    let (st, v) = post(s, "/v1/completions", body).await;
    assert_eq!(st, 200, "{v}");
    let choices = v["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3);
    assert_eq!(v["usage"]["prompt_tokens"], 14);
    assert_eq!(v["usage"]["completion_tokens"], 3);
    for (i, (c, p)) in choices.iter().zip(&prompts).enumerate() {
        assert_eq!(c["index"], i);
        let lp = &c["logprobs"];
        let vals = floats(&lp["token_logprobs"]);
        assert_eq!(vals.len(), p.len() + 1, "prompt positions and the generated token");
        assert!(vals[0].is_none());
        assert!(vals[1..].iter().all(|x| x.is_some_and(|x| x <= 0.0)));
        let tops = lp["top_logprobs"].as_array().expect("tops");
        assert!(tops[0].is_null());
        for (k, t) in tops.iter().enumerate().skip(1) {
            let t = t.as_object().expect("dict");
            // `logprobs: 1`: the most likely token, and the token itself when it differs.
            assert!((1..=2).contains(&t.len()), "{t:?}");
            let own = lp["tokens"][k].as_str().expect("token");
            assert_eq!(t[own].as_f64(), vals[k]);
            assert!(t.values().all(|x| x.as_f64() <= t.values().filter_map(Value::as_f64).reduce(f64::max)));
        }
        // The last (generated) token is greedy: its value is the largest in its dict.
        let last = tops.last().and_then(Value::as_object).expect("last dict");
        let best = last.values().filter_map(Value::as_f64).fold(f64::NEG_INFINITY, f64::max);
        assert_eq!(vals.last().copied().flatten(), Some(best));
        let alone = json!({"prompt": p, "echo": true, "logprobs": 1, "max_tokens": 1, "temperature": 0});
        let (_, a) = post(s, "/v1/completions", alone).await;
        assert_eq!(a["choices"][0]["logprobs"], *lp, "prompt {i}: batched equals alone");
        assert_eq!(a["choices"][0]["text"], c["text"]);
    }
    // max_tokens 0 (older harness versions): the prompt only.
    let (st, z) =
        post(s, "/v1/completions", json!({"prompt": prompts, "echo": true, "logprobs": 1, "max_tokens": 0})).await;
    assert_eq!(st, 200, "{z}");
    for (c, full) in z["choices"].as_array().expect("choices").iter().zip(choices) {
        let vals = floats(&c["logprobs"]["token_logprobs"]);
        let want = floats(&full["logprobs"]["token_logprobs"]);
        assert_eq!(vals[..], want[..want.len() - 1]);
    }
    assert_eq!(z["usage"]["completion_tokens"], 0);
    assert_drained(s).await;
}

/// Two prompts × `n: 2`: indices prompt-major (0, 1 from the first prompt), strings and ids
/// mixed, streamed choices each finish once.
#[tokio::test]
async fn batched_prompts_are_numbered_prompt_major() {
    let s = shared();
    let _g = lock();
    let body = json!({"prompt": [PARIS, [504, 3575]], "n": 2, "max_tokens": 3, "temperature": 0, "ignore_eos": true});
    let (st, v) = post(s, "/v1/completions", body.clone()).await;
    assert_eq!(st, 200, "{v}");
    let c = v["choices"].as_array().expect("choices");
    assert_eq!(c.iter().map(|c| c["index"].as_u64()).collect::<Vec<_>>(), [0, 1, 2, 3].map(Some));
    assert_eq!(c[0]["text"], c[1]["text"], "greedy: both choices of a prompt agree");
    let (_, alone) = post(
        s,
        "/v1/completions",
        json!({"prompt": [504, 3575], "max_tokens": 3, "temperature": 0, "ignore_eos": true}),
    )
    .await;
    assert_eq!(c[2]["text"], alone["choices"][0]["text"]);
    assert_eq!(v["usage"]["prompt_tokens"], 7);
    assert_eq!(v["usage"]["completion_tokens"], 12);
    let mut sb = body;
    sb["stream"] = json!(true);
    let (_, _, frames) = post_sse(s, "/v1/completions", sb).await;
    for i in 0..4u64 {
        assert_eq!(stream_text(&frames, i), c[i as usize]["text"].as_str().unwrap_or(""));
        let finishes = frames
            .iter()
            .filter_map(|f| f.get("choices").and_then(Value::as_array))
            .flatten()
            .filter(|x| x["index"] == i && !x["finish_reason"].is_null())
            .count();
        assert_eq!(finishes, 1);
    }
    assert_drained(s).await;
}

/// Streamed logprobs, concatenated chunk by chunk, equal the non-streamed object (completions
/// with `echo`, and chat), and the values agree across the three APIs.
#[tokio::test]
async fn streamed_logprobs_equal_whole_ones_on_every_route() {
    let s = shared();
    let _g = lock();
    let body =
        json!({"prompt": PARIS, "max_tokens": 8, "temperature": 0, "logprobs": 3, "echo": true, "ignore_eos": true});
    let (_, whole) = post(s, "/v1/completions", body.clone()).await;
    let w = &whole["choices"][0]["logprobs"];
    let mut sb = body;
    sb["stream"] = json!(true);
    let (_, _, frames) = post_sse(s, "/v1/completions", sb).await;
    let mut cat = json!({"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []});
    for f in &frames {
        let lp = &f["choices"][0]["logprobs"];
        if lp.is_object() {
            for k in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
                let more = lp[k].as_array().expect("list").clone();
                cat[k].as_array_mut().expect("list").extend(more);
            }
        }
    }
    assert_eq!(cat, *w);
    assert_eq!(w["tokens"].as_array().map(Vec::len), Some(5 + 8));
    // text_offset counts the characters of the token texts.
    let toks: Vec<&str> = w["tokens"].as_array().expect("t").iter().filter_map(Value::as_str).collect();
    let offs: Vec<u64> = w["text_offset"].as_array().expect("o").iter().filter_map(Value::as_u64).collect();
    for k in 1..toks.len() {
        assert_eq!(offs[k] - offs[k - 1], toks[k - 1].chars().count() as u64);
    }
    assert_eq!(toks.concat(), text0(&whole));

    // /generate: the same prompt positions and output tokens, SGLang's tuples.
    let g = json!({"text": PARIS, "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": true},
        "return_logprob": true, "top_logprobs_num": 3, "logprob_start_len": 0, "token_ids_logprob": [7042, 260],
        "return_text_in_logprobs": true});
    let (st, gv) = post(s, "/generate", g.clone()).await;
    assert_eq!(st, 200, "{gv}");
    let mi = &gv["meta_info"];
    let input = mi["input_token_logprobs"].as_array().expect("input");
    let output = mi["output_token_logprobs"].as_array().expect("output");
    assert_eq!((input.len(), output.len()), (5, 8));
    assert!(input[0][0].is_null() && mi["input_top_logprobs"][0].is_null());
    assert!(mi["input_token_ids_logprobs"][0].is_null());
    let wl = floats(&w["token_logprobs"]);
    for (k, t) in input.iter().chain(output).enumerate() {
        assert_eq!(t[0].as_f64(), wl[k], "position {k}");
        assert_eq!(t[2].as_str(), Some(toks[k]));
    }
    for k in 0..8 {
        let top = mi["output_top_logprobs"][k].as_array().expect("top");
        assert_eq!(top.len(), 3);
        assert_eq!(top[0][0], output[k][0], "greedy token is the most likely");
        let ids = mi["output_token_ids_logprobs"][k].as_array().expect("ids");
        assert_eq!(ids.iter().map(|x| x[1].as_u64()).collect::<Vec<_>>(), [Some(7042), Some(260)]);
    }
    let mut gs = g;
    gs["stream"] = json!(true);
    let (_, _, gframes) = post_sse(s, "/generate", gs).await;
    let last = gframes.iter().rev().find(|f| f.get("meta_info").is_some()).expect("a frame");
    assert_eq!(last["meta_info"]["output_token_logprobs"], mi["output_token_logprobs"]);
    assert_eq!(last["meta_info"]["input_token_logprobs"], mi["input_token_logprobs"]);
    // SGLang's default start (-1): the last prompt token only, `null` as SGLang pads the entry at
    // the start; a later start likewise (values from the position after it).
    let (_, d) = post(
        s,
        "/generate",
        json!({"text": PARIS, "sampling_params": {"max_new_tokens": 2, "temperature": 0}, "return_logprob": true}),
    )
    .await;
    assert_eq!(d["meta_info"]["input_token_logprobs"], json!([[null, input[4][1], null]]));
    assert!(d["meta_info"].get("input_top_logprobs").is_none());
    let (_, d) = post(s, "/generate", json!({"text": PARIS, "sampling_params": {"max_new_tokens": 0}, "return_logprob": true, "logprob_start_len": 2})).await;
    let got = d["meta_info"]["input_token_logprobs"].as_array().expect("input").clone();
    assert_eq!(got.len(), 3);
    assert!(got[0][0].is_null());
    assert_eq!(got[1][0].as_f64(), wl[3]);
    assert_eq!(got[2][0].as_f64(), wl[4]);
    assert_eq!(d["meta_info"]["output_token_logprobs"], json!([]));

    // vLLM's prompt_logprobs: null, then per position the prompt token with its rank first.
    let (_, pv) = post(s, "/v1/completions", json!({"prompt": PARIS, "max_tokens": 1, "prompt_logprobs": 2})).await;
    let pl = pv["choices"][0]["prompt_logprobs"].as_array().expect("prompt_logprobs");
    assert_eq!(pl.len(), 5);
    assert!(pl[0].is_null());
    for k in 1..5 {
        let m = pl[k].as_object().expect("dict");
        let (own_id, own) = m.iter().next().expect("own token first");
        assert_eq!(own["logprob"].as_f64(), wl[k]);
        assert_eq!(own["decoded_token"].as_str(), Some(toks[k]));
        assert!(own["rank"].as_u64().is_some_and(|r| r >= 1));
        assert!(m.len() <= 3 && m.values().filter(|x| x["rank"] == 1).count() == 1, "{m:?} ({own_id})");
    }

    // Chat: streamed content entries equal the whole answer's.
    let cb = json!({"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 6, "temperature": 0,
        "logprobs": true, "top_logprobs": 2});
    let (_, cw) = post(s, "/v1/chat/completions", cb.clone()).await;
    let content = cw["choices"][0]["logprobs"]["content"].clone();
    assert!(cw["choices"][0]["logprobs"]["refusal"].is_null());
    let mut csb = cb;
    csb["stream"] = json!(true);
    let (_, _, cf) = post_sse(s, "/v1/chat/completions", csb).await;
    let streamed: Vec<Value> =
        cf.iter().filter_map(|f| f["choices"][0]["logprobs"]["content"].as_array()).flatten().cloned().collect();
    assert_eq!(Value::Array(streamed), content);
    for c in content.as_array().expect("content") {
        let bytes: Vec<u8> =
            c["bytes"].as_array().expect("bytes").iter().filter_map(|b| b.as_u64().map(|b| b as u8)).collect();
        assert_eq!(String::from_utf8_lossy(&bytes), c["token"].as_str().unwrap_or(""));
        assert_eq!(c["top_logprobs"].as_array().map(Vec::len), Some(2));
    }
    // `logprobs: true` alone: empty top lists.
    let (_, one) = post(
        s,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 2, "logprobs": true}),
    )
    .await;
    assert_eq!(one["choices"][0]["logprobs"]["content"][0]["top_logprobs"], json!([]));
    assert_drained(s).await;
}

/// `no_stop_trim` (SGLang) and `include_stop_str_in_output` (vLLM) keep the stop string.
#[tokio::test]
async fn no_stop_trim_keeps_the_stop_string() {
    let s = shared();
    let _g = lock();
    let base = json!({"prompt": PARIS, "max_tokens": 12, "temperature": 0, "ignore_eos": true});
    let (_, free) = post(s, "/v1/completions", base.clone()).await;
    let text = text0(&free);
    // A stop string from the middle of the free-running text.
    let stop: String = text.trim_start().chars().skip(2).take(3).collect();
    let at = text.find(&stop).expect("stop in text");
    let mut b = base.clone();
    b["stop"] = json!([stop]);
    let (_, trimmed) = post(s, "/v1/completions", b.clone()).await;
    assert_eq!(text0(&trimmed), text[..at]);
    b["no_stop_trim"] = json!(true);
    let (_, kept) = post(s, "/v1/completions", b.clone()).await;
    assert_eq!(text0(&kept), text[..at + stop.len()]);
    b.as_object_mut().map(|o| o.remove("no_stop_trim"));
    b["include_stop_str_in_output"] = json!(true);
    let (_, kept2) = post(s, "/v1/completions", b).await;
    assert_eq!(text0(&kept2), text0(&kept));
    let g = json!({"text": PARIS, "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": true,
        "stop": [stop], "no_stop_trim": true}});
    let (_, gv) = post(s, "/generate", g).await;
    assert_eq!(gv["text"].as_str(), Some(&text[..at + stop.len()]));
    assert_drained(s).await;
}
