"""A streamed greedy `/v1/completions` request timed from the client (standard library only),
shared by the A/B scripts of scheduling features (`fair_prefill.py`, `priority_mix.py`)."""
import http.client
import json
import time


def stream_completion(port, prompt, max_tokens, priority=None):
    """(seconds to the first token, text) of a streamed greedy completion of `prompt` (a string
    or token ids) on 127.0.0.1:`port`; `priority` goes into the body when given. `logprobs: 0`
    makes every token a frame: a token that is an incomplete UTF-8 sequence has no text yet,
    and timing the first text would count the step after it."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "logprobs": 0}
    if priority is not None:
        body["priority"] = priority
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise SystemExit(f"HTTP {r.status}: {r.read()[:300]!r}")
    ttft, text = None, ""
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: ") or line == b"data: [DONE]":
            continue
        for ch in json.loads(line[6:]).get("choices", []):
            if ch.get("text") or (ch.get("logprobs") or {}).get("tokens"):
                ttft = ttft if ttft is not None else time.perf_counter() - t0
            text += ch.get("text") or ""
    c.close()
    return ttft, text
