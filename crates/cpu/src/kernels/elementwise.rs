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
