#!/usr/bin/env bash
# Prepares, on this (CPU) machine, everything a bare lent GPU machine needs to run
# tools/gpu_check.sh: the build with the real CUDA plugin and the GPU tests (make), the Debian
# runtime libraries the GPU machine lacks (tools/gpu_deps.sh), and a check that what is carried
# fits the device tool's limit. Prints the paths to carry and the command to run there.
#
#   bash tools/gpu_carry.sh [--check-only]
#
# --check-only  builds nothing: only measures what is there against the limit.
# Exit status: 0 ready, 1 something is missing or too large.
set -euo pipefail
cd "$(dirname "$0")/.."

limit=$((64 * 1024 * 1024)) # the device tool's carry limit, all paths together
# What gpu_check.sh runs, and no more (all of build/tests would take ~60 of the 64 MiB).
paths=(build/bin build/lib build/tests/gpu build/tests/test_model build/tests/test_backend .gpu-deps/root
       .gpu-deps/env.sh)

if [ "${1:-}" != --check-only ]; then
    command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
        { echo "gpu_carry: no nvcc: the CUDA plugin and the GPU tests cannot be built here" >&2; exit 1; }
    make -j"$(nproc)" all >/dev/null
    bash tools/gpu_deps.sh >/dev/null
fi
for p in "${paths[@]}"; do
    [ -e "$p" ] || { echo "gpu_carry: $p is missing (run without --check-only)" >&2; exit 1; }
done
[ -f build/lib/libctitan_cuda.so ] || { echo "gpu_carry: build/lib/libctitan_cuda.so is missing" >&2; exit 1; }
ls build/tests/gpu/test_* >/dev/null 2>&1 || { echo "gpu_carry: no GPU tests in build/tests/gpu" >&2; exit 1; }

# The debug sections are a sixth of the carry and useless there: strip them (here too, until the
# next link; `make` relinks what changed).
if [ "${1:-}" != --check-only ]; then
    strip --strip-debug build/bin/* build/tests/gpu/test_* build/tests/test_model build/tests/test_backend \
        build/lib/libctitan_cuda.so build/lib/libctitan_gpuprof.so
fi
# The device tool counts the working tree (tracked and untracked files git does not ignore) with
# the carried paths.
tree=$(git ls-files -z -co --exclude-standard | du -bc --files0-from=- 2>/dev/null | tail -1 | cut -f1)
total=$(( $(du -sbc "${paths[@]}" | tail -1 | cut -f1) + ${tree:-0} ))
awk -v t="$total" -v w="${tree:-0}" -v l=$((limit / 1048576)) -v p="${paths[*]}" \
    'BEGIN { printf "gpu_carry: %s and the working tree (%.1f MiB): %.1f MiB of %d MiB\n", p, w / 1048576, t / 1048576, l }' 
if [ "$total" -gt "$limit" ]; then
    du -sh "${paths[@]}" >&2
    echo "gpu_carry: too large to carry" >&2
    exit 1
fi
printf 'carry: ['
sep=""
for p in "${paths[@]}"; do printf '%s"%s"' "$sep" "$p"; sep=", "; done
printf ']\n'
echo 'command: . .gpu-deps/env.sh && bash tools/gpu_check.sh --export "$OUT" /tmp/gpu-check'
