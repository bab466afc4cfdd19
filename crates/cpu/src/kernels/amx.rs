//! AMX-INT8 tiles of the batched integer matmul over a [`QMatrix`] (Intel's Advanced Matrix
//! Extensions, Sapphire Rapids and later): `tdpbsud`/`tdpbssd` compute a 16 tokens × 16 rows ×
//! 32 (or 16) bytes block of exact i32 dot products in one instruction, ten to twenty times the
//! 8-bit rate of AVX-512 VNNI. Intel's "Intel® AMX instructions" (SDM vol. 1 ch. 20) and
//! llama.cpp's `ggml-cpu/amx/mmq.cpp` describe the tiles; the arithmetic is unchanged: every
//! sub-block's integer sum is exact, then scaled and accumulated exactly as [`QMatrix::dot`]
//! does (one fused multiply-add per sub-block, in sub-block order), so the bits are those of
//! every other path.
//!
//! Work of one call (a task's row groups against every token):
//! - for each 16-row group, the codes of every sub-block are unpacked once into B tiles (8 rows × 64 bytes: a 4-bit chunk's low nibbles are K bytes 0..16, its high nibbles
//!   16..32; Q8_0's chunks are B rows as stored; Q6_K's codes are made signed, `u − 32`, and
//!   split into two 16-byte halves, one per scale) and every sub-block's scales into `dw`/`mw`
//!   vectors;
//! - for each block of 16 tokens (an A tile from the activation codes repacked tile by tile,
//!   [`QActs::pack_tiles`]), each sub-block: one tile product into a C tile, stored, then the
//!   epilogue `acc = fma(f32(C), dw · dx, acc)` on 16 accumulators kept in registers; the next
//!   sub-block's product goes into the other C tile and is issued before this epilogue, so the
//!   tile unit and the vector units work at the same time. Then `macc = fma(mw, sx, macc)`
//!   over the sub-blocks, and `acc + macc` is stored.
//!
//! The tiles are named in inline assembly (the AMX intrinsics are not stable Rust): `tmm0, 1`
//! C, `tmm4` A, `tmm6` B.
#![allow(unsafe_code)]
#![allow(clippy::needless_range_loop)]

use std::arch::asm;
use std::arch::x86_64::*;

use crate::format::ggml::{GgmlType, QActs, QMatrix, QK, QK_K};
use crate::format::qmatrix::{high_bits, lut_codes, HighBits, TileLayout, CHUNK, GROUP};

/// The palette-1 tile configuration (`ldtilecfg`'s 64-byte operand).
#[repr(C, align(64))]
struct TileCfg {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

/// Loads the configuration: C tiles `tmm0, tmm1` and the A tile `tmm4` of `m` token rows (A:
/// `ka` bytes each), the B tile `tmm6` of `kr` rows.
///
/// # Safety
/// AMX is enabled for the process ([`crate::isa::amx_enabled`]).
#[inline]
unsafe fn configure(m: usize, ka: usize, kr: usize) {
    let mut c = TileCfg { palette: 1, start_row: 0, reserved: [0; 14], colsb: [0; 16], rows: [0; 16] };
    for (t, colsb) in [(0, 64), (1, 64), (4, ka)] {
        c.rows[t] = m as u8;
        c.colsb[t] = colsb as u16;
    }
    c.rows[6] = kr as u8;
    c.colsb[6] = 64;
    asm!("ldtilecfg [{}]", in(reg) &c as *const TileCfg, options(nostack, readonly));
}

/// Releases the tile state (so the thread's context switches stay cheap).
#[inline]
unsafe fn release() {
    asm!("tilerelease", options(nostack, nomem));
}

macro_rules! tileload {
    ($t:literal, $p:expr, $stride:expr) => {
        asm!(concat!("tileloadd ", $t, ", [{p} + {s}*1]"), p = in(reg) $p, s = in(reg) $stride, options(nostack, readonly))
    };
}
macro_rules! tilestore {
    ($t:literal, $p:expr) => {
        asm!(concat!("tilestored [{p} + {s}*1], ", $t), p = in(reg) $p, s = in(reg) 64usize, options(nostack))
    };
}

/// Per-thread buffers of the kernel (grown on demand).
#[derive(Default)]
struct TileScratch {
    /// Unpacked B tiles of one group: `[sub-block][8 × 64 bytes]`.
    b: Vec<__m512i>,
    /// `dw` per step (sub-block, or Q6_K half).
    dw: Vec<__m512>,
    /// `mw` per sub-block.
    mw: Vec<__m512>,
    /// Every token block's `dx` and `sx`, `[block][32-block][16 tokens]` (zero past the last
    /// token).
    dx: Vec<f32>,
    sx: Vec<f32>,
    /// Two C tiles (the pipeline's two buffers).
    c: Vec<__m512i>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<TileScratch> = std::cell::RefCell::new(TileScratch::default());
}

/// Tokens per A tile.
const TM: usize = 16;

/// Per-thread buffers of the K-quant kernel.
#[derive(Default)]
struct KTileScratch {
    /// One group's B planes: `[64-block][plane][16 tile rows]`, 64 bytes each.
    planes: Vec<__m512i>,
    /// One group's mins per 64-block as i16 pairs per row lane (`m_2c | m_2c+1 << 16`); for
    /// Q6_K the four quarters' scales per 64-block, as i32 lanes.
    mins: Vec<__m512i>,
    /// One group's `d` and `dmin` per super-block.
    d: Vec<__m512>,
    dmin: Vec<__m512>,
    /// Every token block's `dk`, `[block][64-block][16 tokens]`.
    dk: Vec<f32>,
    /// Every token block's 32-value sums as i16 pairs, `[block][64-block][16 tokens]`.
    bsp: Vec<i32>,
    /// C tiles (two buffers of two, or five).
    c: Vec<__m512i>,
}

thread_local! {
    static KSCRATCH: std::cell::RefCell<KTileScratch> = std::cell::RefCell::new(KTileScratch::default());
}

/// Row groups `g0 .. g1` of `w` for every token of `x`, to `out[t·ldo + row]`.
///
/// # Safety
/// The CPU has AMX-INT8 and AVX-512 (F, BW, VNNI) and the process may use AMX tiles
/// ([`crate::isa::amx_enabled`]); outputs of those groups are written by this call only.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
pub(crate) unsafe fn quant_rows(w: &QMatrix, g0: usize, g1: usize, x: &QActs, out: *mut f32, ldo: usize) {
    if w.is_k() {
        // SAFETY: the caller's guarantees, passed on.
        KSCRATCH.with_borrow_mut(|sc| unsafe { run_k(sc, w, g0, g1, x, out, ldo) });
    } else {
        // SAFETY: as above.
        SCRATCH.with_borrow_mut(|sc| unsafe { run(sc, w, g0, g1, x, out, ldo) });
    }
}

#[inline(always)]
unsafe fn f16x16(p: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
}

#[inline(always)]
unsafe fn bytes16(p: *const u8, signed: bool) -> __m512 {
    let v = _mm_loadu_si128(p as *const __m128i);
    _mm512_cvtepi32_ps(if signed { _mm512_cvtepi8_epi32(v) } else { _mm512_cvtepu8_epi32(v) })
}

#[inline(always)]
unsafe fn shl(v: __m512i, n: i32) -> __m512i {
    _mm512_sll_epi32(v, _mm_cvtsi32_si128(n))
}

#[inline(always)]
unsafe fn shr(v: __m512i, n: i32) -> __m512i {
    _mm512_srl_epi32(v, _mm_cvtsi32_si128(n))
}

/// MXFP4's codes of 64 nibbles (`MXFP4_CODES`, one shuffle).
#[inline(always)]
unsafe fn mxfp4_codes(nibbles: __m512i) -> __m512i {
    let lut = _mm512_broadcast_i32x4(_mm_loadu_si128(crate::format::ggml::MXFP4_CODES.as_ptr() as *const __m128i));
    _mm512_shuffle_epi8(lut, nibbles)
}

/// Writes sub-block `s` of tile `t`'s codes as 8 B-tile rows at `dst` (module docs).
#[inline(always)]
unsafe fn unpack(ty: GgmlType, l: &TileLayout, t: *const u8, s: usize, dst: *mut __m512i) {
    let codes = t.add(l.codes_at(s));
    if l.code_bytes == 8 * CHUNK {
        for c in 0..8 {
            *dst.add(c) = _mm512_loadu_si512(codes.add(c * CHUNK) as *const _);
        }
        return;
    }
    let nib = _mm512_set1_epi8(0x0f);
    let hi = t.add(l.hi_at(s));
    for c in 0..4 {
        let v = _mm512_loadu_si512(codes.add(c * CHUNK) as *const _);
        let mut lo = _mm512_and_si512(v, nib);
        let mut hh = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
        match high_bits(ty) {
            HighBits::None => {}
            HighBits::One => {
                let h = _mm512_loadu_si512(hi as *const _);
                let m = _mm512_set1_epi8(0x10);
                lo = _mm512_or_si512(lo, _mm512_and_si512(shl(h, 4 - c as i32), m));
                hh = _mm512_or_si512(hh, _mm512_and_si512(shr(h, c as i32), m));
            }
            HighBits::Two => {
                let h0 = _mm512_loadu_si512(hi as *const _);
                let h1 = _mm512_loadu_si512(hi.add(CHUNK) as *const _);
                let m = _mm512_set1_epi8(0x30);
                let sh = 4 - 2 * c as i32;
                let (a, b) = if sh >= 0 { (shl(h0, sh), shl(h1, sh)) } else { (shr(h0, -sh), shr(h1, -sh)) };
                // Signed codes u − 32, for `tdpbssd`.
                let k = _mm512_set1_epi8(32);
                lo = _mm512_sub_epi8(_mm512_or_si512(lo, _mm512_and_si512(a, m)), k);
                hh = _mm512_sub_epi8(_mm512_or_si512(hh, _mm512_and_si512(b, m)), k);
            }
        }
        if lut_codes(ty) {
            (lo, hh) = (mxfp4_codes(lo), mxfp4_codes(hh));
        }
        *dst.add(c) = lo;
        *dst.add(4 + c) = hh;
    }
}

/// The kernel body. Its own `target_feature` (not an inlined closure body) so that every
/// intrinsic is inlined: a closure does not inherit its enclosing function's features, and an
/// intrinsic called from one becomes a function call per vector operation.
///
/// One 16-row group at a time, one block of 16 tokens at a time: the 16 accumulators (one per
/// token, 16 rows in lanes) stay in registers for the whole row, so the epilogue stores
/// nothing; the stores it used to make queued behind each `tilestored` (x86 stores commit in
/// order) and stalled the loop. The offsets' term `Σ mw·sx`, an independent chain of the
/// definition, runs after it, also in registers.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
unsafe fn run(sc: &mut TileScratch, w: &QMatrix, g0: usize, g1: usize, x: &QActs, out: *mut f32, ldo: usize) {
    let ty = w.ty;
    let l = w.layout();
    let nkb = w.blocks_per_row();
    let nb = w.cols / QK;
    let q6 = ty == GgmlType::Q6_K;
    // Q6_K: two 16-byte halves per sub-block (one scale each), signed codes.
    let (ka, kr) = if q6 { (16, 4) } else { (32, 8) };
    let halves = if q6 { 2 } else { 1 };
    let steps = nb * halves;
    let tokens = x.rows;
    sc.b.resize(nb * 8, _mm512_setzero_si512());
    sc.dw.resize(steps, _mm512_setzero_ps());
    sc.mw.resize(nb, _mm512_setzero_ps());
    // Every token block's dx and sx, `[block][32-block][16 tokens]`, once for all groups.
    let blocks = tokens.div_ceil(TM);
    sc.dx.clear();
    sc.dx.resize(blocks * nb * TM, 0.0);
    sc.sx.clear();
    sc.sx.resize(blocks * nb * TM, 0.0);
    for t in 0..tokens {
        let (tb, r) = (t / TM, t % TM);
        for b in 0..nb {
            sc.dx[(tb * nb + b) * TM + r] = x.d[t * nb + b];
            sc.sx[(tb * nb + b) * TM + r] = x.s[t * nb + b];
        }
    }
    sc.c.resize(2 * TM, _mm512_setzero_si512());
    let data = w.data().as_ptr();
    let (bbuf, dwp, mwp) = (sc.b.as_mut_ptr(), sc.dw.as_mut_ptr(), sc.mw.as_mut_ptr());
    let cbuf = sc.c.as_mut_ptr();
    debug_assert_eq!(x.tiles.len(), tokens.div_ceil(TM) * nb * TM * QK, "QActs::pack_tiles first");
    let mut configured = usize::MAX;
    for g in g0..g1 {
        // Unpack the group's codes and scales once for every token block.
        for kb in 0..nkb {
            let t = data.add((g * nkb + kb) * l.bytes);
            let d = match ty {
                GgmlType::MXFP4 => super::q8_avx512::e8m0x16(t.add(l.d)),
                _ => f16x16(t.add(l.d)),
            };
            for s in 0..l.subs {
                let b = kb * l.subs + s;
                unpack(ty, &l, t, s, bbuf.add(b * 8));
                match ty {
                    GgmlType::Q6_K => {
                        for h in 0..2 {
                            let scp = t.add(2 * GROUP + (2 * s + h) * GROUP);
                            *dwp.add(b * 2 + h) = _mm512_mul_ps(d, bytes16(scp, true));
                        }
                    }
                    GgmlType::Q4_K | GgmlType::Q5_K => {
                        *dwp.add(b) = _mm512_mul_ps(d, bytes16(t.add(4 * GROUP + s * GROUP), false));
                        let p = _mm512_mul_ps(f16x16(t.add(2 * GROUP)), bytes16(t.add(12 * GROUP + s * GROUP), false));
                        // −(dmin·m): the product is exact, the negation too.
                        *mwp.add(b) =
                            _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(p), _mm512_set1_epi32(i32::MIN)));
                    }
                    GgmlType::Q4_1 | GgmlType::Q5_1 => {
                        *dwp.add(b) = d;
                        *mwp.add(b) = f16x16(t.add(2 * GROUP));
                    }
                    _ => {
                        let f = match ty {
                            GgmlType::Q4_0 => -8.0,
                            GgmlType::MXFP4 => -12.0,
                            GgmlType::Q5_0 => -16.0,
                            _ => -128.0,
                        };
                        *dwp.add(b) = d;
                        *mwp.add(b) = _mm512_mul_ps(d, _mm512_set1_ps(f));
                    }
                }
            }
        }
        for t0 in (0..tokens).step_by(TM) {
            let m = (tokens - t0).min(TM);
            if configured != m {
                configure(m, ka, kr);
                configured = m;
            }
            let (dxp, sxp) = (sc.dx.as_ptr().add(t0 * nb), sc.sx.as_ptr().add(t0 * nb));
            let a0 = x.tiles.as_ptr().add((t0 / TM) * nb * TM * QK);
            let mut acc = [_mm512_setzero_ps(); TM];
            // Software-pipelined: the tile product of step st runs while the epilogue of step
            // st − 1 reads the other C buffer.
            product(a0, bbuf, cbuf, halves, q6, 0);
            for st in 1..steps {
                product(a0, bbuf, cbuf, halves, q6, st);
                epilogue(&mut acc, cbuf, dwp, dxp, halves, st - 1);
            }
            epilogue(&mut acc, cbuf, dwp, dxp, halves, steps - 1);
            let mut macc = [_mm512_setzero_ps(); TM];
            if !q6 {
                for b in 0..nb {
                    let mw = *mwp.add(b);
                    for r in 0..TM {
                        macc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(*sxp.add(b * TM + r)), macc[r]);
                    }
                }
            }
            for r in 0..m {
                _mm512_storeu_ps(out.add((t0 + r) * ldo + GROUP * g), _mm512_add_ps(acc[r], macc[r]));
            }
        }
    }
    if configured != usize::MAX {
        release();
    }
}

/// Step `st` (sub-block `st / halves`, half `st % halves`): the tile product of the token
/// block's A tile (in `a0`'s packed tiles) and the group's B tile into C buffer `st % 2`.
#[inline(always)]
unsafe fn product(a0: *const i8, bbuf: *const __m512i, cbuf: *mut __m512i, halves: usize, q6: bool, st: usize) {
    let (b, h) = (st / halves, st % halves);
    let a = a0.add(b * TM * QK + h * 16);
    let bp = (bbuf.add(b * 8) as *const u8).add(h * 4 * 64);
    let cp = (cbuf as *mut u8).add((st % 2) * 1024);
    if st.is_multiple_of(2) {
        amx_step::<0>(a, bp, q6, cp);
    } else {
        amx_step::<1>(a, bp, q6, cp);
    }
}

/// Step `st`'s epilogue: `acc[r] = fma(f32(C[r]), dw · dx[r], acc[r])` for the 16 tokens `r`.
#[inline(always)]
unsafe fn epilogue(
    acc: &mut [__m512; TM],
    cbuf: *const __m512i,
    dwp: *const __m512,
    dxp: *const f32,
    halves: usize,
    st: usize,
) {
    let b = st / halves;
    let cp = cbuf.add((st % 2) * TM);
    let dw = *dwp.add(st);
    for r in 0..TM {
        let i = _mm512_cvtepi32_ps(*cp.add(r));
        acc[r] = _mm512_fmadd_ps(i, _mm512_mul_ps(dw, _mm512_set1_ps(*dxp.add(b * TM + r))), acc[r]);
    }
}

/// One step's tile product: A (16 tokens × `ka` bytes at `a`, row stride 32) against the B
/// tile at `bp`, into C tile `tmm0` (`P = 0`) or `tmm1` (`P = 1`), stored to `cp`.
#[inline(always)]
unsafe fn amx_step<const P: u8>(a: *const i8, bp: *const u8, q6: bool, cp: *mut u8) {
    tileload!("tmm4", a, QK);
    tileload!("tmm6", bp, 64usize);
    macro_rules! step {
        ($c:literal) => {{
            asm!(concat!("tilezero ", $c), options(nostack, nomem));
            if q6 {
                asm!(concat!("tdpbssd ", $c, ", tmm4, tmm6"), options(nostack, nomem));
            } else {
                asm!(concat!("tdpbsud ", $c, ", tmm4, tmm6"), options(nostack, nomem));
            }
            tilestore!($c, cp);
        }};
    }
    if P == 0 {
        step!("tmm0");
    } else {
        step!("tmm1");
    }
}

/// Each row's 16 bytes at `p` (`[row]`) spread to its 4 bytes of a chunk-ordered vector.
#[inline(always)]
unsafe fn per_row(p: *const u8) -> __m512i {
    _mm512_mullo_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i)), _mm512_set1_epi32(0x0101_0101))
}

/// `v · k` per byte for a byte factor `k ∈ 0..8` (bits tested into masks, shifted copies added;
/// exact when the products fit a byte).
#[inline(always)]
unsafe fn mul_small(v: __m512i, k: __m512i) -> __m512i {
    let b0 = _mm512_test_epi8_mask(k, _mm512_set1_epi8(1));
    let b1 = _mm512_test_epi8_mask(k, _mm512_set1_epi8(2));
    let b2 = _mm512_test_epi8_mask(k, _mm512_set1_epi8(4));
    let v2 = _mm512_add_epi8(v, v);
    let v4 = _mm512_add_epi8(v2, v2);
    _mm512_add_epi8(
        _mm512_add_epi8(_mm512_maskz_mov_epi8(b0, v), _mm512_maskz_mov_epi8(b1, v2)),
        _mm512_maskz_mov_epi8(b2, v4),
    )
}

/// The K-quants on AMX. A 64-value block's integer sum `S = Σ_j sc_j · Σ u·q` is a dot product
/// over its 64 codes with weights `u · sc_j`, which do not fit a byte; split into byte-sized
/// *planes* it is a sum of tile products of K = 64 bytes (one tile row per 4 bytes of K):
///
/// - Q4_K, Q5_K: `sc = 8·sh + sl` (3 bits each): planes `u·sh`, `u·sl` (≤ 31 · 7 = 217,
///   unsigned), `S = 8·C_h + C_l`; the mins `M = m_2c·Σq + m_2c+1·Σq` with `vpdpwssd` (i16 pairs);
/// - Q6_K (i8 scales per 16 weights, too wide to split cheaply): each 16-weight quarter is its
///   own signed tile product of K = 16 on the codes `u − 32`, and `S = Σ_k sc_k · C_k` in i32.
///
/// The sums are the definition's exact integers, then its float steps (`acc = fma(f32(S),
/// d·dk, acc)`, `macc = fma(f32(M), dmin·dk, macc)`), so the bits are those of every other path.
/// Q4_K/Q5_K's two C tiles alternate between two pairs, and a block's products are issued before
/// the previous block's epilogue.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
unsafe fn run_k(sc: &mut KTileScratch, w: &QMatrix, g0: usize, g1: usize, x: &QActs, out: *mut f32, ldo: usize) {
    let ty = w.ty;
    let l = w.layout();
    let q6 = ty == GgmlType::Q6_K;
    let np = if q6 { 1 } else { 2 };
    let nsb = w.cols / QK_K;
    let nc = w.cols / 64;
    let tokens = x.rows;
    let blocks = tokens.div_ceil(TM);
    debug_assert_eq!(x.tiles_k.len(), blocks * nc * TM * 64, "QActs::pack_tiles first");
    sc.planes.resize(nc * np * 16, _mm512_setzero_si512());
    sc.mins.resize(if q6 { 4 * nc } else { nc }, _mm512_setzero_si512());
    sc.d.resize(nsb, _mm512_setzero_ps());
    sc.dmin.resize(nsb, _mm512_setzero_ps());
    sc.c.resize(5 * TM, _mm512_setzero_si512());
    sc.dk.clear();
    sc.dk.resize(blocks * nc * TM, 0.0);
    sc.bsp.clear();
    sc.bsp.resize(blocks * nc * TM, 0);
    for t in 0..tokens {
        for c in 0..nc {
            let at = ((t / TM) * nc + c) * TM + t % TM;
            sc.dk[at] = x.dk[t * nc + c];
            // The two 32-value sums as an i16 pair (`QActs::bp`).
            sc.bsp[at] = x.bp[(t * nc + c) * 4 + 2];
        }
    }
    let data = w.data().as_ptr();
    let pl = sc.planes.as_mut_ptr();
    let nib = _mm512_set1_epi8(0x0f);
    let mut configured = usize::MAX;
    for g in g0..g1 {
        // The group's planes, mins and scales, once for every token block.
        for sb in 0..nsb {
            let t = data.add((g * nsb + sb) * l.bytes);
            sc.d[sb] = f16x16(t.add(l.d));
            if !q6 {
                sc.dmin[sb] = f16x16(t.add(2 * GROUP));
            }
            for s in 0..8 {
                let c = sb * 4 + s / 2;
                let mut rows = [_mm512_setzero_si512(); 8];
                unpack_codes(ty, &l, t, s, &mut rows, nib);
                let at = |p: usize, r: usize| pl.add((c * np + p) * 16 + (s % 2) * 8 + r);
                if q6 {
                    // Signed codes u − 32; rows 0..4 are the sub-block's first 16 weights (scale
                    // 2s), 4..8 its second (2s + 1): the block's quarters, one K = 16 tile each.
                    // (Planes of the scale's base-4 digits, as Q4_K's, measured 107 against 166
                    // GMAC/s for these four small products.)
                    for (r, v) in rows.iter().enumerate() {
                        *at(0, r) = _mm512_sub_epi8(*v, _mm512_set1_epi8(32));
                    }
                    for h in 0..2 {
                        let scp = t.add(2 * GROUP + (2 * s + h) * GROUP);
                        sc.mins[4 * c + 2 * (s % 2) + h] = _mm512_cvtepi8_epi32(_mm_loadu_si128(scp as *const __m128i));
                    }
                } else {
                    let scv = per_row(t.add(4 * GROUP + s * GROUP));
                    let sh = _mm512_and_si512(shr16(scv, 3), _mm512_set1_epi8(7));
                    let sl = _mm512_and_si512(scv, _mm512_set1_epi8(7));
                    for (r, v) in rows.iter().enumerate() {
                        *at(0, r) = mul_small(*v, sh);
                        *at(1, r) = mul_small(*v, sl);
                    }
                    if s % 2 == 0 {
                        let m0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(t.add(12 * GROUP + s * GROUP) as *const __m128i));
                        let m1 = _mm512_cvtepu8_epi32(_mm_loadu_si128(
                            t.add(12 * GROUP + (s + 1) * GROUP) as *const __m128i
                        ));
                        sc.mins[c] = _mm512_or_si512(m0, _mm512_slli_epi32(m1, 16));
                    }
                }
            }
        }
        for tb in 0..blocks {
            let t0 = tb * TM;
            let m = (tokens - t0).min(TM);
            if configured != m {
                configure_k(m, q6);
                configured = m;
            }
            let a0 = x.tiles_k.as_ptr().add(tb * nc * TM * 64);
            let dkp = sc.dk.as_ptr().add(tb * nc * TM);
            let cbuf = sc.c.as_mut_ptr();
            let mut acc = [_mm512_setzero_ps(); TM];
            if q6 {
                for c in 0..nc {
                    k_products_q6(a0.add(c * TM * 64), (pl as *const u8).add(c * 1024), cbuf as *mut u8);
                    let d = sc.d[c / 4];
                    // The quarters' scales (`mins` holds them for Q6_K).
                    let scv = sc.mins.as_ptr().add(4 * c);
                    for r in 0..TM {
                        let c_ = |k: usize| _mm512_mullo_epi32(*scv.add(k), *cbuf.add(k * TM + r));
                        let s_ = _mm512_add_epi32(_mm512_add_epi32(c_(0), c_(1)), _mm512_add_epi32(c_(2), c_(3)));
                        let dk = _mm512_set1_ps(*dkp.add(c * TM + r));
                        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s_), _mm512_mul_ps(d, dk), acc[r]);
                    }
                }
            } else {
                let dv = sc.d.as_ptr();
                // Software-pipelined: block c's products run while block c − 1's epilogue reads
                // the other pair of C buffers.
                k_products_q4(a0, pl as *const u8, cbuf as *mut u8, 0);
                for c in 1..nc {
                    k_products_q4(a0.add(c * TM * 64), (pl as *const u8).add(c * np * 1024), cbuf as *mut u8, c % 2);
                    k_epilogue(&mut acc, cbuf, *dv.add((c - 1) / 4), dkp.add((c - 1) * TM), (c - 1) % 2);
                }
                k_epilogue(&mut acc, cbuf, *dv.add((nc - 1) / 4), dkp.add((nc - 1) * TM), (nc - 1) % 2);
            }
            let mut macc = [_mm512_setzero_ps(); TM];
            if !q6 {
                let bsp = sc.bsp.as_ptr().add(tb * nc * TM);
                for c in 0..nc {
                    let (mv, dmin) = (sc.mins[c], sc.dmin[c / 4]);
                    for r in 0..TM {
                        let mi =
                            _mm512_dpwssd_epi32(_mm512_setzero_si512(), mv, _mm512_set1_epi32(*bsp.add(c * TM + r)));
                        let dk = _mm512_set1_ps(*dkp.add(c * TM + r));
                        macc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mi), _mm512_mul_ps(dmin, dk), macc[r]);
                    }
                }
            }
            for r in 0..m {
                _mm512_storeu_ps(out.add((t0 + r) * ldo + GROUP * g), _mm512_sub_ps(acc[r], macc[r]));
            }
        }
    }
    if configured != usize::MAX {
        release();
    }
}

/// Q4_K/Q5_K epilogue of the block in C buffer pair `buf`: `acc[r] = fma(f32(8·C_h + C_l),
/// d · dk[r], acc[r])`.
#[inline(always)]
unsafe fn k_epilogue(acc: &mut [__m512; TM], cbuf: *const __m512i, d: __m512, dk: *const f32, buf: usize) {
    let c = cbuf.add(buf * 2 * TM);
    for r in 0..TM {
        let s_ = _mm512_add_epi32(_mm512_slli_epi32(*c.add(r), 3), *c.add(TM + r));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s_), _mm512_mul_ps(d, _mm512_set1_ps(*dk.add(r))), acc[r]);
    }
}

#[inline(always)]
unsafe fn shr16(v: __m512i, n: u32) -> __m512i {
    _mm512_srl_epi16(v, _mm_cvtsi32_si128(n as i32))
}

/// Sub-block `s`'s unsigned codes of the 16 rows as 8 B-tile rows (K 0..4 of each chunk's low
/// nibbles, then the high ones; see [`unpack`]).
#[inline(always)]
unsafe fn unpack_codes(ty: GgmlType, l: &TileLayout, t: *const u8, s: usize, rows: &mut [__m512i; 8], nib: __m512i) {
    let codes = t.add(l.codes_at(s));
    let hi = t.add(l.hi_at(s));
    for c in 0..4 {
        let v = _mm512_loadu_si512(codes.add(c * CHUNK) as *const _);
        let mut lo = _mm512_and_si512(v, nib);
        let mut hh = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
        match high_bits(ty) {
            HighBits::None => {}
            HighBits::One => {
                let h = _mm512_loadu_si512(hi as *const _);
                let m = _mm512_set1_epi8(0x10);
                lo = _mm512_or_si512(lo, _mm512_and_si512(shl(h, 4 - c as i32), m));
                hh = _mm512_or_si512(hh, _mm512_and_si512(shr(h, c as i32), m));
            }
            HighBits::Two => {
                let h0 = _mm512_loadu_si512(hi as *const _);
                let h1 = _mm512_loadu_si512(hi.add(CHUNK) as *const _);
                let m = _mm512_set1_epi8(0x30);
                let sh = 4 - 2 * c as i32;
                let (a, b) = if sh >= 0 { (shl(h0, sh), shl(h1, sh)) } else { (shr(h0, -sh), shr(h1, -sh)) };
                lo = _mm512_or_si512(lo, _mm512_and_si512(a, m));
                hh = _mm512_or_si512(hh, _mm512_and_si512(b, m));
            }
        }
        if lut_codes(ty) {
            (lo, hh) = (mxfp4_codes(lo), mxfp4_codes(hh));
        }
        rows[c] = lo;
        rows[4 + c] = hh;
    }
}

/// The K configuration: C tiles `tmm0..3` of `m` token rows × 64 bytes and the A tile `tmm4` of
/// `m` rows. Q4_K/Q5_K: A 64 bytes, B `tmm5, tmm6` 16 rows × 64 bytes (the two planes); Q6_K:
/// A 16 bytes (a quarter), B `tmm5` 4 rows × 64 bytes.
#[inline]
unsafe fn configure_k(m: usize, q6: bool) {
    let mut c = TileCfg { palette: 1, start_row: 0, reserved: [0; 14], colsb: [0; 16], rows: [0; 16] };
    for t in 0..5 {
        c.rows[t] = m as u8;
        c.colsb[t] = 64;
    }
    if q6 {
        // A: 16 bytes of K per token (a quarter block); B: 4 rows of 64 bytes.
        c.colsb[4] = 16;
        c.rows[5] = 4;
        c.colsb[5] = 64;
    } else {
        for t in 5..7 {
            c.rows[t] = 16;
            c.colsb[t] = 64;
        }
    }
    asm!("ldtilecfg [{}]", in(reg) &c as *const TileCfg, options(nostack, readonly));
}

/// One 64-block of Q4_K/Q5_K: the two planes' products (A at `a`, planes at `b` and `b + 1 KB`)
/// into the C pair `buf` (`tmm0, 1` or `tmm2, 3`), stored to `c + buf · 2 KB`.
#[inline(always)]
unsafe fn k_products_q4(a: *const i8, b: *const u8, c: *mut u8, buf: usize) {
    tileload!("tmm4", a, 64usize);
    tileload!("tmm5", b, 64usize);
    tileload!("tmm6", b.add(1024), 64usize);
    let c = c.add(buf * 2048);
    if buf == 0 {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tdpbsud tmm0, tmm4, tmm5",
            "tdpbsud tmm1, tmm4, tmm6",
            options(nostack, nomem)
        );
        tilestore!("tmm0", c);
        tilestore!("tmm1", c.add(1024));
    } else {
        asm!(
            "tilezero tmm2",
            "tilezero tmm3",
            "tdpbsud tmm2, tmm4, tmm5",
            "tdpbsud tmm3, tmm4, tmm6",
            options(nostack, nomem)
        );
        tilestore!("tmm2", c);
        tilestore!("tmm3", c.add(1024));
    }
}

/// One 64-block of Q6_K: its four 16-weight quarters (one scale each) as four signed tile
/// products of K = 16 (A: the quarter's 16 bytes of each token, at `a + 16k` with the rows 64
/// bytes apart; B: 4 rows at `b + 256k`) into `tmm0..3`, stored to `c`.
#[inline(always)]
unsafe fn k_products_q6(a: *const i8, b: *const u8, c: *mut u8) {
    macro_rules! quarter {
        ($k:literal, $c:literal) => {
            tileload!("tmm4", a.add(16 * $k), 64usize);
            tileload!("tmm5", b.add(256 * $k), 64usize);
            asm!(concat!("tilezero ", $c), concat!("tdpbssd ", $c, ", tmm4, tmm5"), options(nostack, nomem));
        };
    }
    quarter!(0, "tmm0");
    quarter!(1, "tmm1");
    quarter!(2, "tmm2");
    quarter!(3, "tmm3");
    tilestore!("tmm0", c);
    tilestore!("tmm1", c.add(1024));
    tilestore!("tmm2", c.add(2048));
    tilestore!("tmm3", c.add(3072));
}

/// `iters` × 4 independent `tdpbsud` of full tiles (16 × 16 × 64: 16384 products each), for
/// the roofline's AMX peak.
///
/// # Safety
/// AMX is enabled for the process ([`crate::isa::amx_enabled`]).
pub(crate) unsafe fn peak_loop(iters: u64) {
    let mut c = TileCfg { palette: 1, start_row: 0, reserved: [0; 14], colsb: [0; 16], rows: [0; 16] };
    for t in 0..8 {
        c.rows[t] = 16;
        c.colsb[t] = 64;
    }
    asm!("ldtilecfg [{}]", in(reg) &c as *const TileCfg, options(nostack, readonly));
    asm!("tilezero tmm4", "tilezero tmm5", options(nostack, nomem));
    asm!(
        "2:",
        "tdpbsud tmm0, tmm4, tmm5",
        "tdpbsud tmm1, tmm4, tmm5",
        "tdpbsud tmm2, tmm4, tmm5",
        "tdpbsud tmm3, tmm4, tmm5",
        "dec {n}",
        "jnz 2b",
        n = inout(reg) iters => _,
        options(nostack, nomem),
    );
    release();
}
