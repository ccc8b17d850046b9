//! `sweep.png`: the size curves as a line chart, GB/s (decimal) over a log2 size axis, one
//! colour per (operation, device), dips ringed in red, each curve's plateau marked with a
//! bar on its first point; curves the backend cannot measure are named under the chart
//! instead of drawn. Drawn with plotters' bitmap backend and the report's embedded font.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::png::{register_font, DrawError, FAMILY};
use crate::analysis::heatmap::{nice_ceiling, ticks};
use crate::analysis::sweep::Curve;
use crate::dataset::size_label;

const WIDTH: u32 = 1100;
const HEIGHT: u32 = 640;
const LEFT: i32 = 80;
const TOP: i32 = 70;
const PLOT_W: i32 = 740;
const PLOT_H: i32 = 460;

/// Curve colours, cycled.
const PALETTE: [(u8, u8, u8); 10] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
    (0, 0, 0),
];

/// Draw `curves` to `path` (PNG).
pub fn write(curves: &[Curve], title: &str, path: &Path) -> Result<(), DrawError> {
    let fail = |detail: String| DrawError {
        path: path.display().to_string(),
        detail,
    };
    register_font().map_err(fail)?;
    draw(curves, title, path).map_err(|e| fail(e.to_string()))
}

/// log2 of the smallest and the largest size of any point (equal when there is one size).
fn size_range(curves: &[Curve]) -> Option<(f64, f64)> {
    let sizes = curves
        .iter()
        .flat_map(|c| c.points.iter().map(|p| (p.size_bytes as f64).log2()));
    sizes.fold(None, |r, s| match r {
        None => Some((s, s)),
        Some((lo, hi)) => Some((lo.min(s), hi.max(s))),
    })
}

fn draw(curves: &[Curve], title: &str, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let text = |size: u32| (FAMILY, size).into_font().color(&BLACK);
    root.draw_text(title, &text(18), (10, 8))?;
    root.draw_text(
        "GB/s (decimal, median of the samples) over the transfer size (log2 axis); red ring: dip; bar: plateau starts",
        &text(12),
        (10, 34),
    )?;
    let drawn: Vec<&Curve> = curves
        .iter()
        .filter(|c| c.points.iter().any(|p| p.median.is_some()))
        .collect();
    let top_value = drawn
        .iter()
        .flat_map(|c| c.points.iter().filter_map(|p| p.median))
        .fold(0.0f64, f64::max)
        / 1e9;
    let y_max = nice_ceiling(top_value * 1.05);
    let (lo, hi) = size_range(curves).unwrap_or((0.0, 1.0));
    let span = (hi - lo).max(1.0);
    let x_of = |size: u64| LEFT + (((size as f64).log2() - lo) / span * f64::from(PLOT_W)) as i32;
    let y_of = |bps: f64| TOP + PLOT_H - ((bps / 1e9) / y_max * f64::from(PLOT_H)) as i32;

    // Axes, grid and labels.
    root.draw(&Rectangle::new(
        [(LEFT, TOP), (LEFT + PLOT_W, TOP + PLOT_H)],
        BLACK.stroke_width(1),
    ))?;
    let grey = RGBColor(225, 225, 225);
    for t in ticks(y_max) {
        let y = TOP + PLOT_H - (t / y_max * f64::from(PLOT_H)) as i32;
        root.draw(&PathElement::new(vec![(LEFT, y), (LEFT + PLOT_W, y)], grey))?;
        let label = if y_max >= 10.0 {
            format!("{t:.0}")
        } else {
            format!("{t:.1}")
        };
        root.draw_text(
            &label,
            &text(12).pos(Pos::new(HPos::Right, VPos::Center)),
            (LEFT - 6, y),
        )?;
    }
    root.draw_text(
        "GB/s",
        &text(13).pos(Pos::new(HPos::Left, VPos::Bottom)),
        (LEFT - 40, TOP - 8),
    )?;
    let mut sizes: Vec<u64> = curves
        .iter()
        .flat_map(|c| c.points.iter().map(|p| p.size_bytes))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let step = sizes.len().div_ceil(16).max(1);
    for size in sizes.iter().step_by(step) {
        let x = x_of(*size);
        root.draw(&PathElement::new(vec![(x, TOP), (x, TOP + PLOT_H)], grey))?;
        root.draw_text(
            &size_label(*size),
            &text(11).pos(Pos::new(HPos::Center, VPos::Top)),
            (x, TOP + PLOT_H + 6),
        )?;
    }
    root.draw_text(
        "transfer size (bytes per rank for allgather)",
        &text(12).pos(Pos::new(HPos::Center, VPos::Top)),
        (LEFT + PLOT_W / 2, TOP + PLOT_H + 26),
    )?;
    if drawn.is_empty() {
        root.draw_text(
            "no point was measured",
            &text(16).pos(Pos::new(HPos::Center, VPos::Center)),
            (LEFT + PLOT_W / 2, TOP + PLOT_H / 2),
        )?;
    }

    // Curves: a line through consecutive measured points (broken at failed ones), a dot on
    // each, a red ring on a dip, a bar on the plateau's first point.
    let red = RGBColor(214, 39, 40);
    for (i, c) in drawn.iter().enumerate() {
        let (r, g, b) = PALETTE[i % PALETTE.len()];
        let colour = RGBColor(r, g, b);
        let mut run: Vec<(i32, i32)> = Vec::new();
        for p in &c.points {
            match p.median {
                Some(v) => run.push((x_of(p.size_bytes), y_of(v))),
                None => {
                    if run.len() > 1 {
                        root.draw(&PathElement::new(run.clone(), colour.stroke_width(2)))?;
                    }
                    run.clear();
                }
            }
        }
        if run.len() > 1 {
            root.draw(&PathElement::new(run, colour.stroke_width(2)))?;
        }
        for p in &c.points {
            let Some(v) = p.median else { continue };
            let at = (x_of(p.size_bytes), y_of(v));
            root.draw(&Circle::new(at, 3, colour.filled()))?;
            if p.dip {
                root.draw(&Circle::new(at, 8, red.stroke_width(2)))?;
            }
            if c.plateau == Some(p.size_bytes) {
                root.draw(&Rectangle::new(
                    [(at.0 - 1, at.1 - 12), (at.0 + 1, at.1 + 12)],
                    colour.filled(),
                ))?;
            }
        }
        // Legend.
        let y = TOP + 8 + i as i32 * 18;
        let x = LEFT + PLOT_W + 20;
        if y < TOP + PLOT_H + 40 {
            root.draw(&PathElement::new(
                vec![(x, y), (x + 24, y)],
                colour.stroke_width(2),
            ))?;
            root.draw_text(
                &format!("{} {}", c.op, c.label()),
                &text(12).pos(Pos::new(HPos::Left, VPos::Center)),
                (x + 30, y),
            )?;
        }
    }
    let missing: Vec<String> = curves
        .iter()
        .filter(|c| !c.points.iter().any(|p| p.median.is_some()))
        .map(|c| {
            format!(
                "{} {} ({})",
                c.op,
                c.label(),
                if c.unsupported() {
                    "not supported"
                } else {
                    "failed"
                }
            )
        })
        .collect();
    if !missing.is_empty() {
        let mut line = format!("not drawn: {}", missing.join(", "));
        if line.len() > 170 {
            line.truncate(167);
            line.push_str("...");
        }
        root.draw_text(&line, &text(12), (10, HEIGHT as i32 - 22))?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::sweep::{curves, PointInput};

    #[test]
    fn a_chart_is_a_png_even_with_nothing_measured() {
        let dir = tempfile::tempdir().unwrap();
        let samples = [1e9, 2e9];
        let errors = vec!["not supported: no".to_string()];
        let points: Vec<PointInput> = (0..4)
            .flat_map(|i| {
                [
                    PointInput {
                        op: "h2d",
                        device: "0",
                        setting: "idle",
                        size_bytes: 1 << (17 + i),
                        samples: &samples,
                        errors: &[],
                    },
                    PointInput {
                        op: "d2d",
                        device: "0",
                        setting: "idle",
                        size_bytes: 1 << (17 + i),
                        samples: &[],
                        errors: &errors,
                    },
                ]
            })
            .collect();
        let path = dir.path().join("sweep.png");
        write(&curves(&points), "Size curves", &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        let empty = dir.path().join("empty.png");
        write(&[], "Size curves", &empty).unwrap();
        assert_eq!(&std::fs::read(&empty).unwrap()[..4], b"\x89PNG");
    }
}
