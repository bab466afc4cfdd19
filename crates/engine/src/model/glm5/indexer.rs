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

/// Query rows scored together against each block of keys (× the index heads: 128 rows of the
/// score GEMM for glm5-tiny's 8 heads, 512 for GLM-5's 32).
const ROW_BLOCK: usize = 16;

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
        let (rope, positions) = (s.rope, &batch.positions);
        s.pool.par_rows(&mut ki, di, |t, k| {
            layer_norm(k, &self.k_norm_w, &self.k_norm_b, LORA_NORM_EPS);
            rope.rotate(&mut k[..c.qk_rope], positions[t] as usize, ROPE_LAYOUT);
        });
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
            // Rows outside `need` are never read: rotating them too keeps this one pass.
            s.pool.par_rows(&mut qi, ni * di, |t, row| {
                for v in row.chunks_exact_mut(di) {
                    rope.rotate(&mut v[..c.qk_rope], positions[t] as usize, ROPE_LAYOUT);
                }
            });
            let kc = kv.component(l, 1);
            // Tasks: runs of up to ROW_BLOCK consecutive rows of one sequence, scored together
            // against each block of keys (one small GEMM per key block).
            let tasks = super::runs(need.len(), ROW_BLOCK, |a, b| s.row_seq[need[a]] == s.row_seq[need[b]]);
            let results: Vec<std::sync::Mutex<Vec<Vec<u32>>>> =
                tasks.iter().map(|_| std::sync::Mutex::new(Vec::new())).collect();
            let (qi, wts, row_seq, need) = (&qi, &wts, &s.row_seq, &need);
            // Longest first (work ≈ rows × keys of the last row), for a balanced finish.
            let mut order: Vec<usize> = (0..tasks.len()).collect();
            order.sort_by_key(|&i| std::cmp::Reverse(tasks[i].len() * (batch.positions[need[tasks[i].end - 1]] as usize + 1)));
            s.pool.run(tasks.len(), |i| {
                let task = order[i];
                let rows = &need[tasks[task].clone()];
                let slots = batch.kv_slots(row_seq[rows[0]] as usize);
                let lens: Vec<usize> = rows.iter().map(|&t| batch.positions[t] as usize + 1).collect();
                let n = lens.iter().copied().max().unwrap_or(0);
                let mut q = Vec::with_capacity(rows.len() * ni * di);
                // Per head, `w_h · n_heads^-½` as the reference computes it.
                let mut hw = Vec::with_capacity(rows.len() * ni);
                for &t in rows {
                    q.extend_from_slice(&qi[t * ni * di..(t + 1) * ni * di]);
                    hw.extend((0..ni).map(|hd| wts[t * ni + hd] * wscale));
                }
                let mut scores = vec![0f32; rows.len() * n];
                let mut sc = kernels::IndexScratch::default();
                kernels::index_scores(isa, &q, ni, di, &hw, kc, slots, &lens, kscale, &mut sc, &mut scores);
                let top: Vec<Vec<u32>> =
                    lens.iter().enumerate().map(|(i, &len)| top_k_positions(&scores[i * n..i * n + len], c.idx_topk)).collect();
                if let Ok(mut r) = results[task].lock() {
                    *r = top;
                }
            });
            for (task, r) in tasks.iter().zip(results) {
                let tops = r.into_inner().unwrap_or_default();
                for (n, top) in task.clone().zip(tops) {
                    sel[need[n]] = Some(top);
                }
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

/// A kept (score, position) of [`top_k_positions`], ordered so that the *worse* one is greater:
/// a lower score, or the same score at a higher position (`total_cmp` orders −0 < +0).
#[derive(Clone, Copy)]
struct Kept(f32, u32);

impl PartialEq for Kept {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o).is_eq()
    }
}
impl Eq for Kept {}
impl PartialOrd for Kept {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Kept {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        o.0.total_cmp(&self.0).then(self.1.cmp(&o.1))
    }
}

/// Top-`k` positions of `scores` (highest first, ties to the lower position), returned in
/// ascending position order.
///
/// One pass with a threshold: `kept` holds candidates, and `thr` is the `k`-th best of those
/// kept at the last compaction. Positions arrive in increasing order, so a new score can be
/// among the best `k` only if it beats `thr` outright (an equal score loses the tie to the lower
/// position already kept); when `kept` fills up, a selection (`select_nth_unstable`, linear)
/// keeps its best `k` and raises `thr`. Under this strict total order the result is a full
/// sort's first `k`. Most scores are rejected eight at a time by one comparison each against
/// `thr`; a candidate costs a push and, amortized, O(1) of a compaction, where a heap of the
/// best `k` cost `log k` per replacement (and scores that rise with position replace often).
fn top_k_positions(scores: &[f32], k: usize) -> Vec<u32> {
    if scores.len() <= k {
        return (0..scores.len() as u32).collect();
    }
    if k == 0 {
        return Vec::new();
    }
    let cap = 4 * k.max(8);
    let mut kept: Vec<Kept> = Vec::with_capacity(cap);
    kept.extend(scores[..k].iter().enumerate().map(|(i, &s)| Kept(s, i as u32)));
    // The worst of the first k (Kept orders worse as greater).
    let mut thr = kept.iter().copied().max().map_or(f32::NEG_INFINITY, |w| w.0);
    let compact = |kept: &mut Vec<Kept>| -> f32 {
        kept.select_nth_unstable(k - 1);
        kept.truncate(k);
        kept.iter().copied().max().map_or(f32::NEG_INFINITY, |w| w.0)
    };
    let offer = |kept: &mut Vec<Kept>, thr: &mut f32, i: usize, s: f32| {
        // `<` rejects all but ±0 and NaN, which `total_cmp` orders.
        if !(s < *thr) && s.total_cmp(thr).is_gt() {
            kept.push(Kept(s, i as u32));
            if kept.len() == cap {
                *thr = compact(kept);
            }
        }
    };
    let mut i = k;
    while i + 8 <= scores.len() {
        let chunk: &[f32; 8] = scores[i..i + 8].try_into().unwrap_or(&[f32::NAN; 8]);
        // `&` (not `&&`) keeps the test over the chunk vectorizable.
        if !chunk.iter().fold(true, |all, &s| all & (s < thr)) {
            for (d, &s) in chunk.iter().enumerate() {
                offer(&mut kept, &mut thr, i + d, s);
            }
        }
        i += 8;
    }
    for (d, &s) in scores[i..].iter().enumerate() {
        offer(&mut kept, &mut thr, i + d, s);
    }
    if kept.len() > k {
        compact(&mut kept);
    }
    let mut idx: Vec<u32> = kept.into_iter().map(|e| e.1).collect();
    idx.sort_unstable();
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-pass selection equals a full sort by (score descending, position ascending) on
    /// random scores with many ties, for every k.
    #[test]
    fn top_k_equals_a_full_sort() {
        let mut x = 7u64;
        // Flat scores, and scores rising with position (every new key replaces a kept one):
        // both sides of the threshold's compaction.
        for (n, rise) in [(1usize, 0.0f32), (5, 0.0), (40, 0.0), (300, 0.0), (1000, 0.0), (1000, 0.25), (3000, 0.01)] {
            let scores: Vec<f32> = (0..n)
                .map(|i| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    // 32 distinct values: plenty of ties.
                    ((x >> 59) as f32) - 8.0 + (rise * i as f32).floor()
                })
                .collect();
            for k in [1usize, 2, 7, 32, n] {
                let mut all: Vec<u32> = (0..n as u32).collect();
                all.sort_by(|&a, &b| scores[b as usize].total_cmp(&scores[a as usize]).then(a.cmp(&b)));
                let mut want: Vec<u32> = all[..k.min(n)].to_vec();
                want.sort_unstable();
                assert_eq!(top_k_positions(&scores, k), want, "n {n} k {k}");
            }
        }
    }

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
