#!/bin/sh
# scripts/bench-compare-runs.sh on two made-up result directories: the ratios,
# how far apart they are (max/min - 1), the count within 25 %, the rows below
# --from left out, and the exit status (0 all within, 1 not, 2 bad input).
# shellcheck disable=SC2015 # "[ A ] && B || fail": fail when either does not hold
set -u
cmp=$1
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAILED: $*"; cat "$tmp/out"; exit 1; }
mkdir "$tmp/a" "$tmp/b"
h=variant,op,ranks,size,runs,time_med_us,time_min_us,time_max_us,busbw_med,busbw_min,busbw_max
# A: ratios 2.0 (shm 64K), 1.5 (tcp 4M), 3.0 (shm 1K, below --from)
printf '%s\n' "$h" \
  mlxdist-default,all_sum,2,65536,3,10,9,11,1,1,1 mpi-shm,all_sum,2,65536,3,20,19,21,1,1,1 \
  mlxdist-tcp,all_sum,4,4194304,3,100,90,110,1,1,1 mpi-tcp,all_sum,4,4194304,3,150,140,160,1,1,1 \
  mlxdist-default,all_sum,2,1024,3,1,1,1,1,1,1 mpi-shm,all_sum,2,1024,3,3,3,3,1,1,1 > "$tmp/a/summary.csv"
# B: 2.4 (20 % apart), 1.0 (50 % apart), 1.0 at 1K
printf '%s\n' "$h" \
  mlxdist-default,all_sum,2,65536,3,10,9,11,1,1,1 mpi-shm,all_sum,2,65536,3,24,19,25,1,1,1 \
  mlxdist-tcp,all_sum,4,4194304,3,150,140,160,1,1,1 mpi-tcp,all_sum,4,4194304,3,150,140,160,1,1,1 \
  mlxdist-default,all_sum,2,1024,3,1,1,1,1,1,1 mpi-shm,all_sum,2,1024,3,1,1,1,1,1,1 > "$tmp/b/summary.csv"

sh "$cmp" "$tmp/a" "$tmp/b" > "$tmp/out" 2>&1
[ $? = 1 ] || fail "one row 50 % apart: exit 1 expected"
grep -q '^1 of 2 rows (sizes from 65536 B) within 25 %; furthest apart: 50.0 %' "$tmp/out" ||
  fail "count line"
grep -q '^mlxdist-default  all_sum         2      65536        2      2.4   20.0%$' "$tmp/out" ||
  fail "64K row"
grep -q '^mlxdist-tcp .*4194304 *1.5 *1   50.0%  MISS$' "$tmp/out" || fail "4M row"
grep -q ' 1024 ' "$tmp/out" && fail "a row below --from was compared"
# the order of the runs does not matter
sh "$cmp" "$tmp/b" "$tmp/a" > "$tmp/out" 2>&1
grep -q '^1 of 2 rows .* 50.0 %' "$tmp/out" || fail "reversed order"
# everything within: exit 0
sh "$cmp" --within 60 --from 1K "$tmp/a" "$tmp/b" > "$tmp/out" 2>&1 && fail "1K rows are 200 % apart"
sh "$cmp" --within 60 "$tmp/a" "$tmp/b" > "$tmp/out" 2>&1 || fail "all within 60 %: exit 0 expected"
grep -q '^2 of 2 rows' "$tmp/out" || fail "count within 60 %"
# a row missing from one run counts as not within
grep -v '^mpi-tcp' "$tmp/b/summary.csv" > "$tmp/b/s" && mv "$tmp/b/s" "$tmp/b/summary.csv"
sh "$cmp" --within 60 "$tmp/a" "$tmp/b" > "$tmp/out" 2>&1
[ $? = 1 ] || fail "missing row: exit 1 expected"
grep -q 'MISSING' "$tmp/out" || fail "missing row not shown"
# bad input: exit 2 with a message naming the problem
sh "$cmp" "$tmp/a" > "$tmp/out" 2>&1
[ $? = 2 ] && grep -q 'two results directories' "$tmp/out" || fail "one directory"
sh "$cmp" "$tmp/a" "$tmp/nope" > "$tmp/out" 2>&1
[ $? = 2 ] && grep -q 'nope/summary.csv' "$tmp/out" || fail "missing directory"
sh "$cmp" --within abc "$tmp/a" "$tmp/b" > "$tmp/out" 2>&1
[ $? = 2 ] && grep -q "'abc'" "$tmp/out" || fail "bad --within"
sh "$cmp" --from 12Q "$tmp/a" "$tmp/b" > "$tmp/out" 2>&1
[ $? = 2 ] && grep -q "'12Q'" "$tmp/out" || fail "bad --from"
echo "test_bench_compare: all passed"
