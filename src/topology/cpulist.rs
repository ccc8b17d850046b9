//! The kernel's "cpulist" text format (`0-3,8,10-11`), as found in
//! `/sys/devices/system/cpu/online`, `nodeN/cpulist`, `thread_siblings_list` and the
//! `Cpus_allowed_list:` line of `/proc/<pid>/status`: parsing into sorted ids and formatting
//! ids back into compact ranges.

use thiserror::Error;

/// Largest cpu id accepted, exclusive. Linux's `NR_CPUS` tops out far below this; the cap
/// keeps a corrupt `0-4294967295` from allocating gigabytes.
pub const MAX_CPU_ID: u32 = 1 << 20;

/// Why a cpulist could not be parsed. Every variant names the offending token.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CpuListError {
    #[error("bad cpulist token {token:?}: {reason}")]
    BadToken { token: String, reason: &'static str },
    #[error("bad cpulist range {token:?}: start {start} is greater than end {end}")]
    ReversedRange { token: String, start: u32, end: u32 },
}

/// Parse a kernel cpulist such as `"0-3,8,10-11\n"`.
///
/// An empty string (or only whitespace, e.g. the kernel's `"\n"` for an empty set) is the
/// empty list. The result is sorted ascending and deduplicated. Stride syntax (`0-7:2`) and
/// anything else that is not a decimal id or `a-b` range is rejected.
pub fn parse(s: &str) -> Result<Vec<u32>, CpuListError> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(Vec::new());
    }
    // Ranges first, ids once at the end: a list that repeats `0-1048575` a thousand times
    // costs a thousand ranges, not a thousand million ids.
    let mut ranges = Vec::new();
    for raw in s.split(',') {
        let token = raw.trim();
        if token.is_empty() {
            return Err(bad(raw, "empty entry"));
        }
        match token.split_once('-') {
            None => {
                let id = parse_id(token, token)?;
                ranges.push((id, id));
            }
            Some((a, b)) => {
                let start = parse_id(a, token)?;
                let end = parse_id(b, token)?;
                if start > end {
                    return Err(CpuListError::ReversedRange {
                        token: token.to_string(),
                        start,
                        end,
                    });
                }
                ranges.push((start, end));
            }
        }
    }
    ranges.sort_unstable();
    let mut ids = Vec::new();
    // The first id not yet listed (ids stay below MAX_CPU_ID, so `end + 1` cannot wrap).
    let mut next = 0;
    for (start, end) in ranges {
        let from = start.max(next);
        if from <= end {
            ids.extend(from..=end);
            next = end + 1;
        }
    }
    Ok(ids)
}

/// Format ids as a compact kernel cpulist (`[0, 1, 2, 3, 8]` -> `"0-3,8"`).
///
/// The input need not be sorted or unique. The empty list formats as `""`.
pub fn format(ids: &[u32]) -> String {
    let mut sorted = ids.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out = String::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && end.checked_add(1) == Some(sorted[i + 1]) {
            i += 1;
            end = sorted[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if start == end {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}-{end}"));
        }
        i += 1;
    }
    out
}

fn parse_id(s: &str, token: &str) -> Result<u32, CpuListError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(bad(token, "missing number"));
    }
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad(token, "not a decimal cpu id or a-b range"));
    }
    match s.parse::<u32>() {
        Ok(id) if id < MAX_CPU_ID => Ok(id),
        _ => Err(bad(token, "cpu id out of range")),
    }
}

fn bad(token: &str, reason: &'static str) -> CpuListError {
    CpuListError::BadToken {
        token: token.to_string(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kernel_online_file_with_newline() {
        assert_eq!(parse("0-3,8,10-11\n").unwrap(), vec![0, 1, 2, 3, 8, 10, 11]);
    }

    #[test]
    fn empty_and_newline_are_empty() {
        assert_eq!(parse("").unwrap(), Vec::<u32>::new());
        assert_eq!(parse("\n").unwrap(), Vec::<u32>::new());
        assert_eq!(parse("  \t\n").unwrap(), Vec::<u32>::new());
    }

    #[test]
    fn single_cpu_and_surrounding_whitespace() {
        assert_eq!(parse("0\n").unwrap(), vec![0]);
        assert_eq!(parse(" 1-2 , 5 ").unwrap(), vec![1, 2, 5]);
    }

    #[test]
    fn sorted_and_deduplicated() {
        assert_eq!(parse("8,0-3,2,3-4").unwrap(), vec![0, 1, 2, 3, 4, 8]);
    }

    #[test]
    fn a3_node_list_from_a_large_machine() {
        let ids = parse("0-79,320-399\n").unwrap();
        assert_eq!(ids.len(), 160);
        assert_eq!(ids[79], 79);
        assert_eq!(ids[80], 320);
    }

    #[test]
    fn rejects_garbage_naming_the_token() {
        let err = parse("0-3,x,8").unwrap_err();
        assert!(matches!(&err, CpuListError::BadToken { token, .. } if token == "x"));
        assert!(err.to_string().contains("\"x\""), "{err}");
        let err = parse("N/A").unwrap_err();
        assert!(err.to_string().contains("N/A"), "{err}");
    }

    #[test]
    fn rejects_reversed_range() {
        let err = parse("0,5-3").unwrap_err();
        assert_eq!(
            err,
            CpuListError::ReversedRange {
                token: "5-3".into(),
                start: 5,
                end: 3
            }
        );
        assert!(err.to_string().contains("5-3"), "{err}");
    }

    #[test]
    fn rejects_stride_negative_empty_entries_and_overflow() {
        for bad_list in [
            "0-7:2",
            "-1",
            "0-",
            "-",
            "1,,2",
            "1,",
            "+3",
            "0x1",
            "4294967296",
            "0-4294967295",
            "1 2",
        ] {
            let err = parse(bad_list).unwrap_err();
            assert!(
                matches!(err, CpuListError::BadToken { .. }),
                "{bad_list}: {err:?}"
            );
        }
    }

    /// A list repeating the widest range costs one copy of it (issue 14's fuzzing: a
    /// corrupt 10 KB list once meant 4 GB of ids).
    #[test]
    fn repeated_ranges_are_listed_once() {
        let widest = format!("0-{}", MAX_CPU_ID - 1);
        let list = vec![widest.as_str(); 1000].join(",");
        let ids = parse(&list).unwrap();
        assert_eq!(ids.len(), MAX_CPU_ID as usize);
        assert!(ids.iter().enumerate().all(|(i, &id)| id as usize == i));
        assert_eq!(parse("5,3-4,0,4-6,2").unwrap(), vec![0, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn formats_compact_ranges() {
        assert_eq!(format(&[]), "");
        assert_eq!(format(&[5]), "5");
        assert_eq!(format(&[0, 1, 2, 3, 8]), "0-3,8");
        assert_eq!(format(&[0, 1, 3, 4, 6]), "0-1,3-4,6");
        assert_eq!(format(&[8, 3, 2, 1, 0, 2]), "0-3,8");
        assert_eq!(
            format(&[u32::MAX - 1, u32::MAX]),
            format!("{}-{}", u32::MAX - 1, u32::MAX)
        );
    }

    #[test]
    fn format_then_parse_round_trips() {
        for list in ["0-3,8,10-11", "0", "1-3", "0-79,320-399", ""] {
            assert_eq!(format(&parse(list).unwrap()), list);
        }
    }
}
