#!/usr/bin/env bash
# Parameter sharding's memory and cost (issue 24, BENCHMARKS.md "Parameter sharding"): one
# `ctitan launch` per data-parallel layout of the same job, the same number of replicas each
# (so the same global batch); for each, read while it runs: the bytes in /dev/shm of the params
# and grads segments and of the fsdp segment (the exchanges), the largest private memory
# (RssAnon) and proportional share (Pss, /proc/PID/smaps_rollup: shared pages divided among the
# processes mapping them) of any stage process; after it: the median step time after the first
# step, and the largest relative difference of a loss from the first layout's.
# usage: tools/bench_fsdp.sh DIR MANIFEST [--section.key value ...]   (DIR: runs and metrics)
#   FSDP_LAYOUTS="R,S ...": replicate and shard degrees, in order (default "2,1 1,2")
set -u
dir=$1; man=$2; shift 2
extra=("$@")
ctitan=${CTITAN:-build/bin/ctitan}
mkdir -p "$dir"
read -ra layouts <<<"${FSDP_LAYOUTS:-2,1 1,2}"

tree() {
  local c
  for c in $(pgrep -P "$1"); do echo "$c"; tree "$c"; done
}

printf "%-8s %-12s %-12s %-12s %-13s %-11s %-14s %s\n" layout "params MiB" "grads MiB" "fsdp MiB" "RssAnon MiB" \
  "Pss MiB" "step ms (med)" "loss vs first"
base=""
for lay in "${layouts[@]}"; do
  IFS=, read -r R S <<<"$lay"
  job="fsdp-r$R-s$S"
  rm -rf "${dir:?}/$job" "$dir/$job.jsonl"
  "$ctitan" launch "$man" "${extra[@]}" --job.name "$job" --job.dump_folder "$dir/$job" \
    --metrics.file "$dir/$job.jsonl" --parallelism.data_parallel_replicate_degree "$R" \
    --parallelism.data_parallel_shard_degree "$S" >"$dir/$job.out" 2>&1 &
  lp=$!
  seg_p=0 seg_g=0 seg_f=0 anon=0 pss=0
  while kill -0 "$lp" 2>/dev/null; do
    for s in params grads fsdp; do
      b=$(stat -c '%b %B' "/dev/shm/ctitan.$job.$s" 2>/dev/null | awk '{print $1 * $2}')
      case $s in
        params) [ "${b:-0}" -gt "$seg_p" ] && seg_p=$b ;;
        grads) [ "${b:-0}" -gt "$seg_g" ] && seg_g=$b ;;
        fsdp) [ "${b:-0}" -gt "$seg_f" ] && seg_f=$b ;;
      esac
    done
    for p in $(tree "$lp"); do
      [ "$(cat "/proc/$p/comm" 2>/dev/null)" = ctitan-stage ] || continue
      a=$(awk '/^RssAnon/ {print $2}' "/proc/$p/status" 2>/dev/null)
      q=$(awk '/^Pss:/ {print $2}' "/proc/$p/smaps_rollup" 2>/dev/null)
      [ "${a:-0}" -gt "$anon" ] && anon=$a
      [ "${q:-0}" -gt "$pss" ] && pss=$q
    done
    sleep 0.2
  done
  wait "$lp" || { echo "$job failed: $dir/$job.out"; tail -5 "$dir/$job.out"; continue; }
  med=$(grep -o '"step_time_ms": [0-9.]*' "$dir/$job.jsonl" | tail -n +2 | awk '{print $2}' | sort -n |
        awk '{a[NR]=$1} END {print NR ? a[int((NR+1)/2)] : "-"}')
  losses=$(grep -o '"loss": [-0-9.e]*' "$dir/$job.jsonl" | awk '{print $2}')
  if [ -z "$base" ]; then base=$losses; diff="(first)"
  else diff=$(paste <(echo "$base") <(echo "$losses") | awk '{d = ($1 - $2) / $1; d = d < 0 ? -d : d;
                                                             if (d > m) m = d} END {printf "%.2g", m}'); fi
  mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
  printf "%-8s %-12s %-12s %-12s %-13s %-11s %-14s %s\n" "R$R S$S" "$(mib "$seg_p")" "$(mib "$seg_g")" \
    "$(mib "$seg_f")" "$(mib $((anon * 1024)))" "$(mib $((pss * 1024)))" "$med" "$diff"
done
