//! Weights by name under a prefix, after candle-nn's `VarBuilder` (`vb.pp("model.layers").pp(3)`):
//! a loader names each tensor once, relative to its module, and the same full name is what the
//! calibration observer is told, so the name loaded and the name reported cannot differ.
//!
//! Names are Hugging Face state-dict names. A GGUF file is read through llama.cpp's mapping of
//! those names to its own, per architecture (`gguf-py/gguf/tensor_mapping.py`:
//! `model.layers.{bid}.self_attn.q_proj` is `blk.{bid}.attn_q`), so one layer loader serves a
//! family's GGUF files and its HF checkpoints.

use std::cell::Cell;
use std::fmt::Display;
use std::rc::Rc;

use sparrow_cpu::Weight;

use crate::checkpoint::gguf::Gguf;
use crate::checkpoint::hf::Checkpoint;
use crate::model::linear::Linear;
use crate::EngineError;

/// Where a loader's tensors come from, by HF name.
pub trait Tensors {
    /// Whether tensor `name` exists.
    fn has(&self, name: &str) -> bool;
    /// The 1-D tensor `name` as `len` f32 values.
    ///
    /// # Errors
    /// A missing tensor, another length or a type that is not a float vector.
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, EngineError>;
    /// The weight of linear module `module` (tensor `{module}.weight`), `[rows × cols]`, at
    /// its file's size.
    ///
    /// # Errors
    /// A missing tensor, another shape or an unsupported type, named by the file's own
    /// tensor name.
    fn matrix(&self, module: &str, rows: usize, cols: usize) -> Result<Weight, EngineError>;

    /// The weight of module `module` as the model keeps a table it reads by rows or a router
    /// it runs in f32: an HF checkpoint's in f32 whatever its quantization config says
    /// (ModelOpt leaves embeddings and routers unquantized), a GGUF file's at its file's size.
    ///
    /// # Errors
    /// As [`Tensors::matrix`].
    fn dense(&self, module: &str, rows: usize, cols: usize) -> Result<Weight, EngineError> {
        self.matrix(module, rows, cols)
    }

    /// The `[rows × cols]` weights of `n` experts of one projection, `module` naming them
    /// without the expert index (`model.layers.3.mlp.experts.gate_proj`): an HF checkpoint
    /// keeps one tensor per expert (`…experts.{e}.gate_proj.weight`), a GGUF file one tensor
    /// for all (`blk.3.ffn_gate_exps.weight`, [`Gguf::experts`]).
    ///
    /// # Errors
    /// A missing tensor, or one of another shape, named.
    fn experts(&self, module: &str, n: usize, rows: usize, cols: usize) -> Result<Vec<Weight>, EngineError> {
        let (head, proj) = module.rsplit_once('.').unwrap_or(("", module));
        (0..n).map(|e| self.matrix(&format!("{head}.{e}.{proj}"), rows, cols)).collect()
    }
}

/// `{experts}.{proj}.bias` split into the experts' module and the projection, for gpt-oss's
/// packed biases ([`Checkpoint::packed_expert_bias`]).
fn packed_bias(name: &str) -> Option<(&str, &str)> {
    let (experts, proj) = name.strip_suffix(".bias")?.rsplit_once('.')?;
    experts.ends_with(".experts").then_some((experts, proj))
}

impl Tensors for Checkpoint {
    fn has(&self, name: &str) -> bool {
        Checkpoint::has(self, name) || packed_bias(name).is_some_and(|(ex, p)| self.has_packed_expert_bias(ex, p))
    }
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, EngineError> {
        match packed_bias(name).filter(|_| !Checkpoint::has(self, name)) {
            Some((ex, p)) => match self.packed_expert_bias(ex, p, len)? {
                Some(v) => Ok(v),
                None => Checkpoint::vector(self, name, len),
            },
            None => Checkpoint::vector(self, name, len),
        }
    }
    fn matrix(&self, module: &str, rows: usize, cols: usize) -> Result<Weight, EngineError> {
        self.linear(module, rows, cols)
    }
    fn dense(&self, module: &str, rows: usize, cols: usize) -> Result<Weight, EngineError> {
        let name = format!("{module}.weight");
        let (shape, data) = self.f32(&name)?;
        if shape != [rows, cols] {
            return Err(EngineError::model(format!("{name}: shape {shape:?}, want [{rows}, {cols}]")));
        }
        Ok(Weight::Dense { rows, cols, data })
    }
    fn experts(&self, module: &str, n: usize, rows: usize, cols: usize) -> Result<Vec<Weight>, EngineError> {
        let (head, proj) = module.rsplit_once('.').unwrap_or(("", module));
        if let Some(ws) = self.packed_experts(head, proj, n, rows, cols)? {
            return Ok(ws);
        }
        match self.fused_experts(head, proj, n, rows, cols)? {
            Some(ws) => Ok(ws),
            None => (0..n).map(|e| self.matrix(&format!("{head}.{e}.{proj}"), rows, cols)).collect(),
        }
    }
}

/// A view of [`Tensors`] with some module names spelled as a checkpoint spells them: each
/// `(ours, theirs)` pair replaces the path segment(s) `ours` (gpt-oss's router is HF's
/// `mlp.router` where every other family's is `mlp.gate`).
pub struct Renamed<'a> {
    /// The checkpoint.
    pub inner: &'a dyn Tensors,
    /// `(our name, the checkpoint's)` module paths: a segment anywhere, or a root path when
    /// ours starts with `model.`.
    pub names: &'static [(&'static str, &'static str)],
}

impl Renamed<'_> {
    fn name(&self, n: &str) -> String {
        let mut out = n.to_owned();
        for (ours, theirs) in self.names {
            let (mid, end, head) = (format!(".{ours}."), format!(".{ours}"), format!("{ours}."));
            let root = ours.starts_with("model.");
            if root && out == *ours {
                out = (*theirs).to_owned();
            } else if let Some(rest) = out.strip_prefix(&head).filter(|_| root) {
                // A root path (`model.embed_tokens` → Nemotron-H's `backbone.embeddings`).
                out = format!("{theirs}.{rest}");
            } else if out.contains(&mid) {
                out = out.replacen(&mid, &format!(".{theirs}."), 1);
            } else if let Some(stem) = out.strip_suffix(&end) {
                out = format!("{stem}.{theirs}");
            }
        }
        out
    }
}

impl Tensors for Renamed<'_> {
    fn has(&self, name: &str) -> bool {
        self.inner.has(&self.name(name))
    }
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, EngineError> {
        self.inner.vector(&self.name(name), len)
    }
    fn matrix(&self, module: &str, rows: usize, cols: usize) -> Result<Weight, EngineError> {
        self.inner.matrix(&self.name(module), rows, cols)
    }
    fn dense(&self, module: &str, rows: usize, cols: usize) -> Result<Weight, EngineError> {
        self.inner.dense(&self.name(module), rows, cols)
    }
    fn experts(&self, module: &str, n: usize, rows: usize, cols: usize) -> Result<Vec<Weight>, EngineError> {
        self.inner.experts(&self.name(module), n, rows, cols)
    }
}

/// The HF module names of a decoder layer (`model.layers.{bid}.` stripped) and llama.cpp's
/// names for them (`blk.{bid}.` stripped), for the Llama architecture and those that share its
/// layer (`tensor_mapping.py`: `MODEL_ARCH.LLAMA`, `QWEN2`, `QWEN3`, `SMOLLM3`; Qwen3's Q/K
/// norms, Qwen2's biases as `{name}.bias`).
pub const LLAMA_LAYER_NAMES: &[(&str, &str)] = &[
    ("input_layernorm", "attn_norm"),
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("self_attn.q_norm", "attn_q_norm"),
    ("self_attn.k_norm", "attn_k_norm"),
    ("post_attention_layernorm", "ffn_norm"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
];

/// The feed-forward names the MoE families add to [`LLAMA_LAYER_NAMES`] (`MODEL_ARCH.QWEN3MOE`,
/// `GLM4_MOE`, `GPT_OSS`): the router `mlp.gate` (`ffn_gate_inp`), its selection bias
/// (`e_score_correction_bias`, `exp_probs_b.bias`), the routed experts as one tensor per
/// projection (`mlp.experts.{e}.gate_proj` of every `e` is `ffn_gate_exps`, read by
/// [`Tensors::experts`]) and shared experts (`ffn_*_shexp`); leading dense layers keep the
/// plain MLP names.
pub const MOE_FFN_NAMES: &[(&str, &str)] = &[
    ("mlp.gate", "ffn_gate_inp"),
    ("mlp.gate.e_score_correction_bias", "exp_probs_b.bias"),
    ("mlp.experts.gate_proj", "ffn_gate_exps"),
    ("mlp.experts.up_proj", "ffn_up_exps"),
    ("mlp.experts.down_proj", "ffn_down_exps"),
    ("mlp.shared_experts.gate_proj", "ffn_gate_shexp"),
    ("mlp.shared_experts.up_proj", "ffn_up_shexp"),
    ("mlp.shared_experts.down_proj", "ffn_down_shexp"),
    ("mlp.shared_expert_gate", "ffn_gate_inp_shexp"),
];

/// DeepSeek-V2/V3's MLA attention (`MODEL_ARCH.DEEPSEEK2`): the q LoRA (`attn_q_a`,
/// `attn_q_a_norm`, `attn_q_b`) or a plain `attn_q` (V2-Lite), the latent projection and its
/// norm, and `kv_b_proj` unsplit (`attn_kv_b`, older files) or split for the absorbed form
/// (`attn_k_b`, `attn_v_b`); the rest are [`LLAMA_LAYER_NAMES`] and [`MOE_FFN_NAMES`].
pub const DEEPSEEK2_LAYER_NAMES: &[(&str, &str)] = &[
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.q_a_proj", "attn_q_a"),
    ("self_attn.q_a_layernorm", "attn_q_a_norm"),
    ("self_attn.q_b_proj", "attn_q_b"),
    ("self_attn.kv_a_proj_with_mqa", "attn_kv_a_mqa"),
    ("self_attn.kv_a_layernorm", "attn_kv_a_norm"),
    ("self_attn.kv_b_proj", "attn_kv_b"),
    ("self_attn.k_b_proj", "attn_k_b"),
    ("self_attn.v_b_proj", "attn_v_b"),
];

/// GLM-4.5's and gpt-oss's pre-FFN norm, stored as `post_attention_norm` (put before
/// [`LLAMA_LAYER_NAMES`], whose `ffn_norm` it overrides).
pub const POST_ATTENTION_NORM: &[(&str, &str)] = &[("post_attention_layernorm", "post_attention_norm")];

/// The Gated DeltaNet layers of the hybrid families (`MODEL_ARCH.QWEN35`, llama.cpp
/// `src/models/qwen35.cpp`; Qwen3-Next's fused `ssm_ba`), in front of [`LLAMA_LAYER_NAMES`]: the fused `q|k|v` input of the
/// convolution (`attn_qkv`), the output gate `z` (`attn_gate`), β's and the decay's projections
/// (`ssm_beta`, `ssm_alpha`), the convolution's taps (`ssm_conv1d`, F32 `[kernel, channels]`),
/// the decay's bias (`ssm_dt.bias`) and rate (`ssm_a`, which the converter stores as
/// `−exp(A_log)`: the module is named `A` here for that reason), the gated norm and the output
/// projection; the pre-FFN norm is `post_attention_norm`.
pub const QWEN35_LAYER_NAMES: &[(&str, &str)] = &[
    ("post_attention_layernorm", "post_attention_norm"),
    ("linear_attn.in_proj_qkv", "attn_qkv"),
    ("linear_attn.in_proj_z", "attn_gate"),
    ("linear_attn.in_proj_b", "ssm_beta"),
    ("linear_attn.in_proj_a", "ssm_alpha"),
    ("linear_attn.in_proj_ba", "ssm_ba"),
    ("linear_attn.conv1d", "ssm_conv1d"),
    ("linear_attn.dt_bias", "ssm_dt.bias"),
    ("linear_attn.A", "ssm_a"),
    ("linear_attn.norm", "ssm_norm"),
    ("linear_attn.out_proj", "ssm_out"),
];

/// Nemotron-H's Mamba-2 mixer (`MODEL_ARCH.NEMOTRON_H`, HF `NemotronHMamba2Mixer` under
/// `mixer`): the stacked input projection `[z | x B C | dt]`, the convolution (with its bias),
/// the step's bias, `A = −exp(A_log)` and `D` (no `.weight` suffix), the grouped output norm and
/// the output projection; its attention and MLP blocks keep [`LLAMA_LAYER_NAMES`].
pub const NEMOTRON_H_LAYER_NAMES: &[(&str, &str)] = &[
    ("mixer.in_proj", "ssm_in"),
    ("mixer.conv1d", "ssm_conv1d"),
    ("mixer.dt_bias", "ssm_dt.bias"),
    ("mixer.A", "ssm_a"),
    ("mixer.D", "ssm_d"),
    ("mixer.norm", "ssm_norm"),
    ("mixer.out_proj", "ssm_out"),
];

/// The language model's root inside a multimodal Hugging Face checkpoint
/// (`Qwen3_5ForConditionalGeneration`: `model.language_model.*`), read through
/// [`Renamed`] when the checkpoint has it.
pub const LANGUAGE_MODEL_NAMES: &[(&str, &str)] = &[
    ("model.embed_tokens", "model.language_model.embed_tokens"),
    ("model.layers", "model.language_model.layers"),
    ("model.norm", "model.language_model.norm"),
];

/// Nemotron-H's Hugging Face names (`NemotronHForCausalLM`): the root `backbone`, one `norm`
/// and one `mixer` per block, whatever the block is.
pub const NEMOTRON_H_HF_NAMES: &[(&str, &str)] = &[
    ("model.embed_tokens", "backbone.embeddings"),
    ("model.norm", "backbone.norm_f"),
    ("model.layers", "backbone.layers"),
    ("input_layernorm", "norm"),
    ("self_attn", "mixer"),
    ("mlp", "mixer"),
];

/// gpt-oss's attention sinks (`attn_sinks`, one logit per head).
pub const ATTENTION_SINKS: &[(&str, &str)] = &[("self_attn.sinks", "attn_sinks.weight")];

/// As [`LLAMA_LAYER_NAMES`] for Phi-3/Phi-4 (`MODEL_ARCH.PHI3`): Q/K/V in one `attn_qkv`
/// (HF `qkv_proj`) and gate/up in one `ffn_up` of twice the MLP width (HF `gate_up_proj`,
/// gate rows first).
pub const PHI3_LAYER_NAMES: &[(&str, &str)] = &[
    ("input_layernorm", "attn_norm"),
    ("self_attn.qkv_proj", "attn_qkv"),
    ("self_attn.o_proj", "attn_output"),
    ("post_attention_layernorm", "ffn_norm"),
    ("mlp.gate_up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
];

/// As [`LLAMA_LAYER_NAMES`] for Gemma 2/3: four norms per layer (llama.cpp's `ffn_norm` is
/// HF's `pre_feedforward_layernorm` there, and `post_attention_layernorm` is its own tensor)
/// and per-head Q/K norms.
pub const GEMMA3_LAYER_NAMES: &[(&str, &str)] = &[
    ("input_layernorm", "attn_norm"),
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("self_attn.q_norm", "attn_q_norm"),
    ("self_attn.k_norm", "attn_k_norm"),
    ("post_attention_layernorm", "post_attention_norm"),
    ("pre_feedforward_layernorm", "ffn_norm"),
    ("post_feedforward_layernorm", "post_ffw_norm"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
];

/// A GGUF file's tensors under HF names: `layer_names` maps a layer's modules (tables of those
/// above, the first that names a module wins); the model-level names are the same for every
/// architecture.
pub struct GgufTensors<'a, 'b> {
    /// The parsed file.
    pub ld: &'b Gguf<'a>,
    /// `(HF, llama.cpp)` names of a layer's modules, in tables searched in order.
    pub layer_names: &'static [&'static [(&'static str, &'static str)]],
    /// Threads that repack a block-type matrix.
    pub threads: usize,
}

/// llama.cpp's name for the HF tensor or module `hf` (a trailing `.weight` / `.bias` is kept)
/// given the architecture's `layer_names`, or `None` when it has no such tensor.
pub fn gguf_name(layer_names: &[(&str, &str)], hf: &str) -> Option<String> {
    map_module(hf, |stem| match stem {
        "model.embed_tokens" => Some("token_embd".to_owned()),
        "model.norm" => Some("output_norm".to_owned()),
        "lm_head" => Some("output".to_owned()),
        _ => {
            let rest = stem.strip_prefix("model.layers.")?;
            let (bid, module) = rest.split_once('.')?;
            let bid: usize = bid.parse().ok()?;
            let (_, file) = layer_names.iter().find(|(h, _)| *h == module)?;
            Some(format!("blk.{bid}.{file}"))
        }
    })
}

/// `hf` renamed by `module` (which maps a module name, `.weight` / `.bias` stripped), the
/// suffix put back: the shape of every HF -> llama.cpp name table.
pub fn map_module(hf: &str, module: impl Fn(&str) -> Option<String>) -> Option<String> {
    let (stem, suffix) = match hf.rsplit_once('.') {
        Some((s, x @ ("weight" | "bias"))) => (s, Some(x)),
        _ => (hf, None),
    };
    let mapped = module(stem)?;
    Some(match suffix {
        Some(x) => format!("{mapped}.{x}"),
        None => mapped,
    })
}

/// [`gguf_name`] over tables searched in order (a family's overrides, then the names it
/// shares with others).
pub fn gguf_name_in(tables: &[&[(&str, &str)]], hf: &str) -> Option<String> {
    tables.iter().find_map(|t| gguf_name(t, hf))
}

impl GgufTensors<'_, '_> {
    fn named(&self, hf: &str) -> Result<String, EngineError> {
        gguf_name_in(self.layer_names, hf)
            .ok_or_else(|| EngineError::model(format!("no GGUF tensor name for HF tensor {hf} in this architecture")))
    }
}

impl Tensors for GgufTensors<'_, '_> {
    fn has(&self, name: &str) -> bool {
        gguf_name_in(self.layer_names, name).is_some_and(|n| self.ld.has_tensor(&n))
    }
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, EngineError> {
        self.ld.vector(&self.named(name)?, len)
    }
    fn matrix(&self, module: &str, rows: usize, cols: usize) -> Result<Weight, EngineError> {
        self.ld.matrix_threads(&self.named(&format!("{module}.weight"))?, rows, cols, self.threads)
    }
    fn experts(&self, module: &str, n: usize, rows: usize, cols: usize) -> Result<Vec<Weight>, EngineError> {
        self.ld.experts(&self.named(&format!("{module}.weight"))?, n, rows, cols, self.threads)
    }
}

/// A view of [`Tensors`] under a name prefix; cheap to clone and extend. Every view of one
/// root counts the bytes of what it returns, as the model holds them ([`Vb::held_bytes`]), so
/// a loader's weight bytes are counted where the weights are read.
#[derive(Clone)]
pub struct Vb<'a> {
    src: &'a dyn Tensors,
    prefix: String,
    held: Rc<Cell<usize>>,
}

impl<'a> Vb<'a> {
    /// The root view (no prefix), its count at 0.
    pub fn new(src: &'a dyn Tensors) -> Vb<'a> {
        Vb { src, prefix: String::new(), held: Rc::default() }
    }

    /// The view under `self`'s prefix extended by `.{s}` (`vb.pp("model.layers").pp(3)`).
    pub fn pp(&self, s: impl Display) -> Vb<'a> {
        let prefix = match self.prefix.is_empty() {
            true => s.to_string(),
            false => format!("{}.{s}", self.prefix),
        };
        Vb { src: self.src, prefix, held: self.held.clone() }
    }

    /// Bytes of everything read through this root's views so far: matrices at their size in
    /// memory, vectors as f32.
    pub fn held_bytes(&self) -> usize {
        self.held.get()
    }

    /// Tells the count that a weight read as `read` bytes is held as `held` bytes (MLA's
    /// `kv_b_proj`, kept as per-head f32 matrices).
    pub fn held_as(&self, read: usize, held: usize) {
        self.held.set(self.held.get() - read.min(self.held.get()) + held);
    }

    fn count<T>(&self, r: Result<T, EngineError>, bytes: impl Fn(&T) -> usize) -> Result<T, EngineError> {
        if let Ok(v) = &r {
            self.held.set(self.held.get() + bytes(v));
        }
        r
    }

    /// The full HF name of `n` under this prefix.
    pub fn path(&self, n: &str) -> String {
        match self.prefix.is_empty() {
            true => n.to_owned(),
            false => format!("{}.{n}", self.prefix),
        }
    }

    /// Whether tensor `n` exists under this prefix.
    pub fn has(&self, n: &str) -> bool {
        self.src.has(&self.path(n))
    }

    /// The vector `n` (`len` values).
    ///
    /// # Errors
    /// As [`Tensors::vector`].
    pub fn vector(&self, n: &str, len: usize) -> Result<Vec<f32>, EngineError> {
        self.count(self.src.vector(&self.path(n), len), |v| 4 * v.len())
    }

    /// The weight of module `n`, `[rows × cols]`.
    ///
    /// # Errors
    /// As [`Tensors::matrix`].
    pub fn matrix(&self, n: &str, rows: usize, cols: usize) -> Result<Weight, EngineError> {
        self.count(self.src.matrix(&self.path(n), rows, cols), Weight::bytes)
    }

    /// The weight of module `n`, `[rows × cols]`, as [`Tensors::dense`] reads it (an
    /// embedding table, a router).
    ///
    /// # Errors
    /// As [`Tensors::dense`].
    pub fn dense(&self, n: &str, rows: usize, cols: usize) -> Result<Weight, EngineError> {
        self.count(self.src.dense(&self.path(n), rows, cols), Weight::bytes)
    }

    /// The `n` experts of projection `proj` under this prefix (`…mlp.experts`), each a
    /// [`Linear`] named `{prefix}.{e}.{proj}`, as [`Tensors::experts`] reads them.
    ///
    /// # Errors
    /// As [`Tensors::experts`].
    pub fn experts(&self, proj: &str, n: usize, rows: usize, cols: usize) -> Result<Vec<Linear>, EngineError> {
        let ws =
            self.count(self.src.experts(&self.path(proj), n, rows, cols), |ws| ws.iter().map(Weight::bytes).sum())?;
        Ok(ws.into_iter().enumerate().map(|(e, w)| Linear::new(w, vec![self.pp(e).path(proj)])).collect())
    }

    /// Module `n` as a [`Linear`] named by its full HF name, with its bias (`{n}.bias`,
    /// `rows` values) when the file has one, as llama.cpp's loader takes every projection
    /// bias as optional (`create_tensor_qkv`, `TENSOR_NOT_REQUIRED`).
    ///
    /// # Errors
    /// As [`Tensors::matrix`], and a bias of another length.
    pub fn linear(&self, n: &str, rows: usize, cols: usize) -> Result<Linear, EngineError> {
        let mut l = Linear::new(self.matrix(n, rows, cols)?, vec![self.path(n)]);
        let b = format!("{n}.bias");
        if self.has(&b) {
            l.bias = Some(self.vector(&b, rows)?);
        }
        Ok(l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_join_with_dots() {
        struct Names;
        impl Tensors for Names {
            fn has(&self, name: &str) -> bool {
                name == "model.layers.3.mlp.down_proj.weight"
            }
            fn vector(&self, name: &str, _: usize) -> Result<Vec<f32>, EngineError> {
                Err(EngineError::model(name.to_owned()))
            }
            fn matrix(&self, module: &str, _: usize, _: usize) -> Result<Weight, EngineError> {
                Err(EngineError::model(module.to_owned()))
            }
        }
        let root = Vb::new(&Names);
        let mlp = root.pp("model.layers").pp(3).pp("mlp");
        assert_eq!(mlp.path("down_proj"), "model.layers.3.mlp.down_proj");
        assert!(mlp.has("down_proj.weight"));
        assert!(!root.has("down_proj.weight"));
        assert_eq!(root.path("lm_head"), "lm_head");
    }

    /// Pairs from llama.cpp's `gguf-py/gguf/tensor_mapping.py` (and `constants.py` for the
    /// GGUF spellings).
    #[test]
    fn hf_names_map_to_llama_cpp_names() {
        let l = LLAMA_LAYER_NAMES;
        assert_eq!(gguf_name(l, "model.layers.12.self_attn.q_proj.weight").as_deref(), Some("blk.12.attn_q.weight"));
        assert_eq!(gguf_name(l, "model.layers.0.self_attn.k_proj.bias").as_deref(), Some("blk.0.attn_k.bias"));
        assert_eq!(
            gguf_name(l, "model.layers.0.post_attention_layernorm.weight").as_deref(),
            Some("blk.0.ffn_norm.weight")
        );
        assert_eq!(gguf_name(l, "model.layers.7.mlp.down_proj").as_deref(), Some("blk.7.ffn_down"));
        assert_eq!(gguf_name(l, "model.embed_tokens.weight").as_deref(), Some("token_embd.weight"));
        assert_eq!(gguf_name(l, "model.norm.weight").as_deref(), Some("output_norm.weight"));
        assert_eq!(gguf_name(l, "lm_head").as_deref(), Some("output"));
        assert_eq!(gguf_name(l, "model.layers.0.self_attn.q_norm.weight").as_deref(), Some("blk.0.attn_q_norm.weight"));
        assert_eq!(gguf_name(l, "model.layers.0.pre_feedforward_layernorm.weight"), None);
        assert_eq!(gguf_name(l, "model.layers.x.mlp.down_proj"), None);
        let g = GEMMA3_LAYER_NAMES;
        assert_eq!(
            gguf_name(g, "model.layers.2.post_attention_layernorm.weight").as_deref(),
            Some("blk.2.post_attention_norm.weight")
        );
        assert_eq!(
            gguf_name(g, "model.layers.2.pre_feedforward_layernorm.weight").as_deref(),
            Some("blk.2.ffn_norm.weight")
        );
        assert_eq!(gguf_name(g, "model.layers.2.self_attn.k_norm.weight").as_deref(), Some("blk.2.attn_k_norm.weight"));
    }
}
