//! Reading one sysfs/procfs value: the thin IO layer and the parsers shared by the
//! collectors.
//!
//! Parsing is kept apart from IO (the eminence/procfs pattern): every parser takes the text
//! of a file and returns a [`ParseError`] for text it cannot use; [`value_from`] turns the
//! outcome of a read (`io::Result<String>`) plus a parser into a [`ReadError`]-or-value, so a
//! test can inject any `io::Error` (EINVAL, as ConnectX ports in switch mode return) without
//! a kernel to produce it.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Why the text of a file is not a usable value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The file was empty (or only whitespace).
    #[error("empty")]
    Empty,
    /// The driver says it has no value (`N/A (no PMA)` on ports without a PMA agent).
    #[error("not available ({0:?})")]
    NotAvailable(String),
    /// Expected a number.
    #[error("not a number: {0:?}")]
    NotANumber(String),
    /// The text does not have the expected shape.
    #[error("unexpected format: {0:?}")]
    Format(String),
}

/// Why one value could not be read: the file could not be read, or its text not parsed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot parse {path}: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: ParseError,
    },
}

impl ReadError {
    /// The file the value was read from.
    pub fn path(&self) -> &Path {
        match self {
            ReadError::Io { path, .. } | ReadError::Parse { path, .. } => path,
        }
    }
}

/// Turn the outcome of reading `path` into a value with `parse`.
pub fn value_from<T>(
    path: &Path,
    read: io::Result<String>,
    parse: impl FnOnce(&str) -> Result<T, ParseError>,
) -> Result<T, ReadError> {
    let text = read.map_err(|source| ReadError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse(&text).map_err(|source| ReadError::Parse {
        path: path.to_path_buf(),
        source,
    })
}

/// Read `path` and parse it with `parse`.
pub fn read_value<T>(
    path: &Path,
    parse: impl FnOnce(&str) -> Result<T, ParseError>,
) -> Result<T, ReadError> {
    value_from(path, fs::read_to_string(path), parse)
}

/// Names in a directory in natural order ([`natural_cmp`]: `2` before `10`, `mlx5_2`
/// before `mlx5_10`); `Ok(None)` when the directory does not exist.
pub fn list_dir(dir: &Path) -> io::Result<Option<Vec<String>>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut names = Vec::new();
    for entry in entries {
        // A name that is not UTF-8 cannot be a label value; sysfs never produces one.
        if let Some(name) = entry?.file_name().to_str() {
            names.push(name.to_owned());
        }
    }
    sort_natural(&mut names);
    Ok(Some(names))
}

/// Natural order (`node2` < `node10`, `VL15_dropped` < `link_downed`): the crate's one,
/// [`crate::topology::natural`].
pub use crate::topology::natural::{natural_cmp, sort_natural};

/// The trimmed text, or `Empty` / `NotAvailable` for the texts drivers use for "no value".
pub fn content(text: &str) -> Result<&str, ParseError> {
    let t = text.trim();
    if t.is_empty() {
        Err(ParseError::Empty)
    } else if t.starts_with("N/A") {
        Err(ParseError::NotAvailable(t.to_owned()))
    } else {
        Ok(t)
    }
}

/// A decimal unsigned counter (`"1234\n"`).
pub fn parse_u64(text: &str) -> Result<u64, ParseError> {
    let t = content(text)?;
    t.parse()
        .map_err(|_| ParseError::NotANumber(shorten(t).to_owned()))
}

/// A decimal unsigned number that fits 32 bits (`"16\n"`).
pub fn parse_u32(text: &str) -> Result<u32, ParseError> {
    let t = content(text)?;
    t.parse()
        .map_err(|_| ParseError::NotANumber(shorten(t).to_owned()))
}

/// One word (`"InfiniBand\n"` -> `"InfiniBand"`).
pub fn parse_word(text: &str) -> Result<String, ParseError> {
    Ok(content(text)?.to_owned())
}

/// At most 64 bytes of a bad text, for error messages (a garbage file can be large).
pub(crate) fn shorten(t: &str) -> &str {
    if t.len() <= 64 {
        return t;
    }
    let mut end = 64;
    while !t.is_char_boundary(end) {
        end -= 1;
    }
    &t[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_trim_and_reject_the_driver_placeholders() {
        assert_eq!(parse_u64("123456789\n"), Ok(123_456_789));
        assert_eq!(parse_u64("  42 \n"), Ok(42));
        assert_eq!(parse_u64("18446744073709551615\n"), Ok(u64::MAX));
        assert_eq!(parse_u64(""), Err(ParseError::Empty));
        assert_eq!(parse_u64("\n"), Err(ParseError::Empty));
        assert_eq!(
            parse_u64("N/A (no PMA)\n"),
            Err(ParseError::NotAvailable("N/A (no PMA)".into()))
        );
        assert!(matches!(
            parse_u64("0x1f\n"),
            Err(ParseError::NotANumber(_))
        ));
        assert!(matches!(parse_u64("-1\n"), Err(ParseError::NotANumber(_))));
        assert!(matches!(
            parse_u64("18446744073709551616\n"),
            Err(ParseError::NotANumber(_))
        ));
    }

    #[test]
    fn einval_on_read_is_a_read_error_naming_the_file() {
        // What reading `rate` on a ConnectX port in switch mode returns.
        let path = Path::new("/sys/class/infiniband/mlx5_0/ports/1/rate");
        let err = value_from(
            path,
            Err(io::Error::from_raw_os_error(libc::EINVAL)),
            parse_u64,
        )
        .unwrap_err();
        match &err {
            ReadError::Io { source, .. } => assert_eq!(source.raw_os_error(), Some(libc::EINVAL)),
            other => panic!("{other:?}"),
        }
        assert_eq!(err.path(), path);
        assert!(err.to_string().contains("ports/1/rate"), "{err}");
    }

    #[test]
    fn parse_errors_name_the_file() {
        let path = Path::new("x/port_rcv_data");
        let err = value_from(path, Ok("garbage\n".into()), parse_u64).unwrap_err();
        assert!(matches!(err, ReadError::Parse { .. }));
        assert_eq!(
            err.to_string(),
            "cannot parse x/port_rcv_data: not a number: \"garbage\""
        );
    }

    #[test]
    fn natural_order() {
        let mut names: Vec<String> = [
            "mlx5_10",
            "mlx5_2",
            "mlx5_1",
            "10",
            "2",
            "node10",
            "node9",
            "link_downed",
            "VL15_dropped",
            "a01",
            "a1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        sort_natural(&mut names);
        assert_eq!(
            names,
            [
                "2",
                "10",
                "VL15_dropped",
                "a1",
                "a01",
                "link_downed",
                "mlx5_1",
                "mlx5_2",
                "mlx5_10",
                "node9",
                "node10"
            ]
        );
    }

    #[test]
    fn shorten_respects_char_boundaries() {
        let long = "é".repeat(40);
        assert!(shorten(&long).len() <= 64);
        assert_eq!(shorten("abc"), "abc");
    }
}
