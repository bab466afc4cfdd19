//! [`parse`]: the sweep's flags and the bench's, split, parsed and checked into a
//! [`SweepConfig`], each error naming its flag: steps and SLOs, A/B sides, a grid's
//! configurations × workloads under `--link-vars`, and every side's bench flags validated by
//! `sparrow bench`'s own rules.

use std::time::Duration;

use clap::Parser;
use sparrow_bench::args::BenchArgs;

use super::config::{Axis, Side, SweepConfig};
use super::flags::SweepArgs;
use super::split::{split_args, REFUSED, SWEEP_FLAGS};

/// Why flags were refused.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct FlagError(pub String);

fn secs(flag: &str, v: f64) -> Result<Duration, FlagError> {
    sparrow_bench::args::secs(flag, v).map_err(|e| FlagError(e.0))
}

/// Parses and validates raw `sparrow sweep` arguments (without the program name).
///
/// # Errors
/// [`ParseError::Flags`] naming the first offending flag; for `--help`,
/// [`ParseError::Help`] with the help text (print it and exit 0).
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
