//! Pieces the decoders share: rotary position embeddings (RoPE, Su et al. 2021, "RoFormer")
//! and the output head (final RMSNorm of the rows whose logits are wanted, then the LM head).
//!
//! The rotation itself is one function for both layouts. The angle tables are not: Llama's
//! follows llama.cpp (angles in f64, rounded once) and GLM-5's follows HF transformers
//! (`inv_freq` and `pos · inv_freq` in f32), and each model's goldens were made against its own
//! reference, so the two builders stay separate, side by side here.

use crate::model::linear::Fwd;
use sparrow_cpu::{kernels, Weight};

use crate::EngineError;

/// Which values of a head RoPE rotates together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeLayout {
    /// Adjacent pairs `(v[2i], v[2i+1])` (llama.cpp's `LLAMA_ROPE_TYPE_NORM`, GLM-5's MLA and
    /// indexer).
    Interleaved,
    /// Pairs `(v[i], v[i + half])` (HF's `rotate_half`).
    Halves,
}

/// RoPE scaling as ggml applies it (`rope_yarn` and `ggml_rope_yarn_corr_dims`, ggml-cpu
/// `ops.cpp` / `ggml.c`; Peng et al. 2023, "YaRN"): pair `i`'s angle is interpolated
/// (`freq_scale · θ`) for low frequencies and extrapolated (`θ`) for high ones, blended by a
/// linear ramp over the pairs between the correction dimensions of `beta_fast` and
/// `beta_slow` rotations in the original context; `ext_factor = 0` is plain linear scaling.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeScaling {
    /// `1 / factor` (`rope.scaling.factor`).
    pub freq_scale: f64,
    /// 1 for YaRN, 0 for linear scaling (llama.cpp's `yarn_ext_factor` default).
    pub ext_factor: f64,
    /// The context the model was trained with before scaling
    /// (`rope.scaling.original_context_length`).
    pub n_ctx_orig: usize,
    /// Rotations that mark the extrapolated end (llama.cpp's default 32).
    pub beta_fast: f64,
    /// Rotations that mark the interpolated end (default 1).
    pub beta_slow: f64,
    /// YaRN's `mscale_all_dim` (`rope.scaling.yarn_log_multiplier`; 0 when absent): the cosine
    /// and sine factor becomes `mscale(s, 1) / mscale(s, log_mul)` (`llama_context`).
    pub log_mul: f64,
}

impl RopeScaling {
    /// YaRN with llama.cpp's defaults (`beta_fast` 32, `beta_slow` 1).
    pub fn yarn(factor: f64, n_ctx_orig: usize) -> RopeScaling {
        RopeScaling {
            freq_scale: 1.0 / factor,
            ext_factor: 1.0,
            n_ctx_orig,
            beta_fast: 32.0,
            beta_slow: 1.0,
            log_mul: 0.0,
        }
    }

    /// Linear position interpolation by `factor`.
    pub fn linear(factor: f64) -> RopeScaling {
        RopeScaling {
            freq_scale: 1.0 / factor,
            ext_factor: 0.0,
            n_ctx_orig: 0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            log_mul: 0.0,
        }
    }

    /// The factor on every cosine and sine llama.cpp ends up with, for a file's
    /// `rope.scaling.attn_factor` `attn`: its `yarn_attn_factor` (`llama_context`: YaRN's
    /// `0.1 ln s + 1`, or `mscale(s, 1) / mscale(s, log_mul)` with a `yarn_log_multiplier`,
    /// cancelled, times `attn`) times `rope_yarn`'s own `1 + 0.1 ln(1/freq_scale)` under YaRN;
    /// `attn` alone under linear scaling. (DeepSeek's MLA takes `mscale = log_mul`, which makes
    /// the ratio 1: its loader computes its own.)
    pub fn mscale(&self, attn: f64) -> f64 {
        if self.ext_factor == 0.0 {
            return attn;
        }
        let factor = 1.0 / self.freq_scale;
        let get = |s: f64, m: f64| if s <= 1.0 { 1.0 } else { 0.1 * m * s.ln() + 1.0 };
        let ratio = match self.log_mul == 0.0 {
            true => get(factor, 1.0),
            false => get(factor, 1.0) / get(factor, self.log_mul),
        };
        let yarn_attn = ratio / (1.0 + 0.1 * factor.ln()) * attn;
        yarn_attn * (1.0 + 0.1 * (1.0 / self.freq_scale).ln())
    }

    /// ggml's correction dimensions (pair indices) for a rotary width `dims` and base `base`.
    fn corr_dims(&self, dims: usize, base: f64) -> (f64, f64) {
        let corr = |rot: f64| {
            dims as f64 * (self.n_ctx_orig as f64 / (rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
        };
        (corr(self.beta_fast).floor().max(0.0), corr(self.beta_slow).ceil().min(dims as f64 - 1.0))
    }
}

/// Most positions a RoPE table is built for: 2^24, above every released model's context
/// (Llama 4 Scout's is 10M).
pub const MAX_ROPE_POSITIONS: usize = 1 << 24;

/// Checks a RoPE table of `positions` for heads of `dim` rotary values before it is built: the
/// count comes from a file's metadata (`context_length`, `max_position_embeddings`) and the
/// table holds `positions · dim` f32 values. It must stay under [`MAX_ROPE_POSITIONS`] and
/// take no more memory than the checkpoint's `file_bytes` (plus 64 MiB for tiny files); every
/// real model's table is far smaller than its weights (Llama 3 8B's: 64 MiB beside 4.6 GB), so
/// only a crafted count fails.
///
/// # Errors
/// [`EngineError::Model`] naming `key` and both sizes.
pub fn check_rope_positions(key: &str, positions: usize, dim: usize, file_bytes: usize) -> Result<(), EngineError> {
    let bytes = positions.checked_mul(dim).and_then(|n| n.checked_mul(4));
    let allowed = file_bytes.saturating_add(64 << 20);
    match bytes {
        Some(b) if positions <= MAX_ROPE_POSITIONS && b <= allowed => Ok(()),
        _ => Err(EngineError::model(format!(
            "{key} = {positions}: a RoPE table of {positions} positions × {dim} values is past what this \
             checkpoint of {file_bytes} bytes can use (at most {MAX_ROPE_POSITIONS} positions, and no larger than \
             the weights); the file's metadata is wrong"
        ))),
    }
}

/// Cosines and sines of `pos · θ_i` for every position and every pair `i` of a rotary width.
#[derive(Debug, Clone)]
pub struct RopeTable {
    half: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeTable {
    /// llama.cpp's table for heads of `dim` values: `θ_i = base^(−2i/dim)` and `pos · θ_i` in
    /// f64, rounded to f32 after the cosine (what llama.cpp's rope cache effectively computes).
    pub fn llama_cpp(base: f64, dim: usize, positions: usize) -> Self {
        Self::llama_cpp_scaled(base, dim, positions, None)
    }

    /// [`RopeTable::llama_cpp`] with llama.cpp's frequency factors (`rope_freqs`, one per
    /// pair): pair `i`'s angle is `pos · θ_i / factors[i]` (`ggml_rope_cache_init`'s
    /// `theta / ff`, ggml-cpu `ops.cpp`).
    pub fn llama_cpp_scaled(base: f64, dim: usize, positions: usize, factors: Option<&[f32]>) -> Self {
        Self::build(dim, positions, |pos, i| {
            let theta = base.powf(-2.0 * i as f64 / dim as f64);
            let ff = factors.map_or(1.0, |f| f[i] as f64);
            let a = pos as f64 * theta / ff;
            (a.cos() as f32, a.sin() as f32)
        })
    }

    /// [`RopeTable::llama_cpp_scaled`] under RoPE scaling `s` (see [`RopeScaling`]): pair `i`'s
    /// extrapolated angle `θ = pos · base^(−2i/dim) / factors[i]`, its interpolation
    /// `freq_scale · θ`, blended by `ramp(i) · ext_factor` where `ramp` falls from 1 to 0
    /// between the correction dimensions; every cosine and sine times `mscale`
    /// ([`RopeScaling::mscale`]).
    pub fn llama_cpp_yarn(
        base: f64,
        dim: usize,
        positions: usize,
        factors: Option<&[f32]>,
        s: &RopeScaling,
        mscale: f64,
    ) -> Self {
        let (low, high) = s.corr_dims(dim, base);
        Self::build(dim, positions, |pos, i| {
            let theta = base.powf(-2.0 * i as f64 / dim as f64) / factors.map_or(1.0, |f| f[i] as f64);
            let extrap = pos as f64 * theta;
            let interp = s.freq_scale * extrap;
            let ramp = 1.0 - ((i as f64 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
            let mix = ramp * s.ext_factor;
            let a = interp * (1.0 - mix) + extrap * mix;
            ((a.cos() * mscale) as f32, (a.sin() * mscale) as f32)
        })
    }

    /// HF transformers' table for a rotary width `dim`: `inv_freq = 1 / base^(2i/dim)` rounded to
    /// f32, then `pos · inv_freq` and its cosine in f32 (`LlamaRotaryEmbedding` in float32).
    pub fn hf_f32(base: f64, dim: usize, positions: usize) -> Self {
        Self::build(dim, positions, |pos, i| {
            let inv = (1.0 / base.powf(2.0 * i as f64 / dim as f64)) as f32;
            let a = pos as f32 * inv;
            (a.cos(), a.sin())
        })
    }

    fn build(dim: usize, positions: usize, angle: impl Fn(usize, usize) -> (f32, f32)) -> Self {
        let half = dim / 2;
        let mut cos = vec![0f32; positions * half];
        let mut sin = vec![0f32; positions * half];
        for pos in 0..positions {
            for i in 0..half {
                (cos[pos * half + i], sin[pos * half + i]) = angle(pos, i);
            }
        }
        RopeTable { half, cos, sin }
    }

    /// Rotates one head `v` (the table's rotary width) to position `pos`.
    pub fn rotate(&self, v: &mut [f32], pos: usize, layout: RopeLayout) {
        let (c, s) = self.at(pos);
        rotate(v, c, s, layout);
    }

    /// Rotates every head of `v` (consecutive runs of the rotary width) to position `pos`.
    pub fn rotate_heads(&self, v: &mut [f32], pos: usize, layout: RopeLayout) {
        self.rotate_heads_of(v, 2 * self.half, pos, layout);
    }

    /// Rotates the first rotary-width values of every `head_dim`-wide head of `v` to position
    /// `pos`, leaving the rest as they are (partial rotary: Phi-4-mini rotates 96 of 128, as
    /// llama.cpp's `ggml_rope_ext` with `n_rot < head_dim` and HF's `partial_rotary_factor`).
    pub fn rotate_heads_of(&self, v: &mut [f32], head_dim: usize, pos: usize, layout: RopeLayout) {
        let (c, s) = self.at(pos);
        let w = 2 * self.half;
        for head in v.chunks_exact_mut(head_dim) {
            rotate(&mut head[..w], c, s, layout);
        }
    }

    /// The table with every cosine and sine multiplied by `m`: llama.cpp's `attn_factor`
    /// (`mscale` in `ggml_rope_cache_init`), which LongRoPE uses to scale attention scores by
    /// `m²` (`rope.scaling.attn_factor`; HF's `attention_factor`).
    pub fn scaled_by(mut self, m: f32) -> Self {
        if m != 1.0 {
            self.cos.iter_mut().chain(self.sin.iter_mut()).for_each(|v| *v *= m);
        }
        self
    }

    fn at(&self, pos: usize) -> (&[f32], &[f32]) {
        let r = pos * self.half..(pos + 1) * self.half;
        (&self.cos[r.clone()], &self.sin[r])
    }
}

/// Rotates `v` (`2·c.len()` values) by the angles whose cosines and sines are `c`, `s`.
fn rotate(v: &mut [f32], c: &[f32], s: &[f32], layout: RopeLayout) {
    let half = c.len();
    for i in 0..half {
        let (a, b) = match layout {
            RopeLayout::Interleaved => (2 * i, 2 * i + 1),
            RopeLayout::Halves => (i, i + half),
        };
        let (x, y) = (v[a], v[b]);
        v[a] = x * c[i] - y * s[i];
        v[b] = y * c[i] + x * s[i];
    }
}

/// The output head: the final RMSNorm and the LM head matrix (`[vocab × hidden]`; the embedding
/// when tied).
pub struct OutputHead<'a> {
    /// Final norm weights (`hidden`).
    pub norm: &'a [f32],
    /// Its ε.
    pub eps: f32,
    /// LM head.
    pub weight: &'a Weight,
}

impl OutputHead<'_> {
    /// Logits of rows `rows` of the hidden states `x` (`[tokens × hidden]`):
    /// `[rows.len() × vocab]`. Only the wanted rows are normalized and multiplied; the matmul
    /// counts as one in the profile.
    pub fn logits(&self, cx: &mut Fwd<'_>, x: &[f32], rows: &[u32]) -> Vec<f32> {
        let r_n = rows.len();
        let normed = self.hidden(x, rows);
        let mut logits = vec![0f32; r_n * self.weight.rows()];
        cx.matmul(self.weight, &normed, r_n, &mut logits);
        logits
    }

    /// The final norm's output at rows `rows` of `x`, `[rows.len() × hidden]`: what the LM
    /// head reads, and a decoder embedding model's last-token embedding.
    pub fn hidden(&self, x: &[f32], rows: &[u32]) -> Vec<f32> {
        let h = self.norm.len();
        let mut sel = vec![0f32; rows.len() * h];
        for (i, &r) in rows.iter().enumerate() {
            sel[i * h..(i + 1) * h].copy_from_slice(&x[r as usize * h..(r as usize + 1) * h]);
        }
        let mut normed = vec![0f32; rows.len() * h];
        kernels::rms_norm(&sel, self.norm, self.eps, &mut normed);
        normed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rope_layouts() {
        let (c, s) = ([0.0f32, 1.0], [1.0f32, 0.0]);
        let mut v = [1.0, 2.0, 3.0, 4.0];
        rotate(&mut v, &c, &s, RopeLayout::Interleaved);
        // Pair (1,2) rotated by 90°: (−2, 1); pair (3,4) unrotated.
        assert_eq!(v, [-2.0, 1.0, 3.0, 4.0]);
        let mut v = [1.0, 2.0, 3.0, 4.0];
        rotate(&mut v, &c, &s, RopeLayout::Halves);
        // Pairs (v0, v2) = (1, 3) rotated by 90° → (−3, 1); (v1, v3) unrotated.
        assert_eq!(v, [-3.0, 2.0, 1.0, 4.0]);
    }

    /// Position 0 is the identity in both tables; every head of a row turns alike.
    #[test]
    fn tables_and_heads() {
        for t in [RopeTable::llama_cpp(10000.0, 4, 3), RopeTable::hf_f32(10000.0, 4, 3)] {
            let mut v = [1.0, 2.0, 3.0, 4.0];
            t.rotate(&mut v, 0, RopeLayout::Interleaved);
            assert_eq!(v, [1.0, 2.0, 3.0, 4.0]);
            let mut two = [1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0];
            t.rotate_heads(&mut two, 2, RopeLayout::Interleaved);
            assert_eq!(two[..4], two[4..]);
        }
    }
}

/// f32 buffers reused from one forward pass to the next, so that a step's large activations
/// (a MoE layer's gathered rows and expert outputs: megabytes per chunk) are neither zeroed by
/// `calloc` on the engine thread, with the pool's workers waiting, nor faulted in again.
///
/// A taken buffer keeps whatever it held before (only growth past its old length is zeroed):
/// take one only for an output that is written whole (a GEMM's result, a gathered copy), never
/// for an accumulator.
#[derive(Debug, Default)]
pub struct Scratch {
    free: Vec<Vec<f32>>,
}

impl Scratch {
    /// Buffers kept at most (a forward holds a dozen at once, in about twenty sizes).
    const KEEP: usize = 64;
    /// Bytes kept at most: glm5-tiny's 512-token steps use ~30 MB; a larger model's step
    /// buffers past this are allocated per step (and returned to the OS) as before.
    const MAX_BYTES: usize = 256 << 20;

    /// A buffer of `n` elements: a kept one of exactly that length if there is one (a step
    /// asks for the same sizes as the step before, so the steady state zeroes nothing), else
    /// the smallest kept one that holds `n` without growing (only the elements past its old
    /// length are zeroed), else a new zeroed one.
    pub fn take(&mut self, n: usize) -> Vec<f32> {
        let exact = self.free.iter().position(|v| v.len() == n);
        let fit = || {
            self.free
                .iter()
                .enumerate()
                .filter(|(_, v)| v.capacity() >= n)
                .min_by_key(|(_, v)| v.capacity())
                .map(|(i, _)| i)
        };
        match exact.or_else(fit) {
            Some(i) => {
                let mut v = self.free.swap_remove(i);
                v.resize(n, 0.0);
                v
            }
            None => vec![0f32; n],
        }
    }

    /// Returns a buffer for later steps. Past [`Scratch::KEEP`] buffers or
    /// [`Scratch::MAX_BYTES`], the smallest kept ones (the cheapest to make again) are freed.
    pub fn give(&mut self, v: Vec<f32>) {
        if v.capacity() * 4 > Self::MAX_BYTES {
            return;
        }
        self.free.push(v);
        while self.free.len() > Self::KEEP
            || self.free.iter().map(|v| v.capacity() * 4).sum::<usize>() > Self::MAX_BYTES
        {
            let Some(i) = self.free.iter().enumerate().min_by_key(|(_, v)| v.capacity()).map(|(i, _)| i) else { break };
            self.free.swap_remove(i);
        }
    }
}

#[cfg(test)]
mod scratch_tests {
    use super::Scratch;

    /// Buffers come back by exact length, then best fit, keep their contents, and have the
    /// asked length.
    #[test]
    fn scratch_reuses_by_best_fit() {
        let mut s = Scratch::default();
        let mut a = s.take(100);
        a.iter_mut().for_each(|v| *v = 1.0);
        let b = s.take(10);
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        s.give(a);
        s.give(b);
        let c = s.take(8);
        assert_eq!((c.as_ptr(), c.len()), (pb, 8));
        let d = s.take(50);
        assert_eq!((d.as_ptr(), d.len(), d[49]), (pa, 50, 1.0));
        // A new 60-long buffer while `d` is out.
        let g = s.take(60);
        assert_eq!(g.len(), 60);
        s.give(d);
        s.give(g);
        // Exact length first: `d` (length 50, capacity 100), where the best fit by capacity
        // would be `g` (capacity 60).
        let e = s.take(50);
        assert_eq!(e.as_ptr(), pa);
        let f = s.take(1000);
        assert_eq!(f.len(), 1000);
        // A buffer past the byte cap is not kept; many small ones are capped in number.
        s.give(vec![0f32; Scratch::MAX_BYTES / 4 + 1]);
        assert!(s.free.iter().all(|v| v.capacity() * 4 <= Scratch::MAX_BYTES));
        for _ in 0..100 {
            s.give(vec![0f32; 4]);
        }
        assert_eq!(s.free.len(), Scratch::KEEP);
    }
}
