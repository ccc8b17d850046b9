//! Configuration errors: a file that cannot be read or parsed, or a value that names its key
//! (`schedule.interval: ...`) and what is wrong with it.

use std::path::PathBuf;

/// A configuration error that names the key and the problem.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("{key}: {problem}")]
    Invalid { key: String, problem: Problem },
}

impl ConfigError {
    pub fn invalid(key: impl Into<String>, problem: Problem) -> ConfigError {
        ConfigError::Invalid {
            key: key.into(),
            problem,
        }
    }
}

/// What is wrong with a value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Problem {
    #[error("{text:?} is not a duration like 60s or 5m ({why})")]
    NotADuration { text: String, why: String },
    #[error("must be greater than zero")]
    Zero,
    #[error("{0} is not a bandwidth: a positive number of GB/s")]
    NotABandwidth(f64),
    #[error("must be at least 1")]
    NotAtLeastOne,
    #[error("{0:?} is not an address like 0.0.0.0:9863 or [::1]:9863")]
    NotAnAddress(String),
    #[error("{budget} must be shorter than schedule.interval ({interval})")]
    BudgetNotShorter { budget: String, interval: String },
    /// A ratio outside 0..1; `hint` says what 1 means for this key.
    #[error("{value} is not a ratio in 0..1 ({hint})")]
    NotARatio { value: f64, hint: &'static str },
    /// `unit` is written after the value (` MiB`, or nothing).
    #[error("{value}{unit} is outside {min}..={max}")]
    OutOfRange {
        value: u64,
        unit: &'static str,
        min: u64,
        max: u64,
    },
    /// An empty list; says what it needs.
    #[error("needs at least {0}")]
    Empty(&'static str),
    #[error("{text:?} is not a regex ({why})")]
    NotARegex { text: String, why: String },
    #[error("{0:?} is a pattern, this key is a switch (true or false)")]
    NotASwitch(String),
    #[error("{0} is a switch, this key is a pattern (a regex)")]
    NotAPattern(bool),
    /// `exposition.cells` is none of its three values; holds the value as written.
    #[error("expected true, false or \"auto\", got {0}")]
    NotCellExport(String),
    /// `exposition.cpu_series` is neither of its two values; holds the value as written.
    #[error("expected \"exceptions\" or \"all\", got {0}")]
    NotCpuSeries(String),
    /// A domain type refused the text (a backend, direction, cpulist, pair ...): its reason.
    #[error("{0}")]
    Refused(String),
    /// Reached only when validating a layer that was not merged over the defaults.
    #[error("no value and no default")]
    Missing,
}
