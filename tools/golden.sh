#!/usr/bin/env bash
# The golden jobs: a refactor that changes no behaviour keeps every one of their losses, grad
# norms and checkpoint bytes. Writes OUT/<job>.txt (each step's loss and grad norm as %.17g,
# then the sha256 of every checkpoint file, an index but for its creation time, and the end's
# validation loss where it is on)
# for: pp 1, pp 2 (1F1B), GPipe, ZBV, data parallel 2 with 3 shards, a checkpoint and its
# resume into another topology, and on the emulated CUDA backend pp 2, dp 2 (IPC), offload,
# NCCL and a two-host dp 2 job.
#   bash tools/golden.sh OUT          then: diff -r OUT_BEFORE OUT_AFTER
set -u
out=${1:?usage: tools/golden.sh OUT}
cd "$(dirname "$0")/.."
B=$PWD/build/bin
SIM=$PWD/build/lib/libctitan_cuda_sim.so
mkdir -p "$out"
out=$(cd "$out" && pwd)
# one fixed folder: the checkpoints' embedded manifests name its paths
tmp=/tmp/ctitan-golden
rm -rf "$tmp" && mkdir -p "$tmp" || exit 1
trap 'rm -rf "$tmp"' EXIT
python3 - "$tmp/corpus.txt" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    for i in range(20000):
        f.write("w%d%s" % ((i * 7) % 61, ".\n" if i % 9 == 8 else " "))
PY
"$B/ctitan" prep --vocab 300 --out "$tmp/data" "$tmp/corpus.txt" >/dev/null || exit 1

GPU="--model.dim 32 --model.n_heads 2 --model.n_kv_heads 1 --training.seq_len 16 --training.local_batch_size 2 --job.device cuda"
fail=0
# run JOB [env ...] -- ARGS: a launch of manifests/tiny.toml, its record in OUT/JOB.txt
run() {
    local job=$1; shift
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    env "${envs[@]}" timeout 600 "$B/ctitan" launch manifests/tiny.toml --job.name "g$job" \
        --job.dump_folder "$tmp/runs/$job" --loader.dataset_path "$tmp/data/train.bin" \
        --metrics.file "$tmp/$job.jsonl" --metrics.peak_tflops 1 --metrics.log_freq 100000 "$@" \
        >"$tmp/$job.out" 2>&1 || { echo "golden: $job failed:"; tail -20 "$tmp/$job.out"; fail=1; }
    record "$job"
}
record() {
    local job=$1
    sed -n 's/.*"step": \([0-9]*\), "loss": \([^,]*\), "grad_norm": \([^,]*\),.*/\1 \2 \3/p;
            s/.*"step": \([0-9]*\), "val_loss": \([^,}]*\).*/\1 val \2/p' "$tmp/$job.jsonl" >"$out/$job.txt"
    if [ -d "$tmp/runs/$job/checkpoint" ]; then
        (cd "$tmp/runs/$job/checkpoint" && find . -type f ! -name index | sort | xargs -r sha256sum) >>"$out/$job.txt"
        # an index but for its creation time, the two-host job's port (and the trailing checksum)
        find "$tmp/runs/$job/checkpoint" -name index -type f | sort | python3 -c '
import hashlib, re, sys
for path in sys.stdin.read().split():
    b = open(path, "rb").read()[:-8]
    b = re.sub(rb"\xa7created(\xce....|\xd3........|\xcf........)", b"\xa7created", b, flags=re.S)
    b = re.sub(rb"tcp://127\.0\.0\.1:[0-9]+", b"tcp://127.0.0.1:PORT", b)
    print(hashlib.sha256(b).hexdigest(), path.split("/checkpoint/")[1])' >>"$out/$job.txt"
    fi
    echo "golden: $job $(grep -c . "$out/$job.txt") lines"
}

run pp1 -- --training.steps 12 --parallelism.pipeline_parallel_degree 1
run pp2 -- --training.steps 12
run gpipe -- --training.steps 12 --parallelism.pipeline_parallel_schedule GPipe --parallelism.pipeline_parallel_microbatches 4
run zbv -- --training.steps 12 --parallelism.pipeline_parallel_schedule ZBVZeroBubble --parallelism.pipeline_parallel_microbatches 4
run dp2 -- --training.steps 12 --parallelism.data_parallel_replicate_degree 2 --optshard.shards 3
run ckpt -- --training.steps 12 --checkpoint.enable true --checkpoint.interval 4 --validation.enable true --validation.dataset_path "$tmp/data/val.bin"
run resume -- --training.steps 12 --checkpoint.enable true --checkpoint.interval 4 \
    --checkpoint.load "$tmp/runs/ckpt/checkpoint/step-00000004" --parallelism.pipeline_parallel_degree 1 \
    --parallelism.data_parallel_replicate_degree 2 --optshard.shards 3
if [ -f "$SIM" ]; then
    S="CTITAN_CUDA_PLUGIN=$SIM"
    VAL="--validation.enable true --validation.dataset_path $tmp/data/val.bin"
    run gpu_pp2 "$S" -- $GPU --training.steps 3 --checkpoint.enable true --checkpoint.interval 3 $VAL
    run gpu_dp2 "$S" -- $GPU --training.steps 3 --parallelism.data_parallel_replicate_degree 2 --optshard.shards 3
    run gpu_offload "$S" -- $GPU --training.steps 3 --optshard.device cpu $VAL
    run gpu_nccl "$S" -- $GPU --training.steps 3 --parallelism.pipeline_parallel_degree 1 \
        --parallelism.data_parallel_replicate_degree 2 --parallelism.data_plane nccl
    # two hosts on this machine (host 1 as under Slurm), one dp replica each, a checkpoint in parts
    keys=$tmp/keys
    mkdir -p "$keys" && "$B/ctitan" ckpt keygen "$keys/host0" >/dev/null 2>&1 && "$B/ctitan" ckpt keygen "$keys/host1" >/dev/null 2>&1
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    H="$GPU --training.steps 4 --parallelism.data_parallel_replicate_degree 2 --parallelism.data_plane nccl
       --checkpoint.enable true --checkpoint.interval 2 --job.hosts 2 --job.endpoint tcp://127.0.0.1:$port --job.keys $keys"
    env "$S" SLURM_STEP_NUM_NODES=2 SLURM_NODEID=1 timeout 600 "$B/ctitan" launch manifests/tiny.toml --job.name ghosts \
        --job.dump_folder "$tmp/runs/hosts" --loader.dataset_path "$tmp/data/train.bin" \
        --metrics.file "$tmp/hosts-h1.jsonl" --metrics.peak_tflops 1 --metrics.log_freq 100000 $H >"$tmp/hosts-h1.out" 2>&1 &
    h1=$!
    run hosts "$S" -- $H
    wait $h1 || { echo "golden: host 1 failed:"; tail -20 "$tmp/hosts-h1.out"; fail=1; }
else
    echo "golden: $SIM not built: the emulated GPU jobs skipped"
fi
exit $fail
