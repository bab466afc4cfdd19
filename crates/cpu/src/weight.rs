//! [`Weight`]: a linear layer's matrix in whichever form the kernels run on, at the size its
//! file stores it.

use crate::format::ggml::QMatrix;
use crate::format::nvfp4::Nvfp4Matrix;
use crate::half::f16_to_f32;

/// A weight matrix `[rows, cols]` (row `r` produces output `r`) in the form the kernels use.
#[derive(Debug, Clone)]
pub enum Weight {
    /// GGML block-quantized, repacked at the file's bits per weight; multiplied with 8-bit
    /// quantized activations.
    Quant(QMatrix),
    /// Dense f32 `[rows, cols]` row-major (F32 tensors, HF checkpoints).
    Dense {
        /// Output features.
        rows: usize,
        /// Input features.
        cols: usize,
        /// `rows · cols` values.
        data: Vec<f32>,
    },
    /// Dense 16-bit `[rows, cols]` row-major, kept as the file stores it (F16 or BF16) and
    /// widened to f32 in registers.
    Half {
        /// Output features.
        rows: usize,
        /// Input features.
        cols: usize,
        /// `rows · cols` raw values.
        data: Vec<u16>,
        /// BF16 (else IEEE half).
        bf16: bool,
    },
    /// NVFP4 (ModelOpt); multiplied with f32 activations, decoded block by block.
    Nvfp4(Nvfp4Matrix),
    /// Matrices of different forms stacked along rows (a fused QKV whose V is Q6_K and Q, K
    /// Q4_K): part `i` produces outputs `Σ_{j<i} rows_j ..`; every part keeps its own form.
    Stack(Vec<Weight>),
}

/// A 16-bit value of a [`Weight::Half`] as f32 (exact).
#[inline]
pub fn half_to_f32(v: u16, bf16: bool) -> f32 {
    if bf16 {
        f32::from_bits((v as u32) << 16)
    } else {
        f16_to_f32(v)
    }
}

impl Weight {
    /// Output features.
    pub fn rows(&self) -> usize {
        match self {
            Weight::Quant(q) => q.rows,
            Weight::Dense { rows, .. } | Weight::Half { rows, .. } => *rows,
            Weight::Nvfp4(m) => m.rows,
            Weight::Stack(parts) => parts.iter().map(Weight::rows).sum(),
        }
    }
    /// Input features.
    pub fn cols(&self) -> usize {
        match self {
            Weight::Quant(q) => q.cols,
            Weight::Dense { cols, .. } | Weight::Half { cols, .. } => *cols,
            Weight::Nvfp4(m) => m.cols,
            Weight::Stack(parts) => parts.first().map_or(0, Weight::cols),
        }
    }
    /// Dequantizes row `r` into `out` (`cols` values): embedding lookups read the quantized rows
    /// this way, exactly as GGML dequantizes them.
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        match self {
            Weight::Quant(q) => q.dequantize_row(r, out),
            Weight::Dense { cols, data, .. } => out.copy_from_slice(&data[r * cols..(r + 1) * cols]),
            Weight::Half { cols, data, bf16, .. } => {
                for (o, &v) in out.iter_mut().zip(&data[r * cols..(r + 1) * cols]) {
                    *o = half_to_f32(v, *bf16);
                }
            }
            Weight::Nvfp4(m) => m.dequantize_row(r, out),
            Weight::Stack(parts) => {
                let mut r = r;
                for p in parts {
                    if r < p.rows() {
                        return p.row_f32(r, out);
                    }
                    r -= p.rows();
                }
            }
        }
    }
    /// Bytes the weight holds: what one matmul over it streams from memory (codes and scales
    /// of a quantized matrix, at about its file's size).
    pub fn bytes(&self) -> usize {
        match self {
            Weight::Quant(q) => q.bytes(),
            Weight::Dense { data, .. } => 4 * data.len(),
            Weight::Half { data, .. } => 2 * data.len(),
            Weight::Nvfp4(m) => m.weight.len() + m.weight_scale.len() + 4,
            Weight::Stack(parts) => parts.iter().map(Weight::bytes).sum(),
        }
    }

    /// The form's name: the GGML type (`Q4_K`, `Q6_K`, `F16`, ...), `F32`, `NVFP4`, or `mixed`
    /// for a stack of several forms.
    pub fn kind(&self) -> &'static str {
        match self {
            Weight::Quant(q) => q.ty.name(),
            Weight::Dense { .. } => "F32",
            Weight::Half { bf16: true, .. } => "BF16",
            Weight::Half { .. } => "F16",
            Weight::Nvfp4(_) => "NVFP4",
            Weight::Stack(parts) => {
                let first = parts.first().map_or("F32", Weight::kind);
                if parts.iter().all(|p| p.kind() == first) {
                    first
                } else {
                    "mixed"
                }
            }
        }
    }

    /// `(kind, bytes)` of every single-form piece (a stack's parts, else the weight itself): how
    /// a matmul's time is split by type.
    pub fn pieces(&self) -> Vec<(&'static str, usize)> {
        match self {
            Weight::Stack(parts) => parts.iter().flat_map(Weight::pieces).collect(),
            w => vec![(w.kind(), w.bytes())],
        }
    }

    /// Stacks weights along rows: one matrix when all parts have one form that concatenates
    /// (same GGML type, all dense f32, all the same 16-bit type, all NVFP4), else a
    /// [`Weight::Stack`] that keeps each part in its own form.
    ///
    /// # Panics
    /// When `parts` is empty or the widths differ (a caller bug: shapes are checked at load).
    pub fn stack(parts: Vec<Weight>) -> Weight {
        assert!(!parts.is_empty(), "Weight::stack of nothing");
        let cols = parts[0].cols();
        assert!(parts.iter().all(|p| p.cols() == cols), "Weight::stack: widths differ");
        if parts.len() == 1 {
            return parts.into_iter().next().expect("one part");
        }
        let refs: Vec<&Weight> = parts.iter().collect();
        if let Some(w) = Weight::concat(&refs) {
            return w;
        }
        // Flatten nested stacks, then merge runs of one concatenable form.
        let mut flat: Vec<Weight> = Vec::new();
        for p in parts {
            match p {
                Weight::Stack(inner) => flat.extend(inner),
                p => flat.push(p),
            }
        }
        let mut out: Vec<Weight> = Vec::new();
        for p in flat {
            if let Some(last) = out.last_mut() {
                if let Some(m) = Weight::concat(&[&*last, &p]) {
                    *last = m;
                    continue;
                }
            }
            out.push(p);
        }
        if out.len() == 1 {
            return out.into_iter().next().expect("one part");
        }
        Weight::Stack(out)
    }

    /// Stacks weights along rows when all are in one form that concatenates; `None` otherwise.
    pub fn concat(parts: &[&Weight]) -> Option<Weight> {
        let first = parts.first()?;
        let cols = first.cols();
        if parts.iter().any(|p| p.cols() != cols) {
            return None;
        }
        match first {
            Weight::Quant(_) => {
                let qs: Option<Vec<&QMatrix>> =
                    parts.iter().map(|p| if let Weight::Quant(q) = p { Some(q) } else { None }).collect();
                QMatrix::concat(&qs?).map(Weight::Quant)
            }
            Weight::Nvfp4(_) => {
                let ms: Option<Vec<&Nvfp4Matrix>> =
                    parts.iter().map(|p| if let Weight::Nvfp4(m) = p { Some(m) } else { None }).collect();
                Nvfp4Matrix::concat(&ms?).map(Weight::Nvfp4)
            }
            Weight::Dense { .. } => {
                let mut data = Vec::new();
                for p in parts {
                    let Weight::Dense { data: d, .. } = p else { return None };
                    data.extend_from_slice(d);
                }
                Some(Weight::Dense { rows: data.len() / cols.max(1), cols, data })
            }
            Weight::Half { bf16, .. } => {
                let mut data = Vec::new();
                for p in parts {
                    match p {
                        Weight::Half { data: d, bf16: b, .. } if b == bf16 => data.extend_from_slice(d),
                        _ => return None,
                    }
                }
                Some(Weight::Half { rows: data.len() / cols.max(1), cols, data, bf16: *bf16 })
            }
            Weight::Stack(_) => None,
        }
    }
}
