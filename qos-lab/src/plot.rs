//! PNG figures in the style of the papers' figures, from a [`Summary`]:
//!
//! - top: completed I/O per period of every host against its reservation (Haechi
//!   Fig. 9/10/13): one group of bars per host, the reservation first, then each policy's
//!   mean with a min-max whisker;
//! - bottom left: total throughput per period for each policy (Haechi Fig. 11/14/16);
//! - bottom right: the host with the largest reservation over time against its
//!   reservation (Haechi Fig. 17/19);
//! - in scenarios with pacing (Justitia's reader and writer), the bottom shows instead
//!   the small-I/O host's p99 latency (left, log scale) and the large-I/O host's MiB/s
//!   (right), one bar per policy: the point of those scenarios.
//!
//! Text needs a TrueType font: the plot looks for DejaVu Sans (Debian package
//! `fonts-dejavu-core`) or the file named by `QOS_LAB_FONT`, and draws the figure
//! without any text when there is none.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::FontStyle;
use thiserror::Error;

use crate::report::Summary;

#[derive(Debug, Error)]
#[error("cannot draw the plot {path}: {message}")]
pub struct PlotError {
    pub path: PathBuf,
    pub message: String,
}

/// Where fonts are looked for, in order (after `QOS_LAB_FONT`).
pub const FONT_PATHS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
];

static FONT: OnceLock<Option<PathBuf>> = OnceLock::new();

/// Registers a font for the plots once; returns the file used, or `None` (no text).
pub fn font() -> Option<&'static Path> {
    FONT.get_or_init(|| {
        let env = std::env::var_os("QOS_LAB_FONT").map(PathBuf::from);
        for p in env.into_iter().chain(FONT_PATHS.iter().map(PathBuf::from)) {
            if let Ok(bytes) = std::fs::read(&p) {
                // The font table keeps the bytes for the life of the process.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return Some(p);
                }
            }
        }
        None
    })
    .as_deref()
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];
const RESERVATION: RGBColor = RGBColor(150, 150, 150);

fn err(path: &Path, e: impl std::fmt::Debug) -> PlotError {
    PlotError {
        path: path.to_path_buf(),
        message: format!("{e:?}"),
    }
}

/// Draws `summary` to the PNG `path`, with text when a font is available.
pub fn render(summary: &Summary, path: &Path) -> Result<(), PlotError> {
    render_with(summary, path, font().is_some())
}

/// Draws `summary` to the PNG `path`; `text = false` draws no text at all.
pub fn render_with(summary: &Summary, path: &Path, text: bool) -> Result<(), PlotError> {
    let root = BitMapBackend::new(path, (1400, 1000)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(path, e))?;
    let (top, bottom) = root.split_vertically(540);
    let (left, right) = bottom.split_horizontally(700);
    let series: Vec<String> = summary
        .policies
        .iter()
        .map(|p| match &p.variant {
            Some(v) => format!("{} [{v}]", p.policy),
            None => p.policy.clone(),
        })
        .collect();
    let period_s = summary.period_ms as f64 / 1000.0;
    bars(summary, &series, period_s, &top, text).map_err(|e| err(path, e))?;
    match small_and_large(summary) {
        // Pacing scenarios (Justitia's reader and writer): the point is the small
        // reader's latency and the large writer's bandwidth, not I/O counts.
        Some((reader, writer)) => {
            let p99: Vec<f64> = summary
                .policies
                .iter()
                .map(|p| p.hosts[reader].latency_us.p99.unwrap_or(0.0))
                .collect();
            let mibps: Vec<f64> = summary
                .policies
                .iter()
                .map(|p| p.hosts[writer].mib_per_s)
                .collect();
            let host = |i: usize| summary.policies[0].hosts[i].host.clone();
            policy_bars(
                &left,
                &format!("{}: p99 latency (us, log scale)", host(reader)),
                &series,
                &p99,
                true,
                text,
            )
            .map_err(|e| err(path, e))?;
            policy_bars(
                &right,
                &format!("{}: MiB/s", host(writer)),
                &series,
                &mibps,
                false,
                text,
            )
            .map_err(|e| err(path, e))?;
        }
        None => {
            totals(summary, &series, &left, text).map_err(|e| err(path, e))?;
            top_host(summary, &series, period_s, &right, text).map_err(|e| err(path, e))?;
        }
    }
    root.present().map_err(|e| err(path, e))?;
    Ok(())
}

/// In a scenario with pacing policies: the host with the smallest and the one with the
/// largest bytes per I/O (the reader and the writer), when they differ.
pub fn small_and_large(summary: &Summary) -> Option<(usize, usize)> {
    if !summary
        .policies
        .iter()
        .any(|p| p.policy.ends_with("+pacing"))
    {
        return None;
    }
    let first = summary.policies.first()?;
    let size = |i: usize| {
        let h = &first.hosts[i];
        if h.mean_iops > 0.0 {
            h.mib_per_s / h.mean_iops
        } else {
            0.0
        }
    };
    let n = first.hosts.len();
    let small = (0..n).min_by(|&a, &b| size(a).total_cmp(&size(b)))?;
    let large = (0..n).max_by(|&a, &b| size(a).total_cmp(&size(b)))?;
    (size(large) > size(small)).then_some((small, large))
}

/// One bar per policy.
fn policy_bars(
    area: &Area<'_>,
    caption: &str,
    names: &[String],
    values: &[f64],
    log: bool,
    text: bool,
) -> DrawResult {
    let ymax = values.iter().copied().fold(1.0f64, f64::max) * if log { 3.0 } else { 1.15 };
    let mut b = ChartBuilder::on(area);
    b.margin(12)
        .x_label_area_size(if text { 90 } else { 0 })
        .y_label_area_size(if text { 70 } else { 0 });
    if text {
        b.caption(caption, ("sans-serif", 18));
    }
    if log {
        policy_bars_log(b, names, values, ymax, text)
    } else {
        policy_bars_linear(b, names, values, ymax, text)
    }
}

/// A policy's name under the middle of its bar.
fn policy_name_at(names: &[String], x: f64) -> String {
    let i = x.floor() as usize;
    if (x - x.floor() - 0.5).abs() < 1e-9 && i < names.len() {
        names[i].clone()
    } else {
        String::new()
    }
}

/// [`policy_bars`] on a log scale from 1 up.
fn policy_bars_log(
    mut b: ChartBuilder<'_, '_, BitMapBackend<'_>>,
    names: &[String],
    values: &[f64],
    ymax: f64,
    text: bool,
) -> DrawResult {
    let n = values.len().max(1);
    let label = |v: &f64| crate::report::thousands(*v);
    let x_label = |x: &f64| policy_name_at(names, *x);
    let mut chart = b.build_cartesian_2d(0f64..n as f64, (1f64..ymax).log_scale())?;
    let mut mesh = chart.configure_mesh();
    mesh.disable_x_mesh();
    if text {
        mesh.x_labels(n * 2 + 1)
            .x_label_formatter(&x_label)
            .y_label_formatter(&label);
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw()?;
    chart.draw_series(values.iter().enumerate().map(|(i, v)| {
        Rectangle::new(
            [(i as f64 + 0.15, 1.0), (i as f64 + 0.85, v.max(1.0))],
            PALETTE[i % PALETTE.len()].filled(),
        )
    }))?;
    if text {
        chart.draw_series(values.iter().enumerate().map(|(i, v)| {
            Text::new(
                crate::report::thousands(*v),
                (i as f64 + 0.35, v.max(1.0) * 1.25),
                ("sans-serif", 13),
            )
        }))?;
    }
    Ok(())
}

/// [`policy_bars`] on a linear scale from 0 up.
fn policy_bars_linear(
    mut b: ChartBuilder<'_, '_, BitMapBackend<'_>>,
    names: &[String],
    values: &[f64],
    ymax: f64,
    text: bool,
) -> DrawResult {
    let n = values.len().max(1);
    let label = |v: &f64| crate::report::thousands(*v);
    let x_label = |x: &f64| policy_name_at(names, *x);
    let mut chart = b.build_cartesian_2d(0f64..n as f64, 0f64..ymax)?;
    let mut mesh = chart.configure_mesh();
    mesh.disable_x_mesh();
    if text {
        mesh.x_labels(n * 2 + 1)
            .x_label_formatter(&x_label)
            .y_label_formatter(&label);
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw()?;
    chart.draw_series(values.iter().enumerate().map(|(i, v)| {
        Rectangle::new(
            [(i as f64 + 0.15, 0.0), (i as f64 + 0.85, *v)],
            PALETTE[i % PALETTE.len()].filled(),
        )
    }))?;
    if text {
        chart.draw_series(values.iter().enumerate().map(|(i, v)| {
            Text::new(
                crate::report::thousands(*v),
                (i as f64 + 0.35, v + ymax * 0.03),
                ("sans-serif", 13),
            )
        }))?;
    }
    Ok(())
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;
type DrawResult = Result<(), Box<dyn std::error::Error>>;

/// The chart of per-host bars drawn by [`bars`].
type BarChart<'a, 'b> =
    ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Completed I/O per period of every host: one group of bars per host, the reservation
/// first, then each policy's mean with a min-max whisker.
fn bars(
    summary: &Summary,
    series: &[String],
    period_s: f64,
    area: &Area<'_>,
    text: bool,
) -> DrawResult {
    let Some(first) = summary.policies.first() else {
        return Ok(());
    };
    let n = first.hosts.len();
    let ymax = bars_top(summary, period_s);
    let mut b = ChartBuilder::on(area);
    b.margin(12)
        .x_label_area_size(if text { 30 } else { 0 })
        .y_label_area_size(if text { 80 } else { 0 });
    if text {
        b.caption(
            format!(
                "{}: completed I/O per period, per host (reservation first)",
                summary.scenario
            ),
            ("sans-serif", 20),
        );
    }
    let ymin = if text { -ymax * 0.06 } else { 0.0 };
    let mut chart = b.build_cartesian_2d(0f64..n as f64, ymin..ymax)?;
    let mut mesh = chart.configure_mesh();
    mesh.disable_x_mesh().x_labels(0);
    if text {
        mesh.y_desc("I/O per period").y_label_formatter(&|v| {
            if *v < 0.0 {
                String::new()
            } else {
                format!("{:.0}K", v / 1000.0)
            }
        });
    } else {
        mesh.y_labels(0);
    }
    mesh.draw()?;
    for i in 0..n {
        host_bars(&mut chart, summary, i, period_s)?;
        if text {
            chart.draw_series(std::iter::once(Text::new(
                first.hosts[i].host.clone(),
                (i as f64 + 0.4, -ymax * 0.015),
                ("sans-serif", 13).into_font(),
            )))?;
        }
    }
    if text {
        bars_legend(&mut chart, series)?;
    }
    Ok(())
}

/// The top of the bars' axis: the most any host did in a period or reserved, plus room.
fn bars_top(summary: &Summary, period_s: f64) -> f64 {
    let mut ymax = 1.0f64;
    for p in &summary.policies {
        for h in &p.hosts {
            ymax = ymax.max(h.periods.iter().copied().max().unwrap_or(0) as f64);
            if let Some(r) = h.reservation_iops {
                ymax = ymax.max(r as f64 * period_s);
            }
        }
    }
    ymax * 1.12
}

/// Host `i`'s group of bars: its reservation, then each policy's mean and whisker.
fn host_bars(
    chart: &mut BarChart<'_, '_>,
    summary: &Summary,
    i: usize,
    period_s: f64,
) -> DrawResult {
    let first = &summary.policies[0];
    let per = |v: u64| v as f64;
    let groups = summary.policies.len() + 1;
    let bw = 0.8 / groups as f64;
    let x0 = i as f64 + 0.1;
    if let Some(r) = first.hosts[i].reservation_iops {
        let v = r as f64 * period_s;
        chart.draw_series(std::iter::once(Rectangle::new(
            [(x0, 0.0), (x0 + bw * 0.9, v)],
            RESERVATION.filled(),
        )))?;
    }
    for (k, p) in summary.policies.iter().enumerate() {
        let h = &p.hosts[i];
        let mean = h.periods.iter().sum::<u64>() as f64 / h.periods.len().max(1) as f64;
        let lo = per(h.periods.iter().copied().min().unwrap_or(0));
        let hi = per(h.periods.iter().copied().max().unwrap_or(0));
        let xa = x0 + bw * (k + 1) as f64;
        let color = PALETTE[k % PALETTE.len()];
        chart.draw_series(std::iter::once(Rectangle::new(
            [(xa, 0.0), (xa + bw * 0.9, mean)],
            color.filled(),
        )))?;
        let xm = xa + bw * 0.45;
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(xm, lo), (xm, hi)],
            BLACK.stroke_width(1),
        )))?;
    }
    Ok(())
}

/// The legend of [`bars`]: the reservation, then each series.
fn bars_legend<'a, 'b: 'a>(chart: &mut BarChart<'a, 'b>, series: &[String]) -> DrawResult {
    chart
        .draw_series(std::iter::once(Rectangle::new(
            [(0.0, 0.0), (0.0, 0.0)],
            RESERVATION.filled(),
        )))?
        .label("reservation")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], RESERVATION.filled()));
    for (k, name) in series.iter().enumerate() {
        let color = PALETTE[k % PALETTE.len()];
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(0.0, 0.0), (0.0, 0.0)],
                color.filled(),
            )))?
            .label(name.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()?;
    Ok(())
}

fn line_chart(
    area: &Area<'_>,
    caption: &str,
    series: &[(String, Vec<f64>, RGBColor)],
    reference: Option<f64>,
    text: bool,
) -> DrawResult {
    let len = series.iter().map(|s| s.1.len()).max().unwrap_or(1).max(1);
    let mut ymax = reference.unwrap_or(0.0);
    for s in series {
        for v in &s.1 {
            ymax = ymax.max(*v);
        }
    }
    let ymax = (ymax * 1.15).max(1.0);
    let mut b = ChartBuilder::on(area);
    b.margin(12)
        .x_label_area_size(if text { 35 } else { 0 })
        .y_label_area_size(if text { 80 } else { 0 });
    if text {
        b.caption(caption, ("sans-serif", 18));
    }
    let mut chart = b.build_cartesian_2d(0f64..len as f64, 0f64..ymax)?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("period")
            .y_label_formatter(&|v| format!("{:.0}K", v / 1000.0));
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw()?;
    if let Some(r) = reference {
        let s = chart.draw_series(std::iter::once(PathElement::new(
            vec![(0.0, r), (len as f64, r)],
            RESERVATION.stroke_width(2),
        )))?;
        if text {
            s.label("reservation").legend(|(x, y)| {
                PathElement::new(vec![(x, y), (x + 15, y)], RESERVATION.stroke_width(2))
            });
        }
    }
    for (name, values, color) in series {
        let color = *color;
        let s = chart.draw_series(LineSeries::new(
            values.iter().enumerate().map(|(i, v)| (i as f64 + 0.5, *v)),
            color.stroke_width(2),
        ))?;
        if text {
            s.label(name.clone()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 15, y)], color.stroke_width(2))
            });
        }
    }
    if text {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 12))
            .draw()?;
    }
    Ok(())
}

fn totals(summary: &Summary, names: &[String], area: &Area<'_>, text: bool) -> DrawResult {
    let series: Vec<(String, Vec<f64>, RGBColor)> = summary
        .policies
        .iter()
        .enumerate()
        .map(|(k, p)| {
            let len = p.hosts.first().map_or(0, |h| h.periods.len());
            let values = (0..len)
                .map(|i| p.hosts.iter().map(|h| h.periods[i] as f64).sum())
                .collect();
            (names[k].clone(), values, PALETTE[k % PALETTE.len()])
        })
        .collect();
    line_chart(area, "total completed I/O per period", &series, None, text)
}

fn top_host(
    summary: &Summary,
    names: &[String],
    period_s: f64,
    area: &Area<'_>,
    text: bool,
) -> DrawResult {
    let Some(first) = summary.policies.first() else {
        return Ok(());
    };
    let idx = first
        .hosts
        .iter()
        .enumerate()
        .max_by_key(|(i, h)| (h.reservation_iops.unwrap_or(0), std::cmp::Reverse(*i)))
        .map_or(0, |(i, _)| i);
    let host = &first.hosts[idx];
    let series: Vec<(String, Vec<f64>, RGBColor)> = summary
        .policies
        .iter()
        .enumerate()
        .map(|(k, p)| {
            let v = p.hosts[idx].periods.iter().map(|&c| c as f64).collect();
            (names[k].clone(), v, PALETTE[k % PALETTE.len()])
        })
        .collect();
    line_chart(
        area,
        &format!("{} (largest reservation): I/O per period", host.host),
        &series,
        host.reservation_iops.map(|r| r as f64 * period_s),
        text,
    )
}
