//! The dense paths of [`matmul`](super::matmul): f32 and F16/BF16 weights (widened exactly to
//! f32) against f32 activations, the same bits as [`dot`] per (row, token) on every ISA.
#![allow(unsafe_code)]

use crate::isa::Isa;
use crate::kernels::elementwise::dot;
use crate::weight::half_to_f32;

/// A dense matrix's elements as stored.
#[derive(Clone, Copy)]
pub(super) enum Elems<'a> {
    F32(&'a [f32]),
    F16(&'a [u16]),
    Bf16(&'a [u16]),
}

impl Elems<'_> {
    fn get(&self, i: usize) -> f32 {
        match self {
            Elems::F32(d) => d[i],
            Elems::F16(d) => half_to_f32(d[i], false),
            Elems::Bf16(d) => half_to_f32(d[i], true),
        }
    }
}

/// Rows `r0..r1` of a dense matrix (`k` columns) for every token, to `out[t·ldo + r]`: the
/// tiled x86 kernel, or per (row, token) [`dot`] over the row widened to f32 (the same bits).
///
/// # Safety
/// `isa` is supported; outputs of rows `r0..r1` are written by this call only.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn dense_rows(
    isa: Isa,
    w: Elems<'_>,
    k: usize,
    r0: usize,
    r1: usize,
    x: &[f32],
    tokens: usize,
    out: *mut f32,
    ldo: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        match w {
            Elems::F32(d) => dense_x86::rows::<0>(d.as_ptr() as *const u8, k, r0, r1, x, tokens, out, ldo),
            Elems::F16(d) => dense_x86::rows::<1>(d.as_ptr() as *const u8, k, r0, r1, x, tokens, out, ldo),
            Elems::Bf16(d) => dense_x86::rows::<2>(d.as_ptr() as *const u8, k, r0, r1, x, tokens, out, ldo),
        }
        return;
    }
    let mut row = vec![0f32; k];
    for r in r0..r1 {
        for (c, v) in row.iter_mut().enumerate() {
            *v = w.get(r * k + c);
        }
        for t in 0..tokens {
            *out.add(t * ldo + r) = dot(isa, &row, &x[t * k..(t + 1) * k]);
        }
    }
}

/// The dense f32 product in register tiles of 4 rows × 3 tokens, then 4 rows × 2 for two
/// tokens left and 8 rows × 1 for an odd last token, each output computed exactly as [`dot`]
/// computes it on AVX2 (8 lanes of FMAs over `k`, the `hsum` tree, then the tail `k mod 8` in
/// order), so the result is the same bits as the per-(row, token) `dot` loop it replaces; a
/// tile's accumulators are reduced 8 at a time (`hsum8`).
#[cfg(target_arch = "x86_64")]
mod dense_x86 {
    use crate::kernels::hsum8;
    use std::arch::x86_64::*;

    /// 8 weights from element `i` on: f32 (`E = 0`), f16 (1) or bf16 (2), widened exactly.
    #[inline(always)]
    unsafe fn ld<const E: u8>(wp: *const u8, i: usize) -> __m256 {
        match E {
            0 => _mm256_loadu_ps((wp as *const f32).add(i)),
            1 => _mm256_cvtph_ps(_mm_loadu_si128((wp as *const u16).add(i) as *const __m128i)),
            _ => _mm256_castsi256_ps(_mm256_slli_epi32(
                _mm256_cvtepu16_epi32(_mm_loadu_si128((wp as *const u16).add(i) as *const __m128i)),
                16,
            )),
        }
    }

    /// One weight, widened exactly.
    #[inline(always)]
    unsafe fn el<const E: u8>(wp: *const u8, i: usize) -> f32 {
        match E {
            0 => *(wp as *const f32).add(i),
            _ => crate::weight::half_to_f32(*(wp as *const u16).add(i), E == 2),
        }
    }

    /// Tokens per block: their activations stay in L1/L2 while the task's rows pass over them.
    const TOKEN_BLOCK: usize = 32;
    /// A task's weights past this size come from memory, not cache.
    const STREAM_BYTES: usize = 1 << 20;

    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn rows<const E: u8>(
        wp: *const u8,
        k: usize,
        r0: usize,
        r1: usize,
        x: &[f32],
        tokens: usize,
        op: *mut f32,
        n: usize,
    ) {
        assert!(x.len() >= tokens * k);
        let xp = x.as_ptr();
        let k8 = k / 8 * 8;
        for t0 in (0..tokens).step_by(TOKEN_BLOCK) {
            let t1 = (t0 + TOKEN_BLOCK).min(tokens);
            // Token triples (4 rows × 3 tokens, 12 accumulators: 7 loads per 12 FMAs), then a
            // pair if two are left, then the odd token.
            let trip_end = t0 + (t1 - t0) / 3 * 3;
            let pairs_end = trip_end + (t1 - trip_end) / 2 * 2;
            let mut r = r0;
            while r < r1 {
                let rn = (r1 - r).min(4);
                for t in (t0..trip_end).step_by(3) {
                    let mut acc = [[_mm256_setzero_ps(); 3]; 4];
                    let mut c = 0;
                    while c < k8 {
                        let xv = [
                            _mm256_loadu_ps(xp.add(t * k + c)),
                            _mm256_loadu_ps(xp.add((t + 1) * k + c)),
                            _mm256_loadu_ps(xp.add((t + 2) * k + c)),
                        ];
                        for (i, a) in acc.iter_mut().enumerate() {
                            let wv = ld::<E>(wp, (r + i.min(rn - 1)) * k + c);
                            a[0] = _mm256_fmadd_ps(wv, xv[0], a[0]);
                            a[1] = _mm256_fmadd_ps(wv, xv[1], a[1]);
                            a[2] = _mm256_fmadd_ps(wv, xv[2], a[2]);
                        }
                        c += 8;
                    }
                    // (row i, token j) is accumulator f = 3i + j: lane LANE[f] of the first
                    // reduction for f < 8, lane LANE[f − 8] of the second after.
                    const LANE: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];
                    let z = _mm256_setzero_ps();
                    let (mut s1, mut s2) = ([0f32; 8], [0f32; 8]);
                    let g1 = [acc[0][0], acc[0][1], acc[0][2], acc[1][0], acc[1][1], acc[1][2], acc[2][0], acc[2][1]];
                    _mm256_storeu_ps(s1.as_mut_ptr(), hsum8(&g1));
                    _mm256_storeu_ps(s2.as_mut_ptr(), hsum8(&[acc[2][2], acc[3][0], acc[3][1], acc[3][2], z, z, z, z]));
                    for i in 0..rn {
                        for j in 0..3 {
                            let f = 3 * i + j;
                            let v = if f < 8 { s1[LANE[f]] } else { s2[LANE[f - 8]] };
                            store::<E>(wp, xp, k, k8, r + i, t + j, v, op, n);
                        }
                    }
                }
                for t in (trip_end..pairs_end).step_by(2) {
                    let mut acc = [_mm256_setzero_ps(); 8];
                    let mut c = 0;
                    while c < k8 {
                        let xv = [_mm256_loadu_ps(xp.add(t * k + c)), _mm256_loadu_ps(xp.add((t + 1) * k + c))];
                        for i in 0..4 {
                            let wv = ld::<E>(wp, (r + i.min(rn - 1)) * k + c);
                            acc[2 * i] = _mm256_fmadd_ps(wv, xv[0], acc[2 * i]);
                            acc[2 * i + 1] = _mm256_fmadd_ps(wv, xv[1], acc[2 * i + 1]);
                        }
                        c += 8;
                    }
                    // Lanes: (row i, token 0) at i, (row i, token 1) at 4 + i.
                    let mut sums = [0f32; 8];
                    _mm256_storeu_ps(sums.as_mut_ptr(), hsum8(&acc));
                    for i in 0..rn {
                        for j in 0..2 {
                            store::<E>(wp, xp, k, k8, r + i, t + j, sums[4 * j + i], op, n);
                        }
                    }
                }
                r += rn;
            }
            if pairs_end < t1 && (r1 - r0) * k * if E == 0 { 4 } else { 2 } > STREAM_BYTES {
                // The odd token against many rows (an LM head: 50 MB at 49k × 256): rows one
                // after another, a sequential stream the prefetcher follows; reading 8 rows at
                // once made such a GEMV 1.5× slower.
                let t = pairs_end;
                for r in r0..r1 {
                    let mut acc = _mm256_setzero_ps();
                    let mut c = 0;
                    while c < k8 {
                        acc = _mm256_fmadd_ps(ld::<E>(wp, r * k + c), _mm256_loadu_ps(xp.add(t * k + c)), acc);
                        c += 8;
                    }
                    store::<E>(wp, xp, k, k8, r, t, crate::kernels::hsum(acc), op, n);
                }
            } else if pairs_end < t1 {
                // The odd token: 8 rows × 1 token per tile, no duplicated work (a lone token
                // is a DECODE step's GEMV).
                let t = pairs_end;
                let mut r = r0;
                while r < r1 {
                    let rn = (r1 - r).min(8);
                    let mut acc = [_mm256_setzero_ps(); 8];
                    let mut c = 0;
                    while c < k8 {
                        let xv = _mm256_loadu_ps(xp.add(t * k + c));
                        for (i, a) in acc.iter_mut().enumerate() {
                            let wv = ld::<E>(wp, (r + i.min(rn - 1)) * k + c);
                            *a = _mm256_fmadd_ps(wv, xv, *a);
                        }
                        c += 8;
                    }
                    // Lane of row i: [0, 4, 1, 5, 2, 6, 3, 7][i].
                    let mut sums = [0f32; 8];
                    _mm256_storeu_ps(sums.as_mut_ptr(), hsum8(&acc));
                    for i in 0..rn {
                        store::<E>(wp, xp, k, k8, r + i, t, sums[[0, 4, 1, 5, 2, 6, 3, 7][i]], op, n);
                    }
                    r += rn;
                }
            }
        }
    }

    /// Adds the tail `k mod 8` of (row, token) to its reduced lanes, in order, and stores it.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn store<const E: u8>(
        wp: *const u8,
        xp: *const f32,
        k: usize,
        k8: usize,
        row: usize,
        t: usize,
        sum: f32,
        op: *mut f32,
        n: usize,
    ) {
        let xr = xp.add(t * k);
        let mut s = sum;
        for e in k8..k {
            s += el::<E>(wp, row * k + e) * *xr.add(e);
        }
        *op.add(t * n + row) = s;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::ggml::QActs;
    use crate::kernels::matmul::matmul;
    use crate::pool::ThreadPool;
    use crate::weight::Weight;

    /// The tiled dense product gives, for every (row, token), the bits of `dot` over the row
    /// widened to f32, on the same ISA, for f32, f16 and bf16 weights: odd row counts (4-row
    /// tiles and a tail), odd token counts, `k` with a tail past the last 8-lane chunk, token
    /// blocks, and a matrix large enough for the streaming GEMV path.
    #[test]
    fn dense_matmul_equals_dot_per_output() {
        let pool = ThreadPool::new(2).expect("pool");
        let mut seed = 11u64;
        let mut rnd = || crate::kernels::test_rand(&mut seed);
        // The last: 1.5 MB of weights per task, so an odd token takes the streaming path.
        for (n, k, tokens) in [(45usize, 100usize, 37usize), (8, 64, 1), (3, 13, 70), (40_000, 76, 3)] {
            let data: Vec<f32> = (0..n * k).map(|_| rnd()).collect();
            let x: Vec<f32> = (0..tokens * k).map(|_| rnd()).collect();
            let f16: Vec<u16> = data.iter().map(|&v| crate::half::f32_to_f16(v)).collect();
            let bf16: Vec<u16> = data.iter().map(|&v| (v.to_bits() >> 16) as u16).collect();
            let forms = [
                Weight::Dense { rows: n, cols: k, data: data.clone() },
                Weight::Half { rows: n, cols: k, data: f16, bf16: false },
                Weight::Half { rows: n, cols: k, data: bf16, bf16: true },
            ];
            for w in &forms {
                let mut wr = vec![0f32; k];
                for isa in Isa::available() {
                    let mut out = vec![0f32; tokens * n];
                    matmul(&pool, isa, w, &x, tokens, &mut QActs::default(), &mut out);
                    for r in 0..n {
                        w.row_f32(r, &mut wr);
                        for t in 0..tokens {
                            let want = dot(isa, &wr, &x[t * k..(t + 1) * k]);
                            let kind = w.kind();
                            assert_eq!(
                                out[t * n + r].to_bits(),
                                want.to_bits(),
                                "{kind} {isa:?} [{n}x{k}] token {t} row {r}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn dense_matmul_and_dot() {
        let pool = ThreadPool::new(2).expect("pool");
        let (n, k, tokens) = (5, 19, 3);
        let data: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let x: Vec<f32> = (0..tokens * k).map(|i| (i as f32 * 0.11).cos()).collect();
        let w = Weight::Dense { rows: n, cols: k, data: data.clone() };
        let mut out = vec![0f32; tokens * n];
        matmul(&pool, Isa::detect(), &w, &x, tokens, &mut QActs::default(), &mut out);
        for t in 0..tokens {
            for r in 0..n {
                let e: f64 = (0..k).map(|i| data[r * k + i] as f64 * x[t * k + i] as f64).sum();
                assert!((out[t * n + r] as f64 - e).abs() < 1e-5);
            }
        }
    }
}
