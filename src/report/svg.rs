//! Heatmaps as SVG inside a plain HTML page (no JavaScript): what `chd serve` shows at
//! `/matrix`. Every measured cell is one `<rect class="cell">` with a `<title>` tooltip
//! (hover shows CPU, NUMA node, device, GB/s and sample count); cells whose attempts all
//! failed are `<rect class="failed">`; unmeasured cells are left out. Same colour scale as the
//! PNG pictures.

use std::fmt::Write;

use super::heatmap::{self, cell_colour, colour, hex};
use crate::analysis::heatmap::{ticks, Axes, HeatCell, Heatmap};
use crate::analysis::{link, live, H2dMatrix};
use crate::runtime::DeviceInfo;
use crate::store::Store;
use crate::topology::Topology;

/// Escape text for XML/HTML content and attributes.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// One heatmap as an `<svg>` element.
pub fn heatmap_svg(map: &Heatmap) -> String {
    let rows = map.rows.len().max(1) as u32;
    let cols = map.cols.len().max(1) as u32;
    let cw = (900 / cols).clamp(2, 60);
    let rh = (1200 / rows).clamp(2, 20);
    let (left, top) = (70u32, 40u32);
    let (pw, ph) = (cw * cols, rh * rows);
    let width = left + pw + 190;
    let height = top + ph.max(220) + 50;
    let mut s = String::with_capacity(map.cells.len() * 160 + 4096);
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" class="heatmap" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11" data-rows="{}" data-cols="{}" data-measured="{}">"#,
        map.rows.len(),
        map.cols.len(),
        map.measured()
    );
    let _ = write!(s, "<title>{}</title>", escape(&map.title));
    let _ = write!(
        s,
        r##"<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="{}" stroke="#000"/>"##,
        hex(heatmap::EMPTY)
    );
    s.push_str(r#"<g class="cells">"#);
    for r in 0..map.rows.len() {
        for c in 0..map.cols.len() {
            let cell = map.get(r, c);
            let class = match cell {
                HeatCell::Value { .. } => "cell",
                HeatCell::Failed { .. } => "failed",
                HeatCell::Empty => continue,
            };
            let gbps = match cell {
                HeatCell::Value { gbps, .. } => format!(r#" data-gbps="{gbps:.3}""#),
                _ => String::new(),
            };
            let _ = write!(
                s,
                r#"<rect class="{class}" x="{}" y="{}" width="{cw}" height="{rh}" fill="{}" data-row="{}" data-col="{}"{gbps}><title>{}</title></rect>"#,
                left + c as u32 * cw,
                top + r as u32 * rh,
                hex(cell_colour(cell, map.max)),
                escape(&map.rows[r]),
                escape(&map.cols[c]),
                escape(&map.describe(r, c)),
            );
        }
    }
    s.push_str("</g>");
    // Labels.
    let col_step = super::png::label_step(cw, 30);
    for (c, label) in map.cols.iter().enumerate().step_by(col_step) {
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            left + c as u32 * cw + cw / 2,
            top - 5,
            escape(label)
        );
    }
    let _ = write!(
        s,
        r#"<text x="{left}" y="{}">{} &#8594;</text>"#,
        top - 22,
        escape(&map.col_word)
    );
    let row_step = super::png::label_step(rh, 13);
    for (r, label) in map.rows.iter().enumerate().step_by(row_step) {
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="end" dominant-baseline="middle">{}</text>"#,
            left - 4,
            top + r as u32 * rh + rh / 2,
            escape(label)
        );
    }
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="end">{} &#8595;</text>"#,
        left - 4,
        top - 5,
        escape(&map.row_word)
    );
    for g in &map.row_groups {
        let (y0, y1) = (top + g.start as u32 * rh, top + g.end as u32 * rh);
        if g.start > 0 {
            let _ = write!(
                s,
                r##"<line class="numa-boundary" x1="{}" x2="{}" y1="{y0}" y2="{y0}" stroke="#000" stroke-width="2"/>"##,
                left - 8,
                left + pw + 6
            );
        }
        let _ = write!(
            s,
            r#"<text class="numa-label" x="{}" y="{}" dominant-baseline="middle">{}</text>"#,
            left + pw + 8,
            (y0 + y1) / 2,
            escape(&g.label)
        );
    }
    for g in &map.col_groups {
        let x0 = left + g.start as u32 * cw;
        if g.start > 0 {
            let _ = write!(
                s,
                r##"<line class="numa-boundary" x1="{x0}" x2="{x0}" y1="{}" y2="{}" stroke="#000" stroke-width="2"/>"##,
                top - 8,
                top + ph + 6
            );
        }
    }
    // Legend: a vertical gradient from max (top) to 0.
    let lx = left + pw + 80;
    let lh = ph.clamp(200, 400);
    s.push_str(r#"<defs><linearGradient id="scale" x1="0" y1="1" x2="0" y2="0">"#);
    for i in 0..=8 {
        let t = f64::from(i) / 8.0;
        let _ = write!(
            s,
            r#"<stop offset="{t:.3}" stop-color="{}"/>"#,
            hex(colour(t * map.max, map.max))
        );
    }
    s.push_str("</linearGradient></defs>");
    let _ = write!(
        s,
        r##"<g class="legend"><text x="{lx}" y="{}">GB/s</text><rect x="{lx}" y="{top}" width="16" height="{lh}" fill="url(#scale)" stroke="#000"/>"##,
        top - 14
    );
    for t in ticks(map.max) {
        let y = top as f64 + (1.0 - t / map.max) * f64::from(lh);
        let _ = write!(
            s,
            r#"<text x="{}" y="{y:.1}" dominant-baseline="middle">{}</text>"#,
            lx + 20,
            if map.max >= 10.0 {
                format!("{t:.0}")
            } else {
                format!("{t:.1}")
            }
        );
    }
    for (i, (swatch, label)) in [
        (heatmap::FAILED, "failed"),
        (heatmap::EMPTY, "not measured"),
    ]
    .into_iter()
    .enumerate()
    {
        let y = top + lh + 12 + i as u32 * 18;
        let _ = write!(
            s,
            r##"<rect x="{lx}" y="{y}" width="16" height="12" fill="{}" stroke="#000"/><text x="{}" y="{}">{label}</text>"##,
            hex(swatch),
            lx + 22,
            y + 10
        );
    }
    s.push_str("</g></svg>");
    s
}

/// A whole HTML page: a heading, a note, and one section per heatmap.
pub fn html_page(title: &str, note_html: &str, maps: &[Heatmap]) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{t}</title>\
         <style>body{{font-family:sans-serif;margin:1em 2em}} h2{{font-size:1.1em;margin-top:2em}} \
         rect.cell:hover,rect.failed:hover{{stroke:#f0f;stroke-width:2}} \
         table{{border-collapse:collapse}} td,th{{border:1px solid #ccc;padding:2px 6px}}</style>\
         </head><body>\n<h1>{t}</h1>\n{note_html}\n",
        t = escape(title)
    );
    if maps.is_empty() {
        s.push_str("<p class=\"empty\">No cells measured yet.</p>\n");
    }
    for map in maps {
        let _ = write!(
            s,
            "<section class=\"matrix\"><h2>{}</h2>\n<p>{} of {} cells measured; hover a cell for its value.</p>\n{}\n</section>\n",
            escape(&map.title),
            map.measured(),
            map.cells.len(),
            heatmap_svg(map)
        );
    }
    s.push_str("<p><a href=\"/\">index</a> &middot; <a href=\"/metrics\">/metrics</a></p>\n</body></html>\n");
    s
}

/// The matrices of `store` as heatmaps: the core x device matrix per size and direction (rows
/// every allowed CPU and any CPU with a cell, by NUMA node; columns the devices, then any
/// other device with a cell), then each device pair's rank 0 CPU x rank 1 CPU matrix (block
/// medians beyond [`MAX_PAGE_CELLS`] cells).
pub fn store_heatmaps(store: &Store, topology: &Topology, devices: &[DeviceInfo]) -> Vec<Heatmap> {
    let numa = live::numa_map(topology);
    let axes = Axes {
        cpus: topology.allowed_cpus().map(|c| c.id).collect(),
        devices: devices.iter().map(|d| d.id.clone()).collect(),
    };
    let mut maps = Vec::new();
    for ((size, direction), cells) in live::by_matrix(&live::h2d_cells(store)) {
        let title = format!(
            "H2D {} {}",
            crate::dataset::size_label(size),
            direction.as_str()
        );
        maps.push(Heatmap::h2d(title, &cells, &numa, &axes));
    }
    for (pair, cells) in live::pair_cells(store) {
        let map = Heatmap::pair(format!("Pair {pair}"), &cells, &numa, &axes);
        maps.push(map.downsample(MAX_PAGE_CELLS));
    }
    maps
}

/// Each device column of `store` over the link its device was last probed with.
fn store_link_efficiencies(store: &Store, topology: &Topology) -> Vec<link::LinkEfficiency> {
    let numa = live::numa_map(topology);
    let cells = live::h2d_cells(store);
    let matrices = live::by_matrix(&cells)
        .into_iter()
        .map(|(key, cells)| (key, H2dMatrix::of(&cells, &numa)))
        .collect();
    link::link_efficiencies(&matrices, &store.link_by_device())
}

/// Cells per heatmap on a page; bigger pair matrices are shown as block medians.
pub const MAX_PAGE_CELLS: usize = 40_000;

/// The `/matrix` page of `chd serve`: the live core x device heatmaps of `store` and its
/// core-pair matrices (block medians beyond [`MAX_PAGE_CELLS`] cells).
pub fn matrix_page(store: &Store, topology: &Topology, devices: &[DeviceInfo]) -> String {
    let mut note = String::from("<p>Core x device copy matrix as measured so far: colour = median GB/s (decimal) of a cell's recent samples; rows are CPUs grouped by NUMA node.</p>\n");
    if !devices.is_empty() {
        let efficiencies = store_link_efficiencies(store, topology);
        note.push_str("<table class=\"devices\"><tr><th>device</th><th>kind</th><th>name</th><th>PCI</th><th>NUMA node</th><th>PCIe link (while probed)</th><th>median / link</th></tr>");
        for d in devices {
            let _ = write!(
                note,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&d.id),
                escape(&d.kind),
                escape(&d.name),
                escape(&d.pci_bus_id),
                d.numa_node
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| "-".into()),
                store
                    .links()
                    .get(&d.id)
                    .map(|seen| seen.link.describe())
                    .unwrap_or_else(|| "-".into()),
                link::headline(&efficiencies, &d.id)
                    .map(|e| format!(
                        "{:.2} ({} {})",
                        e.ratio,
                        crate::dataset::size_label(e.size_bytes),
                        e.direction.as_str()
                    ))
                    .unwrap_or_else(|| "-".into()),
            );
        }
        note.push_str("</table>\n");
    }
    if store.pairs().keys().next().is_some() {
        note.push_str("<p>Core-pair matrices: rows are rank 0's CPU, columns rank 1's; matrices over 40,000 cells are drawn as the medians of square blocks of CPUs.</p>\n");
    }
    html_page(
        "chd matrix",
        &note,
        &store_heatmaps(store, topology, devices),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rect_per_measured_cell_with_a_tooltip() {
        let mut map = Heatmap::new(
            "t <1>".into(),
            "CPU",
            "device",
            vec!["0".into(), "1".into()],
            vec!["a".into(), "b".into()],
        );
        map.cells[0] = HeatCell::Value {
            gbps: 58.9,
            samples: 3,
        };
        map.cells[3] = HeatCell::Failed {
            error: "copy \"x\"".into(),
        };
        map.rescale();
        let svg = heatmap_svg(&map);
        assert_eq!(svg.matches("<rect class=\"cell\"").count(), 1);
        assert_eq!(svg.matches("<rect class=\"failed\"").count(), 1);
        assert!(
            svg.contains("<title>CPU 0 \u{2192} device a: 58.90 GB/s, median of 3 samples</title>"),
            "{svg}"
        );
        assert!(svg.contains("t &lt;1&gt;"));
        assert!(svg.contains("copy &quot;x&quot;"));
    }
}
