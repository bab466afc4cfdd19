//! Crafted model files (`sparrow_fuzz::crafted`: cut short in every section, tensor data past
//! the end, counts and lengths of 2^32–2^63, a tensor of 2^63 elements, a context length whose
//! RoPE table no file could back, chat templates that loop, flood, build a huge string or read
//! a file): `sparrow serve` exits with an error naming the problem, every time. Its time and
//! peak memory are measured by `scripts/fuzz/crafted.sh`, not here.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn serve_refuses_each_crafted_file_with_its_reason() {
    let dir = tempfile::tempdir().expect("temp dir");
    for c in sparrow_fuzz::crafted::all() {
        let path = dir.path().join(format!("{}.gguf", c.name));
        std::fs::write(&path, &c.bytes).expect("write");
        let mut child = Command::new(env!("CARGO_BIN_EXE_sparrow"))
            .args(["serve", "--port", "0", "--disable-autotune", "--model-path"])
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn sparrow serve");
        // A guard against a hang only (a refused file exits at once); not a timing.
        let start = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().expect("wait") {
                break s;
            }
            if start.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                panic!("{}: still running after 60 s", c.name);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        child.stderr.take().expect("stderr").read_to_string(&mut err).expect("read stderr");
        assert!(!status.success(), "{}: exited 0\n{err}", c.name);
        assert_eq!(status.code(), Some(2), "{}: not the set-up error exit (a signal?)\n{err}", c.name);
        assert!(err.contains(c.expect), "{}: no {:?} in\n{err}", c.name, c.expect);
        assert!(!err.contains("panicked"), "{}: a panic\n{err}", c.name);
    }
}
