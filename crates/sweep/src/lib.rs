//! `sparrow sweep`: the concurrency (or request-rate) sweep of our origin story as one
//! command, with the server launched and its log kept, a verdict on every crash (OOM or
//! defect, with the log line that proves it), the knee, A/B runs and a report.
//!
//! - [`args`]: the sweep's flags, split from the `sparrow bench` flags they travel with.
//! - [`grid`]: server configurations × workloads (`--serve-params`, `--bench-params`,
//!   `--link-vars`).
//! - [`scrape`]: `/metrics`, CPU and RSS once a second per step; why throughput stopped growing.
//! - [`server`]: a launched server: process group, timestamped log, readiness, clean stop.
//! - [`monitor`]: RSS of the server's process tree, available memory, cgroup OOM records.
//! - [`forensics`]: the verdict on a server that died or hung.
//! - [`slo`]: SLO terms, a step's judgement, and the search for the load that meets them.
//! - [`step`]: one step's result.
//! - [`analysis`]: knee, peak, SLO point, repeats.
//! - [`compare`]: a grid's configurations compared: cells, Pareto front, ranking, baseline.
//! - [`out`]: whole-file writes, HTML escaping, shell quoting.
//! - [`plot`], [`report`]: plots, table, `summary.json`/`.csv`, `report.html`.
//! - [`sweep`]: the steps, one after another.

pub mod analysis;
pub mod args;
pub mod compare;
pub mod forensics;
pub mod grid;
pub mod monitor;
pub mod out;
pub mod plot;
pub mod report;
pub mod scrape;
pub mod server;
pub mod slo;
pub mod step;
pub mod sweep;
