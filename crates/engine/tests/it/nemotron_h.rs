//! The hybrid Nemotron-H architecture (GGUF `nemotron_h`: Mamba-2, attention and MLP blocks)
//! against llama.cpp on a tiny "sharp" file: `fixtures/nemotron_h_golden.json`, from
//! `scripts/goldens/nemotron_h_golden.py`, whose tensor generator this mirrors byte for byte
//! (the fixture's SHA-256 of the tensor data is checked first).
//!
//! What the file makes visible: the pattern `M-M*M-` puts the state layers (0, 2, 4), the one
//! KV layer (3) and the MLP blocks (1, 5) at indices that differ from their places in their
//! pools; 8 heads in 2 groups read their group's `B` and `C`; decay rates down to −0.05 so the
//! state carries far back; the gate `SiLU(z)` before the grouped norm. The prompt's logits are
//! computed in 20 chunks of 10 tokens, each continuing the state and window of the one before.
//! Broken copies (the state dropped between chunks, the gate negated, the heads reading the
//! other group, the convolution's taps one place off) must miss the golden. Then 32 mixed
//! requests batched equal each alone under chunked prefill, the radix cache and retraction.

use sparrow_cpu::format::ggml::GgmlType;
use sparrow_engine::model::llama::LlamaModel;
use sparrow_engine::model::Model;

use crate::formats::{assert_golden_sees, check_against_llama_cpp, kq_rel, kq_run, kq_vector, Tensor};
use crate::hybrid::{batched_equals_alone, permute_row_blocks, q8_row, rows_forgetting_state, tight_pool, with_states};
use crate::moe_families::{fixture_named, greedy_agreement, q8, u32s, u32v, write_gguf, MetaValue, HOT, HOT_FACTOR};

const HIDDEN: usize = 256;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const FFN: usize = 512;
const VOCAB: usize = 256;
const CTX: usize = 512;
const EPS: f32 = 1e-6;
const HEAD_DIM: usize = 64;
const PATTERN: &str = "M-M*M-";
const CONV: usize = 4;
const D_STATE: usize = 16;
const GROUPS: usize = 2;
const SSM_HEADS: usize = 8;
const SSM_HEAD_DIM: usize = 16;
const INNER: usize = SSM_HEADS * SSM_HEAD_DIM;
const CONV_DIM: usize = INNER + 2 * GROUPS * D_STATE;
const IN_PROJ: usize = INNER + CONV_DIM + SSM_HEADS;
const N_EXPERT: usize = 16;
const TOP_K: usize = 4;
const EXPERT_FFN: usize = 128;
const ROUTER: f64 = 0.25;
const SCALE: f32 = 2.5;

/// How far ours may be from the exact f64 forward, in multiples of llama.cpp's own mean
/// distance from it (measured, printed by the test).
const VS_REFERENCE: f32 = 1.25;

/// The script's `tensors(fam)`, in file order (GGUF shapes: innermost first); `moe`:
/// `nemotron_h_moe`'s experts in the MLP blocks.
fn tensors(moe: bool) -> Vec<Tensor> {
    let (qd, kv) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    let mat = |name: String, r: usize, c: usize, t: f64| {
        let data = q8(&name, r, c, t);
        (name, vec![c as u64, r as u64], GgmlType::Q8_0, data)
    };
    let vec = |name: String, shape: &[usize], lo: f64, hi: f64| {
        let data = kq_vector(&name, shape.iter().product(), lo, hi);
        (name, shape.iter().map(|&d| d as u64).collect::<Vec<_>>(), GgmlType::F32, data)
    };
    let mut out = vec![mat("token_embd.weight".into(), VOCAB, HIDDEN, 0.5)];
    for (l, kind) in PATTERN.chars().enumerate() {
        let p = format!("blk.{l}.");
        out.push(vec(format!("{p}attn_norm.weight"), &[HIDDEN], 0.6, 1.4));
        match kind {
            'M' => {
                out.push(mat(format!("{p}ssm_in.weight"), IN_PROJ, HIDDEN, 0.25));
                out.push(vec(format!("{p}ssm_conv1d.weight"), &[CONV, CONV_DIM], -0.6, 0.6));
                out.push(vec(format!("{p}ssm_conv1d.bias"), &[CONV_DIM], -0.3, 0.3));
                out.push(vec(format!("{p}ssm_dt.bias"), &[SSM_HEADS], -1.0, 1.0));
                out.push(vec(format!("{p}ssm_a"), &[1, SSM_HEADS], -1.0, -0.05));
                out.push(vec(format!("{p}ssm_d"), &[1, SSM_HEADS], 0.5, 1.5));
                out.push(vec(format!("{p}ssm_norm.weight"), &[INNER / GROUPS, GROUPS], 0.6, 1.4));
                out.push(mat(format!("{p}ssm_out.weight"), HIDDEN, INNER, 0.25));
            }
            '*' => {
                for (n, r, c, t) in [
                    ("attn_q", qd, HIDDEN, 0.15),
                    ("attn_k", kv, HIDDEN, 0.15),
                    ("attn_v", kv, HIDDEN, 0.5),
                    ("attn_output", HIDDEN, qd, 0.5),
                ] {
                    out.push(mat(format!("{p}{n}.weight"), r, c, t));
                }
            }
            _ if moe => {
                out.push(vec(format!("{p}ffn_gate_inp.weight"), &[HIDDEN, N_EXPERT], -ROUTER, ROUTER));
                out.push(vec(format!("{p}exp_probs_b.bias"), &[N_EXPERT], -0.5, 0.5));
                for (n, r, c) in [("ffn_up_exps", EXPERT_FFN, HIDDEN), ("ffn_down_exps", HIDDEN, EXPERT_FFN)] {
                    let name = format!("{p}{n}.weight");
                    let data = q8(&name, N_EXPERT * r, c, 0.25);
                    out.push((name, vec![c as u64, r as u64, N_EXPERT as u64], GgmlType::Q8_0, data));
                }
                out.push(mat(format!("{p}ffn_up_shexp.weight"), EXPERT_FFN, HIDDEN, 0.25));
                out.push(mat(format!("{p}ffn_down_shexp.weight"), HIDDEN, EXPERT_FFN, 0.25));
            }
            _ => {
                out.push(mat(format!("{p}ffn_up.weight"), FFN, HIDDEN, 0.25));
                out.push(mat(format!("{p}ffn_down.weight"), HIDDEN, FFN, 0.25));
            }
        }
    }
    out.push(vec("output_norm.weight".into(), &[HIDDEN], 0.6, 1.4));
    let mut head = q8("output.weight", VOCAB, HIDDEN, 0.5);
    let hot = sparrow_cpu::half::f32_to_f16((HOT_FACTOR * 0.5 / 127.0) as f32).to_le_bytes();
    for blk in head[..HOT * HIDDEN / 32 * 34].chunks_exact_mut(34) {
        blk[..2].copy_from_slice(&hot);
    }
    out.push(("output.weight".into(), vec![HIDDEN as u64, VOCAB as u64], GgmlType::Q8_0, head));
    out
}

/// A `u32` array metadata value, one entry per layer of [`PATTERN`] (`value` where `kind`).
fn per_layer(kind: char, value: usize) -> MetaValue {
    let mut b = 4u32.to_le_bytes().to_vec();
    b.extend_from_slice(&(PATTERN.len() as u64).to_le_bytes());
    PATTERN.chars().for_each(|k| b.extend_from_slice(&(if k == kind { value as u32 } else { 0 }).to_le_bytes()));
    (ggus::GGufMetaDataValueType::Array, b)
}

/// The script's `write`.
fn write(path: &std::path::Path, moe: bool, tensors: &[Tensor]) {
    let mut keyed = vec![
        ("block_count", u32v(PATTERN.len())),
        ("context_length", u32v(CTX)),
        ("embedding_length", u32v(HIDDEN)),
        ("feed_forward_length", per_layer('-', if moe { EXPERT_FFN } else { FFN })),
        ("attention.head_count", u32v(HEADS)),
        ("attention.head_count_kv", per_layer('*', KV_HEADS)),
        ("attention.layer_norm_rms_epsilon", crate::moe_families::f32v(EPS)),
        ("attention.key_length", u32v(HEAD_DIM)),
        ("attention.value_length", u32v(HEAD_DIM)),
        ("ssm.conv_kernel", u32v(CONV)),
        ("ssm.state_size", u32v(D_STATE)),
        ("ssm.group_count", u32v(GROUPS)),
        ("ssm.time_step_rank", u32v(SSM_HEADS)),
        ("ssm.inner_size", u32v(INNER)),
    ];
    if moe {
        let flag = (ggus::GGufMetaDataValueType::Bool, vec![1u8]);
        keyed.extend([
            ("expert_count", u32v(N_EXPERT)),
            ("expert_used_count", u32v(TOP_K)),
            ("expert_feed_forward_length", u32v(EXPERT_FFN)),
            ("expert_shared_feed_forward_length", u32v(EXPERT_FFN)),
            ("expert_shared_count", u32v(1)),
            ("expert_weights_norm", flag),
            ("expert_weights_scale", crate::moe_families::f32v(SCALE)),
        ]);
    }
    write_gguf(path, if moe { "nemotron_h_moe" } else { "nemotron_h" }, &keyed, tensors);
}

/// The broken copies: what each changes in the file.
fn broken_copies(t: &[Tensor]) -> Vec<(&'static str, Vec<Tensor>)> {
    let rb = q8_row(HIDDEN);
    // `z`'s sign flipped (SiLU(−z) ≠ SiLU(z)): its rows' Q8_0 scales negated.
    let mut gate = t.to_vec();
    for x in gate.iter_mut().filter(|x| x.0.ends_with("ssm_in.weight")) {
        for blk in x.3[..INNER * rb].chunks_exact_mut(34) {
            blk[1] ^= 0x80;
        }
    }
    // Group 0's `B` and `C` swapped with group 1's wherever they are: each head reads the
    // other group.
    let perm = [1usize, 0, 3, 2];
    let mut groups = t.to_vec();
    for x in groups.iter_mut() {
        if x.0.ends_with("ssm_in.weight") {
            permute_row_blocks(x, rb, 2 * INNER, D_STATE, &perm);
        } else if x.0.ends_with("ssm_conv1d.weight") {
            permute_row_blocks(x, 4 * CONV, INNER, D_STATE, &perm);
        } else if x.0.ends_with("ssm_conv1d.bias") {
            permute_row_blocks(x, 4, INNER, D_STATE, &perm);
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
        ("gate z negated", gate),
        ("heads read the other group", groups),
        ("convolution taps one place off", conv),
    ];
    if t.iter().any(|x| x.0.ends_with("exp_probs_b.bias")) {
        // The selection bias negated: other experts chosen (a file without it is refused).
        let mut neg = t.to_vec();
        for x in neg.iter_mut().filter(|x| x.0.ends_with("exp_probs_b.bias")) {
            x.3.chunks_exact_mut(4).for_each(|b| b[3] ^= 0x80);
        }
        out.push(("selection bias negated", neg));
    }
    out
}

#[test]
fn nemotron_h_matches_llama_cpp() {
    let g = fixture_named("nemotron_h_golden.json");
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
    let moe = family == "nemotron_h_moe";
    let ids = ids.to_vec();
    let t = tensors(moe);
    let mut sha = Sha256::new();
    t.iter().for_each(|x| sha.update(&x.3));
    let hex: String = sha.finalize().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, case["tensor_sha256"].as_str().expect("sha"), "{family}: not the tensors llama.cpp evaluated");
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("nemotron_h.gguf");
    write(&path, moe, &t);
    let mut m = LlamaModel::load(&path, 2).unwrap_or_else(|e| panic!("{family}: {e}"));
    assert_eq!(m.info().architecture, family);
    // One attention layer keeps KV; three Mamba-2 layers keep a 3-row window of x B C (192
    // channels) and 8 heads of 16 × 16 each: the formula of docs/serve.md.
    assert_eq!(m.attention_needs().kv_layout.layers, 1);
    let st = m.state_layout().expect("a hybrid model has a state");
    assert_eq!((st.layers, st.conv, st.ssm), (3, (CONV - 1) * CONV_DIM, SSM_HEADS * SSM_HEAD_DIM * D_STATE));
    assert_eq!(st.bytes_per_request(), 3 * ((CONV - 1) * CONV_DIM + INNER * D_STATE) * 4);
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
    for (what, bt) in broken_copies(&t) {
        let bp = dir.path().join("broken.gguf");
        write(&bp, moe, &bt);
        let mut mb = LlamaModel::load(&bp, 2).unwrap_or_else(|e| panic!("{family} {what}: {e}"));
        assert_golden_sees(&format!("{family} broken copy ({what})"), &mut mb, &ids, &positions, &case["exact"], limit);
    }
}

/// 32 mixed requests batched equal each alone: chunked prefill of 48 tokens with the radix
/// cache at page size 1, and a pool of 40 pages of 16 that forces retractions; every request
/// slot and saved state is free after each run and a flush (`batch_invariance::run` checks).
#[test]
fn nemotron_h_batched_equals_alone_with_retraction() {
    let dir = tempfile::tempdir().expect("tmp");
    for moe in [false, true] {
        let path = dir.path().join("nemotron_h.gguf");
        write(&path, moe, &tensors(moe));
        let mut m = LlamaModel::load(&path, 2).expect("nemotron_h");
        let configs = [
            ("page 1, radix", with_states(crate::batch_invariance::cfg(1, true, 48))),
            ("40 pages, radix", tight_pool()),
        ];
        batched_equals_alone(&mut m, if moe { "nemotron_h_moe" } else { "nemotron_h" }, &configs);
    }
}
