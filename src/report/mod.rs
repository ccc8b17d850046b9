//! Reports of measured matrices (`chd report`, and the end of `chd probe --out`): from a run
//! directory or a ClusterHealthDetect recording to `summary.md`, `cells.csv`, one heatmap
//! picture per matrix (`h2d_<size>.png`, `pair_<a>-<b>_<size>.png`, `p2p_<size>.png`),
//! `p2p.csv` for peer copy runs, `basics.csv` for a basics run, and `report.xlsx`; plus the
//! SVG heatmaps `chd serve` shows at `/matrix`. A sweep run's size curves get `sweep.csv`,
//! `sweep.png` and a section of `summary.md` instead of heatmaps.
//!
//! Everything is made from the neutral [`dataset::Dataset`]; [`crate::analysis`] computes
//! (on [`crate::dataset::cells::cells`]), the other modules only render.

pub mod basics;
pub mod csv;
pub mod fabric;
pub mod heatmap;
pub mod png;
pub mod stdout;
pub mod summary;
pub mod summary_d2d;
pub mod svg;
pub mod sweep;
pub mod sweep_png;
pub mod xlsx;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::dataset::LoadError;
use crate::dataset::{self, Dataset};
use crate::probe::kind::Layout;
use heatmap::Heatmap;

/// The report's files.
pub const SUMMARY_FILE: &str = "summary.md";
pub const CSV_FILE: &str = "cells.csv";
pub const XLSX_FILE: &str = "report.xlsx";
/// The peer copy pairs of a p2p run, with their path class, method and class median.
pub const P2P_CSV_FILE: &str = "p2p.csv";

/// Why a report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Draw(#[from] png::DrawError),
    #[error("writing {path}: {detail}")]
    Xlsx { path: PathBuf, detail: String },
}

/// The heatmaps of `ds`, each with its file-name stem.
pub fn heatmaps(ds: &Dataset) -> Vec<(String, Heatmap, dataset::MatrixId)> {
    let numa = ds.numa_map();
    ds.matrices()
        .into_iter()
        .filter_map(|(id, cells)| {
            let title = Dataset::matrix_title(id);
            let (cells, axes) = (dataset::cells::cells(&cells), Default::default());
            let map = match crate::probe::kinds::of(id.kind).layout() {
                Layout::CpuByDevice => Heatmap::h2d(title, &cells, &numa, &axes),
                Layout::CpuPairs => Heatmap::pair(title, &cells, &numa, &axes),
                Layout::SourceByDestination => Heatmap::p2p(title, &cells, &[]),
                Layout::Curves | Layout::Table => return None,
                // One value per device: a table in summary.md, no heatmap.
                Layout::Devices => return None,
            };
            Some((ds.matrix_name(id), map, id.clone()))
        })
        .collect()
}

/// What [`write()`] produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    pub files: Vec<PathBuf>,
    pub findings: Vec<String>,
}

fn save(path: PathBuf, text: &str) -> Result<PathBuf, ReportError> {
    std::fs::write(&path, text).map_err(|source| ReportError::Write {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// Write every report file for `ds` into `out` (created if missing).
pub fn write(ds: &Dataset, out: &Path) -> Result<Written, ReportError> {
    std::fs::create_dir_all(out).map_err(|source| ReportError::Write {
        path: out.into(),
        source,
    })?;
    let mut files = Vec::new();
    let maps = heatmaps(ds);
    let mut pictures = BTreeMap::new();
    for (name, map, id) in &maps {
        let path = out.join(format!("{name}.png"));
        png::write(map, &path)?;
        pictures.insert(id.clone(), format!("{name}.png"));
        files.push(path);
    }
    files.push(save(out.join(CSV_FILE), &csv::render(ds))?);
    if let Some(text) = basics::csv(ds) {
        files.push(save(out.join(basics::CSV_FILE), &text)?);
    }
    let curves = sweep::curves(ds);
    if !curves.is_empty() {
        files.push(save(
            out.join(sweep::SWEEP_CSV),
            &sweep::render_csv(&curves),
        )?);
        let path = out.join(sweep::SWEEP_PNG);
        let host = ds
            .meta
            .iter()
            .find(|(k, _)| k == "host")
            .map(|(_, v)| v.as_str());
        let title = match host {
            Some(h) => format!("Size curves, {h}"),
            None => "Size curves".to_string(),
        };
        sweep_png::write(&curves, &title, &path)?;
        files.push(path);
    }
    if let Some(text) = csv::render_p2p(ds) {
        files.push(save(out.join(P2P_CSV_FILE), &text)?);
    }
    files.push(save(
        out.join(SUMMARY_FILE),
        &summary::render(ds, &pictures),
    )?);
    let findings = summary::findings(ds);
    let xlsx_path = out.join(XLSX_FILE);
    let sheets: Vec<(String, Heatmap)> = maps.into_iter().map(|(n, m, _)| (n, m)).collect();
    xlsx::write(ds, &sheets, &findings, &xlsx_path).map_err(|e| ReportError::Xlsx {
        path: xlsx_path.clone(),
        detail: e.to_string(),
    })?;
    files.push(xlsx_path);
    Ok(Written { files, findings })
}
