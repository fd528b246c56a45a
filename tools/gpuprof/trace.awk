# Reading tools/gpuprof/inject.c's traces (with -F'\t' -v bmin=B, B the smallest of the files'
# "# base" headers): each record's start and end as t0 and t1, ns from B, exact in awk's doubles
# (each base is a multiple of 2^32 ns; see inject.c). Goes before the program that reads them.
FNR == 1 {
    if ($0 !~ /^# base [0-9]+$/) { printf "%s: not a gpuprof trace (no \"# base\" line)\n", FILENAME > "/dev/stderr"; exit 1 }
    off = substr($0, 8) - bmin
    next
}
{ t0 = $1 + off; t1 = $2 + off }
