//! `report.html`: one self-contained page: the steps table, knee / peak / SLO point, the grid
//! and A/B comparisons, the inline SVG plots, the server's series per step (sparklines),
//! verdicts with their quoted log lines, the command lines and the machine's facts.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use super::{ratio, Report, STEP_FIGURES};
use crate::analysis::{fmt_value, SideAnalysis};
use crate::out::{esc, shell_join};
use crate::step::{Status, StepResult};

impl Report<'_> {
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
