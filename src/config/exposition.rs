//! The `[exposition]` section: whether the per-cell series are exported (`cells = true`,
//! `false`, or `"auto"`: on when the planned matrix has at most `auto_cells_limit` cells)
//! and whether the core-pair cells are; which per-CPU series are exported (`cpu_series =
//! "exceptions"`: only CPUs that cannot be bound, plus counts; `"all"`: every CPU's
//! `chd_cpu_bindable` and `chd_cpu_info`). `auto` is resolved once the matrix is planned
//! ([`ExpositionConfig::cells_for`]), before the store's collector is built.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::error::{ConfigError, Problem};
pub use crate::exposition::store_collector::CpuSeries;

/// Default `exposition.auto_cells_limit`: a typical 8-GPU node (2 sockets, up to 512 CPUs x
/// 8 devices x 3 sizes = 12,288 cells) exposes its cells; the seed's 640 CPUs x 16 devices
/// x 3 sizes (30,720) does not, which keeps its default exposition, collectors included,
/// under 3,000 series (the fleet series budget of issue 13 and issue 28 part 4).
pub const DEFAULT_AUTO_CELLS_LIMIT: usize = 12_288;

/// `exposition.cells` as written in TOML or on the command line: a switch, text (`"auto"`;
/// other text is refused by validation), or a value of another type, kept as TOML writes it
/// so that validation can name the key that holds it.
#[derive(Debug, Clone, PartialEq)]
pub enum RawCells {
    Switch(bool),
    Text(String),
    Other(String),
}

impl From<&str> for RawCells {
    /// A command-line value: `true` and `false` are switches, anything else text.
    fn from(text: &str) -> RawCells {
        match text {
            "true" => RawCells::Switch(true),
            "false" => RawCells::Switch(false),
            _ => RawCells::Text(text.to_string()),
        }
    }
}

impl Serialize for RawCells {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            RawCells::Switch(on) => s.serialize_bool(*on),
            RawCells::Text(text) | RawCells::Other(text) => s.serialize_str(text),
        }
    }
}

impl<'de> Deserialize<'de> for RawCells {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RawCells, D::Error> {
        Ok(match toml::Value::deserialize(d)? {
            toml::Value::Boolean(on) => RawCells::Switch(on),
            toml::Value::String(text) => RawCells::Text(text),
            other => RawCells::Other(other.to_string()),
        })
    }
}

/// Whether the per-cell series (`chd_h2d_bandwidth_bytes_per_second`) are exported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CellExport {
    On,
    Off,
    /// On when the planned matrix has at most `limit` cells.
    Auto {
        limit: usize,
    },
}

impl CellExport {
    /// Validate `exposition.cells` (with `exposition.auto_cells_limit` for `auto`).
    pub(super) fn validate(raw: RawCells, limit: usize) -> Result<CellExport, ConfigError> {
        let refused =
            |got: String| ConfigError::invalid("exposition.cells", Problem::NotCellExport(got));
        match raw {
            RawCells::Switch(true) => Ok(CellExport::On),
            RawCells::Switch(false) => Ok(CellExport::Off),
            RawCells::Text(text) if text == "auto" => Ok(CellExport::Auto { limit }),
            RawCells::Text(text) => Err(refused(format!("{text:?}"))),
            RawCells::Other(text) => Err(refused(text)),
        }
    }

    /// As written back to TOML (`--print-config`).
    pub(super) fn raw(self) -> RawCells {
        match self {
            CellExport::On => RawCells::Switch(true),
            CellExport::Off => RawCells::Switch(false),
            CellExport::Auto { .. } => RawCells::Text("auto".into()),
        }
    }
}

/// Validate `exposition.cpu_series` (`"exceptions"` or `"all"`).
pub(super) fn cpu_series(text: String) -> Result<CpuSeries, ConfigError> {
    match text.as_str() {
        "exceptions" => Ok(CpuSeries::Exceptions),
        "all" => Ok(CpuSeries::All),
        _ => Err(ConfigError::invalid(
            "exposition.cpu_series",
            Problem::NotCpuSeries(format!("{text:?}")),
        )),
    }
}

/// The validated `[exposition]` section.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpositionConfig {
    pub cells: CellExport,
    /// The most planned cells for which `cells = "auto"` exports them.
    pub auto_cells_limit: usize,
    pub pair_cells: bool,
    pub cpu_series: CpuSeries,
}

impl ExpositionConfig {
    /// Whether the per-cell series are exported for a planned matrix of `planned` cells, and
    /// why (for the startup log).
    pub fn cells_for(&self, planned: usize) -> CellsDecision {
        let on = match self.cells {
            CellExport::On => true,
            CellExport::Off => false,
            CellExport::Auto { limit } => planned <= limit,
        };
        CellsDecision {
            on,
            setting: self.cells,
            planned,
        }
    }
}

/// [`ExpositionConfig::cells_for`]'s answer; its `Display` is the reason, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CellsDecision {
    /// Export the per-cell series.
    pub on: bool,
    setting: CellExport,
    planned: usize,
}

/// `12288` as `12,288`.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

impl fmt::Display for CellsDecision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = if self.on { "on" } else { "off" };
        let planned = thousands(self.planned);
        match self.setting {
            CellExport::On | CellExport::Off => write!(
                f,
                "per-cell series {state}: exposition.cells = {} ({planned} cells planned)",
                self.on
            ),
            CellExport::Auto { limit } => {
                let cmp = if self.on { "<=" } else { ">" };
                write!(
                    f,
                    "per-cell series {state}: exposition.cells = auto and {planned} cells {cmp} \
                     exposition.auto_cells_limit {}",
                    thousands(limit)
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(cells: CellExport) -> ExpositionConfig {
        ExpositionConfig {
            cells,
            auto_cells_limit: DEFAULT_AUTO_CELLS_LIMIT,
            pair_cells: false,
            cpu_series: CpuSeries::Exceptions,
        }
    }

    #[test]
    fn auto_turns_cells_on_up_to_the_limit_and_off_above_it() {
        let auto = config(CellExport::Auto {
            limit: DEFAULT_AUTO_CELLS_LIMIT,
        });
        // A typical 8-GPU node: 512 CPUs x 8 devices x 3 sizes, exactly the limit.
        let node8 = auto.cells_for(512 * 8 * 3);
        assert!(node8.on);
        assert_eq!(
            node8.to_string(),
            "per-cell series on: exposition.cells = auto and 12,288 cells <= \
             exposition.auto_cells_limit 12,288"
        );
        // The seed's node: 640 CPUs x 16 devices x 3 sizes.
        let seed = auto.cells_for(640 * 16 * 3);
        assert!(!seed.on);
        assert_eq!(
            seed.to_string(),
            "per-cell series off: exposition.cells = auto and 30,720 cells > \
             exposition.auto_cells_limit 12,288"
        );
        assert!(!auto.cells_for(DEFAULT_AUTO_CELLS_LIMIT + 1).on);
    }

    #[test]
    fn switches_ignore_the_matrix_size() {
        let on = config(CellExport::On).cells_for(1_000_000);
        assert!(on.on);
        assert_eq!(
            on.to_string(),
            "per-cell series on: exposition.cells = true (1,000,000 cells planned)"
        );
        assert!(!config(CellExport::Off).cells_for(1).on);
    }

    #[test]
    fn thousands_groups_digits() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(30720), "30,720");
        assert_eq!(thousands(1234567), "1,234,567");
    }

    #[test]
    fn command_line_values_become_switches_or_text() {
        assert_eq!(RawCells::from("true"), RawCells::Switch(true));
        assert_eq!(RawCells::from("false"), RawCells::Switch(false));
        assert_eq!(RawCells::from("auto"), RawCells::Text("auto".into()));
    }
}
