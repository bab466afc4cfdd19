//! libFuzzer entry for [`sparrow_fuzz::hf_checkpoint`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sparrow_fuzz::hf_checkpoint(data));
