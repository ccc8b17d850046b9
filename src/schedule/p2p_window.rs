//! The peer copy part of a probe window: ONE ordered device pair's copy cell (a buffer on
//! `src` to a buffer on `dst`, on a stream of `src`, of the configured size), from one CPU of
//! `src`'s NUMA node, run last in the window on the same thread (so never concurrently with
//! the H2D or same-device cells), only in what is left of the budget and only while the idle
//! gate is open ([`super::single_cell`]). [`Backend::measure_peer_copy`] opens peer access for
//! the cell and closes it after, and frees both buffers: nothing is held between windows.

use super::single_cell::{SingleCell, SingleCellSpec};
use crate::probe::p2p;
use crate::runtime::{Backend, DeviceCopyParams, ProbeError};
use crate::store::P2pKey;

/// The ordered pair a window measures, the CPU it runs from and the size of its copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct P2pCell {
    pub key: P2pKey,
    pub cpu: u32,
    pub size_bytes: u64,
}

/// What the p2p part of a window should do (one cell, or none: the p2p probe is off or the
/// node has no pairs).
pub type P2pWindowSpec = SingleCellSpec<P2pCell>;

impl SingleCell for P2pCell {
    const PROBE: &'static str = "p2p";
    type Key = P2pKey;

    fn key(&self) -> &P2pKey {
        &self.key
    }

    fn devices(&self) -> Vec<&str> {
        vec![self.key.src(), self.key.dst()]
    }

    fn label(&self) -> String {
        self.key.to_string()
    }

    fn measure(
        &self,
        backend: &dyn Backend,
        warmup: u32,
        iterations: u32,
    ) -> Result<f64, ProbeError> {
        let params = DeviceCopyParams {
            size_bytes: self.size_bytes,
            warmup,
            iterations,
        };
        let got = p2p::measure_cell(backend, self.cpu, &self.key, &params)?;
        tracing::debug!(pair = %self.key, method = got.method, "p2p cell measured");
        Ok(got.bytes_per_second)
    }
}
