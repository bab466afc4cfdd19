//! The two-pass GQA attention of earlier releases ([`attend_group`]: one KV group over a list of
//! KV slots: every score, then softmax, then values), kept as the benchmarks' baseline; the
//! live kernel is [`super::flash`]. It reads the cache through [`KvElem`].
#![allow(unsafe_code)]
// Register-tile loops index the tile's accumulators and its inputs by the same row or head.
#![allow(clippy::needless_range_loop)]

use super::elementwise::{axpy, dot_scalar};
use super::kv_elem::KvElem;
use crate::isa::Isa;

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
        super::elementwise::softmax_in_place(&mut scores[h * n..(h + 1) * n]);
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx512() && hd == 64 && group == 3 {
        // SAFETY: Vnni implies AVX-512F/VL (32 vector registers hold all 24 accumulators).
        unsafe { x86::attn_values_g3_hd64(scores, v, stride, off, slots, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && hd.is_multiple_of(32) && group <= 3 {
        // SAFETY: AVX2+FMA+F16C were detected; `out` holds group·hd values.
        unsafe { x86::attn_values(scores, group, hd, v, stride, off, slots, out) };
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

    /// `out_h = Σ_j p[h][j] · v_j` for up to 3 heads, 32 dimensions at a time so the 12
    /// accumulators, 3 weights and the V row fit in 16 registers: each V row is converted from
    /// f16 once per 32 dimensions for all heads (the generic path converts it in software). Same
    /// summation order as the generic path (slot by slot, one FMA per element), so the result
    /// is bit-identical to it.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn attn_values<E: KvElem>(
        p: &[f32],
        group: usize,
        hd: usize,
        v: &[E],
        stride: usize,
        off: usize,
        slots: &[u32],
        out: &mut [f32],
    ) {
        let n = slots.len();
        assert!(p.len() >= group * n && out.len() >= group * hd && group <= 3);
        for c0 in (0..hd).step_by(32) {
            let mut acc = [[_mm256_setzero_ps(); 4]; 3];
            for (j, &slot) in slots.iter().enumerate() {
                let base = slot as usize * stride + off + c0;
                let vr = &v[base..base + 32];
                let vp = vr.as_ptr();
                let vv = [E::load8(vp), E::load8(vp.add(8)), E::load8(vp.add(16)), E::load8(vp.add(24))];
                for h in 0..group {
                    let w = _mm256_set1_ps(*p.get_unchecked(h * n + j));
                    for c in 0..4 {
                        acc[h][c] = _mm256_fmadd_ps(w, vv[c], acc[h][c]);
                    }
                }
            }
            for h in 0..group {
                for c in 0..4 {
                    _mm256_storeu_ps(out.as_mut_ptr().add(h * hd + c0 + c * 8), acc[h][c]);
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    use crate::kernels::test_rand as lcg;

    /// The AVX2 value accumulation equals the generic slot-by-slot `axpy` loop bit for bit, and
    /// the whole attention equals an f64 softmax reference within f16/f32 rounding, for f16 and
    /// f32 caches, every group size the kernel takes and a non-contiguous slot list.
    #[test]
    fn attention_matches_reference_and_generic_values() {
        let (hd, kv_heads) = (64, 2);
        let stride = kv_heads * hd;
        let mut seed = 3u64;
        let nslots = 37;
        let kf: Vec<f32> = (0..nslots * stride).map(|_| lcg(&mut seed)).collect();
        let vf: Vec<f32> = (0..nslots * stride).map(|_| lcg(&mut seed)).collect();
        let kh: Vec<u16> = kf.iter().map(|&x| crate::half::f32_to_f16(x)).collect();
        let vh: Vec<u16> = vf.iter().map(|&x| crate::half::f32_to_f16(x)).collect();
        let slots: Vec<u32> = (0..nslots as u32).rev().step_by(2).chain([1, 3]).collect();
        for group in 1..=3 {
            let q: Vec<f32> = (0..group * hd).map(|_| lcg(&mut seed)).collect();
            for isa in Isa::available() {
                let mut out = vec![0f32; group * hd];
                let mut scores = Vec::new();
                attend_group(isa, &q, hd, &kh, &vh, stride, hd, &slots, 0.125, &mut scores, &mut out);
                // f64 reference on the f16-rounded cache.
                for h in 0..group {
                    let s: Vec<f64> = slots
                        .iter()
                        .map(|&j| {
                            (0..hd)
                                .map(|i| {
                                    q[h * hd + i] as f64
                                        * crate::half::f16_to_f32(kh[j as usize * stride + hd + i]) as f64
                                })
                                .sum::<f64>()
                                * 0.125
                        })
                        .collect();
                    let mx = s.iter().copied().fold(f64::MIN, f64::max);
                    let z: f64 = s.iter().map(|x| (x - mx).exp()).sum();
                    for i in 0..hd {
                        let want: f64 = slots
                            .iter()
                            .zip(&s)
                            .map(|(&j, x)| {
                                (x - mx).exp() / z * crate::half::f16_to_f32(vh[j as usize * stride + hd + i]) as f64
                            })
                            .sum();
                        assert!((out[h * hd + i] as f64 - want).abs() < 1e-5, "{isa:?} group {group}");
                    }
                }
                // The generic value loop on the same probabilities gives the same bits.
                let n = slots.len();
                let mut fast = vec![0f32; group * hd];
                attend_group(isa, &q, hd, &kf, &vf, stride, hd, &slots, 0.125, &mut scores, &mut fast);
                let mut generic = vec![0f32; group * hd];
                for (j, &slot) in slots.iter().enumerate() {
                    let vr: Vec<f32> = vf[slot as usize * stride + hd..][..hd].to_vec();
                    for h in 0..group {
                        axpy(isa, scores[h * n + j], &vr, &mut generic[h * hd..(h + 1) * hd]);
                    }
                }
                for (a, b) in fast.iter().zip(&generic) {
                    assert_eq!(a.to_bits(), b.to_bits(), "{isa:?} group {group}");
                }
            }
        }
    }
}
