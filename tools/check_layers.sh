#!/usr/bin/env bash
# The house's floors, checked from the includes: a file may include its own folder and the
# folders on floors below it, never one above or beside (README.md "Layout"). make test runs
# this. A folder is a top-level folder, or one of stages/'s sub-folders:
#   floor 0: kernels/ ipc/                       (the math; the transports and control messages)
#   floor 1: stages/job/ stages/data/            (the job description and segment layouts; data formats)
#   floor 2: stages/runtime/ stages/report/      (the worker runtime and data plane; what a run reports)
#   floor 3: checkpointd/ stages/plan/           (the checkpoint format and its daemon, a worker; the memory plan)
#   floor 4: stages/coord/ stages/roles/         (the coordinator; the role processes)
#   floor 5: stages/supervise/                   (the supervisor: a failed run relaunched)
#   floor 6: tools/                              (the ctitan command)
set -u
cd "$(dirname "$0")/.."
floor() {
    case $1 in
    kernels | ipc) echo 0 ;;
    stages/job | stages/data) echo 1 ;;
    stages/runtime | stages/report) echo 2 ;;
    checkpointd | stages/plan) echo 3 ;;
    stages/coord | stages/roles) echo 4 ;;
    stages/supervise) echo 5 ;;
    tools) echo 6 ;;
    *) echo -1 ;;
    esac
}
# the folder a path is in, as the floors name it
folder() {
    case $1 in
    stages/*/*) local rest=${1#stages/}; echo "stages/${rest%%/*}" ;;
    */*) echo "${1%%/*}" ;;
    *) echo "" ;;
    esac
}
bad=0 n=0
while IFS= read -r f; do
    top=$(folder "$f")
    mine=$(floor "$top")
    if [ "$mine" -lt 0 ]; then
        echo "layers: $f is in no floor's folder ($top)"
        bad=$((bad + 1))
        continue
    fi
    while IFS= read -r inc; do
        n=$((n + 1))
        dir=$(folder "$inc")
        theirs=$(floor "$dir")
        [ "$theirs" -lt 0 ] && continue
        if [ "$theirs" -gt "$mine" ] || { [ "$theirs" -eq "$mine" ] && [ "$dir" != "$top" ]; }; then
            echo "layers: $f includes \"$inc\": $dir/ is not below $top/"
            bad=$((bad + 1))
        fi
    done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
done < <(git ls-files 'kernels/*' 'ipc/*' 'stages/*' 'checkpointd/*' 'tools/*' | grep -E '\.(c|h|cu|cuh|cpp)$')
if [ "$bad" -gt 0 ]; then
    echo "layers: $bad include(s) point up or sideways"
    exit 1
fi
echo "layers: $n includes checked, every one points down"
