//! [`QActs`]: activations quantized to signed 8 bits for the integer matmuls, in the two block
//! sizes GGML's dot products use (llama.cpp `ggml-quants.c`):
//!
//! - per 32 values (`Q8_1`'s idea), for the 32-weight types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0):
//!   `x ≈ d · q` and `s = d · Σq`, the term their offsets multiply;
//! - per 64 values, for the K-quants (Q4_K, Q5_K, Q6_K): one scale `dk` per 64 and the integer
//!   sums `Σq` of every 16 values (also packed as i16 pairs, [`QActs::bp`], for `vpmaddwd`),
//!   so the sub-block scales and mins of 64 weights (two of Q4_K's sub-blocks, four of Q6_K's)
//!   apply in integers and one float step per 64 remains.
//!   llama.cpp's `Q8_K` uses one scale per 256; 64 keeps the logits within the tolerances the
//!   Gemma 3 goldens state (measured against the exact f64 forward: largest error 1.05 and mean
//!   0.153 with 64, 1.33 and 0.224 with 256; with 32, 0.83 and 0.132), and 64 bytes are one
//!   AMX tile row, so a tile product still spans a whole block.
//!
//! Rounding is to nearest, ties to even (llama.cpp's `quantize_row_q8_1` rounds with
//! `_MM_ROUND_NEAREST`); the scale is `max|x| / 127`. The AVX2 quantizers are bit-identical to
//! the scalar ones (tested). Each form is made only when a matmul's weights need it.
#![allow(unsafe_code)]

use super::ggml::QK;

/// Values per block of the K-quants' activation form.
pub const QKA: usize = 64;

/// Activations quantized for the integer kernels (module docs); the shape is `[rows, cols]`.
#[derive(Debug, Default, Clone)]
pub struct QActs {
    /// Rows (tokens).
    pub rows: usize,
    /// Values per row (a multiple of 32; of 256 where the per-64 form is used, for K-quants).
    pub cols: usize,
    /// Per-32 form: `rows · cols` codes.
    pub q: Vec<i8>,
    /// Per-32 form: `rows · cols / 32` scales.
    pub d: Vec<f32>,
    /// Per-32 form: `rows · cols / 32` sums `d · Σq`.
    pub s: Vec<f32>,
    /// Per-32 form's codes in AMX A-tile order when [`QActs::pack_tiles`] made them: for each
    /// block of 16 tokens and each 32-block, 16 rows × 32 bytes (tokens past `rows` zero), so
    /// one tile load reads 512 contiguous bytes instead of 16 rows a whole row apart (which
    /// fell into the same L1 sets).
    pub tiles: Vec<i8>,
    /// Per-64 form: `rows · cols` codes.
    pub qk: Vec<i8>,
    /// Per-64 form: `rows · cols / 64` scales.
    pub dk: Vec<f32>,
    /// Per-64 form: `rows · cols / 16` integer sums `Σq` of every 16 codes.
    pub bk: Vec<i32>,
    /// Per-64 form: [`bk`](QActs::bk) as pairs of i16 in one i32 (low half first), the operand
    /// `vpmaddwd` multiplies sub-block scales or mins with, 4 per 64-value block: `(Σq₀, Σq₁)`,
    /// `(Σq₂, Σq₃)` of the four 16-value sums, `(Σq₀ + Σq₁, Σq₂ + Σq₃)` of the two 32-value
    /// sums, and 0 (every sum fits i16: at most 32 · 127).
    pub bp: Vec<i32>,
    /// Per-64 form's codes in AMX A-tile order ([`QActs::pack_tiles`]): per block of 16
    /// tokens and 64-value block, 16 rows × 64 bytes.
    pub tiles_k: Vec<i8>,
}

impl QActs {
    /// Quantizes `x` (`rows · cols` row-major) into the per-32 form.
    pub fn quantize(&mut self, x: &[f32], rows: usize, cols: usize) {
        self.resize(rows, cols);
        let nb = rows * cols / QK;
        quantize_blocks(x, &mut self.q, &mut self.d, &mut self.s, 0, nb);
    }

    /// Quantizes `x` into the per-64 form (`cols` a multiple of 64).
    pub fn quantize_k(&mut self, x: &[f32], rows: usize, cols: usize) {
        self.resize_k(rows, cols);
        let nb = rows * cols / QKA;
        quantize_k_blocks(x, &mut self.qk, &mut self.dk, &mut self.bk, &mut self.bp, 0, nb);
    }

    /// Sets the shape and sizes the per-32 buffers (contents unspecified until quantized).
    pub fn resize(&mut self, rows: usize, cols: usize) {
        debug_assert_eq!(cols % QK, 0);
        self.rows = rows;
        self.cols = cols;
        self.q.resize(rows * cols, 0);
        let nb = rows * cols / QK;
        self.d.resize(nb, 0.0);
        self.s.resize(nb, 0.0);
    }

    /// Sets the shape and sizes the per-64 buffers (contents unspecified until quantized).
    pub fn resize_k(&mut self, rows: usize, cols: usize) {
        debug_assert_eq!(cols % QKA, 0);
        self.rows = rows;
        self.cols = cols;
        self.qk.resize(rows * cols, 0);
        self.dk.resize(rows * cols / QKA, 0.0);
        self.bk.resize(rows * cols / 16, 0);
        self.bp.resize(rows * cols / 16, 0);
    }

    /// Fills [`QActs::tiles`] (from `q`, when `per32`) and [`QActs::tiles_k`] (from `qk`, when
    /// `perk`).
    pub fn pack_tiles(&mut self, per32: bool, perk: bool) {
        if per32 {
            pack(&self.q, self.rows, self.cols, QK, &mut self.tiles);
        }
        if perk {
            pack(&self.qk, self.rows, self.cols, 64, &mut self.tiles_k);
        }
    }
}

/// `codes` (`rows × cols`) as `[token block of 16][chunk of w bytes][16 rows × w]`.
fn pack(codes: &[i8], rows: usize, cols: usize, w: usize, out: &mut Vec<i8>) {
    let nc = cols / w;
    out.clear();
    out.resize(rows.div_ceil(16) * nc * 16 * w, 0);
    for t in 0..rows {
        let (tb, r) = (t / 16, t % 16);
        for c in 0..nc {
            let dst = ((tb * nc + c) * 16 + r) * w;
            out[dst..dst + w].copy_from_slice(&codes[t * cols + c * w..t * cols + (c + 1) * w]);
        }
    }
}

/// Quantizes 32-blocks `b0 .. b1` of `x` into the matching slices of `q`, `d` and `s`, which
/// hold exactly those blocks.
pub fn quantize_blocks(x: &[f32], q: &mut [i8], d: &mut [f32], s: &mut [f32], b0: usize, b1: usize) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the features were just detected.
        unsafe { quantize_avx2::<QK>(x, q, d, b0, b1, |b, db, total| s[b] = db * total as f32) };
        return;
    }
    quantize_body::<QK>(x, q, d, b0, b1, |b, db, total| s[b] = db * total as f32);
}

/// Quantizes 64-blocks `b0 .. b1` of `x` into the matching slices of `q`, `d`, `bs` (4
/// sums per block) and `bp` (their 4 pairs, [`QActs::bp`]).
pub fn quantize_k_blocks(x: &[f32], q: &mut [i8], d: &mut [f32], bs: &mut [i32], bp: &mut [i32], b0: usize, b1: usize) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the features were just detected.
        unsafe { quantize_avx2::<QKA>(x, q, d, b0, b1, |_, _, _| {}) };
    } else {
        quantize_body::<QKA>(x, q, d, b0, b1, |_, _, _| {});
    }
    #[cfg(not(target_arch = "x86_64"))]
    quantize_body::<QKA>(x, q, d, b0, b1, |_, _, _| {});
    for (h, o) in q[b0 * QKA..b1 * QKA].chunks_exact(16).zip(bs[b0 * 4..b1 * 4].iter_mut()) {
        *o = h.iter().map(|&v| v as i32).sum();
    }
    let pair = |a: i32, b: i32| (a & 0xffff) | (b << 16);
    for (s, p) in bs[b0 * 4..b1 * 4].chunks_exact(4).zip(bp[b0 * 4..b1 * 4].chunks_exact_mut(4)) {
        p.copy_from_slice(&[pair(s[0], s[1]), pair(s[2], s[3]), pair(s[0] + s[1], s[2] + s[3]), 0]);
    }
}

/// [`quantize_body`] with AVX2, block by block, bit-identical to it: `max` ignores NaN as
/// `f32::max` does (`vmaxps` returns its second operand, the running maximum, when the first is
/// NaN), `vcvtps2dq` rounds to nearest even as `round_ties_even` does, NaN values become 0 as in
/// `as i32`, and a block with a non-finite maximum (where the two conversions' saturation rules
/// differ) takes the scalar body. `done(b, d, Σq)` is told each block's scale and code sum.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_avx2<const L: usize>(
    x: &[f32],
    q: &mut [i8],
    d: &mut [f32],
    b0: usize,
    b1: usize,
    mut done: impl FnMut(usize, f32, i32),
) {
    use std::arch::x86_64::*;
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    for b in b0..b1 {
        let xs = &x[b * L..(b + 1) * L];
        let p = xs.as_ptr();
        let mut m = _mm256_setzero_ps();
        for i in (0..L).step_by(8) {
            m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(p.add(i)), abs_mask), m);
        }
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps(m2, m2, 1)));
        if !amax.is_finite() {
            quantize_body::<L>(x, q, d, b, b + 1, &mut done);
            continue;
        }
        let (db, id) = scale_of(amax);
        let idv = _mm256_set1_ps(id);
        let mut sum = _mm256_setzero_si256();
        for i in (0..L).step_by(32) {
            // A NaN value converts to 0 as `as i32` does (`vcvtps2dq` would give i32::MIN).
            let r: [__m256i; 4] = std::array::from_fn(|k| {
                let vi = _mm256_loadu_ps(p.add(i + 8 * k));
                let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(vi, vi));
                _mm256_andnot_si256(nan, _mm256_cvtps_epi32(_mm256_mul_ps(vi, idv)))
            });
            sum = _mm256_add_epi32(sum, _mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3])));
            // Values are within ±127, so the saturating packs are exact; packing works per
            // 128-bit lane, and the permute puts the 8 dword groups back in order.
            let w01 = _mm256_packs_epi32(r[0], r[1]);
            let w23 = _mm256_packs_epi32(r[2], r[3]);
            let bytes = _mm256_packs_epi16(w01, w23);
            let ordered = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(q.as_mut_ptr().add(b * L + i) as *mut __m256i, ordered);
        }
        let s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
        let s2 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0b01_00_11_10));
        let total = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0b10_11_00_01)));
        d[b] = db;
        done(b, db, total);
    }
}

/// A block's scale `max|x| / 127` and its inverse. A block so small that the inverse overflows
/// (`max|x|` below about 3.7e-37, e.g. SiLU of very negative inputs) is quantized as zeros with
/// scale 0: `x · inf` would give codes of ±inf, which `as i32` saturates (and `as i8` then
/// flips the sign of) and the AVX2 conversion turns into −128. llama.cpp's `quantize_row_q8_*`
/// have the same `1/d` and leave this case undefined.
#[inline(always)]
fn scale_of(amax: f32) -> (f32, f32) {
    let db = amax / 127.0;
    let id = if db > 0.0 { 1.0 / db } else { 0.0 };
    if id.is_finite() {
        (db, id)
    } else {
        (0.0, 0.0)
    }
}

/// The scalar quantizer of blocks `b0 .. b1` of `L` values (the reference).
#[inline(always)]
fn quantize_body<const L: usize>(
    x: &[f32],
    q: &mut [i8],
    d: &mut [f32],
    b0: usize,
    b1: usize,
    mut done: impl FnMut(usize, f32, i32),
) {
    for b in b0..b1 {
        let xs = &x[b * L..(b + 1) * L];
        let amax = xs.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let (db, id) = scale_of(amax);
        let mut sum = 0i32;
        for (qv, v) in q[b * L..(b + 1) * L].iter_mut().zip(xs) {
            let r = (v * id).round_ties_even() as i32;
            *qv = r as i8;
            sum += r;
        }
        d[b] = db;
        done(b, db, sum);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX2 quantizers equal the scalar body bit for bit in both block sizes, including
    /// ties, zeros, NaN and infinite blocks, and the per-64 form's 16-value sums are its codes'.
    #[test]
    fn quantize_avx2_matches_scalar() {
        let mut rng = 0x2545_f491u32;
        let mut x: Vec<f32> = (0..64 * QK)
            .map(|_| {
                rng ^= rng << 13;
                rng ^= rng >> 17;
                rng ^= rng << 5;
                (rng as i32 as f32) / 2.0f32.powi(24)
            })
            .collect();
        x[..QK].iter_mut().for_each(|v| *v = 0.0);
        x[QK] = f32::NAN;
        x[2 * QK + 3] = f32::INFINITY;
        // A block whose scale's inverse overflows (ahead of the ties, which fill 3·QK..4·QK).
        x[4 * QK..5 * QK].iter_mut().enumerate().for_each(|(i, v)| *v = if i % 2 == 0 { 1e-38 } else { -2e-38 });
        // Exact ties: 0.5 steps of the block scale.
        for (i, v) in x[3 * QK..4 * QK].iter_mut().enumerate() {
            *v = (i as f32 - 16.0) * 127.0 / 32.0 + 0.0;
        }
        for l in [QK, QKA] {
            let nb = x.len() / l;
            let (mut q1, mut d1, mut s1) = (vec![0i8; x.len()], vec![0f32; nb], vec![0i32; nb]);
            let (mut q2, mut d2) = (q1.clone(), d1.clone());
            let mut s2 = vec![0i32; nb];
            if l == QK {
                quantize_body::<QK>(&x, &mut q1, &mut d1, 0, nb, |b, _, t| s1[b] = t);
            } else {
                quantize_body::<QKA>(&x, &mut q1, &mut d1, 0, nb, |b, _, t| s1[b] = t);
            }
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                // SAFETY: detected just above.
                unsafe {
                    if l == QK {
                        quantize_avx2::<QK>(&x, &mut q2, &mut d2, 0, nb, |b, _, t| s2[b] = t);
                    } else {
                        quantize_avx2::<QKA>(&x, &mut q2, &mut d2, 0, nb, |b, _, t| s2[b] = t);
                    }
                }
                assert_eq!(q1, q2, "block {l}");
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&d1), bits(&d2), "block {l}");
                assert_eq!(s1, s2, "block {l}");
            }
        }
        let mut a = QActs::default();
        a.quantize_k(&x, 2, x.len() / 2);
        // The tiny 32-block: codes 0 (not −1 or −128) and scale 0, on this CPU's path (the loop
        // above compared it with the scalar body).
        let mut q32 = QActs::default();
        q32.quantize(&x, 2, x.len() / 2);
        assert!(q32.q[4 * QK..5 * QK].iter().all(|&c| c == 0) && q32.d[4] == 0.0, "tiny block");
        for (h, &b) in a.qk.chunks_exact(16).zip(&a.bk) {
            assert_eq!(b, h.iter().map(|&v| v as i32).sum::<i32>());
        }
        let half = |v: i32, hi: bool| if hi { v >> 16 } else { v as i16 as i32 };
        for (s, p) in a.bk.chunks_exact(4).zip(a.bp.chunks_exact(4)) {
            assert_eq!(
                [half(p[0], false), half(p[0], true), half(p[1], false), half(p[1], true)],
                [s[0], s[1], s[2], s[3]]
            );
            assert_eq!([half(p[2], false), half(p[2], true), p[3]], [s[0] + s[1], s[2] + s[3], 0]);
        }
    }
}
