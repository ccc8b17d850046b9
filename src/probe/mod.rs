//! Probes: measuring one cell of a matrix on a thread bound to the cell's CPU.

pub mod h2d;
