# tools/gpu_breakdown.sh's tables from the per-process tables of tools/gpuprof/inject.c
# (gpuprof-<pid>.tsv); with tools/gpuprof/ops.awk: awk -F'\t' -v step=MS -f ops.awk -f breakdown.awk.
FNR == 1 { win[FILENAME] = $0; sub(/.*window_ns /, "", win[FILENAME]); sub(/ .*/, "", win[FILENAME])
           b = $0; sub(/.*busy_ns /, "", b); sub(/ .*/, "", b); busy[FILENAME] = b
           if (win[FILENAME] + 0 > wmax) wmax = win[FILENAME] + 0; next }
{ c = op_of($1, $2); ns[c] += $4; pns[FILENAME, c] += $4; cnt[c] += $3; kn[$1 " " $2] += $4; kc[$1 " " $2] += $3 }
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
}
