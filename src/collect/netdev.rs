//! `netdev`: traffic and error counters of network interfaces from `<procfs>/net/dev`, by
//! default only for the netdevs behind RDMA ports (`device/net/` of each HCA the HCA
//! filter allows, see `rdma`), or for every netdev with `netdev_all`; the netdev
//! include/exclude filter applies on top of either.
//!
//! | metric | type | labels | columns of `/proc/net/dev` |
//! |---|---|---|---|
//! | `chd_netdev_bytes_total` | counter | netdev, direction | bytes |
//! | `chd_netdev_packets_total` | counter | netdev, direction | packets |
//! | `chd_netdev_errors_total` | counter | netdev, direction, kind | receive: `errs`, `drop`, `fifo`, `frame`; transmit: `errs`, `drop`, `fifo`, `colls`, `carrier` |
//!
//! `direction` is `receive` or `transmit`; `kind` is the column's name as the kernel's header
//! spells it. `compressed` and receive `multicast` are not errors and not exported.
//!
//! `/proc/net/dev` is the collector's one source: if it cannot be read the collector fails
//! (`chd_collector_success{collector="netdev"} 0`). A selected row with fewer than 16 values
//! costs the whole row and one read error; a value that is not a number costs that series
//! and one. Rows of netdevs that are not selected are not looked at (their problems are not
//! counted), nor is a row without a name unless every netdev is selected.
//!
//! A netdev name may hold any byte but `/`, `:` and whitespace (`dev_valid_name`,
//! net/core/dev.c), so the file need not be UTF-8: it is decoded lossily, and a row whose
//! name is not UTF-8 (it cannot be a label value) counts as a row without a name. Before,
//! one such interface failed the collector and took every netdev's series with it.

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;

use super::read::{self, ParseError};
use super::{
    rdma, CollectError, CollectorSpec, NameFilter, OptionField, OptionSpec, Sink, SysCollector,
};
use crate::topology::Roots;

const BYTES: &str = "chd_netdev_bytes_total";
const PACKETS: &str = "chd_netdev_packets_total";
const ERRORS: &str = "chd_netdev_errors_total";

/// Columns of one row, in `/proc/net/dev` order.
const COLUMNS: usize = 16;
/// Receive columns exported as errors: (index, kind).
const RECEIVE_ERRORS: [(usize, &str); 4] = [(2, "errs"), (3, "drop"), (4, "fifo"), (5, "frame")];
/// Transmit columns exported as errors.
const TRANSMIT_ERRORS: [(usize, &str); 5] = [
    (10, "errs"),
    (11, "drop"),
    (12, "fifo"),
    (13, "colls"),
    (14, "carrier"),
];

/// The netdev collector.
#[derive(Debug)]
pub struct NetdevCollector {
    sysfs: PathBuf,
    net_dev: PathBuf,
    all: bool,
    hcas: NameFilter,
    netdevs: NameFilter,
}

impl NetdevCollector {
    pub fn new(roots: &Roots, all: bool, hcas: NameFilter, netdevs: NameFilter) -> Self {
        NetdevCollector {
            sysfs: roots.sysfs.clone(),
            net_dev: roots.procfs.join("net/dev"),
            all,
            hcas,
            netdevs,
        }
    }
}

/// The `netdev` row of the collector table (it also applies the rdma row's HCA filter).
pub const SPEC: CollectorSpec = CollectorSpec {
    name: "netdev",
    default_enabled: true,
    help: "/proc/net/dev for the netdevs behind RDMA ports",
    options: &[
        OptionSpec {
            key: "netdev_all",
            help: "Export every netdev, not only those behind RDMA ports",
            field: OptionField::Switch(|s| &mut s.netdev_all),
        },
        OptionSpec {
            key: "netdev_include",
            help: "Only netdevs whose name matches",
            field: OptionField::Pattern(|s| &mut s.netdev_include),
        },
        OptionSpec {
            key: "netdev_exclude",
            help: "Skip netdevs whose name matches",
            field: OptionField::Pattern(|s| &mut s.netdev_exclude),
        },
    ],
    build: |ctx| {
        Some(Box::new(NetdevCollector::new(
            ctx.roots,
            ctx.settings.netdev_all,
            ctx.settings.hcas(),
            ctx.settings.netdevs(),
        )))
    },
};

/// One interface row: its name and its 16 values, each parsed on its own (`Err` for the
/// whole row when it has fewer).
#[derive(Debug, PartialEq, Eq)]
pub struct NetDevRow {
    pub name: String,
    pub values: Result<Vec<Result<u64, ParseError>>, ParseError>,
}

/// The interface rows of `/proc/net/dev` (the two header lines skipped); `Err` for a row
/// without an interface name.
pub fn parse_net_dev(text: &str) -> Vec<Result<NetDevRow, ParseError>> {
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.contains('|'))
        .map(parse_row)
        .collect()
}

/// `"  eth0: 1 2 3 ..."`; long names leave no space after the colon (`"enp65s0f0np0:123"`).
fn parse_row(line: &str) -> Result<NetDevRow, ParseError> {
    let bad = || ParseError::Format(read::shorten(line.trim()).to_owned());
    let (name, rest) = line.split_once(':').ok_or_else(bad)?;
    let name = name.trim();
    if name.is_empty() {
        return Err(bad());
    }
    let values: Vec<_> = rest.split_whitespace().map(read::parse_u64).collect();
    Ok(NetDevRow {
        name: name.to_owned(),
        values: if values.len() < COLUMNS {
            Err(bad())
        } else {
            Ok(values)
        },
    })
}

impl NetdevCollector {
    fn export(&self, out: &mut Sink, netdev: &str, values: &[Result<u64, ParseError>]) {
        let value = |out: &mut Sink, i: usize| match &values[i] {
            Ok(v) => Some(*v),
            Err(e) => {
                out.parse_error(&self.net_dev, e.clone());
                None
            }
        };
        for (direction, base) in [("receive", 0), ("transmit", 8)] {
            if let Some(v) = value(out, base) {
                out.counter(
                    BYTES,
                    "Bytes the network interface received or transmitted",
                    [("netdev", netdev), ("direction", direction)],
                    v,
                );
            }
            if let Some(v) = value(out, base + 1) {
                out.counter(
                    PACKETS,
                    "Packets the network interface received or transmitted",
                    [("netdev", netdev), ("direction", direction)],
                    v,
                );
            }
            let kinds: &[(usize, &str)] = if base == 0 {
                &RECEIVE_ERRORS
            } else {
                &TRANSMIT_ERRORS
            };
            for &(i, kind) in kinds {
                if let Some(v) = value(out, i) {
                    out.counter(
                        ERRORS,
                        "Errors and drops of the network interface by /proc/net/dev column",
                        [("netdev", netdev), ("direction", direction), ("kind", kind)],
                        v,
                    );
                }
            }
        }
    }

    fn wanted(&self) -> Option<BTreeSet<String>> {
        (!self.all).then(|| rdma::rdma_netdevs(&self.sysfs, &self.hcas))
    }
}

impl SysCollector for NetdevCollector {
    fn name(&self) -> &'static str {
        "netdev"
    }

    fn collect(&self, out: &mut Sink) -> Result<(), CollectError> {
        let text = fs::read(&self.net_dev).map(|b| String::from_utf8_lossy(&b).into_owned());
        let rows = read::value_from(&self.net_dev, text, |t| Ok(parse_net_dev(t)))?;
        let wanted = self.wanted();
        if wanted.as_ref().is_some_and(|w| w.is_empty()) {
            return Ok(());
        }
        for row in rows {
            match row {
                Ok(row) if row.name.contains(char::REPLACEMENT_CHARACTER) => {
                    if wanted.is_none() {
                        out.parse_error(
                            &self.net_dev,
                            ParseError::Format(format!("netdev name not UTF-8: {:?}", row.name)),
                        );
                    }
                }
                Ok(row) => {
                    let selected = wanted.as_ref().is_none_or(|w| w.contains(&row.name));
                    if !(selected && self.netdevs.allows(&row.name)) {
                        continue;
                    }
                    match row.values {
                        Ok(values) => self.export(out, &row.name, &values),
                        Err(e) => out.parse_error(&self.net_dev, e),
                    }
                }
                // A row we cannot even name: count it only when every netdev is wanted
                // (otherwise it is most likely one we would not export).
                Err(e) => {
                    if wanted.is_none() {
                        out.parse_error(&self.net_dev, e);
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/proc/net/dev` of a RoCE node (6.8 kernel), three interfaces.
    const ROCE_NODE: &str = "\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: 8675309    12345    0    0    0     0          0         0  8675309    12345    0    0    0     0       0          0
  eth0: 123456789012 98765432    1    2    3     4          0      1000 987654321098 87654321    5    6    7     8       9          0
enp65s0f0np0:42 1 0 0 0 0 0 0 43 2 0 0 0 0 0 0
";

    #[test]
    fn rows_of_a_roce_node() {
        let rows: Vec<NetDevRow> = parse_net_dev(ROCE_NODE)
            .into_iter()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[1].name, "eth0");
        let eth0 = rows[1].values.as_ref().unwrap();
        assert_eq!(eth0[0], Ok(123_456_789_012));
        assert_eq!(eth0[8], Ok(987_654_321_098));
        assert_eq!(eth0[14], Ok(9));
        assert_eq!(rows[2].name, "enp65s0f0np0");
        let long = rows[2].values.as_ref().unwrap();
        assert_eq!((long[0].clone(), long[8].clone()), (Ok(42), Ok(43)));
    }

    #[test]
    fn short_and_garbage_rows() {
        let rows =
            parse_net_dev("  eth9: 1 2 3\n  eth8: 1 x 0 0 0 0 0 0 1 1 0 0 0 0 0 0\nnocolon\n");
        let short = rows[0].as_ref().unwrap();
        assert_eq!(short.name, "eth9");
        assert!(matches!(short.values, Err(ParseError::Format(_))));
        let row = rows[1].as_ref().unwrap().values.as_ref().unwrap();
        assert!(matches!(row[1], Err(ParseError::NotANumber(_))));
        assert!(matches!(rows[2], Err(ParseError::Format(_))));
    }
}
