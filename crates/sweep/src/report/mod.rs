//! The sweep's report: the terminal table, `summary.json`, `summary.csv`, the plots and one
//! self-contained `report.html` (table, inline SVG plots, verdicts with their quoted log
//! lines, the command lines and the machine's facts).
//!
//! This file holds the report's inputs ([`Report`], [`Machine`]), the analysis per side, the
//! text forms (terminal table, A/B comparison, JSON, CSV) and [`write_all`]; `charts` builds
//! the plots, `html` the page.

mod charts;
mod html;

use std::fmt::Write as _;
use std::path::Path;

use serde_json::{json, Value};

use crate::analysis::{self, fmt_value, Finding, Point, SideAnalysis};
use crate::args::SweepConfig;
use crate::out::write_atomic;
use crate::plot;
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
