//! f32 vector ops (dot, axpy), f16 conversion and the fused element-wise ops of a layer.
#![allow(unsafe_code)]

use crate::isa::Isa;

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

/// Softmax of `x` in place: `e^(x_i − max) / Σ e^(x_j − max)`, with libm's `exp`, the sum in
/// index order and one multiply by the reciprocal (the two-pass attention's and MLA's
/// arithmetic).
pub fn softmax_in_place(x: &mut [f32]) {
    let mx = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for v in x.iter_mut() {
        *v = (*v - mx).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// Weighted sums of rows: `out[o·out_stride ..][..width] = Σ_n w[o·w_stride + n] ·
/// rows[offs[n] ..][..width]` for `o < nw`, `n < offs.len()`, each sum in `n` order from zero,
/// each term added as [`axpy`] adds it. The bits equal `axpy(isa, w[o·w_stride + n], row_n,
/// out_o)` for `n = 0, 1, …` on a zeroed `out_o`, on the same ISA; the difference is that each
/// row is loaded once for all `nw` outputs and the sums stay in registers (attention's
/// probability-weighted sum of values shared by several heads; a small GEMM whose reduction
/// runs over rows).
///
/// # Panics
/// When a row or weight is out of its slice, or `out` is too short.
#[allow(clippy::too_many_arguments)]
pub fn weighted_rows(
    isa: Isa,
    w: &[f32],
    w_stride: usize,
    nw: usize,
    rows: &[f32],
    offs: &[usize],
    width: usize,
    out: &mut [f32],
    out_stride: usize,
) {
    let m = offs.len();
    if nw == 0 {
        return;
    }
    assert!((nw - 1) * w_stride + m <= w.len() && (nw - 1) * out_stride + width <= out.len(), "weighted_rows: shapes");
    for &o in offs {
        assert!(o + width <= rows.len(), "weighted_rows: row at {o} out of its slice");
    }
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar && width.is_multiple_of(8) {
        // SAFETY: AVX2+FMA were detected; every row, weight and output is in its slice (checked
        // above).
        unsafe { x86::weighted_rows(w, w_stride, nw, rows, offs, width, out, out_stride) };
        return;
    }
    for o in 0..nw {
        let y = &mut out[o * out_stride..o * out_stride + width];
        y.iter_mut().for_each(|v| *v = 0.0);
        for (n, &off) in offs.iter().enumerate() {
            axpy(isa, w[o * w_stride + n], &rows[off..off + width], y);
        }
    }
}

pub(crate) fn dot_scalar(a: &[f32], b: &[f32]) -> f32 {
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
        *d = crate::half::f32_to_f16(*v);
    }
}

/// RMSNorm (Zhang & Sennrich 2019, as in HF `LlamaRMSNorm`): `y = x / sqrt(mean(x²) + eps) · g`,
/// for each row of `x` (`rows · g.len()`), written to `y`.
///
/// Each row's `Σx²` is one chain of f32 adds in element order, whatever the row count (the
/// bits every golden was measured with: these models' logits move by most of a unit when a
/// norm's last bit does, see `tests/it/golden.rs`). A lone chain is latency-bound (2048 values
/// 3.2 µs, about 2 % of a Qwen3-MoE prefill), so [`NORM_ROWS`] rows' chains run side by side.
pub fn rms_norm(x: &[f32], g: &[f32], eps: f32, y: &mut [f32]) {
    let h = g.len();
    if h == 0 {
        return;
    }
    let n = (x.len() / h).min(y.len() / h) * h;
    y[..n].copy_from_slice(&x[..n]);
    rms_norm_in_place(&mut y[..n], g, eps);
}

/// [`rms_norm`] of every row of `x` in place (the same bits).
pub fn rms_norm_in_place(x: &mut [f32], g: &[f32], eps: f32) {
    let h = g.len();
    if h == 0 {
        return;
    }
    let rows = x.len() / h;
    for r in (0..rows).step_by(NORM_ROWS) {
        let n = (rows - r).min(NORM_ROWS);
        let xs = &mut x[r * h..(r + n) * h];
        let inv = inv_rms(xs, h, eps);
        for (k, inv) in inv.iter().enumerate().take(n) {
            for (xv, gv) in xs[k * h..(k + 1) * h].iter_mut().zip(g) {
                *xv = *xv * inv * gv;
            }
        }
    }
}

/// `1 / sqrt(Σx² / h + eps)` of each of the (at most [`NORM_ROWS`]) rows of `xs`, each sum
/// one chain in element order (see [`rms_norm`]).
#[inline]
fn inv_rms(xs: &[f32], h: usize, eps: f32) -> [f32; NORM_ROWS] {
    let n = xs.len() / h;
    let mut ss = [0f32; NORM_ROWS];
    if n == NORM_ROWS {
        for i in 0..h {
            for (k, s) in ss.iter_mut().enumerate() {
                let v = xs[k * h + i];
                *s += v * v;
            }
        }
    } else {
        for (k, s) in ss.iter_mut().enumerate().take(n) {
            for v in &xs[k * h..(k + 1) * h] {
                *s += v * v;
            }
        }
    }
    ss.map(|s| 1.0 / (s / h as f32 + eps).sqrt())
}

/// Rows whose [`rms_norm`] sums run side by side.
pub const NORM_ROWS: usize = 8;

/// GeGLU with the tanh GELU (Gemma's `gelu_pytorch_tanh`, Shazeer 2020 "GLU Variants"):
/// `out[i] = gelu(gate[i]) · up[i]`, `gelu(v) = ½·v·(1 + tanh(√(2/π)·(v + 0.044715·v³)))`.
/// Scalar on every ISA (libm's `tanhf`), so every path gives the same bits.
pub fn gelu_tanh_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        let inner = SQRT_2_OVER_PI * (g + 0.044715 * g * g * g);
        *o = 0.5 * g * (1.0 + inner.tanh()) * u;
    }
}

/// `erf(x)` in f32 as a rational function of `x` on (−3.92, 3.92) (±1 beyond, where f32 cannot
/// tell erf from 1): an odd degree-13 numerator over an even degree-8 denominator, the fit Eigen's
/// `generic_fast_erf_float` (and XLA's `ErfImpl32`) evaluates. Max error 4.5e-7 against
/// `libm::erf` (the test; a few ulps of 1 near |x| = 3.2); no fused multiply-add, so every
/// build and lane gives the same bits.
#[inline(always)]
#[allow(clippy::excessive_precision)]
pub fn erf_f32(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let mut p = x2 * -2.72614225801306e-10 + 2.77068142495902e-08;
    p = x2 * p + -2.10102402082508e-06;
    p = x2 * p + -5.69250639462346e-05;
    p = x2 * p + -7.34990630326855e-04;
    p = x2 * p + -2.95459980854025e-03;
    p = x2 * p + -1.60960333262415e-02;
    p *= x;
    let mut q = x2 * -1.45660718464996e-05 + -2.13374055278905e-04;
    q = x2 * q + -1.68282697438203e-03;
    q = x2 * q + -7.37332916720468e-03;
    q = x2 * q + -1.42647390514189e-02;
    // Past 3.92, 1 − erf(x) < 3·10⁻⁸ and erf rounds to ±1 in f32; the fit's own value there
    // is a few ulps short, which GELU would multiply by a large |x|.
    if x2 >= 3.92 * 3.92 {
        1f32.copysign(x)
    } else {
        p / q
    }
}

/// The exact GELU in place, `x · Φ(x) = ½·x·(1 + erf(x/√2))` (Hendrycks & Gimpel 2016; HF's
/// `"gelu"`, BERT's FFN), with [`erf_f32`]. Plain f32 operations in a loop the compiler widens
/// to the machine's vectors: the same bits on every ISA.
pub fn gelu_erf(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 was detected.
        unsafe { gelu_erf_avx2(x) };
        return;
    }
    gelu_erf_body(x);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn gelu_erf_avx2(x: &mut [f32]) {
    gelu_erf_body(x);
}

#[inline(always)]
fn gelu_erf_body(x: &mut [f32]) {
    for v in x {
        *v = 0.5 * *v * (1.0 + erf_f32(*v * std::f32::consts::FRAC_1_SQRT_2));
    }
}

/// SwiGLU: `out[i] = silu(gate[i]) · up[i]` with `silu(v) = v / (1 + e^{−v})`, `e^x` being
/// [`exp_f32`](super::exp_f32) (Cephes' polynomial), so the AVX2 path (8 lanes of the same
/// operations) and the scalar one give the same bits; libm's `expf`, used before, had no SIMD
/// twin and cost a call per element.
pub fn silu_mul(isa: Isa, gate: &[f32], up: &[f32], out: &mut [f32]) {
    let n = out.len().min(gate.len()).min(up.len());
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        // SAFETY: AVX2+FMA were detected; the three slices hold `n` values.
        unsafe { x86::silu_mul(&gate[..n], &up[..n], &mut out[..n]) };
        return;
    }
    let _ = isa;
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu_scalar(g) * u;
    }
}

#[inline]
fn silu_scalar(g: f32) -> f32 {
    g / (1.0 + super::exp_f32(-g))
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use crate::kernels::hsum;
    use std::arch::x86_64::*;

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
            dst[j] = crate::half::f32_to_f16(src[j]);
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

    /// [`super::weighted_rows`] for `width` a multiple of 8: outputs 4 at a time × 16 columns
    /// (8 accumulators), every row's 16 columns loaded once per 4 outputs.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn weighted_rows(
        w: &[f32],
        w_stride: usize,
        nw: usize,
        rows: &[f32],
        offs: &[usize],
        width: usize,
        out: &mut [f32],
        out_stride: usize,
    ) {
        let (wp, rp, op) = (w.as_ptr(), rows.as_ptr(), out.as_mut_ptr());
        let mut o0 = 0;
        while o0 < nw {
            let no = (nw - o0).min(4);
            let mut d = 0;
            while d < width {
                let two = d + 16 <= width;
                let mut acc = [[_mm256_setzero_ps(); 2]; 4];
                for (n, &off) in offs.iter().enumerate() {
                    let r = rp.add(off + d);
                    let a = _mm256_loadu_ps(r);
                    let b = if two { _mm256_loadu_ps(r.add(8)) } else { a };
                    for (i, ac) in acc.iter_mut().enumerate().take(no) {
                        let wv = _mm256_set1_ps(*wp.add((o0 + i) * w_stride + n));
                        ac[0] = _mm256_fmadd_ps(wv, a, ac[0]);
                        ac[1] = _mm256_fmadd_ps(wv, b, ac[1]);
                    }
                }
                for (i, ac) in acc.iter().enumerate().take(no) {
                    let dst = op.add((o0 + i) * out_stride + d);
                    _mm256_storeu_ps(dst, ac[0]);
                    if two {
                        _mm256_storeu_ps(dst.add(8), ac[1]);
                    }
                }
                d += if two { 16 } else { 8 };
            }
            o0 += 4;
        }
    }

    /// [`super::silu_mul`], 8 lanes at a time.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
        let n = out.len();
        let (g, u, o) = (gate.as_ptr(), up.as_ptr(), out.as_mut_ptr());
        let (one, sign) = (_mm256_set1_ps(1.0), _mm256_set1_ps(-0.0));
        let mut i = 0;
        while i + 8 <= n {
            let gv = _mm256_loadu_ps(g.add(i));
            let e = crate::kernels::flash::exp8(_mm256_xor_ps(gv, sign));
            let s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
            _mm256_storeu_ps(o.add(i), _mm256_mul_ps(s, _mm256_loadu_ps(u.add(i))));
            i += 8;
        }
        while i < n {
            *o.add(i) = super::silu_scalar(*g.add(i)) * *u.add(i);
            i += 1;
        }
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
    /// Against the f64 erf of `libm` (a port of FreeBSD's msun): |error| ≤ 4.5e-7 on a grid of
    /// 2·10⁶ points over [−6, 6] (measured 4.45e-7, near |x| = 3.2: a few ulps of 1), and GELU
    /// within 3e-7·max(|x|, 1) of the f64 one.
    #[test]
    fn erf_f32_is_within_f32_rounding_of_libm() {
        let mut worst = 0f64;
        for i in 0..=2_000_000 {
            let x = -6.0 + 12.0 * i as f64 / 2e6;
            let e = (super::erf_f32(x as f32) as f64 - libm::erf(x as f32 as f64)).abs();
            worst = worst.max(e);
        }
        assert!(worst <= 4.5e-7, "worst |erf error| {worst}");
        let xs: Vec<f32> = (-4000..=4000).map(|i| i as f32 / 500.0).collect();
        let mut g = xs.clone();
        super::gelu_erf(&mut g);
        for (&x, &y) in xs.iter().zip(&g) {
            let z = x as f64;
            let want = 0.5 * z * (1.0 + libm::erf(z / std::f64::consts::SQRT_2));
            // ½·|x| times erf's error: absolute, since 1 + erf cancels for negative x.
            assert!((y as f64 - want).abs() <= 3e-7 * (x.abs() as f64).max(1.0), "gelu({x}) = {y}, want {want}");
        }
    }

    use super::*;

    /// RMSNorm against the exact f64 formula (a 128-dim head, 2048, 2880 and 37 wide, large
    /// and tiny magnitudes), over 11 rows: one block of rows summed side by side and a tail of
    /// 3, each row with the bits it has alone (in place too).
    #[test]
    fn rms_norm_is_close_to_exact_and_row_independent() {
        let rows = NORM_ROWS + 3;
        for (h, mag) in [(128, 1.0f32), (2048, 30.0), (2880, 1e-3), (37, 5.0)] {
            let x: Vec<f32> = (0..rows * h).map(|i| ((i * 7919 % 1013) as f32 / 506.0 - 1.0) * mag).collect();
            let g: Vec<f32> = (0..h).map(|i| 0.5 + (i % 7) as f32 / 7.0).collect();
            let mut y = vec![0f32; rows * h];
            rms_norm(&x, &g, 1e-6, &mut y);
            let mut z = x.clone();
            rms_norm_in_place(&mut z, &g, 1e-6);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
            assert_eq!(bits(&z), bits(&y), "in place, h {h}");
            for r in 0..rows {
                let mut alone = vec![0f32; h];
                rms_norm(&x[r * h..(r + 1) * h], &g, 1e-6, &mut alone);
                assert_eq!(bits(&alone), bits(&y[r * h..(r + 1) * h]), "h {h} row {r} alone");
                let xr = &x[r * h..(r + 1) * h];
                let ms = xr.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / h as f64;
                let inv = 1.0 / (ms + 1e-6).sqrt();
                for i in 0..h {
                    let want = xr[i] as f64 * inv * g[i] as f64;
                    let got = y[r * h + i] as f64;
                    assert!((got - want).abs() <= 1e-5 * want.abs().max(1e-3), "h {h} row {r} [{i}]: {got} vs {want}");
                }
            }
        }
    }

    /// SwiGLU gives the same bits on every ISA (lanes and tail), over the range where `exp`
    /// saturates both ways, and stays within 2e-6 relative of the f64 formula (2e-36 absolute
    /// where that formula underflows).
    #[test]
    fn silu_mul_same_bits_on_every_isa() {
        let n = 1003;
        let gate: Vec<f32> = (0..n).map(|i| (i as f32 - 500.0) * 0.2).collect();
        let up: Vec<f32> = (0..n).map(|i| 1.0 + (i % 7) as f32 * 0.25).collect();
        let mut want = vec![0f32; n];
        silu_mul(Isa::Scalar, &gate, &up, &mut want);
        for isa in Isa::available() {
            let mut got = vec![0f32; n];
            silu_mul(isa, &gate, &up, &mut got);
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{isa:?}");
        }
        for ((&w, &g), &u) in want.iter().zip(&gate).zip(&up) {
            let e = g as f64 / (1.0 + (-g as f64).exp()) * u as f64;
            assert!((w as f64 - e).abs() <= 2e-6 * e.abs().max(1e-30), "silu({g}) · {u}: {w} vs {e}");
        }
    }

    /// `weighted_rows` gives the bits of the `axpy` loop it replaces on every ISA: widths with
    /// 16-column tiles, an 8-column tail and no SIMD path at all, output counts around the
    /// 4-output tiles, rows gathered in any order.
    #[test]
    fn weighted_rows_equals_an_axpy_loop() {
        let mut seed = 3u64;
        let mut rnd = || crate::kernels::test_rand(&mut seed);
        let rows: Vec<f32> = (0..40 * 80).map(|_| rnd()).collect();
        for (width, nw, m) in [(64usize, 4usize, 32usize), (80, 1, 7), (24, 5, 3), (13, 9, 11), (8, 4, 0)] {
            let offs: Vec<usize> = (0..m).map(|n| ((n * 17 + 5) % 40) * 80).collect();
            let w_stride = m + 3;
            let w: Vec<f32> = (0..nw * w_stride).map(|_| rnd()).collect();
            let out_stride = width + 5;
            for isa in Isa::available() {
                let mut got = vec![f32::NAN; nw * out_stride];
                weighted_rows(isa, &w, w_stride, nw, &rows, &offs, width, &mut got, out_stride);
                for o in 0..nw {
                    let mut want = vec![0f32; width];
                    for (n, &off) in offs.iter().enumerate() {
                        axpy(isa, w[o * w_stride + n], &rows[off..off + width], &mut want);
                    }
                    let g = &got[o * out_stride..o * out_stride + width];
                    assert!(
                        g.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{isa:?} width {width} output {o}"
                    );
                }
            }
        }
    }
}
