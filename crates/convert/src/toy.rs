//! `glm5-tiny`: a toy GLM-5 checkpoint with every structural feature of the real one, small
//! enough to serve on two CPU cores, deterministic from a seed.
//!
//! Structure: 5 layers (2 dense MLP, 3 MoE), 16 routed experts with top-4 in 4 groups (top-2
//! groups), one shared expert, routed scaling 2.5 with a correction bias, MLA (q LoRA 128, KV
//! LoRA 64, nope/rope/v 32/16/32, 4 heads), a DSA indexer with 8 heads × 32 and top-k 32, and
//! indexer types `full, full, shared, full, shared` (two layers reuse a selection). The vocabulary
//! is SmolLM2's (49152), so real text can be served with its tokenizer.
//!
//! Quantization mirrors a ModelOpt GLM-5 export: every MLP projection (dense, routed and shared
//! experts) and `o_proj` are NVFP4; the other attention projections, the indexer, the router,
//! the embedding and `lm_head` stay BF16 (listed in `exclude_modules`), except the router and its
//! correction bias, which are F32 as in HF.
//!
//! Initialisation: linear weights uniform in `±sqrt(3/fan_in)` (unit-variance outputs for
//! unit-variance inputs), norms `1 + U(±0.1)`, embeddings `U(±1)`, router bias `U(±0.05)`.

use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::quantize::Tensor;

/// The toy's config.json (HF `GlmMoeDsaConfig` fields).
pub fn glm5_tiny_config() -> Value {
    json!({
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        "vocab_size": 49152,
        "hidden_size": 256,
        "intermediate_size": 512,
        "moe_intermediate_size": 128,
        "num_hidden_layers": 5,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "q_lora_rank": 128,
        "kv_lora_rank": 64,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "qk_head_dim": 48,
        "v_head_dim": 32,
        "n_routed_experts": 16,
        "num_experts_per_tok": 4,
        "n_shared_experts": 1,
        "n_group": 4,
        "topk_group": 2,
        "norm_topk_prob": true,
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 2,
        "index_n_heads": 8,
        "index_head_dim": 32,
        "index_topk": 32,
        "indexer_types": ["full", "full", "shared", "full", "shared"],
        "rope_interleave": true,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": false,
        "hidden_act": "silu",
        "attention_bias": false,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
        "torch_dtype": "bfloat16"
    })
}

/// Modules kept in BF16.
pub fn glm5_tiny_exclude() -> Vec<String> {
    [
        "lm_head",
        "model.embed_tokens",
        "model.layers.*.mlp.gate",
        "model.layers.*.self_attn.q_a_proj",
        "model.layers.*.self_attn.q_b_proj",
        "model.layers.*.self_attn.kv_a_proj_with_mqa",
        "model.layers.*.self_attn.kv_b_proj",
        "model.layers.*.self_attn.indexer*",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// The f32 state dict of `glm5_tiny_config()`, deterministic in `seed`.
pub fn glm5_tiny_state_dict(seed: u64) -> Vec<Tensor> {
    let cfg = glm5_tiny_config();
    let g = |k: &str| cfg[k].as_u64().unwrap_or(0) as usize;
    let (h, layers, heads) = (g("hidden_size"), g("num_hidden_layers"), g("num_attention_heads"));
    let (ql, kvl, nope, rope, vd) =
        (g("q_lora_rank"), g("kv_lora_rank"), g("qk_nope_head_dim"), g("qk_rope_head_dim"), g("v_head_dim"));
    let (e, inter, minter, dense) =
        (g("n_routed_experts"), g("intermediate_size"), g("moe_intermediate_size"), g("first_k_dense_replace"));
    let (ih, idim, vocab) = (g("index_n_heads"), g("index_head_dim"), g("vocab_size"));
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    let lin = |out: &mut Vec<Tensor>, rng: &mut rand::rngs::StdRng, name: String, rows: usize, cols: usize| {
        let a = (3.0 / cols as f32).sqrt();
        let data = (0..rows * cols).map(|_| rng.random_range(-a..a)).collect();
        out.push(Tensor::new(name, vec![rows, cols], data));
    };
    let norm = |out: &mut Vec<Tensor>, rng: &mut rand::rngs::StdRng, name: String, n: usize| {
        let data = (0..n).map(|_| 1.0 + rng.random_range(-0.1f32..0.1)).collect();
        out.push(Tensor::new(name, vec![n], data));
    };
    let data = (0..vocab * h).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    out.push(Tensor::new("model.embed_tokens.weight", vec![vocab, h], data));
    let full: Vec<bool> =
        cfg["indexer_types"].as_array().map(|a| a.iter().map(|t| t == "full").collect()).unwrap_or_default();
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        let a = format!("{p}.self_attn");
        norm(&mut out, &mut rng, format!("{p}.input_layernorm.weight"), h);
        norm(&mut out, &mut rng, format!("{p}.post_attention_layernorm.weight"), h);
        lin(&mut out, &mut rng, format!("{a}.q_a_proj.weight"), ql, h);
        norm(&mut out, &mut rng, format!("{a}.q_a_layernorm.weight"), ql);
        lin(&mut out, &mut rng, format!("{a}.q_b_proj.weight"), heads * (nope + rope), ql);
        lin(&mut out, &mut rng, format!("{a}.kv_a_proj_with_mqa.weight"), kvl + rope, h);
        norm(&mut out, &mut rng, format!("{a}.kv_a_layernorm.weight"), kvl);
        lin(&mut out, &mut rng, format!("{a}.kv_b_proj.weight"), heads * (nope + vd), kvl);
        lin(&mut out, &mut rng, format!("{a}.o_proj.weight"), h, heads * vd);
        if full.get(l).copied().unwrap_or(true) {
            let ip = format!("{a}.indexer");
            lin(&mut out, &mut rng, format!("{ip}.wq_b.weight"), ih * idim, ql);
            lin(&mut out, &mut rng, format!("{ip}.wk.weight"), idim, h);
            norm(&mut out, &mut rng, format!("{ip}.k_norm.weight"), idim);
            let b = (0..idim).map(|_| rng.random_range(-0.1f32..0.1)).collect();
            out.push(Tensor::new(format!("{ip}.k_norm.bias"), vec![idim], b));
            lin(&mut out, &mut rng, format!("{ip}.weights_proj.weight"), ih, h);
        }
        let m = format!("{p}.mlp");
        let mlp = |out: &mut Vec<Tensor>, rng: &mut rand::rngs::StdRng, pre: String, n: usize| {
            lin(out, rng, format!("{pre}.gate_proj.weight"), n, h);
            lin(out, rng, format!("{pre}.up_proj.weight"), n, h);
            lin(out, rng, format!("{pre}.down_proj.weight"), h, n);
        };
        if l < dense {
            mlp(&mut out, &mut rng, m, inter);
        } else {
            // The router and its bias stay F32, as HF keeps them.
            lin(&mut out, &mut rng, format!("{m}.gate.weight"), e, h);
            if let Some(t) = out.last_mut() {
                t.keep_f32 = true;
            }
            let b = (0..e).map(|_| rng.random_range(-0.05f32..0.05)).collect();
            out.push(Tensor { keep_f32: true, ..Tensor::new(format!("{m}.gate.e_score_correction_bias"), vec![e], b) });
            for x in 0..e {
                mlp(&mut out, &mut rng, format!("{m}.experts.{x}"), minter);
            }
            mlp(&mut out, &mut rng, format!("{m}.shared_experts"), minter * g("n_shared_experts"));
        }
    }
    norm(&mut out, &mut rng, "model.norm.weight".into(), h);
    lin(&mut out, &mut rng, "lm_head.weight".into(), vocab, h);
    out
}
