//! ARCHITECTURE.md stays true: every source file under `crates/*/src` is named, as its path
//! relative to `src/` in backticks, under its crate's `## crates/<name>` heading, and every
//! file a section lists (a line starting with "- `path.rs`") exists. A file added without its
//! line, or removed with its line left behind, fails here.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Every `.rs` file under `dir`, as paths relative to it with `/` separators.
fn rust_files(dir: &Path, rel: &str, out: &mut Vec<String>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().and_then(|n| n.to_str()).expect("UTF-8 file name").to_owned();
        let r = if rel.is_empty() { name.clone() } else { format!("{rel}/{name}") };
        if p.is_dir() {
            rust_files(&p, &r, out);
        } else if name.ends_with(".rs") {
            out.push(r);
        }
    }
}

/// The `## ` sections of a markdown text: heading -> body lines.
fn sections(text: &str) -> Vec<(String, Vec<&str>)> {
    let mut out: Vec<(String, Vec<&str>)> = Vec::new();
    for line in text.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            out.push((h.trim().to_owned(), Vec::new()));
        } else if let Some((_, body)) = out.last_mut() {
            body.push(line);
        }
    }
    out
}

/// Backticked `*.rs` words of `line`.
fn backticked_rs(line: &str) -> impl Iterator<Item = &str> {
    line.split('`').skip(1).step_by(2).filter(|w| w.ends_with(".rs") && !w.contains(char::is_whitespace))
}

/// What is wrong with `arch` (the text of ARCHITECTURE.md) against the crates under `root`:
/// one message per problem, empty when it is true.
fn problems(arch: &str, root: &Path) -> Vec<String> {
    let secs = sections(arch);
    let mut crates: Vec<String> = std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.join("src").is_dir())
        .map(|p| p.file_name().and_then(|n| n.to_str()).expect("UTF-8").to_owned())
        .collect();
    crates.sort();
    let mut out = Vec::new();
    for c in &crates {
        let head = format!("crates/{c}");
        let found: Vec<_> = secs.iter().filter(|(h, _)| *h == head).collect();
        let [(_, body)] = found.as_slice() else {
            out.push(format!("{} `## {head}` headings (want exactly one)", found.len()));
            continue;
        };
        let named: BTreeSet<&str> = body.iter().flat_map(|l| backticked_rs(l)).collect();
        let mut files = Vec::new();
        rust_files(&root.join("crates").join(c).join("src"), "", &mut files);
        for f in &files {
            if !named.contains(f.as_str()) {
                out.push(format!("{head}/src/{f} is not named under `## {head}`"));
            }
        }
        let listed = body.iter().filter_map(|l| l.strip_prefix("- `")).filter_map(|l| l.split('`').next());
        for l in listed.filter(|l| l.ends_with(".rs")) {
            if !files.iter().any(|f| f == l) {
                out.push(format!("`## {head}` lists `{l}`, which is not a file of {head}/src"));
            }
        }
    }
    for (h, _) in &secs {
        if let Some(c) = h.strip_prefix("crates/") {
            if !crates.iter().any(|k| k == c) {
                out.push(format!("`## {h}`: no such crate"));
            }
        }
    }
    out
}

fn architecture_md() -> String {
    let p = repo().join("ARCHITECTURE.md");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn architecture_names_every_source_file() {
    let p = problems(&architecture_md(), &repo());
    assert!(p.is_empty(), "ARCHITECTURE.md is out of date:\n{}", p.join("\n"));
}

/// The check fails when a file's line is left out, and when a line names a file that is gone.
#[test]
fn architecture_check_catches_a_missing_and_a_stale_line() {
    let arch = architecture_md();
    let line = arch.lines().find(|l| l.starts_with("- `main.rs`")).expect("the binary's main.rs line");
    let without = arch.replacen(&format!("{line}\n"), "", 1);
    let p = problems(&without, &repo());
    assert_eq!(p, vec!["crates/sparrow/src/main.rs is not named under `## crates/sparrow`".to_owned()]);
    let stale = arch.replacen(line, &format!("{line}\n- `gone.rs`: removed long ago."), 1);
    let p = problems(&stale, &repo());
    assert_eq!(p, vec!["`## crates/sparrow` lists `gone.rs`, which is not a file of crates/sparrow/src".to_owned()]);
}

/// The scripts under `scripts/` (each file of `goldens/`, `bench/`, `fuzz/`, `ops/`, and
/// `bench/lib/` as one entry) not named as `` `name` `` in `docs/scripts.md`.
fn unlisted_scripts(doc: &str, root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for dir in ["goldens", "bench", "fuzz", "ops"] {
        let entries =
            std::fs::read_dir(root.join("scripts").join(dir)).unwrap_or_else(|e| panic!("scripts/{dir}: {e}"));
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !doc.contains(&format!("`{name}`")) && !doc.contains(&format!("`{name}/`")) {
                out.push(format!("scripts/{dir}/{name}"));
            }
        }
    }
    out.sort();
    out
}

/// `docs/scripts.md` lists every script, the golden scripts among them, so a new one is found
/// with what it writes and what it compares against; a row left out fails.
#[test]
fn scripts_md_lists_every_script() {
    let p = repo().join("docs/scripts.md");
    let doc = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    assert_eq!(unlisted_scripts(&doc, &repo()), Vec::<String>::new(), "docs/scripts.md lacks rows");
    let without = doc.replace("`family_golden.py`", "family_golden");
    assert_eq!(unlisted_scripts(&without, &repo()), vec!["scripts/goldens/family_golden.py".to_owned()]);
}
