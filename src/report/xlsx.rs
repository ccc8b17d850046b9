//! The report as an Excel workbook (rust_xlsxwriter): a `summary` sheet, one sheet per matrix
//! laid out like its picture (rows CPU with their NUMA node, columns device or rank-1 CPU,
//! cells in GB/s with the picture's background colour; failed cells red with the error as
//! text) and a long `cells` sheet with every cell.

use std::collections::HashMap;
use std::path::Path;

use rust_xlsxwriter::{Color, Format, Workbook, Worksheet, XlsxError};

use super::heatmap::cell_colour;
use crate::analysis::heatmap::{HeatCell, Heatmap};
use crate::dataset::{size_label, Dataset};
use crate::probe::kind::Layout;

/// Sheet names: at most 31 characters, none of `[]:*?/\`, unique.
fn sheet_name(wanted: &str, taken: &mut Vec<String>) -> String {
    let clean: String = wanted
        .chars()
        .map(|c| if "[]:*?/\\".contains(c) { '-' } else { c })
        .collect();
    let mut name: String = clean.chars().take(31).collect();
    let mut n = 2;
    while taken.iter().any(|t| t.eq_ignore_ascii_case(&name)) {
        let suffix = format!("~{n}");
        name = clean.chars().take(31 - suffix.len()).collect::<String>() + &suffix;
        n += 1;
    }
    taken.push(name.clone());
    name
}

/// Cell formats by colour, created once each.
#[derive(Default)]
struct Palette(HashMap<(u8, u8, u8), Format>);

impl Palette {
    fn get(&mut self, rgb: (u8, u8, u8)) -> &Format {
        self.0.entry(rgb).or_insert_with(|| {
            let (r, g, b) = rgb;
            let luma = 0.299 * f64::from(r) + 0.587 * f64::from(g) + 0.114 * f64::from(b);
            let text = if luma < 128.0 { 0xFFFFFF } else { 0x000000 };
            Format::new()
                .set_background_color(Color::RGB(
                    (u32::from(r) << 16) | (u32::from(g) << 8) | u32::from(b),
                ))
                .set_font_color(Color::RGB(text))
                .set_num_format("0.00")
        })
    }
}

/// A matrix laid out like its picture, written row by row (the sheet is in constant memory
/// mode: a row is flushed to the temp file once the next begins).
fn matrix_sheet(ws: &mut Worksheet, map: &Heatmap, palette: &mut Palette) -> Result<(), XlsxError> {
    let bold = Format::new().set_bold();
    ws.write_string_with_format(0, 0, &map.title, &bold)?;
    ws.write_string(
        1,
        0,
        format!(
            "GB/s (decimal), median of a cell's samples; colour scale 0 to {} GB/s like the pictures; red = failed",
            map.max
        ),
    )?;
    let header = 3u32;
    ws.set_freeze_panes(header + 1, 2)?;
    let width = if map.cols.len() > 64 { 4.0 } else { 8.0 };
    for c in 0..map.cols.len() {
        ws.set_column_width(2 + c as u16, width)?;
    }
    ws.write_string_with_format(header, 0, &map.row_word, &bold)?;
    ws.write_string_with_format(header, 1, "NUMA", &bold)?;
    for (c, label) in map.cols.iter().enumerate() {
        let col = 2 + c as u16;
        match label.parse::<f64>() {
            Ok(v) => ws.write_number_with_format(header, col, v, &bold)?,
            Err(_) => ws.write_string_with_format(header, col, label, &bold)?,
        };
    }
    let group_of = |r: usize| {
        map.row_groups
            .iter()
            .find(|g| (g.start..g.end).contains(&r))
            .map(|g| g.label.trim_start_matches("NUMA ").to_string())
            .unwrap_or_default()
    };
    for (r, label) in map.rows.iter().enumerate() {
        let row = header + 1 + r as u32;
        match label.parse::<f64>() {
            Ok(v) => ws.write_number(row, 0, v)?,
            Err(_) => ws.write_string(row, 0, label)?,
        };
        let g = group_of(r);
        match g.parse::<f64>() {
            Ok(v) => ws.write_number(row, 1, v)?,
            Err(_) => ws.write_string(row, 1, g)?,
        };
        for c in 0..map.cols.len() {
            let col = 2 + c as u16;
            let cell = map.get(r, c);
            let format = palette.get(cell_colour(cell, map.max));
            match cell {
                HeatCell::Value { gbps, .. } => {
                    ws.write_number_with_format(row, col, *gbps, format)?;
                }
                HeatCell::Failed { error } => {
                    ws.write_string_with_format(row, col, format!("failed: {error}"), format)?;
                }
                HeatCell::Empty => {}
            }
        }
    }
    Ok(())
}

/// Write the workbook for `ds` with one sheet per heatmap in `maps` (with its file-name
/// stem) and the `summary` lines.
pub fn write(
    ds: &Dataset,
    maps: &[(String, Heatmap)],
    summary_lines: &[String],
    path: &Path,
) -> Result<(), XlsxError> {
    let mut wb = Workbook::new();
    let mut taken = Vec::new();
    let mut palette = Palette::default();
    let bold = Format::new().set_bold();
    {
        let ws = wb.add_worksheet();
        ws.set_name(sheet_name("summary", &mut taken))?;
        ws.write_string_with_format(0, 0, "chd calibration report", &bold)?;
        ws.write_string(1, 0, &ds.source)?;
        let mut row = 3u32;
        for (k, v) in &ds.meta {
            ws.write_string_with_format(row, 0, k, &bold)?;
            ws.write_string(row, 1, v)?;
            row += 1;
        }
        row += 1;
        for line in summary_lines {
            ws.write_string(row, 0, line)?;
            row += 1;
        }
        ws.set_column_width(0, 18)?;
        ws.set_column_width(1, 60)?;
    }
    // The matrix and cells sheets can hold hundreds of thousands of cells: they stream to a
    // temp file row by row (rust_xlsxwriter's constant memory mode), in row order.
    for (name, map) in maps {
        let ws = wb.add_worksheet_with_constant_memory();
        ws.set_name(sheet_name(name, &mut taken))?;
        matrix_sheet(ws, map, &mut palette)?;
    }
    {
        let ws = wb.add_worksheet_with_constant_memory();
        ws.set_name(sheet_name("cells", &mut taken))?;
        ws.set_freeze_panes(1, 0)?;
        let numa = ds.numa_map();
        let heads = [
            "matrix",
            "load",
            "cpu",
            "numa_node",
            "peer_cpu",
            "device",
            "size",
            "size_bytes",
            "direction",
            "host_memory",
            "gbps",
            "samples",
            "failed",
            "last_error",
        ];
        for (c, h) in heads.iter().enumerate() {
            ws.write_string_with_format(0, c as u16, *h, &bold)?;
        }
        // Basics cells are not all bandwidths: their own sheet, in their units.
        let matrix_cells = ds
            .cells
            .iter()
            .filter(|c| crate::probe::kinds::layout(c.matrix.kind) != Layout::Table);
        for (i, cell) in matrix_cells.enumerate() {
            let row = 1 + i as u32;
            let m = &cell.matrix;
            ws.write_string(row, 0, m.kind.as_str())?;
            ws.write_string(row, 1, &m.load)?;
            ws.write_number(row, 2, cell.cpu)?;
            if let Some(n) = numa.get(&cell.cpu) {
                ws.write_number(row, 3, *n)?;
            }
            if let Some(p) = cell.peer_cpu {
                ws.write_number(row, 4, p)?;
            }
            ws.write_string(row, 5, &cell.device)?;
            ws.write_string(row, 6, size_label(m.size_bytes))?;
            ws.write_number(row, 7, m.size_bytes as f64)?;
            ws.write_string(row, 8, &m.direction)?;
            ws.write_string(row, 9, &m.host_memory)?;
            if let Some(v) = cell.value() {
                ws.write_number(row, 10, v / 1e9)?;
            }
            ws.write_number(row, 11, cell.samples.len() as f64)?;
            ws.write_number(row, 12, cell.errors.len() as f64)?;
            if let Some(e) = cell.errors.last() {
                ws.write_string(row, 13, e)?;
            }
        }
    }
    if let Some(table) = super::basics::table(ds) {
        let ws = wb.add_worksheet();
        ws.set_name(sheet_name("basics", &mut taken))?;
        let heads = [
            "measurement",
            "unit",
            "load",
            "slowest",
            "slowest device",
            "fastest",
            "fastest device",
            "slowest / fastest",
            "devices",
            "failed",
        ];
        for (c, h) in heads.iter().enumerate() {
            ws.write_string_with_format(0, c as u16, *h, &bold)?;
        }
        let mut row = 1u32;
        for r in &table.rows {
            ws.write_string(row, 0, r.op.title())?;
            ws.write_string(row, 1, r.op.unit())?;
            ws.write_string(row, 2, &r.load)?;
            for (col, d) in [(3u16, &r.min), (5, &r.max)] {
                if let Some(d) = d {
                    ws.write_number(row, col, r.op.scaled(d.value))?;
                    ws.write_string(row, col + 1, &d.device)?;
                }
            }
            if let Some(spread) = r.spread() {
                ws.write_number(row, 7, spread)?;
            }
            ws.write_number(row, 8, r.measured as f64)?;
            let failed: Vec<String> = r
                .failed
                .iter()
                .map(|(d, why)| format!("device {d}: {why}"))
                .collect();
            ws.write_string(row, 9, failed.join("; "))?;
            row += 1;
        }
        for (op, why) in &table.unavailable {
            row += 1;
            ws.write_string(row, 0, format!("not measured: {}", op.title()))?;
            ws.write_string(row, 3, why)?;
        }
        ws.set_column_width(0, 24)?;
    }
    wb.save(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sheet_names_are_legal_and_unique() {
        let mut taken = Vec::new();
        assert_eq!(sheet_name("h2d_64MiB_cpu:4", &mut taken), "h2d_64MiB_cpu-4");
        let long = "x".repeat(40);
        let a = sheet_name(&long, &mut taken);
        let b = sheet_name(&long, &mut taken);
        assert_eq!(a.len(), 31);
        assert_eq!(b.len(), 31);
        assert!(b.ends_with("~2"));
    }
}
