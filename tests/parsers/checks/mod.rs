//! The properties every parser of untrusted text must keep, one function per fuzz target,
//! each taking the raw bytes of one input and panicking when a property fails. The
//! cargo-fuzz targets (`fuzz/fuzz_targets/`) call them on libFuzzer's inputs; the stable
//! suite (`tests/parsers/main.rs`) calls them on proptest's inputs and replays every file
//! under `fuzz/regressions/<target>/`. One definition of each property, two drivers.

pub mod affinity;
pub mod cluster_health;
pub mod config;
pub mod cpulist;
pub mod http;
pub mod proc_stat;
pub mod run_dir;
pub mod state;
pub mod sysfs;
pub mod topology;

/// A target's properties on one input.
pub type Check = fn(&[u8]);

/// Every target by the name of its fuzz target and its `fuzz/regressions/` directory.
pub const TARGETS: &[(&str, Check)] = &[
    ("affinity_file", affinity::check),
    ("cluster_health", cluster_health::check),
    ("config", config::check),
    ("cpulist", cpulist::check),
    ("http_negotiation", http::check_negotiation),
    ("http_server", http::check_server),
    ("proc_stat", proc_stat::check),
    ("run_dir", run_dir::check),
    ("state_file", state::check),
    ("sysfs_values", sysfs::check),
    ("topology", topology::check),
];

/// The input as text the way chd reads files (`read_to_string`): `None` when it is not
/// UTF-8, which every reader refuses before parsing.
pub fn text(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}

/// The input cut at its first NUL byte into two files' contents (the second empty when
/// there is none): how a target that fills two files gets both from one input.
pub fn two_files(data: &[u8]) -> (&[u8], Option<&[u8]>) {
    match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], Some(&data[i + 1..])),
        None => (data, None),
    }
}
