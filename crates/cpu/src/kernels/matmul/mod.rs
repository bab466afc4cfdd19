//! Batched matrix multiplication over a [`Weight`]: the integer path over GGML block types
//! (activations quantized to 8 bits per 32-block, per 64 for the K-quants; the arithmetic is
//! [`QMatrix::dot`](crate::format::ggml::QMatrix::dot)), the NVFP4 path, the dense f32 path and
//! the dense 16-bit (F16/BF16) path.
//!
//! This file dispatches: [`matmul`] splits a weight (every part of a [`Weight::Stack`]) into
//! row tasks on the pool, [`matmul_grouped`] runs independent GEMMs (a MoE layer's experts) in
//! shared fork-joins. `quant` holds the integer path (activation quantization, the per-ISA
//! tiles, the scalar reference [`quant_dot_scalar`]), `dense` the f32 and F16/BF16 path.
#![allow(unsafe_code)]

mod dense;
mod quant;

pub use quant::quant_dot_scalar;

use super::rows_per_task;
use crate::format::ggml::QActs;
use crate::format::qmatrix::GROUP;
use crate::isa::Isa;
use crate::pool::{SyncPtr, ThreadPool};
use crate::weight::Weight;
use dense::{dense_rows, Elems};
use quant::{quant_rows, quantize_parallel, quantize_serial, AMX_MIN_TOKENS};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::ggml::{GgmlType, QMatrix};

    pub(super) fn lcg(seed: &mut u64) -> u32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (*seed >> 33) as u32
    }

    pub(super) fn random_matrix(ty: GgmlType, rows: usize, cols: usize, seed: &mut u64) -> QMatrix {
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
}
