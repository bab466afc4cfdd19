//! `sparrow serve`'s flags of who waits and what is kept: admission control
//! (`--max-queued-requests`, `--queue-timeout`), priority scheduling, fair prefill and the
//! hierarchical cache's file tier. SGLang's flags keep SGLang's spelling, defaults and values
//! (`server_args.py`); `--long-prefill-token-threshold` and `--max-long-partial-prefills` are
//! vLLM's (SGLang has none); `--queue-timeout` and `--disable-fair-prefill` are sparrow's.

use std::path::PathBuf;

use clap::Args;
use sparrow_engine::config::{FairPrefill, PriorityConfig, QueueConfig};
use sparrow_engine::kv::hicache::{HiCacheArgs, WritePolicy};

use super::values;

/// SGLang's default directory of the `file` storage backend (`HiCacheFile`).
const DEFAULT_HICACHE_DIR: &str = "/tmp/hicache";

/// The flags.
#[derive(Debug, Clone, Args)]
pub struct QueueFlags {
    /// Requests waiting for their first admission beyond which a new request is refused with
    /// a 503 (OpenAI's error JSON, `Retry-After: 1`; Anthropic's route answers 529). Default:
    /// no limit.
    #[arg(long, value_parser = values::count)]
    pub max_queued_requests: Option<usize>,
    /// Seconds a request may wait for its first admission; past it, it is answered with a 503
    /// instead (0: no limit, the default). Sparrow's flag.
    #[arg(long, default_value_t = 0.0, value_parser = values::seconds)]
    pub queue_timeout: f64,
    /// Order the waiting queue by the requests' `priority` field (then by arrival), and let a
    /// more urgent request preempt a running one (SGLang's flag).
    #[arg(long)]
    pub enable_priority_scheduling: bool,
    /// Smaller `priority` values run first (by default larger ones do, as in SGLang).
    #[arg(long)]
    pub schedule_low_priority_values_first: bool,
    /// A waiting request preempts a running one only when its priority is better by more
    /// than this (SGLang's default 10).
    #[arg(long, default_value_t = 10, allow_negative_numbers = true)]
    pub priority_scheduling_preemption_threshold: i64,
    /// Priority scheduling without preemption: the queue is ordered, nothing running is
    /// retracted for it.
    #[arg(long)]
    pub disable_priority_preemption: bool,
    /// The priority of a request that gives none (default 0).
    #[arg(long, allow_negative_numbers = true)]
    pub default_priority_value: Option<i64>,
    /// Fair prefill: prompt tokens left above which a prefill is *long* and, while others
    /// wait, takes only the prefill budget they leave (vLLM's flag). Default (0): the
    /// per-step prefill budget (--chunked-prefill-size).
    #[arg(long, default_value_t = 0, value_parser = values::count)]
    pub long_prefill_token_threshold: usize,
    /// Fair prefill: long prompts prefilling at once; a further long prompt waits while
    /// shorter ones behind it are admitted (vLLM's flag, default 1).
    #[arg(long, default_value_t = 1, value_parser = values::count)]
    pub max_long_partial_prefills: usize,
    /// Turn fair prefill off: a running prompt takes the whole prefill budget before any new
    /// request is admitted (sparrow's behaviour before fair prefill, for A/B).
    #[arg(long)]
    pub disable_fair_prefill: bool,
    /// Keep radix-cache pages beyond the KV pool in a file tier, reopened after a restart
    /// (SGLang's HiCache; sparrow's host tier is the file tier, which the OS page cache keeps
    /// hot).
    #[arg(long)]
    pub enable_hierarchical_cache: bool,
    /// The tier's storage: `file` (the only one sparrow has; SGLang's other backends, from
    /// `mooncake` to `seaweedfs`, are refused by name). Default: `file`.
    #[arg(long)]
    pub hicache_storage_backend: Option<String>,
    /// The file tier's byte budget in GB (overrides --hicache-ratio; 0, SGLang's default: use
    /// the ratio).
    #[arg(long)]
    pub hicache_size: Option<f64>,
    /// The file tier's size as a multiple of the KV pool's bytes (SGLang's default 2.0).
    #[arg(long, default_value_t = 2.0)]
    pub hicache_ratio: f64,
    /// `write_through` (a page is written as it enters the radix cache; SGLang's default) or
    /// `write_back` (written when evicted). SGLang's `write_through_selective` is refused.
    #[arg(long, default_value = "write_through")]
    pub hicache_write_policy: String,
    /// JSON of backend settings: `{"storage_dir": "/path"}` (or `file_path`) sets the tier's
    /// directory (else `$SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR`, else /tmp/hicache, as
    /// SGLang's `file` backend); any other key is refused by name.
    #[arg(long)]
    pub hicache_storage_backend_extra_config: Option<String>,
}

impl QueueFlags {
    /// The engine's queue settings.
    ///
    /// # Errors
    /// A contradiction, naming the flag.
    pub fn queue(&self) -> Result<QueueConfig, String> {
        if self.max_long_partial_prefills == 0 {
            return Err("--max-long-partial-prefills must be at least 1".into());
        }
        let priority = self.enable_priority_scheduling.then(|| PriorityConfig {
            low_values_first: self.schedule_low_priority_values_first,
            preemption: !self.disable_priority_preemption,
            preemption_threshold: self.priority_scheduling_preemption_threshold,
            default_priority: self.default_priority_value.unwrap_or(0),
        });
        let fair_prefill = (!self.disable_fair_prefill).then_some(FairPrefill {
            long_prefill_token_threshold: self.long_prefill_token_threshold,
            max_long_partial_prefills: self.max_long_partial_prefills,
        });
        Ok(QueueConfig {
            priority,
            fair_prefill,
            queue_timeout: values::timeout(self.queue_timeout),
            max_queued_requests: self.max_queued_requests,
        })
    }

    /// The file tier's settings (`None`: off).
    ///
    /// # Errors
    /// A value sparrow does not implement or a malformed one, naming the flag.
    pub fn hicache(&self) -> Result<Option<HiCacheArgs>, String> {
        // Values are checked with or without --enable-hierarchical-cache; without it, as in
        // SGLang, the tier's flags change nothing.
        match self.hicache_storage_backend.as_deref() {
            None | Some("file") => {}
            Some(
                b @ ("sim" | "mooncake" | "npu_memcache" | "hf3fs" | "nixl" | "aibrix" | "dynamic" | "eic" | "simm"
                | "mori" | "shm" | "tensorcast" | "seaweedfs"),
            ) => {
                return Err(format!(
                    "--hicache-storage-backend {b} is an SGLang storage backend that sparrow serve does not support \
                     (have: file)"
                ))
            }
            Some(b) => return Err(format!("--hicache-storage-backend {b:?} is not a storage backend (have: file)")),
        }
        let write_policy = match self.hicache_write_policy.as_str() {
            "write_through" => WritePolicy::WriteThrough,
            "write_back" => WritePolicy::WriteBack,
            "write_through_selective" => {
                return Err("--hicache-write-policy write_through_selective is an SGLang policy that sparrow serve \
                            does not support (have: write_through, write_back)"
                    .into())
            }
            p => {
                return Err(format!(
                    "--hicache-write-policy {p:?} is not a write policy (have: write_through, write_back)"
                ))
            }
        };
        if !(self.hicache_ratio.is_finite() && self.hicache_ratio > 0.0) {
            return Err(format!("--hicache-ratio {} must be positive", self.hicache_ratio));
        }
        // SGLang's default 0 means "use the ratio".
        let size_bytes = match self.hicache_size {
            Some(g) if !(g.is_finite() && g >= 0.0) => {
                return Err(format!("--hicache-size {g} must be 0 (use --hicache-ratio) or a positive number of GB"))
            }
            Some(g) if g > 0.0 => Some((g * 1e9) as u64),
            _ => None,
        };
        let mut dir = None;
        if let Some(raw) = &self.hicache_storage_backend_extra_config {
            let v: serde_json::Value = serde_json::from_str(raw)
                .map_err(|e| format!("--hicache-storage-backend-extra-config is not JSON: {e}"))?;
            let obj = v.as_object().ok_or("--hicache-storage-backend-extra-config must be a JSON object".to_owned())?;
            for (k, v) in obj {
                match (k.as_str(), v.as_str()) {
                    ("storage_dir" | "file_path", Some(p)) => dir = Some(PathBuf::from(p)),
                    ("storage_dir" | "file_path", None) => {
                        return Err(format!("--hicache-storage-backend-extra-config: {k} must be a string"))
                    }
                    _ => {
                        return Err(format!(
                            "--hicache-storage-backend-extra-config: key {k:?} is not one sparrow's file backend \
                             takes (have: storage_dir, or its alias file_path)"
                        ))
                    }
                }
            }
        }
        if !self.enable_hierarchical_cache {
            return Ok(None);
        }
        let dir = dir
            .or_else(|| std::env::var_os("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(DEFAULT_HICACHE_DIR));
        Ok(Some(HiCacheArgs { dir, size_bytes, ratio: self.hicache_ratio, write_policy }))
    }
}
