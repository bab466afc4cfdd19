//! libFuzzer entry for [`sparrow_fuzz::tokenizer_json`].
//!
//! A panic inside the `tokenizers` crate that sparrow catches and turns into an error (its
//! `shield` and the load's probe) is not a finding here: libfuzzer-sys's hook aborts on every
//! panic, caught or not, so `init` puts the standard hook back. A panic that reaches the target
//! still aborts (libfuzzer-sys's own `catch_unwind`) and is a crash.
#![no_main]

libfuzzer_sys::fuzz_target!(
    init: {
        let _ = std::panic::take_hook();
    },
    |data: &[u8]| sparrow_fuzz::tokenizer_json(data)
);
