#!/usr/bin/env python3
"""A synthetic BERT cross-encoder (`BertForSequenceClassification`, one label) and its pair scores
in exact f64, for the server's `/v1/score` and `/v1/rerank` golden.

What it produces, in `crates/server/tests/fixtures/bert_cross_encoder/`:
  - `config.json`, `model.safetensors` (F16, ~70 KB), `tokenizer.json`: a 2-layer BERT
    (hidden 32, 4 heads, FFN 64, 64 positions, 2 token types) under HF's names (`bert.` prefix,
    `bert.pooler.dense`, `classifier`), its WordPiece vocabulary the 5 specials, the 26 letters
    and their `##` forms and 300 frequent words of the pair texts, so every text tokenizes;
  - `golden.json`: pairs (query, document), each pair's token ids (`[CLS] a [SEP] b [SEP]`, by
    the HF `tokenizers` library over that tokenizer.json), the classifier logit computed here in
    float64 numpy from the F16 weights (HF `modeling_bert.py`: post-LayerNorm layers, exact-erf
    GELU, `pooler = tanh(W·h_CLS + b)`, `classifier`), the score `sigmoid(logit)`, and the score a
    broken copy gives (every segment id 0), so the test can show it tells them apart.

Weights are sharp enough that mistakes show: Q/K N(0, 0.35) (peaked attention), other matrices
N(0, 0.15), biases N(0, 0.1), LayerNorm gains 1 + N(0, 0.2), position and type embeddings
N(0, 0.5).

Run (numpy, safetensors and tokenizers; e.g. the venv of minilm_embeddings.py):
    python scripts/goldens/bert_cross_encoder.py
"""
import json
import os
from math import erf, sqrt

import numpy as np

OUT = os.path.join(os.path.dirname(__file__), "../../crates/server/tests/fixtures/bert_cross_encoder")
H, HEADS, FFN, LAYERS, POS, TYPES = 32, 4, 64, 2, 64, 2
QUERIES = [
    "what is the capital of france",
    "how do i sort a list in python",
    "why is the sky blue",
    "best way to learn rust",
]
DOCS = [
    "paris is the capital and largest city of france",
    "use the sorted function or the list sort method in python",
    "rayleigh scattering makes the sky look blue",
    "read the rust book and write small programs every day",
    "the quick brown fox jumps over the lazy dog",
    "bananas are rich in potassium",
]


def vocab():
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    words = []
    for t in QUERIES + DOCS:
        for w in t.split():
            if w not in words and len(w) > 1:
                words.append(w)
    v = specials + letters + ["##" + c for c in letters] + words[:300]
    return {t: i for i, t in enumerate(v)}


def tokenizer_json(v):
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": v[s], "content": s, "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
            for s in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        ],
        "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                       "strip_accents": None, "lowercase": True},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
            "special_tokens": {
                "[CLS]": {"id": "[CLS]", "ids": [v["[CLS]"]], "tokens": ["[CLS]"]},
                "[SEP]": {"id": "[SEP]", "ids": [v["[SEP]"]], "tokens": ["[SEP]"]},
            },
        },
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": v},
    }


def weights(rng, nv):
    f16 = lambda a: a.astype(np.float16)
    w = {}
    w["bert.embeddings.word_embeddings.weight"] = f16(rng.normal(0, 0.5, (nv, H)))
    w["bert.embeddings.position_embeddings.weight"] = f16(rng.normal(0, 0.5, (POS, H)))
    w["bert.embeddings.token_type_embeddings.weight"] = f16(rng.normal(0, 0.5, (TYPES, H)))
    ln = lambda p: (w.__setitem__(p + ".weight", f16(1 + rng.normal(0, 0.2, H))),
                    w.__setitem__(p + ".bias", f16(rng.normal(0, 0.1, H))))
    lin = lambda p, o, i, s: (w.__setitem__(p + ".weight", f16(rng.normal(0, s, (o, i)))),
                              w.__setitem__(p + ".bias", f16(rng.normal(0, 0.1, o))))
    ln("bert.embeddings.LayerNorm")
    for l in range(LAYERS):
        p = f"bert.encoder.layer.{l}"
        lin(p + ".attention.self.query", H, H, 0.35)
        lin(p + ".attention.self.key", H, H, 0.35)
        lin(p + ".attention.self.value", H, H, 0.15)
        lin(p + ".attention.output.dense", H, H, 0.15)
        ln(p + ".attention.output.LayerNorm")
        lin(p + ".intermediate.dense", FFN, H, 0.15)
        lin(p + ".output.dense", H, FFN, 0.15)
        ln(p + ".output.LayerNorm")
    lin("bert.pooler.dense", H, H, 0.15)
    lin("classifier", 1, H, 0.3)
    return w


def forward(w, ids, types):
    g = lambda k: w[k].astype(np.float64)
    def layer_norm(x, p):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / np.sqrt(v + 1e-12) * g(p + ".weight") + g(p + ".bias")
    lin = lambda x, p: x @ g(p + ".weight").T + g(p + ".bias")
    n = len(ids)
    x = g("bert.embeddings.word_embeddings.weight")[ids] + g("bert.embeddings.position_embeddings.weight")[:n] \
        + g("bert.embeddings.token_type_embeddings.weight")[types]
    x = layer_norm(x, "bert.embeddings.LayerNorm")
    hd = H // HEADS
    gelu = np.vectorize(lambda z: 0.5 * z * (1 + erf(z / sqrt(2))))
    for l in range(LAYERS):
        p = f"bert.encoder.layer.{l}"
        q, k, v = (lin(x, p + ".attention.self." + s) for s in ("query", "key", "value"))
        out = np.zeros_like(x)
        for h in range(HEADS):
            sl = slice(h * hd, (h + 1) * hd)
            s = q[:, sl] @ k[:, sl].T / sqrt(hd)
            s = np.exp(s - s.max(-1, keepdims=True))
            out[:, sl] = (s / s.sum(-1, keepdims=True)) @ v[:, sl]
        x = layer_norm(x + lin(out, p + ".attention.output.dense"), p + ".attention.output.LayerNorm")
        x = layer_norm(x + lin(gelu(lin(x, p + ".intermediate.dense")), p + ".output.dense"), p + ".output.LayerNorm")
    pooled = np.tanh(lin(x[0:1], "bert.pooler.dense"))
    return float(lin(pooled, "classifier")[0, 0])


def main():
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer

    os.makedirs(OUT, exist_ok=True)
    v = vocab()
    tj = tokenizer_json(v)
    with open(os.path.join(OUT, "tokenizer.json"), "w") as f:
        json.dump(tj, f)
    config = {
        "architectures": ["BertForSequenceClassification"], "model_type": "bert", "hidden_act": "gelu",
        "hidden_size": H, "num_attention_heads": HEADS, "num_hidden_layers": LAYERS, "intermediate_size": FFN,
        "max_position_embeddings": POS, "type_vocab_size": TYPES, "vocab_size": len(v), "layer_norm_eps": 1e-12,
        "position_embedding_type": "absolute", "id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0},
    }
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    rng = np.random.default_rng(20261206)
    w = weights(rng, len(v))
    save_file(w, os.path.join(OUT, "model.safetensors"))
    tok = Tokenizer.from_file(os.path.join(OUT, "tokenizer.json"))
    pairs = []
    for q in QUERIES:
        for d in DOCS:
            e = tok.encode(q, d)
            logit = forward(w, e.ids, e.type_ids)
            broken = forward(w, e.ids, [0] * len(e.ids))
            sig = lambda z: 1 / (1 + np.exp(-z))
            pairs.append({"query": q, "document": d, "input_ids": e.ids, "type_ids": e.type_ids,
                          "logit": logit, "score": float(sig(logit)), "score_all_type_0": float(sig(broken))})
    with open(os.path.join(OUT, "golden.json"), "w") as f:
        json.dump({"reference": "numpy float64 of HF BertForSequenceClassification's forward over the F16 weights",
                   "pairs": pairs}, f, indent=1)
    print(f"wrote {OUT}: {len(pairs)} pairs, vocab {len(v)}")


if __name__ == "__main__":
    main()
