//! Between nodes: the fabric probe's library.
//!
//! - [`hostlist`]: Slurm hostlist expressions (`node[01-04,07]`) expanded to node names.
//! - [`nodes`]: a checked list of distinct node names, from a list argument or a file.
//! - [`rounds`]: the round-robin schedule of disjoint node pairs (`chd fabric rounds`).

pub mod hostlist;
pub mod nodes;
pub mod rounds;
