//! Heatmap pictures (PNG) with plotters' bitmap backend. Text is drawn with an embedded
//! DejaVu Sans (`font/`, Bitstream Vera licence) through plotters' `ab_glyph` feature, so no
//! system font or fontconfig is needed. Cells scale with the matrix: a 640-CPU x 16-device
//! matrix gets 2-pixel rows with a CPU label every few rows, NUMA boundaries drawn as lines
//! and labelled on the right, and a colour bar in GB/s with swatches for failed and
//! unmeasured cells.

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontStyle;

use super::heatmap::{cell_colour, colour, EMPTY, FAILED};
use crate::analysis::heatmap::{ticks, Heatmap};

const FONT: &[u8] = include_bytes!("font/DejaVuSans.ttf");
pub(super) const FAMILY: &str = "sans-serif";

/// Why a picture could not be drawn.
#[derive(Debug, thiserror::Error)]
#[error("drawing {path}: {detail}")]
pub struct DrawError {
    pub path: String,
    pub detail: String,
}

pub(super) fn register_font() -> Result<(), String> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            plotters::style::register_font(FAMILY, FontStyle::Normal, FONT)
                .map_err(|_| "the embedded font does not parse".to_string())
        })
        .clone()
}

/// Pixel layout of one picture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub cell_w: u32,
    pub cell_h: u32,
    pub left: u32,
    pub top: u32,
    pub plot_w: u32,
    pub plot_h: u32,
    pub width: u32,
    pub height: u32,
}

impl Layout {
    /// Cells as large as fit in about 1000 x 1300 pixels, at least 1 pixel.
    pub fn of(rows: usize, cols: usize) -> Layout {
        let rows = rows.max(1) as u32;
        let cols = cols.max(1) as u32;
        let cell_w = (1000 / cols).clamp(1, 90);
        let cell_h = (1300 / rows).clamp(1, 28).max((240 / rows).min(40));
        let (left, top) = (90, 96);
        let plot_w = cell_w * cols;
        let plot_h = cell_h * rows;
        Layout {
            cell_w,
            cell_h,
            left,
            top,
            plot_w,
            plot_h,
            width: (left + plot_w + 230).max(560),
            height: (top + plot_h + 40).max(top + 330),
        }
    }
}

fn rgb((r, g, b): (u8, u8, u8)) -> RGBColor {
    RGBColor(r, g, b)
}

/// Label every `step`-th row or column, `step` a round number (1, 2, 5, 10, 20, 50, ...)
/// that puts labels at least `min_px` apart.
pub fn label_step(px_per_item: u32, min_px: u32) -> usize {
    let need = min_px.div_ceil(px_per_item.max(1)).max(1) as usize;
    let mut base = 1;
    loop {
        for m in [1, 2, 5] {
            if m * base >= need {
                return m * base;
            }
        }
        base *= 10;
    }
}

/// Draw `map` to `path` (PNG).
pub fn write(map: &Heatmap, path: &Path) -> Result<(), DrawError> {
    let fail = |detail: String| DrawError {
        path: path.display().to_string(),
        detail,
    };
    register_font().map_err(fail)?;
    draw(map, path).map_err(|e| fail(e.to_string()))
}

fn draw(map: &Heatmap, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let l = Layout::of(map.rows.len(), map.cols.len());
    let root = BitMapBackend::new(path, (l.width, l.height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, top) = (l.left as i32, l.top as i32);
    let (cw, rh) = (l.cell_w as i32, l.cell_h as i32);
    let text = |size: u32| (FAMILY, size).into_font().color(&BLACK);

    root.draw_text(&map.title, &text(18), (10, 8))?;
    root.draw_text(
        &format!(
            "rows: {}{}, columns: {}; colour: median GB/s (decimal)",
            map.row_word,
            if map.row_groups.is_empty() {
                ""
            } else {
                " (by NUMA node)"
            },
            map.col_word,
        ),
        &text(12),
        (10, 32),
    )?;
    root.draw_text(
        &format!("{} of {} cells measured", map.measured(), map.cells.len()),
        &text(12),
        (10, 48),
    )?;

    // Cells.
    for r in 0..map.rows.len() {
        for c in 0..map.cols.len() {
            let x = left + c as i32 * cw;
            let y = top + r as i32 * rh;
            let col = rgb(cell_colour(map.get(r, c), map.max));
            root.draw(&Rectangle::new([(x, y), (x + cw, y + rh)], col.filled()))?;
        }
    }
    let (plot_right, plot_bottom) = (left + l.plot_w as i32, top + l.plot_h as i32);
    root.draw(&Rectangle::new(
        [(left - 1, top - 1), (plot_right, plot_bottom)],
        BLACK.stroke_width(1),
    ))?;

    // Column labels above the plot, row labels to the left.
    let col_step = label_step(l.cell_w, 34);
    let centre_bottom = Pos::new(HPos::Center, VPos::Bottom);
    for (c, label) in map.cols.iter().enumerate().step_by(col_step) {
        let x = left + c as i32 * cw + cw / 2;
        root.draw_text(label, &text(12).pos(centre_bottom), (x, top - 4))?;
    }
    root.draw_text(
        &format!("{} \u{2192}", map.col_word),
        &text(12).pos(Pos::new(HPos::Left, VPos::Bottom)),
        (left, top - 20),
    )?;
    let row_step = label_step(l.cell_h, 14);
    let right_centre = Pos::new(HPos::Right, VPos::Center);
    for (r, label) in map.rows.iter().enumerate().step_by(row_step) {
        let y = top + r as i32 * rh + rh / 2;
        root.draw_text(label, &text(11).pos(right_centre), (left - 5, y))?;
    }
    root.draw_text(
        &format!("{} \u{2193}", map.row_word),
        &text(12).pos(Pos::new(HPos::Right, VPos::Bottom)),
        (left - 5, top - 4),
    )?;

    // NUMA boundaries and labels.
    let line = if rh >= 6 { 2 } else { 1 };
    for g in &map.row_groups {
        let y0 = top + g.start as i32 * rh;
        let y1 = top + g.end as i32 * rh;
        if g.start > 0 {
            root.draw(&Rectangle::new(
                [
                    (left - 8, y0 - line / 2),
                    (plot_right + 6, y0 - line / 2 + line),
                ],
                BLACK.filled(),
            ))?;
        }
        if y1 - y0 >= 12 {
            root.draw(&Rectangle::new(
                [(plot_right + 6, y0 + 1), (plot_right + 8, y1 - 1)],
                BLACK.filled(),
            ))?;
            root.draw_text(
                &g.label,
                &text(12).pos(Pos::new(HPos::Left, VPos::Center)),
                (plot_right + 12, (y0 + y1) / 2),
            )?;
        }
    }
    for g in &map.col_groups {
        let x0 = left + g.start as i32 * cw;
        if g.start > 0 {
            root.draw(&Rectangle::new(
                [
                    (x0 - line / 2, top - 8),
                    (x0 - line / 2 + line, plot_bottom + 6),
                ],
                BLACK.filled(),
            ))?;
        }
        let x1 = left + g.end as i32 * cw;
        if x1 - x0 >= 60 {
            root.draw_text(
                &g.label,
                &text(12).pos(Pos::new(HPos::Center, VPos::Top)),
                ((x0 + x1) / 2, plot_bottom + 8),
            )?;
        }
    }

    // Colour bar.
    let bar_x = plot_right + 90;
    let bar_h = (l.plot_h as i32).clamp(200, 400);
    root.draw_text(
        "GB/s",
        &text(13).pos(Pos::new(HPos::Left, VPos::Bottom)),
        (bar_x, top - 6),
    )?;
    for i in 0..bar_h {
        let v = map.max * f64::from(bar_h - 1 - i) / f64::from(bar_h - 1);
        root.draw(&Rectangle::new(
            [(bar_x, top + i), (bar_x + 20, top + i + 1)],
            rgb(colour(v, map.max)).filled(),
        ))?;
    }
    root.draw(&Rectangle::new(
        [(bar_x - 1, top - 1), (bar_x + 20, top + bar_h)],
        BLACK.stroke_width(1),
    ))?;
    for t in ticks(map.max) {
        let y = top + ((1.0 - t / map.max) * f64::from(bar_h - 1)).round() as i32;
        root.draw(&Rectangle::new(
            [(bar_x + 20, y), (bar_x + 25, y + 1)],
            BLACK.filled(),
        ))?;
        let label = if map.max >= 10.0 {
            format!("{t:.0}")
        } else {
            format!("{t:.1}")
        };
        root.draw_text(
            &label,
            &text(12).pos(Pos::new(HPos::Left, VPos::Center)),
            (bar_x + 29, y),
        )?;
    }
    for (i, (swatch, label)) in [(FAILED, "failed"), (EMPTY, "not measured")]
        .into_iter()
        .enumerate()
    {
        let y = top + bar_h + 16 + i as i32 * 20;
        root.draw(&Rectangle::new(
            [(bar_x, y), (bar_x + 20, y + 14)],
            rgb(swatch).filled(),
        ))?;
        root.draw(&Rectangle::new(
            [(bar_x, y), (bar_x + 19, y + 13)],
            BLACK.stroke_width(1),
        ))?;
        root.draw_text(
            label,
            &text(12).pos(Pos::new(HPos::Left, VPos::Center)),
            (bar_x + 26, y + 7),
        )?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_fits_640_cpus_and_tiny_matrices() {
        let big = Layout::of(640, 16);
        assert_eq!(big.cell_h, 2);
        assert_eq!(big.plot_h, 1280);
        assert!(big.cell_w >= 50);
        let pair = Layout::of(640, 640);
        assert_eq!((pair.cell_w, pair.cell_h), (1, 2));
        let tiny = Layout::of(2, 1);
        assert!(tiny.plot_h >= 56 && tiny.height >= tiny.top + 330);
        assert_eq!(label_step(2, 14), 10);
        assert_eq!(label_step(1, 34), 50);
        assert_eq!(label_step(28, 14), 1);
    }
}
