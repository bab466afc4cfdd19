//! gpt-oss's experts as its Hugging Face checkpoints pack them (OpenAI's MXFP4 layout,
//! transformers' `integrations/mxfp4.py`): per projection one `{experts}.{proj}_blocks` tensor
//! (U8 `[n_expert, rows, cols/32, 16]`: byte `j` of a block holds value `2j` in its low nibble
//! and `2j + 1` in its high one), one `{experts}.{proj}_scales` (U8 `[n_expert, rows, cols/32]`,
//! E8M0: `2^(s − 127)`) and one `{experts}.{proj}_bias` (`[n_expert, rows]`); `gate_up_proj`
//! interleaves the gate's rows (even) and the up projection's (odd).
//!
//! Each expert is repacked into GGML's MXFP4 blocks (the scale byte, then 16 bytes whose low
//! nibbles are values 0–15 and high nibbles 16–31), what llama.cpp's converter writes
//! (`conversion/gpt_oss.py`, `transform_nibble_layout` and `repack_mxfp4`), so the checkpoint
//! runs on the same kernels as its GGUF twin at the same 4.25 bits.

use sparrow_cpu::format::ggml::GgmlType;
use sparrow_cpu::format::qmatrix::QMatrix;
use sparrow_cpu::Weight;

use super::hf::{to_f32, Checkpoint, Dtype};
use crate::EngineError;

/// The packed tensor of `proj` (`gate_proj` and `up_proj` share `gate_up_proj`) and which of
/// its rows are `proj`'s: `(name, row stride, first row)`.
fn packed(proj: &str) -> Option<(&'static str, usize, usize)> {
    match proj {
        "gate_proj" => Some(("gate_up_proj", 2, 0)),
        "up_proj" => Some(("gate_up_proj", 2, 1)),
        "down_proj" => Some(("down_proj", 1, 0)),
        _ => None,
    }
}

/// One OpenAI block (16 bytes, values interleaved by nibble) as GGML's MXFP4 block body
/// (values 0–15 in the low nibbles, 16–31 in the high ones).
fn ggml_block(src: &[u8], dst: &mut [u8]) {
    let v = |i: usize| (src[i / 2] >> (4 * (i % 2))) & 0x0f;
    for (j, d) in dst.iter_mut().enumerate() {
        *d = v(j) | (v(j + 16) << 4);
    }
}

impl Checkpoint {
    /// The `n` experts of projection `proj` under `experts` (`model.layers.L.mlp.experts`) from
    /// gpt-oss's packed MXFP4 tensors, each `[rows × cols]`; `None` when the checkpoint has no
    /// packed tensors there.
    ///
    /// # Errors
    /// Tensors of another dtype or shape, named; a subnormal block scale (below 2^-126, which
    /// the kernels do not keep).
    pub fn packed_experts(
        &self,
        experts: &str,
        proj: &str,
        n: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Option<Vec<Weight>>, EngineError> {
        let Some((name, stride, first)) = packed(proj) else { return Ok(None) };
        let (bname, sname) = (format!("{experts}.{name}_blocks"), format!("{experts}.{name}_scales"));
        if !self.has(&bname) {
            return Ok(None);
        }
        if !cols.is_multiple_of(32) {
            return Err(EngineError::model(format!("{bname}: {cols} columns is not whole MXFP4 blocks of 32")));
        }
        let (b, s) = (self.raw(&bname)?, self.raw(&sname)?);
        let nb = cols / 32;
        let all = rows * stride;
        let want = |t: &super::hf::RawTensor<'_>, what: &str, shape: &[usize]| {
            if t.dtype != Dtype::U8 || t.shape != shape {
                return Err(EngineError::model(format!(
                    "{experts}.{name}_{what}: {:?} {:?}, want U8 {shape:?} ({n} experts of [{all}, {cols}])",
                    t.dtype, t.shape
                )));
            }
            Ok(())
        };
        want(&b, "blocks", &[n, all, nb, 16])?;
        want(&s, "scales", &[n, all, nb])?;
        if let Some(p) = s.data.iter().position(|&x| x < 2) {
            return Err(EngineError::model(format!(
                "{sname}: block scale {p} is 2^{}, subnormal (below 2^-126), which sparrow does not keep",
                s.data[p] as i32 - 127
            )));
        }
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let per = rows * nb * 17;
        let mut data = vec![0u8; per];
        let ws = (0..n)
            .map(|e| {
                for r in 0..rows {
                    let src = e * all + r * stride + first;
                    for k in 0..nb {
                        let blk = &mut data[(r * nb + k) * 17..(r * nb + k + 1) * 17];
                        blk[0] = s.data[src * nb + k];
                        ggml_block(&b.data[(src * nb + k) * 16..(src * nb + k + 1) * 16], &mut blk[1..]);
                    }
                }
                Weight::Quant(QMatrix::from_ggml_threads(GgmlType::MXFP4, &data, rows, cols, threads))
            })
            .collect();
        Ok(Some(ws))
    }

    /// The biases of projection `proj` of every expert, expert after expert (`len` values in
    /// all), from gpt-oss's packed `{experts}.{proj}_bias` (`gate_up_proj_bias` interleaved);
    /// `None` when the checkpoint has none there.
    ///
    /// # Errors
    /// A bias of another size, named.
    pub fn packed_expert_bias(&self, experts: &str, proj: &str, len: usize) -> Result<Option<Vec<f32>>, EngineError> {
        let Some((name, stride, first)) = packed(proj) else { return Ok(None) };
        let bname = format!("{experts}.{name}_bias");
        if !self.has(&bname) {
            return Ok(None);
        }
        let t = self.raw(&bname)?;
        if t.shape.len() != 2 || t.shape[0] * t.shape[1] != len * stride {
            return Err(EngineError::model(format!(
                "{bname}: shape {:?}, want {len} values of {proj} ({} packed)",
                t.shape,
                len * stride
            )));
        }
        let all = to_f32(&bname, t)?;
        Ok(Some(all.iter().skip(first).step_by(stride).copied().collect()))
    }

    /// Whether `{experts}.{proj}` has a packed bias ([`Checkpoint::packed_expert_bias`]).
    pub fn has_packed_expert_bias(&self, experts: &str, proj: &str) -> bool {
        packed(proj).is_some_and(|(name, _, _)| self.has(&format!("{experts}.{name}_bias")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// OpenAI's interleaved nibbles become GGML's halves: value `i` is read back in place.
    #[test]
    fn nibbles_move_from_interleaved_to_halves() {
        let values: Vec<u8> = (0..32).map(|i| (i * 7 + 3) % 16).collect();
        let src: Vec<u8> = (0..16).map(|j| values[2 * j] | (values[2 * j + 1] << 4)).collect();
        let mut dst = [0u8; 16];
        ggml_block(&src, &mut dst);
        let back: Vec<u8> = (0..32).map(|i| if i < 16 { dst[i] & 0x0f } else { dst[i - 16] >> 4 }).collect();
        assert_eq!(back, values);
    }
}
