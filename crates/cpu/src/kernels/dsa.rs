//! Scores of DeepSeek sparse attention's lightning indexer (DeepSeek-V3.2 tech report §2; HF
//! transformers `modeling_glm_moe_dsa.py`, `GlmMoeDsaIndexer`): for a query with `heads` index
//! heads, `I_j = (Σ_h w_h · ReLU(q_h · k_j)) · kscale` over the keys `j` of its context.
//!
//! The dot products are one GEMM per block of keys: the (query, head) rows of a run of queries
//! against [`KEY_BLOCK`] keys converted and transposed once ([`block_scores`], the score step
//! of the tiled attention: one FMA chain over the dimension per dot product, 6 rows × 16 keys
//! per register tile), then the heads summed in order with keys in lanes,
//! `acc = acc + w_h · max(d_h, 0)`, then `· kscale`. Every ISA runs these operations, so the
//! top-k a query selects does not depend on the path, the batch or the run of queries. A lone
//! query (a DECODE row) takes a path with heads in lanes instead, so that no key block is
//! transposed for one query: the same chains over the dimension, keys transposed only for the
//! head sum.
//!
//! Also here: [`mla_scores`], the scores of MLA's absorbed attention (DeepSeek-V2 §2.1) over
//! the latent cache, `(q_abs · c_j + q_pe · k_pe_j) · scale` for a token's heads.
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

/// Scores of MLA's absorbed attention for one token's `heads` heads against the latent cache
/// rows of `slots` (row of slot `x`: `lat[x·(kvl + rope) ..]`, `[c (kvl), k_pe (rope)]`):
/// `out[h·n + j] = (dot(q_abs,h, c_j) + dot(q_pe,h, k_pe_j)) · scale`, `n = slots.len()`, each
/// `dot` exactly as [`dot`](super::dot) computes it on the ISA. `qa` is `[heads × kvl]`, `qp`
/// `[heads × rope]`. The AVX2 path runs tiles of 4 heads × 2 keys (8 accumulators reduced
/// together by `hsum8`), so scoring every key of a long context (the dense backend) costs
/// FMAs rather than calls.
///
/// # Panics
/// When a buffer is too short for the shapes, or a slot is out of `lat`.
#[allow(clippy::too_many_arguments)]
pub fn mla_scores(
    isa: Isa,
    qa: &[f32],
    qp: &[f32],
    heads: usize,
    kvl: usize,
    rope: usize,
    lat: &[f32],
    slots: &[u32],
    scale: f32,
    out: &mut [f32],
) {
    let (n, w) = (slots.len(), kvl + rope);
    assert!(qa.len() >= heads * kvl && qp.len() >= heads * rope && out.len() >= heads * n, "mla_scores: shapes");
    for &x in slots {
        assert!((x as usize + 1) * w <= lat.len(), "mla_scores: slot {x} out of the cache");
    }
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && kvl.is_multiple_of(8) && rope.is_multiple_of(8) && n > 0 {
        // SAFETY: AVX2+FMA were detected; every row read is in bounds (asserted above).
        unsafe { x86::mla_scores(qa, qp, heads, kvl, rope, lat, slots, scale, out) };
        return;
    }
    for h in 0..heads {
        for (j, &x) in slots.iter().enumerate() {
            let e = &lat[x as usize * w..(x as usize + 1) * w];
            let d = super::dot(isa, &qa[h * kvl..(h + 1) * kvl], &e[..kvl]) + super::dot(isa, &qp[h * rope..(h + 1) * rope], &e[kvl..]);
            out[h * n + j] = d * scale;
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
    use crate::kernels::hsum8;
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
                    if h < heads { _mm256_loadu_ps(q.as_ptr().add(h * dim + d0)) } else { zero }
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

    /// Per head `i < 4` and key `k < 2`: 8-lane FMA accumulators of `q_i · row_k` over `len`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dots_4x2(q: [*const f32; 4], r: [*const f32; 2], len: usize) -> __m256 {
        let mut a = [_mm256_setzero_ps(); 8];
        let mut c = 0;
        while c < len {
            let (k0, k1) = (_mm256_loadu_ps(r[0].add(c)), _mm256_loadu_ps(r[1].add(c)));
            for i in 0..4 {
                let qv = _mm256_loadu_ps(q[i].add(c));
                a[2 * i] = _mm256_fmadd_ps(qv, k0, a[2 * i]);
                a[2 * i + 1] = _mm256_fmadd_ps(qv, k1, a[2 * i + 1]);
            }
            c += 8;
        }
        // Lanes: (head i, key 0) at i, (head i, key 1) at 4 + i.
        hsum8(&a)
    }

    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn mla_scores(
        qa: &[f32],
        qp: &[f32],
        heads: usize,
        kvl: usize,
        rope: usize,
        lat: &[f32],
        slots: &[u32],
        scale: f32,
        out: &mut [f32],
    ) {
        let (n, w) = (slots.len(), kvl + rope);
        let lp = lat.as_ptr();
        let sc = _mm256_set1_ps(scale);
        for h0 in (0..heads).step_by(4) {
            let hn = (heads - h0).min(4);
            // A partial group repeats its last head (results not stored).
            let qa4: [*const f32; 4] = std::array::from_fn(|i| qa.as_ptr().add((h0 + i.min(hn - 1)) * kvl));
            let qp4: [*const f32; 4] = std::array::from_fn(|i| qp.as_ptr().add((h0 + i.min(hn - 1)) * rope));
            for j in (0..n).step_by(2) {
                let jn = (n - j).min(2);
                let rows: [*const f32; 2] = std::array::from_fn(|k| lp.add(slots[j + k.min(jn - 1)] as usize * w));
                let c = dots_4x2(qa4, rows, kvl);
                let p = dots_4x2(qp4, [rows[0].add(kvl), rows[1].add(kvl)], rope);
                let mut res = [0f32; 8];
                _mm256_storeu_ps(res.as_mut_ptr(), _mm256_mul_ps(_mm256_add_ps(c, p), sc));
                for i in 0..hn {
                    for k in 0..jn {
                        out[(h0 + i) * n + j + k] = res[4 * k + i];
                    }
                }
            }
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

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    /// MLA scores equal the two `dot` calls per (head, key) on every ISA, for 4 and 5 heads (a
    /// partial head group) and odd key counts.
    #[test]
    fn mla_scores_equal_two_dots() {
        let (kvl, rope) = (64, 16);
        let mut seed = 9u64;
        let nslots = 37;
        let lat: Vec<f32> = (0..nslots * (kvl + rope)).map(|_| lcg(&mut seed)).collect();
        let slots: Vec<u32> = (0..nslots as u32).rev().step_by(2).collect();
        for heads in [4usize, 5] {
            let qa: Vec<f32> = (0..heads * kvl).map(|_| lcg(&mut seed)).collect();
            let qp: Vec<f32> = (0..heads * rope).map(|_| lcg(&mut seed)).collect();
            for isa in Isa::available() {
                let n = slots.len();
                let mut got = vec![0f32; heads * n];
                mla_scores(isa, &qa, &qp, heads, kvl, rope, &lat, &slots, 0.3, &mut got);
                for h in 0..heads {
                    for (j, &x) in slots.iter().enumerate() {
                        let e = &lat[x as usize * (kvl + rope)..][..kvl + rope];
                        let d = crate::kernels::dot(isa, &qa[h * kvl..][..kvl], &e[..kvl])
                            + crate::kernels::dot(isa, &qp[h * rope..][..rope], &e[kvl..]);
                        assert_eq!(got[h * n + j].to_bits(), (d * 0.3).to_bits(), "{isa:?} head {h} key {j}");
                    }
                }
            }
        }
    }

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
        for heads in [8usize, 5] {
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
                    Some(f) => assert!(f.iter().zip(&valid).all(|(a, b)| a.to_bits() == b.to_bits()), "{isa:?} differs"),
                }
            }
        }
    }
}
