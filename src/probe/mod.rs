//! Probes: measuring one cell of a matrix (or one point of a size curve) on a thread bound
//! to the cell's CPU, and one-shot runs over a list of cells. Each kind of one-shot
//! measurement is one module here with one row in [`kinds::KINDS`] (its request, its plan, its
//! slots and how one is measured): [`h2d`], [`pairs`], [`d2d`], [`p2p`], [`sweep`],
//! [`basics`]. [`plan`] holds what their planning shares, [`setup`] what a kind hands the
//! one-shot driver, [`run`] is that driver (a run directory started or resumed, measured,
//! recorded), [`execute`] and [`oneshot`] run a plan's slots.

pub mod basics;
pub mod d2d;
pub mod execute;
pub mod h2d;
pub mod kind;
pub mod kinds;
pub mod oneshot;
pub mod p2p;
pub mod pairs;
pub mod plan;
pub mod run;
pub mod setup;
pub mod sweep;

use crate::store::CellKey;
use crate::vocab::Direction;

/// Every copy cell for these CPUs, devices, sizes and directions.
pub fn copy_cells(
    cpus: &[u32],
    devices: &[&str],
    sizes_bytes: &[u64],
    directions: &[Direction],
) -> Vec<CellKey> {
    let mut cells = Vec::with_capacity(cpus.len() * devices.len() * sizes_bytes.len());
    for &cpu in cpus {
        for device in devices {
            for &size_bytes in sizes_bytes {
                for &direction in directions {
                    cells.push(CellKey {
                        cpu,
                        device: device.to_string(),
                        size_bytes,
                        direction,
                    });
                }
            }
        }
    }
    cells
}
