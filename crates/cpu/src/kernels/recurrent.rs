//! Kernels of the recurrent (linear-attention) layers of hybrid models: the causal depthwise
//! convolution with its carried window, the gated delta rule (Yang, Kautz & Hatamizadeh 2024,
//! "Gated Delta Networks", eq. 10; Qwen3-Next / Qwen3.5's `GatedDeltaNet`), the L2 norm of its
//! queries and keys, and the gated RMSNorm of its output; Mamba-2's selective scan (Dao & Gu
//! 2024) and its gate-then-group-RMSNorm.
//!
//! One arithmetic on every ISA (the delta rule compiled for AVX-512 or AVX2 with FMA where the
//! CPU has them: the same operations in the same order, so the same bits): each reduction runs
//! in [`LANES`] interleaved partial sums combined in a fixed tree (the delta rule's sums run per
//! value column, in order, by `f32::mul_add`), so the compiler can keep them in vector registers
//! without reordering a single f32 add, and the bits do not depend on the ISA path, the batch or
//! the chunking of a prompt (a state carried from chunk to chunk is the state a whole prompt
//! reaches).
//!
//! The delta rule runs in its recurrent form for every token, prefill chunks included, over a
//! `[d_k × d_v]` state so that every sum runs across rows of whole value vectors (no horizontal
//! sums) and a block of the state is read and written once per token. The chunkwise (WY) form
//! llama.cpp's `delta-net-base.cpp` uses for prefill does the same multiply-adds per token at
//! `d_k = d_v = 128` (three `C × d × d` products per chunk of `C` against four operations per
//! state element per token) plus `O(C·d)` more; on a GPU it buys tensor cores, on these CPUs
//! the recurrent pass already runs at about 60 % of the FMA peak (see `docs/performance.md`).

/// Partial sums per reduction (one AVX2 register of f32).
pub const LANES: usize = 8;

/// `Σ a[i] · b[i]` in [`LANES`] interleaved partial sums, combined pairwise
/// (`((s0+s4)+(s2+s6)) + ((s1+s5)+(s3+s7))`), then the tail in order.
#[inline]
pub fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut s = [0f32; LANES];
    let body = n / LANES * LANES;
    for (x, y) in a[..body].chunks_exact(LANES).zip(b[..body].chunks_exact(LANES)) {
        for l in 0..LANES {
            s[l] += x[l] * y[l];
        }
    }
    let mut t = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
    for i in body..n {
        t += a[i] * b[i];
    }
    t
}

/// `x / sqrt(Σx² + eps)` in place (HF `l2norm`; llama.cpp's `build_gdn_l2_norm`, which is
/// `rms_norm(x, eps / n) / √n`, the same value).
pub fn l2_norm_in_place(x: &mut [f32], eps: f32) {
    let inv = 1.0 / (dot_lanes(x, x) + eps).sqrt();
    x.iter_mut().for_each(|v| *v *= inv);
}

/// `SiLU(x) = x · σ(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `softplus(x) = ln(1 + eˣ)`, as ggml computes it (`x` itself above 20).
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// The logistic function `1 / (1 + e⁻ˣ)`.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Causal depthwise conv1d of one sequence's new rows with its carried window, then SiLU
/// (Mamba's and GatedDeltaNet's short convolution; ggml's `ssm_conv` + `silu`).
///
/// - `x`: `[n × c]` new input rows, replaced by the outputs;
/// - `state`: `[(k − 1) × c]`, the last `k − 1` input rows before them, oldest first (zeros at
///   a sequence's start), replaced by the last `k − 1` rows of `[state; x]`;
/// - `wt`: `[k × c]`, the taps tap-major (`wt[i · c + ch]` multiplies the input `k − 1 − i`
///   rows back), so output `ch` of row `t` is `Σ_{i<k} in[t + i − (k − 1)][ch] · wt[i][ch]`,
///   summed in tap order.
///
/// # Panics
/// When the lengths disagree with `k` and `c = wt.len() / k`.
pub fn conv1d_silu(x: &mut [f32], state: &mut [f32], wt: &[f32], k: usize) {
    assert!(k >= 1 && wt.len().is_multiple_of(k), "conv1d: {} taps for kernel {k}", wt.len());
    let c = wt.len() / k;
    let w = k - 1;
    assert!(x.len().is_multiple_of(c) && state.len() == w * c, "conv1d: shapes");
    let n = x.len() / c;
    if n == 0 {
        return;
    }
    // The input row `j` of `[state; x]` (before any output is written).
    let old_state = state.to_vec();
    // The new window: the last `w` rows of `[old_state; x]`.
    for r in 0..w {
        let j = n + r; // row of `[old_state; x]`, counted from the window's start
        let src = if j < w { &old_state[j * c..(j + 1) * c] } else { &x[(j - w) * c..(j - w + 1) * c] };
        state[r * c..(r + 1) * c].copy_from_slice(src);
    }
    // Backwards in place: output row `t` reads input rows `t − w ..= t`, none written yet.
    let mut acc = vec![0f32; c];
    for t in (0..n).rev() {
        acc.iter_mut().for_each(|a| *a = 0.0);
        for i in 0..k {
            let j = t + i; // row of `[old_state; x]`
            let src = if j < w { &old_state[j * c..(j + 1) * c] } else { &x[(j - w) * c..(j - w + 1) * c] };
            for ((a, s), wv) in acc.iter_mut().zip(src).zip(&wt[i * c..(i + 1) * c]) {
                *a += s * wv;
            }
        }
        for (o, a) in x[t * c..(t + 1) * c].iter_mut().zip(&acc) {
            *o = silu(*a);
        }
    }
}

/// One output row of [`conv1d_silu`]: `out[ch] = SiLU(Σ_{i<k} input(i)[ch] · wt[i][ch] + b[ch])`,
/// where `input(i)` is the input row `k − 1 − i` rows back (`None`: before the sequence, zeros)
/// and `bias` the convolution's bias when it has one (Mamba-2's `conv1d.bias`; ggml adds it
/// after `ssm_conv`). Without a bias the same arithmetic as [`conv1d_silu`], so rows can be
/// computed in any order, in parallel.
pub fn conv1d_silu_row<'a>(
    out: &mut [f32],
    input: impl Fn(usize) -> Option<&'a [f32]>,
    wt: &[f32],
    k: usize,
    bias: Option<&[f32]>,
) {
    let c = out.len();
    out.iter_mut().for_each(|a| *a = 0.0);
    for i in 0..k {
        let w = &wt[i * c..(i + 1) * c];
        match input(i) {
            Some(src) => out.iter_mut().zip(src).zip(w).for_each(|((a, s), wv)| *a += s * wv),
            None => out.iter_mut().zip(w).for_each(|(a, wv)| *a += 0.0 * wv),
        }
    }
    match bias {
        Some(b) => out.iter_mut().zip(b).for_each(|(a, b)| *a = silu(*a + b)),
        None => out.iter_mut().for_each(|a| *a = silu(*a)),
    }
}

/// One token of one head of a Mamba-2 layer, as [`ssm_scan`] reads it (Dao & Gu 2024,
/// "Transformers are SSMs", the SSD recurrence; llama.cpp's `ggml_ssm_scan` with a scalar `A`
/// per head).
#[derive(Clone, Copy)]
pub struct SsmToken<'a> {
    /// The head's input after the convolution, `[head_dim]`.
    pub x: &'a [f32],
    /// The head's group's input matrix row, `[d_state]`.
    pub b: &'a [f32],
    /// The head's group's output matrix row, `[d_state]`.
    pub c: &'a [f32],
    /// The step `Δ = softplus(dt + dt_bias)`.
    pub dt: f32,
    /// The decay `exp(Δ · A)` (`A = −exp(A_log)`, as the GGUF stores it).
    pub da: f32,
}

/// Mamba-2's selective scan of one head over `n` tokens, in place on its state `[d_state ×
/// head_dim]` (row `s`: state component `s` of every value of the head), outputs
/// `[n × head_dim]`: per token, `S[s] = S[s] · dA + B_s · (x · Δ)` and
/// `y = Σ_s C_s S[s] + D · x` (`ggml_compute_forward_ssm_scan_f32`, the skip term `D` as
/// `mamba2.cpp` adds it after).
///
/// Arithmetic, the same on every ISA: `S · dA` and `x · Δ` rounded, the update and every
/// product summed by fused multiply-adds (`f32::mul_add`), each value's sum over `s` in order,
/// then `D · x` fused in; columns are independent, so the vector width changes the speed,
/// never the bits, and neither does how a prompt is chunked.
///
/// # Panics
/// When `out` is not `n` rows or `state` not `d_state` of them.
pub fn ssm_scan<'a>(state: &mut [f32], n: usize, d: f32, token: impl Fn(usize) -> SsmToken<'a>, out: &mut [f32]) {
    if n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX-512F and FMA, checked above.
            #[allow(unsafe_code)]
            return unsafe { ssm_scan_avx512(state, n, d, &token, out) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX2 and FMA, checked above.
            #[allow(unsafe_code)]
            return unsafe { ssm_scan_avx2(state, n, d, &token, out) };
        }
    }
    ssm_scan_body::<32>(state, n, d, &token, out);
}

/// [`ssm_scan_body`] compiled for AVX-512 (64 columns side by side).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
#[allow(unsafe_code)]
unsafe fn ssm_scan_avx512<'a>(
    state: &mut [f32],
    n: usize,
    d: f32,
    token: &impl Fn(usize) -> SsmToken<'a>,
    out: &mut [f32],
) {
    ssm_scan_body::<64>(state, n, d, token, out);
}

/// [`ssm_scan_body`] compiled for AVX2 (32 columns side by side).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(unsafe_code)]
unsafe fn ssm_scan_avx2<'a>(
    state: &mut [f32],
    n: usize,
    d: f32,
    token: &impl Fn(usize) -> SsmToken<'a>,
    out: &mut [f32],
) {
    ssm_scan_body::<32>(state, n, d, token, out);
}

/// The body of [`ssm_scan`] (`n > 0`), `W` columns (values of the head) at a time, each block
/// through every token while it sits in L1.
#[inline(always)]
fn ssm_scan_body<'a, const W: usize>(
    state: &mut [f32],
    n: usize,
    d: f32,
    token: &impl Fn(usize) -> SsmToken<'a>,
    out: &mut [f32],
) {
    let hd = out.len() / n;
    let ds = state.len() / hd.max(1);
    assert!(out.len() == n * hd && state.len() == hd * ds, "ssm_scan: shapes");
    let mut i0 = 0;
    while i0 < hd {
        if i0 + W <= hd {
            ssm_columns::<W>(state, hd, ds, i0, n, d, token, out);
            i0 += W;
        } else if i0 + 8 <= hd {
            ssm_columns::<8>(state, hd, ds, i0, n, d, token, out);
            i0 += 8;
        } else {
            ssm_columns::<1>(state, hd, ds, i0, n, d, token, out);
            i0 += 1;
        }
    }
}

/// Columns `i0 .. i0 + W` of [`ssm_scan`] through all `n` tokens.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn ssm_columns<'a, const W: usize>(
    state: &mut [f32],
    hd: usize,
    ds: usize,
    i0: usize,
    n: usize,
    d: f32,
    token: &impl Fn(usize) -> SsmToken<'a>,
    out: &mut [f32],
) {
    for t in 0..n {
        let tk = token(t);
        let x = &tk.x[i0..i0 + W];
        let xdt: [f32; W] = std::array::from_fn(|l| x[l] * tk.dt);
        let (b, c) = (&tk.b[..ds], &tk.c[..ds]);
        let mut acc = [0f32; W];
        for s in 0..ds {
            let (bs, cs) = (b[s], c[s]);
            let row = &mut state[s * hd + i0..s * hd + i0 + W];
            for l in 0..W {
                let v = bs.mul_add(xdt[l], row[l] * tk.da);
                row[l] = v;
                acc[l] = cs.mul_add(v, acc[l]);
            }
        }
        let y = &mut out[t * hd + i0..t * hd + i0 + W];
        for l in 0..W {
            y[l] = d.mul_add(x[l], acc[l]);
        }
    }
}

/// Mamba-2's output norm, gate first (`norm_before_gate = False`): `x · SiLU(z)`, then RMSNorm
/// over each group of `group` values, times the weight `w` (as wide as `x`), in place
/// (llama.cpp's `ggml_swiglu_split` then `build_norm` over `{d_inner / n_group, n_group}`).
pub fn gate_group_rms_norm(x: &mut [f32], z: &[f32], w: &[f32], group: usize, eps: f32) {
    x.iter_mut().zip(z).for_each(|(v, zv)| *v *= silu(*zv));
    for (xg, wg) in x.chunks_exact_mut(group).zip(w.chunks_exact(group)) {
        let inv = 1.0 / (dot_lanes(xg, xg) / group as f32 + eps).sqrt();
        xg.iter_mut().zip(wg).for_each(|(v, wv)| *v = *v * inv * wv);
    }
}

/// One token's inputs to [`gated_delta_rule`] for one value head.
#[derive(Debug, Clone, Copy)]
pub struct DeltaToken<'a> {
    /// The query (L2-normed and scaled by `1/√d_k`), `d_k`.
    pub q: &'a [f32],
    /// The key (L2-normed), `d_k`.
    pub k: &'a [f32],
    /// The value, `d_v`.
    pub v: &'a [f32],
    /// The log decay `g = −exp(A_log) · softplus(a + dt_bias)` (≤ 0).
    pub g: f32,
    /// The write strength `β = σ(b)`.
    pub beta: f32,
}

/// The gated delta rule of one value head over one sequence's new tokens, recurrent form:
/// per token `S ← e^g · S`, `S ← S + β (v − Sᵀk) kᵀ` (the delta rule's correction of what `S`
/// recalls for `k`), output `o = Sᵀq`.
///
/// `state` is `[d_k × d_v]`: row `i` is key component `i`'s weights over the values, so the
/// recalls `Sᵀk` and outputs `Sᵀq` are sums over rows of whole value vectors (no horizontal
/// sums): per token `s ← e^g s`, `r = Σ_i k_i s_i`, `d = β (v − r)`, `s_i += k_i d`,
/// `o = Σ_i q_i s_i`. `out` receives `d_v` values per token. `token(t)` gives token `t`'s
/// inputs, `t < n`.
///
/// Arithmetic, the same on every ISA: `e^g · s` rounded, then the update and every product
/// summed by fused multiply-adds (`f32::mul_add`, one rounding everywhere), each value's sums
/// over `i` in order. Columns of the state are independent, so how many go side by side (the
/// vector width) changes the speed, never the bits.
///
/// # Panics
/// When `state` is not `d_k × d_v` for the tokens' widths, or `out` is not `n × d_v`.
pub fn gated_delta_rule<'a>(state: &mut [f32], n: usize, token: impl Fn(usize) -> DeltaToken<'a>, out: &mut [f32]) {
    if n == 0 {
        return;
    }
    // The same function compiled for wider vectors and hardware FMA where the CPU has them: the
    // same operations in the same order (Rust neither reassociates nor fuses float operations,
    // and `mul_add` rounds once everywhere), so the same bits.
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX-512F and FMA, checked above.
            #[allow(unsafe_code)]
            return unsafe { delta_rule_avx512(state, n, &token, out) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX2 and FMA, checked above.
            #[allow(unsafe_code)]
            return unsafe { delta_rule_avx2(state, n, &token, out) };
        }
    }
    delta_rule_body::<32>(state, n, &token, out);
}

/// [`delta_rule_body`] compiled for AVX-512 (128 columns side by side: eight registers per sum,
/// enough independent chains to cover the FMA latency; measured faster than 64 or 32).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
#[allow(unsafe_code)]
unsafe fn delta_rule_avx512<'a>(
    state: &mut [f32],
    n: usize,
    token: &impl Fn(usize) -> DeltaToken<'a>,
    out: &mut [f32],
) {
    delta_rule_body::<128>(state, n, token, out);
}

/// [`delta_rule_body`] compiled for AVX2 (64 columns side by side: eight registers per sum).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(unsafe_code)]
unsafe fn delta_rule_avx2<'a>(state: &mut [f32], n: usize, token: &impl Fn(usize) -> DeltaToken<'a>, out: &mut [f32]) {
    delta_rule_body::<64>(state, n, token, out);
}

/// The body of [`gated_delta_rule`] (`n > 0`), `W` columns of the state at a time: each block of
/// columns (`d_k × W`: 64 KB at `d_k = W = 128`, in L2; 16 KB at `W = 32`) goes through every
/// token while it stays in cache, so a prefill chunk streams the tokens' keys and queries
/// instead of the state. One read-and-write pass over the block per token: the correction of
/// token `t` and its output, then the next token's decay and recall; before the first token a
/// read-only pass gives its recall (so a decode step reads its state from memory once and
/// writes it once).
#[inline(always)]
fn delta_rule_body<'a, const W: usize>(
    state: &mut [f32],
    n: usize,
    token: &impl Fn(usize) -> DeltaToken<'a>,
    out: &mut [f32],
) {
    let (dk, dv) = (token(0).k.len(), token(0).v.len());
    assert!(state.len() == dk * dv && out.len() == n * dv, "delta rule: shapes");
    let mut j0 = 0;
    while j0 < dv {
        if j0 + W <= dv {
            delta_columns::<W>(state, dk, dv, j0, n, token, out);
            j0 += W;
        } else if j0 + 16 <= dv {
            delta_columns::<16>(state, dk, dv, j0, n, token, out);
            j0 += 16;
        } else {
            delta_columns::<1>(state, dk, dv, j0, n, token, out);
            j0 += 1;
        }
    }
}

/// Columns `j0 .. j0 + W` of [`gated_delta_rule`] through all `n` tokens.
#[inline(always)]
fn delta_columns<'a, const W: usize>(
    state: &mut [f32],
    dk: usize,
    dv: usize,
    j0: usize,
    n: usize,
    token: &impl Fn(usize) -> DeltaToken<'a>,
    out: &mut [f32],
) {
    let first = token(0);
    let a0 = first.g.exp();
    // The first token's recall, `Σ_i k_i (e^g s_i)`, without writing the state.
    let mut r = [0f32; W];
    for (i, &ki) in first.k[..dk].iter().enumerate() {
        let s = &state[i * dv + j0..i * dv + j0 + W];
        for l in 0..W {
            r[l] = ki.mul_add(s[l] * a0, r[l]);
        }
    }
    for t in 0..n {
        let tk = token(t);
        let v = &tk.v[j0..j0 + W];
        let d: [f32; W] = std::array::from_fn(|l| (v[l] - r[l]) * tk.beta);
        let o = &mut out[t * dv + j0..t * dv + j0 + W];
        r = if t + 1 < n {
            let nx = token(t + 1);
            match t {
                0 => delta_step::<W, true, true>(state, dk, dv, j0, a0, &d, tk.k, tk.q, nx.g.exp(), nx.k, o),
                _ => delta_step::<W, false, true>(state, dk, dv, j0, 1.0, &d, tk.k, tk.q, nx.g.exp(), nx.k, o),
            }
        } else {
            match t {
                0 => delta_step::<W, true, false>(state, dk, dv, j0, a0, &d, tk.k, tk.q, 1.0, tk.k, o),
                _ => delta_step::<W, false, false>(state, dk, dv, j0, 1.0, &d, tk.k, tk.q, 1.0, tk.k, o),
            }
        };
    }
}

/// One token over columns `j0 .. j0 + W`: per row `i`, `s ← a_in · s` (when `SCALE`),
/// `s ← s + k_i d`, `o += q_i s`; then (when `NEXT`) `s ← a · s` and the next token's recall
/// `r += kn_i s`, returned (zeros without `NEXT`). The state keeps the last `s`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn delta_step<const W: usize, const SCALE: bool, const NEXT: bool>(
    state: &mut [f32],
    dk: usize,
    dv: usize,
    j0: usize,
    a_in: f32,
    d: &[f32; W],
    k: &[f32],
    q: &[f32],
    a: f32,
    kn: &[f32],
    o: &mut [f32],
) -> [f32; W] {
    let (k, q, kn) = (&k[..dk], &q[..dk], &kn[..dk]);
    let mut acc = [0f32; W];
    let mut r = [0f32; W];
    for i in 0..dk {
        let (ki, qi, ni) = (k[i], q[i], kn[i]);
        let s = &mut state[i * dv + j0..i * dv + j0 + W];
        for l in 0..W {
            let s0 = if SCALE { s[l] * a_in } else { s[l] };
            let s1 = ki.mul_add(d[l], s0);
            acc[l] = qi.mul_add(s1, acc[l]);
            s[l] = if NEXT {
                let s2 = s1 * a;
                r[l] = ni.mul_add(s2, r[l]);
                s2
            } else {
                s1
            };
        }
    }
    o[..W].copy_from_slice(&acc);
    r
}

/// The gated RMSNorm of a GatedDeltaNet head's output (HF `Qwen3NextRMSNormGated`;
/// llama.cpp's `build_norm_gated`): `y = x / sqrt(mean(x²) + eps) · w · SiLU(z)`, in place in
/// `x`, per head of `w.len()` values.
pub fn gated_rms_norm(x: &mut [f32], z: &[f32], w: &[f32], eps: f32) {
    let d = w.len();
    for (xh, zh) in x.chunks_exact_mut(d).zip(z.chunks_exact(d)) {
        let inv = 1.0 / (dot_lanes(xh, xh) / d as f32 + eps).sqrt();
        for ((xv, zv), wv) in xh.iter_mut().zip(zh).zip(w) {
            *xv = *xv * inv * wv * silu(*zv);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand(seed: &mut u64, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| crate::kernels::test_rand(seed) * scale).collect()
    }

    /// The conv over a whole sequence equals the conv over chunks carrying the window, bit for
    /// bit, and both equal the f64 definition.
    #[test]
    fn conv_chunks_carry_the_window() {
        let (k, c, n) = (4, 24, 11);
        let mut seed = 7;
        let x = rand(&mut seed, n * c, 1.0);
        let wt = rand(&mut seed, k * c, 0.5);
        let mut whole = x.clone();
        let mut st = vec![0f32; (k - 1) * c];
        conv1d_silu(&mut whole, &mut st, &wt, k);
        let mut parts = x.clone();
        let mut st2 = vec![0f32; (k - 1) * c];
        for (a, b) in [(0, 1), (1, 3), (3, 8), (8, 11)] {
            conv1d_silu(&mut parts[a * c..b * c], &mut st2, &wt, k);
        }
        assert_eq!(whole, parts);
        assert_eq!(st, st2);
        for t in 0..n {
            for ch in 0..c {
                let mut acc = 0f64;
                for i in 0..k {
                    if let Some(j) = (t + i).checked_sub(k - 1) {
                        acc += x[j * c + ch] as f64 * wt[i * c + ch] as f64;
                    }
                }
                let want = acc / (1.0 + (-acc).exp());
                assert!((whole[t * c + ch] as f64 - want).abs() < 1e-5, "t {t} ch {ch}");
            }
        }
        // The carried window is the last k − 1 inputs.
        assert_eq!(st, x[(n - (k - 1)) * c..].to_vec());
        // Row by row, in any order: the same bits.
        for t in (0..n).rev() {
            let mut row = vec![0f32; c];
            let input = |i: usize| (t + i).checked_sub(k - 1).map(|j| &x[j * c..(j + 1) * c]);
            conv1d_silu_row(&mut row, input, &wt, k, None);
            assert_eq!(row, whole[t * c..(t + 1) * c].to_vec(), "row {t}");
        }
    }

    /// A delta rule test's inputs for `n` tokens: queries and keys L2-normed, `g ≤ 0`,
    /// `β ∈ (0, 1)`.
    struct DeltaInputs {
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        g: Vec<f32>,
        beta: Vec<f32>,
        dk: usize,
        dv: usize,
    }

    impl DeltaInputs {
        fn new(seed: &mut u64, dk: usize, dv: usize, n: usize) -> DeltaInputs {
            let mut q = rand(seed, n * dk, 1.0);
            let mut k = rand(seed, n * dk, 1.0);
            let v = rand(seed, n * dv, 1.0);
            let g = rand(seed, n, 1.0).iter().map(|x| -x.abs()).collect();
            let beta = rand(seed, n, 2.0).iter().map(|x| sigmoid(*x)).collect();
            for t in 0..n {
                l2_norm_in_place(&mut q[t * dk..(t + 1) * dk], 1e-6);
                l2_norm_in_place(&mut k[t * dk..(t + 1) * dk], 1e-6);
            }
            DeltaInputs { q, k, v, g, beta, dk, dv }
        }

        fn token(&self, t: usize) -> DeltaToken<'_> {
            let (dk, dv) = (self.dk, self.dv);
            DeltaToken {
                q: &self.q[t * dk..(t + 1) * dk],
                k: &self.k[t * dk..(t + 1) * dk],
                v: &self.v[t * dv..(t + 1) * dv],
                g: self.g[t],
                beta: self.beta[t],
            }
        }
    }

    /// The recurrent delta rule against its definition in f64 with the state as a matrix, and
    /// chunked equals whole.
    #[test]
    fn delta_rule_matches_f64_definition() {
        // 140 values: the widest column path (128 on AVX-512) and the single columns.
        let (dk, dv, n) = (16, 140, 9);
        let mut seed = 11;
        let inp = DeltaInputs::new(&mut seed, dk, dv, n);
        let tok = |t: usize| inp.token(t);
        let (q, kk, v, g, beta) = (&inp.q, &inp.k, &inp.v, &inp.g, &inp.beta);
        let mut st = vec![0f32; dk * dv];
        let mut out = vec![0f32; n * dv];
        gated_delta_rule(&mut st, n, tok, &mut out);
        let mut st2 = vec![0f32; dk * dv];
        let mut out2 = vec![0f32; n * dv];
        gated_delta_rule(&mut st2, 4, tok, &mut out2[..4 * dv]);
        gated_delta_rule(&mut st2, n - 4, |t| tok(t + 4), &mut out2[4 * dv..]);
        assert_eq!(out, out2);
        assert_eq!(st, st2);
        // S as a d_k × d_v matrix in f64.
        let mut s = vec![0f64; dk * dv];
        for t in 0..n {
            let e = (g[t] as f64).exp();
            s.iter_mut().for_each(|x| *x *= e);
            let kt = &kk[t * dk..(t + 1) * dk];
            for j in 0..dv {
                let sk: f64 = (0..dk).map(|i| s[i * dv + j] * kt[i] as f64).sum();
                let d = (v[t * dv + j] as f64 - sk) * beta[t] as f64;
                for i in 0..dk {
                    s[i * dv + j] += kt[i] as f64 * d;
                }
            }
            for j in 0..dv {
                let o: f64 = (0..dk).map(|i| s[i * dv + j] * q[t * dk + i] as f64).sum();
                assert!((out[t * dv + j] as f64 - o).abs() < 1e-5, "t {t} j {j}: {} vs {o}", out[t * dv + j]);
            }
        }
    }

    /// The dispatched delta rule (AVX-512 or AVX2 with FMA where present, 128 or 64 columns at a
    /// time) equals the portable body 16 columns at a time bit for bit, over a value width that
    /// takes every column path (150 = 128 + 16 + 6), token by token and over a chunk.
    #[test]
    fn delta_rule_same_bits_on_every_path() {
        let (dk, dv, n) = (24, 150, 5);
        let mut seed = 23;
        let inp = DeltaInputs::new(&mut seed, dk, dv, n);
        let tok = |t: usize| inp.token(t);
        let init = rand(&mut seed, dk * dv, 0.5);
        let (mut st, mut out) = (init.clone(), vec![0f32; n * dv]);
        gated_delta_rule(&mut st, n, tok, &mut out);
        let (mut st2, mut out2) = (init.clone(), vec![0f32; n * dv]);
        delta_rule_body::<16>(&mut st2, n, &tok, &mut out2);
        assert_eq!(out, out2);
        assert_eq!(st, st2);
        // The AVX2 path too where the CPU has it (an AVX-512 machine dispatches past it).
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            let (mut st4, mut out4) = (init.clone(), vec![0f32; n * dv]);
            // SAFETY: the CPU has AVX2 and FMA, checked above.
            #[allow(unsafe_code)]
            unsafe {
                delta_rule_avx2(&mut st4, n, &tok, &mut out4)
            };
            assert_eq!((&out, &st), (&out4, &st4));
        }
        let (mut st3, mut out3) = (init, vec![0f32; n * dv]);
        for t in 0..n {
            gated_delta_rule(&mut st3, 1, |_| tok(t), &mut out3[t * dv..(t + 1) * dv]);
        }
        assert_eq!(out, out3);
        assert_eq!(st, st3);
    }

    /// The dispatched Mamba-2 scan equals the portable body 8 columns at a time bit for bit, over
    /// a head width that takes every column path (75 = 64 + 8 + 3), whole and token by token.
    #[test]
    fn ssm_scan_same_bits_on_every_path() {
        let (hd, ds, n) = (75, 20, 4);
        let mut seed = 31;
        let x = rand(&mut seed, n * hd, 1.0);
        let b = rand(&mut seed, n * ds, 1.0);
        let c = rand(&mut seed, n * ds, 1.0);
        let dt: Vec<f32> = rand(&mut seed, n, 1.0).iter().map(|v| softplus(*v)).collect();
        let tok = |t: usize| SsmToken {
            x: &x[t * hd..(t + 1) * hd],
            b: &b[t * ds..(t + 1) * ds],
            c: &c[t * ds..(t + 1) * ds],
            dt: dt[t],
            da: (dt[t] * -0.6).exp(),
        };
        let init = rand(&mut seed, hd * ds, 0.5);
        let (mut st, mut out) = (init.clone(), vec![0f32; n * hd]);
        ssm_scan(&mut st, n, 0.4, tok, &mut out);
        let (mut st2, mut out2) = (init.clone(), vec![0f32; n * hd]);
        ssm_scan_body::<8>(&mut st2, n, 0.4, &tok, &mut out2);
        assert_eq!((&out, &st), (&out2, &st2));
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            let (mut st4, mut out4) = (init.clone(), vec![0f32; n * hd]);
            // SAFETY: the CPU has AVX2 and FMA, checked above.
            #[allow(unsafe_code)]
            unsafe {
                ssm_scan_avx2(&mut st4, n, 0.4, &tok, &mut out4)
            };
            assert_eq!((&out, &st), (&out4, &st4));
        }
        let (mut st3, mut out3) = (init, vec![0f32; n * hd]);
        for t in 0..n {
            ssm_scan(&mut st3, 1, 0.4, |_| tok(t), &mut out3[t * hd..(t + 1) * hd]);
        }
        assert_eq!((&out, &st), (&out3, &st3));
    }

    /// The Mamba-2 scan against its definition in f64, chunked equals whole, and the gated group
    /// norm against f64.
    #[test]
    fn ssm_scan_matches_f64_definition() {
        let (hd, ds, n) = (6, 20, 9);
        let mut seed = 5;
        let x = rand(&mut seed, n * hd, 1.0);
        let b = rand(&mut seed, n * ds, 1.0);
        let c = rand(&mut seed, n * ds, 1.0);
        let dt: Vec<f32> = rand(&mut seed, n, 1.0).iter().map(|v| softplus(*v)).collect();
        let a = -0.7f32;
        let d = 0.3f32;
        let tok = |t: usize| SsmToken {
            x: &x[t * hd..(t + 1) * hd],
            b: &b[t * ds..(t + 1) * ds],
            c: &c[t * ds..(t + 1) * ds],
            dt: dt[t],
            da: (dt[t] * a).exp(),
        };
        let mut st = vec![0f32; hd * ds];
        let mut out = vec![0f32; n * hd];
        ssm_scan(&mut st, n, d, tok, &mut out);
        let mut st2 = vec![0f32; hd * ds];
        let mut out2 = vec![0f32; n * hd];
        ssm_scan(&mut st2, 3, d, tok, &mut out2[..3 * hd]);
        ssm_scan(&mut st2, n - 3, d, |t| tok(t + 3), &mut out2[3 * hd..]);
        assert_eq!((out.clone(), st.clone()), (out2, st2));
        let mut s = vec![0f64; hd * ds];
        for t in 0..n {
            let da = (dt[t] as f64 * a as f64).exp();
            for i in 0..hd {
                let mut y = 0f64;
                for j in 0..ds {
                    let v = &mut s[i * ds + j];
                    *v = *v * da + b[t * ds + j] as f64 * x[t * hd + i] as f64 * dt[t] as f64;
                    y += *v * c[t * ds + j] as f64;
                }
                y += d as f64 * x[t * hd + i] as f64;
                assert!((out[t * hd + i] as f64 - y).abs() < 1e-4 * (1.0 + y.abs()), "t {t} i {i}");
            }
        }
        let (g, w_n) = (4, 12);
        let mut y = rand(&mut seed, w_n, 2.0);
        let z = rand(&mut seed, w_n, 2.0);
        let w = rand(&mut seed, w_n, 1.0);
        let gated: Vec<f64> =
            y.iter().zip(&z).map(|(v, z)| *v as f64 * (*z as f64 / (1.0 + (-*z as f64).exp()))).collect();
        let mut want = vec![0f64; w_n];
        for (k, grp) in gated.chunks(g).enumerate() {
            let inv = 1.0 / (grp.iter().map(|v| v * v).sum::<f64>() / g as f64 + 1e-5).sqrt();
            for (i, v) in grp.iter().enumerate() {
                want[k * g + i] = v * inv * w[k * g + i] as f64;
            }
        }
        gate_group_rms_norm(&mut y, &z, &w, g, 1e-5);
        for (a, b) in y.iter().zip(&want) {
            assert!((*a as f64 - b).abs() < 1e-5, "{a} vs {b}");
        }
    }
}
