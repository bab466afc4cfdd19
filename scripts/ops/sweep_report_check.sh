#!/usr/bin/env bash
# Opens a sweep's report.html in a real headless browser and checks that the screenshot shows
# the plots. Runs a small A/B sweep against two `sparrow mock-server`s (no model needed), or
# checks the report of an existing sweep folder given as $1. Installs Debian's chromium if it
# is missing. Leaves the screenshot at <sweep folder>/report.png.
#
#   scripts/ops/sweep_report_check.sh            # make a sweep in a temporary folder, check it
#   scripts/ops/sweep_report_check.sh DIR        # check DIR/report.html
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ $# -ge 1 ]; then
  dir=$(realpath "$1")
else
  cargo build --release -q -p sparrow
  bin=$PWD/target/release/sparrow
  dir=$(mktemp -d)/sweep
  pa=31791; pb=31792
  "$bin" sweep --concurrency 1,4,16 --num-prompts-per-step 32 --backend sglang-oai \
    --tokenizer crates/bench/tests/fixtures/words.tokenizer.json --dataset-name random-ids \
    --random-input-len 6 --random-output-len 8 --random-range-ratio 1 --disable-tqdm \
    --server-cmd "$bin mock-server --listen 127.0.0.1:$pa --chunk-delay-ms 5 --max-running 4" \
    --base-url "http://127.0.0.1:$pa" --label fast \
    --server-cmd "$bin mock-server --listen 127.0.0.1:$pb --chunk-delay-ms 9 --max-running 4" \
    --base-url "http://127.0.0.1:$pb" --label slow \
    --slo-ttft-ms 40 --output-dir "$dir" >/dev/null
fi
[ -f "$dir/report.html" ] || { echo "no report.html in $dir" >&2; exit 1; }

if ! command -v chromium >/dev/null; then
  apt-get update -qq && apt-get install -y -qq chromium >/dev/null
fi
profile=$(mktemp -d)
# Tall enough for the tables above the plots: the steps and the server's series grow a row a
# step.
steps=$(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["steps"]))' "$dir/summary.json")
height=$((2600 + 90 * steps))
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$profile" --hide-scrollbars --window-size=1900,$height \
  --screenshot="$dir/report.png" "file://$dir/report.html" 2>/dev/null
rm -rf "$profile"

# Decode the screenshot (8-bit RGB/RGBA PNG, standard library only) and count the pixels
# drawn in the plots' series colours (A's, B's for an A/B run, the third for a grid): a page
# without its plots has none.
python3 - "$dir/report.png" "$dir/summary.json" <<'PY'
import json, struct, sys, zlib
sides = len(json.load(open(sys.argv[2]))["sides"])
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat, w = 8, b"", 0
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
        assert depth == 8 and ctype in (2, 6), f"unsupported PNG: depth {depth} colour type {ctype}"
        bpp = 3 if ctype == 2 else 4
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
raw, stride = zlib.decompress(idat), w * bpp
prev, rows, i = bytearray(stride), [], 0
for _ in range(h):
    f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride]); i += 1 + stride
    for x in range(stride):
        a = line[x - bpp] if x >= bpp else 0
        b = prev[x]; c = prev[x - bpp] if x >= bpp else 0
        if f == 1: line[x] = (line[x] + a) & 255
        elif f == 2: line[x] = (line[x] + b) & 255
        elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c; pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    rows.append(bytes(line)); prev = line
def count(rgb):
    return sum(1 for r in rows for x in range(0, stride, bpp) if abs(r[x] - rgb[0]) < 8 and abs(r[x + 1] - rgb[1]) < 8 and abs(r[x + 2] - rgb[2]) < 8)
blue, red, green = count((31, 119, 180)), count((214, 39, 40)), count((44, 160, 44))
print(f"screenshot {w}x{h}: {blue} pixels in side A's colour, {red} in side B's, {green} in the third's")
assert blue > 2000 and (sides < 2 or red > 2000), "the plots are not in the screenshot"
assert sides < 3 or green > 1000, "a grid's third series is not in the screenshot"
PY
echo "ok: $dir/report.png"
