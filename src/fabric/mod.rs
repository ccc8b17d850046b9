//! Between nodes: the fabric probe's library. A launcher (Slurm, a Kubernetes Indexed Job,
//! torchrun, MPI) starts one `chd probe fabric` per rank; each learns who it is
//! ([`launch`]), finds its rails ([`rails`]), meets the others at rank 0 with the run's token
//! ([`token`], [`wire`], [`session`]), and measures what rank 0 planned ([`plan`]) over TCP
//! streams ([`stream`]) on the CPUs nearest each rail ([`placement`]), then the collective over all ranks ([`ring`]). Each node keeps its side of the results in its state directory
//! (`format::fabric`), where `chd serve` publishes them.
//!
//! Which node pairs run together is the schedule's: [`rounds`] (`chd fabric rounds`), the
//! round-robin schedule of disjoint node pairs, over [`nodes`] (a checked list of distinct
//! node names) and [`hostlist`] (Slurm hostlist expressions, `node[01-04,07]`).

pub mod device;
pub mod hostlist;
pub mod launch;
pub mod nic;
pub mod nodes;
pub mod placement;
pub mod plan;
pub mod rails;
pub mod ring;
pub mod rounds;
pub mod session;
pub mod stream;
pub mod token;
pub mod wire;
