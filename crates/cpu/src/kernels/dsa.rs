//! Scores of DeepSeek sparse attention's lightning indexer (DeepSeek-V3.2 tech report §2; HF
//! transformers `modeling_glm_moe_dsa.py`, `GlmMoeDsaIndexer`): for one query with `heads`
//! index heads, `I_j = (Σ_h w_h · ReLU(q_h · k_j)) · kscale` over the keys `j` of its context.
//!
//! Every path computes each score with the same operations: `q_h · k_j` exactly as
//! [`dot`](super::dot) does on the ISA (8 lanes of FMAs over the dimension, then the tree of
//! `hsum`), then the heads summed in order, `acc = acc + w_h · max(d_h, 0)`, then `· kscale`;
//! so the top-k a query selects does not depend on which path ran. The AVX2 path scores 8 keys
//! at a time, heads in groups of 8: a group's 8 dot products with a key are 8 register
//! accumulators reduced together (`hsum8`), and 8 keys' results are transposed so the head sum
//! runs with keys in lanes.
#![allow(unsafe_code)]

use super::elementwise::dot;
use crate::isa::Isa;

/// Index scores of one query (`q`: `[heads × dim]`, `hw`: the per-head weights `w_h`) against
/// the keys of `slots` (key of slot `s` at `k[s·dim ..][..dim]`), written to `out[j]` for
/// `slots[j]`.
///
/// # Panics
/// When `out` is shorter than `slots`, or a slot is out of `k`.
#[allow(clippy::too_many_arguments)]
pub fn index_scores(
    isa: Isa,
    q: &[f32],
    heads: usize,
    dim: usize,
    hw: &[f32],
    k: &[f32],
    slots: &[u32],
    kscale: f32,
    out: &mut [f32],
) {
    assert!(out.len() >= slots.len() && q.len() >= heads * dim && hw.len() >= heads);
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && dim.is_multiple_of(8) {
        for &s in slots {
            assert!((s as usize + 1) * dim <= k.len(), "index_scores: slot {s} out of the cache");
        }
        // SAFETY: AVX2+FMA were detected; every key row is in `k` (checked above).
        unsafe { x86::index_scores(q, heads, dim, hw, k, slots, kscale, out) };
        return;
    }
    for (o, &slot) in out.iter_mut().zip(slots) {
        let kr = &k[slot as usize * dim..(slot as usize + 1) * dim];
        let mut acc = 0f32;
        for h in 0..heads {
            let d = dot(isa, &q[h * dim..(h + 1) * dim], kr);
            acc += hw[h] * d.max(0.0);
        }
        *o = acc * kscale;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use crate::kernels::{hsum8, transpose8};
    use std::arch::x86_64::*;

    /// Lane of head `h` in `hsum8`'s output.
    const LANE: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];

    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn index_scores(
        q: &[f32],
        heads: usize,
        dim: usize,
        hw: &[f32],
        k: &[f32],
        slots: &[u32],
        kscale: f32,
        out: &mut [f32],
    ) {
        let (qp, kp) = (q.as_ptr(), k.as_ptr());
        let n = slots.len();
        let zero = _mm256_setzero_ps();
        for j0 in (0..n).step_by(8) {
            let mut acc = zero;
            // Heads in groups of 8, in order: the head sum below runs h = 0, 1, 2, … .
            for h0 in (0..heads).step_by(8) {
                let hn = (heads - h0).min(8);
                let mut dots = [zero; 8];
                for (jj, d) in dots.iter_mut().enumerate() {
                    // A partial last group of keys repeats its last key (results not stored).
                    let kr = kp.add(slots[(j0 + jj).min(n - 1)] as usize * dim);
                    let qg = qp.add(h0 * dim);
                    *d = if hn == 8 { dots8(qg, kr, dim) } else { dots_partial(qg, hn, kr, dim) };
                }
                // by_lane[l] = lane l of every key's reduced vector: keys in lanes.
                let by_lane = transpose8(&dots);
                for h in 0..hn {
                    let rel = _mm256_max_ps(by_lane[LANE[h]], zero);
                    acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(hw[h0 + h]), rel));
                }
            }
            let mut res = [0f32; 8];
            _mm256_storeu_ps(res.as_mut_ptr(), _mm256_mul_ps(acc, _mm256_set1_ps(kscale)));
            let m = (n - j0).min(8);
            out[j0..j0 + m].copy_from_slice(&res[..m]);
        }
    }

    /// The 8 dot products `q_h · k` of 8 consecutive heads (`q`: `[8 × dim]`), reduced by
    /// `hsum8`: 8 accumulators over `dim / 8` chunks, all in registers.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dots8(q: *const f32, k: *const f32, dim: usize) -> __m256 {
        let mut a = [_mm256_setzero_ps(); 8];
        let mut c = 0;
        while c < dim {
            let kv = _mm256_loadu_ps(k.add(c));
            a[0] = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(c)), kv, a[0]);
            a[1] = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(dim + c)), kv, a[1]);
            a[2] = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(2 * dim + c)), kv, a[2]);
            a[3] = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(3 * dim + c)), kv, a[3]);
            a[4] = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(4 * dim + c)), kv, a[4]);
            a[5] = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(5 * dim + c)), kv, a[5]);
            a[6] = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(6 * dim + c)), kv, a[6]);
            a[7] = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(7 * dim + c)), kv, a[7]);
            c += 8;
        }
        hsum8(&a)
    }

    /// [`dots8`] for `hn < 8` heads (the others' lanes are 0).
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dots_partial(q: *const f32, hn: usize, k: *const f32, dim: usize) -> __m256 {
        let mut a = [_mm256_setzero_ps(); 8];
        for (h, acc) in a.iter_mut().enumerate().take(hn) {
            for c in (0..dim).step_by(8) {
                *acc = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(h * dim + c)), _mm256_loadu_ps(k.add(c)), *acc);
            }
        }
        hsum8(&a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// Every ISA gives the bits of the per-key definition on that ISA (`dot`, then the head
    /// sum in order), for 8 and fewer heads and a partial last group of keys; and the scores
    /// are the f64 value within rounding.
    #[test]
    fn index_scores_equal_the_per_key_definition() {
        let dim = 32;
        let mut seed = 5u64;
        let nslots = 45;
        let k: Vec<f32> = (0..nslots * dim).map(|_| lcg(&mut seed)).collect();
        let slots: Vec<u32> = (0..nslots as u32).rev().step_by(3).chain([0, 1]).collect();
        for heads in [8usize, 5, 19] {
            let q: Vec<f32> = (0..heads * dim).map(|_| lcg(&mut seed)).collect();
            let hw: Vec<f32> = (0..heads).map(|_| lcg(&mut seed)).collect();
            for isa in Isa::available() {
                let mut got = vec![0f32; slots.len()];
                index_scores(isa, &q, heads, dim, &hw, &k, &slots, 0.17, &mut got);
                for (j, &s) in slots.iter().enumerate() {
                    let kr = &k[s as usize * dim..(s as usize + 1) * dim];
                    let mut acc = 0f32;
                    let mut exact = 0f64;
                    for h in 0..heads {
                        let d = dot(isa, &q[h * dim..(h + 1) * dim], kr);
                        acc += hw[h] * d.max(0.0);
                        let de: f64 = (0..dim).map(|i| q[h * dim + i] as f64 * kr[i] as f64).sum();
                        exact += hw[h] as f64 * de.max(0.0);
                    }
                    assert_eq!(got[j].to_bits(), (acc * 0.17).to_bits(), "{isa:?} heads {heads} key {j}");
                    assert!((got[j] as f64 - exact * 0.17).abs() < 1e-5, "{isa:?} key {j}");
                }
            }
        }
    }
}
