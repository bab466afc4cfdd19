//! The validated settings of a sweep ([`SweepConfig`]): its step values ([`Axis`]), its sides
//! ([`Side`]: A/B, or a grid's configuration × workload) and what each step of them runs with
//! (concurrency, rate, prompts, seed).

use std::time::Duration;

use sparrow_bench::args::BenchConfig;

use super::flags::SweepArgs;

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
