//! `http_server`: the properties of `chd_fuzz::checks::http::check_server` on libFuzzer's inputs.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| chd_fuzz::checks::http::check_server(data));
