#!/usr/bin/env bash
# The first contact with a GPU as one command: on the lent machine, with the build and the
# libraries tools/gpu_carry.sh prepared, it runs in order and within a time budget: device
# facts, every GPU test program one by one, the CPU model tests, the model on the GPU (pipeline
# degree 1 and 2 on one GPU with GPU optimizer shards, offload, and a one-rank NCCL plane) step
# by step against the CPU's losses, the GPU shards' clip factor against the host's and offload
# against GPU shards (both bitwise), the end's validation on the GPU against the CPU's and its
# sample on the GPU, a GPU checkpoint and its resume, recovery, where the step
# goes per kernel (tools/gpu_breakdown.sh, for ctitan and PyTorch), the race against PyTorch
# (tools/bench_gpu.sh), a checkpoint's stall on a GPU job, then issue 24's: the 8B's plan and
# the 3B trained, activation checkpointing's cost, the ~1B's plan on the CPU against its
# measured memory. Every step has a timeout of its own and a failure never stops the next;
# OUT/report.md is rewritten after each step and the raw logs are in OUT/logs/, so whatever was
# reached before the lease ends is kept.
#
#   bash tools/gpu_check.sh [--budget SECONDS] [--only STEPS] [--rehearse] [--export DIR] OUT
#
# --budget  seconds for the whole check (default 540: a lease allows 600 a command)
# --only    a comma list of the steps to run (the device facts always): tests, model (the model
#           against the CPU, checkpoint and resume, recovery), breakdown (where the step goes,
#           tools/gpu_breakdown.sh: six jobs, ~3 minutes), waits (of those only the ~1B at pp 1,
#           its "Where the stage waits" table among its tables, ~50 s), bench
#           (tools/bench_gpu.sh), stall (a checkpoint's stall), big (issue 24: the 8B's three plans,
#           the 8B trained where one fits, GPU-resident or offload's lean form, then the 3B; ~7-9
#           minutes: run it on its own), ac (activation checkpointing's cost and
#           saving on the ~160M, ~1 minute), plan (the ~1B's memory plan on the CPU against its
#           measured host memory, ~1-2 minutes)
# --export  after every step, also DIR/report.md and DIR/raw.tgz (the logs and metrics files,
#           without the data, runs and checkpoints): two files, because the device tool brings back at
#           most 8 files from its $OUT (OUT itself holds ~30).
# --rehearse  for a machine without a GPU (make test runs it on tests/cudasim's emulated plugin,
#           which CTITAN_CUDA_PLUGIN names): the steps that need a real GPU say "skipped: no
#           GPU" and the model runs in a small shape, so the check itself cannot rot.
# CTITAN_BUILD names another build folder (default build; tests pass their own).
# Exit status: 0 when no step failed, 1 when one did, 2 for bad usage.
set -u
cd "$(dirname "$0")/.."

budget=540 rehearse=0 out="" export="" only=""
while [ $# -gt 0 ]; do
    case $1 in
    --budget) budget=${2:-}; shift 2 ;;
    --rehearse) rehearse=1; shift ;;
    --only) only=${2:-}; shift 2 ;;
    --export) export=${2:-}; [ -n "$export" ] || { echo "gpu_check: --export takes a folder" >&2; exit 2; }; shift 2 ;;
    -h|--help) awk 'NR == 1 { next } !/^#/ { exit } { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    -*) echo "gpu_check: unknown option $1" >&2; exit 2 ;;
    *) out=$1; shift ;;
    esac
done
case $budget in ''|*[!0-9]*) echo "gpu_check: --budget takes whole seconds, got '$budget'" >&2; exit 2 ;; esac
[ -n "$out" ] || { echo "usage: tools/gpu_check.sh [--budget SECONDS] [--only STEPS] [--rehearse] [--export DIR] OUT" >&2; exit 2; }
steps_known="tests model breakdown waits bench stall big ac plan"
for w in ${only//,/ }; do
    case " $steps_known " in *" $w "*) ;; *) echo "gpu_check: --only: no step '$w' (steps: $steps_known)" >&2; exit 2 ;; esac
done
want() { [ -z "$only" ] || case ",$only," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
mkdir -p "$out/logs" || exit 2
if [ -n "$export" ]; then mkdir -p "$export" && export=$(cd "$export" && pwd) || exit 2; fi
out=$(cd "$out" && pwd)
build=${CTITAN_BUILD:-build}
bin=$build/bin/ctitan
start=$(date +%s)
failed=0 n=0
: >"$out/.rows"
: >"$out/.details"

left() { echo $((budget - ($(date +%s) - start))); }

write_report() {
    {
        echo "# ctitan GPU check, $(date -u '+%F %H:%M UTC')"
        echo
        echo "- mode: $([ $rehearse = 1 ] && echo "rehearsal without a GPU (emulated plugin: ${CTITAN_CUDA_PLUGIN:-none})" || echo "GPU")"
        echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown); host: $(uname -n), $(nproc) CPUs"
        echo "- budget: ${budget} s, used $(( $(date +%s) - start )) s; raw logs: logs/"
        echo
        echo "| # | step | result | seconds | what it says |"
        echo "|---|---|---|---|---|"
        cat "$out/.rows"
        echo
        cat "$out/.details"
    } >"$out/report.md.tmp" && mv "$out/report.md.tmp" "$out/report.md"
    if [ -n "$export" ]; then
        cp "$out/report.md" "$export/.report.md" && mv "$export/.report.md" "$export/report.md"
        tar czf "$export/.raw.tgz" -C "$out" --exclude=./data --exclude=./runs --exclude="./ckpt*" . 2>/dev/null &&
            mv "$export/.raw.tgz" "$export/raw.tgz"
    fi
}

# row NAME RESULT SECONDS TEXT: one line of the table (RESULT ok, FAILED, skipped: ...).
row() {
    n=$((n + 1))
    local text=${4//|/\\|}
    printf '| %d | %s | %s | %s | %s |\n' "$n" "$1" "$2" "$3" "${text:0:300}" >>"$out/.rows"
    case $2 in FAILED*) failed=1 ;; esac
    write_report
}

details() { printf '%s\n' "$@" >>"$out/.details"; }

# run LOG CAP CMD...: runs CMD with at most CAP seconds (less if the budget has less left),
# output to logs/LOG; sets rc (124 on timeout) and secs. Returns 1 without running when the
# budget is spent.
run() {
    local log=$1 cap=$2
    shift 2
    local have=$(( $(left) - 5 ))
    [ "$have" -lt "$cap" ] && cap=$have
    if [ "$cap" -lt 5 ]; then
        rc=125 secs=0
        return 1
    fi
    local t0=$(date +%s)
    timeout -k 5 "$cap" "$@" >"$out/logs/$log" 2>&1
    rc=$?
    secs=$(( $(date +%s) - t0 ))
    return 0
}

# The line of a log that says what went wrong: the first error a process
# logged (the cause, before the coordinator's account of who stopped), else
# the last line that reads like a failure (tests, tools).
why() {
    [ -f "$out/logs/$1" ] || return 0
    local first
    first=$(grep -a '^\[[^]]*\] E ' "$out/logs/$1" | head -1)
    if [ -n "$first" ]; then printf '%s\n' "$first"; return 0; fi
    grep -aE 'error|failed|FAILED|cannot|refused|Assertion|Segmentation|not |no ' "$out/logs/$1" | tail -1 || true
}

# result LOG: ok, timed out or FAILED from rc.
result() { case $rc in 0) echo ok ;; 124|137) echo "FAILED (timed out)" ;; *) echo "FAILED (exit $rc)" ;; esac; }

# losses JSONL: the "loss" of each line of a metrics file, one per line.
losses() { sed -nE 's/.*"loss": ([^,]*),.*/\1/p' "$1"; }

# ---- 1. the machine ----
if [ $rehearse = 1 ]; then
    row "device facts" "skipped: no GPU" 0 "rehearsal: $(uname -sr)"
elif run facts.log 30 sh -c 'nvidia-smi; echo; nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv; echo; (nvcc --version || /usr/local/cuda/bin/nvcc --version) 2>&1 | tail -2; echo; python3 -c "import torch; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"nccl\", torch.cuda.nccl.version())" 2>&1; ls -l /usr/local/cuda 2>&1 | head -1; echo; echo cuDNN:; python3 -c "import glob, os, torch; d = os.path.dirname(torch.__file__); print(\"torch cudnn\", torch.backends.cudnn.version()); [print(p, os.path.getsize(p)) for p in sorted(glob.glob(d + \"/../nvidia/cudnn/lib/*\") + glob.glob(d + \"/lib/libcudnn*\"))]" 2>&1; ldconfig -p | grep -i cudnn | head -5; ls /usr/include/cudnn*.h /usr/local/cuda/include/cudnn*.h /usr/include/x86_64-linux-gnu/cudnn*.h 2>/dev/null | head -5; echo; echo host memory:; grep -E "^(MemTotal|MemAvailable)" /proc/meminfo; df -h /dev/shm'; then
    # the host's memory and /dev/shm beside the card (the 8B's lean offload needs ~120 GiB of both)
    row "device facts" "$(result)" "$secs" "$(grep -a -A1 '^name' "$out/logs/facts.log" | tail -1); $(grep -a '^MemAvailable' "$out/logs/facts.log" | tr -s ' '); /dev/shm $(df -h /dev/shm 2>/dev/null | awk 'NR == 2 { print $4 " free of " $2 }')"
    details "## Device facts" "" '```' "$(head -70 "$out/logs/facts.log")" '```' ""
else
    row "device facts" "skipped: out of budget" 0 ""
fi

if want tests; then
# ---- 2. every GPU test program, one by one ----
for t in "$build"/tests/gpu/test_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    if [ $rehearse = 1 ]; then
        row "$name" "skipped: no GPU" 0 "runs in make test as ${name}_sim on the emulator where one exists"
        continue
    fi
    if ! run "$name.log" 120 env CMOCKA_MESSAGE_OUTPUT=stdout CTITAN_CUDNN_DEVICEPROP="$out/cudnn-deviceprop.json" "$t"; then
        row "$name" "skipped: out of budget" 0 ""
        continue
    fi
    ok=$(grep -ac '^\[       OK \]' "$out/logs/$name.log")
    bad=$(grep -a '^\[  FAILED  \]\s*test' "$out/logs/$name.log" | sort -u | wc -l)
    skip=$(grep -a '^\[  SKIPPED \]\s*test' "$out/logs/$name.log" | sort -u | wc -l)
    text="$ok passed, $bad failed, $skip skipped"
    [ $rc = 0 ] || text="$text; $(why "$name.log")"
    row "$name" "$(result)" "$secs" "$text"
done

# ---- 3. the CPU model tests (the carried build works on this machine) ----
for t in "$build"/tests/test_model "$build"/tests/test_backend; do
    name=$(basename "$t")
    if ! run "$name.log" 120 env CMOCKA_MESSAGE_OUTPUT=stdout "$t"; then
        row "$name" "skipped: out of budget" 0 ""
        continue
    fi
    row "$name" "$(result)" "$secs" "$(grep -ac '^\[       OK \]' "$out/logs/$name.log") passed$([ $rc = 0 ] || echo "; $(why "$name.log")")"
done
fi # tests

# ---- 4. the model on the GPU against the CPU ----
# Data: a tokenizer and token files from text every Debian machine has (no download, no python).
data=$out/data
texts=(README.md DESIGN.md NOTES.md BENCHMARKS.md)
for f in /usr/share/common-licenses/*; do [ -f "$f" ] && texts+=("$f"); done
if ! run prep.log 60 "$bin" prep --vocab 512 --out "$data" "${texts[@]}"; then
    row "data (ctitan prep)" "skipped: out of budget" 0 ""
elif [ $rc != 0 ]; then
    row "data (ctitan prep)" "$(result)" "$secs" "$(why prep.log)"
else
    row "data (ctitan prep)" ok "$secs" "$(grep -a 'wrote' "$out/logs/prep.log" | tail -1)"
fi
if [ $rehearse = 1 ]; then
    shape=(--model.dim 64 --model.n_layers 2 --model.n_heads 4 --model.n_kv_heads 2 --training.seq_len 32
           --training.local_batch_size 4 --parallelism.pipeline_parallel_microbatches 2)
    steps=3 sample=4
else
    shape=(--parallelism.pipeline_parallel_microbatches 8)
    steps=6 sample=32
fi
common=(manifests/demo.toml --model.vocab_size 512 --model.tokenizer_path "$data/tokenizer.bin"
        --loader.dataset_path "$data/train.bin" --validation.enable false --sample.tokens 0
        --checkpoint.enable false --metrics.peak_tflops 1 --job.max_restarts 0 "${shape[@]}")  # a failure is reported, not retried

# job NAME LOG ARGS...: one `ctitan launch` of the model, metrics in OUT/NAME.jsonl.
job() {
    local name=$1 log=$2
    shift 2
    run "$log" 150 "$bin" launch "${common[@]}" --job.name "gpuchk$$$name" --job.dump_folder "$out/runs/$name" \
        --metrics.file "$out/$name.jsonl" "$@"
}

if want model; then
details "## The model on the GPU against the CPU" "" \
    "Losses per step (\`ctitan launch manifests/demo.toml\`, $steps steps, vocabulary 512 from \`ctitan prep\`" \
    "on local text; GPU: bf16 with fp32 accumulation; CPU: fp32). Within 1% counts as the same." ""
# pp 1 validates at the end (the GPU job's on its GPU: the coordinator through the CUDA backend)
val=(--validation.enable true --validation.dataset_path "$data/val.bin" --validation.steps 4)
job cpu1 cpu-pp1.log --training.steps $steps --parallelism.pipeline_parallel_degree 1 "${val[@]}" || true
job cpu2 cpu-pp2.log --training.steps $steps --parallelism.pipeline_parallel_degree 2 || true
compare() { # LABEL NAME PP ARGS...
    local label=$1 name=$2 pp=$3
    shift 3
    if ! job "$name" "$name.log" --training.steps $steps --parallelism.pipeline_parallel_degree "$pp" \
        --job.device cuda "$@"; then
        row "$label" "skipped: out of budget" 0 ""
        return
    fi
    if [ $rc != 0 ]; then
        row "$label" "$(result)" "$secs" "$(why "$name.log")"
        return
    fi
    local cpu=$out/cpu$pp.jsonl verdict
    if [ ! -s "$cpu" ]; then
        row "$label" FAILED "$secs" "the CPU run to compare with did not finish (logs/cpu-pp$pp.log)"
        return
    fi
    verdict=$(paste <(losses "$out/$name.jsonl") <(losses "$cpu") | awk -v steps=$steps '
        { d = $1 - $2; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > worst) worst = r;
          line = line sprintf("| %d | %s | %s | %.2e |\n", NR, $1, $2, r) }
        END { printf "%s %d %.2e\n", (NR == steps && worst <= 0.01) ? "ok" : "FAILED", NR, worst > "/dev/stderr";
              printf "%s", line }' 2>"$out/.verdict")
    read -r res nsteps worst <"$out/.verdict"
    details "### $label" "" "| step | GPU | CPU | relative difference |" "|---|---|---|---|" "$verdict" ""
    row "$label" "$res" "$secs" "$nsteps of $steps steps, worst relative difference $worst"
}
compare "model pp 1, GPU shards" gpu1 1 "${val[@]}" --sample.tokens $sample --sample.temperature 0
# the end's validation of that job, on the GPU, against the CPU job's (the same 1%)
vloss() { sed -nE 's/.*"val_loss": ([^,]*),.*/\1/p' "$1" | tail -1; }
vg=$(vloss "$out/gpu1.jsonl" 2>/dev/null) vc=$(vloss "$out/cpu1.jsonl" 2>/dev/null)
if [ ! -s "$out/logs/gpu1.log" ]; then
    row "validation on the GPU" "skipped: out of budget" 0 ""
elif [ -z "$vg" ] || [ -z "$vc" ]; then
    row "validation on the GPU" FAILED 0 "no val_loss record (GPU: '$vg', CPU: '$vc'; logs/gpu1.log)"
elif ! grep -aq "batches on the GPU" "$out/logs/gpu1.log"; then
    row "validation on the GPU" FAILED 0 "it ran on the CPU: $(grep -a 'validation on the GPU did not run' "$out/logs/gpu1.log" | head -1)"
else
    row "validation on the GPU" "$(awk -v g="$vg" -v c="$vc" 'BEGIN { d = g - c; if (d < 0) d = -d; print (d <= 0.01 * (c < 0 ? -c : c)) ? "ok" : "FAILED" }')" 0 \
        "val_loss $vg on the GPU, $vc on the CPU"
fi
# and its sample, on the GPU too (`ctitan generate`'s loop through the plugin's inference model)
if [ ! -s "$out/logs/gpu1.log" ]; then
    row "sample on the GPU" "skipped: out of budget" 0 ""
elif grep -aq "greedy, on the GPU) ---" "$out/logs/gpu1.log"; then
    row "sample on the GPU" ok 0 "$(grep -a -A1 'greedy, on the GPU) ---' "$out/logs/gpu1.log" | tail -1 | cut -c1-60 | tr -d '|')"
else
    row "sample on the GPU" FAILED 0 "$(grep -aE 'sample on the GPU|no sample' "$out/logs/gpu1.log" | head -1 | tr -d '|')"
fi
compare "model pp 2, GPU shards" gpu2 2
# the clip factor the GPU shards made on the device (stages/runtime/devnorm.c) against the same job
# with the coordinator's sum on the host (the test hook: three rounds a step): the same bits
gnorms() { sed -nE 's/.*"grad_norm": ([^,]*),.*/\1/p' "$1"; }
if [ ! -s "$out/gpu2.jsonl" ]; then
    row "clip factor on the device" "skipped: no pp 2 GPU-shard run to compare with" 0 ""
else
    export CTITAN_TEST_HOST_NORM=1
    job hostnorm hostnorm.log --training.steps $steps --parallelism.pipeline_parallel_degree 2 --job.device cuda ||
        rc=125
    unset CTITAN_TEST_HOST_NORM
    if [ "$rc" = 125 ]; then
        row "clip factor on the device" "skipped: out of budget" 0 ""
    elif [ "$rc" != 0 ]; then
        row "clip factor on the device" "$(result)" "$secs" "$(why hostnorm.log)"
    elif [ -s "$out/hostnorm.jsonl" ] && [ "$(losses "$out/gpu2.jsonl")" = "$(losses "$out/hostnorm.jsonl")" ] &&
         [ "$(gnorms "$out/gpu2.jsonl")" = "$(gnorms "$out/hostnorm.jsonl")" ]; then
        row "clip factor on the device" ok "$secs" "losses and grad norms of $steps steps bitwise the host's sum (grad norms $(gnorms "$out/gpu2.jsonl" | cut -c1-6 | paste -sd ' ' -); max_norm 1)"
    else
        row "clip factor on the device" FAILED "$secs" "losses or grad norms differ from the host's sum (gpu2.jsonl, hostnorm.jsonl)"
    fi
fi
compare "model pp 2, offload" off2 2 --optshard.device cpu
# offload's CPU shards (block norms on the CPU, the coordinator's sum, AdamW on the CPU) against the
# GPU shards (all of it on the device): one order and one arithmetic on both, so the same bits
if [ ! -s "$out/gpu2.jsonl" ] || [ ! -s "$out/off2.jsonl" ]; then
    row "offload = GPU shards, bitwise" "skipped: a pp 2 run missing" 0 ""
elif [ "$(losses "$out/gpu2.jsonl")" = "$(losses "$out/off2.jsonl")" ] &&
     [ "$(gnorms "$out/gpu2.jsonl")" = "$(gnorms "$out/off2.jsonl")" ]; then
    row "offload = GPU shards, bitwise" ok 0 "losses and grad norms of $steps steps the same bits (gpu2.jsonl, off2.jsonl)"
else
    row "offload = GPU shards, bitwise" FAILED 0 "losses or grad norms differ (gpu2.jsonl, off2.jsonl: the first differing step says where)"
fi
compare "model pp 1, NCCL plane (one rank)" nccl1 1 --parallelism.data_plane nccl

# ---- 5. a GPU checkpoint, and its resume (bitwise the run that did not stop) ----
half=$((steps / 2))
if job ckfull ckfull.log --training.steps $steps --parallelism.pipeline_parallel_degree 2 --job.device cuda \
    --checkpoint.enable true --checkpoint.interval $half --checkpoint.keep_latest_k $steps --checkpoint.folder "$out/ckpt" && [ $rc = 0 ] &&
   job ckresume ckresume.log --training.steps $steps --parallelism.pipeline_parallel_degree 2 --job.device cuda \
    --checkpoint.load "$out/ckpt/step-$(printf %08d $half)" && [ $rc = 0 ]; then
    if [ "$(losses "$out/ckfull.jsonl" | tail -n +$((half + 1)))" = "$(losses "$out/ckresume.jsonl")" ] &&
       [ -s "$out/ckresume.jsonl" ]; then
        row "checkpoint and resume" ok "$secs" "steps $((half + 1))-$steps resumed from step $half: bitwise the uninterrupted run"
    else
        row "checkpoint and resume" FAILED "$secs" "the resumed losses differ from the uninterrupted run's (see ckfull.jsonl, ckresume.jsonl)"
    fi
elif [ "${rc:-125}" = 125 ]; then
    row "checkpoint and resume" "skipped: out of budget" 0 ""
else
    row "checkpoint and resume" "$(result)" "${secs:-0}" "$(why ckresume.log)$(why ckfull.log)"
fi

# ---- 5b. `ctitan generate --device cuda` from that GPU checkpoint: the CPU's greedy tokens ----
last=$out/ckpt/step-$(printf %08d $steps)
gen() { run "$1" 90 "$bin" generate "$last" --prompt-ids '1 2 3 4 5 6 7 8 9' --ids --temperature 0 --max-tokens 40 \
            --device "$2"; }
if [ ! -d "$last" ]; then
    row "generate --device cuda" "skipped: no checkpoint" 0 "the checkpoint step did not write $last"
elif gen gen-cpu.log cpu && [ $rc = 0 ] && gen gen-cuda.log cuda; then
    ids() { head -1 "$out/logs/$1" | sed 's/generate: .*//'; } # stderr's summary may follow on the line
    if [ $rc = 0 ] && [ -n "$(ids gen-cpu.log)" ] && [ "$(ids gen-cuda.log)" = "$(ids gen-cpu.log)" ]; then
        row "generate --device cuda" ok "$secs" "40 greedy tokens equal to the CPU's; $(grep -ao 'generate: .*' "$out/logs/gen-cuda.log" | tail -1)"
    else
        row "generate --device cuda" FAILED "$secs" "$( [ $rc = 0 ] && echo "tokens differ from the CPU's (gen-cpu.log, gen-cuda.log)" || why gen-cuda.log)"
    fi
elif [ "${rc:-125}" = 125 ]; then
    row "generate --device cuda" "skipped: out of budget" 0 ""
else
    row "generate --device cuda" "$(result)" "${secs:-0}" "$(why gen-cpu.log)"
fi

# ---- 6. recovery: a GPU stage killed (every stage started again, the shards keep the state), then a
# GPU shard (a rewind to the in-memory snapshot); each step's loss bitwise the undisturbed pp 2 run's ----
mkdir -p "$out/once"
if [ ! -s "$out/gpu2.jsonl" ]; then
    row "recovery (stage, shard killed)" "skipped: no undisturbed pp 2 run to compare with" 0 ""
elif run recover.log 150 env CTITAN_TEST_DIE_ONCE="$out/once" \
        CTITAN_TEST_DIE_AT=stage.1.0:mid:2,stage.0.0:begin:$((half + 1)),optshard.0.0:adamw:$steps \
        "$bin" launch "${common[@]}" --job.name "gpuchk$$rec" --job.dump_folder "$out/runs/rec" \
        --metrics.file "$out/rec.jsonl" --training.steps $steps --parallelism.pipeline_parallel_degree 2 \
        --job.device cuda --job.max_restarts 3 --checkpoint.snapshot_interval 2; then
    if [ $rc != 0 ]; then
        row "recovery (stage, shard killed)" "$(result)" "$secs" "$(why recover.log)"
    else
        bystep() { sed -nE 's/^\{"step": ([0-9]+),.*"loss": ([^,]*),.*/\1 \2/p' "$1"; }
        differ=$(awk 'NR == FNR { ref[$1] = $2; next } { n++; if (ref[$1] != $2) bad++ } END { print n + 0, bad + 0 }' \
                 <(bystep "$out/gpu2.jsonl") <(bystep "$out/rec.jsonl"))
        read -r nrec nbad <<<"$differ"
        lines=$(grep -a '^recovered ' "$out/logs/recover.log" | sed -E 's/:.*( in [0-9.]+ s).*/\1/' | paste -sd ';' - | sed 's/;/; /g')
        if [ "$nbad" = 0 ] && [ "$nrec" -ge "$steps" ] && [ "$(grep -ac '^recovered ' "$out/logs/recover.log")" = 3 ]; then
            row "recovery (stage, shard killed)" ok "$secs" "3 recoveries ($lines); $nrec step records, every loss bitwise the undisturbed run's"
        else
            row "recovery (stage, shard killed)" FAILED "$secs" "$nbad of $nrec step losses differ from gpu2.jsonl; recoveries: $lines"
        fi
    fi
else
    row "recovery (stage, shard killed)" "skipped: out of budget" 0 ""
fi
fi # model

# ---- 7. where the step goes, per kernel (tools/gpu_breakdown.sh: CUPTI in every GPU process) ----
breakdown() { # LABEL LOG LAST_MS {ctitan STEPS OVERRIDES... | torch ARGS...}
    local label=$1 log=$2 last=$3 what=$4
    shift 4
    [ "$what" = ctitan ] && set -- "$data/train.bin" "$@"
    if [ $rehearse = 1 ]; then
        row "breakdown: $label" "skipped: no GPU" 0 "tools/gpu_breakdown.sh"
    elif run "$log" 120 env CTITAN_BREAKDOWN_KEEP="$out/logs/${log%.log}" bash tools/gpu_breakdown.sh "$label" "$last" "$what" "$@"; then
        row "breakdown: $label" "$(result)" "$secs" "$([ $rc = 0 ] && echo "table below" || tail -1 "$out/logs/$log")"
        details "$(cat "$out/logs/$log")" ""
    else
        row "breakdown: $label" "skipped: out of budget" 0 ""
    fi
}
if want breakdown || want waits; then
[ $rehearse = 1 ] || details "## Where the step goes" ""
# (no metrics.peak_tflops: the job measures the GPU's peak once and caches it, as a user's would)
b1=(--model.flavor llama1b --model.vocab_size 32000 --training.seq_len 2048 --training.local_batch_size 4
    --parallelism.pipeline_parallel_microbatches 1)
breakdown "~1B Llama, pp 1, 4x2048" bd-1b.log 2000 ctitan 25 "${b1[@]}" --parallelism.pipeline_parallel_degree 1
fi
if want breakdown; then
# the ~160M of the stall step (issue 25's 45% MFU goal; 27.6% on 2026-11-28): where its 16.5 ms go
# (one optimizer shard against two at the ~1B was measured on 2026-11-28: 127.0 against 127.6 ms)
breakdown "~160M Llama, pp 1, 4x1024" bd-160m.log 1000 ctitan 80 --model.flavor llama1b --model.dim 1024 \
    --model.n_layers 8 --model.n_heads 16 --model.n_kv_heads 8 --model.vocab_size 32000 --training.seq_len 1024 \
    --training.local_batch_size 4 --parallelism.pipeline_parallel_microbatches 1 --parallelism.pipeline_parallel_degree 1
# PyTorch's own breakdown (tools/gpu_breakdown.sh ... torch: ~95 s) is in BENCHMARKS.md, 2026-11-27: it
# does not change with ctitan; run it by hand when the reference moves.
bd=(--model.flavor debugmodel --model.vocab_size 2048 --training.seq_len 256 --training.local_batch_size 8
    --metrics.peak_tflops 1)
breakdown "demo, pp 1, 8x256" bd-demo1.log 1000 ctitan 400 "${bd[@]}" --parallelism.pipeline_parallel_degree 1 \
    --parallelism.pipeline_parallel_microbatches 1
breakdown "demo, pp 2 on one GPU, 8 microbatches" bd-demo2.log 1500 ctitan 300 "${bd[@]}" \
    --parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_microbatches 8
# the same two under MPS (job.mps: the launch's private daemon): do the stages and shards overlap then?
breakdown "demo, pp 2 on one GPU, 8 microbatches, MPS" bd-demo2-mps.log 1500 ctitan 300 \
    "${bd[@]}" --parallelism.pipeline_parallel_degree 2 --parallelism.pipeline_parallel_microbatches 8 --job.mps on
breakdown "~1B Llama, pp 1, 4x2048, MPS" bd-1b-mps.log 2000 ctitan 25 "${b1[@]}" \
    --parallelism.pipeline_parallel_degree 1 --job.mps on
fi # breakdown

# ---- 8. the race against PyTorch ----
if want bench; then
if [ $rehearse = 1 ]; then
    row "bench-gpu (ctitan vs PyTorch)" "skipped: no GPU" 0 "tools/bench_gpu.sh"
elif run bench-gpu.log 100000 bash tools/bench_gpu.sh; then
    row "bench-gpu (ctitan vs PyTorch)" "$(result)" "$secs" "$([ $rc = 0 ] && echo "table below" || why bench-gpu.log)"
    details "## bench-gpu" "" "$(cat "$out/logs/bench-gpu.log")" ""
else
    row "bench-gpu (ctitan vs PyTorch)" "skipped: out of budget" 0 ""
fi
fi # bench

# ---- 9. a checkpoint's stall on a GPU job: ~160M (dim 1024, 8 layers, 4x1024), a checkpoint every
# 40 steps against the same job without; each step after a checkpoint against the median step ----
st=(--model.flavor llama1b --model.tokenizer_path "" --model.dim 1024 --model.n_layers 8 --model.n_heads 16 --model.n_kv_heads 8
    --model.vocab_size 32000 --training.seq_len 1024 --training.local_batch_size 4
    --parallelism.pipeline_parallel_microbatches 1 --parallelism.pipeline_parallel_degree 1
    --training.steps 120 --job.device cuda)
steptimes() { sed -nE 's/.*"step_time_ms": ([0-9.]+).*/\1/p' "$1"; }
# the device's peak in use (every process on it) over a job's steps, GiB
peak_gib() { sed -nE 's/.*"mem_peak_bytes": ([0-9]+).*/\1/p' "$1" | sort -g | tail -1 | awk '{ printf "%.2f", $1 / 1073741824 }'; }
if want stall; then
if [ $rehearse = 1 ]; then
    row "checkpoint stall (~160M)" "skipped: no GPU" 0 ""
elif job stall0 stall0.log "${st[@]}" && [ $rc = 0 ] &&
     job stall1 stall1.log "${st[@]}" --checkpoint.enable true --checkpoint.interval 40 \
         --checkpoint.keep_latest_k 1 --checkpoint.folder "$out/ckpt-stall" && [ $rc = 0 ]; then
    med=$(steptimes "$out/stall0.jsonl" | tail -n +3 | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
    stall=$(paste <(steptimes "$out/stall0.jsonl") <(steptimes "$out/stall1.jsonl") | awk -v med="$med" '
        NR > 2 { t0 += $1; t1 += $2 } { s1[NR] = $2 }
        END { printf "median step %.1f ms; after each checkpoint: %.1f, %.1f ms; steps 3-120: %.2f s without, %.2f s with (%+.1f%%)",
                  med, s1[41], s1[81], t0 / 1e3, t1 / 1e3, 100 * (t1 - t0) / t0 }')
    # the memory plan against the device's peak (every process on it) of the job without checkpoints
    planned=$("$bin" plan "${common[@]}" "${st[@]}" 2>/dev/null | sed -nE 's/^  gpu0 needs ([0-9.]+) GiB.*/\1/p' | head -1) || true
    stall="$stall; device peak $(peak_gib "$out/stall0.jsonl") GiB, planned ${planned:-?} GiB"
    row "checkpoint stall (~160M)" ok "$secs" "$stall"
    details "## Checkpoint stall (~160M, pp 1, interval 40)" "" "$stall" ""
    # the same with two banks of shard state on the device (optshard.gpu_banks 2): the copy off
    # the device no longer holds the next update
    if job stall2 stall2.log "${st[@]}" --checkpoint.enable true --checkpoint.interval 40 --optshard.gpu_banks 2 \
           --checkpoint.keep_latest_k 1 --checkpoint.folder "$out/ckpt-stall2" && [ $rc = 0 ]; then
        stall2=$(paste <(steptimes "$out/stall0.jsonl") <(steptimes "$out/stall2.jsonl") | awk '
            NR > 2 { t0 += $1; t1 += $2 } { s1[NR] = $2 }
            END { printf "after each checkpoint: %.1f, %.1f ms; steps 3-120: %.2f s without, %.2f s with (%+.1f%%)",
                      s1[41], s1[81], t0 / 1e3, t1 / 1e3, 100 * (t1 - t0) / t0 }')
        stall2="$stall2; device peak $(peak_gib "$out/stall2.jsonl") GiB"
        row "checkpoint stall (~160M), optshard.gpu_banks 2" ok "$secs" "$stall2"
        details "## Checkpoint stall with two banks of shard state (optshard.gpu_banks 2)" "" "$stall2" ""
    else
        row "checkpoint stall (~160M), optshard.gpu_banks 2" "$( [ "${rc:-125}" = 125 ] && echo "skipped: out of budget" || result)" "${secs:-0}" "$(why stall2.log)"
    fi
else
    row "checkpoint stall (~160M)" "$( [ "${rc:-125}" = 125 ] && echo "skipped: out of budget" || result)" "${secs:-0}" "$(why stall1.log)$(why stall0.log)"
fi
fi # stall

# ---- 10. issue 24 on one GPU: the plan's answer for the Llama 3.1 8B shape with this machine's
# memory (GPU-resident state, offload, and offload's lean form: one bank, bf16 copies); the 8B
# trained a few steps where its GPU-resident plan fits (an H200: 137 of its ~140 GiB), else in
# the lean offload where that fits (an 80 GB H100 with 128 GiB of host: 120.2 GiB planned), then
# the Llama 3.2 3B shape (tokens/s, the device's peak against the plan's figure) ----
l3=(--model.flavor llama1b --model.tokenizer_path "" --model.vocab_size 128256 --model.n_kv_heads 8
    --model.max_seq_len 8192 --training.seq_len 2048 --training.local_batch_size 1
    --parallelism.pipeline_parallel_microbatches 1 --parallelism.pipeline_parallel_degree 1 --job.device cuda
    --optshard.shards 1 --activation_checkpoint.mode full)
b8=(--model.dim 4096 --model.n_layers 32 --model.n_heads 32 --model.hidden_dim 14336)
b3=(--model.dim 3072 --model.n_layers 28 --model.n_heads 24 --model.hidden_dim 8192)
med_ms() { steptimes "$1" | tail -n +2 | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# the median of the optimizer's rounds a step (the CPU shards' work in offload), first step left out
med_opt_ms() { sed -nE 's/.*"optimizer_ms": ([0-9.]+).*/\1/p' "$1" | tail -n +2 | sort -g |
               awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
# train_big NAME LABEL CAP SHAPE...: the plan (logs/big-planNAME.log), then 8 steps if it fits
train_big() {
    local name=$1 label=$2 cap=$3
    shift 3
    if run "big-plan$name.log" 60 "$bin" plan "${common[@]}" "${l3[@]}" "$@" && [ $rc = 0 ] &&
       run "big$name.log" "$cap" "$bin" launch "${common[@]}" "${l3[@]}" "$@" --training.steps 8 \
           --job.name "gpuchk$$big$name" --job.dump_folder "$out/runs/big$name" --metrics.file "$out/big$name.jsonl"; then
        local planned text
        planned=$(sed -nE 's/^  gpu0 needs ([0-9.]+) GiB.*/\1/p' "$out/logs/big-plan$name.log")
        text="planned gpu0 $planned GiB, measured $(peak_gib "$out/big$name.jsonl") GiB; median step $(med_ms "$out/big$name.jsonl") ms (optimizer rounds $(med_opt_ms "$out/big$name.jsonl") ms), $(sed -nE 's/.*"tokens_per_s": ([0-9.]+).*/\1/p' "$out/big$name.jsonl" | tail -1) tokens/s"
        row "train: $label, AC full" "$(result)" "$secs" "$text$([ $rc = 0 ] || echo "; $(why "big$name.log")")"
        details "## The $label on one GPU" "" "$text" "" '```' "$(cat "$out/logs/big-plan$name.log")" '```' ""
    else
        row "train: $label, AC full" "$( [ "${rc:-125}" = 125 ] && echo "skipped: out of budget" || result)" "${secs:-0}" "$(why "big-plan$name.log")"
    fi
}
if want big; then
if [ $rehearse = 1 ]; then
    row "issue 24: 8B plan, 8B and 3B runs on a GPU" "skipped: no GPU" 0 ""
else
    # offload's lean form: one bank of the shards' state, bf16 copies (ZeRO-Offload's 16 bytes a
    # parameter), 12 CPU shards (AdamW is a shard's one thread), 8 microbatches a step
    lean=(--optshard.device cpu --optshard.host_banks 1 --optshard.offload_dtype bfloat16 --optshard.shards 12
          --training.local_batch_size 8 --parallelism.pipeline_parallel_microbatches 8)
    for off in cuda cpu lean; do # the plan says 0 (fits) or 1 (refused); 2 is an error
        where=$(case $off in cuda) echo "on the GPU" ;; cpu) echo "offloaded to the host" ;;
                *) echo "offloaded, one bank, bf16 copies" ;; esac)
        how=(--optshard.device "$off")
        [ $off = lean ] && how=("${lean[@]}")
        if run "big-plan8-$off.log" 60 "$bin" plan "${common[@]}" "${l3[@]}" "${b8[@]}" "${how[@]}"; then
            row "plan: Llama 3.1 8B, optimizer state $where" "$([ $rc -le 1 ] && echo ok || result)" "$secs" \
                "$(grep -aE '^  (refused|fits)' "$out/logs/big-plan8-$off.log" | head -1)$([ $rc -le 1 ] || echo "; $(why "big-plan8-$off.log")")"
            details "## The plan of the 8B shape, optimizer state $where" "" '```' \
                "$(cat "$out/logs/big-plan8-$off.log")" '```' ""
        fi
    done
    # GPU-resident where it fits (an H200, ~2 GiB to spare); the lean offload where it does not (an
    # 80 GB H100), or where the GPU-resident run failed (e.g. the contexts' estimate was short)
    rc=1
    if grep -q '^  fits' "$out/logs/big-plan8-cuda.log" 2>/dev/null; then
        train_big 8 "Llama 3.1 8B shape, 1x2048" 300 "${b8[@]}"
    fi
    if [ "${rc:-1}" != 0 ] && grep -q '^  fits' "$out/logs/big-plan8-lean.log" 2>/dev/null; then
        train_big 8lean "Llama 3.1 8B shape, offloaded (one bank, bf16 copies, 8x2048)" 300 "${b8[@]}" "${lean[@]}"
    fi
    train_big 3 "Llama 3.2 3B shape, 1x2048" 420 "${b3[@]}"
fi
fi # big

# ---- 11. activation checkpointing's cost and saving on the ~160M shape of the stall step ----
if want ac; then
if [ $rehearse = 1 ]; then
    row "activation checkpointing (~160M, 4x1024)" "skipped: no GPU" 0 ""
else
    acs="" acres=ok
    for mode in none full selective; do
        if job "ac-$mode" "ac-$mode.log" "${st[@]}" --training.steps 20 --activation_checkpoint.mode "$mode" \
               --activation_checkpoint.selective_ac_option op && [ $rc = 0 ]; then
            acs="$acs$mode: $(med_ms "$out/ac-$mode.jsonl") ms, $(peak_gib "$out/ac-$mode.jsonl") GiB; "
        elif [ "${rc:-125}" = 125 ]; then
            acs="$acs$mode: skipped: out of budget; "
            [ $acres = ok ] && acres="skipped: out of budget"
        else
            acs="$acs$mode: $(result) $(why "ac-$mode.log"); "
            acres="FAILED ($mode)"
        fi
    done
    row "activation checkpointing (~160M, 4x1024): median step, device peak" "$acres" "" "$acs"
    details "## Activation checkpointing on the GPU (~160M; selective = op)" "" "$acs" ""
fi
fi # ac

# ---- 12. issue 24: the ~1B's memory plan on the CPU against what it holds, with the default two
# banks of CPU shard state (~20 GB of it: a development machine measures it with
# optshard.host_banks 1 instead, BENCHMARKS.md "The ~1B's memory plan on the CPU"), as `make
# bench-plan` measures the demo and the ~160M (tools/plan_measure.py), over two small steps ----
if want plan; then
if [ $rehearse = 1 ]; then
    row "plan: ~1B Llama on the CPU, planned against measured" "skipped: no GPU" 0 ""
elif run plan1b.log 300 python3 tools/plan_measure.py --bin "$bin" "${common[@]}" --model.flavor llama1b \
         --model.tokenizer_path "" --model.vocab_size 32000 --training.seq_len 256 --training.local_batch_size 1 \
         --parallelism.pipeline_parallel_degree 1 --parallelism.pipeline_parallel_microbatches 1 \
         --training.steps 2 --job.name "gpuchk$$plan" --job.dump_folder "$out/runs/plan1b"; then
    row "plan: ~1B Llama on the CPU, planned against measured" "$(result)" "$secs" \
        "$(grep -a 'host total' "$out/logs/plan1b.log" | tr -s ' ')$([ $rc = 0 ] || echo "; $(why plan1b.log)")"
    details "## The ~1B's memory plan on the CPU (host memory, \`tools/plan_measure.py\`)" "" '```' \
        "$(cat "$out/logs/plan1b.log")" '```' ""
else
    row "plan: ~1B Llama on the CPU, planned against measured" "skipped: out of budget" 0 ""
fi
fi # plan

rm -rf "$out/runs" "$out/ckpt" "$out/ckpt-stall" "$out/ckpt-stall2" "$out/once" "$out/.verdict"
write_report
echo "gpu_check: $n steps, $([ $failed = 1 ] && echo "some FAILED" || echo "none failed"); report: $out/report.md"
exit $failed
