//! Test doubles: one fake [`Model`] for the scheduler's and the engine thread's tests (unit and
//! integration), so they exercise the real scheduler, pages and radix cache without weights.

use crate::batch::ForwardBatch;
use crate::kv::{KvLayout, KvStore};
use crate::model::{AttentionNeeds, Model, ModelInfo};
use crate::EngineError;

/// The recurrence's modulus: below 2^24, so every value is exact in an f32 KV slot.
pub const MODULUS: u64 = 16_777_213;

/// One step of the recurrence `v[p] = mix(v[p-1], token[p])`, `v[-1] = 1`.
pub fn mix(prev: u64, token: u32) -> u64 {
    (prev * 31 + token as u64 + 7) % MODULUS
}

/// What the fake model predicts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Predict {
    /// `v[last] mod vocab`, with `v` the recurrence kept in the KV cache (one value per token,
    /// read back from the slot of position `p-1` through the batch's slot list): a wrong slot,
    /// a stale page, a wrongly shared prefix, an off-by-one chunk boundary or a retraction that
    /// loses state changes the output.
    Recurrence,
    /// `(last input token + 1) mod vocab`; reads no KV.
    NextToken,
}

/// A fake model: greedy logits are one-hot on its prediction.
#[derive(Debug, Clone)]
pub struct FakeModel {
    info: ModelInfo,
    predict: Predict,
    /// A batch containing this input token panics the forward (a stand-in for a model bug).
    panic_on: Option<u32>,
    /// Every logits row is this one (a known next-token distribution), whatever `predict` says.
    fixed: Option<Vec<f32>>,
}

impl FakeModel {
    /// A model of `vocab` tokens and `context_length`, predicting with `predict`.
    pub fn new(vocab: usize, context_length: usize, predict: Predict) -> Self {
        let info = ModelInfo {
            architecture: "fake".into(),
            name: "fake".into(),
            vocab_size: vocab,
            context_length,
            num_layers: 1,
            hidden_size: 1,
            weight_bytes: 0,
            file_weight_bytes: None,
            active_weight_bytes: None,
        };
        FakeModel { info, predict, panic_on: None, fixed: None }
    }

    /// Makes every logits row `row` (`[vocab]`): the next-token distribution is then
    /// `softmax(row)` at every position, for tests of sampling.
    pub fn with_fixed_logits(mut self, row: Vec<f32>) -> Self {
        assert_eq!(row.len(), self.info.vocab_size, "one logit per token");
        self.fixed = Some(row);
        self
    }

    /// Makes every forward whose batch holds input token `token` panic.
    pub fn panic_on(mut self, token: u32) -> Self {
        self.panic_on = Some(token);
        self
    }

    /// The recurrence's greedy output for `prompt`, computed directly: up to `max_new` tokens,
    /// stopping at `eos` (included) or when prompt + output reach `ctx`; `true` when it stopped
    /// on `eos`.
    pub fn reference(&self, prompt: &[u32], max_new: usize, eos: Option<u32>, ctx: usize) -> (Vec<u32>, bool) {
        let vocab = self.info.vocab_size as u64;
        let mut v = 1;
        for &t in prompt {
            v = mix(v, t);
        }
        let mut out = Vec::new();
        loop {
            let t = (v % vocab) as u32;
            out.push(t);
            if Some(t) == eos {
                return (out, true);
            }
            if out.len() >= max_new || prompt.len() + out.len() >= ctx {
                return (out, false);
            }
            v = mix(v, t);
        }
    }
}

impl Model for FakeModel {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn attention_needs(&self) -> AttentionNeeds {
        AttentionNeeds { kind: "gqa", kv_layout: KvLayout::gqa(1, 1, 1), sliding_window: false }
    }

    fn forward(&mut self, b: &ForwardBatch, kv: &mut KvStore) -> Result<Vec<f32>, EngineError> {
        if let Some(bad) = self.panic_on {
            assert!(!b.input_ids.contains(&bad), "bug triggered by token {bad}");
        }
        let vocab = self.info.vocab_size;
        let mut logits = Vec::new();
        for (i, s) in b.seqs.iter().enumerate() {
            let slots = b.kv_slots(i).to_vec();
            // Only the recurrence reads the cache, so only it writes it.
            if self.predict == Predict::Recurrence {
                for j in 0..s.extend_len as usize {
                    let pos = s.prefix_len as usize + j;
                    let prev = if pos == 0 { 1 } else { kv.component(0, 0)[slots[pos - 1] as usize] as u64 };
                    let v = mix(prev, b.input_ids[s.token_start as usize + j]);
                    kv.component_mut(0, 0)[slots[pos] as usize] = v as f32;
                }
            }
            // One row per wanted token, each predicting from its own position.
            for j in s.extend_len - s.num_logits..s.extend_len {
                let predicted = match self.predict {
                    Predict::Recurrence => {
                        let at = slots[(s.prefix_len + j) as usize];
                        kv.component(0, 0)[at as usize] as u64 % vocab as u64
                    }
                    Predict::NextToken => {
                        let t = b.input_ids[(s.token_start + j) as usize];
                        (t as u64 + 1) % vocab as u64
                    }
                };
                match &self.fixed {
                    Some(row) => logits.extend_from_slice(row),
                    None => {
                        let mut row = vec![0f32; vocab];
                        row[predicted as usize] = 1.0;
                        logits.extend(row);
                    }
                }
            }
        }
        Ok(logits)
    }
}
