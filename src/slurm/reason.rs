//! The drain reason chd writes, `chd: <causes>`, and how chd knows its own. Slurm keeps a
//! node's reason as a plain string, but slurmdbd stores it in the event table's `reason`
//! column, a MySQL `tinytext` (src/plugins/accounting_storage/mysql/accounting_storage_mysql.c,
//! `event_table_fields`), which holds 255 bytes; `scontrol update` strips one leading and one
//! trailing `"` from `Reason=` (src/scontrol/update_node.c), and `scontrol show node` starts a
//! new line at every newline of it. So the reason is printable ASCII on one line, without
//! double quotes, at most 255 bytes, cut at a cause boundary where it can be.

use crate::analysis::verdict::Cause;

/// What every reason chd writes starts with; a drain whose reason does not is someone else's.
pub const PREFIX: &str = "chd:";

/// The longest reason slurmdbd keeps whole (a `tinytext` column).
pub const MAX_BYTES: usize = 255;

/// Whether a node's reason is one chd wrote.
pub fn is_chd(reason: &str) -> bool {
    reason.starts_with(PREFIX)
}

/// `chd: device 0 slow column (0.21 x the typical device); ...`, within [`MAX_BYTES`].
pub fn reason(causes: &[Cause]) -> String {
    let texts: Vec<String> = causes.iter().map(|c| clean(&c.text)).collect();
    let mut out = format!("{PREFIX} {}", texts.join("; "));
    if out.len() > MAX_BYTES {
        // Whole causes while they fit, then the count of those left out.
        let mut kept = format!("{PREFIX} ");
        for (i, text) in texts.iter().enumerate() {
            let more = format!(" (+{} more)", texts.len() - i);
            let sep = if i == 0 { "" } else { "; " };
            if kept.len() + sep.len() + text.len() + more.len() > MAX_BYTES {
                if i == 0 {
                    // One cause alone is too long: cut it (ASCII, so any byte is a boundary).
                    let room = MAX_BYTES - kept.len() - 3;
                    kept.push_str(&text[..room]);
                    kept.push_str("...");
                } else {
                    kept.push_str(&more);
                }
                break;
            }
            kept.push_str(sep);
            kept.push_str(text);
        }
        out = kept;
    }
    out
}

/// Printable ASCII on one line without double quotes.
fn clean(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '"' => '\'',
            '\n' | '\r' | '\t' => ' ',
            c if c.is_ascii_graphic() || c == ' ' => c,
            _ => '?',
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::verdict::Level;

    fn cause(text: &str) -> Cause {
        Cause {
            id: text.into(),
            level: Level::Failed,
            text: text.into(),
            device: None,
        }
    }

    #[test]
    fn the_causes_joined_after_the_prefix() {
        let r = reason(&[
            cause("device 0 slow column (0.22 x the typical device)"),
            cause("pair 0,3: CPU 6 as rank 0 slow"),
        ]);
        assert_eq!(
            r,
            "chd: device 0 slow column (0.22 x the typical device); pair 0,3: CPU 6 as rank 0 slow"
        );
        assert!(is_chd(&r));
        assert!(!is_chd("maintenance (chd: no)"));
    }

    #[test]
    fn quotes_newlines_and_non_ascii_never_reach_slurm() {
        let r = reason(&[cause("\"device\"\n0 – slow")]);
        assert_eq!(r, "chd: 'device' 0 ? slow");
    }

    #[test]
    fn many_causes_fit_in_255_bytes_whole_and_counted() {
        let causes: Vec<Cause> = (0..16)
            .map(|d| {
                cause(&format!(
                    "device {d} slow column (0.2{d} x the typical device)"
                ))
            })
            .collect();
        let r = reason(&causes);
        assert!(r.len() <= MAX_BYTES, "{} bytes: {r}", r.len());
        assert!(r.starts_with("chd: device 0 slow column (0.20 x the typical device); device 1 "));
        assert!(r.ends_with(" more)"), "{r}");
        let kept = r.matches("slow column").count();
        assert!(r.ends_with(&format!("(+{} more)", 16 - kept)), "{r}");
        // One cause longer than the limit is cut.
        let long = reason(&[cause(&"x".repeat(400))]);
        assert_eq!(long.len(), MAX_BYTES);
        assert!(long.ends_with("x..."));
    }
}
