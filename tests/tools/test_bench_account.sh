#!/bin/sh
# mlxdist-bench --account on 2 ranks: the counting columns are there, in the
# CSV and in the table, the fault and context-switch counts are numbers and the
# maximum over the ranks is at least rank 0's, instructions and system calls
# are numbers or n/a, each n/a counter is named once on rank 0's stderr (and
# only then), and without --account the output has its usual 15 columns.
# Usage: test_bench_account.sh MLXDIST-LAUNCH MLXDIST-BENCH
# shellcheck disable=SC2015 # "[ A ] && B || fail": fail when either does not hold
set -u
launch=$1 bench=$2
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAILED: $*"; echo "--- stdout"; cat "$tmp/out"; echo "--- stderr"; cat "$tmp/err"; exit 1; }
run() {
  "$launch" -n 2 --timeout 100 -- "$bench" --op all_sum -b 4 -e 64 -f 4 --min-time 0 -n 20 -w 1 \
    --batches 2 --backend ring "$@" > "$tmp/out" 2> "$tmp/err" || fail "exit $? for $*"
  sed -n 's/^\[0\] //p' "$tmp/out" > "$tmp/r0"
}

# CSV: 15 + 10 columns
run --account --csv
acct=minflt_r0,minflt_max,majflt_r0,majflt_max,csw_r0,csw_max,instr_r0,instr_max,syscalls_r0,syscalls_max
head -n 1 "$tmp/r0" | grep -q ",batch_max_us,$acct\$" || fail "CSV header without the --account columns"
[ "$(grep -c '^mlxdist-ring,all_sum,2,' "$tmp/r0")" = 3 ] || fail "3 CSV rows expected"
awk -F, 'NR > 1 {
  if (NF != 25) { print "row " NR ": " NF " fields"; bad = 1 }
  for (i = 16; i <= 21; i++) if ($i !~ /^[0-9]+\.[0-9][0-9][0-9]$/) { print "row " NR " field " i ": " $i; bad = 1 }
  for (i = 22; i <= 25; i++) if ($i != "n/a" && $i !~ /^[0-9]+(\.[0-9][0-9][0-9])?$/) { print "row " NR " field " i ": " $i; bad = 1 }
  for (i = 16; i <= 24; i += 2)
    if ($i != "n/a" && $(i + 1) != "n/a" && $(i + 1) + 0 < $i + 0) { print "row " NR ": max " $(i + 1) " < rank 0 " $i; bad = 1 }
    else if (($i == "n/a") != ($(i + 1) == "n/a") && $i == "n/a") { print "row " NR ": rank 0 n/a but max not"; bad = 1 }
  na_i += ($22 == "n/a"); na_s += ($24 == "n/a")
} END {
  printf "%d %d\n", na_i, na_s > "/dev/stderr"
  exit bad
}' "$tmp/r0" 2> "$tmp/na" || fail "CSV values: $(cat "$tmp/na")"
read -r na_i na_s < "$tmp/na"
# an n/a column is said once on rank 0's stderr, with its reason; a counted one is not
said_i=$(grep -c '^\[0\] \[bench\] --account: user-space instructions are not counted (n/a): perf_event_open.*: .' "$tmp/err")
said_s=$(grep -c '^\[0\] \[bench\] --account: system calls are not counted (n/a): .' "$tmp/err")
{ [ "$na_i" = 0 ] && [ "$said_i" = 0 ]; } || { [ "$na_i" = 3 ] && [ "$said_i" = 1 ]; } ||
  fail "instructions: $na_i rows n/a, said $said_i times"
{ [ "$na_s" = 0 ] && [ "$said_s" = 0 ]; } || { [ "$na_s" = 3 ] && [ "$said_s" = 1 ]; } ||
  fail "system calls: $na_s rows n/a, said $said_s times"
grep -q '^\[1\] .*--account' "$tmp/err" && fail "rank 1 spoke about the counters"
echo "CSV ok (instructions n/a in $na_i rows, system calls in $na_s)"

# the table: the headers, 11 + 10 fields a row, numbers or n/a
run --account
grep -q '^# account: per op over the timed batches' "$tmp/r0" || fail "no account line in the title"
grep -q 'batches min-max(us) minflt(r0) minflt(mx) majflt(r0) majflt(mx) *csw(r0) *csw(mx) *instr(r0) *instr(mx) *sysc(r0) *sysc(mx)$' "$tmp/r0" ||
  fail "table header"
awk '!/^#/ {
  n++
  if (NF != 21) { print "row: " NF " fields"; bad = 1 }
  for (i = 12; i <= 17; i++) if ($i !~ /^[0-9]+\.[0-9][0-9][0-9]$/) { print "field " i ": " $i; bad = 1 }
  for (i = 18; i <= 21; i++) if ($i != "n/a" && $i !~ /^[0-9]+(\.[0-9][0-9][0-9])?$/) { print "field " i ": " $i; bad = 1 }
} END { if (n != 3) { print n " rows"; bad = 1 }; exit bad }' "$tmp/r0" > "$tmp/why" || fail "table: $(cat "$tmp/why")"
echo "table ok"

# without --account: the usual columns, nothing said
run --csv
head -n 1 "$tmp/r0" | grep -q ',batch_min_us,batch_max_us$' || fail "plain CSV header"
awk -F, 'NR > 1 && NF != 15 { bad = 1 } END { exit bad }' "$tmp/r0" || fail "plain CSV: not 15 fields"
grep -q -- '--account' "$tmp/err" && fail "counters named without --account"
echo "plain ok"
