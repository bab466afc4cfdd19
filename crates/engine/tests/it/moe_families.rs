//! The MoE families on the Llama layer (GGUF `qwen3moe`, `gpt-oss`, `glm4moe`) against llama.cpp on tiny
//! "sharp" files: `fixtures/moe_golden.json`, from `scripts/goldens/moe_golden.py`, whose tensor
//! generator this mirrors byte for byte (the fixture's SHA-256 of the tensor data is checked
//! first).
//!
//! What each file makes visible: 16 experts, 4 per token, a router wide enough that the
//! softmax/sigmoid weights of the experts differ by far more than 8-bit noise; Qwen3-MoE's
//! softmax over all experts with the chosen renormalized; GLM-4.5's sigmoid scores, the
//! selection bias that changes the choice but not the weights, the routed scale 2.5, the shared
//! expert, a dense first layer, Q/K/V biases and partial RoPE; YaRN RoPE scaling (factor 4 over
//! an original context of 64, so most of the prompt is past it) on the Qwen3-MoE file; gpt-oss's
//! attention sinks, 16-key sliding window on even layers, Q/K/V and output biases, YaRN, the
//! router's bias, top-k by raw logit with a softmax over the chosen, and MXFP4 experts with
//! biases and the clamped SwiGLU. The files are written byte by byte (`ggus` has no MXFP4). Each is compared with the exact
//! f64 forward of the same weights in multiples of llama.cpp's own distance from it, its greedy
//! tokens with llama.cpp's; a deliberately broken copy of each must fail the comparison, and a
//! malformed file is refused naming the tensor.

use std::path::Path;

use ggus::GGufMetaDataValueType as Ty;
use sparrow_cpu::format::ggml::GgmlType;
use sparrow_engine::model::llama::LlamaModel;
use sparrow_engine::model::Model;

use crate::formats::{assert_golden_sees, check_against_llama_cpp, fnv1a, kq_run, kq_vector, splitmix, Tensor};

const HIDDEN: usize = 256;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const FFN: usize = 512;
const LAYERS: usize = 4;
const VOCAB: usize = 256;
const CTX: usize = 512;
const EPS: f32 = 1e-6;
const N_EXPERT: usize = 16;
const TOP_K: usize = 4;
const EXPERT_FFN: usize = 128;
const ROUTER: f64 = 0.25;

/// The script's `FAMILIES`.
#[derive(Clone, Copy)]
struct Spec {
    head_dim: usize,
    rope_dims: usize,
    bias: bool,
    qk_norm: bool,
    probs_bias: bool,
    shared: usize,
    dense_lead: usize,
    ffn_norm: &'static str,
    /// gpt-oss: output bias, sinks, router bias, MXFP4 experts with biases.
    gpt_oss: bool,
}

fn spec(family: &str) -> Spec {
    match family {
        "qwen3moe" | "qwen3moe_yarn" => Spec {
            head_dim: 96,
            rope_dims: 96,
            bias: false,
            qk_norm: true,
            probs_bias: false,
            shared: 0,
            dense_lead: 0,
            ffn_norm: "ffn_norm",
            gpt_oss: false,
        },
        "gpt-oss" => Spec {
            head_dim: 64,
            rope_dims: 64,
            bias: true,
            qk_norm: false,
            probs_bias: false,
            shared: 0,
            dense_lead: 0,
            ffn_norm: "post_attention_norm",
            gpt_oss: true,
        },
        "glm4moe" => Spec {
            head_dim: 64,
            rope_dims: 32,
            bias: true,
            qk_norm: false,
            probs_bias: true,
            shared: 1,
            dense_lead: 1,
            ffn_norm: "post_attention_norm",
            gpt_oss: false,
        },
        other => panic!("no spec for {other}"),
    }
}

/// The script's `q8_matrix_t`: random Q8_0 codes, every block's scale `target / 127`.
pub(crate) fn q8(name: &str, rows: usize, cols: usize, target: f64) -> Vec<u8> {
    let mut raw = splitmix(fnv1a(name), rows * cols / 32 * 34);
    let scale = sparrow_cpu::half::f32_to_f16((target / 127.0) as f32).to_le_bytes();
    for blk in raw.chunks_exact_mut(34) {
        blk[..2].copy_from_slice(&scale);
    }
    raw
}

/// The script's `mxfp4_matrix`: random nibbles, every block's E8M0 scale 2^-5.
fn mxfp4(name: &str, rows: usize, cols: usize) -> Vec<u8> {
    let mut raw = splitmix(fnv1a(name), rows * cols / 32 * 17);
    raw.chunks_exact_mut(17).for_each(|b| b[0] = 123);
    raw
}

/// The script's `tensors(family)`, in file order (GGUF shapes: innermost first).
fn tensors(family: &str) -> Vec<Tensor> {
    let s = spec(family);
    let (qd, kv) = (HEADS * s.head_dim, KV_HEADS * s.head_dim);
    let mat = |name: String, r: usize, c: usize, t: f64| {
        let data = q8(&name, r, c, t);
        (name, vec![c as u64, r as u64], GgmlType::Q8_0, data)
    };
    let vec = |name: String, n: usize, lo: f64, hi: f64| {
        let data = kq_vector(&name, n, lo, hi);
        (name, vec![n as u64], GgmlType::F32, data)
    };
    let mut out = vec![mat("token_embd.weight".into(), VOCAB, HIDDEN, 0.5)];
    for l in 0..LAYERS {
        let p = format!("blk.{l}.");
        out.push(vec(format!("{p}attn_norm.weight"), HIDDEN, 0.6, 1.4));
        for (n, r, c, t) in [
            ("attn_q", qd, HIDDEN, 0.15),
            ("attn_k", kv, HIDDEN, 0.15),
            ("attn_v", kv, HIDDEN, 0.25),
            ("attn_output", HIDDEN, qd, 0.25),
        ] {
            out.push(mat(format!("{p}{n}.weight"), r, c, t));
        }
        if s.bias {
            for (n, r) in [("attn_q", qd), ("attn_k", kv), ("attn_v", kv)] {
                out.push(vec(format!("{p}{n}.bias"), r, -1.0, 1.0));
            }
        }
        if s.gpt_oss {
            out.push(vec(format!("{p}attn_output.bias"), HIDDEN, -0.5, 0.5));
            out.push(vec(format!("{p}attn_sinks.weight"), HEADS, 0.0, 3.0));
        }
        if s.qk_norm {
            out.push(vec(format!("{p}attn_q_norm.weight"), s.head_dim, 0.6, 1.4));
            out.push(vec(format!("{p}attn_k_norm.weight"), s.head_dim, 0.6, 1.4));
        }
        out.push(vec(format!("{p}{}.weight", s.ffn_norm), HIDDEN, 0.6, 1.4));
        if l < s.dense_lead {
            for (n, r, c) in [("ffn_gate", FFN, HIDDEN), ("ffn_up", FFN, HIDDEN), ("ffn_down", HIDDEN, FFN)] {
                out.push(mat(format!("{p}{n}.weight"), r, c, 0.25));
            }
            continue;
        }
        let router = format!("{p}ffn_gate_inp.weight");
        let data = kq_vector(&router, N_EXPERT * HIDDEN, -ROUTER, ROUTER);
        out.push((router, vec![HIDDEN as u64, N_EXPERT as u64], GgmlType::F32, data));
        if s.gpt_oss {
            out.push(vec(format!("{p}ffn_gate_inp.bias"), N_EXPERT, -0.5, 0.5));
        }
        if s.probs_bias {
            out.push(vec(format!("{p}exp_probs_b.bias"), N_EXPERT, -0.5, 0.5));
        }
        for (n, r, c) in [
            ("ffn_gate_exps", EXPERT_FFN, HIDDEN),
            ("ffn_up_exps", EXPERT_FFN, HIDDEN),
            ("ffn_down_exps", HIDDEN, EXPERT_FFN),
        ] {
            let name = format!("{p}{n}.weight");
            let shape = vec![c as u64, r as u64, N_EXPERT as u64];
            if s.gpt_oss {
                out.push((name.clone(), shape, GgmlType::MXFP4, mxfp4(&name, N_EXPERT * r, c)));
                let b = format!("{p}{n}.bias");
                let data = kq_vector(&b, N_EXPERT * r, -0.5, 0.5);
                out.push((b, vec![r as u64, N_EXPERT as u64], GgmlType::F32, data));
                continue;
            }
            let data = q8(&name, N_EXPERT * r, c, 0.25);
            out.push((name, shape, GgmlType::Q8_0, data));
        }
        if s.shared > 0 {
            let si = s.shared * EXPERT_FFN;
            for (n, r, c) in
                [("ffn_gate_shexp", si, HIDDEN), ("ffn_up_shexp", si, HIDDEN), ("ffn_down_shexp", HIDDEN, si)]
            {
                out.push(mat(format!("{p}{n}.weight"), r, c, 0.25));
            }
        }
    }
    out.push(vec("output_norm.weight".into(), HIDDEN, 0.6, 1.4));
    let mut head = q8("output.weight", VOCAB, HIDDEN, 0.5);
    let hot = sparrow_cpu::half::f32_to_f16((HOT_FACTOR * 0.5 / 127.0) as f32).to_le_bytes();
    for blk in head[..HOT * HIDDEN / 32 * 34].chunks_exact_mut(34) {
        blk[..2].copy_from_slice(&hot);
    }
    out.push(("output.weight".into(), vec![HIDDEN as u64, VOCAB as u64], GgmlType::Q8_0, head));
    out
}

/// The script's `q8_head`: the first `HOT` rows of the output head at `HOT_FACTOR` × the span,
/// so a greedy token is usually one of a few, with gaps well above 8-bit noise.
pub(crate) const HOT: usize = 8;
pub(crate) const HOT_FACTOR: f64 = 4.0;

/// Metadata the script's `write` sets beside the tensors; `expert_count` may be overridden (a
/// malformed file).
struct Meta {
    /// `general.architecture`.
    arch: &'static str,
    /// YaRN's `(factor, original_context_length)`.
    yarn: Option<(f32, usize)>,
    expert_count: usize,
    /// gpt-oss's `attention.sliding_window`.
    window: Option<usize>,
    /// GLM-4.5's routing keys: gating function, renormalization, scale.
    glm: Option<(u32, bool, f32)>,
}

fn meta(family: &str) -> Meta {
    let arch = match family {
        "glm4moe" => "glm4moe",
        "gpt-oss" => "gpt-oss",
        _ => "qwen3moe",
    };
    let yarn = matches!(family, "qwen3moe_yarn" | "gpt-oss").then_some((4.0, 64));
    let window = (family == "gpt-oss").then_some(16);
    Meta { arch, yarn, expert_count: N_EXPERT, window, glm: (family == "glm4moe").then_some((2, true, 2.5)) }
}

/// A metadata value as GGUF stores it.
pub(crate) type MetaValue = (Ty, Vec<u8>);

/// A `u32` metadata value.
pub(crate) fn u32v(v: usize) -> MetaValue {
    (Ty::U32, (v as u32).to_le_bytes().to_vec())
}

/// An `f32` metadata value.
pub(crate) fn f32v(v: f32) -> MetaValue {
    (Ty::F32, v.to_le_bytes().to_vec())
}

/// A string metadata value.
pub(crate) fn strv(s: &str) -> MetaValue {
    (Ty::String, [&(s.len() as u64).to_le_bytes()[..], s.as_bytes()].concat())
}

/// A GGUF of `tensors` under `arch`'s metadata keys (what the script's `gguf.GGUFWriter` writes
/// for the model; no tokenizer).
fn write(path: &Path, s: &Spec, m: &Meta, tensors: &[Tensor]) {
    let mut keyed = vec![
        ("block_count", u32v(LAYERS)),
        ("context_length", u32v(CTX)),
        ("embedding_length", u32v(HIDDEN)),
        ("feed_forward_length", u32v(FFN)),
        ("attention.head_count", u32v(HEADS)),
        ("attention.head_count_kv", u32v(KV_HEADS)),
        ("rope.freq_base", f32v(if m.arch == "gpt-oss" { 150000.0 } else { 1e6 })),
        ("attention.layer_norm_rms_epsilon", f32v(EPS)),
        ("attention.key_length", u32v(s.head_dim)),
        ("attention.value_length", u32v(s.head_dim)),
        ("rope.dimension_count", u32v(s.rope_dims)),
        ("expert_count", u32v(m.expert_count)),
        ("expert_used_count", u32v(TOP_K)),
        ("expert_feed_forward_length", u32v(EXPERT_FFN)),
    ];
    if let Some(w) = m.window {
        keyed.push(("attention.sliding_window", u32v(w)));
    }
    if let Some((factor, orig)) = m.yarn {
        keyed.push(("rope.scaling.type", strv("yarn")));
        keyed.push(("rope.scaling.factor", f32v(factor)));
        keyed.push(("rope.scaling.original_context_length", u32v(orig)));
    }
    if let Some((gating, norm, scale)) = m.glm {
        keyed.push(("expert_shared_count", u32v(s.shared)));
        keyed.push(("leading_dense_block_count", u32v(s.dense_lead)));
        keyed.push(("expert_weights_scale", f32v(scale)));
        keyed.push(("expert_weights_norm", (Ty::Bool, vec![norm as u8])));
        keyed.push(("expert_gating_func", u32v(gating as usize)));
    }
    write_gguf(path, m.arch, &keyed, tensors);
}

/// A GGUF file of `tensors` with `general.architecture = arch` and `keyed` as `{arch}.{key}`.
pub(crate) fn write_gguf(path: &Path, arch: &str, keyed: &[(&str, MetaValue)], tensors: &[Tensor]) {
    let mut meta: Vec<(String, MetaValue)> = vec![("general.architecture".into(), strv(arch))];
    meta.extend(keyed.iter().map(|(k, v)| (format!("{arch}.{k}"), v.clone())));
    // Byte by byte (`ggus`' writer has no MXFP4): the header, the metadata, the tensor table,
    // then each tensor's data at a 32-byte boundary.
    let mut f = Vec::new();
    f.extend_from_slice(b"GGUF");
    f.extend_from_slice(&3u32.to_le_bytes());
    f.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    f.extend_from_slice(&(meta.len() as u64).to_le_bytes());
    for (k, (ty, v)) in &meta {
        f.extend_from_slice(&(k.len() as u64).to_le_bytes());
        f.extend_from_slice(k.as_bytes());
        f.extend_from_slice(&(*ty as u32).to_le_bytes());
        f.extend_from_slice(v);
    }
    let mut offset = 0u64;
    for (name, shape, ty, bytes) in tensors {
        f.extend_from_slice(&(name.len() as u64).to_le_bytes());
        f.extend_from_slice(name.as_bytes());
        f.extend_from_slice(&(shape.len() as u32).to_le_bytes());
        shape.iter().for_each(|d| f.extend_from_slice(&d.to_le_bytes()));
        f.extend_from_slice(&ggml_id(*ty).to_le_bytes());
        f.extend_from_slice(&offset.to_le_bytes());
        offset += (bytes.len() as u64).next_multiple_of(32);
    }
    for (_, _, _, bytes) in tensors {
        f.resize(f.len().next_multiple_of(32), 0);
        f.extend_from_slice(bytes);
    }
    std::fs::write(path, f).expect("write gguf");
}

/// GGML's number of a type (`ggml_type`).
fn ggml_id(ty: GgmlType) -> u32 {
    match ty {
        GgmlType::F32 => 0,
        GgmlType::Q8_0 => 8,
        GgmlType::MXFP4 => 39,
        other => panic!("{other:?} is not written here"),
    }
}

fn fixture() -> serde_json::Value {
    fixture_named("moe_golden.json")
}

/// `tests/fixtures/{name}` as JSON.
pub(crate) fn fixture_named(name: &str) -> serde_json::Value {
    let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    serde_json::from_str(&std::fs::read_to_string(p).expect("fixture")).expect("JSON")
}

pub(crate) fn u32s(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().expect("ids").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

/// How far ours may be from the exact f64 forward, in multiples of llama.cpp's own mean
/// distance from it (measured, printed by the test).
const VS_REFERENCE: f32 = 1.25;

/// Of the fixture's six greedy prompts, how many must give llama.cpp's 12 tokens (the issue's
/// "4 of 6"): a prompt agrees when our tokens equal llama.cpp's, or leave them only where
/// llama.cpp's own top-1/top-2 margin is below [`GREEDY_MARGIN`]. Not all 12 exactly: an
/// expert choice near a tie flips under 8-bit noise, llama.cpp's as ours, and in files this
/// sharp one flip moves a logit by several units. llama.cpp itself gives the exact f64
/// forward's 12 tokens (teacher-forced on its own) for only 3 (qwen3moe) and 2 (glm4moe) of
/// the 6 prompts. Measured: qwen3moe 6 of 6 (4 of them all 12 tokens), qwen3moe_yarn 5 of 6
/// (1; llama.cpp's rows are 11.8 % from exact there, ours 11.5 %), gpt-oss 4 of 6 (1; 18.8 %
/// and 18.7 %: MXFP4 weights against 8-bit activations), glm4moe 5 of 6 (3); the
/// glm4moe prompt that fails leaves llama.cpp's at a 4.9-unit margin because our 4th and 5th
/// experts of layer 1 swap places (selection keys 0.7473 and 0.7406 in the exact forward,
/// 0.7474 and 0.7480 in ours): a routing near-tie, not an output one.
const GREEDY_AGREE: usize = 4;

/// llama.cpp's top-1/top-2 margin below which a token is a near-tie: 8-bit activation noise
/// moves these logits by ~5 % of a row's scale (~40 with the hot rows), about 2 units.
const GREEDY_MARGIN: f64 = 2.0;

/// Our greedy tokens for each of the fixture's greedy prompts; how many agree with llama.cpp's.
pub(crate) fn greedy_agreement(m: &mut dyn Model, family: &str, case: &serde_json::Value) -> usize {
    let prompts = case["greedy"].as_array().expect("greedy prompts");
    let (mut agree, mut strict) = (0, 0);
    for (i, p) in prompts.iter().enumerate() {
        let (ids, want) = (u32s(&p["prompt_ids"]), u32s(&p["greedy_ids"]));
        let (_, ours) = kq_run(m, &ids, &[], want.len());
        let at = ours.iter().zip(&want).take_while(|(a, b)| a == b).count();
        let tie = |j: usize| p["greedy_margins"][j].as_f64().expect("margin") < GREEDY_MARGIN;
        let same = at == want.len() || tie(at);
        strict += usize::from(at == want.len());
        agree += usize::from(same);
        if at < want.len() {
            eprintln!(
                "{family} greedy prompt {i}: leaves llama.cpp's at token {at} (its margin there {}; {})",
                p["greedy_margins"][at],
                if same { "a near-tie" } else { "not a near-tie" }
            );
        }
    }
    eprintln!(
        "{family}: greedy equal to llama.cpp's to its first near-tie for {agree} of {n} prompts, all 12 tokens for {strict} of {n}",
        n = prompts.len()
    );
    agree
}

#[test]
fn moe_families_match_llama_cpp() {
    use sha2::{Digest, Sha256};
    let g = fixture();
    let ids = u32s(&g["prompt_ids"]);
    let dir = tempfile::tempdir().expect("tmp");
    for case in g["cases"].as_array().expect("cases") {
        let family = case["family"].as_str().expect("family");
        let s = spec(family);
        let tensors = tensors(family);
        let mut sha = Sha256::new();
        tensors.iter().for_each(|t| sha.update(&t.3));
        let hex: String = sha.finalize().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, case["tensor_sha256"].as_str().expect("sha"), "{family}: not the tensors llama.cpp evaluated");
        let path = dir.path().join(format!("{family}.gguf"));
        write(&path, &s, &meta(family), &tensors);
        let mut m = LlamaModel::load(&path, 2).unwrap_or_else(|e| panic!("{family}: {e}"));
        assert_eq!(m.info().architecture, meta(family).arch);
        let positions: Vec<usize> =
            case["positions"].as_array().expect("pos").iter().map(|x| x.as_u64().expect("p") as usize).collect();
        let (rows, _) = kq_run(&mut m, &ids, &positions, 0);
        let ref_mean = check_against_llama_cpp(family, case, &rows, &[], &[], VS_REFERENCE, 0.0);
        let agree = greedy_agreement(&mut m, family, case);
        assert!(agree >= GREEDY_AGREE, "{family}: greedy equal to llama.cpp's for {agree} prompts of 6");
        // Broken copies: the family's routing rule undone through its metadata or tensors.
        let broken: Vec<(&str, Meta, Vec<Tensor>)> = match family {
            "qwen3moe" => {
                // The experts' order within each tensor reversed: the router picks by index.
                let mut rev = tensors.clone();
                for t in rev.iter_mut().filter(|t| t.0.contains("_exps")) {
                    let per = t.3.len() / N_EXPERT;
                    let blocks: Vec<Vec<u8>> = t.3.chunks(per).rev().map(<[u8]>::to_vec).collect();
                    t.3 = blocks.concat();
                }
                vec![("experts in reverse order", meta(family), rev)]
            }
            "gpt-oss" => {
                let no_sinks: Vec<Tensor> =
                    tensors.iter().filter(|t| !t.0.ends_with("attn_sinks.weight")).cloned().collect();
                let mut no_bias = tensors.clone();
                for t in no_bias.iter_mut().filter(|t| t.0.contains("_exps.bias")) {
                    t.3.iter_mut().for_each(|b| *b = 0);
                }
                vec![
                    ("attention sinks dropped", meta(family), no_sinks),
                    ("no sliding window", Meta { window: Some(CTX), ..meta(family) }, tensors.clone()),
                    ("expert biases zeroed", meta(family), no_bias),
                ]
            }
            "qwen3moe_yarn" => vec![
                ("YaRN keys dropped", Meta { yarn: None, ..meta(family) }, tensors.clone()),
                ("YaRN over the whole context", Meta { yarn: Some((4.0, CTX)), ..meta(family) }, tensors.clone()),
            ],
            _ => {
                let mut no_bias = tensors.clone();
                for t in no_bias.iter_mut().filter(|t| t.0.ends_with("exp_probs_b.bias")) {
                    t.3.iter_mut().for_each(|b| *b = 0);
                }
                vec![
                    ("selection bias zeroed", meta(family), no_bias),
                    ("softmax gating", Meta { glm: Some((1, true, 2.5)), ..meta(family) }, tensors.clone()),
                    ("no routed scale", Meta { glm: Some((2, true, 1.0)), ..meta(family) }, tensors.clone()),
                ]
            }
        };
        for (what, bm_meta, t) in broken {
            let bp = dir.path().join("broken.gguf");
            write(&bp, &s, &bm_meta, &t);
            let mut mb = LlamaModel::load(&bp, 2).unwrap_or_else(|e| panic!("{family} {what}: {e}"));
            let label = format!("{family} broken copy ({what})");
            assert_golden_sees(&label, &mut mb, &ids, &positions, &case["exact"], 2.0 * VS_REFERENCE * ref_mean);
        }
    }
}

/// Each family's greedy output alone equals its output in a batch of 32 mixed requests
/// (`batch_invariance.rs`: shared prefixes, chunked prefill, radix on and off, page sizes 1–64):
/// rows of one batch go to different experts, and the grouped expert GEMMs must give each row
/// what it gets alone.
#[test]
fn moe_families_batched_equal_alone() {
    let dir = tempfile::tempdir().expect("tmp");
    let prompts = crate::batch_invariance::mixed_prompts(VOCAB as u32);
    for family in ["qwen3moe", "qwen3moe_yarn", "gpt-oss", "glm4moe"] {
        let path = dir.path().join(format!("{family}.gguf"));
        write(&path, &spec(family), &meta(family), &tensors(family));
        let mut m = LlamaModel::load(&path, 2).unwrap_or_else(|e| panic!("{family}: {e}"));
        crate::batch_invariance::check_invariance(&mut m, &prompts);
    }
}

/// Malformed MoE files are start-up errors naming what is wrong: a missing expert tensor, an
/// expert count in the metadata unlike the tensors', and a MoE file without `expert_count`.
#[test]
fn malformed_moe_files_are_refused_by_name() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("f.gguf");
    let s = spec("qwen3moe");
    let err = |m: &Meta, t: &[Tensor]| {
        write(&path, &s, m, t);
        LlamaModel::load(&path, 1).map(|_| ()).expect_err("refused").to_string()
    };
    let t = tensors("qwen3moe");
    let missing: Vec<Tensor> = t.iter().filter(|x| x.0 != "blk.2.ffn_up_exps.weight").cloned().collect();
    let e = err(&meta("qwen3moe"), &missing);
    assert!(e.contains("blk.2.ffn_up_exps.weight"), "{e}");
    let e = err(&Meta { expert_count: 12, ..meta("qwen3moe") }, &t);
    assert!(e.contains("blk.0.ffn_gate_exps.weight") && e.contains("12 experts"), "{e}");
    let e = err(&Meta { expert_count: 0, ..meta("qwen3moe") }, &t);
    assert!(e.contains("inconsistent experts: expert_count 0"), "{e}");
}
