//! The raw flags of `sparrow sweep` (the sweep's own; every other flag is a `sparrow bench`
//! flag, see [`super::split_args`]).

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

/// When a launched server is restarted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Restart {
    /// A fresh server for every step.
    PerStep,
    /// One server for the whole sweep (per side); after a crash, `--on-crash` decides.
    Never,
}

/// What happens after a step crashed the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnCrash {
    /// Stop the sweep: later steps are `skipped`; report what was measured.
    Stop,
    /// Restart the server (when the sweep launched it), mark the lost point, go on.
    Restart,
}

/// The sweep's own flags (`sparrow sweep --help`); every other flag is a `sparrow bench` flag.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "sparrow sweep",
    args_override_self = true,
    about = "Sweep `sparrow bench` over concurrency or request-rate steps, launching servers, judging crashes",
    after_help = "Every `sparrow bench` flag is accepted as well, with the same meaning (see `sparrow bench --help`).\n\
                  Exit status: 0 when every step is ok; 1 when a step failed, crashed or was skipped; \
                  2 bad flags or set-up; 130/143 interrupted."
)]
pub struct SweepArgs {
    /// Concurrency steps, comma-separated (`1,64,256,512`); or, with a `--request-rate` list,
    /// the one `--max-concurrency` of every step.
    #[arg(long, visible_alias = "max-concurrency", value_delimiter = ',')]
    pub concurrency: Vec<usize>,
    /// Request-rate steps (`1,4,inf`); or, with a `--concurrency` list, the one rate of every
    /// step (default inf).
    #[arg(long, value_delimiter = ',')]
    pub request_rate: Vec<f64>,
    /// Prompts per step (default: max(4 × concurrency, 64)).
    #[arg(long, visible_alias = "num-prompts")]
    pub num_prompts_per_step: Option<usize>,
    /// Server command line the sweep launches (`sh -c`); twice for an A/B run.
    #[arg(long, action = clap::ArgAction::Append)]
    pub server_cmd: Vec<String>,
    /// Server address; twice for an A/B run (default from --host/--port).
    #[arg(long, action = clap::ArgAction::Append)]
    pub base_url: Vec<String>,
    /// Name of each side (default A, B).
    #[arg(long, action = clap::ArgAction::Append)]
    pub label: Vec<String>,
    /// When launched servers are restarted.
    #[arg(long, value_enum, default_value = "never")]
    pub restart: Restart,
    /// What to do after a crash.
    #[arg(long, value_enum, default_value = "stop")]
    pub on_crash: OnCrash,
    /// Path polled until the launched server answers 2xx.
    #[arg(long, default_value = "/health")]
    pub ready_path: String,
    /// Seconds a launched server may take to become ready.
    #[arg(long, default_value_t = 600.0)]
    pub startup_timeout: f64,
    /// Seconds of silence (no /health answer, no byte on any stream) after which a live
    /// server is judged hung.
    #[arg(long, default_value_t = 60.0)]
    pub hang_timeout: f64,
    /// Seconds a launched server is given after SIGINT, and again after SIGTERM, before the
    /// next signal (SIGTERM, then SIGKILL).
    #[arg(long, default_value_t = 10.0)]
    pub stop_grace: f64,
    /// Knee: the first step after which output tok/s grows by less than this fraction per
    /// doubling of the step value.
    #[arg(long, default_value_t = 0.10)]
    pub knee_gain: f64,
    /// SLO on each request's time to first token, ms.
    #[arg(long)]
    pub slo_ttft_ms: Option<f64>,
    /// SLO on each request's time per output token, ms.
    #[arg(long)]
    pub slo_tpot_ms: Option<f64>,
    /// SLO on each request's end-to-end latency, ms.
    #[arg(long)]
    pub slo_e2e_ms: Option<f64>,
    /// Fraction of a step's requests that must meet every SLO for the step to meet them.
    #[arg(long, default_value_t = 0.9)]
    pub slo_attainment: f64,
    /// SLOs to search the load for, ms (`ttft_p99<=2000,tpot_p99<=100,e2e_p90<=8000`; a term
    /// without `_pNN` is a per-request bound judged with --slo-attainment): per side, the
    /// listed step values are tried in order until one misses, then the gap is bisected.
    #[arg(long)]
    pub slo: Option<String>,
    /// With --slo on a request-rate sweep: bisection ends when the rate met and the rate
    /// missed are within this fraction of each other.
    #[arg(long, default_value_t = 0.05)]
    pub slo_rate_tolerance: f64,
    /// Runs of each step; the summary gives the median and the spread.
    #[arg(long, visible_alias = "num-runs", default_value_t = 1)]
    pub repeat: usize,
    /// Server configurations: a JSON file of flag sets appended to the one `--server-cmd`
    /// (a list of flag dicts, or a dict of named ones; vLLM's `--serve-params` format); each
    /// configuration gets a fresh server, its own log and its own verdicts.
    #[arg(long)]
    pub serve_params: Option<PathBuf>,
    /// Workloads: a JSON file of `sparrow bench` flag sets (dataset, lengths, ...), each run
    /// over every step of every configuration.
    #[arg(long)]
    pub bench_params: Option<PathBuf>,
    /// Server flag tied to a bench flag (`max_running_requests=max_concurrency`): a step runs
    /// only where both are set to the same value; a workload without the bench flag takes the
    /// configuration's value.
    #[arg(long, value_delimiter = ',')]
    pub link_vars: Vec<String>,
    /// The configuration (a `--serve-params` name) every other is compared with in words
    /// (default: the first).
    #[arg(long)]
    pub baseline: Option<String>,
    /// Folder for every result (default: a new `sweep-YYYYMMDD-HHMMSS` folder here).
    #[arg(long)]
    pub output_dir: Option<PathBuf>,
    /// Skip steps whose `ok` results are already in `--output-dir` (same label, step value,
    /// repeat and bench flags).
    #[arg(long)]
    pub resume: bool,
    /// JSONL file the bench's result lines are appended to (default `<output-dir>/results.jsonl`).
    #[arg(long)]
    pub output_file: Option<PathBuf>,
    /// The cgroup (v2) folder whose `memory.max` and `memory.events` are read (default: the
    /// server's own cgroup, from `/proc/<pid>/cgroup`).
    #[arg(long, hide = true)]
    pub cgroup_dir: Option<PathBuf>,
    /// Seconds between two samples of the server's `/metrics`, CPU and RSS (1 s; tests of a
    /// fast scripted server take more).
    #[arg(long, default_value_t = 1.0, hide = true)]
    pub scrape_interval: f64,
}
