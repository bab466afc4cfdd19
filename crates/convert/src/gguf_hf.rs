//! A Llama GGUF file as a Hugging Face state dict: the input `sparrow quantize` converts.
//!
//! Tensor names follow llama.cpp's `convert_hf_to_gguf.py` in reverse; the Q/K rows that
//! script permutes for GGML's RoPE layout are permuted back to HF's rotate-half order.

use std::path::Path;

use sparrow_cpu::format::ggml::{dequantize_row, GgmlType};
use sparrow_engine::checkpoint::gguf::GgufFile;
use sparrow_engine::model::llama::LlamaModel;
use sparrow_engine::EngineError;

use crate::quantize::Tensor;

/// Reads a Llama GGUF file as a Hugging Face state dict in f32 (every tensor dequantized,
/// names and Q/K row order as `LlamaForCausalLM` has them) plus its `config.json`.
///
/// # Errors
/// As [`LlamaModel::load`], and for a tensor without a Llama HF name.
pub fn gguf_to_hf(path: &Path) -> Result<(serde_json::Value, Vec<Tensor>), EngineError> {
    let file = GgufFile::open(path)?;
    let ld = file.view()?;
    // Reuse the loader's checks by loading the config the same way.
    let m = LlamaModel::load(path, 1)?;
    // Other families (gemma3) load through the same loader but have no `LlamaForCausalLM` form.
    let arch = &sparrow_engine::model::Model::info(&m).architecture;
    if arch != "llama" {
        return Err(EngineError::model(format!(
            "architecture {arch:?}: only llama GGUF files convert to a Llama checkpoint"
        )));
    }
    let c = m.config().clone();
    if c.variant.rope_freq_factors.is_some() {
        // The file keeps Llama 3's per-pair factors, not the `rope_scaling` parameters an HF
        // config states: a copy without them would run unscaled RoPE.
        return Err(EngineError::model(format!(
            "{}: Llama 3 RoPE frequency factors (rope_freqs.weight) have no HF config form here",
            path.display()
        )));
    }
    let tied = !ld.has_tensor("output.weight");
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": c.hidden,
        "intermediate_size": c.ffn,
        "num_attention_heads": c.heads,
        "num_key_value_heads": c.kv_heads,
        "num_hidden_layers": c.layers,
        "head_dim": c.head_dim,
        "rms_norm_eps": c.rms_eps,
        "rope_theta": c.rope_base,
        "vocab_size": c.vocab,
        "max_position_embeddings": c.context_length,
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
        "torch_dtype": "float32",
    });
    let hd = c.head_dim;
    let unpermute = |data: Vec<f32>, rows: usize, cols: usize| -> Vec<f32> {
        let half = hd / 2;
        let mut out = Vec::with_capacity(data.len());
        for r in 0..rows {
            let (h, j) = (r / hd, r % hd);
            let src = h * hd + if j < half { 2 * j } else { 2 * (j - half) + 1 };
            out.extend_from_slice(&data[src * cols..(src + 1) * cols]);
        }
        out
    };
    let names = ld.tensor_names();
    let mut out = Vec::new();
    for name in names {
        let (ty, shape, data) = ld.tensor(name)?;
        let n: usize = shape.iter().product();
        let mut v = vec![0f32; n];
        dequantize_row(ty, data, &mut v);
        let hf_shape: Vec<usize> = shape.iter().rev().copied().collect();
        let (hf_name, v) = match name.strip_prefix("blk.").and_then(|r| r.split_once('.')) {
            Some((l, rest)) => {
                let p = format!("model.layers.{l}");
                match rest {
                    "attn_norm.weight" => (format!("{p}.input_layernorm.weight"), v),
                    "attn_q.weight" => (format!("{p}.self_attn.q_proj.weight"), unpermute(v, hf_shape[0], hf_shape[1])),
                    "attn_k.weight" => (format!("{p}.self_attn.k_proj.weight"), unpermute(v, hf_shape[0], hf_shape[1])),
                    "attn_v.weight" => (format!("{p}.self_attn.v_proj.weight"), v),
                    "attn_output.weight" => (format!("{p}.self_attn.o_proj.weight"), v),
                    "ffn_norm.weight" => (format!("{p}.post_attention_layernorm.weight"), v),
                    "ffn_gate.weight" => (format!("{p}.mlp.gate_proj.weight"), v),
                    "ffn_up.weight" => (format!("{p}.mlp.up_proj.weight"), v),
                    "ffn_down.weight" => (format!("{p}.mlp.down_proj.weight"), v),
                    other => {
                        return Err(EngineError::model(format!("GGUF tensor {name}: {other} has no Llama HF name")))
                    }
                }
            }
            None => match name {
                "token_embd.weight" => ("model.embed_tokens.weight".into(), v),
                "output_norm.weight" => ("model.norm.weight".into(), v),
                "output.weight" => ("lm_head.weight".into(), v),
                other => return Err(EngineError::model(format!("GGUF tensor {other} has no Llama HF name"))),
            },
        };
        // F32 in the GGUF (norms) stays F32.
        out.push(Tensor { name: hf_name, shape: hf_shape, data: v, keep_f32: ty == GgmlType::F32 });
    }
    Ok((config, out))
}
