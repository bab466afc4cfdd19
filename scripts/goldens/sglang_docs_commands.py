#!/usr/bin/env python3
"""Extract every `sglang.bench_serving` command line from SGLang's benchmark guide.

The guide is `docs/developer_guide/bench_serving.md` in the SGLang repository; the fixture
was made from the copy at commit 0229689b6730cccb5b7f0d4eeef06d7de423b6e1. Each command
(continuation lines joined) becomes one line of the output, its arguments after the module
name. `crates/bench/tests/it/sglang_parity.rs` parses each with sparrow bench.

usage: scripts/goldens/sglang_docs_commands.py BENCH_SERVING_MD [OUT_TXT]
"""
import re
import sys

md = open(sys.argv[1]).read()
out = sys.argv[2] if len(sys.argv) > 2 else "crates/bench/tests/fixtures/sglang_docs_commands.txt"
commands = []
for block in re.findall(r"```bash\n(.*?)```", md, flags=re.S):
    joined = re.sub(r"\\\n\s*", " ", block)
    for line in joined.splitlines():
        m = re.match(r"\s*python3? -m sglang\.bench_serving\s+(.*)", line)
        if m:
            commands.append(" ".join(m.group(1).split()))
with open(out, "w") as fh:
    fh.write("# `python -m sglang.bench_serving` command lines of SGLang's docs/developer_guide/bench_serving.md\n")
    fh.write("# (commit 0229689b), made by scripts/goldens/sglang_docs_commands.py; arguments only.\n")
    for c in commands:
        fh.write(c + "\n")
print(f"{len(commands)} commands -> {out}")
