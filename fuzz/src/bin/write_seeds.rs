//! Writes every target's seeds ([`sparrow_fuzz::seeds::all`]) under the directory given as
//! the only argument, one folder per target, as `cargo fuzz` corpora: what
//! `scripts/fuzz/run.sh` starts a corpus from.

fn main() -> std::process::ExitCode {
    let Some(root) = std::env::args_os().nth(1).map(std::path::PathBuf::from) else {
        eprintln!("usage: write_seeds <corpus root>");
        return std::process::ExitCode::from(2);
    };
    for (target, name, bytes) in sparrow_fuzz::seeds::all() {
        let dir = root.join(target);
        let path = dir.join(format!("seed-{name}"));
        if let Err(e) = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, bytes)) {
            eprintln!("{}: {e}", path.display());
            return std::process::ExitCode::FAILURE;
        }
    }
    std::process::ExitCode::SUCCESS
}
