#!/usr/bin/env bash
# `make demo`: prepares the fortunes corpus once, then trains the debugmodel-shaped Llama on
# it in one process and prints a text sample (the pipeline issue will move this to `ctitan launch`).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin/ctitan
[ -f data/fortunes/train.bin ] || "$bin" prep --out data/fortunes
exec "$bin" train --data data/fortunes --model debugmodel --steps "${DEMO_STEPS:-300}" --batch 8 --seq 256 --lr 2e-3 "$@"
