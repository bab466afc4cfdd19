//! The self-attention layer of the Llama-layer decoder (Vaswani et al. 2017 §3.2.2,
//! grouped-query heads as Ainslie et al. 2023): the fused QKV projection, per-head Q/K norms and
//! RoPE, the new K and V into their cache slots, causal attention over each sequence's slot list
//! (`kernels::flash_attend`: tasks of one KV group × a query block, longest first), Qwen3-Next's
//! output gate, the output projection.

use super::{LayerBuffers, Step};
use crate::batch::ForwardBatch;
use crate::kv::{KvDtype, KvStore};
use crate::model::linear::{Fwd, Linear};
use sparrow_cpu::half::Fp8;
use sparrow_cpu::kernels;
use sparrow_cpu::Isa;
use sparrow_cpu::ThreadPool;

/// A self-attention layer's weights.
pub(crate) struct Attention {
    /// Q, K and V stacked (`[q_dim + 2·kv_dim × hidden]`; with [`Variant::attn_gate`] the
    /// query part is `2·q_dim` rows, each head's query then its gate).
    pub(crate) qkv: Linear,
    pub(crate) wo: Linear,
    /// Per-head Q and K norms (`head_dim` each), with [`Variant::qk_norm`].
    pub(crate) qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    /// Attention sinks, one logit per query head (gpt-oss's `attn_sinks`).
    pub(crate) sinks: Option<Vec<f32>>,
    /// The layer's index in the KV cache (its attention layers counted; the layer index in a
    /// model without recurrent layers).
    pub(crate) kv_layer: usize,
}

/// Tokens per attention query block: with 3 heads per KV group, 96 query rows share each key
/// block converted from f16 (32 and key blocks of 128 timed best at 4k tokens, against 16/64,
/// 32/256 and 64/128).
const QUERY_BLOCK: usize = 32;

/// One attention task: sequence `seq`, KV group `g`, its tokens `i0..i1` (relative to the
/// sequence's first new token).
#[derive(Clone, Copy)]
pub(super) struct AttnTask {
    seq: usize,
    g: usize,
    i0: usize,
    i1: usize,
}

/// The step's attention tasks, longest first, and the range of `attn_t` each writes: sequence
/// `s` (first token `ts`, `len` tokens) owns `attn_t[ts·h .. (ts + len)·h]`, laid out
/// `[group g][token i][group·hd]`, so a task's rows are contiguous.
pub(super) fn attention_tasks(
    batch: &ForwardBatch,
    kv_heads: usize,
    ghd: usize,
) -> (Vec<AttnTask>, Vec<std::ops::Range<usize>>) {
    let h = kv_heads * ghd;
    let mut tasks = Vec::new();
    for (seq, sq) in batch.seqs.iter().enumerate() {
        let len = sq.extend_len as usize;
        for g in 0..kv_heads {
            for i0 in (0..len).step_by(QUERY_BLOCK) {
                tasks.push(AttnTask { seq, g, i0, i1: (i0 + QUERY_BLOCK).min(len) });
            }
        }
    }
    // Work ≈ tokens × keys of the block's last token.
    tasks.sort_by_key(|t| {
        let sq = &batch.seqs[t.seq];
        std::cmp::Reverse((t.i1 - t.i0) * (sq.prefix_len as usize + t.i1))
    });
    let ranges = tasks
        .iter()
        .map(|t| {
            let sq = &batch.seqs[t.seq];
            let base = sq.token_start as usize * h + (t.g * sq.extend_len as usize + t.i0) * ghd;
            base..base + (t.i1 - t.i0) * ghd
        })
        .collect();
    (tasks, ranges)
}

thread_local! {
    static FLASH: std::cell::RefCell<kernels::FlashScratch> = std::cell::RefCell::new(kernels::FlashScratch::default());
}

impl Attention {
    /// Layer `l`'s self-attention (Vaswani et al. 2017 §3.2.2, grouped-query heads as Ainslie
    /// et al. 2023): the normed input `s.h` (`[tokens, hidden]`) → fused QKV → per-head QK norm
    /// and RoPE → the new K and V into their cache slots → causal attention over each
    /// sequence's slots → [× σ(gate), Qwen3-Next] → output projection, in `s.proj`
    /// (`[tokens, hidden]`).
    pub(super) fn forward(&self, cx: &mut Fwd, st: &Step, l: usize, s: &mut LayerBuffers, kv: &mut KvStore) {
        let t_n = st.batch.num_tokens();
        self.qkv.forward(cx, &s.h, t_n, &mut s.qkv);
        self.qk_norm_rope(cx.pool, st, l, &mut s.qkv);
        let (pool, isa, kl) = (cx.pool, cx.isa, self.kv_layer);
        cx.timed(
            |p| &mut p.attention,
            || {
                write_kv(isa, st, kl, &s.qkv, kv);
                attend(pool, isa, st, l, kl, self.sinks.as_deref(), s, kv);
            },
        );
        if st.c.variant.attn_gate {
            // Qwen3-Next's output gate: `attn · σ(gate)` per value (`build_layer_attn`).
            let (qkv, w, g0, qd) = (&s.qkv, st.qkv_w, st.qd + 2 * st.kvd, st.qd);
            pool.par_rows(&mut s.attn, qd, |t, row| {
                let gate = &qkv[t * w + g0..t * w + g0 + qd];
                row.iter_mut().zip(gate).for_each(|(a, g)| *a *= kernels::recurrent::sigmoid(*g));
            });
        }
        self.wo.forward(cx, &s.attn, t_n, &mut s.proj);
    }

    /// Per-head RMSNorm of Q and K (Qwen3, Gemma 3), then RoPE on the layer's rotated
    /// dimensions (none on SmolLM3's NoPE layers), in place in the QKV rows. A gated layer's
    /// rows are first reordered from `[q_0 g_0 q_1 g_1 … | k | v]` to `[q | k | v | g]`.
    fn qk_norm_rope(&self, pool: &ThreadPool, st: &Step, l: usize, qkv: &mut [f32]) {
        let (c, var) = (st.c, &st.c.variant);
        let (hd, qd, kvd) = (c.head_dim, st.qd, st.kvd);
        let rope = match (var.windows[l], st.rope_local) {
            (Some(_), Some(local)) => local,
            _ => st.rope,
        };
        let (layout, eps, rotate, temp) = (var.rope_layout, c.rms_eps, !var.no_rope[l], var.attn_temperature);
        let qk_norm = self.qk_norm.as_ref();
        let gated = var.attn_gate;
        pool.par_rows(qkv, st.qkv_w, |t, row| {
            let pos = st.batch.positions[t] as usize;
            if gated {
                let qg = row[..2 * qd].to_vec();
                row.copy_within(2 * qd..2 * qd + 2 * kvd, qd);
                for (h, pair) in qg.chunks_exact(2 * hd).enumerate() {
                    row[h * hd..(h + 1) * hd].copy_from_slice(&pair[..hd]);
                    let g = qd + 2 * kvd + h * hd;
                    row[g..g + hd].copy_from_slice(&pair[hd..]);
                }
            }
            let (q, rest) = row.split_at_mut(qd);
            let k = &mut rest[..kvd];
            if let Some((qn, kn)) = qk_norm {
                // Every head of the token at once: their sums run side by side.
                kernels::rms_norm_in_place(q, qn, eps);
                kernels::rms_norm_in_place(k, kn, eps);
            }
            if rotate {
                rope.rotate_heads_of(q, hd, pos, layout);
                rope.rotate_heads_of(k, hd, pos, layout);
            }
            if let Some(t) = temp {
                // Llama 4's temperature on the rotated queries (llama.cpp's `Qcur · attn_scale`).
                let f = t.factor(pos);
                q.iter_mut().for_each(|v| *v *= f);
            }
        });
    }
}

/// The new tokens' K and V (from the fused QKV rows, `[tokens, q_dim + 2·kv_dim (+ q_dim)]`)
/// into their slots (`batch.out_cache_loc`) of KV layer `l`, in the cache's element type.
fn write_kv(isa: Isa, st: &Step, l: usize, qkv: &[f32], kv: &mut KvStore) {
    let (qd, kvd, qkv_w) = (st.qd, st.kvd, st.qkv_w);
    let rows = |t: usize| {
        let (k, v) = qkv[t * qkv_w + qd..t * qkv_w + qd + 2 * kvd].split_at(kvd);
        (k, v, st.batch.out_cache_loc[t] as usize * kvd)
    };
    let t_n = st.batch.num_tokens();
    match st.kv_dtype {
        KvDtype::F16 | KvDtype::Bf16 => {
            let (kc, vc) = kv.pair_mut_u16(l);
            for t in 0..t_n {
                let (k, v, at) = rows(t);
                if st.kv_dtype == KvDtype::F16 {
                    kernels::to_f16(isa, k, &mut kc[at..at + kvd]);
                    kernels::to_f16(isa, v, &mut vc[at..at + kvd]);
                } else {
                    kc[at..at + kvd].iter_mut().zip(k).for_each(|(d, x)| *d = sparrow_cpu::half::f32_to_bf16(*x));
                    vc[at..at + kvd].iter_mut().zip(v).for_each(|(d, x)| *d = sparrow_cpu::half::f32_to_bf16(*x));
                }
            }
        }
        _ => {
            let f = if st.kv_dtype == KvDtype::Fp8E4m3 { Fp8::E4M3 } else { Fp8::E5M2 };
            let (kc, vc) = kv.pair_mut_u8(l);
            for t in 0..t_n {
                let (k, v, at) = rows(t);
                kc[at..at + kvd].iter_mut().zip(k).for_each(|(d, x)| *d = f.encode(*x));
                vc[at..at + kvd].iter_mut().zip(v).for_each(|(d, x)| *d = f.encode(*x));
            }
        }
    }
}

/// Causal attention of layer `l` (KV layer `kl`): every new token's query heads (in `s.qkv`)
/// over its sequence's cached K and V (its sliding window on window layers), one task per KV
/// group × query block (`kernels::flash_attend`, written to `s.attn_t` in task order), then
/// back to token rows in `s.attn` (`[tokens, q_dim]`).
#[allow(clippy::too_many_arguments)]
fn attend(
    pool: &ThreadPool,
    isa: Isa,
    st: &Step,
    l: usize,
    kl: usize,
    sinks: Option<&[f32]>,
    s: &mut LayerBuffers,
    kv: &KvStore,
) {
    let (c, batch) = (st.c, st.batch);
    let (hd, kvd, qd, qkv_w, ghd, group) = (c.head_dim, st.kvd, st.qd, st.qkv_w, st.ghd, st.group);
    let (scale, window) = (c.variant.attn_scale, c.variant.windows[l]);
    // Generic over the element type the cache holds.
    macro_rules! attend {
        ($kc:expr, $vc:expr) => {{
            let (kc, vc) = ($kc, $vc);
            let qkv = &s.qkv;
            pool.par_ranges(&mut s.attn_t, &st.ranges, |task, o| {
                let AttnTask { seq, g, i0, i1 } = st.tasks[task];
                let sinks = sinks.map(|s| &s[g * group..(g + 1) * group]);
                let ts = batch.seqs[seq].token_start as usize;
                let slots = batch.kv_slots(seq);
                let view = kernels::KvView { k: kc, v: vc, stride: kvd, off: g * hd, slots };
                let q = &qkv[(ts + i0) * qkv_w + g * ghd..];
                let pos = &batch.positions[ts + i0..ts + i1];
                let past_window = |w: usize| pos.iter().any(|&p| p as usize >= w);
                match window {
                    // When some token's window starts past position 0, every token of the
                    // block attends alone over a view that starts at its window, so it reads
                    // its window only and its arithmetic does not depend on the other tokens
                    // of the block.
                    Some(w) if past_window(w) => {
                        for (i, &p) in pos.iter().enumerate() {
                            let lo = (p as usize + 1).saturating_sub(w);
                            let view = kernels::KvView { slots: &slots[lo..], ..view };
                            let rel = [p - lo as u32];
                            let q = &q[i * qkv_w..];
                            let o = &mut o[i * ghd..(i + 1) * ghd];
                            FLASH.with_borrow_mut(|sc| {
                                kernels::flash_attend_sinks(isa, q, qkv_w, &rel, group, hd, &view, scale, sinks, sc, o)
                            });
                        }
                    }
                    _ => FLASH.with_borrow_mut(|sc| {
                        kernels::flash_attend_sinks(isa, q, qkv_w, pos, group, hd, &view, scale, sinks, sc, o)
                    }),
                }
            });
            // Back to token rows: token t's group g from its sequence's `[g][i]` layout.
            let (at, row_seq) = (&s.attn_t, &s.row_seq);
            pool.par_rows(&mut s.attn, qd, |t, row| {
                let sq = &batch.seqs[row_seq[t] as usize];
                let (ts, len) = (sq.token_start as usize, sq.extend_len as usize);
                for g in 0..c.kv_heads {
                    let src = ts * qd + (g * len + t - ts) * ghd;
                    row[g * ghd..(g + 1) * ghd].copy_from_slice(&at[src..src + ghd]);
                }
            });
        }};
    }
    match st.kv_dtype {
        KvDtype::F16 => attend!(kv.component_f16(kl, 0), kv.component_f16(kl, 1)),
        KvDtype::Bf16 => attend!(kernels::as_bf16(kv.component_u16(kl, 0)), kernels::as_bf16(kv.component_u16(kl, 1))),
        KvDtype::Fp8E4m3 => attend!(kernels::as_e4m3(kv.component_u8(kl, 0)), kernels::as_e4m3(kv.component_u8(kl, 1))),
        KvDtype::Fp8E5m2 => attend!(kernels::as_e5m2(kv.component_u8(kl, 0)), kernels::as_e5m2(kv.component_u8(kl, 1))),
        KvDtype::F32 => attend!(kv.component(kl, 0), kv.component(kl, 1)),
    }
}
