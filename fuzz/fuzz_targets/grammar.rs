//! libFuzzer entry for [`sparrow_fuzz::grammar`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sparrow_fuzz::grammar(data));
