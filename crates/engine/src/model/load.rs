//! Loading a model from `--model-path`: a GGUF file (Llama family, Gemma 3, DeepSeek-V2/V3's
//! `deepseek2` on GLM-5's MLA model) or a Hugging Face checkpoint
//! directory (`glm_moe_dsa` GLM-5, `llama`), in one place; for GLM-5 the DSA attention choices
//! and the MoE implementation (fixed, or autotuned per batch-size bucket) are applied here.

use crate::config::{EngineArgs, MoeRunner};
use crate::model::bert::BertModel;
use crate::model::glm5::{Glm5Model, Glm5Options, MoeChoice, MoeImpl};
use crate::model::llama::LlamaModel;
use crate::model::Model;
use crate::EngineError;

/// Loads the model `args.model_path` names: a GGUF file (Llama family, Gemma 3), or a Hugging Face
/// checkpoint directory whose `config.json` says `glm_moe_dsa` (GLM-5) or `llama`. For GLM-5
/// the NSA backends and the MoE implementation are applied, autotuning the MoE choice unless
/// told otherwise. Returns the model, its kernel ISA name, and start-up notes.
///
/// # Errors
/// Unreadable or unsupported checkpoints, unknown backend names.
pub fn load_model(args: &EngineArgs) -> Result<(Box<dyn Model>, &'static str, serde_json::Value), EngineError> {
    let p = &args.model_path;
    let (prefill_attn, decode_attn) = (args.dsa_prefill_backend, args.dsa_decode_backend);
    let fixed = match args.moe_runner_backend {
        MoeRunner::Auto => None,
        MoeRunner::Fixed(m) => Some(m),
    };
    if p.is_dir() {
        let cfg = crate::checkpoint::hf::read_json(&p.join("config.json"))?;
        let mt = cfg.get("model_type").and_then(|v| v.as_str()).unwrap_or("").to_owned();
        match mt.as_str() {
            "glm_moe_dsa" => {
                let opts = Glm5Options {
                    prefill_attn,
                    decode_attn,
                    moe: MoeChoice::Fixed(fixed.unwrap_or(MoeImpl::ExpertMajor)),
                };
                let mut m = Glm5Model::load(p, args.threads, opts.clone())?;
                let mut notes = serde_json::json!({
                    "dsa_prefill_backend": args.dsa_prefill_backend.name(),
                    "dsa_decode_backend": args.dsa_decode_backend.name(),
                });
                let moe = moe_choice(&m, args, fixed, &mut notes)?;
                m.set_options(Glm5Options { moe, ..opts });
                let isa = m.isa().name();
                Ok((Box::new(m), isa, notes))
            }
            "bert" => Ok(bert_loaded(BertModel::load_hf(p, args.threads)?)),
            // Every dense family's `model_type` (`llama`, `mistral`, `qwen2`, `qwen3`, `smollm3`,
            // `phi3`): the dense loader refuses another, listing the ones it reads.
            _ => {
                let m = LlamaModel::load_hf(p, args.threads)?;
                let isa = m.isa().name();
                Ok((Box::new(m), isa, serde_json::Value::Null))
            }
        }
    } else {
        match gguf_architecture(p)?.as_str() {
            "bert" => Ok(bert_loaded(BertModel::load_gguf(p, args.threads)?)),
            crate::model::glm5::gguf::ARCH => {
                // As the other GGUF MoE families: the MoE implementation is fixed (expert-major
                // unless `--moe-runner-backend` names one), not autotuned.
                let moe = MoeChoice::Fixed(fixed.unwrap_or(MoeImpl::ExpertMajor));
                let m = Glm5Model::load_gguf(p, args.threads, Glm5Options { prefill_attn, decode_attn, moe })?;
                let isa = m.isa().name();
                let notes = serde_json::json!({"attention": "MLA, absorbed, over the latent cache (no DSA indexer)"});
                Ok((Box::new(m), isa, notes))
            }
            _ => {
                let mut m = LlamaModel::load(p, args.threads)?;
                if let Some(f) = fixed {
                    m.set_moe(MoeChoice::Fixed(f));
                }
                let isa = m.isa().name();
                let windows = &m.config().variant.windows;
                let sliding: Vec<usize> = windows.iter().flatten().copied().collect();
                let notes = match sliding.first() {
                    // What the KV budget assumes, for the start-up line.
                    Some(w) => serde_json::json!({
                        "kv_cache": format!(
                            "every layer keeps the full K/V of a sequence (the KV budget counts all {} layers); \
                             {} sliding-window layers read only their last {w} keys, {} global layers read all",
                            windows.len(),
                            sliding.len(),
                            windows.len() - sliding.len()
                        ),
                    }),
                    None => serde_json::Value::Null,
                };
                Ok((Box::new(m), isa, notes))
            }
        }
    }
}

/// A loaded encoder with its kernel ISA name and start-up notes (what it returns per input).
fn bert_loaded(m: BertModel) -> (Box<dyn Model>, &'static str, serde_json::Value) {
    let isa = m.isa().name();
    let c = m.config();
    let notes = serde_json::json!({
        "embedding": match c.num_labels {
            Some(n) => format!("cross-encoder: a classification head of {n} labels scores pairs"),
            None => format!("{} pooling of {} values", c.pooling.name(), c.hidden),
        },
        "max_seq_length": c.max_len,
    });
    (Box::new(m), isa, notes)
}

/// The `general.architecture` of GGUF file `p`.
///
/// # Errors
/// An unreadable file or a missing key.
pub fn gguf_architecture(p: &std::path::Path) -> Result<String, EngineError> {
    use ggus::GGufMetaMapExt;
    let file = crate::checkpoint::gguf::GgufFile::open(p)?;
    let ld = file.view()?;
    let arch = ld
        .meta()
        .general_architecture()
        .map_err(|e| EngineError::model(format!("{}: general.architecture: {e:?}", p.display())))?;
    Ok(arch.to_owned())
}

/// The MoE implementation per batch size: `fixed` if given; else the start-up autotune's
/// buckets (from the cache when it holds this model's key), or a fixed rule when autotune is
/// off. What was chosen and why goes to `notes`.
fn moe_choice(
    m: &Glm5Model,
    args: &EngineArgs,
    fixed: Option<MoeImpl>,
    notes: &mut serde_json::Value,
) -> Result<MoeChoice, EngineError> {
    Ok(match fixed {
        Some(f) => {
            notes["moe_runner_backend"] = f.name().into();
            MoeChoice::Fixed(f)
        }
        None if m.first_moe().is_none() => {
            notes["moe_runner_backend"] = "auto (no MoE layer)".into();
            MoeChoice::Fixed(MoeImpl::ExpertMajor)
        }
        None if args.disable_autotune => {
            // Without timings: a GEMV per pair for one token, grouped GEMMs beyond.
            notes["moe_runner_backend"] =
                "auto (autotune disabled: token_major for 1 token, expert_major beyond)".into();
            MoeChoice::Buckets(vec![(1, MoeImpl::TokenMajor), (usize::MAX, MoeImpl::ExpertMajor)])
        }
        None => {
            let max_tokens = args.chunked_prefill_size.min(args.max_prefill_tokens).clamp(1, 1024);
            let bl = crate::model::autotune::buckets(max_tokens);
            let key = crate::model::autotune::key(m, bl.last().copied().unwrap_or(1));
            let cached = args.autotune_cache_dir.as_deref().and_then(|d| crate::model::autotune::load(d, &key, &bl));
            let (tune, source) = match cached {
                Some(t) => (t, "cache"),
                None => (crate::model::autotune::tune(m, &bl, args.autotune_cache_dir.as_deref())?, "measured"),
            };
            notes["moe_runner_backend"] = "auto".into();
            notes["moe_autotune"] = serde_json::json!({
                "source": source,
                "key": tune.key,
                "file": args.autotune_cache_dir.as_ref().map(|d| d.join(format!("{}.json", tune.key))),
                "summary": tune.summary(),
            });
            MoeChoice::Buckets(tune.choices())
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint directory of any dense family reaches the dense loader (it was refused as
    /// "not supported" unless its `model_type` was `llama`): without weights, the error is the
    /// checkpoint's.
    #[test]
    fn hf_directories_of_every_dense_family_reach_their_loader() {
        let dir = tempfile::tempdir().expect("tmp");
        for mt in ["llama", "mistral", "qwen2", "qwen3", "smollm3", "phi3"] {
            std::fs::write(dir.path().join("config.json"), format!("{{\"model_type\": \"{mt}\"}}")).expect("write");
            let e = load_model(&EngineArgs::new(dir.path().to_owned())).err().expect("no weights: an error");
            assert!(e.to_string().contains("no *.safetensors weights"), "{mt}: {e}");
        }
    }
}
