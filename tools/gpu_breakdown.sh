#!/usr/bin/env bash
# Where a GPU job's step goes, per operation: runs a job on the GPU with every GPU process of
# it under the CUPTI injection library (build/lib/libctitan_gpuprof.so, tools/gpuprof/inject.c:
# each kernel, copy and memset the device ran for it) and prints markdown: each operation's
# share of the steady window (the last LAST_MS milliseconds of each process: the final steps,
# not the set-up), its time and launches per step (the window over the median step time), and
# the time the device ran nothing for each process (idle). Then the 15 costliest kernels.
#
#   bash tools/gpu_breakdown.sh LABEL LAST_MS ctitan TOKENS STEPS [launch overrides ...]
#   bash tools/gpu_breakdown.sh LABEL LAST_MS torch [tools/torch_llama.py bench arguments ...]
#
# ctitan: `ctitan launch manifests/demo.toml` on cuda with the overrides, TOKENS a token file
# (llm.c format), the step time the median step_time_ms of its metrics. torch: the PyTorch
# reference (torch.compile) on the same shape, for a side-by-side table; its step time is the
# one it prints. CTITAN_BREAKDOWN_KEEP=DIR keeps the per-process tables there.
# CTITAN_BREAKDOWN_MPS=1 runs the job under NVIDIA's Multi-Process Service (a private daemon,
# `nvidia-cuda-mps-control -d`, pipe and log folders of its own, stopped afterwards): without
# it the job's processes on one GPU are time-sliced, never running kernels at the same time.
# Needs an NVIDIA GPU and a built tree with CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: tools/gpu_breakdown.sh LABEL LAST_MS {ctitan TOKENS STEPS | torch} [arguments ...]"
[ $# -ge 3 ] || { echo "$usage" >&2; exit 2; }
label=$1 last=$2 what=$3
shift 3
bin=build/bin/ctitan
lib=$PWD/build/lib/libctitan_gpuprof.so
[ -f "$lib" ] || { echo "gpu_breakdown: $lib is missing (make with CUDA)" >&2; exit 2; }
dir=$(mktemp -d /tmp/ctitan-breakdown-XXXXXX)
trap 'rm -rf "$dir"' EXIT
mkdir "$dir/prof"
mps=""
if [ "${CTITAN_BREAKDOWN_MPS:-0}" = 1 ]; then
    mkdir "$dir/mps-pipe" "$dir/mps-log"
    export CUDA_MPS_PIPE_DIRECTORY=$dir/mps-pipe CUDA_MPS_LOG_DIRECTORY=$dir/mps-log
    nvidia-cuda-mps-control -d || { echo "### Breakdown: $label: nvidia-cuda-mps-control -d failed"; exit 1; }
    trap 'echo quit | nvidia-cuda-mps-control >/dev/null 2>&1; sleep 1; rm -rf "$dir"' EXIT
    mps=", under MPS"
fi
prof=(env CUDA_INJECTION64_PATH="$lib" CTITAN_GPUPROF_DIR="$dir/prof" CTITAN_GPUPROF_LAST_MS="$last")

case $what in
ctitan)
    [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
    tokens=$1 steps=$2
    shift 2
    what="ctitan, $steps steps"
    if ! "${prof[@]}" "$bin" launch manifests/demo.toml --job.name "breakdown$$" --job.dump_folder "$dir/runs" \
        --job.device cuda --model.tokenizer_path "" --training.steps "$steps" \
        --checkpoint.enable false --validation.enable false --sample.tokens 0 --job.max_restarts 0 \
        --loader.dataset_path "$tokens" --metrics.file "$dir/m.jsonl" "$@" > "$dir/out" 2>&1; then
        echo "### Breakdown: $label: the job failed: $(tail -1 "$dir/out")"
        exit 1
    fi
    median() { sed -nE "s/.*\"$1\": ([0-9.]+).*/\\1/p" "$dir/m.jsonl" | tail -n +3 | sort -g |
               awk '{ v[NR] = $1 } END { print NR ? v[int((NR + 1) / 2)] : 0 }'; }
    step_ms=$(median step_time_ms)
    what="$what, median MFU $(median mfu) ($(grep -a -m1 -E '^launch: (MFU against|no GPU peak)' "$dir/out" |
                                              sed 's/^launch: //'))" ;;
torch)
    what="PyTorch (tools/torch_llama.py bench)"
    if ! "${prof[@]}" python3 tools/torch_llama.py bench "$@" > "$dir/out" 2>"$dir/err"; then
        echo "### Breakdown: $label: tools/torch_llama.py failed: $(tail -1 "$dir/err")"
        exit 1
    fi
    step_ms=$(sed -nE 's/.*"step_ms": ([0-9.]+).*/\1/p' "$dir/out") ;;
*) echo "$usage" >&2; exit 2 ;;
esac
ls "$dir"/prof/gpuprof-*.tsv >/dev/null 2>&1 ||
    { echo "### Breakdown: $label: no process wrote a profile (CUPTI did not load?)"; exit 1; }
[ -z "${CTITAN_BREAKDOWN_KEEP:-}" ] || { mkdir -p "$CTITAN_BREAKDOWN_KEEP" && cp "$dir"/prof/*.tsv "$CTITAN_BREAKDOWN_KEEP"/; }

echo "### Breakdown: $label"
echo
echo "\`tools/gpu_breakdown.sh\` ($what$mps; the last $last ms of each GPU process; median step $step_ms ms)."
echo "One row per operation, summed over the job's GPU processes; share is of the window (processes"
echo "sharing the device can add up to over 100%)."
echo
awk -F'\t' -v step="$step_ms" '
function cat(kind, name,   n) {
    if (kind == "memcpy") return "copy " name
    if (kind == "memset") return "memset"
    n = tolower(name)
    if (n ~ /attn_bwd|attn_delta/) return "attention backward"
    if (n ~ /attn_fwd/) return "attention forward"
    if (n ~ /flash|fmha|sdpa|cudnn.*attn/) return (n ~ /bwd|backward|dgrad|dot_do|convert_dq/) ? "attention backward" : "attention forward"
    if (n ~ /^triton/) return "Triton (torch.compile fused)"
    if (n ~ /adam|multi_tensor/) return "AdamW"
    if (n ~ /gemm|nvjet|xmma|cutlass|cublas|gemv|splitk/) return "matrix products (cuBLASLt)"
    if (n ~ /rmsnorm/) return "RMSNorm"
    if (n ~ /swiglu/) return "SwiGLU"
    if (n ~ /rope/) return "RoPE"
    if (n ~ /xent/) return "cross-entropy"
    if (n ~ /embed/) return "embedding"
    if (n ~ /nccl/) return "NCCL"
    if (n ~ /fill/) return "fills"
    return "other kernels"
}
FNR == 1 { win[FILENAME] = $0; sub(/.*window_ns /, "", win[FILENAME]); sub(/ .*/, "", win[FILENAME])
           b = $0; sub(/.*busy_ns /, "", b); sub(/ .*/, "", b); busy[FILENAME] = b
           if (win[FILENAME] + 0 > wmax) wmax = win[FILENAME] + 0; next }
{ c = cat($1, $2); ns[c] += $4; pns[FILENAME, c] += $4; cnt[c] += $3; kn[$1 " " $2] += $4; kc[$1 " " $2] += $3 }
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
    print "| process | window s | device busy for it | idle | its three largest operations (ms per step) |"
    print "|---|---|---|---|---|"
    for (f in win) { p = f; sub(/.*gpuprof-/, "", p); sub(/\.tsv/, "", p)
        top = ""
        for (k = 0; k < 3; k++) { best = ""; bv = -1
            for (c in ns) if (!((f, c) in used) && ((f, c) in pns) && pns[f, c] > bv) { bv = pns[f, c]; best = c }
            if (best == "") break
            used[f, best] = 1; top = top (k ? ", " : "") sprintf("%s %.3f", best, bv / 1e6 / steps) }
        printf "| pid %s | %.2f | %.1f%% | %.1f%% | %s |\n", p, win[f] / 1e9, 100 * busy[f] / win[f], 100 - 100 * busy[f] / win[f], top }
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
