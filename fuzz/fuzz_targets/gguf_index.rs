//! libFuzzer entry for [`sparrow_fuzz::gguf_index`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sparrow_fuzz::gguf_index(data));
