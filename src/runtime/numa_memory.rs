//! NUMA-placed buffers: placeholder, being written.
