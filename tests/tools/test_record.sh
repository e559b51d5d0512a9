#!/bin/sh
# The operation record and mlxdist-launch as supervisor (docs/troubleshooting.md),
# with real processes: test_record.sh CASE LAUNCHER RANK_PROGRAM (rec_rank.c).
#   hang      3 ranks, the last waits in a recv nobody sends, --timeout 6: exit 124,
#             each rank's record, and the table marks rank 2 as behind
#   kill      rank 1 dies of SIGKILL: the summary names rank 1 as the first failure
#   exitrecv  rank 0 exits with a recv pending: rank 1's recv fails within 5 s naming
#             rank 0 and the closed group, and the job ends within 20 s (exitrecv_tcp: over TCP;
#             exitrecv: the default transport, shared memory on one host)
#   stop      rank 1 stops itself (SIGSTOP): the launcher reports it stopped
#   signal    MLXDIST_DUMP_SIGNAL=0 given by the user: no record is asked for (the
#             ranks keep SIGUSR1's default) and the table says so
set -u
case_=$1
launch=$2
prog=$3
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fail=0

check() { # check DESCRIPTION GREP-PATTERN: the pattern must be in the output
  if grep -E -q -- "$2" "$out"; then
    echo "ok: $1"
  else
    echo "FAIL: $1 (no line matches: $2)"
    fail=1
  fi
}

run() { # run EXPECTED-STATUS MAX-SECONDS ARGS...: the launcher's status and time
  want=$1
  max=$2
  shift 2
  t0=$(date +%s.%N)
  "$launch" "$@" >"$out" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  cat "$out"
  took=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
  if [ "$rc" -ne "$want" ]; then
    echo "FAIL: the launcher exited $rc (expected $want)"
    fail=1
  fi
  if awk -v t="$took" -v m="$max" 'BEGIN { exit !(t > m) }'; then
    echo "FAIL: the job took $took s (expected at most $max s)"
    fail=1
  fi
  echo "(exit $rc after $took s)"
}

case $case_ in
hang)
  run 124 20 -n 3 --timeout 6 -- "$prog" hang
  check "rank 2 prints its record on SIGUSR1" '^\[2\] \[mlxdist\] record rank 2/3 pid [0-9]+ host [^ ]+ \(signal\): in recv #0 for [0-9.]+ s; colls 2$'
  check "rank 0's record shows the all_sum it waits in" '^\[0\] \[mlxdist\]   all_sum #2 float32 16 B: running for'
  check "the table's heading" '^\[launch\] where every rank was when the timeout expired'
  check "rank 0 in all_sum #2" '^\[launch\]   0 +[^ ]+ +all_sum #2 +in +[0-9.]+ s$'
  check "rank 2 marked behind" '^\[launch\]   2 +[^ ]+ +recv #0 +in +[0-9.]+ s +<- behind: 1 collective behind'
  ;;
kill)
  run 137 15 -n 3 -- "$prog" kill
  check "the summary names rank 1 first" '^\[launch\] first failure: rank 1 \([^)]+\): was killed by signal 9'
  # The summary comes last: no line of another rank after it.
  last=$(grep -n 'first failure' "$out" | cut -d: -f1)
  if tail -n +"$last" "$out" | grep -q '^\[[02]\]'; then
    echo "FAIL: ranks' lines after the summary"
    fail=1
  fi
  ;;
exitrecv | exitrecv_tcp)
  transport=auto
  [ "$case_" = exitrecv_tcp ] && transport=tcp
  # The job's bound tells an exit that waits for the pending recv (MLXDIST_TIMEOUT, 60 s)
  # from one that does not; rank 1 checks its recv's 5 s itself. It is not tighter: the
  # start and exit of sanitized ranks on a busy host took up to 16 s (LeakSanitizer's scan
  # at exit stops the process, seen by the launcher as a stopped rank).
  run 0 20 -n 2 --env MLXDIST_TRANSPORT=$transport -- "$prog" exitrecv
  if [ "$case_" = exitrecv ]; then
    # shm relays the abort: the peer's recv fails with rank 0's own reason
    check "rank 1's recv fails naming rank 0" "^\[1\] rec_rank: rank 1's recv failed after [0-4]\.[0-9]+ s: \[ring\] recv #0: the group was closed with this operation pending.*rank 0"
  else
    # TCP: the relayed reason where the transport relays aborts, else the closed connection
    check "rank 1's recv fails naming rank 0" "^\[1\] rec_rank: rank 1's recv failed after [0-4]\.[0-9]+ s: \[ring\] recv #0: (the group was closed with this operation pending.*reported by rank 0|lost connection to rank 0)"
  fi
  ;;
stop)
  run 124 20 -n 3 --timeout 5 -- "$prog" stop
  check "the stopped rank is reported" '^\[launch\] rank 1 \(pid [0-9]+\) is stopped \(state T'
  check "the table marks it" '^\[launch\]   1 .*<- stopped \(state T\)$'
  check "the others' records" '^\[0\] \[mlxdist\] record rank 0/3 .*\(signal\): in all_sum #1 for'
  ;;
signal)
  run 124 12 -n 2 --timeout 2 --env MLXDIST_DUMP_SIGNAL=0 -- "$prog" hang
  check "no record asked for" 'timeout: .*; killing 2 ranks\.$'
  check "the table says there is none" '^\[launch\]   0 .*<- no record'
  if grep -q 'record rank' "$out"; then
    echo "FAIL: a record was printed with MLXDIST_DUMP_SIGNAL=0"
    fail=1
  fi
  ;;
*)
  echo "unknown case $case_"
  exit 2
  ;;
esac
exit $fail
