//! GPTQ (Frantar et al. 2022, "GPTQ: Accurate Post-Training Quantization for Generative
//! Pre-trained Transformers", Algorithm 1) producing NVFP4 weights.
//!
//! For a linear layer `W [N, K]` and calibration inputs `X [T, K]`, `H = XᵀX` (summed over
//! tokens). Columns are quantized left to right; the rounding error of column `j`, scaled by
//! the Cholesky factor `U` of `H⁻¹` (upper, `H⁻¹ = UᵀU`), is pushed onto the columns not yet
//! quantized: `W[:, c] −= (w_j − q_j) / U[j, j] · U[j, c]` for `c > j`. This minimizes the layer's
//! output error `‖XWᵀ − XQᵀ‖²` greedily instead of the weight error.
//!
//! NVFP4 specifics: the global scale is amax-based over the original `W` (as in
//! [`Nvfp4Matrix::quantize`]); each 16-column block's E4M3 scale is fixed when the block is
//! reached, from the amax of the block's *updated* weights (GPTQ's group handling in the
//! reference implementation), and each weight rounds to the nearest E2M1 value under it.
//! Dampening: `λ = damp · mean(diag H)` is added to the diagonal; columns never excited by
//! the calibration data (`H[j,j] = 0`) are zeroed, as in the reference.

use sparrow_cpu::format::nvfp4::{
    amax, e2m1_to_f32, e4m3_to_f32, f32_to_e2m1, f32_to_e4m3, global_scale, Nvfp4Matrix, BLOCK,
};

/// Errors of [`gptq_nvfp4`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GptqError {
    /// `H + λI` is not positive definite (no or degenerate calibration data).
    #[error("the calibration Hessian is not positive definite (pivot {0})")]
    NotPositiveDefinite(usize),
    /// Shapes do not fit.
    #[error("shape: {0}")]
    Shape(String),
}

/// Default dampening fraction (the reference implementation's `percdamp`).
pub const DAMP: f64 = 0.01;

/// In-place Cholesky `A = LLᵀ` of a symmetric `n × n` row-major matrix; returns `L` in the
/// lower triangle (upper set to 0).
fn cholesky(a: &mut [f64], n: usize) -> Result<(), GptqError> {
    for j in 0..n {
        let mut d = a[j * n + j];
        for k in 0..j {
            d -= a[j * n + k] * a[j * n + k];
        }
        if d <= 0.0 || !d.is_finite() {
            return Err(GptqError::NotPositiveDefinite(j));
        }
        let d = d.sqrt();
        a[j * n + j] = d;
        for i in j + 1..n {
            let mut s = a[i * n + j];
            for k in 0..j {
                s -= a[i * n + k] * a[j * n + k];
            }
            a[i * n + j] = s / d;
        }
        for k in j + 1..n {
            a[j * n + k] = 0.0;
        }
    }
    Ok(())
}

/// `U` (upper) with `H⁻¹ = UᵀU`, from `H` (`n × n`, positive definite).
fn inverse_cholesky_upper(h: &[f64], n: usize) -> Result<Vec<f64>, GptqError> {
    let mut l = h.to_vec();
    cholesky(&mut l, n)?;
    // L⁻¹ by forward substitution (lower triangular).
    let mut li = vec![0f64; n * n];
    for j in 0..n {
        li[j * n + j] = 1.0 / l[j * n + j];
        for i in j + 1..n {
            let mut s = 0.0;
            for k in j..i {
                s += l[i * n + k] * li[k * n + j];
            }
            li[i * n + j] = -s / l[i * n + i];
        }
    }
    // H⁻¹ = L⁻ᵀ L⁻¹.
    let mut hinv = vec![0f64; n * n];
    for i in 0..n {
        for j in 0..=i {
            let mut s = 0.0;
            for k in i..n {
                s += li[k * n + i] * li[k * n + j];
            }
            hinv[i * n + j] = s;
            hinv[j * n + i] = s;
        }
    }
    // Upper Cholesky of H⁻¹: H⁻¹ = UᵀU with U = Lᵀ of the lower factor.
    cholesky(&mut hinv, n)?;
    let mut u = vec![0f64; n * n];
    for i in 0..n {
        for j in 0..=i {
            u[j * n + i] = hinv[i * n + j];
        }
    }
    Ok(u)
}

/// Quantizes `w` (`[rows, cols]` row-major) to NVFP4 with GPTQ against the calibration
/// Hessian `h` (`[cols, cols]`, `Σ_t x_t x_tᵀ`).
///
/// # Errors
/// Shape mismatches, or a Hessian that stays indefinite after dampening.
pub fn gptq_nvfp4(w: &[f32], rows: usize, cols: usize, h: &[f64], damp: f64) -> Result<Nvfp4Matrix, GptqError> {
    gptq_nvfp4_with(w, rows, cols, h, damp, false, None)
}

/// [`gptq_nvfp4`] with the choice of "act order" (the reference's `desc_act` with
/// `static_groups`): every block scale is fixed up front from the original weights, then
/// columns are quantized in decreasing order of `H[j,j]`, so the most excited inputs are
/// rounded first while the most error can still be compensated.
///
/// `global` overrides the tensor scale (shared by fused siblings, see
/// [`Nvfp4Matrix::quantize_global`]); `None` derives it from `w`'s amax.
///
/// # Errors
/// As [`gptq_nvfp4`].
pub fn gptq_nvfp4_with(
    w: &[f32],
    rows: usize,
    cols: usize,
    h: &[f64],
    damp: f64,
    act_order: bool,
    global: Option<f32>,
) -> Result<Nvfp4Matrix, GptqError> {
    if !cols.is_multiple_of(BLOCK) || w.len() != rows * cols || h.len() != cols * cols {
        return Err(GptqError::Shape(format!("W {}, [{rows}, {cols}], H {}", w.len(), h.len())));
    }
    let global = global.unwrap_or_else(|| global_scale(amax(w)));
    let nb = cols / BLOCK;
    // Static groups (act order): every block scale from the original weights, up front.
    let mut weight_scale = vec![0u8; rows * nb];
    if act_order {
        for r in 0..rows {
            for b in 0..nb {
                let bmax = amax(&w[r * cols + b * BLOCK..r * cols + (b + 1) * BLOCK]);
                weight_scale[r * nb + b] = f32_to_e4m3(bmax / 6.0 / global);
            }
        }
    }
    // Work in the quantization order: column i of the work matrices is original column perm[i].
    let mut perm: Vec<usize> = (0..cols).collect();
    if act_order {
        perm.sort_by(|&a, &b| h[b * cols + b].total_cmp(&h[a * cols + a]).then(a.cmp(&b)));
    }
    let mut hp = vec![0f64; cols * cols];
    for i in 0..cols {
        for j in 0..cols {
            hp[i * cols + j] = h[perm[i] * cols + perm[j]];
        }
    }
    let mut wp = vec![0f64; rows * cols];
    for r in 0..rows {
        for i in 0..cols {
            wp[r * cols + i] = w[r * cols + perm[i]] as f64;
        }
    }
    let mean_diag = (0..cols).map(|j| hp[j * cols + j]).sum::<f64>() / cols as f64;
    for j in 0..cols {
        if hp[j * cols + j] == 0.0 {
            hp[j * cols + j] = 1.0;
            for r in 0..rows {
                wp[r * cols + j] = 0.0;
            }
        }
    }
    let lambda = damp * if mean_diag > 0.0 { mean_diag } else { 1.0 };
    for j in 0..cols {
        hp[j * cols + j] += lambda;
    }
    let u = inverse_cholesky_upper(&hp, cols)?;
    let mut weight = vec![0u8; rows * cols / 2];
    for j in 0..cols {
        let c = perm[j];
        if !act_order && j % BLOCK == 0 {
            // Dynamic groups: the block's scale from its weights as updated so far (here the
            // order is the identity, so the block is columns j..j+16).
            for r in 0..rows {
                let bmax = wp[r * cols + j..r * cols + j + BLOCK].iter().fold(0f64, |a, v| a.max(v.abs())) as f32;
                weight_scale[r * nb + j / BLOCK] = f32_to_e4m3(bmax / 6.0 / global);
            }
        }
        let d = u[j * cols + j];
        for r in 0..rows {
            let scale = e4m3_to_f32(weight_scale[r * nb + c / BLOCK]) * global;
            let v = wp[r * cols + j] as f32;
            let code = if scale > 0.0 { f32_to_e2m1(v / scale) } else { 0 };
            let idx = r * cols + c;
            weight[idx / 2] |= if idx.is_multiple_of(2) { code } else { code << 4 };
            let q = (e2m1_to_f32(code) * scale) as f64;
            let err = (wp[r * cols + j] - q) / d;
            let (urow, wrow) = (&u[j * cols + j + 1..(j + 1) * cols], &mut wp[r * cols + j + 1..(r + 1) * cols]);
            for (wc, uc) in wrow.iter_mut().zip(urow) {
                *wc -= err * uc;
            }
        }
    }
    Ok(Nvfp4Matrix { rows, cols, weight, weight_scale, weight_scale_2: vec![global; rows] })
}

/// Adds `Σ_t x_t x_tᵀ` over the `tokens` rows of `x` (`[tokens, k]`) into `h` (`[k, k]`).
pub fn accumulate_hessian(h: &mut [f64], x: &[f32], tokens: usize, k: usize) {
    debug_assert_eq!(h.len(), k * k);
    for t in 0..tokens {
        let xt = &x[t * k..(t + 1) * k];
        for i in 0..k {
            let xi = xt[i] as f64;
            if xi == 0.0 {
                continue;
            }
            let row = &mut h[i * k..(i + 1) * k];
            for (hj, &xj) in row.iter_mut().zip(xt) {
                *hj += xi * xj as f64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn out_err(w: &[f32], q: &Nvfp4Matrix, x: &[f32], t: usize) -> f64 {
        let (n, k) = (q.rows, q.cols);
        let mut row = vec![0f32; k];
        let mut e = 0.0;
        for r in 0..n {
            q.dequantize_row(r, &mut row);
            for s in 0..t {
                let xs = &x[s * k..(s + 1) * k];
                let a: f64 = w[r * k..(r + 1) * k].iter().zip(xs).map(|(a, b)| *a as f64 * *b as f64).sum();
                let b: f64 = row.iter().zip(xs).map(|(a, b)| *a as f64 * *b as f64).sum();
                e += (a - b).powi(2);
            }
        }
        e
    }

    #[test]
    fn cholesky_inverse_by_hand() {
        // H = [[4, 2], [2, 3]]: H⁻¹ = [[3, −2], [−2, 4]] / 8; its upper factor U has
        // U00 = sqrt(3/8), U01 = −2/8 / U00, U11 = sqrt(4/8 − U01²).
        let u = inverse_cholesky_upper(&[4.0, 2.0, 2.0, 3.0], 2).expect("pd");
        let u00 = (3.0f64 / 8.0).sqrt();
        let u01 = -0.25 / u00;
        let u11 = (0.5 - u01 * u01).sqrt();
        for (got, want) in u.iter().zip([u00, u01, 0.0, u11]) {
            assert!((got - want).abs() < 1e-12, "{u:?}");
        }
        assert!(inverse_cholesky_upper(&[1.0, 2.0, 2.0, 1.0], 2).is_err(), "indefinite");
    }

    /// On correlated inputs with uneven channel scales, GPTQ's output error is well below
    /// round-to-nearest's, and with a diagonal Hessian on a single token it reduces to RTN.
    #[test]
    fn gptq_beats_round_to_nearest_on_output_error() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let (n, k, t) = (24, 64, 256);
        let w: Vec<f32> = (0..n * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let mix: Vec<f32> = (0..k * 8).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let mut x = vec![0f32; t * k];
        for s in 0..t {
            let z: Vec<f32> = (0..8).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            for c in 0..k {
                let chan = if c % 7 == 0 { 8.0 } else { 1.0 };
                x[s * k + c] =
                    chan * ((0..8).map(|i| mix[c * 8 + i] * z[i]).sum::<f32>() + 0.1 * rng.random_range(-1.0f32..1.0));
            }
        }
        let mut h = vec![0f64; k * k];
        accumulate_hessian(&mut h, &x, t, k);
        let g = gptq_nvfp4(&w, n, k, &h, DAMP).expect("gptq");
        let rtn = Nvfp4Matrix::quantize(&w, n, k);
        let (eg, er) = (out_err(&w, &g, &x, t), out_err(&w, &rtn, &x, t));
        assert!(eg < 0.6 * er, "GPTQ output error {eg} vs RTN {er}");
        let ga = gptq_nvfp4_with(&w, n, k, &h, DAMP, true, None).expect("act order");
        let ea = out_err(&w, &ga, &x, t);
        assert!(ea < 0.6 * er, "GPTQ act-order output error {ea} vs RTN {er}");
        // Identity Hessian (no correlation): no error is propagated, so GPTQ is RTN exactly.
        let mut id = vec![0f64; k * k];
        (0..k).for_each(|j| id[j * k + j] = 1.0);
        let g = gptq_nvfp4(&w, n, k, &id, 0.0).expect("gptq");
        assert_eq!(g, rtn);
    }
}
