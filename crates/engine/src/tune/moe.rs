//! Start-up autotune of the MoE implementation, the way SGLang tunes its fused-MoE kernel
//! configs (`benchmark/kernels/fused_moe_triton/tuning_fused_moe_triton.py`): time every
//! implementation on the shapes the server will run, pick the fastest per batch-size bucket, and
//! keep the choice in a JSON file keyed by the shapes, the instruction set and the thread count,
//! so the next start reads it instead of timing again.
//!
//! Buckets are powers of two up to the largest batch the scheduler builds; a batch uses the
//! smallest bucket at least as large as its token count. Each (bucket, implementation) is run
//! once to warm up, then timed as the minimum of [`REPEATS`] runs on the first MoE layer's real
//! experts with a real routing of random activations.

use std::path::{Path, PathBuf};
use std::time::Instant;

use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::config::{EngineArgs, MoeImpl, MoeRunner};
use crate::model::common::Scratch;
use crate::model::linear::Fwd;
use crate::model::moe::{MoeBench, MoeChoice};
use crate::model::Model;
use crate::EngineError;
use sparrow_cpu::format::ggml::QActs;

/// Timed runs per (bucket, implementation); the minimum is kept.
pub const REPEATS: usize = 3;

/// One bucket's measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BucketChoice {
    /// Largest token count of the bucket.
    pub tokens: usize,
    /// The faster implementation.
    pub choice: MoeImpl,
    /// Microseconds per run of each implementation, `[token_major, expert_major]`.
    pub micros: [f64; 2],
}

/// The stored result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MoeTune {
    /// What the timing was for (shapes, ISA, threads).
    pub key: String,
    /// Per bucket, ascending.
    pub buckets: Vec<BucketChoice>,
}

impl MoeTune {
    /// `(bucket, choice)` pairs for [`crate::model::glm5::MoeChoice::Buckets`].
    pub fn choices(&self) -> Vec<(usize, MoeImpl)> {
        self.buckets.iter().map(|b| (b.tokens, b.choice)).collect()
    }

    /// One line per bucket for the start-up log.
    pub fn summary(&self) -> String {
        self.buckets
            .iter()
            .map(|b| format!("T≤{}: {} ({:.0}/{:.0} µs)", b.tokens, b.choice.name(), b.micros[0], b.micros[1]))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Bucket sizes: 1, 2, 4, … up to the first power of two ≥ `max_tokens`.
pub fn buckets(max_tokens: usize) -> Vec<usize> {
    let mut v = vec![1];
    while *v.last().unwrap_or(&1) < max_tokens.max(1) {
        let n = v.last().unwrap_or(&1) * 2;
        v.push(n);
    }
    v
}

/// The cache key of a MoE layer's shapes on this machine, for buckets up to `max_bucket`
/// tokens, and of the kernels' generation ([`sparrow_cpu::KERNEL_GENERATION`]).
pub fn key(b: &MoeBench<'_>, max_bucket: usize) -> String {
    let m = b.moe;
    format!(
        "moe_{}_E{}_top{}_H{}_I{}_S{}_T{max_bucket}_{}_{}t_k{}",
        m.weight_format(),
        m.num_experts(),
        m.top_k(),
        m.hidden(),
        m.expert_inter(),
        m.shared_inter(),
        b.isa.name(),
        b.pool.threads(),
        sparrow_cpu::KERNEL_GENERATION
    )
}

/// Reads a stored tune for `key` from `dir`, if present and readable.
pub fn load(dir: &Path, key: &str, bucket_list: &[usize]) -> Option<MoeTune> {
    let text = std::fs::read_to_string(path(dir, key)).ok()?;
    let t: MoeTune = serde_json::from_str(&text).ok()?;
    let same = t.key == key && t.buckets.iter().map(|b| b.tokens).eq(bucket_list.iter().copied());
    same.then_some(t)
}

fn path(dir: &Path, key: &str) -> PathBuf {
    dir.join(format!("{key}.json"))
}

/// Times both implementations on every bucket and, when `dir` is given, stores the result.
///
/// # Errors
/// A failure to write the cache file.
pub fn tune(b: &MoeBench<'_>, bucket_list: &[usize], dir: Option<&Path>) -> Result<MoeTune, EngineError> {
    let (moe, pool, isa, hidden) = (b.moe, b.pool, b.isa, b.moe.hidden());
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let mut none = None;
    let mut cx = Fwd { pool, isa, xq: QActs::default(), observer: &mut none, parts: None };
    let mut out = Vec::new();
    for &t in bucket_list {
        let x: Vec<f32> = (0..t * hidden).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let routes = moe.routes(&mut cx, &x, t);
        let mut y = vec![0f32; t * hidden];
        let mut micros = [0f64; 2];
        for (i, imp) in [MoeImpl::TokenMajor, MoeImpl::ExpertMajor].into_iter().enumerate() {
            moe.forward_routed(&mut cx, imp, &routes, &x, &mut Scratch::default(), &mut y);
            let mut best = f64::INFINITY;
            for _ in 0..REPEATS {
                let t0 = Instant::now();
                moe.forward_routed(&mut cx, imp, &routes, &x, &mut Scratch::default(), &mut y);
                best = best.min(t0.elapsed().as_secs_f64() * 1e6);
            }
            micros[i] = best;
        }
        let choice = if micros[0] < micros[1] { MoeImpl::TokenMajor } else { MoeImpl::ExpertMajor };
        out.push(BucketChoice { tokens: t, choice, micros });
    }
    let tune = MoeTune { key: key(b, bucket_list.last().copied().unwrap_or(1)), buckets: out };
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir).map_err(|e| EngineError::Config(format!("{}: {e}", dir.display())))?;
        let p = path(dir, &tune.key);
        let text = serde_json::to_string_pretty(&tune).map_err(|e| EngineError::Config(e.to_string()))?;
        std::fs::write(&p, text).map_err(|e| EngineError::Config(format!("{}: {e}", p.display())))?;
    }
    Ok(tune)
}

/// The MoE implementation per batch size for `model`: `--moe-runner-backend` when it names
/// one; else the start-up autotune's buckets (from the cache when it holds this layer's key),
/// or a fixed rule when autotune is off. What was chosen and why goes to `notes`; a model with
/// no MoE layer is left as it is.
///
/// # Errors
/// A failure to write the autotune cache.
pub fn choose(model: &mut dyn Model, args: &EngineArgs, notes: &mut serde_json::Value) -> Result<(), EngineError> {
    let choice = {
        let Some(b) = model.first_moe() else { return Ok(()) };
        match args.moe_runner_backend {
            MoeRunner::Fixed(f) => {
                notes["moe_runner_backend"] = f.name().into();
                MoeChoice::Fixed(f)
            }
            MoeRunner::Auto if args.disable_autotune => {
                // Without timings: a GEMV per pair for one token, grouped GEMMs beyond.
                notes["moe_runner_backend"] =
                    "auto (autotune disabled: token_major for 1 token, expert_major beyond)".into();
                MoeChoice::Buckets(vec![(1, MoeImpl::TokenMajor), (usize::MAX, MoeImpl::ExpertMajor)])
            }
            MoeRunner::Auto => {
                let max_tokens = args.chunked_prefill_size.min(args.max_prefill_tokens).clamp(1, 1024);
                let bl = buckets(max_tokens);
                let key = key(&b, bl.last().copied().unwrap_or(1));
                let dir = args.autotune_cache_dir.as_deref();
                let (tune, source) = match dir.and_then(|d| load(d, &key, &bl)) {
                    Some(t) => (t, "cache"),
                    None => (tune(&b, &bl, dir)?, "measured"),
                };
                notes["moe_runner_backend"] = "auto".into();
                notes["moe_autotune"] = serde_json::json!({
                    "source": source,
                    "key": tune.key,
                    "file": dir.map(|d| d.join(format!("{}.json", tune.key))),
                    "summary": tune.summary(),
                });
                MoeChoice::Buckets(tune.choices())
            }
        }
    };
    model.set_moe(choice);
    Ok(())
}
