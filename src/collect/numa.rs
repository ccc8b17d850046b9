//! `numa`: per-node allocation events and memory from
//! `<sysfs>/devices/system/node/node<N>/{numastat,meminfo}`.
//!
//! | metric | type | labels | source |
//! |---|---|---|---|
//! | `chd_numa_events_total` | counter | numa_node, event | `numastat` rows as named there: `numa_hit`, `numa_miss`, `numa_foreign`, `interleave_hit`, `local_node`, `other_node` |
//! | `chd_numa_memory_bytes` | gauge | numa_node, kind | `meminfo` rows in kB, x 1024: by default only the kinds of [`MEMORY_KINDS`]; every row with `numa_memory_all = true` |
//!
//! The default kinds (issue 28 part 4, the series budget): a 6.x kernel prints 33 kB rows per
//! node, 264 series on an 8-node host, of which the dashboards read `total`, `used` and
//! `free`; [`MEMORY_KINDS`] keeps those and the ones that say where a node's memory went.
//!
//! `kind` is the meminfo field in snake case, with the `Mem` prefix dropped:
//! `MemTotal` -> `total`, `MemFree` -> `free`, `MemUsed` -> `used`, `Active(anon)` ->
//! `active_anon`, `FilePages` -> `file_pages`, `KernelStack` -> `kernel_stack`,
//! `NFS_Unstable` -> `nfs_unstable`, `KReclaimable` -> `k_reclaimable`, `SUnreclaim` ->
//! `s_unreclaim`, `AnonHugePages` -> `anon_huge_pages`, ... (one rule, so fields new kernels
//! add get a predictable name). `HugePages_Total`/`_Free`/`_Surp` are page counts, not kB:
//! they are skipped (not an error), since a count has no place in a `_bytes` metric.
//!
//! No `devices/system/node` (a kernel without NUMA) is quiet; a node whose file is missing
//! or a row that does not parse costs those series and counts read errors.

use std::path::{Path, PathBuf};

use super::read::{self, list_dir, ParseError};
use super::{CollectError, CollectorSpec, OptionField, OptionSpec, Sink, SysCollector};

const EVENTS: &str = "chd_numa_events_total";
const MEMORY: &str = "chd_numa_memory_bytes";

/// The `kind`s of `chd_numa_memory_bytes` exported by default: the node's size and what is
/// free and used (the dashboards' panels), what the used memory is (page cache, anonymous,
/// shared, kernel slab, transparent huge pages), what cannot be reclaimed (pinned and
/// locked pages: pinned host buffers of copies land here) and what is waiting for I/O.
pub const MEMORY_KINDS: [&str; 12] = [
    "total",
    "free",
    "used",
    "file_pages",
    "anon_pages",
    "shmem",
    "slab",
    "anon_huge_pages",
    "unevictable",
    "mlocked",
    "dirty",
    "writeback",
];

/// The numa collector.
#[derive(Debug)]
pub struct NumaCollector {
    node_dir: PathBuf,
    /// Every `meminfo` row, not only [`MEMORY_KINDS`].
    all_memory: bool,
}

impl NumaCollector {
    pub fn new(sysfs: &Path, all_memory: bool) -> NumaCollector {
        NumaCollector {
            node_dir: sysfs.join("devices/system/node"),
            all_memory,
        }
    }
}

/// The `numa` row of the collector table.
pub const SPEC: CollectorSpec = CollectorSpec {
    name: "numa",
    default_enabled: true,
    help: "NUMA numastat events and per-node memory",
    options: &[OptionSpec {
        key: "numa_memory_all",
        help: "Export every meminfo row of each NUMA node, not only the default kinds",
        field: OptionField::Switch(|s| &mut s.numa_memory_all),
    }],
    build: |ctx| {
        Some(Box::new(NumaCollector::new(
            &ctx.roots.sysfs,
            ctx.settings.numa_memory_all,
        )))
    },
};

/// One row of `numastat`: `"numa_hit 123"` -> `("numa_hit", 123)`.
pub fn parse_numastat(text: &str) -> Vec<Result<(String, u64), ParseError>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let mut fields = line.split_whitespace();
            match (fields.next(), fields.next(), fields.next()) {
                (Some(event), Some(value), None) => Ok((event.to_owned(), read::parse_u64(value)?)),
                _ => Err(ParseError::Format(read::shorten(line.trim()).to_owned())),
            }
        })
        .collect()
}

/// One row of a node's `meminfo` in bytes, `None` for the page-count rows (`HugePages_*`).
pub fn parse_meminfo_row(line: &str) -> Result<Option<(String, u64)>, ParseError> {
    let bad = || ParseError::Format(read::shorten(line.trim()).to_owned());
    let mut fields = line.split_whitespace();
    // "Node" "<id>" "<Field>:" "<value>" ["kB"]
    if fields.next() != Some("Node") {
        return Err(bad());
    }
    fields.next().ok_or_else(bad)?;
    let field = fields
        .next()
        .and_then(|f| f.strip_suffix(':'))
        .ok_or_else(bad)?;
    let value = fields.next().ok_or_else(bad)?;
    let scale = match (fields.next(), fields.next()) {
        (Some("kB"), None) => 1024,
        (None, None) => return Ok(None),
        _ => return Err(bad()),
    };
    let bytes = read::parse_u64(value)?
        .checked_mul(scale)
        .ok_or_else(|| ParseError::NotANumber(value.to_owned()))?;
    Ok(Some((meminfo_kind(field), bytes)))
}

/// Every row of a node's `meminfo`.
pub fn parse_meminfo(text: &str) -> Vec<Result<(String, u64), ParseError>> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| parse_meminfo_row(l).transpose())
        .collect()
}

/// `MemTotal` -> `total`, `Active(anon)` -> `active_anon`, `NFS_Unstable` ->
/// `nfs_unstable`, `KReclaimable` -> `k_reclaimable`.
pub fn meminfo_kind(field: &str) -> String {
    let field = match field.strip_prefix("Mem") {
        Some(rest) if rest.starts_with(|c: char| c.is_ascii_uppercase()) => rest,
        _ => field,
    };
    let chars: Vec<char> = field.chars().collect();
    let mut out = String::with_capacity(field.len() + 4);
    for (i, &c) in chars.iter().enumerate() {
        let prev = i.checked_sub(1).map(|p| chars[p]);
        let next = chars.get(i + 1).copied();
        match c {
            '(' | '_' | ' ' | '-' => {
                if !out.is_empty() && !out.ends_with('_') {
                    out.push('_');
                }
            }
            ')' => {}
            c if c.is_ascii_uppercase() => {
                let boundary = match prev {
                    Some(p) if p.is_ascii_lowercase() || p.is_ascii_digit() => true,
                    Some(p) if p.is_ascii_uppercase() => {
                        next.is_some_and(|n| n.is_ascii_lowercase())
                    }
                    _ => false,
                };
                if boundary && !out.ends_with('_') {
                    out.push('_');
                }
                out.push(c.to_ascii_lowercase());
            }
            c => out.push(c.to_ascii_lowercase()),
        }
    }
    out
}

/// Node ids from `node<N>` names.
fn node_ids(names: &[String]) -> impl Iterator<Item = &str> {
    names.iter().filter_map(|n| {
        let id = n.strip_prefix("node")?;
        (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit())).then_some(id)
    })
}

impl SysCollector for NumaCollector {
    fn name(&self) -> &'static str {
        "numa"
    }

    fn collect(&self, out: &mut Sink) -> Result<(), CollectError> {
        let names = match list_dir(&self.node_dir) {
            Ok(Some(names)) => names,
            // Kernel without NUMA support: nothing to report.
            Ok(None) => return Ok(()),
            Err(source) => {
                return Err(CollectError::List {
                    path: self.node_dir.clone(),
                    source,
                })
            }
        };
        for id in node_ids(&names) {
            let dir = self.node_dir.join(format!("node{id}"));
            let path = dir.join("numastat");
            for row in out
                .read(&path, |t| Ok(parse_numastat(t)))
                .unwrap_or_default()
            {
                match row {
                    Ok((event, value)) => out.counter(
                        EVENTS,
                        "NUMA allocation events of the node (numastat)",
                        [("numa_node", id), ("event", &event)],
                        value,
                    ),
                    Err(e) => out.parse_error(&path, e),
                }
            }
            let path = dir.join("meminfo");
            for row in out
                .read(&path, |t| Ok(parse_meminfo(t)))
                .unwrap_or_default()
            {
                match row {
                    Ok((kind, _)) if !self.all_memory && !MEMORY_KINDS.contains(&kind.as_str()) => {
                    }
                    Ok((kind, bytes)) => out.gauge(
                        MEMORY,
                        "Memory of the NUMA node by kind (nodeN/meminfo), bytes",
                        [("numa_node", id), ("kind", &kind)],
                        bytes,
                    ),
                    Err(e) => out.parse_error(&path, e),
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `node0/numastat` of a dual-socket Sapphire Rapids server.
    const SPR_NUMASTAT: &str = "numa_hit 1794537813\nnuma_miss 0\nnuma_foreign 0\n\
interleave_hit 3046\nlocal_node 1794350195\nother_node 187618\n";

    /// Rows of `node0/meminfo` of the same machine (6.5 kernel).
    const SPR_MEMINFO: &str = "\
Node 0 MemTotal:       263783792 kB
Node 0 MemFree:        240152700 kB
Node 0 MemUsed:         23631092 kB
Node 0 Active(anon):     1349320 kB
Node 0 NFS_Unstable:           0 kB
Node 0 KReclaimable:      923364 kB
Node 0 SUnreclaim:        600836 kB
Node 0 HugePages_Total:     0
Node 0 HugePages_Free:      0
Node 0 HugePages_Surp:      0
";

    #[test]
    fn numastat_of_a_sapphire_rapids_node() {
        let rows: Vec<_> = parse_numastat(SPR_NUMASTAT)
            .into_iter()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(rows.len(), 6);
        assert_eq!(rows[0], ("numa_hit".to_string(), 1_794_537_813));
        assert_eq!(rows[5], ("other_node".to_string(), 187_618));
    }

    #[test]
    fn numastat_bad_rows_cost_one_each() {
        let rows = parse_numastat("numa_hit 1\nnuma_miss N/A\ngarbage\n\nlocal_node 3 4\n");
        assert_eq!(rows.len(), 4);
        assert!(rows[0].is_ok());
        assert!(matches!(rows[1], Err(ParseError::NotAvailable(_))));
        assert!(matches!(rows[2], Err(ParseError::Format(_))));
        assert!(matches!(rows[3], Err(ParseError::Format(_))));
    }

    #[test]
    fn meminfo_of_a_sapphire_rapids_node() {
        let rows: Vec<(String, u64)> = parse_meminfo(SPR_MEMINFO)
            .into_iter()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            rows,
            [
                ("total".to_string(), 263_783_792 * 1024),
                ("free".to_string(), 240_152_700 * 1024),
                ("used".to_string(), 23_631_092 * 1024),
                ("active_anon".to_string(), 1_349_320 * 1024),
                ("nfs_unstable".to_string(), 0),
                ("k_reclaimable".to_string(), 923_364 * 1024),
                ("s_unreclaim".to_string(), 600_836 * 1024),
            ]
        );
    }

    #[test]
    fn meminfo_bad_rows() {
        assert!(matches!(
            parse_meminfo_row("Node 0 MemFree: lots kB"),
            Err(ParseError::NotANumber(_))
        ));
        assert!(matches!(
            parse_meminfo_row("MemFree: 1 kB"),
            Err(ParseError::Format(_))
        ));
        assert!(matches!(
            parse_meminfo_row("Node 0 MemFree: 1 MB"),
            Err(ParseError::Format(_))
        ));
        assert!(matches!(
            parse_meminfo_row("Node 0 MemFree: 18446744073709551615 kB"),
            Err(ParseError::NotANumber(_))
        ));
    }

    #[test]
    fn kind_names() {
        for (field, kind) in [
            ("MemTotal", "total"),
            ("MemUsed", "used"),
            ("Mlocked", "mlocked"),
            ("Active", "active"),
            ("Inactive(file)", "inactive_file"),
            ("FilePages", "file_pages"),
            ("KernelStack", "kernel_stack"),
            ("PageTables", "page_tables"),
            ("SecPageTables", "sec_page_tables"),
            ("NFS_Unstable", "nfs_unstable"),
            ("WritebackTmp", "writeback_tmp"),
            ("SReclaimable", "s_reclaimable"),
            ("AnonHugePages", "anon_huge_pages"),
            ("ShmemPmdMapped", "shmem_pmd_mapped"),
            ("HugePages_Total", "huge_pages_total"),
        ] {
            assert_eq!(meminfo_kind(field), kind, "{field}");
        }
    }
}
