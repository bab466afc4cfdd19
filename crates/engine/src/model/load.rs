//! Loading a model from `--model-path`, dispatched by the architecture table
//! ([`crate::model::arch`]): a GGUF file by its `general.architecture`, a Hugging Face
//! checkpoint directory by its `config.json` `model_type`, each to its row's body (the
//! Llama-layer decoder, MLA, the BERT encoder). Then the start-up choices every body shares:
//! GLM-5's DSA backends, and the MoE implementation of any model with experts (fixed, or
//! autotuned per batch-size bucket, [`crate::tune::moe`]).

use std::path::Path;

use crate::config::EngineArgs;
use crate::model::arch::{self, Arch, Body};
use crate::model::bert::BertModel;
use crate::model::glm5::{Glm5Model, Glm5Options, MoeChoice, MoeImpl};
use crate::model::llama::LlamaModel;
use crate::model::Model;
use crate::EngineError;

/// Loads the model `args.model_path` names: a GGUF file or a Hugging Face checkpoint
/// directory of an architecture of [`arch::ARCHITECTURES`]. Returns the model, its kernel ISA
/// name, and start-up notes (GLM-5's attention backends, the MoE choice, the KV budget of
/// sliding-window layers, an encoder's pooling).
///
/// # Errors
/// Unreadable or unsupported checkpoints (listing the architectures that load), unknown
/// backend names, an autotune cache that cannot be written.
pub fn load_model(args: &EngineArgs) -> Result<(Box<dyn Model>, &'static str, serde_json::Value), EngineError> {
    let p = &args.model_path;
    let (a, gguf) = match p.is_dir() {
        true => {
            let cfg = crate::checkpoint::hf::read_json(&p.join("config.json"))?;
            let mt = cfg.get("model_type").and_then(|v| v.as_str()).unwrap_or("");
            (arch::by_model_type(mt).map_err(|e| EngineError::model(format!("{}: {e}", p.display())))?, false)
        }
        false => {
            let name = gguf_architecture(p)?;
            (arch::by_gguf(&name).map_err(|e| EngineError::model(format!("{}: {e}", p.display())))?, true)
        }
    };
    let (mut model, isa, mut notes) = load_body(a, p, gguf, args)?;
    crate::tune::moe::choose(&mut *model, args, &mut notes)?;
    Ok((model, isa, notes))
}

/// What a body's loader gives: the model, its kernel ISA name and its start-up notes.
type Loaded = (Box<dyn Model>, &'static str, serde_json::Value);

/// The model of row `a` at `p` (a GGUF file when `gguf`), with its body's start-up notes.
fn load_body(a: &Arch, p: &Path, gguf: bool, args: &EngineArgs) -> Result<Loaded, EngineError> {
    let t = args.threads;
    Ok(match a.body {
        Body::Encoder => {
            let m = if gguf { BertModel::load_gguf(p, t)? } else { BertModel::load_hf(p, t)? };
            let c = m.config();
            let notes = serde_json::json!({
                "embedding": match c.num_labels {
                    Some(n) => format!("cross-encoder: a classification head of {n} labels scores pairs"),
                    None => format!("{} pooling of {} values", c.pooling.name(), c.hidden),
                },
                "max_seq_length": c.max_len,
            });
            let isa = m.isa().name();
            (Box::new(m), isa, notes)
        }
        Body::Mla => {
            let opts = Glm5Options {
                prefill_attn: args.dsa_prefill_backend,
                decode_attn: args.dsa_decode_backend,
                moe: MoeChoice::Fixed(MoeImpl::ExpertMajor),
            };
            let m = if gguf { Glm5Model::load_gguf(p, t, opts)? } else { Glm5Model::load(p, t, opts)? };
            let notes = match m.config().has_indexer() {
                true => serde_json::json!({
                    "dsa_prefill_backend": args.dsa_prefill_backend.name(),
                    "dsa_decode_backend": args.dsa_decode_backend.name(),
                }),
                false => serde_json::json!({"attention": "MLA, absorbed, over the latent cache (no DSA indexer)"}),
            };
            let isa = m.isa().name();
            (Box::new(m), isa, notes)
        }
        Body::Decoder(_) => {
            let m = if gguf { LlamaModel::load(p, t)? } else { LlamaModel::load_hf(p, t)? };
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
            let isa = m.isa().name();
            (Box::new(m), isa, notes)
        }
    })
}

/// The `general.architecture` of GGUF file `p`.
///
/// # Errors
/// An unreadable file or a missing key.
pub fn gguf_architecture(p: &Path) -> Result<String, EngineError> {
    use ggus::GGufMetaMapExt;
    let file = crate::checkpoint::gguf::GgufFile::open(p)?;
    let ld = file.view()?;
    let arch = ld
        .meta()
        .general_architecture()
        .map_err(|e| EngineError::model(format!("{}: general.architecture: {e:?}", p.display())))?;
    Ok(arch.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A checkpoint directory of every HF `model_type` in the table reaches its body's loader:
    /// without weights, the error is the checkpoint's (or, for BERT, whose loader reads its
    /// config first, the config's). An unknown one is refused listing them.
    #[test]
    fn hf_directories_of_every_model_type_reach_their_loader() {
        let dir = tempfile::tempdir().expect("tmp");
        for mt in arch::hf_model_types() {
            std::fs::write(dir.path().join("config.json"), format!("{{\"model_type\": \"{mt}\"}}")).expect("write");
            let e = load_model(&EngineArgs::new(dir.path().to_owned())).err().expect("no weights: an error");
            let e = e.to_string();
            let reached = e.contains("no *.safetensors weights") || (mt == "bert" && e.contains("hidden_size"));
            assert!(reached && !e.contains("is not supported"), "{mt}: {e}");
        }
        std::fs::write(dir.path().join("config.json"), "{\"model_type\": \"rwkv\"}").expect("write");
        let e = load_model(&EngineArgs::new(dir.path().to_owned())).err().expect("refused").to_string();
        assert!(e.contains("\"rwkv\" is not supported") && e.contains("qwen3_moe"), "{e}");
    }
}
