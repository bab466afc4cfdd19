//! The integer path of [`matmul`](super::matmul) over GGML block types: activations quantized
//! into [`QActs`] (per 32 for the 32-weight types, per 64 for the K-quants), rows dispatched by
//! [`Isa`] to the AMX, AVX-512 VNNI, AVX-VNNI or AVX2 tiles, and the scalar reference
//! [`quant_dot_scalar`] ([`QMatrix::dot`]) every one of them reproduces bit for bit.
#![allow(unsafe_code)]

use crate::format::ggml::{QActs, QMatrix, QK};
use crate::format::qmatrix::{GROUP, HALF};
use crate::isa::Isa;
use crate::pool::{SyncPtr, ThreadPool};

/// Quantizes activations on the calling thread into the forms asked for (the blocks and bits
/// [`quantize_parallel`] gives).
pub(super) fn quantize_serial(x: &[f32], rows: usize, cols: usize, xq: &mut QActs, per32: bool, perk: bool) {
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
pub(super) fn quantize_parallel(
    pool: &ThreadPool,
    x: &[f32],
    rows: usize,
    cols: usize,
    xq: &mut QActs,
    per32: bool,
    perk: bool,
) {
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
pub(super) const AMX_MIN_TOKENS: usize = 24;

/// Rows `r0..r1` of `w` (`r0` a multiple of 16) for every token of `x`, to `out[t·ldo + r]`.
///
/// # Safety
/// `isa` must be supported by the CPU; those outputs must not be accessed by anyone else
/// during the call.
pub(super) unsafe fn quant_rows(isa: Isa, w: &QMatrix, r0: usize, r1: usize, x: &QActs, out: *mut f32, ldo: usize) {
    debug_assert!(r0.is_multiple_of(GROUP));
    // The 512-bit kernel takes whole groups of 16 rows, the 256-bit ones whole halves of 8; the
    // rows past them (a matrix whose rows are not whole groups) are scalar.
    let unit = if isa.avx512() { GROUP } else { HALF };
    let r_simd = r0 + (r1 - r0) / unit * unit;
    let (u0, u1) = (r0 / unit, r_simd / unit);
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Amx if x.rows >= amx_min_tokens(w.ty) => crate::kernels::amx::quant_rows(w, u0, u1, x, out, ldo),
        #[cfg(target_arch = "x86_64")]
        Isa::Amx | Isa::Vnni => crate::kernels::q8_avx512::quant_rows(w, u0, u1, x, out, ldo),
        #[cfg(target_arch = "x86_64")]
        Isa::AvxVnni => crate::kernels::q8_x86::quant_rows_avxvnni(w, u0, u1, x, out, ldo),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => crate::kernels::q8_x86::quant_rows_avx2(w, u0, u1, x, out, ldo),
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
    use crate::kernels::matmul::matmul;
    use crate::kernels::matmul::tests::{lcg, random_matrix};
    use crate::weight::Weight;

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
}
