//! Every GGUF tensor type the Llama loader accepts (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//! Q4_K, Q5_K, Q6_K), in mixed combinations, with a tied or a separate output head, loaded from
//! tiny synthetic GGUF files written here with `ggus`. The 5-bit and K-quant tensors are random
//! block bytes with their scales set for weights of about ±0.5 (no quantizer is needed: the
//! twin holds whatever they decode to).
//!
//! Each quantized model is checked against an all-F32 twin holding exactly its dequantized
//! weights: the twin runs the dense f32 path with unquantized activations, the original the
//! integer kernels with 8-bit activations, so their logits differ only by activation rounding
//! (bounded below) and their greedy tokens agree where the twin's margin is clear. The mixed
//! case puts different formats into one fused QKV and gate/up projection (a stack that keeps
//! each part's form). Every case also holds its weights within 1.05 × the file's tensor bytes.

use std::path::Path;

use ggus::{GGmlType, GGufFileHeader, GGufFileWriter, GGufMetaDataValueType as Ty};
use sparrow_cpu::format::ggml::{dequantize_row, GgmlType};
use sparrow_cpu::half::f16_to_f32;
use sparrow_engine::batch::ForwardBatch;
use sparrow_engine::kv::KvStore;
use sparrow_engine::model::llama::LlamaModel;
use sparrow_engine::model::Model;

// Whole K-quant super-blocks (256) in every row.
const HIDDEN: usize = 256;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const FFN: usize = 512;
const LAYERS: usize = 2;
const VOCAB: usize = 96;
const CTX: usize = 64;

pub(crate) struct Lcg(pub(crate) u64);
impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }
    pub(crate) fn f(&mut self, scale: f32) -> f32 {
        (self.next() % 20001) as f32 / 10000.0 * scale - scale
    }
}

/// Encodes `x` (a multiple of 32 values) in a GGML type. f32 → f16 truncates the mantissa and
/// flushes tiny values to zero: any encoding will do, because the twin is built from the
/// decoded values.
pub(crate) fn encode(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    if matches!(ty, GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K) {
        return random_encoding(ty, x);
    }
    let f16 = |v: f32| -> [u8; 2] {
        // Exact for the scales used here: normal f16 range, 10-bit mantissa taken from f32.
        let b = v.to_bits();
        let sign = ((b >> 16) & 0x8000) as u16;
        let exp = ((b >> 23) & 0xff) as i32 - 127 + 15;
        if exp < 1 {
            return sign.to_le_bytes(); // below f16's normal range: flush to zero
        }
        assert!(exp < 31, "{v} outside f16 range");
        (sign | ((exp as u16) << 10) | ((b >> 13) & 0x3ff) as u16).to_le_bytes()
    };
    let round16 = |v: f32| f16_to_f32(u16::from_le_bytes(f16(v)));
    let mut out = Vec::new();
    match ty {
        GgmlType::F32 => x.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        GgmlType::F16 => x.iter().for_each(|v| out.extend_from_slice(&f16(*v))),
        // The top half of the f32 (truncation: any encoding will do).
        GgmlType::BF16 => x.iter().for_each(|v| out.extend_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes())),
        GgmlType::Q8_0 => {
            for blk in x.chunks_exact(32) {
                let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
                let d = round16(amax / 127.0);
                out.extend_from_slice(&f16(d));
                out.extend(blk.iter().map(|v| ((v / d).round().clamp(-127.0, 127.0) as i8) as u8));
            }
        }
        GgmlType::Q4_0 => {
            for blk in x.chunks_exact(32) {
                let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
                let d = round16(amax / 7.0);
                out.extend_from_slice(&f16(d));
                let q = |v: f32| ((v / d).round().clamp(-8.0, 7.0) as i32 + 8) as u8;
                out.extend((0..16).map(|j| q(blk[j]) | (q(blk[j + 16]) << 4)));
            }
        }
        GgmlType::Q4_1 => {
            for blk in x.chunks_exact(32) {
                let (lo, hi) = blk.iter().fold((f32::MAX, f32::MIN), |(a, b), v| (a.min(*v), b.max(*v)));
                let (d, m) = (round16((hi - lo) / 15.0), round16(lo));
                out.extend_from_slice(&f16(d));
                out.extend_from_slice(&f16(m));
                let q = |v: f32| ((v - m) / d).round().clamp(0.0, 15.0) as u8;
                out.extend((0..16).map(|j| q(blk[j]) | (q(blk[j + 16]) << 4)));
            }
        }
        _ => unreachable!("random_encoding takes {ty:?}"),
    }
    out
}

/// Random codes (seeded from `x`) with the f16 scale fields set so that weights stay within
/// about ±0.5: `(offset, value)` of each field per block.
fn random_encoding(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut rng = Lcg(x.len() as u64 ^ x[0].to_bits() as u64);
    let mut raw = sparrow_cpu::format::ggml::random_blocks(ty, x.len(), &mut || rng.next());
    let fields: &[(usize, f32)] = match ty {
        GgmlType::Q5_0 => &[(0, 0.5 / 16.0)],
        GgmlType::Q5_1 => &[(0, 1.0 / 31.0), (2, -0.5)],
        GgmlType::Q4_K => &[(0, 1.0 / (63.0 * 15.0)), (2, 0.5 / 63.0)],
        GgmlType::Q5_K => &[(0, 1.0 / (63.0 * 31.0)), (2, 0.5 / 63.0)],
        _ => &[(208, 0.5 / (127.0 * 32.0))],
    };
    let bs = ty.bytes_for(ty.block_len());
    for blk in raw.chunks_exact_mut(bs) {
        for &(at, v) in fields {
            blk[at..at + 2].copy_from_slice(&sparrow_cpu::half::f32_to_f16(v).to_le_bytes());
        }
    }
    raw
}

pub(crate) fn ggml(ty: GgmlType) -> GGmlType {
    match ty {
        GgmlType::F32 => GGmlType::F32,
        GgmlType::F16 => GGmlType::F16,
        GgmlType::BF16 => GGmlType::BF16,
        GgmlType::Q4_0 => GGmlType::Q4_0,
        GgmlType::Q4_1 => GGmlType::Q4_1,
        GgmlType::Q8_0 => GGmlType::Q8_0,
        GgmlType::Q5_0 => GGmlType::Q5_0,
        GgmlType::Q5_1 => GGmlType::Q5_1,
        GgmlType::Q4_K => GGmlType::Q4K,
        GgmlType::Q5_K => GGmlType::Q5K,
        GgmlType::Q6_K => GGmlType::Q6K,
        GgmlType::MXFP4 => panic!("ggus has no MXFP4 (moe_tensors.rs writes it byte by byte)"),
    }
}

/// Chooses each linear tensor's type from its name.
type TypePick = Box<dyn Fn(&str) -> GgmlType>;

/// A tensor: name, GGUF shape `[cols, rows]` (or `[len]`), type, encoded bytes.
pub(crate) type Tensor = (String, Vec<u64>, GgmlType, Vec<u8>);

/// Random weights; `types` picks the type of each linear tensor (by name suffix). Returns the
/// tensors, and the same tensors re-encoded as F32 holding the dequantized values.
fn weights(types: &dyn Fn(&str) -> GgmlType, tied: bool) -> (Vec<Tensor>, Vec<Tensor>) {
    let mut rng = Lcg(42);
    let kvd = HIDDEN / HEADS * KV_HEADS;
    let mut mats: Vec<(String, usize, usize)> = vec![("token_embd.weight".into(), VOCAB, HIDDEN)];
    for l in 0..LAYERS {
        for (n, r, c) in [
            ("attn_q", HIDDEN, HIDDEN),
            ("attn_k", kvd, HIDDEN),
            ("attn_v", kvd, HIDDEN),
            ("attn_output", HIDDEN, HIDDEN),
            ("ffn_gate", FFN, HIDDEN),
            ("ffn_up", FFN, HIDDEN),
            ("ffn_down", HIDDEN, FFN),
        ] {
            mats.push((format!("blk.{l}.{n}.weight"), r, c));
        }
    }
    if !tied {
        mats.push(("output.weight".into(), VOCAB, HIDDEN));
    }
    let (mut real, mut twin) = (Vec::new(), Vec::new());
    for (name, rows, cols) in mats {
        let ty = types(&name);
        let x: Vec<f32> = (0..rows * cols).map(|_| rng.f(0.5)).collect();
        let bytes = encode(ty, &x);
        let mut deq = vec![0f32; rows * cols];
        dequantize_row(ty, &bytes, &mut deq);
        real.push((name.clone(), vec![cols as u64, rows as u64], ty, bytes));
        twin.push((name, vec![cols as u64, rows as u64], GgmlType::F32, encode(GgmlType::F32, &deq)));
    }
    for l in 0..LAYERS {
        for n in ["attn_norm", "ffn_norm"] {
            let g: Vec<f32> = (0..HIDDEN).map(|_| 1.0 + rng.f(0.2)).collect();
            let t = (format!("blk.{l}.{n}.weight"), vec![HIDDEN as u64], GgmlType::F32, encode(GgmlType::F32, &g));
            real.push(t.clone());
            twin.push(t);
        }
    }
    let g: Vec<f32> = (0..HIDDEN).map(|_| 1.0 + rng.f(0.2)).collect();
    let t = ("output_norm.weight".to_owned(), vec![HIDDEN as u64], GgmlType::F32, encode(GgmlType::F32, &g));
    real.push(t.clone());
    twin.push(t);
    (real, twin)
}

fn write_gguf(path: &Path, tensors: &[Tensor]) {
    write_gguf_meta(path, tensors, LAYERS, CTX, HIDDEN, FFN, HEADS, KV_HEADS, 10000.0)
}

#[allow(clippy::too_many_arguments)]
fn write_gguf_meta(
    path: &Path,
    tensors: &[Tensor],
    layers: usize,
    ctx: usize,
    hidden: usize,
    ffn: usize,
    heads: usize,
    kv_heads: usize,
    rope_base: f32,
) {
    let meta: Vec<(&str, Ty, Vec<u8>)> = vec![
        ("general.architecture", Ty::String, [&(5u64.to_le_bytes())[..], b"llama"].concat()),
        ("llama.block_count", Ty::U32, (layers as u32).to_le_bytes().to_vec()),
        ("llama.context_length", Ty::U32, (ctx as u32).to_le_bytes().to_vec()),
        ("llama.embedding_length", Ty::U32, (hidden as u32).to_le_bytes().to_vec()),
        ("llama.feed_forward_length", Ty::U32, (ffn as u32).to_le_bytes().to_vec()),
        ("llama.attention.head_count", Ty::U32, (heads as u32).to_le_bytes().to_vec()),
        ("llama.attention.head_count_kv", Ty::U32, (kv_heads as u32).to_le_bytes().to_vec()),
        ("llama.rope.freq_base", Ty::F32, rope_base.to_le_bytes().to_vec()),
        ("llama.attention.layer_norm_rms_epsilon", Ty::F32, 1e-5f32.to_le_bytes().to_vec()),
    ];
    let file = std::fs::File::create(path).expect("create gguf");
    let header = GGufFileHeader::new(3, tensors.len() as u64, meta.len() as u64);
    let mut w = GGufFileWriter::new(std::io::BufWriter::new(file), header).expect("header");
    for (k, ty, v) in &meta {
        w.write_meta_kv(k, *ty, v).expect("meta");
    }
    let mut tw = w.finish::<Vec<u8>>(true);
    for (name, shape, ty, bytes) in tensors {
        tw.write_tensor(name, ggml(*ty), shape, bytes.clone()).expect("tensor");
    }
    tw.finish().expect("write");
}

fn logits(m: &mut LlamaModel, ids: &[u32]) -> Vec<Vec<f32>> {
    let mut kv = KvStore::new(m.attention_needs().kv_layout, CTX + 1);
    // Prefill all but the last token, then one step at a time: both paths of the kernels.
    let mut out = vec![m.forward(&ForwardBatch::single_sequence(&ids[..ids.len() - 3], 0), &mut kv).expect("forward")];
    for n in ids.len() - 2..=ids.len() {
        out.push(m.forward(&ForwardBatch::single_sequence(&ids[..n], n - 1), &mut kv).expect("forward"));
    }
    out
}

#[test]
fn every_tensor_type_loads_and_matches_its_f32_twin() {
    let dir = std::env::temp_dir().join(format!("sparrow-formats-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let ids: Vec<u32> = (0..20u32).map(|i| (i * 37 + 5) % VOCAB as u32).collect();
    let mixed = |n: &str| -> GgmlType {
        if n.contains("attn_q") || n.contains("ffn_gate") {
            GgmlType::Q4_0
        } else if n.contains("attn_k") || n.contains("ffn_down") || n.starts_with("token_embd") {
            GgmlType::Q8_0
        } else if n.contains("attn_v") || n.starts_with("output") {
            GgmlType::Q4_1
        } else if n.contains("attn_output") {
            GgmlType::F16
        } else {
            GgmlType::Q4_1
        }
    };
    let uniform = |ty: GgmlType| move |_: &str| ty;
    // What a Q4_K_M converter writes for Gemma 3: Q5_0/Q8_0 projections, Q4_K and Q6_K outputs
    // and downs; Q5_0 beside Q8_0 in one fused QKV, Q6_K (dense) beside nothing.
    let kmix = |n: &str| -> GgmlType {
        if n.contains("attn_v") || n.starts_with("token_embd") {
            GgmlType::Q8_0
        } else if n.contains("attn_output") || n.contains("blk.0.ffn_down") {
            GgmlType::Q4_K
        } else if n.contains("ffn_down") {
            GgmlType::Q6_K
        } else {
            GgmlType::Q5_0
        }
    };
    let cases: Vec<(&str, TypePick, bool)> = vec![
        ("mixed, separate output", Box::new(mixed), false),
        ("Q4_0, tied", Box::new(uniform(GgmlType::Q4_0)), true),
        ("Q8_0, separate output", Box::new(uniform(GgmlType::Q8_0)), false),
        ("F16, tied", Box::new(uniform(GgmlType::F16)), true),
        ("BF16, separate output", Box::new(uniform(GgmlType::BF16)), false),
        ("Q5_0, tied", Box::new(uniform(GgmlType::Q5_0)), true),
        ("Q5_1, separate output", Box::new(uniform(GgmlType::Q5_1)), false),
        ("Q4_K, tied", Box::new(uniform(GgmlType::Q4_K)), true),
        ("Q5_K, separate output", Box::new(uniform(GgmlType::Q5_K)), false),
        ("Q6_K, tied", Box::new(uniform(GgmlType::Q6_K)), true),
        ("K-quant mix (Q4_K_M-like)", Box::new(kmix), true),
    ];
    for (name, types, tied) in cases {
        let (real, twin) = weights(&*types, tied);
        let (pr, pt) = (dir.join("real.gguf"), dir.join("twin.gguf"));
        write_gguf(&pr, &real);
        write_gguf(&pt, &twin);
        let mut mr = LlamaModel::load(&pr, 2).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut mt = LlamaModel::load(&pt, 2).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(mr.info().vocab_size, VOCAB);
        // Weights at the file's size: every type keeps its bits per weight (the K-quants'
        // 6-bit scales take a byte each: 1.028 × for Q4_K, 1.023 × for Q5_K).
        let (held, file) = (mr.info().weight_bytes, mr.info().file_weight_bytes.expect("a GGUF file"));
        let on_disk: usize = real.iter().map(|t| t.3.len()).sum();
        assert_eq!(file, on_disk, "{name}: file bytes of the tensors read");
        assert!(held as f64 <= 1.05 * file as f64, "{name}: {held} bytes held for {file} in the file");
        let (lr, lt) = (logits(&mut mr, &ids), logits(&mut mt, &ids));
        for (step, (a, b)) in lr.iter().zip(&lt).enumerate() {
            let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            // 8-bit activations on these unstructured random weights move logits by 1.2–5.6 % of
            // their scale (measured); a loader mistake (layout, transposition, scales) moves
            // them by about 100 %. F16 and BF16 run the dense product of the same values as
            // the twin's f32: exact.
            // Measured per case (worst step): 1.2–4.4 % for most, 12.7 % for the random Q5_0
            // codes (kernel checked separately against the dequantized product: the same 0.5 %
            // relative error per matmul as Q5_1; this network amplifies it more).
            let tol = if name.starts_with("F16") || name.starts_with("BF16") { 0.0 } else { 0.2 * scale };
            assert!(worst <= tol, "{name} step {step}: max diff {worst} at logit scale {scale}");
            let (ia, ib) = (sparrow_engine::sampler::argmax(a) as usize, sparrow_engine::sampler::argmax(b) as usize);
            let mut sorted = b.clone();
            sorted.sort_by(|x, y| y.total_cmp(x));
            if sorted[0] - sorted[1] > 2.0 * worst {
                assert_eq!(ia, ib, "{name} step {step}: argmax differs at a clear margin");
            }
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

// ---------------------------------------------------------------------------------------------
// Tiny Llama-3-style files in the Q4_K_M, Q5_K_M and Q6_K type mixes against llama.cpp
// (`fixtures/k_quant_golden.json`, from `scripts/goldens/k_quant_golden.py`, whose tensor generator
// this mirrors byte for byte: the fixture's SHA-256 of the tensor data is checked first).

mod kq {
    pub const HIDDEN: usize = 256;
    pub const HEADS: usize = 4;
    pub const KV_HEADS: usize = 2;
    pub const HEAD_DIM: usize = 64;
    pub const FFN: usize = 512;
    pub const LAYERS: usize = 2;
    pub const VOCAB: usize = 256;
    pub const CTX: usize = 512;
    pub const ROPE_BASE: f32 = 500000.0;
}

pub(crate) fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

pub(crate) fn splitmix(seed: u64, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n + 8);
    let mut x = seed;
    while out.len() < n {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        out.extend_from_slice(&z.to_le_bytes());
    }
    out.truncate(n);
    out
}

/// The script's `matrix_bytes`: random blocks with the scale fields of `role` set.
fn kq_matrix(name: &str, ty: GgmlType, rows: usize, cols: usize, role: &str) -> Vec<u8> {
    let target: f64 = match role {
        "wide" => 0.6,
        "mid" => 0.25,
        _ => 0.5,
    };
    let fields: Vec<(usize, f64)> = match ty {
        GgmlType::Q4_K => vec![(0, target / (63.0 * 15.0)), (2, target / 63.0 / 2.0)],
        GgmlType::Q5_K => vec![(0, target / (63.0 * 31.0)), (2, target / 63.0 / 2.0)],
        _ => vec![(208, target / 2048.0)],
    };
    let bs = ty.bytes_for(ty.block_len());
    let mut raw = splitmix(fnv1a(name), ty.bytes_for(rows * cols));
    for blk in raw.chunks_exact_mut(bs) {
        for &(at, v) in &fields {
            blk[at..at + 2].copy_from_slice(&sparrow_cpu::half::f32_to_f16(v as f32).to_le_bytes());
        }
    }
    raw
}

pub(crate) fn kq_vector(name: &str, n: usize, lo: f64, hi: f64) -> Vec<u8> {
    splitmix(fnv1a(name), 4 * n)
        .chunks_exact(4)
        .flat_map(|c| {
            let u = u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64 / 4294967296.0;
            ((lo + (hi - lo) * u) as f32).to_le_bytes()
        })
        .collect()
}

/// The tensors of `mix` in the script's order; `rope` the fixture's RoPE factors.
fn kq_tensors(mix: &str, rope: &[f32]) -> Vec<Tensor> {
    use kq::*;
    let ty_of = |name: &str| {
        let six = name.contains("attn_v") || name.contains("ffn_down") || name.starts_with("token_embd");
        match (mix, six) {
            (_, true) | ("Q6_K", _) => GgmlType::Q6_K,
            ("Q4_K_M", false) => GgmlType::Q4_K,
            _ => GgmlType::Q5_K,
        }
    };
    let kv = KV_HEADS * HEAD_DIM;
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let mut out: Vec<Tensor> =
        vec![("rope_freqs.weight".into(), vec![(HEAD_DIM / 2) as u64], GgmlType::F32, f32s(rope))];
    let mat = |name: String, r: usize, c: usize, role: &str| {
        let ty = ty_of(&name);
        let data = kq_matrix(&name, ty, r, c, role);
        (name, vec![c as u64, r as u64], ty, data)
    };
    out.push(mat("token_embd.weight".into(), VOCAB, HIDDEN, "embd"));
    for l in 0..LAYERS {
        let p = format!("blk.{l}.");
        out.push((
            format!("{p}attn_norm.weight"),
            vec![HIDDEN as u64],
            GgmlType::F32,
            kq_vector(&format!("{p}attn_norm.weight"), HIDDEN, 0.6, 1.4),
        ));
        for (n, r, c, role) in [
            ("attn_q", HIDDEN, HIDDEN, "wide"),
            ("attn_k", kv, HIDDEN, "wide"),
            ("attn_v", kv, HIDDEN, "mid"),
            ("attn_output", HIDDEN, HIDDEN, "mid"),
        ] {
            out.push(mat(format!("{p}{n}.weight"), r, c, role));
        }
        out.push((
            format!("{p}ffn_norm.weight"),
            vec![HIDDEN as u64],
            GgmlType::F32,
            kq_vector(&format!("{p}ffn_norm.weight"), HIDDEN, 0.6, 1.4),
        ));
        for (n, r, c) in [("ffn_gate", FFN, HIDDEN), ("ffn_up", FFN, HIDDEN), ("ffn_down", HIDDEN, FFN)] {
            out.push(mat(format!("{p}{n}.weight"), r, c, "mid"));
        }
    }
    out.push((
        "output_norm.weight".into(),
        vec![HIDDEN as u64],
        GgmlType::F32,
        kq_vector("output_norm.weight", HIDDEN, 0.6, 1.4),
    ));
    out
}

/// Logits at `positions` of `ids` (one chunk per position, so every chunk extends the cache
/// as a chunked prefill does), then `greedy` tokens decoded one at a time.
pub(crate) fn kq_run(m: &mut dyn Model, ids: &[u32], positions: &[usize], greedy: usize) -> (Vec<Vec<f32>>, Vec<u32>) {
    let mut kv = sparrow_engine::model::kv_store(m, ids.len() + greedy + 1, 1, 0);
    let (mut rows, mut done) = (Vec::new(), 0);
    for &p in positions {
        rows.push(m.forward(&ForwardBatch::single_sequence(&ids[..=p], done), &mut kv).expect("forward"));
        done = p + 1;
    }
    let mut seq = ids.to_vec();
    let mut out = Vec::new();
    if done < seq.len() {
        let l = m.forward(&ForwardBatch::single_sequence(&seq, done), &mut kv).expect("forward");
        done = seq.len();
        out.push(sparrow_engine::sampler::argmax(&l));
    } else if let Some(last) = rows.last() {
        out.push(sparrow_engine::sampler::argmax(last));
    }
    while out.len() < greedy {
        seq.push(*out.last().expect("a token"));
        let l = m.forward(&ForwardBatch::single_sequence(&seq, done), &mut kv).expect("forward");
        done = seq.len();
        out.push(sparrow_engine::sampler::argmax(&l));
    }
    (rows, out)
}

/// Checks our logit `rows` and `greedy` tokens for one golden `case` (its `logits`, `exact` and
/// `greedy_margins`, as `k_quant_golden.py` and `family_golden.py` write them): our mean
/// distance from the exact f64 forward stays within `vs_reference` × llama.cpp's own, and our
/// greedy tokens leave llama.cpp's (`want_greedy`) only where its top-1/top-2 margin was below
/// `greedy_margin`. Prints both distances; returns llama.cpp's mean distance from exact.
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_against_llama_cpp(
    label: &str,
    case: &serde_json::Value,
    rows: &[Vec<f32>],
    greedy: &[u32],
    want_greedy: &[u32],
    vs_reference: f32,
    greedy_margin: f32,
) -> f32 {
    // llama.cpp's own distance from the exact forward, from the fixture's two row sets.
    let llama_rows: Vec<Vec<f32>> = case["logits"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| r.as_array().expect("row").iter().map(|x| x.as_f64().expect("f") as f32).collect())
        .collect();
    let (ref_mean, ref_max) = kq_rel(&llama_rows, &case["exact"]);
    let (mean, max) = kq_rel(rows, &case["exact"]);
    let (vs_llama, _) = kq_rel(rows, &case["logits"]);
    let agree = greedy.iter().zip(want_greedy).take_while(|(a, b)| a == b).count();
    eprintln!(
        "{label}: from exact f64 ours {:.1} % mean / {:.1} % max, llama.cpp {:.1} % / {:.1} %; ours from llama.cpp {:.1} % mean; greedy agrees for {agree} of {}",
        100.0 * mean, 100.0 * max, 100.0 * ref_mean, 100.0 * ref_max, 100.0 * vs_llama, want_greedy.len()
    );
    assert!(mean <= vs_reference * ref_mean, "{label}: {mean} from exact against llama.cpp's {ref_mean}");
    if agree < want_greedy.len() {
        let margin = case["greedy_margins"][agree].as_f64().expect("margin") as f32;
        assert!(
            margin < greedy_margin,
            "{label}: greedy leaves llama.cpp's at token {agree}, where its margin is {margin}"
        );
    }
    ref_mean
}

/// A deliberately broken copy of a golden's file, loaded as `m`, must miss the fixture's exact
/// rows by more than `limit` on average (the golden sees the mistake); prints its distance.
pub(crate) fn assert_golden_sees(
    label: &str,
    m: &mut dyn Model,
    ids: &[u32],
    positions: &[usize],
    exact: &serde_json::Value,
    limit: f32,
) {
    let (rows, _) = kq_run(m, ids, positions, 1);
    let (bm, _) = kq_rel(&rows, exact);
    eprintln!("{label}: {:.1} % from exact on average", 100.0 * bm);
    assert!(bm > limit, "{label}: the golden does not see it ({bm})");
}

/// Mean and largest per-row deviation of `rows` from the fixture's `want` rows, each relative
/// to that row's largest |logit|.
pub(crate) fn kq_rel(rows: &[Vec<f32>], want: &serde_json::Value) -> (f32, f32) {
    let (mut sum, mut worst) = (0f32, 0f32);
    let want = want.as_array().expect("rows");
    for (o, w) in rows.iter().zip(want) {
        let w: Vec<f32> = w.as_array().expect("row").iter().map(|x| x.as_f64().expect("f") as f32).collect();
        let scale = w.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = o.iter().zip(&w).fold(0f32, |a, (x, y)| a.max((x - y).abs())) / scale;
        sum += d;
        worst = worst.max(d);
    }
    (sum / want.len() as f32, worst)
}

/// How far ours may be from the exact f64 forward, in multiples of llama.cpp's own distance
/// from it (mean over the compared rows). These sharp two-layer models amplify 8-bit
/// activation noise: llama.cpp's rows are 7–14 % of their scale from exact on average and up to
/// 47 % (it quantizes K-quant activations per 256, we per 64). Measured (ours / llama.cpp, mean
/// from exact): Q4_K_M 6.4 / 8.3 %, Q5_K_M 6.1 / 6.9 %, Q6_K 14.0 / 14.1 %; the broken copies
/// below 99–124 %.
const KQ_VS_REFERENCE: f32 = 1.25;

/// llama.cpp's top-1/top-2 margin below which our greedy tokens may leave its (noise of 6–8 %
/// of a ~15-unit logit scale: about one unit).
const KQ_GREEDY_MARGIN: f32 = 1.5;

#[test]
fn k_quant_mixes_match_llama_cpp() {
    use sha2::{Digest, Sha256};
    let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/k_quant_golden.json");
    let g: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).expect("fixture")).expect("JSON");
    let u32s = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array().expect("ids").iter().map(|x| x.as_u64().expect("id") as u32).collect()
    };
    let ids = u32s(&g["prompt_ids"]);
    let rope: Vec<f32> =
        g["rope_freqs"].as_array().expect("rope").iter().map(|x| x.as_f64().expect("f") as f32).collect();
    let dir = tempfile::tempdir().expect("tmp");
    let write = |path: &Path, t: &[Tensor]| {
        use kq::*;
        write_gguf_meta(path, t, LAYERS, CTX, HIDDEN, FFN, HEADS, KV_HEADS, ROPE_BASE)
    };
    for case in g["cases"].as_array().expect("cases") {
        let mix = case["mix"].as_str().expect("mix");
        let tensors = kq_tensors(mix, &rope);
        let mut sha = Sha256::new();
        tensors.iter().for_each(|t| sha.update(&t.3));
        let hex: String = sha.finalize().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, case["tensor_sha256"].as_str().expect("sha"), "{mix}: not the tensors llama.cpp evaluated");
        let path = dir.path().join(format!("{mix}.gguf"));
        write(&path, &tensors);
        let mut m = LlamaModel::load(&path, 2).expect("loads");
        let positions: Vec<usize> =
            case["positions"].as_array().expect("pos").iter().map(|x| x.as_u64().expect("p") as usize).collect();
        let want_greedy = u32s(&case["greedy_ids"]);
        let (rows, greedy) = kq_run(&mut m, &ids, &positions, want_greedy.len());
        let ref_mean =
            check_against_llama_cpp(mix, case, &rows, &greedy, &want_greedy, KQ_VS_REFERENCE, KQ_GREEDY_MARGIN);
        // Deliberately broken copies must fail the same comparison: without Llama 3's RoPE
        // factors, and with the gate and up projections swapped.
        if mix == "Q4_K_M" {
            for broken in ["no rope_freqs", "gate and up swapped"] {
                let mut t = tensors.clone();
                if broken == "no rope_freqs" {
                    t.remove(0);
                } else {
                    for l in 0..kq::LAYERS {
                        let gi = t.iter().position(|x| x.0 == format!("blk.{l}.ffn_gate.weight")).expect("gate");
                        let ui = t.iter().position(|x| x.0 == format!("blk.{l}.ffn_up.weight")).expect("up");
                        let (gd, ud) = (t[gi].3.clone(), t[ui].3.clone());
                        t[gi].3 = ud;
                        t[ui].3 = gd;
                    }
                }
                let bp = dir.path().join("broken.gguf");
                write(&bp, &t);
                let mut mb = LlamaModel::load(&bp, 2).expect("loads");
                let (rows, _) = kq_run(&mut mb, &ids, &positions, 1);
                let (bm, _) = kq_rel(&rows, &case["exact"]);
                eprintln!("broken copy ({broken}): {:.1} % from exact on average", 100.0 * bm);
                assert!(bm > 2.0 * KQ_VS_REFERENCE * ref_mean, "{broken}: the golden does not see it ({bm})");
            }
        }
    }
}
