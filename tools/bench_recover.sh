#!/usr/bin/env bash
# `make bench-recover` (issue 13): the demo model trained twice with the same manifest, once
# undisturbed and once with a kill -9 of a random role every KILL_EVERY steps (seeded), and
# then: the effective training time (undisturbed wall time / disturbed wall time), the losses
# of both runs compared bit for bit, and each recovery's time from the restart records
# (recovery_s: from the death seen to the redone round sent; time_lost_s: with the step's work
# thrown away). Environment: STEPS (300), KILL_EVERY (20), SEED (1), ROLES (the roles to draw
# from: stage0 stage1 shard0 shard1 loader checkpointd coordinator), OUT (a folder to keep).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=build/bin/ctitan
steps=${STEPS:-300} every=${KILL_EVERY:-20} seed=${SEED:-1}
roles=(${ROLES:-stage0 stage1 shard0 shard1 loader checkpointd coordinator})
out=${OUT:-$(mktemp -d /tmp/ctitan-bench-recover-XXXXXX)}
mkdir -p "$out"
[ -f data/fortunes/train.bin ] || "$bin" prep --out data/fortunes
common=(--training.steps "$steps" --checkpoint.enable true --checkpoint.interval "$every" --metrics.log_freq 100000
        --job.restart_backoff_ms 0)

# pid of a role's process among the launch's descendants
find_role() {
    local launch=$1 role=$2 comm args
    case $role in
        stage0) comm=ctitan-stage; args="--rank 0 " ;;
        stage1) comm=ctitan-stage; args="--rank 1 " ;;
        shard0) comm=ctitan-optshard; args="--rank 0" ;;
        shard1) comm=ctitan-optshard; args="--rank 1" ;;
        loader) comm=ctitan-loader; args="" ;;
        checkpointd) comm=checkpointd; args="" ;;
        coordinator) comm=ctitan-coord; args="" ;;
    esac
    for p in $(pgrep -x "${comm:0:15}"); do
        local anc=$p
        for _ in 1 2 3; do anc=$(ps -o ppid= -p "$anc" 2>/dev/null | tr -d ' ') || break; [ "$anc" = "$launch" ] && break; done
        [ "$anc" = "$launch" ] || continue
        tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null | grep -q -- "$args" && { echo "$p"; return; }
    done
}

run() { # run NAME [kill]: wall seconds to stdout
    local name=$1 kills=${2:-}
    rm -rf "$out/$name"
    local t0 t1
    t0=$(date +%s.%N)
    "$bin" launch manifests/demo.toml --job.name "br$$$name" --job.dump_folder "$out/$name" \
        --metrics.file "$out/$name.jsonl" "${common[@]}" > "$out/$name.out" 2>&1 &
    local launch=$!
    if [ -n "$kills" ]; then
        RANDOM=$seed
        local next=$every
        while kill -0 "$launch" 2>/dev/null; do
            local done_steps
            done_steps=$(grep -c '^{"step"' "$out/$name.jsonl" 2>/dev/null || true)
            if [ "${done_steps:-0}" -ge "$next" ] && [ "$next" -lt "$steps" ]; then
                sleep "0.$(printf '%03d' $((RANDOM % 500)))"
                local role=${roles[$((RANDOM % ${#roles[@]}))]} pid
                pid=$(find_role "$launch" "$role")
                [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null && echo "kill -9 $role (pid $pid) after step $done_steps" >> "$out/kills.txt"
                next=$((next + every))
            fi
            sleep 0.05
        done
    fi
    wait "$launch"
    t1=$(date +%s.%N)
    echo "$t1 - $t0" | bc
}

: > "$out/kills.txt"
t_plain=$(run plain)
t_kill=$(run killed kill)
losses() { grep -o '"step": [0-9]*, "loss": [^,]*' "$1" | sort -u; }
if diff <(losses "$out/plain.jsonl") <(losses "$out/killed.jsonl") > /dev/null; then same=yes; else same=NO; fi
echo "bench-recover: $(date -u +%F) $(nproc) CPUs, demo model, $steps steps, checkpoint every $every, seed $seed"
echo "kills: $(wc -l < "$out/kills.txt") ($(cut -d' ' -f3 "$out/kills.txt" | sort | uniq -c | tr -s ' ' | paste -sd,))"
echo "undisturbed ${t_plain} s, with kills ${t_kill} s: effective training time $(echo "scale=1; 100 * $t_plain / $t_kill" | bc) %"
echo "every step's loss bitwise as undisturbed: $same"
field() { grep -o "\"$1\": [^,}]*" <<< "$2" | head -1 | sed -E 's/.*: "?([^"]*)"?/\1/'; }
grep '^{"restart"' "$out/killed.jsonl" | while read -r rec; do
    echo "$(field scope "$rec") $(field role "$rec") $(field recovery_s "$rec") $(field time_lost_s "$rec")"
done | awk '{k = $1 " " $2; n[k]++; if ($3 != "") r[k] += $3; l[k] += $4}
    END {for (k in n) printf "  %s: %d, mean recovery %.3f s (scope job: not measured), mean time lost %.2f s\n", k, n[k], r[k] / n[k], l[k] / n[k]}'
echo "(files in $out)"
