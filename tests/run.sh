#!/usr/bin/env bash
# Runs each cmocka test program given and prints one summary line; exits non-zero if any failed.
# Each program's wall time is printed as `time: NAME S s` (where make test's minutes go).
set -u
pass=0; fail=0; skip=0; failed=()
for t in "$@"; do
  out=$(mktemp)
  t0=$EPOCHREALTIME
  CMOCKA_MESSAGE_OUTPUT=stdout "$t" >"$out" 2>&1
  rc=$?
  cat "$out"
  printf 'time: %s %.1f s\n' "$(basename "$t")${CTITAN_TEST_ONLY:+ ($CTITAN_TEST_ONLY)}" "$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { print b - a }')"
  p=$(grep -c '^\[       OK \]' "$out"); f=$(grep '^\[  FAILED  \]\s*test' "$out" | sort -u | wc -l); s=$(grep '^\[  SKIPPED \]\s*test' "$out" | sort -u | wc -l)
  pass=$((pass + p)); skip=$((skip + s))
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi   # a crash before cmocka reports counts as a failure
  fail=$((fail + f))
  [ "$rc" -ne 0 ] && failed+=("$(basename "$t")")
  rm -f "$out"
done
[ ${#failed[@]} -gt 0 ] && echo "failed programs: ${failed[*]}"
echo "tests: $pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ] && [ ${#failed[@]} -eq 0 ]
