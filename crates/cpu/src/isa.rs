//! Instruction-set detection, done once at start-up and passed to every kernel.
//!
//! One mechanism (`is_x86_feature_detected!`) decides which SIMD path runs; every path computes
//! the same arithmetic as the scalar reference, so the choice changes speed only.

/// The instruction set the kernels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// AVX2 + FMA + F16C + AVX-512 VNNI/VL (`vpdpbusd` on 256-bit registers).
    Vnni,
    /// AVX2 + FMA + F16C + AVX-VNNI: the VEX-encoded 256-bit `vpdpbusd` of Alder Lake and later
    /// and Zen 5, with 16 vector registers.
    AvxVnni,
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
            if avx2 && is_x86_feature_detected!("avxvnni") {
                return Isa::AvxVnni;
            }
            if avx2 {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// Every set this CPU supports, best first (the tests run each one against the scalar
    /// reference).
    pub fn available() -> Vec<Isa> {
        #[allow(unused_mut)]
        let mut v = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 =
                is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
            if avx2 && is_x86_feature_detected!("avx512vnni") && is_x86_feature_detected!("avx512vl") {
                v.push(Isa::Vnni);
            }
            if avx2 && is_x86_feature_detected!("avxvnni") {
                v.push(Isa::AvxVnni);
            }
            if avx2 {
                v.push(Isa::Avx2);
            }
        }
        v.push(Isa::Scalar);
        v
    }

    /// Name for logs and `/get_server_info`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Vnni => "avx512-vnni",
            Isa::AvxVnni => "avx-vnni",
            Isa::Avx2 => "avx2",
            Isa::Scalar => "scalar",
        }
    }
}

