//! The NVFP4 dequantizing GEMM: decodes 16 weights at a time and applies them to every token of
//! the batch while they are in registers (AVX2+FMA, and a scalar path with the same arithmetic).
#![allow(unsafe_code)]

use crate::format::nvfp4::{e2m1_to_f32, e4m3_to_f32, Nvfp4Matrix, BLOCK, E2M1};
use crate::isa::Isa;
use crate::pool::{SyncPtr, ThreadPool};

impl Nvfp4Matrix {
    /// `out[t·rows + r] = Σ_c W[r, c] · x[t·cols + c]` on the pool, decoding one 16-weight
    /// block at a time (the f32 weight matrix is never materialised) and applying it to every
    /// token while it is in registers.
    ///
    /// Exactly, per (row, token): eight f32 partial sums, lane `l` taking the weights whose
    /// column is `l` mod 8 in column order, each `w = e2m1 · (e4m3 · weight_scale_2)` and added
    /// with one fused multiply-add; the lanes are then summed as
    /// `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`. The SIMD and scalar paths both compute exactly
    /// this, so results do not depend on the instruction set or the batch.
    ///
    /// # Panics
    /// When `x.len() != tokens · cols` or `out.len() != tokens · rows`.
    pub fn matmul(&self, pool: &ThreadPool, isa: Isa, x: &[f32], tokens: usize, out: &mut [f32]) {
        self.check(x, tokens, out);
        let isa = usable(isa);
        let per = self.rows.div_ceil(pool.threads() * 4).max(1);
        let ptr = SyncPtr(out.as_mut_ptr());
        pool.run(self.rows.div_ceil(per), |i| {
            // SAFETY: rows i·per .. of every token belong to task i alone; `check` passed.
            unsafe { self.rows_into(isa, x, tokens, i * per, ((i + 1) * per).min(self.rows), ptr) }
        });
    }

    /// Panics unless `x` is `[tokens × cols]`, `out` `[tokens × rows]` and the matrix's fields
    /// (public) are consistent: what the SIMD paths rely on.
    fn check(&self, x: &[f32], tokens: usize, out: &[f32]) {
        assert_eq!(x.len(), tokens * self.cols, "nvfp4 matmul: activations shape");
        assert_eq!(out.len(), tokens * self.rows, "nvfp4 matmul: output shape");
        assert!(
            self.cols.is_multiple_of(BLOCK)
                && self.weight.len() == self.rows * self.cols / 2
                && self.weight_scale.len() == self.rows * self.cols / BLOCK
                && self.weight_scale_2.len() == self.rows,
            "nvfp4 matmul: inconsistent matrix [{}, {}]",
            self.rows,
            self.cols
        );
    }

    /// Output rows `r0..r1` of every token into `out` (`[tokens × rows]`).
    ///
    /// # Safety
    /// `out` points to `tokens · rows` writable f32 whose rows `r0..r1` nobody else touches
    /// meanwhile; `check` passed for these shapes.
    unsafe fn rows_into(&self, isa: Isa, x: &[f32], tokens: usize, r0: usize, r1: usize, ptr: SyncPtr<f32>) {
        #[cfg(target_arch = "x86_64")]
        if isa != Isa::Scalar {
            // Batches of TILE_T tokens or more go through the register-tiled kernel over a
            // decoded group of rows; smaller ones (decode) take the per-row kernel. Both do
            // the same FMAs per (row, token) in the same order.
            // A last partial tile runs as a tile with its last token repeated (from
            // TILE_T tokens on): only its real tokens are stored.
            let full = if tokens >= x86::TILE_T { tokens } else { 0 };
            let mut res = vec![0f32; tokens - full];
            let mut buf = Vec::new();
            for g0 in (r0..r1).step_by(x86::GROUP) {
                let g1 = (g0 + x86::GROUP).min(r1);
                if full > 0 {
                    // SAFETY: AVX2+FMA were detected; rows g0..g1 of every token belong to
                    // this task alone.
                    unsafe { x86::group_tiled(self, g0, g1, x, full, &mut buf, ptr, self.rows) };
                }
                if full < tokens {
                    for r in g0..g1 {
                        // SAFETY: as above.
                        unsafe { x86::row(self, r, &x[full * self.cols..], tokens - full, &mut res) };
                        for (t, v) in res.iter().enumerate() {
                            // SAFETY: element (full + t, r) belongs to this task.
                            unsafe { *ptr.get().add((full + t) * self.rows + r) = *v };
                        }
                    }
                }
            }
            return;
        }
        let _ = isa;
        let mut acc = vec![[0f32; 8]; tokens];
        let mut res = vec![0f32; tokens];
        for r in r0..r1 {
            self.row_scalar(r, x, tokens, &mut acc, &mut res);
            write_row(ptr, self.rows, r, &res);
        }
    }

    /// The definition (see [`Nvfp4Matrix::matmul`]) for row `r`, all tokens.
    fn row_scalar(&self, r: usize, x: &[f32], tokens: usize, acc: &mut [[f32; 8]], res: &mut [f32]) {
        acc.iter_mut().for_each(|a| *a = [0.0; 8]);
        for b in 0..self.cols / BLOCK {
            let scale = e4m3_to_f32(self.weight_scale[r * self.cols / BLOCK + b]) * self.weight_scale_2[r];
            let bytes = &self.weight[r * self.cols / 2 + b * BLOCK / 2..][..BLOCK / 2];
            let mut w = [0f32; BLOCK];
            for (j, byte) in bytes.iter().enumerate() {
                w[2 * j] = e2m1_to_f32(byte & 0xf) * scale;
                w[2 * j + 1] = e2m1_to_f32(byte >> 4) * scale;
            }
            for (t, a) in acc.iter_mut().enumerate().take(tokens) {
                let xs = &x[t * self.cols + b * BLOCK..][..BLOCK];
                for half in 0..2 {
                    for l in 0..8 {
                        a[l] = w[half * 8 + l].mul_add(xs[half * 8 + l], a[l]);
                    }
                }
            }
        }
        for (o, a) in res.iter_mut().zip(acc.iter()) {
            *o = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
        }
    }
}

/// One GEMM of [`matmul_grouped`]: `out = W · x` for `tokens` rows, as
/// [`Nvfp4Matrix::matmul`] takes them (`x`: `[tokens × cols]`, `out`: `[tokens × rows]`).
pub struct Nvfp4Job<'a> {
    /// The weights.
    pub w: &'a Nvfp4Matrix,
    /// The activations, `[tokens × w.cols]`.
    pub x: &'a [f32],
    /// Rows of `x`.
    pub tokens: usize,
    /// The result, `[tokens × w.rows]`.
    pub out: &'a mut [f32],
}

/// Several independent NVFP4 GEMMs (a MoE layer's experts, each on the tokens routed to it) in
/// one fork-join of the pool: their row blocks are tasks of about equal work, longest first,
/// so that no expert's small GEMM leaves a core idle and the layer pays one barrier instead of
/// one per expert (CUTLASS's and SGLang's grouped/fused MoE GEMM, here on CPU cores).
/// Every (row, token) is computed exactly as [`Nvfp4Matrix::matmul`] computes it.
///
/// # Panics
/// As [`Nvfp4Matrix::matmul`], for any job.
pub fn matmul_grouped(pool: &ThreadPool, isa: Isa, jobs: &mut [Nvfp4Job<'_>]) {
    for j in jobs.iter() {
        j.w.check(j.x, j.tokens, j.out);
    }
    let isa = usable(isa);
    // At least 1, so that an empty job (0 columns) cannot divide by zero below.
    let cost = |j: &Nvfp4Job<'_>| (j.tokens * j.w.cols).max(1);
    let total: usize = jobs.iter().map(|j| cost(j) * j.w.rows).sum();
    // About 8 tasks per thread; whole groups of decoded rows each.
    let target = (total / (pool.threads() * 8)).max(1);
    let mut tasks: Vec<(usize, usize, usize)> = Vec::new();
    for (i, j) in jobs.iter().enumerate() {
        let per = (target / cost(j)).div_ceil(GROUP).max(1) * GROUP;
        tasks.extend((0..j.w.rows).step_by(per).map(|r0| (i, r0, (r0 + per).min(j.w.rows))));
    }
    tasks.sort_by_key(|&(i, r0, r1)| std::cmp::Reverse(cost(&jobs[i]) * (r1 - r0)));
    let ptrs: Vec<SyncPtr<f32>> = jobs.iter_mut().map(|j| SyncPtr(j.out.as_mut_ptr())).collect();
    let jobs = &*jobs;
    pool.run(tasks.len(), |t| {
        let (i, r0, r1) = tasks[t];
        let j = &jobs[i];
        // SAFETY: the tasks of job i cover disjoint row ranges of its own output; `check`
        // passed above.
        unsafe { j.w.rows_into(isa, j.x, j.tokens, r0, r1, ptrs[i]) }
    });
}

/// A caller may name an ISA the CPU lacks; fall back rather than fault.
fn usable(isa: Isa) -> Isa {
    if isa != Isa::Scalar && Isa::detect() == Isa::Scalar {
        Isa::Scalar
    } else {
        isa
    }
}

#[cfg(target_arch = "x86_64")]
const GROUP: usize = x86::GROUP;
#[cfg(not(target_arch = "x86_64"))]
const GROUP: usize = 8;

fn write_row(out: SyncPtr<f32>, rows: usize, r: usize, res: &[f32]) {
    for (t, v) in res.iter().enumerate() {
        // SAFETY: element (t, r) belongs to the task that owns row r.
        #[allow(unsafe_code)]
        unsafe {
            *out.get().add(t * rows + r) = *v;
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    /// Rows decoded per group of the tiled kernel: 16 rows (16 KiB decoded at 256 columns)
    /// let each token block, fetched from L2, serve 8 row pairs; 8 rows served 4 and ran
    /// ~10 % slower at glm5-tiny's expert shapes (`nvfp4_shapes`, best of 6 interleaved runs).
    pub(super) const GROUP: usize = 16;
    /// Tokens per register tile.
    pub(super) const TILE_T: usize = 6;

    /// Decodes the 16 weights of block `b` of row `r` into two vectors (`w = e2m1 · scale`).
    #[inline(always)]
    unsafe fn decode_block(m: &Nvfp4Matrix, r: usize, b: usize, table: __m256) -> (__m256, __m256) {
        let seven = _mm256_set1_epi32(7);
        let eight = _mm256_set1_epi32(8);
        let nib = _mm_set1_epi8(0x0f);
        let scale = _mm256_set1_ps(e4m3_to_f32(m.weight_scale[r * m.cols / BLOCK + b]) * m.weight_scale_2[r]);
        let bytes = &m.weight[r * m.cols / 2 + b * BLOCK / 2..][..BLOCK / 2];
        let v = _mm_loadl_epi64(bytes.as_ptr() as *const __m128i);
        // Element 2j is byte j's low nibble, 2j+1 its high nibble: interleave them.
        let codes = _mm_unpacklo_epi8(_mm_and_si128(v, nib), _mm_and_si128(_mm_srli_epi16(v, 4), nib));
        let decode = |c: __m256i| {
            let mag = _mm256_permutevar8x32_ps(table, _mm256_and_si256(c, seven));
            let sign = _mm256_slli_epi32(_mm256_and_si256(c, eight), 28);
            _mm256_mul_ps(_mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(mag), sign)), scale)
        };
        (decode(_mm256_cvtepu8_epi32(codes)), decode(_mm256_cvtepu8_epi32(_mm_srli_si128(codes, 8))))
    }

    #[inline(always)]
    unsafe fn reduce(a: __m256) -> f32 {
        let lo = _mm256_castps256_ps128(a);
        let hi = _mm256_extractf128_ps(a, 1);
        let s = _mm_add_ps(lo, hi); // [l0+l4, l1+l5, l2+l6, l3+l7]
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s)); // [(l0+l4)+(l2+l6), (l1+l5)+(l3+l7), ..]
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    /// Rows `g0..g1` (at most [`GROUP`]) against `tokens ≥ TILE_T` tokens: the group is decoded
    /// once into `buf` (`GROUP × cols` f32: 16 KiB at glm5-tiny's 256 columns, in L1; larger
    /// `cols` spill it to L2, a shape not measured here), then each pair of rows × [`TILE_T`]
    /// tokens keeps its 12 accumulators in registers.
    ///
    /// # Safety
    /// AVX2+FMA available; `out` rows `g0..g1` of those tokens owned by the caller.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn group_tiled(
        m: &Nvfp4Matrix,
        g0: usize,
        g1: usize,
        x: &[f32],
        tokens: usize,
        buf: &mut Vec<f32>,
        out: SyncPtr<f32>,
        n_out: usize,
    ) {
        let k = m.cols;
        let table = _mm256_loadu_ps(E2M1.as_ptr());
        buf.resize(GROUP * k, 0.0);
        for r in g0..g1 {
            for b in 0..k / BLOCK {
                let (w0, w1) = decode_block(m, r, b, table);
                let dst = buf.as_mut_ptr().add((r - g0) * k + b * BLOCK);
                _mm256_storeu_ps(dst, w0);
                _mm256_storeu_ps(dst.add(8), w1);
            }
        }
        let o = out.get();
        // Token blocks of ~8 KiB of activations: the block stays in L1, with the group's
        // decoded rows, while the row pairs pass over it (a whole batch only fits L2).
        let tb = ((8192 / (4 * k)) / TILE_T * TILE_T).max(TILE_T);
        for tb0 in (0..tokens).step_by(tb) {
            let tb1 = (tb0 + tb).min(tokens);
            let mut r = g0;
            while r < g1 {
                let pair = r + 1 < g1;
                let wa = buf.as_ptr().add((r - g0) * k);
                // A lone last row reuses its own weights as the partner; that result is dropped.
                let wb = if pair { wa.add(k) } else { wa };
                for t0 in (tb0..tb1).step_by(TILE_T) {
                    let xs: [*const f32; TILE_T] =
                        std::array::from_fn(|i| x.as_ptr().add((t0 + i).min(tokens - 1) * k));
                    tile(wa, wb, xs, (tokens - t0).min(TILE_T), o, t0, n_out, r, pair, k);
                }
                r += 2;
            }
        }
    }

    /// Two decoded rows (`wa`, `wb`) × the [`TILE_T`] token rows `xs`, 12 accumulators in
    /// registers; the first `nt` tokens' results are stored.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile(
        wa: *const f32,
        wb: *const f32,
        xs: [*const f32; TILE_T],
        nt: usize,
        o: *mut f32,
        t0: usize,
        n_out: usize,
        r: usize,
        pair: bool,
        k: usize,
    ) {
        let z = _mm256_setzero_ps();
        let (mut a0, mut a1, mut a2, mut a3, mut a4, mut a5) = (z, z, z, z, z, z);
        let (mut b0, mut b1, mut b2, mut b3, mut b4, mut b5) = (z, z, z, z, z, z);
        let mut c = 0;
        while c < k {
            let va = _mm256_loadu_ps(wa.add(c));
            let vb = _mm256_loadu_ps(wb.add(c));
            let x0 = _mm256_loadu_ps(xs[0].add(c));
            a0 = _mm256_fmadd_ps(va, x0, a0);
            b0 = _mm256_fmadd_ps(vb, x0, b0);
            let x1 = _mm256_loadu_ps(xs[1].add(c));
            a1 = _mm256_fmadd_ps(va, x1, a1);
            b1 = _mm256_fmadd_ps(vb, x1, b1);
            let x2 = _mm256_loadu_ps(xs[2].add(c));
            a2 = _mm256_fmadd_ps(va, x2, a2);
            b2 = _mm256_fmadd_ps(vb, x2, b2);
            let x3 = _mm256_loadu_ps(xs[3].add(c));
            a3 = _mm256_fmadd_ps(va, x3, a3);
            b3 = _mm256_fmadd_ps(vb, x3, b3);
            let x4 = _mm256_loadu_ps(xs[4].add(c));
            a4 = _mm256_fmadd_ps(va, x4, a4);
            b4 = _mm256_fmadd_ps(vb, x4, b4);
            let x5 = _mm256_loadu_ps(xs[5].add(c));
            a5 = _mm256_fmadd_ps(va, x5, a5);
            b5 = _mm256_fmadd_ps(vb, x5, b5);
            c += 8;
        }
        for (t, (a, b)) in [(a0, b0), (a1, b1), (a2, b2), (a3, b3), (a4, b4), (a5, b5)].into_iter().enumerate().take(nt)
        {
            *o.add((t0 + t) * n_out + r) = reduce(a);
            if pair {
                *o.add((t0 + t) * n_out + r + 1) = reduce(b);
            }
        }
    }

    /// Row `r` against every token; see [`Nvfp4Matrix::matmul`] for the exact arithmetic.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn row(m: &Nvfp4Matrix, r: usize, x: &[f32], tokens: usize, res: &mut [f32]) {
        let table = _mm256_loadu_ps(E2M1.as_ptr());
        let mut acc = vec![_mm256_setzero_ps(); tokens];
        for b in 0..m.cols / BLOCK {
            let (w0, w1) = decode_block(m, r, b, table);
            for (t, a) in acc.iter_mut().enumerate() {
                let xp = x.as_ptr().add(t * m.cols + b * BLOCK);
                *a = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xp), *a);
                *a = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xp.add(8)), *a);
            }
        }
        for (o, a) in res.iter_mut().zip(&acc) {
            *o = reduce(*a);
        }
    }
}
