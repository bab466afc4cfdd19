//! AVX-512 VNNI tiles of the integer matmul over a [`QMatrix`]: the kernels of [`super::q8_x86`]
//! (32-weight types; K-quants with their integer super-block sums) on 512-bit vectors, one 16-row group per register (a whole chunk of the tile layout, see
//! [`crate::format::qmatrix`]). Half the instructions per weight byte of the 256-bit kernel,
//! which matters most for the single-token GEMV of a decode step: it must issue its loads fast
//! enough to keep the memory bus busy. The integer sums are `vpdpbusd`'s exact ones and every
//! float operation is the definition's ([`QMatrix::dot`]), so the bits are those of every
//! other path.
#![allow(unsafe_code)]
#![allow(clippy::needless_range_loop)]

use crate::format::ggml::{GgmlType, QActs, QMatrix, MXFP4_CODES, QK, QK_K};
use crate::format::qmatrix::{layout, TileLayout, CHUNK, GROUP};
use std::arch::x86_64::*;

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

const fn bits(t: u8) -> u32 {
    match t {
        Q4_0 | Q4_1 | Q4_K | MXFP4 => 4,
        Q5_0 | Q5_1 | Q5_K => 5,
        Q6_K => 6,
        _ => 8,
    }
}

#[inline(always)]
unsafe fn bcast4(p: *const i8) -> __m512i {
    _mm512_set1_epi32((p as *const i32).read_unaligned())
}

#[inline(always)]
unsafe fn shl(v: __m512i, n: i32) -> __m512i {
    _mm512_sll_epi32(v, _mm_cvtsi32_si128(n))
}

#[inline(always)]
unsafe fn shr(v: __m512i, n: i32) -> __m512i {
    _mm512_srl_epi32(v, _mm_cvtsi32_si128(n))
}

/// Chunk `c`'s codes of 16 rows (see `q8_x86::chunk_codes`, same order).
#[inline(always)]
unsafe fn chunk_codes<const T: u8>(codes: *const u8, hi: *const u8, c: usize) -> (__m512i, __m512i) {
    if bits(T) == 8 {
        return (
            _mm512_loadu_si512(codes.add(2 * c * CHUNK) as *const _),
            _mm512_loadu_si512(codes.add((2 * c + 1) * CHUNK) as *const _),
        );
    }
    let nib = _mm512_set1_epi8(0x0f);
    let v = _mm512_loadu_si512(codes.add(c * CHUNK) as *const _);
    // `sel(a, b)`: the nibble bits of `a`, the other bits of `b` (`vpternlogd`, `nib ? a : b`),
    // one instruction for the and-and-or of a code's low and high parts.
    let sel = |a: __m512i, b: __m512i| _mm512_ternarylogic_epi32::<0xe4>(a, b, nib);
    let hsrc = _mm512_srli_epi16(v, 4);
    if bits(T) == 5 {
        let h = _mm512_loadu_si512(hi as *const _);
        let m = _mm512_set1_epi8(0x10);
        (sel(v, _mm512_and_si512(shl(h, 4 - c as i32), m)), sel(hsrc, _mm512_and_si512(shr(h, c as i32), m)))
    } else if bits(T) == 6 {
        let h0 = _mm512_loadu_si512(hi as *const _);
        let h1 = _mm512_loadu_si512(hi.add(CHUNK) as *const _);
        let m = _mm512_set1_epi8(0x30);
        let sh = 4 - 2 * c as i32;
        let (a, b) = if sh >= 0 { (shl(h0, sh), shl(h1, sh)) } else { (shr(h0, -sh), shr(h1, -sh)) };
        (sel(v, _mm512_and_si512(a, m)), sel(hsrc, _mm512_and_si512(b, m)))
    } else if T == MXFP4 {
        // Each nibble's code from the table (`MXFP4_CODES`), one shuffle per 64 nibbles.
        let lut = _mm512_broadcast_i32x4(_mm_loadu_si128(MXFP4_CODES.as_ptr() as *const __m128i));
        (_mm512_shuffle_epi8(lut, _mm512_and_si512(v, nib)), _mm512_shuffle_epi8(lut, _mm512_and_si512(hsrc, nib)))
    } else {
        (_mm512_and_si512(v, nib), _mm512_and_si512(hsrc, nib))
    }
}

/// The 16 rows' f16 values at `p`, widened.
#[inline(always)]
unsafe fn f16x16(p: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
}

/// The 16 rows' MXFP4 block scales from their E8M0 bytes at `p`: each byte `e` shifted into an
/// f32 exponent field as `e − 1` ([`crate::format::ggml::mxfp4_scale`]; the GGUF loader
/// refuses `e` < 2, the subnormal scales).
#[inline(always)]
pub(crate) unsafe fn e8m0x16(p: *const u8) -> __m512 {
    let e = _mm512_cvtepu8_epi32(_mm_loadu_si128(p as *const __m128i));
    _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_sub_epi32(e, _mm512_set1_epi32(1))))
}

/// The 16 rows' block scales of a 32-weight type at `p`: E8M0 bytes (MXFP4) or f16.
#[inline(always)]
unsafe fn scales16<const T: u8>(p: *const u8) -> __m512 {
    if T == MXFP4 {
        e8m0x16(p)
    } else {
        f16x16(p)
    }
}

/// Requests every line of the tiles about to be read at once, so a single-token tile's loads
/// are in flight together (a 16-row tile is 2.4–3.4 KB). Measured on the 1B Q4_K_M step's
/// matmuls, 2 threads: 31.2 ms, against 33.1 prefetching 1 KB ahead and 37.3 with no software
/// prefetch (Intel; see `prefetch_weight_tiles` for AMD).
#[inline(always)]
unsafe fn prefetch_tiles<const NG: usize>(tiles: &[*const u8; NG], bytes: usize) {
    for p in tiles {
        let mut off = 0;
        while off < bytes {
            _mm_prefetch::<_MM_HINT_T0>(p.add(off) as *const i8);
            off += 64;
        }
    }
}

/// The `vpdpbusd` sums of sub-block `s` (32 weights) of the `NG` tiles against the tokens at
/// `xp`, per row in i32 lanes: the low-nibble weights (8-bit: the first 16) in `.0`, the others
/// in `.1`; with `ONE` (halves that share a scale) both go to `.0` and `.1` stays zero.
#[inline(always)]
#[allow(clippy::type_complexity)]
unsafe fn sub_sums<const T: u8, const NG: usize, const NT: usize, const ONE: bool>(
    tiles: &[*const u8; NG],
    s: usize,
    xp: &[*const i8; NT],
) -> ([[__m512i; NT]; NG], [[__m512i; NT]; NG]) {
    let l = const { tl(T) };
    let z = _mm512_setzero_si512();
    let mut lo = [[z; NT]; NG];
    let mut hi = [[z; NT]; NG];
    for c in 0..4 {
        let mut wl = [z; NG];
        let mut wh = [z; NG];
        for j in 0..NG {
            let codes = tiles[j].add(l.codes_at(s));
            let hip = tiles[j].add(l.hi_at(s));
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
                lo[j][t] = _mm512_dpbusd_epi32(lo[j][t], wl[j], xl);
                if ONE {
                    lo[j][t] = _mm512_dpbusd_epi32(lo[j][t], wh[j], xh);
                } else {
                    hi[j][t] = _mm512_dpbusd_epi32(hi[j][t], wh[j], xh);
                }
            }
        }
    }
    (lo, hi)
}

/// Row groups `g .. g+NG` against tokens `t0 .. t0+NT`; results to `out[t·ldo + row]`.
#[inline(always)]
unsafe fn group_tile<const T: u8, const NG: usize, const NT: usize>(
    w: &QMatrix,
    g: usize,
    x: &QActs,
    t0: usize,
    out: *mut f32,
    ldo: usize,
) {
    let l = const { tl(T) };
    let nkb = w.cols / ggml(T).block_len();
    let prefetch = crate::isa::prefetch_weight_tiles();
    let nb = w.cols / QK;
    let base = w.data().as_ptr();
    let tile = |j: usize, kb: usize| base.add(((g + j) * nkb + kb) * l.bytes);
    let cols = w.cols;
    let mut acc = [[_mm512_setzero_ps(); NT]; NG];
    let mut macc = [[_mm512_setzero_ps(); NT]; NG];
    for kb in 0..nkb {
        let tiles: [*const u8; NG] = std::array::from_fn(|j| tile(j, kb));
        if NT == 1 && prefetch {
            prefetch_tiles(&tiles, l.bytes);
        }
        let d: [__m512; NG] = std::array::from_fn(|j| scales16::<T>(tiles[j].add(l.d)));
        for s in 0..l.subs {
            let b = kb * l.subs + s;
            let xp: [*const i8; NT] = std::array::from_fn(|t| x.q.as_ptr().add((t0 + t) * cols + b * QK));
            let (lo, hi) = sub_sums::<T, NG, NT, false>(&tiles, s, &xp);
            for j in 0..NG {
                let t_ = tiles[j];
                let (dw, mw) = match T {
                    Q4_1 | Q5_1 => (d[j], f16x16(t_.add(2 * GROUP))),
                    // m = factor · d exactly (a power of two), as the definition's.
                    Q4_0 => (d[j], _mm512_mul_ps(d[j], _mm512_set1_ps(-8.0))),
                    MXFP4 => (d[j], _mm512_mul_ps(d[j], _mm512_set1_ps(-12.0))),
                    Q5_0 => (d[j], _mm512_mul_ps(d[j], _mm512_set1_ps(-16.0))),
                    _ => (d[j], _mm512_mul_ps(d[j], _mm512_set1_ps(-128.0))),
                };
                for t in 0..NT {
                    let xb = (t0 + t) * nb + b;
                    let dx = _mm512_set1_ps(*x.d.as_ptr().add(xb));
                    let i = _mm512_cvtepi32_ps(_mm512_add_epi32(lo[j][t], hi[j][t]));
                    acc[j][t] = _mm512_fmadd_ps(i, _mm512_mul_ps(dw, dx), acc[j][t]);
                    macc[j][t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(*x.s.as_ptr().add(xb)), macc[j][t]);
                }
            }
        }
    }
    for j in 0..NG {
        for t in 0..NT {
            _mm512_storeu_ps(out.add((t0 + t) * ldo + GROUP * (g + j)), _mm512_add_ps(acc[j][t], macc[j][t]));
        }
    }
}

/// Row groups `g .. g+NG` of a K-quant against tokens `t0 .. t0+NT` (the K-quant definition
/// of [`QMatrix::dot`]), per 64 values:
///
/// - each sub-block's `vpdpbusd` sums (Q4_K, Q5_K: both halves of a 32-weight sub-block into one
///   accumulator, as they share a scale; Q6_K: one per 16-weight half) times its integer scale
///   (`vpmulld`), summed in i32;
/// - the terms the activations' 16- and 32-value sums multiply, Q4_K/Q5_K's mins `Σ m_j · Σq_j`
///   and Q6_K's offset `32 · Σ sc_j · Σq_j`, two products per `vpmaddwd` on i16 pairs (the
///   mins or `32 · sc` of two sub-blocks against [`QActs::bp`]; Q6_K's offset for one token
///   goes per 16 values instead, where unpacking the pairs would cost more than it saves);
/// - then one float step (Q6_K has no min term, so no second one).
///
/// Every integer is the definition's (exact in i32), so the bits are too. Per token and 64
/// values this issues, beside the 16 `vpdpbusd`: Q4_K/Q5_K 2 `vpmulld` + 1 `vpmaddwd` (4
/// `vpmulld` before: one per sub-block sum and one per min), which matters because on Zen 4
/// all of them share the two multiply pipes that bound the batched kernel; Q6_K 4 `vpmulld` +
/// 2 `vpmaddwd` batched, 4 + 0 for one token (its gain is elsewhere: no dead min term, no
/// broadcasts from general registers per 16 values, `vpternlogd` unpacking).
#[inline(always)]
unsafe fn k_tile<const T: u8, const NG: usize, const NT: usize>(
    w: &QMatrix,
    g: usize,
    x: &QActs,
    t0: usize,
    out: *mut f32,
    ldo: usize,
) {
    let l = const { tl(T) };
    let nsb = w.cols / QK_K;
    let prefetch = crate::isa::prefetch_weight_tiles();
    let base = w.data().as_ptr();
    let cols = w.cols;
    let z = _mm512_setzero_si512();
    let mut acc = [[_mm512_setzero_ps(); NT]; NG];
    let mut macc = [[_mm512_setzero_ps(); NT]; NG];
    for sb in 0..nsb {
        let tiles: [*const u8; NG] = std::array::from_fn(|j| base.add(((g + j) * nsb + sb) * l.bytes));
        if NT == 1 && prefetch {
            prefetch_tiles(&tiles, l.bytes);
        }
        let d: [__m512; NG] = std::array::from_fn(|j| f16x16(tiles[j].add(l.d)));
        let dmin: [__m512; NG] =
            std::array::from_fn(|j| if T == Q6_K { _mm512_setzero_ps() } else { f16x16(tiles[j].add(2 * GROUP)) });
        for c64 in 0..4 {
            let k64 = sb * 4 + c64;
            let mut sacc = [[z; NT]; NG];
            for s in 2 * c64..2 * c64 + 2 {
                let b = sb * 8 + s;
                let xp: [*const i8; NT] = std::array::from_fn(|t| x.qk.as_ptr().add((t0 + t) * cols + b * QK));
                // Q4_K/Q5_K: a sub-block's two halves share its scale, so one accumulator.
                let (lo, hi) = if T == Q6_K {
                    sub_sums::<T, NG, NT, false>(&tiles, s, &xp)
                } else {
                    sub_sums::<T, NG, NT, true>(&tiles, s, &xp)
                };
                for j in 0..NG {
                    if T == Q6_K {
                        let sca = int16(tiles[j].add(2 * GROUP + 2 * s * GROUP), true);
                        let scb = int16(tiles[j].add(2 * GROUP + (2 * s + 1) * GROUP), true);
                        for t in 0..NT {
                            let (mut ia, mut ib) = (lo[j][t], hi[j][t]);
                            if NT == 1 {
                                // One token does not pay back the pairs' unpacking below: the
                                // offset goes per 16 values, as the definition writes it.
                                let bk = x.bk.as_ptr().add((t0 + t) * cols / 16 + 2 * b);
                                ia = _mm512_sub_epi32(ia, _mm512_set1_epi32(32 * *bk));
                                ib = _mm512_sub_epi32(ib, _mm512_set1_epi32(32 * *bk.add(1)));
                            }
                            sacc[j][t] = _mm512_add_epi32(sacc[j][t], _mm512_mullo_epi32(sca, ia));
                            sacc[j][t] = _mm512_add_epi32(sacc[j][t], _mm512_mullo_epi32(scb, ib));
                        }
                    } else {
                        let sc = int16(tiles[j].add(4 * GROUP + s * GROUP), false);
                        for t in 0..NT {
                            sacc[j][t] = _mm512_add_epi32(sacc[j][t], _mm512_mullo_epi32(sc, lo[j][t]));
                        }
                    }
                }
            }
            for j in 0..NG {
                if T == Q6_K && NT == 1 {
                    let dk = _mm512_set1_ps(*x.dk.as_ptr().add(t0 * cols / 64 + k64));
                    acc[j][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sacc[j][0]), _mm512_mul_ps(d[j], dk), acc[j][0]);
                } else if T == Q6_K {
                    // S −= 32 · Σ sc_j · Σq_j over the 4 halves: (32·sc₀, 32·sc₁) · (Σq₀, Σq₁) + ...
                    let p01 = _mm512_slli_epi16(pairs16(tiles[j].add(2 * GROUP + 4 * c64 * GROUP), true), 5);
                    let p23 = _mm512_slli_epi16(pairs16(tiles[j].add(2 * GROUP + (4 * c64 + 2) * GROUP), true), 5);
                    for t in 0..NT {
                        let bp = x.bp.as_ptr().add((t0 + t) * cols / 16 + 4 * k64);
                        let o = _mm512_add_epi32(
                            _mm512_madd_epi16(p01, _mm512_set1_epi32(*bp)),
                            _mm512_madd_epi16(p23, _mm512_set1_epi32(*bp.add(1))),
                        );
                        let dk = _mm512_set1_ps(*x.dk.as_ptr().add((t0 + t) * cols / 64 + k64));
                        let si = _mm512_sub_epi32(sacc[j][t], o);
                        acc[j][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(si), _mm512_mul_ps(d[j], dk), acc[j][t]);
                    }
                } else {
                    // M = m_a · Σq_a + m_b · Σq_b over the two sub-blocks.
                    let mn = pairs16(tiles[j].add(12 * GROUP + 2 * c64 * GROUP), false);
                    for t in 0..NT {
                        let bp = x.bp.as_ptr().add((t0 + t) * cols / 16 + 4 * k64 + 2);
                        let m = _mm512_madd_epi16(mn, _mm512_set1_epi32(*bp));
                        let dk = _mm512_set1_ps(*x.dk.as_ptr().add((t0 + t) * cols / 64 + k64));
                        acc[j][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sacc[j][t]), _mm512_mul_ps(d[j], dk), acc[j][t]);
                        macc[j][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m), _mm512_mul_ps(dmin[j], dk), macc[j][t]);
                    }
                }
            }
        }
    }
    for j in 0..NG {
        for t in 0..NT {
            // Q6_K's `macc` is +0, or NaN only where `dk` is infinite, and then `acc` is NaN
            // too (S = 0 and 0 · inf): `acc − macc` has `acc`'s bits, so it is skipped.
            let v = if T == Q6_K { acc[j][t] } else { _mm512_sub_ps(acc[j][t], macc[j][t]) };
            _mm512_storeu_ps(out.add((t0 + t) * ldo + GROUP * (g + j)), v);
        }
    }
}

/// Two runs of the 16 rows' scale bytes, at `p` and `p + 16`, as i16 pairs: lane `i` of the
/// i32 view holds row `i`'s byte of the first run (low half) and of the second (high half),
/// the operand `vpmaddwd` multiplies with a [`QActs::bp`] pair.
#[inline(always)]
unsafe fn pairs16(p: *const u8, signed: bool) -> __m512i {
    let a = _mm_loadu_si128(p as *const __m128i);
    let b = _mm_loadu_si128(p.add(GROUP) as *const __m128i);
    let v = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(_mm_unpacklo_epi8(a, b)), _mm_unpackhi_epi8(a, b));
    if signed {
        _mm512_cvtepi8_epi16(v)
    } else {
        _mm512_cvtepu8_epi16(v)
    }
}

/// The 16 rows' scale bytes at `p` as i32 lanes.
#[inline(always)]
unsafe fn int16(p: *const u8, signed: bool) -> __m512i {
    let v = _mm_loadu_si128(p as *const __m128i);
    if signed {
        _mm512_cvtepi8_epi32(v)
    } else {
        _mm512_cvtepu8_epi32(v)
    }
}

/// One tile of `NG` groups × `NT` tokens of type `T`: the K-quant or the 32-weight kernel.
#[inline(always)]
unsafe fn tile<const T: u8, const NG: usize, const NT: usize>(
    w: &QMatrix,
    g: usize,
    x: &QActs,
    t0: usize,
    out: *mut f32,
    ldo: usize,
) {
    if ggml(T).block_len() == QK_K {
        k_tile::<T, NG, NT>(w, g, x, t0, out, ldo)
    } else {
        group_tile::<T, NG, NT>(w, g, x, t0, out, ldo)
    }
}

#[inline(always)]
unsafe fn tile_n<const T: u8, const NG: usize>(
    w: &QMatrix,
    g: usize,
    x: &QActs,
    t0: usize,
    n: usize,
    out: *mut f32,
    ldo: usize,
) {
    match n {
        1 => tile::<T, NG, 1>(w, g, x, t0, out, ldo),
        2 => tile::<T, NG, 2>(w, g, x, t0, out, ldo),
        _ => tile::<T, NG, 3>(w, g, x, t0, out, ldo),
    }
}

/// Whether the single-token GEMV reads one row group at a time instead of four. Measured from
/// memory (`qmm TYPE 65536 2048 1 2`, Zen 4, no software prefetch): one group's sequential
/// stream per thread is what the hardware prefetcher follows best (Q4_0 1.19 against 1.43 ms,
/// Q4_1 1.13 / 1.47, Q5_0 1.31 / 1.77, Q8_0 2.45 / 2.61, Q4_K 1.81 / 2.09; since each
/// sub-block's high plane sits beside its codes, Q5_K 2.10 / 2.38 and Q6_K at 151936 × 2048
/// 6.9 / 7.3). With software prefetch (Intel, `prefetch_weight_tiles`) four groups measured
/// best for every type (31.4 ms for the 1B Q4_K_M step's matmuls against 34.2 with one).
#[inline(always)]
fn single_stream() -> bool {
    !crate::isa::prefetch_weight_tiles()
}

/// Row groups `g0 .. g1` for every token (the structure of `q8_x86::rows_generic`).
#[inline(always)]
unsafe fn rows<const T: u8>(w: &QMatrix, g0: usize, g1: usize, x: &QActs, out: *mut f32, ldo: usize) {
    const NG: usize = 1;
    const NT: usize = 4;
    let mut g = g0;
    if x.rows == 1 {
        // Four groups' streams at a time: 31.4 ms for the 1B Q4_K_M step's matmuls against 31.9
        // with two and 34.2 with one (2 threads, best of 10, prefetching 2 KiB ahead).
        // One group's stream at a time where that measured faster (see `single_stream`),
        // otherwise four groups' streams.
        const NG1: usize = 4;
        if single_stream() {
            for g in g0..g1 {
                tile::<T, 1, 1>(w, g, x, 0, out, ldo);
            }
            return;
        }
        while g < g1 {
            if g + NG1 <= g1 {
                tile::<T, NG1, 1>(w, g, x, 0, out, ldo);
                g += NG1;
            } else {
                tile::<T, 1, 1>(w, g, x, 0, out, ldo);
                g += 1;
            }
        }
        return;
    }
    let tb = (18432 / w.cols).max(NT) / NT * NT;
    if x.rows > tb {
        chunks::<T, NG, NT, true>(w, g0, g1, x, out, ldo, tb);
    } else {
        chunks::<T, NG, NT, false>(w, g0, g1, x, out, ldo, tb);
    }
}

/// The batched loop of [`rows`]: L2 chunks of groups, blocks of `tb` tokens, `NT`-token tiles;
/// with `PF` the next chunk is prefetched into L2 as this one runs ([`super::NextChunk`]). Two
/// instances, so the loop without it compiles as before (one loop with a runtime switch
/// measured 25 % slower at 8 tokens on Zen 4).
#[inline(always)]
unsafe fn chunks<const T: u8, const NG: usize, const NT: usize, const PF: bool>(
    w: &QMatrix,
    g0: usize,
    g1: usize,
    x: &QActs,
    out: *mut f32,
    ldo: usize,
    tb: usize,
) {
    let chunk = super::l2_groups(w);
    let mut ahead = super::NextChunk::new(w, g1, chunk, x.rows, tb, NT, NG, 1);
    for (units, toks) in super::chunk_blocks(g0, g1, chunk, x.rows, tb) {
        if PF && toks.start == 0 {
            ahead.start(units.clone());
        }
        for g in units.step_by(NG) {
            let mut t = toks.start;
            while t + NT <= toks.end {
                if PF {
                    ahead.step();
                }
                tile::<T, NG, NT>(w, g, x, t, out, ldo);
                t += NT;
            }
            if t < toks.end {
                if PF {
                    ahead.step();
                }
                tile_n::<T, NG>(w, g, x, t, toks.end - t, out, ldo);
            }
        }
    }
}

/// Row groups `g0 .. g1` (16 rows each) of `w` for every token of `x`, 512-bit AVX-512 VNNI.
///
/// # Safety
/// The CPU has AVX-512 F, BW, VNNI and F16C; outputs `out[t·ldo + 16g ..][..16]` of those
/// groups are written by this call only.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vnni,avx512vl")]
pub(crate) unsafe fn quant_rows(w: &QMatrix, g0: usize, g1: usize, x: &QActs, out: *mut f32, ldo: usize) {
    match w.ty {
        GgmlType::Q4_0 => rows::<Q4_0>(w, g0, g1, x, out, ldo),
        GgmlType::Q4_1 => rows::<Q4_1>(w, g0, g1, x, out, ldo),
        GgmlType::Q5_0 => rows::<Q5_0>(w, g0, g1, x, out, ldo),
        GgmlType::Q5_1 => rows::<Q5_1>(w, g0, g1, x, out, ldo),
        GgmlType::Q8_0 => rows::<Q8_0>(w, g0, g1, x, out, ldo),
        GgmlType::Q4_K => rows::<Q4_K>(w, g0, g1, x, out, ldo),
        GgmlType::Q5_K => rows::<Q5_K>(w, g0, g1, x, out, ldo),
        GgmlType::Q6_K => rows::<Q6_K>(w, g0, g1, x, out, ldo),
        GgmlType::MXFP4 => rows::<MXFP4>(w, g0, g1, x, out, ldo),
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!("not a block type"),
    }
}
