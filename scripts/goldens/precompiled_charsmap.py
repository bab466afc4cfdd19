#!/usr/bin/env python3
"""A real SentencePiece `precompiled_charsmap` and what SentencePiece makes of text through it,
for `crates/tokenizer/tests/it/hf_json.rs`.

    python3 scripts/goldens/precompiled_charsmap.py \\
        --out crates/tokenizer/tests/fixtures/precompiled_charsmap.json

A `tokenizer.json` whose normalizer is `Precompiled` (T5, XLM-R, mBART, ALBERT: every
SentencePiece model HF converts) carries SentencePiece's compiled normalization rules, a
darts-clone double-array trie and the replacement strings, as base64. The full `nmt_nfkc` map
is ~240 kB, so this script builds a small one the same way: `spm_train` with a custom
`normalization_rule_tsv` (a few NFKC-like rules, one with a two-code-point source), in a venv
of its own with `sentencepiece` from PyPI. The map is read out of the model's protobuf
(`ModelProto.normalizer_spec` = field 3, `NormalizerSpec.precompiled_charsmap` = field 2) and
each case is normalized by `SentencePieceNormalizer` over the model with its other
normalization switched off (no dummy prefix, no whitespace folding or escaping), so the
golden is the charsmap's mapping alone.
"""
import argparse
import base64
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SENTENCEPIECE = "sentencepiece==0.2.1"

# (source code points, replacement code points).
RULES = [
    ([0xFB01], [0x66, 0x69]),  # LATIN SMALL LIGATURE FI -> "fi"
    ([0xFF21], [0x41]),  # FULLWIDTH A -> "A"
    ([0xFF41], [0x61]),  # FULLWIDTH a -> "a"
    ([0x2460], [0x31]),  # CIRCLED DIGIT ONE -> "1"
    ([0x3000], [0x20]),  # IDEOGRAPHIC SPACE -> " "
    ([0x00C5], [0x41, 0x030A]),  # A WITH RING -> A + COMBINING RING
    ([0x212B], [0x41, 0x030A]),  # ANGSTROM SIGN -> A + COMBINING RING
]

CASES = [
    "ﬁne ﬁsh",
    "ＡａＡ①",
    "a\u3000b",
    "Å and Å",
    "plain text, untouched",
    "mixed ﬁ① Ａ end",
]


def varint(b, i):
    n, shift = 0, 0
    while True:
        x = b[i]
        i += 1
        n |= (x & 0x7F) << shift
        shift += 7
        if x < 0x80:
            return n, i


def field(b, number):
    """The first length-delimited field `number` of a serialized protobuf message."""
    i = 0
    while i < len(b):
        key, i = varint(b, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            _, i = varint(b, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            n, i = varint(b, i)
            if num == number:
                return b[i : i + n]
            i += n
        else:
            raise ValueError(f"wire type {wire}")
    raise KeyError(number)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--venv", default=str(Path.home() / ".cache" / "sparrow" / "venvs" / "sentencepiece"))
    args = ap.parse_args()
    py = Path(args.venv) / "bin" / "python"
    if os.environ.get("SPARROW_GOLDEN_INNER") != "1":
        if not py.exists():
            subprocess.run([sys.executable, "-m", "venv", args.venv], check=True)
            subprocess.run([str(py), "-m", "pip", "install", "-q", SENTENCEPIECE], check=True)
        env = dict(os.environ, SPARROW_GOLDEN_INNER="1")
        sys.exit(subprocess.run([str(py), __file__, "--out", args.out, "--venv", args.venv], env=env).returncode)

    import sentencepiece as spm

    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        tsv = d / "rules.tsv"
        tsv.write_text(
            "".join(
                " ".join(f"{c:X}" for c in src) + "\t" + " ".join(f"{c:X}" for c in dst) + "\n" for src, dst in RULES
            )
        )
        corpus = d / "corpus.txt"
        corpus.write_text("\n".join(CASES * 20 + ["the quick brown fox jumps over the lazy dog"] * 20) + "\n")
        spm.SentencePieceTrainer.train(
            input=str(corpus),
            model_prefix=str(d / "m"),
            model_type="unigram",
            vocab_size=40,
            hard_vocab_limit=False,
            normalization_rule_tsv=str(tsv),
            minloglevel=2,
        )
        model = (d / "m.model").read_bytes()
        # Training insists on escaping whitespace; the normalizer is loaded from the same model
        # with every switch but the charsmap off.
        sp = spm.SentencePieceNormalizer(
            model_file=str(d / "m.model"), add_dummy_prefix=False, escape_whitespaces=False, remove_extra_whitespaces=False
        )
        charsmap = field(field(model, 3), 2)
        cases = [[c, sp.normalize(c)] for c in CASES]
    Path(args.out).write_text(
        json.dumps(
            {
                "source": f"{SENTENCEPIECE}: spm_train normalization_rule_tsv, SentencePieceNormalizer.normalize",
                "rules": [[s, t] for s, t in RULES],
                "precompiled_charsmap": base64.b64encode(charsmap).decode(),
                "cases": cases,
            },
            indent=1,
            ensure_ascii=False,
        )
        + "\n"
    )
    print(f"{args.out}: charsmap {len(charsmap)} bytes, {len(cases)} cases")
    for c in cases:
        print(" ", json.dumps(c, ensure_ascii=False))


if __name__ == "__main__":
    main()
