//! The checks that turn the raw flags into a [`BenchConfig`]: refused SGLang flags, backends
//! and datasets by name, then every value and combination SGLang would reject (or silently
//! misread), each error naming its flag. A run starts only from a validated config, so no
//! later stage re-checks a flag.

use std::time::Duration;

use super::flags::BenchArgs;
use super::refused::REFUSED_FLAGS;
use super::values::{DatasetName, GroupDistribution, MooncakeWorkload, SloMetric};

/// Why flags were refused.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct FlagError(pub String);

/// Validated, immutable settings of one run.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// The raw flags, for fields used as given.
    pub args: BenchArgs,
    /// Server base URL without a trailing slash.
    pub base_url: String,
    /// Parsed `--extra-request-body`.
    pub extra_body: serde_json::Map<String, serde_json::Value>,
    /// Parsed `--header` pairs.
    pub headers: Vec<(String, String)>,
    /// `--read-timeout`.
    pub read_timeout: Duration,
    /// `--request-timeout`.
    pub request_timeout: Duration,
    /// `--health-interval`, `None` when disabled.
    pub health_interval: Option<Duration>,
    /// Parsed `--goodput` SLOs in milliseconds, in the order given (a repeated key keeps
    /// its last value, as SGLang's `dict()` does).
    pub goodput: Vec<(SloMetric, f64)>,
    /// `--flush-cache-timeout`.
    pub flush_cache_timeout: Duration,
    /// `--ready-check-timeout-sec`, `None` when 0.
    pub ready_check: Option<Duration>,
    /// Flags given that do nothing with this dataset (SGLang ignores them silently; we say so).
    pub warnings: Vec<String>,
}

impl BenchConfig {
    /// Whether this client sends dataset row `row` (`row % client_count == client_index`: an
    /// interleaved split, so every client gets the same mix of early and late arrivals).
    pub fn owns_row(&self, row: usize) -> bool {
        row % self.args.client_count == self.args.client_index
    }

    /// This client's share of `--max-concurrency`, which is the whole run's: `c / K`, plus
    /// one for the first `c % K` clients, so the shares sum to `c`.
    pub fn client_max_concurrency(&self) -> Option<usize> {
        let (i, k) = (self.args.client_index, self.args.client_count);
        self.args.max_concurrency.map(|c| c / k + usize::from(i < c % k))
    }

    /// True for a run that is one of several clients (or starts at a set time).
    pub fn multi_client(&self) -> bool {
        self.args.client_count > 1 || self.args.start_at.is_some()
    }
}

/// One `--goodput` entry `KEY:VALUE` (SGLang's `_goodput_slo`).
///
/// # Errors
/// [`FlagError`] naming `--goodput` for an unknown key or a value that is not a finite
/// positive number of milliseconds.
pub fn parse_slo(pair: &str) -> Result<(SloMetric, f64), FlagError> {
    let (name, value) = pair.split_once(':').unwrap_or((pair, ""));
    let metric = match name {
        "ttft" => SloMetric::Ttft,
        "tpot" => SloMetric::Tpot,
        "e2el" => SloMetric::E2el,
        _ => {
            return Err(FlagError(format!("--goodput: expected KEY:VALUE with KEY in ttft, tpot, e2el, got {pair:?}")))
        }
    };
    match value.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok((metric, v)),
        _ => Err(FlagError(format!("--goodput {pair:?}: the value must be a finite positive number of milliseconds"))),
    }
}

/// `v` seconds as a duration, refused (naming `flag`) unless finite and positive.
///
/// # Errors
/// [`FlagError`] naming `flag`.
pub fn secs(flag: &str, v: f64) -> Result<Duration, FlagError> {
    if v.is_finite() && v > 0.0 {
        Ok(Duration::from_secs_f64(v))
    } else {
        Err(FlagError(format!("{flag} must be a positive number of seconds, got {v}")))
    }
}

impl BenchArgs {
    /// Flags set away from their defaults that the chosen dataset does not read.
    fn unused_flags(&self) -> Vec<String> {
        let d = self.dataset_name;
        let gsp = [
            ("--gsp-num-groups", self.gsp_num_groups != 64),
            ("--gsp-prompts-per-group", self.gsp_prompts_per_group != 16),
            ("--gsp-system-prompt-len", self.gsp_system_prompt_len != 2048),
            ("--gsp-question-len", self.gsp_question_len != 128),
            ("--gsp-output-len", self.gsp_output_len != 256),
            ("--gsp-range-ratio", self.gsp_range_ratio != 1.0),
            ("--gsp-num-turns", self.gsp_num_turns != 1),
            ("--gsp-ordered", self.gsp_ordered),
            ("--gsp-group-distribution", self.gsp_group_distribution != GroupDistribution::Uniform),
            ("--gsp-fast-prepare", self.gsp_fast_prepare),
            ("--gsp-send-routing-key", self.gsp_send_routing_key),
        ];
        let mooncake = [
            ("--mooncake-num-rounds", self.mooncake_num_rounds != 1),
            ("--mooncake-slowdown-factor", self.mooncake_slowdown_factor != 1.0),
            ("--mooncake-workload", self.mooncake_workload != MooncakeWorkload::Conversation),
        ];
        let mut unused: Vec<&str> = Vec::new();
        if d != DatasetName::GeneratedSharedPrefix {
            unused.extend(gsp.iter().filter(|(_, set)| *set).map(|(f, _)| *f));
        }
        if d != DatasetName::Mooncake {
            unused.extend(mooncake.iter().filter(|(_, set)| *set).map(|(f, _)| *f));
        }
        if self.dataset_offset != 0 && matches!(d, DatasetName::RandomIds | DatasetName::GeneratedSharedPrefix) {
            unused.push("--dataset-offset");
        }
        if self.apply_chat_template && !matches!(d, DatasetName::ShareGpt | DatasetName::Custom) {
            unused.push("--apply-chat-template");
        }
        unused.into_iter().map(|f| format!("{f} has no effect with --dataset-name {}", d.name())).collect()
    }

    /// Checks the flags and derives what the run needs.
    ///
    /// # Errors
    /// [`FlagError`] naming the first offending flag.
    pub fn validate(mut self) -> Result<BenchConfig, FlagError> {
        if let Some(w) = self.dataset_name.mooncake_alias() {
            self.dataset_name = DatasetName::Mooncake;
            self.mooncake_workload = w;
        }
        if let Some(flag) = self.refused_used().first() {
            let why = REFUSED_FLAGS.iter().find(|(f, _)| f == flag).map_or("", |(_, w)| *w);
            return Err(FlagError(format!(
                "{flag} is an SGLang bench_serving flag that sparrow bench does not support ({why})"
            )));
        }
        if !self.backend.supported() {
            return Err(FlagError(format!(
                "--backend {} is an SGLang bench_serving backend that sparrow bench does not support \
                 (supported: sglang, sglang-native, sglang-oai, sglang-oai-chat, vllm, vllm-chat, lmdeploy, lmdeploy-chat, trt)",
                self.backend.name()
            )));
        }
        if !self.dataset_name.supported() {
            return Err(FlagError(format!(
                "--dataset-name {} is an SGLang bench_serving dataset that sparrow bench does not support \
                 (supported: sharegpt, random, random-ids, generated-shared-prefix, custom, openai, mooncake)",
                self.dataset_name.name()
            )));
        }
        if self.backend == crate::client::Backend::Trt {
            if self.model.is_none() {
                return Err(FlagError("--backend trt needs --model (Triton lists no OpenAI models)".into()));
            }
            if self.disable_stream {
                return Err(FlagError("--backend trt always streams (generate_stream); drop --disable-stream".into()));
            }
        }
        if self.rust_worker_threads.is_some() && !self.rust_client {
            return Err(FlagError("--rust-worker-threads requires --rust-client".into()));
        }
        if self.rust_worker_threads == Some(0) {
            return Err(FlagError("--rust-worker-threads must be at least 1".into()));
        }
        let chat = self.backend.api() == crate::client::Api::Chat;
        if self.gsp_num_turns == 0 {
            return Err(FlagError("--gsp-num-turns must be at least 1".into()));
        }
        if self.dataset_name == DatasetName::GeneratedSharedPrefix && self.gsp_num_turns > 1 && !chat {
            return Err(FlagError(format!(
                "--gsp-num-turns {} needs a chat backend (sglang-oai-chat, vllm-chat, lmdeploy-chat), not {}",
                self.gsp_num_turns,
                self.backend.name()
            )));
        }
        match (self.gsp_group_distribution, self.gsp_zipf_alpha) {
            (GroupDistribution::Zipf, None) => {
                return Err(FlagError(
                    "--gsp-group-distribution=zipf requires --gsp-zipf-alpha (a finite float > 0)".into(),
                ))
            }
            (GroupDistribution::Zipf, Some(a)) if !(a.is_finite() && a > 0.0) => {
                return Err(FlagError(format!("--gsp-zipf-alpha must be a finite float > 0, got {a}")))
            }
            (GroupDistribution::Uniform, Some(_)) => {
                return Err(FlagError("--gsp-zipf-alpha is only meaningful with --gsp-group-distribution=zipf".into()))
            }
            _ => {}
        }
        if !(0.0..=1.0).contains(&self.gsp_range_ratio) {
            return Err(FlagError(format!("--gsp-range-ratio must be in [0, 1], got {}", self.gsp_range_ratio)));
        }
        if self.tokenize_prompt {
            if self.backend.api() != crate::client::Api::Generate {
                return Err(FlagError(format!(
                    "--tokenize-prompt sends input_ids, which only the sglang backend's /generate takes, not {}",
                    self.backend.name()
                )));
            }
            if self.dataset_name == DatasetName::GeneratedSharedPrefix && self.gsp_num_turns > 1 {
                return Err(FlagError("--tokenize-prompt requires --gsp-num-turns=1".into()));
            }
            if self.dataset_name == DatasetName::Mooncake || self.dataset_name == DatasetName::OpenAi {
                return Err(FlagError(format!(
                    "--tokenize-prompt does not apply to the {} dataset",
                    self.dataset_name.name()
                )));
            }
        }
        if self.dataset_name == DatasetName::OpenAi {
            if self.dataset_path.is_empty() {
                return Err(FlagError("--dataset-name openai needs --dataset-path (a JSONL of chat requests)".into()));
            }
            if !chat {
                return Err(FlagError(format!(
                    "--dataset-name openai sends chat messages; use a chat backend (sglang-oai-chat, vllm-chat, \
                     lmdeploy-chat), not {}",
                    self.backend.name()
                )));
            }
        }
        if self.use_trace_timestamps == Some(true) && self.dataset_name != DatasetName::Mooncake {
            return Err(FlagError("--use-trace-timestamps is only valid with --dataset-name mooncake".into()));
        }
        if !(self.mooncake_slowdown_factor.is_finite() && self.mooncake_slowdown_factor >= 0.0) {
            return Err(FlagError(format!(
                "--mooncake-slowdown-factor must be a non-negative number, got {}",
                self.mooncake_slowdown_factor
            )));
        }
        if self.mooncake_num_rounds == 0 {
            return Err(FlagError("--mooncake-num-rounds must be at least 1".into()));
        }
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(FlagError(format!("--temperature must be a non-negative number, got {}", self.temperature)));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(FlagError(format!("--top-p must be in (0, 1], got {}", self.top_p)));
        }
        let goodput = match &self.goodput {
            None => Vec::new(),
            Some(pairs) => pairs.iter().map(|p| parse_slo(p)).collect::<Result<Vec<_>, _>>()?,
        };
        let flush_cache_timeout = secs("--flush-cache-timeout", self.flush_cache_timeout)?;
        let warnings = self.unused_flags();
        let ready_check = (self.ready_check_timeout_sec > 0).then(|| Duration::from_secs(self.ready_check_timeout_sec));
        if self.num_prompts == 0 && self.dataset_name != DatasetName::GeneratedSharedPrefix {
            return Err(FlagError("--num-prompts must be at least 1".into()));
        }
        if self.request_rate.is_nan() || self.request_rate <= 0.0 {
            return Err(FlagError(format!("--request-rate must be positive or inf, got {}", self.request_rate)));
        }
        if !(self.burstiness.is_finite() && self.burstiness > 0.0) {
            return Err(FlagError(format!("--burstiness must be a positive number, got {}", self.burstiness)));
        }
        if !(0.0..=1.0).contains(&self.random_range_ratio) {
            return Err(FlagError(format!("--random-range-ratio must be in [0, 1], got {}", self.random_range_ratio)));
        }
        if self.max_concurrency == Some(0) {
            return Err(FlagError("--max-concurrency must be at least 1".into()));
        }
        if self.client_count == 0 {
            return Err(FlagError("--client-count must be at least 1".into()));
        }
        if self.client_index >= self.client_count {
            return Err(FlagError(format!(
                "--client-index {} must be below --client-count {}",
                self.client_index, self.client_count
            )));
        }
        if self.client_count > 1 && self.start_at.is_none() {
            return Err(FlagError(format!(
                "--client-count {} needs --start-at (one unix time for every client, e.g. $(( $(date +%s) + 30 ))) \
                 so that their schedules and records share a clock",
                self.client_count
            )));
        }
        if let Some(t) = self.start_at {
            // Bounds catch the usual slips: milliseconds (`date +%s%3N`), a stale variable.
            let now = crate::run::unix_now();
            if !(t.is_finite() && t > 0.0) || t > now + 86_400.0 || t < now - 3_600.0 {
                return Err(FlagError(format!(
                    "--start-at must be a unix time in seconds within a day from now (now is {now:.0}), got {t}"
                )));
            }
        }
        if let Some(c) = self.max_concurrency {
            if c < self.client_count {
                return Err(FlagError(format!(
                    "--max-concurrency {c} is the whole run's and is split over --client-count {}: it must be at least that",
                    self.client_count
                )));
            }
        }
        if !(0.0..=1.0).contains(&self.max_failure_rate) {
            return Err(FlagError(format!("--max-failure-rate must be in [0, 1], got {}", self.max_failure_rate)));
        }
        if self.dataset_name == DatasetName::Custom && self.dataset_path.is_empty() {
            return Err(FlagError("--dataset-name custom needs --dataset-path".into()));
        }
        let extra_body = match &self.extra_request_body {
            None => serde_json::Map::new(),
            Some(s) => match serde_json::from_str::<serde_json::Value>(s) {
                Ok(serde_json::Value::Object(m)) => m,
                Ok(_) => return Err(FlagError("--extra-request-body must be a JSON object".into())),
                Err(e) => return Err(FlagError(format!("--extra-request-body is not valid JSON: {e}"))),
            },
        };
        let headers = self
            .header
            .iter()
            .map(|h| {
                h.split_once('=')
                    .or_else(|| h.split_once(':'))
                    .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                    .filter(|(k, _)| !k.is_empty())
                    .ok_or_else(|| FlagError(format!("--header {h:?} must be Key=Value")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let base_url = match &self.base_url {
            Some(u) => u.trim_end_matches('/').to_owned(),
            None => format!("http://{}:{}", self.host, self.port.unwrap_or(self.backend.default_port())),
        };
        if base_url.starts_with("https://") {
            return Err(FlagError("https URLs are not supported by this build (no TLS); use http".into()));
        }
        let read_timeout = secs("--read-timeout", self.read_timeout)?;
        let request_timeout = secs("--request-timeout", self.request_timeout)?;
        let health_interval =
            if self.health_interval == 0.0 { None } else { Some(secs("--health-interval", self.health_interval)?) };
        Ok(BenchConfig {
            base_url,
            extra_body,
            headers,
            read_timeout,
            request_timeout,
            health_interval,
            goodput,
            flush_cache_timeout,
            ready_check,
            warnings,
            args: self,
        })
    }
}
