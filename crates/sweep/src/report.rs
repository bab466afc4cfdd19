//! The sweep's report: the terminal table, `summary.json`, `summary.csv`, the plots and one
//! self-contained `report.html` (table, inline SVG plots, verdicts with their quoted log
//! lines, the command lines and the machine's facts).

use std::fmt::Write as _;
use std::path::Path;

use serde_json::{json, Value};

use crate::analysis::{self, fmt_value, Finding, Point, SideAnalysis};
use crate::args::SweepConfig;
use crate::out::{esc, shell_join, write_atomic};
use crate::plot::{self, Chart, Series};
use crate::step::{Status, StepResult};

/// Facts about the machine and the build, for the report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Machine {
    /// `model name` of `/proc/cpuinfo`.
    pub cpu_model: String,
    /// Its `flags` line.
    pub cpu_flags: String,
    /// SIMD features of note present in the flags.
    pub simd: Vec<String>,
    /// Cores this process may use.
    pub cores: usize,
    /// `MemTotal`, bytes.
    pub mem_total: u64,
    /// Kernel release.
    pub kernel: String,
    /// Sparrow's version.
    pub version: String,
    /// The git commit it was built from.
    pub git_hash: String,
}

impl Machine {
    /// Reads them from `/proc`.
    pub fn read() -> Self {
        let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |k: &str| {
            cpu.lines()
                .find(|l| l.split(':').next().is_some_and(|n| n.trim() == k))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
                .unwrap_or_default()
        };
        let flags = field("flags");
        let simd = ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "amx_int8"]
            .iter()
            .filter(|f| flags.split_whitespace().any(|x| x == **f))
            .map(|f| (*f).to_owned())
            .collect();
        Machine {
            cpu_model: field("model name"),
            cpu_flags: flags,
            simd,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            mem_total: crate::monitor::meminfo("MemTotal").unwrap_or(0),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            git_hash: env!("SPARROW_GIT_HASH").to_owned(),
        }
    }
}

/// Everything the report is made from.
#[derive(Debug)]
pub struct Report<'a> {
    /// The sweep's settings.
    pub cfg: &'a SweepConfig,
    /// The command line, as given.
    pub argv: &'a [String],
    /// When the sweep started (UTC).
    pub started: String,
    /// Every step in run order.
    pub steps: &'a [StepResult],
    /// Machine facts.
    pub machine: &'a Machine,
}

/// The bench figures of a step row, in the table's column order (req/s, output and total
/// tok/s, TTFT p50/p99, TPOT p50/p99, ITL p50).
const STEP_FIGURES: [&str; 8] = [
    "request_throughput",
    "output_throughput",
    "total_throughput",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "median_itl_ms",
];

/// A/B rows: the step value and (figure, A, B) per figure.
type AbRows = Vec<(f64, Vec<(&'static str, f64, f64)>)>;

impl Report<'_> {
    /// The analysis of every side.
    pub fn analyse(&self) -> Vec<SideAnalysis> {
        let axis = self.cfg.axis.name();
        self.cfg
            .sides
            .iter()
            .map(|s| {
                let points = analysis::points(self.steps, &s.label, axis);
                // The knee over the listed values: a search's bisection probes sit a step apart,
                // where growth per doubling is noise.
                let listed: Vec<Point> = points.iter().filter(|p| p.value_index < self.cfg.listed).cloned().collect();
                let knee = analysis::knee(&listed, self.cfg.args.knee_gain);
                let past = knee.value.and_then(|k| points.iter().find(|p| p.value > k)).map(|p| p.value);
                let limit = past.and_then(|v| {
                    self.steps
                        .iter()
                        .filter(|t| t.label == s.label && t.value(axis) == v)
                        .find_map(|t| t.limit.as_ref())
                        .map(|l| format!("at {}: {l}", fmt_value(v)))
                });
                SideAnalysis {
                    label: s.label.clone(),
                    limit,
                    knee,
                    peak: analysis::peak(&points),
                    slo: self.cfg.has_slos().then(|| analysis::slo_point(&points, &self.cfg.slo.describe())),
                    points,
                }
            })
            .collect()
    }

    fn forensics_note(&self) -> Option<String> {
        self.cfg.sides.iter().any(|s| s.server_cmd.is_none()).then(|| {
            "the sweep did not launch the server: forensics are limited to what HTTP shows (no log, exit status or memory figures)".to_owned()
        })
    }

    /// The terminal summary: one row per step, then each side's knee / peak / SLO point, then
    /// the A/B comparison.
    pub fn table(&self, an: &[SideAnalysis]) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "{:>4} {:<8} {:>6} {:>6} {:>8} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>8} {:>6}  verdict",
            "step",
            "label",
            "conc",
            "rate",
            "req/s",
            "out tok/s",
            "tot tok/s",
            "TTFT p50",
            "TTFT p99",
            "TPOT p50",
            "TPOT p99",
            "ITL p50",
            "failed",
        );
        for s in self.steps {
            let m = |k: &str| s.metric(k).map_or("-".to_owned(), |v| format!("{v:.1}"));
            let verdict = match (s.status, s.verdict) {
                (Status::Skipped, _) => "skipped".to_owned(),
                (Status::Interrupted, _) => "interrupted".to_owned(),
                (Status::Failed, Some(v)) => format!("{} (failed)", v.as_str()),
                (_, Some(v)) => v.as_str().to_owned(),
                (_, None) => "-".to_owned(),
            };
            let _ = writeln!(
                o,
                "{:>4} {:<8} {:>6} {:>6} {:>8} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>8} {:>6}  {}",
                s.step,
                s.label,
                s.concurrency.map_or("-".into(), |c| c.to_string()),
                fmt_value(s.request_rate),
                m(STEP_FIGURES[0]),
                m(STEP_FIGURES[1]),
                m(STEP_FIGURES[2]),
                m(STEP_FIGURES[3]),
                m(STEP_FIGURES[4]),
                m(STEP_FIGURES[5]),
                m(STEP_FIGURES[6]),
                m(STEP_FIGURES[7]),
                s.failed,
                verdict
            );
        }
        for s in self.steps.iter().filter(|s| matches!(s.status, Status::Crashed | Status::Failed)) {
            let _ =
                writeln!(o, "step {} ({}): {}: {}", s.step, s.label, s.verdict.map_or("-", |v| v.as_str()), s.evidence);
            if let Some(q) = &s.quote {
                let _ = writeln!(o, "    {}:{}: {}", s.server_log.as_deref().unwrap_or("log"), q.line, q.text);
            }
        }
        if let Some(n) = self.forensics_note() {
            let _ = writeln!(o, "note: {n}");
        }
        for a in an {
            if self.cfg.args.repeat > 1 {
                for p in &a.points {
                    let _ = writeln!(
                        o,
                        "{} at {}: median {:.1} output tok/s over {} runs (spread {:.1} .. {:.1})",
                        a.label,
                        fmt_value(p.value),
                        p.output_throughput,
                        p.runs,
                        p.spread.0,
                        p.spread.1
                    );
                }
            }
            let _ = writeln!(o, "{}: {}", a.label, a.knee.how);
            if let Some(l) = &a.limit {
                let _ = writeln!(o, "{}: past the knee, {l}", a.label);
            }
            let _ = writeln!(o, "{}: {}", a.label, a.peak.how);
            if let Some(s) = &a.slo {
                let _ = writeln!(o, "{}: {}", a.label, s.how);
            }
        }
        if self.cfg.is_ab() {
            o.push_str(&self.ab_table(an));
        }
        if self.cfg.has_slos() {
            o.push_str(&crate::compare::slo_text(self.cfg, an, self.steps));
        }
        if self.cfg.is_grid() {
            o.push_str(&crate::compare::table_text(self.cfg, an, self.steps));
        }
        o
    }

    fn ab_rows(&self, an: &[SideAnalysis]) -> AbRows {
        let (a, b) = (&an[0], &an[1]);
        a.points
            .iter()
            .filter_map(|pa| {
                let pb = b.points.iter().find(|p| p.value_index == pa.value_index)?;
                Some((
                    pa.value,
                    vec![
                        ("out tok/s", pa.output_throughput, pb.output_throughput),
                        ("total tok/s", pa.total_throughput, pb.total_throughput),
                        ("TTFT p50 ms", pa.ttft_p50, pb.ttft_p50),
                        ("TPOT p50 ms", pa.tpot_p50, pb.tpot_p50),
                        ("ITL p50 ms", pa.itl_p50, pb.itl_p50),
                    ],
                ))
            })
            .collect()
    }

    fn ab_table(&self, an: &[SideAnalysis]) -> String {
        let mut o = String::new();
        let _ = writeln!(
            o,
            "A/B: {} (A) vs {} (B), same prompts per step, interleaved; ratio B/A",
            an[0].label, an[1].label
        );
        for (v, cols) in self.ab_rows(an) {
            let cells: Vec<String> =
                cols.iter().map(|(n, a, b)| format!("{n} {a:.1} | {b:.1} | x{}", ratio(*a, *b))).collect();
            let _ = writeln!(o, "  {} {}: {}", self.cfg.axis.name(), fmt_value(v), cells.join("; "));
        }
        o
    }

    /// `summary.json`.
    pub fn summary_json(&self, an: &[SideAnalysis]) -> Value {
        let finding = |f: &Finding| json!({"value": f.value.map(fmt_json), "figure": f.figure, "how": f.how});
        json!({
            "argv": self.argv,
            "started": self.started,
            "axis": self.cfg.axis.name(),
            "bench_flags": self.cfg.bench_argv,
            "sides": self.cfg.sides.iter().map(|s| json!({"label": s.label, "server_cmd": s.server_cmd, "base_url": s.base_url, "configuration": s.config, "workload": s.workload, "bench_flags": s.bench_extra})).collect::<Vec<_>>(),
            "forensics_note": self.forensics_note(),
            "machine": self.machine,
            "steps": self.steps,
            "analysis": an.iter().map(|a| json!({
                "label": a.label,
                "knee": finding(&a.knee),
                "limit": a.limit,
                "peak": finding(&a.peak),
                "slo_point": a.slo.as_ref().map(finding),
                "points": a.points.iter().map(|p| json!({
                    "value": fmt_json(p.value), "runs": p.runs, "output_throughput": p.output_throughput,
                    "output_throughput_min": p.spread.0, "output_throughput_max": p.spread.1,
                    "total_throughput": p.total_throughput, "request_throughput": p.request_throughput,
                    "median_ttft_ms": p.ttft_p50, "p99_ttft_ms": p.ttft_p99, "median_tpot_ms": p.tpot_p50,
                    "p99_tpot_ms": p.tpot_p99, "median_itl_ms": p.itl_p50, "median_e2e_latency_ms": p.e2e_p50,
                    "slo_attainment": p.slo_attainment, "goodput": p.goodput,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "grid": self.cfg.is_grid().then(|| crate::compare::json(self.cfg, an, self.steps)),
            "slo": self.cfg.has_slos().then(|| crate::compare::slo_json(self.cfg, an, self.steps)),
            "ab": self.cfg.is_ab().then(|| self.ab_rows(an).into_iter().map(|(v, cols)| {
                let mut m = serde_json::Map::new();
                m.insert("value".into(), fmt_json(v));
                for (n, a, b) in cols {
                    m.insert(n.into(), json!({"a": a, "b": b, "ratio_b_over_a": if a != 0.0 { Some(b / a) } else { None }}));
                }
                Value::Object(m)
            }).collect::<Vec<_>>()),
        })
    }

    /// `summary.csv`: one row per step.
    pub fn csv(&self) -> String {
        let cols: Vec<&str> = STEP_FIGURES.iter().copied().chain(["median_e2e_latency_ms"]).collect();
        let mut o = format!(
            "step,label,configuration,workload,concurrency,request_rate,repeat,seed,num_prompts,status,verdict,completed,failed,{},goodput,slo_attainment,slo_met,peak_rss_bytes,evidence\n",
            cols.join(",")
        );
        for s in self.steps {
            let mut row = vec![
                s.step.to_string(),
                csv_cell(&s.label),
                csv_cell(s.config.as_deref().unwrap_or("")),
                csv_cell(s.workload.as_deref().unwrap_or("")),
                s.concurrency.map_or(String::new(), |c| c.to_string()),
                fmt_value(s.request_rate),
                s.repeat.to_string(),
                s.seed.to_string(),
                s.num_prompts.to_string(),
                s.status.as_str().to_owned(),
                s.verdict.map_or(String::new(), |v| v.as_str().to_owned()),
                s.completed.to_string(),
                s.failed.to_string(),
            ];
            row.extend(cols.iter().map(|c| s.metric(c).map_or(String::new(), |v| v.to_string())));
            row.push(s.goodput.map_or(String::new(), |v| v.to_string()));
            row.push(s.slo_attainment.map_or(String::new(), |v| v.to_string()));
            row.push(s.slo_met.map_or(String::new(), |v| v.to_string()));
            row.push(s.peak_rss_bytes.map_or(String::new(), |v| v.to_string()));
            row.push(csv_cell(&s.evidence));
            o.push_str(&row.join(","));
            o.push('\n');
        }
        o
    }

    /// The four charts.
    pub fn charts(&self, an: &[SideAnalysis]) -> Vec<Chart> {
        let axis = self.cfg.axis.name();
        let has_inf = (0..self.cfg.axis.len()).any(|i| self.cfg.axis.value(i).is_infinite());
        let x_desc = match (axis == "concurrency", has_inf) {
            (true, _) => "max concurrency",
            (false, false) => "request rate (req/s)",
            (false, true) => "request rate (req/s; the inf step has no place on this axis: see the table)",
        };
        let per_side = |f: &dyn Fn(&Point) -> f64, suffix: &str, dashed: bool| -> Vec<Series> {
            an.iter()
                .enumerate()
                .map(|(i, a)| Series {
                    name: format!("{}{suffix}", a.label),
                    color: i,
                    dashed,
                    pts: a.points.iter().map(|p| (p.value, f(p))).collect(),
                })
                .collect()
        };
        let chart = |name: &str, title: &str, x: &str, y: &str, x_log: bool, y_log: bool, series: Vec<Series>| Chart {
            name: name.into(),
            title: title.into(),
            x_desc: x.into(),
            y_desc: y.into(),
            x_log,
            y_log,
            series,
            marks: vec![],
        };
        let mut throughput = chart(
            "throughput",
            "Output throughput",
            x_desc,
            "output tok/s",
            true,
            false,
            per_side(&|p| p.output_throughput, "", false),
        );
        let mut ttft = per_side(&|p| p.ttft_p50, " p50", false);
        ttft.extend(per_side(&|p| p.ttft_p99, " p99", true));
        let mut tpot = per_side(&|p| p.tpot_p50, " p50", false);
        tpot.extend(per_side(&|p| p.tpot_p99, " p99", true));
        let lat: Vec<Series> = an
            .iter()
            .enumerate()
            .map(|(i, a)| Series {
                name: format!("{} median E2E", a.label),
                color: i,
                dashed: false,
                pts: a.points.iter().map(|p| (p.output_throughput, p.e2e_p50)).collect(),
            })
            .collect();
        let mut latency = chart(
            "latency_throughput",
            "Latency against throughput",
            "output tok/s",
            "median E2E latency (ms)",
            false,
            true,
            lat,
        );
        for (i, a) in an.iter().enumerate() {
            if let Some(k) = a.knee.value {
                if let Some(p) = a.points.iter().find(|p| p.value == k) {
                    let text = format!("  knee {} ({})", fmt_value(k), a.label);
                    throughput.marks.push((p.value, p.output_throughput, text.clone(), i));
                    latency.marks.push((p.output_throughput, p.e2e_p50, text, i));
                }
            }
        }
        let mut charts = vec![
            throughput,
            chart("ttft", "Time to first token", x_desc, "TTFT (ms)", true, true, ttft),
            chart("tpot", "Time per output token", x_desc, "TPOT (ms)", true, true, tpot),
            latency,
        ];
        if self.cfg.is_grid() {
            for (wi, w) in crate::compare::workloads(self.cfg).into_iter().enumerate() {
                let pts = crate::compare::pareto(self.cfg, an, w);
                // Each configuration's points in step order, then the front through the best.
                let mut series: Vec<Series> = an
                    .iter()
                    .enumerate()
                    .filter(|(_, a)| pts.iter().any(|p| p.label == a.label))
                    .map(|(i, a)| Series {
                        // The workload is in the title: the configuration names the line.
                        name: self
                            .cfg
                            .sides
                            .iter()
                            .find(|s| s.label == a.label)
                            .and_then(|s| s.config.clone())
                            .unwrap_or_else(|| a.label.clone()),
                        color: i,
                        dashed: false,
                        pts: pts.iter().filter(|p| p.label == a.label).map(|p| (p.per_user, p.total)).collect(),
                    })
                    .collect();
                let mut front: Vec<(f64, f64)> =
                    pts.iter().filter(|p| p.on_front).map(|p| (p.per_user, p.total)).collect();
                front.sort_by(|a, b| a.0.total_cmp(&b.0));
                series.push(Series {
                    name: "Pareto front".into(),
                    color: crate::plot::FRONT_COLOR,
                    dashed: true,
                    pts: front,
                });
                let name = if wi == 0 { "pareto".to_owned() } else { format!("pareto-{}", wi + 1) };
                let title = match w {
                    Some(w) => format!("Pareto front: {w}"),
                    None => "Pareto front".to_owned(),
                };
                charts.push(chart(
                    &name,
                    &title,
                    "tokens/s per user (1000 / median TPOT ms)",
                    "output tok/s",
                    false,
                    false,
                    series,
                ));
            }
        }
        charts
    }

    /// `report.html`, with the SVG plots inlined.
    pub fn html(&self, an: &[SideAnalysis], svgs: &[(String, String)], dir: &Path) -> String {
        let mut h = String::new();
        h.push_str(
            "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>sparrow sweep</title><style>\n",
        );
        h.push_str(
            "body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;font-size:13px}\
td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}th{background:#f2f2f2}td.l{text-align:left}\
.bad{background:#fde8e8}.skip{color:#999}pre{background:#f7f7f7;padding:8px;overflow-x:auto;font-size:12px}\
.plots{display:flex;flex-wrap:wrap;gap:12px}.plots div{width:900px}code{background:#f2f2f2}\n</style></head><body>\n",
        );
        let _ = writeln!(
            h,
            "<h1>sparrow sweep</h1>\n<p>Started {} &middot; axis <b>{}</b> &middot; {} step(s)</p>",
            esc(&self.started),
            self.cfg.axis.name(),
            self.steps.len()
        );
        h.push_str("<h2>Steps</h2>\n<table><tr>");
        for c in [
            "step",
            "label",
            "conc",
            "rate",
            "req/s",
            "out tok/s",
            "total tok/s",
            "TTFT p50",
            "TTFT p99",
            "TPOT p50",
            "TPOT p99",
            "ITL p50",
            "failed",
            "status",
            "verdict",
        ] {
            let _ = write!(h, "<th>{c}</th>");
        }
        h.push_str("</tr>\n");
        for s in self.steps {
            let cls = match s.status {
                Status::Ok => "",
                Status::Skipped | Status::Interrupted => " class=\"skip\"",
                _ => " class=\"bad\"",
            };
            let m = |k: &str| s.metric(k).map_or("-".to_owned(), |v| format!("{v:.1}"));
            let _ = write!(
                h,
                "<tr{cls}><td>{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td>",
                s.step,
                esc(&s.label),
                s.concurrency.map_or("-".into(), |c| c.to_string()),
                fmt_value(s.request_rate)
            );
            for k in STEP_FIGURES {
                let _ = write!(h, "<td>{}</td>", m(k));
            }
            let status = s.status.as_str();
            let _ = writeln!(
                h,
                "<td>{}</td><td class=\"l\">{status}</td><td class=\"l\">{}</td></tr>",
                s.failed,
                s.verdict.map_or("-", |v| v.as_str())
            );
        }
        h.push_str("</table>\n<h2>Knee, peak, SLO point</h2>\n<ul>\n");
        for a in an {
            let _ = writeln!(
                h,
                "<li><b>{}</b>: {}</li><li><b>{}</b>: {}</li>",
                esc(&a.label),
                esc(&a.knee.how),
                esc(&a.label),
                esc(&a.peak.how)
            );
            if let Some(l) = &a.limit {
                let _ = writeln!(h, "<li><b>{}</b>: past the knee, {}</li>", esc(&a.label), esc(l));
            }
            if let Some(s) = &a.slo {
                let _ = writeln!(h, "<li><b>{}</b>: {}</li>", esc(&a.label), esc(&s.how));
            }
        }
        let _ = writeln!(
            h,
            "</ul>\n<p>The knee is the first step value after which output tok/s grows by less than {:.0} % per doubling of the step value (T(i+1)/T(i) &lt; (1 + gain)<sup>log2(c(i+1)/c(i))</sup>); with --repeat, medians are compared.</p>",
            self.cfg.args.knee_gain * 100.0
        );
        if self.cfg.has_slos() {
            h.push_str(&crate::compare::slo_html(self.cfg, an, self.steps));
        }
        if self.cfg.is_grid() {
            h.push_str(&crate::compare::html(self.cfg, an, self.steps));
        }
        if self.cfg.is_ab() {
            let _ = writeln!(h, "<h2>A/B</h2>\n<p>{} (A) against {} (B): same prompts at each step, runs interleaved A, B; ratio B/A.</p>\n<table><tr><th>{}</th><th>figure</th><th>A</th><th>B</th><th>B/A</th></tr>", esc(&an[0].label), esc(&an[1].label), self.cfg.axis.name());
            for (v, cols) in self.ab_rows(an) {
                for (n, a, b) in cols {
                    let _ = writeln!(
                        h,
                        "<tr><td>{}</td><td class=\"l\">{n}</td><td>{a:.1}</td><td>{b:.1}</td><td>{}</td></tr>",
                        fmt_value(v),
                        ratio(a, b)
                    );
                }
            }
            h.push_str("</table>\n");
        }
        h.push_str("<h2>Plots</h2>\n<div class=\"plots\">\n");
        if svgs.is_empty() {
            h.push_str("<p>No plots: no TrueType font was found for their text (install fonts-dejavu-core, or set SPARROW_PLOT_FONT to a .ttf file).</p>\n");
        }
        for (name, svg) in svgs {
            let body = svg.find("<svg").map_or(svg.as_str(), |i| &svg[i..]);
            let _ = writeln!(h, "<div id=\"plot-{name}\">{body}</div>");
        }
        h.push_str("</div>\n");
        h.push_str(&self.series_html(dir));
        h.push_str("<h2>Verdicts</h2>\n");
        let mut any = false;
        for s in self
            .steps
            .iter()
            .filter(|s| s.status != Status::Ok || s.verdict.is_some_and(|v| v != crate::forensics::VerdictKind::Ok))
        {
            any = true;
            let _ = writeln!(
                h,
                "<h3>Step {} ({}, {} {}): {}</h3>\n<p>{}</p>",
                s.step,
                esc(&s.label),
                self.cfg.axis.name(),
                fmt_value(s.value(self.cfg.axis.name())),
                s.verdict.map_or(s.status.as_str(), |v| v.as_str()),
                esc(&s.evidence)
            );
            if let Some(q) = &s.quote {
                let mut quoted = format!("{}:{}: {}\n", s.server_log.as_deref().unwrap_or("log"), q.line, q.text);
                for c in &s.context {
                    let _ = writeln!(quoted, "{}:{}: {}", s.server_log.as_deref().unwrap_or("log"), c.line, c.text);
                }
                let _ = writeln!(h, "<pre>{}</pre>", esc(&quoted));
            }
        }
        if !any {
            h.push_str("<p>Every step ran with the server up.</p>\n");
        }
        if let Some(n) = self.forensics_note() {
            let _ = writeln!(h, "<p><i>{}</i></p>", esc(&n));
        }
        h.push_str("<h2>Command lines</h2>\n");
        let _ = writeln!(h, "<pre>sparrow sweep {}</pre>", esc(&shell_join(self.argv)));
        for s in &self.cfg.sides {
            let _ = writeln!(
                h,
                "<p>{}: <code>{}</code> at <code>{}</code></p>",
                esc(&s.label),
                esc(s.server_cmd.as_deref().unwrap_or("(not launched by the sweep)")),
                esc(&s.base_url)
            );
        }
        let m = self.machine;
        let _ = writeln!(
            h,
            "<h2>Machine</h2>\n<table><tr><td class=\"l\">CPU</td><td class=\"l\">{}</td></tr><tr><td class=\"l\">SIMD</td><td class=\"l\">{}</td></tr><tr><td class=\"l\">cores</td><td class=\"l\">{}</td></tr><tr><td class=\"l\">memory</td><td class=\"l\">{}</td></tr><tr><td class=\"l\">kernel</td><td class=\"l\">{}</td></tr><tr><td class=\"l\">sparrow</td><td class=\"l\">{} ({})</td></tr>{}</table>\n<details><summary>CPU flags</summary><pre>{}</pre></details>",
            esc(&m.cpu_model),
            esc(&m.simd.join(" ")),
            m.cores,
            crate::monitor::gib(m.mem_total),
            esc(&m.kernel),
            esc(&m.version),
            esc(&m.git_hash),
            self.kernel_isa_rows(),
            esc(&m.cpu_flags)
        );
        h.push_str("</body></html>\n");
        h
    }

    /// The server over each step, one second a point: a small line per figure (running,
    /// queued, KV usage, the server's CPU, the host's CPU, RSS) with its range, and the
    /// step's limit.
    fn series_html(&self, dir: &Path) -> String {
        let rows: Vec<(&StepResult, Vec<crate::scrape::Sample>)> = self
            .steps
            .iter()
            .filter_map(|s| {
                let text = std::fs::read_to_string(dir.join(s.series_file.as_ref()?)).ok()?;
                Some((s, serde_json::from_str(&text).ok()?))
            })
            .collect();
        if rows.is_empty() {
            return String::new();
        }
        let mut h = String::from(
            "<h2>The server over each step</h2>\n<p>Sampled once a second: <code>/metrics</code> (SGLang, vLLM, llama.cpp or sparrow names), the server's process tree's CPU and RSS, the host's CPU.</p>\n<table id=\"series\"><tr><th>step</th><th>series</th><th>value</th><th>running</th><th>queued</th><th>KV usage</th><th>server CPU (cores)</th><th>host CPU</th><th>RSS</th><th>limit</th></tr>\n",
        );
        let axis = self.cfg.axis.name();
        for (s, series) in rows {
            let _ = write!(
                h,
                "<tr><td>{}</td><td class=\"l\">{}</td><td>{}</td>",
                s.step,
                esc(&s.label),
                fmt_value(s.value(axis))
            );
            for (f, fmt) in SERIES_COLUMNS {
                let v: Vec<(f64, f64)> = series.iter().filter_map(|x| Some((x.t, f(x)?))).collect();
                let _ = write!(h, "<td>{}</td>", sparkline(&v, fmt));
            }
            let _ = writeln!(h, "<td class=\"l\">{}</td></tr>", esc(s.limit.as_deref().unwrap_or("")));
        }
        h.push_str("</table>\n");
        h
    }

    fn kernel_isa_rows(&self) -> String {
        let mut o = String::new();
        for s in &self.cfg.sides {
            let isa = self.steps.iter().filter(|st| st.label == s.label).find_map(|st| {
                st.bench.get("server_info").and_then(|i| i.get("kernel_isa")).and_then(Value::as_str).map(str::to_owned)
            });
            if let Some(isa) = isa {
                let _ = write!(
                    o,
                    "<tr><td class=\"l\">{} kernel ISA</td><td class=\"l\">{}</td></tr>",
                    esc(&s.label),
                    esc(&isa)
                );
            }
        }
        o
    }
}

/// A figure of the server's series, and how its values read.
type Column = (fn(&crate::scrape::Sample) -> Option<f64>, fn(f64) -> String);

/// The columns of the series table: running, queued, KV usage, server CPU, host CPU, RSS.
const SERIES_COLUMNS: [Column; 6] = [
    (|x| x.running, |v| format!("{v:.0}")),
    (|x| x.queued, |v| format!("{v:.0}")),
    (|x| x.kv_usage.map(|k| k * 100.0), |v| format!("{v:.0} %")),
    (|x| x.server_cpu, |v| format!("{v:.2}")),
    (|x| x.host_cpu.map(|c| c * 100.0), |v| format!("{v:.0} %")),
    (|x| x.rss.map(|r| r as f64), |v| crate::monitor::gib(v as u64)),
];

/// A 120 × 28 inline SVG line of `(t, v)` points with its range in words ("0 .. 4"); a dash
/// for none.
fn sparkline(pts: &[(f64, f64)], fmt: fn(f64) -> String) -> String {
    if pts.is_empty() {
        return "-".into();
    }
    let (w, hgt) = (120.0, 28.0);
    let (t0, t1) = (pts[0].0, pts[pts.len() - 1].0);
    let lo = pts.iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let hi = pts.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let x = |t: f64| if t1 > t0 { (t - t0) / (t1 - t0) * w } else { w / 2.0 };
    let y = |v: f64| if hi > lo { hgt - 2.0 - (v - lo) / (hi - lo) * (hgt - 4.0) } else { hgt / 2.0 };
    let line: Vec<String> = pts.iter().map(|p| format!("{:.1},{:.1}", x(p.0), y(p.1))).collect();
    format!(
        "<svg width=\"{w}\" height=\"{hgt}\" viewBox=\"0 0 {w} {hgt}\"><polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"{}\"/></svg><br>{} .. {}",
        line.join(" "),
        fmt(lo),
        fmt(hi)
    )
}

fn ratio(a: f64, b: f64) -> String {
    if a > 0.0 {
        format!("{:.3}", b / a)
    } else {
        "-".into()
    }
}

fn fmt_json(v: f64) -> Value {
    if v.is_finite() {
        json!(v)
    } else {
        json!("inf")
    }
}

fn csv_cell(s: &str) -> String {
    if s.contains([',', '"', '\n']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// Writes `summary.json`, `summary.csv`, the plots (`plots/*.svg`, `plots/*.png`) and
/// `report.html` into `dir`; returns the terminal table. Plot failures are warnings.
///
/// # Errors
/// The first file that cannot be written.
pub fn write_all(r: &Report<'_>, dir: &Path) -> std::io::Result<String> {
    let an = r.analyse();
    let summary = r.summary_json(&an);
    write_atomic(&dir.join("summary.json"), serde_json::to_string_pretty(&summary).unwrap_or_default().as_bytes())?;
    write_atomic(&dir.join("summary.csv"), r.csv().as_bytes())?;
    let plots = dir.join("plots");
    std::fs::create_dir_all(&plots)?;
    // plotters lays out every text (SVG included) with the registered font: no font, no plots.
    let font = plot::ensure_font();
    let mut svgs = vec![];
    for c in r.charts(&an).into_iter().filter(|_| font.is_some()) {
        if c.series.iter().all(|s| s.pts.is_empty()) {
            continue;
        }
        match plot::svg(&c) {
            Ok(s) => {
                write_atomic(&plots.join(format!("{}.svg", c.name)), s.as_bytes())?;
                svgs.push((c.name.clone(), s));
            }
            Err(e) => sparrow_bench::errln!("warning: plot {}: {e}", c.name),
        }
        // Drawn beside the final name, then renamed: a reader never sees half a PNG.
        let tmp = plots.join(format!("{}.tmp.png", c.name)); // the encoder goes by the extension
        match plot::png(&c, &tmp) {
            Ok(()) => std::fs::rename(&tmp, plots.join(format!("{}.png", c.name)))?,
            Err(e) => sparrow_bench::errln!("warning: plot {}.png: {e}", c.name),
        }
    }
    if font.is_none() {
        sparrow_bench::errln!(
            "warning: no TrueType font found (install fonts-dejavu-core or set SPARROW_PLOT_FONT): no plots"
        );
    }
    write_atomic(&dir.join("report.html"), r.html(&an, &svgs, dir).as_bytes())?;
    Ok(r.table(&an))
}
