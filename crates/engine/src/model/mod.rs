//! Models and the one trait the scheduler drives them through.
//!
//! Compatibility is settled at start-up, by capability: a model states what its attention
//! needs ([`AttentionNeeds`]) and the backend states what it provides ([`BackendCaps`]);
//! [`check_compat`] refuses a mismatched pair with a message before any request is admitted.

pub mod arch;
pub mod bert;
pub mod common;
pub mod family;
pub mod glm5;
pub mod hparams;
pub mod linear;
pub mod llama;
pub mod load;
pub mod moe;
pub mod observer;
pub mod routing;
pub mod vb;

use crate::batch::ForwardBatch;
use crate::kv::{KvLayout, KvStore, StateLayout};
use crate::EngineError;

/// Static facts about a loaded model, for `/get_model_info` and admission checks.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ModelInfo {
    /// Architecture name from the checkpoint (e.g. `llama`).
    pub architecture: String,
    /// Human name (`general.name`).
    pub name: String,
    /// Vocabulary size (logit width).
    pub vocab_size: usize,
    /// Longest sequence the model was trained for.
    pub context_length: usize,
    /// Layers.
    pub num_layers: usize,
    /// Hidden size.
    pub hidden_size: usize,
    /// Bytes of weights held in memory (matrices at their repacked size, vectors in f32).
    pub weight_bytes: usize,
    /// The file's bytes of the same tensors, where the model came from a file that states them
    /// (GGUF): start-up prints both, and `weight_bytes` stays within 1.05 × of it.
    pub file_weight_bytes: Option<usize>,
    /// Bytes of weights one token reads, where that is less than `weight_bytes` (a MoE model:
    /// the router, its `top_k` routed and the shared experts of each layer, and the rest but
    /// an untied embedding table, of which a token reads one row).
    pub active_weight_bytes: Option<usize>,
}

/// The weight forms [`PartTimes::gemm_by_kind`] splits the matmul time by (`Weight::kind`'s
/// names).
pub const GEMM_KINDS: [&str; 13] =
    ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16", "F32", "NVFP4", "MXFP4"];

/// Wall time of a model's forward passes by part, in seconds summed over the calls since the
/// timing was switched on (`set_profile(true)` on a model): for benchmarks that want to see
/// where a step goes, e.g. the quadratic attention term against the linear GEMMs, or (`sparrow
/// roofline`) a decode step's matmuls by weight type.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PartTimes {
    /// Matrix multiplications: every [`linear::Linear`] (projections, MLP, experts), GLM-5's
    /// router and the LM head; the matmuls alone, not the norms or activations around them.
    pub gemm: f64,
    /// `gemm` by weight form, indexed like [`GEMM_KINDS`]; a matmul over a stack of forms
    /// (a fused QKV of Q4_K and Q6_K) is split by the forms' bytes.
    pub gemm_by_kind: [f64; 13],
    /// Attention: K/V writes, scores, softmax, values; a recurrent layer's convolution, norms
    /// and delta rule.
    pub attention: f64,
    /// The DSA indexer's key scoring and top-k (GLM-5 only).
    pub indexer: f64,
    /// The whole forward passes.
    pub total: f64,
}

impl PartTimes {
    /// Adds `secs` of a matmul over `w` to `gemm` and to its forms' shares.
    pub fn add_gemm(&mut self, w: &sparrow_cpu::Weight, secs: f64) {
        self.gemm += secs;
        let pieces = w.pieces();
        let total: usize = pieces.iter().map(|p| p.1).sum::<usize>().max(1);
        for (kind, bytes) in pieces {
            if let Some(i) = GEMM_KINDS.iter().position(|k| *k == kind) {
                self.gemm_by_kind[i] += secs * bytes as f64 / total as f64;
            }
        }
    }

    /// Adds another set of totals to these.
    pub fn accumulate(&mut self, o: &PartTimes) {
        self.gemm += o.gemm;
        self.attention += o.attention;
        self.indexer += o.indexer;
        self.total += o.total;
        for (a, b) in self.gemm_by_kind.iter_mut().zip(&o.gemm_by_kind) {
            *a += b;
        }
    }

    /// Everything else: embeddings, norms, RoPE, activations, the routing rule and the MoE
    /// combine, the pool's hand-offs.
    pub fn other(&self) -> f64 {
        self.total - self.gemm - self.attention - self.indexer
    }
}

/// What a model keeps for calibration and profiling, the same for every model: it hands it out
/// through [`Model::instruments`] and [`Model::instruments_mut`], and the trait's
/// `set_observer`, `take_observer`, `set_profile` and `part_times` work on it.
#[derive(Default)]
pub struct Instruments {
    /// Told the input of every linear layer while set (calibration).
    pub observer: observer::ObserverSlot,
    /// Whether forwards time their parts.
    pub profile: bool,
    /// The part times summed since profiling was switched on.
    pub parts: PartTimes,
}

impl Instruments {
    /// A clock for one forward while profiling (`None` otherwise).
    pub fn clock(&self) -> Option<std::time::Instant> {
        self.profile.then(std::time::Instant::now)
    }

    /// Adds one forward's part times, its whole wall time measured from `clock`.
    pub fn record(&mut self, clock: Option<std::time::Instant>, mut pt: PartTimes) {
        if let Some(t0) = clock {
            pt.total = t0.elapsed().as_secs_f64();
            self.parts.accumulate(&pt);
        }
    }
}

/// What a model's attention requires from the backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttentionNeeds {
    /// Attention kind (`"gqa"`, `"mla"`, `"mla+dsa"`, `"bidirectional"`).
    pub kind: &'static str,
    /// The per-token cache layout.
    pub kv_layout: KvLayout,
    /// Whether some layers attend over a sliding window of keys (Gemma 3).
    pub sliding_window: bool,
}

impl AttentionNeeds {
    /// True when every token attends to every other of its sequence (an encoder): a
    /// sequence must then be computed in one step, never chunked and never started from a
    /// cached prefix, because an earlier chunk's keys would not have seen the later tokens.
    pub fn whole_sequences(&self) -> bool {
        self.kind == "bidirectional"
    }
}

/// What an attention backend provides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendCaps {
    /// Backend name (`--attention-backend`).
    pub name: &'static str,
    /// Attention kinds it implements.
    pub kinds: &'static [&'static str],
    /// Whether it runs EXTEND and DECODE rows in one batch.
    pub mixed_batches: bool,
    /// Whether EXTEND rows may start from a cached prefix (chunked prefill, radix hits).
    pub extend_with_prefix: bool,
    /// Whether layers may attend over a sliding window (reading only its keys).
    pub sliding_window: bool,
}

/// The CPU backend: paged GQA attention over the slot lists of a [`ForwardBatch`], causal, and
/// the bidirectional attention of an encoder over each sequence's own slots (the scheduler
/// then sends whole sequences, see [`AttentionNeeds::whole_sequences`]).
pub const CPU_BACKEND: BackendCaps = BackendCaps {
    name: "cpu",
    kinds: &["gqa", "bidirectional"],
    mixed_batches: true,
    extend_with_prefix: true,
    sliding_window: true,
};

/// The CPU DSA backend: MLA over the latent cache with DeepSeek sparse attention (indexer
/// top-k), named after SGLang's `--attention-backend dsa` (`nsa` before 0.5.23); without an
/// indexer (DeepSeek-V2/V3) the same absorbed MLA attends to the whole context.
pub const DSA_BACKEND: BackendCaps = BackendCaps {
    name: "dsa",
    kinds: &["mla+dsa", "mla"],
    mixed_batches: true,
    extend_with_prefix: true,
    sliding_window: false,
};

/// Every attention backend this build has.
pub const BACKENDS: &[BackendCaps] = &[CPU_BACKEND, DSA_BACKEND];

/// Refuses a model/backend pair the backend cannot run.
///
/// # Errors
/// [`EngineError::Incompatible`] naming the missing capability.
pub fn check_compat(needs: &AttentionNeeds, caps: &BackendCaps) -> Result<(), EngineError> {
    if !caps.kinds.contains(&needs.kind) {
        let fit: Vec<&str> = BACKENDS.iter().filter(|b| b.kinds.contains(&needs.kind)).map(|b| b.name).collect();
        return Err(EngineError::Incompatible(format!(
            "attention backend {:?} implements {:?}, but the model needs {:?}{}; backends that do: {:?}",
            caps.name,
            caps.kinds,
            needs.kind,
            if needs.kind.contains("dsa") { " (DeepSeek sparse attention)" } else { "" },
            fit
        )));
    }
    if needs.sliding_window && !caps.sliding_window {
        return Err(EngineError::Incompatible(format!(
            "attention backend {:?} has no sliding-window attention, which the model's windowed layers need",
            caps.name
        )));
    }
    if !caps.mixed_batches || !caps.extend_with_prefix {
        return Err(EngineError::Incompatible(format!(
            "attention backend {:?} lacks mixed batches or prefix extend, which the scheduler uses for every request",
            caps.name
        )));
    }
    Ok(())
}

/// How an embedding model reduces a sequence's hidden states to one vector (sentence-transformers'
/// `1_Pooling/config.json` modes; llama.cpp's `--pooling mean|cls|last`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pooling {
    /// The mean of every token's final hidden state (`pooling_mode_mean_tokens`).
    Mean,
    /// The first token's (`[CLS]`, `pooling_mode_cls_token`).
    Cls,
    /// The last token's: the only one a causal decoder lets see the whole input
    /// (`pooling_mode_lasttoken`, Qwen3-Embedding's recipe).
    Last,
}

impl Pooling {
    /// The name used in start-up notes and `/get_model_info`.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
        }
    }
}

/// What an embedding model returns per sequence ([`Model::set_embedding`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct EmbeddingSpec {
    /// Values per embedding (the hidden size).
    pub dim: usize,
    /// How the sequence's hidden states are pooled.
    pub pooling: Pooling,
    /// The rows are a classification head's logits (`dim` labels), not embeddings: a
    /// cross-encoder, which scores a pair `[CLS] a [SEP] b [SEP]` jointly.
    pub labels: bool,
}

/// The KV storage `model` runs on: `slots` KV slots and, for a hybrid model, a state pool of
/// `requests` live states (one per request-pool index a batch may name) and `checkpoints`
/// saved ones (the scheduler's `state_checkpoints`).
pub fn kv_store(model: &dyn Model, slots: usize, requests: usize, checkpoints: usize) -> KvStore {
    let kv = KvStore::new(model.attention_needs().kv_layout, slots);
    match model.state_layout() {
        Some(l) => kv.with_states(l, requests, checkpoints),
        None => kv,
    }
}

/// A model the engine can run.
pub trait Model: Send {
    /// Static facts.
    fn info(&self) -> &ModelInfo;
    /// What the attention needs (checked once at start-up).
    fn attention_needs(&self) -> AttentionNeeds;
    /// Keeps the KV cache in `dtype` (SGLang's `--kv-cache-dtype`): [`Model::attention_needs`]
    /// reports it from then on.
    ///
    /// # Errors
    /// [`EngineError::Incompatible`] when the model's attention cannot read that type (the
    /// default: only the model's own).
    fn set_kv_dtype(&mut self, dtype: crate::kv::KvDtype) -> Result<(), EngineError> {
        let own = self.attention_needs().kv_layout.dtype;
        if dtype == own {
            return Ok(());
        }
        Err(EngineError::Incompatible(format!(
            "the {} model keeps its KV cache in {}; --kv-cache-dtype {} is not supported for it",
            self.info().architecture,
            own.name(),
            dtype.name()
        )))
    }
    /// The recurrent state a hybrid model keeps per request beside its KV pages (linear-
    /// attention layers: [`crate::kv::state`]); `None` for a model of attention layers only
    /// (the default). The engine sizes the state pool from it, one state per request slot,
    /// and refuses what a state cannot do yet, by capability, at start-up.
    fn state_layout(&self) -> Option<StateLayout> {
        None
    }
    /// Runs one step: writes the new tokens' KV into `kv` at `batch.out_cache_loc` and returns
    /// the logits of `batch.logits_rows`, `[logits_rows.len() × vocab_size]` row-major. After
    /// [`Model::set_embedding`] it returns embeddings instead: one row of `dim` values per entry
    /// of `logits_rows` (the scheduler asks one row, the last, of an embedding sequence's final
    /// chunk), pooled over the sequence as [`EmbeddingSpec::pooling`] says, not normalized.
    ///
    /// # Errors
    /// Only for conditions the model cannot recover from (the engine fails the batch's requests).
    fn forward(&mut self, batch: &ForwardBatch, kv: &mut KvStore) -> Result<Vec<f32>, EngineError>;
    /// True for a model that can only embed (an encoder with no LM head): the engine then
    /// serves embeddings whatever `--is-embedding` says.
    fn embedding_only(&self) -> bool {
        false
    }
    /// Switches [`Model::forward`] to embeddings (SGLang's `--is-embedding`), for good.
    ///
    /// # Errors
    /// [`EngineError::Incompatible`] for a model that cannot (the default).
    fn set_embedding(&mut self) -> Result<EmbeddingSpec, EngineError> {
        Err(EngineError::Incompatible(format!("the {} model cannot serve embeddings", self.info().architecture)))
    }
    /// The first MoE layer with the pool and ISA it runs on (what the start-up autotune
    /// times); `None` for a model without experts.
    fn first_moe(&self) -> Option<moe::MoeBench<'_>> {
        None
    }
    /// Chooses the MoE implementation per batch size (`--moe-runner-backend`, the autotune;
    /// both implementations give the same bits). A model without experts ignores it.
    fn set_moe(&mut self, _choice: moe::MoeChoice) {}
    /// The model's calibration observer and profile ([`Instruments`]); `None` for models that
    /// keep none (the scheduler's test doubles), which the methods below then ignore.
    fn instruments(&self) -> Option<&Instruments> {
        None
    }
    /// As [`Model::instruments`], to change them.
    fn instruments_mut(&mut self) -> Option<&mut Instruments> {
        None
    }
    /// Sets (or clears) the calibration observer: while set, every forward reports the input of
    /// each linear layer under its HF module name (see [`observer::Observer`]).
    fn set_observer(&mut self, observer: observer::ObserverSlot) {
        if let Some(i) = self.instruments_mut() {
            i.observer = observer;
        }
    }
    /// Removes the observer and returns it (`None` when none was kept).
    fn take_observer(&mut self) -> observer::ObserverSlot {
        self.instruments_mut().and_then(|i| i.observer.take())
    }
    /// Switches per-part timing of the forward passes on or off (off by default); switching it
    /// on clears the totals.
    fn set_profile(&mut self, on: bool) {
        if let Some(i) = self.instruments_mut() {
            i.profile = on;
            i.parts = PartTimes::default();
        }
    }
    /// Time spent per part since [`Model::set_profile`]`(true)` (all zero without one).
    fn part_times(&self) -> PartTimes {
        self.instruments().map_or_else(PartTimes::default, |i| i.parts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GLM-5-style model (MLA latent cache + sparse indexer keys) is refused by the CPU
    /// backend at start-up, by capability, with a message naming what is missing.
    #[test]
    fn incompatible_attention_is_refused_by_capability() {
        let mla = AttentionNeeds {
            kind: "mla+dsa",
            kv_layout: KvLayout {
                layers: 2,
                components: vec![
                    crate::kv::KvComponent { name: "latent", width: 512 + 64 },
                    crate::kv::KvComponent { name: "index_k", width: 128 },
                ],
                dtype: crate::kv::KvDtype::F16,
            },
            sliding_window: false,
        };
        let e = check_compat(&mla, &CPU_BACKEND).expect_err("cpu has no MLA");
        assert!(e.to_string().contains("mla+dsa") && e.to_string().contains("cpu"), "{e}");
        let gqa = AttentionNeeds { kind: "gqa", kv_layout: KvLayout::gqa(2, 3, 64), sliding_window: false };
        check_compat(&gqa, &CPU_BACKEND).expect("cpu runs GQA");
        let no_mixed = BackendCaps {
            name: "prefill-only",
            kinds: &["gqa"],
            mixed_batches: false,
            extend_with_prefix: true,
            sliding_window: true,
        };
        assert!(check_compat(&gqa, &no_mixed).is_err());
        // Gemma 3's windowed layers need a backend that reads only the window.
        let swa = AttentionNeeds { sliding_window: true, ..gqa };
        check_compat(&swa, &CPU_BACKEND).expect("cpu has sliding windows");
        let no_window = BackendCaps { name: "full-only", sliding_window: false, ..CPU_BACKEND };
        let e = check_compat(&swa, &no_window).expect_err("no windows");
        assert!(e.to_string().contains("sliding-window"), "{e}");
    }
}
