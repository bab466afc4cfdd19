//! Every architecture Sparrow loads, one row each ([`ARCHITECTURES`]), after llama.cpp's
//! `src/llama-arch.cpp` (`{ LLM_ARCH_QWEN3, "qwen3" }`) and vLLM's model registry
//! (`"MistralForCausalLM": ("llama", "LlamaForCausalLM")`: an alias is a line). A row names
//! the GGUF `general.architecture`, the HF `model_type`s read as it (with their HF classes),
//! the class `/get_model_info` reports, the body that runs it and what it can do.
//!
//! Nothing else lists architectures: load dispatch ([`crate::model::load`]), the start-up
//! errors that list what is supported, `/get_model_info`'s `architectures`, the calibration
//! gate of `sparrow quantize` and the families table of `docs/serve.md` (checked by a test)
//! all read this table.

use crate::model::common::RopeLayout;
use crate::model::family::{Family, GdnLayout, QkNorm, RecurrentMixer};
use crate::model::hparams::HParams;
use crate::model::moe::Glu;
use crate::model::moe::MoeFamily;
use crate::model::routing::Scoring;
use crate::model::vb::{
    ATTENTION_SINKS, GEMMA3_LAYER_NAMES, LLAMA_LAYER_NAMES, MOE_FFN_NAMES, NEMOTRON_H_HF_NAMES, NEMOTRON_H_LAYER_NAMES,
    PHI3_LAYER_NAMES, POST_ATTENTION_NORM, QWEN35_LAYER_NAMES,
};
use crate::EngineError;

/// The model that runs an architecture.
#[derive(Debug, Clone, Copy)]
pub enum Body {
    /// The Llama-layer decoder ([`crate::model::llama::LlamaModel`]), dense or MoE, with the
    /// family's differences.
    Decoder(Family),
    /// Multi-head latent attention with a MoE feed-forward ([`crate::model::glm5::Glm5Model`]):
    /// DeepSeek-V2/V3, and GLM-5 with its DSA indexer.
    Mla,
    /// A bidirectional encoder ([`crate::model::bert::BertModel`]).
    Encoder,
}

/// What `sparrow quantize` can calibrate on a model of the architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Calibration {
    /// Nothing: the architecture is refused.
    None,
    /// Input scales (ModelOpt's `input_scale`) from observed activations.
    InputScales,
    /// Input scales and GPTQ's Hessians.
    Gptq,
}

/// One architecture.
#[derive(Debug, Clone, Copy)]
pub struct Arch {
    /// Its name: the GGUF `general.architecture` when it loads from GGUF, else its HF
    /// `model_type`.
    pub name: &'static str,
    /// Whether GGUF files of it load.
    pub gguf: bool,
    /// HF `config.json` `model_type`s read as this architecture, each with its HF class.
    pub hf: &'static [(&'static str, &'static str)],
    /// The HF class `/get_model_info` reports for a GGUF file of it.
    pub class: &'static str,
    /// What runs it.
    pub body: Body,
    /// Whether it serves `--is-embedding`.
    pub embedding: bool,
    /// What `sparrow quantize` calibrates.
    pub calibration: Calibration,
}

impl Arch {
    const BASE: Arch = Arch {
        name: "",
        gguf: true,
        hf: &[],
        class: "",
        body: Body::Decoder(Family::BASE),
        embedding: true,
        calibration: Calibration::None,
    };

    /// The HF class of `model_type` (one of [`Arch::hf`]), else [`Arch::class`].
    pub fn class_of(&self, model_type: &str) -> &'static str {
        self.hf.iter().find(|(m, _)| *m == model_type).map_or(self.class, |(_, c)| c)
    }
}

/// Gemma 3's attention scale when the file states none: `1/√key_length` (HF's
/// `query_pre_attn_scalar`), but `1/√(hidden/heads)` for the 62-layer 27B, as llama.cpp.
fn gemma3_attn_scale(hp: &HParams, head_dim: usize) -> f32 {
    match hp.layers {
        62 => 1.0 / ((hp.hidden / hp.heads.max(1)) as f32).sqrt(),
        _ => 1.0 / (head_dim as f32).sqrt(),
    }
}

/// Qwen3.5's layer (`qwen35`): Qwen3's attention with its output gate, Gated DeltaNet layers,
/// the pre-FFN norm named `post_attention_norm`.
const QWEN35: Family = Family {
    gguf_rope: RopeLayout::Halves,
    qk_norm: QkNorm::On,
    layer_names: &[QWEN35_LAYER_NAMES, LLAMA_LAYER_NAMES],
    rope_base: 10_000_000.0,
    rms_eps: 1e-6,
    attn_gate: true,
    hf_norm_plus_one: true,
    recurrent: Some(RecurrentMixer::DeltaNet(GdnLayout::QWEN35)),
    ..Family::BASE
};

/// [`QWEN35`] with Qwen3-MoE's routing and a gated shared expert.
const QWEN35_MOE: Family = Family {
    layer_names: &[QWEN35_LAYER_NAMES, LLAMA_LAYER_NAMES, MOE_FFN_NAMES],
    moe: Some(MoeFamily { scoring: Some(Scoring::Softmax), norm_topk_prob: Some(true), ..MoeFamily::BASE }),
    ..QWEN35
};

/// Nemotron-H's layer (`nemotron_h`): a Mamba-2 mixer, an attention without RoPE or a ReLU²
/// MLP without a gate per layer.
const NEMOTRON_H: Family = Family {
    layer_names: &[NEMOTRON_H_LAYER_NAMES, LLAMA_LAYER_NAMES],
    no_rope_step: Some(1),
    act: Glu::Relu2,
    hf_names: NEMOTRON_H_HF_NAMES,
    recurrent: Some(RecurrentMixer::Mamba2),
    ..Family::BASE
};

/// Every architecture, in the order the docs list them.
pub const ARCHITECTURES: &[Arch] = &[
    Arch {
        name: "llama",
        hf: &[("llama", "LlamaForCausalLM"), ("mistral", "MistralForCausalLM")],
        class: "LlamaForCausalLM",
        calibration: Calibration::Gptq,
        ..Arch::BASE
    },
    Arch {
        name: "qwen2",
        hf: &[("qwen2", "Qwen2ForCausalLM")],
        class: "Qwen2ForCausalLM",
        body: Body::Decoder(Family { gguf_rope: RopeLayout::Halves, qkv_bias: true, ..Family::BASE }),
        ..Arch::BASE
    },
    Arch {
        name: "qwen3",
        hf: &[("qwen3", "Qwen3ForCausalLM")],
        class: "Qwen3ForCausalLM",
        body: Body::Decoder(Family { gguf_rope: RopeLayout::Halves, qk_norm: QkNorm::On, ..Family::BASE }),
        ..Arch::BASE
    },
    Arch {
        name: "smollm3",
        hf: &[("smollm3", "SmolLM3ForCausalLM")],
        class: "SmolLM3ForCausalLM",
        body: Body::Decoder(Family { no_rope_step: Some(4), ..Family::BASE }),
        ..Arch::BASE
    },
    Arch {
        name: "phi3",
        hf: &[("phi3", "Phi3ForCausalLM")],
        class: "Phi3ForCausalLM",
        body: Body::Decoder(Family { gguf_rope: RopeLayout::Halves, layer_names: &[PHI3_LAYER_NAMES], ..Family::BASE }),
        ..Arch::BASE
    },
    // Gemma 3 (HF `modeling_gemma3.py`, llama.cpp `gemma3`): embeddings × √hidden, `1 + w`
    // norms (the converter stores `1 + w`), norms after attention and the MLP, Q/K norms,
    // GeGLU, five sliding-window layers then a global one, local RoPE base 10 000.
    Arch {
        name: "gemma3",
        class: "Gemma3ForCausalLM",
        body: Body::Decoder(Family {
            gguf_rope: RopeLayout::Halves,
            qk_norm: QkNorm::On,
            layer_names: &[GEMMA3_LAYER_NAMES],
            swa_pattern: Some(6),
            act: Glu::GeluTanh,
            embed_scale_sqrt: true,
            post_norms: true,
            rope_local_base: Some(10_000.0),
            rope_base: 1_000_000.0,
            rms_eps: 1e-6,
            rope_scaling: false,
            attn_scale: Some(gemma3_attn_scale),
            ..Family::BASE
        }),
        ..Arch::BASE
    },
    // Granite 3 (llama.cpp `granite`): Llama's layer with the file's embedding, residual,
    // attention and logit multipliers.
    Arch {
        name: "granite",
        hf: &[("granite", "GraniteForCausalLM")],
        class: "GraniteForCausalLM",
        body: Body::Decoder(Family { multipliers: true, ..Family::BASE }),
        ..Arch::BASE
    },
    // Mistral 3 text (Ministral 3, Mistral Small 3.1/3.2; llama.cpp `mistral3`): Llama's layer
    // with YaRN and Llama 4's attention temperature.
    Arch {
        name: "mistral3",
        hf: &[("ministral3", "Ministral3ForCausalLM")],
        class: "Mistral3ForConditionalGeneration",
        body: Body::Decoder(Family { attn_temperature: true, ..Family::BASE }),
        ..Arch::BASE
    },
    // Qwen3-MoE: Qwen3's attention; softmax over all experts, the chosen renormalized
    // (`build_moe_ffn(…, norm_w = true, …, SOFTMAX)` whatever the file says).
    Arch {
        name: "qwen3moe",
        hf: &[("qwen3_moe", "Qwen3MoeForCausalLM")],
        class: "Qwen3MoeForCausalLM",
        body: Body::Decoder(Family {
            gguf_rope: RopeLayout::Halves,
            qk_norm: QkNorm::On,
            layer_names: &[LLAMA_LAYER_NAMES, MOE_FFN_NAMES],
            moe: Some(MoeFamily { scoring: Some(Scoring::Softmax), norm_topk_prob: Some(true), ..MoeFamily::BASE }),
            ..Family::BASE
        }),
        ..Arch::BASE
    },
    // GLM-4.5 / 4.6 / 4.7 (and Solar Open): Q/K/V biases, partial NEOX RoPE, optional Q/K norms,
    // the pre-FFN norm stored as `post_attention_norm`; leading dense layers, then sigmoid
    // routing with the selection bias, the file's renormalization and scale, shared experts.
    Arch {
        name: "glm4moe",
        hf: &[("glm4_moe", "Glm4MoeForCausalLM")],
        class: "Glm4MoeForCausalLM",
        body: Body::Decoder(Family {
            gguf_rope: RopeLayout::Halves,
            qk_norm: QkNorm::IfPresent,
            layer_names: &[POST_ATTENTION_NORM, LLAMA_LAYER_NAMES, MOE_FFN_NAMES],
            moe: Some(MoeFamily { scaled: true, ..MoeFamily::BASE }),
            ..Family::BASE
        }),
        ..Arch::BASE
    },
    // gpt-oss (`src/models/openai-moe.cpp`): Q/K/V and output biases, attention sinks, NEOX RoPE
    // (YaRN in the files), every other layer a sliding window (even layers); the router's
    // bias, top-k by raw logit with a softmax over the chosen, experts with biases and the
    // clamped SwiGLU (alpha 1.702, limit 7).
    Arch {
        name: "gpt-oss",
        hf: &[("gpt_oss", "GptOssForCausalLM")],
        class: "GptOssForCausalLM",
        body: Body::Decoder(Family {
            gguf_rope: RopeLayout::Halves,
            qkv_bias: true,
            layer_names: &[POST_ATTENTION_NORM, ATTENTION_SINKS, LLAMA_LAYER_NAMES, MOE_FFN_NAMES],
            moe: Some(MoeFamily {
                scoring: Some(Scoring::SoftmaxSelected),
                norm_topk_prob: Some(false),
                act: Glu::SwigluOai { alpha: 1.702, limit: 7.0 },
                ..MoeFamily::BASE
            }),
            swa_pattern: Some(2),
            hf_names: &[("mlp.gate", "mlp.router")],
            ..Family::BASE
        }),
        ..Arch::BASE
    },
    // DeepSeek-V2 / V2-Lite / V3 (and what llama.cpp runs as `deepseek2`, GLM-4.7-Flash) on
    // GLM-5's MLA model without the DSA indexer.
    // Qwen3.5 / Qwen3.6 dense (llama.cpp `src/models/qwen35.cpp`): three Gated DeltaNet layers
    // for every gated full-attention layer (`full_attention_interval`), the state beside the KV
    // pages (`kv::state`); HF checkpoints keep the value heads grouped by key head.
    Arch {
        name: "qwen35",
        hf: &[("qwen3_5", "Qwen3_5ForConditionalGeneration"), ("qwen3_5_text", "Qwen3_5ForCausalLM")],
        class: "Qwen3_5ForCausalLM",
        body: Body::Decoder(QWEN35),
        embedding: false,
        ..Arch::BASE
    },
    // Qwen3.5-MoE / Qwen3.6-35B-A3B (`src/models/qwen35moe.cpp`): qwen35's layers with a MoE
    // feed-forward (softmax over all experts, top-k renormalized) and one shared expert under
    // its sigmoid gate. HF checkpoints: the experts one tensor each or fused in transformers'
    // 3-D `gate_up_proj` / `down_proj`, the shared expert as `mlp.shared_expert`.
    Arch {
        name: "qwen35moe",
        hf: &[("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration"), ("qwen3_5_moe_text", "Qwen3_5MoeForCausalLM")],
        class: "Qwen3_5MoeForCausalLM",
        body: Body::Decoder(Family { hf_names: &[("mlp.shared_experts", "mlp.shared_expert")], ..QWEN35_MOE }),
        embedding: false,
        ..Arch::BASE
    },
    // Qwen3-Next (`src/models/qwen3next.cpp`): qwen35moe's layers as its converter lays them out:
    // value heads grouped by key head, β and the decay's inputs in one `ssm_ba`, plain NEOX RoPE.
    // HF checkpoints: `in_proj_qkvz` interleaved per key head, split at load as the converter
    // splits it.
    Arch {
        name: "qwen3next",
        hf: &[("qwen3_next", "Qwen3NextForCausalLM")],
        class: "Qwen3NextForCausalLM",
        body: Body::Decoder(Family {
            recurrent: Some(RecurrentMixer::DeltaNet(GdnLayout::QWEN3NEXT)),
            hf_names: &[("mlp.shared_experts", "mlp.shared_expert")],
            ..QWEN35_MOE
        }),
        embedding: false,
        ..Arch::BASE
    },
    // Nemotron-H (`src/models/nemotron-h.cpp`): one block per layer, each a Mamba-2 mixer, an
    // attention without RoPE or a ReLU² MLP without a gate, under its one RMSNorm; which is
    // which from the per-layer `attention.head_count_kv` and `feed_forward_length` (0: none).
    Arch {
        name: "nemotron_h",
        hf: &[("nemotron_h", "NemotronHForCausalLM")],
        class: "NemotronHForCausalLM",
        body: Body::Decoder(NEMOTRON_H),
        embedding: false,
        ..Arch::BASE
    },
    // Nemotron-H MoE (Nemotron 3 Nano: `nemotron-h-moe.cpp`, the trunk `nemotron-h.cpp`'s): the
    // MLP blocks are experts, ReLU² without a gate, chosen by sigmoid scores with the
    // selection bias `exp_probs_b`, renormalized and scaled as the file says, plus one ungated
    // ReLU² shared expert; the latent projections of larger sizes (`ffn_latent_down`) are
    // not run (refused as unread tensors).
    Arch {
        name: "nemotron_h_moe",
        class: "NemotronHForCausalLM",
        body: Body::Decoder(Family {
            layer_names: &[NEMOTRON_H_LAYER_NAMES, LLAMA_LAYER_NAMES, MOE_FFN_NAMES],
            moe: Some(MoeFamily { scoring: Some(Scoring::Sigmoid), scaled: true, act: Glu::Relu2, ..MoeFamily::BASE }),
            ..NEMOTRON_H
        }),
        embedding: false,
        ..Arch::BASE
    },
    Arch {
        name: "deepseek2",
        hf: &[("deepseek_v2", "DeepseekV2ForCausalLM"), ("deepseek_v3", "DeepseekV3ForCausalLM")],
        class: "DeepseekV2ForCausalLM",
        body: Body::Mla,
        embedding: false,
        ..Arch::BASE
    },
    // GLM-5 (HF `glm_moe_dsa`): MLA with the DSA indexer, checkpoints only.
    Arch {
        name: "glm_moe_dsa",
        gguf: false,
        hf: &[("glm_moe_dsa", "GlmMoeDsaForCausalLM")],
        class: "GlmMoeDsaForCausalLM",
        body: Body::Mla,
        embedding: false,
        calibration: Calibration::InputScales,
    },
    // BERT encoders (sentence-transformers; a cross-encoder's `BertForSequenceClassification`
    // has the same `model_type`).
    Arch { name: "bert", hf: &[("bert", "BertModel")], class: "BertModel", body: Body::Encoder, ..Arch::BASE },
];

/// The row of GGUF architecture `name`.
///
/// # Errors
/// An architecture no row loads from GGUF, listing those that do.
pub fn by_gguf(name: &str) -> Result<&'static Arch, EngineError> {
    ARCHITECTURES.iter().find(|a| a.gguf && a.name == name).ok_or_else(|| {
        EngineError::model(format!("architecture {name:?} is not supported (GGUF: {})", gguf_names().join(", ")))
    })
}

/// The row of HF `model_type` `mt`.
///
/// # Errors
/// A `model_type` no row reads, listing those that are read.
pub fn by_model_type(mt: &str) -> Result<&'static Arch, EngineError> {
    ARCHITECTURES.iter().find(|a| a.hf.iter().any(|(m, _)| *m == mt)).ok_or_else(|| {
        EngineError::model(format!(
            "config.json model_type {mt:?} is not supported (Hugging Face checkpoints: {})",
            hf_model_types().join(", ")
        ))
    })
}

/// The HF class of a model whose [`crate::model::ModelInfo::architecture`] is `name` (a GGUF
/// architecture or an HF `model_type`), for `/get_model_info`.
pub fn hf_class(name: &str) -> Option<&'static str> {
    let by_type = ARCHITECTURES.iter().find_map(|a| a.hf.iter().find(|(m, _)| *m == name).map(|(_, c)| *c));
    by_type.or_else(|| ARCHITECTURES.iter().find(|a| a.name == name).map(|a| a.class))
}

/// The GGUF architectures that load, in table order.
pub fn gguf_names() -> Vec<&'static str> {
    ARCHITECTURES.iter().filter(|a| a.gguf).map(|a| a.name).collect()
}

/// The HF `model_type`s that load, in table order.
pub fn hf_model_types() -> Vec<&'static str> {
    ARCHITECTURES.iter().flat_map(|a| a.hf.iter().map(|(m, _)| *m)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names are unique, every row has an HF class, and every `model_type` one row.
    #[test]
    fn rows_are_unique_and_named() {
        for (i, a) in ARCHITECTURES.iter().enumerate() {
            assert!(a.class.ends_with("ForCausalLM") || a.class.ends_with("Model") || a.class.ends_with("Generation"));
            assert!(ARCHITECTURES[..i].iter().all(|b| b.name != a.name), "{} twice", a.name);
            assert!(a.gguf || !a.hf.is_empty(), "{} loads from nothing", a.name);
            for (mt, class) in a.hf {
                assert_eq!(by_model_type(mt).expect("read").name, a.name);
                assert_eq!(hf_class(mt), Some(*class));
            }
            if a.gguf {
                assert_eq!(by_gguf(a.name).expect("gguf").name, a.name);
                assert_eq!(hf_class(a.name), Some(a.class_of(a.name)));
            }
        }
        let e = by_gguf("mamba").expect_err("no row").to_string();
        assert!(e.contains("\"mamba\"") && e.contains("qwen3moe, glm4moe"), "{e}");
        let e = by_model_type("t5").expect_err("no row").to_string();
        assert!(e.contains("qwen3_moe") && e.contains("deepseek_v3"), "{e}");
    }
}
