#!/usr/bin/env bash
# `make bench-gpu`: ctitan on one GPU against a plain PyTorch implementation of the same model
# (tools/torch_llama.py, torch.compile + bf16 autocast), in the same invocation. For the demo
# model and a ~1B Llama (dim 2048, 16 layers, 16 heads, 8 KV heads, seq 2048), pipeline degree
# 1 and 2 on the one GPU: tokens/s, MFU against the card's measured bf16 matrix-product rate
# (`ctitan bench --gpu-peak`), and the ratio to PyTorch's tokens/s. Prints markdown.
#
# Needs an NVIDIA GPU, a built tree (make) and python3 with PyTorch; on the lent GPU machine
# source .gpu-deps/env.sh first (NOTES.md). Without a GPU it says so and exits 2.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin/ctitan
steps=${BENCH_GPU_STEPS:-12}

if [ ! -e /dev/nvidiactl ]; then
  echo "bench-gpu: no NVIDIA GPU on this machine: nothing measured" >&2
  exit 2
fi
python3 -c 'import torch' 2>/dev/null || { echo "bench-gpu: python3 has no PyTorch" >&2; exit 2; }
peak=$("$bin" bench --gpu-peak)
dir=$(mktemp -d /tmp/ctitan-bench-gpu-XXXXXX)
trap 'rm -rf "$dir"' EXIT

# Random tokens in llm.c's format (256 int32 header: magic 20240520, version 1, count; uint16),
# below 2048 so that they suit both vocabularies.
python3 - "$dir/tokens.bin" <<'EOF'
import random, struct, sys
n, v = 4_000_000, 2048
random.seed(1)
hdr = [20240520, 1, n] + [0] * 253
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *hdr))
    f.write(struct.pack("<%dH" % n, *(random.randrange(v) for _ in range(n))))
EOF

# median of a metrics field over steps 3.. (the first steps warm up)
median() { python3 - "$1" "$2" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])][2:]
print(statistics.median(r[sys.argv[2]] for r in rows))
EOF
}

echo "# ctitan bench-gpu, $(date -u +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
echo
echo "bf16 matrix-product peak (cuBLASLt, 8192^3, measured now): **$peak TFLOP/s**; MFU is against it."
echo "ctitan: \`ctitan launch\` with \`--job.device cuda\` (stages on the GPU, hand-offs through CUDA IPC rings,"
echo "optimizer shards on the GPU updating the stages' weights in place), $steps steps, medians of steps"
echo "3..$steps; peak memory is the device's in use at a step's end (every process on it), planned: what"
echo "\`ctitan plan\` of the same job says GPU 0 needs (every process on it: the memory plan's accuracy). PyTorch:"
echo "tools/torch_llama.py bench, the same model and batch: peak torch.cuda.max_memory_allocated, and"
echo "device: the device's memory in use after its steps, counted as ctitan's (context and allocator reserve)."
echo
echo "| model | pp | batch x seq | ctitan tokens/s | ctitan MFU | ctitan peak GiB | planned GiB | PyTorch tokens/s | PyTorch peak GiB | PyTorch device GiB | ctitan / PyTorch |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
# label flavor dim layers heads kv vocab seq batch pp microbatches [more ctitan overrides]
run() {
  local label=$1 flavor=$2 dim=$3 layers=$4 heads=$5 kv=$6 vocab=$7 seq=$8 batch=$9 pp=${10} mb=${11} more=${12:-}
  local m="$dir/$flavor-$pp-$RANDOM.jsonl"
  local job=(manifests/demo.toml --job.name "benchgpu$$" --job.dump_folder "$dir/runs"
      --job.device cuda --model.flavor "$flavor" --model.tokenizer_path "" --model.vocab_size "$vocab"
      --training.steps "$steps" --training.seq_len "$seq" --training.local_batch_size "$batch"
      --parallelism.pipeline_parallel_degree "$pp" --parallelism.pipeline_parallel_microbatches "$mb"
      --checkpoint.enable false --validation.enable false --sample.tokens 0 --job.max_restarts 0
      --loader.dataset_path "$dir/tokens.bin" --metrics.file "$m" --metrics.peak_tflops "$peak" $more)
  # the plan's figure for GPU 0 ("gpu0 needs X GiB, has ..." or "...; its memory is unknown")
  local planned
  planned=$("$bin" plan "${job[@]}" 2>/dev/null | sed -nE 's/^  gpu0 needs ([0-9.]+) GiB.*/\1/p' | head -1) || true
  local rc=0
  "$bin" launch "${job[@]}" > "$dir/launch.out" 2>&1 || rc=$?
  if [ $rc != 0 ]; then
    echo "| $label | $pp | ${batch}x$seq | failed: $(tail -1 "$dir/launch.out") | | | ${planned:-?} | | | | |"
    return
  fi
  # which attention ran (kernels/cuda/model.cu says it once a stage process and shape)
  grep -ah '^note: attention' "$dir/launch.out" | sort -u | sed "s|^note: |- $label, pp $pp: |" >> "$dir/notes" || true
  local tps mfu mem torch
  tps=$(median "$m" tokens_per_s)
  mfu=$(median "$m" mfu)
  mem=$(python3 -c 'import json,sys; print(max(json.loads(l)["mem_peak_bytes"] for l in open(sys.argv[1])))' "$m")
  local tj="$dir/torch-$dim-$layers-$heads-$kv-$vocab-$seq-$batch.json" # one PyTorch run a shape
  [ -s "$tj" ] || python3 tools/torch_llama.py bench --dim "$dim" --n-layers "$layers" --n-heads "$heads" \
          --n-kv-heads "$kv" --vocab "$vocab" --seq "$seq" --batch "$batch" --steps 10 2>"$dir/torch.err" > "$tj"
  torch=$(cat "$tj")
  python3 -c "
import json, sys
t, m, mem = map(float, sys.argv[1:4]); p = json.loads(sys.argv[4])
print('| $label | $pp | ${batch}x$seq | %.0f | %.1f%% | %.1f | ${planned:-?} | %.0f | %.1f | %.1f | %.2f |' % (
    t, 100 * m, mem / 2**30, p['tokens_per_s'], p['peak_bytes'] / 2**30, p.get('device_bytes', 0) / 2**30,
    t / p['tokens_per_s']))" \
    "$tps" "$mfu" "$mem" "$torch"
}
run "demo (debugmodel)" debugmodel 256 6 16 16 2048 256 8 1 1
run "demo (debugmodel)" debugmodel 256 6 16 16 2048 256 8 2 8
run "~1B Llama" llama1b 2048 16 16 8 32000 2048 4 1 1
# the same with ctitan's own attention kernels (kernels/cuda/attn.cu) in place of cuDNN's
run "~1B Llama, ctitan's attention" llama1b 2048 16 16 8 32000 2048 4 1 1 "--training.attention ctitan"
run "~1B Llama" llama1b 2048 16 16 8 32000 2048 4 2 4
# pp 2's two stage processes (and the shards) time-slice the one GPU; under MPS (job.mps: the
# launch's private daemon) they share it at once: issue 25's pp 2 goal (>= 0.9x its own pp 1)
# against the hand-offs' context switches
run "demo (debugmodel), MPS" debugmodel 256 6 16 16 2048 256 8 2 8 "--job.mps on"
run "~1B Llama, MPS" llama1b 2048 16 16 8 32000 2048 4 2 4 "--job.mps on"
# memory: the norms and SwiGLU recomputed (what torch.compile's partitioner does by itself), and
# one optimizer shard (one CUDA context fewer on the GPU); AC op with two shards ran at 0.87x of
# PyTorch on 2026-11-28, 23.5 GiB
run "~1B Llama, AC op, 1 shard" llama1b 2048 16 16 8 32000 2048 4 1 1 \
  "--activation_checkpoint.mode selective --activation_checkpoint.selective_ac_option op --optshard.shards 1"
if [ -s "$dir/notes" ]; then
  echo
  echo "Attention, as each job's stage processes said:"
  echo
  cat "$dir/notes"
fi
