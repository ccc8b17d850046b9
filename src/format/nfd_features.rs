//! A Node Feature Discovery feature file (`/etc/kubernetes/node-feature-discovery/features.d/`):
//! one `name=value` line per label, `#` comments, and the `# +expiry-time=<RFC 3339>` directive
//! after which nfd-worker ignores the lines that follow (so labels written by a chd that has
//! died go away instead of lying). nfd-worker reads every file of the directory whose name does
//! not start with `.`, at most 64 KiB each (NFD's `source/local/local.go`), so the file is
//! written as a hidden temporary file and renamed over the old one ([`super::atomic_file`]:
//! the directory is group-writable, so the temporary file gets a random name and is never
//! opened through a planted symlink or FIFO): NFD never reads half a file.
//!
//! Names carry the `chd.feature.node.kubernetes.io/` prefix: NFD accepts sub-namespaces of
//! `feature.node.kubernetes.io` without extra configuration (`-extra-label-ns`). Values follow
//! Kubernetes' label value rules (at most 63 characters of `[A-Za-z0-9._-]`, alphanumeric at both
//! ends).

use std::io::Write;
use std::path::{Path, PathBuf};

/// The namespace of every label chd writes.
pub const LABEL_PREFIX: &str = "chd.feature.node.kubernetes.io/";

/// nfd-worker's limit on one feature file.
pub const MAX_FILE_BYTES: usize = 65_536;

/// Why a feature file could not be made or written.
#[derive(Debug, thiserror::Error)]
pub enum NfdError {
    #[error("label {name:?}: {problem}")]
    Label { name: String, problem: &'static str },
    #[error("feature file of {0} bytes is over NFD's 64 KiB limit")]
    TooBig(usize),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Whether `value` is a valid Kubernetes label value.
pub fn valid_value(value: &str) -> bool {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    value.is_empty()
        || (value.len() <= 63
            && value.chars().all(ok_char)
            && value.starts_with(|c: char| c.is_ascii_alphanumeric())
            && value.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

/// The file's text: a header comment, the expiry directive, then `labels` (name without the
/// prefix, value) in the order given.
pub fn render(
    labels: &[(String, String)],
    expires_rfc3339: &str,
    comment: &str,
) -> Result<String, NfdError> {
    let mut text = String::new();
    for line in comment.lines() {
        text.push_str("# ");
        text.push_str(line);
        text.push('\n');
    }
    text.push_str("# +expiry-time=");
    text.push_str(expires_rfc3339);
    text.push('\n');
    for (name, value) in labels {
        let bad = |problem| NfdError::Label {
            name: name.clone(),
            problem,
        };
        let name_ok = !name.is_empty()
            && name.len() <= 63
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !name_ok {
            return Err(bad("not a label name (at most 63 of [A-Za-z0-9._-])"));
        }
        if !valid_value(value) {
            return Err(bad(
                "not a label value (at most 63 of [A-Za-z0-9._-], alphanumeric at both ends)",
            ));
        }
        text.push_str(LABEL_PREFIX);
        text.push_str(name);
        text.push('=');
        text.push_str(value);
        text.push('\n');
    }
    if text.len() > MAX_FILE_BYTES {
        return Err(NfdError::TooBig(text.len()));
    }
    Ok(text)
}

/// Write `text` to `path` through a hidden temporary file in the same directory (which NFD
/// skips), synced, then renamed over `path` ([`super::atomic_file::write`]).
pub fn write(path: &Path, text: &str) -> Result<(), NfdError> {
    super::atomic_file::write(path, |f| f.write_all(text.as_bytes())).map_err(|source| {
        NfdError::Io {
            path: path.to_path_buf(),
            source,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prefixed_labels_after_the_expiry_directive() {
        let text = render(
            &[
                ("verdict".into(), "degraded".into()),
                ("slow-devices".into(), "0_3".into()),
            ],
            "2026-12-01T17:00:00Z",
            "written by chd",
        )
        .unwrap();
        assert_eq!(
            text,
            "# written by chd\n# +expiry-time=2026-12-01T17:00:00Z\n\
             chd.feature.node.kubernetes.io/verdict=degraded\n\
             chd.feature.node.kubernetes.io/slow-devices=0_3\n"
        );
    }

    #[test]
    fn refuses_what_kubernetes_would_refuse() {
        for value in ["0,3", "-x", "x-", &"a".repeat(64), "a b"] {
            assert!(!valid_value(value), "{value}");
            assert!(
                render(&[("v".into(), value.into())], "t", "").is_err(),
                "{value}"
            );
        }
        for value in ["", "0", "0_3", "degraded", "a.b-c_d"] {
            assert!(valid_value(value), "{value}");
        }
        assert!(render(&[("a/b".into(), "x".into())], "t", "").is_err());
    }

    #[test]
    fn writes_through_a_hidden_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chd");
        write(&path, "a=1\n").unwrap();
        write(&path, "a=2\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a=2\n");
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["chd"]);
        let missing = dir.path().join("no/such/dir/chd");
        assert!(matches!(write(&missing, "a=1\n"), Err(NfdError::Io { .. })));
    }
}
