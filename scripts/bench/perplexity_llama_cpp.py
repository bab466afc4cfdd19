#!/usr/bin/env python3
"""llama.cpp's perplexity on the replies `sparrow perplexity` scores, for a side-by-side figure.

The same selection and tokens as `sparrow perplexity` (crates/sparrow/src/offline.rs): ShareGPT
records parsed element by element until the first that fails, the second message of each
conversation with at least two, tokenized with special-token text parsed and the model's BOS
when it asks for one (add_bos_token), cut to --max-tokens, kept if at least 2 tokens, the first
--num-samples; each reply evaluated alone from position 0 with llama-cpp-python's low-level
eval (one batch), NLL of every token after the first. Prints the same JSON fields.

    python scripts/bench/perplexity_llama_cpp.py --gguf PATH --sharegpt PATH [--num-samples 200]
Needs llama-cpp-python: ../shared/peers/setup.sh downloads its sdist (build it into a venv as
scripts/goldens/k_quant_golden.py's header says).
"""
import argparse, json, math, os
import numpy as np
from llama_cpp import Llama

ap = argparse.ArgumentParser()
ap.add_argument("--gguf", required=True)
ap.add_argument("--sharegpt", required=True)
ap.add_argument("--num-samples", type=int, default=200)
ap.add_argument("--max-tokens", type=int, default=256)
ap.add_argument("--threads", type=int, default=2)
a = ap.parse_args()

llm = Llama(model_path=os.path.expanduser(a.gguf), n_ctx=a.max_tokens + 8, n_batch=512, logits_all=True,
            n_threads=a.threads, seed=0, verbose=False)
add_bos = str(llm.metadata.get("tokenizer.ggml.add_bos_token", "false")).lower() == "true"
data = open(os.path.expanduser(a.sharegpt), encoding="utf-8").read()
dec = json.JSONDecoder()
pos = data.index("[") + 1
nll, count, seqs = 0.0, 0, 0
while seqs < a.num_samples:
    while pos < len(data) and data[pos] in " \t\r\n,":
        pos += 1
    if pos >= len(data) or data[pos] == "]":
        break
    try:
        rec, pos = dec.raw_decode(data, pos)
    except json.JSONDecodeError:
        break
    conv = rec.get("conversations") or []
    if len(conv) < 2:
        continue
    ids = llm.tokenize(conv[1]["value"].encode("utf-8"), add_bos=add_bos, special=True)[: a.max_tokens]
    if len(ids) < 2:
        continue
    llm.reset()
    llm.eval(ids)
    logits = np.array(llm.scores[: len(ids)], dtype=np.float64)
    m = logits.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[:, 0]
    nll += float(sum(lse[i] - logits[i, ids[i + 1]] for i in range(len(ids) - 1)))
    count += len(ids) - 1
    seqs += 1
print(json.dumps({"model_path": a.gguf, "replies": seqs, "tokens_scored": count, "mean_nll": nll / count,
                  "perplexity": math.exp(nll / count), "reference": "llama-cpp-python"}))
