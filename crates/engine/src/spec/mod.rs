//! Speculative decoding: a row proposes tokens, one forward scores them all, and the scheduler
//! keeps the longest prefix the target model agrees with (Leviathan et al. 2023, "Fast
//! Inference from Transformers via Speculative Decoding"; Chen et al. 2023, "Accelerating
//! Large Language Model Decoding with Speculative Sampling").
//!
//! The proposals here are single tokens, not distributions: an n-gram match ([`ngram`]) or a
//! draft model's greedy choice. For a proposal that is a point mass on `d`, the standard
//! rejection rule (accept with probability `min(1, p(d) / q(d)) = p(d)`; on rejection draw from
//! `norm(max(0, p - q))`, which is `p` without `d`) is exactly: draw `x` from the target's
//! processed distribution `p` with the request's own randomness, accept `d` when `x == d`, and
//! otherwise keep `x`. Every emitted token is therefore drawn from the target's distribution
//! at its position, greedy outputs equal the non-speculative ones token for token, and a seeded
//! request gives the same tokens with and without speculation (the draw at output index `i`
//! is the same draw). The verify loop lives in the scheduler's `postprocess`; what is here is
//! the configuration, the per-request state and the draft-length rule.

pub mod ngram;

use std::path::PathBuf;

pub use ngram::NgramIndex;

/// `--speculative-algorithm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecAlgorithm {
    /// Proposals from the request's own prompt and output ([`ngram`]); no extra model.
    Ngram,
    /// A smaller draft model of the same vocabulary (`--speculative-draft-model-path`).
    Standalone,
}

impl SpecAlgorithm {
    /// SGLang's spelling.
    pub fn name(self) -> &'static str {
        match self {
            SpecAlgorithm::Ngram => "NGRAM",
            SpecAlgorithm::Standalone => "STANDALONE",
        }
    }
}

/// Speculative decoding settings (SGLang's `--speculative-*` flags, validated).
#[derive(Debug, Clone, PartialEq)]
pub struct SpecConfig {
    /// Where proposals come from.
    pub algorithm: SpecAlgorithm,
    /// Tokens one verify step scores per row, the row's last sampled token included
    /// (`--speculative-num-draft-tokens`, counted as SGLang counts it with one draft chain):
    /// at most `num_draft_tokens - 1` proposals per step.
    pub num_draft_tokens: usize,
    /// Shortest suffix an NGRAM match may use (`--speculative-ngram-min-match-window-size`).
    pub ngram_min_window: usize,
    /// Longest suffix an NGRAM match tries (`--speculative-ngram-max-match-window-size`).
    pub ngram_max_window: usize,
    /// The draft model (STANDALONE only).
    pub draft_model_path: Option<PathBuf>,
    /// Draft-model forwards per step (`--speculative-num-steps`); proposals per step are at
    /// most `min(num_steps, num_draft_tokens - 1)`.
    pub num_steps: usize,
}

impl SpecConfig {
    /// NGRAM with SGLang's defaults for the match windows and `num_draft_tokens` tokens a step.
    pub fn ngram(num_draft_tokens: usize) -> Self {
        SpecConfig {
            algorithm: SpecAlgorithm::Ngram,
            num_draft_tokens,
            ngram_min_window: 1,
            ngram_max_window: 12,
            draft_model_path: None,
            num_steps: num_draft_tokens.saturating_sub(1),
        }
    }

    /// Most proposals one row carries into a step.
    pub fn max_drafts(&self) -> usize {
        let k = self.num_draft_tokens.saturating_sub(1);
        match self.algorithm {
            SpecAlgorithm::Ngram => k,
            SpecAlgorithm::Standalone => k.min(self.num_steps),
        }
    }

    /// One line for the start-up log.
    pub fn describe(&self) -> String {
        match self.algorithm {
            SpecAlgorithm::Ngram => format!(
                "speculative decoding: NGRAM, up to {} draft tokens per step, match windows {}..={}",
                self.max_drafts(),
                self.ngram_min_window,
                self.ngram_max_window
            ),
            SpecAlgorithm::Standalone => format!(
                "speculative decoding: STANDALONE draft model {}, up to {} draft tokens per step",
                self.draft_model_path.as_ref().map_or("?".into(), |p| p.display().to_string()),
                self.max_drafts()
            ),
        }
    }
}

/// Speculation counters of one request (SGLang's `meta_info` fields of the same names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpecCounts {
    /// Decode forwards of the request (each verifies its proposals, possibly none).
    pub verify_ct: u64,
    /// Tokens proposed.
    pub draft_tokens: u64,
    /// Of those, accepted.
    pub accepted_tokens: u64,
}

/// A request's speculation state: its proposer and its adaptive draft length.
#[derive(Debug, Clone)]
pub struct SpecState {
    /// The request's n-gram index (NGRAM).
    pub index: Option<NgramIndex>,
    /// Proposals to ask for next step (adapted by [`SpecState::record`]).
    pub len: usize,
    /// Most proposals per step.
    pub max: usize,
    /// Steps left without proposals (after proposals that all failed).
    pub skip: usize,
    /// The next pause's length: doubled by every step whose proposals all failed (up to
    /// [`MAX_BACKOFF`]), reset by any acceptance.
    pub backoff: usize,
    /// Counters so far.
    pub counts: SpecCounts,
}

/// Longest pause of a request whose proposals keep failing, in steps.
pub const MAX_BACKOFF: usize = 16;

impl SpecState {
    /// Fresh state under `cfg`.
    pub fn new(cfg: &SpecConfig) -> Self {
        let index = (cfg.algorithm == SpecAlgorithm::Ngram)
            .then(|| NgramIndex::new(cfg.ngram_min_window, cfg.ngram_max_window));
        SpecState {
            index,
            len: cfg.max_drafts(),
            max: cfg.max_drafts(),
            skip: 0,
            backoff: 0,
            counts: SpecCounts::default(),
        }
    }

    /// Proposals wanted this step: the draft length, or none while paused.
    pub fn wanted(&self) -> usize {
        if self.skip > 0 {
            0
        } else {
            self.len
        }
    }

    /// Records one verify step that proposed `proposed` tokens and accepted `accepted`, and
    /// adapts the next draft length: doubled (up to the maximum) after a full acceptance,
    /// otherwise one more than this step accepted. A step whose proposals all failed pauses
    /// proposals for 1, 2, 4 … up to [`MAX_BACKOFF`] steps, so a request whose output copies
    /// nothing (a model that does not repeat its prompt) spends almost no compute on guesses,
    /// while one that copies loses a step at most.
    pub fn record(&mut self, proposed: usize, accepted: usize) {
        self.counts.verify_ct += 1;
        self.counts.draft_tokens += proposed as u64;
        self.counts.accepted_tokens += accepted as u64;
        if proposed == 0 {
            self.skip = self.skip.saturating_sub(1);
            return;
        }
        self.len = if accepted == proposed { (self.len * 2).clamp(1, self.max) } else { (accepted + 1).min(self.max) };
        if accepted == 0 {
            self.backoff = (self.backoff * 2).clamp(1, MAX_BACKOFF);
            self.skip = self.backoff;
        } else {
            self.backoff = 0;
        }
    }
}
