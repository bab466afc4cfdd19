//! DeepSeek sparse attention's "lightning indexer" (DeepSeek-V3.2 tech report §2; HF
//! transformers `modeling_glm_moe_dsa.py`, `GlmMoeDsaIndexer`; SGLang's `dsa` backend (`nsa` before 0.5.23)): it
//! scores every cached token for each query and attention reads only the top-k.
//!
//! On layers whose indexer type is `full`: `q_I = RoPE(wq_b(qr))` per indexer head,
//! `k_I = RoPE(LayerNorm(wk(h)))` (one head, cached as component `index_k`),
//! `w = weights_proj(h) · n_heads^-½`; `I(t, j) = Σ_h w_h · ReLU(q_I,h · k_I,j) · d^-½`. The
//! query attends to the `index_topk` positions with the highest `I` among `0..=pos`; when
//! `pos + 1 ≤ index_topk` every position is selected and the scores are not computed. A
//! `shared` layer reuses the selection of the nearest `full` layer before it.

use sparrow_cpu::kernels;

use super::{Step, Work, LORA_NORM_EPS, ROPE_LAYOUT};
use crate::kv::KvStore;
use crate::model::linear::Linear;

/// Query rows scored together against each block of keys (× the index heads: 128 rows of the
/// score GEMM for glm5-tiny's 8 heads, 512 for GLM-5's 32).
const ROW_BLOCK: usize = 16;

/// Per row: the positions it attends to (ascending), or `None` for its whole context.
pub(super) type Selection = Vec<Option<Vec<u32>>>;

/// One layer's indexer weights.
pub(super) struct Indexer {
    pub(super) wq_b: Linear,
    pub(super) wk: Linear,
    pub(super) k_norm_w: Vec<f32>,
    pub(super) k_norm_b: Vec<f32>,
    pub(super) weights_proj: Linear,
}

impl Indexer {
    /// Writes the step's index keys to layer `l` of the cache and returns each row's selection.
    /// `h` is the layer's normalized input, `qr` the normalized query LoRA (both
    /// `[tokens × …]`), already reported to the observer for these projections
    /// ([`super::mla`]'s `project`). The projections count as matmuls in the profile, the
    /// scoring and top-k as the indexer.
    pub(super) fn select(
        &self,
        s: &Step<'_>,
        l: usize,
        h: &[f32],
        qr: &[f32],
        kv: &mut KvStore,
        w: &mut Work<'_>,
    ) -> Selection {
        let (c, batch, isa) = (s.cfg, s.batch, s.isa);
        let t_n = batch.num_tokens();
        let (di, ni) = (c.idx_dim, c.idx_heads);
        // `ki`, `qi`, `wts`: GEMM outputs, written whole.
        let mut ki = w.bufs.take(t_n * di);
        self.wk.forward_observed(&mut w.cx, h, t_n, &mut ki);
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
        w.bufs.give(ki);
        // Only queries whose context exceeds top-k need scores.
        let need: Vec<usize> = (0..t_n).filter(|&t| batch.positions[t] as usize + 1 > c.idx_topk).collect();
        let mut sel: Selection = vec![None; t_n];
        if !need.is_empty() {
            let mut qi = w.bufs.take(t_n * ni * di);
            self.wq_b.forward_observed(&mut w.cx, qr, t_n, &mut qi);
            let mut wts = w.bufs.take(t_n * ni);
            self.weights_proj.forward_observed(&mut w.cx, h, t_n, &mut wts);
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
            let (qi_r, wts_r, row_seq, need) = (&qi, &wts, &s.row_seq, &need);
            // Longest first (work ≈ rows × keys of the last row), for a balanced finish.
            let mut order: Vec<usize> = (0..tasks.len()).collect();
            order.sort_by_key(|&i| {
                std::cmp::Reverse(tasks[i].len() * (batch.positions[need[tasks[i].end - 1]] as usize + 1))
            });
            w.cx.timed(
                |p| &mut p.indexer,
                || {
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
                            q.extend_from_slice(&qi_r[t * ni * di..(t + 1) * ni * di]);
                            hw.extend((0..ni).map(|hd| wts_r[t * ni + hd] * wscale));
                        }
                        let mut scores = vec![0f32; rows.len() * n];
                        let mut sc = kernels::IndexScratch::default();
                        kernels::index_scores(isa, &q, ni, di, &hw, kc, slots, &lens, kscale, &mut sc, &mut scores);
                        let top: Vec<Vec<u32>> = lens
                            .iter()
                            .enumerate()
                            .map(|(i, &len)| top_k_positions(&scores[i * n..i * n + len], c.idx_topk))
                            .collect();
                        if let Ok(mut r) = results[task].lock() {
                            *r = top;
                        }
                    })
                },
            );
            for (task, r) in tasks.iter().zip(results) {
                let tops = r.into_inner().unwrap_or_default();
                for (n, top) in task.clone().zip(tops) {
                    sel[need[n]] = Some(top);
                }
            }
            w.stats.indexer_keys += need.iter().map(|&t| batch.positions[t] as u64 + 1).sum::<u64>();
            w.bufs.give(qi);
            w.bufs.give(wts);
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
/// ascending position order. Scores compare by `total_cmp`: +NaN ranks first and −NaN last
/// (`torch.topk` ranks every NaN first; x86's default NaN, from `inf · 0`, has the sign bit
/// set, so such a NaN ranks last here, as it did before this selection was rewritten).
///
/// Two passes and no heap. First a threshold: the `k`-th largest of the maxima of chunks of
/// 8 or 16 scores. Those `k` chunks hold `k` distinct scores at or above it, so a score
/// strictly below it (by value) cannot be among the best `k`. Then the candidates, every score
/// not below the threshold (NaN included), are collected from the chunks whose maximum reaches
/// it (or that hold a NaN), about `k` of them, and the best `k` chosen by a linear selection
/// under the exact order. The first pass costs one comparison per score whatever the scores'
/// shape, the second reads ~k chunks; a heap of the best `k` so far (or a threshold raised as
/// the pass goes) degenerates when scores rise with position, as the indexer's often do.
fn top_k_positions(scores: &[f32], k: usize) -> Vec<u32> {
    let n = scores.len();
    if n <= k {
        return (0..n as u32).collect();
    }
    if k == 0 {
        return Vec::new();
    }
    // Chunks of 16 while that leaves at least 4k of them (fewer maxima to select from), else 8.
    let chunk = if n >= 64 * k { 16 } else { 8 };
    let maxima: Vec<(f32, bool)> = scores.chunks(chunk).map(chunk_max).collect();
    let mut sel: Vec<f32> = maxima.iter().map(|m| m.0).collect();
    let thr =
        if sel.len() >= k { *sel.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a)).1 } else { f32::NEG_INFINITY };
    let mut kept: Vec<Kept> = Vec::with_capacity(4 * k);
    for (c, &(mx, nan)) in maxima.iter().enumerate() {
        // A chunk whose largest score is below the threshold, and that holds no NaN, has
        // nothing to offer.
        if mx < thr && !nan {
            continue;
        }
        for (d, &s) in scores[c * chunk..((c + 1) * chunk).min(n)].iter().enumerate() {
            // Not below the threshold: at or above it, or NaN (`thr` is never NaN).
            if s >= thr || s.is_nan() {
                kept.push(Kept(s, (c * chunk + d) as u32));
            }
        }
    }
    if kept.len() > k {
        kept.select_nth_unstable(k - 1);
        kept.truncate(k);
    }
    let mut idx: Vec<u32> = kept.into_iter().map(|e| e.1).collect();
    idx.sort_unstable();
    idx
}

/// The largest score of `c`, NaN skipped (`s > m` is false for NaN; −∞ when `c` holds only
/// NaN), and whether `c` holds a NaN. Eight independent lanes of `if s > m { m = s }` (one
/// `maxps` per eight scores once vectorized) instead of one dependent `max` per score.
fn chunk_max(c: &[f32]) -> (f32, bool) {
    let mut m = [f32::NEG_INFINITY; 8];
    let mut nan = [false; 8];
    for v in c.chunks(8) {
        for ((m, n), &s) in m.iter_mut().zip(nan.iter_mut()).zip(v) {
            *m = if s > *m { s } else { *m };
            *n |= s.is_nan();
        }
    }
    (m.iter().fold(f32::NEG_INFINITY, |a, &b| if b > a { b } else { a }), nan.iter().any(|&n| n))
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

    /// NaN ranks as `total_cmp` orders it (+NaN above every number, −NaN below), −0 below +0,
    /// in chunks the threshold would otherwise skip.
    #[test]
    fn top_k_orders_nan_and_signed_zeros() {
        let mut s = vec![-5.0f32; 300];
        s[10] = f32::NAN;
        s[11] = -f32::NAN;
        s[200] = 0.0;
        s[201] = -0.0;
        s[250] = 1.0;
        assert_eq!(top_k_positions(&s, 3), vec![10, 200, 250]);
        assert_eq!(top_k_positions(&s, 4), vec![10, 200, 201, 250]);
        let mut all: Vec<u32> = (0..300).collect();
        all.sort_by(|&a, &b| s[b as usize].total_cmp(&s[a as usize]).then(a.cmp(&b)));
        let mut want = all[..40].to_vec();
        want.sort_unstable();
        assert_eq!(top_k_positions(&s, 40), want);
        assert!(!want.contains(&11) && !top_k_positions(&s, 299).contains(&11));
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
