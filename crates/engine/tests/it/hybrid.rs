//! The hybrid Qwen3.5 architecture (GGUF `qwen35`: Gated DeltaNet layers beside gated
//! full-attention layers) against llama.cpp on a tiny "sharp" file: `fixtures/hybrid_golden.json`,
//! from `scripts/goldens/hybrid_golden.py`, whose tensor generator this mirrors byte for byte
//! (the fixture's SHA-256 of the tensor data is checked first).
//!
//! What the file makes visible: layers 1 and 3 attend and 0 and 2 are recurrent, so KV and
//! state layers are not the layer indices; 2 key heads under 4 value heads (value head `h`
//! reads key head `h mod 2`); decay rates down to −0.05 so the state carries far back; the
//! attention's per-head gate. The prompt's logits are computed in 20 chunks of 10 tokens, each
//! continuing the state and the window of the one before. Broken copies (the state dropped
//! between chunks, the attention gate negated, value heads in grouped order, the
//! convolution's taps one place off) must miss the golden. Then the scheduler: 32 mixed
//! requests batched equal each alone under chunked prefill, page sizes 1–64 and a pool small
//! enough to retract, and every state slot is free afterwards.

use sparrow_cpu::format::ggml::GgmlType;
use sparrow_engine::model::llama::LlamaModel;
use sparrow_engine::model::Model;
use sparrow_engine::scheduler::SchedulerConfig;

use crate::formats::{assert_golden_sees, check_against_llama_cpp, kq_rel, kq_run, kq_vector, Tensor};
use crate::moe_families::{
    f32v, fixture_named, greedy_agreement, q8, u32s, u32v, write_gguf, MetaValue, HOT, HOT_FACTOR,
};

const HIDDEN: usize = 256;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const FFN: usize = 512;
const LAYERS: usize = 4;
const VOCAB: usize = 256;
const CTX: usize = 512;
const EPS: f32 = 1e-6;
const HEAD_DIM: usize = 64;
const ROPE_DIMS: usize = 16;
const INTERVAL: usize = 2;
const CONV: usize = 4;
const DK: usize = 32;
const K_HEADS: usize = 2;
const V_HEADS: usize = 4;
const INNER: usize = V_HEADS * DK;
const CONV_DIM: usize = 2 * K_HEADS * DK + INNER;
const N_EXPERT: usize = 16;
const TOP_K: usize = 4;
const EXPERT_FFN: usize = 128;
const ROUTER: f64 = 0.25;

/// How far ours may be from the exact f64 forward, in multiples of llama.cpp's own mean
/// distance from it (measured, printed by the test).
const VS_REFERENCE: f32 = 1.25;

fn recurrent(l: usize) -> bool {
    !(l + 1).is_multiple_of(INTERVAL)
}

/// The script's `FAMILIES`: `(moe, next)`: experts (`qwen35moe`, `qwen3next`) and Qwen3-Next's
/// layout (grouped value heads, `ssm_ba`).
fn flags(family: &str) -> (bool, bool) {
    (family != "qwen35", family == "qwen3next")
}

/// The script's `tensors(fam)`, in file order (GGUF shapes: innermost first).
fn tensors(family: &str) -> Vec<Tensor> {
    let (moe, next) = flags(family);
    let (qd, kv) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    let mat = |name: String, r: usize, c: usize, t: f64| {
        let data = q8(&name, r, c, t);
        (name, vec![c as u64, r as u64], GgmlType::Q8_0, data)
    };
    let vec = |name: String, n: usize, lo: f64, hi: f64| {
        let data = kq_vector(&name, n, lo, hi);
        (name, vec![n as u64], GgmlType::F32, data)
    };
    let mut out = vec![mat("token_embd.weight".into(), VOCAB, HIDDEN, 0.5)];
    for l in 0..LAYERS {
        let p = format!("blk.{l}.");
        out.push(vec(format!("{p}attn_norm.weight"), HIDDEN, 0.6, 1.4));
        if recurrent(l) {
            out.push(mat(format!("{p}attn_qkv.weight"), CONV_DIM, HIDDEN, 0.15));
            out.push(mat(format!("{p}attn_gate.weight"), INNER, HIDDEN, 0.25));
            if next {
                out.push(mat(format!("{p}ssm_ba.weight"), 2 * V_HEADS, HIDDEN, 0.25));
            } else {
                out.push(mat(format!("{p}ssm_beta.weight"), V_HEADS, HIDDEN, 0.25));
                out.push(mat(format!("{p}ssm_alpha.weight"), V_HEADS, HIDDEN, 0.25));
            }
            let conv = format!("{p}ssm_conv1d.weight");
            let data = kq_vector(&conv, CONV_DIM * CONV, -0.6, 0.6);
            out.push((conv, vec![CONV as u64, CONV_DIM as u64], GgmlType::F32, data));
            out.push(vec(format!("{p}ssm_dt.bias"), V_HEADS, -1.0, 1.0));
            out.push(vec(format!("{p}ssm_a"), V_HEADS, -1.0, -0.05));
            out.push(vec(format!("{p}ssm_norm.weight"), DK, 0.6, 1.4));
            out.push(mat(format!("{p}ssm_out.weight"), HIDDEN, INNER, 0.25));
        } else {
            for (n, r, c, t) in [
                ("attn_q", 2 * qd, HIDDEN, 0.15),
                ("attn_k", kv, HIDDEN, 0.15),
                ("attn_v", kv, HIDDEN, 0.5),
                ("attn_output", HIDDEN, qd, 0.5),
            ] {
                out.push(mat(format!("{p}{n}.weight"), r, c, t));
            }
            out.push(vec(format!("{p}attn_q_norm.weight"), HEAD_DIM, 0.6, 1.4));
            out.push(vec(format!("{p}attn_k_norm.weight"), HEAD_DIM, 0.6, 1.4));
        }
        out.push(vec(format!("{p}post_attention_norm.weight"), HIDDEN, 0.6, 1.4));
        if moe {
            let router = format!("{p}ffn_gate_inp.weight");
            let data = kq_vector(&router, N_EXPERT * HIDDEN, -ROUTER, ROUTER);
            out.push((router, vec![HIDDEN as u64, N_EXPERT as u64], GgmlType::F32, data));
            for (n, r, c) in [
                ("ffn_gate_exps", EXPERT_FFN, HIDDEN),
                ("ffn_up_exps", EXPERT_FFN, HIDDEN),
                ("ffn_down_exps", HIDDEN, EXPERT_FFN),
            ] {
                let name = format!("{p}{n}.weight");
                let data = q8(&name, N_EXPERT * r, c, 0.25);
                out.push((name, vec![c as u64, r as u64, N_EXPERT as u64], GgmlType::Q8_0, data));
            }
            out.push(vec(format!("{p}ffn_gate_inp_shexp.weight"), HIDDEN, -0.3, 0.3));
            for (n, r, c) in [
                ("ffn_gate_shexp", EXPERT_FFN, HIDDEN),
                ("ffn_up_shexp", EXPERT_FFN, HIDDEN),
                ("ffn_down_shexp", HIDDEN, EXPERT_FFN),
            ] {
                out.push(mat(format!("{p}{n}.weight"), r, c, 0.25));
            }
            continue;
        }
        for (n, r, c) in [("ffn_gate", FFN, HIDDEN), ("ffn_up", FFN, HIDDEN), ("ffn_down", HIDDEN, FFN)] {
            out.push(mat(format!("{p}{n}.weight"), r, c, 0.25));
        }
    }
    out.push(vec("output_norm.weight".into(), HIDDEN, 0.6, 1.4));
    let mut head = q8("output.weight", VOCAB, HIDDEN, 0.5);
    let hot = sparrow_cpu::half::f32_to_f16((HOT_FACTOR * 0.5 / 127.0) as f32).to_le_bytes();
    for blk in head[..HOT * HIDDEN / 32 * 34].chunks_exact_mut(34) {
        blk[..2].copy_from_slice(&hot);
    }
    out.push(("output.weight".into(), vec![HIDDEN as u64, VOCAB as u64], GgmlType::Q8_0, head));
    out
}

/// An `i32` array metadata value.
fn i32_array(v: &[i32]) -> MetaValue {
    let mut b = 5u32.to_le_bytes().to_vec();
    b.extend_from_slice(&(v.len() as u64).to_le_bytes());
    v.iter().for_each(|x| b.extend_from_slice(&x.to_le_bytes()));
    (ggus::GGufMetaDataValueType::Array, b)
}

/// The script's `write`: the family's keys beside the tensors.
fn write(path: &std::path::Path, family: &str, tensors: &[Tensor]) {
    let (moe, next) = flags(family);
    let mut keyed = vec![
        ("block_count", u32v(LAYERS)),
        ("context_length", u32v(CTX)),
        ("embedding_length", u32v(HIDDEN)),
        ("feed_forward_length", u32v(FFN)),
        ("attention.head_count", u32v(HEADS)),
        ("attention.head_count_kv", u32v(KV_HEADS)),
        ("rope.freq_base", f32v(1e7)),
        ("attention.layer_norm_rms_epsilon", f32v(EPS)),
        ("attention.key_length", u32v(HEAD_DIM)),
        ("attention.value_length", u32v(HEAD_DIM)),
        ("rope.dimension_count", u32v(ROPE_DIMS)),
        ("ssm.conv_kernel", u32v(CONV)),
        ("ssm.state_size", u32v(DK)),
        ("ssm.group_count", u32v(K_HEADS)),
        ("ssm.time_step_rank", u32v(V_HEADS)),
        ("ssm.inner_size", u32v(INNER)),
        ("full_attention_interval", u32v(INTERVAL)),
    ];
    if !next {
        keyed.push(("rope.dimension_sections", i32_array(&[3, 3, 2, 0])));
    }
    if moe {
        keyed.push(("expert_count", u32v(N_EXPERT)));
        keyed.push(("expert_used_count", u32v(TOP_K)));
        keyed.push(("expert_feed_forward_length", u32v(EXPERT_FFN)));
        keyed.push(("expert_shared_feed_forward_length", u32v(EXPERT_FFN)));
    }
    write_gguf(path, family, &keyed, tensors);
}

/// Bytes of one Q8_0 row of `cols` values.
pub(crate) fn q8_row(cols: usize) -> usize {
    cols / 32 * 34
}

/// `t`'s rows regrouped: row block `b` of `rows_per` rows comes from block `perm[b]`.
pub(crate) fn permute_row_blocks(t: &mut Tensor, row_bytes: usize, first_row: usize, rows_per: usize, perm: &[usize]) {
    let old = t.3.clone();
    for (b, &from) in perm.iter().enumerate() {
        let dst = (first_row + b * rows_per) * row_bytes;
        let src = (first_row + from * rows_per) * row_bytes;
        t.3[dst..dst + rows_per * row_bytes].copy_from_slice(&old[src..src + rows_per * row_bytes]);
    }
}

/// The broken copies: what each changes in the file.
fn broken_copies(t: &[Tensor], family: &str) -> Vec<(&'static str, Vec<Tensor>)> {
    let (moe, next) = flags(family);
    // The gate's sign flipped (σ(−g) = 1 − σ(g)): each head's gate rows' Q8_0 scales negated.
    let mut gate = t.to_vec();
    for x in gate.iter_mut().filter(|x| x.0.ends_with("attn_q.weight")) {
        let rb = q8_row(HIDDEN);
        for h in 0..HEADS {
            let rows = (2 * h + 1) * HEAD_DIM * rb..(2 * h + 2) * HEAD_DIM * rb;
            for blk in x.3[rows].chunks_exact_mut(34) {
                blk[1] ^= 0x80;
            }
        }
    }
    // Value heads in HF's grouped order (h / 2 instead of h mod 2), consistently in every
    // tensor that has them: the same model read with the other grouping.
    let perm = [0usize, 2, 1, 3];
    let mut grouped = t.to_vec();
    for x in grouped.iter_mut() {
        let rb = q8_row(HIDDEN);
        if x.0.ends_with("attn_qkv.weight") {
            permute_row_blocks(x, rb, 2 * K_HEADS * DK, DK, &perm);
        } else if x.0.ends_with("attn_gate.weight") {
            permute_row_blocks(x, rb, 0, DK, &perm);
        } else if x.0.ends_with("ssm_beta.weight") || x.0.ends_with("ssm_alpha.weight") {
            permute_row_blocks(x, rb, 0, 1, &perm);
        } else if x.0.ends_with("ssm_dt.bias") || x.0.ends_with("ssm_a") {
            permute_row_blocks(x, 4, 0, 1, &perm);
        } else if x.0.ends_with("ssm_conv1d.weight") {
            permute_row_blocks(x, 4 * CONV, 2 * K_HEADS * DK, DK, &perm);
        } else if x.0.ends_with("ssm_out.weight") {
            // Columns: one Q8_0 block (32 = d_v values) per head in every row.
            let old = x.3.clone();
            for r in 0..HIDDEN {
                for (b, &from) in perm.iter().enumerate() {
                    let (dst, src) = (r * q8_row(INNER) + b * 34, r * q8_row(INNER) + from * 34);
                    x.3[dst..dst + 34].copy_from_slice(&old[src..src + 34]);
                }
            }
        }
    }
    // Each channel's taps one place off (the window read one token late).
    let mut conv = t.to_vec();
    for x in conv.iter_mut().filter(|x| x.0.ends_with("ssm_conv1d.weight")) {
        for ch in x.3.chunks_exact_mut(4 * CONV) {
            ch.rotate_left(4);
        }
    }
    let mut out = vec![
        ("attention gate negated", gate),
        ("value heads grouped, not tiled", grouped),
        ("convolution taps one place off", conv),
    ];
    if next {
        // β's and the decay's inputs swapped within each key head's `[b b | a a]`.
        let mut ba = t.to_vec();
        for x in ba.iter_mut().filter(|x| x.0.ends_with("ssm_ba.weight")) {
            let r = V_HEADS / K_HEADS;
            let perm: Vec<usize> = (0..2 * K_HEADS).map(|b| b ^ 1).collect();
            permute_row_blocks(x, q8_row(HIDDEN), 0, r, &perm);
        }
        out.push(("ssm_ba's b and a swapped", ba));
    }
    if moe {
        // The shared expert's gate gone: its output added whole.
        out.push((
            "shared expert ungated",
            t.iter().filter(|x| !x.0.ends_with("ffn_gate_inp_shexp.weight")).cloned().collect(),
        ));
    }
    out
}

/// [`kq_run`]'s prompt rows, but with every recurrent state dropped between chunks.
pub(crate) fn rows_forgetting_state(m: &mut dyn Model, ids: &[u32], positions: &[usize]) -> Vec<Vec<f32>> {
    use sparrow_engine::batch::ForwardBatch;
    let mut kv = sparrow_engine::model::kv_store(m, ids.len() + 1, 1, 0);
    let (mut rows, mut done) = (Vec::new(), 0);
    for &p in positions {
        if let Some(st) = kv.states_mut() {
            for l in 0..st.layout().layers {
                let (c, s) = st.layer_mut(l);
                c.fill(0.0);
                s.fill(0.0);
            }
        }
        rows.push(m.forward(&ForwardBatch::single_sequence(&ids[..=p], done), &mut kv).expect("forward"));
        done = p + 1;
    }
    rows
}

#[test]
fn qwen35_matches_llama_cpp() {
    let g = fixture_named("hybrid_golden.json");
    let ids = u32s(&g["prompt_ids"]);
    for case in g["cases"].as_array().expect("cases") {
        check_case(&ids, case);
    }
}

/// One fixture case: the file's tensors, its state layout, its rows and greedy tokens against
/// llama.cpp, and its broken copies.
fn check_case(ids: &[u32], case: &serde_json::Value) {
    use sha2::{Digest, Sha256};
    let family = case["family"].as_str().expect("family");
    let ids = ids.to_vec();
    let t = tensors(family);
    let mut sha = Sha256::new();
    t.iter().for_each(|x| sha.update(&x.3));
    let hex: String = sha.finalize().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, case["tensor_sha256"].as_str().expect("sha"), "{family}: not the tensors llama.cpp evaluated");
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("hybrid.gguf");
    write(&path, family, &t);
    let mut m = LlamaModel::load(&path, 2).unwrap_or_else(|e| panic!("{family}: {e}"));
    assert_eq!(m.info().architecture, family);
    // Two attention layers keep KV; two recurrent layers keep a 3-row window of 256 channels
    // and 4 heads of 32 × 32 each: the formula of docs/serve.md.
    assert_eq!(m.attention_needs().kv_layout.layers, 2);
    let st = m.state_layout().expect("a hybrid model has a state");
    assert_eq!((st.layers, st.conv, st.ssm), (2, (CONV - 1) * CONV_DIM, V_HEADS * DK * DK));
    assert_eq!(st.bytes_per_request(), 2 * ((CONV - 1) * CONV_DIM + V_HEADS * DK * DK) * 4);
    let positions: Vec<usize> =
        case["positions"].as_array().expect("pos").iter().map(|x| x.as_u64().expect("p") as usize).collect();
    let (rows, _) = kq_run(&mut m, &ids, &positions, 0);
    let ref_mean = check_against_llama_cpp(family, case, &rows, &[], &[], VS_REFERENCE, 0.0);
    let agree = greedy_agreement(&mut m, family, case);
    assert!(agree >= 5, "{family}: greedy equal to llama.cpp's for {agree} prompts of 6");
    let limit = 2.0 * VS_REFERENCE * ref_mean;
    let forgot = rows_forgetting_state(&mut m, &ids, &positions);
    let (fm, _) = kq_rel(&forgot, &case["exact"]);
    eprintln!("{family} broken run (state dropped between chunks): {:.1} % from exact on average", 100.0 * fm);
    assert!(fm > limit, "{family}: the golden does not see a state dropped between chunks ({fm})");
    for (what, bt) in broken_copies(&t, family) {
        let bp = dir.path().join("broken.gguf");
        write(&bp, family, &bt);
        let mut mb = LlamaModel::load(&bp, 2).unwrap_or_else(|e| panic!("{family} {what}: {e}"));
        assert_golden_sees(&format!("{family} broken copy ({what})"), &mut mb, &ids, &positions, &case["exact"], limit);
    }
}

/// 32 mixed requests (shared prefixes, lengths 3–69) batched equal each alone: chunked
/// prefill of 48 tokens, page sizes 1, 16 and 64, the radix cache on (hits only where a state
/// was saved) and off, and a pool of 40 pages of 16 that forces retractions (a retracted request
/// recomputed from its saved state or from position 0). Every request slot and saved state is
/// free after each run and a flush (`batch_invariance::run` checks).
#[test]
fn hybrid_batched_equals_alone_with_retraction() {
    use crate::batch_invariance::cfg;
    let dir = tempfile::tempdir().expect("tmp");
    for family in ["qwen35", "qwen35moe", "qwen3next"] {
        let path = dir.path().join("hybrid.gguf");
        write(&path, family, &tensors(family));
        let mut m = LlamaModel::load(&path, 2).expect("hybrid model");
        let configs = [
            ("page 1, radix", with_states(cfg(1, true, 48))),
            ("page 16, radix", with_states(cfg(16, true, 48))),
            ("page 64, no radix", cfg(64, false, 48)),
            ("40 pages, radix", tight_pool()),
        ];
        batched_equals_alone(&mut m, family, &configs);
    }
}

/// `c` with two saved states per request slot (the engine's default for a hybrid model).
pub(crate) fn with_states(c: SchedulerConfig) -> SchedulerConfig {
    SchedulerConfig { state_checkpoints: 2 * c.max_running_requests, ..c }
}

/// A pool of 40 pages of 16 for 16 running requests, radix on, chunks of 48: it retracts.
pub(crate) fn tight_pool() -> SchedulerConfig {
    with_states(SchedulerConfig {
        num_pages: 40,
        max_running_requests: 16,
        ..crate::batch_invariance::cfg(16, true, 48)
    })
}

/// The mixed prompts run under each of `configs` give each request the tokens it gets alone
/// (`batch_invariance::run` checks every slot and saved state is free after each run).
pub(crate) fn batched_equals_alone(m: &mut LlamaModel, family: &str, configs: &[(&str, SchedulerConfig)]) {
    use crate::batch_invariance::{cfg, mixed_prompts, run, NEW};
    let prompts = mixed_prompts(VOCAB as u32);
    let alone = run(m, cfg(1, false, 512), &prompts, true);
    assert!(alone.iter().all(|o| o.len() == NEW));
    for (label, c) in configs {
        let got = run(m, c.clone(), &prompts, false);
        for (i, (g, a)) in got.iter().zip(&alone).enumerate() {
            assert_eq!(g, a, "{family}: request {i}, {label}");
        }
    }
}

/// An agent's turns: each prompt is the one before, its answer and a new message. With saved
/// states the second and third turns start from the state saved where the turn before ended
/// (radix hits of most of their prompt), and every turn's tokens equal those of a cache-less
/// run; a flush frees every saved state.
#[test]
fn hybrid_multi_turn_hits_saved_states() {
    use sparrow_engine::kv::KvStore;
    use sparrow_engine::scheduler::{NewRequest, Output, Scheduler};
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("hybrid.gguf");
    write(&path, "qwen35", &tensors("qwen35"));
    let mut m = LlamaModel::load(&path, 2).expect("qwen35");
    let mut turns = |radix: bool| -> (Vec<Vec<u32>>, u64) {
        let c = crate::batch_invariance::cfg(1, radix, 32);
        let c = SchedulerConfig { state_checkpoints: if radix { 8 } else { 0 }, max_running_requests: 4, ..c };
        let mut s = Scheduler::new(c.clone(), None);
        let mut kv: KvStore = sparrow_engine::model::kv_store(&m, s.num_slots(), 4, c.state_checkpoints);
        let mut prompt: Vec<u32> = (0..70u32).map(|i| (i * 37 + 5) % VOCAB as u32).collect();
        let mut outs = Vec::new();
        for turn in 0..3u64 {
            let req = NewRequest {
                id: turn,
                input_ids: prompt.clone(),
                max_new_tokens: 8,
                sampling: Default::default(),
                stop_token_ids: vec![],
                ignore_eos: true,
                logprobs: Default::default(),
                constraint: None,
                embed: false,
                priority: None,
            };
            s.submit(req).expect("fits");
            let mut out = Vec::new();
            while !s.is_idle() {
                for o in s.step(&mut m, &mut kv) {
                    if let Output::Token { token, .. } = o {
                        out.push(token);
                    }
                }
            }
            prompt.extend(&out);
            prompt.extend((0..20u32).map(|i| (i * 11 + turn as u32 * 7) % VOCAB as u32));
            outs.push(out);
        }
        let hits = s.stats().radix_hit_tokens_total;
        s.flush_cache();
        assert_eq!(s.saved_states(), 0, "saved states left after a flush");
        (outs, hits)
    };
    let (cached, hits) = turns(true);
    let (plain, none) = turns(false);
    assert_eq!(cached, plain, "turns with saved states differ from a cache-less run");
    assert_eq!(none, 0);
    // Turn 2 hits the 70 + 8 − 1 tokens turn 1 computed, turn 3 turn 2's 98 + 8 − 1.
    assert_eq!(hits, (70 + 8 - 1) + (98 + 8 - 1), "radix hits over the turns");
}

/// The engine runs a hybrid model with its state pool and saved states (radix cache on), and
/// refuses by capability, at start-up, what a recurrent state cannot do yet: speculative
/// decoding, the file tier and embeddings, each error naming the flag.
#[test]
fn hybrid_engine_start_up_and_refusals() {
    use sparrow_engine::engine::{Engine, EngineArgs};
    use sparrow_engine::kv::hicache::{HiCacheArgs, WritePolicy};
    use sparrow_engine::scheduler::{NewRequest, Output};
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("hybrid.gguf");
    write(&path, "qwen35", &tensors("qwen35"));
    let load = || -> Box<dyn Model> { Box::new(LlamaModel::load(&path, 2).expect("qwen35")) };
    let args = EngineArgs {
        max_total_tokens: Some(4096),
        kv_cache_gb: 1.0,
        max_running_requests: Some(4),
        disable_autotune: true,
        ..EngineArgs::new(path.clone())
    };
    let engine = Engine::start_with_model(load(), &args, "scalar").expect("starts");
    let st = engine.state_layout().expect("a state pool");
    assert_eq!(st.bytes_per_request(), 2 * ((CONV - 1) * CONV_DIM + V_HEADS * DK * DK) * 4);
    let c = engine.config();
    assert!(!c.disable_radix_cache && c.state_checkpoints == 2 * c.max_running_requests, "{c:?}");
    let (tx, rx) = std::sync::mpsc::channel();
    let req = NewRequest {
        id: 1,
        input_ids: (0..40u32).collect(),
        max_new_tokens: 4,
        sampling: Default::default(),
        stop_token_ids: vec![],
        ignore_eos: true,
        logprobs: Default::default(),
        constraint: None,
        embed: false,
        priority: None,
    };
    engine.submit(req, Box::new(move |o| tx.send(o).is_ok())).expect("engine running");
    let mut n = 0;
    loop {
        match rx.recv_timeout(std::time::Duration::from_secs(30)).expect("an answer") {
            Output::Token { .. } => n += 1,
            Output::Finished { reason, .. } => {
                assert_eq!((n, format!("{reason:?}")), (4, "Length".to_owned()));
                break;
            }
            _ => {}
        }
    }
    let refuse = |a: EngineArgs, flag: &str| {
        let e = Engine::start_with_model(load(), &a, "scalar").map(|_| ()).expect_err("refused").to_string();
        assert!(e.contains("recurrent") && e.contains(flag), "{flag}: {e}");
    };
    let spec = sparrow_engine::spec::SpecConfig::ngram(4);
    refuse(EngineArgs { speculative: Some(spec), ..args.clone() }, "--speculative-algorithm");
    let tier = HiCacheArgs {
        dir: dir.path().join("tier"),
        size_bytes: Some(1 << 20),
        ratio: 2.0,
        write_policy: WritePolicy::WriteThrough,
    };
    refuse(EngineArgs { hicache: Some(tier), ..args.clone() }, "--enable-hierarchical-cache");
    refuse(EngineArgs { is_embedding: true, ..args }, "--is-embedding");
}
