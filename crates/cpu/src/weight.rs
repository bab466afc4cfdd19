//! [`Weight`]: a linear layer's matrix in whichever form the kernels run on.

use crate::format::ggml::QMatrix;
use crate::format::nvfp4::Nvfp4Matrix;

/// A weight matrix in the form the kernels use.
#[derive(Debug, Clone)]
pub enum Weight {
    /// Quantized; multiplied with 8-bit quantized activations.
    Quant(QMatrix),
    /// Dense f32 `[rows, cols]` row-major (from F16/F32 tensors).
    Dense {
        /// Output features.
        rows: usize,
        /// Input features.
        cols: usize,
        /// `rows · cols` values.
        data: Vec<f32>,
    },
    /// NVFP4 (ModelOpt); multiplied with f32 activations, decoded block by block.
    Nvfp4(Nvfp4Matrix),
}

impl Weight {
    /// Output features.
    pub fn rows(&self) -> usize {
        match self {
            Weight::Quant(q) => q.rows,
            Weight::Dense { rows, .. } => *rows,
            Weight::Nvfp4(m) => m.rows,
        }
    }
    /// Input features.
    pub fn cols(&self) -> usize {
        match self {
            Weight::Quant(q) => q.cols,
            Weight::Dense { cols, .. } => *cols,
            Weight::Nvfp4(m) => m.cols,
        }
    }
    /// Dequantizes row `r` (used for embedding lookups).
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        match self {
            Weight::Quant(q) => q.dequantize_row(r, out),
            Weight::Dense { cols, data, .. } => out.copy_from_slice(&data[r * cols..(r + 1) * cols]),
            Weight::Nvfp4(m) => m.dequantize_row(r, out),
        }
    }
    /// Row `i` of the result is row `perm[i]` of `self` (undoes a checkpoint's head layout).
    /// `None` for the GGUF-repacked form, whose rows are interleaved in groups of 8.
    pub fn permute_rows(&self, perm: &[usize]) -> Option<Weight> {
        match self {
            Weight::Quant(_) => None,
            Weight::Dense { rows, cols, data } => {
                debug_assert_eq!(perm.len(), *rows);
                let data = perm.iter().flat_map(|&r| data[r * cols..(r + 1) * cols].iter().copied()).collect();
                Some(Weight::Dense { rows: *rows, cols: *cols, data })
            }
            Weight::Nvfp4(m) => {
                let parts: Vec<Nvfp4Matrix> = perm.iter().map(|&r| m.slice_rows(r, r + 1)).collect();
                let refs: Vec<&Nvfp4Matrix> = parts.iter().collect();
                Nvfp4Matrix::concat(&refs).map(Weight::Nvfp4)
            }
        }
    }

    /// [`Weight::concat`], falling back to dense f32 for mixed formats (slower, exact).
    ///
    /// # Panics
    /// When `parts` is empty.
    pub fn concat_or_dense(parts: &[&Weight]) -> Weight {
        if let Some(w) = Weight::concat(parts) {
            return w;
        }
        let cols = parts[0].cols();
        let mut data = Vec::new();
        let mut row = vec![0f32; cols];
        for p in parts {
            for r in 0..p.rows() {
                p.row_f32(r, &mut row);
                data.extend_from_slice(&row);
            }
        }
        Weight::Dense { rows: data.len() / cols.max(1), cols, data }
    }

    /// Bytes one matmul over the weight reads (for a quantized matrix, the SIMD kernels' codes
    /// and scales: what a decode step streams from memory).
    pub fn bytes(&self) -> usize {
        match self {
            Weight::Quant(q) => q.kernel_bytes(),
            Weight::Dense { data, .. } => 4 * data.len(),
            Weight::Nvfp4(m) => m.weight.len() + m.weight_scale.len() + 4,
        }
    }
    /// Stacks weights along rows when all are quantized alike or all dense.
    pub fn concat(parts: &[&Weight]) -> Option<Weight> {
        if parts.iter().all(|p| matches!(p, Weight::Quant(_))) {
            let qs: Vec<&QMatrix> = parts
                .iter()
                .filter_map(|p| match p {
                    Weight::Quant(q) => Some(q),
                    _ => None,
                })
                .collect();
            return QMatrix::concat(&qs).map(Weight::Quant);
        }
        if parts.iter().all(|p| matches!(p, Weight::Nvfp4(_))) {
            let ms: Vec<&Nvfp4Matrix> = parts
                .iter()
                .filter_map(|p| match p {
                    Weight::Nvfp4(m) => Some(m),
                    _ => None,
                })
                .collect();
            return Nvfp4Matrix::concat(&ms).map(Weight::Nvfp4);
        }
        let cols = parts.first()?.cols();
        let mut data = Vec::new();
        let mut rows = 0;
        for p in parts {
            match p {
                Weight::Dense { rows: r, cols: c, data: d } if *c == cols => {
                    rows += r;
                    data.extend_from_slice(d);
                }
                _ => return None,
            }
        }
        Some(Weight::Dense { rows, cols, data })
    }
}

