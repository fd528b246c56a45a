#!/usr/bin/env bash
# Where a GPU job's step goes, per operation: runs `ctitan launch manifests/demo.toml` with
# the given overrides on the GPU, every GPU process of it under the CUPTI injection library
# (build/lib/libctitan_gpuprof.so, tools/gpuprof/inject.c: each kernel, copy and memset the
# device ran for it), and prints markdown: each operation's share of the steady window (the
# first SKIP_MS milliseconds of each process are warm-up and left out), its time and launches
# per step (the window divided by the median step_time_ms of the metrics), and the time the
# device ran nothing for the process (idle). Then the 15 costliest kernels by name.
#
#   bash tools/gpu_breakdown.sh LABEL TOKENS STEPS SKIP_MS [launch overrides ...]
#
# TOKENS is a token file (llm.c format). Needs an NVIDIA GPU and a built tree with CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 4 ] || { echo "usage: tools/gpu_breakdown.sh LABEL TOKENS STEPS SKIP_MS [launch overrides ...]" >&2; exit 2; }
label=$1 tokens=$2 steps=$3 skip=$4
shift 4
bin=build/bin/ctitan
lib=$PWD/build/lib/libctitan_gpuprof.so
[ -f "$lib" ] || { echo "gpu_breakdown: $lib is missing (make with CUDA)" >&2; exit 2; }
dir=$(mktemp -d /tmp/ctitan-breakdown-XXXXXX)
trap 'rm -rf "$dir"' EXIT
mkdir "$dir/prof"

if ! CUDA_INJECTION64_PATH=$lib CTITAN_GPUPROF_DIR=$dir/prof CTITAN_GPUPROF_SKIP_MS=$skip \
    "$bin" launch manifests/demo.toml --job.name "breakdown$$" --job.dump_folder "$dir/runs" \
    --job.device cuda --model.tokenizer_path "" --training.steps "$steps" \
    --checkpoint.enable false --validation.enable false --sample.tokens 0 --job.max_restarts 0 \
    --loader.dataset_path "$tokens" --metrics.file "$dir/m.jsonl" "$@" > "$dir/launch.out" 2>&1; then
    echo "### Breakdown: $label: the job failed: $(tail -1 "$dir/launch.out")"
    exit 1
fi
ls "$dir"/prof/gpuprof-*.tsv >/dev/null 2>&1 ||
    { echo "### Breakdown: $label: no process wrote a profile (CUPTI did not load?)"; exit 1; }
step_ms=$(sed -nE 's/.*"step_time_ms": ([0-9.]+).*/\1/p' "$dir/m.jsonl" | tail -n +3 | sort -g |
          awk '{ v[NR] = $1 } END { print NR ? v[int((NR + 1) / 2)] : 0 }')

echo "### Breakdown: $label"
echo
echo "\`tools/gpu_breakdown.sh\` ($steps steps, the first $skip ms of each GPU process left out; median step $step_ms ms)."
echo "One row per operation, summed over the job's GPU processes; share is of the window (processes"
echo "sharing the device can add up to over 100%)."
echo
awk -F'\t' -v step="$step_ms" '
function cat(kind, name,   n) {
    if (kind == "memcpy") return "copy " name
    if (kind == "memset") return "memset"
    n = tolower(name)
    if (n ~ /attn_fwd/) return "attention forward"
    if (n ~ /attn_bwd|attn_delta/) return "attention backward"
    if (n ~ /gemm|nvjet|xmma|cutlass|cublas|gemv|splitk/) return "matrix products (cuBLASLt)"
    if (n ~ /rmsnorm/) return "RMSNorm"
    if (n ~ /swiglu/) return "SwiGLU"
    if (n ~ /rope/) return "RoPE"
    if (n ~ /xent/) return "cross-entropy"
    if (n ~ /embed/) return "embedding"
    if (n ~ /adamw/) return "AdamW"
    if (n ~ /nccl/) return "NCCL"
    if (n ~ /fill/) return "fills"
    return "other kernels"
}
FNR == 1 { win[FILENAME] = $0; sub(/.*window_ns /, "", win[FILENAME]); sub(/ .*/, "", win[FILENAME])
           b = $0; sub(/.*busy_ns /, "", b); sub(/ .*/, "", b); busy[FILENAME] = b
           if (win[FILENAME] + 0 > wmax) wmax = win[FILENAME] + 0; next }
{ c = cat($1, $2); ns[c] += $4; cnt[c] += $3; kn[$1 " " $2] += $4; kc[$1 " " $2] += $3 }
END {
    if (wmax == 0) { print "no records in the window"; exit }
    steps = step > 0 ? wmax / (step * 1e6) : 1
    print "| operation | ms per step | launches per step | share |"
    print "|---|---|---|---|"
    n = 0
    for (c in ns) order[++n] = c
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (ns[order[j]] > ns[order[i]]) { t = order[i]; order[i] = order[j]; order[j] = t }
    for (i = 1; i <= n; i++) { c = order[i]; tot += ns[c]
        printf "| %s | %.3f | %.1f | %.1f%% |\n", c, ns[c] / 1e6 / steps, cnt[c] / steps, 100 * ns[c] / wmax }
    printf "| (all GPU work) | %.3f | | %.1f%% |\n", tot / 1e6 / steps, 100 * tot / wmax
    print ""
    print "| process profile | window s | device busy for it | idle |"
    print "|---|---|---|---|"
    for (f in win) { p = f; sub(/.*gpuprof-/, "", p); sub(/\.tsv/, "", p)
        printf "| pid %s | %.2f | %.1f%% | %.1f%% |\n", p, win[f] / 1e9, 100 * busy[f] / win[f], 100 - 100 * busy[f] / win[f] }
    print ""
    print "| costliest kernels | ms per step | launches per step |"
    print "|---|---|---|"
    m = 0
    for (k in kn) korder[++m] = k
    for (i = 1; i <= m && i <= 15; i++) { for (j = i + 1; j <= m; j++) if (kn[korder[j]] > kn[korder[i]]) { t = korder[i]; korder[i] = korder[j]; korder[j] = t }
        k = korder[i]; name = substr(k, 1, 90)
        printf "| `%s` | %.3f | %.1f |\n", name, kn[k] / 1e6 / steps, kc[k] / steps }
}' "$dir"/prof/gpuprof-*.tsv
echo
