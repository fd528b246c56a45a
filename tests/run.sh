#!/usr/bin/env bash
# Runs each cmocka test program given and prints one summary line; exits non-zero if any failed.
# Each program's wall time is printed as `time: NAME S s (cpu C s)` (where make test's minutes go;
# C: the CPU time of the program and of its jobs' processes it waited for, user and system).
#
# An argument PROG:GLOBS runs PROG with CTITAN_TEST_ONLY=GLOBS (tests/testutil.h: comma-separated
# globs, a leading '-' leaving out). TEST_JOBS=N (default 1) runs up to N programs at once, in the
# order given (list the long ones first), each program's output printed whole as it ends; the
# programs named in TEST_SERIAL (space-separated base names: those that look at what every job
# of this user leaves in /dev/shm, such as the freers' lock file) run alone, after the others.
# TEST_RECAP=FILE: the failed programs are also added to FILE as one line, after TEST_LABEL.
set -u
jobs=${TEST_JOBS:-1}
[[ $jobs =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: TEST_JOBS must be a count of programs (1, 2, ...), not '$jobs'" >&2; exit 2; }
serial=" ${TEST_SERIAL:-} "
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0; fail=0; skip=0; failed=()

# run K ARG, in a subshell of its own (&): runs one program, its output to $tmp/K.out, "status
# seconds cpu-seconds" to $tmp/K.rc
run() {
  local k=$1 prog=${2%%:*} t0=$EPOCHREALTIME rc
  [ "$prog" != "$2" ] && export CTITAN_TEST_ONLY="${2#*:}"
  CMOCKA_MESSAGE_OUTPUT=stdout "$prog" >"$tmp/$k.out" 2>&1
  rc=$?
  # this subshell's children's CPU time (times' second line): the program and every process of
  # its jobs that was waited for
  local cpu
  times >"$tmp/$k.cpu" # not in a pipe: a forked shell has no children yet
  cpu=$(awk 'NR == 2 { n = 0; for (i = 1; i <= 2; i++) { split($i, t, /[ms]/); n += t[1] * 60 + t[2] } printf "%.1f", n }' "$tmp/$k.cpu")
  echo "$rc $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') $cpu" >"$tmp/$k.rc"
}

# report K ARG: prints program K's output and time and adds it to the counts
report() {
  local k=$1 prog=${2%%:*} only=${CTITAN_TEST_ONLY:-} rc secs cpu out=$tmp/$1.out
  [ "$prog" != "$2" ] && only=${2#*:}
  read -r rc secs cpu <"$tmp/$k.rc"
  cat "$out"
  printf 'time: %s %s s (cpu %s s)\n' "$(basename "$prog")${only:+ ($only)}" "$secs" "$cpu"
  local p f s
  p=$(grep -c '^\[       OK \]' "$out"); f=$(grep '^\[  FAILED  \]\s*test' "$out" | sort -u | wc -l)
  s=$(grep '^\[  SKIPPED \]\s*test' "$out" | sort -u | wc -l)
  pass=$((pass + p)); skip=$((skip + s))
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi   # a crash before cmocka reports counts as a failure
  fail=$((fail + f))
  [ "$rc" -ne 0 ] && failed+=("$(basename "$prog")${only:+ ($only)}")
  rm -f "$out" "$tmp/$k.rc" "$tmp/$k.cpu"
}

args=("$@")
order=() late=()
for i in "${!args[@]}"; do
  base=$(basename "${args[$i]%%:*}")
  if [[ "$serial" == *" $base "* ]]; then late+=("$i"); else order+=("$i"); fi
done

declare -A running=() # pid -> argument index
# reap_one: waits for one running program to end and reports it
reap_one() {
  local done
  wait -n -p done "${!running[@]}"
  report "${running[$done]}" "${args[${running[$done]}]}"
  unset "running[$done]"
}
for i in "${order[@]}"; do
  while [ "${#running[@]}" -ge "$jobs" ]; do reap_one; done
  run "$i" "${args[$i]}" &
  running[$!]=$i
done
while [ "${#running[@]}" -gt 0 ]; do reap_one; done
for i in "${late[@]}"; do
  run "$i" "${args[$i]}" &
  running[$!]=$i
  reap_one
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "failed programs: ${failed[*]}"
  # make test's recap (Makefile TEST_RECAP): which part failed, printed again at its end
  [ -z "${TEST_RECAP:-}" ] || echo "${TEST_LABEL:-run.sh}: ${failed[*]}" >>"$TEST_RECAP"
fi
echo "tests: $pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ] && [ ${#failed[@]} -eq 0 ]
