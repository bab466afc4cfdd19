//! `sparrow sweep` flags: the sweep's own, split from the `sparrow bench` flags they are mixed
//! with, and validated into an immutable [`SweepConfig`].
//!
//! Every flag that is not the sweep's goes to `sparrow bench`'s parser unchanged, so it keeps
//! its meaning (and a typo is refused by name, as by `sparrow bench`). `--request-rate`,
//! `--max-concurrency`, `--base-url`, `--num-prompts` and `--output-file` are taken by the sweep,
//! which sets them per step.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use sparrow_bench::args::{BenchArgs, BenchConfig};

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

/// Why flags were refused.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct FlagError(pub String);

/// Flags that take no value.
const SWEEP_SWITCHES: &[&str] = &["resume"];
/// Flags (with a value) that belong to the sweep; the rest go to `sparrow bench`.
const SWEEP_FLAGS: &[&str] = &[
    "concurrency",
    "max-concurrency",
    "request-rate",
    "num-prompts-per-step",
    "num-prompts",
    "server-cmd",
    "base-url",
    "label",
    "restart",
    "on-crash",
    "ready-path",
    "startup-timeout",
    "hang-timeout",
    "stop-grace",
    "knee-gain",
    "slo-ttft-ms",
    "slo-tpot-ms",
    "slo-e2e-ms",
    "slo-attainment",
    "slo",
    "slo-rate-tolerance",
    "repeat",
    "num-runs",
    "serve-params",
    "bench-params",
    "link-vars",
    "baseline",
    "output-dir",
    "output-file",
    "cgroup-dir",
    "scrape-interval",
];
/// Bench flags the sweep sets per step and so refuses.
const REFUSED: &[(&str, &str)] = &[
    ("details-file", "each step writes its own details file under --output-dir"),
    ("client-index", "a sweep is one client; run `sparrow bench` per client and `sparrow bench merge`"),
    ("client-count", "a sweep is one client; run `sparrow bench` per client and `sparrow bench merge`"),
    ("start-at", "each step starts when the previous one ends"),
];

/// Splits raw arguments (without the program name) into the sweep's and the bench's.
///
/// `--help`/`-h` stays with the sweep's. `--flag=value` and `--flag value` are both read.
pub fn split_args(raw: &[String]) -> (Vec<String>, Vec<String>) {
    let (mut sweep, mut bench) = (vec!["sparrow sweep".to_owned()], vec!["sparrow bench".to_owned()]);
    let mut it = raw.iter().peekable();
    while let Some(a) = it.next() {
        let name = a.strip_prefix("--").map(|n| n.split_once('=').map_or(n, |(k, _)| k));
        let is = |set: &[&str]| name.is_some_and(|n| set.contains(&n));
        if a == "-h" || a == "--help" || is(SWEEP_SWITCHES) {
            sweep.push(a.clone());
        } else if is(SWEEP_FLAGS) {
            sweep.push(a.clone());
            if !a.contains('=') {
                if let Some(v) = it.next() {
                    sweep.push(v.clone());
                }
            }
        } else {
            bench.push(a.clone());
        }
    }
    (sweep, bench)
}

/// The step values of a sweep.
#[derive(Debug, Clone, PartialEq)]
pub enum Axis {
    /// `--max-concurrency` per step.
    Concurrency(Vec<usize>),
    /// `--request-rate` per step (req/s; infinite means all at once).
    RequestRate(Vec<f64>),
}

impl Axis {
    /// The index of step value `v`, added at the end if new (an SLO search's bisection).
    pub fn index_or_push(&mut self, v: f64) -> usize {
        if let Some(i) = (0..self.len()).find(|&i| self.value(i) == v) {
            return i;
        }
        match self {
            Axis::Concurrency(c) => c.push(v.round().max(1.0) as usize),
            Axis::RequestRate(r) => r.push(v),
        }
        self.len() - 1
    }
    /// The axis name as used in the report (`concurrency` / `request_rate`).
    pub fn name(&self) -> &'static str {
        match self {
            Axis::Concurrency(_) => "concurrency",
            Axis::RequestRate(_) => "request_rate",
        }
    }
    /// Number of step values.
    pub fn len(&self) -> usize {
        match self {
            Axis::Concurrency(v) => v.len(),
            Axis::RequestRate(v) => v.len(),
        }
    }
    /// True when there is no step value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Step value `i` as a number (concurrencies as f64).
    pub fn value(&self, i: usize) -> f64 {
        match self {
            Axis::Concurrency(v) => v[i] as f64,
            Axis::RequestRate(v) => v[i],
        }
    }
}

/// One series of steps: a side of an A/B run (or the only side), or one configuration ×
/// workload of a grid.
#[derive(Debug, Clone)]
pub struct Side {
    /// `--label`; in a grid the configuration's name, then `:` and the workload's when there
    /// are workloads.
    pub label: String,
    /// `--server-cmd` (with the configuration's flags), when the sweep launches the server.
    pub server_cmd: Option<String>,
    /// Base URL without a trailing slash.
    pub base_url: String,
    /// The server the side's steps run on (index into the sweep's servers): the sides of one
    /// grid configuration share it.
    pub server: usize,
    /// The grid configuration's name (`--serve-params`).
    pub config: Option<String>,
    /// The workload's name (`--bench-params`).
    pub workload: Option<String>,
    /// The workload's position in `--bench-params` (0 without).
    pub workload_index: usize,
    /// Bench flags after the sweep's own: the workload's, then values tied by `--link-vars`.
    pub bench_extra: Vec<String>,
    /// The validated bench flags the side's steps start from.
    pub bench: BenchConfig,
    /// The step values (indices on the axis) the side runs: every one, or those a
    /// `--link-vars` pair on the step flag keeps.
    pub steps: Vec<usize>,
}

impl Side {
    /// The bench flags of the side, as given (the sweep's, then [`Self::bench_extra`]).
    pub fn bench_argv(&self, common: &[String]) -> Vec<String> {
        common.iter().chain(&self.bench_extra).cloned().collect()
    }
}

/// The seed stride of workloads: more than any workload's steps × repeats.
pub const WORKLOAD_STRIDE: usize = 1 << 24;

/// The seed stride of repeats in an SLO search, which adds step values as it goes: more than
/// any search holds (64 listed, then a bisection of at most 64 halvings per side).
pub const SEARCH_STRIDE: usize = 1 << 16;

/// Validated settings of a sweep (a search adds step values to the axis as it goes).
#[derive(Debug, Clone)]
pub struct SweepConfig {
    /// The raw sweep flags, for fields used as given.
    pub args: SweepArgs,
    /// The bench flags as given (after the split), for the resume key and the report.
    pub bench_argv: Vec<String>,
    /// The validated bench flags every step starts from.
    pub bench: BenchConfig,
    /// The step values.
    pub axis: Axis,
    /// With a concurrency axis: the one rate of every step; with a rate axis: the one
    /// concurrency (if any).
    pub fixed_rate: f64,
    /// See [`Self::fixed_rate`].
    pub fixed_concurrency: Option<usize>,
    /// One or two sides, or a grid's configurations × workloads (configuration-major).
    pub sides: Vec<Side>,
    /// True for a grid of server configurations (`--serve-params`).
    pub grid: bool,
    /// The grid's configurations, in file order (empty outside a grid).
    pub configs: Vec<crate::grid::ParamSet>,
    /// The workloads (`--bench-params`), in file order (empty without).
    pub workloads: Vec<crate::grid::ParamSet>,
    /// The configuration the others are compared with (`--baseline`, else the first).
    pub baseline: Option<String>,
    /// Every SLO (`--slo` terms and `--slo-*-ms` bounds).
    pub slo: crate::slo::Slo,
    /// True when the steps are a search for the SLOs' limit (`--slo`).
    pub search: bool,
    /// How many step values were listed (a search appends the values it bisects to).
    pub listed: usize,
    /// `--startup-timeout`.
    pub startup_timeout: Duration,
    /// `--hang-timeout`.
    pub hang_timeout: Duration,
    /// `--stop-grace`.
    pub stop_grace: Duration,
}

fn secs(flag: &str, v: f64) -> Result<Duration, FlagError> {
    sparrow_bench::args::secs(flag, v).map_err(|e| FlagError(e.0))
}

/// Parses and validates raw `sparrow sweep` arguments (without the program name).
///
/// # Errors
/// [`FlagError`] naming the first offending flag; for `--help`, the help text (print it and
/// exit 0: [`FlagError::is_help`]).
pub fn parse(raw: &[String]) -> Result<SweepConfig, ParseError> {
    let (sweep_argv, bench_argv) = split_args(raw);
    let args = SweepArgs::try_parse_from(&sweep_argv).map_err(|e| match e.kind() {
        clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => ParseError::Help(e.to_string()),
        _ => ParseError::Flags(FlagError(clap_message(&e))),
    })?;
    for a in &bench_argv[1..] {
        if let Some((flag, why)) =
            REFUSED.iter().find(|(f, _)| a.strip_prefix("--").is_some_and(|n| n.split('=').next() == Some(f)))
        {
            return Err(ParseError::Flags(FlagError(format!("--{flag} is set by the sweep per step: {why}"))));
        }
    }
    if let Some(e) = sparrow_bench::args::ambiguous_flag(&bench_argv[1..]) {
        return Err(ParseError::Flags(FlagError(e)));
    }
    let bench_args =
        BenchArgs::try_parse_from(&bench_argv).map_err(|e| ParseError::Flags(FlagError(clap_message(&e))))?;
    validate(args, bench_args, bench_argv[1..].to_vec()).map_err(ParseError::Flags)
}

/// A clap error as one line of text for `error: {}` (clap's own `error: ` prefix dropped),
/// naming the sweep, not the bench, in its usage line.
fn clap_message(e: &clap::Error) -> String {
    let text = e.to_string();
    text.trim_start_matches("error: ")
        .replace("Usage: sparrow bench", "Usage: sparrow sweep [SWEEP FLAGS] [SPARROW BENCH FLAGS]")
        .trim_end()
        .to_owned()
}

/// What [`parse`] refused.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// `--help` was asked for: the text to print (exit 0).
    #[error("{0}")]
    Help(String),
    /// Bad flags (exit 2).
    #[error(transparent)]
    Flags(#[from] FlagError),
}

fn validate(a: SweepArgs, mut bench_args: BenchArgs, bench_argv: Vec<String>) -> Result<SweepConfig, FlagError> {
    if a.concurrency.len() > 1 && a.request_rate.len() > 1 {
        return Err(FlagError(
            "--concurrency and --request-rate are both lists: sweep one of them; the other takes one value".into(),
        ));
    }
    if a.concurrency.contains(&0) {
        return Err(FlagError("--concurrency values must be at least 1".into()));
    }
    if let Some(r) = a.request_rate.iter().find(|r| r.is_nan() || **r <= 0.0) {
        return Err(FlagError(format!("--request-rate values must be positive or inf, got {r}")));
    }
    let (axis, fixed_rate, fixed_concurrency) = if a.request_rate.len() > 1 {
        (Axis::RequestRate(a.request_rate.clone()), f64::INFINITY, a.concurrency.first().copied())
    } else if !a.concurrency.is_empty() {
        (Axis::Concurrency(a.concurrency.clone()), a.request_rate.first().copied().unwrap_or(f64::INFINITY), None)
    } else if !a.request_rate.is_empty() {
        (Axis::RequestRate(a.request_rate.clone()), f64::INFINITY, None)
    } else {
        return Err(FlagError("give the steps: --concurrency 1,64,256,512 or --request-rate 1,4,inf".into()));
    };
    let vals: Vec<f64> = (0..axis.len()).map(|i| axis.value(i)).collect();
    if vals.windows(2).any(|w| w[1] <= w[0]) {
        return Err(FlagError(format!(
            "--{} steps must increase ({}): the knee compares each step with the next",
            axis.name().replace('_', "-"),
            vals.iter().map(|v| crate::analysis::fmt_value(*v)).collect::<Vec<_>>().join(",")
        )));
    }
    if a.repeat == 0 {
        return Err(FlagError("--repeat must be at least 1".into()));
    }
    if a.num_prompts_per_step == Some(0) {
        return Err(FlagError("--num-prompts-per-step must be at least 1".into()));
    }
    if !(a.knee_gain.is_finite() && a.knee_gain > 0.0) {
        return Err(FlagError(format!("--knee-gain must be a positive fraction, got {}", a.knee_gain)));
    }
    if !(a.slo_attainment > 0.0 && a.slo_attainment <= 1.0) {
        return Err(FlagError(format!("--slo-attainment must be in (0, 1], got {}", a.slo_attainment)));
    }
    for (flag, v) in
        [("--slo-ttft-ms", a.slo_ttft_ms), ("--slo-tpot-ms", a.slo_tpot_ms), ("--slo-e2e-ms", a.slo_e2e_ms)]
    {
        if v.is_some_and(|v| !(v.is_finite() && v > 0.0)) {
            return Err(FlagError(format!("{flag} must be a positive number of milliseconds")));
        }
    }
    let mut slo = crate::slo::Slo { terms: vec![], attainment: a.slo_attainment };
    if let Some(text) = &a.slo {
        slo.terms = crate::slo::parse_terms(text).map_err(FlagError)?;
        if axis.len() > 64 {
            return Err(FlagError("--slo searches from at most 64 listed step values".into()));
        }
        if (0..axis.len()).any(|i| axis.value(i).is_infinite()) {
            return Err(FlagError(
                "--slo searches between the listed rates and has no middle to take with inf: end the list with a finite rate".into(),
            ));
        }
        if !(a.slo_rate_tolerance.is_finite() && a.slo_rate_tolerance > 0.0) {
            return Err(FlagError(format!(
                "--slo-rate-tolerance must be a positive fraction, got {}",
                a.slo_rate_tolerance
            )));
        }
    }
    for (metric, v) in [
        (crate::slo::Metric::Ttft, a.slo_ttft_ms),
        (crate::slo::Metric::Tpot, a.slo_tpot_ms),
        (crate::slo::Metric::E2e, a.slo_e2e_ms),
    ] {
        if let Some(bound_ms) = v {
            slo.terms.push(crate::slo::Term { metric, pct: None, bound_ms });
        }
    }
    let search = a.slo.is_some();
    if !(a.scrape_interval.is_finite() && a.scrape_interval >= 0.01) {
        return Err(FlagError(format!("--scrape-interval must be at least 0.01 s, got {}", a.scrape_interval)));
    }
    if !a.ready_path.starts_with('/') {
        return Err(FlagError(format!("--ready-path must start with '/', got {:?}", a.ready_path)));
    }
    if a.resume && a.output_dir.is_none() {
        return Err(FlagError("--resume needs --output-dir (the folder of the sweep to resume)".into()));
    }
    let n_sides = a.server_cmd.len().max(a.base_url.len()).max(a.label.len()).max(1);
    for (flag, n) in
        [("--server-cmd", a.server_cmd.len()), ("--base-url", a.base_url.len()), ("--label", a.label.len())]
    {
        if n > 2 {
            return Err(FlagError(format!("{flag} given {n} times: at most twice (an A/B run)")));
        }
    }
    if n_sides == 2 && a.label.len() == 1 {
        return Err(FlagError("an A/B run needs --label twice (or not at all: A and B)".into()));
    }
    if n_sides == 2 && a.server_cmd.len() == 1 && a.base_url.len() == 2 {
        return Err(FlagError("an A/B run with two --base-url needs --server-cmd twice (or not at all)".into()));
    }
    let grid = a.serve_params.is_some();
    if grid && (a.server_cmd.len() != 1 || a.base_url.len() > 1 || !a.label.is_empty()) {
        return Err(FlagError(
            "--serve-params takes one --server-cmd (the command every configuration's flags are appended to), at most one --base-url and no --label (configurations are named in the file)".into(),
        ));
    }
    if n_sides == 2 && a.bench_params.is_some() {
        return Err(FlagError(
            "--bench-params with an A/B run: give the two servers as --serve-params configurations of one --server-cmd"
                .into(),
        ));
    }
    let links = crate::grid::parse_links(&a.link_vars).map_err(FlagError)?;
    if !links.is_empty() && !grid {
        return Err(FlagError("--link-vars ties --serve-params values to bench values: give --serve-params".into()));
    }
    // The bench's own validation gives the default address (from --host/--port/--backend).
    bench_args.base_url = a.base_url.first().cloned();
    // The sweep owns readiness (its own launch wait and liveness watch): a step never waits
    // out the bench's 60 s ready check on a server the sweep already judged.
    bench_args.ready_check_timeout_sec = 0;
    let bench = bench_args.clone().validate().map_err(|e| FlagError(e.0))?;
    // Servers: the A/B sides, or the grid's configurations.
    let mut servers: Vec<(String, Option<String>, String, Option<crate::grid::ParamSet>)> = vec![];
    for i in 0..n_sides {
        let label = a.label.get(i).cloned().unwrap_or_else(|| ["A", "B"][i].to_owned());
        let base_url = a
            .base_url
            .get(i)
            .or(a.base_url.first())
            .map_or_else(|| bench.base_url.clone(), |u| u.trim_end_matches('/').to_owned());
        if base_url.starts_with("https://") {
            return Err(FlagError("https URLs are not supported by this build (no TLS); use http".into()));
        }
        let server_cmd = a.server_cmd.get(i).or(a.server_cmd.first()).cloned();
        if server_cmd.as_deref().is_some_and(|c| c.trim().is_empty()) {
            return Err(FlagError("--server-cmd is empty".into()));
        }
        servers.push((label, server_cmd, base_url, None));
    }
    if let Some(path) = &a.serve_params {
        let (_, cmd, url, _) = servers.remove(0);
        let cmd = cmd.unwrap_or_default();
        let template: Vec<String> = cmd
            .split_whitespace()
            .filter(|t| t.starts_with("--"))
            .map(|t| crate::grid::norm_key(t.split('=').next().unwrap_or(t)))
            .collect();
        for set in crate::grid::load(path, "--serve-params").map_err(FlagError)? {
            // Appended, a flag the template already holds would be given twice (refused by
            // sparrow serve's parser, the last one kept by argparse): one place for each flag.
            if let Some((f, _)) =
                set.flags.iter().find(|(f, _)| f.starts_with("--") && template.contains(&crate::grid::norm_key(f)))
            {
                return Err(FlagError(format!(
                    "--serve-params {}: {f} is in --server-cmd as well: give it in one place (in the file to vary it)",
                    set.name
                )));
            }
            servers.push((set.name.clone(), Some(set.command(&cmd)), url.clone(), Some(set)));
        }
    }
    let workloads = match &a.bench_params {
        Some(path) => crate::grid::load(path, "--bench-params").map_err(FlagError)?.into_iter().map(Some).collect(),
        None => vec![None],
    };
    let mut sides = vec![];
    for (si, (label, server_cmd, base_url, config)) in servers.iter().enumerate() {
        for (workload_index, w) in workloads.iter().enumerate() {
            let Some(side) = grid_side(&axis, &bench_argv, &links, config.as_ref(), w.as_ref())? else { continue };
            let (bench_extra, steps) = side;
            let mut b = if bench_extra.is_empty() {
                bench.clone()
            } else {
                let what = format!("--bench-params {}", w.as_ref().map_or("", |w| w.name.as_str()));
                let argv: Vec<String> = std::iter::once("sparrow bench".to_owned())
                    .chain(bench_argv.iter().cloned())
                    .chain(bench_extra.iter().cloned())
                    .collect();
                let mut ba =
                    BenchArgs::try_parse_from(&argv).map_err(|e| FlagError(format!("{what}: {}", clap_message(&e))))?;
                ba.base_url = Some(base_url.clone());
                ba.ready_check_timeout_sec = 0;
                ba.validate().map_err(|e| FlagError(format!("{what}: {}", e.0)))?
            };
            b.base_url.clone_from(base_url);
            sides.push(Side {
                label: match w {
                    Some(w) => format!("{label}:{}", w.name),
                    None => label.clone(),
                },
                server_cmd: server_cmd.clone(),
                base_url: base_url.clone(),
                server: si,
                config: config.as_ref().map(|c| c.name.clone()),
                workload: w.as_ref().map(|w| w.name.clone()),
                workload_index,
                bench_extra,
                bench: b,
                steps,
            });
        }
    }
    let configs: Vec<crate::grid::ParamSet> = servers.into_iter().filter_map(|s| s.3).collect();
    let baseline = match &a.baseline {
        Some(b) if !configs.iter().any(|c| &c.name == b) => {
            return Err(FlagError(format!(
                "--baseline {b:?} is not a --serve-params configuration ({})",
                configs.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ")
            )))
        }
        Some(b) => Some(b.clone()),
        None => configs.first().map(|c| c.name.clone()),
    };
    if sides.is_empty() {
        return Err(FlagError(
            "--link-vars leaves no configuration × workload × step to run: no pair has equal linked values".into(),
        ));
    }
    if sides.len() == 2 && !grid && sides[0].label == sides[1].label {
        return Err(FlagError(format!("the two --label values are the same ({:?})", sides[0].label)));
    }
    if let Some(l) = sides.iter().find(|s| s.label.is_empty() || s.label.contains(['/', '\0'])) {
        return Err(FlagError(format!("--label {:?} must be non-empty and hold no '/'", l.label)));
    }
    let listed = axis.len();
    Ok(SweepConfig {
        startup_timeout: secs("--startup-timeout", a.startup_timeout)?,
        hang_timeout: secs("--hang-timeout", a.hang_timeout)?,
        stop_grace: secs("--stop-grace", a.stop_grace)?,
        args: a,
        bench_argv,
        bench,
        axis,
        fixed_rate,
        fixed_concurrency,
        sides,
        grid,
        baseline,
        configs,
        workloads: workloads.into_iter().flatten().collect(),
        slo,
        search,
        listed,
    })
}

/// Bench flags a workload may not set: the sweep sets them per step or per side.
const OWNED_BY_SWEEP: &[&str] =
    &["max-concurrency", "request-rate", "num-prompts", "output-file", "base-url", "host", "port", "seed"];

/// A kept configuration × workload pair: its extra bench flags and its step value indices.
type GridPair = (Vec<String>, Vec<usize>);

/// A configuration × workload pair under `--link-vars`: its extra bench flags (the workload's,
/// then values a link carries over) and its step values; `None` when a link's two values differ.
fn grid_side(
    axis: &Axis,
    bench_argv: &[String],
    links: &[crate::grid::Link],
    config: Option<&crate::grid::ParamSet>,
    workload: Option<&crate::grid::ParamSet>,
) -> Result<Option<GridPair>, FlagError> {
    use crate::grid::{flag_name, norm_key, same_value};
    let mut extra = workload.map(crate::grid::ParamSet::argv).unwrap_or_default();
    if let Some(w) = workload {
        for (f, _) in &w.flags {
            let k = norm_key(f);
            let refused = REFUSED.iter().any(|(r, _)| *r == k);
            if refused || OWNED_BY_SWEEP.contains(&k.as_str()) || SWEEP_FLAGS.contains(&k.as_str()) {
                return Err(FlagError(format!(
                    "--bench-params {}: {f} is set by the sweep (steps: --concurrency / --request-rate; prompts: --num-prompts-per-step; seed and address: the sweep's own flags)",
                    w.name
                )));
            }
        }
    }
    let mut steps: Vec<usize> = (0..axis.len()).collect();
    for l in links {
        let on_axis = match axis {
            Axis::Concurrency(_) => l.bench == "max-concurrency" || l.bench == "concurrency",
            Axis::RequestRate(_) => l.bench == "request-rate",
        };
        if !on_axis && (OWNED_BY_SWEEP.contains(&l.bench.as_str()) || SWEEP_FLAGS.contains(&l.bench.as_str())) {
            return Err(FlagError(format!(
                "--link-vars {}={}: --{} is set by the sweep, not by a workload",
                l.serve, l.bench, l.bench
            )));
        }
        let Some(sv) = config.and_then(|c| c.get(&l.serve)) else { continue };
        if on_axis {
            steps.retain(|&i| same_value(&sv, &crate::analysis::fmt_value(axis.value(i))));
            if steps.is_empty() {
                let values: Vec<String> = (0..axis.len()).map(|i| crate::analysis::fmt_value(axis.value(i))).collect();
                return Err(FlagError(format!(
                    "--link-vars {}={}: configuration {} has {}={sv}, which is not among the steps ({}): add it to the list",
                    l.serve,
                    l.bench,
                    config.map_or("", |c| c.name.as_str()),
                    l.serve,
                    values.join(",")
                )));
            }
        } else if let Some(bv) = workload.and_then(|w| w.get(&l.bench)) {
            if !same_value(&sv, &bv) {
                return Ok(None);
            }
        } else {
            // Set by the sweep's own bench flags, the link holds where they agree; unset, the
            // workload takes the configuration's value.
            match flag_value(bench_argv, &l.bench) {
                Some(g) if !same_value(&g, &sv) => return Ok(None),
                Some(_) => {}
                None => extra.extend([flag_name(&l.bench), sv]),
            }
        }
    }
    Ok((!steps.is_empty()).then_some((extra, steps)))
}

/// The last value given to bench flag `key` (comparable form) in `argv`.
fn flag_value(argv: &[String], key: &str) -> Option<String> {
    let mut found = None;
    let mut it = argv.iter();
    while let Some(x) = it.next() {
        let Some(n) = x.strip_prefix("--") else { continue };
        let (name, inline) = n.split_once('=').map_or((n, None), |(k, v)| (k, Some(v.to_owned())));
        if crate::grid::norm_key(name) == key {
            found = inline.or_else(|| it.next().cloned());
        }
    }
    found
}

impl SweepConfig {
    /// The concurrency of step value `i` (`None`: unbounded).
    pub fn concurrency(&self, i: usize) -> Option<usize> {
        match &self.axis {
            Axis::Concurrency(v) => Some(v[i]),
            Axis::RequestRate(_) => self.fixed_concurrency,
        }
    }
    /// The request rate of step value `i`.
    pub fn request_rate(&self, i: usize) -> f64 {
        match &self.axis {
            Axis::Concurrency(_) => self.fixed_rate,
            Axis::RequestRate(v) => v[i],
        }
    }
    /// Prompts of side `side` at step value `i`: `--num-prompts-per-step`, else
    /// max(4 × concurrency, 64); for `generated-shared-prefix`, groups × prompts per group
    /// (that dataset sets its own count, as in `sparrow bench`).
    pub fn num_prompts(&self, side: usize, i: usize) -> usize {
        let b = &self.sides[side].bench.args;
        if b.dataset_name == sparrow_bench::args::DatasetName::GeneratedSharedPrefix {
            return b.gsp_num_groups * b.gsp_prompts_per_group;
        }
        self.args.num_prompts_per_step.unwrap_or_else(|| self.concurrency(i).map_or(64, |c| (4 * c).max(64)))
    }
    /// The seed of side `side` at step value `i`, repeat `r`: `--seed + i + r × steps + w ×`
    /// [`WORKLOAD_STRIDE`] for the side's `w`-th workload, the same for every configuration
    /// (and A and B), so no step re-sends another step's or workload's prompts into a warm
    /// cache and every configuration gets the same ones. A search adds step values as it goes:
    /// its stride is [`SEARCH_STRIDE`], not the count.
    pub fn seed(&self, side: usize, i: usize, r: usize) -> u64 {
        let stride = if self.search { SEARCH_STRIDE } else { self.axis.len() };
        let w = self.sides.get(side).map_or(0, |s| s.workload_index);
        self.bench.args.seed.wrapping_add((i + r * stride + w * WORKLOAD_STRIDE) as u64)
    }
    /// True for an A/B run (two sides, no grid, no workloads, no search): compared step by step.
    pub fn is_ab(&self) -> bool {
        !self.grid && !self.search && self.workloads.is_empty() && self.sides.len() == 2
    }
    /// True when configurations or workloads are compared (`--serve-params`, `--bench-params`).
    pub fn is_grid(&self) -> bool {
        self.grid || !self.workloads.is_empty()
    }
    /// True when SLOs were given.
    pub fn has_slos(&self) -> bool {
        self.slo.any()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<SweepConfig, String> {
        let raw: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        parse(&raw).map_err(|e| e.to_string())
    }

    #[test]
    fn sweep_and_bench_flags_are_split() {
        let c = p(&[
            "--concurrency",
            "1,64,256",
            "--dataset-name",
            "random",
            "--random-input-len=256",
            "--resume",
            "--output-dir",
            "x",
        ])
        .expect("parses");
        assert_eq!(c.axis, Axis::Concurrency(vec![1, 64, 256]));
        assert_eq!(c.bench_argv, vec!["--dataset-name", "random", "--random-input-len=256"]);
        assert_eq!(c.bench.args.random_input_len, 256);
        assert!(c.args.resume);
        assert_eq!(c.num_prompts(0, 0), 64);
        assert_eq!(c.num_prompts(0, 2), 1024);
        assert!(c.request_rate(1).is_infinite());
        assert_eq!(c.sides.len(), 1);
        assert_eq!(c.sides[0].base_url, "http://0.0.0.0:30000");
    }

    #[test]
    fn rate_axis_with_one_concurrency() {
        let c = p(&["--request-rate", "1,4,inf", "--max-concurrency", "8", "--seed", "10"]).expect("parses");
        assert_eq!(c.axis, Axis::RequestRate(vec![1.0, 4.0, f64::INFINITY]));
        assert_eq!(c.concurrency(2), Some(8));
        assert_eq!(c.seed(0, 0, 0), 10);
        assert_eq!(c.seed(0, 2, 1), 15);
    }

    #[test]
    fn ab_sides_pair_in_order() {
        let c = p(&["--concurrency", "1,2", "--server-cmd", "a", "--server-cmd", "b", "--port", "31000"]).expect("ab");
        assert_eq!(c.sides.len(), 2);
        assert_eq!((c.sides[0].label.as_str(), c.sides[1].label.as_str()), ("A", "B"));
        assert_eq!(c.sides[1].server_cmd.as_deref(), Some("b"));
        assert_eq!(c.sides[0].base_url, c.sides[1].base_url);
        let c = p(&[
            "--concurrency",
            "1",
            "--base-url",
            "http://h:1/",
            "--base-url",
            "http://h:2",
            "--label",
            "x",
            "--label",
            "y",
        ])
        .expect("urls");
        assert_eq!(c.sides[0].base_url, "http://h:1");
        assert_eq!(c.sides[1].label, "y");
    }

    #[test]
    fn bad_flags_are_refused_by_name() {
        assert!(p(&["--concurrency", "1,2", "--request-rate", "1,2"]).expect_err("two lists").contains("both lists"));
        assert!(p(&[]).expect_err("no steps").contains("--concurrency"));
        assert!(p(&["--concurrency", "0"]).expect_err("zero").contains("--concurrency"));
        assert!(p(&["--concurrency", "1", "--details-file", "x"]).expect_err("details").contains("--details-file"));
        assert!(p(&["--concurrency", "1", "--client-count", "2"]).expect_err("clients").contains("--client-count"));
        assert!(p(&["--concurrency", "1", "--resume"]).expect_err("resume").contains("--output-dir"));
        assert!(p(&["--concurrency", "1", "--no-such-flag"]).expect_err("typo").contains("--no-such-flag"));
        assert!(p(&["--concurrency", "1", "--label", "a", "--label", "a"]).expect_err("same").contains("--label"));
        assert!(matches!(parse(&["--help".to_owned()]), Err(ParseError::Help(_))));
        assert!(p(&["--concurrency", "64,1"]).expect_err("order").contains("increase"));
        assert!(p(&["--request-rate", "1,inf,4"]).expect_err("order").contains("--request-rate"));
        assert!(p(&["--concurrency", "4,4"]).expect_err("dup").contains("increase"));
    }

    fn files(serve: &str, bench: &str) -> (tempfile::TempDir, String, String) {
        let d = tempfile::tempdir().expect("tempdir");
        let (sp, bp) = (d.path().join("serve.json"), d.path().join("bench.json"));
        std::fs::write(&sp, serve).expect("serve");
        std::fs::write(&bp, bench).expect("bench");
        let s = |p: std::path::PathBuf| p.to_str().expect("utf8").to_owned();
        (d, s(sp), s(bp))
    }

    #[test]
    fn grid_sides_are_configurations_times_workloads() {
        let (_d, sp, bp) = files(
            r#"{"small": {"max_running_requests": 8}, "big": {"max_running_requests": 64, "disable_radix_cache": true}}"#,
            r#"{"short": {"random_input_len": 16}, "long": {"random_input_len": 512, "dataset_name": "random"}}"#,
        );
        let c = p(&[
            "--concurrency",
            "1,8,64",
            "--server-cmd",
            "srv --port 30000",
            "--serve-params",
            &sp,
            "--bench-params",
            &bp,
        ])
        .expect("grid");
        let labels: Vec<&str> = c.sides.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(labels, ["small:short", "small:long", "big:short", "big:long"]);
        assert_eq!(
            c.sides[2].server_cmd.as_deref(),
            Some("srv --port 30000 --max-running-requests 64 --disable-radix-cache")
        );
        assert_eq!((c.sides[0].server, c.sides[1].server, c.sides[2].server), (0, 0, 1));
        assert_eq!(c.sides[1].bench.args.random_input_len, 512);
        assert_eq!(c.sides[0].bench.args.random_input_len, 16);
        assert_eq!(c.sides[3].steps, [0, 1, 2]);
        assert_eq!(c.baseline.as_deref(), Some("small"));
        assert!(c.grid && c.is_grid() && !c.is_ab());
        // Linked to the step axis, each configuration runs at its own cap only.
        let c = p(&[
            "--concurrency",
            "1,8,64",
            "--server-cmd",
            "srv",
            "--serve-params",
            &sp,
            "--link-vars",
            "max_running_requests=max_concurrency",
        ])
        .expect("linked");
        assert_eq!((c.sides[0].steps.as_slice(), c.sides[1].steps.as_slice()), (&[1][..], &[2][..]));
    }

    #[test]
    fn linked_bench_values_are_carried_or_filter_pairs() {
        let (_d, sp, bp) = files(
            r#"[{"context_length": 256}, {"context_length": 512}]"#,
            r#"[{"random_input_len": 256}, {"random_output_len": 7}]"#,
        );
        let c = p(&[
            "--concurrency",
            "1",
            "--server-cmd",
            "srv",
            "--serve-params",
            &sp,
            "--bench-params",
            &bp,
            "--link-vars",
            "context_length=random_input_len",
        ])
        .expect("linked");
        // (256, input 256) kept; (512, input 256) dropped; the second workload takes each value.
        let got: Vec<(String, u64)> =
            c.sides.iter().map(|s| (s.label.clone(), s.bench.args.random_input_len)).collect();
        assert_eq!(
            got,
            [
                ("context-length=256:random-input-len=256".to_owned(), 256),
                ("context-length=256:random-output-len=7".to_owned(), 256),
                ("context-length=512:random-output-len=7".to_owned(), 512),
            ]
        );
        assert_eq!(c.sides[2].bench_extra, ["--random-output-len", "7", "--random-input-len", "512"]);
    }

    #[test]
    fn grid_flags_are_refused_by_name() {
        let (_d, sp, bp) = files(r#"[{"a": 1}]"#, r#"[{"max_concurrency": 4}]"#);
        let e = |args: &[&str]| p(args).expect_err("refused");
        assert!(e(&["--concurrency", "1", "--serve-params", &sp]).contains("one --server-cmd"));
        assert!(e(&["--concurrency", "1", "--server-cmd", "a", "--server-cmd", "b", "--serve-params", &sp])
            .contains("one --server-cmd"));
        assert!(e(&["--concurrency", "1", "--server-cmd", "a", "--serve-params", &sp, "--label", "x"])
            .contains("no --label"));
        assert!(e(&["--concurrency", "1", "--server-cmd", "a", "--bench-params", &bp])
            .contains("--max-concurrency is set by the sweep"));
        assert!(e(&["--concurrency", "1", "--link-vars", "a=b"]).contains("give --serve-params"));
        assert!(e(&["--concurrency", "1", "--server-cmd", "a", "--serve-params", &sp, "--baseline", "zz"])
            .contains("--baseline \"zz\""));
        assert!(e(&["--concurrency", "1", "--server-cmd", "a", "--serve-params", "/nonexistent.json"])
            .contains("--serve-params /nonexistent.json"));
        let (_d2, sp2, bp2) = files(r#"[{"a": 1}]"#, r#"[{"random_input_len": "many"}]"#);
        assert!(e(&["--concurrency", "1", "--server-cmd", "a", "--serve-params", &sp2, "--bench-params", &bp2])
            .contains("--bench-params random-input-len=many"));
        assert!(e(&[
            "--concurrency",
            "2",
            "--server-cmd",
            "a",
            "--serve-params",
            &sp2,
            "--link-vars",
            "a=max_concurrency"
        ])
        .contains("a=1, which is not among the steps (2)"));
        assert!(e(&["--concurrency", "2", "--server-cmd", "srv --a 3", "--serve-params", &sp2])
            .contains("--a is in --server-cmd as well"));
    }
}
