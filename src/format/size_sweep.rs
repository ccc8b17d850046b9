//! ClusterHealthDetect users' size-sweep files, as the engineers' sweep scripts write them
//! (the public `reports/A3-180-*-sweep-*.json` and `*-size-sweep-*.csv`):
//!
//! - copy sweeps: `{"rows": [{"operation": "h2d" | "d2d_same_device", "device_id",
//!   "size_bytes", "size_mb", "iters", "avg_seconds", "gbps", "pinned", "cpu_affinity":
//!   [0]}], "sizes": [...], "device_id", "note"}`;
//! - allgather sweeps, one file per setting: `{"rows": [{"rank", "local_rank", "device_id",
//!   "operation": "hccl_all_gather", "size_bytes", "size_mb", "iters", "avg_seconds",
//!   "alg_gbps", "rank_exchange_gbps", "hccl_buffsize"}], "sizes": [...], "env":
//!   {"HCCL_BUFFSIZE": "32" | null, "HCCL_BUFFER_SIZE": null}}`;
//! - the CSV of a whole sweep: `series,size_mb,gbps,iters,avg_seconds`, series `h2d`,
//!   `d2d_same_device`, `hccl_default`, `hccl_buff_<MB>`.
//!
//! GB/s there is decimal (bytes / seconds / 1e9). Each row is one point: the mean over
//! `iters` copies, so a point has one sample. [`read`] returns the points and the rows it
//! cannot use, each with where it is and why.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::cluster_health::python_floats::PythonFloats;

/// Why a sweep file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {problem}")]
    Shape { path: PathBuf, problem: String },
}

/// One measured size of one sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepPoint {
    /// As the file names it: `h2d`, `d2d_same_device`, `hccl_all_gather`, or the CSV's series.
    pub operation: String,
    /// What the sweep ran under: `HCCL_BUFFSIZE=32`, `HCCL_BUFFSIZE unset`; empty when the
    /// file names no setting.
    pub setting: String,
    pub device: Option<u32>,
    /// The CPUs the copy thread was bound to (`cpu_affinity`).
    pub cpus: Vec<u32>,
    pub size_bytes: u64,
    /// Decimal GB/s (`gbps`, else `alg_gbps`).
    pub gbps: f64,
    pub iters: Option<u64>,
    pub avg_seconds: Option<f64>,
}

/// A row that could not be used.
#[derive(Debug, Clone, PartialEq)]
pub struct BadRow {
    /// `rows[3]` or `line 5`.
    pub at: String,
    pub why: String,
}

/// A sweep file's points.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SweepFile {
    pub points: Vec<SweepPoint>,
    pub bad: Vec<BadRow>,
    /// The file's `note`, when it has one.
    pub note: Option<String>,
}

/// The CSV's header.
pub const CSV_HEADER: &str = "series,size_mb,gbps,iters,avg_seconds";

/// Whether `text` is a sweep file: a JSON object with a `rows` array, or the sweep CSV.
pub fn is_sweep(text: &str) -> bool {
    let start = text.trim_start();
    if start.starts_with(CSV_HEADER) {
        return true;
    }
    // Cheap before parsing: the writers put "rows" first.
    start.starts_with('{') && start.contains("\"rows\"") && !start.contains("\"metrics\"")
}

/// Read a sweep file (JSON or CSV, told apart by its text).
pub fn read(path: &Path) -> Result<SweepFile, SweepError> {
    let text = std::fs::read_to_string(path).map_err(|source| SweepError::Io {
        path: path.into(),
        source,
    })?;
    parse(&text).map_err(|problem| SweepError::Shape {
        path: path.into(),
        problem,
    })
}

/// Parse a sweep file's text.
pub fn parse(text: &str) -> Result<SweepFile, String> {
    let file = if text.trim_start().starts_with(CSV_HEADER) {
        parse_csv(text)
    } else {
        parse_json(text)?
    };
    if file.points.is_empty() {
        let why = match file.bad.first() {
            Some(b) => format!(
                "{} row(s), none usable (first: {}: {})",
                file.bad.len(),
                b.at,
                b.why
            ),
            None => "no rows".to_string(),
        };
        return Err(format!("a size-sweep file with no usable point: {why}"));
    }
    Ok(file)
}

/// MiB -> bytes (`size_mb` is `size_bytes / 2^20` in the writers).
fn mib(v: f64) -> Option<u64> {
    (v.is_finite() && v > 0.0).then(|| (v * f64::from(1u32 << 20)).round() as u64)
}

fn parse_json(text: &str) -> Result<SweepFile, String> {
    // Python writes a float that is not finite as a bare NaN: read as null.
    let doc: Value = serde_json::from_reader(PythonFloats::new(text.as_bytes()))
        .map_err(|e| format!("not JSON ({e})"))?;
    let rows = doc
        .get("rows")
        .and_then(Value::as_array)
        .ok_or("no \"rows\" array")?;
    let env_setting = doc.get("env").and_then(Value::as_object).map(|env| {
        match env.get("HCCL_BUFFSIZE").and_then(Value::as_str) {
            Some(v) => format!("HCCL_BUFFSIZE={v}"),
            None => "HCCL_BUFFSIZE unset".to_string(),
        }
    });
    let mut file = SweepFile {
        note: doc.get("note").and_then(Value::as_str).map(str::to_string),
        ..SweepFile::default()
    };
    for (i, row) in rows.iter().enumerate() {
        let at = format!("rows[{i}]");
        match json_point(row, env_setting.as_deref()) {
            Ok(p) => file.points.push(p),
            Err(why) => file.bad.push(BadRow { at, why }),
        }
    }
    Ok(file)
}

fn json_point(row: &Value, env_setting: Option<&str>) -> Result<SweepPoint, String> {
    let operation = row
        .get("operation")
        .and_then(Value::as_str)
        .ok_or("no operation")?
        .to_string();
    let size_bytes = match row.get("size_bytes").and_then(Value::as_u64) {
        Some(b) if b > 0 => b,
        _ => row
            .get("size_mb")
            .and_then(Value::as_f64)
            .and_then(mib)
            .ok_or("no size_bytes or size_mb")?,
    };
    let (field, gbps) = ["gbps", "alg_gbps"]
        .iter()
        .find_map(|k| row.get(*k).map(|v| (*k, v)))
        .ok_or("no gbps or alg_gbps")?;
    let gbps = gbps
        .as_f64()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| format!("{field} is not a number (NaN, null or negative)"))?;
    let setting = match (row.get("hccl_buffsize"), env_setting) {
        (_, Some(s)) => s.to_string(),
        (Some(Value::String(v)), None) => format!("HCCL_BUFFSIZE={v}"),
        (Some(Value::Null), None) => "HCCL_BUFFSIZE unset".to_string(),
        _ => String::new(),
    };
    Ok(SweepPoint {
        operation,
        setting,
        device: row
            .get("device_id")
            .and_then(Value::as_u64)
            .and_then(|d| u32::try_from(d).ok()),
        cpus: row
            .get("cpu_affinity")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|c| c.as_u64().and_then(|c| u32::try_from(c).ok()))
                    .collect()
            })
            .unwrap_or_default(),
        size_bytes,
        gbps,
        iters: row.get("iters").and_then(Value::as_u64),
        avg_seconds: row.get("avg_seconds").and_then(Value::as_f64),
    })
}

fn parse_csv(text: &str) -> SweepFile {
    let mut file = SweepFile::default();
    for (i, line) in text.lines().enumerate().skip(1) {
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("line {}", i + 1);
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let number = |k: usize| f.get(k).and_then(|v| v.parse::<f64>().ok());
        let point = match (f.first().filter(|s| !s.is_empty()), number(1).and_then(mib)) {
            (None, _) => Err("no series".to_string()),
            (_, None) => Err(format!(
                "size_mb {:?} is not a positive number",
                f.get(1).unwrap_or(&"")
            )),
            (Some(series), Some(size_bytes)) => match number(2).filter(|v| *v >= 0.0) {
                None => Err(format!(
                    "gbps {:?} is not a number",
                    f.get(2).unwrap_or(&"")
                )),
                Some(gbps) => Ok(SweepPoint {
                    operation: series.to_string(),
                    setting: String::new(),
                    device: None,
                    cpus: Vec::new(),
                    size_bytes,
                    gbps,
                    iters: number(3).filter(|v| *v >= 0.0).map(|v| v as u64),
                    avg_seconds: number(4),
                }),
            },
        };
        match point {
            Ok(p) => file.points.push(p),
            Err(why) => file.bad.push(BadRow { at, why }),
        }
    }
    file
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allgather_sweep_takes_its_setting_from_env() {
        let text = r#"{"rows": [
          {"rank": 0, "local_rank": 0, "device_id": 8, "operation": "hccl_all_gather",
           "size_bytes": 131072, "size_mb": 0.125, "iters": 80, "avg_seconds": 0.000176,
           "alg_gbps": 0.7448, "rank_exchange_gbps": 0.7448, "hccl_buffsize": "32",
           "hccl_buffer_size": null},
          {"rank": 0, "operation": "hccl_all_gather", "size_bytes": 262144,
           "alg_gbps": NaN}],
          "sizes": [131072, 262144], "env": {"HCCL_BUFFSIZE": "32", "HCCL_BUFFER_SIZE": null}}"#;
        let f = parse(text).unwrap();
        assert_eq!(f.points.len(), 1);
        assert_eq!(f.points[0].setting, "HCCL_BUFFSIZE=32");
        assert_eq!(f.points[0].device, Some(8));
        assert_eq!(f.points[0].size_bytes, 131072);
        assert_eq!(f.bad[0].at, "rows[1]");
        assert_eq!(
            f.bad[0].why,
            "alg_gbps is not a number (NaN, null or negative)"
        );
        assert!(parse("{").unwrap_err().starts_with("not JSON"));
        let default = text.replace(r#""HCCL_BUFFSIZE": "32""#, r#""HCCL_BUFFSIZE": null"#);
        assert_eq!(
            parse(&default).unwrap().points[0].setting,
            "HCCL_BUFFSIZE unset"
        );
    }

    #[test]
    fn the_csv_names_its_bad_lines() {
        let text = "series,size_mb,gbps,iters,avg_seconds\n\
                    h2d,0.125,3.9,200,3.3e-05\n\
                    h2d,,3.9,200,3.3e-05\n\
                    hccl_buff_32,1024.0,74.5,1,0.0144\n";
        assert!(is_sweep(text));
        let f = parse(text).unwrap();
        assert_eq!(f.points.len(), 2);
        assert_eq!(f.points[1].operation, "hccl_buff_32");
        assert_eq!(f.points[1].size_bytes, 1 << 30);
        assert_eq!(f.bad[0].at, "line 3");
        assert!(parse("series,size_mb,gbps,iters,avg_seconds\n")
            .unwrap_err()
            .contains("no usable point"));
    }
}
