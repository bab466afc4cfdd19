//! 256-bit x86 tiles of the integer matmul over a [`QMatrix`] (the arithmetic is the module docs
//! of [`crate::format::qmatrix`]): AVX-VNNI (VEX `vpdpbusd`, 16 registers) and AVX2
//! (`vpmaddubsw`, 16 registers), one generic kernel per GGML type, on half groups of 8 rows.
//! AVX-512 machines run the 512-bit kernel of [`super::q8_avx512`].
//!
//! One kernel shape serves every token count, *rows in lanes*: a tile is `NG` groups of 8 weight
//! rows against `NT` tokens. A chunk (32 bytes) holds the same 4 code bytes of all 8 rows, so a
//! 256-bit load gives 8 rows × 4 weights (8-bit) or, split into nibbles, 8 rows × 2 × 4 weights,
//! and a broadcast of a token's 4 matching activation bytes feeds the whole run: no horizontal
//! reduction, no activation repacking, and the 8 results of a (row group, token) are one vector
//! store. 5- and 6-bit codes get their high bits from the tile's high plane with one shift and
//! one mask per chunk (see [`HighBits`](crate::format::qmatrix::HighBits)).
//!
//! Only the integer sums `Σ u·q` differ between paths, and they are exact on every path, so
//! every path's output is bit-identical to [`QMatrix::dot`]:
//! - with `vpdpbusd`, 4 products per i32 lane are added in one instruction;
//! - with `vpmaddubsw` (llama.cpp's AVX2 idiom), pairs of u8·i8 products are added into
//!   *saturating* i16 lanes, so a chain of them may only add as many pairs as cannot reach
//!   32767. An activation code is at most 127 in magnitude (`QActs` scales by `max|x|/127`), so
//!   one pair of 4-bit codes is at most 2·15·127 = 3810 and a 32-weight sub-block's 8 pairs per
//!   lane at most 30480: one i16 chain per sub-block. 5-bit pairs reach 7874: the low and the
//!   high nibble halves get a chain each (4 pairs, 31496). 6-bit pairs reach 16002, so each is
//!   widened (`vpmaddwd` by 1) at once. 8-bit codes are split into their two nibbles,
//!   each summed as 4-bit codes, and recombined as `lo + 16·hi` in i32.
#![allow(unsafe_code)]
// SIMD tiles index several parallel arrays by the same small constant bounds.
#![allow(clippy::needless_range_loop)]

use crate::format::ggml::{GgmlType, QActs, QMatrix, MXFP4_CODES, QK, QK_K};
use crate::format::qmatrix::{layout, TileLayout, CHUNK, GROUP, HALF};
use std::arch::x86_64::*;

/// `vpmaddubsw` + i16 partial sums.
const AVX2: u8 = 0;
/// VEX `vpdpbusd`.
const AVXVNNI: u8 = 1;

/// The GGML types as const-generic parameters.
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q5_1: u8 = 3;
const Q8_0: u8 = 4;
const Q4_K: u8 = 5;
const Q5_K: u8 = 6;
const Q6_K: u8 = 7;
const MXFP4: u8 = 8;

const fn ggml(t: u8) -> GgmlType {
    match t {
        Q4_0 => GgmlType::Q4_0,
        Q4_1 => GgmlType::Q4_1,
        Q5_0 => GgmlType::Q5_0,
        Q5_1 => GgmlType::Q5_1,
        Q8_0 => GgmlType::Q8_0,
        Q4_K => GgmlType::Q4_K,
        Q5_K => GgmlType::Q5_K,
        MXFP4 => GgmlType::MXFP4,
        _ => GgmlType::Q6_K,
    }
}

const fn tl(t: u8) -> TileLayout {
    match layout(ggml(t)) {
        Some(l) => l,
        None => panic!("a block type"),
    }
}

/// Code width of type `t`: 4, 5, 6 or 8 bits.
const fn bits(t: u8) -> u32 {
    match t {
        Q4_0 | Q4_1 | Q4_K | MXFP4 => 4,
        Q5_0 | Q5_1 | Q5_K => 5,
        Q6_K => 6,
        _ => 8,
    }
}

#[target_feature(enable = "avx2,fma,avxvnni")]
unsafe fn dpbusd_vex(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    _mm256_dpbusd_avx_epi32(acc, w, x)
}

/// `acc + Σ` of the 4 u8·i8 products of each i32 lane, in one instruction (AVX-VNNI).
#[inline(always)]
unsafe fn dpbusd<const M: u8>(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    dpbusd_vex(acc, w, x)
}

/// 4 activation bytes at `p`, broadcast to every i32 lane (a load, no shuffle).
#[inline(always)]
unsafe fn bcast4(p: *const i8) -> __m256i {
    _mm256_set1_epi32((p as *const i32).read_unaligned())
}

#[inline(always)]
unsafe fn shl32(v: __m256i, n: i32) -> __m256i {
    _mm256_sll_epi32(v, _mm_cvtsi32_si128(n))
}

#[inline(always)]
unsafe fn shr32(v: __m256i, n: i32) -> __m256i {
    _mm256_srl_epi32(v, _mm_cvtsi32_si128(n))
}

/// The codes of chunk `c` of one half group's sub-block as two vectors of 8 rows × 4 unsigned
/// codes: weights `4c .. 4c+4` and `16 + 4c .. 16 + 4c + 4` of the sub-block (8-bit codes:
/// chunks `2c` and `2c + 1`, weights `8c .. 8c+8`). `codes` is the half's first chunk (the
/// sub-block's chunks + 32 bytes for the second half) and `hi` its high plane likewise.
#[inline(always)]
unsafe fn chunk_codes<const T: u8>(codes: *const u8, hi: *const u8, c: usize) -> (__m256i, __m256i) {
    let nib = _mm256_set1_epi8(0x0f);
    if bits(T) == 8 {
        return (
            _mm256_loadu_si256(codes.add(2 * c * CHUNK) as *const __m256i),
            _mm256_loadu_si256(codes.add((2 * c + 1) * CHUNK) as *const __m256i),
        );
    }
    let v = _mm256_loadu_si256(codes.add(c * CHUNK) as *const __m256i);
    let mut lo = _mm256_and_si256(v, nib);
    let mut hh = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
    if bits(T) == 5 {
        let h = _mm256_loadu_si256(hi as *const __m256i);
        let m = _mm256_set1_epi8(0x10);
        lo = _mm256_or_si256(lo, _mm256_and_si256(shl32(h, 4 - c as i32), m));
        hh = _mm256_or_si256(hh, _mm256_and_si256(shr32(h, c as i32), m));
    } else if bits(T) == 6 {
        let h0 = _mm256_loadu_si256(hi as *const __m256i);
        let h1 = _mm256_loadu_si256(hi.add(CHUNK) as *const __m256i);
        let m = _mm256_set1_epi8(0x30);
        let sh = 4 - 2 * c as i32;
        let (a, b) = if sh >= 0 { (shl32(h0, sh), shl32(h1, sh)) } else { (shr32(h0, -sh), shr32(h1, -sh)) };
        lo = _mm256_or_si256(lo, _mm256_and_si256(a, m));
        hh = _mm256_or_si256(hh, _mm256_and_si256(b, m));
    } else if T == MXFP4 {
        // Each nibble's code from the table (`MXFP4_CODES`), one shuffle per 32 nibbles.
        let lut = _mm256_broadcastsi128_si256(_mm_loadu_si128(MXFP4_CODES.as_ptr() as *const __m128i));
        lo = _mm256_shuffle_epi8(lut, lo);
        hh = _mm256_shuffle_epi8(lut, hh);
    }
    (lo, hh)
}

/// One sub-block's exact integer sums of half groups `j < NG` (tile pointers and halves
/// `tiles[j]`) against tokens `t0 .. t0+NT`: `[j][t] = (lo, hi)`, lane `i` the sums of the
/// half's row `i` over the sub-block's first and second 16 weights (8-bit codes: its even and
/// odd chunks; only Q6_K reads them apart, the others add them).
#[inline(always)]
unsafe fn sub_sums<const T: u8, const M: u8, const NG: usize, const NT: usize>(
    tiles: &[(*const u8, usize); NG],
    s: usize,
    xp: &[*const i8; NT],
) -> [[(__m256i, __m256i); NT]; NG] {
    let l = const { tl(T) };
    let z = _mm256_setzero_si256();
    let ones = _mm256_set1_epi16(1);
    let mut lo = [[z; NT]; NG];
    let mut hi = [[z; NT]; NG];
    for c in 0..4 {
        let mut wl = [z; NG];
        let mut wh = [z; NG];
        for j in 0..NG {
            let (tp, h) = tiles[j];
            let codes = tp.add(l.codes_at(s) + 32 * h);
            let hip = tp.add(l.hi_at(s) + 32 * h);
            (wl[j], wh[j]) = chunk_codes::<T>(codes, hip, c);
        }
        for t in 0..NT {
            // 8-bit: chunks 2c, 2c+1 are weights 8c..8c+8; else weights 4c.. and 16+4c...
            let (xl, xh) = if bits(T) == 8 {
                (bcast4(xp[t].add(8 * c)), bcast4(xp[t].add(8 * c + 4)))
            } else {
                (bcast4(xp[t].add(4 * c)), bcast4(xp[t].add(16 + 4 * c)))
            };
            for j in 0..NG {
                if M != AVX2 {
                    lo[j][t] = dpbusd::<M>(lo[j][t], wl[j], xl);
                    hi[j][t] = dpbusd::<M>(hi[j][t], wh[j], xh);
                    continue;
                }
                match bits(T) {
                    4 => {
                        // One i16 chain: at most 8 pair sums a lane (module docs).
                        let p = _mm256_add_epi16(_mm256_maddubs_epi16(wl[j], xl), _mm256_maddubs_epi16(wh[j], xh));
                        lo[j][t] = _mm256_add_epi16(lo[j][t], p);
                    }
                    5 => {
                        lo[j][t] = _mm256_add_epi16(lo[j][t], _mm256_maddubs_epi16(wl[j], xl));
                        hi[j][t] = _mm256_add_epi16(hi[j][t], _mm256_maddubs_epi16(wh[j], xh));
                    }
                    6 => {
                        // Widened at once: two 6-bit pairs may already exceed i16.
                        lo[j][t] = _mm256_add_epi32(lo[j][t], _mm256_madd_epi16(_mm256_maddubs_epi16(wl[j], xl), ones));
                        hi[j][t] = _mm256_add_epi32(hi[j][t], _mm256_madd_epi16(_mm256_maddubs_epi16(wh[j], xh), ones));
                    }
                    _ => {
                        // 8-bit codes: two chunks per step, each split into nibbles; the low
                        // nibbles of both go to `lo`, the high ones to `hi` (i16, 8 pairs each).
                        let nib = _mm256_set1_epi8(0x0f);
                        let (a, b) = (wl[j], wh[j]);
                        let al = _mm256_and_si256(a, nib);
                        let ah = _mm256_and_si256(_mm256_srli_epi16(a, 4), nib);
                        let bl = _mm256_and_si256(b, nib);
                        let bh = _mm256_and_si256(_mm256_srli_epi16(b, 4), nib);
                        lo[j][t] = _mm256_add_epi16(
                            lo[j][t],
                            _mm256_add_epi16(_mm256_maddubs_epi16(al, xl), _mm256_maddubs_epi16(bl, xh)),
                        );
                        hi[j][t] = _mm256_add_epi16(
                            hi[j][t],
                            _mm256_add_epi16(_mm256_maddubs_epi16(ah, xl), _mm256_maddubs_epi16(bh, xh)),
                        );
                    }
                }
            }
        }
    }
    let mut out = [[(z, z); NT]; NG];
    for j in 0..NG {
        for t in 0..NT {
            out[j][t] = if M != AVX2 {
                (lo[j][t], hi[j][t])
            } else {
                match bits(T) {
                    4 => (_mm256_madd_epi16(lo[j][t], ones), z),
                    5 => (_mm256_madd_epi16(lo[j][t], ones), _mm256_madd_epi16(hi[j][t], ones)),
                    6 => (lo[j][t], hi[j][t]),
                    _ => (_mm256_madd_epi16(lo[j][t], ones), _mm256_slli_epi32(_mm256_madd_epi16(hi[j][t], ones), 4)),
                }
            };
        }
    }
    out
}

/// The 8 rows' f16 values at `p`, widened (exactly).
#[inline(always)]
unsafe fn f16x8(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

/// Eight rows' MXFP4 block scales from their E8M0 bytes at `p` (see
/// [`crate::format::ggml::mxfp4_scale`]; the GGUF loader refuses the subnormal `e` < 2).
#[inline(always)]
unsafe fn e8m0x8(p: *const u8) -> __m256 {
    let e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i));
    _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_sub_epi32(e, _mm256_set1_epi32(1))))
}

/// Half groups (8-row units) `u .. u+NG` against tokens `t0 .. t0+NT`; results to
/// `out[t·ldo + row]`.
#[inline(always)]
unsafe fn group_tile<const T: u8, const M: u8, const NG: usize, const NT: usize>(
    w: &QMatrix,
    u: usize,
    x: &QActs,
    t0: usize,
    out: *mut f32,
    ldo: usize,
) {
    let l = const { tl(T) };
    let nkb = w.cols / ggml(T).block_len();
    let nb = w.cols / QK;
    let base = w.data().as_ptr();
    // Unit `u + j`: group (u + j) / 2, half (u + j) % 2.
    let tile = |j: usize, kb: usize| (base.add(((u + j) / 2 * nkb + kb) * l.bytes), (u + j) % 2);
    let cols = w.cols;
    // Per-row arrays of a tile are `[..][16 rows]`: a half's 8 values start 8 elements in.
    let f16h = |(tp, h): (*const u8, usize), at: usize| f16x8(tp.add(at + 2 * HALF * h));
    // The half's block scales: MXFP4's E8M0 bytes, the other types' f16s.
    let scales = |(tp, h): (*const u8, usize)| {
        if T == MXFP4 {
            e8m0x8(tp.add(l.d + HALF * h))
        } else {
            f16h((tp, h), l.d)
        }
    };
    // Two passes, so that only the `acc` accumulators are live beside the integer chains (16
    // AVX2 registers): `Σ I·dw·dx` over the sub-blocks, then `Σ mw·sx`. Each runs in sub-block
    // order as in the definition and they meet in its final `acc + macc`: the same bits.
    let mut acc = [[_mm256_setzero_ps(); NT]; NG];
    let prefetch = crate::isa::prefetch_weight_tiles();
    for kb in 0..nkb {
        let tiles: [(*const u8, usize); NG] = std::array::from_fn(|j| tile(j, kb));
        if NT == 1 && prefetch {
            prefetch_tile(tiles[0].0.add(PREFETCH), l.bytes / 2);
        }
        let d: [__m256; NG] = std::array::from_fn(|j| scales(tiles[j]));
        for s in 0..l.subs {
            let b = kb * l.subs + s;
            let xp: [*const i8; NT] = std::array::from_fn(|t| x.q.as_ptr().add((t0 + t) * cols + b * QK));
            let sums = sub_sums::<T, M, NG, NT>(&tiles, s, &xp);
            for j in 0..NG {
                let dw = d[j];
                for t in 0..NT {
                    let dx = _mm256_set1_ps(*x.d.as_ptr().add((t0 + t) * nb + b));
                    let (sl, sh) = sums[j][t];
                    let i = _mm256_cvtepi32_ps(_mm256_add_epi32(sl, sh));
                    acc[j][t] = _mm256_fmadd_ps(i, _mm256_mul_ps(dw, dx), acc[j][t]);
                }
            }
        }
    }
    for j in 0..NG {
        let mut macc = [_mm256_setzero_ps(); NT];
        {
            for kb in 0..nkb {
                let tp = tile(j, kb);
                for s in 0..l.subs {
                    let b = kb * l.subs + s;
                    let mw = match T {
                        // m = factor · d exactly (a power of two), as the definition's.
                        Q4_0 => _mm256_mul_ps(f16h(tp, l.d), _mm256_set1_ps(-8.0)),
                        MXFP4 => _mm256_mul_ps(scales(tp), _mm256_set1_ps(-12.0)),
                        Q5_0 => _mm256_mul_ps(f16h(tp, l.d), _mm256_set1_ps(-16.0)),
                        Q8_0 => _mm256_mul_ps(f16h(tp, l.d), _mm256_set1_ps(-128.0)),
                        _ => f16h(tp, 2 * GROUP),
                    };
                    for tt in 0..NT {
                        macc[tt] = _mm256_fmadd_ps(mw, _mm256_set1_ps(*x.s.as_ptr().add((t0 + tt) * nb + b)), macc[tt]);
                    }
                }
            }
        }
        for t in 0..NT {
            _mm256_storeu_ps(out.add((t0 + t) * ldo + HALF * (u + j)), _mm256_add_ps(acc[j][t], macc[t]));
        }
    }
}

/// Half groups `u .. u+NG` of a K-quant against tokens `t0 .. t0+NT`: the K-quant definition
/// of [`QMatrix::dot`], sub-block sums scaled by their integer scales in i32 (`vpmulld`), the
/// mins (Q4_K, Q5_K) and Q6_K's `−32` offset (batched) per 64 values by `vpmaddwd` on i16
/// pairs against [`QActs::bp`], as in `q8_avx512::k_tile`, then one float step per 64 values.
#[inline(always)]
unsafe fn k_tile<const T: u8, const M: u8, const NG: usize, const NT: usize>(
    w: &QMatrix,
    u: usize,
    x: &QActs,
    t0: usize,
    out: *mut f32,
    ldo: usize,
) {
    let l = const { tl(T) };
    let nsb = w.cols / QK_K;
    let base = w.data().as_ptr();
    let cols = w.cols;
    let tile = |j: usize, sb: usize| (base.add(((u + j) / 2 * nsb + sb) * l.bytes), (u + j) % 2);
    // A half's 8 per-row bytes start 8 in.
    let ints = |(tp, h): (*const u8, usize), at: usize, signed: bool| {
        let v = _mm_loadl_epi64(tp.add(at + HALF * h) as *const __m128i);
        if signed {
            _mm256_cvtepi8_epi32(v)
        } else {
            _mm256_cvtepu8_epi32(v)
        }
    };
    // Two sub-blocks' bytes of the half's 8 rows (at `at` and `at + 16`) as i16 pairs, the
    // operand `vpmaddwd` multiplies with a `QActs::bp` pair.
    let pairs8 = |(tp, h): (*const u8, usize), at: usize, signed: bool| {
        let a = _mm_loadl_epi64(tp.add(at + HALF * h) as *const __m128i);
        let b = _mm_loadl_epi64(tp.add(at + GROUP + HALF * h) as *const __m128i);
        let v = _mm_unpacklo_epi8(a, b);
        if signed {
            _mm256_cvtepi8_epi16(v)
        } else {
            _mm256_cvtepu8_epi16(v)
        }
    };
    let z = _mm256_setzero_si256();
    let mut acc = [[_mm256_setzero_ps(); NT]; NG];
    let mut macc = [[_mm256_setzero_ps(); NT]; NG];
    let prefetch = crate::isa::prefetch_weight_tiles();
    for sb in 0..nsb {
        let tiles: [(*const u8, usize); NG] = std::array::from_fn(|j| tile(j, sb));
        if NT == 1 && prefetch {
            prefetch_tile(tiles[0].0.add(PREFETCH), l.bytes / 2);
        }
        let d: [__m256; NG] = std::array::from_fn(|j| f16x8(tiles[j].0.add(l.d + 2 * HALF * tiles[j].1)));
        let dmin: [__m256; NG] = std::array::from_fn(|j| {
            if T == Q6_K {
                _mm256_setzero_ps()
            } else {
                f16x8(tiles[j].0.add(2 * GROUP + 2 * HALF * tiles[j].1))
            }
        });
        for c64 in 0..4 {
            let k64 = sb * 4 + c64;
            let mut sacc = [[z; NT]; NG];
            for s in 2 * c64..2 * c64 + 2 {
                let b = sb * 8 + s;
                let xp: [*const i8; NT] = std::array::from_fn(|t| x.qk.as_ptr().add((t0 + t) * cols + b * QK));
                let sums = sub_sums::<T, M, NG, NT>(&tiles, s, &xp);
                for j in 0..NG {
                    if T == Q6_K {
                        let sca = ints(tiles[j], 2 * GROUP + 2 * s * GROUP, true);
                        let scb = ints(tiles[j], 2 * GROUP + (2 * s + 1) * GROUP, true);
                        for t in 0..NT {
                            let (mut ia, mut ib) = sums[j][t];
                            if NT == 1 {
                                // One token does not pay back the pairs' unpacking below.
                                let bk = x.bk.as_ptr().add((t0 + t) * cols / 16 + 2 * b);
                                ia = _mm256_sub_epi32(ia, _mm256_set1_epi32(32 * *bk));
                                ib = _mm256_sub_epi32(ib, _mm256_set1_epi32(32 * *bk.add(1)));
                            }
                            sacc[j][t] = _mm256_add_epi32(sacc[j][t], _mm256_mullo_epi32(sca, ia));
                            sacc[j][t] = _mm256_add_epi32(sacc[j][t], _mm256_mullo_epi32(scb, ib));
                        }
                    } else {
                        let sc = ints(tiles[j], 4 * GROUP + s * GROUP, false);
                        for t in 0..NT {
                            let (lo, hi) = sums[j][t];
                            sacc[j][t] = _mm256_add_epi32(sacc[j][t], _mm256_mullo_epi32(sc, _mm256_add_epi32(lo, hi)));
                        }
                    }
                }
            }
            // Every 64 values: the activation-sum terms by `vpmaddwd` (see the AVX-512 kernel),
            // then one float step with that block's activation scale.
            for j in 0..NG {
                if T == Q6_K {
                    let (p01, p23) = if NT == 1 {
                        (z, z)
                    } else {
                        (
                            _mm256_slli_epi16(pairs8(tiles[j], 2 * GROUP + 4 * c64 * GROUP, true), 5),
                            _mm256_slli_epi16(pairs8(tiles[j], 2 * GROUP + (4 * c64 + 2) * GROUP, true), 5),
                        )
                    };
                    for t in 0..NT {
                        let mut si = sacc[j][t];
                        if NT > 1 {
                            let bp = x.bp.as_ptr().add((t0 + t) * cols / 16 + 4 * k64);
                            let o = _mm256_add_epi32(
                                _mm256_madd_epi16(p01, _mm256_set1_epi32(*bp)),
                                _mm256_madd_epi16(p23, _mm256_set1_epi32(*bp.add(1))),
                            );
                            si = _mm256_sub_epi32(si, o);
                        }
                        let dk = _mm256_set1_ps(*x.dk.as_ptr().add((t0 + t) * cols / 64 + k64));
                        acc[j][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(si), _mm256_mul_ps(d[j], dk), acc[j][t]);
                    }
                } else {
                    let mn = pairs8(tiles[j], 12 * GROUP + 2 * c64 * GROUP, false);
                    for t in 0..NT {
                        let bp = x.bp.as_ptr().add((t0 + t) * cols / 16 + 4 * k64 + 2);
                        let m = _mm256_madd_epi16(mn, _mm256_set1_epi32(*bp));
                        let dk = _mm256_set1_ps(*x.dk.as_ptr().add((t0 + t) * cols / 64 + k64));
                        acc[j][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sacc[j][t]), _mm256_mul_ps(d[j], dk), acc[j][t]);
                        macc[j][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(dmin[j], dk), macc[j][t]);
                    }
                }
            }
        }
    }
    for j in 0..NG {
        for t in 0..NT {
            // Q6_K's `acc − macc` has `acc`'s bits (see `q8_avx512::k_tile`).
            let v = if T == Q6_K { acc[j][t] } else { _mm256_sub_ps(acc[j][t], macc[j][t]) };
            _mm256_storeu_ps(out.add((t0 + t) * ldo + HALF * (u + j)), v);
        }
    }
}

/// One tile of `NG` half groups × `NT` tokens of type `T`: the K-quant or the 32-weight kernel.
#[inline(always)]
unsafe fn tile<const T: u8, const M: u8, const NG: usize, const NT: usize>(
    w: &QMatrix,
    u: usize,
    x: &QActs,
    t0: usize,
    out: *mut f32,
    ldo: usize,
) {
    if ggml(T).block_len() == QK_K {
        k_tile::<T, M, NG, NT>(w, u, x, t0, out, ldo)
    } else {
        group_tile::<T, M, NG, NT>(w, u, x, t0, out, ldo)
    }
}

/// Bytes ahead of the weights being read that a single-token tile prefetches: the hardware
/// prefetcher alone left the decode GEMV at ~50 % of the streaming bandwidth; 2 KiB ahead
/// measured best of 2, 4, 8 and 16 KiB (1B Q4_K_M decode step, 2 threads) on Intel; AMD runs
/// without it ([`crate::isa::prefetch_weight_tiles`]).
pub(crate) const PREFETCH: usize = 2048;

/// Prefetches `bytes` from `p` on, a line at a time.
#[inline(always)]
unsafe fn prefetch_tile(p: *const u8, bytes: usize) {
    let mut off = 0;
    while off < bytes {
        _mm_prefetch::<_MM_HINT_T0>(p.add(off) as *const i8);
        off += 64;
    }
}

/// Units `u .. u+NG` against the `n < 4` tokens `t0 .. t0+n` in one tile of that many
/// tokens: a batch of 13 rows runs as 4 + 4 + 4 + 1 at `NT = 4`, never with single-token tiles
/// for the rest.
#[inline(always)]
unsafe fn tile_n<const T: u8, const M: u8, const NG: usize>(
    w: &QMatrix,
    g: usize,
    x: &QActs,
    t0: usize,
    n: usize,
    out: *mut f32,
    ldo: usize,
) {
    match n {
        1 => tile::<T, M, NG, 1>(w, g, x, t0, out, ldo),
        2 => tile::<T, M, NG, 2>(w, g, x, t0, out, ldo),
        _ => tile::<T, M, NG, 3>(w, g, x, t0, out, ldo),
    }
}

/// Units (8-row halves or, in the 512-bit kernel, 16-row groups) `g0 .. g1` for every token.
/// Several tokens: chunks of units whose weights fit in L2 outer ([`super::l2_groups`]), then
/// blocks of tokens, then `NG` units at a time (then single units), then
/// `NT`-token tiles, the last `block mod NT` tokens as one smaller tile. One token (the
/// memory-bound GEMV): `NG1` units at a time.
#[inline(always)]
unsafe fn rows_generic<const T: u8, const M: u8, const NG: usize, const NT: usize, const NG1: usize>(
    w: &QMatrix,
    g0: usize,
    g1: usize,
    x: &QActs,
    out: *mut f32,
    ldo: usize,
) {
    const { assert!(NT <= 4) };
    let mut g = g0;
    if x.rows == 1 {
        while g < g1 {
            if g + NG1 <= g1 {
                tile::<T, M, NG1, 1>(w, g, x, 0, out, ldo);
                g += NG1;
            } else {
                tile::<T, M, 1, 1>(w, g, x, 0, out, ldo);
                g += 1;
            }
        }
        return;
    }
    // Token blocks of about 18 KiB of activation codes, each passed over every row group of
    // the chunk: the block stays in L1 while the weights come from L2. A block boundary
    // changes which tile a token is in, never its arithmetic.
    let tb = (18432 / w.cols).max(NT) / NT * NT;
    if x.rows > tb {
        chunks::<T, M, NG, NT, true>(w, g0, g1, x, out, ldo, tb);
    } else {
        chunks::<T, M, NG, NT, false>(w, g0, g1, x, out, ldo, tb);
    }
}

/// The batched loop of [`rows_generic`]; with `PF` the next L2 chunk is prefetched as this one
/// runs ([`super::NextChunk`]). Two instances, so the loop without it compiles as before (one
/// loop with a runtime switch measured 25 % slower at 8 tokens on Zen 4).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn chunks<const T: u8, const M: u8, const NG: usize, const NT: usize, const PF: bool>(
    w: &QMatrix,
    g0: usize,
    g1: usize,
    x: &QActs,
    out: *mut f32,
    ldo: usize,
    tb: usize,
) {
    // Units here are 8-row halves: an L2 chunk of 16-row groups is twice as many units, kept
    // a multiple of NG.
    let chunk = (2 * super::l2_groups(w)).next_multiple_of(NG);
    let mut ahead = super::NextChunk::new(w, g1, chunk, x.rows, tb, NT, NG, 2);
    for (units, toks) in super::chunk_blocks(g0, g1, chunk, x.rows, tb) {
        if PF && toks.start == 0 {
            ahead.start(units.clone());
        }
        let mut g = units.start;
        while g < units.end {
            let ng = if g + NG <= units.end { NG } else { 1 };
            let mut t = toks.start;
            while t + NT <= toks.end {
                if PF {
                    ahead.step();
                }
                if ng == NG {
                    tile::<T, M, NG, NT>(w, g, x, t, out, ldo);
                } else {
                    tile::<T, M, 1, NT>(w, g, x, t, out, ldo);
                }
                t += NT;
            }
            if t < toks.end {
                if PF {
                    ahead.step();
                }
                if ng == NG {
                    tile_n::<T, M, NG>(w, g, x, t, toks.end - t, out, ldo);
                } else {
                    tile_n::<T, M, 1>(w, g, x, t, toks.end - t, out, ldo);
                }
            }
            g += ng;
        }
    }
}

/// Dispatches `ty` to its monomorphized kernel.
macro_rules! by_type {
    ($ty:expr, $f:ident, $($args:tt)*) => {
        match $ty {
            GgmlType::Q4_0 => $f::<Q4_0>($($args)*),
            GgmlType::Q4_1 => $f::<Q4_1>($($args)*),
            GgmlType::Q5_0 => $f::<Q5_0>($($args)*),
            GgmlType::Q5_1 => $f::<Q5_1>($($args)*),
            GgmlType::Q8_0 => $f::<Q8_0>($($args)*),
            GgmlType::Q4_K => $f::<Q4_K>($($args)*),
            GgmlType::Q5_K => $f::<Q5_K>($($args)*),
            GgmlType::Q6_K => $f::<Q6_K>($($args)*),
            GgmlType::MXFP4 => $f::<MXFP4>($($args)*),
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!("not a block type"),
        }
    };
}

#[inline(always)]
unsafe fn avxvnni_t<const T: u8>(w: &QMatrix, g0: usize, g1: usize, x: &QActs, out: *mut f32, ldo: usize) {
    rows_generic::<T, AVXVNNI, 2, 2, 2>(w, g0, g1, x, out, ldo)
}

#[inline(always)]
unsafe fn avx2_t<const T: u8>(w: &QMatrix, g0: usize, g1: usize, x: &QActs, out: *mut f32, ldo: usize) {
    // Tile shapes measured on Zen 3 with one thread (4-bit: 1 row group × 4 tokens, 72.7 GMAC/s
    // at 64 tokens where 2 × 4 spilled; 8-bit: 1 × 2). One token streams from memory: one row
    // group at a time is one sequential stream for the prefetcher.
    if bits(T) == 8 {
        rows_generic::<T, AVX2, 1, 2, 1>(w, g0, g1, x, out, ldo)
    } else {
        rows_generic::<T, AVX2, 1, 4, 1>(w, g0, g1, x, out, ldo)
    }
}

/// Half groups (8 rows each) `u0 .. u1` of `w` for every token of `x`, AVX-VNNI.
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and AVX-VNNI; outputs `out[t·ldo + 8u ..][..8]` of those units
/// are written by this call only.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(crate) unsafe fn quant_rows_avxvnni(w: &QMatrix, g0: usize, g1: usize, x: &QActs, out: *mut f32, ldo: usize) {
    by_type!(w.ty, avxvnni_t, w, g0, g1, x, out, ldo)
}

/// As [`quant_rows_avxvnni`], AVX2 (`vpmaddubsw`).
///
/// # Safety
/// As [`quant_rows_avxvnni`], with AVX2 + FMA + F16C only.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quant_rows_avx2(w: &QMatrix, g0: usize, g1: usize, x: &QActs, out: *mut f32, ldo: usize) {
    by_type!(w.ty, avx2_t, w, g0, g1, x, out, ldo)
}
