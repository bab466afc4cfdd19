//! GQA attention of one KV group over a list of KV slots, f32 or f16 cache.
#![allow(unsafe_code)]

use super::elementwise::{axpy, dot_scalar};
use crate::isa::Isa;

/// An element of the KV cache: f32, or IEEE half stored as `u16` bits.
pub trait KvElem: Copy + Send + Sync + 'static {
    /// The value as f32.
    fn to_f32(self) -> f32;
    /// Loads 8 consecutive values as f32.
    ///
    /// # Safety
    /// `p` must point at 8 readable values; AVX (and F16C for `u16`) must be available.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
}

impl KvElem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        std::arch::x86_64::_mm256_loadu_ps(p)
    }
}

impl KvElem for u16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        crate::half::f16_to_f32(self)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const u16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
}

/// Causal attention of the `group` query heads that share one KV head (GQA), over the KV
/// slots `slots` (positions `0 ..= p` of one sequence): for each head `h`,
/// `out_h = Σ_j softmax_j(scale · q_h·k_j) · v_j`.
///
/// Shapes: `q` and `out` are `[group × hd]`; key and value of slot `s` are
/// `k[s·stride + off ..][..hd]` and `v[...]` likewise. `scores` is scratch. Each K and V row is
/// read once for all heads of the group.
#[allow(clippy::too_many_arguments)]
pub fn attend_group<E: KvElem>(
    isa: Isa,
    q: &[f32],
    hd: usize,
    k: &[E],
    v: &[E],
    stride: usize,
    off: usize,
    slots: &[u32],
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let group = q.len() / hd;
    let n = slots.len();
    scores.resize(group * n, 0.0);
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && hd.is_multiple_of(8) && group <= 8 {
        // SAFETY: AVX2+FMA were detected; indices are checked by the slice bounds below.
        unsafe { x86::attn_scores(q, hd, group, k, stride, off, slots, scale, scores) };
    } else {
        attn_scores_scalar(q, hd, group, k, stride, off, slots, scale, scores);
    }
    #[cfg(not(target_arch = "x86_64"))]
    attn_scores_scalar(q, hd, group, k, stride, off, slots, scale, scores);
    for h in 0..group {
        let sc = &mut scores[h * n..(h + 1) * n];
        let mx = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for x in sc.iter_mut() {
            *x = (*x - mx).exp();
            sum += *x;
        }
        let inv = 1.0 / sum;
        sc.iter_mut().for_each(|x| *x *= inv);
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Vnni && hd == 64 && group == 3 {
        // SAFETY: Vnni implies AVX-512F/VL (32 vector registers hold all 24 accumulators).
        unsafe { x86::attn_values_g3_hd64(scores, v, stride, off, slots, out) };
        return;
    }
    out.iter_mut().for_each(|o| *o = 0.0);
    let mut vr = vec![0f32; hd];
    for (j, &slot) in slots.iter().enumerate() {
        let base = slot as usize * stride + off;
        vr.iter_mut().zip(&v[base..base + hd]).for_each(|(d, s)| *d = s.to_f32());
        for h in 0..group {
            axpy(isa, scores[h * n + j], &vr, &mut out[h * hd..(h + 1) * hd]);
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn attn_scores_scalar<E: KvElem>(
    q: &[f32],
    hd: usize,
    group: usize,
    k: &[E],
    stride: usize,
    off: usize,
    slots: &[u32],
    scale: f32,
    scores: &mut [f32],
) {
    let n = slots.len();
    let mut kr = vec![0f32; hd];
    for (j, &slot) in slots.iter().enumerate() {
        let base = slot as usize * stride + off;
        kr.iter_mut().zip(&k[base..base + hd]).for_each(|(d, s)| *d = s.to_f32());
        for h in 0..group {
            scores[h * n + j] = dot_scalar(&q[h * hd..(h + 1) * hd], &kr) * scale;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use crate::kernels::hsum;
    use std::arch::x86_64::*;

    /// Scores of up to 8 heads against each key, every key row loaded once.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn attn_scores<E: KvElem>(
        q: &[f32],
        hd: usize,
        group: usize,
        k: &[E],
        stride: usize,
        off: usize,
        slots: &[u32],
        scale: f32,
        scores: &mut [f32],
    ) {
        let n = slots.len();
        let qp = q.as_ptr();
        for (j, &slot) in slots.iter().enumerate() {
            let base = slot as usize * stride + off;
            let kr = &k[base..base + hd];
            let kp = kr.as_ptr();
            let mut acc = [_mm256_setzero_ps(); 8];
            let mut c = 0;
            while c < hd {
                let kv = E::load8(kp.add(c));
                for h in 0..group {
                    acc[h] = _mm256_fmadd_ps(kv, _mm256_loadu_ps(qp.add(h * hd + c)), acc[h]);
                }
                c += 8;
            }
            for h in 0..group {
                scores[h * n + j] = hsum(acc[h]) * scale;
            }
        }
    }

    /// `out_h = Σ_j p[h][j] · v_j` for 3 heads of 64 dims with all accumulators in registers:
    /// each V row is read once, and `out` is written once. Same summation order as the
    /// generic path (slot by slot), so results do not depend on which path ran... per ISA.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
    pub(super) unsafe fn attn_values_g3_hd64<E: KvElem>(
        p: &[f32],
        v: &[E],
        stride: usize,
        off: usize,
        slots: &[u32],
        out: &mut [f32],
    ) {
        let n = slots.len();
        let mut acc = [[_mm256_setzero_ps(); 8]; 3];
        for (j, &slot) in slots.iter().enumerate() {
            let base = slot as usize * stride + off;
            let vr = &v[base..base + 64];
            let vp = vr.as_ptr();
            let w = [_mm256_set1_ps(p[j]), _mm256_set1_ps(p[n + j]), _mm256_set1_ps(p[2 * n + j])];
            for c in 0..8 {
                let vv = E::load8(vp.add(c * 8));
                for h in 0..3 {
                    acc[h][c] = _mm256_fmadd_ps(w[h], vv, acc[h][c]);
                }
            }
        }
        let o = &mut out[..192];
        for h in 0..3 {
            for c in 0..8 {
                _mm256_storeu_ps(o.as_mut_ptr().add(h * 64 + c * 8), acc[h][c]);
            }
        }
    }
}
