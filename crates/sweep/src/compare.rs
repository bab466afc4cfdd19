//! Configurations compared: the grid table (one row per configuration × workload), the
//! Pareto front of tokens/s per user against total output tokens/s (vLLM's
//! `vllm bench sweep plot_pareto`, with 1 / TPOT as the per-user rate), the ranking of
//! configurations per workload, and each configuration's difference from the baseline in words.

use crate::analysis::SideAnalysis;
use crate::analysis::{fmt_value, Point};
use crate::args::SweepConfig;
use crate::grid::{FlagValue, ParamSet};
use crate::step::{Status, StepResult};

/// One configuration × workload of a grid.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    /// The configuration's name.
    pub config: String,
    /// The workload's name (`None`: the sweep's one workload).
    pub workload: Option<String>,
    /// The side's label.
    pub label: String,
    /// Steps that ran with status ok, and steps planned.
    pub ok: usize,
    /// See above.
    pub planned: usize,
    /// The first step that did not end ok: `"crashed at 256: defect (...)"`, `"skipped"`.
    pub trouble: Option<String>,
}

/// The grid's cells in run order (configuration-major).
pub fn cells(cfg: &SweepConfig, steps: &[StepResult]) -> Vec<Cell> {
    let axis = cfg.axis.name();
    cfg.sides
        .iter()
        .map(|s| {
            let mine: Vec<&StepResult> = steps.iter().filter(|t| t.label == s.label).collect();
            let trouble = mine.iter().find(|t| t.status != Status::Ok).map(|t| {
                let at = fmt_value(t.value(axis));
                match (t.status, t.verdict) {
                    (Status::Skipped, _) => format!("skipped from {at}: {}", t.evidence),
                    (Status::Interrupted, _) => format!("interrupted at {at}"),
                    (st, Some(v)) => format!("{} at {at}: {} ({})", st.as_str(), v.as_str(), t.evidence),
                    (st, None) => format!("{} at {at}: {}", st.as_str(), t.evidence),
                }
            });
            Cell {
                config: s.config.clone().unwrap_or_else(|| s.label.clone()),
                workload: s.workload.clone(),
                label: s.label.clone(),
                ok: mine.iter().filter(|t| t.status == Status::Ok).count(),
                // A search decides its steps as it goes: what it ran is what it planned.
                planned: if cfg.search { mine.len() } else { s.steps.len() * cfg.args.repeat },
                trouble,
            }
        })
        .collect()
}

/// One (configuration, step value) point of a workload, medians over repeats.
#[derive(Debug, Clone, PartialEq)]
pub struct ParetoPoint {
    /// The side's label.
    pub label: String,
    /// The step value.
    pub value: f64,
    /// Output tokens/s seen by one request: 1000 / median TPOT (ms).
    pub per_user: f64,
    /// Total output tokens/s of the step.
    pub total: f64,
    /// True when no other point of the workload is at least as good on both axes and better
    /// on one.
    pub on_front: bool,
}

/// Every measured point of the sides in `an` whose workload is `workload`, the front marked.
/// Points without a TPOT (one output token per request) take no part.
pub fn pareto(cfg: &SweepConfig, an: &[SideAnalysis], workload: Option<&str>) -> Vec<ParetoPoint> {
    let mut pts: Vec<ParetoPoint> = an
        .iter()
        .filter(|a| cfg.sides.iter().any(|s| s.label == a.label && s.workload.as_deref() == workload))
        .flat_map(|a| {
            a.points.iter().filter(|p: &&Point| p.tpot_p50 > 0.0).map(|p| ParetoPoint {
                label: a.label.clone(),
                value: p.value,
                per_user: 1000.0 / p.tpot_p50,
                total: p.output_throughput,
                on_front: false,
            })
        })
        .collect();
    mark_front(&mut pts);
    pts
}

/// Marks the points no other point dominates (at least as good on both axes, better on one).
pub fn mark_front(pts: &mut [ParetoPoint]) {
    let dominated: Vec<bool> = pts
        .iter()
        .map(|p| {
            pts.iter().any(|q| {
                q.per_user >= p.per_user && q.total >= p.total && (q.per_user > p.per_user || q.total > p.total)
            })
        })
        .collect();
    for (p, d) in pts.iter_mut().zip(dominated) {
        p.on_front = !d;
    }
}

/// A configuration's place in its workload's ranking.
#[derive(Debug, Clone, PartialEq)]
pub struct Ranked {
    /// The side's label.
    pub label: String,
    /// The configuration's name.
    pub config: String,
    /// The figure it is ranked by: output tok/s at its SLO point (with SLOs), else at its
    /// peak; `None` when it has none (it met no SLO, or measured nothing).
    pub figure: Option<f64>,
    /// The step value of that figure.
    pub at: Option<f64>,
}

/// The ranking of configurations for `workload`, best first (those without a figure last).
pub fn ranking(cfg: &SweepConfig, an: &[SideAnalysis], workload: Option<&str>) -> Vec<Ranked> {
    let mut r: Vec<Ranked> = an
        .iter()
        .filter_map(|a| {
            let side = cfg.sides.iter().find(|s| s.label == a.label && s.workload.as_deref() == workload)?;
            let f = match &a.slo {
                Some(slo) => slo.value.and_then(|v| a.points.iter().find(|p| p.value == v)),
                None => a.peak.value.and_then(|v| a.points.iter().find(|p| p.value == v)),
            };
            Some(Ranked {
                label: a.label.clone(),
                config: side.config.clone().unwrap_or_else(|| a.label.clone()),
                figure: f.map(|p| p.output_throughput),
                at: f.map(|p| p.value),
            })
        })
        .collect();
    r.sort_by(|a, b| b.figure.unwrap_or(-1.0).total_cmp(&a.figure.unwrap_or(-1.0)));
    r
}

fn flag_text(f: &str, v: &FlagValue) -> String {
    match v {
        FlagValue::Switch => f.to_owned(),
        FlagValue::One(x) => format!("{f} {x}"),
        FlagValue::Many(xs) => format!("{f} {}", xs.join(" ")),
    }
}

/// How `c` differs from `base` as flags: `--max-running-requests 2048`, `without
/// --disable-radix-cache`; `same flags` when none differ.
pub fn flag_diff(base: &ParamSet, c: &ParamSet) -> String {
    let key = crate::grid::norm_key;
    let mut d: Vec<String> = c
        .flags
        .iter()
        .filter(|(f, v)| !base.flags.iter().any(|(g, w)| key(g) == key(f) && w == v))
        .map(|(f, v)| flag_text(f, v))
        .collect();
    d.extend(
        base.flags
            .iter()
            .filter(|(f, _)| !c.flags.iter().any(|(g, _)| key(g) == key(f)))
            .map(|(f, v)| format!("without {}", flag_text(f, v))),
    );
    if d.is_empty() {
        "same flags".into()
    } else {
        d.join(" ")
    }
}

/// Each configuration against the baseline, per workload, in the words a person tuning the
/// server would write: "`--max-running-requests 2048`: x2.21 output tok/s at 256 over
/// baseline (1950.0 vs 882.0); peak x1.90". The figure is taken at the highest step value
/// both measured; a configuration that crashed where the baseline ran says so.
pub fn baseline_words(cfg: &SweepConfig, an: &[SideAnalysis], steps: &[StepResult]) -> Vec<String> {
    let Some(base_name) = &cfg.baseline else { return vec![] };
    let Some(base) = cfg.configs.iter().find(|c| &c.name == base_name) else { return vec![] };
    let axis = cfg.axis.name();
    let mut out = vec![];
    for w in workloads(cfg) {
        let side_of =
            |config: &str| cfg.sides.iter().find(|s| s.config.as_deref() == Some(config) && s.workload.as_deref() == w);
        let Some(bs) = side_of(base_name) else { continue };
        let Some(ba) = an.iter().find(|a| a.label == bs.label) else { continue };
        let on = w.map_or(String::new(), |w| format!(" [{w}]"));
        for c in cfg.configs.iter().filter(|c| &c.name != base_name) {
            let Some(cs) = side_of(&c.name) else { continue };
            let Some(ca) = an.iter().find(|a| a.label == cs.label) else { continue };
            let flags = flag_diff(base, c);
            let common = ca
                .points
                .iter()
                .filter_map(|p| ba.points.iter().find(|q| q.value == p.value).map(|q| (p, q)))
                .next_back();
            let mut text = match common {
                Some((p, q)) if q.output_throughput > 0.0 => format!(
                    "{}{on} (`{flags}`): x{:.2} output tok/s at {} over {base_name} ({:.1} vs {:.1})",
                    c.name,
                    p.output_throughput / q.output_throughput,
                    fmt_value(p.value),
                    p.output_throughput,
                    q.output_throughput
                ),
                _ => format!("{}{on} (`{flags}`): no step value measured by both it and {base_name}", c.name),
            };
            if let (Some(pc), Some(pb)) = (ca.peak.figure, ba.peak.figure) {
                if pb > 0.0 {
                    text += &format!(
                        "; peak x{:.2} ({:.1} at {} vs {:.1} at {})",
                        pc / pb,
                        pc,
                        fmt_value(ca.peak.value.unwrap_or(0.0)),
                        pb,
                        fmt_value(ba.peak.value.unwrap_or(0.0))
                    );
                }
            }
            if let (Some(sc), Some(sb)) = (&ca.slo, &ba.slo) {
                text += &format!(
                    "; SLO point {} vs {}",
                    sc.value.map_or("none".into(), fmt_value),
                    sb.value.map_or("none".into(), fmt_value)
                );
            }
            // Where it died and the baseline did not: the news that matters most.
            for t in steps.iter().filter(|t| t.label == cs.label && t.status == Status::Crashed) {
                let base_ok = steps
                    .iter()
                    .any(|u| u.label == bs.label && u.value_index == t.value_index && u.status == Status::Ok);
                if base_ok {
                    text += &format!(
                        "; crashed at {} ({}) where {base_name} ran",
                        fmt_value(t.value(axis)),
                        t.verdict.map_or("-", |v| v.as_str())
                    );
                }
            }
            out.push(text);
        }
    }
    out
}

/// A step value as JSON: a whole number as an integer (concurrencies), `"inf"` for infinity.
fn num(v: f64) -> serde_json::Value {
    if v.is_infinite() {
        "inf".into()
    } else if v == v.trunc() && v.abs() < 9.0e15 {
        (v as i64).into()
    } else {
        v.into()
    }
}

/// The workloads of a sweep: each named one, or the one unnamed workload.
pub fn workloads(cfg: &SweepConfig) -> Vec<Option<&str>> {
    if cfg.workloads.is_empty() {
        vec![None]
    } else {
        cfg.workloads.iter().map(|w| Some(w.name.as_str())).collect()
    }
}

/// A cell's peak: "305.0 at 16", or "-".
fn peak_text(a: Option<&SideAnalysis>) -> String {
    a.and_then(|a| a.peak.value.zip(a.peak.figure)).map_or("-".into(), |(v, f)| format!("{f:.1} at {}", fmt_value(v)))
}

/// What [`ranking`] ranks by, in words.
fn ranked_by(cfg: &SweepConfig) -> &'static str {
    if cfg.has_slos() {
        "output tok/s at the SLO point"
    } else {
        "peak output tok/s"
    }
}

fn rank_figure(r: &Ranked) -> String {
    match (r.figure, r.at) {
        (Some(f), Some(at)) => format!("{f:.1} at {}", fmt_value(at)),
        _ => "-".into(),
    }
}

/// The grid on the terminal: one row per configuration × workload (steps ok, peak, knee, SLO
/// point, first trouble), the ranking per workload and the words against the baseline.
pub fn table_text(cfg: &SweepConfig, an: &[SideAnalysis], steps: &[StepResult]) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ =
        writeln!(o, "Grid: {} configuration(s) x {} workload(s)", cfg.configs.len().max(1), cfg.workloads.len().max(1));
    for c in cells(cfg, steps) {
        let a = an.iter().find(|a| a.label == c.label);
        let peak = peak_text(a);
        let knee = a.and_then(|a| a.knee.value).map_or("-".into(), fmt_value);
        let slo = a.and_then(|a| a.slo.as_ref()).map(|s| s.value.map_or("none".into(), fmt_value));
        let _ = writeln!(
            o,
            "  {:<28} {:<16} steps ok {}/{}  peak {peak}  knee {knee}{}{}",
            c.config,
            c.workload.as_deref().unwrap_or("-"),
            c.ok,
            c.planned,
            slo.map_or(String::new(), |s| format!("  SLO point {s}")),
            c.trouble.map_or(String::new(), |t| format!("  [{t}]"))
        );
    }
    let by = ranked_by(cfg);
    for w in workloads(cfg) {
        let r = ranking(cfg, an, w);
        let list: Vec<String> =
            r.iter().enumerate().map(|(i, r)| format!("{}. {} ({})", i + 1, r.config, rank_figure(r))).collect();
        let _ = writeln!(o, "Ranking{} by {by}: {}", w.map_or(String::new(), |w| format!(" [{w}]")), list.join(", "));
        let front: Vec<String> = pareto(cfg, an, w)
            .iter()
            .filter(|p| p.on_front)
            .map(|p| {
                format!("{} at {} ({:.1} tok/s/user, {:.1} tok/s)", p.label, fmt_value(p.value), p.per_user, p.total)
            })
            .collect();
        let _ = writeln!(o, "Pareto front{}: {}", w.map_or(String::new(), |w| format!(" [{w}]")), front.join("; "));
    }
    for line in baseline_words(cfg, an, steps) {
        let _ = writeln!(o, "{line}");
    }
    o
}

/// The grid as `summary.json`'s `grid` object: configurations (name, flags, command),
/// workloads (name, flags), cells, Pareto points, rankings and the baseline comparison.
pub fn json(cfg: &SweepConfig, an: &[SideAnalysis], steps: &[StepResult]) -> serde_json::Value {
    use serde_json::json;
    let fv = num;
    let server_cmd =
        |name: &str| cfg.sides.iter().find(|s| s.config.as_deref() == Some(name)).and_then(|s| s.server_cmd.clone());
    json!({
        "configurations": cfg.configs.iter().map(|c| json!({"name": c.name, "flags": c.argv(), "server_cmd": server_cmd(&c.name)})).collect::<Vec<_>>(),
        "workloads": cfg.workloads.iter().map(|w| json!({"name": w.name, "flags": w.argv()})).collect::<Vec<_>>(),
        "baseline": cfg.baseline,
        "cells": cells(cfg, steps).iter().map(|c| {
            let a = an.iter().find(|a| a.label == c.label);
            json!({
                "configuration": c.config, "workload": c.workload, "label": c.label,
                "steps_ok": c.ok, "steps_planned": c.planned, "trouble": c.trouble,
                "peak_output_throughput": a.and_then(|a| a.peak.figure),
                "peak_at": a.and_then(|a| a.peak.value).map(fv),
                "knee": a.and_then(|a| a.knee.value).map(fv),
                "slo_point": a.and_then(|a| a.slo.as_ref()).and_then(|s| s.value).map(fv),
            })
        }).collect::<Vec<_>>(),
        "per_workload": workloads(cfg).into_iter().map(|w| json!({
            "workload": w,
            "ranking": ranking(cfg, an, w).iter().map(|r| json!({"configuration": r.config, "label": r.label, "output_throughput": r.figure, "at": r.at.map(fv)})).collect::<Vec<_>>(),
            "pareto": pareto(cfg, an, w).iter().map(|p| json!({"label": p.label, "value": fv(p.value), "tokens_per_s_per_user": p.per_user, "output_throughput": p.total, "on_front": p.on_front})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "against_baseline": baseline_words(cfg, an, steps),
    })
}

/// The grid in `report.html`: the cells table, the rankings, the baseline comparison.
pub fn html(cfg: &SweepConfig, an: &[SideAnalysis], steps: &[StepResult]) -> String {
    use crate::out::esc;
    use std::fmt::Write as _;
    let mut h = String::from("<h2>Grid</h2>\n<table id=\"grid\"><tr><th>configuration</th><th>workload</th><th>steps ok</th><th>peak out tok/s</th><th>knee</th>");
    if cfg.has_slos() {
        h.push_str("<th>SLO point</th>");
    }
    h.push_str("<th>trouble</th></tr>\n");
    for c in cells(cfg, steps) {
        let a = an.iter().find(|a| a.label == c.label);
        let peak = peak_text(a);
        let cls = if c.trouble.is_some() { " class=\"bad\"" } else { "" };
        let _ = write!(
            h,
            "<tr{cls}><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}/{}</td><td>{peak}</td><td>{}</td>",
            esc(&c.config),
            esc(c.workload.as_deref().unwrap_or("-")),
            c.ok,
            c.planned,
            a.and_then(|a| a.knee.value).map_or("-".into(), fmt_value)
        );
        if cfg.has_slos() {
            let _ = write!(
                h,
                "<td>{}</td>",
                a.and_then(|a| a.slo.as_ref()).and_then(|s| s.value).map_or("none".into(), fmt_value)
            );
        }
        let _ = writeln!(h, "<td class=\"l\">{}</td></tr>", esc(c.trouble.as_deref().unwrap_or("")));
    }
    h.push_str("</table>\n");
    let by = ranked_by(cfg);
    for w in workloads(cfg) {
        let _ = writeln!(h, "<h3>Ranking{} by {by}</h3>\n<ol>", w.map_or(String::new(), |w| format!(" ({})", esc(w))));
        for r in ranking(cfg, an, w) {
            let _ = writeln!(h, "<li>{}: {}</li>", esc(&r.config), rank_figure(&r));
        }
        h.push_str("</ol>\n");
    }
    let words = baseline_words(cfg, an, steps);
    if !words.is_empty() {
        h.push_str("<h3>Against the baseline</h3>\n<ul>\n");
        for w in words {
            let _ = writeln!(h, "<li>{}</li>", esc(&w));
        }
        h.push_str("</ul>\n");
    }
    h
}

/// One side at its SLOs: the values measured (in run order, for a search the probes), the
/// highest that met them and the lowest that missed, and the figures at the SLO point.
#[derive(Debug, Clone, PartialEq)]
pub struct SloRow {
    /// The side's label.
    pub label: String,
    /// (value, met, the terms missed) per value, in the order first measured.
    pub probes: Vec<(f64, bool, Vec<String>)>,
    /// Why the side's steps (a search) stopped before their end: a crash with `--on-crash
    /// stop`, or a signal.
    pub cut_short: Option<String>,
    /// The highest value met.
    pub met: Option<f64>,
    /// The lowest value missed.
    pub missed: Option<f64>,
    /// Goodput (req/s) and output tok/s at the highest value met.
    pub goodput: Option<f64>,
    /// See above.
    pub output_throughput: Option<f64>,
}

/// The SLO table: one row per side (with SLOs).
pub fn slo_rows(cfg: &SweepConfig, an: &[SideAnalysis], steps: &[StepResult]) -> Vec<SloRow> {
    let axis = cfg.axis.name();
    cfg.sides
        .iter()
        .map(|side| {
            let mut seen: Vec<usize> = vec![];
            for s in steps
                .iter()
                .filter(|s| s.label == side.label && !matches!(s.status, Status::Skipped | Status::Interrupted))
            {
                if !seen.contains(&s.value_index) {
                    seen.push(s.value_index);
                }
            }
            let probes: Vec<(f64, bool, Vec<String>)> = seen
                .iter()
                .map(|&vi| {
                    let runs: Vec<&StepResult> =
                        steps.iter().filter(|s| s.label == side.label && s.value_index == vi).collect();
                    let value = runs.first().map_or(0.0, |s| s.value(axis));
                    let mut why: Vec<String> = runs.iter().flat_map(|s| s.slo_missed.iter().cloned()).collect();
                    if let Some(c) = runs.iter().find(|s| s.status != Status::Ok) {
                        why.push(format!("step {}: {}", c.step, c.verdict.map_or(c.status.as_str(), |v| v.as_str())));
                    }
                    if let Some(l) = runs.iter().find_map(|s| s.limit.as_ref()) {
                        why.push(format!("limit: {l}"));
                    }
                    why.dedup();
                    (value, crate::analysis::value_met(steps, &side.label, vi).unwrap_or(false), why)
                })
                .collect();
            let met = probes.iter().filter(|p| p.1).map(|p| p.0).reduce(f64::max);
            let missed = probes.iter().filter(|p| !p.1).map(|p| p.0).reduce(f64::min);
            let at =
                an.iter().find(|a| a.label == side.label).and_then(|a| a.points.iter().find(|p| Some(p.value) == met));
            let cut = steps
                .iter()
                .find(|s| s.label == side.label && matches!(s.status, Status::Skipped | Status::Interrupted));
            SloRow {
                label: side.label.clone(),
                cut_short: cut.map(|s| s.evidence.clone()),
                probes,
                met,
                missed,
                goodput: at.and_then(|p| p.goodput),
                output_throughput: at.map(|p| p.output_throughput),
            }
        })
        .collect()
}

fn probe_text(p: &(f64, bool, Vec<String>)) -> String {
    format!("{} {}", fmt_value(p.0), if p.1 { "met" } else { "missed" })
}

/// The SLO table on the terminal.
pub fn slo_text(cfg: &SweepConfig, an: &[SideAnalysis], steps: &[StepResult]) -> String {
    use std::fmt::Write as _;
    let mut o = format!(
        "SLOs: {}{}\n",
        cfg.slo.describe(),
        if cfg.search { " (searched: the listed values until one missed, then bisection)" } else { "" }
    );
    for r in slo_rows(cfg, an, steps) {
        let _ = writeln!(
            o,
            "  {}: highest met {}{}; lowest missed {}; {}",
            r.label,
            r.met.map_or("none".into(), fmt_value),
            match (r.goodput, r.output_throughput) {
                (Some(g), Some(t)) => format!(" (goodput {g:.2} req/s, {t:.1} output tok/s)"),
                _ => String::new(),
            },
            r.missed.map_or("none".into(), fmt_value),
            r.probes.iter().map(probe_text).collect::<Vec<_>>().join(", ")
        );
        if let Some(c) = &r.cut_short {
            let _ = writeln!(o, "    cut short: {c}");
        }
        if let Some(p) = r.probes.iter().find(|p| Some(p.0) == r.missed) {
            for w in &p.2 {
                let _ = writeln!(o, "    at {}: {w}", fmt_value(p.0));
            }
        }
    }
    o
}

/// The SLO table as JSON rows.
pub fn slo_json(cfg: &SweepConfig, an: &[SideAnalysis], steps: &[StepResult]) -> serde_json::Value {
    use serde_json::json;
    let fv = num;
    json!({
        "slos": cfg.slo.describe(),
        "searched": cfg.search,
        "rows": slo_rows(cfg, an, steps).iter().map(|r| json!({
            "label": r.label,
            "highest_met": r.met.map(fv),
            "lowest_missed": r.missed.map(fv),
            "goodput": r.goodput,
            "output_throughput": r.output_throughput,
            "probes": r.probes.iter().map(|p| json!({"value": fv(p.0), "met": p.1, "missed_terms": p.2})).collect::<Vec<_>>(),
            "cut_short": r.cut_short,
        })).collect::<Vec<_>>(),
    })
}

/// The SLO table in `report.html`.
pub fn slo_html(cfg: &SweepConfig, an: &[SideAnalysis], steps: &[StepResult]) -> String {
    use crate::out::esc;
    use std::fmt::Write as _;
    let mut h = format!(
        "<h2>SLOs</h2>\n<p>{}{}</p>\n<table id=\"slo\"><tr><th>series</th><th>highest met</th><th>goodput req/s</th><th>output tok/s</th><th>lowest missed</th><th>why missed</th><th>values measured</th></tr>\n",
        esc(&cfg.slo.describe()),
        if cfg.search { " &middot; searched: the listed values until one missed, then bisection" } else { "" }
    );
    for r in slo_rows(cfg, an, steps) {
        let mut why = r.probes.iter().find(|p| Some(p.0) == r.missed).map_or(String::new(), |p| p.2.join("; "));
        if let Some(c) = &r.cut_short {
            why = format!("{why} (cut short: {c})");
        }
        let _ = writeln!(
            h,
            "<tr><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td></tr>",
            esc(&r.label),
            r.met.map_or("none".into(), fmt_value),
            r.goodput.map_or("-".into(), |g| format!("{g:.2}")),
            r.output_throughput.map_or("-".into(), |t| format!("{t:.1}")),
            r.missed.map_or("none".into(), fmt_value),
            esc(&why),
            esc(&r.probes.iter().map(probe_text).collect::<Vec<_>>().join(", "))
        );
    }
    h.push_str("</table>\n");
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_front_is_the_undominated_points() {
        let p = |per_user: f64, total: f64| ParetoPoint {
            label: String::new(),
            value: 1.0,
            per_user,
            total,
            on_front: false,
        };
        // (50, 100) beats (40, 90); (10, 400) and (30, 300) trade off; (30, 200) loses to (30, 300).
        let mut pts = [p(50.0, 100.0), p(40.0, 90.0), p(10.0, 400.0), p(30.0, 300.0), p(30.0, 200.0), p(50.0, 100.0)];
        mark_front(&mut pts);
        let front: Vec<bool> = pts.iter().map(|x| x.on_front).collect();
        // Equal points do not dominate each other: both stay on the front.
        assert_eq!(front, [true, false, true, true, false, true]);
    }

    #[test]
    fn flag_differences_in_words() {
        let sets = crate::grid::parse(
            r#"{"base": {"max_running_requests": 64}, "big": {"max_running_requests": 2048, "disable_radix_cache": true}, "bare": {}}"#,
            "t",
        )
        .expect("sets");
        assert_eq!(flag_diff(&sets[0], &sets[1]), "--max-running-requests 2048 --disable-radix-cache");
        assert_eq!(flag_diff(&sets[0], &sets[2]), "without --max-running-requests 64");
        assert_eq!(flag_diff(&sets[0], &sets[0]), "same flags");
    }
}
