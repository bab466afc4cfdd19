//! x86 tiles of the Q4/Q8 integer matmul (see the module docs of [`super`] for the arithmetic
//! every path computes): AVX-512 VNNI (EVEX `vpdpbusd` on 256-bit vectors, 32 registers),
//! AVX-VNNI (VEX `vpdpbusd`, 16 registers) and AVX2 (`vpmaddubsw`, 16 registers).
//!
//! One kernel shape serves every token count, *rows in lanes*: a tile is one group of 8 weight
//! rows against `NT` tokens. [`QMatrix`] stores a row group's block as 32-byte runs that hold
//! the same 4 code bytes of all 8 rows, so a 256-bit load gives 8 rows × 4 weights (8-bit) or,
//! split into nibbles, 8 rows × 2 × 4 weights (4-bit), and a broadcast of a token's 4 matching
//! activation bytes feeds the whole run: no horizontal reduction, no activation repacking, and
//! the 8 results of a (row group, token) are one vector store. Tokens come in blocks of about
//! 18 KiB of activation codes that stay in L1 while every row group passes over them; within a
//! block each group's weights (a few KiB) stay in L1 while the block's tokens pass. Up to one
//! block of tokens (decode batches), every weight is read from memory once per call.
//!
//! Only the integer block sums `Σ u·q` differ between paths, and they are exact integers on
//! every path, so every path's output is bit-identical to the scalar definition:
//! - with `vpdpbusd`, 4 products per i32 lane are added in one instruction;
//! - with `vpmaddubsw` (llama.cpp's AVX2 path, `ggml_vec_dot_q4_1_q8_1`), pairs of u8·i8
//!   products are added into *saturating* i16 lanes. A 4-bit code is at most 15 and an
//!   activation code at most 127 in magnitude (`QActs` scales by `max|x|/127`), so one pair is at
//!   most 2·15·127 = 3810, and the 8 pair sums a lane gathers over a block at most 30480 < 32767:
//!   the tile keeps its partial sums in i16 for a whole block and widens them (`vpmaddwd` by 1)
//!   once per block. 8-bit codes are split into their two nibbles, each summed that way, and
//!   recombined as `lo + 16·hi` in i32.
#![allow(unsafe_code)]
// SIMD tiles index several parallel arrays by the same small constant bounds.
#![allow(clippy::needless_range_loop)]

use crate::format::ggml::{Bits, QActs, QMatrix, QK};
use std::arch::x86_64::*;

/// `vpmaddubsw` + i16 partial sums.
const AVX2: u8 = 0;
/// VEX `vpdpbusd`.
const AVXVNNI: u8 = 1;
/// EVEX `vpdpbusd` on 256-bit registers.
const VNNI512: u8 = 2;

#[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
unsafe fn dpbusd_evex(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(acc, w, x)
}

#[target_feature(enable = "avx2,fma,avxvnni")]
unsafe fn dpbusd_vex(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    _mm256_dpbusd_avx_epi32(acc, w, x)
}

/// `acc + Σ` of the 4 u8·i8 products of each i32 lane, in one instruction (VNNI paths).
#[inline(always)]
unsafe fn dpbusd<const M: u8>(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    if M == VNNI512 {
        dpbusd_evex(acc, w, x)
    } else {
        dpbusd_vex(acc, w, x)
    }
}

/// 4 activation bytes at `p`, broadcast to every i32 lane (a load, no shuffle).
#[inline(always)]
unsafe fn bcast4(p: *const i8) -> __m256i {
    _mm256_set1_epi32((p as *const i32).read_unaligned())
}

/// Block `b`'s exact integer sums of row groups `g .. g+NG` against tokens `t0 .. t0+NT`: lane
/// `i` of result `[j][t]` is `Σ u[8(g+j)+i, b, ·] · q[t0+t, b, ·]`. Each broadcast of 4
/// activation bytes feeds `NG` row groups.
#[inline(always)]
unsafe fn block_sums<const NG: usize, const NT: usize, const M: u8>(
    w: &QMatrix,
    g: usize,
    b: usize,
    x: &QActs,
    t0: usize,
) -> [[__m256i; NT]; NG] {
    let nb = w.cols / QK;
    let chunks = w.block_bytes() / 4;
    let wp = |j: usize, c: usize| w.codes.as_ptr().add((((g + j) * nb + b) * chunks + c) * 32) as *const __m256i;
    let xp = |t: usize| x.q.as_ptr().add((t0 + t) * w.cols + b * QK);
    let nib = _mm256_set1_epi8(0x0f);
    let ones = _mm256_set1_epi16(1);
    let mut s = [[_mm256_setzero_si256(); NT]; NG];
    let mut s2 = [[_mm256_setzero_si256(); NT]; NG];
    match w.bits {
        // Chunk c: low nibbles are weights 4c.., high nibbles weights 16+4c.. of each row.
        Bits::U4 => {
            for c in 0..4 {
                let mut lo = [_mm256_setzero_si256(); NG];
                let mut hi = [_mm256_setzero_si256(); NG];
                for j in 0..NG {
                    let v = _mm256_loadu_si256(wp(j, c));
                    lo[j] = _mm256_and_si256(v, nib);
                    hi[j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
                }
                for t in 0..NT {
                    let xl = bcast4(xp(t).add(4 * c));
                    for j in 0..NG {
                        s[j][t] = if M == AVX2 {
                            _mm256_add_epi16(s[j][t], _mm256_maddubs_epi16(lo[j], xl))
                        } else {
                            dpbusd::<M>(s[j][t], lo[j], xl)
                        };
                    }
                    let xh = bcast4(xp(t).add(16 + 4 * c));
                    for j in 0..NG {
                        if M == AVX2 {
                            // One i16 chain: 8 pair sums a block (bound in the module docs).
                            s[j][t] = _mm256_add_epi16(s[j][t], _mm256_maddubs_epi16(hi[j], xh));
                        } else {
                            // VNNI: a second chain per tile, so enough sums are in flight.
                            s2[j][t] = dpbusd::<M>(s2[j][t], hi[j], xh);
                        }
                    }
                }
            }
            for j in 0..NG {
                for t in 0..NT {
                    s[j][t] = if M == AVX2 {
                        _mm256_madd_epi16(s[j][t], ones)
                    } else {
                        _mm256_add_epi32(s[j][t], s2[j][t])
                    };
                }
            }
        }
        // Chunk c: weights 4c .. 4c+4 of each row.
        Bits::U8 => {
            for c in 0..8 {
                let mut lo = [_mm256_setzero_si256(); NG];
                let mut hi = [_mm256_setzero_si256(); NG];
                for j in 0..NG {
                    let v = _mm256_loadu_si256(wp(j, c));
                    lo[j] = if M == AVX2 { _mm256_and_si256(v, nib) } else { v };
                    hi[j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
                }
                for t in 0..NT {
                    let xv = bcast4(xp(t).add(4 * c));
                    for j in 0..NG {
                        if M == AVX2 {
                            s[j][t] = _mm256_add_epi16(s[j][t], _mm256_maddubs_epi16(lo[j], xv));
                            s2[j][t] = _mm256_add_epi16(s2[j][t], _mm256_maddubs_epi16(hi[j], xv));
                        } else if c % 2 == 0 {
                            s[j][t] = dpbusd::<M>(s[j][t], lo[j], xv);
                        } else {
                            s2[j][t] = dpbusd::<M>(s2[j][t], lo[j], xv);
                        }
                    }
                }
            }
            for j in 0..NG {
                for t in 0..NT {
                    s[j][t] = if M == AVX2 {
                        _mm256_add_epi32(
                            _mm256_madd_epi16(s[j][t], ones),
                            _mm256_slli_epi32(_mm256_madd_epi16(s2[j][t], ones), 4),
                        )
                    } else {
                        _mm256_add_epi32(s[j][t], s2[j][t])
                    };
                }
            }
        }
    }
    s
}

/// The 8 rows' values at `at` of a grouped scale array: the f32 copy for K-quants
/// (`QMatrix::f32_scales`), else the f16 one, widened (exactly).
#[inline(always)]
unsafe fn scales8(w: &QMatrix, h: &[u16], f: &[f32], at: usize) -> __m256 {
    if w.f32_scales {
        _mm256_loadu_ps(f.as_ptr().add(at))
    } else {
        _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr().add(at) as *const __m128i))
    }
}

/// Row groups `g .. g+NG` (rows `8g .. 8(g+NG)`) against tokens `t0 .. t0+NT`.
#[inline(always)]
unsafe fn group_tile<const NG: usize, const NT: usize, const M: u8>(
    w: &QMatrix,
    g: usize,
    x: &QActs,
    t0: usize,
    out: *mut f32,
) {
    let nb = w.cols / QK;
    // Two passes, so that only the `d` accumulators are live beside the integer chains (16
    // AVX2 registers): `Σ d·dx·isum` over the blocks, then `Σ m·s` over the blocks. Each sum
    // runs in block order as in the scalar definition and they meet in its final `acc + macc`,
    // so the bits are the same.
    let mut acc = [[_mm256_setzero_ps(); NT]; NG];
    for b in 0..nb {
        let s = block_sums::<NG, NT, M>(w, g, b, x, t0);
        for j in 0..NG {
            let at = ((g + j) * nb + b) * 8;
            let dw = scales8(w, &w.dh, &w.df, at);
            for t in 0..NT {
                let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*x.d.as_ptr().add((t0 + t) * nb + b)));
                acc[j][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[j][t]), scale, acc[j][t]);
            }
        }
    }
    for j in 0..NG {
        let mut macc = [_mm256_setzero_ps(); NT];
        for b in 0..nb {
            let at = ((g + j) * nb + b) * 8;
            let mw = match w.m_factor {
                // m = factor · d exactly (a power of two), as the scalar path's stored m.
                Some(f) => _mm256_mul_ps(scales8(w, &w.dh, &w.df, at), _mm256_set1_ps(f)),
                None => scales8(w, &w.mh, &w.mf, at),
            };
            for t in 0..NT {
                macc[t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(*x.s.as_ptr().add((t0 + t) * nb + b)), macc[t]);
            }
        }
        for t in 0..NT {
            _mm256_storeu_ps(out.add((t0 + t) * w.rows + 8 * (g + j)), _mm256_add_ps(acc[j][t], macc[t]));
        }
    }
}

/// Row groups `g .. g+NG` against the `n < 4` tokens `t0 .. t0+n` in one tile of that many
/// tokens: a batch of 13 rows runs as 4 + 4 + 4 + 1 at `NT = 4`, and 15 as 4 + 4 + 4 + 3, never
/// with single-token tiles for the rest. Every path's `NT` is at most 4.
#[inline(always)]
unsafe fn tile_n<const NG: usize, const M: u8>(w: &QMatrix, g: usize, x: &QActs, t0: usize, n: usize, out: *mut f32) {
    match n {
        1 => group_tile::<NG, 1, M>(w, g, x, t0, out),
        2 => group_tile::<NG, 2, M>(w, g, x, t0, out),
        _ => group_tile::<NG, 3, M>(w, g, x, t0, out),
    }
}

/// Rows `r0..r1` (whole groups of 8, `r0` a multiple of 8) for every token. Several tokens:
/// blocks of tokens outer, then `NG` row groups at a time (then single groups), then `NT`-token
/// tiles, the last `block mod NT` tokens as one smaller tile. One token (the memory-bound GEMV): `NG1` row
/// groups at a time, so that more weight streams are in flight.
#[inline(always)]
unsafe fn rows_generic<const M: u8, const NG: usize, const NT: usize, const NG1: usize>(
    w: &QMatrix,
    r0: usize,
    r1: usize,
    x: &QActs,
    out: *mut f32,
) {
    const { assert!(NT <= 4) };
    let (g1, mut g) = (r1 / 8, r0 / 8);
    if x.rows == 1 {
        while g < g1 {
            if g + NG1 <= g1 {
                group_tile::<NG1, 1, M>(w, g, x, 0, out);
                g += NG1;
            } else {
                group_tile::<1, 1, M>(w, g, x, 0, out);
                g += 1;
            }
        }
        return;
    }
    // Token blocks of about 18 KiB of activation codes, each passed over every row group: the
    // block stays in L1 while the weights stream. Measured on Zen 3 (3072 × 576, 256 tokens,
    // one thread): 62.6 GMAC/s with 32-token blocks, 51.2 with 64, 42.0 with none. A block
    // boundary changes which tile a token is in, never its arithmetic.
    let tb = (18432 / w.cols).max(NT) / NT * NT;
    let g0 = g;
    for b0 in (0..x.rows).step_by(tb) {
        let b1 = (b0 + tb).min(x.rows);
        g = g0;
        while g < g1 {
            let ng = if g + NG <= g1 { NG } else { 1 };
            let mut t = b0;
            while t + NT <= b1 {
                if ng == NG {
                    group_tile::<NG, NT, M>(w, g, x, t, out);
                } else {
                    group_tile::<1, NT, M>(w, g, x, t, out);
                }
                t += NT;
            }
            if t < b1 {
                if ng == NG {
                    tile_n::<NG, M>(w, g, x, t, b1 - t, out);
                } else {
                    tile_n::<1, M>(w, g, x, t, b1 - t, out);
                }
            }
            g += ng;
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
pub(crate) unsafe fn quant_rows_vnni(w: &QMatrix, r0: usize, r1: usize, x: &QActs, out: *mut f32) {
    // 32 registers: 2 row groups × 4 tokens' 16 sum chains and 16 accumulators.
    rows_generic::<VNNI512, 2, 4, 2>(w, r0, r1, x, out)
}

#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
pub(crate) unsafe fn quant_rows_avxvnni(w: &QMatrix, r0: usize, r1: usize, x: &QActs, out: *mut f32) {
    rows_generic::<AVXVNNI, 2, 2, 2>(w, r0, r1, x, out)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quant_rows_avx2(w: &QMatrix, r0: usize, r1: usize, x: &QActs, out: *mut f32) {
    // Tile shapes measured on Zen 3 with one thread, variants interleaved (best of 15 rounds):
    // - 4-bit, 1 row group × 4 tokens (4 i16 chains, 4 f32 accumulators, the unpacked weights):
    //   72.7 GMAC/s at 64 tokens, where 2 × 4 spilled to 68.6 and 2 × 2 gave 62;
    // - 8-bit needs two chains per pair: 1 × 2 gives 40.2 GMAC/s, 2 × 2 29.1, 1 × 3 32.2;
    // - one token streams from memory: 1 row group at a time reads 19 GMAC/s of a 42 MB 4-bit
    //   matrix where 2 at a time read 12.7 (one sequential stream for the prefetcher).
    // The ceiling of this instruction mix here is about 77 GMAC/s a core: `vpmaddubsw` +
    // `vpaddw` issue at 2.8 a cycle, and each activation broadcast costs a third of a cycle.
    match w.bits {
        Bits::U4 => rows_generic::<AVX2, 1, 4, 1>(w, r0, r1, x, out),
        Bits::U8 => rows_generic::<AVX2, 1, 2, 1>(w, r0, r1, x, out),
    }
}
