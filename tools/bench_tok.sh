#!/usr/bin/env bash
# Encoding speed of ctitan's tokenizer.json reader against the `tokenizers` library, one core
# each, same text, same run: `ctitan prep --tokenizer` (its encode time; prep is one thread)
# and Tokenizer.encode with RAYON_NUM_THREADS=1 (the whole text as one string, checked to give
# the very ids of ctitan's train.bin, and as 64 KiB pieces in one encode_batch); the ratio is
# against the library's faster way.
#
# usage: tools/bench_tok.sh [TOKENIZER_JSON] [MB]
#   TOKENIZER_JSON  default build/py/llama3/tokenizer.json (tools/pydeps.sh), MB default 10
# The text: the fortunes files and the Python standard library's sources (prose and code,
# distinct, no repetition) up to MB megabytes, in build/bench_tok/text.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${CTITAN_PY:-build/py}
TOK=${1:-$PY/llama3/tokenizer.json}
MB=${2:-10}
OUT=build/bench_tok
mkdir -p "$OUT"
[ -x build/bin/ctitan ] || make -j2 build/bin/ctitan >/dev/null
"$PY/venv/bin/python" - "$OUT/text.txt" "$MB" <<'PYEOF'
import glob, os, sys
out, limit = sys.argv[1], int(sys.argv[2]) << 20
paths = sorted(p for p in glob.glob("/usr/share/games/fortunes/**/*", recursive=True)
               if os.path.isfile(p) and not os.path.islink(p) and not p.endswith(".dat"))
paths += sorted(glob.glob("/usr/lib/python3*/**/*.py", recursive=True))
total = 0
with open(out, "wb") as f:
    for p in paths:
        b = open(p, "rb").read().decode("utf-8", "replace").encode()
        b = b[:limit - total]
        f.write(b)
        total += len(b)
        if total >= limit:
            break
print("text: %d bytes from %d files" % (total, len(paths)))
PYEOF
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), load $(cut -d' ' -f1-3 /proc/loadavg)"
rm -rf "$OUT/prep"
taskset -c 0 build/bin/ctitan prep --tokenizer "$TOK" --val-fraction 0 --out "$OUT/prep" "$OUT/text.txt" | tee "$OUT/ctitan.log"
RAYON_NUM_THREADS=1 taskset -c 0 "$PY/venv/bin/python" - "$TOK" "$OUT/text.txt" "$OUT/prep/train.bin" <<'PYEOF' | tee "$OUT/tokenizers.log"
import struct, sys, time
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
text = open(sys.argv[2], encoding="utf-8").read()
best = None
for _ in range(2):
    t0 = time.perf_counter()
    ids = tok.encode(text, add_special_tokens=False).ids
    dt = time.perf_counter() - t0
    best = dt if best is None else min(best, dt)
n = len(text.encode())
print("tokenizers: %d tokens, encode %.2f s (best of 2), %.2f MB/s" % (len(ids), best, n / best / 1e6))
raw = open(sys.argv[3], "rb").read()  # ctitan's token file: 32-byte header, then the ids
width = struct.unpack_from("<I", raw, 12)[0]
mine = list(struct.unpack_from("<%d%s" % ((len(raw) - 32) // width, "HI"[width == 4]), raw, 32))
if mine != ids:
    k = next((i for i, (a, b) in enumerate(zip(mine, ids)) if a != b), min(len(mine), len(ids)))
    sys.exit("ids differ from ctitan's at token %d" % k)
print("tokenizers: the same %d ids as ctitan" % len(ids))
# the library is slower on one long string than on pieces: also 64 KiB pieces in one batch
chunks = [text[i:i + 65536] for i in range(0, len(text), 65536)]
t0 = time.perf_counter()
m = sum(len(e.ids) for e in tok.encode_batch(chunks, add_special_tokens=False))
dt = time.perf_counter() - t0
print("tokenizers-batch: %d tokens in %d pieces, encode %.2f s, %.2f MB/s" % (m, len(chunks), dt, n / dt / 1e6))
PYEOF
n_c=$(grep -o '[0-9]* tokens (' "$OUT/ctitan.log" | grep -o '^[0-9]*')
n_t=$(grep -o '[0-9]* tokens,' "$OUT/tokenizers.log" | grep -o '^[0-9]*')
s_c=$(grep -o 'encode [0-9.]*' "$OUT/ctitan.log" | grep -o '[0-9.]*$')
s_t=$(grep -o 'encode [0-9.]*' "$OUT/tokenizers.log" | grep -o '[0-9.]*$' | sort -g | head -1)  # the faster way
bytes=$(stat -c %s "$OUT/text.txt")
[ "$n_c" = "$n_t" ] || { echo "token counts differ: ctitan $n_c, tokenizers $n_t"; exit 1; }
awk -v b="$bytes" -v c="$s_c" -v t="$s_t" 'BEGIN { printf "ctitan %.2f MB/s, tokenizers %.2f MB/s: %.2fx\n", b/c/1e6, b/t/1e6, t/c }'
