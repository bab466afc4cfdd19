//! Tiled causal attention with an online softmax (FlashAttention-2, Dao 2023, Algorithm 1) over
//! the paged KV cache, for EXTEND and DECODE rows alike.
//!
//! One call handles a *query block*: consecutive tokens of one sequence and the `group` query
//! heads that share one KV head (GQA), `R = tokens × group` rows. Keys are visited in blocks of
//! [`KEY_BLOCK`] positions aligned at absolute positions (`[b·128, b·128 + 128)`); blocks past the
//! block's last position are never touched (causal skipping). For each key block:
//!
//! ```text
//! S[r][j]  = (Σ_d q_r[d] · k_j[d]) · scale          (one FMA chain, d = 0, 1, …, hd − 1)
//! m'_r     = max(m_r, max_{j ≤ pos_r} S[r][j])
//! α_r      = exp(m_r − m'_r)
//! p[r][j]  = exp(S[r][j] − m'_r) for j ≤ pos_r, else 0
//! l_r      = fma(l_r, α_r, hsum8(Σ_c p[r][8c .. 8c + 8]))    (8 lanes over key chunks)
//! O_r      = O_r · α_r, then O_r = fma(p[r][j], v_j, O_r) for j in key order
//! ```
//!
//! and at the end `out_r = O_r · (1 / l_r)`. `hsum8` is the fixed tree of
//! [`hsum`](super::hsum); `exp` is [`exp_f32`], one polynomial for every path.
//!
//! **Determinism.** Every quantity of a row is a function of that row's query and its keys
//! `0 ..= pos` alone, in a fixed order: the tiling over rows, tokens and dimensions changes only
//! which row shares a loaded key, never an operation of a row; masked keys add exact zeros to
//! the sums, and no row reads a value past its position. So a row gives the same bits in a
//! query block of 32 tokens (prefill), alone (decode), in any chunk of a chunked prefill or
//! after a prefix-cache hit, and the SIMD path equals [`flash_attend`] with [`Isa::Scalar`] bit
//! for bit (for finite scores; a NaN score gives NaN on every path, not necessarily the same
//! NaN).
//!
//! **Data reuse.** Each key block is converted from f16 once and transposed (`[hd × 128]`, 8 × 8
//! in registers), so a score tile of 6 rows × 16 keys is pure FMAs over `d`: two key vectors and
//! six broadcast query values feed 12 accumulators, and no score needs a horizontal sum. With
//! `R ≥ 8` the block's values are converted once too, then read by value tiles of 6 rows × 16
//! dims; decode rows (`R = group`) read the values in place, converting in registers.
#![allow(unsafe_code)]

use super::kv_elem::KvElem;
use crate::isa::Isa;

/// Keys per block (positions `[b·KEY_BLOCK, (b + 1)·KEY_BLOCK)`). Part of the numerics: a row's
/// online-softmax rescales happen at these boundaries.
pub const KEY_BLOCK: usize = 128;

/// Rows per score and value tile: 6 rows × 16 keys (or dims) keep 12 FMA chains in flight,
/// enough to cover the FMA latency on two pipes, in 15 of the 16 AVX2 registers.
const TILE_ROWS: usize = 6;

/// Rows at which converting a key block's values to f32 once beats converting them per row
/// tile. One decode token's 8 GQA rows (two tiles) convert in the tiles: 26.7 → 24.3 µs per
/// (row, KV head) over 320 keys of 128 dims (`attnbench 320 8 128`, Zen 4).
const CONVERT_ROWS: usize = 9;

/// Lower bound below which [`exp_f32`] returns 0 (e^-87 ≈ 1.6e-38, just above the smallest
/// normal f32, 1.18e-38: the `2^n` of the result stays a normal number).
const EXP_LO: f32 = -87.0;
const EXP_HI: f32 = 88.0;
const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Cephes `expf` minimax coefficients on [−ln2/2, ln2/2], highest degree first.
const EXP_P: [f32; 6] = [1.987_569_1e-4, 1.398_2e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5];

/// Elements per block of [`sum_exp_shifted`]: 8 lanes of 32 terms each in f32, then f64.
const SUM_EXP_BLOCK: usize = 256;

/// `Σ_i e^(x_i − m)` over the non-NaN `x_i`, with [`exp_f32`]: element `i` of each block of 256
/// is added to f32 lane `i mod 8` (from zero, in index order), the 8 lanes then to the f64 total
/// in lane order, block after block. Every ISA performs these operations, so the bits agree on
/// all of them (the log-sum-exp of a logits row, for logprobs: 49k `exp`s per row).
pub fn sum_exp_shifted(isa: Isa, x: &[f32], m: f32) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        // SAFETY: every ISA but `Scalar` implies AVX2 and FMA (checked by `Isa::detect`).
        return unsafe { x86::sum_exp_shifted(x, m) };
    }
    let _ = isa;
    let mut total = 0f64;
    for block in x.chunks(SUM_EXP_BLOCK) {
        let mut lanes = [0f32; 8];
        for (i, &v) in block.iter().enumerate() {
            let d = v - m;
            lanes[i % 8] += if d.is_nan() { 0.0 } else { exp_f32(d) };
        }
        for l in lanes {
            total += l as f64;
        }
    }
    total
}

/// `e^x` in f32 as Cephes `expf` computes it (range reduction by ln 2 in two parts, a degree-5
/// polynomial, scaling by `2^n` through the exponent bits): within 2 ulp of the exact value for
/// `x ∈ [−87, 88]`, exactly 0 below −87 (so `exp(−∞) = 0`). The SIMD paths compute the same
/// operations lane by lane, so all paths agree bit for bit.
#[inline]
pub fn exp_f32(x: f32) -> f32 {
    if x < EXP_LO || x.is_nan() {
        return if x.is_nan() { x } else { 0.0 };
    }
    let x = x.min(EXP_HI);
    let n = (x * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    let mut p = EXP_P[0];
    for &c in &EXP_P[1..] {
        p = p.mul_add(r, c);
    }
    let y = p.mul_add(r * r, r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// The K and V of one sequence in the cache: the key of position `j` is
/// `k[slots[j]·stride + off ..][..hd]`, its value likewise in `v`.
#[derive(Clone, Copy)]
pub struct KvView<'a, E> {
    /// Keys, `[slots × stride]`.
    pub k: &'a [E],
    /// Values, `[slots × stride]`.
    pub v: &'a [E],
    /// Elements per cache slot.
    pub stride: usize,
    /// Offset of this KV head inside a slot.
    pub off: usize,
    /// Cache slot of each position `0 ..= max(pos)` of the sequence.
    pub slots: &'a [u32],
}

/// Reusable buffers of [`flash_attend`] (grown on demand, never shrunk).
#[derive(Default)]
pub struct FlashScratch {
    q: Vec<f32>,
    /// Scores, then probabilities: `[R × KEY_BLOCK]`.
    s: Vec<f32>,
    /// The key block transposed: `[hd × KEY_BLOCK]`.
    kt: Vec<f32>,
    o: Vec<f32>,
    m: Vec<f32>,
    l: Vec<f32>,
    alpha: Vec<f32>,
    valid: Vec<i32>,
    vf: Vec<f32>,
    koff: Vec<usize>,
}

/// Causal attention of one query block (see the module docs).
///
/// Shapes: token `i`'s `group` query heads are `q[i·q_stride ..][..group·hd]`, at position
/// `positions[i]`; `out` is `[tokens × group × hd]`. `kv.slots` covers every position up to the
/// largest in `positions`. `scale` multiplies the raw scores (usually `hd^-½`).
///
/// # Panics
/// When `out` or `q` is too short, or a slot index is out of the cache.
#[allow(clippy::too_many_arguments)]
pub fn flash_attend<E: KvElem>(
    isa: Isa,
    q: &[f32],
    q_stride: usize,
    positions: &[u32],
    group: usize,
    hd: usize,
    kv: &KvView<'_, E>,
    scale: f32,
    sc: &mut FlashScratch,
    out: &mut [f32],
) {
    flash_attend_sinks(isa, q, q_stride, positions, group, hd, kv, scale, None, sc, out)
}

/// [`flash_attend`] with attention sinks (gpt-oss; Xiao et al. 2023, "StreamingLLM"): head
/// `h` of the group (`sinks[h]`, a logit on the scaled scores' scale) joins every row's softmax
/// with no value, so each output is the flash result times `l / (l + e^{sink − m})` (`m` the
/// row's running maximum, `l` its sum of `e^{s − m}`): llama.cpp's `ggml_soft_max_add_sinks`.
///
/// # Panics
/// As [`flash_attend`], and when `sinks` holds fewer than `group` values.
#[allow(clippy::too_many_arguments)]
pub fn flash_attend_sinks<E: KvElem>(
    isa: Isa,
    q: &[f32],
    q_stride: usize,
    positions: &[u32],
    group: usize,
    hd: usize,
    kv: &KvView<'_, E>,
    scale: f32,
    sinks: Option<&[f32]>,
    sc: &mut FlashScratch,
    out: &mut [f32],
) {
    let tokens = positions.len();
    let rows = tokens * group;
    if rows == 0 {
        return;
    }
    assert!(out.len() >= rows * hd, "flash_attend: out holds {} of {} values", out.len(), rows * hd);
    let simd = cfg!(target_arch = "x86_64") && isa != Isa::Scalar && hd.is_multiple_of(16);
    sc.q.clear();
    for i in 0..tokens {
        sc.q.extend_from_slice(&q[i * q_stride..i * q_stride + group * hd]);
    }
    sc.s.resize(rows * KEY_BLOCK, 0.0);
    // No clearing: `transpose_keys` writes every column the score tiles read.
    sc.kt.resize(hd * KEY_BLOCK, 0.0);
    sc.o.clear();
    sc.o.resize(rows * hd, 0.0);
    sc.m.clear();
    sc.m.resize(rows, f32::NEG_INFINITY);
    sc.l.clear();
    sc.l.resize(rows, 0.0);
    sc.alpha.resize(rows, 0.0);
    sc.valid.resize(rows, 0);
    let max_pos = positions.iter().copied().max().unwrap_or(0) as usize;
    // The scalar path reads the cache in place: conversion only pays off for SIMD tiles.
    let convert = simd && rows >= CONVERT_ROWS;
    for k0 in (0..=max_pos).step_by(KEY_BLOCK) {
        let nk = (max_pos + 1 - k0).min(KEY_BLOCK);
        for r in 0..rows {
            let p = positions[r / group] as usize;
            sc.valid[r] = (p + 1).saturating_sub(k0).min(nk) as i32;
        }
        let kslots = &kv.slots[k0..k0 + nk];
        for &slot in kslots {
            let base = slot as usize * kv.stride + kv.off;
            assert!(base + hd <= kv.k.len() && base + hd <= kv.v.len(), "flash_attend: slot {slot} out of the cache");
        }
        sc.koff.clear();
        if convert {
            sc.vf.resize(nk * hd, 0.0);
            for (j, &slot) in kslots.iter().enumerate() {
                let base = slot as usize * kv.stride + kv.off;
                convert_row(isa, &kv.v[base..base + hd], &mut sc.vf[j * hd..(j + 1) * hd]);
                sc.koff.push(j * hd);
            }
        } else {
            sc.koff.extend(kslots.iter().map(|&s| s as usize * kv.stride + kv.off));
        }
        let parts = Parts { rows, hd, nk, scale };
        let v: &[E] = kv.v;
        #[cfg(target_arch = "x86_64")]
        if simd {
            // SAFETY: AVX2+FMA+F16C were detected (`simd` implies a SIMD ISA); every key and
            // value row is in the cache (asserted above) and the scratch has the sizes set
            // above.
            unsafe {
                x86::transpose_keys(kv, kslots, hd, &mut sc.kt);
                x86::scores(&sc.q, &parts, &sc.kt, &mut sc.s);
                x86::softmax(&parts, &mut sc.s, &mut sc.m, &mut sc.l, &mut sc.alpha, &sc.valid);
                if convert {
                    x86::values(&parts, &sc.vf, &sc.koff, &sc.s, &mut sc.o, &sc.alpha, &sc.valid);
                } else {
                    x86::values(&parts, v, &sc.koff, &sc.s, &mut sc.o, &sc.alpha, &sc.valid);
                }
            }
            continue;
        }
        scalar::scores(&sc.q, &parts, kv, kslots, &mut sc.s);
        scalar::softmax(&parts, &mut sc.s, &mut sc.m, &mut sc.l, &mut sc.alpha, &sc.valid);
        scalar::values(&parts, v, &sc.koff, &sc.s, &mut sc.o, &sc.alpha, &sc.valid);
    }
    for r in 0..rows {
        let sink = sinks.map_or(0.0, |s| (s[r % group] - sc.m[r]).exp());
        let inv = 1.0 / (sc.l[r] + sink);
        for (o, &a) in out[r * hd..(r + 1) * hd].iter_mut().zip(&sc.o[r * hd..(r + 1) * hd]) {
            *o = a * inv;
        }
    }
}

/// The score step of [`flash_attend`] alone, for other attention-like products (the DSA
/// indexer): `s[r·KEY_BLOCK + j] = (Σ_d q_r[d] · k_j[d]) · scale` for the `rows` rows of `q`
/// (`[rows × hd]`) and the keys of `kslots` (at most [`KEY_BLOCK`], key of slot `x` at
/// `kv.k[x·kv.stride + kv.off ..][..hd]`; `kv.v` is not read). The same operations as
/// `flash_attend`'s scores on every ISA (one FMA chain over `d` per score); `kt` is scratch.
/// Up to 8 rows run with rows in lanes (the query transposed, keys broadcast), more with keys
/// in lanes (the key block transposed): the same chains either way.
///
/// # Panics
/// When `kslots` holds more than [`KEY_BLOCK`] keys, a slot is out of `kv.k`, or `q`/`s` are
/// too short.
#[allow(clippy::too_many_arguments)]
pub fn block_scores<E: KvElem>(
    isa: Isa,
    q: &[f32],
    rows: usize,
    hd: usize,
    kv: &KvView<'_, E>,
    kslots: &[u32],
    scale: f32,
    kt: &mut Vec<f32>,
    s: &mut [f32],
) {
    let nk = kslots.len();
    assert!(nk <= KEY_BLOCK && q.len() >= rows * hd && s.len() >= rows * KEY_BLOCK, "block_scores: shapes");
    for &slot in kslots {
        assert!(slot as usize * kv.stride + kv.off + hd <= kv.k.len(), "block_scores: slot {slot} out of the cache");
    }
    let p = Parts { rows, hd, nk, scale };
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && hd.is_multiple_of(8) && rows <= 8 {
        // Few rows (one token's heads): transposing the query beats transposing the keys.
        // SAFETY: as below.
        unsafe { x86::few_rows_scores(q, &p, kv, kslots, kt, s) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && hd.is_multiple_of(8) {
        kt.resize(hd * KEY_BLOCK, 0.0);
        // SAFETY: AVX2+FMA+F16C were detected; key rows are in the cache (asserted above), and
        // `kt`, `q`, `s` have the sizes the kernels read.
        unsafe {
            x86::transpose_keys(kv, kslots, hd, kt);
            x86::scores(q, &p, kt, s);
        }
        return;
    }
    let _ = (isa, kt);
    scalar::scores(q, &p, kv, kslots, s);
}

/// Sizes of one key block's work.
struct Parts {
    rows: usize,
    hd: usize,
    nk: usize,
    scale: f32,
}

fn convert_row<E: KvElem>(isa: Isa, src: &[E], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && src.len().is_multiple_of(8) {
        // SAFETY: AVX2+F16C were detected; both slices hold `src.len()` values.
        unsafe { x86::convert_row(src, dst) };
        return;
    }
    let _ = isa;
    dst.iter_mut().zip(src).for_each(|(d, s)| *d = s.to_f32());
}

/// The portable definition every SIMD path reproduces.
mod scalar {
    use super::*;

    pub(super) fn scores<E: KvElem>(q: &[f32], p: &Parts, kv: &KvView<'_, E>, kslots: &[u32], s: &mut [f32]) {
        for (j, &slot) in kslots.iter().enumerate() {
            let base = slot as usize * kv.stride + kv.off;
            let kr = &kv.k[base..base + p.hd];
            for r in 0..p.rows {
                let mut acc = 0f32;
                for (qv, kv) in q[r * p.hd..(r + 1) * p.hd].iter().zip(kr) {
                    acc = kv.to_f32().mul_add(*qv, acc);
                }
                s[r * KEY_BLOCK + j] = acc * p.scale;
            }
        }
    }

    /// The reduction tree of `kernels::hsum`: `((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7))`.
    fn hsum8_order(l: &[f32; 8]) -> f32 {
        let s = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
        (s[0] + s[2]) + (s[1] + s[3])
    }

    pub(super) fn softmax(p: &Parts, s: &mut [f32], m: &mut [f32], l: &mut [f32], alpha: &mut [f32], valid: &[i32]) {
        for r in 0..p.rows {
            let nv = valid[r] as usize;
            let row = &mut s[r * KEY_BLOCK..(r + 1) * KEY_BLOCK];
            let mx = row[..nv].iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let m_new = m[r].max(mx);
            let a = if m_new == f32::NEG_INFINITY { 1.0 } else { exp_f32(m[r] - m_new) };
            let mut lanes = [0f32; 8];
            for (j, x) in row[..p.nk.next_multiple_of(8)].iter_mut().enumerate() {
                *x = if j < nv { exp_f32(*x - m_new) } else { 0.0 };
                lanes[j % 8] += *x;
            }
            l[r] = l[r].mul_add(a, hsum8_order(&lanes));
            m[r] = m_new;
            alpha[r] = a;
        }
    }

    pub(super) fn values<T: KvElem>(
        p: &Parts,
        v: &[T],
        koff: &[usize],
        s: &[f32],
        o: &mut [f32],
        alpha: &[f32],
        valid: &[i32],
    ) {
        for r in 0..p.rows {
            let orow = &mut o[r * p.hd..(r + 1) * p.hd];
            orow.iter_mut().for_each(|x| *x *= alpha[r]);
            for j in 0..valid[r] as usize {
                let w = s[r * KEY_BLOCK + j];
                for (x, vv) in orow.iter_mut().zip(&v[koff[j]..koff[j] + p.hd]) {
                    *x = w.mul_add(vv.to_f32(), *x);
                }
            }
        }
    }
}

/// The key-block transposition of the score step, for the DSA indexer's fused kernel.
#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{exp8, transpose_keys};

#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::half::{f16_to_f32, f32_to_f16};

    use crate::kernels::test_rand as lcg;

    #[test]
    fn sum_exp_shifted_is_the_same_on_every_isa_and_close_to_f64() {
        let x: Vec<f32> =
            (0..1003).map(|i| ((i * 7919) % 1000) as f32 * 0.03 - 20.0).chain([f32::NAN, -f32::INFINITY]).collect();
        let m = 9.97;
        let exact: f64 = x.iter().filter(|v| !v.is_nan()).map(|&v| ((v - m) as f64).exp()).sum();
        let want = sum_exp_shifted(Isa::Scalar, &x, m);
        assert!((want - exact).abs() / exact < 1e-5, "{want} vs {exact}");
        for isa in Isa::available() {
            assert_eq!(sum_exp_shifted(isa, &x, m).to_bits(), want.to_bits(), "{isa:?}");
        }
    }

    #[test]
    fn exp_is_close_to_libm_and_exact_at_the_edges() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let (a, b) = (exp_f32(x) as f64, (x as f64).exp());
            worst = worst.max((a - b).abs() / b);
            x += 0.0137;
        }
        assert!(worst < 3.0 * f32::EPSILON as f64, "relative error {worst}");
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-100.0), 0.0);
        #[cfg(target_arch = "x86_64")]
        if Isa::detect() != Isa::Scalar {
            let xs: Vec<f32> = (0..4096).map(|i| -90.0 + i as f32 * 0.0223).chain([f32::NEG_INFINITY; 8]).collect();
            for c in xs.chunks_exact(8) {
                let mut got = [0f32; 8];
                // SAFETY: AVX2+FMA were detected.
                unsafe {
                    use std::arch::x86_64::*;
                    _mm256_storeu_ps(got.as_mut_ptr(), x86::exp8(_mm256_loadu_ps(c.as_ptr())));
                }
                for (g, &x) in got.iter().zip(c) {
                    assert_eq!(g.to_bits(), exp_f32(x).to_bits(), "exp({x})");
                }
            }
        }
    }

    /// An f64 softmax attention over the f16-rounded cache.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        q: &[f32],
        k: &[u16],
        v: &[u16],
        stride: usize,
        off: usize,
        slots: &[u32],
        hd: usize,
        scale: f64,
    ) -> Vec<f64> {
        let s: Vec<f64> = slots
            .iter()
            .map(|&j| {
                (0..hd).map(|i| q[i] as f64 * f16_to_f32(k[j as usize * stride + off + i]) as f64).sum::<f64>() * scale
            })
            .collect();
        let mx = s.iter().copied().fold(f64::MIN, f64::max);
        let z: f64 = s.iter().map(|x| (x - mx).exp()).sum();
        (0..hd)
            .map(|i| {
                slots
                    .iter()
                    .zip(&s)
                    .map(|(&j, x)| (x - mx).exp() / z * f16_to_f32(v[j as usize * stride + off + i]) as f64)
                    .sum()
            })
            .collect()
    }

    /// `block_scores` gives each row the same bits with 13 rows (keys in lanes), 5 or 8 rows
    /// (rows in lanes) and on the scalar ISA, over a partial key block, f32 cache rows of 80.
    #[test]
    fn block_scores_do_not_depend_on_the_row_count() {
        let (hd, nk, nslots) = (80usize, 77usize, 90usize);
        let mut seed = 21u64;
        let k: Vec<f32> = (0..nslots * hd).map(|_| lcg(&mut seed)).collect();
        let slots: Vec<u32> = (0..nslots as u32).rev().collect();
        let q: Vec<f32> = (0..13 * hd).map(|_| lcg(&mut seed)).collect();
        let kv = KvView { k: &k, v: &k, stride: hd, off: 0, slots: &slots };
        let ks = &slots[3..3 + nk];
        let mut kt = Vec::new();
        let mut want = vec![0f32; 13 * KEY_BLOCK];
        block_scores(Isa::Scalar, &q, 13, hd, &kv, ks, 0.7, &mut kt, &mut want);
        for isa in Isa::available() {
            for (r0, r1) in [(0usize, 13usize), (0, 5), (5, 13), (12, 13)] {
                let mut got = vec![0f32; (r1 - r0) * KEY_BLOCK];
                block_scores(isa, &q[r0 * hd..r1 * hd], r1 - r0, hd, &kv, ks, 0.7, &mut kt, &mut got);
                for r in r0..r1 {
                    for j in 0..nk {
                        let (g, w) = (got[(r - r0) * KEY_BLOCK + j], want[r * KEY_BLOCK + j]);
                        assert_eq!(g.to_bits(), w.to_bits(), "{isa:?} rows {r0}..{r1}: row {r} key {j}");
                    }
                }
            }
        }
    }

    /// A value that overflowed f16 (±inf) at a later position never reaches earlier rows of the
    /// same query block: they stay finite and equal to the rows computed alone.
    #[test]
    fn later_infinite_values_do_not_leak_backwards() {
        let (hd, n) = (64usize, 40usize);
        let mut seed = 17u64;
        let kh: Vec<u16> = (0..n * hd).map(|_| f32_to_f16(lcg(&mut seed))).collect();
        let mut vh: Vec<u16> = (0..n * hd).map(|_| f32_to_f16(lcg(&mut seed))).collect();
        vh[(n - 1) * hd + 5] = 0x7c00; // +inf at the last position
        let slots: Vec<u32> = (0..n as u32).collect();
        let q: Vec<f32> = (0..n * 3 * hd).map(|_| lcg(&mut seed)).collect();
        let positions: Vec<u32> = (0..n as u32).collect();
        let view = KvView { k: &kh, v: &vh, stride: hd, off: 0, slots: &slots };
        let mut sc = FlashScratch::default();
        for isa in Isa::available() {
            let mut all = vec![0f32; n * 3 * hd];
            flash_attend(isa, &q, 3 * hd, &positions, 3, hd, &view, 0.125, &mut sc, &mut all);
            for t in 0..n - 1 {
                let mut one = vec![0f32; 3 * hd];
                flash_attend(
                    isa,
                    &q[t * 3 * hd..],
                    3 * hd,
                    &positions[t..t + 1],
                    3,
                    hd,
                    &view,
                    0.125,
                    &mut sc,
                    &mut one,
                );
                let got = &all[t * 3 * hd..(t + 1) * 3 * hd];
                assert!(got.iter().all(|x| x.is_finite()), "{isa:?} token {t} is not finite");
                assert!(got.iter().zip(&one).all(|(a, b)| a.to_bits() == b.to_bits()), "{isa:?} token {t}");
            }
        }
    }

    /// Every row of a prefill block equals the f64 reference, and the same row computed alone
    /// (a decode row), in other query blocks, with the f32 twin of the cache and on every ISA,
    /// bit for bit.
    #[test]
    fn blocks_match_reference_and_each_row_is_independent_of_tiling() {
        let (hd, kv_heads) = (64, 2);
        let stride = kv_heads * hd;
        let n = 203; // two key blocks, the last one partial and odd
        let mut seed = 11u64;
        let kf: Vec<f32> = (0..n * stride).map(|_| lcg(&mut seed) * 2.0).collect();
        let vf: Vec<f32> = (0..n * stride).map(|_| lcg(&mut seed)).collect();
        let kh: Vec<u16> = kf.iter().map(|&x| f32_to_f16(x)).collect();
        let vh: Vec<u16> = vf.iter().map(|&x| f32_to_f16(x)).collect();
        let kr: Vec<f32> = kh.iter().map(|&x| f16_to_f32(x)).collect();
        let vr: Vec<f32> = vh.iter().map(|&x| f16_to_f32(x)).collect();
        // A paged, shuffled slot map.
        let mut slots: Vec<u32> = (0..n as u32).collect();
        for i in (1..n).rev() {
            let j = (lcg(&mut seed).abs() * i as f32) as usize % (i + 1);
            slots.swap(i, j);
        }
        for group in [1usize, 3, 4] {
            let qs = group * hd + 5; // a token's query row is longer than its group's heads
            let q: Vec<f32> = (0..n * qs).map(|_| lcg(&mut seed)).collect();
            let positions: Vec<u32> = (0..n as u32).collect();
            let view = KvView { k: &kh, v: &vh, stride, off: hd, slots: &slots };
            let mut sc = FlashScratch::default();
            let mut want: Option<Vec<f32>> = None;
            for isa in Isa::available() {
                // The whole sequence as one block.
                let mut all = vec![0f32; n * group * hd];
                flash_attend(isa, &q, qs, &positions, group, hd, &view, 0.125, &mut sc, &mut all);
                for t in [0usize, 1, 63, 64, 127, 128, 130, n - 1] {
                    for h in 0..group {
                        let r = reference(&q[t * qs + h * hd..], &kh, &vh, stride, hd, &slots[..=t], hd, 0.125);
                        for (i, w) in r.iter().enumerate() {
                            let g = all[(t * group + h) * hd + i] as f64;
                            assert!((g - w).abs() < 2e-5, "{isa:?} group {group} token {t}: {g} vs {w}");
                        }
                    }
                }
                // Query blocks of 16 and 7 tokens, single tokens, and the f32 cache: same bits.
                let f32_view = KvView { k: &kr, v: &vr, stride, off: hd, slots: &slots };
                for qb in [16usize, 7, 1] {
                    let mut part = vec![0f32; n * group * hd];
                    for t0 in (0..n).step_by(qb) {
                        let t1 = (t0 + qb).min(n);
                        let o = &mut part[t0 * group * hd..t1 * group * hd];
                        flash_attend(isa, &q[t0 * qs..], qs, &positions[t0..t1], group, hd, &view, 0.125, &mut sc, o);
                    }
                    assert!(all.iter().zip(&part).all(|(a, b)| a.to_bits() == b.to_bits()), "{isa:?} blocks of {qb}");
                    let mut f = vec![0f32; n * group * hd];
                    flash_attend(isa, &q, qs, &positions, group, hd, &f32_view, 0.125, &mut sc, &mut f);
                    assert!(all.iter().zip(&f).all(|(a, b)| a.to_bits() == b.to_bits()), "{isa:?} f32 cache");
                }
                match &want {
                    None => want = Some(all),
                    Some(w) => assert!(
                        w.iter().zip(&all).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{isa:?} differs from scalar"
                    ),
                }
            }
        }
    }

    /// Sinks join each row's softmax with no value: the output equals the f64 softmax over the
    /// scores and the head's sink, on every ISA, for one block and past it.
    #[test]
    fn sinks_match_softmax_with_an_extra_logit() {
        let (hd, group, n) = (16usize, 2usize, 140usize);
        let mut seed = 5u64;
        let kh: Vec<u16> = (0..n * hd).map(|_| f32_to_f16(lcg(&mut seed) * 2.0)).collect();
        let vh: Vec<u16> = (0..n * hd).map(|_| f32_to_f16(lcg(&mut seed))).collect();
        let slots: Vec<u32> = (0..n as u32).collect();
        let q: Vec<f32> = (0..n * group * hd).map(|_| lcg(&mut seed)).collect();
        let positions: Vec<u32> = (0..n as u32).collect();
        let sinks = [1.5f32, -0.5];
        let view = KvView { k: &kh, v: &vh, stride: hd, off: 0, slots: &slots };
        let mut sc = FlashScratch::default();
        for isa in Isa::available() {
            let mut out = vec![0f32; n * group * hd];
            flash_attend_sinks(
                isa,
                &q,
                group * hd,
                &positions,
                group,
                hd,
                &view,
                0.25,
                Some(&sinks),
                &mut sc,
                &mut out,
            );
            for t in [0usize, 1, 64, n - 1] {
                for h in 0..group {
                    let qh = &q[(t * group + h) * hd..];
                    let s: Vec<f64> = (0..=t)
                        .map(|j| (0..hd).map(|i| qh[i] as f64 * f16_to_f32(kh[j * hd + i]) as f64).sum::<f64>() * 0.25)
                        .collect();
                    let z: f64 = s.iter().map(|x| x.exp()).sum::<f64>() + (sinks[h] as f64).exp();
                    for i in 0..hd {
                        let w: f64 =
                            s.iter().enumerate().map(|(j, x)| x.exp() / z * f16_to_f32(vh[j * hd + i]) as f64).sum();
                        let g = out[(t * group + h) * hd + i] as f64;
                        assert!((g - w).abs() < 2e-5, "{isa:?} token {t} head {h}: {g} vs {w}");
                    }
                }
            }
        }
    }
}
