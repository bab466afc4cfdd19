//! Instruction-set detection, done once at start-up and passed to every kernel.
//!
//! One mechanism (`is_x86_feature_detected!`) decides which SIMD path runs; every path computes
//! the same arithmetic as the scalar reference, so the choice changes speed only.

/// The instruction set the kernels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// [`Isa::Vnni`] plus AMX-INT8 tiles (Sapphire Rapids and later) for batched matmuls.
    Amx,
    /// AVX2 + FMA + F16C + AVX-512 F/BW/VL/VNNI (`vpdpbusd` on 512-bit registers).
    Vnni,
    /// AVX2 + FMA + F16C + AVX-VNNI: the VEX-encoded 256-bit `vpdpbusd` of Alder Lake and later
    /// and Zen 5, with 16 vector registers.
    AvxVnni,
    /// AVX2 + FMA + F16C (`vpmaddubsw`).
    Avx2,
    /// Portable Rust.
    Scalar,
}

/// Whether AMX-INT8 tiles may be used: the CPU has AMX-TILE and AMX-INT8 (CPUID leaf 7, EDX
/// bits 24 and 25) and Linux granted this process the tile data state (`arch_prctl(
/// ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, Documentation/arch/x86/xstate.rst), asked once.
pub fn amx_enabled() -> bool {
    static AMX: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AMX.get_or_init(|| {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
            if !is_x86_feature_detected!("avx2") || edx & (3 << 24) != 3 << 24 {
                return false;
            }
            const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
            const XFEATURE_XTILEDATA: libc::c_long = 18;
            // SAFETY: a permission request; it changes no memory of ours.
            #[allow(unsafe_code)]
            let r = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) };
            r == 0
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        false
    })
}

/// Whether the single-token GEMV asks for each weight tile's lines itself before reading them
/// (`prefetcht0` of the whole current tile), chosen by CPU vendor (CPUID leaf 0) and measured on
/// the 1B Q4_K_M decode step's matmuls (`decode_matmuls`, 2 threads, interleaved): on an Intel
/// Xeon (AMX, family 6 model 0xa7) 31.2 ms with it, 37.3 ms without; on an AMD EPYC (Zen 4,
/// family 0x19 model 0x11) 30–35 ms without, 38–41 ms with it, and worse still at every distance
/// ahead tried (1, 2, 4, 8, 16 KiB, L1 or L2); its AVX2 path 40–45 ms without, 60 ms with the
/// AVX2 kernel's 2 KiB-ahead prefetch. Zen's own stream prefetcher keeps enough lines in
/// flight; the explicit requests only take load-queue slots.
pub fn prefetch_weight_tiles() -> bool {
    static INTEL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *INTEL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            let r = std::arch::x86_64::__cpuid(0);
            // "GenuineIntel" in EBX, EDX, ECX.
            r.ebx == u32::from_le_bytes(*b"Genu")
                && r.edx == u32::from_le_bytes(*b"ineI")
                && r.ecx == u32::from_le_bytes(*b"ntel")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// AVX-512 F, BW, VL and VNNI: what the 512-bit kernels use.
#[cfg(target_arch = "x86_64")]
fn avx512() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512vnni")
}

impl Isa {
    /// Whether the 512-bit AVX-512 kernels run (the AMX path uses them below its batch sizes).
    pub fn avx512(self) -> bool {
        matches!(self, Isa::Amx | Isa::Vnni)
    }

    /// The best set this CPU supports.
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 =
                is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c");
            if avx2 && avx512() && amx_enabled() {
                return Isa::Amx;
            }
            if avx2 && avx512() {
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
            if avx2 && avx512() && amx_enabled() {
                v.push(Isa::Amx);
            }
            if avx2 && avx512() {
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
            Isa::Amx => "amx",
            Isa::Vnni => "avx512-vnni",
            Isa::AvxVnni => "avx-vnni",
            Isa::Avx2 => "avx2",
            Isa::Scalar => "scalar",
        }
    }
}
