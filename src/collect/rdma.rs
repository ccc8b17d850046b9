//! `rdma`: every port of every RDMA device (HCA) under
//! `<sysfs>/class/infiniband/<hca>/ports/<port>/`, whatever the driver (mlx5, mlx4, irdma,
//! bnxt_re, rxe, ...).
//!
//! | metric | type | labels | source |
//! |---|---|---|---|
//! | `chd_rdma_port_info` | gauge (1) | hca, port, netdev, link_layer, numa_node | `device/net/*` (+`dev_port`), `link_layer`, `device/numa_node` |
//! | `chd_rdma_port_state` | gauge | hca, port | `state` (`4: ACTIVE` -> 4) |
//! | `chd_rdma_port_physical_state` | gauge | hca, port | `phys_state` (`5: LinkUp` -> 5; 2 Polling, 3 Disabled, 7 PhyTest) |
//! | `chd_rdma_port_rate_bytes_per_second` | gauge | hca, port | `rate` (`200 Gb/sec (4X HDR)` -> 2.5e10) |
//! | `chd_rdma_port_data_transmitted_bytes_total` / `..._received_bytes_total` | counter | hca, port | `port_xmit_data` / `port_rcv_data` x 4 (they count 4-octet words) |
//! | `chd_rdma_port_packets_transmitted_total` / `..._received_total` | counter | hca, port | `port_xmit_packets` / `port_rcv_packets` |
//! | `chd_rdma_port_transmit_wait_total` | counter | hca, port | `port_xmit_wait` |
//! | `chd_rdma_port_errors_total` | counter | hca, port, counter | every other file of `counters/` (symbol_error, port_rcv_errors, link_downed, VL15_dropped, ...) |
//! | `chd_rdma_hw_counters_total` | counter | hca, port, counter | every file of `hw_counters/` but `lifespan` |
//!
//! METRICS.md names the last one `chd_rdma_hw_counter_total`; `promtool check metrics`
//! rejects that ("metric name should not include type 'counter'": `_counter_` in a name),
//! so it is exported as `chd_rdma_hw_counters_total` (the values of `hw_counters/`).
//! `chd_rdma_port_physical_state` is an addition to the contract: it tells a port that is
//! down because it is disabled (3) from one whose cable or peer is gone (2, Polling).
//!
//! Choices:
//! - Where `counters_ext/` exists (older kernels' 64-bit PMA extended counters), its
//!   `port_{xmit,rcv}_{data,packets}_64` are the source of the data and packet counters and
//!   the 32-bit `counters/` files of the same meaning are not read. If the `_64` file cannot
//!   be read the series is lost for that scrape rather than switched to the 32-bit value
//!   (which would look like a counter reset).
//! - `counters/{unicast,multicast}_{xmit,rcv}_packets` and the unicast/multicast files of
//!   `counters_ext/` are not exported (subsets of the packet counters); every other file of
//!   `counters/` is an IB PortCounters error counter and goes to `chd_rdma_port_errors_total`.
//! - `hw_counters/lifespan` is the counter cache lifetime in ms (a setting), not a counter.
//!   Device-wide `<hca>/hw_counters/` (not per port) is not read.
//! - A value that exceeds `u64` after the x4 is exported as a float.
//! - The netdev of port N is the netdev in `device/net/` whose `dev_port` is N-1 (a missing
//!   `dev_port` counts as 0); among several, the shortest name (the parent `ib0` before its
//!   child `ib0.8001`). Without `device/net/`, the `parent` file of soft-RoCE (rxe)
//!   names it. None found: `netdev=""`. `numa_node` is `""` when sysfs says -1 or has no
//!   `device/numa_node`.
//! - A port without `counters/` (irdma) or `hw_counters/` is quiet; a port file that
//!   cannot be read costs its series and one read error (see the module `collect`).
//! - Counters are exported as read; one that goes backwards (driver reset, a 32-bit PMA
//!   counter wrapping) is a counter reset to Prometheus.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::read::{self, content, list_dir, parse_u32, parse_u64, parse_word, ParseError};
use super::{
    CollectError, CollectorSpec, NameFilter, Number, OptionField, OptionSpec, Sink, SysCollector,
};

const INFO: &str = "chd_rdma_port_info";
const STATE: &str = "chd_rdma_port_state";
const PHYS_STATE: &str = "chd_rdma_port_physical_state";
const RATE: &str = "chd_rdma_port_rate_bytes_per_second";
const TX_BYTES: &str = "chd_rdma_port_data_transmitted_bytes_total";
const RX_BYTES: &str = "chd_rdma_port_data_received_bytes_total";
const TX_PACKETS: &str = "chd_rdma_port_packets_transmitted_total";
const RX_PACKETS: &str = "chd_rdma_port_packets_received_total";
const TX_WAIT: &str = "chd_rdma_port_transmit_wait_total";
const ERRORS: &str = "chd_rdma_port_errors_total";
const HW_COUNTER: &str = "chd_rdma_hw_counters_total";

/// `<sysfs>/class/infiniband`.
pub fn class_dir(sysfs: &Path) -> PathBuf {
    sysfs.join("class/infiniband")
}

/// The rdma collector.
#[derive(Debug)]
pub struct RdmaCollector {
    class_dir: PathBuf,
    hcas: NameFilter,
}

impl RdmaCollector {
    pub fn new(sysfs: &Path, hcas: NameFilter) -> RdmaCollector {
        RdmaCollector {
            class_dir: class_dir(sysfs),
            hcas,
        }
    }
}

/// The `rdma` row of the collector table; it declares the HCA filter the pcie collector and
/// the netdev selection apply too.
pub const SPEC: CollectorSpec = CollectorSpec {
    name: "rdma",
    default_enabled: true,
    help: "RDMA ports: state, rate, data, error and hw counters",
    options: &[
        OptionSpec {
            key: "hca_include",
            help: "Only HCAs whose name matches (unanchored regex)",
            field: OptionField::Pattern(|s| &mut s.hca_include),
        },
        OptionSpec {
            key: "hca_exclude",
            help: "Skip HCAs whose name matches",
            field: OptionField::Pattern(|s| &mut s.hca_exclude),
        },
    ],
    build: |ctx| {
        Some(Box::new(RdmaCollector::new(
            &ctx.roots.sysfs,
            ctx.settings.hcas(),
        )))
    },
};

/// A traffic counter of `counters/` and its `counters_ext/` replacement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Traffic {
    XmitData,
    RcvData,
    XmitPackets,
    RcvPackets,
    XmitWait,
}

impl Traffic {
    const ALL: [Traffic; 5] = [
        Traffic::XmitData,
        Traffic::RcvData,
        Traffic::XmitPackets,
        Traffic::RcvPackets,
        Traffic::XmitWait,
    ];

    fn ext_name(self) -> Option<&'static str> {
        match self {
            Traffic::XmitData => Some("port_xmit_data_64"),
            Traffic::RcvData => Some("port_rcv_data_64"),
            Traffic::XmitPackets => Some("port_xmit_packets_64"),
            Traffic::RcvPackets => Some("port_rcv_packets_64"),
            Traffic::XmitWait => None,
        }
    }

    fn metric(self) -> (&'static str, &'static str) {
        match self {
            Traffic::XmitData => (
                TX_BYTES,
                "Bytes the RDMA port transmitted (port_xmit_data x 4)",
            ),
            Traffic::RcvData => (RX_BYTES, "Bytes the RDMA port received (port_rcv_data x 4)"),
            Traffic::XmitPackets => (TX_PACKETS, "Packets the RDMA port transmitted"),
            Traffic::RcvPackets => (RX_PACKETS, "Packets the RDMA port received"),
            Traffic::XmitWait => (
                TX_WAIT,
                "Ticks the RDMA port had data to send but no flow-control credits (port_xmit_wait)",
            ),
        }
    }

    /// The exported value of a raw reading: data counters count 4-octet words.
    fn value(self, raw: u64) -> Number {
        match self {
            Traffic::XmitData | Traffic::RcvData => data_bytes(raw),
            _ => Number::Int(raw),
        }
    }
}

/// What a file of `counters/` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PortCounter {
    Traffic(Traffic),
    /// Unicast/multicast packet counts: subsets of the packet counters, not exported.
    Ignored,
    Error,
}

fn classify(name: &str) -> PortCounter {
    match name {
        "port_xmit_data" => PortCounter::Traffic(Traffic::XmitData),
        "port_rcv_data" => PortCounter::Traffic(Traffic::RcvData),
        "port_xmit_packets" => PortCounter::Traffic(Traffic::XmitPackets),
        "port_rcv_packets" => PortCounter::Traffic(Traffic::RcvPackets),
        "port_xmit_wait" => PortCounter::Traffic(Traffic::XmitWait),
        "unicast_xmit_packets"
        | "unicast_rcv_packets"
        | "multicast_xmit_packets"
        | "multicast_rcv_packets" => PortCounter::Ignored,
        _ => PortCounter::Error,
    }
}

/// `port_xmit_data` / `port_rcv_data` count 4-octet words.
pub fn data_bytes(words: u64) -> Number {
    match words.checked_mul(4) {
        Some(bytes) => Number::Int(bytes),
        None => Number::Float(words as f64 * 4.0),
    }
}

/// `state` / `phys_state`: `"4: ACTIVE"` -> 4, `"5: LinkUp"` -> 5.
pub fn parse_state(text: &str) -> Result<u32, ParseError> {
    let t = content(text)?;
    let id = t.split(':').next().unwrap_or(t).trim();
    id.parse()
        .map_err(|_| ParseError::Format(read::shorten(t).to_owned()))
}

/// `rate`: `"200 Gb/sec (4X HDR)"` -> 2.5e10 bytes per second.
pub fn parse_rate(text: &str) -> Result<f64, ParseError> {
    let t = content(text)?;
    let mut fields = t.split_whitespace();
    let bad = || ParseError::Format(read::shorten(t).to_owned());
    let gbit: f64 = fields.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
    let unit = fields.next().ok_or_else(bad)?;
    let bytes_per_second = gbit * 1e9 / 8.0;
    // `1e308 Gb/sec` is finite, its bytes per second are not.
    if !(unit.starts_with("Gb/s") && bytes_per_second.is_finite() && gbit >= 0.0) {
        return Err(bad());
    }
    Ok(bytes_per_second)
}

/// `device/numa_node`: `"1"` -> Some(1), `"-1"` (no affinity declared) -> None.
pub fn parse_numa_node(text: &str) -> Result<Option<u32>, ParseError> {
    let t = content(text)?;
    match t.parse::<i64>() {
        Ok(n) if n < 0 => Ok(None),
        Ok(n) => u32::try_from(n)
            .map(Some)
            .map_err(|_| ParseError::NotANumber(t.to_owned())),
        Err(_) => Err(ParseError::NotANumber(read::shorten(t).to_owned())),
    }
}

/// The netdev of `port` (1-based, as in `ports/<port>`) among `(netdev, dev_port)`: the one
/// whose `dev_port` is `port - 1`, the shortest name first when several match.
pub fn port_netdev<'a>(netdevs: &'a [(String, u32)], port: &str) -> Option<&'a str> {
    let index = port.parse::<u32>().ok()?.checked_sub(1)?;
    netdevs
        .iter()
        .filter(|(_, dev_port)| *dev_port == index)
        .map(|(name, _)| name.as_str())
        .min_by(|a, b| (a.len(), a).cmp(&(b.len(), b)))
}

/// The netdevs of an HCA with their `dev_port` (0 when absent or unreadable: older
/// kernels and single-port functions), or the `parent` of a software device.
fn hca_netdevs(hca_dir: &Path) -> Vec<(String, u32)> {
    let net = hca_dir.join("device/net");
    match list_dir(&net) {
        Ok(Some(names)) if !names.is_empty() => names
            .into_iter()
            .map(|name| {
                let dev_port =
                    read::read_value(&net.join(&name).join("dev_port"), parse_u32).unwrap_or(0);
                (name, dev_port)
            })
            .collect(),
        _ => match read::read_value(&hca_dir.join("parent"), parse_word) {
            Ok(parent) => vec![(parent, 0)],
            Err(_) => Vec::new(),
        },
    }
}

/// The netdevs behind the ports of the HCAs `hcas` allows (for the netdev collector). Read
/// problems are ignored here; the rdma collector counts them.
pub fn rdma_netdevs(sysfs: &Path, hcas: &NameFilter) -> BTreeSet<String> {
    let class = class_dir(sysfs);
    let mut found = BTreeSet::new();
    let Ok(Some(names)) = list_dir(&class) else {
        return found;
    };
    for hca in names.iter().filter(|h| hcas.allows(h)) {
        let hca_dir = class.join(hca);
        let netdevs = hca_netdevs(&hca_dir);
        if netdevs.is_empty() {
            continue;
        }
        if let Ok(Some(ports)) = list_dir(&hca_dir.join("ports")) {
            for port in &ports {
                if let Some(n) = port_netdev(&netdevs, port) {
                    found.insert(n.to_owned());
                }
            }
        }
    }
    found
}

/// The ports of the HCAs `hcas` allows that are not ACTIVE (`state` other than 4), as
/// `hca/port`, for the node verdict. A port whose state cannot be read is left out (the rdma
/// collector counts it as a read error).
pub fn ports_not_active(sysfs: &Path, hcas: &NameFilter) -> Vec<String> {
    let class = class_dir(sysfs);
    let mut down = Vec::new();
    let Ok(Some(names)) = list_dir(&class) else {
        return down;
    };
    for hca in names.iter().filter(|h| hcas.allows(h)) {
        let ports_dir = class.join(hca).join("ports");
        let Ok(Some(ports)) = list_dir(&ports_dir) else {
            continue;
        };
        for port in &ports {
            if let Ok(state) = read::read_value(&ports_dir.join(port).join("state"), parse_state) {
                if state != 4 {
                    down.push(format!("{hca}/{port}"));
                }
            }
        }
    }
    down
}

impl RdmaCollector {
    fn collect_hca(&self, out: &mut Sink, hca: &str) {
        let hca_dir = self.class_dir.join(hca);
        let numa_path = hca_dir.join("device/numa_node");
        let numa = match read::read_value(&numa_path, parse_numa_node) {
            Ok(node) => node,
            Err(read::ReadError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                None
            }
            Err(e) => {
                out.read_error(&e);
                None
            }
        };
        let numa = numa.map(|n| n.to_string()).unwrap_or_default();
        let netdevs = hca_netdevs(&hca_dir);
        let ports_dir = hca_dir.join("ports");
        let ports = match list_dir(&ports_dir) {
            Ok(Some(ports)) => ports,
            Ok(None) => {
                out.read_error(&read::ReadError::Io {
                    path: ports_dir,
                    source: std::io::ErrorKind::NotFound.into(),
                });
                return;
            }
            Err(source) => {
                out.read_error(&read::ReadError::Io {
                    path: ports_dir,
                    source,
                });
                return;
            }
        };
        for port in &ports {
            let netdev = port_netdev(&netdevs, port).unwrap_or("");
            self.collect_port(out, hca, port, &ports_dir.join(port), netdev, &numa);
        }
    }

    fn collect_port(
        &self,
        out: &mut Sink,
        hca: &str,
        port: &str,
        dir: &Path,
        netdev: &str,
        numa: &str,
    ) {
        let labels = [("hca", hca), ("port", port)];
        if let Some(state) = out.read(&dir.join("state"), parse_state) {
            out.gauge(
                STATE,
                "Logical state of the RDMA port (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER)",
                labels,
                state,
            );
        }
        if let Some(state) = out.read(&dir.join("phys_state"), parse_state) {
            out.gauge(
                PHYS_STATE,
                "Physical state of the RDMA port (2 Polling, 3 Disabled, 4 Training, 5 LinkUp, 6 LinkErrorRecovery, 7 PhyTest)",
                labels,
                state,
            );
        }
        if let Some(rate) = out.read(&dir.join("rate"), parse_rate) {
            out.gauge(
                RATE,
                "Signalling rate of the RDMA port, bytes per second",
                labels,
                Number::exact(rate),
            );
        }
        let link_layer = out.read(&dir.join("link_layer"), parse_word);
        out.gauge(
            INFO,
            "RDMA port, its netdev, link layer and the NUMA node of its HCA",
            [
                ("hca", hca),
                ("port", port),
                ("netdev", netdev),
                ("link_layer", link_layer.as_deref().unwrap_or("")),
                ("numa_node", numa),
            ],
            1u64,
        );
        self.port_counters(out, hca, port, dir);
        hw_counters(out, hca, port, &dir.join("hw_counters"));
    }

    fn port_counters(&self, out: &mut Sink, hca: &str, port: &str, dir: &Path) {
        let labels = [("hca", hca), ("port", port)];
        let ext_dir = dir.join("counters_ext");
        let ext = out.list(&ext_dir);
        let in_ext = |t: Traffic| t.ext_name().filter(|n| ext.iter().any(|e| e == n));
        let counters_dir = dir.join("counters");
        for name in out.list(&counters_dir) {
            match classify(&name) {
                PortCounter::Traffic(t) => {
                    if in_ext(t).is_some() {
                        continue;
                    }
                    if let Some(raw) = out.read(&counters_dir.join(&name), parse_u64) {
                        let (metric, help) = t.metric();
                        out.counter(metric, help, labels, t.value(raw));
                    }
                }
                PortCounter::Ignored => {}
                PortCounter::Error => {
                    if let Some(v) = out.read(&counters_dir.join(&name), parse_u64) {
                        out.counter(
                            ERRORS,
                            "IB PortCounters error counter of the RDMA port (counters/<counter>)",
                            [("hca", hca), ("port", port), ("counter", &name)],
                            v,
                        );
                    }
                }
            }
        }
        for t in Traffic::ALL {
            if let Some(ext_name) = in_ext(t) {
                if let Some(raw) = out.read(&ext_dir.join(ext_name), parse_u64) {
                    let (metric, help) = t.metric();
                    out.counter(metric, help, labels, t.value(raw));
                }
            }
        }
    }
}

fn hw_counters(out: &mut Sink, hca: &str, port: &str, dir: &Path) {
    for name in out.list(dir) {
        if name == "lifespan" {
            continue;
        }
        if let Some(v) = out.read(&dir.join(&name), parse_u64) {
            out.counter(
                HW_COUNTER,
                "Driver hardware counter of the RDMA port (hw_counters/<counter>: retransmits, retries exceeded, ECN, CNP, ...)",
                [("hca", hca), ("port", port), ("counter", &name)],
                v,
            );
        }
    }
}

impl SysCollector for RdmaCollector {
    fn name(&self) -> &'static str {
        "rdma"
    }

    fn collect(&self, out: &mut Sink) -> Result<(), CollectError> {
        let hcas = match list_dir(&self.class_dir) {
            Ok(Some(hcas)) => hcas,
            // No RDMA hardware (or no driver loaded): nothing to report, not an error.
            Ok(None) => return Ok(()),
            Err(source) => {
                return Err(CollectError::List {
                    path: self.class_dir.clone(),
                    source,
                })
            }
        };
        for hca in hcas.iter().filter(|h| self.hcas.allows(h)) {
            self.collect_hca(out, hca);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_not_active_are_named_for_the_allowed_hcas() {
        let tmp = tempfile::tempdir().unwrap();
        for (hca, port, state) in [
            ("mlx5_0", "1", "4: ACTIVE\n"),
            ("mlx5_1", "1", "1: DOWN\n"),
            ("mlx5_1", "2", "garbage\n"),
            ("mlx5_2", "1", "1: DOWN\n"),
        ] {
            let dir = class_dir(tmp.path()).join(hca).join("ports").join(port);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("state"), state).unwrap();
        }
        let not_2 = NameFilter::new(None, regex::Regex::new("_2$").ok());
        assert_eq!(ports_not_active(tmp.path(), &not_2), ["mlx5_1/1"]);
        assert!(ports_not_active(&tmp.path().join("none"), &not_2).is_empty());
    }

    #[test]
    fn states_of_an_mlx5_port() {
        assert_eq!(parse_state("4: ACTIVE\n"), Ok(4));
        assert_eq!(parse_state("1: DOWN\n"), Ok(1));
        assert_eq!(parse_state("5: LinkUp\n"), Ok(5));
        assert_eq!(parse_state("3: Disabled\n"), Ok(3));
        assert_eq!(parse_state("4"), Ok(4));
        assert_eq!(parse_state(""), Err(ParseError::Empty));
        assert!(matches!(
            parse_state("ACTIVE\n"),
            Err(ParseError::Format(_))
        ));
    }

    #[test]
    fn rates_as_ib_core_prints_them() {
        assert_eq!(parse_rate("200 Gb/sec (4X HDR)\n"), Ok(25e9));
        assert_eq!(parse_rate("400 Gb/sec (4X NDR)\n"), Ok(50e9));
        assert_eq!(parse_rate("100 Gb/sec (4X EDR)\n"), Ok(12.5e9));
        assert_eq!(parse_rate("2.5 Gb/sec (1X SDR)\n"), Ok(312_500_000.0));
        assert_eq!(parse_rate("56 Gb/sec (4X FDR)\n"), Ok(7e9));
        assert_eq!(parse_rate("10 Gb/sec (4X)\n"), Ok(1.25e9));
        assert!(matches!(parse_rate("fast\n"), Err(ParseError::Format(_))));
        assert!(matches!(
            parse_rate("200 MB/s\n"),
            Err(ParseError::Format(_))
        ));
        assert!(matches!(
            parse_rate("NaN Gb/sec\n"),
            Err(ParseError::Format(_))
        ));
        // Finite Gb/s whose bytes per second are not (tests/parsers' rate property).
        assert!(matches!(
            parse_rate("1e308 Gb/sec\n"),
            Err(ParseError::Format(_))
        ));
        assert_eq!(parse_rate("\n"), Err(ParseError::Empty));
    }

    #[test]
    fn data_counters_count_words() {
        assert_eq!(data_bytes(1_000), Number::Int(4_000));
        assert_eq!(data_bytes(u64::MAX / 4), Number::Int(u64::MAX / 4 * 4));
        assert_eq!(data_bytes(u64::MAX), Number::Float(u64::MAX as f64 * 4.0));
        assert_eq!(Traffic::XmitPackets.value(7), Number::Int(7));
    }

    #[test]
    fn numa_node_minus_one_is_unknown() {
        assert_eq!(parse_numa_node("1\n"), Ok(Some(1)));
        assert_eq!(parse_numa_node("-1\n"), Ok(None));
        assert!(parse_numa_node("x\n").is_err());
    }

    #[test]
    fn counters_are_classified_like_the_kernel_groups_them() {
        assert_eq!(
            classify("port_xmit_data"),
            PortCounter::Traffic(Traffic::XmitData)
        );
        assert_eq!(
            classify("port_xmit_wait"),
            PortCounter::Traffic(Traffic::XmitWait)
        );
        assert_eq!(classify("unicast_rcv_packets"), PortCounter::Ignored);
        for e in [
            "symbol_error",
            "port_rcv_errors",
            "port_xmit_discards",
            "link_downed",
            "VL15_dropped",
            "excessive_buffer_overrun_errors",
        ] {
            assert_eq!(classify(e), PortCounter::Error, "{e}");
        }
    }

    #[test]
    fn netdev_of_a_port() {
        let mlx4 = vec![("eth1".to_string(), 1), ("eth0".to_string(), 0)];
        assert_eq!(port_netdev(&mlx4, "1"), Some("eth0"));
        assert_eq!(port_netdev(&mlx4, "2"), Some("eth1"));
        assert_eq!(port_netdev(&mlx4, "3"), None);
        let ipoib = vec![("ib0.8001".to_string(), 0), ("ib0".to_string(), 0)];
        assert_eq!(port_netdev(&ipoib, "1"), Some("ib0"));
        assert_eq!(port_netdev(&ipoib, "0"), None);
        assert_eq!(port_netdev(&ipoib, "x"), None);
    }
}
