//! placeholder, being written.
use super::{Cpu, NumaNode, Roots, TopologyError};
pub(crate) fn read_cpus(_roots: &Roots, _nodes: &[NumaNode]) -> Result<(Vec<Cpu>, Vec<u32>), TopologyError> {
    unimplemented!("being written")
}
