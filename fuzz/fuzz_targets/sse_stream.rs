//! libFuzzer entry for [`sparrow_fuzz::sse_stream`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sparrow_fuzz::sse_stream(data));
