//! Scores of DeepSeek sparse attention's lightning indexer (DeepSeek-V3.2 tech report §2; HF
//! transformers `modeling_glm_moe_dsa.py`, `GlmMoeDsaIndexer`): for a query with `heads` index
//! heads, `I_j = (Σ_h w_h · ReLU(q_h · k_j)) · kscale` over the keys `j` of its context.
//!
//! The dot products are one GEMM per block of keys: the (query, head) rows of a run of queries
//! against [`KEY_BLOCK`] keys converted and transposed once (one FMA chain over the dimension
//! per dot product), then the heads summed in order with keys in lanes,
//! `acc = acc + w_h · max(d_h, 0)`, then `· kscale`. The scalar path is [`block_scores`] (the
//! tiled attention's score step) followed by that sum; on AVX2 the sum is fused into the score
//! tile (4 heads × 16 keys in registers, then the heads' terms added in order), the same
//! operations without the scores' round trip through memory. Every ISA runs these operations,
//! so the top-k a query selects does not depend on the path, the batch or the run of queries. A lone
//! query (a DECODE row) takes a path with heads in lanes instead, so that no key block is
//! transposed for one query: the same chains over the dimension, keys transposed only for the
//! head sum.

#![allow(unsafe_code)]

use super::flash::{block_scores, KvView, KEY_BLOCK};
use crate::isa::Isa;

/// Reusable buffers of [`index_scores`].
#[derive(Default)]
pub struct IndexScratch {
    s: Vec<f32>,
    kt: Vec<f32>,
}

/// Index scores of `rows` queries of one sequence: query `r` has heads
/// `q[(r·heads + h)·dim ..][..dim]` and weights `hw[r·heads + h]` (`w_h`), and sees the keys at
/// positions `0 .. lens[r]` of `slots` (key of slot `x` at `k[x·dim ..][..dim]`). Writes
/// `out[r·n + j]` for `j < lens[r]`, `n = max(lens)`; other entries are left as they are.
///
/// # Panics
/// When a buffer is too short for the shapes, or a slot is out of `k`.
#[allow(clippy::too_many_arguments)]
pub fn index_scores(
    isa: Isa,
    q: &[f32],
    heads: usize,
    dim: usize,
    hw: &[f32],
    k: &[f32],
    slots: &[u32],
    lens: &[usize],
    kscale: f32,
    sc: &mut IndexScratch,
    out: &mut [f32],
) {
    let rows = lens.len();
    let n = lens.iter().copied().max().unwrap_or(0);
    assert!(
        q.len() >= rows * heads * dim && hw.len() >= rows * heads && out.len() >= rows * n && slots.len() >= n,
        "index_scores: shapes"
    );
    #[cfg(target_arch = "x86_64")]
    if rows == 1 && isa != Isa::Scalar && dim.is_multiple_of(8) {
        for &x in &slots[..n] {
            assert!((x as usize + 1) * dim <= k.len(), "index_scores: slot {x} out of the cache");
        }
        // SAFETY: AVX2+FMA were detected; every key row is in `k` (checked above).
        unsafe { x86::one_query(q, heads, dim, hw, k, &slots[..n], kscale, &mut sc.s, out) };
        return;
    }
    let kv = KvView { k, v: k, stride: dim, off: 0, slots };
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && dim.is_multiple_of(8) {
        for &x in &slots[..n] {
            assert!((x as usize + 1) * dim <= k.len(), "index_scores: slot {x} out of the cache");
        }
        sc.kt.resize(dim * KEY_BLOCK, 0.0);
        for k0 in (0..n).step_by(KEY_BLOCK) {
            let k1 = (k0 + KEY_BLOCK).min(n);
            // SAFETY: AVX2+FMA were detected; every key row is in `k` (checked above), `kt`
            // holds a block, and `q`, `hw`, `out` have the sizes asserted at the top.
            unsafe {
                super::flash::transpose_keys(&kv, &slots[k0..k1], dim, &mut sc.kt);
                x86::fused_block(q, heads, dim, hw, &sc.kt, k0, k1, lens, n, kscale, out);
            }
        }
        return;
    }
    sc.s.resize(rows * heads * KEY_BLOCK, 0.0);
    for k0 in (0..n).step_by(KEY_BLOCK) {
        let k1 = (k0 + KEY_BLOCK).min(n);
        block_scores(isa, q, rows * heads, dim, &kv, &slots[k0..k1], 1.0, &mut sc.kt, &mut sc.s);
        for (r, &len) in lens.iter().enumerate() {
            if len <= k0 {
                continue;
            }
            let m = len.min(k1) - k0;
            let s = &sc.s[r * heads * KEY_BLOCK..(r + 1) * heads * KEY_BLOCK];
            head_sum(isa, s, heads, &hw[r * heads..(r + 1) * heads], kscale, &mut out[r * n + k0..r * n + k0 + m]);
        }
    }
}

/// `out[j] = (Σ_h hw[h] · max(s[h·KEY_BLOCK + j], 0)) · kscale`, heads in order.
fn head_sum(isa: Isa, s: &[f32], heads: usize, hw: &[f32], kscale: f32, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        // SAFETY: AVX2 was detected; `s` holds `heads` rows of KEY_BLOCK ≥ out.len() rounded
        // up to 8 (KEY_BLOCK is a multiple of 8).
        unsafe { x86::head_sum(s, heads, hw, kscale, out) };
        return;
    }
    let _ = isa;
    for (j, o) in out.iter_mut().enumerate() {
        let mut acc = 0f32;
        for h in 0..heads {
            let d = s[h * KEY_BLOCK + j];
            // `maxps(d, 0)`: d if d > 0, else +0 (also for −0 and NaN).
            acc += hw[h] * if d > 0.0 { d } else { 0.0 };
        }
        *o = acc * kscale;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::KEY_BLOCK;
    use std::arch::x86_64::*;

    /// [`super::index_scores`] for one query: heads in lanes (the query transposed once,
    /// `qt[d]` = 8 heads' `q_h[d]`), keys 4 at a time broadcast per dimension, so each (head,
    /// key) dot product is the same FMA chain over `d` as the block path's; then 8 keys' head
    /// vectors are transposed so the head sum runs in head order with keys in lanes.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn one_query(
        q: &[f32],
        heads: usize,
        dim: usize,
        hw: &[f32],
        k: &[f32],
        slots: &[u32],
        kscale: f32,
        qt: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        use crate::kernels::transpose8;
        let groups = heads.div_ceil(8);
        qt.clear();
        qt.resize(groups * dim * 8, 0.0);
        let zero = _mm256_setzero_ps();
        for g in 0..groups {
            for d0 in (0..dim).step_by(8) {
                let r: [__m256; 8] = std::array::from_fn(|i| {
                    let h = g * 8 + i;
                    if h < heads {
                        _mm256_loadu_ps(q.as_ptr().add(h * dim + d0))
                    } else {
                        zero
                    }
                });
                for (i, v) in transpose8(&r).iter().enumerate() {
                    _mm256_storeu_ps(qt.as_mut_ptr().add((g * dim + d0 + i) * 8), *v);
                }
            }
        }
        let n = slots.len();
        let kp = k.as_ptr();
        for j0 in (0..n).step_by(8) {
            let rows: [*const f32; 8] = std::array::from_fn(|i| kp.add(slots[(j0 + i).min(n - 1)] as usize * dim));
            let mut acc = zero;
            for g in 0..groups {
                let hn = (heads - g * 8).min(8);
                let hwv = _mm256_loadu_ps(
                    std::array::from_fn::<f32, 8, _>(|i| if g * 8 + i < heads { hw[g * 8 + i] } else { 0.0 }).as_ptr(),
                );
                let mut t = [zero; 8];
                for half in 0..2 {
                    let mut a = [zero; 4];
                    for d in 0..dim {
                        let qv = _mm256_loadu_ps(qt.as_ptr().add((g * dim + d) * 8));
                        for (jj, aj) in a.iter_mut().enumerate() {
                            *aj = _mm256_fmadd_ps(qv, _mm256_broadcast_ss(&*rows[half * 4 + jj].add(d)), *aj);
                        }
                    }
                    for jj in 0..4 {
                        t[half * 4 + jj] = _mm256_mul_ps(hwv, _mm256_max_ps(a[jj], zero));
                    }
                }
                // by_head[i] = head i's term for the 8 keys.
                let by_head = transpose8(&t);
                for bh in by_head.iter().take(hn) {
                    acc = _mm256_add_ps(acc, *bh);
                }
            }
            let mut res = [0f32; 8];
            _mm256_storeu_ps(res.as_mut_ptr(), _mm256_mul_ps(acc, _mm256_set1_ps(kscale)));
            let m = (n - j0).min(8);
            out[j0..j0 + m].copy_from_slice(&res[..m]);
        }
    }

    /// The block path of [`super::index_scores`] with the head sum in registers: per query
    /// and 16 keys of the transposed block `kt` (`[dim × KEY_BLOCK]`, keys `k0..k1`), heads
    /// 4 at a time, each (head, key) dot product the FMA chain over `d` of
    /// [`super::block_scores`], then `sum = sum + w_h · max(dot, 0)` in head order and
    /// `· kscale`: the operations (and bits) of `block_scores` at scale 1 followed by
    /// `head_sum`, without the scores' round trip through memory.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn fused_block(
        q: &[f32],
        heads: usize,
        dim: usize,
        hw: &[f32],
        kt: &[f32],
        k0: usize,
        k1: usize,
        lens: &[usize],
        n: usize,
        kscale: f32,
        out: &mut [f32],
    ) {
        assert!(kt.len() >= dim * KEY_BLOCK && k1 - k0 <= KEY_BLOCK);
        let zero = _mm256_setzero_ps();
        let ks = _mm256_set1_ps(kscale);
        for (r, &len) in lens.iter().enumerate() {
            if len <= k0 {
                continue;
            }
            let m = len.min(k1) - k0;
            assert!(q.len() >= (r + 1) * heads * dim && hw.len() >= (r + 1) * heads && out.len() >= r * n + k0 + m);
            let qr = q.as_ptr().add(r * heads * dim);
            let wr = hw.as_ptr().add(r * heads);
            for j in (0..m).step_by(16) {
                let mut sum = [zero; 2];
                let mut h0 = 0;
                while h0 < heads {
                    match heads - h0 {
                        1 => heads_tile::<1>(qr, wr, h0, dim, kt, j, &mut sum),
                        2 => heads_tile::<2>(qr, wr, h0, dim, kt, j, &mut sum),
                        3 => heads_tile::<3>(qr, wr, h0, dim, kt, j, &mut sum),
                        _ => heads_tile::<4>(qr, wr, h0, dim, kt, j, &mut sum),
                    }
                    h0 += 4;
                }
                let mut res = [0f32; 16];
                _mm256_storeu_ps(res.as_mut_ptr(), _mm256_mul_ps(sum[0], ks));
                _mm256_storeu_ps(res.as_mut_ptr().add(8), _mm256_mul_ps(sum[1], ks));
                let c = (m - j).min(16);
                out[r * n + k0 + j..r * n + k0 + j + c].copy_from_slice(&res[..c]);
            }
        }
    }

    /// Heads `h0..h0 + HN` of one query against keys `j..j + 16` of `kt`, added to `sum`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn heads_tile<const HN: usize>(
        q: *const f32,
        hw: *const f32,
        h0: usize,
        dim: usize,
        kt: &[f32],
        j: usize,
        sum: &mut [__m256; 2],
    ) {
        let zero = _mm256_setzero_ps();
        let mut acc = [[zero; 2]; HN];
        let kp = kt.as_ptr();
        for d in 0..dim {
            let (a, b) = (_mm256_loadu_ps(kp.add(d * KEY_BLOCK + j)), _mm256_loadu_ps(kp.add(d * KEY_BLOCK + j + 8)));
            for (h, ac) in acc.iter_mut().enumerate() {
                let qv = _mm256_broadcast_ss(&*q.add((h0 + h) * dim + d));
                ac[0] = _mm256_fmadd_ps(a, qv, ac[0]);
                ac[1] = _mm256_fmadd_ps(b, qv, ac[1]);
            }
        }
        for (h, ac) in acc.iter().enumerate() {
            let w = _mm256_set1_ps(*hw.add(h0 + h));
            sum[0] = _mm256_add_ps(sum[0], _mm256_mul_ps(w, _mm256_max_ps(ac[0], zero)));
            sum[1] = _mm256_add_ps(sum[1], _mm256_mul_ps(w, _mm256_max_ps(ac[1], zero)));
        }
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn head_sum(s: &[f32], heads: usize, hw: &[f32], kscale: f32, out: &mut [f32]) {
        assert!(s.len() >= heads * KEY_BLOCK && hw.len() >= heads && out.len() <= KEY_BLOCK);
        let zero = _mm256_setzero_ps();
        for j in (0..out.len()).step_by(8) {
            let mut acc = zero;
            for (h, &w) in hw.iter().enumerate().take(heads) {
                let d = _mm256_loadu_ps(s.as_ptr().add(h * KEY_BLOCK + j));
                acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_set1_ps(w), _mm256_max_ps(d, zero)));
            }
            let mut res = [0f32; 8];
            _mm256_storeu_ps(res.as_mut_ptr(), _mm256_mul_ps(acc, _mm256_set1_ps(kscale)));
            let m = (out.len() - j).min(8);
            out[j..j + m].copy_from_slice(&res[..m]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::kernels::test_rand as lcg;

    /// A run of queries with different context lengths (several key blocks, partial blocks)
    /// gives the same bits on every ISA, the same bits one query at a time, and the f64 value
    /// within rounding.
    #[test]
    fn index_scores_match_f64_and_are_independent_of_path_and_run() {
        let dim = 32;
        let mut seed = 5u64;
        let nslots = 300;
        let k: Vec<f32> = (0..nslots * dim).map(|_| lcg(&mut seed)).collect();
        let slots: Vec<u32> = (0..nslots as u32).rev().collect();
        for heads in [8usize, 5, 20] {
            let lens = [300usize, 299, 129, 128, 7, 1];
            let rows = lens.len();
            let q: Vec<f32> = (0..rows * heads * dim).map(|_| lcg(&mut seed)).collect();
            let hw: Vec<f32> = (0..rows * heads).map(|_| lcg(&mut seed)).collect();
            let mut first: Option<Vec<f32>> = None;
            for isa in Isa::available() {
                let mut sc = IndexScratch::default();
                let mut got = vec![0f32; rows * 300];
                index_scores(isa, &q, heads, dim, &hw, &k, &slots, &lens, 0.17, &mut sc, &mut got);
                for (r, &len) in lens.iter().enumerate() {
                    let mut one = vec![0f32; len];
                    let (qr, hr) = (&q[r * heads * dim..(r + 1) * heads * dim], &hw[r * heads..(r + 1) * heads]);
                    index_scores(isa, qr, heads, dim, hr, &k, &slots, &[len], 0.17, &mut sc, &mut one);
                    for j in 0..len {
                        assert_eq!(got[r * 300 + j].to_bits(), one[j].to_bits(), "{isa:?} row {r} key {j}");
                        let kr = &k[slots[j] as usize * dim..][..dim];
                        let exact: f64 = (0..heads)
                            .map(|h| {
                                let d: f64 = (0..dim).map(|i| qr[h * dim + i] as f64 * kr[i] as f64).sum();
                                hr[h] as f64 * d.max(0.0)
                            })
                            .sum::<f64>()
                            * 0.17;
                        assert!((one[j] as f64 - exact).abs() < 1e-5, "{isa:?} row {r} key {j}");
                    }
                }
                let valid: Vec<f32> =
                    lens.iter().enumerate().flat_map(|(r, &l)| got[r * 300..r * 300 + l].to_vec()).collect();
                match &first {
                    None => first = Some(valid),
                    Some(f) => {
                        assert!(f.iter().zip(&valid).all(|(a, b)| a.to_bits() == b.to_bits()), "{isa:?} differs")
                    }
                }
            }
        }
    }
}
