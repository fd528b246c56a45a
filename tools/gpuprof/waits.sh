#!/usr/bin/env bash
# What the device ran while a stage waited: from the traces tools/gpuprof/inject.c writes with
# CTITAN_GPUPROF_TRACE=1 (gpuprof-<pid>.trace, one per GPU process of a job, on one clock), for
# each stage process (tools/gpuprof/window.sh's) the time in the window it had nothing on the
# device, split by what the other processes ran meanwhile (their kernels first, then memsets,
# then copies: the first of these that anything was running; shared equally among those
# running) or "nothing": no process ran anything, the time the step spent in host round trips,
# context switches and launches.
#
#   bash tools/gpuprof/waits.sh DIR LAST_MS STEP_MS
#
# The window is tools/gpuprof/window.sh's: the last LAST_MS milliseconds before the stages' last
# record ended, the same for every process (a process whose last work came long after the
# steps, e.g. at the job's end, is still read over the steps). Prints a markdown table, ms per
# step (STEP_MS long).
set -euo pipefail
[ $# = 3 ] || { echo "usage: tools/gpuprof/waits.sh DIR LAST_MS STEP_MS" >&2; exit 2; }
dir=$1 last=$2 step=$3
here=$(cd "$(dirname "$0")" && pwd)
traces=("$dir"/gpuprof-*.trace)
[ -e "${traces[0]}" ] || { echo "waits: no gpuprof-*.trace in $dir (CTITAN_GPUPROF_TRACE=1 writes them)" >&2; exit 1; }

read -r bmin from end stage_list < <(bash "$here/window.sh" "$dir" "$last")
[ -n "${end:-}" ] || { echo "waits: tools/gpuprof/window.sh found no window in $dir" >&2; exit 1; }
read -r -a stages <<<"$stage_list"

echo "| stage process | waits, ms per step | the device ran nothing | meanwhile, other processes ran (ms per step) |"
echo "|---|---|---|---|"
for s in "${stages[@]}"; do
    # every record's start and end inside the window as an event, in time order, then a sweep
    awk -F'\t' -v stage="$s" -v bmin="$bmin" -v from="$from" -v end="$end" -f "$here/ops.awk" -f "$here/trace.awk" \
        -f /dev/stdin "${traces[@]}" <<'EOF' |
BEGIN { printf "%.0f\t0\tstage\t0\t-\n%.0f\t0\tstage\t0\t-\n", from, end }
{ a = t0; b = t1; if (b <= from || a >= end) next
  if (a < from) a = from; if (b > end) b = end
  who = FILENAME == stage ? "stage" : FILENAME; sub(/.*gpuprof-/, "", who); sub(/\.trace$/, "", who)
  cls = $3 == "kernel" ? 1 : $3 == "memset" ? 2 : 3
  printf "%.0f\t1\t%s\t%d\t%s\n", a, who, cls, op_of($3, $4)
  printf "%.0f\t-1\t%s\t%d\t%s\n", b, who, cls, op_of($3, $4) }
EOF
    sort -t$'\t' -k1,1n -k2,2n |
    awk -F'\t' -v steps="$(awk -v l="$last" -v s="$step" 'BEGIN { printf "%.6f", (s > 0 ? l / s : 1) }')" \
        -v pid="$(basename "$s" .trace | sed 's/^gpuprof-//')" '
    function attribute(dt,   k, best, n, c) {
        best = 4
        for (k in on) if (on[k] > 0) { split(k, c, SUBSEP); if (c[2] + 0 < best) best = c[2] + 0 }
        if (best == 4) { nothing += dt; return }
        n = 0
        for (k in on) if (on[k] > 0) { split(k, c, SUBSEP); if (c[2] + 0 == best) n++ }
        for (k in on) if (on[k] > 0) { split(k, c, SUBSEP); if (c[2] + 0 == best) meanwhile[c[3] " [" c[1] "]"] += dt / n }
    }
    { t = $1 + 0
      if (started && busy == 0 && t > prev) { waits += t - prev; attribute(t - prev) }
      started = 1; prev = t
      if ($3 == "stage") busy += $2; else on[$3, $4, $5] += $2 }
    END {
        m = 0
        for (k in meanwhile) order[++m] = k
        for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (meanwhile[order[j]] > meanwhile[order[i]]) { x = order[i]; order[i] = order[j]; order[j] = x }
        text = ""
        for (i = 1; i <= m && i <= 5; i++) text = text (i > 1 ? ", " : "") sprintf("%s %.3f", order[i], meanwhile[order[i]] / 1e6 / steps)
        printf "| pid %s | %.3f | %.3f | %s |\n", pid, waits / 1e6 / steps, nothing / 1e6 / steps, text == "" ? "-" : text
    }'
done
