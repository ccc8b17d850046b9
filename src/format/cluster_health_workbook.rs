//! ClusterHealthDetect's xlsx workbooks, read as the public tool writes them
//! (`cluster_health_detect/excel_heatmap.py:write_xlsx`, standard library only: inline-string
//! cells, numbers as `%.12g`, booleans `t="b"`, `None` as an empty `<c r="B2"/>`, and a
//! float that is not finite written as its text, `nan` or `inf`). Two writers fill them:
//!
//! - `matrix_excel.py` (the H2D matrix and core-pair workbooks): one `H2D_<size>MB` sheet per
//!   size (A1 `CPU core -> NPU H2D GB/s (<size> MB)`, B1.. `npu:N`, then one row per CPU: the
//!   CPU in column A, each device's median GB/s), one `D2D_<size>MB` sheet per size of the
//!   core-pair matrix (A1 `rank0 CPU -> rank1 CPU all_gather alg GB/s (<size> MB)`, B1.. the
//!   rank 1 CPUs, one row per rank 0 CPU), a `Summary` sheet (`test, size_mb, row, column,
//!   metric, count, min, median, max, max/min` per cell), an `Affinity` sheet (`cpu,
//!   numa_node, socket_id, core_id, online, allowed, bindable, thread_siblings, reason`), and a
//!   `Heatmap` sheet saying `No core matrix metrics found` when there was no matrix;
//! - `excel_heatmap.py` (the NUMA affinity workbook of `numa_affinity_benchmark.py`): a
//!   `Heatmap` sheet (`policy/profile` x metric label, medians), a `Summary` sheet
//!   (`policy/profile, metric, count, min, median, max, max/min`) and the `Affinity` sheet.
//!
//! [`read`] returns every sheet as a plain record ([`Sheet`]); a sheet of another shape is
//! [`Sheet::Other`] with the reason, never dropped. What the values mean is `dataset`'s.

use std::path::{Path, PathBuf};

use calamine::{Data, Range, Reader, Xlsx};

use super::cluster_health::RecordedCpu;

/// Why a workbook could not be read.
#[derive(Debug, thiserror::Error)]
pub enum WorkbookError {
    #[error("{path}: not an xlsx workbook chd can open ({detail})")]
    Open { path: PathBuf, detail: String },
    #[error("{path}: sheet {sheet:?} cannot be read ({detail})")]
    Sheet {
        path: PathBuf,
        sheet: String,
        detail: String,
    },
}

/// One cell as the writer left it.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Empty,
    Number(f64),
    Text(String),
    Bool(bool),
}

impl Cell {
    fn of(d: Option<&Data>) -> Cell {
        match d {
            None | Some(Data::Empty) => Cell::Empty,
            Some(Data::Int(i)) => Cell::Number(*i as f64),
            Some(Data::Float(f)) => Cell::Number(*f),
            Some(Data::Bool(b)) => Cell::Bool(*b),
            Some(Data::String(s)) | Some(Data::DateTimeIso(s)) | Some(Data::DurationIso(s)) => {
                Cell::Text(s.clone())
            }
            Some(Data::DateTime(d)) => Cell::Number(d.as_f64()),
            Some(Data::Error(e)) => Cell::Text(format!("#{e:?}")),
        }
    }

    /// The cell as text (numbers as the writer's `%g`-like form), for headers and messages.
    pub fn text(&self) -> String {
        match self {
            Cell::Empty => String::new(),
            Cell::Number(v) => v.to_string(),
            Cell::Text(s) => s.clone(),
            Cell::Bool(b) => b.to_string(),
        }
    }

    /// A number, when the cell holds one.
    pub fn number(&self) -> Option<f64> {
        match self {
            Cell::Number(v) => Some(*v),
            _ => None,
        }
    }

    /// A non-negative whole number (a CPU id, a NUMA node).
    pub fn whole(&self) -> Option<u32> {
        self.number()
            .filter(|v| v.fract() == 0.0 && *v >= 0.0 && *v <= f64::from(u32::MAX))
            .map(|v| v as u32)
    }
}

/// `B7`: the A1 reference of a 0-based row and column.
pub fn cell_ref(row: u32, col: u32) -> String {
    let mut name = String::new();
    let mut n = col + 1;
    while n > 0 {
        let rem = (n - 1) % 26;
        name.insert(0, char::from(b'A' + rem as u8));
        n = (n - 1) / 26;
    }
    format!("{name}{}", row + 1)
}

/// One row of a matrix sheet: its label cell (column A) and its value cells.
#[derive(Debug, Clone, PartialEq)]
pub struct MatrixRow {
    /// 0-based row in the sheet.
    pub row: u32,
    pub label: Cell,
    pub values: Vec<Cell>,
}

/// An `H2D_<size>MB` or `D2D_<size>MB` sheet.
#[derive(Debug, Clone, PartialEq)]
pub struct MatrixSheet {
    pub name: String,
    /// The size in the sheet's name and title, MiB (`size_mb`).
    pub size_mb: f64,
    /// B1.. as written: `npu:3` (H2D) or the rank 1 CPU (core-pair).
    pub columns: Vec<Cell>,
    pub rows: Vec<MatrixRow>,
}

/// One row of the NUMA affinity workbook's `Summary` sheet.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyRow {
    /// 0-based row in the sheet.
    pub row: u32,
    /// `none`, `numa:0:shard`, ...
    pub policy: String,
    /// `test|operation|scope|<size>MB|field`, e.g. `h2d|copy|host_to_device|1MB|gbps`.
    pub metric: String,
    pub count: Cell,
    pub min: Cell,
    pub median: Cell,
    pub max: Cell,
}

/// A sheet and what it holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Sheet {
    /// `H2D_<size>MB`: CPU x device medians.
    H2d(MatrixSheet),
    /// `D2D_<size>MB`: rank 0 CPU x rank 1 CPU allgather medians.
    Pair(MatrixSheet),
    /// `matrix_excel.py`'s `Summary`: per cell count, min, median, max; its rows.
    MatrixSummary { rows: usize },
    /// `excel_heatmap.py`'s `Heatmap` (policy x metric medians); its rows.
    PolicyHeatmap { rows: usize },
    /// `excel_heatmap.py`'s `Summary`.
    PolicySummary(Vec<PolicyRow>),
    /// `Affinity`: the CPU records, and the rows without a CPU number (their 1-based rows).
    Affinity {
        cpus: Vec<RecordedCpu>,
        bad_rows: Vec<u32>,
    },
    /// `Heatmap` with `No core matrix metrics found`: the tool had no matrix to write.
    NoMetrics,
    /// A sheet of no shape the tool writes.
    Other { name: String, why: String },
}

/// A workbook's sheets, in the workbook's order.
#[derive(Debug, Clone, PartialEq)]
pub struct Workbook {
    pub path: PathBuf,
    pub sheets: Vec<(String, Sheet)>,
}

/// Whether `path` is an xlsx file by its first bytes (a zip) and its name.
pub fn looks_like_workbook(path: &Path) -> bool {
    let zip = std::fs::File::open(path).ok().and_then(|mut f| {
        use std::io::Read;
        let mut magic = [0u8; 4];
        f.read_exact(&mut magic).ok().map(|_| magic)
    });
    zip == Some(*b"PK\x03\x04")
        || path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("xlsx"))
}

/// Read every sheet of a ClusterHealthDetect workbook.
pub fn read(path: &Path) -> Result<Workbook, WorkbookError> {
    let mut book: Xlsx<_> =
        calamine::open_workbook(path).map_err(|e: calamine::XlsxError| WorkbookError::Open {
            path: path.into(),
            detail: e.to_string(),
        })?;
    let mut sheets = Vec::new();
    for name in book.sheet_names() {
        let range = book
            .worksheet_range(&name)
            .map_err(|e| WorkbookError::Sheet {
                path: path.into(),
                sheet: name.clone(),
                detail: e.to_string(),
            })?;
        let sheet = classify(&name, &range);
        sheets.push((name, sheet));
    }
    Ok(Workbook {
        path: path.into(),
        sheets,
    })
}

/// The cell at a 0-based (row, column).
fn at(range: &Range<Data>, row: u32, col: u32) -> Cell {
    Cell::of(range.get_value((row, col)))
}

/// Rows and columns the sheet spans from A1 (the writer always starts there).
fn extent(range: &Range<Data>) -> (u32, u32) {
    range.end().map(|(r, c)| (r + 1, c + 1)).unwrap_or((0, 0))
}

/// The size of `H2D_64MB` / `D2D_0.5MB`.
fn size_of_name(name: &str, prefix: &str) -> Option<f64> {
    name.strip_prefix(prefix)?
        .strip_suffix("MB")?
        .parse::<f64>()
        .ok()
        .filter(|v| *v > 0.0 && v.is_finite())
}

fn header(range: &Range<Data>) -> Vec<String> {
    let (_, cols) = extent(range);
    (0..cols).map(|c| at(range, 0, c).text()).collect()
}

fn classify(name: &str, range: &Range<Data>) -> Sheet {
    let a1 = at(range, 0, 0).text();
    let other = |why: String| Sheet::Other {
        name: name.to_string(),
        why,
    };
    let (rows, _) = extent(range);
    for (prefix, title, pair) in [
        ("H2D_", "CPU core -> NPU H2D GB/s", false),
        ("D2D_", "rank0 CPU -> rank1 CPU all_gather", true),
    ] {
        if !name.starts_with(prefix) {
            continue;
        }
        let Some(size_mb) = size_of_name(name, prefix) else {
            return other(format!("no size in the sheet name (want {prefix}<size>MB)"));
        };
        if !a1.starts_with(title) {
            return other(format!("A1 is {a1:?}, not {title:?}"));
        }
        let matrix = matrix(name, size_mb, range);
        return if pair {
            Sheet::Pair(matrix)
        } else {
            Sheet::H2d(matrix)
        };
    }
    let head = header(range);
    let head: Vec<&str> = head.iter().map(String::as_str).collect();
    match (name, head.as_slice()) {
        ("Summary", ["test", "size_mb", "row", "column", "metric", ..]) => Sheet::MatrixSummary {
            rows: rows.saturating_sub(1) as usize,
        },
        ("Summary", ["policy/profile", "metric", "count", "min", "median", "max", ..]) => {
            Sheet::PolicySummary(
                (1..rows)
                    .map(|r| PolicyRow {
                        row: r,
                        policy: at(range, r, 0).text(),
                        metric: at(range, r, 1).text(),
                        count: at(range, r, 2),
                        min: at(range, r, 3),
                        median: at(range, r, 4),
                        max: at(range, r, 5),
                    })
                    .collect(),
            )
        }
        ("Heatmap", ["policy/profile", ..]) => Sheet::PolicyHeatmap {
            rows: rows.saturating_sub(1) as usize,
        },
        ("Heatmap", ["No core matrix metrics found", ..]) => Sheet::NoMetrics,
        (
            "Affinity",
            ["cpu", "numa_node", "socket_id", "core_id", "online", "allowed", "bindable", ..],
        ) => affinity(range, rows),
        _ => other(format!(
            "not a sheet ClusterHealthDetect writes (A1 {a1:?}; it writes H2D_<size>MB, \
             D2D_<size>MB, Summary, Heatmap and Affinity)"
        )),
    }
}

fn matrix(name: &str, size_mb: f64, range: &Range<Data>) -> MatrixSheet {
    let (rows, cols) = extent(range);
    MatrixSheet {
        name: name.to_string(),
        size_mb,
        columns: (1..cols).map(|c| at(range, 0, c)).collect(),
        rows: (1..rows)
            .map(|r| MatrixRow {
                row: r,
                label: at(range, r, 0),
                values: (1..cols).map(|c| at(range, r, c)).collect(),
            })
            .collect(),
    }
}

fn affinity(range: &Range<Data>, rows: u32) -> Sheet {
    let flag = |c: Cell| match c {
        Cell::Bool(b) => Some(b),
        _ => None,
    };
    let mut cpus = Vec::new();
    let mut bad_rows = Vec::new();
    for r in 1..rows {
        let Some(cpu) = at(range, r, 0).whole() else {
            bad_rows.push(r + 1);
            continue;
        };
        let siblings = at(range, r, 7).text();
        let reason = at(range, r, 8).text();
        cpus.push(RecordedCpu {
            cpu,
            online: flag(at(range, r, 4)),
            allowed: flag(at(range, r, 5)),
            bindable: flag(at(range, r, 6)),
            numa_node: at(range, r, 1).whole(),
            socket_id: at(range, r, 2).whole(),
            core_id: at(range, r, 3).whole(),
            thread_siblings: siblings
                .split(',')
                .filter_map(|s| s.trim().parse().ok())
                .collect(),
            reason: (!reason.is_empty()).then_some(reason),
        });
    }
    Sheet::Affinity { cpus, bad_rows }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_and_sizes_read_as_the_writer_names_them() {
        assert_eq!(cell_ref(0, 0), "A1");
        assert_eq!(cell_ref(6, 1), "B7");
        assert_eq!(cell_ref(0, 26), "AA1");
        assert_eq!(size_of_name("H2D_64MB", "H2D_"), Some(64.0));
        assert_eq!(size_of_name("D2D_0.5MB", "D2D_"), Some(0.5));
        assert_eq!(size_of_name("H2D_MB", "H2D_"), None);
        assert_eq!(size_of_name("H2D_nanMB", "H2D_"), None);
        assert_eq!(Cell::Number(3.0).whole(), Some(3));
        assert_eq!(Cell::Number(3.5).whole(), None);
        assert_eq!(Cell::Text("nan".into()).number(), None);
    }

    #[test]
    fn a_file_that_is_no_zip_is_refused_with_its_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("report.xlsx");
        std::fs::write(&path, "not a zip").unwrap();
        let e = read(&path).unwrap_err().to_string();
        assert!(e.contains("report.xlsx: not an xlsx workbook"), "{e}");
    }
}
