//! What a ledger is made from: a node's store (live, or a recording read into one) with its
//! topology, devices and the facts a store does not hold (host, backend, links a run
//! recorded, the load-profile delta of a run with several profiles, the peer copies' path
//! classes, a recorded run's size curves and basics table, the state directory's fabric
//! results).

use crate::analysis::basics::BasicsTable;
use crate::analysis::limits::PathLimits;
use crate::analysis::sweep::Curve;
use crate::analysis::verdict::NodeVerdict;
use crate::format::fabric_dir::Listing;
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
    /// Each ordered device pair's PCIe path class (`SRC>DST` -> `PIX` ...), for the store's
    /// peer copy cells: read from sysfs by `chd serve`, recorded by a `chd probe p2p` run.
    pub p2p_paths: &'a BTreeMap<String, String>,
    /// How each pair's peer copies went (`copy`, `copy-staged`), where known.
    pub p2p_methods: &'a BTreeMap<String, String>,
    /// A recorded run's size curves (a store holds none).
    pub curves: &'a [Curve],
    /// A recorded run's basic validation table.
    pub basics: Option<&'a BasicsTable>,
    /// The state directory's fabric results (`chd probe fabric`); empty for a recording.
    pub fabric: &'a Listing,
    /// Each device's path limits (`analysis::limits`) for the same-device copies; empty for
    /// a recording (whose own report reads them from run.json).
    pub d2d_limits: &'a PathLimits,
}
