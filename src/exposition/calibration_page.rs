//! `/api/v1/calibration`: the node's calibration ledger (`ledger::build`) of a live or
//! replayed store, kept per store generation, held verdict and fabric results' stamp
//! (`page_cache`) and built again only when one of them changed.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::page_cache::PageCache;
use super::server::PageRenderer;
use crate::analysis::basics::BasicsTable;
use crate::analysis::limits::PathLimits;
use crate::analysis::sweep::Curve;
use crate::analysis::verdict::NodeVerdict;
use crate::format::fabric_dir::{FabricDir, Listing};
use crate::ledger::{self, Source};
use crate::runtime::DeviceInfo;
use crate::schedule::verdict::SharedVerdict;
use crate::store::{unix_now, SharedStore};
use crate::topology::pci_link::Link;
use crate::topology::Topology;

/// What `/api/v1/calibration` is made from, besides the store.
pub struct CalibrationPage {
    pub store: SharedStore,
    pub topology: Arc<Topology>,
    pub devices: Vec<DeviceInfo>,
    pub host: String,
    pub backend: String,
    pub description: String,
    pub pairs: Vec<crate::vocab::DevicePair>,
    pub recorded_links: BTreeMap<String, Link>,
    pub recorded_bindable: Vec<(u32, bool)>,
    pub load_profile_delta: BTreeMap<String, BTreeMap<String, f64>>,
    /// `chd serve`'s verdict, held across windows; `None` (a replay): judged as a snapshot.
    pub verdict: Option<SharedVerdict>,
    /// Path classes and methods of the peer copy pairs (`SRC>DST`).
    pub p2p_paths: BTreeMap<String, String>,
    pub p2p_methods: BTreeMap<String, String>,
    /// A replayed run's size curves and basics table.
    pub curves: Vec<Curve>,
    pub basics: Option<BasicsTable>,
    /// The state directory's fabric results (`chd serve`; none for a replay).
    pub fabric: Option<FabricDir>,
    /// Each device's same-device copy limit (`chd serve`: NVML's memory bus, the config).
    pub d2d_limits: PathLimits,
}

impl CalibrationPage {
    /// The fabric results' stamp now (0 without a directory or when it cannot be listed).
    fn fabric_stamp(&self) -> u64 {
        self.fabric
            .as_ref()
            .and_then(|d| d.stamp().ok())
            .unwrap_or_default()
    }

    /// The fabric results now (none without a directory, or when it cannot be listed).
    fn fabric(&self) -> Listing {
        let Some(dir) = &self.fabric else {
            return Listing::default();
        };
        dir.list().unwrap_or_else(|e| {
            tracing::warn!("/api/v1/calibration goes without the fabric results: {e}");
            Listing::default()
        })
    }

    /// The ledger as of now, built under a read lock of the store.
    fn build(&self, held: Option<&NodeVerdict>, fabric: &Listing) -> String {
        let store = self
            .store
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        ledger::to_json(&ledger::build(&Source {
            host: &self.host,
            backend: &self.backend,
            description: &self.description,
            topology: &self.topology,
            devices: &self.devices,
            store: &store,
            pairs: &self.pairs,
            recorded_links: &self.recorded_links,
            recorded_bindable: &self.recorded_bindable,
            load_profile_delta: &self.load_profile_delta,
            now: unix_now(),
            verdict: held,
            p2p_paths: &self.p2p_paths,
            p2p_methods: &self.p2p_methods,
            curves: &self.curves,
            basics: self.basics.as_ref(),
            fabric,
            d2d_limits: &self.d2d_limits,
        }))
    }

    /// The held verdict now, if `chd serve` holds one.
    fn held(&self) -> Option<NodeVerdict> {
        self.verdict
            .as_ref()
            .map(|v| v.read().unwrap_or_else(|p| p.into_inner()).clone())
    }

    /// The store's generation now.
    fn generation(&self) -> u64 {
        self.store
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .generation()
    }

    /// The page, built again only when the store's generation or the held verdict changed
    /// since the last one (`exposition::page_cache`): its `generated_at` is when it was built,
    /// and every age in it counts from then, so a kept page stays true as of that time.
    pub fn renderer(self) -> PageRenderer {
        let cache: PageCache<(u64, Option<NodeVerdict>, u64)> = PageCache::default();
        Arc::new(move || {
            let held = self.held();
            // Read before the build: a cell recorded meanwhile makes the next request build
            // again rather than keep a page that misses it.
            let generation = self.generation();
            // Only the files' stamps per request: the records are read when the page is built.
            let fabric = self.fabric_stamp();
            cache.get((generation, held.clone(), fabric), || {
                self.build(held.as_ref(), &self.fabric())
            })
        })
    }

    /// The page built at every call, for `scripts/bench.sh`'s side-by-side comparison.
    pub fn rebuilt(&self) -> String {
        self.build(self.held().as_ref(), &self.fabric())
    }
}
