//! libFuzzer entry for [`sparrow_fuzz::tokenizer_json`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sparrow_fuzz::tokenizer_json(data));
