//! The short causal depthwise convolution of the recurrent layers (Gated DeltaNet's over
//! `q k v`, Mamba-2's over `x B C`), with each request's carried window of its last `k − 1`
//! inputs in the state pool ([`crate::kv::state`]); ggml's `ssm_conv` (+ bias) + `silu` as
//! llama.cpp's `qwen35.cpp` and `mamba-base.cpp` build it.

use crate::batch::ForwardBatch;
use crate::model::vb::Vb;
use crate::EngineError;
use sparrow_cpu::kernels::recurrent;
use sparrow_cpu::ThreadPool;

/// One layer's convolution: taps, optional bias, widths.
pub(crate) struct ShortConv {
    /// The taps tap-major, `[kernel × channels]` (the file's rows are channels).
    taps: Vec<f32>,
    /// The bias per channel (Mamba-2's `conv1d.bias`), added before the SiLU.
    bias: Option<Vec<f32>>,
    /// Taps per channel.
    pub(crate) kernel: usize,
    /// Channels.
    pub(crate) channels: usize,
}

impl ShortConv {
    /// `conv1d.weight` (`[channels × kernel]` in HF order) under `vb`, and `conv1d.bias` when
    /// the file has one.
    ///
    /// # Errors
    /// A missing tensor or one of another length, named.
    pub(crate) fn load(vb: &Vb<'_>, channels: usize, kernel: usize) -> Result<ShortConv, EngineError> {
        let raw = vb.vector("conv1d.weight", channels * kernel)?;
        let mut taps = vec![0f32; kernel * channels];
        for ch in 0..channels {
            for i in 0..kernel {
                taps[i * channels + ch] = raw[ch * kernel + i];
            }
        }
        let bias = match vb.has("conv1d.bias") {
            true => Some(vb.vector("conv1d.bias", channels)?),
            false => None,
        };
        Ok(ShortConv { taps, bias, kernel, channels })
    }

    /// f32 values of one request's window (`(k − 1) × channels`).
    pub(crate) fn state_len(&self) -> usize {
        (self.kernel - 1) * self.channels
    }

    /// The convolution of the step's rows `input` (`[tokens × channels]`) into `out`, row by
    /// row on the pool (a row reads the `k − 1` inputs before it: its sequence's rows, or its
    /// slot's window before them, zeros at position 0); then each sequence's window in
    /// `windows` (`[slots × state_len]`) moved on to its last `k − 1` inputs.
    pub(crate) fn forward(
        &self,
        pool: &ThreadPool,
        batch: &ForwardBatch,
        row_seq: &[u32],
        input: &[f32],
        out: &mut Vec<f32>,
        windows: &mut [f32],
    ) {
        let (cd, k, cs) = (self.channels, self.kernel, self.state_len());
        out.resize(input.len(), 0.0);
        {
            let (taps, bias, windows) = (&self.taps, self.bias.as_deref(), &*windows);
            pool.par_rows(out, cd, |t, row| {
                let sq = &batch.seqs[row_seq[t] as usize];
                let (ts, slot) = (sq.token_start as usize, sq.req_pool_idx as usize);
                let window = (sq.prefix_len > 0).then(|| &windows[slot * cs..(slot + 1) * cs]);
                let rel = t - ts;
                let row_at = |i: usize| match (rel + i).checked_sub(k - 1) {
                    Some(j) => Some(&input[(ts + j) * cd..(ts + j + 1) * cd]),
                    None => window.map(|w| {
                        let r = rel + i; // row of the window, `r < k − 1`
                        &w[r * cd..(r + 1) * cd]
                    }),
                };
                recurrent::conv1d_silu_row(row, row_at, taps, k, bias);
            });
        }
        for sq in &batch.seqs {
            let (ts, n, slot) = (sq.token_start as usize, sq.extend_len as usize, sq.req_pool_idx as usize);
            let w = &mut windows[slot * cs..(slot + 1) * cs];
            if sq.prefix_len == 0 {
                w.fill(0.0);
            }
            // The last `k − 1` rows of `[window; inputs]`.
            let old = w.to_vec();
            for r in 0..k - 1 {
                let j = n + r; // row of `[window; inputs]`
                let src = match j.checked_sub(k - 1) {
                    Some(x) => &input[(ts + x) * cd..(ts + x + 1) * cd],
                    None => &old[j * cd..(j + 1) * cd],
                };
                w[r * cd..(r + 1) * cd].copy_from_slice(src);
            }
        }
    }
}

/// `A = −exp(A_log)` per head under `vb`: the GGUF's `A` (the converter's values), or an HF
/// checkpoint's `A_log` turned as llama.cpp's converter turns it.
///
/// # Errors
/// Neither tensor, or one of another length, named.
pub(crate) fn decay_rates(vb: &Vb<'_>, heads: usize) -> Result<Vec<f32>, EngineError> {
    match vb.has("A") {
        true => vb.vector("A", heads),
        false => Ok(vb.vector("A_log", heads)?.iter().map(|x| -x.exp()).collect()),
    }
}

/// The windows and matrix states of recurrent layer `layer` (`[slots × …]` each) from `kv`'s
/// state pool, after checking every sequence's slot is in it.
///
/// # Errors
/// A store without a state pool, or a slot outside it.
pub(crate) fn slot_states<'a>(
    kv: &'a mut crate::kv::KvStore,
    batch: &ForwardBatch,
    layer: usize,
) -> Result<(&'a mut [f32], &'a mut [f32]), EngineError> {
    let states = kv.states_mut().ok_or_else(|| {
        EngineError::model("a hybrid model's recurrent layers need the KV store's state pool (kv::state)")
    })?;
    if let Some(sq) = batch.seqs.iter().find(|q| q.req_pool_idx as usize >= states.slots()) {
        return Err(EngineError::model(format!(
            "state slot {} outside the pool of {}",
            sq.req_pool_idx,
            states.slots()
        )));
    }
    Ok(states.layer_mut(layer))
}
