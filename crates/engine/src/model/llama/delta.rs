//! The Gated DeltaNet layer of the hybrid families (Yang, Kautz & Hatamizadeh 2024; Qwen3-Next
//! and Qwen3.5's `linear_attention` layers), as llama.cpp's `src/models/qwen35.cpp`
//! (`build_layer_attn_linear`) and `delta-net-base.cpp` run it:
//!
//! normed input → one stacked projection `[q k v | z | b | a]` → causal depthwise conv1d of
//! `q k v` with the request's carried window, SiLU → per head: `q`, `k` L2-normed, `q · 1/√d_k`;
//! `β = σ(b)`, `g = softplus(a + dt_bias) · A` (`A = −exp(A_log)`, as the file stores it) →
//! the gated delta rule per value head over the request's `d_k × d_v` state (value head `h`
//! reads key head `h mod k_heads` in Qwen3.5 files, whose converter reorders HF's grouped value
//! heads to this tiled order, and `h / (v_heads / k_heads)` in Qwen3-Next files, where β and
//! the decay's inputs also come fused in `ssm_ba`: [`GdnLayout`]) → RMSNorm per head · weight ·
//! SiLU(z) → output projection.
//!
//! The window and the state live in the KV store's state pool ([`crate::kv::state`]) at the
//! sequence's `req_pool_idx`; a sequence whose row starts at position 0 starts from zeros.

use super::conv::{decay_rates, slot_states, ShortConv};
use super::{LayerBuffers, Step};
use crate::kv::KvStore;
use crate::model::family::GdnLayout;
use crate::model::hparams::LinearAttnParams;
use crate::model::linear::{Fwd, Linear};
use crate::model::vb::Vb;
use crate::EngineError;
use sparrow_cpu::kernels::recurrent::{self, DeltaToken};
use sparrow_cpu::Weight;

/// One Gated DeltaNet layer's weights and widths.
pub(crate) struct DeltaNet {
    /// `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a` stacked:
    /// `[conv_dim + inner + 2·v_heads × hidden]`.
    pub(crate) in_proj: Linear,
    /// `out_proj`, `[hidden × inner]`.
    pub(crate) out_proj: Linear,
    /// The short convolution over `q k v`.
    conv: ShortConv,
    /// The decay's bias per value head (`dt_bias`).
    dt_bias: Vec<f32>,
    /// `A = −exp(A_log)` per value head.
    a: Vec<f32>,
    /// The gated norm's weight, `d_v`.
    norm: Vec<f32>,
    /// Key (and value) head width.
    dk: usize,
    k_heads: usize,
    v_heads: usize,
    /// This layer's index among the recurrent layers (its place in the state pool).
    pub(crate) state_layer: usize,
    /// How the file lays out heads and β / decay inputs.
    layout: GdnLayout,
    eps: f32,
}

/// A step's buffers of the recurrent layers (Gated DeltaNet's, and Mamba-2's in the same roles).
#[derive(Default)]
pub(crate) struct Scratch {
    /// The stacked projection's output, `[tokens × (conv_dim + inner + 2·v_heads)]`.
    pub(super) proj: Vec<f32>,
    /// The convolution's input, then output, `[tokens × conv_dim]`.
    pub(super) conv: Vec<f32>,
    /// The convolution's output before it takes `conv`'s place.
    pub(super) conv_out: Vec<f32>,
    /// `g` then `β` per value head, `[tokens × 2·v_heads]` (Mamba-2: `Δ` then `exp(Δ·A)` per
    /// head).
    pub(super) gb: Vec<f32>,
    /// The recurrence's output per (sequence, head), `[head][token][d_v]` within each
    /// sequence's block.
    pub(super) out_t: Vec<f32>,
    /// The heads' outputs by token rows, `[tokens × inner]`.
    pub(super) core: Vec<f32>,
}

/// A Qwen3-Next checkpoint's `in_proj_qkvz` (`[k_heads · (2·d_k + 2·r·d_k) × hidden]`, per key
/// head its `q`, `k`, then its `r = v_heads / k_heads` value heads' `v` and `z` rows) as the
/// `[q all | k all | v all]` and `[z all]` projections the layer runs, the rows moved as
/// llama.cpp's `Qwen3NextModel.modify_tensors` moves them (value heads stay grouped by key
/// head).
///
/// # Errors
/// A missing tensor or one of another shape, named; a quantized one (read dense only).
///
/// Value heads are `d_k` wide here: [`DeltaNet::load`] refuses `d_v ≠ d_k` before this runs.
fn qwen3next_qkvz(la: &Vb<'_>, hidden: usize, dk: usize, kh: usize, vh: usize) -> Result<[Vec<f32>; 2], EngineError> {
    let (r, blk) = (vh / kh, 2 * dk + 2 * (vh / kh) * dk);
    let Weight::Dense { data, .. } = la.dense("in_proj_qkvz", kh * blk, hidden)? else {
        return Err(EngineError::model(format!("{}: only a dense in_proj_qkvz is read", la.path("in_proj_qkvz"))));
    };
    let rows = |b: usize, from: usize, n: usize| &data[(b * blk + from) * hidden..(b * blk + from + n) * hidden];
    let (mut qkv, mut z) = (Vec::with_capacity((2 * kh + vh) * dk * hidden), Vec::with_capacity(vh * dk * hidden));
    for (from, n) in [(0, dk), (dk, dk), (2 * dk, r * dk)] {
        (0..kh).for_each(|b| qkv.extend_from_slice(rows(b, from, n)));
    }
    (0..kh).for_each(|b| z.extend_from_slice(rows(b, 2 * dk + r * dk, r * dk)));
    Ok([qkv, z])
}

/// [`qwen3next_qkvz`] as the layer's first two projections.
fn qkvz_parts(la: &Vb<'_>, hidden: usize, dk: usize, kh: usize, vh: usize) -> Result<Vec<Linear>, EngineError> {
    let [qkv, z] = qwen3next_qkvz(la, hidden, dk, kh, vh)?;
    let name = la.path("in_proj_qkvz");
    Ok(vec![
        Linear::new(Weight::Dense { rows: (2 * kh + vh) * dk, cols: hidden, data: qkv }, vec![name.clone()]),
        Linear::new(Weight::Dense { rows: vh * dk, cols: hidden, data: z }, vec![name]),
    ])
}

impl DeltaNet {
    /// Layer `vb` (`model.layers.{l}`)'s `linear_attn` under llama.cpp's names (through the
    /// GGUF name table `QWEN35_LAYER_NAMES`), `state_layer`-th of the recurrent layers.
    ///
    /// # Errors
    /// A missing tensor or one of another shape, named; value heads not a multiple of key heads.
    pub(crate) fn load(
        vb: &Vb<'_>,
        hidden: usize,
        p: &LinearAttnParams,
        layout: GdnLayout,
        state_layer: usize,
        eps: f32,
    ) -> Result<DeltaNet, EngineError> {
        let (dk, kh, vh) = (p.head_k, p.k_heads, p.v_heads);
        if vh % kh != 0 || p.inner != vh * dk {
            return Err(EngineError::model(format!(
                "{}: {vh} value heads over {kh} key heads of {dk}, inner size {} (want value heads a multiple of \
                 key heads and inner = value heads × {dk})",
                vb.path("linear_attn"),
                p.inner
            )));
        }
        let la = vb.pp("linear_attn");
        let conv_dim = 2 * kh * dk + p.inner;
        let mut parts = match la.has("in_proj_qkvz.weight") {
            true => qkvz_parts(&la, hidden, dk, kh, vh)?,
            false => vec![la.linear("in_proj_qkv", conv_dim, hidden)?, la.linear("in_proj_z", p.inner, hidden)?],
        };
        match layout.fused_ba {
            true => parts.push(la.linear("in_proj_ba", 2 * vh, hidden)?),
            false => parts.extend([la.linear("in_proj_b", vh, hidden)?, la.linear("in_proj_a", vh, hidden)?]),
        }
        let in_proj = Linear::stack(parts);
        Ok(DeltaNet {
            in_proj,
            out_proj: la.linear("out_proj", hidden, p.inner)?,
            conv: ShortConv::load(&la, conv_dim, p.conv_kernel)?,
            dt_bias: la.vector("dt_bias", vh)?,
            a: decay_rates(&la, vh)?,
            norm: la.vector("norm.weight", dk)?,
            dk,
            k_heads: kh,
            v_heads: vh,
            state_layer,
            layout,
            eps,
        })
    }

    /// Channels of the convolution (`q`, `k` and `v` of all heads).
    fn conv_dim(&self) -> usize {
        (2 * self.k_heads + self.v_heads) * self.dk
    }

    /// f32 values of one request's convolution window in this layer.
    pub(crate) fn conv_state_len(&self) -> usize {
        self.conv.state_len()
    }

    /// f32 values of one request's delta-rule state in this layer.
    pub(crate) fn ssm_state_len(&self) -> usize {
        self.v_heads * self.dk * self.dk
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
        let (dk, kh, vh) = (self.dk, self.k_heads, self.v_heads);
        let (cd, inner) = (self.conv_dim(), vh * dk);
        let pw = cd + inner + 2 * vh;
        let pool = cx.pool;
        let (conv_states, ssm_states) = slot_states(kv, batch, self.state_layer)?;
        let d = &mut s.delta;
        d.proj.resize(t_n * pw, 0.0);
        d.conv.resize(t_n * cd, 0.0);
        d.gb.resize(t_n * 2 * vh, 0.0);
        d.out_t.resize(t_n * inner, 0.0);
        d.core.resize(t_n * inner, 0.0);
        self.in_proj.forward(cx, &s.h, t_n, &mut d.proj);
        // The convolution's input rows, and each token's decay and write strength.
        let (proj, dt_bias, a) = (&d.proj, &self.dt_bias, &self.a);
        let (r, fused) = (vh / kh, self.layout.fused_ba);
        // Where value head `h`'s `b` and `a` sit after `[qkv | z]`: `[b | a]`, or per key head
        // `[b × r, a × r]` (Qwen3-Next's `ssm_ba`).
        type At = fn(usize, usize, usize) -> usize;
        let (b_at, a_at): (At, At) = match fused {
            true => (
                |h: usize, r: usize, _vh: usize| (h / r) * 2 * r + h % r,
                |h: usize, r: usize, _vh: usize| (h / r) * 2 * r + r + h % r,
            ),
            false => (|h: usize, _r: usize, _vh: usize| h, |h: usize, _r: usize, vh: usize| vh + h),
        };
        pool.par_row_chunks2(&mut d.conv, cd, &mut d.gb, 2 * vh, |r0, conv, gb| {
            for (i, (c, g)) in conv.chunks_exact_mut(cd).zip(gb.chunks_exact_mut(2 * vh)).enumerate() {
                let row = &proj[(r0 + i) * pw..(r0 + i + 1) * pw];
                c.copy_from_slice(&row[..cd]);
                let ba = &row[cd + inner..];
                for h in 0..vh {
                    g[h] = recurrent::softplus(ba[a_at(h, r, vh)] + dt_bias[h]) * a[h];
                    g[vh + h] = recurrent::sigmoid(ba[b_at(h, r, vh)]);
                }
            }
        });
        // The token mixing (convolution, norms, delta rule) counts as the layer's attention.
        let clock = std::time::Instant::now();
        self.conv.forward(pool, batch, &s.row_seq, &d.conv, &mut d.conv_out, conv_states);
        std::mem::swap(&mut d.conv, &mut d.conv_out);
        // Per token: q and k of each key head L2-normed, q scaled by 1/√d_k.
        let (eps, scale) = (self.eps, 1.0 / (dk as f32).sqrt());
        pool.par_rows(&mut d.conv, cd, |_, row| {
            for (h, x) in row[..2 * kh * dk].chunks_exact_mut(dk).enumerate() {
                recurrent::l2_norm_in_place(x, eps);
                if h < kh {
                    x.iter_mut().for_each(|v| *v *= scale);
                }
            }
        });
        // The delta rule per (sequence, value head) over the slot's state.
        let mut state_ranges = Vec::with_capacity(batch.seqs.len() * vh);
        let mut out_ranges = Vec::with_capacity(batch.seqs.len() * vh);
        for q in &batch.seqs {
            let (slot, ts, n) = (q.req_pool_idx as usize, q.token_start as usize, q.extend_len as usize);
            for h in 0..vh {
                state_ranges.push((slot * vh + h) * dk * dk..(slot * vh + h + 1) * dk * dk);
                let base = ts * inner + h * n * dk;
                out_ranges.push(base..base + n * dk);
            }
        }
        let (conv, gb, grouped) = (&d.conv, &d.gb, self.layout.grouped_heads);
        pool.par_ranges2(ssm_states, &state_ranges, &mut d.out_t, &out_ranges, |task, state, out| {
            let (sq, h) = (&batch.seqs[task / vh], task % vh);
            if sq.prefix_len == 0 {
                state.fill(0.0);
            }
            let kq = if grouped { h / (vh / kh) } else { h % kh };
            let ts = sq.token_start as usize;
            let token = |t: usize| {
                let row = &conv[(ts + t) * cd..(ts + t + 1) * cd];
                let g = &gb[(ts + t) * 2 * vh..(ts + t + 1) * 2 * vh];
                DeltaToken {
                    q: &row[kq * dk..(kq + 1) * dk],
                    k: &row[(kh + kq) * dk..(kh + kq + 1) * dk],
                    v: &row[(2 * kh + h) * dk..(2 * kh + h + 1) * dk],
                    g: g[h],
                    beta: g[vh + h],
                }
            };
            recurrent::gated_delta_rule(state, sq.extend_len as usize, token, out);
        });
        if let Some(p) = cx.parts.as_deref_mut() {
            p.attention += clock.elapsed().as_secs_f64();
        }
        // Back to token rows, then the gated norm per head.
        let (out_t, row_seq, norm) = (&d.out_t, &s.row_seq, &self.norm);
        pool.par_rows(&mut d.core, inner, |t, row| {
            let sq = &batch.seqs[row_seq[t] as usize];
            let (ts, n) = (sq.token_start as usize, sq.extend_len as usize);
            for h in 0..vh {
                let src = ts * inner + (h * n + t - ts) * dk;
                row[h * dk..(h + 1) * dk].copy_from_slice(&out_t[src..src + dk]);
            }
            let z = &proj[t * pw + cd..t * pw + cd + inner];
            recurrent::gated_rms_norm(row, z, norm, eps);
        });
        self.out_proj.forward(cx, &d.core, t_n, &mut s.proj);
        Ok(())
    }
}
