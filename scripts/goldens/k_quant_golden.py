#!/usr/bin/env python3
"""Goldens of tiny Llama-3-style GGUF files in the Q4_K_M, Q5_K_M and Q6_K type mixes, from
llama.cpp (llama-cpp-python), for `crates/engine/tests/it/formats.rs`.

    $VENV/bin/python scripts/goldens/k_quant_golden.py --out crates/engine/tests/fixtures/k_quant_golden.json

($VENV: any venv with numpy and llama-cpp-python 0.3.36 built from the sdist that
../shared/peers/setup.sh downloads, e.g. `CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON
-DGGML_FMA=ON -DGGML_F16C=ON" pip install numpy $PEERS/pk/llama_cpp_python-0.3.36.tar.gz`; a
native build on an AMX machine crashes in llama.cpp's AMX matmul.)

The files are made here and again by the Rust test, byte for byte the same tensors: every
tensor's bytes come from splitmix64 seeded with the FNV-1a hash of its name, then the block
scale fields are set (`fields`, mirrored in the test); the RoPE factors are stored in the
fixture. The fixture records each file's tensor-data SHA-256, so the test proves it evaluates
the weights llama.cpp evaluated.

The weights are made to expose mistakes (the brief's "sharp" files): Q and K rows a few times
wider than the rest, so attention is far from uniform; norms 0.6..1.4, not 1; Llama 3's RoPE
frequency factors (`rope_freqs`, factor 8) so a missing or misapplied scaling moves the
logits; GQA (4 query heads on 2 KV heads); a 200-token prompt. For each mix: the logits of
every 10th position of the prompt evaluated as one batch (the vocabulary is 256, so whole
rows), the same rows from an exact float64 forward of the same dequantized weights
(`exact_forward`), and 16 greedy tokens decoded one at a time.
"""
import argparse
import hashlib
import json
import os
import struct
import sys
import tempfile
from pathlib import Path

PEERS = Path(os.environ.get("PEERS", Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sparrow-peers"))
sys.path.insert(0, str(PEERS / "src" / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp" / "gguf-py"))
import numpy as np  # noqa: E402
import gguf  # noqa: E402

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS, VOCAB, CTX = 256, 4, 2, 64, 512, 2, 256, 512
ROPE_BASE = 500000.0
PROMPT_LEN, GREEDY = 200, 16

# Block scale fields per type: (byte offset of the f16, value) set in every block, by role.
# `wide` is Q and K, `mid` the rest of the projections, `embd` the embedding/output head.
TARGET = {"wide": 0.6, "mid": 0.25, "embd": 0.5}
BLOCK = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210, "Q8_0": 34}
QK = {"Q4_K": 256, "Q5_K": 256, "Q6_K": 256, "Q8_0": 32}
GGML = {"Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "Q8_0": 8}


def fields(ty, role):
    t = TARGET[role]
    if ty == "Q4_K":
        return [(0, t / (63 * 15)), (2, t / 63 / 2)]
    if ty == "Q5_K":
        return [(0, t / (63 * 31)), (2, t / 63 / 2)]
    if ty == "Q6_K":
        return [(208, t / 2048)]
    return [(0, t / 127)]


def mix(name):
    """{mix: type} of a matrix, as llama-quantize assigns them (Q4_K_M/Q5_K_M: Q6_K for attn_v,
    ffn_down and the tied embedding)."""
    six = "attn_v" in name or "ffn_down" in name or name.startswith("token_embd")
    return {"Q4_K_M": "Q6_K" if six else "Q4_K", "Q5_K_M": "Q6_K" if six else "Q5_K", "Q6_K": "Q6_K"}


def fnv1a(s):
    h = 0xcbf29ce484222325
    for b in s.encode():
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def splitmix(seed, n):
    out = bytearray()
    x = seed
    while len(out) < n:
        x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        z ^= z >> 31
        out += struct.pack("<Q", z)
    return bytes(out[:n])


def matrix_bytes(name, ty, rows, cols, role):
    raw = bytearray(splitmix(fnv1a(name), rows * cols // QK[ty] * BLOCK[ty]))
    for b0 in range(0, len(raw), BLOCK[ty]):
        for off, v in fields(ty, role):
            raw[b0 + off:b0 + off + 2] = np.float16(np.float32(v)).tobytes()
    return bytes(raw)


def vector(name, n, lo, hi):
    u = np.frombuffer(splitmix(fnv1a(name), 4 * n), dtype=np.uint32).astype(np.float64) / 2**32
    return (lo + (hi - lo) * u).astype(np.float32)


def llama_rows(llm, ids):
    """llama.cpp's logits after evaluating `ids` from a fresh context: every position's scores,
    the compared positions (every 10th) and their rows rounded to 4 places."""
    llm.reset()
    llm.eval(ids)
    scores = np.array(llm.scores[:len(ids)], dtype=np.float64)
    positions = list(range(9, len(ids), 10))
    return scores, positions, [[round(float(v), 4) for v in scores[p]] for p in positions]


def greedy_after(llm, seq, n):
    """`n` greedy tokens after the evaluated `seq`, one `eval` each, with llama.cpp's
    top-1/top-2 margin at each."""
    seq, toks, margins = list(seq), [], []
    for _ in range(n):
        row = np.array(llm.scores[len(seq) - 1], dtype=np.float64)
        t = int(np.argmax(row))
        top2 = np.sort(row)[-2:]
        margins.append(round(float(top2[1] - top2[0]), 4))
        toks.append(t)
        seq.append(t)
        llm.eval([t])
    return toks, margins


def rope_factors():
    """Llama 3's factors (factor 8, low 1, high 4, original context 32: small, so the scaling
    touches pairs of this short context) as convert_hf_to_gguf.py computes them."""
    import math
    freqs = 1.0 / (ROPE_BASE ** (np.arange(0, HEAD_DIM, 2, dtype=np.float32) / HEAD_DIM))
    factor, lo, hi, old = 8.0, 1.0, 4.0, 32
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < old / hi:
            out.append(1.0)
        elif wl > old / lo:
            out.append(factor)
        else:
            s = (old / wl - lo) / (hi - lo)
            out.append(1 / ((1 - s) / factor + s))
    return np.array(out, dtype=np.float32)


def tensors(m):
    """(name, numpy shape [rows, cols] or [n], ggml type name, bytes) in file order."""
    kv = KV_HEADS * HEAD_DIM
    out = [("rope_freqs.weight", [HEAD_DIM // 2], "F32", rope_factors().tobytes())]
    ty = mix("token_embd")[m]
    out.append(("token_embd.weight", [VOCAB, HIDDEN], ty, matrix_bytes("token_embd.weight", ty, VOCAB, HIDDEN, "embd")))
    for l in range(LAYERS):
        p = f"blk.{l}."
        out.append((p + "attn_norm.weight", [HIDDEN], "F32", vector(p + "attn_norm.weight", HIDDEN, 0.6, 1.4).tobytes()))
        for n, r, c, role in [("attn_q", HIDDEN, HIDDEN, "wide"), ("attn_k", kv, HIDDEN, "wide"), ("attn_v", kv, HIDDEN, "mid"),
                              ("attn_output", HIDDEN, HIDDEN, "mid")]:
            ty = mix(n)[m]
            out.append((p + n + ".weight", [r, c], ty, matrix_bytes(p + n + ".weight", ty, r, c, role)))
        out.append((p + "ffn_norm.weight", [HIDDEN], "F32", vector(p + "ffn_norm.weight", HIDDEN, 0.6, 1.4).tobytes()))
        for n, r, c in [("ffn_gate", FFN, HIDDEN), ("ffn_up", FFN, HIDDEN), ("ffn_down", HIDDEN, FFN)]:
            ty = mix(n)[m]
            out.append((p + n + ".weight", [r, c], ty, matrix_bytes(p + n + ".weight", ty, r, c, "mid")))
    out.append(("output_norm.weight", [HIDDEN], "F32", vector("output_norm.weight", HIDDEN, 0.6, 1.4).tobytes()))
    return out


def write(path, m):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(f"k-quant golden {m}")
    w.add_block_count(LAYERS)
    w.add_context_length(CTX)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_vocab_size(VOCAB)
    w.add_tokenizer_model("none")
    sha = hashlib.sha256()
    ts = tensors(m)
    for name, shape, ty, data in ts:
        sha.update(data)
        if ty == "F32":
            w.add_tensor(name, np.frombuffer(data, dtype=np.float32).reshape(shape))
        else:
            arr = np.frombuffer(data, dtype=np.uint8).reshape(shape[0], len(data) // shape[0])
            w.add_tensor(name, arr, raw_dtype=gguf.GGMLQuantizationType(GGML[ty]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return sha.hexdigest()


def exact_forward(ts, ids):
    """An exact float64 forward of the same weights (gguf-py's dequantization, no activation
    quantization, no f16): llama.cpp's graph for `llama` with Llama 3's frequency factors
    (RoPE on adjacent pairs, angle `pos · base^(−2i/d) / ff_i`), GQA, SwiGLU, tied output."""
    from gguf.quants import dequantize
    w = {}
    for name, shape, ty, data in ts:
        if ty == "F32":
            w[name] = np.frombuffer(data, dtype=np.float32).astype(np.float64)
        else:
            arr = np.frombuffer(data, dtype=np.uint8).reshape(shape[0], len(data) // shape[0])
            w[name] = dequantize(arr, gguf.GGMLQuantizationType(GGML[ty])).astype(np.float64).reshape(shape)
    eps = 1e-5
    rms = lambda x, g: x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g
    T = len(ids)
    inv = ROPE_BASE ** (-np.arange(0, HEAD_DIM, 2, dtype=np.float64) / HEAD_DIM) / w["rope_freqs.weight"]
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(ang), np.sin(ang)

    def rope(x):  # [T, heads, hd], pairs (2i, 2i+1)
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * cos[:, None, :] - b * sin[:, None, :]
        out[..., 1::2] = b * cos[:, None, :] + a * sin[:, None, :]
        return out

    x = w["token_embd.weight"][ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(LAYERS):
        p = f"blk.{l}."
        h = rms(x, w[p + "attn_norm.weight"])
        q = rope((h @ w[p + "attn_q.weight"].T).reshape(T, HEADS, HEAD_DIM))
        k = rope((h @ w[p + "attn_k.weight"].T).reshape(T, KV_HEADS, HEAD_DIM))
        v = (h @ w[p + "attn_v.weight"].T).reshape(T, KV_HEADS, HEAD_DIM)
        o = np.empty((T, HEADS, HEAD_DIM))
        for hh in range(HEADS):
            g = hh // (HEADS // KV_HEADS)
            sc = q[:, hh] @ k[:, g].T / np.sqrt(HEAD_DIM) + mask
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            o[:, hh] = (sc / sc.sum(-1, keepdims=True)) @ v[:, g]
        x = x + o.reshape(T, -1) @ w[p + "attn_output.weight"].T
        h = rms(x, w[p + "ffn_norm.weight"])
        gt, up = h @ w[p + "ffn_gate.weight"].T, h @ w[p + "ffn_up.weight"].T
        x = x + (gt / (1 + np.exp(-gt)) * up) @ w[p + "ffn_down.weight"].T
    return rms(x, w["output_norm.weight"]) @ w["token_embd.weight"].T


def prompt():
    ids = np.frombuffer(splitmix(fnv1a("prompt"), 4 * PROMPT_LEN), dtype=np.uint32) % VOCAB
    return [int(i) for i in ids]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    import llama_cpp
    from llama_cpp import Llama
    ids = prompt()
    cases = []
    with tempfile.TemporaryDirectory() as d:
        for m in ["Q4_K_M", "Q5_K_M", "Q6_K"]:
            path = Path(d) / f"{m}.gguf"
            sha = write(path, m)
            llm = Llama(model_path=str(path), n_ctx=CTX, n_batch=CTX, n_ubatch=CTX, logits_all=True, n_threads=2,
                        seed=0, verbose=False, vocab_only=False)
            scores, positions, rows = llama_rows(llm, ids)
            llama_rows(llm, ids)
            greedy, margins = greedy_after(llm, ids, GREEDY)
            ex = exact_forward(tensors(m), ids)
            exact = [[round(float(v), 4) for v in ex[p]] for p in positions]
            cases.append({"mix": m, "tensor_sha256": sha, "positions": positions, "logits": rows, "exact": exact,
                          "greedy_ids": greedy, "greedy_margins": margins})
            del llm
    out = {
        "reference": f"llama-cpp-python {llama_cpp.__version__} (vendored llama.cpp), AVX2 build, n_threads=2",
        "generator": "scripts/goldens/k_quant_golden.py",
        "prompt_ids": ids,
        "rope_freqs": [float(v) for v in rope_factors()],
        "cases": cases,
    }
    a.out.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
