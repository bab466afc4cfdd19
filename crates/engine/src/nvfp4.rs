//! NVFP4 weights as NVIDIA ModelOpt exports them (the GLM-5 checkpoints of issue 4), and the
//! quantizer that produces them.
//!
//! Per quantized linear layer `[N, K]` (ModelOpt `nvfp4` export, also read by SGLang's
//! `modelopt_quant.py` and vLLM's `ModelOptNvFp4LinearMethod`):
//! - `weight`: `u8 [N, K/2]`; element `2j` of a row in the low nibble of byte `j`, `2j+1` in the
//!   high nibble; each nibble is an E2M1 code: bit 3 the sign, bits 0–2 index the magnitudes
//!   `{0, 0.5, 1, 1.5, 2, 3, 4, 6}`;
//! - `weight_scale`: `float8_e4m3fn [N, K/16]`, one scale per 16 consecutive weights of a row;
//! - `weight_scale_2`: one f32 for the whole tensor;
//! - `w = e2m1 · f32(weight_scale) · weight_scale_2`.
//!
//! The quantizer follows ModelOpt's recipe: `weight_scale_2 = amax(|W|) / (6 · 448)`, each block
//! scale `amax(|block|) / 6 / weight_scale_2` rounded to E4M3 (saturating at 448), and each
//! weight rounded to the nearest E2M1 value of `w / (scale · weight_scale_2)` (ties to the even
//! code, as the hardware cast does).
//!
//! [`Nvfp4Matrix::matmul`] decodes 16 weights at a time and applies them to every token of a
//! batch (AVX2+FMA with runtime detection, and a scalar path computing the same arithmetic,
//! tested bit for bit against each other).

/// E2M1 magnitudes by the low three bits of a code.
pub const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

use crate::kernels::Isa;
use crate::pool::{SyncPtr, ThreadPool};

/// Weights per block scale.
pub const BLOCK: usize = 16;

/// Largest finite `float8_e4m3fn`.
pub const E4M3_MAX: f32 = 448.0;

/// Decodes one E2M1 nibble (bit 3 the sign).
pub fn e2m1_to_f32(code: u8) -> f32 {
    let m = E2M1[(code & 7) as usize];
    if code & 8 != 0 {
        -m
    } else {
        m
    }
}

/// Decodes a `float8_e4m3fn` byte: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits, no
/// infinities, `S.1111.111` is NaN, exponent 0 is subnormal (`m/8 · 2^-6`).
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let e = ((b >> 3) & 0xf) as i32;
    let m = (b & 7) as f32;
    if e == 0xf && b & 7 == 7 {
        return f32::NAN;
    }
    if e == 0 {
        return sign * m / 8.0 * 2f32.powi(-6);
    }
    sign * (1.0 + m / 8.0) * 2f32.powi(e - 7)
}

/// Nearest `float8_e4m3fn` to `x` (ties to even mantissa), saturating at ±448; NaN → NaN.
pub fn f32_to_e4m3(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7f;
    }
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let a = x.abs().min(E4M3_MAX);
    // Every representable magnitude is a candidate; 127 finite codes is few enough to search,
    // and a search cannot get the subnormal/normal boundary or the ties wrong.
    let mut best = 0u8;
    let mut best_err = f32::INFINITY;
    for code in 0u8..0x7f {
        let v = e4m3_to_f32(code);
        let err = (v - a).abs();
        if err < best_err || (err == best_err && code & 1 == 0 && best & 1 == 1) {
            best = code;
            best_err = err;
        }
    }
    sign | best
}

/// Nearest E2M1 code to `x` (ties to the even code); magnitudes above 6 saturate.
pub fn f32_to_e2m1(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 8u8 } else { 0 };
    let a = x.abs();
    let mut best = 0u8;
    let mut best_err = f32::INFINITY;
    for (code, m) in E2M1.iter().enumerate() {
        let err = (m - a).abs();
        if err < best_err || (err == best_err && code.is_multiple_of(2)) {
            best = code as u8;
            best_err = err;
        }
    }
    // −0 is encoded as +0.
    if best == 0 {
        0
    } else {
        sign | best
    }
}

/// Largest magnitude of `w`.
pub fn amax(w: &[f32]) -> f32 {
    w.iter().fold(0f32, |a, v| a.max(v.abs()))
}

/// ModelOpt's tensor scale for weights of largest magnitude `amax`: `amax / (6 · 448)`, so
/// block scales use the whole E4M3 range (1 for an all-zero tensor).
pub fn global_scale(amax: f32) -> f32 {
    if amax > 0.0 {
        amax / (6.0 * E4M3_MAX)
    } else {
        1.0
    }
}

/// How block scales are chosen by the quantizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleRule {
    /// ModelOpt's max calibration: `amax(|block|) / 6`, rounded to E4M3.
    Amax,
    /// Start from the amax scale and keep, among the E4M3 codes from [`MSE_CODES_BELOW`] below
    /// it to one above, the one whose block has the least squared error (a smaller scale
    /// clips the largest weight but resolves the rest more finely).
    Mse,
}

/// How far below the amax code [`ScaleRule::Mse`] searches (8 codes = one binade).
pub const MSE_CODES_BELOW: u8 = 8;

/// An NVFP4 matrix `[rows, cols]` in the exported layout.
#[derive(Debug, Clone, PartialEq)]
pub struct Nvfp4Matrix {
    /// Output features.
    pub rows: usize,
    /// Input features (a multiple of 16).
    pub cols: usize,
    /// `rows · cols / 2` bytes of E2M1 pairs.
    pub weight: Vec<u8>,
    /// `rows · cols / 16` E4M3 block scales.
    pub weight_scale: Vec<u8>,
    /// The tensor-wide scale, repeated per row (`[rows]`): one value for an exported tensor,
    /// and rows stacked from several tensors by [`Nvfp4Matrix::concat`] keep their own.
    pub weight_scale_2: Vec<f32>,
}

impl Nvfp4Matrix {
    /// Weight `(r, c)`.
    pub fn get(&self, r: usize, c: usize) -> f32 {
        let byte = self.weight[r * self.cols / 2 + c / 2];
        let code = if c.is_multiple_of(2) { byte & 0xf } else { byte >> 4 };
        e2m1_to_f32(code) * e4m3_to_f32(self.weight_scale[r * self.cols / BLOCK + c / BLOCK]) * self.weight_scale_2[r]
    }

    /// Row `r` as f32 (the reference the kernel is tested against).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        for (c, o) in out.iter_mut().enumerate().take(self.cols) {
            *o = self.get(r, c);
        }
    }

    /// Stacks matrices with the same column count along rows (fused projections such as
    /// gate/up); `None` for an empty list or differing column counts.
    pub fn concat(parts: &[&Nvfp4Matrix]) -> Option<Nvfp4Matrix> {
        let cols = parts.first()?.cols;
        if parts.iter().any(|p| p.cols != cols) {
            return None;
        }
        let mut m =
            Nvfp4Matrix { rows: 0, cols, weight: Vec::new(), weight_scale: Vec::new(), weight_scale_2: Vec::new() };
        for p in parts {
            m.rows += p.rows;
            m.weight.extend_from_slice(&p.weight);
            m.weight_scale.extend_from_slice(&p.weight_scale);
            m.weight_scale_2.extend_from_slice(&p.weight_scale_2);
        }
        Some(m)
    }

    /// Rows `r0..r1` as their own matrix (splits a stacked expert tensor).
    ///
    /// # Panics
    /// When the range is out of bounds.
    pub fn slice_rows(&self, r0: usize, r1: usize) -> Nvfp4Matrix {
        let (hb, sb) = (self.cols / 2, self.cols / BLOCK);
        Nvfp4Matrix {
            rows: r1 - r0,
            cols: self.cols,
            weight: self.weight[r0 * hb..r1 * hb].to_vec(),
            weight_scale: self.weight_scale[r0 * sb..r1 * sb].to_vec(),
            weight_scale_2: self.weight_scale_2[r0..r1].to_vec(),
        }
    }

    /// Quantizes a row-major f32 matrix (ModelOpt's recipe, module docs).
    ///
    /// # Panics
    /// When `cols` is not a multiple of 16 or `w.len() != rows · cols`.
    pub fn quantize(w: &[f32], rows: usize, cols: usize) -> Self {
        Self::quantize_with(w, rows, cols, ScaleRule::Amax)
    }

    /// [`Nvfp4Matrix::quantize`] with a choice of block-scale rule (the global scale is always
    /// amax-based).
    ///
    /// # Panics
    /// When `cols` is not a multiple of 16 or `w.len() != rows · cols`.
    pub fn quantize_with(w: &[f32], rows: usize, cols: usize, rule: ScaleRule) -> Self {
        Self::quantize_global(w, rows, cols, rule, global_scale(amax(w)))
    }

    /// [`Nvfp4Matrix::quantize_with`] with a given `weight_scale_2`: layers that serving
    /// engines fuse (q/k/v, gate/up) must share one, computed from their joint amax, as
    /// ModelOpt's export does (vLLM and SGLang take the max of the siblings' scales without
    /// rescaling the block scales).
    ///
    /// # Panics
    /// When `cols` is not a multiple of 16 or `w.len() != rows · cols`.
    pub fn quantize_global(w: &[f32], rows: usize, cols: usize, rule: ScaleRule, global: f32) -> Self {
        assert!(
            cols.is_multiple_of(BLOCK) && w.len() == rows * cols,
            "NVFP4 needs [rows, cols] with cols a multiple of 16"
        );
        let mut weight = vec![0u8; rows * cols / 2];
        let mut weight_scale = vec![0u8; rows * cols / BLOCK];
        for (b, blk) in w.chunks_exact(BLOCK).enumerate() {
            let bmax = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
            let mut s8 = f32_to_e4m3(bmax / 6.0 / global);
            if rule == ScaleRule::Mse && bmax > 0.0 {
                // E4M3 codes of one sign are ordered like their values: step through the
                // neighbours of the amax code and keep the one with the least squared error.
                let sse = |code: u8| -> f32 {
                    let sc = e4m3_to_f32(code) * global;
                    blk.iter().map(|v| (e2m1_to_f32(f32_to_e2m1(v / sc)) * sc - v).powi(2)).sum()
                };
                let lo = s8.saturating_sub(MSE_CODES_BELOW).max(1);
                let hi = (s8 + 1).min(0x7e);
                let mut best = (sse(s8), s8);
                for code in lo..=hi {
                    let e = sse(code);
                    if e < best.0 {
                        best = (e, code);
                    }
                }
                s8 = best.1;
            }
            weight_scale[b] = s8;
            let scale = e4m3_to_f32(s8) * global;
            for (i, v) in blk.iter().enumerate() {
                let code = if scale > 0.0 { f32_to_e2m1(v / scale) } else { 0 };
                let idx = b * BLOCK + i;
                weight[idx / 2] |= if idx.is_multiple_of(2) { code } else { code << 4 };
            }
        }
        Nvfp4Matrix { rows, cols, weight, weight_scale, weight_scale_2: vec![global; rows] }
    }

    /// `out[t·rows + r] = Σ_c W[r, c] · x[t·cols + c]` on the pool, decoding one 16-weight
    /// block at a time (the f32 weight matrix is never materialised) and applying it to every
    /// token while it is in registers.
    ///
    /// Exactly, per (row, token): eight f32 partial sums, lane `l` taking the weights whose
    /// column is `l` mod 8 in column order, each `w = e2m1 · (e4m3 · weight_scale_2)` and added
    /// with one fused multiply-add; the lanes are then summed as
    /// `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`. The SIMD and scalar paths both compute exactly
    /// this, so results do not depend on the instruction set or the batch.
    ///
    /// # Panics
    /// When `x.len() != tokens · cols` or `out.len() != tokens · rows`.
    pub fn matmul(&self, pool: &ThreadPool, isa: Isa, x: &[f32], tokens: usize, out: &mut [f32]) {
        assert_eq!(x.len(), tokens * self.cols, "nvfp4 matmul: activations shape");
        assert_eq!(out.len(), tokens * self.rows, "nvfp4 matmul: output shape");
        // The fields are public: check what the SIMD paths rely on, once per call.
        assert!(
            self.cols.is_multiple_of(BLOCK)
                && self.weight.len() == self.rows * self.cols / 2
                && self.weight_scale.len() == self.rows * self.cols / BLOCK
                && self.weight_scale_2.len() == self.rows,
            "nvfp4 matmul: inconsistent matrix [{}, {}]",
            self.rows,
            self.cols
        );
        // A caller may name an ISA the CPU lacks; fall back rather than fault.
        let isa = if isa != Isa::Scalar && Isa::detect() == Isa::Scalar { Isa::Scalar } else { isa };
        let per = self.rows.div_ceil(pool.threads() * 4).max(1);
        let ptr = SyncPtr(out.as_mut_ptr());
        pool.run(self.rows.div_ceil(per), |i| {
            let (r0, r1) = (i * per, ((i + 1) * per).min(self.rows));
            #[cfg(target_arch = "x86_64")]
            if isa != Isa::Scalar {
                // Full tiles of TILE_T tokens go through the register-tiled kernel over a
                // decoded group of rows; the remaining tokens take the per-row kernel. Both do
                // the same FMAs per (row, token) in the same order.
                let full = tokens / x86::TILE_T * x86::TILE_T;
                let mut res = vec![0f32; tokens - full];
                let mut buf = Vec::new();
                for g0 in (r0..r1).step_by(x86::GROUP) {
                    let g1 = (g0 + x86::GROUP).min(r1);
                    if full > 0 {
                        // SAFETY: AVX2+FMA were detected; rows g0..g1 of every token belong to
                        // this task alone.
                        #[allow(unsafe_code)]
                        unsafe {
                            x86::group_tiled(self, g0, g1, x, full, &mut buf, ptr, self.rows)
                        };
                    }
                    if full < tokens {
                        for r in g0..g1 {
                            // SAFETY: as above.
                            #[allow(unsafe_code)]
                            unsafe {
                                x86::row(self, r, &x[full * self.cols..], tokens - full, &mut res)
                            };
                            for (t, v) in res.iter().enumerate() {
                                // SAFETY: element (full + t, r) belongs to this task.
                                #[allow(unsafe_code)]
                                unsafe {
                                    *ptr.get().add((full + t) * self.rows + r) = *v;
                                }
                            }
                        }
                    }
                }
                return;
            }
            let _ = isa;
            let mut acc = vec![[0f32; 8]; tokens];
            let mut res = vec![0f32; tokens];
            for r in r0..r1 {
                self.row_scalar(r, x, tokens, &mut acc, &mut res);
                write_row(ptr, self.rows, r, &res);
            }
        });
    }

    /// The definition (see [`Nvfp4Matrix::matmul`]) for row `r`, all tokens.
    fn row_scalar(&self, r: usize, x: &[f32], tokens: usize, acc: &mut [[f32; 8]], res: &mut [f32]) {
        acc.iter_mut().for_each(|a| *a = [0.0; 8]);
        for b in 0..self.cols / BLOCK {
            let scale = e4m3_to_f32(self.weight_scale[r * self.cols / BLOCK + b]) * self.weight_scale_2[r];
            let bytes = &self.weight[r * self.cols / 2 + b * BLOCK / 2..][..BLOCK / 2];
            let mut w = [0f32; BLOCK];
            for (j, byte) in bytes.iter().enumerate() {
                w[2 * j] = e2m1_to_f32(byte & 0xf) * scale;
                w[2 * j + 1] = e2m1_to_f32(byte >> 4) * scale;
            }
            for (t, a) in acc.iter_mut().enumerate().take(tokens) {
                let xs = &x[t * self.cols + b * BLOCK..][..BLOCK];
                for half in 0..2 {
                    for l in 0..8 {
                        a[l] = w[half * 8 + l].mul_add(xs[half * 8 + l], a[l]);
                    }
                }
            }
        }
        for (o, a) in res.iter_mut().zip(acc.iter()) {
            *o = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
        }
    }
}

fn write_row(out: SyncPtr<f32>, rows: usize, r: usize, res: &[f32]) {
    for (t, v) in res.iter().enumerate() {
        // SAFETY: element (t, r) belongs to the task that owns row r.
        #[allow(unsafe_code)]
        unsafe {
            *out.get().add(t * rows + r) = *v;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    /// Rows decoded per group of the tiled kernel.
    pub(super) const GROUP: usize = 8;
    /// Tokens per register tile.
    pub(super) const TILE_T: usize = 6;

    /// Decodes the 16 weights of block `b` of row `r` into two vectors (`w = e2m1 · scale`).
    #[inline(always)]
    unsafe fn decode_block(m: &Nvfp4Matrix, r: usize, b: usize, table: __m256) -> (__m256, __m256) {
        let seven = _mm256_set1_epi32(7);
        let eight = _mm256_set1_epi32(8);
        let nib = _mm_set1_epi8(0x0f);
        let scale = _mm256_set1_ps(e4m3_to_f32(m.weight_scale[r * m.cols / BLOCK + b]) * m.weight_scale_2[r]);
        let bytes = &m.weight[r * m.cols / 2 + b * BLOCK / 2..][..BLOCK / 2];
        let v = _mm_loadl_epi64(bytes.as_ptr() as *const __m128i);
        // Element 2j is byte j's low nibble, 2j+1 its high nibble: interleave them.
        let codes = _mm_unpacklo_epi8(_mm_and_si128(v, nib), _mm_and_si128(_mm_srli_epi16(v, 4), nib));
        let decode = |c: __m256i| {
            let mag = _mm256_permutevar8x32_ps(table, _mm256_and_si256(c, seven));
            let sign = _mm256_slli_epi32(_mm256_and_si256(c, eight), 28);
            _mm256_mul_ps(_mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(mag), sign)), scale)
        };
        (decode(_mm256_cvtepu8_epi32(codes)), decode(_mm256_cvtepu8_epi32(_mm_srli_si128(codes, 8))))
    }

    #[inline(always)]
    unsafe fn reduce(a: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(a);
        let hi = _mm256_extractf128_ps(a, 1);
        let s = _mm_add_ps(lo, hi); // [l0+l4, l1+l5, l2+l6, l3+l7]
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s)); // [(l0+l4)+(l2+l6), (l1+l5)+(l3+l7), ..]
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    /// Rows `g0..g1` (at most [`GROUP`]) against the first `tokens` tokens (a multiple of
    /// [`TILE_T`]): the group is decoded once into `buf` (`GROUP × cols` f32, L1-sized), then
    /// each pair of rows × [`TILE_T`] tokens keeps its 12 accumulators in registers.
    ///
    /// # Safety
    /// AVX2+FMA available; `out` rows `g0..g1` of those tokens owned by the caller.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn group_tiled(
        m: &Nvfp4Matrix,
        g0: usize,
        g1: usize,
        x: &[f32],
        tokens: usize,
        buf: &mut Vec<f32>,
        out: SyncPtr<f32>,
        n_out: usize,
    ) {
        let k = m.cols;
        let table = _mm256_loadu_ps(E2M1.as_ptr());
        buf.resize(GROUP * k, 0.0);
        for r in g0..g1 {
            for b in 0..k / BLOCK {
                let (w0, w1) = decode_block(m, r, b, table);
                let dst = buf.as_mut_ptr().add((r - g0) * k + b * BLOCK);
                _mm256_storeu_ps(dst, w0);
                _mm256_storeu_ps(dst.add(8), w1);
            }
        }
        let o = out.get();
        let mut r = g0;
        while r < g1 {
            let pair = r + 1 < g1;
            let wa = buf.as_ptr().add((r - g0) * k);
            // A lone last row reuses its own weights as the partner; that result is dropped.
            let wb = if pair { wa.add(k) } else { wa };
            for t0 in (0..tokens).step_by(TILE_T) {
                let xp = x.as_ptr().add(t0 * k);
                let z = _mm256_setzero_ps();
                let (mut a0, mut a1, mut a2, mut a3, mut a4, mut a5) = (z, z, z, z, z, z);
                let (mut b0, mut b1, mut b2, mut b3, mut b4, mut b5) = (z, z, z, z, z, z);
                let mut c = 0;
                while c < k {
                    let va = _mm256_loadu_ps(wa.add(c));
                    let vb = _mm256_loadu_ps(wb.add(c));
                    let x0 = _mm256_loadu_ps(xp.add(c));
                    a0 = _mm256_fmadd_ps(va, x0, a0);
                    b0 = _mm256_fmadd_ps(vb, x0, b0);
                    let x1 = _mm256_loadu_ps(xp.add(k + c));
                    a1 = _mm256_fmadd_ps(va, x1, a1);
                    b1 = _mm256_fmadd_ps(vb, x1, b1);
                    let x2 = _mm256_loadu_ps(xp.add(2 * k + c));
                    a2 = _mm256_fmadd_ps(va, x2, a2);
                    b2 = _mm256_fmadd_ps(vb, x2, b2);
                    let x3 = _mm256_loadu_ps(xp.add(3 * k + c));
                    a3 = _mm256_fmadd_ps(va, x3, a3);
                    b3 = _mm256_fmadd_ps(vb, x3, b3);
                    let x4 = _mm256_loadu_ps(xp.add(4 * k + c));
                    a4 = _mm256_fmadd_ps(va, x4, a4);
                    b4 = _mm256_fmadd_ps(vb, x4, b4);
                    let x5 = _mm256_loadu_ps(xp.add(5 * k + c));
                    a5 = _mm256_fmadd_ps(va, x5, a5);
                    b5 = _mm256_fmadd_ps(vb, x5, b5);
                    c += 8;
                }
                for (t, (a, b)) in [(a0, b0), (a1, b1), (a2, b2), (a3, b3), (a4, b4), (a5, b5)].into_iter().enumerate()
                {
                    *o.add((t0 + t) * n_out + r) = reduce(a);
                    if pair {
                        *o.add((t0 + t) * n_out + r + 1) = reduce(b);
                    }
                }
            }
            r += 2;
        }
    }

    /// Row `r` against every token; see [`Nvfp4Matrix::matmul`] for the exact arithmetic.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn row(m: &Nvfp4Matrix, r: usize, x: &[f32], tokens: usize, res: &mut [f32]) {
        let table = _mm256_loadu_ps(E2M1.as_ptr());
        let mut acc = vec![_mm256_setzero_ps(); tokens];
        for b in 0..m.cols / BLOCK {
            let (w0, w1) = decode_block(m, r, b, table);
            for (t, a) in acc.iter_mut().enumerate() {
                let xp = x.as_ptr().add(t * m.cols + b * BLOCK);
                *a = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xp), *a);
                *a = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xp.add(8)), *a);
            }
        }
        for (o, a) in res.iter_mut().zip(&acc) {
            *o = reduce(*a);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-checked decodings.
    #[test]
    fn e2m1_and_e4m3_tables() {
        let want: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];
        for (code, w) in want.iter().enumerate() {
            assert_eq!(e2m1_to_f32(code as u8).to_bits(), w.to_bits(), "code {code:#x}");
        }
        // (byte, value): 0x38 = 0.0111.000 → 2^0; 0x7e = 0.1111.110 → 1.75·2^8 = 448;
        // 0x01 = smallest subnormal 2^-9; 0x08 = smallest normal 2^-6; 0xc0 = 1.1000.000 → −2.
        for (b, v) in [
            (0x38u8, 1.0f32),
            (0x7e, 448.0),
            (0x01, 0.001953125),
            (0x08, 0.015625),
            (0xc0, -2.0),
            (0x3c, 1.5),
            (0x00, 0.0),
        ] {
            assert_eq!(e4m3_to_f32(b), v, "{b:#x}");
            assert_eq!(f32_to_e4m3(v), b, "{v}");
        }
        assert!(e4m3_to_f32(0x7f).is_nan() && e4m3_to_f32(0xff).is_nan());
        assert_eq!(f32_to_e4m3(1000.0), 0x7e, "saturates at 448");
        // Ties go to the even mantissa: 1.0625 is halfway between 1.0 (0x38) and 1.125 (0x39).
        assert_eq!(f32_to_e4m3(1.0625), 0x38);
        assert_eq!(f32_to_e2m1(2.5), 4, "2.5 is halfway between 2 (code 4) and 3 (code 5)");
        assert_eq!(f32_to_e2m1(-5.0), 8 | 6, "−5 is halfway between −4 and −6: even code 6");
        assert_eq!(f32_to_e2m1(100.0), 7);
    }

    /// Layout: element 2j in the low nibble, 2j+1 in the high nibble; scales per 16 of a row.
    #[test]
    fn layout_and_scales() {
        let m = Nvfp4Matrix {
            rows: 1,
            cols: 16,
            weight: vec![0x21, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xf7],
            weight_scale: vec![0x40],
            weight_scale_2: vec![0.5],
        };
        // Scale 0x40 = 0.1000.000 → 2; times 0.5 → 1.
        assert_eq!(m.get(0, 0), 0.5); // low nibble of 0x21: code 1
        assert_eq!(m.get(0, 1), 1.0); // high nibble: code 2
        assert_eq!(m.get(0, 14), 6.0); // low nibble of 0xf7: code 7
        assert_eq!(m.get(0, 15), -6.0); // high nibble: code 0xf
    }

    #[test]
    fn quantize_round_trip_and_matmul() {
        // 5 rows: one per task; 21 and 37: groups with row pairs and a lone row.
        for rows in [5usize, 21, 37] {
            let cols = 64;
            let w: Vec<f32> = (0..rows * cols)
                .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * if i % 13 == 0 { 4.0 } else { 1.0 })
                .collect();
            let q = Nvfp4Matrix::quantize(&w, rows, cols);
            let mut row = vec![0f32; cols];
            for r in 0..rows {
                q.dequantize_row(r, &mut row);
                for (c, (d, o)) in row.iter().zip(&w[r * cols..]).enumerate() {
                    // Error within half a step of the coarsest E2M1 spacing at this block's scale.
                    let s = e4m3_to_f32(q.weight_scale[(r * cols + c) / BLOCK]) * q.weight_scale_2[r];
                    assert!((d - o).abs() <= s + 1e-6, "({r},{c}): {d} vs {o}");
                }
            }
            let pool = ThreadPool::new(2).expect("pool");
            for tokens in [1usize, 3, 6, 9, 13] {
                let x: Vec<f32> = (0..tokens * cols).map(|i| (i as f32 * 0.37).sin()).collect();
                let mut simd = vec![0f32; tokens * rows];
                let mut scalar = vec![0f32; tokens * rows];
                q.matmul(&pool, Isa::detect(), &x, tokens, &mut simd);
                q.matmul(&pool, Isa::Scalar, &x, tokens, &mut scalar);
                for t in 0..tokens {
                    for r in 0..rows {
                        let i = t * rows + r;
                        assert_eq!(simd[i].to_bits(), scalar[i].to_bits(), "row {r} token {t} of {tokens}");
                        q.dequantize_row(r, &mut row);
                        let e: f64 =
                            row.iter().zip(&x[t * cols..(t + 1) * cols]).map(|(a, b)| *a as f64 * *b as f64).sum();
                        assert!((simd[i] as f64 - e).abs() < 1e-4, "{} vs {e}", simd[i]);
                    }
                }
            }
        }
    }
}
