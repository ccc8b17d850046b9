//! The collector table's types, in node_exporter's `registerCollector(name, default, factory)`
//! manner: each collector file declares one [`CollectorSpec`] (its name, whether it runs by
//! default, its help, its options and its constructor) and `collect::COLLECTORS` lists them.
//! Everything else is derived from the table: the `--collector.NAME` / `--no-collector.NAME`
//! flags and their `--help`, the `[collectors]` config keys, the defaults, and which
//! collectors [`build_set`] constructs. Adding a collector is its file plus one table row.

use std::collections::BTreeSet;
use std::sync::Arc;

use regex::Regex;

use super::{CollectorSet, NameFilter, SysCollector, COLLECTORS};
use crate::runtime::telemetry::DeviceTelemetry;
use crate::topology::Roots;

/// One row of the collector table.
#[derive(Debug, Clone, Copy)]
pub struct CollectorSpec {
    /// The `collector` label, the config key (`[collectors] NAME = true`) and the flag
    /// (`--collector.NAME`).
    pub name: &'static str,
    /// Whether it runs when neither the config file nor a flag says.
    pub default_enabled: bool,
    /// One line for `--help`: what it exports.
    pub help: &'static str,
    /// Its options: keys of `[collectors]` and `--collector.KEY` flags besides the switch.
    pub options: &'static [OptionSpec],
    /// Build it; `None` when the context lacks what it needs (the device collector without
    /// a telemetry source).
    pub build: fn(&BuildContext) -> Option<Box<dyn SysCollector>>,
}

/// An option of a collector: the `[collectors]` key (`netdev_all`), the flag derived from it
/// (`--collector.netdev-all`), help, and where its validated value lives in
/// [`CollectorSettings`].
#[derive(Debug, Clone, Copy)]
pub struct OptionSpec {
    pub key: &'static str,
    pub help: &'static str,
    pub field: OptionField,
}

/// An option's kind and its field in [`CollectorSettings`].
#[derive(Debug, Clone, Copy)]
pub enum OptionField {
    /// Off by default; the flag takes no value and turns it on.
    Switch(fn(&mut CollectorSettings) -> &mut bool),
    /// An unanchored regex over names; unset by default.
    Pattern(fn(&mut CollectorSettings) -> &mut Option<Regex>),
}

impl CollectorSpec {
    /// The flag that turns it on: `collector.NAME`.
    pub fn flag(&self) -> String {
        format!("collector.{}", self.name)
    }

    /// The flag that turns it off: `no-collector.NAME`.
    pub fn no_flag(&self) -> String {
        format!("no-collector.{}", self.name)
    }
}

impl OptionSpec {
    /// The flag: `collector.` and the key with dashes (`collector.hca-include`).
    pub fn flag(&self) -> String {
        format!("collector.{}", self.key.replace('_', "-"))
    }
}

/// The table row called `name`.
pub fn spec(name: &str) -> Option<&'static CollectorSpec> {
    COLLECTORS.iter().find(|s| s.name == name)
}

/// The option whose key is `key`, of whichever collector declares it.
pub fn option(key: &str) -> Option<&'static OptionSpec> {
    options().find(|o| o.key == key)
}

/// Every option of every collector, in table order.
pub fn options() -> impl Iterator<Item = &'static OptionSpec> {
    COLLECTORS.iter().flat_map(|s| s.options.iter())
}

/// Which collectors run and what they cover (the validated `[collectors]` section).
#[derive(Debug, Clone)]
pub struct CollectorSettings {
    /// The collectors that run, by table name. [`Default`] is each row's `default_enabled`.
    pub enabled: BTreeSet<&'static str>,
    /// Export every netdev of `/proc/net/dev`, not only those behind RDMA ports.
    pub netdev_all: bool,
    /// Export every `meminfo` row of each NUMA node, not only `numa::MEMORY_KINDS`.
    pub numa_memory_all: bool,
    /// HCAs (`mlx5_0`, ...) the rdma and pcie collectors and the netdev selection cover.
    pub hca_include: Option<Regex>,
    pub hca_exclude: Option<Regex>,
    /// Netdevs the netdev collector exports (applied after the RDMA / all selection).
    pub netdev_include: Option<Regex>,
    pub netdev_exclude: Option<Regex>,
}

impl Default for CollectorSettings {
    /// The table's defaults; every option off or unset.
    fn default() -> Self {
        CollectorSettings {
            enabled: COLLECTORS
                .iter()
                .filter(|s| s.default_enabled)
                .map(|s| s.name)
                .collect(),
            netdev_all: false,
            numa_memory_all: false,
            hca_include: None,
            hca_exclude: None,
            netdev_include: None,
            netdev_exclude: None,
        }
    }
}

/// Equal when the same collectors run and every option (a pattern by its text) is equal.
impl PartialEq for CollectorSettings {
    fn eq(&self, other: &Self) -> bool {
        self.enabled == other.enabled && self.option_values() == other.option_values()
    }
}

/// An option's value as text-comparable data (a pattern by its source).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptionValue {
    Switch(bool),
    Pattern(Option<String>),
}

impl CollectorSettings {
    /// Turn the collector called `name` on or off, as `--collector.NAME` /
    /// `--no-collector.NAME` do; `false` for a name the table lacks.
    pub fn set_enabled(&mut self, name: &str, on: bool) -> bool {
        let Some(spec) = spec(name) else {
            return false;
        };
        if on {
            self.enabled.insert(spec.name);
        } else {
            self.enabled.remove(spec.name);
        }
        true
    }

    /// Whether the collector called `name` runs (`None` for a name the table lacks).
    pub fn enabled(&self, name: &str) -> Option<bool> {
        spec(name).map(|s| self.enabled.contains(s.name))
    }

    /// Every option's value, in table order, keyed by its `[collectors]` key.
    pub fn option_values(&self) -> Vec<(&'static str, OptionValue)> {
        // The fields are reached through the table's `&mut` accessors; a copy keeps `self`
        // untouched (settings are small: a few flags and compiled patterns).
        let mut copy = self.clone();
        options()
            .map(|o| {
                let value = match o.field {
                    OptionField::Switch(field) => OptionValue::Switch(*field(&mut copy)),
                    OptionField::Pattern(field) => {
                        OptionValue::Pattern(field(&mut copy).as_ref().map(|r| r.to_string()))
                    }
                };
                (o.key, value)
            })
            .collect()
    }

    /// The HCA filter the rdma and pcie collectors and the netdev selection apply.
    pub fn hcas(&self) -> NameFilter {
        NameFilter::new(self.hca_include.clone(), self.hca_exclude.clone())
    }

    /// The netdev filter of the netdev collector.
    pub fn netdevs(&self) -> NameFilter {
        NameFilter::new(self.netdev_include.clone(), self.netdev_exclude.clone())
    }
}

/// An accelerator the runtime backend found, for the pcie collector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciDeviceRef {
    /// Runtime index, the `device` label (`"0"`).
    pub device: String,
    /// PCI address as sysfs names it (`"0000:1a:00.0"`).
    pub bdf: String,
}

/// What a collector's constructor may use.
#[derive(Clone)]
pub struct BuildContext<'a> {
    pub settings: &'a CollectorSettings,
    /// Where sysfs and procfs are (a fixture tree in tests).
    pub roots: &'a Roots,
    /// The accelerators the pcie collector covers besides the HCAs.
    pub pci_devices: &'a [PciDeviceRef],
    /// The runtime backend's telemetry, for the device collector; `None` outside `serve`.
    pub telemetry: Option<Arc<dyn DeviceTelemetry>>,
    /// The state directory, for the fabric collector; `None` outside `serve`.
    pub state_dir: Option<&'a std::path::Path>,
}

/// The enabled collectors the context can build, in table order.
pub fn build_set(ctx: &BuildContext) -> CollectorSet {
    let mut set = CollectorSet::new();
    for spec in COLLECTORS {
        if !ctx.settings.enabled.contains(spec.name) {
            continue;
        }
        match (spec.build)(ctx) {
            Some(collector) => set.push(collector),
            None => tracing::debug!(collector = spec.name, "not available here"),
        }
    }
    set
}

/// The enabled sysfs/procfs collectors for `settings`, reading under `roots`, in table order
/// (no device telemetry). `pci_devices` are the accelerators the pcie collector covers
/// besides the HCAs.
pub fn build(
    settings: &CollectorSettings,
    roots: &Roots,
    pci_devices: Vec<PciDeviceRef>,
) -> CollectorSet {
    build_set(&BuildContext {
        settings,
        roots,
        pci_devices: &pci_devices,
        telemetry: None,
        state_dir: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::telemetry::NoTelemetry;

    #[test]
    fn names_and_option_keys_are_unique_and_flag_safe() {
        let mut keys = BTreeSet::new();
        for spec in COLLECTORS {
            assert!(keys.insert(spec.name), "{} twice", spec.name);
            assert!(!spec.help.is_empty(), "{} has no help", spec.name);
        }
        for o in options() {
            assert!(keys.insert(o.key), "{} twice", o.key);
        }
        for key in keys {
            assert!(
                key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{key}"
            );
        }
    }

    #[test]
    fn every_row_builds_a_collector_of_its_own_name() {
        let mut settings = CollectorSettings::default();
        for spec in COLLECTORS {
            settings.set_enabled(spec.name, true);
        }
        let roots = Roots::default();
        let set = build_set(&BuildContext {
            settings: &settings,
            roots: &roots,
            pci_devices: &[],
            telemetry: Some(Arc::new(NoTelemetry)),
            state_dir: Some(std::path::Path::new("/nonexistent")),
        });
        let names: Vec<&str> = COLLECTORS.iter().map(|s| s.name).collect();
        assert_eq!(set.names(), names);
    }

    #[test]
    fn the_device_collector_needs_telemetry() {
        let settings = CollectorSettings::default();
        assert_eq!(settings.enabled("device"), Some(true));
        let set = build(&settings, &Roots::default(), vec![]);
        assert!(!set.names().contains(&"device"), "{:?}", set.names());
    }

    #[test]
    fn flags_follow_the_names() {
        let netdev = spec("netdev").unwrap();
        assert_eq!(netdev.flag(), "collector.netdev");
        assert_eq!(netdev.no_flag(), "no-collector.netdev");
        assert_eq!(
            option("hca_include").unwrap().flag(),
            "collector.hca-include"
        );
        assert!(spec("bogus").is_none() && option("bogus").is_none());
    }

    #[test]
    fn settings_compare_patterns_by_text() {
        let with = |text: &str| CollectorSettings {
            netdev_include: Regex::new(text).ok(),
            ..Default::default()
        };
        assert_eq!(with("^eth"), with("^eth"));
        assert_ne!(with("^eth"), with("^ens"));
        let mut off = CollectorSettings::default();
        off.set_enabled("pcie", false);
        assert_ne!(off, CollectorSettings::default());
    }
}
