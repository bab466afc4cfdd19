//! CPU kernels: quantized matrix multiplication over a batch of tokens, f32 dot products and
//! the small fused element-wise ops of a Llama layer.
//!
//! `matmul` computes `out[t, n] = Σ_k W[n, k] · x[t, k]` for all tokens `t` of a batch. The
//! integer path follows llama.cpp's `ggml_vec_dot_q4_1_q8_1`: with weights `d_w·u + m_w` and
//! activations `d_x·q`, a block contributes `d_w·d_x·Σ(u·q) + m_w·(d_x·Σq)`. Exactly, for row
//! `r` and token `t` (f32, `fma` rounding once):
//!
//! ```text
//! acc = 0; macc = 0
//! for each block b: acc  = fma(f32(Σ_k u·q), d_w[r,b] · d_x[t,b], acc)
//!                   macc = fma(m_w[r,b], s_x[t,b], macc)
//! out = acc + macc
//! ```
//!
//! Every kernel computes exactly this, so a request's logits are bit-identical alone and
//! batched: that is what makes greedy outputs independent of batching, chunking and the prefix
//! cache. Two SIMD kernels share the work:
//! - *tokens in lanes* (8 or more tokens): activations of 8 tokens are interleaved so that one
//!   `vpdpbusd` multiplies 4 weights with 4 values of each of 8 tokens; the integer block sum
//!   then needs one conversion and one FMA per 8 (row, token) pairs instead of per pair;
//! - *rows in lanes* (the last `T mod 8` tokens, e.g. single-stream decode): 8 weight rows
//!   against one token, block sums reduced across lanes with `vphaddd`.
//!
//! Instruction sets are picked once at run time ([`Isa::detect`]): AVX-512 VNNI on 256-bit
//! vectors, else AVX2+FMA, else portable scalar code (also the tests' reference).
#![allow(unsafe_code)]
// SIMD tiles index several parallel arrays by the same small constant bounds.
#![allow(clippy::needless_range_loop)]

use crate::pool::{SyncPtr, ThreadPool};
use crate::quant::{Bits, QActs, QMatrix, Weight, QK};

/// The instruction set the kernels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// AVX2 + FMA + F16C + AVX-512 VNNI/VL (`vpdpbusd` on 256-bit registers).
    Vnni,
    /// AVX2 + FMA + F16C (`vpmaddubsw`).
    Avx2,
    /// Portable Rust.
    Scalar,
}

impl Isa {
    /// The best set this CPU supports.
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 =
                is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
            if avx2 && is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl") {
                return Isa::Vnni;
            }
            if avx2 {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// Name for logs and `/get_server_info`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Vnni => "avx512-vnni",
            Isa::Avx2 => "avx2",
            Isa::Scalar => "scalar",
        }
    }
}

/// Tasks per thread and matmul: enough to balance a thread that gets descheduled, few enough
/// that handing tasks out (an atomic on a shared cache line) stays cheap.
const TASKS_PER_THREAD: usize = 4;

/// Rows of `W` per task for a matrix of `n` rows (a multiple of 8, so row groups stay whole).
fn rows_per_task(pool: &ThreadPool, n: usize) -> usize {
    let tasks = (pool.threads() * TASKS_PER_THREAD).max(1);
    n.div_ceil(tasks).next_multiple_of(8).max(8)
}

/// `out[t·N + n] = Σ_k W[n,k] · x[t·K + k]` for `t < tokens`, `N = w.rows()`, `K = w.cols()`.
///
/// `xq` is scratch for the quantized activations (reused across calls to avoid allocation).
///
/// # Panics
/// When `x.len() != tokens·K` or `out.len() != tokens·N` (a caller bug).
pub fn matmul(pool: &ThreadPool, isa: Isa, w: &Weight, x: &[f32], tokens: usize, xq: &mut QActs, out: &mut [f32]) {
    let (n, k) = (w.rows(), w.cols());
    assert_eq!(x.len(), tokens * k, "matmul: activations shape");
    assert_eq!(out.len(), tokens * n, "matmul: output shape");
    if tokens == 0 {
        return;
    }
    let ptr = SyncPtr(out.as_mut_ptr());
    let rpt = rows_per_task(pool, n);
    let tasks = n.div_ceil(rpt);
    match w {
        Weight::Quant(q) => {
            quantize_parallel(pool, x, tokens, k, xq);
            if isa != Isa::Scalar {
                xq.interleave();
            }
            let xq = &*xq;
            pool.run(tasks, |i| {
                let r0 = i * rpt;
                let r1 = (r0 + rpt).min(n);
                // SAFETY: rows r0..r1 of every token are written by this task only; the
                // target features were detected at start-up.
                unsafe { quant_rows(isa, q, r0, r1, xq, ptr) }
            });
        }
        Weight::Nvfp4(m) => m.matmul(pool, isa, x, tokens, out),
        Weight::Dense { data, .. } => {
            pool.run(tasks, |i| {
                let r0 = i * rpt;
                let r1 = (r0 + rpt).min(n);
                for r in r0..r1 {
                    let wr = &data[r * k..(r + 1) * k];
                    for t in 0..tokens {
                        let v = dot(isa, wr, &x[t * k..(t + 1) * k]);
                        // SAFETY: (t, r) is written by this task only.
                        unsafe { *ptr.get().add(t * n + r) = v };
                    }
                }
            });
        }
    }
}

/// Quantizes activations on the pool, a run of whole blocks per task.
fn quantize_parallel(pool: &ThreadPool, x: &[f32], rows: usize, cols: usize, xq: &mut QActs) {
    xq.resize(rows, cols);
    let nb = rows * cols / QK;
    if nb < 256 {
        crate::quant::quantize_blocks(x, &mut xq.q, &mut xq.d, &mut xq.s, 0, nb);
        return;
    }
    let tasks = pool.threads() * 2;
    let per = nb.div_ceil(tasks);
    let (qp, dp, sp) = (SyncPtr(xq.q.as_mut_ptr()), SyncPtr(xq.d.as_mut_ptr()), SyncPtr(xq.s.as_mut_ptr()));
    pool.run(tasks, |i| {
        let (b0, b1) = ((i * per).min(nb), ((i + 1) * per).min(nb));
        // SAFETY: task i owns blocks b0..b1 of every buffer; the buffers outlive the call.
        let (q, d, s) = unsafe {
            (
                std::slice::from_raw_parts_mut(qp.get().add(b0 * QK), (b1 - b0) * QK),
                std::slice::from_raw_parts_mut(dp.get().add(b0), b1 - b0),
                std::slice::from_raw_parts_mut(sp.get().add(b0), b1 - b0),
            )
        };
        crate::quant::quantize_blocks(&x[b0 * QK..b1 * QK], q, d, s, 0, b1 - b0);
    });
}

/// # Safety
/// `isa` must be supported by the CPU; rows `r0..r1` of `out` (for every token) must not be
/// accessed by anyone else during the call.
unsafe fn quant_rows(isa: Isa, w: &QMatrix, r0: usize, r1: usize, x: &QActs, out: SyncPtr<f32>) {
    let out = out.get();
    // SIMD kernels take whole groups of 8 rows (r0 is a multiple of 8); the rest is scalar.
    let r_simd = r0 + (r1 - r0) / 8 * 8;
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Vnni => x86::quant_rows_vnni(w, r0, r_simd, x, out),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => x86::quant_rows_avx2(w, r0, r_simd, x, out),
        _ => quant_rows_scalar(w, r0, r_simd, x, out),
    }
    quant_rows_scalar(w, r_simd, r1, x, out);
}

/// The definition (module docs) for one weight row against one token; the portable path and
/// the reference the SIMD kernels are tested against bit for bit.
pub fn quant_dot_scalar(w: &QMatrix, r: usize, x: &QActs, t: usize) -> f32 {
    let nb = w.cols / QK;
    let xq = &x.q[t * w.cols..(t + 1) * w.cols];
    let mut acc = 0f32;
    let mut macc = 0f32;
    for b in 0..nb {
        let qb = &xq[b * QK..(b + 1) * QK];
        let mut isum = 0i32;
        match w.bits {
            Bits::U4 => {
                let c = &w.codes[w.block_offset(r, b)..w.block_offset(r, b) + 16];
                for j in 0..16 {
                    isum += (c[j] & 0xf) as i32 * qb[j] as i32 + (c[j] >> 4) as i32 * qb[j + 16] as i32;
                }
            }
            Bits::U8 => {
                let c = &w.codes[w.block_offset(r, b)..w.block_offset(r, b) + QK];
                for j in 0..QK {
                    isum += c[j] as i32 * qb[j] as i32;
                }
            }
        }
        let xb = t * nb + b;
        acc = (isum as f32).mul_add(w.d[r * nb + b] * x.d[xb], acc);
        macc = w.m[r * nb + b].mul_add(x.s[xb], macc);
    }
    acc + macc
}

/// # Safety
/// As [`quant_rows`].
unsafe fn quant_rows_scalar(w: &QMatrix, r0: usize, r1: usize, x: &QActs, out: *mut f32) {
    for r in r0..r1 {
        for t in 0..x.rows {
            *out.add(t * w.rows + r) = quant_dot_scalar(w, r, x, t);
        }
    }
}

/// f32 dot product; the same summation order for every caller of a given `isa`.
#[inline]
pub fn dot(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        // SAFETY: AVX2+FMA were detected (both Vnni and Avx2 imply them).
        return unsafe { x86::dot_avx2(a, b) };
    }
    let _ = isa;
    dot_scalar(a, b)
}

/// `y += a · x` over slices of equal length.
#[inline]
pub fn axpy(isa: Isa, a: f32, x: &[f32], y: &mut [f32]) {
    debug_assert_eq!(x.len(), y.len());
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        // SAFETY: AVX2+FMA were detected.
        return unsafe { x86::axpy_avx2(a, x, y) };
    }
    let _ = isa;
    for (yv, xv) in y.iter_mut().zip(x) {
        *yv += a * xv;
    }
}

fn dot_scalar(a: &[f32], b: &[f32]) -> f32 {
    // Eight partial sums, like the SIMD path, so the rounding behaviour is comparable.
    let mut acc = [0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += a[c * 8 + l] * b[c * 8 + l];
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for i in chunks * 8..a.len() {
        s += a[i] * b[i];
    }
    s
}

/// An element of the KV cache: f32, or IEEE half stored as `u16` bits.
pub trait KvElem: Copy + Send + Sync + 'static {
    /// The value as f32.
    fn to_f32(self) -> f32;
    /// Loads 8 consecutive values as f32.
    ///
    /// # Safety
    /// `p` must point at 8 readable values; AVX (and F16C for `u16`) must be available.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
}

impl KvElem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> std::arch::x86_64::__m256 {
        std::arch::x86_64::_mm256_loadu_ps(p)
    }
}

impl KvElem for u16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        crate::quant::f16_to_f32(self)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const u16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
}

/// Writes `src` into `dst` as IEEE-half bits, rounding to nearest even.
pub fn to_f16(isa: Isa, src: &[f32], dst: &mut [u16]) {
    debug_assert_eq!(src.len(), dst.len());
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        // SAFETY: F16C was detected (both SIMD ISAs require it).
        unsafe { x86::to_f16(src, dst) };
        return;
    }
    let _ = isa;
    for (d, v) in dst.iter_mut().zip(src) {
        *d = crate::quant::f32_to_f16(*v);
    }
}

/// Causal attention of the `group` query heads that share one KV head (GQA), over the KV
/// slots `slots` (positions `0 ..= p` of one sequence): for each head `h`,
/// `out_h = Σ_j softmax_j(scale · q_h·k_j) · v_j`.
///
/// Shapes: `q` and `out` are `[group × hd]`; key and value of slot `s` are
/// `k[s·stride + off ..][..hd]` and `v[...]` likewise. `scores` is scratch. Each K and V row is
/// read once for all heads of the group.
#[allow(clippy::too_many_arguments)]
pub fn attend_group<E: KvElem>(
    isa: Isa,
    q: &[f32],
    hd: usize,
    k: &[E],
    v: &[E],
    stride: usize,
    off: usize,
    slots: &[u32],
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let group = q.len() / hd;
    let n = slots.len();
    scores.resize(group * n, 0.0);
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && hd.is_multiple_of(8) && group <= 8 {
        // SAFETY: AVX2+FMA were detected; indices are checked by the slice bounds below.
        unsafe { x86::attn_scores(q, hd, group, k, stride, off, slots, scale, scores) };
    } else {
        attn_scores_scalar(q, hd, group, k, stride, off, slots, scale, scores);
    }
    #[cfg(not(target_arch = "x86_64"))]
    attn_scores_scalar(q, hd, group, k, stride, off, slots, scale, scores);
    for h in 0..group {
        let sc = &mut scores[h * n..(h + 1) * n];
        let mx = sc.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for x in sc.iter_mut() {
            *x = (*x - mx).exp();
            sum += *x;
        }
        let inv = 1.0 / sum;
        sc.iter_mut().for_each(|x| *x *= inv);
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Vnni && hd == 64 && group == 3 {
        // SAFETY: Vnni implies AVX-512F/VL (32 vector registers hold all 24 accumulators).
        unsafe { x86::attn_values_g3_hd64(scores, v, stride, off, slots, out) };
        return;
    }
    out.iter_mut().for_each(|o| *o = 0.0);
    let mut vr = vec![0f32; hd];
    for (j, &slot) in slots.iter().enumerate() {
        let base = slot as usize * stride + off;
        vr.iter_mut().zip(&v[base..base + hd]).for_each(|(d, s)| *d = s.to_f32());
        for h in 0..group {
            axpy(isa, scores[h * n + j], &vr, &mut out[h * hd..(h + 1) * hd]);
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn attn_scores_scalar<E: KvElem>(
    q: &[f32],
    hd: usize,
    group: usize,
    k: &[E],
    stride: usize,
    off: usize,
    slots: &[u32],
    scale: f32,
    scores: &mut [f32],
) {
    let n = slots.len();
    let mut kr = vec![0f32; hd];
    for (j, &slot) in slots.iter().enumerate() {
        let base = slot as usize * stride + off;
        kr.iter_mut().zip(&k[base..base + hd]).for_each(|(d, s)| *d = s.to_f32());
        for h in 0..group {
            scores[h * n + j] = dot_scalar(&q[h * hd..(h + 1) * hd], &kr) * scale;
        }
    }
}

/// RMSNorm (Zhang & Sennrich 2019, as in HF `LlamaRMSNorm`): `y = x / sqrt(mean(x²) + eps) · g`,
/// for each row of `x` (`rows · g.len()`), written to `y`.
pub fn rms_norm(x: &[f32], g: &[f32], eps: f32, y: &mut [f32]) {
    let h = g.len();
    for (xr, yr) in x.chunks_exact(h).zip(y.chunks_exact_mut(h)) {
        let ss: f32 = xr.iter().map(|v| v * v).sum::<f32>() / h as f32;
        let inv = 1.0 / (ss + eps).sqrt();
        for ((yv, xv), gv) in yr.iter_mut().zip(xr).zip(g) {
            *yv = xv * inv * gv;
        }
    }
}

/// SwiGLU: `out[i] = silu(gate[i]) · up[i]` with `silu(v) = v / (1 + e^{−v})`.
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (1.0 + (-g).exp()) * u;
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(v);
        let hi = _mm256_extractf128_ps(v, 1);
        let s = _mm_add_ps(lo, hi);
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    /// Loads one block (at `codes`) as 32 unsigned codes in weight order.
    #[inline(always)]
    unsafe fn load_codes(bits: Bits, codes: *const u8) -> __m256i {
        match bits {
            Bits::U4 => {
                let v = _mm_loadu_si128(codes as *const __m128i);
                let mask = _mm_set1_epi8(0x0f);
                let lo = _mm_and_si128(v, mask);
                let hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
                _mm256_set_m128i(hi, lo)
            }
            Bits::U8 => _mm256_loadu_si256(codes as *const __m256i),
        }
    }

    /// `acc + Σ` of 4-byte products per i32 lane: `vpdpbusd` with VNNI; else `vpmaddubsw` +
    /// `vpmaddwd`, splitting 8-bit codes into nibbles so no i16 pair can saturate.
    #[inline(always)]
    unsafe fn dot4<const VNNI: bool>(bits: Bits, acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
        if VNNI {
            return vnni_dot(acc, w, x);
        }
        let ones = _mm256_set1_epi16(1);
        if bits == Bits::U4 {
            return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), ones));
        }
        let nib = _mm256_set1_epi8(0x0f);
        let lo = _mm256_and_si256(w, nib);
        let hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), nib);
        let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, x), ones);
        let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, x), ones);
        _mm256_add_epi32(acc, _mm256_add_epi32(pl, _mm256_slli_epi32(ph, 4)))
    }

    /// Tokens in lanes: rows `r0..r0+NR` against token groups `g0..g0+NG` (8 tokens each).
    #[inline(always)]
    unsafe fn tokens_tile<const NR: usize, const NG: usize, const VNNI: bool>(
        w: &QMatrix,
        r0: usize,
        x: &QActs,
        g0: usize,
        out: *mut f32,
    ) {
        let nb = w.cols / QK;
        let mut acc = [[_mm256_setzero_ps(); NG]; NR];
        let mut macc = [[_mm256_setzero_ps(); NG]; NR];
        for b in 0..nb {
            let mut wa = [[0i32; 8]; NR];
            for i in 0..NR {
                let wv = load_codes(w.bits, w.codes.as_ptr().add(w.block_offset(r0 + i, b)));
                _mm256_storeu_si256(wa[i].as_mut_ptr() as *mut __m256i, wv);
            }
            let mut isum = [[_mm256_setzero_si256(); NG]; NR];
            for k in 0..8 {
                let mut xv = [_mm256_setzero_si256(); NG];
                for gi in 0..NG {
                    xv[gi] =
                        _mm256_loadu_si256(x.xi.as_ptr().add((((g0 + gi) * nb + b) * 8 + k) * 32) as *const __m256i);
                }
                for i in 0..NR {
                    let wb = _mm256_set1_epi32(wa[i][k]);
                    for gi in 0..NG {
                        isum[i][gi] = dot4::<VNNI>(w.bits, isum[i][gi], wb, xv[gi]);
                    }
                }
            }
            for i in 0..NR {
                let dw = _mm256_set1_ps(*w.d.as_ptr().add((r0 + i) * nb + b));
                let mw = _mm256_set1_ps(*w.m.as_ptr().add((r0 + i) * nb + b));
                for gi in 0..NG {
                    let at = ((g0 + gi) * nb + b) * 8;
                    let scale = _mm256_mul_ps(dw, _mm256_loadu_ps(x.dv.as_ptr().add(at)));
                    acc[i][gi] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[i][gi]), scale, acc[i][gi]);
                    macc[i][gi] = _mm256_fmadd_ps(mw, _mm256_loadu_ps(x.sv.as_ptr().add(at)), macc[i][gi]);
                }
            }
        }
        for i in 0..NR {
            for gi in 0..NG {
                let mut res = [0f32; 8];
                _mm256_storeu_ps(res.as_mut_ptr(), _mm256_add_ps(acc[i][gi], macc[i][gi]));
                for (j, v) in res.iter().enumerate() {
                    *out.add((8 * (g0 + gi) + j) * w.rows + r0 + i) = *v;
                }
            }
        }
    }

    /// Sums each of 8 i32 vectors across its lanes; lane `i` of the result is vector `i`'s sum.
    #[inline(always)]
    unsafe fn reduce8(p: &[__m256i; 8]) -> __m256i {
        let h01 = _mm256_hadd_epi32(p[0], p[1]);
        let h23 = _mm256_hadd_epi32(p[2], p[3]);
        let h45 = _mm256_hadd_epi32(p[4], p[5]);
        let h67 = _mm256_hadd_epi32(p[6], p[7]);
        let q0 = _mm256_hadd_epi32(h01, h23);
        let q1 = _mm256_hadd_epi32(h45, h67);
        let lo = _mm_add_epi32(_mm256_castsi256_si128(q0), _mm256_extracti128_si256(q0, 1));
        let hi = _mm_add_epi32(_mm256_castsi256_si128(q1), _mm256_extracti128_si256(q1, 1));
        _mm256_set_m128i(hi, lo)
    }

    /// Rows in lanes: the 8-row group starting at `r0` against token `t`.
    #[inline(always)]
    unsafe fn rows_tile<const VNNI: bool>(w: &QMatrix, r0: usize, x: &QActs, t: usize, out: *mut f32) {
        let nb = w.cols / QK;
        let bb = w.block_bytes();
        let g = r0 / 8;
        let mut acc = _mm256_setzero_ps();
        let mut macc = _mm256_setzero_ps();
        for b in 0..nb {
            let xv = _mm256_loadu_si256(x.q.as_ptr().add(t * w.cols + b * QK) as *const __m256i);
            // The group's 8 rows of block b are one contiguous run.
            let base = w.codes.as_ptr().add(w.block_offset(r0, b));
            let mut p = [_mm256_setzero_si256(); 8];
            for (i, pi) in p.iter_mut().enumerate() {
                let wv = load_codes(w.bits, base.add(i * bb));
                *pi = dot4::<VNNI>(w.bits, _mm256_setzero_si256(), wv, xv);
            }
            let isum = reduce8(&p);
            let at = (g * nb + b) * 8;
            let scale =
                _mm256_mul_ps(_mm256_loadu_ps(w.dt.as_ptr().add(at)), _mm256_set1_ps(*x.d.as_ptr().add(t * nb + b)));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc);
            macc = _mm256_fmadd_ps(
                _mm256_loadu_ps(w.mt.as_ptr().add(at)),
                _mm256_set1_ps(*x.s.as_ptr().add(t * nb + b)),
                macc,
            );
        }
        _mm256_storeu_ps(out.add(t * w.rows + r0), _mm256_add_ps(acc, macc));
    }

    #[inline(always)]
    unsafe fn vnni_dot(acc: __m256i, wv: __m256i, xv: __m256i) -> __m256i {
        vnni_dot_impl(acc, wv, xv)
    }

    #[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
    unsafe fn vnni_dot_impl(acc: __m256i, wv: __m256i, xv: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, wv, xv)
    }

    /// Rows `r0..r1` (whole groups of 8, `r0` a multiple of 8) for every token.
    #[inline(always)]
    unsafe fn rows_generic<const VNNI: bool, const NR: usize>(
        w: &QMatrix,
        r0: usize,
        r1: usize,
        x: &QActs,
        out: *mut f32,
    ) {
        let groups = x.rows / 8;
        let mut g = 0;
        while g + 2 <= groups {
            let mut r = r0;
            while r + NR <= r1 {
                tokens_tile::<NR, 2, VNNI>(w, r, x, g, out);
                r += NR;
            }
            while r < r1 {
                tokens_tile::<1, 2, VNNI>(w, r, x, g, out);
                r += 1;
            }
            g += 2;
        }
        if g < groups {
            for r in r0..r1 {
                tokens_tile::<1, 1, VNNI>(w, r, x, g, out);
            }
        }
        for t in groups * 8..x.rows {
            let mut r = r0;
            while r < r1 {
                rows_tile::<VNNI>(w, r, x, t, out);
                r += 8;
            }
        }
    }

    #[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
    pub(super) unsafe fn quant_rows_vnni(w: &QMatrix, r0: usize, r1: usize, x: &QActs, out: *mut f32) {
        // 32 vector registers (AVX-512VL) hold a 2-row × 2-group tile.
        rows_generic::<true, 2>(w, r0, r1, x, out)
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn quant_rows_avx2(w: &QMatrix, r0: usize, r1: usize, x: &QActs, out: *mut f32) {
        rows_generic::<false, 1>(w, r0, r1, x, out)
    }

    /// Scores of up to 8 heads against each key, every key row loaded once.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn attn_scores<E: KvElem>(
        q: &[f32],
        hd: usize,
        group: usize,
        k: &[E],
        stride: usize,
        off: usize,
        slots: &[u32],
        scale: f32,
        scores: &mut [f32],
    ) {
        let n = slots.len();
        let qp = q.as_ptr();
        for (j, &slot) in slots.iter().enumerate() {
            let base = slot as usize * stride + off;
            let kr = &k[base..base + hd];
            let kp = kr.as_ptr();
            let mut acc = [_mm256_setzero_ps(); 8];
            let mut c = 0;
            while c < hd {
                let kv = E::load8(kp.add(c));
                for h in 0..group {
                    acc[h] = _mm256_fmadd_ps(kv, _mm256_loadu_ps(qp.add(h * hd + c)), acc[h]);
                }
                c += 8;
            }
            for h in 0..group {
                scores[h * n + j] = hsum(acc[h]) * scale;
            }
        }
    }

    /// `out_h = Σ_j p[h][j] · v_j` for 3 heads of 64 dims with all accumulators in registers:
    /// each V row is read once, and `out` is written once. Same summation order as the
    /// generic path (slot by slot), so results do not depend on which path ran... per ISA.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
    pub(super) unsafe fn attn_values_g3_hd64<E: KvElem>(
        p: &[f32],
        v: &[E],
        stride: usize,
        off: usize,
        slots: &[u32],
        out: &mut [f32],
    ) {
        let n = slots.len();
        let mut acc = [[_mm256_setzero_ps(); 8]; 3];
        for (j, &slot) in slots.iter().enumerate() {
            let base = slot as usize * stride + off;
            let vr = &v[base..base + 64];
            let vp = vr.as_ptr();
            let w = [_mm256_set1_ps(p[j]), _mm256_set1_ps(p[n + j]), _mm256_set1_ps(p[2 * n + j])];
            for c in 0..8 {
                let vv = E::load8(vp.add(c * 8));
                for h in 0..3 {
                    acc[h][c] = _mm256_fmadd_ps(w[h], vv, acc[h][c]);
                }
            }
        }
        let o = &mut out[..192];
        for h in 0..3 {
            for c in 0..8 {
                _mm256_storeu_ps(o.as_mut_ptr().add(h * 64 + c * 8), acc[h][c]);
            }
        }
    }

    /// f32 → f16 bits, 8 at a time with `vcvtps2ph` (round to nearest even).
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn to_f16(src: &[f32], dst: &mut [u16]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.as_ptr().add(i)));
            _mm_storeu_si128(dst.as_mut_ptr().add(i) as *mut __m128i, h);
            i += 8;
        }
        for j in i..n {
            dst[j] = crate::quant::f32_to_f16(src[j]);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = _mm256_setzero_ps();
        let mut i = 0;
        while i + 8 <= n {
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc);
            i += 8;
        }
        let mut s = hsum(acc);
        while i < n {
            s += *pa.add(i) * *pb.add(i);
            i += 1;
        }
        s
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn axpy_avx2(a: f32, x: &[f32], y: &mut [f32]) {
        let n = x.len();
        let (px, py) = (x.as_ptr(), y.as_mut_ptr());
        let av = _mm256_set1_ps(a);
        let mut i = 0;
        while i + 8 <= n {
            let v = _mm256_fmadd_ps(av, _mm256_loadu_ps(px.add(i)), _mm256_loadu_ps(py.add(i)));
            _mm256_storeu_ps(py.add(i), v);
            i += 8;
        }
        while i < n {
            *py.add(i) += a * *px.add(i);
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::GgmlType;

    fn lcg(seed: &mut u64) -> u32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (*seed >> 33) as u32
    }

    fn random_matrix(ty: GgmlType, rows: usize, cols: usize, seed: &mut u64) -> QMatrix {
        let mut raw = vec![0u8; ty.bytes_for(rows * cols)];
        raw.iter_mut().for_each(|b| *b = lcg(seed) as u8);
        for blk in raw.chunks_exact_mut(ty.bytes_for(QK)) {
            blk[1] = 0x20 | (blk[1] & 0x0f);
            if ty == GgmlType::Q4_1 {
                blk[3] = 0xa0 | (blk[3] & 0x0f);
            }
        }
        QMatrix::from_ggml(ty, &raw, rows, cols)
    }

    /// The SIMD kernels agree with the scalar reference, and with a plain f32 product of the
    /// dequantized matrices within quantization error; every token row is identical whatever
    /// the batch size.
    #[test]
    fn quant_matmul_matches_reference_and_is_batch_invariant() {
        let pool = ThreadPool::new(2).expect("pool");
        let mut seed = 7u64;
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            let (n, k) = (45, 96);
            let w = Weight::Quant(random_matrix(ty, n, k, &mut seed));
            for tokens in [1usize, 3, 4, 8, 9, 16, 17, 24, 30] {
                let x: Vec<f32> = (0..tokens * k).map(|_| (lcg(&mut seed) % 2001) as f32 / 1000.0 - 1.0).collect();
                let mut xq = QActs::default();
                let mut out = vec![0f32; tokens * n];
                let mut isas = vec![Isa::detect(), Isa::Scalar];
                #[cfg(target_arch = "x86_64")]
                if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                    isas.push(Isa::Avx2);
                }
                for isa in isas {
                    matmul(&pool, isa, &w, &x, tokens, &mut xq, &mut out);
                    let Weight::Quant(q) = &w else { unreachable!() };
                    for t in 0..tokens {
                        // Single-token run of the same row gives the same bits.
                        let mut one = vec![0f32; n];
                        matmul(&pool, isa, &w, &x[t * k..(t + 1) * k], 1, &mut QActs::default(), &mut one);
                        let mut wr = vec![0f32; k];
                        for r in 0..n {
                            assert_eq!(out[t * n + r].to_bits(), one[r].to_bits(), "{ty:?} {isa:?} batch invariance");
                            let refv = quant_dot_scalar(q, r, &xq, t);
                            assert_eq!(
                                out[t * n + r].to_bits(),
                                refv.to_bits(),
                                "{ty:?} {isa:?} row {r} token {t} of {tokens}"
                            );
                            q.dequantize_row(r, &mut wr);
                            let exact: f32 = wr.iter().zip(&x[t * k..(t + 1) * k]).map(|(a, b)| a * b).sum();
                            let scale: f32 = wr.iter().map(|v| v.abs()).sum::<f32>() / 127.0;
                            assert!(
                                (out[t * n + r] - exact).abs() <= scale + 1e-3,
                                "{ty:?}: {} vs {exact}",
                                out[t * n + r]
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn dense_matmul_and_dot() {
        let pool = ThreadPool::new(2).expect("pool");
        let (n, k, tokens) = (5, 19, 3);
        let data: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let x: Vec<f32> = (0..tokens * k).map(|i| (i as f32 * 0.11).cos()).collect();
        let w = Weight::Dense { rows: n, cols: k, data: data.clone() };
        let mut out = vec![0f32; tokens * n];
        matmul(&pool, Isa::detect(), &w, &x, tokens, &mut QActs::default(), &mut out);
        for t in 0..tokens {
            for r in 0..n {
                let e: f64 = (0..k).map(|i| data[r * k + i] as f64 * x[t * k + i] as f64).sum();
                assert!((out[t * n + r] as f64 - e).abs() < 1e-5);
            }
        }
    }
}
