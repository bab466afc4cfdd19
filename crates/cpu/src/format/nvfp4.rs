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
//! `Nvfp4Matrix::matmul` (in `kernels/nvfp4_gemm.rs`) decodes 16 weights at a time and applies them to every token of a
//! batch (AVX2+FMA with runtime detection, and a scalar path computing the same arithmetic,
//! tested bit for bit against each other).

/// E2M1 magnitudes by the low three bits of a code.
pub const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Isa, ThreadPool};

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
            // 50 and 101: several token blocks (48 tokens at 64 columns), a partial last tile.
            for tokens in [1usize, 3, 6, 9, 13, 50, 101] {
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
