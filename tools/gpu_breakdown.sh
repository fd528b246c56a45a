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
# Then where the stage waits: what the device ran, in the same window for every process, while
# a stage process had nothing on it (tools/gpuprof/waits.sh, from every process's trace).
# With `--job.mps on` among the overrides the job runs under NVIDIA's Multi-Process Service (the
# launch's private daemon): without it the job's processes on one GPU are time-sliced, never
# running kernels at the same time.
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
case " $* " in *" --job.mps on "*) mps=", under MPS" ;; esac
prof=(env CUDA_INJECTION64_PATH="$lib" CTITAN_GPUPROF_DIR="$dir/prof" CTITAN_GPUPROF_LAST_MS="$last" CTITAN_GPUPROF_TRACE=1)

rounds=""
case $what in
ctitan)
    [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
    tokens=$1 steps=$2
    shift 2
    what="ctitan, $steps steps"
    if ! "${prof[@]}" "$bin" launch manifests/demo.toml --job.name "breakdown$$" --job.dump_folder "$dir/runs" \
        --job.device cuda --model.tokenizer_path "" --training.steps "$steps" \
        --checkpoint.enable false --validation.enable false --sample.tokens 0 --job.max_restarts 0 \
        --loader.dataset_path "$tokens" --metrics.file "$dir/m.jsonl" --profiling.trace_file "$dir/trace.json" \
        "$@" > "$dir/out" 2>&1; then
        echo "### Breakdown: $label: the job failed: $(tail -1 "$dir/out")"
        exit 1
    fi
    median() { sed -nE "s/.*\"$1\": ([0-9.]+).*/\\1/p" "$dir/m.jsonl" | tail -n +3 | sort -g |
               awk '{ v[NR] = $1 } END { print NR ? v[int((NR + 1) / 2)] : 0 }'; }
    step_ms=$(median step_time_ms)
    # the coordinator's rounds (its timeline's "round" slices): wall time, median over the steps
    round_ms() { { grep -a "\"name\": \"$1\", \"cat\": \"round\"" "$dir/trace.json" 2>/dev/null || true; } | sed -nE 's/.*"dur": ([0-9.]+).*/\1/p' |
                 tail -n +3 | sort -g | awk '{ v[NR] = $1 } END { printf "%.3f", NR ? v[int((NR + 1) / 2)] / 1e3 : 0 }'; }
    reduce_ms=$(round_ms reduce)
    [ "$reduce_ms" = 0.000 ] && reduce_ms="none (GPU shards sum the norm on the device, in UPDATE)"
    rounds="the coordinator's rounds, median wall ms a step: STEP $(round_ms stages), REDUCE $reduce_ms, UPDATE $(round_ms update); the shards' own time in REDUCE and UPDATE $(median optimizer_ms) ms"
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
# the tables over one window for every process (from the traces), else each process's own
tables="$dir/prof" window="the last $last ms of each GPU process"
if ls "$dir"/prof/gpuprof-*.trace >/dev/null 2>&1 &&
   bash tools/gpuprof/window.sh "$dir/prof" "$last" "$dir/common" >/dev/null; then
    tables="$dir/common" window="the last $last ms before the stages' last record, one window for every GPU process"
fi
[ -z "${CTITAN_BREAKDOWN_KEEP:-}" ] || { mkdir -p "$CTITAN_BREAKDOWN_KEEP" && cp "$tables"/*.tsv "$CTITAN_BREAKDOWN_KEEP"/; }

echo "### Breakdown: $label"
echo
echo "\`tools/gpu_breakdown.sh\` ($what$mps; $window; median step $step_ms ms)."
echo "One row per operation, summed over the job's GPU processes; share is of the window (processes"
echo "sharing the device can add up to over 100%)."
echo
awk -F'\t' -v step="$step_ms" -f tools/gpuprof/ops.awk -f tools/gpuprof/breakdown.awk "$tables"/gpuprof-*.tsv
echo
if ls "$dir"/prof/gpuprof-*.trace >/dev/null 2>&1; then
    echo "Where the stage waits (\`tools/gpuprof/waits.sh\`, the same window: what the other processes ran"
    echo "while the stage had nothing on the device, by operation and [pid]; \"nothing\": no process ran"
    echo "anything${rounds:+; $rounds})."
    echo
    bash tools/gpuprof/waits.sh "$dir/prof" "$last" "$step_ms" || echo "(tools/gpuprof/waits.sh failed)"
    echo
fi
