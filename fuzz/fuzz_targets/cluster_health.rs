//! `cluster_health`: the properties of `chd_fuzz::checks::cluster_health::check` on libFuzzer's inputs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| chd_fuzz::checks::cluster_health::check(data));
