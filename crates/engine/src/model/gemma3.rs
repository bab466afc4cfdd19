//! Gemma 3 (`general.architecture = gemma3`, Gemma Team 2025) as a [`Variant`] of the Llama
//! decoder, following HF transformers' `models/gemma3/modeling_gemma3.py` and llama.cpp's
//! `gemma3` graph (`src/models/gemma3.cpp`, hyper-parameters in `src/llama-model.cpp`):
//! - embeddings × √hidden (f32);
//! - RMSNorm of `(1 + w)`: the GGUF converter stores `1 + w` already (`convert_hf_to_gguf.py`
//!   adds the 1), so the norms are plain multipliers here, as in llama.cpp;
//! - norms before and after attention and the MLP, per-head RMSNorm of Q and K, GeGLU (tanh);
//! - sliding-window layers (`gemma3.attention.sliding_window` keys, the query's own included)
//!   interleaved with global ones: every `pattern`-th layer is global, `(l + 1) % pattern == 0`,
//!   with `gemma3.attention.sliding_window_pattern` when the file states it and llama.cpp's 6
//!   otherwise (`set_swa_pattern(6)`; HF `sliding_window_pattern = 6`);
//! - RoPE over halves (llama.cpp's NEOX, HF's `rotate_half`), base `gemma3.rope.freq_base` on
//!   global layers and 10 000 on local ones (HF `rope_local_base_freq`, llama.cpp's
//!   `rope_freq_base_train_swa`);
//! - attention scale `gemma3.attention.scale` when stated, else `1/√key_length` (HF's
//!   `query_pre_attn_scalar`), but `1/√(hidden/heads)` for the 62-layer 27B, as llama.cpp;
//! - the LM head tied to the embeddings, no final logit soft-capping (Gemma 2 had it).
//!
//! Gemma 3's linear RoPE scaling of the global layers (4B and up) is refused.

use super::common::RopeLayout;
use super::llama::load::GgufHparams;
use super::llama::{Activation, LlamaConfig, Variant};
use crate::checkpoint::gguf::Gguf;
use crate::EngineError;

/// llama.cpp's default layer pattern: five sliding-window layers, then a global one.
const DEFAULT_PATTERN: usize = 6;
/// RoPE base of the sliding-window layers.
const LOCAL_ROPE_BASE: f32 = 10_000.0;

/// The hyper-parameters of a `gemma3` GGUF file.
///
/// # Errors
/// [`EngineError::Model`] for a missing key or RoPE scaling.
pub fn config(ld: &Gguf<'_>) -> Result<LlamaConfig, EngineError> {
    let hp = GgufHparams::read(ld, "gemma3")?;
    let (hidden, heads, layers) = (hp.embedding_length, hp.head_count, hp.block_count);
    let head_dim = hp.head_dim("gemma3")?;
    let rope_dims = hp.rope_dims("gemma3", head_dim)?;
    let window = match hp.sliding_window {
        Some(0) | None => return Err(EngineError::model("gemma3.attention.sliding_window is missing or 0")),
        Some(w) => w,
    };
    let pattern = hp.sliding_window_pattern.unwrap_or(DEFAULT_PATTERN).max(1);
    let windows = (0..layers).map(|l| ((l + 1) % pattern != 0).then_some(window)).collect();
    let attn_scale = match hp.attention_scale {
        Some(s) => s,
        None if layers == 62 => 1.0 / ((hidden / heads) as f32).sqrt(),
        None => 1.0 / (head_dim as f32).sqrt(),
    };
    let rope_base = hp.rope_freq_base.unwrap_or(1_000_000.0);
    Ok(LlamaConfig {
        layers,
        hidden,
        ffn: hp.feed_forward_length,
        heads,
        kv_heads: hp.head_count_kv.unwrap_or(heads),
        head_dim,
        rope_base,
        rms_eps: hp.rms_eps.unwrap_or(1e-6),
        vocab: ld.embedding_rows()?,
        context_length: hp.context_length,
        variant: Variant {
            act: Activation::GeluTanh,
            embed_scale: (hidden as f32).sqrt(),
            attn_scale,
            rope_layout: RopeLayout::Halves,
            windows,
            rope_local_base: LOCAL_ROPE_BASE,
            qk_norm: true,
            rope_freq_factors: None,
            post_norms: true,
            no_rope: vec![false; layers],
            rope_dims,
            rope_attn_factor: 1.0,
            rope_scaling: None,
        },
        moe: None,
    })
}
