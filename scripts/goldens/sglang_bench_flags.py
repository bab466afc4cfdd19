#!/usr/bin/env python3
"""Extract SGLang bench_serving's command-line surface into a test fixture.

Reads `sglang/benchmark/serving.py` (from the sglang wheel, e.g. 0.5.23:
`python3 -m pip download --no-deps sglang==0.5.23`, then pass the .whl or the extracted
file) with Python's `ast`, without importing it, and writes every `add_argument` flag with
how it takes values, plus the `--dataset-name` choices and the backend names
(`ASYNC_REQUEST_FUNCS` keys). `crates/bench/tests/it/sglang_parity.rs` checks that sparrow
bench handles or refuses by name each one.

usage: scripts/goldens/sglang_bench_flags.py SGLANG_WHEEL_OR_SERVING_PY [OUT_JSON]
"""
import ast
import json
import sys
import zipfile

src_path = sys.argv[1]
out = sys.argv[2] if len(sys.argv) > 2 else "crates/bench/tests/fixtures/sglang_bench_flags.json"
if src_path.endswith(".whl"):
    with zipfile.ZipFile(src_path) as z:
        src = z.read("sglang/benchmark/serving.py").decode()
        version = next(
            (n.split("-")[1].removesuffix(".dist") for n in z.namelist() if n.endswith(".dist-info/METADATA")),
            "unknown",
        )
else:
    src = open(src_path).read()
    version = "unknown"

tree = ast.parse(src)
flags = []
for node in ast.walk(tree):
    if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
        name = node.args[0].value
        kw = {k.arg: k.value for k in node.keywords}
        action = ast.literal_eval(kw["action"]) if "action" in kw and isinstance(kw["action"], ast.Constant) else None
        nargs = ast.literal_eval(kw["nargs"]) if "nargs" in kw else None
        choices = None
        if "choices" in kw:
            try:
                choices = ast.literal_eval(kw["choices"])
            except ValueError:
                choices = None  # computed (backend keys), listed separately below
        typ = ast.unparse(kw["type"]) if "type" in kw else None
        takes = "none" if action in ("store_true", "store_false") else ("many" if nargs in ("+", "*") else "one")
        flags.append({"flag": name, "takes": takes, "type": typ, "choices": choices, "line": node.lineno})

backends = []
datasets = []
for node in ast.walk(tree):
    if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "ASYNC_REQUEST_FUNCS" for t in node.targets):
        backends = [k.value for k in node.value.keys]
for f in flags:
    if f["flag"] == "--dataset-name":
        datasets = f["choices"]

doc = {
    "source": f"sglang {version} sglang/benchmark/serving.py",
    "flags": sorted(flags, key=lambda f: f["line"]),
    "backends": backends,
    "datasets": datasets,
}
with open(out, "w") as fh:
    # One flag per line, so a diff between SGLang versions reads flag by flag.
    fh.write("{\n")
    fh.write(f' "source": {json.dumps(doc["source"])},\n')
    fh.write(f' "backends": {json.dumps(backends)},\n')
    fh.write(f' "datasets": {json.dumps(datasets)},\n')
    fh.write(' "flags": [\n')
    fh.write(",\n".join("  " + json.dumps(f) for f in doc["flags"]))
    fh.write("\n ]\n}\n")
print(f"{len(flags)} flags, {len(backends)} backends, {len(datasets)} datasets -> {out}")
