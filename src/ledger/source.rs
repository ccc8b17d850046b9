//! What a ledger is made from: a node's store (live, or a recording read into one) with its
//! topology, devices and the facts a store does not hold (host, backend, links a run
//! recorded, the load-profile delta of a run with several profiles).

use crate::analysis::verdict::NodeVerdict;
use std::collections::BTreeMap;

use crate::runtime::DeviceInfo;
use crate::store::Store;
use crate::topology::pci_link::Link;
use crate::topology::Topology;
use crate::vocab::DevicePair;

/// Everything [`super::build`] needs.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    pub host: &'a str,
    pub backend: &'a str,
    /// `chd serve`, a recording's path, a state directory.
    pub description: &'a str,
    pub topology: &'a Topology,
    pub devices: &'a [DeviceInfo],
    pub store: &'a Store,
    /// The configured device pairs (a pair without cells still gets an empty matrix).
    pub pairs: &'a [DevicePair],
    /// Links a recording holds (run.json `devices[].link`), for devices the store has no
    /// seen link of.
    pub recorded_links: &'a BTreeMap<String, Link>,
    /// Affinity verdicts (cpu, bindable) a recording holds (its `affinity.json`), for a store
    /// without verdicts of its own (a replayed store holds none).
    pub recorded_bindable: &'a [(u32, bool)],
    /// Device -> profile -> ratio to idle (`analysis::load_delta`); empty for one profile.
    pub load_profile_delta: &'a BTreeMap<String, BTreeMap<String, f64>>,
    /// Unix time the document is made at.
    pub now: f64,
    /// `chd serve`'s verdict, held across windows; `None`: judge the store as a snapshot.
    pub verdict: Option<&'a NodeVerdict>,
}
