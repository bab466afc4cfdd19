#!/usr/bin/env python3
"""Goldens of a tiny "sharp" GGUF of the hybrid Nemotron-H architecture (`nemotron_h`: Mamba-2
layers, attention layers and MLP layers, one block each), from llama.cpp (llama-cpp-python), for
`crates/engine/tests/it/nemotron_h.rs`.

    PYTHONPATH=$PEERS/llamapy LLAMA_CPP_LIB_PATH=$PEERS/build/llama-shared/bin \\
        $PEERS/venv/bin/python scripts/goldens/nemotron_h_golden.py --out crates/engine/tests/fixtures/nemotron_h_golden.json

(llama-cpp-python as `family_golden.py` describes.) The tensor generator is `moe_golden.py`'s
(splitmix64 seeded with the FNV-1a hash of each name; Q8_0 matrices whose scales set the
weights' span), which the Rust test mirrors byte for byte; the fixture records the tensor data's
SHA-256.

The file (llama.cpp `src/models/nemotron-h.cpp`, `mamba-base.cpp`'s `build_mamba2_layer`):
6 layers in the pattern `M-M*M-` (Mamba-2, MLP, Mamba-2, attention, Mamba-2, MLP), told apart
by the per-layer `attention.head_count_kv` and `feed_forward_length` (0 where a layer has
none), so the state layers, the KV layer and the layer indices all differ; each block is
`x + block(rms_norm(x))`. Mamba-2 layers: 8 heads of 16 in 2 groups, `d_state` 16, a 4-tap
convolution with its bias, decay rates `A` in [−1, −0.05] so some heads remember far back, the
skip `D`, `y · SiLU(z)` then RMSNorm per group of 64. The attention layer: GQA without RoPE. The
MLP layers: `down(relu(up(x))²)`, no gate. The prompt (200 tokens) is longer than two prefill
chunks of the Rust test. `nemotron_h_moe` is the same file with experts in the MLP blocks (16, 4
per token, ungated ReLU², sigmoid scores with the selection bias `exp_probs_b`, renormalized ×
2.5, one ungated shared expert). For each case: the logits of every 10th prompt position, the same rows
from an exact float64 forward of the same dequantized weights (`exact_forward`), and six greedy
prompts' 12 tokens with their top-1/top-2 margins.
"""
import sys

from family_golden import PEERS  # noqa: F401  (importing it puts gguf-py on the path)
import numpy as np  # noqa: E402
import gguf  # noqa: E402
from k_quant_golden import vector  # noqa: E402
from moe_golden import CTX, EPS, FFN, HEADS, HIDDEN, KV_HEADS, VOCAB, dequantized, finish, q8_head, q8_matrix_t, run  # noqa: E402

PATTERN = "M-M*M-"
LAYERS = len(PATTERN)
HEAD_DIM = 64
CONV, D_STATE, GROUPS, SSM_HEADS, SSM_HEAD_DIM = 4, 16, 2, 8, 16
INNER = SSM_HEADS * SSM_HEAD_DIM
CONV_DIM = INNER + 2 * GROUPS * D_STATE
IN_PROJ = INNER + CONV_DIM + SSM_HEADS
# nemotron_h_moe: the MLP blocks are experts (16, 4 per token, ReLU² without a gate, sigmoid
# scores, the selection bias `exp_probs_b` ±0.5, the chosen renormalized and × 2.5) plus one
# ungated ReLU² shared expert (`nemotron-h.cpp`'s `build_ffn_layer`).
FAMILIES = {"nemotron_h": {}, "nemotron_h_moe": {"moe": True}}
N_EXPERT, TOP_K, EXPERT_FFN, ROUTER, SCALE = 16, 4, 128, 0.25, 2.5


def tensors(fam):
    """(name, numpy shape, type, bytes) in file order."""
    qd, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    q8 = lambda name, rows, cols, target: (name, [rows, cols], "Q8_0", q8_matrix_t(name, rows, cols, target))
    vec = lambda name, shape, lo, hi: (name, shape, "F32", vector(name, int(np.prod(shape)), lo, hi).tobytes())
    out = [q8("token_embd.weight", VOCAB, HIDDEN, 0.5)]
    for l, kind in enumerate(PATTERN):
        p = f"blk.{l}."
        out.append(vec(p + "attn_norm.weight", [HIDDEN], 0.6, 1.4))
        if kind == "M":
            out.append(q8(p + "ssm_in.weight", IN_PROJ, HIDDEN, 0.25))
            out.append(vec(p + "ssm_conv1d.weight", [CONV_DIM, CONV], -0.6, 0.6))
            out.append(vec(p + "ssm_conv1d.bias", [CONV_DIM], -0.3, 0.3))
            out.append(vec(p + "ssm_dt.bias", [SSM_HEADS], -1.0, 1.0))
            out.append(vec(p + "ssm_a", [SSM_HEADS, 1], -1.0, -0.05))
            out.append(vec(p + "ssm_d", [SSM_HEADS, 1], 0.5, 1.5))
            out.append(vec(p + "ssm_norm.weight", [GROUPS, INNER // GROUPS], 0.6, 1.4))
            out.append(q8(p + "ssm_out.weight", HIDDEN, INNER, 0.25))
        elif kind == "*":
            for n, r, c, t in [("attn_q", qd, HIDDEN, 0.15), ("attn_k", kv, HIDDEN, 0.15),
                               ("attn_v", kv, HIDDEN, 0.5), ("attn_output", HIDDEN, qd, 0.5)]:
                out.append(q8(p + n + ".weight", r, c, t))
        elif FAMILIES[fam].get("moe"):
            out.append(vec(p + "ffn_gate_inp.weight", [N_EXPERT, HIDDEN], -ROUTER, ROUTER))
            out.append(vec(p + "exp_probs_b.bias", [N_EXPERT], -0.5, 0.5))
            for n, r, c in [("ffn_up_exps", EXPERT_FFN, HIDDEN), ("ffn_down_exps", HIDDEN, EXPERT_FFN)]:
                name = p + n + ".weight"
                out.append((name, [N_EXPERT, r, c], "Q8_0", q8_matrix_t(name, N_EXPERT * r, c, 0.25)))
            out.append(q8(p + "ffn_up_shexp.weight", EXPERT_FFN, HIDDEN, 0.25))
            out.append(q8(p + "ffn_down_shexp.weight", HIDDEN, EXPERT_FFN, 0.25))
        else:
            out.append(q8(p + "ffn_up.weight", FFN, HIDDEN, 0.25))
            out.append(q8(p + "ffn_down.weight", HIDDEN, FFN, 0.25))
    out.append(vec("output_norm.weight", [HIDDEN], 0.6, 1.4))
    out.append(("output.weight", [VOCAB, HIDDEN], "Q8_0", q8_head("output.weight", VOCAB, HIDDEN, 0.5)))
    return out


def write(path, fam):
    w = gguf.GGUFWriter(str(path), fam)
    w.add_name(f"hybrid golden {fam}")
    w.add_block_count(LAYERS)
    w.add_context_length(CTX)
    w.add_embedding_length(HIDDEN)
    moe = FAMILIES[fam].get("moe")
    w.add_feed_forward_length([(EXPERT_FFN if moe else FFN) if k == "-" else 0 for k in PATTERN])
    w.add_head_count(HEADS)
    w.add_head_count_kv([KV_HEADS if k == "*" else 0 for k in PATTERN])
    w.add_layer_norm_rms_eps(EPS)
    w.add_layer_norm_eps(EPS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_ssm_conv_kernel(CONV)
    w.add_ssm_state_size(D_STATE)
    w.add_ssm_group_count(GROUPS)
    w.add_ssm_time_step_rank(SSM_HEADS)
    w.add_ssm_inner_size(INNER)
    if moe:
        w.add_expert_count(N_EXPERT)
        w.add_expert_used_count(TOP_K)
        w.add_expert_feed_forward_length(EXPERT_FFN)
        w.add_expert_shared_feed_forward_length(EXPERT_FFN)
        w.add_expert_shared_count(1)
        w.add_expert_weights_norm(True)
        w.add_expert_weights_scale(SCALE)
    w.add_vocab_size(VOCAB)
    return finish(w, tensors(fam))


def exact_forward(fam, ids):
    """An exact float64 forward of the same weights following `nemotron-h.cpp`: per layer
    `x += block(RMSNorm(x))`; final RMSNorm and head. Mamba-2 blocks: `[z | x B C | dt]` →
    causal 4-tap conv with zeros before the prompt, + bias, SiLU → per head h (group h // 4):
    `Δ = softplus(dt + dt_bias)`, `S ← S·e^{ΔA} + (x Δ) Bᵀ`, `y = S C + D x` → `y · SiLU(z)` →
    RMSNorm per group of 64 · w → out. Attention: causal GQA, no RoPE, scale 1/√64. MLP:
    `relu(up h)²` → down (nemotron_h_moe: the experts and the shared expert, each so)."""
    w = dequantized(tensors(fam))
    rms = lambda x, g: x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * g
    silu = lambda g: g / (1 + np.exp(-g))
    T = len(ids)
    x = w["token_embd.weight"][ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l, kind in enumerate(PATTERN):
        p = f"blk.{l}."
        h = rms(x, w[p + "attn_norm.weight"])
        if kind == "M":
            proj = h @ w[p + "ssm_in.weight"].T
            z, xbc, dt = proj[:, :INNER], proj[:, INNER:INNER + CONV_DIM], proj[:, INNER + CONV_DIM:]
            taps = w[p + "ssm_conv1d.weight"]  # [channels, kernel]
            padded = np.concatenate([np.zeros((CONV - 1, CONV_DIM)), xbc])
            conv = np.stack([(padded[t:t + CONV] * taps.T).sum(0) for t in range(T)]) + w[p + "ssm_conv1d.bias"]
            conv = silu(conv)
            xs = conv[:, :INNER].reshape(T, SSM_HEADS, SSM_HEAD_DIM)
            B = conv[:, INNER:INNER + GROUPS * D_STATE].reshape(T, GROUPS, D_STATE)
            C = conv[:, INNER + GROUPS * D_STATE:].reshape(T, GROUPS, D_STATE)
            dt = np.log1p(np.exp(dt + w[p + "ssm_dt.bias"]))
            A, D = w[p + "ssm_a"].reshape(-1), w[p + "ssm_d"].reshape(-1)
            y = np.zeros((T, SSM_HEADS, SSM_HEAD_DIM))
            for hh in range(SSM_HEADS):
                g = hh // (SSM_HEADS // GROUPS)
                S = np.zeros((SSM_HEAD_DIM, D_STATE))
                for t in range(T):
                    S = S * np.exp(dt[t, hh] * A[hh]) + np.outer(xs[t, hh] * dt[t, hh], B[t, g])
                    y[t, hh] = S @ C[t, g] + D[hh] * xs[t, hh]
            y = y.reshape(T, INNER) * silu(z)
            y = rms(y.reshape(T, GROUPS, INNER // GROUPS), w[p + "ssm_norm.weight"]).reshape(T, INNER)
            x = x + y @ w[p + "ssm_out.weight"].T
        elif kind == "*":
            q = (h @ w[p + "attn_q.weight"].T).reshape(T, HEADS, HEAD_DIM)
            k = (h @ w[p + "attn_k.weight"].T).reshape(T, KV_HEADS, HEAD_DIM)
            v = (h @ w[p + "attn_v.weight"].T).reshape(T, KV_HEADS, HEAD_DIM)
            o = np.empty((T, HEADS, HEAD_DIM))
            for hh in range(HEADS):
                gq = hh // (HEADS // KV_HEADS)
                sc = q[:, hh] @ k[:, gq].T / np.sqrt(HEAD_DIM) + mask
                sc = np.exp(sc - sc.max(-1, keepdims=True))
                o[:, hh] = (sc / sc.sum(-1, keepdims=True)) @ v[:, gq]
            x = x + o.reshape(T, -1) @ w[p + "attn_output.weight"].T
        elif FAMILIES[fam].get("moe"):
            # `build_moe_ffn`: sigmoid scores, top 4 by score + exp_probs_b, their scores
            # renormalized × 2.5; + the shared expert.
            relu2 = lambda a: np.maximum(a, 0) ** 2
            probs = 1 / (1 + np.exp(-(h @ w[p + "ffn_gate_inp.weight"].T)))
            sel = probs + w[p + "exp_probs_b.bias"]
            uexp, dexp = w[p + "ffn_up_exps.weight"], w[p + "ffn_down_exps.weight"]
            y = np.zeros_like(h)
            for t in range(T):
                top = np.argsort(-sel[t], kind="stable")[:TOP_K]
                wt = probs[t, top] / probs[t, top].sum() * SCALE
                for e_, we in zip(top, wt):
                    y[t] += we * (relu2(uexp[e_] @ h[t]) @ dexp[e_].T)
            sh = relu2(h @ w[p + "ffn_up_shexp.weight"].T) @ w[p + "ffn_down_shexp.weight"].T
            x = x + y + sh
        else:
            x = x + np.maximum(h @ w[p + "ffn_up.weight"].T, 0) ** 2 @ w[p + "ffn_down.weight"].T
    return rms(x, w["output_norm.weight"]) @ w["output.weight"].T


if __name__ == "__main__":
    assert CTX >= 256 and sys.version_info >= (3, 8)
    run(__doc__, FAMILIES, write, exact_forward, "scripts/goldens/nemotron_h_golden.py")
