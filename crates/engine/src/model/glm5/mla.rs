//! Multi-head latent attention (MLA, DeepSeek-V2 §2.1) in its absorbed form, over the top-k
//! selection of the DSA indexer (DeepSeek-V3.2 §2) where the model has one (GLM-5), over the
//! whole context where it has none (DeepSeek-V2/V3 from GGUF). Semantics follow HF transformers
//! `modeling_glm_moe_dsa.py` (`GlmMoeDsaAttention`); the absorbed, latent-only form and the
//! sparse/dense choice follow SGLang's `dsa` backend (`nsa` before 0.5.23).
//!
//! Per token: `qr = RMSNorm(q_a_proj(h))`, `q = q_b_proj(qr)` (or `q = q_proj(h)` without a q
//! LoRA) split per head into
//! `[q_nope (qk_nope_head_dim), q_pe (qk_rope_head_dim)]`; `kv = kv_a_proj_with_mqa(h)` split
//! into `c = RMSNorm(kv[..kv_lora_rank])` (the latent) and `k_pe = RoPE(kv[kv_lora_rank..])`,
//! shared by all heads. The cache keeps `[c, k_pe]` per token (component `latent`).
//! `kv_b_proj` holds, per head, `W_UK [nope, kv_lora]` and `W_UV [v, kv_lora]`; we run the
//! absorbed form for every row (prefill and decode): `q_abs = W_UKᵀ q_nope`,
//! `score_j = (q_abs·c_j + q_pe·k_pe_j) · softmax_scale` (`(nope + rope)^-½`, times YaRN's
//! `mscale²` for DeepSeek's scaled RoPE), `o = W_UV Σ_j softmax_j · c_j`,
//! which reads only the latent cache.
//!
//! Two implementations for rows with a selection, selected like SGLang's
//! `--nsa-prefill-backend` / `--nsa-decode-backend`: [`AttnImpl::Sparse`] gathers only the
//! selected slots; [`AttnImpl::Dense`] scores every slot of the context and masks the
//! unselected ones, as the HF reference does. Both visit slots in position order and give
//! bit-identical outputs.

use sparrow_cpu::format::ggml::QActs;
use sparrow_cpu::{kernels, Weight};

use crate::model::linear::{observe_shared, Linear};

use super::indexer::{Indexer, Selection};
use super::{Step, Work, ROPE_LAYOUT};
use crate::config::AttnImpl;
use crate::kv::KvStore;
use crate::model::common::Scratch;

/// Dense-backend rows scored together against each key block.
const QUERY_BLOCK: usize = 16;

/// Rows from which W_UV runs as one dense GEMM per head (three fork-joins of the pool per head)
/// rather than a `dot` per output inside each row's task (same bits either way).
const UV_GEMM_ROWS: usize = 16;

/// How a layer makes its queries.
pub(super) enum QProj {
    /// `q_b_proj(RMSNorm(q_a_proj(h)))`: GLM-5, DeepSeek-V2 and V3.
    Lora { a: Linear, norm: Vec<f32>, b: Linear },
    /// `q_proj(h)`: DeepSeek-V2-Lite (`q_lora_rank` null; llama.cpp's `attn_q`).
    Direct(Linear),
}

/// One layer's attention weights, with its indexer on `full` layers.
pub(super) struct Mla {
    pub(super) q: QProj,
    pub(super) kv_a: Linear,
    pub(super) kv_a_ln: Vec<f32>,
    /// `[heads][nope × kv_lora]`.
    pub(super) w_uk: Vec<Vec<f32>>,
    /// Per head, `W_UV` as a dense `[v × kv_lora]` matrix.
    pub(super) w_uv: Vec<Weight>,
    pub(super) o: Linear,
    pub(super) indexer: Option<Indexer>,
}

impl Mla {
    /// Self-attention of layer `l` on the step's normalized rows `h` (`[tokens × hidden]`):
    /// writes their latents (and index keys) to the cache, replaces `sel` when this layer runs
    /// an indexer, and returns the `o_proj` output.
    pub(super) fn forward(
        &self,
        s: &Step<'_>,
        l: usize,
        h: &[f32],
        kv: &mut KvStore,
        sel: &mut Selection,
        w: &mut Work<'_>,
    ) -> Vec<f32> {
        let c = s.cfg;
        let t_n = s.batch.num_tokens();
        let lat_w = c.kv_lora_rank + c.qk_rope;
        let (qr, q, kva) = self.project(s, h, w);
        {
            let cache = kv.component_mut(l, 0);
            for t in 0..t_n {
                let slot = s.batch.out_cache_loc[t] as usize;
                cache[slot * lat_w..(slot + 1) * lat_w].copy_from_slice(&kva[t * lat_w..(t + 1) * lat_w]);
            }
        }
        if let Some(ix) = &self.indexer {
            *sel = ix.select(s, l, h, &qr, kv, w);
        }
        let attn = w.cx.timed(|p| &mut p.attention, || self.attend(s, &q, kv.component(l, 0), sel, &mut w.bufs));
        for (t, chosen) in sel.iter().enumerate() {
            let ctx = s.batch.positions[t] as u64 + 1;
            let n = match (chosen, s.attn_impl(t)) {
                (None, _) | (Some(_), AttnImpl::Dense) => ctx,
                (Some(chosen), AttnImpl::Sparse) => chosen.len() as u64,
            };
            w.stats.attn_keys += n * c.heads as u64;
        }
        let mut out = w.bufs.take(t_n * c.hidden);
        self.o.forward(&mut w.cx, &attn, t_n, &mut out);
        for b in [qr, q, kva, attn] {
            w.bufs.give(b);
        }
        out
    }

    /// The projections of the rows `h`, with their norms and RoPE: the normalized query LoRA
    /// `qr` (the indexer reads it too; empty without a q LoRA), the queries `q`
    /// (`[tokens × heads × (nope + rope)]`) and the cache rows `[c, k_pe]`. The rows `h` (and
    /// `qr`) are reported to the observer once for every projection that reads them, the
    /// indexer's included.
    fn project(&self, s: &Step<'_>, h: &[f32], w: &mut Work<'_>) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let (c, isa, pool) = (s.cfg, s.isa, s.pool);
        let t_n = s.batch.num_tokens();
        let hq = c.qk_nope + c.qk_rope;
        let lat_w = c.kv_lora_rank + c.qk_rope;
        let ix = self.indexer.as_ref();
        let q_in = match &self.q {
            QProj::Lora { a, .. } => a,
            QProj::Direct(q) => q,
        };
        let mut on_h = vec![q_in, &self.kv_a];
        on_h.extend(ix.into_iter().flat_map(|ix| [&ix.wk, &ix.weights_proj]));
        observe_shared(w.cx.observer, pool, isa, &on_h, h, t_n);
        // Every buffer here is written whole (GEMM outputs, the norm's).
        let mut q = w.bufs.take(t_n * c.heads * hq);
        let qr = match &self.q {
            QProj::Lora { a, norm, b } => {
                let mut qa = w.bufs.take(t_n * c.q_lora_rank);
                a.forward_observed(&mut w.cx, h, t_n, &mut qa);
                let mut qr = w.bufs.take(t_n * c.q_lora_rank);
                super::par_norm(pool, &qa, norm, c.lora_eps, &mut qr);
                w.bufs.give(qa);
                let mut on_qr = vec![b];
                on_qr.extend(ix.map(|ix| &ix.wq_b));
                observe_shared(w.cx.observer, pool, isa, &on_qr, &qr, t_n);
                b.forward_observed(&mut w.cx, &qr, t_n, &mut q);
                qr
            }
            QProj::Direct(wq) => {
                wq.forward_observed(&mut w.cx, h, t_n, &mut q);
                Vec::new()
            }
        };
        let mut kva = w.bufs.take(t_n * lat_w);
        self.kv_a.forward_observed(&mut w.cx, h, t_n, &mut kva);
        let (rope, positions) = (s.rope, &s.batch.positions);
        pool.par_rows(&mut kva, lat_w, |t, row| {
            let (lat, kpe) = row.split_at_mut(c.kv_lora_rank);
            let mut normed = vec![0f32; c.kv_lora_rank];
            kernels::rms_norm(lat, &self.kv_a_ln, c.lora_eps, &mut normed);
            lat.copy_from_slice(&normed);
            rope.rotate(kpe, positions[t] as usize, ROPE_LAYOUT);
        });
        pool.par_rows(&mut q, c.heads * hq, |t, row| {
            for qh in row.chunks_exact_mut(hq) {
                rope.rotate(&mut qh[c.qk_nope..], positions[t] as usize, ROPE_LAYOUT);
            }
        });
        (qr, q, kva)
    }

    /// The absorbed attention of every (row, head) over the latent cache `lat_cache`, reading
    /// each row's selection: `[tokens × heads·v]`.
    ///
    /// Three passes: the absorbed queries `[q_abs, q_pe]` of every row; the scores of the keys
    /// each row attends to, by [`kernels::block_scores`] (one FMA chain over the 576 — here
    /// `kv_lora + rope` — dimensions per score, whatever else is in the block); softmax, the
    /// latent sum and `W_UV` per row. Sparse rows score their selected keys only; dense rows
    /// with a selection score every key of their context in query blocks (the work of dense
    /// attention) and keep the selected scores, which are the same bits as the sparse ones.
    ///
    /// Every buffer taken from `bufs` is written whole before it is read.
    fn attend(&self, s: &Step<'_>, q: &[f32], lat_cache: &[f32], sel: &Selection, bufs: &mut Scratch) -> Vec<f32> {
        let (c, batch, isa, pool) = (s.cfg, s.batch, s.isa, s.pool);
        let t_n = batch.num_tokens();
        let hq = c.qk_nope + c.qk_rope;
        let lat_w = c.kv_lora_rank + c.qk_rope;
        let softmax_scale = c.softmax_scale;
        let (vd, kvl, heads) = (c.v_dim, c.kv_lora_rank, c.heads);
        // 1. [q_abs (kv_lora), q_pe (rope)] per (row, head): a query against a latent row.
        // q_abs = Σ_i q_nope[i] · W_UK[i], the rows of W_UK read once per run of rows.
        let mut qcat = bufs.take(t_n * heads * lat_w);
        let uk_rows: Vec<usize> = (0..c.qk_nope).map(|i| i * kvl).collect();
        // A few rows (decode): the (row, head) pairs split over the pool, each W_UK read by one
        // thread; more rows: runs of rows per thread, each W_UK read once per run. Same bits.
        if t_n < UV_GEMM_ROWS {
            pool.par_rows(&mut qcat, lat_w, |u, row| {
                let (t, hd) = (u / heads, u % heads);
                let qh = &q[(t * heads + hd) * hq..(t * heads + hd + 1) * hq];
                kernels::weighted_rows(isa, qh, hq, 1, &self.w_uk[hd], &uk_rows, kvl, row, lat_w);
                row[kvl..].copy_from_slice(&qh[c.qk_nope..]);
            });
        } else {
            pool.par_row_chunks(&mut qcat, heads * lat_w, |r0, chunk| {
                let nr = chunk.len() / (heads * lat_w);
                for hd in 0..heads {
                    let wq = &q[(r0 * heads + hd) * hq..];
                    let out = &mut chunk[hd * lat_w..];
                    kernels::weighted_rows(isa, wq, heads * hq, nr, &self.w_uk[hd], &uk_rows, kvl, out, heads * lat_w);
                    for t in 0..nr {
                        let src = &q[((r0 + t) * heads + hd) * hq + c.qk_nope..((r0 + t) * heads + hd + 1) * hq];
                        chunk[(t * heads + hd) * lat_w + kvl..(t * heads + hd + 1) * lat_w].copy_from_slice(src);
                    }
                }
            });
        }
        // The positions row t attends to.
        let all_pos: Vec<u32> = (0..=batch.positions.iter().copied().max().unwrap_or(0)).collect();
        let chosen = |t: usize| -> &[u32] {
            match &sel[t] {
                Some(x) => x,
                None => &all_pos[..=batch.positions[t] as usize],
            }
        };
        let dense = |t: usize| sel[t].is_some() && s.attn_impl(t) == AttnImpl::Dense;
        // 2. Scores, `[heads × chosen]` per row. Tasks: runs of up to QUERY_BLOCK rows of one
        // sequence and one kind: dense rows share every key block; the others share buffers.
        // A few rows (decode): a lone sparse row's heads split between the threads, each part
        // scoring the row's keys for its heads (same bits: a score is one FMA chain whatever
        // else is in the block).
        let row_runs = super::runs(t_n, QUERY_BLOCK, |a, b| dense(a) == dense(b) && s.row_seq[a] == s.row_seq[b]);
        let head_part = match t_n < UV_GEMM_ROWS {
            true => heads.div_ceil(pool.threads().max(1)),
            false => heads,
        };
        let mut tasks: Vec<(std::ops::Range<usize>, std::ops::Range<usize>)> = Vec::new();
        for r in row_runs {
            if dense(r.start) || r.len() > 1 {
                tasks.push((r, 0..heads));
            } else {
                tasks.extend((0..heads).step_by(head_part).map(|h0| (r.clone(), h0..(h0 + head_part).min(heads))));
            }
        }
        // Row t's scores, `[heads × chosen(t)]`, at `all[off[t] .. off[t + 1]]`: each task's
        // rows (and heads) are one contiguous range.
        let mut off = Vec::with_capacity(t_n + 1);
        off.push(0usize);
        for t in 0..t_n {
            off.push(off[t] + heads * chosen(t).len());
        }
        let mut all = vec![0f32; off[t_n]];
        // Longest first (work ≈ rows × scored keys), for a balanced finish.
        let work = |(r, h): &(std::ops::Range<usize>, std::ops::Range<usize>)| {
            if dense(r.start) {
                r.len() * (batch.positions[r.end - 1] as usize + 1)
            } else {
                (off[r.end] - off[r.start]) / heads * h.len()
            }
        };
        tasks.sort_by_key(|t| std::cmp::Reverse(work(t)));
        let ranges: Vec<std::ops::Range<usize>> = tasks
            .iter()
            .map(|(r, h)| match h.len() == heads {
                true => off[r.start]..off[r.end],
                false => {
                    let m = chosen(r.start).len();
                    off[r.start] + h.start * m..off[r.start] + h.end * m
                }
            })
            .collect();
        pool.par_ranges(&mut all, &ranges, |task, out| {
            let (rows, hr) = tasks[task].clone();
            let base = ranges[task].start;
            let slots = batch.kv_slots(s.row_seq[rows.start] as usize);
            let view = kernels::KvView { k: lat_cache, v: lat_cache, stride: lat_w, off: 0, slots };
            let mut kt = Vec::new();
            if dense(rows.start) {
                let mut blk = vec![0f32; rows.len() * heads * kernels::KEY_BLOCK];
                let qrows = &qcat[rows.start * heads * lat_w..rows.end * heads * lat_w];
                let last = rows.clone().map(|t| batch.positions[t] as usize).max().unwrap_or(0);
                for k0 in (0..=last).step_by(kernels::KEY_BLOCK) {
                    let k1 = (k0 + kernels::KEY_BLOCK).min(last + 1);
                    let nr = rows.len() * heads;
                    kernels::block_scores(
                        isa,
                        qrows,
                        nr,
                        lat_w,
                        &view,
                        &slots[k0..k1],
                        softmax_scale,
                        &mut kt,
                        &mut blk,
                    );
                    for (i, t) in rows.clone().enumerate() {
                        let ch = chosen(t);
                        let (m, o) = (ch.len(), &mut out[off[t] - base..off[t + 1] - base]);
                        for (n, &p) in ch.iter().enumerate() {
                            let p = p as usize;
                            if (k0..k1).contains(&p) {
                                for hd in 0..heads {
                                    o[hd * m + n] = blk[(i * heads + hd) * kernels::KEY_BLOCK + p - k0];
                                }
                            }
                        }
                    }
                }
            } else {
                let nh = hr.len();
                let mut blk = vec![0f32; nh * kernels::KEY_BLOCK];
                let mut ks = Vec::with_capacity(kernels::KEY_BLOCK);
                for t in rows {
                    let ch = chosen(t);
                    let m = ch.len();
                    let o = &mut out[off[t] + hr.start * m - base..off[t] + hr.end * m - base];
                    let qrow = &qcat[(t * heads + hr.start) * lat_w..(t * heads + hr.end) * lat_w];
                    for n0 in (0..m).step_by(kernels::KEY_BLOCK) {
                        let n1 = (n0 + kernels::KEY_BLOCK).min(m);
                        ks.clear();
                        ks.extend(ch[n0..n1].iter().map(|&p| slots[p as usize]));
                        kernels::block_scores(isa, qrow, nh, lat_w, &view, &ks, softmax_scale, &mut kt, &mut blk);
                        for i in 0..nh {
                            o[i * m + n0..i * m + n1]
                                .copy_from_slice(&blk[i * kernels::KEY_BLOCK..i * kernels::KEY_BLOCK + n1 - n0]);
                        }
                    }
                }
            }
        });
        // 3. Softmax, the latent sum and W_UV. A few rows (DECODE, W_UV dense as load builds
        // it): runs of (row, head) pairs over the pool, so one row's heads split between the
        // threads (each reads the row's latent rows once for its heads, and its heads' W_UV),
        // one `dot` per output. More rows: whole rows per thread (its heads share the latent
        // rows), then a dense GEMM per head over every row. Same bits: every head's softmax,
        // latent sum and W_UV products are the same operations either way.
        let inline_uv = t_n < UV_GEMM_ROWS && self.w_uv.iter().all(|w| matches!(w, Weight::Dense { .. }));
        let mut lat_all = bufs.take(t_n * heads * kvl);
        let mut attn = bufs.take(t_n * heads * vd);
        // The latent sums of row t's heads h0..h1 into `lat` (`[h1 − h0 × kvl]`).
        let latent_sums = |t: usize, h0: usize, h1: usize, lat: &mut [f32]| {
            let slots = batch.kv_slots(s.row_seq[t] as usize);
            let ch = chosen(t);
            let m = ch.len();
            // The row's scores are `[heads × m]`: softmax per head.
            let mut p = all[off[t] + h0 * m..off[t] + h1 * m].to_vec();
            for sc in p.chunks_exact_mut(m.max(1)) {
                kernels::softmax_in_place(sc);
            }
            let rows: Vec<usize> = ch.iter().map(|&p| slots[p as usize] as usize * lat_w).collect();
            kernels::weighted_rows(isa, &p, m, h1 - h0, lat_cache, &rows, kvl, lat, kvl);
        };
        if inline_uv {
            pool.par_row_chunks2(&mut lat_all, kvl, &mut attn, vd, |u0, lats, outs| {
                let mut u = u0;
                while u < u0 + lats.len() / kvl {
                    let (t, h0) = (u / heads, u % heads);
                    let h1 = heads.min(h0 + (u0 + lats.len() / kvl - u));
                    let (i0, i1) = (u - u0, u - u0 + h1 - h0);
                    latent_sums(t, h0, h1, &mut lats[i0 * kvl..i1 * kvl]);
                    for (i, hd) in (i0..i1).zip(h0..h1) {
                        if let Weight::Dense { data, .. } = &self.w_uv[hd] {
                            let lh = &lats[i * kvl..(i + 1) * kvl];
                            for (j, o) in outs[i * vd..(i + 1) * vd].iter_mut().enumerate() {
                                *o = kernels::dot(isa, &data[j * kvl..(j + 1) * kvl], lh);
                            }
                        }
                    }
                    u += h1 - h0;
                }
            });
        } else {
            pool.par_row_chunks(&mut lat_all, heads * kvl, |r0, lats| {
                for (i, lat) in lats.chunks_exact_mut(heads * kvl).enumerate() {
                    latent_sums(r0 + i, 0, heads, lat);
                }
            });
            let (mut xh, mut oh) = (bufs.take(t_n * kvl), bufs.take(t_n * vd));
            let mut xq = QActs::default();
            for (hd, uv) in self.w_uv.iter().enumerate() {
                pool.par_rows(&mut xh, kvl, |t, r| {
                    r.copy_from_slice(&lat_all[(t * heads + hd) * kvl..(t * heads + hd + 1) * kvl])
                });
                kernels::matmul(pool, isa, uv, &xh, t_n, &mut xq, &mut oh);
                pool.par_rows(&mut attn, heads * vd, |t, r| {
                    r[hd * vd..(hd + 1) * vd].copy_from_slice(&oh[t * vd..(t + 1) * vd])
                });
            }
            bufs.give(xh);
            bufs.give(oh);
        }
        bufs.give(qcat);
        bufs.give(lat_all);
        attn
    }
}
