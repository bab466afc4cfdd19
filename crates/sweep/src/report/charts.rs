//! The report's charts: throughput, TTFT and TPOT against the step value, latency against
//! throughput (each side's knee marked), and for a grid one Pareto front per workload.

use super::Report;
use crate::analysis::{fmt_value, Point, SideAnalysis};
use crate::plot::{Chart, Series};

impl Report<'_> {
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
}
