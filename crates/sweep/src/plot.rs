//! The sweep's plots (plotters), each as SVG (inlined in `report.html`) and PNG: output tok/s
//! against the step value, TTFT and TPOT p50/p99 against the step value, and latency against
//! throughput with the knee marked. A/B sides share the axes.
//!
//! Step values and latencies are drawn on log10 axes (concurrencies and rates are geometric;
//! latencies span orders of magnitude) by plotting `log10(x)` on a linear axis with labels in
//! real units, so one chart routine serves every plot. PNG text needs a TrueType font: the
//! first of a few system fonts found (`fonts-dejavu-core` on Debian) is registered; without
//! one, only the SVGs are written.

use std::path::{Path, PathBuf};

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::coord::Shift;
use plotters::prelude::*;

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Colour index (0 = side A, 1 = side B, one per grid side; [`FRONT_COLOR`]).
    pub color: usize,
    /// Dashed (p99) or solid (p50, throughput).
    pub dashed: bool,
    /// Points in data units.
    pub pts: Vec<(f64, f64)>,
}

/// One chart.
#[derive(Debug, Clone)]
pub struct Chart {
    /// File stem (`throughput`, `ttft`, `tpot`, `latency_throughput`, `pareto[-N]`).
    pub name: String,
    /// Caption.
    pub title: String,
    /// X axis description.
    pub x_desc: String,
    /// Y axis description.
    pub y_desc: String,
    /// Log10 axes.
    pub x_log: bool,
    /// See `x_log`.
    pub y_log: bool,
    /// The lines.
    pub series: Vec<Series>,
    /// Marked points (data units) with their label (the knee).
    pub marks: Vec<(f64, f64, String, usize)>,
}

/// Size of every plot, pixels.
pub const SIZE: (u32, u32) = (900, 520);

/// Side colours (matplotlib's tab10, A blue and B red first as before), then black for the
/// Pareto front ([`FRONT_COLOR`]).
const COLORS: [RGBColor; 11] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(0, 0, 0),
];

/// The colour index of the Pareto front's line.
pub const FRONT_COLOR: usize = usize::MAX;

/// Side `i`'s colour (the palette repeats past ten sides; black is the front's alone).
fn color(i: usize) -> RGBColor {
    if i == FRONT_COLOR {
        COLORS[10]
    } else {
        COLORS[i % 10]
    }
}

fn tx(v: f64, log: bool) -> Option<f64> {
    if !v.is_finite() {
        return None;
    }
    if log {
        (v > 0.0).then(|| v.log10())
    } else {
        Some(v)
    }
}

fn label(v: f64, log: bool) -> String {
    let x = if log { 10f64.powf(v) } else { v };
    if x.abs() >= 100.0 || (x - x.round()).abs() < 1e-6 {
        format!("{x:.0}")
    } else if x.abs() >= 1.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

fn range(vals: impl Iterator<Item = f64>, log: bool, from_zero: bool) -> (f64, f64) {
    let v: Vec<f64> = vals.collect();
    let (mut lo, mut hi) =
        (v.iter().copied().fold(f64::INFINITY, f64::min), v.iter().copied().fold(f64::NEG_INFINITY, f64::max));
    if !lo.is_finite() || !hi.is_finite() {
        return (0.0, 1.0);
    }
    if from_zero && !log {
        lo = lo.min(0.0);
    }
    let pad = if hi > lo {
        (hi - lo) * 0.08
    } else if log {
        0.3
    } else {
        hi.abs().max(1.0) * 0.5
    };
    if !from_zero || log {
        lo -= pad;
    }
    hi += pad;
    (lo, hi)
}

/// Tick positions (in plotted units): the data's own x values on a log step axis (so every
/// step is labelled by its value), else 1-2-5 steps (per decade on a log axis).
fn ticks(lo: f64, hi: f64, log: bool, at: Option<Vec<f64>>) -> Vec<f64> {
    if let Some(mut v) = at {
        v.sort_by(f64::total_cmp);
        v.dedup();
        if !v.is_empty() && v.len() <= 16 {
            return v;
        }
    }
    if log {
        let mut out = vec![];
        let mut d = lo.floor() as i32;
        while f64::from(d) <= hi.ceil() {
            for m in [1.0, 2.0, 5.0] {
                let t = (m * 10f64.powi(d)).log10();
                if (lo..=hi).contains(&t) {
                    out.push(t);
                }
            }
            d += 1;
        }
        if out.len() >= 2 {
            return out;
        }
        // Less than a decade: round ticks in real units, placed on the log axis.
        let (a, b) = (10f64.powf(lo), 10f64.powf(hi));
        return ticks(a, b, false, None).into_iter().filter(|t| *t > 0.0).map(f64::log10).collect();
    }
    let raw = (hi - lo) / 6.0;
    if raw.is_nan() || raw <= 0.0 {
        return vec![lo];
    }
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    let mut t = (lo / step).ceil() * step;
    let mut out = vec![];
    while t <= hi + step * 1e-9 {
        out.push(if t.abs() < step * 1e-9 { 0.0 } else { t });
        t += step;
    }
    out
}

/// A linear axis over `lo..hi` whose labelled ticks are exactly `ticks`.
struct TickAxis {
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
}

impl Ranged for TickAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;
    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let f = (v - self.lo) / (self.hi - self.lo);
        limit.0 + (f * f64::from(limit.1 - limit.0)).round() as i32
    }
    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            vec![]
        } else {
            self.ticks.clone()
        }
    }
    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, c: &Chart) -> Result<(), String> {
    let e = |x: DrawingAreaErrorKind<DB::ErrorType>| x.to_string();
    root.fill(&WHITE).map_err(e)?;
    let series: Vec<(&Series, Vec<(f64, f64)>)> = c
        .series
        .iter()
        .map(|s| (s, s.pts.iter().filter_map(|&(x, y)| Some((tx(x, c.x_log)?, tx(y, c.y_log)?))).collect()))
        .collect();
    let all = || series.iter().flat_map(|(_, p)| p.iter().copied());
    let (x0, x1) = range(all().map(|p| p.0), c.x_log, false);
    let (y0, y1) = range(all().map(|p| p.1), c.y_log, true);
    // Headroom above the data for the legend box.
    let y1 = y1 + (y1 - y0) * 0.25;
    let mut chart = ChartBuilder::on(root)
        .caption(&c.title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(
            TickAxis { lo: x0, hi: x1, ticks: ticks(x0, x1, c.x_log, c.x_log.then(|| all().map(|p| p.0).collect())) },
            TickAxis { lo: y0, hi: y1, ticks: ticks(y0, y1, c.y_log, None) },
        )
        .map_err(e)?;
    let (xl, yl) = (c.x_log, c.y_log);
    chart
        .configure_mesh()
        .x_desc(c.x_desc.as_str())
        .y_desc(c.y_desc.as_str())
        .x_label_formatter(&|v| label(*v, xl))
        .y_label_formatter(&|v| label(*v, yl))
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    for (s, pts) in &series {
        let color = color(s.color);
        let style = color.stroke_width(2);
        let drawn = if s.dashed {
            chart.draw_series(DashedLineSeries::new(pts.clone(), 8, 5, style)).map_err(e)?
        } else {
            chart.draw_series(LineSeries::new(pts.clone(), style)).map_err(e)?
        };
        let dashed = s.dashed;
        drawn.label(s.name.as_str()).legend(move |(x, y)| {
            let seg = |a: i32, b: i32| PathElement::new(vec![(x + a, y), (x + b, y)], color.stroke_width(2));
            // A dashed legend is three dashes; a solid one three touching segments.
            let g = if dashed { 0 } else { 4 };
            EmptyElement::at((0, 0)) + seg(0, 7 + g) + seg(11, 18 + g) + seg(22, 26)
        });
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled()))).map_err(e)?;
    }
    for (x, y, text, ci) in &c.marks {
        if let (Some(x), Some(y)) = (tx(*x, c.x_log), tx(*y, c.y_log)) {
            let color = color(*ci);
            chart.draw_series(std::iter::once(Circle::new((x, y), 11, color.stroke_width(3)))).map_err(e)?;
            chart
                .draw_series(std::iter::once(Text::new(
                    text.clone(),
                    (x, y),
                    ("sans-serif", 16).into_font().color(&color),
                )))
                .map_err(e)?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    root.present().map_err(e)
}

/// The chart as an SVG document.
///
/// # Errors
/// The drawing error (e.g. no font for text measurement).
pub fn svg(c: &Chart) -> Result<String, String> {
    let mut s = String::new();
    {
        let root = SVGBackend::with_string(&mut s, SIZE).into_drawing_area();
        draw(&root, c)?;
    }
    Ok(s)
}

/// Writes the chart as a PNG file.
///
/// # Errors
/// The drawing or encoding error.
pub fn png(c: &Chart, path: &Path) -> Result<(), String> {
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    draw(&root, c)
}

/// Font files tried, in order, for the `sans-serif` family.
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/freefont/FreeSans.ttf",
];

/// Registers a system font for plot text (once per process); returns the file used.
pub fn ensure_font() -> Option<PathBuf> {
    static FONT: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    FONT.get_or_init(|| {
        let from_env = std::env::var_os("SPARROW_PLOT_FONT").map(PathBuf::from);
        for p in from_env.into_iter().chain(FONTS.iter().map(PathBuf::from)) {
            let Ok(bytes) = std::fs::read(&p) else { continue };
            // plotters keeps fonts for the life of the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return Some(p);
            }
        }
        None
    })
    .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_labels_and_ranges() {
        assert_eq!(label(2f64.log10(), true), "2");
        assert_eq!(label(0.5, false), "0.50");
        assert_eq!(tx(0.0, true), None);
        assert_eq!(tx(f64::INFINITY, false), None);
        let (lo, hi) = range([10.0, 20.0].into_iter(), false, true);
        assert_eq!(lo, 0.0);
        assert!(hi > 20.0);
        assert_eq!(ticks(0.0, 1.0, true, Some(vec![0.6, 0.0, 0.6])), vec![0.0, 0.6]);
        assert_eq!(ticks(0.0, 30.0, false, None), vec![0.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0]);
        let decade: Vec<String> = ticks(-0.1, 1.1, true, None).iter().map(|t| label(*t, true)).collect();
        assert_eq!(decade, ["1", "2", "5", "10"]);
    }
}
