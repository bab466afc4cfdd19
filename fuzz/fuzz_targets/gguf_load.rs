//! libFuzzer entry for [`sparrow_fuzz::gguf_load`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sparrow_fuzz::gguf_load(data));
