//! Start-up batch cap: how many requests may run at once on this CPU before a larger batch
//! stops paying.
//!
//! SGLang derives `max_running_requests` from the KV pool alone (thousands of rows), which on a
//! GPU is fine: a decode step's time hardly grows with the batch until the GPU is saturated. On
//! a CPU a step soon becomes compute- or bandwidth-bound (the weights are read once per step,
//! but every row adds its own attention over its context and its own LM-head row), so past some
//! batch size a larger batch buys no more tokens/s, only longer inter-token latency for
//! everyone. This module measures where that happens, in the MoE autotune's manner
//! ([`super::autotune`]): time it on the model the server will run, keep the result as JSON in
//! `EngineArgs::autotune_cache_dir` keyed by the model's shapes, the instruction set, the thread
//! count and the context used, and read it back on the next start instead of timing again.
//!
//! The measurement: a synthetic DECODE step (every row one new token after [`CONTEXT_LEN`]
//! cached tokens of its own, in a private [`KvStore`](crate::kv::KvStore) sized for that batch, never the server's
//! pool) at batch sizes 1, 2, 4, … doubling ([`ladder`]); each size is run once to warm up,
//! then timed as the minimum of [`REPEATS`] runs (one run past [`SLOW_STEP_S`]); tokens/s =
//! batch / step time. Doubling stops
//! as soon as two doublings buy less than [`MIN_GAIN`] (10 %) more tokens/s, so huge batches are
//! never timed needlessly. The rule itself ([`choose`]) is a pure function of the curve.
//!
//! An explicit `--max-running-requests` always wins and skips the measurement; so does
//! `--disable-autotune` (the SGLang-derived value is used then).

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::batch::{ForwardBatch, SeqMeta};
use crate::config::{EngineArgs, MoeRunner};
#[cfg(test)]
use crate::kv::KvStore;
use crate::model::Model;
use crate::EngineError;

/// Cached tokens before the new one in every row of the synthetic DECODE step (clamped below
/// the model's context length). The origin workload's sequences average about this much
/// (prompts up to 256, outputs up to 128 tokens).
pub const CONTEXT_LEN: usize = 256;

/// Timed runs per batch size after the warm-up; the minimum is kept.
pub const REPEATS: usize = 3;

/// A warm-up step slower than this many seconds is timed once, not [`REPEATS`] times: a long
/// step varies little relative to its length, and a curve that keeps paying up to hundreds of
/// rows must not stretch the start-up by many seconds.
pub const SLOW_STEP_S: f64 = 0.1;

/// A doubling of the batch must multiply tokens/s by at least this much to be worth it.
pub const MIN_GAIN: f64 = 1.10;

/// The value every cached prior-context KV entry holds during the measurement: finite (the
/// time is what matters), and written rather than left zeroed, so that every page of the
/// store is really allocated and the attention reads real memory, not the kernel's shared
/// zero page.
const FILL: f32 = 1.0 / 64.0;

/// One point of the curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// Rows in the DECODE step.
    pub batch: usize,
    /// `batch / step time`, new tokens per second.
    pub tokens_per_s: f64,
}

/// Why [`choose`] picked its cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Doubling the cap bought less than [`MIN_GAIN`].
    Plateau,
    /// Every doubling up to the largest measurable batch bought at least [`MIN_GAIN`].
    KeepsPaying,
}

/// The outcome of [`choose`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    /// Largest useful batch (the `max` given to [`choose`] under [`Reason::KeepsPaying`]).
    pub cap: usize,
    /// Why.
    pub reason: Reason,
}

/// Batch sizes measured under a limit of `max` rows: 1, 2, 4, … up to the largest power of two
/// not above `max` (just `[1]` for `max ≤ 1`).
pub fn ladder(max: usize) -> Vec<usize> {
    let mut v = vec![1usize];
    while let Some(n) = v.last().and_then(|b| b.checked_mul(2)).filter(|&n| n <= max) {
        v.push(n);
    }
    v
}

/// The choice rule over a measured curve: the smallest `B` of [`ladder`]`(max)` from which
/// neither of the next two doublings (those in the ladder) reaches [`MIN_GAIN`] × tokens/s(B)
/// ([`Reason::Plateau`]); `max` itself when no such `B` exists up to the ladder's top
/// ([`Reason::KeepsPaying`]). Two doublings, not one: a single measurement is noisy and decode
/// curves have local flats (a tile boundary), and a cap one doubling too low costs far more
/// than one too high. `points` may hold more batches than the ladder, in any order (a cache
/// measured under a larger limit).
///
/// Returns `None` when `points` lack a batch size the decision needs (the curve does not cover
/// this `max` yet); with `max ≤ 1` nothing is needed and the answer is 1. A NaN tokens/s counts
/// as no gain.
pub fn choose(points: &[Point], max: usize) -> Option<Choice> {
    let tps = |b: usize| points.iter().find(|p| p.batch == b).map(|p| p.tokens_per_s);
    let lad = ladder(max);
    for (i, &b) in lad.iter().enumerate() {
        if i + 1 == lad.len() {
            break;
        }
        let base = tps(b)?;
        let mut pays = false;
        for &larger in lad.iter().skip(i + 1).take(2) {
            // False when either is NaN: no gain.
            if tps(larger)? >= MIN_GAIN * base {
                pays = true;
                break;
            }
        }
        if !pays {
            return Some(Choice { cap: b, reason: Reason::Plateau });
        }
    }
    Some(Choice { cap: max.max(1), reason: Reason::KeepsPaying })
}

/// Where the cap came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// Timed at this start (and stored when there is a cache directory).
    Measured,
    /// Read from the cache directory.
    Cached,
    /// `--max-running-requests` was given; nothing measured.
    Given,
    /// `--disable-autotune`: the SGLang-derived value, nothing measured.
    Disabled,
}

/// The batch cap in effect, for the start-up line and `/get_server_info`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BatchCap {
    /// Where [`BatchCap::chosen`] came from.
    pub source: Source,
    /// The `max_running_requests` the scheduler gets.
    pub chosen: usize,
    /// What it would be without the cap: the given value, or the one derived from the KV pool
    /// as SGLang derives it.
    pub derived: usize,
    /// The curve the choice was made on, ascending by batch (empty when nothing was measured).
    pub measured: Vec<Point>,
    /// Why [`BatchCap::chosen`] (measured or cached only).
    pub reason: Option<Reason>,
    /// Cached tokens per row in the timed steps.
    pub context_len: usize,
    /// Cache key (measured or cached only).
    pub key: Option<String>,
    /// Cache file (when there is a cache directory).
    pub file: Option<PathBuf>,
    /// Seconds spent timing at this start (0 unless measured).
    pub seconds: f64,
}

impl BatchCap {
    /// One line for the start-up log, e.g. `batch cap: B=1: 120 tok/s, 2: 230, 4: 250 ->
    /// max_running_requests=2 (the next two doublings buy < 10 %; measured in 0.4 s, 256 cached tokens
    /// per row)`.
    pub fn summary(&self) -> String {
        match self.source {
            Source::Given => format!("batch cap: max_running_requests={} (given; not measured)", self.chosen),
            Source::Disabled => format!(
                "batch cap: max_running_requests={} as derived from the KV pool (autotune disabled; not measured)",
                self.chosen
            ),
            Source::Measured | Source::Cached => {
                let curve = self
                    .measured
                    .iter()
                    .enumerate()
                    .map(|(i, p)| {
                        let unit = if i == 0 { " tok/s" } else { "" };
                        let lead = if i == 0 { "B=" } else { "" };
                        format!("{lead}{}: {:.0}{unit}", p.batch, p.tokens_per_s)
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                let why = match self.reason {
                    Some(Reason::Plateau) => format!("the next two doublings buy < {:.0} %", (MIN_GAIN - 1.0) * 100.0),
                    Some(Reason::KeepsPaying) => {
                        format!("every doubling measured bought ≥ {:.0} %", (MIN_GAIN - 1.0) * 100.0)
                    }
                    None => String::new(),
                };
                let how = match (self.source, &self.file) {
                    (Source::Cached, Some(f)) => format!("cached in {}", f.display()),
                    _ => format!("measured in {:.1} s", self.seconds),
                };
                let curve = if curve.is_empty() { "nothing to measure".to_owned() } else { curve };
                format!(
                    "batch cap: {curve} -> max_running_requests={} ({why}; {how}, {} cached tokens per row)",
                    self.chosen, self.context_len
                )
            }
        }
    }
}

/// The stored measurement (one JSON file per key).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stored {
    /// What the timing was for (see [`key`]).
    pub key: String,
    /// Cached tokens per row.
    pub context_len: usize,
    /// The curve, ascending by batch.
    pub points: Vec<Point>,
}

/// The cache key: model architecture, attention kind and shapes (layers, hidden size,
/// vocabulary, KV bytes per token), weight bytes, `variant` (options that change a decode
/// step's cost, e.g. GLM-5's DSA decode attention and MoE runner; empty for Llama), the
/// instruction set, the thread count, the context length and the kernels' generation
/// ([`sparrow_cpu::KERNEL_GENERATION`]). Only `[A-Za-z0-9._-]` remain, so
/// it is a file name.
pub fn key(model: &dyn Model, variant: &str, isa: &str, threads: usize, context_len: usize) -> String {
    let i = model.info();
    let needs = model.attention_needs();
    let raw = format!(
        "batchcap_{}_{}_L{}_H{}_V{}_kv{}_W{}{variant}_{isa}_{threads}t_ctx{context_len}_k{}",
        i.architecture,
        needs.kind,
        i.num_layers,
        i.hidden_size,
        i.vocab_size,
        needs.kv_layout.bytes_per_token(),
        i.weight_bytes,
        sparrow_cpu::KERNEL_GENERATION,
    );
    raw.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '-' }).collect()
}

/// The cache file of `key` in `dir`.
pub fn path(dir: &Path, key: &str) -> PathBuf {
    dir.join(format!("{key}.json"))
}

/// Reads the stored measurement for `key` from `dir`, if present, readable and for that key.
pub fn load(dir: &Path, key: &str) -> Option<Stored> {
    let text = std::fs::read_to_string(path(dir, key)).ok()?;
    let s: Stored = serde_json::from_str(&text).ok()?;
    (s.key == key).then_some(s)
}

/// Writes `s` to `dir` (created if missing) under its key.
///
/// # Errors
/// [`EngineError::Config`] naming the directory or file that could not be written.
pub fn store(dir: &Path, s: &Stored) -> Result<PathBuf, EngineError> {
    std::fs::create_dir_all(dir).map_err(|e| EngineError::Config(format!("{}: {e}", dir.display())))?;
    let p = path(dir, &s.key);
    let text = serde_json::to_string_pretty(s).map_err(|e| EngineError::Config(e.to_string()))?;
    std::fs::write(&p, text).map_err(|e| EngineError::Config(format!("{}: {e}", p.display())))?;
    Ok(p)
}

/// The synthetic DECODE step of `batch` rows after `ctx` cached tokens each: row `i` owns slots
/// `1 + i·(ctx+1) ..= (i+1)·(ctx+1)` (slot 0 unused), its new token at position `ctx` goes to
/// the last of them, and every row wants logits, as in serving. Needs a store of
/// `batch·(ctx+1) + 1` slots.
pub fn decode_batch(batch: usize, ctx: usize, vocab: usize) -> ForwardBatch {
    let per = ctx + 1;
    let mut b = ForwardBatch::default();
    b.kv_indptr.push(0);
    for i in 0..batch {
        let first = 1 + i * per;
        // Any valid token does; spread them over the vocabulary.
        b.input_ids.push(((i * 7919 + 1) % vocab.max(1)) as u32);
        b.positions.push(ctx as u32);
        b.out_cache_loc.push((first + ctx) as u32);
        b.seqs.push(SeqMeta {
            req_pool_idx: i as u32,
            prefix_len: ctx as u32,
            extend_len: 1,
            token_start: i as u32,
            num_logits: 1,
        });
        b.kv_indices.extend((first..first + per).map(|s| s as u32));
        b.kv_indptr.push(b.kv_indices.len() as u32);
        b.logits_rows.push(i as u32);
    }
    b
}

/// Times the DECODE step of `batch` rows after `ctx` cached tokens each in a private store:
/// one warm-up, then the minimum of [`REPEATS`] runs (one when the warm-up took longer than
/// [`SLOW_STEP_S`]). Returns tokens/s.
///
/// # Errors
/// The model's forward error, or a batch the validator refuses (a bug here).
pub fn time_decode(model: &mut dyn Model, batch: usize, ctx: usize) -> Result<f64, EngineError> {
    let fb = decode_batch(batch, ctx, model.info().vocab_size);
    let slots = batch * (ctx + 1) + 1;
    fb.validate(slots).map_err(|e| EngineError::Internal(format!("batch cap: {e}")))?;
    let mut kv = crate::model::kv_store(model, slots, batch, 0);
    kv.fill(FILL);
    let t0 = Instant::now();
    model.forward(&fb, &mut kv)?;
    let repeats = if t0.elapsed().as_secs_f64() > SLOW_STEP_S { 1 } else { REPEATS };
    let mut best = f64::INFINITY;
    for _ in 0..repeats {
        let t0 = Instant::now();
        model.forward(&fb, &mut kv)?;
        best = best.min(t0.elapsed().as_secs_f64());
    }
    // A step too fast for the clock (a fake model) must not make an infinite rate.
    Ok(batch as f64 / best.max(1e-9))
}

/// Measures [`ladder`]`(max)` in order until [`choose`] can decide; returns the points.
///
/// # Errors
/// As [`time_decode`].
pub fn measure(model: &mut dyn Model, max: usize, ctx: usize) -> Result<Vec<Point>, EngineError> {
    let mut points = Vec::new();
    for b in ladder(max) {
        if choose(&points, max).is_some() {
            break;
        }
        // Kept to 1e-3 tok/s: 10 or so significant digits, which serde_json reads back exactly
        // (a full-precision f64 can come back one ulp off), so a warm start sees the same curve.
        let tps = (time_decode(model, b, ctx)? * 1e3).round() / 1e3;
        points.push(Point { batch: b, tokens_per_s: tps });
    }
    Ok(points)
}

/// The batch cap for an engine about to start: `derived` is the `max_running_requests` that
/// [`crate::config::derive_config`] gives (the flag's value when given), `pool_tokens` the KV
/// pool's size, `isa` the kernels' instruction set name.
///
/// Given `--max-running-requests` or `--disable-autotune`, `derived` unchanged. Otherwise the
/// curve from the cache (when it covers the decision) or measured now (and stored), measured
/// only up to the batch the server's pool could hold at [`CONTEXT_LEN`] tokens per row (so the
/// measurement never allocates more than the server itself would). The cap is the
/// [`choose`]n batch, or `derived` when every measured doubling paid.
///
/// # Errors
/// The model's forward error during the measurement, or a cache file that cannot be written.
pub fn decide(
    model: &mut dyn Model,
    args: &EngineArgs,
    isa: &str,
    derived: usize,
    pool_tokens: usize,
) -> Result<BatchCap, EngineError> {
    let ctx = CONTEXT_LEN.min(model.info().context_length.saturating_sub(1));
    let fixed = |source| BatchCap {
        source,
        chosen: derived,
        derived,
        measured: Vec::new(),
        reason: None,
        context_len: ctx,
        key: None,
        file: None,
        seconds: 0.0,
    };
    if args.max_running_requests.is_some() {
        return Ok(fixed(Source::Given));
    }
    if args.disable_autotune {
        return Ok(fixed(Source::Disabled));
    }
    let limit = derived.min(pool_tokens / (ctx + 1)).max(1);
    let variant = if model.attention_needs().kind.contains("dsa") {
        let moe = match args.moe_runner_backend {
            MoeRunner::Auto => "auto",
            MoeRunner::Fixed(m) => m.name(),
        };
        format!("_dsa-{}_moe-{moe}", args.dsa_decode_backend.name())
    } else {
        String::new()
    };
    let key = key(&*model, &variant, isa, args.threads, ctx);
    let dir = args.autotune_cache_dir.as_deref();
    let cached = dir.and_then(|d| load(d, &key)).filter(|s| s.context_len == ctx);
    let (points, choice, source, seconds) = match cached.and_then(|s| choose(&s.points, limit).map(|c| (s, c))) {
        Some((s, c)) => (s.points, c, Source::Cached, 0.0),
        None => {
            let t0 = Instant::now();
            let points = measure(model, limit, ctx)?;
            let seconds = t0.elapsed().as_secs_f64();
            let c = choose(&points, limit)
                .ok_or_else(|| EngineError::Internal("batch cap: the measurement left the choice open".into()))?;
            if let Some(d) = dir {
                store(d, &Stored { key: key.clone(), context_len: ctx, points: points.clone() })?;
            }
            (points, c, Source::Measured, seconds)
        }
    };
    let chosen = match choice.reason {
        Reason::Plateau => choice.cap.min(derived),
        Reason::KeepsPaying => derived,
    };
    let mut measured: Vec<Point> = points.into_iter().filter(|p| p.batch <= limit).collect();
    measured.sort_by_key(|p| p.batch);
    Ok(BatchCap {
        source,
        chosen,
        derived,
        measured,
        reason: Some(choice.reason),
        context_len: ctx,
        file: dir.map(|d| path(d, &key)),
        key: Some(key),
        seconds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{FakeModel, Predict};

    fn curve(f: impl Fn(usize) -> f64, max: usize) -> Vec<Point> {
        ladder(max).into_iter().map(|b| Point { batch: b, tokens_per_s: f(b) }).collect()
    }

    #[test]
    fn ladder_is_powers_of_two_up_to_the_limit() {
        assert_eq!(ladder(0), vec![1]);
        assert_eq!(ladder(1), vec![1]);
        assert_eq!(ladder(2), vec![1, 2]);
        assert_eq!(ladder(48), vec![1, 2, 4, 8, 16, 32]);
        assert_eq!(ladder(64), vec![1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(ladder(usize::MAX).len(), usize::BITS as usize);
    }

    /// Linear growth to 16 rows then flat: 16 → 32 buys nothing, so the cap is 16.
    #[test]
    fn linear_then_flat_caps_at_the_knee() {
        let p = curve(|b| 100.0 * b.min(16) as f64, 4096);
        assert_eq!(choose(&p, 4096), Some(Choice { cap: 16, reason: Reason::Plateau }));
        // The same with a decline past the knee.
        let p = curve(|b| if b <= 16 { 100.0 * b as f64 } else { 1500.0 }, 4096);
        assert_eq!(choose(&p, 4096).map(|c| c.cap), Some(16));
        // Past 8 rows a doubling buys 12 % to 32 rows, then 8 %: the cap is 32.
        let p = curve(
            |b| match b {
                ..=8 => 100.0 * b as f64,
                16 => 896.0,
                32 => 1003.5,
                _ => 1083.8 * (b / 64) as f64,
            },
            64,
        );
        assert_eq!(choose(&p, 64), Some(Choice { cap: 32, reason: Reason::Plateau }), "{p:?}");
    }

    /// One flat doubling followed by a paying one (a local plateau, or noise) does not stop the
    /// ladder: measured on this machine, 4 → 8 rows bought 8 % and 8 → 16 rows 38 %.
    #[test]
    fn a_single_flat_doubling_is_not_a_plateau() {
        let p = curve(
            |b| match b {
                1 => 95.0,
                2 => 159.0,
                4 => 242.0,
                8 => 261.0,
                16 => 340.0,
                _ => 350.0,
            },
            256,
        );
        assert_eq!(choose(&p, 256), Some(Choice { cap: 16, reason: Reason::Plateau }));
        assert_eq!(choose(&p[..4], 256), None, "16 is needed to judge 4");
    }

    /// Still growing by ≥ 10 % per doubling at the limit: the cap is the limit, even one that
    /// is not a power of two (its ladder stops at 32).
    #[test]
    fn growth_to_the_limit_keeps_the_limit() {
        let p = curve(|b| 100.0 * (b as f64).powf(0.5), 4096);
        assert_eq!(choose(&p, 4096), Some(Choice { cap: 4096, reason: Reason::KeepsPaying }));
        assert_eq!(choose(&p, 48), Some(Choice { cap: 48, reason: Reason::KeepsPaying }));
    }

    /// Tiny gains from the start (4 % per doubling, or a loss): one row.
    #[test]
    fn tiny_gains_cap_at_one() {
        let p = curve(|b| 200.0 * (1.0 + 0.04 * (b as f64).log2()), 256);
        assert_eq!(choose(&p, 256), Some(Choice { cap: 1, reason: Reason::Plateau }));
        let p = curve(|b| 200.0 / b as f64, 256);
        assert_eq!(choose(&p, 256).map(|c| c.cap), Some(1));
        let p = vec![
            Point { batch: 1, tokens_per_s: 200.0 },
            Point { batch: 2, tokens_per_s: f64::NAN },
            Point { batch: 4, tokens_per_s: f64::NAN },
        ];
        assert_eq!(choose(&p, 256).map(|c| c.cap), Some(1), "NaN is no gain");
    }

    /// A curve that stops short of the decision leaves it open; points past the knee or beyond
    /// the limit, or out of order, change nothing.
    #[test]
    fn choice_needs_the_points_up_to_the_knee_only() {
        let p = curve(|b| 100.0 * b.min(16) as f64, 8);
        assert_eq!(choose(&p, 8).map(|c| c.reason), Some(Reason::KeepsPaying));
        assert_eq!(choose(&p, 4096), None, "16 and 32 were never measured");
        let mut p = curve(|b| 100.0 * b.min(16) as f64, 64);
        p.reverse();
        assert_eq!(choose(&p, 4096).map(|c| c.cap), Some(16));
        assert_eq!(choose(&p[..2], 4096), None);
        assert_eq!(choose(&[], 1), Some(Choice { cap: 1, reason: Reason::KeepsPaying }), "nothing to measure");
        assert_eq!(choose(&[], 2), None);
    }

    #[test]
    fn the_synthetic_step_is_a_valid_decode_batch() {
        let b = decode_batch(5, 256, 100);
        b.validate(5 * 257 + 1).expect("valid");
        assert_eq!(b.mode(), crate::batch::ForwardMode::Decode);
        assert_eq!(b.logits_rows, vec![0, 1, 2, 3, 4]);
        assert!(b.validate(5 * 257).is_err(), "the last slot is needed");
    }

    #[test]
    fn cache_round_trip_and_a_different_key_misses() {
        let dir = tempfile::tempdir().expect("tmp");
        let m = FakeModel::new(100, 4096, Predict::NextToken);
        let k = key(&m, "", "avx2", 2, 256);
        assert_eq!(
            k,
            format!("batchcap_fake_gqa_L1_H1_V100_kv8_W0_avx2_2t_ctx256_k{}", sparrow_cpu::KERNEL_GENERATION)
        );
        let s = Stored {
            key: k.clone(),
            context_len: 256,
            points: vec![Point { batch: 1, tokens_per_s: 123.5 }, Point { batch: 2, tokens_per_s: 130.25 }],
        };
        let p = store(&dir.path().join("sub"), &s).expect("stored");
        assert_eq!(p, path(&dir.path().join("sub"), &k));
        assert_eq!(load(&dir.path().join("sub"), &k), Some(s));
        for other in [key(&m, "", "avx2", 1, 256), key(&m, "", "scalar", 2, 256), key(&m, "", "avx2", 2, 128)] {
            assert_ne!(other, k);
            assert_eq!(load(&dir.path().join("sub"), &other), None, "{other}");
        }
        // A file whose content names another key (renamed by hand) is not trusted.
        std::fs::copy(&p, path(&dir.path().join("sub"), "batchcap_other")).expect("copy");
        assert_eq!(load(&dir.path().join("sub"), "batchcap_other"), None);
    }

    /// Counts forwards, so a test can tell whether anything was timed.
    struct Counting(FakeModel, usize);

    impl Model for Counting {
        fn info(&self) -> &crate::model::ModelInfo {
            self.0.info()
        }
        fn attention_needs(&self) -> crate::model::AttentionNeeds {
            self.0.attention_needs()
        }
        fn forward(&mut self, b: &ForwardBatch, kv: &mut KvStore) -> Result<Vec<f32>, EngineError> {
            self.1 += 1;
            self.0.forward(b, kv)
        }
    }

    fn args(dir: &Path) -> EngineArgs {
        EngineArgs { autotune_cache_dir: Some(dir.to_path_buf()), ..EngineArgs::new("unused".into()) }
    }

    /// An explicit `--max-running-requests` wins without timing anything; so does
    /// `--disable-autotune` with the derived value.
    #[test]
    fn given_or_disabled_skips_the_measurement() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut m = Counting(FakeModel::new(100, 4096, Predict::NextToken), 0);
        let a = EngineArgs { max_running_requests: Some(7), ..args(dir.path()) };
        let c = decide(&mut m, &a, "scalar", 7, 1 << 20).expect("decides");
        assert_eq!((c.source, c.chosen, c.measured.len()), (Source::Given, 7, 0));
        let a = EngineArgs { disable_autotune: true, ..args(dir.path()) };
        let c = decide(&mut m, &a, "scalar", 4096, 1 << 20).expect("decides");
        assert_eq!((c.source, c.chosen, c.measured.len()), (Source::Disabled, 4096, 0));
        assert_eq!(m.1, 0, "nothing was run");
        assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0, "nothing was stored");
        assert!(c.summary().contains("max_running_requests=4096"), "{}", c.summary());
    }

    /// Measured on a cold start (and stored), read back on a warm one without running the
    /// model, the same choice; a stored curve that does not cover the decision is measured
    /// again.
    #[test]
    fn warm_start_reads_the_cache() {
        let dir = tempfile::tempdir().expect("tmp");
        let mut m = Counting(FakeModel::new(100, 4096, Predict::NextToken), 0);
        let a = args(dir.path());
        let cold = decide(&mut m, &a, "scalar", 8, 1 << 20).expect("measures");
        assert_eq!(cold.source, Source::Measured);
        assert!(m.1 > 0);
        assert!(!cold.measured.is_empty() && cold.measured.iter().all(|p| p.tokens_per_s > 0.0), "{cold:?}");
        assert!(cold.chosen >= 1 && cold.chosen <= 8);
        assert!(cold.file.as_ref().is_some_and(|f| f.is_file()));
        let runs = m.1;
        let warm = decide(&mut m, &a, "scalar", 8, 1 << 20).expect("reads");
        assert_eq!(m.1, runs, "a warm start runs nothing");
        assert_eq!(warm.source, Source::Cached);
        assert_eq!((warm.chosen, &warm.measured), (cold.chosen, &cold.measured));
        // The pool bounds the measurement: 2 rows of 257 slots fit in 600 tokens, 4 do not.
        let small =
            decide(&mut m, &EngineArgs { autotune_cache_dir: None, ..a.clone() }, "scalar", 8, 600).expect("measures");
        assert!(small.measured.iter().all(|p| p.batch <= 2), "{small:?}");
        assert!(small.summary().starts_with("batch cap: B=1: "), "{}", small.summary());
        // A stored curve that kept paying up to 8 rows cannot decide for 64: timed again.
        let k = key(&m, "", "scalar", a.threads, CONTEXT_LEN);
        let paying = Stored { key: k, context_len: CONTEXT_LEN, points: curve(|b| 100.0 * b as f64, 8) };
        store(dir.path(), &paying).expect("stored");
        assert_eq!(decide(&mut m, &a, "scalar", 8, 1 << 20).expect("reads").source, Source::Cached);
        let runs = m.1;
        let wider = decide(&mut m, &a, "scalar", 64, 1 << 20).expect("measures");
        assert_eq!(wider.source, Source::Measured);
        assert!(m.1 > runs);
    }
}
