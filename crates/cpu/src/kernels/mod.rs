//! CPU kernels: quantized matrix multiplication over a batch of tokens, GQA attention, f32 dot
//! products and the small fused element-wise ops of a layer.
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
//! cache. One SIMD kernel shape serves every batch size, *rows in lanes*: 8 weight rows of a
//! [`QMatrix`](crate::format::ggml::QMatrix) are stored chunk-interleaved, so one 256-bit load
//! holds the same 4 weights of 8 rows and one broadcast of 4 activation bytes feeds them all;
//! tiles of 2 row groups × 4 tokens (AVX2, 4-bit) keep the integer block sums in registers, and the 8
//! results of a (row group, token) are one vector store (details in `q8_x86`).
//!
//! Instruction sets are picked once at run time ([`Isa::detect`](crate::Isa::detect)): AMX tiles
//! for batched integer matmuls, AVX-512 VNNI on 512-bit vectors, else AVX-VNNI, else AVX2+FMA,
//! else portable scalar code (also the tests' reference). `sparrow roofline` measures what each
//! path reaches on the machine.
//!
//! Files: [`matmul`](mod@matmul) (dispatch over [`crate::Weight`], the integer path over the
//! GGML block types, scalar reference), `q8_x86` (its AVX-VNNI / AVX2 tiles), `q8_avx512` (its AVX-512
//! VNNI tiles), `amx` (its AMX-INT8 tiles), `nvfp4_gemm` (the NVFP4 dequantizing GEMM),
//! [`flash`] (tiled causal attention with an online softmax over the paged cache, for EXTEND and
//! DECODE rows, and its score step [`block_scores`]), [`dsa`] (the DSA indexer's scores),
//! [`attention`] (the previous two-pass GQA kernel, kept as the benchmarks' baseline),
//! [`kv_elem`] (the KV cache's element types every attention kernel reads), [`elementwise`]
//! (dot, axpy, RMSNorm, SwiGLU, GeGLU, f16 conversion). RoPE lives with the models
//! (`sparrow-engine`, `model/common.rs`).

#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
pub mod attention;
pub mod dsa;
pub mod elementwise;
pub mod flash;
pub mod kv_elem;
pub mod matmul;
mod nvfp4_gemm;
#[cfg(target_arch = "x86_64")]
mod q8_avx512;
#[cfg(target_arch = "x86_64")]
mod q8_x86;
pub mod recurrent;

pub use attention::attend_group;
pub use dsa::{index_scores, IndexScratch};
pub use elementwise::{
    axpy, dot, erf_f32, gelu_erf, gelu_tanh_mul, rms_norm, rms_norm_in_place, silu_mul, softmax_in_place, to_f16,
    weighted_rows,
};
pub use flash::{block_scores, exp_f32, flash_attend, flash_attend_sinks, FlashScratch, KvView, KEY_BLOCK};
pub use kv_elem::{as_bf16, as_e4m3, as_e5m2, Bf16, E4m3, E5m2, KvElem};
pub use matmul::{matmul, matmul_grouped, quant_dot_scalar, GemmJob};

use crate::pool::ThreadPool;

/// Matmul tasks per pool thread: enough that a thread slowed by the host (a shared machine)
/// leaves its last tasks to the others, few enough that handing tasks out (an atomic on a
/// shared cache line) stays cheap.
const TASKS_PER_THREAD: usize = 4;

/// Rows of `W` per task for a matrix of `n` rows (a multiple of 16, so row groups stay whole).
pub(crate) fn rows_per_task(pool: &ThreadPool, n: usize) -> usize {
    let g = crate::format::qmatrix::GROUP;
    let tasks = (pool.threads() * TASKS_PER_THREAD).max(1);
    n.div_ceil(tasks).next_multiple_of(g).max(g)
}

/// Row groups (16 rows) per chunk of a batched integer matmul: the chunk's weights (about 256
/// KiB, within every L2 we run on) are read from memory once and from L2 by every token block
/// after the first. Without it a task's rows passed over each token block in turn, so a task
/// larger than L2 (the 1B LM head: 27 MB per task) streamed from memory once per block of 8
/// tokens. A chunk boundary changes the order tiles run in, never a tile's arithmetic.
pub(crate) fn l2_groups(w: &crate::format::ggml::QMatrix) -> usize {
    const L2_CHUNK: usize = 256 * 1024;
    let per_group = w.bytes() / w.rows.div_ceil(crate::format::qmatrix::GROUP).max(1);
    (L2_CHUNK / per_group.max(1)).max(1)
}

/// Software prefetch of the next L2 chunk's weights into L2 (`prefetcht1`), spread evenly over
/// the tiles of the current chunk, so the memory stream overlaps the chunk's compute.
///
/// Why: within a chunk only the first token block reads the weights from memory; the others
/// hit L2. Without help the reads come in bursts (one tile's lines per ~100 ns, near the
/// machine's bandwidth for that moment) and the hardware prefetcher is idle for the rest of the
/// chunk: the 1B LM head (Q6_K, 128256 × 2048, 215 MB) at 16 tokens ran at 177 GMAC/s against
/// 242 for a matrix that fits in L3 (`qmm`, Zen 4, 2 threads). Prefetches change no arithmetic.
pub(crate) struct NextChunk {
    base: *const u8,
    per_group: usize,
    g1: usize,
    chunk: usize,
    tiles_per_group: usize,
    ng: usize,
    cursor: usize,
    end: usize,
    step: usize,
}

impl NextChunk {
    /// For row groups up to `g1` of `w`, chunks of `chunk` groups, `tiles_per_group` tile calls
    /// per group over all token blocks. Off (`start` and `step` do nothing) when the tokens fit
    /// in one block (`rows ≤ tb`): each group's tiles then run back to back, the first from
    /// memory and the rest from L1, a steady stream the hardware prefetcher already follows,
    /// and the extra requests measured slower (Q4_K 16384 × 2048 at 2–8 tokens: 10–27 %).
    ///
    /// Units are what the caller's loop counts: 16-row groups (`per_group` 1) or the AVX2
    /// kernel's 8-row halves (2); `ng` units go to one tile call.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        w: &crate::format::ggml::QMatrix,
        g1: usize,
        chunk: usize,
        rows: usize,
        tb: usize,
        nt: usize,
        ng: usize,
        per_group: usize,
    ) -> NextChunk {
        let tiles_per_group = if rows > tb { rows.div_ceil(nt) } else { 0 };
        let units = (w.rows.div_ceil(crate::format::qmatrix::GROUP) * per_group).max(1);
        NextChunk {
            base: w.data().as_ptr(),
            per_group: w.bytes() / units,
            ng: ng.max(1),
            g1,
            chunk,
            tiles_per_group,
            cursor: 0,
            end: 0,
            step: 0,
        }
    }

    /// A chunk of groups `units` begins: aim at the chunk after it (within this call's groups).
    pub(crate) fn start(&mut self, units: std::ops::Range<usize>) {
        if self.tiles_per_group == 0 {
            return;
        }
        let next = units.end..(units.end + self.chunk).min(self.g1);
        self.cursor = next.start * self.per_group;
        self.end = next.end.max(next.start) * self.per_group;
        let calls = (units.len().div_ceil(self.ng) * self.tiles_per_group).max(1);
        self.step = (self.end - self.cursor).div_ceil(calls).next_multiple_of(64);
    }

    /// Before one tile: the next slice of the next chunk.
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)]
    #[inline(never)]
    pub(crate) fn step(&mut self) {
        use std::arch::x86_64::*;
        let stop = (self.cursor + self.step).min(self.end);
        while self.cursor < stop {
            // SAFETY: a prefetch never faults, and the address is inside the matrix anyway.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(self.base.add(self.cursor) as *const i8) };
            self.cursor += 64;
        }
    }
}

/// The batched loop order of the integer kernels: chunks of `chunk` units of `g0 .. g1` outer
/// (see [`l2_groups`]), blocks of `tb` tokens of `0 .. rows` inner; yields (units, tokens).
pub(crate) fn chunk_blocks(
    g0: usize,
    g1: usize,
    chunk: usize,
    rows: usize,
    tb: usize,
) -> impl Iterator<Item = (std::ops::Range<usize>, std::ops::Range<usize>)> {
    (g0..g1)
        .step_by(chunk)
        .flat_map(move |c0| (0..rows).step_by(tb).map(move |b0| (c0..(c0 + chunk).min(g1), b0..(b0 + tb).min(rows))))
}

/// Horizontal sum of 8 f32 lanes, shared by the SIMD paths.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[inline(always)]
pub(crate) unsafe fn hsum(v: std::arch::x86_64::__m256) -> f32 {
    use std::arch::x86_64::*;
    let lo = _mm256_castps256_ps128(v);
    let hi = _mm256_extractf128_ps(v, 1);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// The 8 × 8 transpose of `r` (rows of 8 lanes): `out[i][j] = r[j][i]`.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[inline]
#[target_feature(enable = "avx")]
pub(crate) unsafe fn transpose8(r: &[std::arch::x86_64::__m256; 8]) -> [std::arch::x86_64::__m256; 8] {
    use std::arch::x86_64::*;
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ]
}

/// The horizontal sums of 8 vectors, each by the tree of [`hsum`], as one vector with lanes
/// `[v0, v2, v4, v6, v1, v3, v5, v7]` (bit-identical to `hsum(v[i])` lane by lane).
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
#[inline]
#[target_feature(enable = "avx")]
pub(crate) unsafe fn hsum8(v: &[std::arch::x86_64::__m256; 8]) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let half = |a: __m256, b: __m256| {
        _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(a, b), _mm256_permute2f128_ps::<0x31>(a, b))
    };
    let (w01, w23, w45, w67) = (half(v[0], v[1]), half(v[2], v[3]), half(v[4], v[5]), half(v[6], v[7]));
    let c = _mm256_add_ps(_mm256_shuffle_ps::<0x44>(w01, w23), _mm256_shuffle_ps::<0xEE>(w01, w23));
    let d = _mm256_add_ps(_mm256_shuffle_ps::<0x44>(w45, w67), _mm256_shuffle_ps::<0xEE>(w45, w67));
    _mm256_hadd_ps(c, d)
}

/// Test data: the next value in [-1, 1) of a 64-bit LCG (Knuth's MMIX constants), the one
/// stream the kernel tests share.
#[cfg(test)]
pub(crate) fn test_rand(seed: &mut u64) -> f32 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}
