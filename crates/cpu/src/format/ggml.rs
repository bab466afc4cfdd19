//! GGML blocks as stored in GGUF files (their types, sizes and GGML's own dequantization), and
//! the 8-bit activation blocks the integer kernels multiply them with.
//!
//! GGML block layouts follow `ggml/src/ggml-common.h` (llama.cpp):
//! - `Q4_0`: `{ d: f16, qs: [u8; 16] }`, 32 weights, `w = d · (q − 8)`;
//! - `Q4_1`: `{ d: f16, m: f16, qs: [u8; 16] }`, `w = d · q + m`;
//! - `Q8_0`: `{ d: f16, qs: [i8; 32] }`, `w = d · q`;
//! - `Q5_0`: `{ d: f16, qh: u32, qs: [u8; 16] }`, `w = d · (q − 16)`, bit 4 of weight `j` is bit
//!   `j` of `qh`;
//! - `Q5_1`: `{ d: f16, m: f16, qh: u32, qs: [u8; 16] }`, `w = d · q + m`;
//! - K-quants, super-blocks of 256 (`QK_K`): `Q4_K` `{ d, dmin: f16, scales: [u8; 12],
//!   qs: [u8; 128] }` and `Q5_K` (plus `qh: [u8; 32]`) give each 32-weight sub-block a 6-bit
//!   scale `sc` and min `m`, `w = (d·sc) · q − dmin·m`; `Q6_K` `{ ql: [u8; 128], qh: [u8; 64],
//!   scales: [i8; 16], d: f16 }` has 16-weight sub-blocks, `w = (d·sc) · (q − 32)`
//!   (`dequantize_row_q{4,5,6}_K` in `ggml/src/ggml-quants.c`);
//! - `MXFP4` (OCP microscaling FP4, gpt-oss's experts): `{ e: u8, qs: [u8; 16] }`, 32 E2M1
//!   weights in Q4_0's nibble order under one E8M0 scale, `w = 2^(e − 128) · kv[q]` with GGML's
//!   doubled E2M1 values `kv = {0, 1, 2, 3, 4, 6, 8, 12, −0, −1, −2, −3, −4, −6, −8, −12}`
//!   (`dequantize_row_mxfp4`, `kvalues_mxfp4`, `GGML_E8M0_TO_FP32_HALF`); its unsigned code is
//!   `kv[q] + 12` (`MXFP4_CODES`), in 0..=24;
//! - `F32`, `F16` and `BF16` (the top half of an f32) are plain arrays.
//!
//! In both 4-bit legacy blocks byte `j` holds weight `j` in its low nibble and weight `j + 16` in
//! its high nibble. [`decode_codes`] turns any block into its unsigned integer codes (the form
//! [`QMatrix`] repacks, at the file's size); [`dequantize_row`] is GGML's dequantization, the
//! reference the repacked layout is tested against.
#![allow(unsafe_code)]

use crate::half::f16_to_f32;

pub use super::acts::{quantize_blocks, QActs};
pub use super::qmatrix::QMatrix;

/// Weights per quantization block (all GGML formats used here, and activations).
pub const QK: usize = 32;

/// Weights per K-quant super-block (`QK_K`).
pub const QK_K: usize = 256;

/// GGML tensor types this crate reads (values are GGML's `ggml_type` numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// IEEE half.
    F16,
    /// bfloat16 (the top 16 bits of an f32).
    BF16,
    /// 4-bit, scale only.
    Q4_0,
    /// 4-bit, scale and min.
    Q4_1,
    /// 8-bit, scale only.
    Q8_0,
    /// 5-bit, scale only.
    Q5_0,
    /// 5-bit, scale and min.
    Q5_1,
    /// 4-bit K-quant (256-weight super-blocks, 6-bit sub-block scales and mins).
    Q4_K,
    /// 5-bit K-quant.
    Q5_K,
    /// 6-bit K-quant (16-weight sub-blocks, 8-bit scales).
    Q6_K,
    /// OCP MXFP4: 4-bit E2M1 weights under a shared E8M0 scale per 32.
    MXFP4,
}

/// MXFP4's unsigned code of each nibble: GGML's doubled E2M1 value (`kvalues_mxfp4`) plus 12.
pub const MXFP4_CODES: [u8; 16] = [12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0];

/// MXFP4's block scale `2^(e − 128)` from its E8M0 byte `e` (GGML's `GGML_E8M0_TO_FP32_HALF`:
/// half the E8M0 value, as the codes are doubled), exactly: for `e ≥ 2` the f32 whose exponent
/// field is `e − 1`; `e` 0 and 1 are subnormal (2^-128, 2^-127). The repacked tiles keep the
/// byte, and the kernels widen 8 or 16 at a time by the same shift ([`mxfp4_scale`] is their
/// definition).
pub fn mxfp4_scale(e: u8) -> f32 {
    match e {
        0 | 1 => f32::from_bits(0x0020_0000 << e),
        _ => f32::from_bits(((e as u32) - 1) << 23),
    }
}

impl GgmlType {
    /// Maps GGML's type number; `None` for types we do not load.
    pub fn from_u32(t: u32) -> Option<Self> {
        Some(match t {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            12 => Self::Q4_K,
            13 => Self::Q5_K,
            14 => Self::Q6_K,
            30 => Self::BF16,
            39 => Self::MXFP4,
            _ => return None,
        })
    }

    /// Bytes taken by `n` elements (`n` a multiple of [`GgmlType::block_len`]).
    pub fn bytes_for(self, n: usize) -> usize {
        match self {
            Self::F32 => 4 * n,
            Self::F16 | Self::BF16 => 2 * n,
            Self::Q4_0 => n / QK * 18,
            Self::Q4_1 => n / QK * 20,
            Self::Q8_0 => n / QK * 34,
            Self::Q5_0 => n / QK * 22,
            Self::Q5_1 => n / QK * 24,
            Self::Q4_K => n / QK_K * 144,
            Self::Q5_K => n / QK_K * 176,
            Self::Q6_K => n / QK_K * 210,
            Self::MXFP4 => n / QK * 17,
        }
    }

    /// True for block-quantized types (row length must be a multiple of [`GgmlType::block_len`]).
    pub fn is_block(self) -> bool {
        !matches!(self, Self::F32 | Self::F16 | Self::BF16)
    }

    /// Weights per block: 1 for F32/F16, 32, or 256 for the K-quants.
    pub fn block_len(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_K | Self::Q5_K | Self::Q6_K => QK_K,
            _ => QK,
        }
    }

    /// GGML's name (`Q4_K`, `F32`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q8_0 => "Q8_0",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q4_K => "Q4_K",
            Self::Q5_K => "Q5_K",
            Self::Q6_K => "Q6_K",
            Self::MXFP4 => "MXFP4",
        }
    }
}

/// Every block type, in GGML's numbering order (tests iterate over it).
pub const BLOCK_TYPES: [GgmlType; 9] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::MXFP4,
];

/// The 6-bit scale and min of sub-block `j` (0..8) of a `Q4_K`/`Q5_K` super-block
/// (`get_scale_min_k4` in `ggml-quants.c`).
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// One 32-weight block of an affine type as unsigned codes (`u[i]` is weight `i`), scale and
/// offset, `w = d · u + m`: the single decoding of every affine type that both
/// [`dequantize_row`] and [`decode_codes`] use. `blk` is the GGML block holding it and
/// `sub` the block's index inside it (0 for 32-weight types, 0..8 for K-quants).
fn affine_block(ty: GgmlType, blk: &[u8], sub: usize, u: &mut [u8; QK]) -> (f32, f32) {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            let qs = &blk[if ty == GgmlType::Q4_0 { 2 } else { 4 }..];
            for j in 0..16 {
                u[j] = qs[j] & 0xf;
                u[j + 16] = qs[j] >> 4;
            }
            let d = rd_f16(blk, 0);
            if ty == GgmlType::Q4_0 {
                (d, -8.0 * d)
            } else {
                (d, rd_f16(blk, 2))
            }
        }
        GgmlType::MXFP4 => {
            let qs = &blk[1..];
            for j in 0..16 {
                u[j] = MXFP4_CODES[(qs[j] & 0xf) as usize];
                u[j + 16] = MXFP4_CODES[(qs[j] >> 4) as usize];
            }
            // 2^(e − 128) exactly (GGML's E8M0 half), built from its bits.
            let d = match blk[0] {
                0 => f32::from_bits(0x0020_0000),
                1 => f32::from_bits(0x0040_0000),
                e => f32::from_bits(((e as u32) - 1) << 23),
            };
            (d, -12.0 * d)
        }
        GgmlType::Q8_0 => {
            for j in 0..QK {
                u[j] = (blk[2 + j] as i8 as i16 + 128) as u8;
            }
            let d = rd_f16(blk, 0);
            (d, -128.0 * d)
        }
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let o = if ty == GgmlType::Q5_0 { 2 } else { 4 };
            let qh = u32::from_le_bytes([blk[o], blk[o + 1], blk[o + 2], blk[o + 3]]);
            let qs = &blk[o + 4..];
            for j in 0..16 {
                u[j] = (qs[j] & 0xf) | (((qh >> j) << 4) & 0x10) as u8;
                u[j + 16] = (qs[j] >> 4) | ((qh >> (j + 12)) & 0x10) as u8;
            }
            let d = rd_f16(blk, 0);
            if ty == GgmlType::Q5_0 {
                (d, -16.0 * d)
            } else {
                (d, rd_f16(blk, 2))
            }
        }
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let (d, dmin) = (rd_f16(blk, 0), rd_f16(blk, 2));
            let (sc, m) = scale_min_k4(sub, &blk[4..16]);
            // Sub-blocks 2k and 2k+1 share 32 bytes of `qs`: low nibbles, then high ones.
            let (qs, hi) = if ty == GgmlType::Q4_K { (&blk[16..], None) } else { (&blk[48..], Some(&blk[16..48])) };
            let q = &qs[sub / 2 * 32..sub / 2 * 32 + 32];
            for l in 0..QK {
                let nib = if sub.is_multiple_of(2) { q[l] & 0xf } else { q[l] >> 4 };
                let h = hi.map_or(0, |qh| ((qh[l] >> sub) & 1) << 4);
                u[l] = nib | h;
            }
            (d * sc as f32, -(dmin * m as f32))
        }
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Q6_K => unreachable!("not an affine block type"),
    }
}

/// The unsigned integer codes of one GGML block of a block type (`u.len()` = its block length):
/// `u[i]` is weight `i`'s code, 4-bit (Q4_0, Q4_1, Q4_K), 5-bit (Q5_0, Q5_1, Q5_K), 6-bit (Q6_K,
/// `q + 32`) or 8-bit (Q8_0, `q + 128`).
///
/// # Panics
/// For F32/F16/BF16.
pub fn decode_codes(ty: GgmlType, blk: &[u8], u: &mut [u8]) {
    if ty == GgmlType::Q6_K {
        let (ql, qh) = (&blk[..128], &blk[128..192]);
        for n in 0..2 {
            let (ql, qh, y) = (&ql[64 * n..], &qh[32 * n..], &mut u[128 * n..]);
            for l in 0..32 {
                y[l] = (ql[l] & 0xf) | ((qh[l] & 3) << 4);
                y[l + 32] = (ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4);
                y[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                y[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
            }
        }
        return;
    }
    let mut sub = [0u8; QK];
    for (s, o) in u.chunks_exact_mut(QK).enumerate() {
        affine_block(ty, blk, s, &mut sub);
        o.copy_from_slice(&sub);
    }
}

fn rd_f16(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Dequantizes one row of `n` elements of type `ty` from `src` into `out` (length `n`).
///
/// This is the scalar reference the kernels are tested against.
pub fn dequantize_row(ty: GgmlType, src: &[u8], out: &mut [f32]) {
    match ty {
        GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = f16_to_f32(u16::from_le_bytes([c[0], c[1]]));
            }
        }
        GgmlType::BF16 => {
            for (o, c) in out.iter_mut().zip(src.chunks_exact(2)) {
                *o = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
            }
        }
        GgmlType::Q6_K => {
            for (blk, o) in src.chunks_exact(210).zip(out.chunks_exact_mut(QK_K)) {
                let (ql, qh, sc) = (&blk[..128], &blk[128..192], &blk[192..208]);
                let d = rd_f16(blk, 208);
                for n in 0..2 {
                    let (ql, qh, sc, y) = (&ql[64 * n..], &qh[32 * n..], &sc[8 * n..], &mut o[128 * n..]);
                    for l in 0..32 {
                        let is = l / 16;
                        let q1 = ((ql[l] & 0xf) | ((qh[l] & 3) << 4)) as i32 - 32;
                        let q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                        let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                        let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                        // GGML's `d * sc[is] * q`, left to right.
                        y[l] = d * sc[is] as i8 as f32 * q1 as f32;
                        y[l + 32] = d * sc[is + 2] as i8 as f32 * q2 as f32;
                        y[l + 64] = d * sc[is + 4] as i8 as f32 * q3 as f32;
                        y[l + 96] = d * sc[is + 6] as i8 as f32 * q4 as f32;
                    }
                }
            }
        }
        _ => {
            let (bl, bs) = (ty.block_len(), ty.bytes_for(ty.block_len()));
            let mut u = [0u8; QK];
            for (blk, o) in src.chunks_exact(bs).zip(out.chunks_exact_mut(bl)) {
                for (sub, o) in o.chunks_exact_mut(QK).enumerate() {
                    let (d, m) = affine_block(ty, blk, sub, &mut u);
                    for (o, &u) in o.iter_mut().zip(&u) {
                        *o = d * u as f32 + m;
                    }
                }
            }
        }
    }
}

/// Random GGML bytes of `n` weights of block type `ty` whose f16 scales are finite and small
/// (about 1e-3..1e-2), for tests of the formats and kernels.
#[doc(hidden)]
pub fn random_blocks(ty: GgmlType, n: usize, next: &mut dyn FnMut() -> u32) -> Vec<u8> {
    let mut raw: Vec<u8> = (0..ty.bytes_for(n)).map(|_| next() as u8).collect();
    let bs = ty.bytes_for(ty.block_len());
    // The high bytes of the f16 fields: d (and m or dmin) at the front, Q6_K's d at the end.
    let highs: &[usize] = match ty {
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[1, 3],
        GgmlType::Q6_K => &[209],
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::MXFP4 => &[],
        _ => &[1],
    };
    for blk in raw.chunks_exact_mut(bs) {
        if ty == GgmlType::MXFP4 {
            // Scales 2^-10 .. 2^5, within what the tiles keep.
            blk[0] = 118 + blk[0] % 16;
        }
        for (i, &h) in highs.iter().enumerate() {
            // A positive scale; Q4_1/Q5_1 offsets negative (K-quant mins are subtracted).
            let sign = if i == 1 && matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) { 0x80 } else { 0 };
            blk[h] = sign | 0x20 | (blk[h] & 0x0f);
        }
    }
    raw
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::half::f32_to_f16;

    #[test]
    fn f16_values() {
        assert_eq!(f16_to_f32(0x3c00), 1.0);
        assert_eq!(f16_to_f32(0xc000), -2.0);
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x03ff), 1023.0 * 2f32.powi(-24));
        assert!(f16_to_f32(0x7c00).is_infinite());
        assert!(f16_to_f32(0x7e00).is_nan());
    }

    /// The software conversion equals the hardware one (F16C) bit for bit, and round-trips.
    #[test]
    fn f32_to_f16_matches_hardware() {
        let mut x = 0x9e37_79b9u32;
        let mut vals: Vec<f32> =
            vec![0.0, -0.0, 1.0, 65504.0, 65520.0, 1e-8, 5.96e-8, 2.98e-8, 6.1e-5, f32::INFINITY, f32::NAN];
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            vals.push(f32::from_bits(x));
        }
        for v in vals {
            let h = f32_to_f16(v);
            if v.is_nan() {
                assert!(f16_to_f32(h).is_nan());
                continue;
            }
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("f16c") {
                // SAFETY: F16C detected.
                #[allow(unsafe_code)]
                let hw = unsafe { hw_f16(v) };
                assert_eq!(h, hw, "{v:e}");
            }
            if v.abs() <= 65504.0 && v.abs() >= 6.2e-5 {
                assert!((f16_to_f32(h) - v).abs() <= v.abs() / 2048.0, "{v:e}");
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    #[target_feature(enable = "f16c")]
    unsafe fn hw_f16(v: f32) -> u16 {
        use std::arch::x86_64::*;
        _mm_extract_epi16::<0>(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set1_ps(v))) as u16
    }

    /// Hand-built blocks against values computed by hand from GGML's layouts.
    #[test]
    fn hand_computed_blocks() {
        let f16 = |v: f32| f32_to_f16(v).to_le_bytes();
        // Q5_0, d = 0.5: weight j has low nibble j % 16, high bit set for odd j.
        let mut b = Vec::new();
        b.extend_from_slice(&f16(0.5));
        let qh: u32 = (0..32).filter(|j| j % 2 == 1).fold(0, |a, j| a | 1 << j);
        b.extend_from_slice(&qh.to_le_bytes());
        b.extend((0..16u8).map(|j| j | (j << 4)));
        let mut out = [0f32; 32];
        dequantize_row(GgmlType::Q5_0, &b, &mut out);
        for (j, &v) in out.iter().enumerate() {
            let q = (j % 16) as f32 + if j % 2 == 1 { 16.0 } else { 0.0 };
            assert_eq!(v, 0.5 * (q - 16.0), "Q5_0 weight {j}");
        }
        // Q4_K: d = 1, dmin = 0.25; sub-block s has scale 7s + 1 and min 9s (s < 4 direct,
        // s ≥ 4 through the packed high bits); every code is 3 (low nibbles) or 5 (high).
        let mut b = Vec::new();
        b.extend_from_slice(&f16(1.0));
        b.extend_from_slice(&f16(0.25));
        let (sc, mn): (Vec<u8>, Vec<u8>) = ((0..8).map(|s| 7 * s + 1).collect(), (0..8).map(|s| 9 * s).collect());
        let mut scales = [0u8; 12];
        for j in 0..4 {
            scales[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
            scales[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
            scales[j + 8] = (sc[j + 4] & 0xf) | ((mn[j + 4] & 0xf) << 4);
        }
        b.extend_from_slice(&scales);
        b.extend(std::iter::repeat_n(0x53u8, 128));
        let mut out = vec![0f32; 256];
        dequantize_row(GgmlType::Q4_K, &b, &mut out);
        for (i, &v) in out.iter().enumerate() {
            let s = i / 32;
            let q = if s % 2 == 0 { 3.0 } else { 5.0 };
            assert_eq!(v, sc[s] as f32 * q - 0.25 * mn[s] as f32, "Q4_K weight {i}");
        }
    }
}
