//! libFuzzer entry for [`sparrow_fuzz::chat_template`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sparrow_fuzz::chat_template(data));
