//! Token sampling: logit bias, `min_tokens`, penalties, temperature, top-k, top-p (nucleus),
//! min-p, seeded.
//!
//! The logits are adjusted in vLLM v1's order (`vllm/v1/sample/sampler.py`): the logit bias
//! and the `min_tokens` mask (stop tokens at −∞ until that many tokens are out), then the
//! penalties ([`apply_penalties`]), then sampling. Semantics follow SGLang's `SamplingParams` /
//! `sampler.py` and vLLM: `temperature == 0`
//! (or `top_k == 1`) is greedy argmax, ties to the lowest id; otherwise logits are divided by
//! the temperature, softmaxed, cut to the `top_k` most likely, to the smallest set whose mass
//! reaches `top_p`, and to tokens with `p ≥ min_p · p_max`, renormalised and sampled.
//!
//! Randomness is a pure function of `(seed, output index)`, so a seeded request draws the same
//! tokens alone, in any batch, and after retraction and recomputation.

use rand::{Rng, SeedableRng};

/// Validated sampling parameters of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// In (0, 1]; values ≤ 0 keep only the most likely token.
    pub top_p: f32,
    /// 0 or negative: no limit.
    pub top_k: i32,
    /// In [0, 1].
    pub min_p: f32,
    /// Seed of the per-request stream.
    pub seed: u64,
    /// Additive biases `(token id, bias)`.
    pub logit_bias: Vec<(u32, f32)>,
    /// Subtracted once from every token already in the output (OpenAI's `presence_penalty`).
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the output (OpenAI's `frequency_penalty`).
    pub frequency_penalty: f32,
    /// Tokens of the prompt or the output: positive logits divided by it, the others
    /// multiplied (HF's and vLLM's `repetition_penalty`); 1 is off.
    pub repetition_penalty: f32,
    /// Stop tokens (EOS included) are masked until this many tokens are generated (vLLM's
    /// `min_tokens`, SGLang's `min_new_tokens`).
    pub min_tokens: usize,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            seed: 0,
            logit_bias: Vec::new(),
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            min_tokens: 0,
        }
    }
}

impl SamplingParams {
    /// True when the choice is argmax: temperature below vLLM's `_SAMPLING_EPS` (1e-5; smaller
    /// temperatures overflow `1 / t`) or `top_k == 1`.
    pub fn is_greedy(&self) -> bool {
        self.temperature < SAMPLING_EPS || self.top_k == 1
    }
}

/// Temperatures below this are greedy (vLLM's `_SAMPLING_EPS`).
pub const SAMPLING_EPS: f32 = 1e-5;

/// Index of the largest value; the lowest index wins ties; NaN never wins.
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut bv = f32::NEG_INFINITY;
    for (i, &x) in v.iter().enumerate() {
        if x > bv {
            bv = x;
            best = i;
        }
    }
    best as u32
}

/// The tokens a request has seen, for [`sample_seq`]: its prompt, its output so far and its
/// stop tokens (EOS included unless ignored).
#[derive(Debug, Clone, Copy)]
pub struct History<'a> {
    /// Prompt token ids.
    pub prompt: &'a [u32],
    /// Generated token ids so far.
    pub output: &'a [u32],
    /// Tokens that end the sequence.
    pub stop_ids: &'a [u32],
}

/// vLLM's penalties (`vllm/model_executor/layers/utils.py`, `apply_penalties`), in its order
/// and arithmetic: for every distinct token of the prompt or the output, `l / r` when `l > 0`
/// else `l · r` (`r` = `repetition_penalty`); then for every distinct output token with count
/// `c`, `l − f · c` (`f` = `frequency_penalty`), then `− presence_penalty`. Tokens outside
/// `logits` are ignored. A pure function of the row, so a request gives the same bits in any
/// batch.
pub fn apply_penalties(logits: &mut [f32], p: &SamplingParams, h: &History<'_>) {
    if p.repetition_penalty != 1.0 {
        let mut ids: Vec<u32> = h.prompt.iter().chain(h.output).copied().collect();
        ids.sort_unstable();
        ids.dedup();
        for id in ids {
            if let Some(l) = logits.get_mut(id as usize) {
                *l = if *l > 0.0 { *l / p.repetition_penalty } else { *l * p.repetition_penalty };
            }
        }
    }
    if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
        let mut out = h.output.to_vec();
        out.sort_unstable();
        for run in out.chunk_by(|a, b| a == b) {
            if let Some(l) = logits.get_mut(run[0] as usize) {
                *l -= p.frequency_penalty * run.len() as f32;
                *l -= p.presence_penalty;
            }
        }
    }
}

/// Picks the next token of a sequence with history `h`: the logit bias, the `min_tokens` mask
/// and the penalties applied to `logits` in place (see the module docs), then [`sample`]'s
/// choice for output index `h.output.len()`.
pub fn sample_seq(logits: &mut [f32], p: &SamplingParams, h: &History<'_>) -> u32 {
    add_bias(logits, p);
    if h.output.len() < p.min_tokens {
        for &s in h.stop_ids {
            if let Some(l) = logits.get_mut(s as usize) {
                *l = f32::NEG_INFINITY;
            }
        }
    }
    apply_penalties(logits, p, h);
    pick(logits, p, h.output.len() as u64)
}

fn add_bias(logits: &mut [f32], p: &SamplingParams) {
    for &(id, b) in &p.logit_bias {
        if let Some(l) = logits.get_mut(id as usize) {
            *l += b;
        }
    }
}

/// Picks the next token from `logits` (modified in place by the bias) for output index `step`.
pub fn sample(logits: &mut [f32], p: &SamplingParams, step: u64) -> u32 {
    add_bias(logits, p);
    pick(logits, p, step)
}

/// The choice after every adjustment of the logits.
fn pick(logits: &[f32], p: &SamplingParams, step: u64) -> u32 {
    if p.is_greedy() || p.top_p <= 0.0 {
        return argmax(logits);
    }
    let inv_t = 1.0 / p.temperature;
    let mx = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut cand: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, ((l - mx) * inv_t).exp()))
        .filter(|(_, w)| *w > 0.0)
        .collect();
    if cand.is_empty() {
        // Only possible with non-finite logits: fall back to the (NaN-proof) argmax.
        return argmax(logits);
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(p.seed ^ step.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    if p.top_k <= 0 && p.top_p >= 1.0 && p.min_p <= 0.0 {
        // No filtering: draw from the whole distribution without sorting the vocabulary.
        let total: f32 = cand.iter().map(|c| c.1).sum();
        return draw(&cand, total, &mut rng);
    }
    // Stable sort by descending probability keeps the lowest id first among equals.
    cand.sort_by(|a, b| b.1.total_cmp(&a.1));
    if p.top_k > 0 {
        cand.truncate(p.top_k as usize);
    }
    let total: f32 = cand.iter().map(|c| c.1).sum();
    if p.top_p < 1.0 {
        let mut acc = 0.0;
        let mut keep = cand.len();
        for (i, c) in cand.iter().enumerate() {
            acc += c.1 / total;
            if acc >= p.top_p {
                keep = i + 1;
                break;
            }
        }
        cand.truncate(keep.max(1));
    }
    if p.min_p > 0.0 {
        let pmax = cand[0].1;
        cand.retain(|c| c.1 >= p.min_p * pmax);
        if cand.is_empty() {
            return argmax(logits);
        }
    }
    let total: f32 = cand.iter().map(|c| c.1).sum();
    draw(&cand, total, &mut rng)
}

/// Inverse-CDF draw from weights summing to `total`, in the order given.
fn draw(cand: &[(u32, f32)], total: f32, rng: &mut rand::rngs::StdRng) -> u32 {
    let mut r = rng.random::<f32>() * total;
    for c in cand {
        r -= c.1;
        if r < 0.0 {
            return c.0;
        }
    }
    cand.last().map_or(0, |c| c.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// vLLM's formulas on a fixed logit row, by hand: repetition 2 over prompt ∪ output
    /// (positive halved, negative doubled), frequency 0.5 per output occurrence, presence 0.25
    /// once per output token; tokens seen nowhere untouched.
    #[test]
    fn penalties_by_hand() {
        let p = SamplingParams {
            repetition_penalty: 2.0,
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            ..Default::default()
        };
        let mut l = [2.0f32, -1.0, 0.5, 3.0, 7.0];
        let h = History { prompt: &[0, 1, 0], output: &[3, 3, 2], stop_ids: &[] };
        apply_penalties(&mut l, &p, &h);
        // 0: 2/2 = 1; 1: −1·2 = −2; 2: 0.5/2 − 0.5 − 0.25 = −0.5; 3: 3/2 − 1.0 − 0.25 = 0.25; 4: 7.
        assert_eq!(l, [1.0, -2.0, -0.5, 0.25, 7.0]);
        // Off by default: nothing changes.
        let mut m = [2.0f32, -1.0];
        apply_penalties(&mut m, &SamplingParams::default(), &h);
        assert_eq!(m, [2.0, -1.0]);
    }

    /// `min_tokens` masks the stop tokens (EOS among them) until that many are out, and the
    /// logit bias comes before the penalties (vLLM v1's order).
    #[test]
    fn min_tokens_and_order() {
        let p = SamplingParams { temperature: 0.0, min_tokens: 2, ..Default::default() };
        let h = History { prompt: &[1], output: &[0], stop_ids: &[2] };
        assert_eq!(sample_seq(&mut [0.0, 1.0, 9.0], &p, &h), 1);
        let done = History { output: &[0, 0], ..h };
        assert_eq!(sample_seq(&mut [0.0, 1.0, 9.0], &p, &done), 2);
        // Bias +1 then repetition 2 on token 0 (in the prompt): (1 + 1) / 2 = 1 < 1.5.
        let q = SamplingParams {
            temperature: 0.0,
            logit_bias: vec![(0, 1.0)],
            repetition_penalty: 2.0,
            ..Default::default()
        };
        let h0 = History { prompt: &[0], output: &[], stop_ids: &[] };
        let mut row = [1.0f32, 1.5];
        assert_eq!(sample_seq(&mut row, &q, &h0), 1);
        assert_eq!(row[0], 1.0);
    }

    #[test]
    fn greedy_and_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5]), 1);
        let p = SamplingParams { temperature: 0.0, ..Default::default() };
        assert_eq!(sample(&mut [0.0, 1.0, 0.5], &p, 0), 1);
        let biased = SamplingParams { temperature: 0.0, logit_bias: vec![(0, 100.0)], ..Default::default() };
        assert_eq!(sample(&mut [0.0, 1.0, 0.5], &biased, 0), 0);
    }

    /// Tiny temperatures overflow 1/t; they are greedy, and non-finite logits never panic.
    #[test]
    fn degenerate_inputs_do_not_panic() {
        let tiny = SamplingParams { temperature: 1e-39, min_p: 0.1, ..Default::default() };
        assert_eq!(sample(&mut [0.0, 2.0, 1.0], &tiny, 0), 1);
        let hot = SamplingParams { temperature: 1.0, min_p: 0.5, top_p: 0.5, ..Default::default() };
        let _ = sample(&mut [f32::NAN, f32::NAN, f32::NAN], &hot, 0);
        let _ = sample(&mut [f32::INFINITY, 0.0, f32::NEG_INFINITY], &hot, 3);
        let _ = sample(&mut [f32::NEG_INFINITY; 4], &hot, 1);
    }

    #[test]
    fn seeded_sampling_is_a_function_of_seed_and_step() {
        let p = SamplingParams { temperature: 0.8, seed: 42, ..Default::default() };
        let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.7).sin()).collect();
        let a: Vec<u32> = (0..20).map(|s| sample(&mut logits.clone(), &p, s)).collect();
        let b: Vec<u32> = (0..20).map(|s| sample(&mut logits.clone(), &p, s)).collect();
        assert_eq!(a, b);
        assert!(a.iter().any(|&t| t != a[0]), "a temperature of 0.8 over 100 tokens should vary");
    }

    /// Unfiltered sampling follows the softmax: p = (0.25, 0.75) for logits (ln 1, ln 3).
    #[test]
    fn unfiltered_sampling_follows_the_distribution() {
        let p = SamplingParams { temperature: 1.0, seed: 9, ..Default::default() };
        let logits = [0.0f32, 3f32.ln()];
        let ones = (0..4000).filter(|&s| sample(&mut logits.clone(), &p, s) == 1).count();
        assert!((2880..=3120).contains(&ones), "{ones} of 4000, want about 3000");
        // Temperature 2 flattens it: p1 = √3 / (1 + √3) ≈ 0.634.
        let warm = SamplingParams { temperature: 2.0, seed: 9, ..Default::default() };
        let ones = (0..4000).filter(|&s| sample(&mut logits.clone(), &warm, s) == 1).count();
        assert!((2416..=2656).contains(&ones), "{ones} of 4000, want about 2536");
    }

    #[test]
    fn top_p_and_top_k_restrict_the_support() {
        // Probabilities ∝ e^{logit}: token 0 holds ~0.84 of the mass.
        let logits = [4.0f32, 2.0, 1.0, 0.0];
        let p = SamplingParams { temperature: 1.0, top_p: 0.5, seed: 1, ..Default::default() };
        assert!((0..200).all(|s| sample(&mut logits.clone(), &p, s) == 0));
        let k = SamplingParams { temperature: 1.0, top_k: 2, seed: 1, ..Default::default() };
        assert!((0..200).all(|s| sample(&mut logits.clone(), &k, s) < 2));
        let m = SamplingParams { temperature: 1.0, min_p: 0.2, seed: 1, ..Default::default() };
        // e^{2}/e^{4} ≈ 0.135 < 0.2: only token 0 survives.
        assert!((0..200).all(|s| sample(&mut logits.clone(), &m, s) == 0));
    }
}
