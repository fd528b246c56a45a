#!/usr/bin/env bash
# `make demo`: prepares the fortunes corpus once, then trains the debugmodel-shaped Llama on it
# with `ctitan launch manifests/demo.toml` (loader, 2 pipeline stages with 1F1B, 2 optimizer
# shards, each its own process) and prints a validation loss and a text sample.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin/ctitan
[ -f data/fortunes/train.bin ] || "$bin" prep --out data/fortunes
exec "$bin" launch manifests/demo.toml "$@"
