//! DeepSeek sparse attention's "lightning indexer" (DeepSeek-V3.2 tech report §2; HF
//! transformers `modeling_glm_moe_dsa.py`, `GlmMoeDsaIndexer`; SGLang's `nsa` backend): it
//! scores every cached token for each query and attention reads only the top-k.
//!
//! On layers whose indexer type is `full`: `q_I = RoPE(wq_b(qr))` per indexer head,
//! `k_I = RoPE(LayerNorm(wk(h)))` (one head, cached as component `index_k`),
//! `w = weights_proj(h) · n_heads^-½`; `I(t, j) = Σ_h w_h · ReLU(q_I,h · k_I,j) · d^-½`. The
//! query attends to the `index_topk` positions with the highest `I` among `0..=pos`; when
//! `pos + 1 ≤ index_topk` every position is selected and the scores are not computed. A
//! `shared` layer reuses the selection of the nearest `full` layer before it.

use sparrow_cpu::{kernels, Weight};

use super::{Step, Work, LORA_NORM_EPS, ROPE_LAYOUT};
use crate::kv::KvStore;

/// Per row: the positions it attends to (ascending), or `None` for its whole context.
pub(super) type Selection = Vec<Option<Vec<u32>>>;

/// One layer's indexer weights.
pub(super) struct Indexer {
    pub(super) wq_b: Weight,
    pub(super) wk: Weight,
    pub(super) k_norm_w: Vec<f32>,
    pub(super) k_norm_b: Vec<f32>,
    pub(super) weights_proj: Weight,
}

impl Indexer {
    /// Writes the step's index keys to layer `l` of the cache and returns each row's selection.
    /// `h` is the layer's normalized input, `qr` the normalized query LoRA (both
    /// `[tokens × …]`).
    pub(super) fn select(
        &self,
        s: &Step<'_>,
        l: usize,
        h: &[f32],
        qr: &[f32],
        kv: &mut KvStore,
        w: &mut Work,
    ) -> Selection {
        let (c, batch, isa) = (s.cfg, s.batch, s.isa);
        let t_n = batch.num_tokens();
        let (di, ni) = (c.idx_dim, c.idx_heads);
        let mut ki = vec![0f32; t_n * di];
        kernels::matmul(s.pool, isa, &self.wk, h, t_n, &mut w.xq, &mut ki);
        for t in 0..t_n {
            let pos = batch.positions[t] as usize;
            let k = &mut ki[t * di..(t + 1) * di];
            layer_norm(k, &self.k_norm_w, &self.k_norm_b, LORA_NORM_EPS);
            s.rope.rotate(&mut k[..c.qk_rope], pos, ROPE_LAYOUT);
        }
        {
            let cache = kv.component_mut(l, 1);
            for t in 0..t_n {
                let slot = batch.out_cache_loc[t] as usize;
                cache[slot * di..(slot + 1) * di].copy_from_slice(&ki[t * di..(t + 1) * di]);
            }
        }
        // Only queries whose context exceeds top-k need scores.
        let need: Vec<usize> = (0..t_n).filter(|&t| batch.positions[t] as usize + 1 > c.idx_topk).collect();
        let mut sel: Selection = vec![None; t_n];
        if !need.is_empty() {
            let mut qi = vec![0f32; t_n * ni * di];
            kernels::matmul(s.pool, isa, &self.wq_b, qr, t_n, &mut w.xq, &mut qi);
            let mut wts = vec![0f32; t_n * ni];
            kernels::matmul(s.pool, isa, &self.weights_proj, h, t_n, &mut w.xq, &mut wts);
            let wscale = 1.0 / (ni as f32).sqrt();
            let kscale = 1.0 / (di as f32).sqrt();
            for t in &need {
                let pos = batch.positions[*t] as usize;
                for hd in 0..ni {
                    let v = &mut qi[(t * ni + hd) * di..(t * ni + hd + 1) * di];
                    s.rope.rotate(&mut v[..c.qk_rope], pos, ROPE_LAYOUT);
                }
            }
            let kc = kv.component(l, 1);
            let results: Vec<std::sync::Mutex<Option<Vec<u32>>>> =
                need.iter().map(|_| std::sync::Mutex::new(None)).collect();
            let (qi, wts, row_seq) = (&qi, &wts, &s.row_seq);
            s.pool.run(need.len(), |n| {
                let t = need[n];
                let pos = batch.positions[t] as usize;
                let slots = &batch.kv_slots(row_seq[t] as usize)[..=pos];
                let mut scores = vec![0f32; slots.len()];
                for (j, &slot) in slots.iter().enumerate() {
                    let kr = &kc[slot as usize * di..(slot as usize + 1) * di];
                    let mut acc = 0f32;
                    for hd in 0..ni {
                        let d = kernels::dot(isa, &qi[(t * ni + hd) * di..(t * ni + hd + 1) * di], kr);
                        acc += wts[t * ni + hd] * wscale * d.max(0.0);
                    }
                    scores[j] = acc * kscale;
                }
                let top = top_k_positions(&scores, c.idx_topk);
                if let Ok(mut r) = results[n].lock() {
                    *r = Some(top);
                }
            });
            for (n, r) in results.into_iter().enumerate() {
                sel[need[n]] = r.into_inner().ok().flatten();
            }
            w.stats.indexer_keys += need.iter().map(|&t| batch.positions[t] as u64 + 1).sum::<u64>();
        }
        w.stats.queries_sparse += need.len() as u64;
        w.stats.queries_dense += (t_n - need.len()) as u64;
        sel
    }
}

/// LayerNorm with bias (`torch.nn.LayerNorm`): `(x − mean)/sqrt(var + eps) · w + b`.
fn layer_norm(x: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    let n = x.len() as f32;
    let mean = x.iter().sum::<f32>() / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
    let inv = 1.0 / (var + eps).sqrt();
    for ((v, w), b) in x.iter_mut().zip(w).zip(b) {
        *v = (*v - mean) * inv * w + b;
    }
}

/// Top-`k` positions of `scores` (highest first, ties to the lower position), returned in
/// ascending position order.
fn top_k_positions(scores: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..scores.len() as u32).collect();
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, |&a, &b| scores[b as usize].total_cmp(&scores[a as usize]).then(a.cmp(&b)));
        idx.truncate(k);
    }
    idx.sort_unstable();
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_is_a_set_in_position_order() {
        let s = [0.5, 3.0, -1.0, 3.0, 2.0, 0.0];
        assert_eq!(top_k_positions(&s, 3), vec![1, 3, 4]);
        assert_eq!(top_k_positions(&s, 10), vec![0, 1, 2, 3, 4, 5]);
        // Ties at the boundary go to the lower position.
        assert_eq!(top_k_positions(&[1.0, 1.0, 1.0], 2), vec![0, 1]);
    }

    #[test]
    fn layer_norm_by_hand() {
        // mean 2, var 2/3: (x − 2)/sqrt(2/3) · 2 + 1.
        let mut x = [1.0, 2.0, 3.0];
        layer_norm(&mut x, &[2.0; 3], &[1.0; 3], 0.0);
        let d = 2.0 / (2.0f32 / 3.0).sqrt();
        assert!((x[0] - (1.0 - d)).abs() < 1e-6 && x[1] == 1.0 && (x[2] - (1.0 + d)).abs() < 1e-6, "{x:?}");
    }
}
