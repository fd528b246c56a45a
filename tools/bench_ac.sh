#!/usr/bin/env bash
# Activation checkpointing's saving and cost on the CPU (issue 24, BENCHMARKS.md): one
# `ctitan launch` per mode of the same job; for each, the peak resident set (VmHWM) of every
# stage process, read from /proc while it runs, the median step time after the first step,
# the job's own memory figure (mem_peak_bytes of the metrics: the largest stage's peak resident
# set on the CPU, the device's memory in use with --job.device cuda), and whether the losses
# equal mode none's bit for bit.
# usage: tools/bench_ac.sh DIR MANIFEST [--section.key value ...]   (DIR: runs and metrics)
set -u
dir=$1; man=$2; shift 2
extra=("$@")
ctitan=${CTITAN:-build/bin/ctitan}
mkdir -p "$dir"
read -ra modes <<<"${AC_MODES:-none full selective,2 selective,op}" # AC_MODES: which, in order

# Descendant pids of $1, one a line.
tree() {
  local c
  for c in $(pgrep -P "$1"); do echo "$c"; tree "$c"; done
}

printf "%-13s %-22s %-14s %-10s %s\n" mode "VmHWM MiB per rank" "step ms (med)" losses "mem_peak MiB"
base=""
run=0
for mode in "${modes[@]}"; do
  IFS=, read -r m opt <<<"$mode"
  job="ac-$m${opt:+-$opt}-$((++run))"
  args=(--activation_checkpoint.mode "$m")
  [ -n "$opt" ] && args+=(--activation_checkpoint.selective_ac_option "$opt")
  rm -rf "$dir/$job" "$dir/$job.jsonl"
  "$ctitan" launch "$man" "${extra[@]}" --job.name "$job" --job.dump_folder "$dir/$job" \
    --metrics.file "$dir/$job.jsonl" "${args[@]}" >"$dir/$job.out" 2>&1 &
  lp=$!
  declare -A hwm=()
  while kill -0 "$lp" 2>/dev/null; do
    for p in $(tree "$lp"); do
      { cmd=$(tr '\0' ' ' <"/proc/$p/cmdline"); } 2>/dev/null || continue
      case "$cmd" in *ctitan-stage*) ;; *) continue ;; esac
      r=$(sed -n 's/.*--rank \([0-9]*\).*/\1/p' <<<"$cmd")
      kb=$(awk '/^VmHWM/ {print $2}' "/proc/$p/status" 2>/dev/null) || continue
      [ -n "$kb" ] && [ "$kb" -gt "${hwm[$r]:-0}" ] && hwm[$r]=$kb
    done
    sleep 0.1
  done
  wait "$lp" || { echo "$job failed: $dir/$job.out"; tail -5 "$dir/$job.out"; continue; }
  mib=""
  for r in $(printf '%s\n' "${!hwm[@]}" | sort -n); do mib+="$(( ${hwm[$r]} / 1024 )) "; done
  med=$(grep -o '"step_time_ms": [0-9.]*' "$dir/$job.jsonl" | tail -n +2 | awk '{print $2}' | sort -n |
        awk '{a[NR]=$1} END {print NR ? a[int((NR+1)/2)] : "-"}')
  losses=$(grep -o '"loss": [-0-9.e]*' "$dir/$job.jsonl")
  if [ -z "$base" ]; then base=$losses; same="(baseline)";
  elif [ "$losses" = "$base" ]; then same="bitwise"; else same="DIFFER"; fi
  peak=$(grep -o '"mem_peak_bytes": [0-9]*' "$dir/$job.jsonl" | tail -1 | awk '{printf "%.1f", $2 / 1048576}')
  printf '%-13s %-22s %-14s %-10s %s\n' "${mode/,/ }" "$mib" "$med" "$same" "$peak"
  unset hwm
done
