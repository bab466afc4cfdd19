//! Batched matrix multiplication over a [`Weight`]: the integer path over GGML block types
//! (activations quantized to 8 bits per 32-block, per 64 for the K-quants; the arithmetic is
//! [`QMatrix::dot`]), the NVFP4 path, the dense f32 path and the dense 16-bit (F16/BF16) path.
#![allow(unsafe_code)]

use super::elementwise::dot;
use super::rows_per_task;
use crate::format::ggml::{QActs, QMatrix, QK};
use crate::format::qmatrix::{GROUP, HALF};
use crate::isa::Isa;
use crate::pool::{SyncPtr, ThreadPool};
use crate::weight::{half_to_f32, Weight};

/// One single-form piece of a weight and the first output column it writes.
struct Piece<'a> {
    w: &'a Weight,
    off: usize,
}

fn pieces(w: &Weight) -> Vec<Piece<'_>> {
    match w {
        Weight::Stack(parts) => {
            let mut v = Vec::new();
            let mut off = 0;
            for p in parts {
                for mut q in pieces(p) {
                    q.off += off;
                    v.push(q);
                }
                off += p.rows();
            }
            v
        }
        w => vec![Piece { w, off: 0 }],
    }
}

/// `out[t·N + r] = Σ_c W[r, c] · x[t·K + c]` for `tokens` rows of `x` (`W`: `[N × K]`), on the
/// pool by blocks of output rows (every piece of a [`Weight::Stack`] in one fork-join).
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
    let ps = pieces(w);
    // NVFP4 runs its own tiled GEMM over the pool; inside a stack, through a buffer.
    if let [Piece { w: Weight::Nvfp4(m), .. }] = ps.as_slice() {
        return m.matmul(pool, isa, x, tokens, out);
    }
    // The activation forms the pieces need: per 32 for the 32-weight types, per 64 for the
    // K-quants.
    let per32 = ps.iter().any(|p| matches!(p.w, Weight::Quant(q) if !q.is_k()));
    let perk = ps.iter().any(|p| matches!(p.w, Weight::Quant(q) if q.is_k()));
    if per32 || perk {
        quantize_parallel(pool, x, tokens, k, xq, per32, perk);
        if isa == Isa::Amx && tokens >= AMX_MIN_TOKENS {
            xq.pack_tiles(per32, perk);
        }
    }
    // Tasks: row ranges of each piece, whole groups of 8 rows.
    let mut tasks: Vec<(usize, usize, usize)> = Vec::new();
    for (i, p) in ps.iter().enumerate() {
        if matches!(p.w, Weight::Nvfp4(_)) {
            continue;
        }
        let pn = p.w.rows();
        let rpt = rows_per_task(pool, pn);
        for r0 in (0..pn).step_by(rpt) {
            tasks.push((i, r0, (r0 + rpt).min(pn)));
        }
    }
    let ptr = SyncPtr(out.as_mut_ptr());
    let xq = &*xq;
    pool.run(tasks.len(), |ti| {
        let (i, r0, r1) = tasks[ti];
        let p = &ps[i];
        // SAFETY: piece `i`'s rows r0..r1 (output columns off + r0 .. off + r1) of every token
        // are written by this task only; the target features were detected at start-up.
        let base = unsafe { ptr.get().add(p.off) };
        match p.w {
            Weight::Quant(q) => unsafe { quant_rows(isa, q, r0, r1, xq, base, n) },
            Weight::Dense { data, .. } => unsafe { dense_rows(isa, Elems::F32(data), k, r0, r1, x, tokens, base, n) },
            Weight::Half { data, bf16, .. } => {
                let e = if *bf16 { Elems::Bf16(data) } else { Elems::F16(data) };
                unsafe { dense_rows(isa, e, k, r0, r1, x, tokens, base, n) }
            }
            Weight::Nvfp4(_) | Weight::Stack(_) => {}
        }
    });
    for p in &ps {
        if let Weight::Nvfp4(m) = p.w {
            let pn = m.rows;
            let mut tmp = vec![0f32; tokens * pn];
            m.matmul(pool, isa, x, tokens, &mut tmp);
            for t in 0..tokens {
                out[t * n + p.off..t * n + p.off + pn].copy_from_slice(&tmp[t * pn..(t + 1) * pn]);
            }
        }
    }
}

/// A dense matrix's elements as stored.
#[derive(Clone, Copy)]
enum Elems<'a> {
    F32(&'a [f32]),
    F16(&'a [u16]),
    Bf16(&'a [u16]),
}

impl Elems<'_> {
    fn get(&self, i: usize) -> f32 {
        match self {
            Elems::F32(d) => d[i],
            Elems::F16(d) => half_to_f32(d[i], false),
            Elems::Bf16(d) => half_to_f32(d[i], true),
        }
    }
}

/// Rows `r0..r1` of a dense matrix (`k` columns) for every token, to `out[t·ldo + r]`: the
/// tiled x86 kernel, or per (row, token) [`dot`] over the row widened to f32 (the same bits).
///
/// # Safety
/// `isa` is supported; outputs of rows `r0..r1` are written by this call only.
#[allow(clippy::too_many_arguments)]
unsafe fn dense_rows(
    isa: Isa,
    w: Elems<'_>,
    k: usize,
    r0: usize,
    r1: usize,
    x: &[f32],
    tokens: usize,
    out: *mut f32,
    ldo: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        match w {
            Elems::F32(d) => dense_x86::rows::<0>(d.as_ptr() as *const u8, k, r0, r1, x, tokens, out, ldo),
            Elems::F16(d) => dense_x86::rows::<1>(d.as_ptr() as *const u8, k, r0, r1, x, tokens, out, ldo),
            Elems::Bf16(d) => dense_x86::rows::<2>(d.as_ptr() as *const u8, k, r0, r1, x, tokens, out, ldo),
        }
        return;
    }
    let mut row = vec![0f32; k];
    for r in r0..r1 {
        for (c, v) in row.iter_mut().enumerate() {
            *v = w.get(r * k + c);
        }
        for t in 0..tokens {
            *out.add(t * ldo + r) = dot(isa, &row, &x[t * k..(t + 1) * k]);
        }
    }
}

/// One GEMM of [`matmul_grouped`]: `out = W · x` for `tokens` rows, shapes as [`matmul`]'s.
pub struct GemmJob<'a> {
    /// The weights, `[N × K]`.
    pub w: &'a Weight,
    /// The activations, `[tokens × K]`.
    pub x: &'a [f32],
    /// Rows of `x`.
    pub tokens: usize,
    /// The result, `[tokens × N]`.
    pub out: &'a mut [f32],
}

/// Independent GEMMs (a MoE layer's experts, each on its own tokens): every job's output equals
/// what [`matmul`] gives for it alone, and the jobs share fork-joins of the pool instead of one
/// (or two) each. NVFP4 jobs run in its grouped kernel (`Nvfp4Job`, tasks of equal work across
/// all of them); the GGML block types and dense/16-bit weights run in another: every job's
/// activations quantized once (one job per task), then one task list over every job's row
/// blocks, the largest first. A job over a stack with an NVFP4 part runs its own [`matmul`].
///
/// # Panics
/// As [`matmul`], for any job.
pub fn matmul_grouped(pool: &ThreadPool, isa: Isa, jobs: &mut [GemmJob<'_>], xq: &mut QActs) {
    let has_nvfp4 = |w: &Weight| pieces(w).iter().any(|p| matches!(p.w, Weight::Nvfp4(_)));
    let mut nv: Vec<super::nvfp4_gemm::Nvfp4Job<'_>> = Vec::with_capacity(jobs.len());
    let mut plain: Vec<&mut GemmJob<'_>> = Vec::with_capacity(jobs.len());
    for j in jobs.iter_mut() {
        assert_eq!(j.x.len(), j.tokens * j.w.cols(), "matmul_grouped: activations shape");
        assert_eq!(j.out.len(), j.tokens * j.w.rows(), "matmul_grouped: output shape");
        match j.w {
            Weight::Nvfp4(m) => {
                nv.push(super::nvfp4_gemm::Nvfp4Job { w: m, x: j.x, tokens: j.tokens, out: &mut *j.out })
            }
            w if has_nvfp4(w) => matmul(pool, isa, w, j.x, j.tokens, xq, j.out),
            _ if j.tokens == 0 => {}
            _ => plain.push(j),
        }
    }
    match plain.as_mut_slice() {
        [] => {}
        [j] => matmul(pool, isa, j.w, j.x, j.tokens, xq, j.out),
        many => grouped_plain(pool, isa, many),
    }
    super::nvfp4_gemm::matmul_grouped(pool, isa, &mut nv);
}

thread_local! {
    /// [`grouped_plain`]'s activation buffers, one per job, kept between calls.
    static GROUPED_XQ: std::cell::RefCell<Vec<QActs>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The forms of activations `w`'s pieces need: (per 32, per 64 for the K-quants).
fn act_forms(w: &Weight) -> (bool, bool) {
    let ps = pieces(w);
    let per32 = ps.iter().any(|p| matches!(p.w, Weight::Quant(q) if !q.is_k()));
    let perk = ps.iter().any(|p| matches!(p.w, Weight::Quant(q) if q.is_k()));
    (per32, perk)
}

/// [`matmul_grouped`] over jobs of GGML block types and dense/16-bit weights (no NVFP4, at
/// least one token each): two fork-joins for all of them.
fn grouped_plain(pool: &ThreadPool, isa: Isa, jobs: &mut [&mut GemmJob<'_>]) {
    GROUPED_XQ.with_borrow_mut(|xqs| {
        if xqs.len() < jobs.len() {
            xqs.resize_with(jobs.len(), QActs::default);
        }
        // Each job's activations, one job per task (a job's rows quantize as `matmul` would
        // quantize them: the same blocks, the same bits).
        let xp = SyncPtr(xqs.as_mut_ptr());
        let jobs_ref = &*jobs;
        pool.run(jobs.len(), |i| {
            let j = &jobs_ref[i];
            let (per32, perk) = act_forms(j.w);
            if !(per32 || perk) {
                return;
            }
            // SAFETY: task i alone touches element i of `xqs`, which outlives the call.
            let xq = unsafe { &mut *xp.get().add(i) };
            quantize_serial(j.x, j.tokens, j.w.cols(), xq, per32, perk);
            if isa == Isa::Amx && j.tokens >= AMX_MIN_TOKENS {
                xq.pack_tiles(per32, perk);
            }
        });
        // Tasks of about equal work over every job's pieces, whole groups of rows.
        let pieces: Vec<Vec<Piece<'_>>> = jobs.iter().map(|j| pieces(j.w)).collect();
        let cost = |i: usize| (jobs[i].tokens * jobs[i].w.cols()).max(1);
        let total: usize = (0..jobs.len()).map(|i| cost(i) * jobs[i].w.rows()).sum();
        let target = (total / (pool.threads() * super::TASKS_PER_THREAD).max(1)).max(1);
        let mut tasks: Vec<(usize, usize, usize, usize)> = Vec::new();
        for (i, ps) in pieces.iter().enumerate() {
            let per = (target / cost(i)).next_multiple_of(GROUP).max(GROUP);
            for (pi, p) in ps.iter().enumerate() {
                let pn = p.w.rows();
                tasks.extend((0..pn).step_by(per).map(|r0| (i, pi, r0, (r0 + per).min(pn))));
            }
        }
        tasks.sort_by_key(|&(i, _, r0, r1)| std::cmp::Reverse(cost(i) * (r1 - r0)));
        let outs: Vec<SyncPtr<f32>> = jobs.iter_mut().map(|j| SyncPtr(j.out.as_mut_ptr())).collect();
        let (jobs, xqs) = (&*jobs, &*xqs);
        pool.run(tasks.len(), |t| {
            let (i, pi, r0, r1) = tasks[t];
            let (j, p) = (&jobs[i], &pieces[i][pi]);
            let (n, k) = (j.w.rows(), j.w.cols());
            // SAFETY: job i's piece pi rows r0..r1 (output columns off + r0 .. off + r1 of each
            // of its tokens) are written by this task only; the target features were detected
            // at start-up.
            let base = unsafe { outs[i].get().add(p.off) };
            match p.w {
                Weight::Quant(q) => unsafe { quant_rows(isa, q, r0, r1, &xqs[i], base, n) },
                Weight::Dense { data, .. } => unsafe {
                    dense_rows(isa, Elems::F32(data), k, r0, r1, j.x, j.tokens, base, n)
                },
                Weight::Half { data, bf16, .. } => {
                    let e = if *bf16 { Elems::Bf16(data) } else { Elems::F16(data) };
                    unsafe { dense_rows(isa, e, k, r0, r1, j.x, j.tokens, base, n) }
                }
                Weight::Nvfp4(_) | Weight::Stack(_) => {}
            }
        });
    });
}

/// The dense f32 product in register tiles of 4 rows × 3 tokens, then 4 rows × 2 for two
/// tokens left and 8 rows × 1 for an odd last token, each output computed exactly as [`dot`]
/// computes it on AVX2 (8 lanes of FMAs over `k`, the `hsum` tree, then the tail `k mod 8` in
/// order), so the result is the same bits as the per-(row, token) `dot` loop it replaces; a
/// tile's accumulators are reduced 8 at a time (`hsum8`).
#[cfg(target_arch = "x86_64")]
mod dense_x86 {
    use crate::kernels::hsum8;
    use std::arch::x86_64::*;

    /// 8 weights from element `i` on: f32 (`E = 0`), f16 (1) or bf16 (2), widened exactly.
    #[inline(always)]
    unsafe fn ld<const E: u8>(wp: *const u8, i: usize) -> __m256 {
        match E {
            0 => _mm256_loadu_ps((wp as *const f32).add(i)),
            1 => _mm256_cvtph_ps(_mm_loadu_si128((wp as *const u16).add(i) as *const __m128i)),
            _ => _mm256_castsi256_ps(_mm256_slli_epi32(
                _mm256_cvtepu16_epi32(_mm_loadu_si128((wp as *const u16).add(i) as *const __m128i)),
                16,
            )),
        }
    }

    /// One weight, widened exactly.
    #[inline(always)]
    unsafe fn el<const E: u8>(wp: *const u8, i: usize) -> f32 {
        match E {
            0 => *(wp as *const f32).add(i),
            _ => crate::weight::half_to_f32(*(wp as *const u16).add(i), E == 2),
        }
    }

    /// Tokens per block: their activations stay in L1/L2 while the task's rows pass over them.
    const TOKEN_BLOCK: usize = 32;
    /// A task's weights past this size come from memory, not cache.
    const STREAM_BYTES: usize = 1 << 20;

    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn rows<const E: u8>(
        wp: *const u8,
        k: usize,
        r0: usize,
        r1: usize,
        x: &[f32],
        tokens: usize,
        op: *mut f32,
        n: usize,
    ) {
        assert!(x.len() >= tokens * k);
        let xp = x.as_ptr();
        let k8 = k / 8 * 8;
        for t0 in (0..tokens).step_by(TOKEN_BLOCK) {
            let t1 = (t0 + TOKEN_BLOCK).min(tokens);
            // Token triples (4 rows × 3 tokens, 12 accumulators: 7 loads per 12 FMAs), then a
            // pair if two are left, then the odd token.
            let trip_end = t0 + (t1 - t0) / 3 * 3;
            let pairs_end = trip_end + (t1 - trip_end) / 2 * 2;
            let mut r = r0;
            while r < r1 {
                let rn = (r1 - r).min(4);
                for t in (t0..trip_end).step_by(3) {
                    let mut acc = [[_mm256_setzero_ps(); 3]; 4];
                    let mut c = 0;
                    while c < k8 {
                        let xv = [
                            _mm256_loadu_ps(xp.add(t * k + c)),
                            _mm256_loadu_ps(xp.add((t + 1) * k + c)),
                            _mm256_loadu_ps(xp.add((t + 2) * k + c)),
                        ];
                        for (i, a) in acc.iter_mut().enumerate() {
                            let wv = ld::<E>(wp, (r + i.min(rn - 1)) * k + c);
                            a[0] = _mm256_fmadd_ps(wv, xv[0], a[0]);
                            a[1] = _mm256_fmadd_ps(wv, xv[1], a[1]);
                            a[2] = _mm256_fmadd_ps(wv, xv[2], a[2]);
                        }
                        c += 8;
                    }
                    // (row i, token j) is accumulator f = 3i + j: lane LANE[f] of the first
                    // reduction for f < 8, lane LANE[f − 8] of the second after.
                    const LANE: [usize; 8] = [0, 4, 1, 5, 2, 6, 3, 7];
                    let z = _mm256_setzero_ps();
                    let (mut s1, mut s2) = ([0f32; 8], [0f32; 8]);
                    let g1 = [acc[0][0], acc[0][1], acc[0][2], acc[1][0], acc[1][1], acc[1][2], acc[2][0], acc[2][1]];
                    _mm256_storeu_ps(s1.as_mut_ptr(), hsum8(&g1));
                    _mm256_storeu_ps(s2.as_mut_ptr(), hsum8(&[acc[2][2], acc[3][0], acc[3][1], acc[3][2], z, z, z, z]));
                    for i in 0..rn {
                        for j in 0..3 {
                            let f = 3 * i + j;
                            let v = if f < 8 { s1[LANE[f]] } else { s2[LANE[f - 8]] };
                            store::<E>(wp, xp, k, k8, r + i, t + j, v, op, n);
                        }
                    }
                }
                for t in (trip_end..pairs_end).step_by(2) {
                    let mut acc = [_mm256_setzero_ps(); 8];
                    let mut c = 0;
                    while c < k8 {
                        let xv = [_mm256_loadu_ps(xp.add(t * k + c)), _mm256_loadu_ps(xp.add((t + 1) * k + c))];
                        for i in 0..4 {
                            let wv = ld::<E>(wp, (r + i.min(rn - 1)) * k + c);
                            acc[2 * i] = _mm256_fmadd_ps(wv, xv[0], acc[2 * i]);
                            acc[2 * i + 1] = _mm256_fmadd_ps(wv, xv[1], acc[2 * i + 1]);
                        }
                        c += 8;
                    }
                    // Lanes: (row i, token 0) at i, (row i, token 1) at 4 + i.
                    let mut sums = [0f32; 8];
                    _mm256_storeu_ps(sums.as_mut_ptr(), hsum8(&acc));
                    for i in 0..rn {
                        for j in 0..2 {
                            store::<E>(wp, xp, k, k8, r + i, t + j, sums[4 * j + i], op, n);
                        }
                    }
                }
                r += rn;
            }
            if pairs_end < t1 && (r1 - r0) * k * if E == 0 { 4 } else { 2 } > STREAM_BYTES {
                // The odd token against many rows (an LM head: 50 MB at 49k × 256): rows one
                // after another, a sequential stream the prefetcher follows; reading 8 rows at
                // once made such a GEMV 1.5× slower.
                let t = pairs_end;
                for r in r0..r1 {
                    let mut acc = _mm256_setzero_ps();
                    let mut c = 0;
                    while c < k8 {
                        acc = _mm256_fmadd_ps(ld::<E>(wp, r * k + c), _mm256_loadu_ps(xp.add(t * k + c)), acc);
                        c += 8;
                    }
                    store::<E>(wp, xp, k, k8, r, t, crate::kernels::hsum(acc), op, n);
                }
            } else if pairs_end < t1 {
                // The odd token: 8 rows × 1 token per tile, no duplicated work (a lone token
                // is a DECODE step's GEMV).
                let t = pairs_end;
                let mut r = r0;
                while r < r1 {
                    let rn = (r1 - r).min(8);
                    let mut acc = [_mm256_setzero_ps(); 8];
                    let mut c = 0;
                    while c < k8 {
                        let xv = _mm256_loadu_ps(xp.add(t * k + c));
                        for (i, a) in acc.iter_mut().enumerate() {
                            let wv = ld::<E>(wp, (r + i.min(rn - 1)) * k + c);
                            *a = _mm256_fmadd_ps(wv, xv, *a);
                        }
                        c += 8;
                    }
                    // Lane of row i: [0, 4, 1, 5, 2, 6, 3, 7][i].
                    let mut sums = [0f32; 8];
                    _mm256_storeu_ps(sums.as_mut_ptr(), hsum8(&acc));
                    for i in 0..rn {
                        store::<E>(wp, xp, k, k8, r + i, t, sums[[0, 4, 1, 5, 2, 6, 3, 7][i]], op, n);
                    }
                    r += rn;
                }
            }
        }
    }

    /// Adds the tail `k mod 8` of (row, token) to its reduced lanes, in order, and stores it.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn store<const E: u8>(
        wp: *const u8,
        xp: *const f32,
        k: usize,
        k8: usize,
        row: usize,
        t: usize,
        sum: f32,
        op: *mut f32,
        n: usize,
    ) {
        let xr = xp.add(t * k);
        let mut s = sum;
        for e in k8..k {
            s += el::<E>(wp, row * k + e) * *xr.add(e);
        }
        *op.add(t * n + row) = s;
    }
}

/// Quantizes activations on the calling thread into the forms asked for (the blocks and bits
/// [`quantize_parallel`] gives).
fn quantize_serial(x: &[f32], rows: usize, cols: usize, xq: &mut QActs, per32: bool, perk: bool) {
    use crate::format::acts::{quantize_k_blocks, QKA};
    use crate::format::ggml::quantize_blocks;
    if per32 {
        xq.resize(rows, cols);
        quantize_blocks(x, &mut xq.q, &mut xq.d, &mut xq.s, 0, rows * cols / QK);
    }
    if perk {
        xq.resize_k(rows, cols);
        quantize_k_blocks(x, &mut xq.qk, &mut xq.dk, &mut xq.bk, &mut xq.bp, 0, rows * cols / QKA);
    }
}

/// Quantizes activations on the pool into the forms asked for, a run of whole blocks per task.
fn quantize_parallel(pool: &ThreadPool, x: &[f32], rows: usize, cols: usize, xq: &mut QActs, per32: bool, perk: bool) {
    use crate::format::acts::{quantize_k_blocks, QKA};
    use crate::format::ggml::quantize_blocks;
    if per32 {
        xq.resize(rows, cols);
    }
    if perk {
        xq.resize_k(rows, cols);
    }
    let (n32, nk) = (if per32 { rows * cols / QK } else { 0 }, if perk { rows * cols / QKA } else { 0 });
    if n32 + 2 * nk < 256 {
        return quantize_serial(x, rows, cols, xq, per32, perk);
    }
    let tasks = pool.threads() * 2;
    let (qp, dp, sp) = (SyncPtr(xq.q.as_mut_ptr()), SyncPtr(xq.d.as_mut_ptr()), SyncPtr(xq.s.as_mut_ptr()));
    let (qkp, dkp, bkp) = (SyncPtr(xq.qk.as_mut_ptr()), SyncPtr(xq.dk.as_mut_ptr()), SyncPtr(xq.bk.as_mut_ptr()));
    let bpp = SyncPtr(xq.bp.as_mut_ptr());
    pool.run(tasks, |i| {
        if per32 {
            let per = n32.div_ceil(tasks);
            let (b0, b1) = ((i * per).min(n32), ((i + 1) * per).min(n32));
            // SAFETY: task i owns blocks b0..b1 of every per-32 buffer; they outlive the call.
            let (q, d, s) = unsafe {
                (
                    std::slice::from_raw_parts_mut(qp.get().add(b0 * QK), (b1 - b0) * QK),
                    std::slice::from_raw_parts_mut(dp.get().add(b0), b1 - b0),
                    std::slice::from_raw_parts_mut(sp.get().add(b0), b1 - b0),
                )
            };
            quantize_blocks(&x[b0 * QK..b1 * QK], q, d, s, 0, b1 - b0);
        }
        if perk {
            let per = nk.div_ceil(tasks);
            let (b0, b1) = ((i * per).min(nk), ((i + 1) * per).min(nk));
            // SAFETY: task i owns 64-blocks b0..b1 of every per-64 buffer.
            let (q, d, bs, bp) = unsafe {
                (
                    std::slice::from_raw_parts_mut(qkp.get().add(b0 * QKA), (b1 - b0) * QKA),
                    std::slice::from_raw_parts_mut(dkp.get().add(b0), b1 - b0),
                    std::slice::from_raw_parts_mut(bkp.get().add(4 * b0), 4 * (b1 - b0)),
                    std::slice::from_raw_parts_mut(bpp.get().add(4 * b0), 4 * (b1 - b0)),
                )
            };
            quantize_k_blocks(&x[b0 * QKA..b1 * QKA], q, d, bs, bp, 0, b1 - b0);
        }
    });
}

/// Tokens from which the AMX path runs a matmul of type `ty` (below, the 512-bit VNNI kernel is
/// faster: the tiles' fixed costs, unpacking and stores, are not yet paid back). Measured one
/// thread, 2048 × 2048 (`qmm` example): AMX and VNNI break even at about 16 tokens for the
/// 32-weight types and Q4_K, 64 for Q6_K's five planes.
fn amx_min_tokens(ty: crate::format::ggml::GgmlType) -> usize {
    if ty == crate::format::ggml::GgmlType::Q6_K {
        48
    } else {
        24
    }
}

/// The fewest tokens any type runs on AMX with (activations are packed for the tiles from here).
const AMX_MIN_TOKENS: usize = 24;

/// Rows `r0..r1` of `w` (`r0` a multiple of 16) for every token of `x`, to `out[t·ldo + r]`.
///
/// # Safety
/// `isa` must be supported by the CPU; those outputs must not be accessed by anyone else
/// during the call.
unsafe fn quant_rows(isa: Isa, w: &QMatrix, r0: usize, r1: usize, x: &QActs, out: *mut f32, ldo: usize) {
    debug_assert!(r0.is_multiple_of(GROUP));
    // The 512-bit kernel takes whole groups of 16 rows, the 256-bit ones whole halves of 8; the
    // rows past them (a matrix whose rows are not whole groups) are scalar.
    let unit = if isa.avx512() { GROUP } else { HALF };
    let r_simd = r0 + (r1 - r0) / unit * unit;
    let (u0, u1) = (r0 / unit, r_simd / unit);
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Amx if x.rows >= amx_min_tokens(w.ty) => super::amx::quant_rows(w, u0, u1, x, out, ldo),
        #[cfg(target_arch = "x86_64")]
        Isa::Amx | Isa::Vnni => super::q8_avx512::quant_rows(w, u0, u1, x, out, ldo),
        #[cfg(target_arch = "x86_64")]
        Isa::AvxVnni => super::q8_x86::quant_rows_avxvnni(w, u0, u1, x, out, ldo),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => super::q8_x86::quant_rows_avx2(w, u0, u1, x, out, ldo),
        _ => quant_rows_scalar(w, r0, r_simd, x, out, ldo),
    }
    quant_rows_scalar(w, r_simd, r1, x, out, ldo);
}

/// [`QMatrix::dot`] for one weight row against one token: the definition every path computes.
pub fn quant_dot_scalar(w: &QMatrix, r: usize, x: &QActs, t: usize) -> f32 {
    w.dot(r, x, t)
}

/// # Safety
/// As [`quant_rows`].
unsafe fn quant_rows_scalar(w: &QMatrix, r0: usize, r1: usize, x: &QActs, out: *mut f32, ldo: usize) {
    for r in r0..r1 {
        for t in 0..x.rows {
            *out.add(t * ldo + r) = w.dot(r, x, t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::ggml::GgmlType;

    fn lcg(seed: &mut u64) -> u32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (*seed >> 33) as u32
    }

    fn random_matrix(ty: GgmlType, rows: usize, cols: usize, seed: &mut u64) -> QMatrix {
        let raw = crate::format::ggml::random_blocks(ty, rows * cols, &mut || lcg(seed));
        QMatrix::from_ggml(ty, &raw, rows, cols)
    }

    /// A grouped call gives every job the bits its own `matmul` gives: NVFP4 jobs of 1, 5, 6,
    /// 37 and 0 tokens (the per-row, tiled and partial-tile paths) with row counts that are not
    /// multiples of the task blocks, and a mixed group (NVFP4 beside dense) that runs job by job.
    #[test]
    fn grouped_matmul_equals_each_job_alone() {
        use crate::format::nvfp4::Nvfp4Matrix;
        let pool = ThreadPool::new(2).expect("pool");
        let mut seed = 23u64;
        let mut rnd = || crate::kernels::test_rand(&mut seed);
        let shapes = [(21usize, 64usize, 1usize), (256, 128, 37), (8, 32, 5), (45, 48, 6), (16, 16, 0), (130, 256, 13)];
        let mut ws: Vec<Weight> = Vec::new();
        for &(n, k, _) in &shapes {
            let w: Vec<f32> = (0..n * k).map(|_| rnd()).collect();
            ws.push(Weight::Nvfp4(Nvfp4Matrix::quantize(&w, n, k)));
        }
        ws.push(Weight::Dense { rows: 9, cols: 16, data: (0..144).map(|_| rnd()).collect() });
        let mut xs: Vec<Vec<f32>> = Vec::new();
        for &(_, k, t) in shapes.iter().chain([&(9, 16, 3)]) {
            xs.push((0..t * k).map(|_| rnd()).collect());
        }
        let toks: Vec<usize> = shapes.iter().map(|s| s.2).chain([3]).collect();
        for isa in Isa::available() {
            for group in [shapes.len(), ws.len()] {
                assert_grouped_equals_alone(&pool, isa, &ws[..group], &xs, &toks);
            }
        }
    }

    /// `matmul_grouped` over the jobs `(ws[i], xs[i], toks[i])` gives each the bits its own
    /// `matmul` gives.
    fn assert_grouped_equals_alone(pool: &ThreadPool, isa: Isa, ws: &[Weight], xs: &[Vec<f32>], toks: &[usize]) {
        let want: Vec<Vec<f32>> = ws
            .iter()
            .zip(xs)
            .zip(toks)
            .map(|((w, x), &t)| {
                let mut o = vec![0f32; t * w.rows()];
                matmul(pool, isa, w, x, t, &mut QActs::default(), &mut o);
                o
            })
            .collect();
        let mut outs: Vec<Vec<f32>> = ws.iter().zip(toks).map(|(w, &t)| vec![f32::NAN; t * w.rows()]).collect();
        let mut jobs: Vec<GemmJob<'_>> = outs
            .iter_mut()
            .enumerate()
            .map(|(i, o)| GemmJob { w: &ws[i], x: &xs[i], tokens: toks[i], out: o })
            .collect();
        matmul_grouped(pool, isa, &mut jobs, &mut QActs::default());
        for (i, o) in outs.iter().enumerate() {
            assert!(o.iter().zip(&want[i]).all(|(a, b)| a.to_bits() == b.to_bits()), "{isa:?} job {i} of {}", ws.len());
        }
    }

    /// A grouped call over the GGML block types, a stack of two of them and dense weights (the
    /// MoE experts of a GGUF file) gives every job the bits its own `matmul` gives: 1, 5, 37
    /// (the AMX threshold) and 0 tokens, K-quants beside 32-weight types, rows that are not
    /// whole task blocks, on every ISA this CPU has.
    #[test]
    fn grouped_quant_matmul_equals_each_job_alone() {
        use crate::format::ggml::GgmlType;
        let pool = ThreadPool::new(2).expect("pool");
        let mut seed = 41u64;
        let k = 256;
        let stack = Weight::stack(vec![
            Weight::Quant(random_matrix(GgmlType::Q4_K, 32, k, &mut seed)),
            Weight::Quant(random_matrix(GgmlType::Q8_0, 16, k, &mut seed)),
        ]);
        let mut rnd_seed = 5u64;
        let mut rnd = || crate::kernels::test_rand(&mut rnd_seed);
        let ws: Vec<Weight> = vec![
            Weight::Quant(random_matrix(GgmlType::Q4_K, 256, k, &mut seed)),
            Weight::Quant(random_matrix(GgmlType::Q8_0, 64, k, &mut seed)),
            Weight::Quant(random_matrix(GgmlType::Q6_K, 48, k, &mut seed)),
            stack,
            Weight::Quant(random_matrix(GgmlType::Q5_0, 40, k, &mut seed)),
            Weight::Dense { rows: 9, cols: k, data: (0..9 * k).map(|_| rnd()).collect() },
        ];
        let toks = [5usize, 1, 37, 3, 0, 2];
        let xs: Vec<Vec<f32>> = toks.iter().map(|&t| (0..t * k).map(|_| rnd()).collect()).collect();
        for isa in Isa::available() {
            assert_grouped_equals_alone(&pool, isa, &ws, &xs, &toks);
        }
    }

    /// The tiled dense product gives, for every (row, token), the bits of `dot` over the row
    /// widened to f32, on the same ISA, for f32, f16 and bf16 weights: odd row counts (4-row
    /// tiles and a tail), odd token counts, `k` with a tail past the last 8-lane chunk, token
    /// blocks, and a matrix large enough for the streaming GEMV path.
    #[test]
    fn dense_matmul_equals_dot_per_output() {
        let pool = ThreadPool::new(2).expect("pool");
        let mut seed = 11u64;
        let mut rnd = || crate::kernels::test_rand(&mut seed);
        // The last: 1.5 MB of weights per task, so an odd token takes the streaming path.
        for (n, k, tokens) in [(45usize, 100usize, 37usize), (8, 64, 1), (3, 13, 70), (40_000, 76, 3)] {
            let data: Vec<f32> = (0..n * k).map(|_| rnd()).collect();
            let x: Vec<f32> = (0..tokens * k).map(|_| rnd()).collect();
            let f16: Vec<u16> = data.iter().map(|&v| crate::half::f32_to_f16(v)).collect();
            let bf16: Vec<u16> = data.iter().map(|&v| (v.to_bits() >> 16) as u16).collect();
            let forms = [
                Weight::Dense { rows: n, cols: k, data: data.clone() },
                Weight::Half { rows: n, cols: k, data: f16, bf16: false },
                Weight::Half { rows: n, cols: k, data: bf16, bf16: true },
            ];
            for w in &forms {
                let mut wr = vec![0f32; k];
                for isa in Isa::available() {
                    let mut out = vec![0f32; tokens * n];
                    matmul(&pool, isa, w, &x, tokens, &mut QActs::default(), &mut out);
                    for r in 0..n {
                        w.row_f32(r, &mut wr);
                        for t in 0..tokens {
                            let want = dot(isa, &wr, &x[t * k..(t + 1) * k]);
                            let kind = w.kind();
                            assert_eq!(
                                out[t * n + r].to_bits(),
                                want.to_bits(),
                                "{kind} {isa:?} [{n}x{k}] token {t} row {r}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Runs `tokens` rows of `x` through `w` (a `Weight::Quant`) on `isa` into `out`, and
    /// asserts every (row, token) has the bits of its single-token run and of the scalar
    /// definition ([`quant_dot_scalar`] on the activations `xq` the batch quantized).
    fn assert_bits_of_definition(
        pool: &ThreadPool,
        isa: Isa,
        w: &Weight,
        x: &[f32],
        tokens: usize,
        xq: &mut QActs,
        out: &mut [f32],
    ) {
        let Weight::Quant(q) = w else { panic!("a quantized matrix") };
        let (n, k, ty) = (q.rows, q.cols, q.ty);
        matmul(pool, isa, w, x, tokens, xq, out);
        for t in 0..tokens {
            let mut one = vec![0f32; n];
            matmul(pool, isa, w, &x[t * k..(t + 1) * k], 1, &mut QActs::default(), &mut one);
            for r in 0..n {
                assert_eq!(
                    out[t * n + r].to_bits(),
                    one[r].to_bits(),
                    "{ty:?} {isa:?} row {r} token {t}: batch invariance"
                );
                let refv = quant_dot_scalar(q, r, xq, t);
                assert_eq!(out[t * n + r].to_bits(), refv.to_bits(), "{ty:?} {isa:?} row {r} token {t} of {tokens}");
            }
        }
    }

    /// The SIMD kernels of every block type agree with the scalar definition bit for bit, and
    /// with a plain f32 product of the dequantized matrices within quantization error; every
    /// token row is identical whatever the batch size.
    #[test]
    fn quant_matmul_matches_reference_and_is_batch_invariant() {
        let pool = ThreadPool::new(2).expect("pool");
        let mut seed = 7u64;
        // 45 rows: single groups, 8-row halves and a scalar tail of 5 rows; 300 rows: tasks of
        // several groups (the AMX path's group pairs), and a tail of 12.
        for (ty, n) in crate::format::ggml::BLOCK_TYPES.into_iter().flat_map(|t| [(t, 45), (t, 300)]) {
            // K-quants need whole 256-weight super-blocks.
            let k = if ty.block_len() == 256 { 512 } else { 96 };
            let w = Weight::Quant(random_matrix(ty, n, k, &mut seed));
            let Weight::Quant(q) = &w else { unreachable!() };
            // 30 and up: the AMX path of the 32-weight types and Q4_K/Q5_K; 50: Q6_K's.
            let counts: &[usize] = if n == 45 { &[1, 3, 4, 8, 9, 17, 30] } else { &[1, 16, 33, 50] };
            for &tokens in counts {
                let x: Vec<f32> = (0..tokens * k).map(|_| (lcg(&mut seed) % 2001) as f32 / 1000.0 - 1.0).collect();
                let mut xq = QActs::default();
                let mut out = vec![0f32; tokens * n];
                // Every path this CPU has; the others are tested where they run.
                for isa in Isa::available() {
                    assert_bits_of_definition(&pool, isa, &w, &x, tokens, &mut xq, &mut out);
                    let mut wr = vec![0f32; k];
                    for t in 0..tokens {
                        for r in 0..n {
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

    /// Batches over tasks larger than one L2 chunk of row groups (`kernels::l2_groups`):
    /// several chunks per task, each passed over several token blocks, a chunk boundary inside
    /// a task and a tail of 8 rows; every row still has the scalar definition's bits and those
    /// of its single-token run.
    #[test]
    fn l2_chunked_batches_keep_every_rows_bits() {
        let mut seed = 21u64;
        let k = 4096;
        for (ty, n) in [(GgmlType::Q4_0, 1128), (GgmlType::Q6_K, 648)] {
            let q = random_matrix(ty, n, k, &mut seed);
            // Four tasks per thread: each must span at least two chunks.
            assert!(
                n / 4 > 2 * 16 * crate::kernels::l2_groups(&q),
                "{ty:?}: {} groups per chunk",
                crate::kernels::l2_groups(&q)
            );
            let w = Weight::Quant(q);
            let tokens = 9;
            let x: Vec<f32> = (0..tokens * k).map(|_| (lcg(&mut seed) % 2001) as f32 / 1000.0 - 1.0).collect();
            for threads in [1, 2] {
                let pool = ThreadPool::new(threads).expect("pool");
                for isa in Isa::available() {
                    assert_bits_of_definition(
                        &pool,
                        isa,
                        &w,
                        &x,
                        tokens,
                        &mut QActs::default(),
                        &mut vec![0f32; tokens * n],
                    );
                }
            }
        }
    }

    /// A stack of different forms (Q4_K, Q6_K, F16 and Q8_0 parts, as a Q4_K_M file's fused
    /// QKV mixes them) gives each part's rows exactly what the part alone gives.
    #[test]
    fn stacked_parts_equal_each_part_alone() {
        let pool = ThreadPool::new(2).expect("pool");
        let mut seed = 99u64;
        let k = 256;
        let mut parts = vec![
            Weight::Quant(random_matrix(GgmlType::Q4_K, 24, k, &mut seed)),
            Weight::Quant(random_matrix(GgmlType::Q6_K, 16, k, &mut seed)),
        ];
        let mut rnd = || crate::kernels::test_rand(&mut seed);
        parts.push(Weight::Half {
            rows: 5,
            cols: k,
            data: (0..5 * k).map(|_| crate::half::f32_to_f16(rnd())).collect(),
            bf16: false,
        });
        parts.push(Weight::Quant(random_matrix(GgmlType::Q8_0, 11, k, &mut 5u64)));
        let w = Weight::stack(parts.clone());
        assert!(matches!(&w, Weight::Stack(p) if p.len() == 4), "{:?}", w.kind());
        assert_eq!(w.kind(), "mixed");
        let n = w.rows();
        for tokens in [1usize, 6] {
            let x: Vec<f32> = (0..tokens * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect();
            for isa in Isa::available() {
                let mut out = vec![0f32; tokens * n];
                matmul(&pool, isa, &w, &x, tokens, &mut QActs::default(), &mut out);
                let mut off = 0;
                for p in &parts {
                    let pn = p.rows();
                    let mut alone = vec![0f32; tokens * pn];
                    matmul(&pool, isa, p, &x, tokens, &mut QActs::default(), &mut alone);
                    for t in 0..tokens {
                        for r in 0..pn {
                            assert_eq!(
                                out[t * n + off + r].to_bits(),
                                alone[t * pn + r].to_bits(),
                                "{} {isa:?}",
                                p.kind()
                            );
                        }
                    }
                    off += pn;
                }
            }
        }
    }

    /// The largest sums the i16 partial sums of the AVX2 path can meet (every code at its
    /// maximum, every activation at ±127, the largest sub-block scales) are still exact on every
    /// path: the result equals the scalar definition and the f64 product of the dequantized
    /// weights.
    #[test]
    fn extreme_codes_do_not_saturate() {
        let pool = ThreadPool::new(2).expect("pool");
        let tokens = 16;
        for ty in crate::format::ggml::BLOCK_TYPES {
            let (n, k) = (16, 2 * ty.block_len().max(64));
            let bb = ty.bytes_for(ty.block_len());
            let mut raw = vec![0xffu8; ty.bytes_for(n * k)];
            // d = 1/64 (f16 0x2400), so sums stay moderate; Q4_1/Q5_1 m 0; K-quant dmin 1/64
            // too, so the min terms (6-bit mins 63 against 32-value sums ±32·127, the
            // `vpmaddwd` pairs) run at their largest.
            for blk in raw.chunks_exact_mut(bb) {
                let d_at = if ty == GgmlType::Q6_K { 208 } else { 0 };
                blk[d_at] = 0x00;
                blk[d_at + 1] = 0x24;
                if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
                    blk[2] = 0;
                    blk[3] = 0;
                }
                if matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K) {
                    blk[2] = 0x00;
                    blk[3] = 0x24;
                }
                if ty == GgmlType::Q8_0 {
                    blk[2..].iter_mut().for_each(|c| *c = 0x7f);
                }
                if ty == GgmlType::MXFP4 {
                    // E8M0 2^-6 (the scale is half the E8M0 value: 1/64), every nibble 0xf.
                    blk[0] = 122;
                    blk[1] = 0xff;
                }
                if ty == GgmlType::Q6_K {
                    // Scales 127 (the i8 maximum).
                    blk[192..208].iter_mut().for_each(|c| *c = 0x7f);
                }
            }
            let w = Weight::Quant(QMatrix::from_ggml(ty, &raw, n, k));
            let Weight::Quant(q) = &w else { unreachable!() };
            // Token t: +1 everywhere for even t, -1 for odd t (codes ±127, scale 1/127).
            let x: Vec<f32> = (0..tokens * k).map(|i| if (i / k) % 2 == 0 { 1.0 } else { -1.0 }).collect();
            let mut wr = vec![0f32; k];
            for isa in Isa::available() {
                let mut xq = QActs::default();
                let mut out = vec![0f32; tokens * n];
                matmul(&pool, isa, &w, &x, tokens, &mut xq, &mut out);
                for t in 0..tokens {
                    let sign = if t % 2 == 0 { 1.0 } else { -1.0 };
                    for r in 0..n {
                        let v = out[t * n + r];
                        assert_eq!(v.to_bits(), quant_dot_scalar(q, r, &xq, t).to_bits(), "{ty:?} {isa:?}");
                        q.dequantize_row(r, &mut wr);
                        let want = sign * wr.iter().map(|&v| v as f64).sum::<f64>();
                        assert!((v as f64 - want).abs() <= want.abs() * 1e-5, "{ty:?} {isa:?}: {v} vs {want}");
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
