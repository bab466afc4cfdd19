//! Crafted model files, each wrong in one way a hostile or broken download is: cut short in
//! every section, tensor data past the end, counts and lengths far past the file, a tensor of
//! 2^63 elements, chat templates that loop, flood, build a huge string or try to read a file.
//! `sparrow serve` must refuse each at start-up with a message naming the problem, quickly
//! and without allocating by the stated sizes: `crates/sparrow/tests/it/untrusted.rs` checks
//! the messages, `scripts/fuzz/crafted.sh` measures time and peak memory.

use crate::seeds::{gguf, tiny_gguf, tokenizer_meta, Meta};

/// One crafted file: its name, bytes, and a phrase `sparrow serve`'s error must contain.
pub struct Crafted {
    /// File name stem.
    pub name: &'static str,
    /// The file.
    pub bytes: Vec<u8>,
    /// A phrase of the expected start-up error.
    pub expect: &'static str,
}

/// Offset of the first occurrence of `pat`.
fn find(f: &[u8], pat: &[u8]) -> usize {
    f.windows(pat.len()).position(|w| w == pat).unwrap_or(0)
}

/// The tiny Llama of [`tiny_gguf`] with its chat template replaced.
fn with_template(t: &str) -> Vec<u8> {
    let mut meta = vec![("general.architecture", Meta::Str("llama".into())), ("llama.context_length", Meta::U32(256))];
    meta.extend(tokenizer_meta("bpe").into_iter().map(|(k, v)| match k {
        "tokenizer.chat_template" => (k, Meta::Str(t.into())),
        _ => (k, v),
    }));
    // The template check runs before the weights load: no tensors needed.
    gguf(&meta, &[])
}

/// Every crafted file.
pub fn all() -> Vec<Crafted> {
    let good = tiny_gguf("llama");
    let kv_start = 24;
    let table = find(&good, b"\x11\0\0\0\0\0\0\0token_embd.weight");
    // The data section ends the file: every tensor's F32 values, each padded to 32 bytes.
    let data: usize = [32 * 264, 32, 32, 32 * 32, 32 * 16, 32 * 16, 32 * 32, 32, 32 * 64, 32 * 64, 64 * 32]
        .iter()
        .map(|n| (n * 4usize).next_multiple_of(32))
        .sum();
    let data_start = good.len() - data;
    let mut v = vec![
        Crafted { name: "cut-header", bytes: good[..10].to_vec(), expect: "GGUF" },
        Crafted { name: "cut-metadata", bytes: good[..kv_start + 300].to_vec(), expect: "left in the file" },
        Crafted { name: "cut-tensor-table", bytes: good[..table + 30].to_vec(), expect: "left in the file" },
        Crafted { name: "cut-data", bytes: good[..data_start + 1000].to_vec(), expect: "data runs past the end" },
    ];
    // 2^63 tensors stated.
    let mut f = good.clone();
    f[8..16].copy_from_slice(&(1u64 << 63).to_le_bytes());
    v.push(Crafted { name: "tensor-count-2e63", bytes: f, expect: "left in the file" });
    // 2^63 metadata entries stated.
    let mut f = good.clone();
    f[16..24].copy_from_slice(&(1u64 << 63).to_le_bytes());
    v.push(Crafted { name: "metadata-count-2e63", bytes: f, expect: "left in the file" });
    // general.architecture's value said to be 2^32 bytes long.
    let mut f = good.clone();
    let at = find(&f, b"\x05\0\0\0\0\0\0\0llama");
    f[at..at + 8].copy_from_slice(&(1u64 << 32).to_le_bytes());
    v.push(Crafted { name: "string-2e32", bytes: f, expect: "a string of 4294967296 bytes" });
    // The token list said to hold 2^62 strings.
    let mut f = good.clone();
    let at = find(&f, b"tokenizer.ggml.tokens") + "tokenizer.ggml.tokens".len() + 8;
    f[at..at + 8].copy_from_slice(&(1u64 << 62).to_le_bytes());
    v.push(Crafted { name: "array-2e62", bytes: f, expect: "tokenizer.ggml.tokens" });
    // token_embd.weight of 2^32 × 2^31 = 2^63 elements.
    let mut f = good.clone();
    let dims = table + 8 + "token_embd.weight".len() + 4;
    f[dims..dims + 8].copy_from_slice(&(1u64 << 32).to_le_bytes());
    f[dims + 8..dims + 16].copy_from_slice(&(1u64 << 31).to_le_bytes());
    v.push(Crafted { name: "elements-2e63", bytes: f, expect: "token_embd.weight" });
    // A context length whose RoPE table would take 2^40 × 16 floats.
    let mut f = good.clone();
    let at = find(&f, b"llama.context_length") + "llama.context_length".len() + 4;
    f[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    v.push(Crafted { name: "context-2e32", bytes: f, expect: "context_length = 4294967295" });
    // Templates.
    v.push(Crafted {
        name: "template-loop",
        bytes: with_template("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"),
        expect: "instructions",
    });
    v.push(Crafted {
        name: "template-flood",
        bytes: with_template(
            "{% for i in range(10000) %}{% for j in range(10000) %}{{ 'x' * 1000 }}{% endfor %}{% endfor %}",
        ),
        expect: "rendered more than 4 MiB",
    });
    v.push(Crafted {
        name: "template-doubling",
        bytes: with_template(
            "{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
        ),
        expect: "took more memory than its start-up check allows",
    });
    v.push(Crafted {
        name: "template-per-message",
        bytes: with_template(
            "{% set ns = namespace(s='x') %}{% for m in messages %}{% set ns.s = ns.s ~ ns.s ~ m.content %}{% endfor %}{{ ns.s|length }}",
        ),
        expect: "took more memory than its start-up check allows",
    });
    v.push(Crafted {
        name: "template-read-file",
        bytes: with_template("{% include '/etc/passwd' %}"),
        expect: "tries to read another template or file",
    });
    v
}
