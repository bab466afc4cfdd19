//! [`QMatrix`]: a GGML block-quantized matrix repacked for the kernels at its file's size.
//!
//! Every block type keeps its own bits per weight (Q4_0 4.5, Q4_1 5, Q5_0 5.5, Q5_1 6, Q8_0 8.5,
//! Q4_K 4.625 where the file has 4.5, Q5_K 5.625 for 5.5, Q6_K 6.5625): codes stay 4-bit
//! nibbles plus a 1- or 2-bit high plane, scales stay f16 and the K-quants' 6-bit sub-block
//! scales stay one byte each. Nothing is widened; the layout changes only *where* the bytes are.
//!
//! **Tiles.** Rows come in groups of 16 (the last group padded with zero rows). A *tile* is one
//! row group × one GGML block (32 or 256 weights) and is contiguous, so a row group's weights are
//! one sequential stream: the d/m (or d/dmin) f16 of the 16 rows, then per-sub-block scale
//! bytes, then per 32-weight sub-block the high-bit planes and the code chunks. A *chunk* is 4
//! consecutive code bytes of each of the 16 rows (64 bytes, row `i` at `4i`): one 512-bit load
//! holds the same weights of 16 rows (*rows in lanes*), a 256-bit load those of 8 (the group's
//! two *halves*), and one broadcast of 4 activation bytes feeds them all. A chunk is also one
//! row of an AMX B tile (16 columns × 4 bytes of K).
//! In a 4-bit sub-block, byte `j` (of 16) of a row holds weight `j` in its low nibble and weight
//! `j + 16` in its high nibble (GGML's Q4_0 order, for every type), so chunk `c` gives weights
//! `4c .. 4c+4` (low nibbles) and `16 + 4c .. 16 + 4c + 4` (high nibbles). The high planes are
//! laid out so that chunk `c`'s bits reach bit 4 of each code byte with one shift and one mask
//! (see [`HighBits`]).
//!
//! **Arithmetic** (the scalar definition [`QMatrix::dot`] that every kernel reproduces bit for
//! bit), llama.cpp's dot products (`ggml_vec_dot_*_q8_*` in `ggml-cpu/arch/x86/quants.c`) with
//! one f32 rounding order fixed. Activations are 8-bit ([`QActs`]).
//!
//! *32-weight types* (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) against the per-32 form (`x ≈ dx · q`,
//! `sx = dx · Σq`), each block `w = dw · u + mw` with unsigned codes `u`:
//!
//! ```text
//! acc = 0; macc = 0
//! for each block b:  acc  = fma(f32(Σ u·q), dw_b · dx_b, acc)      (the sum exact in i32)
//!                    macc = fma(mw_b, sx_b, macc)
//! out = acc + macc
//! ```
//!
//! with Q4_0 `dw = d, mw = −8d`; Q4_1 `dw = d, mw = m`; Q5_0 `dw = d, mw = −16d`; Q5_1 `dw = d,
//! mw = m`; Q8_0 `u = q + 128, dw = d, mw = −128d` (every `mw` exact).
//!
//! *K-quants* (Q4_K, Q5_K, Q6_K) against the per-64 form (`x ≈ dk · q` per 64 values, 16-value
//! sums `Σq`; [`crate::format::acts`] says why 64): the sub-block scales and mins are integers,
//! so each 64-value block is summed in i32 and scaled once:
//!
//! ```text
//! acc = 0; macc = 0
//! for each 64-block c of super-block B:
//!     S = Σ_{j∈c} sc_j · Σ_{i∈j} u_i·q_i        Q4_K, Q5_K: 2 sub-blocks of 32
//!     M = Σ_{j∈c} m_j · Σ_{i∈j} q_i
//!     (Q6_K: S = Σ_{j∈c} sc_j · Σ_{i∈j} (u_i − 32)·q_i, 4 sub-blocks of 16; M = 0)
//!     acc  = fma(f32(S), d_B · dk_c, acc)
//!     macc = fma(f32(M), dmin_B · dk_c, macc)
//! out = acc − macc
//! ```
//!
//! (`S` and `M` are exact in i32. For Q4_K/Q5_K they are exact in f32 too: at most
//! 2 · 63 · 31 · 127 · 32 < 2^24; Q6_K's `S` can reach about 3.3 · 10^7, and its conversion
//! rounds to nearest even on every path, `vcvtdq2ps` as `as f32`.) The integer sums are exact
//! on every path (VNNI `vpdpbusd`, AVX2 `vpmaddubsw` in i16 within the bounds worked out in
//! `kernels::q8_x86`, AMX `tdpbsud`), so every path gives the same bits, alone or batched.
//! GGML's own dequantized values ([`QMatrix::dequantize_row`]) are reproduced bit for bit
//! (`dequantize_row_*` in `ggml/src/ggml-quants.c`).
#![allow(unsafe_code)]

use super::ggml::{decode_codes, mxfp4_scale, GgmlType, QActs, MXFP4_CODES, QK, QK_K};

/// The integer scales of one super-block of one row of a K-quant ([`QMatrix::k_params`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KParams {
    /// `d` (f16, widened).
    pub d: f32,
    /// `dmin` (Q4_K, Q5_K; 0 for Q6_K).
    pub dmin: f32,
    /// Sub-block scales: 8 × 6-bit (Q4_K, Q5_K) or 16 × i8 (Q6_K).
    pub sc: [i32; 16],
    /// Sub-block mins: 8 × 6-bit (Q4_K, Q5_K).
    pub m: [i32; 8],
}
use crate::half::f16_to_f32;

/// Rows per group: the lanes of one 512-bit vector of i32 sums.
pub const GROUP: usize = 16;

/// Rows per half group: the lanes of one 256-bit vector of i32 sums.
pub const HALF: usize = 8;

/// Bytes of a chunk: 4 code bytes of each of the 16 rows.
pub const CHUNK: usize = 4 * GROUP;

/// Where each part of a tile lives (byte offsets inside the tile) and how big it is. Every
/// per-row array is `[..][row]` with the 16 rows contiguous (f16: 32 bytes; bytes: 16), so a
/// half group's values are the first or second half of each run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TileLayout {
    /// Bytes of one tile (16 rows × one GGML block).
    pub bytes: usize,
    /// 32-weight sub-blocks per GGML block (1, or 8 for the K-quants).
    pub subs: usize,
    /// The 8 rows' `d` (f16).
    pub d: usize,
    /// The 8 rows' second f16 (Q4_1/Q5_1 `m`, Q4_K/Q5_K `dmin`), if any.
    pub m: Option<usize>,
    /// Sub-block scale bytes, `[sub][row]` (Q4_K/Q5_K: 6-bit `sc` per 32; Q6_K: i8 `sc` per 16,
    /// `[half][row]`).
    pub sc: Option<usize>,
    /// Sub-block min bytes `[sub][row]` (Q4_K/Q5_K: 6-bit `m`).
    pub mn: Option<usize>,
    /// First sub-block's high-bit plane; sub-block `s`'s is at [`TileLayout::hi_at`].
    pub hi: usize,
    /// Bytes of a sub-block's high plane for 16 rows (0, 64 or 128).
    pub hi_bytes: usize,
    /// First sub-block's code chunks, right after its high plane (`hi + hi_bytes`); sub-block
    /// `s`'s are at [`TileLayout::codes_at`].
    pub codes: usize,
    /// Bytes of a sub-block's codes for 16 rows (256 nibble bytes or 512 8-bit codes).
    pub code_bytes: usize,
}

impl TileLayout {
    /// Bytes from one sub-block's high plane and codes to the next's: each sub-block's plane and
    /// codes are adjacent, so a tile is read front to back. (Planes first and codes after, in
    /// two regions, measured 22 % slower for the Q6_K single-token product, 255 MB, Zen 4: the
    /// hardware prefetchers follow one sequential stream per tile, not two interleaved ones.)
    pub const fn sub_stride(&self) -> usize {
        self.hi_bytes + self.code_bytes
    }

    /// Offset of sub-block `s`'s high-bit plane.
    pub const fn hi_at(&self, s: usize) -> usize {
        self.hi + s * self.sub_stride()
    }

    /// Offset of sub-block `s`'s code chunks.
    pub const fn codes_at(&self, s: usize) -> usize {
        self.codes + s * self.sub_stride()
    }
}

/// The high-bit plane of a 32-weight sub-block (per row).
///
/// - [`HighBits::One`] (Q5_*): one 32-bit lane per row (row `i` at `4i`); byte `j` of it holds, at bit `c`, bit 4
///   of weight `4c + j` and, at bit `4 + c`, bit 4 of weight `16 + 4c + j` (`c` = 0..4). Chunk
///   `c`'s bit 4 is `(lane << (4 − c)) & 0x10101010` (low-nibble weights) and `(lane >> c) &
///   0x10101010` (high-nibble weights).
/// - [`HighBits::Two`] (Q6_K): two runs of 16 32-bit lanes, the first for weights 0..16 of
///   each row, the second for 16..32; byte `j` holds at bits `2c, 2c+1` bits 4–5 of weight `4c + j` (of its
///   half). Chunk `c`'s bits 4–5 are `(lane << 4 >> 2c) & 0x30303030`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HighBits {
    /// 4-bit or 8-bit codes.
    None,
    /// Q5_0, Q5_1, Q5_K.
    One,
    /// Q6_K.
    Two,
}

/// The layout of `ty`'s tiles; `None` for F32/F16/BF16.
pub const fn layout(ty: GgmlType) -> Option<TileLayout> {
    #[allow(clippy::too_many_arguments)]
    const fn l(
        bytes: usize,
        subs: usize,
        m: Option<usize>,
        sc: Option<usize>,
        mn: Option<usize>,
        hi: usize,
        hi_bytes: usize,
        codes: usize,
        code_bytes: usize,
    ) -> TileLayout {
        TileLayout { bytes, subs, d: 0, m, sc, mn, hi, hi_bytes, codes, code_bytes }
    }
    Some(match ty {
        GgmlType::Q4_0 => l(288, 1, None, None, None, 32, 0, 32, 256),
        // The 16 rows' E8M0 scale bytes as stored, then Q4_0's nibbles: the file's 17 bytes per
        // block exactly (4.25 bits a weight).
        GgmlType::MXFP4 => l(272, 1, None, None, None, 16, 0, 16, 256),
        GgmlType::Q4_1 => l(320, 1, Some(32), None, None, 64, 0, 64, 256),
        GgmlType::Q8_0 => l(544, 1, None, None, None, 32, 0, 32, 512),
        GgmlType::Q5_0 => l(352, 1, None, None, None, 32, 64, 96, 256),
        GgmlType::Q5_1 => l(384, 1, Some(32), None, None, 64, 64, 128, 256),
        GgmlType::Q4_K => l(2368, 8, Some(32), Some(64), Some(192), 320, 0, 320, 256),
        GgmlType::Q5_K => l(2880, 8, Some(32), Some(64), Some(192), 320, 64, 384, 256),
        GgmlType::Q6_K => l(3360, 8, None, Some(32), None, 288, 128, 416, 256),
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => return None,
    })
}

/// Whether `ty`'s nibbles are looked up in [`MXFP4_CODES`] to give their unsigned codes (MXFP4;
/// the kernels do it with one byte shuffle per chunk), rather than being the codes.
pub const fn lut_codes(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::MXFP4)
}

/// The high plane kind of `ty`.
pub const fn high_bits(ty: GgmlType) -> HighBits {
    match ty {
        GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q5_K => HighBits::One,
        GgmlType::Q6_K => HighBits::Two,
        _ => HighBits::None,
    }
}

/// A quantized matrix `[rows, cols]` in tiles (module docs): row `r` produces output `r`.
#[derive(Clone)]
pub struct QMatrix {
    /// The GGML type the matrix came from (and whose arithmetic it keeps).
    pub ty: GgmlType,
    /// Output features.
    pub rows: usize,
    /// Input features (a multiple of the type's block length).
    pub cols: usize,
    /// The tiles, `groups × blocks_per_row`, row group major, in huge pages.
    data: crate::mem::HugeBytes,
}

impl std::fmt::Debug for QMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QMatrix").field("ty", &self.ty).field("rows", &self.rows).field("cols", &self.cols).finish()
    }
}

/// The scale and offset of one sub-block of one row ([`QMatrix::sub_params`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SubParams {
    /// `dw` (module docs).
    pub dw: f32,
    /// `mw`, for types with an offset.
    pub mw: Option<f32>,
}

impl QMatrix {
    /// The tile layout.
    pub fn layout(&self) -> TileLayout {
        // Construction only accepts block types.
        layout(self.ty).unwrap_or(TileLayout {
            bytes: 0,
            subs: 1,
            d: 0,
            m: None,
            sc: None,
            mn: None,
            hi: 0,
            hi_bytes: 0,
            codes: 0,
            code_bytes: 0,
        })
    }

    /// Row groups (the last may be partly padding).
    pub fn groups(&self) -> usize {
        self.rows.div_ceil(GROUP)
    }

    /// GGML blocks per row.
    pub fn blocks_per_row(&self) -> usize {
        self.cols / self.ty.block_len()
    }

    /// Every tile, `groups × blocks_per_row`, row group major (for the kernels).
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// Bytes held: what a matmul over the matrix streams from memory.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Tile `(g, kb)`.
    #[inline]
    pub fn tile(&self, g: usize, kb: usize) -> &[u8] {
        let l = self.layout();
        let at = (g * self.blocks_per_row() + kb) * l.bytes;
        &self.data[at..at + l.bytes]
    }

    /// Converts GGML block data (`rows` rows of `cols` weights, row-major as in a GGUF file)
    /// into tiles, on up to `threads` threads.
    ///
    /// # Panics
    /// When `ty` is not a block type, `cols` is not whole blocks or `src` is short (callers
    /// check shapes first).
    pub fn from_ggml(ty: GgmlType, src: &[u8], rows: usize, cols: usize) -> Self {
        Self::from_ggml_threads(ty, src, rows, cols, 1)
    }

    /// [`QMatrix::from_ggml`] with the row groups split over `threads` scoped threads (the
    /// repacking of an 8B model's 5 GB is a few seconds per thread).
    ///
    /// # Panics
    /// As [`QMatrix::from_ggml`].
    pub fn from_ggml_threads(ty: GgmlType, src: &[u8], rows: usize, cols: usize, threads: usize) -> Self {
        let l = layout(ty).expect("a block type");
        assert!(cols.is_multiple_of(ty.block_len()), "{cols} columns of {}", ty.name());
        let row_bytes = ty.bytes_for(cols);
        assert!(src.len() >= rows * row_bytes, "{} bytes for {rows} rows of {}", src.len(), ty.name());
        let nkb = cols / ty.block_len();
        let groups = rows.div_ceil(GROUP);
        let group_bytes = nkb * l.bytes;
        let mut data = crate::mem::HugeBytes::zeroed(groups * group_bytes);
        let per = groups.div_ceil(threads.max(1)).max(1);
        let pack = |g0: usize, out: &mut [u8]| {
            for (gi, gout) in out.chunks_exact_mut(group_bytes).enumerate() {
                let g = g0 + gi;
                for i in 0..GROUP {
                    let r = g * GROUP + i;
                    if r >= rows {
                        break;
                    }
                    let row = &src[r * row_bytes..(r + 1) * row_bytes];
                    let bb = ty.bytes_for(ty.block_len());
                    for (kb, blk) in row.chunks_exact(bb).enumerate() {
                        pack_block(ty, &l, blk, &mut gout[kb * l.bytes..(kb + 1) * l.bytes], i);
                    }
                }
            }
        };
        if threads <= 1 || groups <= 1 {
            pack(0, &mut data);
        } else {
            std::thread::scope(|s| {
                for (ti, chunk) in data.chunks_mut(per * group_bytes).enumerate() {
                    let pack = &pack;
                    s.spawn(move || pack(ti * per, chunk));
                }
            });
        }
        QMatrix { ty, rows, cols, data }
    }

    /// Stacks matrices of one type and width along rows (Q, K and V into one QKV projection);
    /// `None` when types or widths differ or a part's rows are not whole groups (but the last).
    pub fn concat(parts: &[&QMatrix]) -> Option<QMatrix> {
        let first = parts.first()?;
        if parts.iter().any(|p| p.ty != first.ty || p.cols != first.cols) {
            return None;
        }
        if parts[..parts.len() - 1].iter().any(|p| !p.rows.is_multiple_of(GROUP)) {
            return None;
        }
        let mut data = crate::mem::HugeBytes::zeroed(parts.iter().map(|p| p.data.len()).sum());
        let mut at = 0;
        for p in parts {
            data[at..at + p.data.len()].copy_from_slice(&p.data);
            at += p.data.len();
        }
        Some(QMatrix { ty: first.ty, rows: parts.iter().map(|p| p.rows).sum(), cols: first.cols, data })
    }

    /// The unsigned codes of 32-weight sub-block `b` (of the row) of row `r`: `u[i]` is weight
    /// `32b + i` (0..15, 0..31, 0..63 or 0..255).
    pub fn sub_codes(&self, r: usize, b: usize, u: &mut [u8; QK]) {
        let l = self.layout();
        let (g, i) = (r / GROUP, r % GROUP);
        let (kb, s) = (b / l.subs, b % l.subs);
        let t = self.tile(g, kb);
        let codes = &t[l.codes_at(s)..];
        if l.code_bytes == 2 * CHUNK * 4 {
            for c in 0..8 {
                u[4 * c..4 * c + 4].copy_from_slice(&codes[c * CHUNK + 4 * i..c * CHUNK + 4 * i + 4]);
            }
            return;
        }
        let code = |n: u8| if lut_codes(self.ty) { MXFP4_CODES[n as usize] } else { n };
        for c in 0..4 {
            for j in 0..4 {
                let byte = codes[c * CHUNK + 4 * i + j];
                u[4 * c + j] = code(byte & 0xf);
                u[16 + 4 * c + j] = code(byte >> 4);
            }
        }
        let hi = &t[l.hi_at(s)..];
        match high_bits(self.ty) {
            HighBits::None => {}
            HighBits::One => {
                let lane = &hi[4 * i..4 * i + 4];
                for c in 0..4 {
                    for j in 0..4 {
                        u[4 * c + j] |= ((lane[j] >> c) & 1) << 4;
                        u[16 + 4 * c + j] |= ((lane[j] >> (4 + c)) & 1) << 4;
                    }
                }
            }
            HighBits::Two => {
                for (half, base) in [(0usize, 0usize), (1, CHUNK)] {
                    let lane = &hi[base + 4 * i..base + 4 * i + 4];
                    for c in 0..4 {
                        for j in 0..4 {
                            u[16 * half + 4 * c + j] |= ((lane[j] >> (2 * c)) & 3) << 4;
                        }
                    }
                }
            }
        }
    }

    fn f16_at(&self, t: &[u8], at: usize, i: usize) -> f32 {
        f16_to_f32(u16::from_le_bytes([t[at + 2 * i], t[at + 2 * i + 1]]))
    }

    /// `dw`/`mw` of row `r`'s 32-weight sub-block `b` (Q6_K: of its 16-weight half `half`).
    pub fn sub_params(&self, r: usize, b: usize, half: usize) -> SubParams {
        let l = self.layout();
        let (g, i) = (r / GROUP, r % GROUP);
        let (kb, s) = (b / l.subs, b % l.subs);
        let t = self.tile(g, kb);
        let d = match self.ty {
            GgmlType::MXFP4 => mxfp4_scale(t[l.d + i]),
            _ => self.f16_at(t, l.d, i),
        };
        match self.ty {
            GgmlType::Q4_0 => SubParams { dw: d, mw: Some(-8.0 * d) },
            GgmlType::MXFP4 => SubParams { dw: d, mw: Some(-12.0 * d) },
            GgmlType::Q5_0 => SubParams { dw: d, mw: Some(-16.0 * d) },
            GgmlType::Q8_0 => SubParams { dw: d, mw: Some(-128.0 * d) },
            GgmlType::Q4_1 | GgmlType::Q5_1 => SubParams { dw: d, mw: Some(self.f16_at(t, 2 * GROUP, i)) },
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let sc = t[4 * GROUP + s * GROUP + i] as f32;
                let m = t[12 * GROUP + s * GROUP + i] as f32;
                SubParams { dw: d * sc, mw: Some(-(self.f16_at(t, 2 * GROUP, i) * m)) }
            }
            GgmlType::Q6_K => {
                let sc = t[2 * GROUP + (2 * s + half) * GROUP + i] as i8 as f32;
                SubParams { dw: d * sc, mw: None }
            }
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!("not a block type"),
        }
    }

    /// Whether the type is a K-quant (256-weight super-blocks, multiplied with the per-256
    /// activations).
    pub fn is_k(&self) -> bool {
        self.ty.block_len() == QK_K
    }

    /// The scales of row `r`'s super-block `sb` (a K-quant).
    pub fn k_params(&self, r: usize, sb: usize) -> KParams {
        let (g, i) = (r / GROUP, r % GROUP);
        let t = self.tile(g, sb);
        let mut p = KParams { d: self.f16_at(t, 0, i), dmin: 0.0, sc: [0; 16], m: [0; 8] };
        if self.ty == GgmlType::Q6_K {
            for h in 0..16 {
                p.sc[h] = t[2 * GROUP + h * GROUP + i] as i8 as i32;
            }
        } else {
            p.dmin = self.f16_at(t, 2 * GROUP, i);
            for j in 0..8 {
                p.sc[j] = t[4 * GROUP + j * GROUP + i] as i32;
                p.m[j] = t[12 * GROUP + j * GROUP + i] as i32;
            }
        }
        p
    }

    /// Row `r`'s weights as GGML dequantizes them (bit for bit), into `out` (`cols` values).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let mut u = [0u8; QK];
        for b in 0..self.cols / QK {
            self.sub_codes(r, b, &mut u);
            let o = &mut out[b * QK..(b + 1) * QK];
            if self.ty == GgmlType::Q6_K {
                // GGML's `d * sc[is] * q` with q = u − 32, left to right.
                for half in 0..2 {
                    let dw = self.sub_params(r, b, half).dw;
                    for j in 0..16 {
                        o[16 * half + j] = dw * (u[16 * half + j] as i32 - 32) as f32;
                    }
                }
                continue;
            }
            let p = self.sub_params(r, b, 0);
            let m = p.mw.unwrap_or(0.0);
            for (o, &u) in o.iter_mut().zip(&u) {
                *o = p.dw * u as f32 + m;
            }
        }
    }

    /// The definition (module docs) for row `r` against token `t` of `x`: the portable path
    /// and the reference every SIMD path is tested against bit for bit.
    pub fn dot(&self, r: usize, x: &QActs, t: usize) -> f32 {
        if self.is_k() {
            return self.dot_k(r, x, t);
        }
        let nb = self.cols / QK;
        let xq = &x.q[t * self.cols..(t + 1) * self.cols];
        let (mut acc, mut macc) = (0f32, 0f32);
        let mut u = [0u8; QK];
        for b in 0..nb {
            self.sub_codes(r, b, &mut u);
            let q = &xq[b * QK..(b + 1) * QK];
            let xb = t * nb + b;
            let dx = x.d[xb];
            let isum: i32 = u.iter().zip(q).map(|(&u, &q)| u as i32 * q as i32).sum();
            let p = self.sub_params(r, b, 0);
            acc = (isum as f32).mul_add(p.dw * dx, acc);
            if let Some(mw) = p.mw {
                macc = mw.mul_add(x.s[xb], macc);
            }
        }
        acc + macc
    }
}

impl QMatrix {
    /// [`QMatrix::dot`] for the K-quants (module docs).
    fn dot_k(&self, r: usize, x: &QActs, t: usize) -> f32 {
        let nsb = self.cols / QK_K;
        let xq = &x.qk[t * self.cols..(t + 1) * self.cols];
        let bs = &x.bk[t * self.cols / 16..(t + 1) * self.cols / 16];
        let dks = &x.dk[t * self.cols / 64..(t + 1) * self.cols / 64];
        let (mut acc, mut macc) = (0f32, 0f32);
        let mut u = [0u8; QK];
        for sb in 0..nsb {
            let p = self.k_params(r, sb);
            let (mut s, mut m) = (0i32, 0i32);
            for j in 0..8 {
                let b = sb * 8 + j;
                self.sub_codes(r, b, &mut u);
                let q = &xq[b * QK..(b + 1) * QK];
                if self.ty == GgmlType::Q6_K {
                    for h in 0..2 {
                        let i: i32 = (16 * h..16 * h + 16).map(|k| (u[k] as i32 - 32) * q[k] as i32).sum();
                        s += p.sc[2 * j + h] * i;
                    }
                } else {
                    let i: i32 = u.iter().zip(q).map(|(&u, &q)| u as i32 * q as i32).sum();
                    s += p.sc[j] * i;
                    m += p.m[j] * (bs[2 * b] + bs[2 * b + 1]);
                }
                if j % 2 == 1 {
                    let dk = dks[b / 2];
                    acc = (s as f32).mul_add(p.d * dk, acc);
                    macc = (m as f32).mul_add(p.dmin * dk, macc);
                    (s, m) = (0, 0);
                }
            }
        }
        acc - macc
    }
}

/// Writes row `i` (0..16) of a tile from one GGML block `blk` of type `ty`.
fn pack_block(ty: GgmlType, l: &TileLayout, blk: &[u8], tile: &mut [u8], i: usize) {
    let mut u = [0u8; QK_K];
    let n = ty.block_len();
    decode_codes(ty, blk, &mut u[..n]);
    let put16 = |tile: &mut [u8], at: usize, v: [u8; 2]| tile[at + 2 * i..at + 2 * i + 2].copy_from_slice(&v);
    match ty {
        GgmlType::Q4_0 | GgmlType::Q8_0 | GgmlType::Q5_0 => put16(tile, l.d, [blk[0], blk[1]]),
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => {
            put16(tile, l.d, [blk[0], blk[1]]);
            put16(tile, 2 * GROUP, [blk[2], blk[3]]);
        }
        GgmlType::Q6_K => put16(tile, l.d, [blk[208], blk[209]]),
        // The kernels widen the byte into an exponent field, which has no subnormals: 0 and 1
        // (2^-128, 2^-127) become 2^-126 here; the GGUF loader refuses them first.
        GgmlType::MXFP4 => tile[l.d + i] = blk[0].max(2),
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!("not a block type"),
    }
    if ty == GgmlType::MXFP4 {
        // The nibbles as stored (the kernels look their codes up).
        let qs = &blk[1..17];
        let codes = &mut tile[l.codes..l.codes + l.code_bytes];
        for c in 0..4 {
            codes[c * CHUNK + 4 * i..c * CHUNK + 4 * i + 4].copy_from_slice(&qs[4 * c..4 * c + 4]);
        }
        return;
    }
    if matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K) {
        for s in 0..8 {
            let (sc, m) = super::ggml::scale_min_k4(s, &blk[4..16]);
            tile[4 * GROUP + s * GROUP + i] = sc;
            tile[12 * GROUP + s * GROUP + i] = m;
        }
    }
    if ty == GgmlType::Q6_K {
        for h in 0..16 {
            tile[2 * GROUP + h * GROUP + i] = blk[192 + h];
        }
    }
    for s in 0..l.subs {
        let u = &u[s * QK..(s + 1) * QK];
        let codes = &mut tile[l.codes_at(s)..l.codes_at(s) + l.code_bytes];
        if l.code_bytes == 2 * CHUNK * 4 {
            for c in 0..8 {
                codes[c * CHUNK + 4 * i..c * CHUNK + 4 * i + 4].copy_from_slice(&u[4 * c..4 * c + 4]);
            }
            continue;
        }
        for c in 0..4 {
            for j in 0..4 {
                codes[c * CHUNK + 4 * i + j] = (u[4 * c + j] & 0xf) | ((u[16 + 4 * c + j] & 0xf) << 4);
            }
        }
        let hi = &mut tile[l.hi_at(s)..l.hi_at(s) + l.hi_bytes];
        match high_bits(ty) {
            HighBits::None => {}
            HighBits::One => {
                for j in 0..4 {
                    let mut byte = 0u8;
                    for c in 0..4 {
                        byte |= ((u[4 * c + j] >> 4) & 1) << c;
                        byte |= ((u[16 + 4 * c + j] >> 4) & 1) << (4 + c);
                    }
                    hi[4 * i + j] = byte;
                }
            }
            HighBits::Two => {
                for (half, base) in [(0usize, 0usize), (1, CHUNK)] {
                    for j in 0..4 {
                        let mut byte = 0u8;
                        for c in 0..4 {
                            byte |= ((u[16 * half + 4 * c + j] >> 4) & 3) << (2 * c);
                        }
                        hi[base + 4 * i + j] = byte;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::ggml::{dequantize_row, random_blocks, BLOCK_TYPES};

    fn xorshift(seed: &mut u32) -> u32 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 17;
        *seed ^= *seed << 5;
        *seed
    }

    /// Every tile's parts cover it exactly once: the scales, then each sub-block's high plane
    /// and codes, front to back (a part overlapping another would still dequantize right when
    /// the repack and the reader agree, so this is checked on its own).
    #[test]
    fn tile_parts_cover_the_tile_once_in_order() {
        for ty in BLOCK_TYPES {
            let l = layout(ty).expect("a block type");
            let d_bytes = if ty == GgmlType::MXFP4 { GROUP } else { 2 * GROUP };
            let sc_bytes = if ty == GgmlType::Q6_K { 16 * GROUP } else { 8 * GROUP };
            let mut parts = vec![(l.d, d_bytes)];
            parts.extend(l.m.map(|m| (m, 2 * GROUP)));
            parts.extend(l.sc.map(|s| (s, sc_bytes)));
            parts.extend(l.mn.map(|m| (m, 8 * GROUP)));
            for s in 0..l.subs {
                parts.push((l.hi_at(s), l.hi_bytes));
                parts.push((l.codes_at(s), l.code_bytes));
            }
            let mut at = 0;
            for (i, &(off, len)) in parts.iter().enumerate() {
                assert_eq!(off, at, "{ty:?}: part {i} at {off}, expected {at}");
                at += len;
            }
            assert_eq!(at, l.bytes, "{ty:?}");
        }
    }

    /// The tiles reproduce GGML's dequantization bit for bit, through a padded row group (29
    /// rows: one group and 13 rows of a second) and through a concat, and every type's tiles are
    /// within 3 % of the file's bytes (exactly its bytes but for the K-quants' unpacked scale
    /// bytes).
    #[test]
    fn repack_is_exact_and_file_sized() {
        let mut seed = 0x1234_5678u32;
        for ty in BLOCK_TYPES {
            let (rows, cols) = (29, 512);
            let raw = random_blocks(ty, rows * cols, &mut || xorshift(&mut seed));
            let q = QMatrix::from_ggml_threads(ty, &raw, rows, cols, 3);
            let single = QMatrix::from_ggml(ty, &raw[..16 * ty.bytes_for(cols)], 16, cols);
            let both = QMatrix::concat(&[&single, &q]).expect("same type");
            assert_eq!(both.rows, 45);
            for r in 0..rows {
                let mut want = vec![0f32; cols];
                dequantize_row(ty, &raw[r * ty.bytes_for(cols)..(r + 1) * ty.bytes_for(cols)], &mut want);
                for (m, rr) in [(&q, r), (&both, r + 16)] {
                    let mut got = vec![0f32; cols];
                    m.dequantize_row(rr, &mut got);
                    let g: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
                    let w: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(g, w, "{ty:?} row {r}");
                }
            }
            let full = QMatrix::from_ggml(ty, &raw[..16 * ty.bytes_for(cols)], 16, cols);
            let ratio = full.bytes() as f64 / (16 * ty.bytes_for(cols)) as f64;
            assert!((1.0..=1.03).contains(&ratio), "{ty:?}: {ratio}");
        }
    }
}
