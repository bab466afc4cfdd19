//! Perplexity of a model over token sequences: `exp(mean NLL)` of each next token under the
//! model's raw logits (log-softmax in f64), every position's logits from one prefill.

use sparrow_engine::batch::ForwardBatch;
use sparrow_engine::model::Model;
use sparrow_engine::EngineError;

/// Totals over the scored sequences.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Perplexity {
    /// Sequences scored (those of at least 2 tokens).
    pub sequences: usize,
    /// Next-token predictions scored.
    pub tokens: usize,
    /// Sum of `−ln p(next)` in nats.
    pub nll: f64,
}

impl Perplexity {
    /// Mean NLL per scored token (nats); NaN when nothing was scored.
    pub fn mean_nll(&self) -> f64 {
        self.nll / self.tokens as f64
    }

    /// `exp(mean NLL)`.
    pub fn perplexity(&self) -> f64 {
        self.mean_nll().exp()
    }
}

/// Scores each sequence of `seqs` (token ids; shorter than 2 are skipped) from position 0.
///
/// # Errors
/// A forward error.
pub fn score(model: &mut dyn Model, seqs: &[Vec<u32>]) -> Result<Perplexity, EngineError> {
    let vocab = model.info().vocab_size;
    let mut p = Perplexity::default();
    let scored: Vec<&Vec<u32>> = seqs.iter().filter(|s| s.len() >= 2).collect();
    forward_each(model, &scored, true, |ids, logits| {
        for (t, &next) in ids.iter().enumerate().skip(1) {
            let row = &logits[(t - 1) * vocab..t * vocab];
            let mx = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            let lse = mx + row.iter().map(|&v| (v as f64 - mx).exp()).sum::<f64>().ln();
            p.nll += lse - row[next as usize] as f64;
            p.tokens += 1;
        }
        p.sequences += 1;
    })?;
    Ok(p)
}

/// Runs each sequence of `seqs` alone from position 0 over one KV store sized for the longest,
/// calling `f(ids, logits)`; `logits` holds every position's row when `all_logits`, else the
/// last one's. What calibration and perplexity both do.
///
/// # Errors
/// A forward error.
pub(crate) fn forward_each<S: AsRef<[u32]>>(
    model: &mut dyn Model,
    seqs: &[S],
    all_logits: bool,
    mut f: impl FnMut(&[u32], &[f32]),
) -> Result<(), EngineError> {
    let longest = seqs.iter().map(|s| s.as_ref().len()).max().unwrap_or(0);
    let mut kv = sparrow_engine::model::kv_store(model, longest + 2, 1, 0);
    for ids in seqs {
        let ids = ids.as_ref();
        let mut b = ForwardBatch::single_sequence(ids, 0);
        if all_logits {
            b.logits_rows = (0..ids.len() as u32).collect();
            b.seqs[0].num_logits = ids.len() as u32;
        }
        let logits = model.forward(&b, &mut kv)?;
        f(ids, &logits);
    }
    Ok(())
}
