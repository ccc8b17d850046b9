//! The `device` load profile as the one-shot driver sees it: it follows the load profile of
//! the slot about to be measured, starting the gemm loops ([`crate::runtime::gemm`]) on the
//! probed devices when the `device` profile's slots begin and stopping them as soon as a slot
//! of another profile comes, or when the run ends ([`DeviceProfile::finish`], or drop).

use std::sync::Mutex;

use crate::runtime::gemm::{DeviceLoad, DeviceLoader};
use crate::runtime::ProbeError;

/// The name of the profile.
pub const NAME: &str = "device";

enum State {
    Off,
    On(DeviceLoad),
    /// Starting failed: every `device` slot fails with this.
    Failed(String),
}

/// Starts and stops the device load around the `device` profile's slots.
pub struct DeviceProfile {
    loader: DeviceLoader,
    devices: Vec<String>,
    cpus: Vec<u32>,
    state: Mutex<State>,
}

impl DeviceProfile {
    /// The load for `devices` (device labels), not started yet. Its threads run on the
    /// `allowed` CPUs that are not `probed` (all of `allowed` when every one is probed: they
    /// mostly wait for their device).
    pub fn new(
        loader: DeviceLoader,
        devices: Vec<String>,
        allowed: &[u32],
        probed: &[u32],
    ) -> DeviceProfile {
        let free: Vec<u32> = allowed
            .iter()
            .copied()
            .filter(|c| !probed.contains(c))
            .collect();
        DeviceProfile {
            loader,
            devices,
            cpus: if free.is_empty() {
                allowed.to_vec()
            } else {
                free
            },
            state: Mutex::new(State::Off),
        }
    }

    /// Call before measuring a slot of load profile `load`: the gemm loops run exactly while
    /// `load` is `device`.
    pub fn follow(&self, load: &str) -> Result<(), ProbeError> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if load != NAME {
            if let State::On(_) = &*state {
                if let State::On(running) = std::mem::replace(&mut *state, State::Off) {
                    let gemms = running.stop();
                    tracing::debug!("load device: {gemms} gemms");
                }
            }
            return Ok(());
        }
        match &*state {
            State::On(_) => Ok(()),
            State::Failed(e) => Err(ProbeError::Device(e.clone())),
            State::Off => match self.loader.start(&self.devices, &self.cpus) {
                Ok(running) => {
                    tracing::info!("load device: {}", running.describe());
                    *state = State::On(running);
                    Ok(())
                }
                Err(e) => {
                    let e = format!("the device load did not start: {e}");
                    *state = State::Failed(e.clone());
                    Err(ProbeError::Device(e))
                }
            },
        }
    }

    /// Stop the load if it runs; returns the gemms it ran.
    pub fn finish(&self) -> u64 {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match std::mem::replace(&mut *state, State::Off) {
            State::On(running) => running.stop(),
            _ => 0,
        }
    }
}
