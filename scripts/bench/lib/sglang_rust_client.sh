# shellcheck shell=bash
# SGLang 0.5.23's Rust bench client (`sglang-bench`), for scripts that compare sparrow bench
# with it. Sourced; `sglang_rust_client DIR` sets PY (the python3.11 that loads it), SGL_SO
# and SGL_BENCH (a python file in DIR that runs the client: `"$PY" "$SGL_BENCH" FLAGS...`).
# Only the one extension module of the wheel is used: no torch, no rest of SGLang.
SGL_CACHE=${SPARROW_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/sparrow}
SGL_DIR=$SGL_CACHE/sglang
SGL_WHEEL=$SGL_DIR/sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl
SGL_SO_MEMBER=sglang/srt/rust_extensions/_bench.cpython-311-x86_64-linux-gnu.so
SGL_SO=$SGL_DIR/x/$SGL_SO_MEMBER

sglang_rust_client() {
  local dir=$1
  # The wheel is cp311-only, so the interpreter that loads the extension is the one that
  # fetches it. Its real path (not a pyenv shim, which is a shell script) is what gets timed.
  PY=$("${PY:-python3.11}" -c 'import sys; print(sys.executable)')
  if [[ ! -f $SGL_SO ]]; then
    [[ -f $SGL_WHEEL ]] || "$PY" -m pip download --no-deps sglang==0.5.23 -d "$SGL_DIR"
    # The wheel is a zip archive.
    "$PY" - "$SGL_WHEEL" "$SGL_SO_MEMBER" "$SGL_DIR/x" <<'PY'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])
PY
  fi
  # Loaded from the file alone; run_argv parses the argv like its CLI and ends in SystemExit.
  SGL_BENCH=$dir/sglang_bench.py
  cat > "$SGL_BENCH" <<EOF2
import importlib.util, sys
spec = importlib.util.spec_from_file_location("sglang.srt.rust_extensions._bench", "$SGL_SO")
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
m.run_argv(["sglang-bench"] + sys.argv[1:])
EOF2
}
