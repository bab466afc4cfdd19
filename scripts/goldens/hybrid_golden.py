#!/usr/bin/env python3
"""Goldens of a tiny "sharp" GGUF of the hybrid Qwen3.5 architecture (`qwen35`: Gated DeltaNet
layers beside gated full-attention layers), from llama.cpp (llama-cpp-python), for
`crates/engine/tests/it/hybrid.rs`.

    PYTHONPATH=$PEERS/llamapy LLAMA_CPP_LIB_PATH=$PEERS/build/llama-shared/bin \\
        $PEERS/venv/bin/python scripts/goldens/hybrid_golden.py --out crates/engine/tests/fixtures/hybrid_golden.json

(llama-cpp-python as `family_golden.py` describes.) The tensor generator is `moe_golden.py`'s
(splitmix64 seeded with the FNV-1a hash of each name; Q8_0 matrices whose scales set the
weights' span), which the Rust test mirrors byte for byte; the fixture records the tensor data's
SHA-256.

The file (llama.cpp `src/models/qwen35.cpp`, `delta-net-base.cpp`): 4 layers, every second a
full-attention layer (`full_attention_interval = 2`: layers 1 and 3 attend, 0 and 2 are
recurrent, so the KV and state layers are not the layer indices); the attention layers' query
projection gives each head its query and a gate (`σ(gate)` on the output), per-head Q/K
RMSNorm, partial NEOX RoPE (16 of 64 values, IMRoPE sections 3/3/2 which for text positions are
plain RoPE); the recurrent layers: 2 key heads and 4 value heads of 32 (value head `h` reads key
head `h mod 2`, the converter's tiled order), a 4-tap convolution, decay rates `A` in
[−1, −0.05] so some heads remember far back, β from its own projection, the gated RMSNorm.
For the prompt's logits to depend on everything the state carries, the prompt (200 tokens) is
longer than two prefill chunks of the Rust test. `qwen35moe` (`src/models/qwen35moe.cpp`) is the same
file with a MoE feed-forward in every layer: 16 experts, 4 per token, softmax over all and the
4 renormalized, one shared expert under its sigmoid gate. `qwen3next` is `qwen35moe`'s weights in
Qwen3-Next's layout: value heads grouped by key head (h // 2), `ssm_ba`, no RoPE sections.
For each case: the logits of every 10th prompt position, the same rows from an exact float64
forward of the same dequantized weights (`exact_forward`), and six greedy prompts' 12 tokens
with their top-1/top-2 margins.
"""
import sys

from family_golden import PEERS  # noqa: F401  (importing it puts gguf-py on the path)
import numpy as np  # noqa: E402
import gguf  # noqa: E402
from k_quant_golden import vector  # noqa: E402
from moe_golden import CTX, EPS, FFN, HEADS, HIDDEN, KV_HEADS, VOCAB, dequantized, finish, q8_head, q8_matrix_t, run  # noqa: E402

LAYERS = 4
HEAD_DIM, ROPE_DIMS, SECTIONS = 64, 16, [3, 3, 2, 0]
ROPE_BASE = 10000000.0
INTERVAL = 2
CONV, DK, K_HEADS, V_HEADS = 4, 32, 2, 4
INNER = V_HEADS * DK
CONV_DIM = 2 * K_HEADS * DK + INNER

# qwen35moe: the same layers with a MoE feed-forward (16 experts, 4 per token, softmax over all,
# the 4 renormalized; a router wide enough that expert weights differ far beyond 8-bit noise) and
# one shared expert under its sigmoid gate (`ffn_gate_inp_shexp`, ±0.3 per value).
# qwen3next: qwen35moe's weights as Qwen3-Next's converter lays them out (`src/models/qwen3next.cpp`):
# value head h reads key head h // 2 (HF's grouped order), β's and the decay's inputs in one
# `ssm_ba` laid out per key head as [b b | a a], plain RoPE (no sections).
FAMILIES = {"qwen35": {}, "qwen35moe": {"moe": True}, "qwen3next": {"moe": True, "next": True}}
N_EXPERT, TOP_K, EXPERT_FFN, ROUTER = 16, 4, 128, 0.25


def recurrent(l):
    return (l + 1) % INTERVAL != 0


def tensors(fam):
    """(name, numpy shape, type, bytes) in file order."""
    qd, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    q8 = lambda name, rows, cols, target: (name, [rows, cols], "Q8_0", q8_matrix_t(name, rows, cols, target))
    vec = lambda name, n, lo, hi: (name, [n], "F32", vector(name, n, lo, hi).tobytes())
    out = [q8("token_embd.weight", VOCAB, HIDDEN, 0.5)]
    for l in range(LAYERS):
        p = f"blk.{l}."
        out.append(vec(p + "attn_norm.weight", HIDDEN, 0.6, 1.4))
        if recurrent(l):
            out.append(q8(p + "attn_qkv.weight", CONV_DIM, HIDDEN, 0.15))
            out.append(q8(p + "attn_gate.weight", INNER, HIDDEN, 0.25))
            if FAMILIES[fam].get("next"):
                out.append(q8(p + "ssm_ba.weight", 2 * V_HEADS, HIDDEN, 0.25))
            else:
                out.append(q8(p + "ssm_beta.weight", V_HEADS, HIDDEN, 0.25))
                out.append(q8(p + "ssm_alpha.weight", V_HEADS, HIDDEN, 0.25))
            conv = vector(p + "ssm_conv1d.weight", CONV_DIM * CONV, -0.6, 0.6)
            out.append((p + "ssm_conv1d.weight", [CONV_DIM, CONV], "F32", conv.tobytes()))
            out.append(vec(p + "ssm_dt.bias", V_HEADS, -1.0, 1.0))
            out.append(vec(p + "ssm_a", V_HEADS, -1.0, -0.05))
            out.append(vec(p + "ssm_norm.weight", DK, 0.6, 1.4))
            out.append(q8(p + "ssm_out.weight", HIDDEN, INNER, 0.25))
        else:
            for n, r, c, t in [("attn_q", 2 * qd, HIDDEN, 0.15), ("attn_k", kv, HIDDEN, 0.15),
                               ("attn_v", kv, HIDDEN, 0.5), ("attn_output", HIDDEN, qd, 0.5)]:
                out.append(q8(p + n + ".weight", r, c, t))
            out.append(vec(p + "attn_q_norm.weight", HEAD_DIM, 0.6, 1.4))
            out.append(vec(p + "attn_k_norm.weight", HEAD_DIM, 0.6, 1.4))
        out.append(vec(p + "post_attention_norm.weight", HIDDEN, 0.6, 1.4))
        if FAMILIES[fam].get("moe"):
            router = vector(p + "ffn_gate_inp.weight", N_EXPERT * HIDDEN, -ROUTER, ROUTER)
            out.append((p + "ffn_gate_inp.weight", [N_EXPERT, HIDDEN], "F32", router.tobytes()))
            for n, r, c in [("ffn_gate_exps", EXPERT_FFN, HIDDEN), ("ffn_up_exps", EXPERT_FFN, HIDDEN),
                            ("ffn_down_exps", HIDDEN, EXPERT_FFN)]:
                name = p + n + ".weight"
                out.append((name, [N_EXPERT, r, c], "Q8_0", q8_matrix_t(name, N_EXPERT * r, c, 0.25)))
            out.append(vec(p + "ffn_gate_inp_shexp.weight", HIDDEN, -0.3, 0.3))
            for n, r, c in [("ffn_gate_shexp", EXPERT_FFN, HIDDEN), ("ffn_up_shexp", EXPERT_FFN, HIDDEN),
                            ("ffn_down_shexp", HIDDEN, EXPERT_FFN)]:
                out.append(q8(p + n + ".weight", r, c, 0.25))
            continue
        for n, r, c in [("ffn_gate", FFN, HIDDEN), ("ffn_up", FFN, HIDDEN), ("ffn_down", HIDDEN, FFN)]:
            out.append(q8(p + n + ".weight", r, c, 0.25))
    out.append(vec("output_norm.weight", HIDDEN, 0.6, 1.4))
    out.append(("output.weight", [VOCAB, HIDDEN], "Q8_0", q8_head("output.weight", VOCAB, HIDDEN, 0.5)))
    return out


def write(path, fam):
    moe = FAMILIES[fam].get("moe")
    w = gguf.GGUFWriter(str(path), fam)
    w.add_name(f"hybrid golden {fam}")
    w.add_block_count(LAYERS)
    w.add_context_length(CTX)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_layer_norm_rms_eps(EPS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_dimension_count(ROPE_DIMS)
    if not FAMILIES[fam].get("next"):
        w.add_rope_dimension_sections(SECTIONS)
    w.add_ssm_conv_kernel(CONV)
    w.add_ssm_state_size(DK)
    w.add_ssm_group_count(K_HEADS)
    w.add_ssm_time_step_rank(V_HEADS)
    w.add_ssm_inner_size(INNER)
    w.add_full_attention_interval(INTERVAL)
    if moe:
        w.add_expert_count(N_EXPERT)
        w.add_expert_used_count(TOP_K)
        w.add_expert_feed_forward_length(EXPERT_FFN)
        w.add_expert_shared_feed_forward_length(EXPERT_FFN)
    w.add_vocab_size(VOCAB)
    return finish(w, tensors(fam))


def exact_forward(fam, ids):
    """An exact float64 forward of the same weights following `qwen35.cpp`: RMSNorm → mixer →
    residual → RMSNorm (`post_attention_norm`) → SwiGLU MLP → residual; final RMSNorm and head.
    Attention layers: Q (with each head's gate), K, V → per-head Q/K RMSNorm → NEOX RoPE on the
    first 16 values → causal GQA → × σ(gate) → output projection. Recurrent layers: `[q k v]`,
    z, b, a → causal 4-tap conv with zeros before the prompt, SiLU → q, k L2-normed
    (`x / √(Σx² + ε)`), q / √32 → per value head h (key head h mod 2) the gated delta rule
    with `S` as a d_k × d_v matrix: `S ← e^g S; S ← S + k (β (v − Sᵀk))ᵀ; o = Sᵀq`,
    `g = softplus(a + dt_bias) · A`, `β = σ(b)` → RMSNorm(o) · w · SiLU(z) per head → out."""
    w = dequantized(tensors(fam))
    rms = lambda x, g: x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * g
    silu = lambda g: g / (1 + np.exp(-g))
    sigm = lambda g: 1 / (1 + np.exp(-g))
    T = len(ids)
    inv = ROPE_BASE ** (-np.arange(0, ROPE_DIMS, 2, dtype=np.float64) / ROPE_DIMS)
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(x):
        r, rest = x[..., :ROPE_DIMS], x[..., ROPE_DIMS:]
        a, b = r[..., :ROPE_DIMS // 2], r[..., ROPE_DIMS // 2:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin, rest], axis=-1)

    x = w["token_embd.weight"][ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(LAYERS):
        p = f"blk.{l}."
        h = rms(x, w[p + "attn_norm.weight"])
        if recurrent(l):
            mixed = h @ w[p + "attn_qkv.weight"].T
            z = h @ w[p + "attn_gate.weight"].T
            nxt = FAMILIES[fam].get("next")
            if nxt:
                # Per key head g: [b for its r value heads, a for them].
                ba = (h @ w[p + "ssm_ba.weight"].T).reshape(T, K_HEADS, 2, V_HEADS // K_HEADS)
                b_in, a_in = ba[:, :, 0].reshape(T, V_HEADS), ba[:, :, 1].reshape(T, V_HEADS)
            else:
                b_in, a_in = h @ w[p + "ssm_beta.weight"].T, h @ w[p + "ssm_alpha.weight"].T
            beta = sigm(b_in)
            g = np.log1p(np.exp(a_in + w[p + "ssm_dt.bias"])) * w[p + "ssm_a"]
            taps = w[p + "ssm_conv1d.weight"]  # [channels, kernel]
            padded = np.concatenate([np.zeros((CONV - 1, CONV_DIM)), mixed])
            conv = np.stack([(padded[t:t + CONV] * taps.T).sum(0) for t in range(T)])
            conv = silu(conv)
            q = conv[:, :K_HEADS * DK].reshape(T, K_HEADS, DK)
            k = conv[:, K_HEADS * DK:2 * K_HEADS * DK].reshape(T, K_HEADS, DK)
            v = conv[:, 2 * K_HEADS * DK:].reshape(T, V_HEADS, DK)
            l2 = lambda a: a / np.sqrt((a * a).sum(-1, keepdims=True) + EPS)
            q, k = l2(q) / np.sqrt(DK), l2(k)
            o = np.zeros((T, V_HEADS, DK))
            for hh in range(V_HEADS):
                S = np.zeros((DK, DK))  # [key, value]
                kh = hh // (V_HEADS // K_HEADS) if nxt else hh % K_HEADS
                for t in range(T):
                    S = S * np.exp(g[t, hh])
                    d = (v[t, hh] - S.T @ k[t, kh]) * beta[t, hh]
                    S = S + np.outer(k[t, kh], d)
                    o[t, hh] = S.T @ q[t, kh]
            o = rms(o, w[p + "ssm_norm.weight"]) * silu(z.reshape(T, V_HEADS, DK))
            x = x + o.reshape(T, -1) @ w[p + "ssm_out.weight"].T
        else:
            qg = (h @ w[p + "attn_q.weight"].T).reshape(T, HEADS, 2 * HEAD_DIM)
            q, gate = qg[..., :HEAD_DIM], qg[..., HEAD_DIM:]
            k = (h @ w[p + "attn_k.weight"].T).reshape(T, KV_HEADS, HEAD_DIM)
            v = (h @ w[p + "attn_v.weight"].T).reshape(T, KV_HEADS, HEAD_DIM)
            q, k = rope(rms(q, w[p + "attn_q_norm.weight"])), rope(rms(k, w[p + "attn_k_norm.weight"]))
            o = np.empty((T, HEADS, HEAD_DIM))
            for hh in range(HEADS):
                gq = hh // (HEADS // KV_HEADS)
                sc = q[:, hh] @ k[:, gq].T / np.sqrt(HEAD_DIM) + mask
                sc = np.exp(sc - sc.max(-1, keepdims=True))
                o[:, hh] = (sc / sc.sum(-1, keepdims=True)) @ v[:, gq]
            o = o * sigm(gate)
            x = x + o.reshape(T, -1) @ w[p + "attn_output.weight"].T
        h = rms(x, w[p + "post_attention_norm.weight"])
        if FAMILIES[fam].get("moe"):
            # `build_moe_ffn`: softmax over all experts, top 4, renormalized; + the shared expert
            # × σ(h · ffn_gate_inp_shexp).
            logits = h @ w[p + "ffn_gate_inp.weight"].T
            e = np.exp(logits - logits.max(-1, keepdims=True))
            probs = e / e.sum(-1, keepdims=True)
            gexp, uexp, dexp = (w[p + n + ".weight"] for n in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"))
            y = np.zeros_like(h)
            for t in range(T):
                top = np.argsort(-probs[t], kind="stable")[:TOP_K]
                wt = probs[t, top] / probs[t, top].sum()
                for e_, we in zip(top, wt):
                    y[t] += we * ((silu(gexp[e_] @ h[t]) * (uexp[e_] @ h[t])) @ dexp[e_].T)
            sh = (silu(h @ w[p + "ffn_gate_shexp.weight"].T) * (h @ w[p + "ffn_up_shexp.weight"].T)) \
                @ w[p + "ffn_down_shexp.weight"].T
            x = x + y + sh * sigm(h @ w[p + "ffn_gate_inp_shexp.weight"])[:, None]
            continue
        x = x + (silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
    return rms(x, w["output_norm.weight"]) @ w["output.weight"].T


if __name__ == "__main__":
    assert CTX >= 256 and sys.version_info >= (3, 8)
    run(__doc__, FAMILIES, write, exact_forward, "scripts/goldens/hybrid_golden.py")
