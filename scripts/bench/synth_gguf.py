#!/usr/bin/env python3
"""Random-weight GGUF files with a real model's shapes, tensor names and metadata, quantized by
llama.cpp's own `llama-quantize` to the type mixes users download.

    $PEERS/venv/bin/python scripts/bench/synth_gguf.py --shape llama-3.2-1b --types Q4_K_M,Q8_0
    # prints one path per line: <out-dir>/<shape>-F16.gguf, then <out-dir>/<shape>-<TYPE>.gguf

What a file holds (llama.cpp's conventions, `conversion/llama.py` and `conversion/base.py` of the
vendored llama.cpp):
- metadata: `general.architecture = llama`, `llama.{block_count, context_length,
  embedding_length, feed_forward_length, attention.head_count, attention.head_count_kv,
  attention.key_length, attention.value_length, rope.freq_base, rope.dimension_count,
  attention.layer_norm_rms_epsilon, vocab_size}`, `general.file_type`;
- the real Llama 3 vocabulary: every `tokenizer.*` key of llama.cpp's
  `models/ggml-vocab-llama-bpe.gguf` (128,256 tokens, merges, pre-tokenizer `llama-bpe`), and
  the model's chat template from `models/templates/`;
- tensors `token_embd`, `blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm,
  ffn_gate, ffn_up, ffn_down}`, `output_norm`, `output` (absent when tied), and `rope_freqs`
  (Llama 3's RoPE scaling factors, computed as `LlamaModel.generate_extra_tensors` does).

Weights are N(0, 0.02) in F16 and norms are 1: activations stay finite, and speed does not
depend on the values. These files are for speed and memory; correctness is checked on small
files with sharper weights (scripts/goldens/k_quant_golden.py).

The F16 file is written tensor by tensor (an 8B model never sits in memory whole), then each
`--types` entry is made by `llama-quantize F16 OUT TYPE` (default: $PEERS/build/llama.cpp/bin,
built by ../shared/peers/setup.sh). Existing files are kept (delete them to rebuild). Files live
in the cache (`--out-dir`, default $SPARROW_CACHE_DIR/synth or ~/.cache/sparrow/synth), never
in the repo.
"""
import argparse
import math
import os
import subprocess
import sys
from pathlib import Path

PEERS = Path(os.environ.get("PEERS", Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sparrow-peers"))
LLAMA_SRC = PEERS / "src" / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"
sys.path.insert(0, str(LLAMA_SRC / "gguf-py"))
import numpy as np  # noqa: E402
import gguf  # noqa: E402

# Hugging Face config.json values of the real checkpoints.
SHAPES = {
    "llama-3.2-1b": dict(
        name="Llama 3.2 1B Instruct (synthetic weights)", layers=16, hidden=2048, ffn=8192, heads=32, kv_heads=8,
        head_dim=64, vocab=128256, ctx=131072, rope_theta=500000.0, rms_eps=1e-5, tied=True,
        rope_scaling=dict(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192),
        template="meta-llama-Llama-3.2-3B-Instruct.jinja"),
    "llama-3.1-8b": dict(
        name="Llama 3.1 8B Instruct (synthetic weights)", layers=32, hidden=4096, ffn=14336, heads=32, kv_heads=8,
        head_dim=128, vocab=128256, ctx=131072, rope_theta=500000.0, rms_eps=1e-5, tied=False,
        rope_scaling=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192),
        template="meta-llama-Llama-3.1-8B-Instruct.jinja"),
}


def rope_factors(head_dim, theta, rs):
    """`rope_freqs` as convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors computes it (f32)."""
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factor, lo, hi, old = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"], rs["original_max_position_embeddings"]
    lo_wl, hi_wl = old / lo, old / hi
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < hi_wl:
            out.append(1.0)
        elif wl > lo_wl:
            out.append(factor)
        else:
            smooth = (old / wl - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def tensors(s):
    """(name, shape as numpy [rows, cols] or [n], kind) in llama.cpp's order."""
    h, f, hd = s["hidden"], s["ffn"], s["head_dim"]
    q, kv = s["heads"] * hd, s["kv_heads"] * hd
    yield "rope_freqs.weight", (hd // 2,), "rope"
    yield "token_embd.weight", (s["vocab"], h), "w"
    for i in range(s["layers"]):
        p = f"blk.{i}."
        yield p + "attn_norm.weight", (h,), "norm"
        yield p + "attn_q.weight", (q, h), "w"
        yield p + "attn_k.weight", (kv, h), "w"
        yield p + "attn_v.weight", (kv, h), "w"
        yield p + "attn_output.weight", (h, q), "w"
        yield p + "ffn_norm.weight", (h,), "norm"
        yield p + "ffn_gate.weight", (f, h), "w"
        yield p + "ffn_up.weight", (f, h), "w"
        yield p + "ffn_down.weight", (h, f), "w"
    yield "output_norm.weight", (h,), "norm"
    if not s["tied"]:
        yield "output.weight", (s["vocab"], h), "w"


def copy_vocab(w):
    r = gguf.GGUFReader(LLAMA_SRC / "models" / "ggml-vocab-llama-bpe.gguf")
    for key, field in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vt = field.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_array(key, field.contents())
        else:
            w.add_key_value(key, field.contents(), vt)


def write_f16(shape, s, path, seed):
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(s["name"])
    w.add_block_count(s["layers"])
    w.add_context_length(s["ctx"])
    w.add_embedding_length(s["hidden"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    w.add_key_length(s["head_dim"])
    w.add_value_length(s["head_dim"])
    w.add_rope_freq_base(s["rope_theta"])
    w.add_layer_norm_rms_eps(s["rms_eps"])
    w.add_vocab_size(s["vocab"])
    w.add_rope_dimension_count(s["head_dim"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    copy_vocab(w)
    w.add_chat_template((LLAMA_SRC / "models" / "templates" / s["template"]).read_text())
    plan = list(tensors(s))
    for name, shp, kind in plan:
        dt = np.float16 if kind == "w" else np.float32
        nbytes = int(np.prod(shp)) * np.dtype(dt).itemsize
        w.add_tensor_info(name, shp, np.dtype(dt), nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shp, kind in plan:
        if kind == "rope":
            t = rope_factors(s["head_dim"], s["rope_theta"], s["rope_scaling"])
        elif kind == "norm":
            t = np.ones(shp, dtype=np.float32)
        else:
            # Row blocks of 16M values: an 8B embedding is 525M values.
            t = np.empty(shp, dtype=np.float16)
            step = max(1, (1 << 24) // shp[1])
            for r0 in range(0, shp[0], step):
                blk = rng.standard_normal((min(step, shp[0] - r0), shp[1]), dtype=np.float32)
                t[r0:r0 + step] = (blk * 0.02).astype(np.float16)
        w.write_tensor_data(t)
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--types", default="Q4_K_M", help="comma-separated llama-quantize types (Q4_K_M,Q5_K_M,Q8_0,...)")
    cache = Path(os.environ.get("SPARROW_CACHE_DIR", Path.home() / ".cache" / "sparrow"))
    ap.add_argument("--out-dir", type=Path, default=cache / "synth")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quantize", type=Path, default=PEERS / "build" / "llama.cpp" / "bin" / "llama-quantize")
    a = ap.parse_args()
    a.out_dir.mkdir(parents=True, exist_ok=True)
    s = SHAPES[a.shape]
    f16 = a.out_dir / f"{a.shape}-F16.gguf"
    if not f16.exists():
        tmp = f16.with_suffix(".tmp")
        write_f16(a.shape, s, tmp, a.seed)
        tmp.rename(f16)
    print(f16, flush=True)
    for ty in [t for t in a.types.split(",") if t and t != "F16"]:
        out = a.out_dir / f"{a.shape}-{ty}.gguf"
        if not out.exists():
            if not a.quantize.exists():
                sys.exit(f"{a.quantize}: missing (run ../shared/peers/setup.sh)")
            tmp = out.with_suffix(".tmp")
            log = a.out_dir / f"{a.shape}-{ty}.quantize.log"
            with open(log, "w") as lf:
                subprocess.run([str(a.quantize), str(f16), str(tmp), ty, str(os.cpu_count() or 1)],
                               check=True, stdout=lf, stderr=subprocess.STDOUT)
            tmp.rename(out)
        print(out, flush=True)


if __name__ == "__main__":
    main()
