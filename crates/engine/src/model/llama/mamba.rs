//! The Mamba-2 layer of Nemotron-H (Dao & Gu 2024, "Transformers are SSMs"; HF
//! `NemotronHMamba2Mixer`), as llama.cpp's `src/models/mamba-base.cpp` (`build_mamba2_layer`)
//! runs it:
//!
//! normed input → one projection `[z (d_inner) | x B C (d_inner + 2·n_group·d_state) | dt
//! (heads)]` → causal depthwise conv1d of `x B C` with the request's carried window, plus its
//! bias, SiLU → per head `h` (group `g = h / (heads / n_group)`): `Δ = softplus(dt + dt_bias)`,
//! the selective scan over the request's `d_state × head_dim` state with `exp(Δ · A)`
//! (`A = −exp(A_log)`, as the file stores it), `B` and `C` of group `g`, plus `D · x` →
//! `y · SiLU(z)` → RMSNorm per group of `d_inner / n_group` values · weight → output
//! projection.
//!
//! The scan runs in its recurrent form for every token, prefill chunks included (the chunked
//! SSD form regroups the same sums; see `kernels::recurrent`). The window and the state live in
//! the KV store's state pool ([`crate::kv::state`]) at the sequence's `req_pool_idx`; a
//! sequence whose row starts at position 0 starts from zeros.

use super::conv::{decay_rates, slot_states, ShortConv};
use super::{LayerBuffers, Step};
use crate::kv::KvStore;
use crate::model::hparams::LinearAttnParams;
use crate::model::linear::{Fwd, Linear};
use crate::model::vb::Vb;
use crate::EngineError;
use sparrow_cpu::kernels::recurrent::{self, SsmToken};

/// One Mamba-2 layer's weights and widths.
pub(crate) struct Mamba2 {
    /// `in_proj`, `[2·d_inner + 2·n_group·d_state + heads × hidden]`.
    pub(crate) in_proj: Linear,
    /// `out_proj`, `[hidden × d_inner]`.
    pub(crate) out_proj: Linear,
    /// The short convolution over `x B C`.
    conv: ShortConv,
    /// The step's bias per head (`dt_bias`).
    dt_bias: Vec<f32>,
    /// `A = −exp(A_log)` per head.
    a: Vec<f32>,
    /// The skip factor per head.
    d: Vec<f32>,
    /// The grouped norm's weight, `d_inner`.
    norm: Vec<f32>,
    heads: usize,
    head_dim: usize,
    groups: usize,
    d_state: usize,
    /// This layer's index among the recurrent layers (its place in the state pool).
    pub(crate) state_layer: usize,
    eps: f32,
}

impl Mamba2 {
    /// Layer `vb` (`model.layers.{l}`)'s `mixer` under llama.cpp's names (through
    /// `NEMOTRON_H_LAYER_NAMES`), `state_layer`-th of the recurrent layers. In `p`,
    /// `head_k` is `d_state`, `k_heads` the groups, `v_heads` the heads and `inner` `d_inner`.
    ///
    /// # Errors
    /// A missing tensor or one of another shape, named; heads or groups that do not divide
    /// `d_inner`, or groups that do not divide the heads.
    pub(crate) fn load(
        vb: &Vb<'_>,
        hidden: usize,
        p: &LinearAttnParams,
        state_layer: usize,
        eps: f32,
    ) -> Result<Mamba2, EngineError> {
        let (inner, ds, ng, nh) = (p.inner, p.head_k, p.k_heads, p.v_heads);
        if inner % nh != 0 || nh % ng != 0 {
            return Err(EngineError::model(format!(
                "{}: d_inner {inner} over {nh} heads in {ng} groups (want heads dividing d_inner and groups dividing \
                 heads)",
                vb.path("mixer")
            )));
        }
        let m = vb.pp("mixer");
        let cd = inner + 2 * ng * ds;
        Ok(Mamba2 {
            in_proj: m.linear("in_proj", inner + cd + nh, hidden)?,
            out_proj: m.linear("out_proj", hidden, inner)?,
            conv: ShortConv::load(&m, cd, p.conv_kernel)?,
            dt_bias: m.vector("dt_bias", nh)?,
            a: decay_rates(&m, nh)?,
            d: m.vector("D", nh)?,
            norm: m.vector("norm.weight", inner)?,
            heads: nh,
            head_dim: inner / nh,
            groups: ng,
            d_state: ds,
            state_layer,
            eps,
        })
    }

    /// f32 values of one request's convolution window in this layer.
    pub(crate) fn conv_state_len(&self) -> usize {
        self.conv.state_len()
    }

    /// f32 values of one request's SSM state in this layer (`heads × d_state × head_dim`).
    pub(crate) fn ssm_state_len(&self) -> usize {
        self.heads * self.head_dim * self.d_state
    }

    /// The layer over the step's normed input `s.h`, its output in `s.proj`; the window and
    /// state of each sequence's slot carried in `kv`'s state pool.
    ///
    /// # Errors
    /// A store without a state pool, or one too small for the batch's slots.
    pub(super) fn forward(
        &self,
        cx: &mut Fwd,
        st: &Step,
        s: &mut LayerBuffers,
        kv: &mut KvStore,
    ) -> Result<(), EngineError> {
        let batch = st.batch;
        let t_n = batch.num_tokens();
        let (nh, hd, ng, ds) = (self.heads, self.head_dim, self.groups, self.d_state);
        let inner = nh * hd;
        let cd = self.conv.channels;
        let pw = inner + cd + nh;
        let pool = cx.pool;
        let (conv_states, ssm_states) = slot_states(kv, batch, self.state_layer)?;
        let d = &mut s.delta;
        d.proj.resize(t_n * pw, 0.0);
        d.conv.resize(t_n * cd, 0.0);
        d.gb.resize(t_n * 2 * nh, 0.0);
        d.out_t.resize(t_n * inner, 0.0);
        d.core.resize(t_n * inner, 0.0);
        self.in_proj.forward(cx, &s.h, t_n, &mut d.proj);
        // The convolution's input rows, and each token's step and decay per head.
        let (proj, dt_bias, a) = (&d.proj, &self.dt_bias, &self.a);
        pool.par_row_chunks2(&mut d.conv, cd, &mut d.gb, 2 * nh, |r0, conv, gb| {
            for (i, (c, g)) in conv.chunks_exact_mut(cd).zip(gb.chunks_exact_mut(2 * nh)).enumerate() {
                let row = &proj[(r0 + i) * pw..(r0 + i + 1) * pw];
                c.copy_from_slice(&row[inner..inner + cd]);
                for h in 0..nh {
                    let dt = recurrent::softplus(row[inner + cd + h] + dt_bias[h]);
                    g[h] = dt;
                    g[nh + h] = (dt * a[h]).exp();
                }
            }
        });
        // The token mixing (convolution, scan) counts as the layer's attention.
        let clock = std::time::Instant::now();
        self.conv.forward(pool, batch, &s.row_seq, &d.conv, &mut d.conv_out, conv_states);
        std::mem::swap(&mut d.conv, &mut d.conv_out);
        // The scan per (sequence, head) over the slot's state.
        let mut state_ranges = Vec::with_capacity(batch.seqs.len() * nh);
        let mut out_ranges = Vec::with_capacity(batch.seqs.len() * nh);
        let sl = hd * ds;
        for q in &batch.seqs {
            let (slot, ts, n) = (q.req_pool_idx as usize, q.token_start as usize, q.extend_len as usize);
            for h in 0..nh {
                state_ranges.push((slot * nh + h) * sl..(slot * nh + h + 1) * sl);
                let base = ts * inner + h * n * hd;
                out_ranges.push(base..base + n * hd);
            }
        }
        let (conv, gb, skip) = (&d.conv, &d.gb, &self.d);
        pool.par_ranges2(ssm_states, &state_ranges, &mut d.out_t, &out_ranges, |task, state, out| {
            let (sq, h) = (&batch.seqs[task / nh], task % nh);
            if sq.prefix_len == 0 {
                state.fill(0.0);
            }
            let g = h / (nh / ng);
            let ts = sq.token_start as usize;
            let token = |t: usize| {
                let row = &conv[(ts + t) * cd..(ts + t + 1) * cd];
                let step = &gb[(ts + t) * 2 * nh..(ts + t + 1) * 2 * nh];
                SsmToken {
                    x: &row[h * hd..(h + 1) * hd],
                    b: &row[inner + g * ds..inner + (g + 1) * ds],
                    c: &row[inner + (ng + g) * ds..inner + (ng + g + 1) * ds],
                    dt: step[h],
                    da: step[nh + h],
                }
            };
            recurrent::ssm_scan(state, sq.extend_len as usize, skip[h], token, out);
        });
        if let Some(p) = cx.parts.as_deref_mut() {
            p.attention += clock.elapsed().as_secs_f64();
        }
        // Back to token rows, then the gate and the grouped norm.
        let (out_t, row_seq, norm, eps) = (&d.out_t, &s.row_seq, &self.norm, self.eps);
        pool.par_rows(&mut d.core, inner, |t, row| {
            let sq = &batch.seqs[row_seq[t] as usize];
            let (ts, n) = (sq.token_start as usize, sq.extend_len as usize);
            for h in 0..nh {
                let src = ts * inner + (h * n + t - ts) * hd;
                row[h * hd..(h + 1) * hd].copy_from_slice(&out_t[src..src + hd]);
            }
            let z = &proj[t * pw..t * pw + inner];
            recurrent::gate_group_rms_norm(row, z, norm, inner / ng, eps);
        });
        self.out_proj.forward(cx, &d.core, t_n, &mut s.proj);
        Ok(())
    }
}
