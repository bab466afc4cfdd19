//! IEEE 754 half precision <-> f32, exact and round-to-nearest-even (the scalar reference of
//! the `vcvtps2ph` / `vcvtph2ps` paths); f32 -> bf16; FP8 E4M3 / E5M2 ([`Fp8`]) for the KV
//! cache.

/// IEEE 754 half → f32 (exact; handles subnormals, infinities and NaN).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let frac = (h & 0x3ff) as u32;
    let bits = match (exp, frac) {
        (0, 0) => sign,
        (0, f) => {
            // Subnormal: value = f · 2^-24; renormalise into an f32.
            let lz = f.leading_zeros() - 21; // shifts that bring the top set bit to bit 10
            let f = (f << lz) & 0x3ff;
            let e = 127 - 15 + 1 - lz;
            sign | (e << 23) | (f << 13)
        }
        (0x1f, f) => sign | 0x7f80_0000 | (f << 13),
        (e, f) => sign | ((e + 127 - 15) << 23) | (f << 13),
    };
    f32::from_bits(bits)
}

/// f32 → IEEE half, rounding to nearest even (as `vcvtps2ph` with `_MM_FROUND_TO_NEAREST_INT`);
/// overflow gives ±inf, NaN stays NaN, values below half the smallest subnormal give ±0.
pub fn f32_to_f16(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xff) as i32;
    let man = b & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 | (man >> 13) as u16 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        // Subnormal half: value = m · 2^-24 with m = mantissa24 >> (14 − e), rounded.
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rem = m & ((1 << shift) - 1);
        let mut r = m >> shift;
        if rem > half || (rem == half && r & 1 == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (man >> 13);
    let rem = man & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && r & 1 == 1) {
        r += 1; // a carry into the exponent is the correct rounding (up to inf)
    }
    sign | r as u16
}

/// Rounds f32 to bf16 (nearest, ties to even), as torch's `.to(torch.bfloat16)` does.
pub fn f32_to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    if x.is_nan() {
        return ((b >> 16) | 0x40) as u16;
    }
    let round = 0x7fff + ((b >> 16) & 1);
    ((b + round) >> 16) as u16
}

/// The two 8-bit float formats of OCP's "OFP8" specification (2023) that SGLang's
/// `--kv-cache-dtype` names: `E4M3` (`fp8_e4m3`, PyTorch's `float8_e4m3fn`: bias 7, no
/// infinities, largest finite ±448) and `E5M2` (`fp8_e5m2`: bias 15, the top byte of an IEEE
/// half, largest finite ±57344).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp8 {
    /// 4 exponent bits, 3 mantissa bits.
    E4M3,
    /// 5 exponent bits, 2 mantissa bits.
    E5M2,
}

impl Fp8 {
    const fn params(self) -> (i32, u32, f64, u8) {
        // (bias, mantissa bits, largest finite value, its code)
        match self {
            Fp8::E4M3 => (7, 3, 448.0, 0x7e),
            Fp8::E5M2 => (15, 2, 57344.0, 0x7b),
        }
    }

    /// Rounds `x` to this format: nearest, ties to even; values past the largest finite one (and
    /// infinities) saturate to it, as vLLM's and SGLang's scaled fp8 casts clamp; NaN stays NaN.
    /// Bit arithmetic on the f32 (the rounding carry may step into the exponent, which is the
    /// right result); [`Fp8::encode_reference`] is the same in f64 arithmetic, for the tests.
    pub fn encode(self, x: f32) -> u8 {
        let (bias, mb, max, max_code) = self.params();
        if x.is_nan() {
            return match self {
                Fp8::E4M3 => 0x7f,
                Fp8::E5M2 => 0x7e,
            };
        }
        let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
        let a = x.abs();
        let code = if a >= max as f32 {
            max_code
        } else if a < f32::from_bits(((128 - bias) as u32) << 23) {
            // Subnormal: multiples of 2^(1 − bias − mb), exact scaling by a power of two.
            (a * f32::from_bits(((127 + bias - 1 + mb as i32) as u32) << 23)).round_ties_even() as u8
        } else {
            let drop = 23 - mb;
            let b = a.to_bits();
            let r = (b + ((1 << (drop - 1)) - 1) + ((b >> drop) & 1)) >> drop;
            let c = r - (((127 - bias) as u32) << mb);
            c.min(max_code as u32) as u8
        };
        sign | code
    }

    /// [`Fp8::encode`] in f64 arithmetic (the tests' reference).
    pub fn encode_reference(self, x: f32) -> u8 {
        let (bias, mb, max, max_code) = self.params();
        if x.is_nan() {
            return match self {
                Fp8::E4M3 => 0x7f,
                Fp8::E5M2 => 0x7e,
            };
        }
        let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
        let a = x.abs() as f64;
        let q = |v: f64| v.round_ties_even();
        let min_normal = 2f64.powi(1 - bias);
        let code = if a >= max {
            max_code
        } else if a < min_normal {
            // Subnormal steps of 2^(1 − bias − mb); a result of 2^mb is the smallest normal.
            q(a / 2f64.powi(1 - bias - mb as i32)) as u8
        } else {
            let e = a.log2().floor() as i32;
            // log2 may misjudge by one at powers of two; fix the exponent so 1 ≤ frac < 2.
            let e = if a / 2f64.powi(e) >= 2.0 {
                e + 1
            } else if a / 2f64.powi(e) < 1.0 {
                e - 1
            } else {
                e
            };
            let m = q((a / 2f64.powi(e) - 1.0) * (1u32 << mb) as f64) as u32;
            let (e, m) = if m == 1 << mb { (e + 1, 0) } else { (e, m) };
            let c = (((e + bias) as u32) << mb) | m;
            if c > max_code as u32 {
                max_code
            } else {
                c as u8
            }
        };
        sign | code
    }

    /// The exact value of code `c`.
    pub fn decode(self, c: u8) -> f32 {
        match self {
            // E5M2 is the top byte of an IEEE half.
            Fp8::E5M2 => f16_to_f32((c as u16) << 8),
            Fp8::E4M3 => {
                let (e, m) = ((c >> 3) & 0xf, c & 7);
                if e == 0xf && m == 7 {
                    return f32::NAN;
                }
                let v =
                    if e == 0 { m as f32 * 2f32.powi(-9) } else { (1.0 + m as f32 / 8.0) * 2f32.powi(e as i32 - 7) };
                if c & 0x80 != 0 {
                    -v
                } else {
                    v
                }
            }
        }
    }
}

#[cfg(test)]
mod fp8_tests {
    use super::*;

    /// Every code decodes to its value and encodes back to itself; values between two codes go
    /// to the nearer (ties to the even code); out-of-range values saturate.
    #[test]
    fn fp8_round_trips_and_rounds_to_nearest_even() {
        for f in [Fp8::E4M3, Fp8::E5M2] {
            let mut finite: Vec<(u8, f32)> =
                (0..=255u8).map(|c| (c, f.decode(c))).filter(|(_, v)| v.is_finite()).collect();
            for &(c, v) in &finite {
                let back = f.encode(v);
                // ±0 both encode as themselves.
                assert_eq!(back, c, "{f:?} {c:#x} = {v}");
            }
            finite.retain(|&(c, _)| c & 0x80 == 0);
            finite.sort_by(|a, b| a.1.total_cmp(&b.1));
            for w in finite.windows(2) {
                let ((c0, v0), (c1, v1)) = (w[0], w[1]);
                let mid = ((v0 as f64 + v1 as f64) / 2.0) as f32;
                let even = if c0 % 2 == 0 { c0 } else { c1 };
                assert_eq!(f.encode(mid), even, "{f:?} tie between {v0} and {v1}");
                assert_eq!(f.encode(v0 + (mid - v0) * 0.5), c0);
                assert_eq!(f.encode(mid + (v1 - mid) * 0.5), c1);
            }
            // The bit arithmetic equals the f64 reference on a spread of values.
            let mut x = 0x1234_5678u32;
            for _ in 0..200_000 {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                let v = f32::from_bits(x);
                let v = if v.is_finite() { v % 1000.0 } else { 0.0 };
                for v in [v, v * 1e-3, v * 1e-6] {
                    assert_eq!(f.encode(v), f.encode_reference(v), "{f:?} {v:e}");
                }
            }
        }
        assert_eq!(Fp8::E4M3.decode(Fp8::E4M3.encode(1e6)), 448.0);
        assert_eq!(Fp8::E4M3.decode(Fp8::E4M3.encode(f32::NEG_INFINITY)), -448.0);
        assert_eq!(Fp8::E5M2.decode(Fp8::E5M2.encode(1e9)), 57344.0);
        assert_eq!(Fp8::E4M3.decode(0x01), 2f32.powi(-9));
    }
}
