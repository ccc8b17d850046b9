//! `proc_stat`: the properties of `chd_fuzz::checks::proc_stat::check` on libFuzzer's inputs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| chd_fuzz::checks::proc_stat::check(data));
