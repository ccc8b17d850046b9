//! Reports of measured matrices (`chd report`, and the end of `chd probe --out`): from a run
//! directory or a ClusterHealthDetect recording to `summary.md`, `cells.csv`, one heatmap
//! picture per matrix (`h2d_<size>.png`, `pair_<a>-<b>_<size>.png`, `p2p_<size>.png`),
//! `p2p.csv` for peer copy runs, `basics.csv` for a basics run, and `report.xlsx`; plus the
//! SVG heatmaps `chd serve` shows at `/matrix`. A sweep run's size curves get `sweep.csv`,
//! `sweep.png` and a section of `summary.md` instead of heatmaps.
//!
//! Everything is made from the neutral [`dataset::Dataset`]; [`crate::analysis`] computes
//! (on [`analysis::cells`]), the other modules only render.

pub mod analysis;
pub mod basics;
pub mod csv;
pub mod dataset;
pub mod heatmap;
pub mod png;
pub mod stdout;
pub mod summary;
pub mod summary_d2d;
pub mod svg;
pub mod sweep;
pub mod sweep_png;
pub mod timing;
pub mod xlsx;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::format::affinity_file::{self, AffinityFileError, AFFINITY_FILE};
use crate::format::cluster_health;
use crate::format::run_dir::{self, RunDirError};
use crate::probe::kind::Layout;
use dataset::Dataset;
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
    Run(#[from] RunDirError),
    #[error(transparent)]
    Affinity(#[from] AffinityFileError),
    #[error(transparent)]
    ClusterHealth(#[from] cluster_health::Error),
    #[error(
        "{0}: nothing to report (no {run}, results.json or {AFFINITY_FILE}) and no other \
         ClusterHealthDetect file (rank_NNNNN.json, partial_results.json, \
         rank_NNNNN_partial.json)",
        run = run_dir::RUN_FILE
    )]
    Nothing(PathBuf),
    #[error("{path}: {detail}")]
    Read { path: PathBuf, detail: String },
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

fn read_affinity(path: &Path) -> Result<Vec<(u32, bool)>, ReportError> {
    let rows = affinity_file::read(path)?;
    Ok(rows.into_iter().map(|r| (r.cpu, r.bindable)).collect())
}

/// Load what `input` holds: a chd run directory (`run.json` + `cells.jsonl`, and
/// `affinity.json` if present), a ClusterHealthDetect run directory or one of its files
/// (see [`cluster_health::read`]), or a `run.json` file. Returns the dataset and the
/// directory reports go to by default.
pub fn load(input: &Path) -> Result<(Dataset, PathBuf), ReportError> {
    if input.is_file() {
        let dir = input.parent().unwrap_or(Path::new(".")).to_path_buf();
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        if input.file_name().is_some_and(|n| n == run_dir::RUN_FILE) {
            return load(&dir);
        }
        let rec = cluster_health::read(input)?;
        return Ok((Dataset::from_recording(rec), dir));
    }
    if !input.is_dir() {
        return Err(ReportError::Read {
            path: input.into(),
            detail: "no such file or directory".into(),
        });
    }
    if !input.join(run_dir::RUN_FILE).is_file() {
        match cluster_health::read(input) {
            Ok(rec) => return Ok((Dataset::from_recording(rec), input.to_path_buf())),
            Err(cluster_health::Error::NoRecording(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let affinity_path = input.join(AFFINITY_FILE);
    let affinity = if affinity_path.is_file() {
        read_affinity(&affinity_path)?
    } else {
        Vec::new()
    };
    let mut ds = if input.join(run_dir::RUN_FILE).is_file() {
        let (run, records) = run_dir::read_run(input)?;
        Dataset::from_run(&run, &records)
    } else if !affinity.is_empty() {
        Dataset {
            source: format!("chd probe affinity ({})", affinity_path.display()),
            ..Dataset::default()
        }
    } else {
        return Err(ReportError::Nothing(input.into()));
    };
    ds.affinity = affinity;
    Ok((ds, input.to_path_buf()))
}

/// The heatmaps of `ds`, each with its file-name stem.
pub fn heatmaps(ds: &Dataset) -> Vec<(String, Heatmap, dataset::MatrixId)> {
    let numa = ds.numa_map();
    ds.matrices()
        .into_iter()
        .filter_map(|(id, cells)| {
            let title = Dataset::matrix_title(id);
            let (cells, axes) = (analysis::cells(&cells), Default::default());
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
