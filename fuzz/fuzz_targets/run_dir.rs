//! `run_dir`: the properties of `chd_fuzz::checks::run_dir::check` on libFuzzer's inputs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| chd_fuzz::checks::run_dir::check(data));
