//! Scraping the collectors in-process on a fixture tree: the trees and their accelerators,
//! one scrape's samples keyed by the series as written, and the series names the tests ask for.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use chd::collect::{build, CollectorSettings, PciDeviceRef};
use chd::exposition::{encode, Format};
use chd::topology::Roots;
use prometheus_client::registry::Registry;

pub(crate) fn tree(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/collectors")
        .join(name)
}

pub(crate) fn roots(name: &str) -> Roots {
    let dir = tree(name);
    Roots {
        sysfs: dir.join("sys"),
        procfs: dir.join("proc"),
    }
}

/// The accelerators of `roce-dual-rail`: GPU 0 with a degraded link, GPU 1 healthy.
pub(crate) fn roce_gpus() -> Vec<PciDeviceRef> {
    vec![
        PciDeviceRef {
            device: "0".into(),
            bdf: "0000:1a:00.0".into(),
        },
        // As CUDA and NVML spell it.
        PciDeviceRef {
            device: "1".into(),
            bdf: "00000000:9B:00.0".into(),
        },
    ]
}

/// Accelerator 0 of `odd` has its link down; accelerator 1 is not in sysfs at all.
pub(crate) fn odd_accelerators() -> Vec<PciDeviceRef> {
    vec![
        PciDeviceRef {
            device: "0".into(),
            bdf: "0000:3b:00.0".into(),
        },
        PciDeviceRef {
            device: "1".into(),
            bdf: "0000:ff:00.0".into(),
        },
    ]
}

pub(crate) fn registry(
    settings: &CollectorSettings,
    tree_name: &str,
    pci: Vec<PciDeviceRef>,
) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(build(settings, &roots(tree_name), pci)));
    registry
}

pub(crate) fn scrape_with(
    settings: &CollectorSettings,
    tree_name: &str,
    pci: Vec<PciDeviceRef>,
) -> Scrape {
    Scrape::of(&registry(settings, tree_name, pci))
}

pub(crate) fn scrape(tree_name: &str, pci: Vec<PciDeviceRef>) -> Scrape {
    scrape_with(&CollectorSettings::default(), tree_name, pci)
}

/// One scrape's text and its samples keyed by the series as written.
pub(crate) struct Scrape {
    pub(crate) text: String,
    pub(crate) samples: BTreeMap<String, String>,
}

impl Scrape {
    pub(crate) fn of(registry: &Registry) -> Scrape {
        let text = encode(registry, Format::Prometheus).expect("encode");
        let mut samples = BTreeMap::new();
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let (series, value) = line.rsplit_once(' ').expect("series value");
            let old = samples.insert(series.to_owned(), value.to_owned());
            assert!(old.is_none(), "duplicate series {series}");
        }
        Scrape { text, samples }
    }

    /// The value of exactly this series (labels in the order they are emitted).
    pub(crate) fn get(&self, series: &str) -> f64 {
        let raw = self.raw(series);
        raw.parse()
            .unwrap_or_else(|_| panic!("{series} has value {raw:?}"))
    }

    pub(crate) fn raw(&self, series: &str) -> &str {
        self.samples
            .get(series)
            .unwrap_or_else(|| panic!("no series {series} in\n{}", self.text))
    }

    pub(crate) fn has(&self, series: &str) -> bool {
        self.samples.contains_key(series)
    }

    /// Series of one family (`name{...}`).
    pub(crate) fn family(&self, name: &str) -> Vec<&str> {
        let prefix = format!("{name}{{");
        self.samples
            .keys()
            .filter(|k| k.starts_with(&prefix))
            .map(String::as_str)
            .collect()
    }

    /// Whether any series of `name` has a label matching `label`.
    pub(crate) fn any(&self, name: &str, label: &str) -> bool {
        self.family(name).iter().any(|s| s.contains(label))
    }

    pub(crate) fn health(&self, collector: &str) -> (f64, f64) {
        (
            self.get(&format!(
                "chd_collector_success{{collector=\"{collector}\"}}"
            )),
            self.get(&format!(
                "chd_collector_read_errors_total{{collector=\"{collector}\"}}"
            )),
        )
    }
}

pub(crate) fn port(metric: &str, hca: &str) -> String {
    format!("{metric}{{hca=\"{hca}\",port=\"1\"}}")
}

pub(crate) fn port_counter(metric: &str, hca: &str, counter: &str) -> String {
    format!("{metric}{{hca=\"{hca}\",port=\"1\",counter=\"{counter}\"}}")
}

pub(crate) fn pcie(metric: &str, device: &str, state: &str) -> String {
    format!("{metric}{{device=\"{device}\",state=\"{state}\"}}")
}

pub(crate) fn aer(device: &str, severity: &str) -> String {
    format!("chd_device_pcie_aer_errors_total{{device=\"{device}\",severity=\"{severity}\"}}")
}

pub(crate) fn netdev(metric: &str, dev: &str, direction: &str) -> String {
    format!("{metric}{{netdev=\"{dev}\",direction=\"{direction}\"}}")
}

pub(crate) fn netdev_error(dev: &str, direction: &str, kind: &str) -> String {
    format!("chd_netdev_errors_total{{netdev=\"{dev}\",direction=\"{direction}\",kind=\"{kind}\"}}")
}
