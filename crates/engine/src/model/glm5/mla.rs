//! Multi-head latent attention (MLA, DeepSeek-V2 §2.1) in its absorbed form, over the top-k
//! selection of the DSA indexer (DeepSeek-V3.2 §2). Semantics follow HF transformers
//! `modeling_glm_moe_dsa.py` (`GlmMoeDsaAttention`); the absorbed, latent-only form and the
//! sparse/dense choice follow SGLang's `nsa` backend.
//!
//! Per token: `qr = RMSNorm(q_a_proj(h))`, `q = q_b_proj(qr)` split per head into
//! `[q_nope (qk_nope_head_dim), q_pe (qk_rope_head_dim)]`; `kv = kv_a_proj_with_mqa(h)` split
//! into `c = RMSNorm(kv[..kv_lora_rank])` (the latent) and `k_pe = RoPE(kv[kv_lora_rank..])`,
//! shared by all heads. The cache keeps `[c, k_pe]` per token (component `latent`).
//! `kv_b_proj` holds, per head, `W_UK [nope, kv_lora]` and `W_UV [v, kv_lora]`; we run the
//! absorbed form for every row (prefill and decode): `q_abs = W_UKᵀ q_nope`,
//! `score_j = (q_abs·c_j + q_pe·k_pe_j) · (nope + rope)^-½`, `o = W_UV Σ_j softmax_j · c_j`,
//! which reads only the latent cache.
//!
//! Two implementations for rows with a selection, selected like SGLang's
//! `--nsa-prefill-backend` / `--nsa-decode-backend`: [`AttnImpl::Sparse`] gathers only the
//! selected slots; [`AttnImpl::Dense`] scores every slot of the context and masks the
//! unselected ones, as the HF reference does. Both visit slots in position order and give
//! bit-identical outputs.

use sparrow_cpu::{kernels, Weight};

use super::indexer::{Indexer, Selection};
use super::{note, Step, Work, LORA_NORM_EPS, ROPE_LAYOUT};
use crate::config::AttnImpl;
use crate::kv::KvStore;

/// One layer's attention weights, with its indexer on `full` layers.
pub(super) struct Mla {
    pub(super) q_a: Weight,
    pub(super) q_a_ln: Vec<f32>,
    pub(super) q_b: Weight,
    pub(super) kv_a: Weight,
    pub(super) kv_a_ln: Vec<f32>,
    /// `[heads][nope × kv_lora]`.
    pub(super) w_uk: Vec<Vec<f32>>,
    /// `[heads][v × kv_lora]`.
    pub(super) w_uv: Vec<Vec<f32>>,
    pub(super) o: Weight,
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
        w: &mut Work,
    ) -> Vec<f32> {
        let (c, isa, pool) = (s.cfg, s.isa, s.pool);
        let t_n = s.batch.num_tokens();
        let lat_w = c.kv_lora_rank + c.qk_rope;
        // Module names only matter while calibrating; no formatting on the serving path.
        let a = if w.obs.is_some() { format!("model.layers.{l}.self_attn") } else { String::new() };
        let (qr, q, kva) = w.timed(|p| &mut p.gemm, |w| self.project(s, h, w, &a));
        {
            let cache = kv.component_mut(l, 0);
            for t in 0..t_n {
                let slot = s.batch.out_cache_loc[t] as usize;
                cache[slot * lat_w..(slot + 1) * lat_w].copy_from_slice(&kva[t * lat_w..(t + 1) * lat_w]);
            }
        }
        if let Some(ix) = &self.indexer {
            *sel = w.timed(|p| &mut p.indexer, |w| ix.select(s, l, h, &qr, kv, w));
        }
        let attn = w.timed(|p| &mut p.attention, |_| self.attend(s, &q, kv.component(l, 0), sel));
        for (t, chosen) in sel.iter().enumerate() {
            let ctx = s.batch.positions[t] as u64 + 1;
            let n = match (chosen, s.attn_impl(t)) {
                (None, _) | (Some(_), AttnImpl::Dense) => ctx,
                (Some(chosen), AttnImpl::Sparse) => chosen.len() as u64,
            };
            w.stats.attn_keys += n * c.heads as u64;
        }
        if w.obs.is_some() {
            note(&mut w.obs, pool, isa, &[format!("{a}.o_proj")], &attn, t_n);
        }
        let mut out = vec![0f32; t_n * c.hidden];
        w.timed(|p| &mut p.gemm, |w| kernels::matmul(pool, isa, &self.o, &attn, t_n, &mut w.xq, &mut out));
        out
    }

    /// The projections of the rows `h`, with their norms and RoPE: the normalized query LoRA
    /// `qr` (the indexer reads it too), the queries `q` (`[tokens × heads × (nope + rope)]`) and
    /// the cache rows `[c, k_pe]`. `a` names the attention module while observing.
    fn project(&self, s: &Step<'_>, h: &[f32], w: &mut Work, a: &str) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let (c, isa, pool) = (s.cfg, s.isa, s.pool);
        let t_n = s.batch.num_tokens();
        let hq = c.qk_nope + c.qk_rope;
        let lat_w = c.kv_lora_rank + c.qk_rope;
        if w.obs.is_some() {
            let mut ms = vec![format!("{a}.q_a_proj"), format!("{a}.kv_a_proj_with_mqa")];
            if self.indexer.is_some() {
                ms.extend([format!("{a}.indexer.wk"), format!("{a}.indexer.weights_proj")]);
            }
            note(&mut w.obs, pool, isa, &ms, h, t_n);
        }
        let mut qa = vec![0f32; t_n * c.q_lora_rank];
        kernels::matmul(pool, isa, &self.q_a, h, t_n, &mut w.xq, &mut qa);
        let mut qr = vec![0f32; t_n * c.q_lora_rank];
        super::par_norm(pool, &qa, &self.q_a_ln, LORA_NORM_EPS, &mut qr);
        if w.obs.is_some() {
            let mut ms = vec![format!("{a}.q_b_proj")];
            if self.indexer.is_some() {
                ms.push(format!("{a}.indexer.wq_b"));
            }
            note(&mut w.obs, pool, isa, &ms, &qr, t_n);
        }
        let mut q = vec![0f32; t_n * c.heads * hq];
        kernels::matmul(pool, isa, &self.q_b, &qr, t_n, &mut w.xq, &mut q);
        let mut kva = vec![0f32; t_n * lat_w];
        kernels::matmul(pool, isa, &self.kv_a, h, t_n, &mut w.xq, &mut kva);
        let (rope, positions) = (s.rope, &s.batch.positions);
        pool.par_rows(&mut kva, lat_w, |t, row| {
            let (lat, kpe) = row.split_at_mut(c.kv_lora_rank);
            let mut normed = vec![0f32; c.kv_lora_rank];
            kernels::rms_norm(lat, &self.kv_a_ln, LORA_NORM_EPS, &mut normed);
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
    /// each row's selection: `[tokens × heads·v]`, one row per task.
    fn attend(&self, s: &Step<'_>, q: &[f32], lat_cache: &[f32], sel: &Selection) -> Vec<f32> {
        let (c, batch, isa) = (s.cfg, s.batch, s.isa);
        let hq = c.qk_nope + c.qk_rope;
        let lat_w = c.kv_lora_rank + c.qk_rope;
        let softmax_scale = 1.0 / (hq as f32).sqrt();
        let (vd, kvl) = (c.v_dim, c.kv_lora_rank);
        let mut attn = vec![0f32; batch.num_tokens() * c.heads * vd];
        let rope = c.qk_rope;
        s.pool.par_rows(&mut attn, c.heads * vd, |t, out| {
            let pos = batch.positions[t] as usize;
            let slots = &batch.kv_slots(s.row_seq[t] as usize)[..=pos];
            // The token's absorbed queries and rotary parts, all heads.
            let mut qa = vec![0f32; c.heads * kvl];
            let mut qp = vec![0f32; c.heads * rope];
            for hd in 0..c.heads {
                let qh = &q[t * c.heads * hq + hd * hq..t * c.heads * hq + (hd + 1) * hq];
                let (qn, qpe) = qh.split_at(c.qk_nope);
                let qabs = &mut qa[hd * kvl..(hd + 1) * kvl];
                let uk = &self.w_uk[hd];
                for (i, &qv) in qn.iter().enumerate() {
                    kernels::axpy(isa, qv, &uk[i * kvl..(i + 1) * kvl], qabs);
                }
                qp[hd * rope..(hd + 1) * rope].copy_from_slice(qpe);
            }
            // Which keys get scores, and which of them (positions) attention reads.
            let all_pos: Vec<u32>;
            let (scored, chosen): (Vec<u32>, &[u32]) = match (&sel[t], s.attn_impl(t)) {
                (None, _) => {
                    all_pos = (0..slots.len() as u32).collect();
                    (slots.to_vec(), &all_pos)
                }
                (Some(sel), AttnImpl::Sparse) => (sel.iter().map(|&p| slots[p as usize]).collect(), sel),
                // Score every key, then keep the selected ones: the work of dense attention
                // with the sparse result (masked keys would add exp(−∞) = 0).
                (Some(sel), AttnImpl::Dense) => (slots.to_vec(), sel),
            };
            let dense_sel = matches!((&sel[t], s.attn_impl(t)), (Some(_), AttnImpl::Dense));
            let n = scored.len();
            let mut all = vec![0f32; c.heads * n];
            kernels::mla_scores(isa, &qa, &qp, c.heads, kvl, rope, lat_cache, &scored, softmax_scale, &mut all);
            let mut lat = vec![0f32; kvl];
            let mut scores: Vec<f32> = Vec::with_capacity(chosen.len());
            for hd in 0..c.heads {
                let row = &all[hd * n..(hd + 1) * n];
                scores.clear();
                if dense_sel {
                    scores.extend(chosen.iter().map(|&p| row[p as usize]));
                } else {
                    scores.extend_from_slice(row);
                }
                let mx = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0f32;
                for v in scores.iter_mut() {
                    *v = (*v - mx).exp();
                    sum += *v;
                }
                lat.iter_mut().for_each(|v| *v = 0.0);
                let inv = 1.0 / sum;
                for (n, &p) in chosen.iter().enumerate() {
                    let slot = slots[p as usize] as usize;
                    kernels::axpy(isa, scores[n] * inv, &lat_cache[slot * lat_w..slot * lat_w + kvl], &mut lat);
                }
                let o = &mut out[hd * vd..(hd + 1) * vd];
                let uv = &self.w_uv[hd];
                for (j, ov) in o.iter_mut().enumerate() {
                    *ov = kernels::dot(isa, &uv[j * kvl..(j + 1) * kvl], &lat);
                }
            }
        });
        attn
    }
}
