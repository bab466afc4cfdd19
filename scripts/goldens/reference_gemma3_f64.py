#!/usr/bin/env python3
"""Exact float64 reference for Gemma 3 270M Q4_K_M: a plain numpy Gemma 3 forward pass over the
GGUF weights dequantized by gguf-py (no activation quantization, no f16 anywhere), written from
HF transformers' `models/gemma3/modeling_gemma3.py` (Gemma3ForCausalLM) with llama.cpp's GGUF
conventions (norm weights stored as 1 + w, RoPE over halves, tied output):

  x = embed[ids] * sqrt(hidden)
  per layer l:  h = rms(x) * attn_norm;  q, k, v = h Wq, h Wk, h Wv
                q, k = rms_head(q) * q_norm, rms_head(k) * k_norm;  rope(q, k; base_l)
                attention over keys j with i - j < 512 on sliding layers ((l + 1) % 6 != 0,
                base 10 000), all j <= i on global layers (base 1e6); scale 1/sqrt(256)
                x += rms(attn Wo) * post_attention_norm
                h = rms(x) * ffn_norm;  x += rms((gelu_tanh(h Wg) * (h Wu)) Wd) * post_ffw_norm
  logits = rms(x) * output_norm @ embed.T

It evaluates the teacher-forced sequences of `gemma3_greedy.json` (prompt + llama.cpp's greedy
tokens) and writes `gemma3_f64.json` beside it: for each case and each of the 32 predicted
positions, the five largest f64 logits; and it prints llama.cpp's distance to these (the
tolerances in `crates/engine/tests/it/gemma3_golden.rs` come from it).

Run: python3 scripts/goldens/reference_gemma3_f64.py --gguf PATH (numpy + gguf; a minute or two).
"""
import argparse, json, os
import numpy as np
import gguf
from gguf.quants import dequantize

ap = argparse.ArgumentParser()
ap.add_argument("--gguf", default=os.path.expanduser("~/.cache/sparrow/pkgs/gemma3-270m/gemma-3-270m-q4_k_m.gguf"))
ap.add_argument("--fixtures", default=os.path.join(os.path.dirname(__file__), "..", "..", "crates/engine/tests/fixtures"))
args = ap.parse_args()

r = gguf.GGUFReader(args.gguf)
meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.")}
T = {t.name: t for t in r.tensors}


def W(name):
    t = T[name]
    w = dequantize(t.data, t.tensor_type).astype(np.float64)
    return w.reshape([int(d) for d in reversed(t.shape)])


H = meta["gemma3.embedding_length"]
L = meta["gemma3.block_count"]
NH = meta["gemma3.attention.head_count"]
NKV = meta["gemma3.attention.head_count_kv"]
HD = meta["gemma3.attention.key_length"]
EPS = meta["gemma3.attention.layer_norm_rms_epsilon"]
WIN = meta["gemma3.attention.sliding_window"]
BASE = meta["gemma3.rope.freq_base"]
LOCAL_BASE = 10000.0
PATTERN = 6

embed = W("token_embd.weight")  # [vocab, H]
layers = []
for l in range(L):
    p = f"blk.{l}."
    layers.append({n: W(p + n + ".weight") for n in [
        "attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "attn_output",
        "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm"]})
out_norm = W("output_norm.weight")


def rms(x, g):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * g


def rope(x, base):  # x: [T, heads, HD], rotate halves
    T_ = x.shape[0]
    half = HD // 2
    inv = base ** (-np.arange(half, dtype=np.float64) * 2 / HD)
    ang = np.arange(T_, dtype=np.float64)[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def forward(ids):
    T_ = len(ids)
    x = embed[ids] * np.sqrt(np.float64(H))
    i = np.arange(T_)[:, None]
    j = np.arange(T_)[None, :]
    for l, w in enumerate(layers):
        sliding = (l + 1) % PATTERN != 0
        h = rms(x, w["attn_norm"])
        q = (h @ w["attn_q"].T).reshape(T_, NH, HD)
        k = (h @ w["attn_k"].T).reshape(T_, NKV, HD)
        v = (h @ w["attn_v"].T).reshape(T_, NKV, HD)
        q, k = rms(q, w["attn_q_norm"]), rms(k, w["attn_k_norm"])
        base = LOCAL_BASE if sliding else BASE
        q, k = rope(q, base), rope(k, base)
        mask = j <= i
        if sliding:
            mask &= (i - j) < WIN
        o = np.empty((T_, NH, HD))
        for hh in range(NH):
            g = hh // (NH // NKV)
            s = (q[:, hh, :] @ k[:, g, :].T) / np.sqrt(HD)
            s = np.where(mask, s, -np.inf)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o[:, hh, :] = s @ v[:, g, :]
        x = x + rms(o.reshape(T_, NH * HD) @ w["attn_output"].T, w["post_attention_norm"])
        h = rms(x, w["ffn_norm"])
        m = gelu_tanh(h @ w["ffn_gate"].T) * (h @ w["ffn_up"].T)
        x = x + rms(m @ w["ffn_down"].T, w["post_ffw_norm"])
    return rms(x, out_norm) @ embed.T


def main():
    g = json.load(open(os.path.join(args.fixtures, "gemma3_greedy.json")))
    out = {"reference": "numpy float64 Gemma 3 forward over gguf-py-dequantized weights (scripts/goldens/reference_gemma3_f64.py)",
           "cases": []}
    dev = []
    for c in g["cases"]:
        seq = c["prompt_ids"] + c["greedy_ids"]
        n = len(c["prompt_ids"])
        logits = forward(seq)
        steps = []
        for s in range(len(c["greedy_ids"])):
            row = logits[n - 1 + s]
            top = np.argsort(-row, kind="stable")[:5]
            steps.append([[int(t), round(float(row[t]), 5)] for t in top])
            st = c["steps"][s]
            dev.append(abs(row[st["top1"]] - st["top1_logit"]))
            dev.append(abs(row[st["top2"]] - st["top2_logit"]))
        out["cases"].append({"name": c["name"], "steps": steps})
        print(c["name"], "llama.cpp top-1 agrees with f64 at",
              sum(1 for s in range(len(steps)) if steps[s][0][0] == c["steps"][s]["top1"]), "of", len(steps))
    dev = np.array(dev)
    print(f"llama.cpp vs f64 on its top-1/top-2 logits: mean {dev.mean():.4f}, max {dev.max():.4f}")
    path = os.path.join(args.fixtures, "gemma3_f64.json")
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
