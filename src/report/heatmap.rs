//! The colour scale every heatmap renderer shares (PNG, SVG, workbook): viridis from 0 to
//! the map's rounded maximum (dark = slow, yellow = fast), failed cells red, unmeasured grey.
//! The heatmap model itself is [`crate::analysis::heatmap`].

use crate::analysis::heatmap::HeatCell;
/// The model, where the report's renderers have always found it.
pub use crate::analysis::heatmap::Heatmap;

/// Viridis, sampled at 9 points.
const VIRIDIS: [(u8, u8, u8); 9] = [
    (68, 1, 84),
    (71, 44, 122),
    (59, 81, 139),
    (44, 113, 142),
    (33, 144, 141),
    (39, 173, 129),
    (92, 200, 99),
    (170, 220, 50),
    (253, 231, 37),
];

/// Failed cells.
pub const FAILED: (u8, u8, u8) = (215, 25, 28);
/// Unmeasured cells.
pub const EMPTY: (u8, u8, u8) = (225, 225, 225);

/// Colour of `gbps` on a scale from 0 to `max`.
pub fn colour(gbps: f64, max: f64) -> (u8, u8, u8) {
    let t = if max > 0.0 {
        (gbps / max).clamp(0.0, 1.0)
    } else {
        0.0
    };
    let pos = t * (VIRIDIS.len() - 1) as f64;
    let i = (pos.floor() as usize).min(VIRIDIS.len() - 2);
    let f = pos - i as f64;
    let mix = |a: u8, b: u8| (f64::from(a) + (f64::from(b) - f64::from(a)) * f).round() as u8;
    let (a, b) = (VIRIDIS[i], VIRIDIS[i + 1]);
    (mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

/// Colour of a cell.
pub fn cell_colour(cell: &HeatCell, max: f64) -> (u8, u8, u8) {
    match cell {
        HeatCell::Value { gbps, .. } => colour(*gbps, max),
        HeatCell::Failed { .. } => FAILED,
        HeatCell::Empty => EMPTY,
    }
}

/// `#rrggbb`.
pub fn hex((r, g, b): (u8, u8, u8)) -> String {
    format!("#{r:02x}{g:02x}{b:02x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colours_run_dark_to_yellow() {
        assert_eq!(colour(0.0, 10.0), VIRIDIS[0]);
        assert_eq!(colour(10.0, 10.0), VIRIDIS[8]);
        assert_eq!(colour(99.0, 10.0), VIRIDIS[8]);
        assert_eq!(hex(colour(5.0, 10.0)), "#21908d");
    }
}
