//! Slurm hostlist expressions expanded to node names, as `scontrol show hostnames` does:
//! `node[01-04,07],gpu-[1-2]` is node01 node02 node03 node04 node07 gpu-1 gpu-2.
//!
//! Hosts are separated by commas or whitespace outside brackets. A bracket holds numbers and
//! ranges (`lo-hi`, `lo <= hi`) separated by commas; a number is printed with at least as
//! many digits as the bracket's lower bound has (`[08-10]` is 08 09 10, `[8-10]` 8 9 10).
//! Several brackets in one host multiply out, the last varying fastest (`r[1-2]n[1-2]` is
//! r1n1 r1n2 r2n1 r2n2). Order and repeats are kept as written; the node list judges them.

use thiserror::Error;

/// The most names one expression may expand to: a fleet is thousands of nodes, and a typo
/// like `n[0-9999999999]` must be an error, not all of memory.
pub const MAX_HOSTS: usize = 65_536;

/// Why an expression is not a hostlist.
#[derive(Debug, Error, PartialEq)]
pub enum HostlistError {
    #[error("hostlist {expression:?}: '[' at byte {at} is never closed")]
    Unclosed { expression: String, at: usize },
    #[error("hostlist {expression:?}: ']' at byte {at} closes no '['")]
    UnopenedClose { expression: String, at: usize },
    #[error("hostlist {expression:?}: '[' inside a bracket at byte {at}")]
    Nested { expression: String, at: usize },
    #[error("hostlist {expression:?}: {range:?} is not a number or a range lo-hi of numbers")]
    BadRange { expression: String, range: String },
    #[error("hostlist {expression:?}: range {range:?} runs backwards")]
    Backwards { expression: String, range: String },
    #[error("hostlist {expression:?}: an empty bracket []")]
    EmptyBracket { expression: String },
    #[error("hostlist {expression:?} names more than {MAX_HOSTS} hosts")]
    TooMany { expression: String },
}

/// The node names of `expression`, in the order written (empty for an empty expression).
pub fn expand(expression: &str) -> Result<Vec<String>, HostlistError> {
    let mut hosts = Vec::new();
    for host in split_hosts(expression)? {
        let parts = parse_host(expression, host)?;
        let count = parts.iter().try_fold(1usize, |n, part| match part {
            Part::Text(_) => Some(n),
            Part::Numbers(numbers) => n.checked_mul(numbers.len()),
        });
        match count {
            Some(n) if hosts.len() + n <= MAX_HOSTS => multiply_out(&parts, &mut hosts),
            _ => {
                return Err(HostlistError::TooMany {
                    expression: expression.to_string(),
                })
            }
        }
    }
    Ok(hosts)
}

/// One piece of a host expression: literal text or one bracket's numbers, already formatted.
enum Part<'a> {
    Text(&'a str),
    Numbers(Vec<String>),
}

/// The host expressions of a hostlist: split at commas and whitespace outside brackets.
fn split_hosts(expression: &str) -> Result<Vec<&str>, HostlistError> {
    let mut hosts = Vec::new();
    let mut start = 0;
    let mut open: Option<usize> = None;
    for (at, c) in expression.char_indices() {
        match c {
            '[' if open.is_some() => {
                return Err(HostlistError::Nested {
                    expression: expression.to_string(),
                    at,
                })
            }
            '[' => open = Some(at),
            ']' if open.is_none() => {
                return Err(HostlistError::UnopenedClose {
                    expression: expression.to_string(),
                    at,
                })
            }
            ']' => open = None,
            c if open.is_none() && (c == ',' || c.is_whitespace()) => {
                hosts.push(&expression[start..at]);
                start = at + c.len_utf8();
            }
            _ => {}
        }
    }
    if let Some(at) = open {
        return Err(HostlistError::Unclosed {
            expression: expression.to_string(),
            at,
        });
    }
    hosts.push(&expression[start..]);
    Ok(hosts.into_iter().filter(|h| !h.is_empty()).collect())
}

/// One host expression (brackets balanced, none nested) as text and number parts.
fn parse_host<'a>(expression: &str, host: &'a str) -> Result<Vec<Part<'a>>, HostlistError> {
    let mut parts = Vec::new();
    let mut rest = host;
    while let Some(open) = rest.find('[') {
        let close = open
            + rest[open..]
                .find(']')
                .expect("split_hosts balanced the brackets");
        if open > 0 {
            parts.push(Part::Text(&rest[..open]));
        }
        parts.push(Part::Numbers(bracket_numbers(
            expression,
            &rest[open + 1..close],
        )?));
        rest = &rest[close + 1..];
    }
    if !rest.is_empty() {
        parts.push(Part::Text(rest));
    }
    Ok(parts)
}

/// The numbers of one bracket's inside (`01-04,07`), each formatted to the width of the lower
/// bound it came from.
fn bracket_numbers(expression: &str, inside: &str) -> Result<Vec<String>, HostlistError> {
    if inside.trim().is_empty() {
        return Err(HostlistError::EmptyBracket {
            expression: expression.to_string(),
        });
    }
    let bad = |range: &str| HostlistError::BadRange {
        expression: expression.to_string(),
        range: range.to_string(),
    };
    let mut numbers = Vec::new();
    for range in inside.split(',') {
        let (lo_text, hi_text) = range.split_once('-').unwrap_or((range, range));
        let lo = number(lo_text).ok_or_else(|| bad(range))?;
        let hi = number(hi_text).ok_or_else(|| bad(range))?;
        if hi < lo {
            return Err(HostlistError::Backwards {
                expression: expression.to_string(),
                range: range.to_string(),
            });
        }
        if numbers.len() as u64 + (hi - lo) >= MAX_HOSTS as u64 {
            return Err(HostlistError::TooMany {
                expression: expression.to_string(),
            });
        }
        let width = lo_text.len();
        numbers.extend((lo..=hi).map(|n| format!("{n:0width$}")));
    }
    Ok(numbers)
}

/// A bracket's decimal number: ASCII digits only (no sign, no space).
fn number(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Every combination of the parts' choices, the last part varying fastest.
fn multiply_out(parts: &[Part], hosts: &mut Vec<String>) {
    let mut names = vec![String::new()];
    for part in parts {
        names = match part {
            Part::Text(text) => names.into_iter().map(|n| n + text).collect(),
            Part::Numbers(numbers) => names
                .iter()
                .flat_map(|n| numbers.iter().map(move |x| format!("{n}{x}")))
                .collect(),
        };
    }
    hosts.extend(names);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(expression: &str) -> Vec<String> {
        expand(expression).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_bracket_keeps_the_lower_bounds_width() {
        assert_eq!(
            names("node[01-04,07]"),
            ["node01", "node02", "node03", "node04", "node07"]
        );
        assert_eq!(names("x[009-011]"), ["x009", "x010", "x011"]);
        assert_eq!(names("y[8-10]"), ["y8", "y9", "y10"]);
        assert_eq!(names("n[01-2]"), ["n01", "n02"]);
    }

    #[test]
    fn hosts_split_at_commas_and_whitespace_outside_brackets() {
        assert_eq!(names("a,b[1-2] c\td[3],\n"), ["a", "b1", "b2", "c", "d3"]);
        assert_eq!(names(""), Vec::<String>::new());
        assert_eq!(names(" , "), Vec::<String>::new());
    }

    #[test]
    fn several_brackets_multiply_the_last_fastest() {
        assert_eq!(
            names("rack[1-2]-n[8-9]"),
            ["rack1-n8", "rack1-n9", "rack2-n8", "rack2-n9"]
        );
        assert_eq!(names("gpu[1-2]-ib"), ["gpu1-ib", "gpu2-ib"]);
    }

    #[test]
    fn repeats_and_order_are_kept_as_written() {
        assert_eq!(names("b,a,b"), ["b", "a", "b"]);
    }

    #[test]
    fn bad_expressions_say_what_is_wrong() {
        let cases = [
            ("a[1-2", "'[' at byte 1 is never closed"),
            ("a]1", "']' at byte 1 closes no '['"),
            ("a[1[2]]", "'[' inside a bracket at byte 3"),
            ("a[x]", "\"x\" is not a number or a range"),
            ("a[1-]", "\"1-\" is not a number or a range"),
            ("a[-1]", "\"-1\" is not a number or a range"),
            ("a[1,,2]", "\"\" is not a number or a range"),
            ("a[3-1]", "range \"3-1\" runs backwards"),
            ("a[]", "an empty bracket"),
            ("a[0-99999999999]", "names more than 65536 hosts"),
            ("a[0-999]b[0-999]", "names more than 65536 hosts"),
        ];
        for (expression, expected) in cases {
            let error = expand(expression).unwrap_err().to_string();
            assert!(
                error.contains(expected) && error.contains(expression),
                "{expression}: {error}"
            );
        }
    }

    #[test]
    fn exactly_the_limit_is_allowed() {
        assert_eq!(names("n[1-65536]").len(), MAX_HOSTS);
        assert!(expand("n[1-65536],m").is_err());
    }
}
