#!/usr/bin/env bash
# One bank of CPU shard state against two (optshard.host_banks, BENCHMARKS.md "One bank of CPU
# shard state"): the same job run with 2 and 1 banks in turn, ROUNDS times (A B A B: the VM's
# speed drifts), each run's median optimizer round (`optimizer_ms`: REDUCE to the last UPDATED)
# and step time after its first two steps, its optstate segment's size and its last loss (the
# same bits either way).
# usage: tools/bench_banks.sh DIR MANIFEST [--section.key value ...]   (DIR: runs and metrics)
#   ROUNDS=N (default 2)
set -u
dir=$1; man=$2; shift 2
extra=("$@")
ctitan=${CTITAN:-build/bin/ctitan}
mkdir -p "$dir"
printf "%-6s %-6s %-16s %-16s %-14s %s\n" banks round "optimizer ms" "step ms" "optstate MiB" "last loss"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for banks in 2 1; do
    job="banks$banks-r$round"
    rm -rf "${dir:?}/$job" "$dir/$job.jsonl"
    "$ctitan" launch "$man" "${extra[@]}" --optshard.host_banks "$banks" --job.name "$job" \
      --job.dump_folder "$dir/$job" --metrics.file "$dir/$job.jsonl" --metrics.log_freq 100000 \
      >"$dir/$job.out" 2>&1 &
    pid=$!
    seg=0 # the optstate segment's allocated bytes, read while the job runs
    while kill -0 "$pid" 2>/dev/null; do
      s=$(du -B1 "/dev/shm/ctitan.$job.optstate" 2>/dev/null | cut -f1)
      [ -n "$s" ] && [ "$s" -gt "$seg" ] && seg=$s
      sleep 0.5
    done
    if ! wait "$pid"; then
      echo "$job failed: see $dir/$job.out" >&2
      exit 1
    fi
    python3 - "$dir/$job.jsonl" "$banks" "$round" "$seg" <<'PY'
import json, statistics, sys
path, banks, rnd, seg = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
rows = [json.loads(l) for l in open(path) if '"loss"' in l][2:]
med = lambda k: statistics.median(r[k] for r in rows)
print(f"{banks:<6} {rnd:<6} {med('optimizer_ms'):<16.1f} {med('step_time_ms'):<16.1f} {seg / 2**20:<14.1f} {rows[-1]['loss']!r}")
PY
  done
done
