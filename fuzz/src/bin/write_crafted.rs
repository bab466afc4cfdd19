//! Writes every crafted model file ([`sparrow_fuzz::crafted::all`]) into the directory given
//! as the only argument, as `<name>.gguf`, with `<name>.expect` holding the phrase the start-up
//! error must contain: what `scripts/fuzz/crafted.sh` serves and measures.

fn main() -> std::process::ExitCode {
    let Some(dir) = std::env::args_os().nth(1).map(std::path::PathBuf::from) else {
        eprintln!("usage: write_crafted <dir>");
        return std::process::ExitCode::from(2);
    };
    for c in sparrow_fuzz::crafted::all() {
        let written = std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(dir.join(format!("{}.gguf", c.name)), &c.bytes))
            .and_then(|()| std::fs::write(dir.join(format!("{}.expect", c.name)), c.expect));
        if let Err(e) = written {
            eprintln!("{}: {e}", dir.display());
            return std::process::ExitCode::FAILURE;
        }
    }
    std::process::ExitCode::SUCCESS
}
