#!/usr/bin/env bash
# The house's floors, checked from the includes: a file may include its own folder and the
# folders below it, never one above (README.md "Layout"). make test runs this.
#   floor 0: kernels/ and ipc/ (independent of each other)
#   floor 1: stages/     (the roles: job description, segments, worker runtime, coordinator)
#   floor 2: checkpointd/ (the checkpoint format and its daemon, a worker on stages/)
#   floor 3: tools/      (the ctitan command)
set -u
cd "$(dirname "$0")/.."
floor() {
    case $1 in
    kernels|ipc) echo 0 ;;
    stages) echo 1 ;;
    checkpointd) echo 2 ;;
    tools) echo 3 ;;
    *) echo -1 ;;
    esac
}
bad=0 n=0
while IFS= read -r f; do
    top=${f%%/*}
    mine=$(floor "$top")
    while IFS= read -r inc; do
        n=$((n + 1))
        dir=${inc%%/*}
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
