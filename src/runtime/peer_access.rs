//! Peer access for the pair probe's copy method. A cross-device copy only crosses the link
//! between two devices once each side may map the other's memory: CUDA stages it through host
//! memory otherwise, and CANN requires `aclrtDeviceCanAccessPeer` +
//! `aclrtDeviceEnablePeerAccess` before `aclrtMemcpy` between devices. As nvbandwidth does
//! (`DeviceBuffer::enablePeerAcess`: `cuDeviceCanAccessPeer`, then `cuCtxEnablePeerAccess`
//! from each context towards the other, tolerating `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`),
//! `PeerLink::open` queries and enables access both ways.
//!
//! Lifetime: access lasts until `cudaDeviceDisablePeerAccess`, a device reset, or the end of
//! the context (the process); nvbandwidth leaves it to the context's end. chd is a long-lived
//! exporter and a mapped peer makes every later allocation of either device map into the
//! other, so `PeerLink::close` disables what chd itself enabled when the probe releases the
//! pair (a direction that was already enabled, e.g. by NCCL in this process, is left alone).
//! On ACL every direction counts as already enabled: CANN enables peer access per device, not
//! per process, and cannot say whether it already was, so chd never disables it there.

use super::device_copy::{ApiError, DeviceApi};

/// How a pair's cross-device copies travel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PeerRoute {
    /// Peer access is enabled both ways: copies cross the link.
    Direct,
    /// Peer access was refused; the runtime stages copies through host memory (CUDA).
    Staged(String),
    /// Peer access was refused and the runtime cannot copy between the devices (ACL).
    Refused(String),
}

impl PeerRoute {
    /// The pair probe method this route measures: `copy` or `copy-staged`.
    pub(crate) fn method(&self) -> &'static str {
        match self {
            PeerRoute::Staged(_) => COPY_STAGED,
            PeerRoute::Direct | PeerRoute::Refused(_) => COPY,
        }
    }
}

/// Peer copies over the link.
pub const COPY: &str = "copy";
/// Peer copies staged through host memory: peer access was refused.
pub const COPY_STAGED: &str = "copy-staged";

/// Why `a` and `b` cannot map each other, if they cannot (no state changes).
pub(crate) fn refusal(api: &dyn DeviceApi, pair: [i32; 2]) -> Result<Option<String>, ApiError> {
    for (dev, peer) in [(pair[0], pair[1]), (pair[1], pair[0])] {
        if !api.can_access_peer(dev, peer)? {
            return Ok(Some(format!(
                "the runtime says device {dev} cannot access device {peer}'s memory"
            )));
        }
    }
    Ok(None)
}

/// Peer access opened for one device pair; [`PeerLink::close`] undoes what chd enabled.
#[derive(Debug)]
pub(crate) struct PeerLink {
    pair: [i32; 2],
    pub route: PeerRoute,
    /// `enabled[r]`: chd enabled `pair[r]` -> `pair[1 - r]` and must disable it.
    enabled: [bool; 2],
}

impl PeerLink {
    /// Query and enable peer access both ways. Never fails: a refusal is the route.
    pub(crate) fn open(api: &dyn DeviceApi, pair: [i32; 2]) -> PeerLink {
        let mut link = PeerLink {
            pair,
            route: PeerRoute::Direct,
            enabled: [false; 2],
        };
        let mut why = match refusal(api, pair) {
            Ok(why) => why,
            Err(e) => Some(e.to_string()),
        };
        for r in 0..2 {
            if why.is_some() {
                break;
            }
            let (dev, peer) = (pair[r], pair[1 - r]);
            match api
                .set_device(dev)
                .and_then(|()| api.enable_peer_access(peer))
            {
                Ok(newly) => link.enabled[r] = newly,
                Err(e) => why = Some(e.to_string()),
            }
        }
        if let Some(why) = why {
            link.route = if api.stages_peer_copies() {
                PeerRoute::Staged(why)
            } else {
                PeerRoute::Refused(why)
            };
        }
        link
    }

    /// The directions chd enabled, as (device, peer): what [`PeerLink::close`] would disable.
    pub(crate) fn enabled_directions(&self) -> Vec<(i32, i32)> {
        (0..2)
            .filter(|&r| self.enabled[r])
            .map(|r| (self.pair[r], self.pair[1 - r]))
            .collect()
    }

    /// Disable the directions chd enabled.
    pub(crate) fn close(self, api: &dyn DeviceApi) {
        for r in 0..2 {
            if !self.enabled[r] {
                continue;
            }
            let (dev, peer) = (self.pair[r], self.pair[1 - r]);
            if let Err(e) = api
                .set_device(dev)
                .and_then(|()| api.disable_peer_access(peer))
            {
                tracing::warn!("disabling peer access from device {dev} to device {peer}: {e}");
            }
        }
    }
}
