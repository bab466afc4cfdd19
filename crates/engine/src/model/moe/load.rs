//! A MoE layer's settings ([`MoeConfig`]: the file's expert keys under the family's fixed
//! rules) and the components that build themselves from a weight prefix: [`Mlp::load`] and
//! [`Moe::load`] (candle's `Qwen3MLP::new(cfg, vb.pp("mlp"))`), for every family and both file
//! formats.

use super::{Glu, Mlp, Moe};
use crate::model::hparams::HParams;
use crate::model::linear::Linear;
use crate::model::routing::{Routing, Scoring};
use crate::model::vb::Vb;
use crate::EngineError;

/// What a MoE family's llama.cpp graph fixes and what it reads from the file
/// (`build_moe_ffn`'s `norm_w` and `gating_op` arguments in `src/models/{qwen3moe,glm4-moe}.cpp`).
#[derive(Debug, Clone, Copy)]
pub struct MoeFamily {
    /// The scoring the graph uses; `None`: the file's (`expert_gating_func` 1 softmax, 2
    /// sigmoid, 3 softmax over the chosen; `scoring_func`), else `default_scoring`.
    pub scoring: Option<Scoring>,
    /// The scoring of a file that states none.
    pub default_scoring: Scoring,
    /// Whether the chosen weights are renormalized; `None`: the file's (false when absent).
    pub norm_topk_prob: Option<bool>,
    /// Whether `expert_weights_scale` applies (`routed_scaling_factor`).
    pub scaled: bool,
    /// The experts' activation.
    pub act: Glu,
}

impl MoeFamily {
    /// Softmax-or-file scoring, the file's renormalization, unscaled SwiGLU experts.
    pub const BASE: MoeFamily = MoeFamily {
        scoring: None,
        default_scoring: Scoring::Sigmoid,
        norm_topk_prob: None,
        scaled: false,
        act: Glu::Silu,
    };
}

/// A MoE family's feed-forward, from the file's expert keys (llama.cpp's `LLM_KV_EXPERT_*`)
/// under the family's rules.
#[derive(Debug, Clone)]
pub struct MoeConfig {
    /// Routed experts (`expert_count`).
    pub n_expert: usize,
    /// Each routed expert's inner width (`expert_feed_forward_length`).
    pub expert_ffn: usize,
    /// Shared experts' inner width together (`expert_shared_count ×
    /// expert_shared_feed_forward_length`, or × `expert_feed_forward_length`); 0 for none.
    pub shared_ffn: usize,
    /// Leading layers with the dense MLP (`leading_dense_block_count`).
    pub first_dense: usize,
    /// Per layer whether it is dense, where the file lists it (Qwen3-MoE's `mlp_only_layers`);
    /// else the first [`MoeConfig::first_dense`] are.
    pub dense_layers: Option<Vec<bool>>,
    /// How the router's logits choose and weigh experts.
    pub routing: Routing,
    /// The experts' (and shared experts') activation.
    pub act: Glu,
}

impl MoeConfig {
    /// The settings of `hp`'s experts read as llama.cpp reads them for a family `fam`
    /// (`llama_model::load_hparams`).
    ///
    /// # Errors
    /// A missing expert count, experts per token or expert width, named with the key.
    pub fn from_hparams(hp: &HParams, fam: &MoeFamily) -> Result<MoeConfig, EngineError> {
        let m = hp.need_moe()?;
        let why = "a MoE architecture";
        let expert_ffn = hp.need(m.expert_ffn, "expert_feed_forward_length", why)?;
        let n_group = m.n_group.unwrap_or(1).max(1);
        Ok(MoeConfig {
            act: fam.act,
            n_expert: m.n_expert,
            expert_ffn,
            shared_ffn: m.shared_count * m.shared_ffn.unwrap_or(expert_ffn),
            first_dense: m.first_dense,
            dense_layers: m.dense_layers.clone(),
            routing: Routing {
                scoring: fam.scoring.or(m.scoring).unwrap_or(fam.default_scoring),
                top_k: hp.need(m.top_k, "expert_used_count", why)?,
                norm_topk_prob: fam.norm_topk_prob.unwrap_or(m.weights_norm.unwrap_or(false)),
                // llama.cpp scales by neither 0 (the key's default) nor 1.
                scaling: match m.weights_scale {
                    Some(s) if fam.scaled && s != 0.0 => s,
                    _ => 1.0,
                },
                n_group,
                topk_group: m.topk_group.unwrap_or(n_group),
            },
        })
    }

    /// Whether layer `l` has the dense MLP rather than experts.
    pub fn is_dense(&self, l: usize) -> bool {
        match &self.dense_layers {
            Some(d) => d.get(l).copied().unwrap_or(false),
            None => l < self.first_dense,
        }
    }

    /// Whether any layer has the dense MLP.
    pub fn any_dense(&self) -> bool {
        self.dense_layers.as_ref().map_or(self.first_dense > 0, |d| d.contains(&true))
    }

    /// Rejects counts the router cannot run.
    ///
    /// # Errors
    /// Naming every count.
    pub fn check(&self) -> Result<(), EngineError> {
        let r = &self.routing;
        if self.n_expert == 0
            || r.top_k == 0
            || r.top_k > self.n_expert
            || self.expert_ffn == 0
            || !self.n_expert.is_multiple_of(r.n_group)
            || r.topk_group == 0
            || r.topk_group > r.n_group
        {
            return Err(EngineError::model(format!(
                "inconsistent experts: expert_count {}, expert_used_count {}, expert_feed_forward_length {}, \
                 {} groups of which {} used",
                self.n_expert, r.top_k, self.expert_ffn, r.n_group, r.topk_group
            )));
        }
        Ok(())
    }
}

/// The packed projections a checkpoint may store as one tensor, and the parts they fuse, in
/// row order (nano-vllm's `packed_modules_mapping`): Phi-3's `qkv_proj` and `gate_up_proj`
/// (GGUF `attn_qkv`, `ffn_up` of twice the width).
pub const PACKED_MODULES: &[(&str, &[&str])] =
    &[("qkv_proj", &["q_proj", "k_proj", "v_proj"]), ("gate_up_proj", &["gate_proj", "up_proj"])];

impl Vb<'_> {
    /// The projections `parts` (`(module, rows)`, each `[rows × cols]`) as one stacked
    /// [`Linear`]: the packed tensor that holds them when the file has one
    /// ([`PACKED_MODULES`]), else the parts, each with its bias when the file has one.
    ///
    /// # Errors
    /// As [`Vb::linear`].
    pub fn packed(&self, parts: &[(&str, usize)], cols: usize) -> Result<Linear, EngineError> {
        let names: Vec<&str> = parts.iter().map(|(n, _)| *n).collect();
        let packed = PACKED_MODULES.iter().find(|(_, p)| *p == names.as_slice()).map(|(n, _)| *n);
        match packed.filter(|n| self.has(&format!("{n}.weight"))) {
            Some(n) => self.linear(n, parts.iter().map(|(_, r)| r).sum(), cols),
            None => Ok(Linear::stack(parts.iter().map(|(n, r)| self.linear(n, *r, cols)).collect::<Result<_, _>>()?)),
        }
    }
}

impl Mlp {
    /// The gated MLP under `vb` (`…mlp`): `gate_proj` and `up_proj` stacked (or the packed
    /// `gate_up_proj`), `down_proj`, `inter` wide, activation `act` (only `up_proj` when `act`
    /// is not gated).
    ///
    /// # Errors
    /// A missing tensor or one of another shape, named.
    pub fn load(vb: &Vb<'_>, hidden: usize, inter: usize, act: Glu) -> Result<Mlp, EngineError> {
        let gate_up = match act.gated() {
            true => vb.packed(&[("gate_proj", inter), ("up_proj", inter)], hidden)?,
            false => vb.linear("up_proj", inter, hidden)?,
        };
        Ok(Mlp { gate_up, down: vb.linear("down_proj", hidden, inter)?, inter, act })
    }
}

impl Moe {
    /// A MoE layer's feed-forward under `mlp` (`model.layers.L.mlp`): the router `gate` (with
    /// its bias when the file has one), its selection bias when the file has one, the routed
    /// experts (gate and up stacked per expert, up alone when the activation is not gated,
    /// biases where the file has them) and the shared experts.
    ///
    /// # Errors
    /// A missing tensor or one of another shape, named.
    pub fn load(mlp: &Vb<'_>, hidden: usize, m: &MoeConfig) -> Result<Moe, EngineError> {
        let (n, inter) = (m.n_expert, m.expert_ffn);
        let ex = mlp.pp("experts");
        // Each projection's experts, with their biases when the file has them (gpt-oss: one
        // `[rows, n_expert]` tensor per projection, expert `e`'s rows at `e · rows`).
        let proj = |name: &str, rows: usize, cols: usize| -> Result<Vec<Linear>, EngineError> {
            let mut ls = ex.experts(name, n, rows, cols)?;
            let b = format!("{name}.bias");
            if ex.has(&b) {
                let all = ex.vector(&b, n * rows)?;
                for (l, b) in ls.iter_mut().zip(all.chunks_exact(rows)) {
                    l.bias = Some(b.to_vec());
                }
            }
            Ok(ls)
        };
        // Ungated experts (Nemotron-H MoE's ReLU²) have no `gate_proj`.
        let gates = match m.act.gated() {
            true => proj("gate_proj", inter, hidden)?.into_iter().map(Some).collect(),
            false => vec![None; n],
        };
        let ups = proj("up_proj", inter, hidden)?;
        let downs = proj("down_proj", hidden, inter)?;
        let experts = gates
            .into_iter()
            .zip(ups)
            .zip(downs)
            .map(|((g, u), down)| {
                let gate_up = match g {
                    Some(g) => Linear::stack(vec![g, u]),
                    None => u,
                };
                Mlp { gate_up, down, inter, act: m.act }
            })
            .collect();
        let shared = match m.shared_ffn {
            0 => None,
            si => Some(Mlp::load(&mlp.pp("shared_experts"), hidden, si, m.act)?),
        };
        let opt = |name: &str| -> Result<Option<Vec<f32>>, EngineError> {
            match mlp.has(name) {
                true => Ok(Some(mlp.vector(name, n)?)),
                false => Ok(None),
            }
        };
        Ok(Moe {
            gate: mlp.dense("gate", n, hidden)?,
            gate_bias: opt("gate.bias")?,
            bias: opt("gate.e_score_correction_bias")?,
            routing: m.routing,
            experts,
            shared,
            shared_gate: match mlp.has("shared_expert_gate.weight") {
                true => Some(mlp.vector("shared_expert_gate.weight", hidden)?),
                false => None,
            },
        })
    }
}
