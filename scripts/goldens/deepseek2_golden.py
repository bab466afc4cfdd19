#!/usr/bin/env python3
"""Goldens of tiny "sharp" GGUF files of llama.cpp's `deepseek2` architecture (DeepSeek-V2 /
V2-Lite / V3: MLA attention + MoE), from llama.cpp (llama-cpp-python), for
`crates/engine/tests/it/deepseek2.rs`.

    PYTHONPATH=$PEERS/llamapy LLAMA_CPP_LIB_PATH=$PEERS/build/llama-shared/bin \\
        $PEERS/venv/bin/python scripts/goldens/deepseek2_golden.py --out crates/engine/tests/fixtures/deepseek2_golden.json

(llama-cpp-python as `family_golden.py` describes.) Tensors as `moe_golden.py` makes them
(splitmix64 seeded with the FNV-1a hash of each name; Q8_0 blocks whose scale sets the span),
mirrored byte for byte by the Rust test; the fixture records the tensor data's SHA-256.

Two files, between them every choice the loader makes:
- deepseek2 (DeepSeek-V3's layout): the q LoRA (`attn_q_a`, `attn_q_a_norm`, `attn_q_b`),
  `attn_kv_b` split into `attn_k_b` / `attn_v_b` as llama.cpp's converter writes it since
  its MLA change (`key_length_mla`, `value_length_mla`), sigmoid routing with the selection
  bias `exp_probs_b`, 4 expert groups of which 2 are kept, renormalized weights times 2.5,
  one shared expert, a dense first layer, YaRN (factor 4 over an original context of 64) with
  `mscale_all_dim = 1` (`yarn_log_multiplier = 0.1`, as the converter writes it); its experts
  span ±0.15, not ±0.25: with groups, sigmoid scores and the ×2.5 scale a near-tie choice
  flips under 8-bit noise often enough that at ±0.25 llama.cpp's own greedy tokens are the
  exact forward's for only 58 of 72 (teacher-forced), at ±0.15 for 67;
- deepseek2_lite (DeepSeek-V2-Lite's layout): no q LoRA (`attn_q`, `q_lora_rank = 0`), the
  legacy unsplit `attn_kv_b` (no `*_mla` keys: llama.cpp runs it as plain MHA, we absorb it),
  softmax routing without renormalization, two shared experts, YaRN with
  `mscale_all_dim = 0.707` (V2-Lite's value).
The exact float64 forward follows HF transformers' DeepSeek-V2/V3 modeling, not llama.cpp's
graph: MLA without absorption (K and V decompressed per head), RoPE on adjacent pairs of the
rotary part, YaRN's frequencies with `softmax_scale = (nope + rope)^-0.5 · mscale²`,
`mscale = 0.1 · mscale_all_dim · ln(factor) + 1`, and the cosines unscaled
(`mscale / mscale_all_dim` = 1). For each file: the logits of every 10th position of a
200-token prompt, the same rows from the exact forward, and 6 prompts' 12 greedy tokens with
their margins, as `moe_golden.py` records them.
"""
from family_golden import PEERS, prompt  # noqa: F401  (importing it puts gguf-py on the path)
import numpy as np  # noqa: E402
import gguf  # noqa: E402
from k_quant_golden import vector  # noqa: E402
from moe_golden import dequantized, finish, q8_head, q8_matrix_t, router_scores, run  # noqa: E402

HIDDEN, HEADS, FFN, LAYERS, VOCAB, CTX = 256, 4, 512, 4, 256, 512
KV_LORA, Q_LORA, NOPE, ROPE, V_DIM = 128, 128, 64, 32, 64
N_EXPERT, TOP_K, EXPERT_FFN = 16, 4, 128
EPS = 1e-6
ROPE_BASE = 10000.0
YARN = (4.0, 64)
ROUTER = 0.25

FAMILIES = {
    "deepseek2": {"q_lora": True, "split_kv_b": True, "scoring": "sigmoid", "probs_bias": True, "groups": (4, 2),
                  "norm": True, "scale": 2.5, "shared": 1, "dense_lead": 1, "mscale_all_dim": 1.0,
                  "exp_span": 0.15},
    "deepseek2_lite": {"q_lora": False, "split_kv_b": False, "scoring": "softmax", "probs_bias": False,
                       "groups": None, "norm": False, "scale": 1.0, "shared": 2, "dense_lead": 1,
                       "mscale_all_dim": 0.707},
}


def tensors(fam):
    """(name, numpy shape, type, bytes) in file order; expert and per-head tensors are 3-D."""
    f = FAMILIES[fam]
    hq = NOPE + ROPE
    q8 = lambda name, shape, target: (name, shape, "Q8_0", q8_matrix_t(name, int(np.prod(shape[:-1])), shape[-1],
                                                                        target))
    vec = lambda name, n, lo, hi: (name, [n], "F32", vector(name, n, lo, hi).tobytes())
    out = [q8("token_embd.weight", [VOCAB, HIDDEN], 0.5)]
    for l in range(LAYERS):
        p = f"blk.{l}."
        out.append(vec(p + "attn_norm.weight", HIDDEN, 0.6, 1.4))
        if f["q_lora"]:
            out.append(q8(p + "attn_q_a.weight", [Q_LORA, HIDDEN], 0.15))
            out.append(vec(p + "attn_q_a_norm.weight", Q_LORA, 0.6, 1.4))
            out.append(q8(p + "attn_q_b.weight", [HEADS * hq, Q_LORA], 0.25))
        else:
            out.append(q8(p + "attn_q.weight", [HEADS * hq, HIDDEN], 0.15))
        out.append(q8(p + "attn_kv_a_mqa.weight", [KV_LORA + ROPE, HIDDEN], 0.15))
        out.append(vec(p + "attn_kv_a_norm.weight", KV_LORA, 0.6, 1.4))
        if f["split_kv_b"]:
            # Per head W_UKᵀ [kv_lora × nope] and W_UV [v × kv_lora] (the converter's split).
            out.append(q8(p + "attn_k_b.weight", [HEADS, KV_LORA, NOPE], 0.25))
            out.append(q8(p + "attn_v_b.weight", [HEADS, V_DIM, KV_LORA], 0.25))
        else:
            out.append(q8(p + "attn_kv_b.weight", [HEADS * (NOPE + V_DIM), KV_LORA], 0.25))
        out.append(q8(p + "attn_output.weight", [HIDDEN, HEADS * V_DIM], 0.25))
        out.append(vec(p + "ffn_norm.weight", HIDDEN, 0.6, 1.4))
        if l < f["dense_lead"]:
            for n, r, c in [("ffn_gate", FFN, HIDDEN), ("ffn_up", FFN, HIDDEN), ("ffn_down", HIDDEN, FFN)]:
                out.append(q8(p + n + ".weight", [r, c], 0.25))
            continue
        router = vector(p + "ffn_gate_inp.weight", N_EXPERT * HIDDEN, -ROUTER, ROUTER)
        out.append((p + "ffn_gate_inp.weight", [N_EXPERT, HIDDEN], "F32", router.tobytes()))
        if f["probs_bias"]:
            out.append(vec(p + "exp_probs_b.bias", N_EXPERT, -0.5, 0.5))
        for n, r, c in [("ffn_gate_exps", EXPERT_FFN, HIDDEN), ("ffn_up_exps", EXPERT_FFN, HIDDEN),
                        ("ffn_down_exps", HIDDEN, EXPERT_FFN)]:
            out.append(q8(p + n + ".weight", [N_EXPERT, r, c], f.get("exp_span", 0.25)))
        si = f["shared"] * EXPERT_FFN
        for n, r, c in [("ffn_gate_shexp", si, HIDDEN), ("ffn_up_shexp", si, HIDDEN), ("ffn_down_shexp", HIDDEN, si)]:
            out.append(q8(p + n + ".weight", [r, c], f.get("exp_span", 0.25)))
    out.append(vec("output_norm.weight", HIDDEN, 0.6, 1.4))
    out.append(("output.weight", [VOCAB, HIDDEN], "Q8_0", q8_head("output.weight", VOCAB, HIDDEN, 0.5)))
    return out


def write(path, fam):
    f = FAMILIES[fam]
    w = gguf.GGUFWriter(str(path), "deepseek2")
    w.add_name(f"deepseek2 golden {fam}")
    w.add_block_count(LAYERS)
    w.add_context_length(CTX)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_layer_norm_rms_eps(EPS)
    w.add_leading_dense_block_count(f["dense_lead"])
    w.add_vocab_size(VOCAB)
    w.add_q_lora_rank(Q_LORA if f["q_lora"] else 0)
    w.add_kv_lora_rank(KV_LORA)
    if f["split_kv_b"]:
        # As `conversion/deepseek.py` writes an MLA file: the absorbed widths, then the heads'.
        w.add_head_count_kv(1)
        w.add_key_length(KV_LORA + ROPE)
        w.add_value_length(KV_LORA)
        w.add_key_length_mla(NOPE + ROPE)
        w.add_value_length_mla(V_DIM)
    else:
        w.add_head_count_kv(HEADS)
        w.add_key_length(NOPE + ROPE)
        w.add_value_length(V_DIM)
    w.add_expert_feed_forward_length(EXPERT_FFN)
    w.add_expert_count(N_EXPERT)
    w.add_expert_shared_count(f["shared"])
    w.add_expert_used_count(TOP_K)
    w.add_expert_weights_scale(f["scale"])
    w.add_expert_weights_norm(f["norm"])
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if f["scoring"] == "sigmoid"
                             else gguf.ExpertGatingFuncType.SOFTMAX)
    if f["groups"]:
        w.add_expert_group_count(f["groups"][0])
        w.add_expert_group_used_count(f["groups"][1])
    w.add_rope_dimension_count(ROPE)
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(YARN[0])
    w.add_rope_scaling_orig_ctx_len(YARN[1])
    w.add_rope_scaling_yarn_log_mul(0.1 * f["mscale_all_dim"])
    return finish(w, tensors(fam))


def exact_forward(fam, ids):
    """HF DeepSeek-V2/V3 in float64 over the same dequantized weights (see the module docs)."""
    f = FAMILIES[fam]
    w = dequantized(tensors(fam))
    rms = lambda x, g: x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * g
    silu = lambda g: g / (1 + np.exp(-g))
    T = len(ids)
    # YaRN (DeepseekV2YarnRotaryEmbedding): the ramp between the correction dimensions of 32 and
    # 1 rotations in the original context; cosines unscaled, the scores by mscale².
    factor, orig = YARN
    inv = ROPE_BASE ** (-np.arange(0, ROPE, 2, dtype=np.float64) / ROPE)
    dim_of = lambda rot: ROPE * np.log(orig / (rot * 2 * np.pi)) / (2 * np.log(ROPE_BASE))
    low, high = max(np.floor(dim_of(32)), 0), min(np.ceil(dim_of(1)), ROPE - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(ROPE // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    inv = inv / factor * ramp + inv * (1 - ramp)
    mscale = 0.1 * f["mscale_all_dim"] * np.log(factor) + 1
    scale = (NOPE + ROPE) ** -0.5 * mscale * mscale
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(ang), np.sin(ang)

    def rope(x):
        # Adjacent pairs (2i, 2i + 1) turn by frequency i; x is [T, ..., ROPE].
        c = cos.reshape((T,) + (1,) * (x.ndim - 2) + (ROPE // 2,))
        s = sin.reshape(c.shape)
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = a * c - b * s, b * c + a * s
        return out

    x = w["token_embd.weight"][ids]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(LAYERS):
        p = f"blk.{l}."
        h = rms(x, w[p + "attn_norm.weight"])
        if f["q_lora"]:
            q = rms(h @ w[p + "attn_q_a.weight"].T, w[p + "attn_q_a_norm.weight"]) @ w[p + "attn_q_b.weight"].T
        else:
            q = h @ w[p + "attn_q.weight"].T
        q = q.reshape(T, HEADS, NOPE + ROPE)
        q_nope, q_pe = q[..., :NOPE], rope(q[..., NOPE:])
        kv = h @ w[p + "attn_kv_a_mqa.weight"].T
        c, k_pe = rms(kv[:, :KV_LORA], w[p + "attn_kv_a_norm.weight"]), rope(kv[:, KV_LORA:])
        o = np.empty((T, HEADS, V_DIM))
        for hh in range(HEADS):
            if f["split_kv_b"]:
                w_uk, w_uv = w[p + "attn_k_b.weight"][hh].T, w[p + "attn_v_b.weight"][hh]
            else:
                rows = w[p + "attn_kv_b.weight"][hh * (NOPE + V_DIM):(hh + 1) * (NOPE + V_DIM)]
                w_uk, w_uv = rows[:NOPE], rows[NOPE:]
            k_nope, v = c @ w_uk.T, c @ w_uv.T
            sc = (q_nope[:, hh] @ k_nope.T + q_pe[:, hh] @ k_pe.T) * scale + mask
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            o[:, hh] = (sc / sc.sum(-1, keepdims=True)) @ v
        x = x + o.reshape(T, -1) @ w[p + "attn_output.weight"].T
        h = rms(x, w[p + "ffn_norm.weight"])
        if l < f["dense_lead"]:
            x = x + (silu(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
            continue
        probs = router_scores(h @ w[p + "ffn_gate_inp.weight"].T, f["scoring"])
        sel = probs + (w[p + "exp_probs_b.bias"] if f["probs_bias"] else 0.0)
        y = np.zeros_like(h)
        gexp, uexp, dexp = (w[p + n + ".weight"] for n in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"))
        for t in range(T):
            key = sel[t].copy()
            if f["groups"]:
                # Groups ranked by the sum of their two best selection keys; the rest masked.
                n_group, keep = f["groups"]
                g = key.reshape(n_group, -1)
                gscore = np.sort(g, axis=-1)[:, -2:].sum(-1)
                kept = np.argsort(-gscore, kind="stable")[:keep]
                allowed = np.zeros(n_group, dtype=bool)
                allowed[kept] = True
                key = np.where(np.repeat(allowed, N_EXPERT // n_group), key, -np.inf)
            top = np.argsort(-key, kind="stable")[:TOP_K]
            wt = probs[t, top]
            if f["norm"]:
                wt = wt / wt.sum()
            wt = wt * f["scale"]
            for e_, we in zip(top, wt):
                y[t] += we * ((silu(gexp[e_] @ h[t]) * (uexp[e_] @ h[t])) @ dexp[e_].T)
        y += (silu(h @ w[p + "ffn_gate_shexp.weight"].T) * (h @ w[p + "ffn_up_shexp.weight"].T)) \
            @ w[p + "ffn_down_shexp.weight"].T
        x = x + y
    return rms(x, w["output_norm.weight"]) @ w["output.weight"].T


if __name__ == "__main__":
    run(__doc__, FAMILIES, write, exact_forward, "scripts/goldens/deepseek2_golden.py")
