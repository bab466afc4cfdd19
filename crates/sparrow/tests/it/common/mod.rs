//! Helpers shared by the `sparrow` binary's integration tests (each test file uses some).
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The `sparrow` binary under test.
pub fn sparrow() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sparrow"))
}

/// A port nothing listens on right now.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port()
}

/// The 14-word test tokenizer of the bench's fixtures.
pub fn words_tokenizer() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/tests/fixtures/words.tokenizer.json");
    p.to_str().expect("utf8").to_owned()
}

/// Waits (20 s at most) until something accepts connections on `127.0.0.1:port`.
pub fn wait_listening(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "{what} never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
}
