//! GLM-5's hyper-parameters: `config.json` deserialized as HF transformers'
//! `GlmMoeDsaConfig` (`models/glm_moe_dsa/configuration_glm_moe_dsa.py`) reads it, with its
//! defaults, then checked and turned into the per-layer facts the model needs.

use serde::Deserialize;
use serde_json::Value;

use crate::model::routing::Scoring;
use crate::EngineError;

/// Hyper-parameters from `config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct Glm5Config {
    /// Hidden size.
    pub hidden: usize,
    /// Decoder layers (MTP layers beyond these are ignored).
    pub layers: usize,
    /// Attention heads.
    pub heads: usize,
    /// Query LoRA rank; 0: no q LoRA, the queries are one projection of the hidden state
    /// (DeepSeek-V2-Lite). The indexer reads the normalized `qr`, so it needs one.
    pub q_lora_rank: usize,
    /// Latent (compressed KV) width.
    pub kv_lora_rank: usize,
    /// Per-head non-rotary query/key width.
    pub qk_nope: usize,
    /// Rotary width (shared `k_pe`).
    pub qk_rope: usize,
    /// Per-head value width.
    pub v_dim: usize,
    /// Routed experts.
    pub n_routed: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Shared experts (their MLP is `n_shared · moe_inter` wide).
    pub n_shared: usize,
    /// Routed expert MLP width.
    pub moe_inter: usize,
    /// Dense MLP width.
    pub inter: usize,
    /// Layers before this one are dense (`first_k_dense_replace`).
    pub first_k_dense: usize,
    /// Per layer: dense MLP (else MoE); from `mlp_layer_types` or `first_k_dense`.
    pub mlp_dense: Vec<bool>,
    /// Router scores: sigmoid (GLM-5, DeepSeek-V3) or softmax (DeepSeek-V2).
    pub scoring: Scoring,
    /// Multiplies the routed experts' weights (once).
    pub routed_scaling: f32,
    /// Expert groups.
    pub n_group: usize,
    /// Groups kept per token.
    pub topk_group: usize,
    /// Normalize the chosen weights to sum 1.
    pub norm_topk_prob: bool,
    /// Indexer heads.
    pub idx_heads: usize,
    /// Indexer head width.
    pub idx_dim: usize,
    /// Positions each query attends to.
    pub idx_topk: usize,
    /// Per layer: `true` when the layer runs its own indexer, `false` when it reuses the
    /// selection of the previous `full` layer.
    pub indexer_full: Vec<bool>,
    /// RoPE base.
    pub rope_theta: f64,
    /// Multiplies every attention score: `(nope + rope)^-½`, times YaRN's `mscale²` in a
    /// DeepSeek file with RoPE scaling (DeepSeek-V2 §2.1 with YaRN; llama.cpp's `kq_scale`).
    pub softmax_scale: f32,
    /// RMSNorm ε of `q_a_layernorm` and `kv_a_layernorm`: 1e-6 in HF's GLM-5 (built without
    /// `rms_norm_eps`), the file's `layer_norm_rms_epsilon` in a GGUF, as llama.cpp uses it.
    pub lora_eps: f32,
    /// RMSNorm ε of the layer norms and the final norm (the LoRA norms use [`Self::lora_eps`]).
    pub rms_eps: f32,
    /// Vocabulary size.
    pub vocab: usize,
    /// Longest position.
    pub max_positions: usize,
    /// lm_head shares the embedding.
    pub tie_word_embeddings: bool,
}

/// `GlmMoeDsaConfig`'s defaults (transformers 5), which are GLM-5's own values: a config that
/// omits a key means what it means to HF. `rope_theta` is `RotaryEmbeddingConfigMixin`'s
/// `default_theta`; `index_topk_freq` and `index_skip_topk_offset` are what `__post_init__`
/// reads from the extra kwargs when absent.
mod hf {
    macro_rules! defaults {
        ($($name:ident: $t:ty = $v:expr;)*) => { $(pub fn $name() -> $t { $v })* };
    }
    defaults! {
        vocab_size: usize = 154880;
        hidden_size: usize = 6144;
        intermediate_size: usize = 12288;
        moe_intermediate_size: usize = 2048;
        num_hidden_layers: usize = 78;
        num_attention_heads: usize = 64;
        n_shared_experts: usize = 1;
        n_routed_experts: usize = 256;
        routed_scaling_factor: f64 = 2.5;
        kv_lora_rank: usize = 512;
        q_lora_rank: Option<usize> = Some(2048);
        qk_rope_head_dim: usize = 64;
        v_head_dim: usize = 256;
        qk_nope_head_dim: usize = 192;
        n_group: usize = 1;
        topk_group: usize = 1;
        num_experts_per_tok: usize = 8;
        norm_topk_prob: bool = true;
        hidden_act: String = "silu".into();
        max_position_embeddings: usize = 202752;
        rms_norm_eps: f64 = 1e-5;
        rope_theta: f64 = 10000.0;
        index_topk: usize = 2048;
        index_head_dim: usize = 128;
        index_n_heads: usize = 32;
        first_k_dense_replace: usize = 3;
        index_topk_freq: usize = 1;
        index_skip_topk_offset: usize = 2;
    }
}

/// The keys of `config.json` the model reads, as HF names them. Unknown keys are ignored, as HF
/// keeps them as attributes nobody reads.
#[derive(Debug, Deserialize)]
struct HfConfig {
    #[serde(default)]
    model_type: String,
    #[serde(default = "hf::vocab_size")]
    vocab_size: usize,
    #[serde(default = "hf::hidden_size")]
    hidden_size: usize,
    #[serde(default = "hf::intermediate_size")]
    intermediate_size: usize,
    #[serde(default = "hf::moe_intermediate_size")]
    moe_intermediate_size: usize,
    #[serde(default = "hf::num_hidden_layers")]
    num_hidden_layers: usize,
    #[serde(default = "hf::num_attention_heads")]
    num_attention_heads: usize,
    #[serde(default = "hf::n_shared_experts")]
    n_shared_experts: usize,
    #[serde(default = "hf::n_routed_experts")]
    n_routed_experts: usize,
    #[serde(default = "hf::routed_scaling_factor")]
    routed_scaling_factor: f64,
    #[serde(default = "hf::kv_lora_rank")]
    kv_lora_rank: usize,
    /// `None` only for an explicit null (no q LoRA), which the indexer cannot run without.
    #[serde(default = "hf::q_lora_rank")]
    q_lora_rank: Option<usize>,
    #[serde(default = "hf::qk_rope_head_dim")]
    qk_rope_head_dim: usize,
    #[serde(default = "hf::v_head_dim")]
    v_head_dim: usize,
    #[serde(default = "hf::qk_nope_head_dim")]
    qk_nope_head_dim: usize,
    #[serde(default = "hf::n_group")]
    n_group: usize,
    #[serde(default = "hf::topk_group")]
    topk_group: usize,
    #[serde(default = "hf::num_experts_per_tok")]
    num_experts_per_tok: usize,
    #[serde(default = "hf::norm_topk_prob")]
    norm_topk_prob: bool,
    #[serde(default = "hf::hidden_act")]
    hidden_act: String,
    /// Not `GlmMoeDsaConfig` fields (its modeling hard-codes sigmoid routing with
    /// `noaux_tc`), but DeepSeek-style configs carry them; refused when they say otherwise.
    scoring_func: Option<String>,
    topk_method: Option<String>,
    #[serde(default = "hf::max_position_embeddings")]
    max_position_embeddings: usize,
    #[serde(default = "hf::rms_norm_eps")]
    rms_norm_eps: f64,
    #[serde(default)]
    tie_word_embeddings: bool,
    /// transformers ≥ 5.
    rope_parameters: Option<RopeParameters>,
    /// The older spelling of `rope_parameters`' type.
    rope_scaling: Option<RopeScaling>,
    /// The older flat field, used when `rope_parameters` has none.
    #[serde(default = "hf::rope_theta")]
    rope_theta: f64,
    #[serde(default)]
    attention_bias: bool,
    mlp_layer_types: Option<Vec<String>>,
    #[serde(default = "hf::index_topk")]
    index_topk: usize,
    #[serde(default = "hf::index_head_dim")]
    index_head_dim: usize,
    #[serde(default = "hf::index_n_heads")]
    index_n_heads: usize,
    #[serde(default = "hf::first_k_dense_replace")]
    first_k_dense_replace: usize,
    indexer_types: Option<Vec<String>>,
    index_topk_pattern: Option<TopkPattern>,
    #[serde(default = "hf::index_topk_freq")]
    index_topk_freq: usize,
    #[serde(default = "hf::index_skip_topk_offset")]
    index_skip_topk_offset: usize,
}

#[derive(Debug, Deserialize)]
struct RopeParameters {
    rope_type: Option<String>,
    rope_theta: Option<f64>,
}

#[derive(Debug, Deserialize)]
struct RopeScaling {
    #[serde(rename = "type")]
    kind: Option<String>,
    rope_type: Option<String>,
}

/// `index_topk_pattern`: `"FSSF…"` or a list of `"F"`/`"S"` (or `"full"`/`"shared"`).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum TopkPattern {
    Chars(String),
    List(Vec<String>),
}

impl Glm5Config {
    /// Parses a `glm_moe_dsa` `config.json`.
    ///
    /// # Errors
    /// Another architecture, a value of the wrong type (named), or a feature we do not
    /// implement (named).
    pub fn from_json(v: &Value) -> Result<Self, EngineError> {
        // A null means what a missing key means (HF's default), except for q_lora_rank, where
        // null says "no q LoRA".
        let mut obj = v.as_object().cloned().unwrap_or_default();
        obj.retain(|k, x| !x.is_null() || k == "q_lora_rank");
        let v = Value::Object(obj);
        let raw = HfConfig::deserialize(&v).map_err(|e| type_error(&v, &e))?;
        Self::from_hf(&raw)
    }

    /// Checks what the model cannot run and derives the per-layer facts.
    fn from_hf(r: &HfConfig) -> Result<Self, EngineError> {
        if r.model_type != "glm_moe_dsa" {
            return Err(EngineError::model(format!(
                "config.json model_type {:?}: the GLM-5 loader reads glm_moe_dsa",
                r.model_type
            )));
        }
        let layers = r.num_hidden_layers;
        let q_lora_rank = r
            .q_lora_rank
            .ok_or_else(|| EngineError::model("config.json: q_lora_rank is null; the DSA indexer needs the q LoRA"))?;
        let rp = r.rope_parameters.as_ref();
        let rope_type = rp
            .and_then(|p| p.rope_type.as_deref())
            .or_else(|| r.rope_scaling.as_ref().and_then(|s| s.kind.as_deref().or(s.rope_type.as_deref())))
            .unwrap_or("default");
        if rope_type != "default" {
            return Err(EngineError::model(format!("RoPE scaling {rope_type:?} is not supported (default RoPE is)")));
        }
        if r.attention_bias {
            return Err(EngineError::model("config.json: attention_bias = true is not supported"));
        }
        for (k, x, want) in [
            ("hidden_act", Some(&r.hidden_act), "silu"),
            ("scoring_func", r.scoring_func.as_ref(), "sigmoid"),
            ("topk_method", r.topk_method.as_ref(), "noaux_tc"),
        ] {
            if let Some(x) = x.filter(|x| *x != want) {
                return Err(EngineError::model(format!("config.json: {k} {x:?} is not supported ({want:?} is)")));
            }
        }
        let c = Glm5Config {
            hidden: r.hidden_size,
            layers,
            heads: r.num_attention_heads,
            q_lora_rank,
            kv_lora_rank: r.kv_lora_rank,
            qk_nope: r.qk_nope_head_dim,
            qk_rope: r.qk_rope_head_dim,
            v_dim: r.v_head_dim,
            n_routed: r.n_routed_experts,
            top_k: r.num_experts_per_tok,
            n_shared: r.n_shared_experts,
            moe_inter: r.moe_intermediate_size,
            inter: r.intermediate_size,
            first_k_dense: r.first_k_dense_replace,
            indexer_full: indexer_types(r, layers)?,
            mlp_dense: mlp_dense(r, layers)?,
            scoring: Scoring::Sigmoid,
            routed_scaling: r.routed_scaling_factor as f32,
            n_group: r.n_group,
            topk_group: r.topk_group,
            norm_topk_prob: r.norm_topk_prob,
            idx_heads: r.index_n_heads,
            idx_dim: r.index_head_dim,
            idx_topk: r.index_topk,
            rope_theta: rp.and_then(|p| p.rope_theta).unwrap_or(r.rope_theta),
            softmax_scale: 1.0 / ((r.qk_nope_head_dim + r.qk_rope_head_dim) as f32).sqrt(),
            lora_eps: super::LORA_NORM_EPS,
            rms_eps: r.rms_norm_eps as f32,
            vocab: r.vocab_size,
            max_positions: r.max_position_embeddings,
            tie_word_embeddings: r.tie_word_embeddings,
        };
        c.check_from("config.json")?;
        Ok(c)
    }

    /// Checks the shapes and choices the model relies on; `src` names where they came from in
    /// an error (`config.json`, or a GGUF file's architecture).
    pub(super) fn check_from(&self, src: &str) -> Result<(), EngineError> {
        let bad = |m: String| Err(EngineError::model(format!("{src}: {m}")));
        if self.n_group == 0
            || !self.n_routed.is_multiple_of(self.n_group)
            || self.topk_group > self.n_group
            || self.topk_group == 0
        {
            return bad(format!(
                "{} experts in {} groups, top {} groups",
                self.n_routed, self.n_group, self.topk_group
            ));
        }
        if self.top_k == 0 || self.top_k > self.topk_group * (self.n_routed / self.n_group) {
            return bad(format!("num_experts_per_tok {} exceeds the experts of the kept groups", self.top_k));
        }
        if self.n_routed / self.n_group < 2 && self.n_group > 1 {
            return bad("group scores need at least 2 experts per group".into());
        }
        if self.layers == 0 || self.hidden == 0 || self.heads == 0 || self.vocab == 0 || self.max_positions == 0 {
            return bad("num_hidden_layers, hidden_size, num_attention_heads, vocab_size and max_position_embeddings must be positive".into());
        }
        if self.qk_rope == 0 || !self.qk_rope.is_multiple_of(2) {
            return bad(format!("qk_rope_head_dim {} must be even and positive", self.qk_rope));
        }
        if self.mlp_dense.len() != self.layers || self.indexer_full.len() != self.layers {
            return bad(format!(
                "per-layer lists of {} and {} for {} layers",
                self.mlp_dense.len(),
                self.indexer_full.len(),
                self.layers
            ));
        }
        if !self.has_indexer() {
            return Ok(());
        }
        if self.qk_rope > self.idx_dim {
            return bad(format!("qk_rope_head_dim {} exceeds index_head_dim {}", self.qk_rope, self.idx_dim));
        }
        if self.q_lora_rank == 0 {
            return bad("the DSA indexer needs the q LoRA (q_lora_rank > 0)".into());
        }
        if self.idx_topk == 0 || self.idx_heads == 0 {
            return bad(format!("index_topk {} and index_n_heads {} must be positive", self.idx_topk, self.idx_heads));
        }
        if self.indexer_full.first() == Some(&false) {
            return bad("the first layer's indexer is \"shared\" but no earlier layer computes a selection".into());
        }
        Ok(())
    }

    /// Whether any layer runs the DSA indexer (GLM-5); DeepSeek-V2/V3 files have none, and
    /// every query attends to its whole context.
    pub fn has_indexer(&self) -> bool {
        self.indexer_full.iter().any(|&f| f)
    }
}

/// serde_json names no key in a type error; every field has a default, so deserializing each
/// key on its own finds the one that does not fit.
fn type_error(v: &Value, e: &serde_json::Error) -> EngineError {
    let alone = |k: &String, x: &Value| Value::Object([(k.clone(), x.clone())].into_iter().collect());
    match v.as_object().into_iter().flatten().find(|(k, x)| HfConfig::deserialize(&alone(k, x)).is_err()) {
        Some((k, x)) => EngineError::model(format!("config.json: {k} is {x}: {e}")),
        None => EngineError::model(format!("config.json: {e}")),
    }
}

/// Per layer: whether the layer's indexer is `full` (HF `GlmMoeDsaConfig.__post_init__`): an
/// explicit `indexer_types` list (`"full"`/`"shared"`) wins; else `index_topk_pattern` (`F`/`S`
/// characters or a list of them); else layer `i` is full iff
/// `max(i − offset + 1, 0) mod freq == 0` with `freq = index_topk_freq` (default 1) and
/// `offset = index_skip_topk_offset` (default 2), so by default every layer is full.
fn indexer_types(r: &HfConfig, layers: usize) -> Result<Vec<bool>, EngineError> {
    let parse_list = |list: &[String], what: &str| -> Result<Vec<bool>, EngineError> {
        if list.len() < layers {
            return Err(EngineError::model(format!(
                "config.json: {what} has {} entries for {layers} layers",
                list.len()
            )));
        }
        list[..layers]
            .iter()
            .map(|t| match t.as_str() {
                "full" | "F" => Ok(true),
                "shared" | "S" => Ok(false),
                _ => Err(EngineError::model(format!(
                    "config.json: {what} entry {t:?} (want \"full\"/\"F\" or \"shared\"/\"S\")"
                ))),
            })
            .collect()
    };
    if let Some(list) = &r.indexer_types {
        return parse_list(list, "indexer_types");
    }
    match &r.index_topk_pattern {
        Some(TopkPattern::List(list)) => return parse_list(list, "index_topk_pattern"),
        Some(TopkPattern::Chars(s)) => {
            let list: Vec<String> = s.chars().map(String::from).collect();
            return parse_list(&list, "index_topk_pattern");
        }
        None => {}
    }
    let freq = r.index_topk_freq.max(1) as i64;
    let off = r.index_skip_topk_offset as i64;
    Ok((0..layers as i64).map(|i| (i - off + 1).max(0) % freq == 0).collect())
}

/// Per layer: whether its MLP is dense. `mlp_layer_types` (`"dense"`/`"sparse"`) wins over
/// `first_k_dense_replace`.
fn mlp_dense(r: &HfConfig, layers: usize) -> Result<Vec<bool>, EngineError> {
    match &r.mlp_layer_types {
        Some(list) if list.len() >= layers => list[..layers]
            .iter()
            .map(|t| match t.as_str() {
                "dense" => Ok(true),
                "sparse" => Ok(false),
                _ => Err(EngineError::model(format!(
                    "config.json: mlp_layer_types entry {t:?} (want \"dense\" or \"sparse\")"
                ))),
            })
            .collect(),
        Some(list) => Err(EngineError::model(format!(
            "config.json: mlp_layer_types has {} entries for {layers} layers",
            list.len()
        ))),
        None => Ok((0..layers).map(|l| l < r.first_k_dense_replace).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(v: Value) -> HfConfig {
        HfConfig::deserialize(&v).expect("deserializes")
    }

    /// A config that omits a key means HF's default (GLM-5's values), not zero.
    #[test]
    fn missing_keys_take_hf_defaults() {
        let c = Glm5Config::from_json(&serde_json::json!({"model_type": "glm_moe_dsa"})).expect("defaults parse");
        assert_eq!((c.layers, c.hidden, c.n_routed, c.top_k, c.n_shared, c.first_k_dense), (78, 6144, 256, 8, 1, 3));
        assert_eq!((c.routed_scaling, c.rms_eps, c.idx_topk, c.max_positions), (2.5, 1e-5, 2048, 202752));
        assert_eq!((c.rope_theta, c.vocab, c.n_group, c.topk_group, c.q_lora_rank), (10000.0, 154880, 1, 1, 2048));
        assert!(c.indexer_full.iter().all(|&f| f) && c.mlp_dense[..3].iter().all(|&d| d) && !c.mlp_dense[3]);
        // A null is a missing key, except q_lora_rank's, which says there is no q LoRA.
        let c = Glm5Config::from_json(&serde_json::json!({"model_type": "glm_moe_dsa", "hidden_size": null}))
            .expect("null is the default");
        assert_eq!(c.hidden, 6144);
        let e = Glm5Config::from_json(&serde_json::json!({"model_type": "glm_moe_dsa", "q_lora_rank": null}))
            .expect_err("no q LoRA")
            .to_string();
        assert!(e.contains("q_lora_rank"), "{e}");
        let e =
            Glm5Config::from_json(&serde_json::json!({"model_type": "glm_moe_dsa", "q_lora_rank": 8, "index_topk": 0}))
                .expect_err("index_topk 0")
                .to_string();
        assert!(e.contains("index_topk"), "{e}");
    }

    /// A value of the wrong type is refused under its key's name.
    #[test]
    fn type_errors_name_the_key() {
        for (k, x) in [("hidden_size", serde_json::json!(1.5)), ("norm_topk_prob", serde_json::json!("yes"))] {
            let mut v = serde_json::json!({"model_type": "glm_moe_dsa"});
            v[k] = x;
            let e = Glm5Config::from_json(&v).expect_err("wrong type").to_string();
            assert!(e.contains(&format!("config.json: {k} is")), "{e}");
        }
        let e = Glm5Config::from_json(&serde_json::json!({"model_type": "llama"})).expect_err("llama").to_string();
        assert!(e.contains("glm_moe_dsa"), "{e}");
    }

    #[test]
    fn indexer_type_forms() {
        let v = serde_json::json!({"indexer_types": ["full", "shared", "full"]});
        assert_eq!(indexer_types(&raw(v), 3).expect("list"), vec![true, false, true]);
        // HF's docstring example: freq 4, offset 2, 12 layers → F F S S S F S S S F S S.
        let v = serde_json::json!({"index_topk_freq": 4, "index_skip_topk_offset": 2});
        let want: Vec<bool> = "FFSSSFSSSFSS".chars().map(|c| c == 'F').collect();
        assert_eq!(indexer_types(&raw(v), 12).expect("freq"), want);
        assert_eq!(indexer_types(&raw(serde_json::json!({})), 3).expect("default"), vec![true; 3]);
        let v = serde_json::json!({"index_topk_pattern": "FSSF"});
        assert_eq!(indexer_types(&raw(v), 4).expect("pattern"), vec![true, false, false, true]);
        let v = serde_json::json!({"index_topk_pattern": ["F", "shared"]});
        assert_eq!(indexer_types(&raw(v), 2).expect("pattern list"), vec![true, false]);
        assert!(indexer_types(&raw(serde_json::json!({"indexer_types": ["full", "half"]})), 2).is_err());
    }
}
