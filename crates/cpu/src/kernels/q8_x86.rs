//! AVX-512 VNNI and AVX2 tiles of the Q4/Q8 integer matmul (see the module docs of
//! [`super`] for the arithmetic every path computes).
#![allow(unsafe_code)]
// SIMD tiles index several parallel arrays by the same small constant bounds.
#![allow(clippy::needless_range_loop)]

use crate::format::ggml::{Bits, QActs, QMatrix, QK};
use std::arch::x86_64::*;

/// Loads one block (at `codes`) as 32 unsigned codes in weight order.
#[inline(always)]
unsafe fn load_codes(bits: Bits, codes: *const u8) -> __m256i {
    match bits {
        Bits::U4 => {
            let v = _mm_loadu_si128(codes as *const __m128i);
            let mask = _mm_set1_epi8(0x0f);
            let lo = _mm_and_si128(v, mask);
            let hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
            _mm256_set_m128i(hi, lo)
        }
        Bits::U8 => _mm256_loadu_si256(codes as *const __m256i),
    }
}

/// `acc + Σ` of 4-byte products per i32 lane: `vpdpbusd` with VNNI; else `vpmaddubsw` +
/// `vpmaddwd`, splitting 8-bit codes into nibbles so no i16 pair can saturate.
#[inline(always)]
unsafe fn dot4<const VNNI: bool>(bits: Bits, acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    if VNNI {
        return vnni_dot(acc, w, x);
    }
    let ones = _mm256_set1_epi16(1);
    if bits == Bits::U4 {
        return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones));
    }
    let nib = _mm256_set1_epi8(0x0f);
    let lo = _mm256_and_si256(w, nib);
    let hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), nib);
    let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x), ones);
    let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x), ones);
    _mm256_add_epi32(acc, _mm256_add_epi32(pl, _mm256_slli_epi32(ph, 4)))
}

/// Tokens in lanes: rows `r0..r0+NR` against token groups `g0..g0+NG` (8 tokens each).
#[inline(always)]
unsafe fn tokens_tile<const NR: usize, const NG: usize, const VNNI: bool>(
    w: &QMatrix,
    r0: usize,
    x: &QActs,
    g0: usize,
    out: *mut f32,
) {
    let nb = w.cols / QK;
    let mut acc = [[_mm256_setzero_ps(); NG]; NR];
    let mut macc = [[_mm256_setzero_ps(); NG]; NR];
    for b in 0..nb {
        let mut wa = [[0i32; 8]; NR];
        for i in 0..NR {
            let wv = load_codes(w.bits, w.codes.as_ptr().add(w.block_offset(r0 + i, b)));
            _mm256_storeu_si256(wa[i].as_mut_ptr() as *mut __m256i, wv);
        }
        let mut isum = [[_mm256_setzero_si256(); NG]; NR];
        for k in 0..8 {
            let mut xv = [_mm256_setzero_si256(); NG];
            for gi in 0..NG {
                xv[gi] =
                    _mm256_loadu_si256(x.xi.as_ptr().add((((g0 + gi) * nb + b) * 8 + k) * 32) as *const __m256i);
            }
            for i in 0..NR {
                let wb = _mm256_set1_epi32(wa[i][k]);
                for gi in 0..NG {
                    isum[i][gi] = dot4::<VNNI>(w.bits, isum[i][gi], wb, xv[gi]);
                }
            }
        }
        for i in 0..NR {
            let dw = _mm256_set1_ps(*w.d.as_ptr().add((r0 + i) * nb + b));
            let mw = _mm256_set1_ps(*w.m.as_ptr().add((r0 + i) * nb + b));
            for gi in 0..NG {
                let at = ((g0 + gi) * nb + b) * 8;
                let scale = _mm256_mul_ps(dw, _mm256_loadu_ps(x.dv.as_ptr().add(at)));
                acc[i][gi] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i][gi]), scale, acc[i][gi]);
                macc[i][gi] = _mm256_fmadd_ps(mw, _mm256_loadu_ps(x.sv.as_ptr().add(at)), macc[i][gi]);
            }
        }
    }
    for i in 0..NR {
        for gi in 0..NG {
            let mut res = [0f32; 8];
            _mm256_storeu_ps(res.as_mut_ptr(), _mm256_add_ps(acc[i][gi], macc[i][gi]));
            for (j, v) in res.iter().enumerate() {
                *out.add((8 * (g0 + gi) + j) * w.rows + r0 + i) = *v;
            }
        }
    }
}

/// Sums each of 8 i32 vectors across its lanes; lane `i` of the result is vector `i`'s sum.
#[inline(always)]
unsafe fn reduce8(p: &[__m256i; 8]) -> __m256i {
    let h01 = _mm256_hadd_epi32(p[0], p[1]);
    let h23 = _mm256_hadd_epi32(p[2], p[3]);
    let h45 = _mm256_hadd_epi32(p[4], p[5]);
    let h67 = _mm256_hadd_epi32(p[6], p[7]);
    let q0 = _mm256_hadd_epi32(h01, h23);
    let q1 = _mm256_hadd_epi32(h45, h67);
    let lo = _mm_add_epi32(_mm256_castsi256_si128(q0), _mm256_extracti128_si256(q0, 1));
    let hi = _mm_add_epi32(_mm256_castsi256_si128(q1), _mm256_extracti128_si256(q1, 1));
    _mm256_set_m128i(hi, lo)
}

/// Rows in lanes: the 8-row group starting at `r0` against token `t`.
#[inline(always)]
unsafe fn rows_tile<const VNNI: bool>(w: &QMatrix, r0: usize, x: &QActs, t: usize, out: *mut f32) {
    let nb = w.cols / QK;
    let bb = w.block_bytes();
    let g = r0 / 8;
    let mut acc = _mm256_setzero_ps();
    let mut macc = _mm256_setzero_ps();
    for b in 0..nb {
        let xv = _mm256_loadu_si256(x.q.as_ptr().add(t * w.cols + b * QK) as *const __m256i);
        // The group's 8 rows of block b are one contiguous run.
        let base = w.codes.as_ptr().add(w.block_offset(r0, b));
        let mut p = [_mm256_setzero_si256(); 8];
        for (i, pi) in p.iter_mut().enumerate() {
            let wv = load_codes(w.bits, base.add(i * bb));
            *pi = dot4::<VNNI>(w.bits, _mm256_setzero_si256(), wv, xv);
        }
        let isum = reduce8(&p);
        let at = (g * nb + b) * 8;
        let scale =
            _mm256_mul_ps(_mm256_loadu_ps(w.dt.as_ptr().add(at)), _mm256_set1_ps(*x.d.as_ptr().add(t * nb + b)));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc);
        macc = _mm256_fmadd_ps(
            _mm256_loadu_ps(w.mt.as_ptr().add(at)),
            _mm256_set1_ps(*x.s.as_ptr().add(t * nb + b)),
            macc,
        );
    }
    _mm256_storeu_ps(out.add(t * w.rows + r0), _mm256_add_ps(acc, macc));
}

#[inline(always)]
unsafe fn vnni_dot(acc: __m256i, wv: __m256i, xv: __m256i) -> __m256i {
    vnni_dot_impl(acc, wv, xv)
}

#[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
unsafe fn vnni_dot_impl(acc: __m256i, wv: __m256i, xv: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(acc, wv, xv)
}

/// Rows `r0..r1` (whole groups of 8, `r0` a multiple of 8) for every token.
#[inline(always)]
unsafe fn rows_generic<const VNNI: bool, const NR: usize>(
    w: &QMatrix,
    r0: usize,
    r1: usize,
    x: &QActs,
    out: *mut f32,
) {
    let groups = x.rows / 8;
    let mut g = 0;
    while g + 2 <= groups {
        let mut r = r0;
        while r + NR <= r1 {
            tokens_tile::<NR, 2, VNNI>(w, r, x, g, out);
            r += NR;
        }
        while r < r1 {
            tokens_tile::<1, 2, VNNI>(w, r, x, g, out);
            r += 1;
        }
        g += 2;
    }
    if g < groups {
        for r in r0..r1 {
            tokens_tile::<1, 1, VNNI>(w, r, x, g, out);
        }
    }
    for t in groups * 8..x.rows {
        let mut r = r0;
        while r < r1 {
            rows_tile::<VNNI>(w, r, x, t, out);
            r += 8;
        }
    }
}

#[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
pub(crate) unsafe fn quant_rows_vnni(w: &QMatrix, r0: usize, r1: usize, x: &QActs, out: *mut f32) {
    // 32 vector registers (AVX-512VL) hold a 2-row × 2-group tile.
    rows_generic::<true, 2>(w, r0, r1, x, out)
}

#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn quant_rows_avx2(w: &QMatrix, r0: usize, r1: usize, x: &QActs, out: *mut f32) {
    rows_generic::<false, 1>(w, r0, r1, x, out)
}
