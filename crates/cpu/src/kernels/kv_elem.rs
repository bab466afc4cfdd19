//! The KV cache's element types as every attention kernel reads them ([`KvElem`]: f32, IEEE
//! half bits, [`Bf16`], [`E4m3`], [`E5m2`]), each widened exactly to f32 one at a time or 8 at
//! a time (AVX2), and views of raw cache bytes as them.
#![allow(unsafe_code)]

/// An element of the KV cache: f32, IEEE half stored as `u16` bits, or one of [`Bf16`],
/// [`E4m3`], [`E5m2`].
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
        crate::half::f16_to_f32(self)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const u16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
}

/// A bfloat16 KV element (the top half of an f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(transparent)]
pub struct Bf16(pub u16);

/// An fp8 E4M3 KV element ([`crate::half::Fp8::E4M3`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(transparent)]
pub struct E4m3(pub u8);

/// An fp8 E5M2 KV element ([`crate::half::Fp8::E5M2`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(transparent)]
pub struct E5m2(pub u8);

impl KvElem for Bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Bf16) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i)), 16))
    }
}

impl KvElem for E5m2 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        crate::half::f16_to_f32((self.0 as u16) << 8)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const E5m2) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // The byte is the top half of an IEEE half.
        _mm256_cvtph_ps(_mm_slli_epi16(_mm_cvtepu8_epi16(_mm_loadl_epi64(p as *const __m128i)), 8))
    }
}

impl KvElem for E4m3 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        crate::half::Fp8::E4M3.decode(self.0)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const E4m3) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // Sign-extended to i32 and shifted left 20, the byte's exponent and mantissa land in an
        // f32's exponent field (bits 26..23) and top mantissa bits (22..20), its sign in bit 31:
        // the f32 with those bits is the value · 2^−120, exactly (E4M3 subnormals become f32
        // subnormals), so one multiply by 2^120 gives the value. Code 0x7f (NaN) is never written.
        let v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i));
        let bits = _mm256_and_si256(_mm256_slli_epi32(v, 20), _mm256_set1_epi32(0x87f0_0000u32 as i32));
        _mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(f32::from_bits(0x7b80_0000)))
    }
}

/// Views raw KV bytes as [`E4m3`] elements.
pub fn as_e4m3(b: &[u8]) -> &[E4m3] {
    // SAFETY: `E4m3` is `repr(transparent)` over `u8`.
    unsafe { std::slice::from_raw_parts(b.as_ptr() as *const E4m3, b.len()) }
}

/// Views raw KV bytes as [`E5m2`] elements.
pub fn as_e5m2(b: &[u8]) -> &[E5m2] {
    // SAFETY: `E5m2` is `repr(transparent)` over `u8`.
    unsafe { std::slice::from_raw_parts(b.as_ptr() as *const E5m2, b.len()) }
}

/// Views raw KV halves as [`Bf16`] elements.
pub fn as_bf16(b: &[u16]) -> &[Bf16] {
    // SAFETY: `Bf16` is `repr(transparent)` over `u16`.
    unsafe { std::slice::from_raw_parts(b.as_ptr() as *const Bf16, b.len()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every fp8 code (and bf16 values) widens to the same f32 in the SIMD load as in the
    /// scalar conversion, the codecs' exact values.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn kv_element_loads_match_scalar() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")) {
            return;
        }
        // Finite codes only: the encoders never write NaN or (E5M2) infinity.
        let codes: Vec<u8> = (0..=255u8).filter(|&c| c & 0x7f != 0x7f).collect();
        let codes5: Vec<u8> = (0..=255u8).filter(|&c| c & 0x7c != 0x7c).collect();
        let e4: Vec<E4m3> = codes.iter().map(|&c| E4m3(c)).collect();
        let e5: Vec<E5m2> = codes5.iter().map(|&c| E5m2(c)).collect();
        let bf: Vec<Bf16> = (0..256u32).map(|i| Bf16((i * 257 % 65536) as u16 & 0x7f7f)).collect();
        fn check<E: KvElem + std::fmt::Debug>(v: &[E]) {
            for ch in v.chunks_exact(8) {
                let mut out = [0f32; 8];
                // SAFETY: 8 readable values; AVX2 and F16C detected by the caller.
                unsafe { std::arch::x86_64::_mm256_storeu_ps(out.as_mut_ptr(), E::load8(ch.as_ptr())) };
                for (o, e) in out.iter().zip(ch) {
                    assert_eq!(o.to_bits(), e.to_f32().to_bits(), "{e:?}");
                }
            }
        }
        check(&e4[..e4.len() / 8 * 8]);
        check(&e5[..e5.len() / 8 * 8]);
        check(&bf);
        for &c in &codes {
            assert_eq!(E4m3(c).to_f32().to_bits(), crate::half::Fp8::E4M3.decode(c).to_bits());
        }
        for &c in &codes5 {
            assert_eq!(E5m2(c).to_f32().to_bits(), crate::half::Fp8::E5M2.decode(c).to_bits());
        }
    }
}
