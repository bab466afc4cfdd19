//! A synthetic Hugging Face checkpoint of a `qwen3_moe`, a `glm4_moe`, a `gpt_oss` (its MXFP4
//! experts packed as OpenAI packs them) and a `deepseek_v3` shape, each beside its GGUF twin
//! (`qwen3moe`, `glm4moe`, `gpt-oss`, `deepseek2`: the same values under llama.cpp's names,
//! experts stacked into one tensor per projection, the keys llama.cpp's converter writes for
//! the config), load to the same model: the same logits, bit for bit, and so the same greedy
//! tokens. Both use YaRN (factor 4 over an original context of 64, the prompt past it), which
//! `config.json` states as `rope_scaling` and the GGUF file as `rope.scaling.*` keys, so the
//! twins agree only if both readers normalise it alike ([`HParams`]); DeepSeek's
//! `mscale_all_dim` (GGUF: `0.1 ·` it as `yarn_log_multiplier`) sets its attention scale. A
//! broken copy (two experts swapped in the checkpoint) must give other logits, so the
//! comparison sees the experts.
//!
//! [`HParams`]: sparrow_engine::model::hparams::HParams

use std::collections::HashMap;
use std::path::Path;

use ggus::GGufMetaDataValueType as Ty;
use sparrow_cpu::format::ggml::GgmlType;
use sparrow_engine::model::glm5::{Glm5Model, Glm5Options};
use sparrow_engine::model::llama::LlamaModel;
use sparrow_engine::model::Model;

use crate::formats::{kq_run, Tensor};
use crate::moe_families::{f32v, strv, u32v, write_gguf, MetaValue};

const HIDDEN: usize = 64;
const HEADS: usize = 4;
const LAYERS: usize = 3;
pub(crate) const VOCAB: usize = 128;
const CTX: usize = 256;
const N_EXPERT: usize = 8;
const TOP_K: usize = 2;
const EXPERT_FFN: usize = 32;
const FFN: usize = 96;
const EPS: f32 = 1e-6;

/// One weight of both files: its HF name and shape (`[rows, cols]` or `[n]`), its llama.cpp
/// name, and its values. Experts are one per expert here; the GGUF writer stacks them.
pub(crate) struct W {
    pub(crate) hf: String,
    pub(crate) gguf: String,
    pub(crate) shape: Vec<usize>,
    pub(crate) data: Vec<f32>,
}

/// Uniform values in `[-span, span]` (or `[lo, hi]` for norms), seeded by the name.
pub(crate) fn values(name: &str, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    let mut x = crate::formats::fnv1a(name);
    (0..n)
        .map(|_| {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            lo + (hi - lo) * ((z >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

/// A layer's weight in both files: (HF suffix, llama.cpp suffix, HF shape, value range).
type Named = (String, String, Vec<usize>, (f32, f32));

/// The model's tensors under both names: `layer(l)` lists a layer's ([`Named`]).
fn weights(layer: impl Fn(usize) -> Vec<Named>) -> Vec<W> {
    let mut out = Vec::new();
    let mut push = |hf: String, gguf: String, shape: Vec<usize>, (lo, hi): (f32, f32)| {
        let data = values(&hf, shape.iter().product(), lo, hi);
        out.push(W { hf, gguf, shape, data });
    };
    push("model.embed_tokens.weight".into(), "token_embd.weight".into(), vec![VOCAB, HIDDEN], (-1.0, 1.0));
    for l in 0..LAYERS {
        for (hf, gguf, shape, span) in layer(l) {
            push(format!("model.layers.{l}.{hf}"), format!("blk.{l}.{gguf}"), shape, span);
        }
    }
    push("model.norm.weight".into(), "output_norm.weight".into(), vec![HIDDEN], (0.6, 1.4));
    push("lm_head.weight".into(), "output.weight".into(), vec![VOCAB, HIDDEN], (-0.5, 0.5));
    out
}

/// The routed experts of one layer: per expert and projection, with their stacked GGUF name.
fn experts(mlp: &str) -> Vec<Named> {
    let mut v = Vec::new();
    for (p, g, r, c) in [
        ("gate_proj", "ffn_gate_exps", EXPERT_FFN, HIDDEN),
        ("up_proj", "ffn_up_exps", EXPERT_FFN, HIDDEN),
        ("down_proj", "ffn_down_exps", HIDDEN, EXPERT_FFN),
    ] {
        for e in 0..N_EXPERT {
            v.push((format!("{mlp}.experts.{e}.{p}.weight"), format!("{g}.weight#{e}"), vec![r, c], (-0.3, 0.3)));
        }
    }
    v
}

/// The F32 GGUF tensors of `ws`: names as llama.cpp's, shapes innermost first, experts
/// (`name#e`) stacked in expert order into `[cols, rows, n_expert]`.
/// The FFN of a DeepSeek-style layer (DeepSeek-V3, GLM-4.5): layer 0 dense
/// (`first_k_dense_replace` = 1), the others routed experts with a sigmoid-gate bias and one
/// shared expert.
fn deepseek_ffn(l: usize) -> Vec<Named> {
    let mut w = Vec::new();
    if l == 0 {
        for (p, g, r, c) in [
            ("gate_proj", "ffn_gate", FFN, HIDDEN),
            ("up_proj", "ffn_up", FFN, HIDDEN),
            ("down_proj", "ffn_down", HIDDEN, FFN),
        ] {
            w.push((format!("mlp.{p}.weight"), format!("{g}.weight"), vec![r, c], (-0.3, 0.3)));
        }
        return w;
    }
    w.push(("mlp.gate.weight".into(), "ffn_gate_inp.weight".into(), vec![N_EXPERT, HIDDEN], (-0.5, 0.5)));
    w.push(("mlp.gate.e_score_correction_bias".into(), "exp_probs_b.bias".into(), vec![N_EXPERT], (-0.3, 0.3)));
    w.extend(experts("mlp"));
    for (p, g, r, c) in [
        ("gate_proj", "ffn_gate_shexp", EXPERT_FFN, HIDDEN),
        ("up_proj", "ffn_up_shexp", EXPERT_FFN, HIDDEN),
        ("down_proj", "ffn_down_shexp", HIDDEN, EXPERT_FFN),
    ] {
        w.push((format!("mlp.shared_experts.{p}.weight"), format!("{g}.weight"), vec![r, c], (-0.3, 0.3)));
    }
    w
}

pub(crate) fn gguf_tensors(ws: &[W]) -> Vec<Tensor> {
    let mut out: Vec<Tensor> = Vec::new();
    let bytes = |d: &[f32]| d.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    for w in ws {
        match w.gguf.split_once('#') {
            Some((name, e)) => {
                if e == "0" {
                    let (r, c) = (w.shape[0], w.shape[1]);
                    out.push((name.into(), vec![c as u64, r as u64, N_EXPERT as u64], GgmlType::F32, Vec::new()));
                }
                let t = out.iter_mut().find(|t| t.0 == name).expect("expert 0 first");
                t.3.extend(bytes(&w.data));
            }
            None => {
                let shape = w.shape.iter().rev().map(|&d| d as u64).collect();
                out.push((w.gguf.clone(), shape, GgmlType::F32, bytes(&w.data)));
            }
        }
    }
    out
}

/// The checkpoint directory: `config.json` and one F32 safetensors file of `ws`.
pub(crate) fn write_hf(dir: &Path, config: &serde_json::Value, ws: &[W]) {
    std::fs::create_dir_all(dir).expect("dir");
    std::fs::write(dir.join("config.json"), config.to_string()).expect("config");
    let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = ws
        .iter()
        .map(|w| (w.hf.clone(), w.data.iter().flat_map(|x| x.to_le_bytes()).collect(), w.shape.clone()))
        .collect();
    let views = bytes.iter().map(|(n, b, s)| {
        (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b).expect("view"))
    });
    safetensors::serialize_to_file(views, None::<HashMap<String, String>>, &dir.join("model.safetensors"))
        .expect("safetensors");
}

/// The checkpoint with experts 0 and 1 of layer 1 swapped (every projection).
fn swapped(ws: &[W]) -> Vec<W> {
    let rename = |n: &str| match () {
        _ if n.contains("layers.1.mlp.experts.0.") => n.replace("experts.0.", "experts.1."),
        _ if n.contains("layers.1.mlp.experts.1.") => n.replace("experts.1.", "experts.0."),
        _ => n.to_owned(),
    };
    ws.iter()
        .map(|w| W { hf: rename(&w.hf), gguf: w.gguf.clone(), shape: w.shape.clone(), data: w.data.clone() })
        .collect()
}

/// The prompt: past the original context of 64, so YaRN's interpolated pairs matter.
fn prompt() -> Vec<u32> {
    (0..90).map(|i| ((i * 37 + 11) % VOCAB) as u32).collect()
}

/// Logits of every 10th prompt position and 12 greedy tokens.
pub(crate) fn run(m: &mut dyn Model) -> (Vec<Vec<f32>>, Vec<u32>) {
    let ids = prompt();
    let positions: Vec<usize> = (9..ids.len()).step_by(10).collect();
    kq_run(m, &ids, &positions, 12)
}

/// The twins' logits are the same bits and their greedy tokens the same; the broken copy's
/// logits are not.
pub(crate) fn check_twins(label: &str, gguf: &mut dyn Model, hf: &mut dyn Model, broken: &mut dyn Model) {
    let (rg, tg) = run(gguf);
    let (rh, th) = run(hf);
    assert_eq!(th, tg, "{label}: greedy tokens of the checkpoint and of its GGUF twin");
    assert_eq!(rh, rg, "{label}: logits of the checkpoint and of its GGUF twin");
    let (rb, _) = run(broken);
    let diff = rb.iter().flatten().zip(rg.iter().flatten()).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(diff > 1e-3, "{label}: the broken checkpoint gives the same logits ({diff})");
    println!("{label}: {} logit rows equal, greedy {th:?}; the broken copy moves logits by up to {diff:.3}", rg.len());
}

#[test]
fn qwen3_moe_checkpoint_equals_its_gguf_twin() {
    let hd = 32;
    let ws = weights(|_| {
        let mut v = vec![
            ("input_layernorm.weight".into(), "attn_norm.weight".into(), vec![HIDDEN], (0.6, 1.4)),
            ("self_attn.q_proj.weight".into(), "attn_q.weight".into(), vec![HEADS * hd, HIDDEN], (-0.4, 0.4)),
            ("self_attn.k_proj.weight".into(), "attn_k.weight".into(), vec![2 * hd, HIDDEN], (-0.4, 0.4)),
            ("self_attn.v_proj.weight".into(), "attn_v.weight".into(), vec![2 * hd, HIDDEN], (-0.3, 0.3)),
            ("self_attn.o_proj.weight".into(), "attn_output.weight".into(), vec![HIDDEN, HEADS * hd], (-0.3, 0.3)),
            ("self_attn.q_norm.weight".into(), "attn_q_norm.weight".into(), vec![hd], (0.6, 1.4)),
            ("self_attn.k_norm.weight".into(), "attn_k_norm.weight".into(), vec![hd], (0.6, 1.4)),
            ("post_attention_layernorm.weight".into(), "ffn_norm.weight".into(), vec![HIDDEN], (0.6, 1.4)),
            ("mlp.gate.weight".into(), "ffn_gate_inp.weight".into(), vec![N_EXPERT, HIDDEN], (-0.5, 0.5)),
        ];
        v.extend(experts("mlp"));
        v
    });
    let config = serde_json::json!({
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": HIDDEN,
        "intermediate_size": FFN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": 2, "head_dim": hd, "rope_theta": 1000000.0, "rms_norm_eps": EPS,
        "vocab_size": VOCAB, "max_position_embeddings": CTX, "tie_word_embeddings": false,
        "num_experts": N_EXPERT, "num_experts_per_tok": TOP_K, "moe_intermediate_size": EXPERT_FFN,
        "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}
    });
    let keys: Vec<(&str, MetaValue)> = vec![
        ("block_count", u32v(LAYERS)),
        ("context_length", u32v(CTX)),
        ("embedding_length", u32v(HIDDEN)),
        ("feed_forward_length", u32v(FFN)),
        ("attention.head_count", u32v(HEADS)),
        ("attention.head_count_kv", u32v(2)),
        ("attention.key_length", u32v(hd)),
        ("attention.value_length", u32v(hd)),
        ("rope.freq_base", f32v(1e6)),
        ("attention.layer_norm_rms_epsilon", f32v(EPS)),
        ("expert_count", u32v(N_EXPERT)),
        ("expert_used_count", u32v(TOP_K)),
        ("expert_feed_forward_length", u32v(EXPERT_FFN)),
        ("rope.scaling.type", strv("yarn")),
        ("rope.scaling.factor", f32v(4.0)),
        ("rope.scaling.original_context_length", u32v(64)),
    ];
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("twin.gguf");
    write_gguf(&path, "qwen3moe", &keys, &gguf_tensors(&ws));
    write_hf(&dir.path().join("hf"), &config, &ws);
    write_hf(&dir.path().join("broken"), &config, &swapped(&ws));
    let mut g = LlamaModel::load(&path, 2).expect("GGUF twin");
    let mut h = LlamaModel::load_hf(&dir.path().join("hf"), 2).expect("checkpoint");
    let mut b = LlamaModel::load_hf(&dir.path().join("broken"), 2).expect("broken checkpoint");
    assert_eq!((h.info().architecture.as_str(), g.info().architecture.as_str()), ("qwen3_moe", "qwen3moe"));
    check_twins("qwen3_moe", &mut g, &mut h, &mut b);
}

#[test]
fn deepseek_v3_checkpoint_equals_its_gguf_twin() {
    let (q_lora, kv_lora, nope, rope, v) = (48, 32, 16, 16, 16);
    let ws = weights(|l| {
        let mut w = vec![
            ("input_layernorm.weight".into(), "attn_norm.weight".into(), vec![HIDDEN], (0.6, 1.4)),
            ("self_attn.q_a_proj.weight".into(), "attn_q_a.weight".into(), vec![q_lora, HIDDEN], (-0.4, 0.4)),
            ("self_attn.q_a_layernorm.weight".into(), "attn_q_a_norm.weight".into(), vec![q_lora], (0.6, 1.4)),
            (
                "self_attn.q_b_proj.weight".into(),
                "attn_q_b.weight".into(),
                vec![HEADS * (nope + rope), q_lora],
                (-0.4, 0.4),
            ),
            (
                "self_attn.kv_a_proj_with_mqa.weight".into(),
                "attn_kv_a_mqa.weight".into(),
                vec![kv_lora + rope, HIDDEN],
                (-0.4, 0.4),
            ),
            ("self_attn.kv_a_layernorm.weight".into(), "attn_kv_a_norm.weight".into(), vec![kv_lora], (0.6, 1.4)),
            (
                "self_attn.kv_b_proj.weight".into(),
                "attn_kv_b.weight".into(),
                vec![HEADS * (nope + v), kv_lora],
                (-0.4, 0.4),
            ),
            ("self_attn.o_proj.weight".into(), "attn_output.weight".into(), vec![HIDDEN, HEADS * v], (-0.3, 0.3)),
            ("post_attention_layernorm.weight".into(), "ffn_norm.weight".into(), vec![HIDDEN], (0.6, 1.4)),
        ];
        w.extend(deepseek_ffn(l));
        w
    });
    let config = serde_json::json!({
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": HIDDEN,
        "intermediate_size": FFN, "moe_intermediate_size": EXPERT_FFN, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": HEADS, "n_shared_experts": 1,
        "n_routed_experts": N_EXPERT, "num_experts_per_tok": TOP_K, "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 1, "n_group": 4, "topk_group": 2, "norm_topk_prob": true,
        "scoring_func": "sigmoid", "topk_method": "noaux_tc", "kv_lora_rank": kv_lora, "q_lora_rank": q_lora,
        "qk_nope_head_dim": nope, "qk_rope_head_dim": rope, "v_head_dim": v, "rope_theta": 10000.0,
        "rms_norm_eps": EPS, "vocab_size": VOCAB, "max_position_embeddings": CTX, "tie_word_embeddings": false,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                         "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}
    });
    let keys: Vec<(&str, MetaValue)> = vec![
        ("block_count", u32v(LAYERS)),
        ("context_length", u32v(CTX)),
        ("embedding_length", u32v(HIDDEN)),
        ("feed_forward_length", u32v(FFN)),
        ("attention.head_count", u32v(HEADS)),
        ("attention.head_count_kv", u32v(HEADS)),
        ("attention.key_length", u32v(nope + rope)),
        ("attention.value_length", u32v(v)),
        ("rope.freq_base", f32v(10000.0)),
        ("attention.layer_norm_rms_epsilon", f32v(EPS)),
        ("leading_dense_block_count", u32v(1)),
        ("attention.q_lora_rank", u32v(q_lora)),
        ("attention.kv_lora_rank", u32v(kv_lora)),
        ("expert_feed_forward_length", u32v(EXPERT_FFN)),
        ("expert_count", u32v(N_EXPERT)),
        ("expert_shared_count", u32v(1)),
        ("expert_used_count", u32v(TOP_K)),
        ("expert_weights_scale", f32v(2.5)),
        ("expert_weights_norm", (Ty::Bool, vec![1])),
        ("expert_gating_func", u32v(2)),
        ("expert_group_count", u32v(4)),
        ("expert_group_used_count", u32v(2)),
        ("rope.dimension_count", u32v(rope)),
        ("rope.scaling.type", strv("yarn")),
        ("rope.scaling.factor", f32v(4.0)),
        ("rope.scaling.original_context_length", u32v(64)),
        ("rope.scaling.yarn_log_multiplier", f32v(0.1 * 0.707)),
    ];
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("twin.gguf");
    write_gguf(&path, "deepseek2", &keys, &gguf_tensors(&ws));
    write_hf(&dir.path().join("hf"), &config, &ws);
    write_hf(&dir.path().join("broken"), &config, &swapped(&ws));
    let opts = Glm5Options::default;
    let mut g = Glm5Model::load_gguf(&path, 2, opts()).expect("GGUF twin");
    let mut h = Glm5Model::load(&dir.path().join("hf"), 2, opts()).expect("checkpoint");
    let mut b = Glm5Model::load(&dir.path().join("broken"), 2, opts()).expect("broken checkpoint");
    assert_eq!(h.info().architecture, "deepseek_v3");
    check_twins("deepseek_v3", &mut g, &mut h, &mut b);
}

#[test]
fn glm4_moe_checkpoint_equals_its_gguf_twin() {
    let hd = 32;
    let ws = weights(|l| {
        let mut w = vec![
            ("input_layernorm.weight".into(), "attn_norm.weight".into(), vec![HIDDEN], (0.6, 1.4)),
            ("self_attn.q_proj.weight".into(), "attn_q.weight".into(), vec![HEADS * hd, HIDDEN], (-0.4, 0.4)),
            ("self_attn.q_proj.bias".into(), "attn_q.bias".into(), vec![HEADS * hd], (-1.0, 1.0)),
            ("self_attn.k_proj.weight".into(), "attn_k.weight".into(), vec![2 * hd, HIDDEN], (-0.4, 0.4)),
            ("self_attn.k_proj.bias".into(), "attn_k.bias".into(), vec![2 * hd], (-1.0, 1.0)),
            ("self_attn.v_proj.weight".into(), "attn_v.weight".into(), vec![2 * hd, HIDDEN], (-0.3, 0.3)),
            ("self_attn.v_proj.bias".into(), "attn_v.bias".into(), vec![2 * hd], (-1.0, 1.0)),
            ("self_attn.o_proj.weight".into(), "attn_output.weight".into(), vec![HIDDEN, HEADS * hd], (-0.3, 0.3)),
            // GLM-4.5's pre-FFN norm: HF's `post_attention_layernorm`, llama.cpp's
            // `post_attention_norm`.
            ("post_attention_layernorm.weight".into(), "post_attention_norm.weight".into(), vec![HIDDEN], (0.6, 1.4)),
        ];
        w.extend(deepseek_ffn(l));
        w
    });
    let config = serde_json::json!({
        "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "hidden_size": HIDDEN,
        "intermediate_size": FFN, "moe_intermediate_size": EXPERT_FFN, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": 2, "head_dim": hd, "partial_rotary_factor": 0.5,
        "attention_bias": true, "use_qk_norm": false, "n_routed_experts": N_EXPERT, "n_shared_experts": 1,
        "num_experts_per_tok": TOP_K, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
        "norm_topk_prob": true, "routed_scaling_factor": 2.5, "rope_theta": 1000000.0, "rms_norm_eps": EPS,
        "vocab_size": VOCAB, "max_position_embeddings": CTX, "tie_word_embeddings": false
    });
    let keys: Vec<(&str, MetaValue)> = vec![
        ("block_count", u32v(LAYERS)),
        ("context_length", u32v(CTX)),
        ("embedding_length", u32v(HIDDEN)),
        ("feed_forward_length", u32v(FFN)),
        ("attention.head_count", u32v(HEADS)),
        ("attention.head_count_kv", u32v(2)),
        ("attention.key_length", u32v(hd)),
        ("attention.value_length", u32v(hd)),
        ("rope.dimension_count", u32v(hd / 2)),
        ("rope.freq_base", f32v(1e6)),
        ("attention.layer_norm_rms_epsilon", f32v(EPS)),
        ("leading_dense_block_count", u32v(1)),
        ("expert_count", u32v(N_EXPERT)),
        ("expert_used_count", u32v(TOP_K)),
        ("expert_feed_forward_length", u32v(EXPERT_FFN)),
        ("expert_shared_count", u32v(1)),
        ("expert_weights_scale", f32v(2.5)),
        ("expert_weights_norm", (Ty::Bool, vec![1])),
        ("expert_gating_func", u32v(2)),
    ];
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("twin.gguf");
    write_gguf(&path, "glm4moe", &keys, &gguf_tensors(&ws));
    write_hf(&dir.path().join("hf"), &config, &ws);
    write_hf(&dir.path().join("broken"), &config, &swapped(&ws));
    let mut g = LlamaModel::load(&path, 2).expect("GGUF twin");
    let mut h = LlamaModel::load_hf(&dir.path().join("hf"), 2).expect("checkpoint");
    let mut b = LlamaModel::load_hf(&dir.path().join("broken"), 2).expect("broken checkpoint");
    check_twins("glm4_moe", &mut g, &mut h, &mut b);
}

/// A safetensors checkpoint of raw tensors `(name, dtype, shape, bytes)` beside `config`.
fn write_raw_hf(dir: &Path, config: &serde_json::Value, ts: &[(String, safetensors::Dtype, Vec<usize>, Vec<u8>)]) {
    std::fs::create_dir_all(dir).expect("dir");
    std::fs::write(dir.join("config.json"), config.to_string()).expect("config");
    let views = ts
        .iter()
        .map(|(n, d, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).expect("view")));
    safetensors::serialize_to_file(views, None::<HashMap<String, String>>, &dir.join("model.safetensors"))
        .expect("safetensors");
}

/// gpt-oss as its HF checkpoints store it (the router as `mlp.router`, every projection's
/// experts packed in OpenAI's MXFP4 layout: nibbles interleaved, scales apart, `gate_up_proj`
/// rows and biases interleaved gate/up) beside its GGUF twin (GGML MXFP4 blocks, one tensor per
/// projection): the same logits bit for bit. The broken copy packs `gate_up_proj` as gate rows
/// then up rows, not interleaved.
#[test]
fn gpt_oss_checkpoint_equals_its_gguf_twin() {
    use safetensors::Dtype as D;
    let (hd, kv) = (32, 2);
    let f32b = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let mut gguf: Vec<Tensor> = Vec::new();
    let mut hf = Vec::new();
    let mut broken = Vec::new();
    // A float tensor in both files (`shape` as HF has it).
    type Hf = Vec<(String, D, Vec<usize>, Vec<u8>)>;
    let both = |gguf: &mut Vec<Tensor>, hf: &mut Hf, hfn: String, gn: String, shape: Vec<usize>, span: (f32, f32)| {
        let data = values(&hfn, shape.iter().product(), span.0, span.1);
        gguf.push((gn, shape.iter().rev().map(|&d| d as u64).collect(), GgmlType::F32, f32b(&data)));
        hf.push((hfn, D::F32, shape, f32b(&data)));
    };
    both(
        &mut gguf,
        &mut hf,
        "model.embed_tokens.weight".into(),
        "token_embd.weight".into(),
        vec![VOCAB, HIDDEN],
        (-1.0, 1.0),
    );
    let (nb, nbi) = (HIDDEN / 32, EXPERT_FFN / 32);
    let (mut packed, mut packed_broken): (Hf, Hf) = (Vec::new(), Vec::new());
    for l in 0..LAYERS {
        let (p, b) = (format!("model.layers.{l}."), format!("blk.{l}."));
        for (h, g, shape, span) in [
            ("input_layernorm.weight", "attn_norm.weight", vec![HIDDEN], (0.6, 1.4)),
            ("self_attn.q_proj.weight", "attn_q.weight", vec![HEADS * hd, HIDDEN], (-0.4, 0.4)),
            ("self_attn.q_proj.bias", "attn_q.bias", vec![HEADS * hd], (-1.0, 1.0)),
            ("self_attn.k_proj.weight", "attn_k.weight", vec![kv * hd, HIDDEN], (-0.4, 0.4)),
            ("self_attn.k_proj.bias", "attn_k.bias", vec![kv * hd], (-1.0, 1.0)),
            ("self_attn.v_proj.weight", "attn_v.weight", vec![kv * hd, HIDDEN], (-0.3, 0.3)),
            ("self_attn.v_proj.bias", "attn_v.bias", vec![kv * hd], (-1.0, 1.0)),
            ("self_attn.o_proj.weight", "attn_output.weight", vec![HIDDEN, HEADS * hd], (-0.3, 0.3)),
            ("self_attn.o_proj.bias", "attn_output.bias", vec![HIDDEN], (-0.5, 0.5)),
            ("self_attn.sinks", "attn_sinks.weight", vec![HEADS], (0.0, 3.0)),
            ("post_attention_layernorm.weight", "post_attention_norm.weight", vec![HIDDEN], (0.6, 1.4)),
            ("mlp.router.weight", "ffn_gate_inp.weight", vec![N_EXPERT, HIDDEN], (-0.5, 0.5)),
            ("mlp.router.bias", "ffn_gate_inp.bias", vec![N_EXPERT], (-0.5, 0.5)),
        ] {
            both(&mut gguf, &mut hf, format!("{p}{h}"), format!("{b}{g}"), shape, span);
        }
        // Each projection's experts: GGML MXFP4 rows (scale byte + 16 code bytes per 32) in the
        // GGUF file; OpenAI's layout in the checkpoint.
        let rows_of = |gguf: &mut Vec<Tensor>, proj: &str, rows: usize, cols_blocks: usize| -> Vec<Vec<u8>> {
            let name = format!("{b}ffn_{proj}_exps.weight");
            let mut raw = crate::formats::splitmix(crate::formats::fnv1a(&name), N_EXPERT * rows * cols_blocks * 17);
            raw.chunks_exact_mut(17).enumerate().for_each(|(i, blk)| blk[0] = 120 + (i % 6) as u8);
            let bias = values(&format!("{name}.bias"), N_EXPERT * rows, -0.5, 0.5);
            gguf.push((
                name,
                vec![(cols_blocks * 32) as u64, rows as u64, N_EXPERT as u64],
                GgmlType::MXFP4,
                raw.clone(),
            ));
            gguf.push((
                format!("{b}ffn_{proj}_exps.bias"),
                vec![rows as u64, N_EXPERT as u64],
                GgmlType::F32,
                f32b(&bias),
            ));
            let mut out: Vec<Vec<u8>> = raw.chunks_exact(cols_blocks * 17).map(<[u8]>::to_vec).collect();
            out.push(f32b(&bias));
            out
        };
        let gate = rows_of(&mut gguf, "gate", EXPERT_FFN, nb);
        let up = rows_of(&mut gguf, "up", EXPERT_FFN, nb);
        let down = rows_of(&mut gguf, "down", HIDDEN, nbi);
        // OpenAI's block: value 2j in byte j's low nibble, 2j + 1 in its high one.
        let openai = |ggml_row: &[u8], blocks: &mut Vec<u8>, scales: &mut Vec<u8>| {
            for blk in ggml_row.chunks_exact(17) {
                scales.push(blk[0]);
                let v = |i: usize| if i < 16 { blk[1 + i] & 0x0f } else { blk[1 + i - 16] >> 4 };
                blocks.extend((0..16).map(|j| v(2 * j) | (v(2 * j + 1) << 4)));
            }
        };
        let (gb, ub, db) = (gate.last().expect("bias"), up.last().expect("bias"), down.last().expect("bias"));
        for interleave in [true, false] {
            let (mut blocks, mut scales, mut bias) = (Vec::new(), Vec::new(), Vec::new());
            for e in 0..N_EXPERT {
                for i in 0..2 * EXPERT_FFN {
                    let (src, bsrc, r) = match (interleave, i % 2, i < EXPERT_FFN) {
                        (true, 0, _) => (&gate, gb, i / 2),
                        (true, _, _) => (&up, ub, i / 2),
                        (false, _, true) => (&gate, gb, i),
                        (false, _, false) => (&up, ub, i - EXPERT_FFN),
                    };
                    openai(&src[e * EXPERT_FFN + r], &mut blocks, &mut scales);
                    bias.extend_from_slice(&bsrc[(e * EXPERT_FFN + r) * 4..(e * EXPERT_FFN + r + 1) * 4]);
                }
            }
            let dst = if interleave { &mut packed } else { &mut packed_broken };
            let ex = format!("{p}mlp.experts.");
            dst.push((format!("{ex}gate_up_proj_blocks"), D::U8, vec![N_EXPERT, 2 * EXPERT_FFN, nb, 16], blocks));
            dst.push((format!("{ex}gate_up_proj_scales"), D::U8, vec![N_EXPERT, 2 * EXPERT_FFN, nb], scales));
            dst.push((format!("{ex}gate_up_proj_bias"), D::F32, vec![N_EXPERT, 2 * EXPERT_FFN], bias));
        }
        let (mut blocks, mut scales) = (Vec::new(), Vec::new());
        down[..N_EXPERT * HIDDEN].iter().for_each(|r| openai(r, &mut blocks, &mut scales));
        for dst in [&mut packed, &mut packed_broken] {
            let ex = format!("{p}mlp.experts.");
            dst.push((format!("{ex}down_proj_blocks"), D::U8, vec![N_EXPERT, HIDDEN, nbi, 16], blocks.clone()));
            dst.push((format!("{ex}down_proj_scales"), D::U8, vec![N_EXPERT, HIDDEN, nbi], scales.clone()));
            dst.push((format!("{ex}down_proj_bias"), D::F32, vec![N_EXPERT, HIDDEN], db.clone()));
        }
    }
    both(&mut gguf, &mut hf, "model.norm.weight".into(), "output_norm.weight".into(), vec![HIDDEN], (0.6, 1.4));
    both(&mut gguf, &mut hf, "lm_head.weight".into(), "output.weight".into(), vec![VOCAB, HIDDEN], (-0.5, 0.5));
    broken.extend(hf.iter().cloned());
    hf.extend(packed);
    broken.extend(packed_broken);
    let layer_types: Vec<&str> =
        (0..LAYERS).map(|l| if l % 2 == 0 { "sliding_attention" } else { "full_attention" }).collect();
    let config = serde_json::json!({
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": HIDDEN,
        "intermediate_size": EXPERT_FFN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": kv, "head_dim": hd, "num_local_experts": N_EXPERT, "num_experts_per_tok": TOP_K,
        "sliding_window": 16, "layer_types": layer_types, "rope_theta": 150000.0, "rms_norm_eps": EPS,
        "vocab_size": VOCAB, "max_position_embeddings": CTX, "tie_word_embeddings": false, "attention_bias": true,
        "swiglu_limit": 7.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
                         "beta_fast": 32.0, "beta_slow": 1.0, "truncate": false}
    });
    let keys: Vec<(&str, MetaValue)> = vec![
        ("block_count", u32v(LAYERS)),
        ("context_length", u32v(CTX)),
        ("embedding_length", u32v(HIDDEN)),
        ("feed_forward_length", u32v(EXPERT_FFN)),
        ("attention.head_count", u32v(HEADS)),
        ("attention.head_count_kv", u32v(kv)),
        ("attention.key_length", u32v(hd)),
        ("attention.value_length", u32v(hd)),
        ("rope.freq_base", f32v(150000.0)),
        ("attention.layer_norm_rms_epsilon", f32v(EPS)),
        ("expert_count", u32v(N_EXPERT)),
        ("expert_used_count", u32v(TOP_K)),
        ("expert_feed_forward_length", u32v(EXPERT_FFN)),
        ("attention.sliding_window", u32v(16)),
        ("rope.scaling.type", strv("yarn")),
        ("rope.scaling.factor", f32v(4.0)),
        ("rope.scaling.original_context_length", u32v(64)),
    ];
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("twin.gguf");
    write_gguf(&path, "gpt-oss", &keys, &gguf);
    write_raw_hf(&dir.path().join("hf"), &config, &hf);
    write_raw_hf(&dir.path().join("broken"), &config, &broken);
    let mut g = LlamaModel::load(&path, 2).expect("GGUF twin");
    let mut h = LlamaModel::load_hf(&dir.path().join("hf"), 2).expect("checkpoint");
    let mut b = LlamaModel::load_hf(&dir.path().join("broken"), 2).expect("broken checkpoint");
    assert_eq!(h.info().architecture, "gpt_oss");
    check_twins("gpt_oss", &mut g, &mut h, &mut b);
}
