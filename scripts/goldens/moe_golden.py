#!/usr/bin/env python3
"""Goldens of tiny "sharp" GGUF files of the MoE families on the Llama layer (qwen3moe,
glm4moe), from llama.cpp (llama-cpp-python), for `crates/engine/tests/it/moe_families.rs`.

    PYTHONPATH=$PEERS/llamapy LLAMA_CPP_LIB_PATH=$PEERS/build/llama-shared/bin \\
        $PEERS/venv/bin/python scripts/goldens/moe_golden.py --out crates/engine/tests/fixtures/moe_golden.json

(llama-cpp-python as `family_golden.py` describes.) The tensor generator is
`family_golden.py`'s (splitmix64 seeded with the FNV-1a hash of each name; Q8_0 matrices
whose scales set the weights' span), which the Rust test mirrors byte for byte; the fixture
records the tensor data's SHA-256.

What makes routing visible: 16 experts, 4 chosen per token, a router (F32, as llama-quantize
leaves `ffn_gate_inp`) wide enough that the router logits spread over several units, so the
softmax/sigmoid weights differ a lot between experts and a wrong choice, a missing
renormalization or a dropped bias moves the logits by far more than 8-bit noise.
- qwen3moe (llama.cpp `src/models/qwen3moe.cpp`): Qwen3's attention (per-head Q/K RMSNorm,
  head_dim 96, NEOX RoPE); softmax over all 16 router logits, top 4, the four renormalized
  (`norm_w = true` fixed by the graph); no shared experts.
- qwen3moe_yarn: the same file with YaRN RoPE scaling (factor 4 over an original context of 64),
  as Qwen3 files extended past 32k carry it (`rope.scaling.type = yarn`).
- gpt-oss (`src/models/openai-moe.cpp`): Q/K/V (±1) and output biases, attention sinks
  (0..3) in every head's softmax, a 16-key sliding window on even layers (the 200-token prompt
  is far past it), YaRN (factor 4 over 64), the router's bias, the top 4 by raw logit with a
  softmax over them, MXFP4 experts (scale 2^-5) with biases and the clamped SwiGLU.
- glm4moe (`src/models/glm4-moe.cpp`): Q/K/V biases (±1.0), partial NEOX RoPE (32 of 64
  values), the pre-FFN norm named `post_attention_norm`; layer 0 a dense MLP
  (`leading_dense_block_count = 1`); sigmoid scores, the selection bias `exp_probs_b` (±0.5:
  it changes which experts win, not their weights), `expert_weights_norm`, a routed scale of
  2.5 (`expert_weights_scale`), one shared expert.
The output head's first 8 rows are 4× wider (`q8_head`), so a greedy token is usually one of a
few with gaps well above 8-bit noise. For each family: the logits of every 10th position of a 200-token prompt, the same rows from an
exact float64 forward of the same dequantized weights (`exact_forward`), and for six more
prompts (24–64 tokens) 12 greedy tokens each with their top-1/top-2 margins. Routing is
discrete: 8-bit activation noise flips an expert choice now and then, and in files this sharp a
flip moves a logit by several units (llama.cpp's own rows are up to 54 % of their scale from
the exact forward), so greedy agreement is counted per prompt (the issue's "4 of 6").
"""
import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

from family_golden import PEERS, prompt  # noqa: F401  (importing it puts gguf-py on the path)
import numpy as np  # noqa: E402
import gguf  # noqa: E402
from k_quant_golden import fnv1a, greedy_after, llama_rows, splitmix, vector  # noqa: E402

HIDDEN, HEADS, KV_HEADS, FFN, LAYERS, VOCAB, CTX = 256, 4, 2, 512, 4, 256, 512
N_EXPERT, TOP_K, EXPERT_FFN = 16, 4, 128
EPS = 1e-6
PROMPT_LEN, GREEDY, GREEDY_PROMPTS = 200, 12, 6
ROUTER = 0.25
HOT, HOT_FACTOR = 8, 4.0

FAMILIES = {
    "qwen3moe": {"head_dim": 96, "rope_dims": 96, "bias": False, "qk_norm": True, "rope_base": 1000000.0,
                 "scoring": "softmax", "norm": True, "scale": 1.0, "probs_bias": False, "shared": 0,
                 "dense_lead": 0, "ffn_norm": "ffn_norm"},
    # Qwen3-MoE's weights with YaRN (factor 4 over an original context of 64, so most of the
    # 200-token prompt is past it): `rope.scaling.{type,factor,original_context_length}`.
    "qwen3moe_yarn": {"arch": "qwen3moe", "yarn": (4.0, 64), "head_dim": 96, "rope_dims": 96, "bias": False,
                      "qk_norm": True, "rope_base": 1000000.0, "scoring": "softmax", "norm": True, "scale": 1.0,
                      "probs_bias": False, "shared": 0, "dense_lead": 0, "ffn_norm": "ffn_norm"},
    # gpt-oss: Q/K/V and output biases, sinks, every other layer a 16-key sliding window, YaRN,
    # the router's bias, top 4 by raw logit with a softmax over them, MXFP4 experts with biases
    # and the clamped SwiGLU.
    "gpt-oss": {"yarn": (4.0, 64), "head_dim": 64, "rope_dims": 64, "bias": True, "qk_norm": False,
                "rope_base": 150000.0, "scoring": "softmax_selected", "norm": False, "scale": 1.0,
                "probs_bias": False, "shared": 0, "dense_lead": 0, "ffn_norm": "post_attention_norm",
                "sinks": True, "window": 16, "mxfp4": True, "out_bias": True},
    "glm4moe": {"head_dim": 64, "rope_dims": 32, "bias": True, "qk_norm": False, "rope_base": 1000000.0,
                "scoring": "sigmoid", "norm": True, "scale": 2.5, "probs_bias": True, "shared": 1,
                "dense_lead": 1, "ffn_norm": "post_attention_norm"},
}


def tensors(fam):
    """(name, numpy shape, type, bytes) in file order; expert tensors are [n_expert, rows, cols]."""
    f = FAMILIES[fam]
    hd = f["head_dim"]
    qd, kv = HEADS * hd, KV_HEADS * hd
    q8 = lambda name, rows, cols, target: (name, [rows, cols], "Q8_0", q8_matrix_t(name, rows, cols, target))
    vec = lambda name, n, lo, hi: (name, [n], "F32", vector(name, n, lo, hi).tobytes())
    out = [q8("token_embd.weight", VOCAB, HIDDEN, 0.5)]
    for l in range(LAYERS):
        p = f"blk.{l}."
        out.append(vec(p + "attn_norm.weight", HIDDEN, 0.6, 1.4))
        for n, r, c, t in [("attn_q", qd, HIDDEN, 0.15), ("attn_k", kv, HIDDEN, 0.15), ("attn_v", kv, HIDDEN, 0.25),
                           ("attn_output", HIDDEN, qd, 0.25)]:
            out.append(q8(p + n + ".weight", r, c, t))
        if f["bias"]:
            for n, r in [("attn_q", qd), ("attn_k", kv), ("attn_v", kv)]:
                out.append(vec(p + n + ".bias", r, -1.0, 1.0))
        if f.get("out_bias"):
            out.append(vec(p + "attn_output.bias", HIDDEN, -0.5, 0.5))
        if f.get("sinks"):
            out.append(vec(p + "attn_sinks.weight", HEADS, 0.0, 3.0))
        if f["qk_norm"]:
            out.append(vec(p + "attn_q_norm.weight", hd, 0.6, 1.4))
            out.append(vec(p + "attn_k_norm.weight", hd, 0.6, 1.4))
        out.append(vec(p + f["ffn_norm"] + ".weight", HIDDEN, 0.6, 1.4))
        if l < f["dense_lead"]:
            for n, r, c in [("ffn_gate", FFN, HIDDEN), ("ffn_up", FFN, HIDDEN), ("ffn_down", HIDDEN, FFN)]:
                out.append(q8(p + n + ".weight", r, c, 0.25))
            continue
        router = vector(p + "ffn_gate_inp.weight", N_EXPERT * HIDDEN, -ROUTER, ROUTER)
        out.append((p + "ffn_gate_inp.weight", [N_EXPERT, HIDDEN], "F32", router.tobytes()))
        if f.get("mxfp4"):
            out.append(vec(p + "ffn_gate_inp.bias", N_EXPERT, -0.5, 0.5))
        if f["probs_bias"]:
            out.append(vec(p + "exp_probs_b.bias", N_EXPERT, -0.5, 0.5))
        for n, r, c in [("ffn_gate_exps", EXPERT_FFN, HIDDEN), ("ffn_up_exps", EXPERT_FFN, HIDDEN),
                        ("ffn_down_exps", HIDDEN, EXPERT_FFN)]:
            name = p + n + ".weight"
            if f.get("mxfp4"):
                out.append((name, [N_EXPERT, r, c], "MXFP4", mxfp4_matrix(name, N_EXPERT * r, c)))
                bias = vector(p + n + ".bias", N_EXPERT * r, -0.5, 0.5)
                out.append((p + n + ".bias", [N_EXPERT, r], "F32", bias.tobytes()))
            else:
                out.append((name, [N_EXPERT, r, c], "Q8_0", q8_matrix_t(name, N_EXPERT * r, c, 0.25)))
        if f["shared"]:
            si = f["shared"] * EXPERT_FFN
            for n, r, c in [("ffn_gate_shexp", si, HIDDEN), ("ffn_up_shexp", si, HIDDEN), ("ffn_down_shexp", HIDDEN, si)]:
                out.append(q8(p + n + ".weight", r, c, 0.25))
    out.append(vec("output_norm.weight", HIDDEN, 0.6, 1.4))
    out.append(("output.weight", [VOCAB, HIDDEN], "Q8_0", q8_head("output.weight", VOCAB, HIDDEN, 0.5)))
    return out


def mxfp4_matrix(name, rows, cols):
    """MXFP4 blocks of random nibbles, every block's E8M0 scale 2^-5 (weights within ±0.375)."""
    raw = bytearray(splitmix(fnv1a(name), rows * cols // 32 * 17))
    for b0 in range(0, len(raw), 17):
        raw[b0] = 123
    return bytes(raw)


def q8_head(name, rows, cols, target):
    """The output head: `q8_matrix_t`, then the first HOT rows' scales HOT_FACTOR× larger, so
    that the greedy token is usually one of a few with gaps far above 8-bit noise."""
    raw = bytearray(q8_matrix_t(name, rows, cols, target))
    per_row = cols // 32 * 34
    scale = np.float16(np.float32(HOT_FACTOR * target / 127)).tobytes()
    for b0 in range(0, HOT * per_row, 34):
        raw[b0:b0 + 2] = scale
    return bytes(raw)


def q8_matrix_t(name, rows, cols, target):
    """Q8_0 blocks of random codes, every block's f16 scale `target / 127` (`family_golden.
    q8_matrix` with the span given directly)."""
    raw = bytearray(splitmix(fnv1a(name), rows * cols // 32 * 34))
    scale = np.float16(np.float32(target / 127)).tobytes()
    for b0 in range(0, len(raw), 34):
        raw[b0:b0 + 2] = scale
    return bytes(raw)


def write(path, fam):
    f = FAMILIES[fam]
    arch = f.get("arch", fam)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"moe golden {fam}")
    w.add_block_count(LAYERS)
    w.add_context_length(CTX)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(f["rope_base"])
    w.add_layer_norm_rms_eps(EPS)
    w.add_key_length(f["head_dim"])
    w.add_value_length(f["head_dim"])
    w.add_rope_dimension_count(f["rope_dims"])
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(TOP_K)
    w.add_expert_feed_forward_length(EXPERT_FFN)
    if "yarn" in f:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(f["yarn"][0])
        w.add_rope_scaling_orig_ctx_len(f["yarn"][1])
    if f.get("window"):
        w.add_sliding_window(f["window"])
    if arch == "glm4moe":
        w.add_expert_shared_count(f["shared"])
        w.add_leading_dense_block_count(f["dense_lead"])
        w.add_expert_weights_scale(f["scale"])
        w.add_expert_weights_norm(f["norm"])
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    w.add_vocab_size(VOCAB)
    return finish(w, tensors(fam))


# Bytes per 32-weight block of the block types the goldens write.
BLOCK_BYTES = {"Q8_0": 34, "MXFP4": 17}


def blocks(shape, ty, data):
    """A block-type tensor's bytes as the uint8 array gguf-py takes: the last dimension in
    blocks."""
    return np.frombuffer(data, dtype=np.uint8).reshape(shape[:-1] + [shape[-1] // 32 * BLOCK_BYTES[ty]])


def finish(w, ts):
    """Writes `ts` (`tensors()`' tuples) after the metadata, with no tokenizer, and closes `w`;
    returns the SHA-256 of the tensor data, which the Rust tests check first."""
    w.add_tokenizer_model("none")
    sha = hashlib.sha256()
    for name, shape, ty, data in ts:
        sha.update(data)
        if ty == "F32":
            w.add_tensor(name, np.frombuffer(data, dtype=np.float32).reshape(shape))
        else:
            w.add_tensor(name, blocks(shape, ty, data), raw_dtype=gguf.GGMLQuantizationType[ty])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return sha.hexdigest()


def router_scores(logits, scoring):
    """The router's scores of `logits` (`[tokens × experts]`): `softmax` over all experts,
    `sigmoid` per expert, or the raw logits (`softmax_selected`: softmax over the chosen later)."""
    if scoring == "softmax_selected":
        return logits
    if scoring == "softmax":
        e = np.exp(logits - logits.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    return 1 / (1 + np.exp(-logits))


def dequantized(ts):
    """`ts` as float64 arrays by name (gguf-py's dequantization)."""
    from gguf.quants import dequantize
    w = {}
    for name, shape, ty, data in ts:
        if ty == "F32":
            w[name] = np.frombuffer(data, dtype=np.float32).astype(np.float64).reshape(shape)
        else:
            qt = gguf.GGMLQuantizationType[ty]
            w[name] = dequantize(blocks(shape, ty, data), qt).astype(np.float64).reshape(shape)
    return w


def exact_forward(fam, ids):
    """An exact float64 forward of the same weights (gguf-py's dequantization, no activation
    quantization), following llama.cpp's graphs and `build_moe_ffn` (`src/llama-graph.cpp`):
    RMSNorm → Q/K/V (+ bias) → [per-head Q/K RMSNorm] → NEOX RoPE on the first `rope_dims`
    values → causal GQA attention → output projection → residual → RMSNorm → dense SwiGLU MLP
    (leading layers) or MoE: scores = softmax or sigmoid of the router logits; the top 4 by
    score (+ exp_probs_b when present); weights = their scores, renormalized, times the scale;
    Σ weight · SwiGLU expert + shared expert → residual; final RMSNorm and the head."""
    f = FAMILIES[fam]
    hd, rd = f["head_dim"], f["rope_dims"]
    w = dequantized(tensors(fam))
    rms = lambda x, g: x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * g
    T = len(ids)
    inv = f["rope_base"] ** (-np.arange(0, rd, 2, dtype=np.float64) / rd)
    mscale = 1.0
    if "yarn" in f:
        # HF transformers' `_compute_yarn_parameters` (beta_fast 32, beta_slow 1): each pair's
        # frequency blended between extrapolated and interpolated (÷ factor) by a linear ramp
        # between the correction dimensions; cosines and sines times 0.1 ln(factor) + 1.
        factor, orig = f["yarn"]
        dim_of = lambda rot: rd * np.log(orig / (rot * 2 * np.pi)) / (2 * np.log(f["rope_base"]))
        low, high = max(np.floor(dim_of(32)), 0), min(np.ceil(dim_of(1)), rd - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(rd // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extrap = 1 - ramp
        inv = inv / factor * (1 - extrap) + inv * extrap
        mscale = 0.1 * np.log(factor) + 1
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = mscale * np.cos(ang)[:, None, :], mscale * np.sin(ang)[:, None, :]

    def rope(x):
        r, rest = x[..., :rd], x[..., rd:]
        a, b = r[..., :rd // 2], r[..., rd // 2:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin, rest], axis=-1)

    silu = lambda g: g / (1 + np.exp(-g))
    x = w["token_embd.weight"][ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(LAYERS):
        p = f"blk.{l}."
        h = rms(x, w[p + "attn_norm.weight"])
        proj = lambda n: h @ w[p + n + ".weight"].T + (w[p + n + ".bias"] if f["bias"] else 0.0)
        q, k, v = proj("attn_q"), proj("attn_k"), proj("attn_v")
        q, k, v = q.reshape(T, HEADS, hd), k.reshape(T, KV_HEADS, hd), v.reshape(T, KV_HEADS, hd)
        if f["qk_norm"]:
            q, k = rms(q, w[p + "attn_q_norm.weight"]), rms(k, w[p + "attn_k_norm.weight"])
        q, k = rope(q), rope(k)
        o = np.empty((T, HEADS, hd))
        lmask = mask
        if f.get("window") and l % 2 == 0:
            # Even layers slide: a query sees its last `window` keys, itself included.
            i, j = np.arange(T)[:, None], np.arange(T)[None, :]
            lmask = np.where(i - j >= f["window"], -np.inf, mask)
        for hh in range(HEADS):
            g = hh // (HEADS // KV_HEADS)
            sc = q[:, hh] @ k[:, g].T / np.sqrt(hd) + lmask
            if f.get("sinks"):
                # The sink: one more logit in each row's softmax, with no value.
                sink = w[p + "attn_sinks.weight"][hh]
                mx = np.maximum(sc.max(-1, keepdims=True), sink)
                e = np.exp(sc - mx)
                o[:, hh] = (e / (e.sum(-1, keepdims=True) + np.exp(sink - mx))) @ v[:, g]
                continue
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            o[:, hh] = (sc / sc.sum(-1, keepdims=True)) @ v[:, g]
        x = x + o.reshape(T, -1) @ w[p + "attn_output.weight"].T + (w[p + "attn_output.bias"] if f.get("out_bias") else 0.0)
        h = rms(x, w[p + f["ffn_norm"] + ".weight"])
        if l < f["dense_lead"]:
            y = (silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
        else:
            logits = h @ w[p + "ffn_gate_inp.weight"].T
            if f.get("mxfp4"):
                logits = logits + w[p + "ffn_gate_inp.bias"]
            probs = router_scores(logits, f["scoring"])
            sel = probs + (w[p + "exp_probs_b.bias"] if f["probs_bias"] else 0.0)
            y = np.zeros_like(h)
            gexp, uexp, dexp = (w[p + n + ".weight"] for n in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"))
            bias = lambda n: w[p + n + ".bias"] if f.get("mxfp4") else np.zeros((N_EXPERT, 1))
            gb, ub, db = bias("ffn_gate_exps"), bias("ffn_up_exps"), bias("ffn_down_exps")
            for t in range(T):
                top = np.argsort(-sel[t], kind="stable")[:TOP_K]
                wt = probs[t, top]
                if f["scoring"] == "softmax_selected":
                    wt = np.exp(wt - wt.max())
                    wt = wt / wt.sum()
                if f["norm"]:
                    wt = wt / wt.sum()
                wt = wt * f["scale"]
                for e_, we in zip(top, wt):
                    gt, up = gexp[e_] @ h[t] + gb[e_], uexp[e_] @ h[t] + ub[e_]
                    if f.get("mxfp4"):
                        # gpt-oss's clamped SwiGLU (alpha 1.702, limit 7).
                        gt, up = np.minimum(gt, 7.0), np.clip(up, -7.0, 7.0)
                        act = gt / (1 + np.exp(-1.702 * gt)) * (up + 1)
                    else:
                        act = silu(gt) * up
                    y[t] += we * (act @ dexp[e_].T + db[e_])
            if f["shared"]:
                y += (silu(h @ w[p + "ffn_gate_shexp.weight"].T) * (h @ w[p + "ffn_up_shexp.weight"].T)) \
                    @ w[p + "ffn_down_shexp.weight"].T
        x = x + y
    return rms(x, w["output_norm.weight"]) @ w["output.weight"].T


def greedy_prompt(i):
    """Greedy prompt `i`: 24 + 8·i token ids from splitmix64 of `greedy{i}`."""
    n = 24 + 8 * i
    return [int(t) for t in np.frombuffer(splitmix(fnv1a(f"greedy{i}"), 4 * n), dtype=np.uint32) % VOCAB]


def run(doc, families, write, exact_forward, generator):
    """The script's `main` for a set of tiny files: `write(path, fam)` makes each (returning its
    tensors' SHA-256), llama.cpp evaluates it (the logit rows of `prompt()`, six greedy prompts'
    tokens and margins), `exact_forward(fam, ids)` gives the f64 rows; writes the fixture to
    `--out`, naming `generator`."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    import llama_cpp
    from llama_cpp import Llama
    ids = prompt()
    cases = []
    with tempfile.TemporaryDirectory() as d:
        for fam in families:
            path = Path(d) / f"{fam}.gguf"
            sha = write(path, fam)
            llm = Llama(model_path=str(path), n_ctx=CTX, n_batch=CTX, n_ubatch=CTX, logits_all=True, n_threads=2,
                        seed=0, verbose=False)
            scores, positions, rows = llama_rows(llm, ids)
            greedy = []
            for i in range(GREEDY_PROMPTS):
                g_ids = greedy_prompt(i)
                llama_rows(llm, g_ids)
                toks, margins = greedy_after(llm, g_ids, GREEDY)
                greedy.append({"prompt_ids": g_ids, "greedy_ids": toks, "greedy_margins": margins})
            ex = exact_forward(fam, ids)
            exact = [[round(float(v), 4) for v in ex[p]] for p in positions]
            ref = np.array([scores[p] for p in positions])
            dev = np.abs(ref - ex[positions]).max(-1) / np.abs(ex[positions]).max(-1)
            print(f"{fam}: llama.cpp from exact f64 {100 * dev.mean():.1f} % mean, {100 * dev.max():.1f} % max "
                  f"of each row's scale", file=sys.stderr)
            cases.append({"family": fam, "tensor_sha256": sha, "positions": positions, "logits": rows, "exact": exact,
                          "greedy": greedy})
            del llm
    out = {
        "reference": f"llama-cpp-python {llama_cpp.__version__} (vendored llama.cpp), native build, n_threads=2",
        "generator": generator,
        "prompt_ids": ids,
        "cases": cases,
    }
    a.out.write_text(json.dumps(out, separators=(",", ":")) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    run(__doc__, FAMILIES, write, exact_forward, "scripts/goldens/moe_golden.py")
