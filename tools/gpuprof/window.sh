#!/usr/bin/env bash
# One window for every GPU process of a job, from the traces tools/gpuprof/inject.c writes with
# CTITAN_GPUPROF_TRACE=1 (gpuprof-<pid>.trace, on one clock): the last LAST_MS milliseconds
# before the stage processes' last record ended (a stage: a process that ran an attention
# forward; failing that, the one with the most kernel time). Each process's own table
# (inject.c's gpuprof-<pid>.tsv) ends at its own last record instead, which for a process whose
# last work comes long after the steps (an optimizer shard's copy of its weights at the job's
# end) holds none of them.
#
#   bash tools/gpuprof/window.sh DIR LAST_MS [OUT]
#
# Prints "BASE FROM END STAGE_TRACE...": the window [FROM, END) in ns from BASE, the smallest of
# the traces' bases (tools/gpuprof/trace.awk reads them in that frame); with OUT, also writes
# there one gpuprof-<pid>.tsv per trace in inject.c's format over that window (records clipped
# to it; busy is their union), which tools/gpuprof/breakdown.awk reads as it reads inject.c's.
set -euo pipefail
[ $# = 2 ] || [ $# = 3 ] || { echo "usage: tools/gpuprof/window.sh DIR LAST_MS [OUT]" >&2; exit 2; }
dir=$1 last=$2 out=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
traces=("$dir"/gpuprof-*.trace)
[ -e "${traces[0]}" ] || { echo "window: no gpuprof-*.trace in $dir (CTITAN_GPUPROF_TRACE=1 writes them)" >&2; exit 1; }

stages=()
for t in "${traces[@]}"; do
    if awk -F'\t' -f "$here/ops.awk" -f /dev/stdin "$t" <<'EOF'
$3 == "kernel" && op_of($3, $4) == "attention forward" { found = 1; exit }
END { exit !found }
EOF
    then stages+=("$t"); fi
done
if [ ${#stages[@]} = 0 ]; then
    mapfile -t stages < <(for t in "${traces[@]}"; do
        awk -F'\t' '$3 == "kernel" { s += $2 - $1 } END { printf "%.0f\t%s\n", s, FILENAME }' "$t"
    done | sort -t$'\t' -k1,1nr | head -1 | cut -f2)
fi
# times from the smallest base (tools/gpuprof/trace.awk)
bmin=$(head -qn1 "${traces[@]}" | sed -n 's/^# base //p' | sort -n | head -1)
end=$(awk -F'\t' -v bmin="${bmin:-0}" -f "$here/trace.awk" -f /dev/stdin "${stages[@]}" <<'EOF'
t1 > m { m = t1 }
END { printf "%.0f\n", m }
EOF
)
from=$(awk -v e="$end" -v l="$last" 'BEGIN { printf "%.0f\n", e - l * 1e6 }')

if [ -n "$out" ]; then
    mkdir -p "$out"
    for t in "${traces[@]}"; do
        # the trace is in start order: the union of the clipped records in one pass
        awk -F'\t' -v bmin="${bmin:-0}" -v from="$from" -v end="$end" -f "$here/trace.awk" -f /dev/stdin "$t" <<'EOF' \
            > "$out/$(basename "$t" .trace).tsv"
        { a = t0; b = t1
          if (b <= from && a < from) { skipped++; next }
          if (a >= end) next
          if (a < from) a = from; if (b > end) b = end
          k = $3 "\t" $4; if (!(k in cnt)) order[++n] = k; cnt[k]++; ns[k] += b - a
          if (open && a <= hi) { if (b > hi) hi = b; next }
          if (open) busy += hi - lo; lo = a; hi = b; open = 1 }
        END { if (open) busy += hi - lo
              printf "# window_ns %.0f busy_ns %.0f skipped %d\n", end - from, busy, skipped
              for (i = 1; i <= n; i++) printf "%s\t%d\t%.0f\n", order[i], cnt[order[i]], ns[order[i]] }
EOF
    done
fi
echo "$bmin $from $end ${stages[*]}"
