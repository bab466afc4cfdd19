//! [`LlamaConfig`] from the neutral hyper-parameters and the family's row: the one place a
//! decoder's settings are derived, for GGUF files and HF checkpoints alike.

use super::{LlamaConfig, Variant};
use crate::model::common::RopeLayout;
use crate::model::family::{Family, GdnLayout, QkNorm, RecurrentMixer};
use crate::model::hparams::HParams;
use crate::model::moe::MoeConfig;
use crate::EngineError;

/// The file format a config was read from: it decides how Q/K rows pair for RoPE and whether
/// a window the family does not slide is honoured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A GGUF file: RoPE pairs as the family's llama.cpp graph rotates them; windows only on
    /// families whose graph slides.
    Gguf,
    /// An HF checkpoint: RoPE over halves (`rotate_half`); a stated window slides every layer
    /// (Mistral).
    Hf,
}

impl LlamaConfig {
    /// The decoder's settings for `hp` under family `fam`; `has_q_norm` says whether the file
    /// holds per-head Q norms (for [`QkNorm::IfPresent`]).
    ///
    /// # Errors
    /// RoPE scaling the family does not run, a missing window its sliding layers need, a bad
    /// rotary width, missing expert keys, naming the key.
    pub fn from_hparams(hp: &HParams, fam: &Family, format: Format, has_q_norm: bool) -> Result<Self, EngineError> {
        let src = &hp.source;
        let head_dim = hp.head_dim()?;
        let rope_dims = hp.rope_dims(head_dim)?;
        if !fam.rope_scaling && (hp.rope.scaling.is_some() || hp.rope.freq_factors.is_some()) {
            return Err(EngineError::model(format!(
                "{src}: RoPE scaling is not supported on this architecture (its global layers' scaling is not \
                 implemented)"
            )));
        }
        let layers = hp.layers;
        let rope_base = hp.rope.base.unwrap_or(fam.rope_base);
        let windows = match (fam.swa_pattern, &hp.window, format) {
            (Some(default), Some(w), _) if w.size > 0 => match &w.layers {
                Some(l) => l.iter().map(|&s| s.then_some(w.size)).collect(),
                None => {
                    let n = w.pattern.unwrap_or(default).max(1);
                    (0..layers).map(|l| (l % n < n - 1).then_some(w.size)).collect()
                }
            },
            (Some(_), _, _) => {
                return Err(EngineError::model(format!(
                    "{src}.attention.sliding_window missing or 0 (its sliding-window layers need it)"
                )))
            }
            (None, Some(w), Format::Hf) => match &w.layers {
                Some(l) => l.iter().map(|&s| s.then_some(w.size)).collect(),
                None => vec![Some(w.size); layers],
            },
            (None, _, _) => vec![None; layers],
        };
        let no_rope = match &hp.no_rope_layers {
            Some(v) => v.clone(),
            None => (0..layers).map(|l| fam.no_rope_step.is_some_and(|n| n > 0 && (l + 1) % n == 0)).collect(),
        };
        // Granite's multipliers, read only where the family's graph reads them.
        let mult = |v: Option<f32>| v.filter(|_| fam.multipliers);
        let embed_scale = match (mult(hp.embedding_scale), fam.embed_scale_sqrt) {
            (Some(s), _) => s,
            (None, true) => (hp.hidden as f32).sqrt(),
            (None, false) => 1.0,
        };
        let attn_scale = mult(hp.attention_scale)
            .or_else(|| fam.attn_scale.map(|f| f(hp, head_dim)))
            .unwrap_or(1.0 / (head_dim as f32).sqrt());
        let variant = Variant {
            act: fam.act,
            embed_scale,
            attn_scale,
            rope_layout: match format {
                Format::Gguf => fam.gguf_rope,
                Format::Hf => RopeLayout::Halves,
            },
            windows,
            rope_local_base: hp.rope.local_base.or(fam.rope_local_base).unwrap_or(rope_base),
            qk_norm: match fam.qk_norm {
                QkNorm::Off => false,
                QkNorm::On => true,
                QkNorm::IfPresent => has_q_norm,
            },
            rope_freq_factors: hp.rope.freq_factors.clone(),
            post_norms: fam.post_norms,
            no_rope,
            rope_dims,
            rope_attn_factor: hp.rope.attn_factor,
            rope_scaling: hp.rope.scaling,
            residual_scale: mult(hp.residual_scale).unwrap_or(1.0),
            logit_scale: mult(hp.logit_scale).unwrap_or(1.0),
            attn_temperature: hp.attn_temperature.filter(|_| fam.attn_temperature),
            attn_gate: fam.attn_gate,
            norm_offset: match (format, fam.hf_norm_plus_one) {
                (Format::Hf, true) => 1.0,
                _ => 0.0,
            },
        };
        let moe = match &fam.moe {
            Some(m) => Some(MoeConfig::from_hparams(hp, m)?),
            None => None,
        };
        Ok(LlamaConfig {
            layers,
            hidden: hp.hidden,
            ffn: hp.ffn,
            heads: hp.heads,
            kv_heads: hp.kv_heads,
            head_dim,
            rope_base,
            rms_eps: hp.rms_eps.unwrap_or(fam.rms_eps),
            vocab: hp.vocab,
            context_length: hp.context_length,
            variant,
            moe,
            // HF checkpoints keep the value heads grouped by key head; llama.cpp's Qwen3.5
            // converter tiles them.
            recurrent: match (fam.recurrent, format) {
                (Some(RecurrentMixer::DeltaNet(l)), Format::Hf) => {
                    Some(RecurrentMixer::DeltaNet(GdnLayout { grouped_heads: true, ..l }))
                }
                (r, _) => r,
            },
            linear_attn: match (&hp.linear_attn, fam.recurrent.is_some()) {
                (Some(la), true) => Some(la.clone()),
                (Some(_), false) => {
                    return Err(EngineError::model(format!(
                        "{src}: the file has linear-attention (ssm.*) keys, which this architecture does not run"
                    )))
                }
                (None, true) => {
                    return Err(EngineError::model(format!(
                    "{src}.ssm.conv_kernel missing (a hybrid architecture: its recurrent layers need the ssm.* keys)"
                )))
                }
                (None, false) => None,
            },
        })
    }
}
