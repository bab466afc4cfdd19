//! libFuzzer entry for [`sparrow_fuzz::tokenizer_gguf`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sparrow_fuzz::tokenizer_gguf(data));
