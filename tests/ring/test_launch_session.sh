#!/bin/sh
# The shared-memory session mlxdist-launch names (MLXDIST_SHM_SESSION): the
# ranks of a job on this host exchange their host records through it instead
# of over TCP (select.c mlxd_ring_select_local). Real processes, the real
# launcher, scale_rank (strict init, all_sum, all_gather, ring exchange, each
# checked) as the program.
#   test_launch_session.sh CASE LAUNCHER SCALE_RANK
# Cases:
#   shm       3 ranks: every rank says it took the launcher's session, holds no
#             TCP connection, and its results are right
#   tcp       --env MLXDIST_TRANSPORT=tcp, and the same in the launcher's own
#             environment: no session is named (the ranks see none) and the job
#             runs over TCP
#   disagree  rank 1 has MLXDIST_TRANSPORT=tcp, then MLXDIST_SMALL_ALGO=direct:
#             every rank fails naming the setting and both values, at once
#   hosts     MLXDIST_HOST_ID says 2 hosts: the session only carries the
#             records; the TCP exchange decides (mixed transport), results right
#   apart     rank 1 is given another session name: both ranks fail within the
#             join's bound (MLXDIST_CONNECT_TIMEOUT=2), naming the missing rank
#   badname   a session name shared memory cannot take: every rank fails naming
#             MLXDIST_SHM_SESSION and why
#   inherit   a session in the launcher's own environment (an outer job's) with
#             MLXDIST_TRANSPORT=tcp: the ranks see it emptied, and run over TCP
#   job       rank 1 has another job token: every rank that sees it fails naming
#             the rank and MLXDIST_JOB_TOKEN (no handshake checks tokens here)
#   machine   2 ranks as 2 emulated hosts (MLXDIST_HOST_ID) on 1 CPU (taskset),
#             over TCP: each counts both ranks on its machine and its TCP waits
#             yield (they once counted the ranks of their host, 1, and spun)
# The failing cases also check that the session left no name in /dev/shm.
set -u
case_=$1
launch=$2
rankp=$3
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fail() {
  echo "FAIL ($case_): $*" >&2
  echo "---- output" >&2
  cat "$out" >&2
  exit 1
}
# run the launcher, output in $out, exit status in $rc, seconds in $secs
go() {
  t0=$(date +%s)
  "$launch" "$@" >"$out" 2>&1
  rc=$?
  secs=$(($(date +%s) - t0))
}
oks() { grep -c "scale rank [0-9]* n $1 .* ok$" "$out"; }
# the rank program, failing when its environment names a session
nosession='[ -z "${MLXDIST_SHM_SESSION:-}" ] || { echo "session named: $MLXDIST_SHM_SESSION"; exit 3; }; exec "$0"'
# the last 2-rank job passed, over TCP ($1: which run)
passed_over_tcp() {
  [ "$rc" -eq 0 ] || fail "exit $rc ($1)"
  [ "$(oks 2)" -eq 2 ] || fail "expected 2 checked ranks ($1)"
  grep -q 'scale rank 0 n 2 .* tcp 1 ' "$out" || fail "rank 0 is not over TCP ($1)"
}
# 2 ranks, rank 1 with shell statement $1 first: the job must fail within 20 s, with a line
# matching $2 (grep) in its output, and leave no name of its session in /dev/shm
rank1_fails() {
  go -n 2 --timeout 60 --env MLXDIST_CONNECT_TIMEOUT=2 -- \
    sh -c "echo \"session=\$MLXDIST_SHM_SESSION\"; if [ \"\$MLX_RANK\" = 1 ]; then $1; fi; exec \"\$0\"" "$rankp"
  [ "$rc" -ne 0 ] || fail "the job passed ($1)"
  [ "$secs" -le 20 ] || fail "took $secs s ($1)"
  grep -q "$2" "$out" || fail "no line matches: $2"
  no_leftovers
}
# no name of the session the ranks printed ("session=NAME") left in /dev/shm
no_leftovers() {
  name=$(sed -n 's/^\[0\] session=//p' "$out" | head -1)
  [ -n "$name" ] || fail "rank 0 printed no session name"
  left=$(ls /dev/shm 2>/dev/null | grep -c "^$name") || true
  [ "$left" -eq 0 ] || fail "$left name(s) of session $name left in /dev/shm"
}

case $case_ in
shm)
  go -n 3 --timeout 60 --env MLX_RING_VERBOSE=1 -- "$rankp"
  [ "$rc" -eq 0 ] || fail "exit $rc"
  [ "$(oks 3)" -eq 3 ] || fail "expected 3 checked ranks"
  [ "$(grep -c 'transport shm (all 3 ranks on host .* from mlxdist-launch' "$out")" -eq 3 ] ||
    fail "not every rank took the launcher's session"
  [ "$(grep -c 'scale rank [0-9]* n 3 .* tcp 0 ' "$out")" -eq 3 ] ||
    fail "a rank holds a TCP connection"
  ;;
tcp)
  go -n 2 --timeout 60 --env MLXDIST_TRANSPORT=tcp -- sh -c "$nosession" "$rankp"
  passed_over_tcp --env
  MLXDIST_TRANSPORT=tcp go -n 2 --timeout 60 -- sh -c "$nosession" "$rankp"
  passed_over_tcp environment
  ;;
disagree)
  rank1_fails 'export MLXDIST_TRANSPORT=tcp' \
    '^\[0\] .*ranks disagree on MLXDIST_TRANSPORT: rank 0 has auto, rank 1 has tcp'
  rank1_fails 'export MLXDIST_SMALL_ALGO=direct' 'ranks disagree on MLXDIST_SMALL_ALGO'
  ;;
hosts)
  go -n 4 --timeout 60 --env MLX_RING_VERBOSE=1 -- \
    sh -c 'export MLXDIST_HOST_ID=h$((MLX_RANK / 2)); exec "$0"' "$rankp"
  [ "$rc" -eq 0 ] || fail "exit $rc"
  [ "$(oks 4)" -eq 4 ] || fail "expected 4 checked ranks"
  [ "$(grep -c 'hosts differ: the TCP exchange decides' "$out")" -eq 4 ] ||
    fail "not every rank left the decision to the TCP exchange"
  [ "$(grep -c 'transport mixed' "$out")" -eq 4 ] || fail "not every rank took the mixed transport"
  ;;
apart)
  rank1_fails 'export MLXDIST_SHM_SESSION=${MLXDIST_SHM_SESSION}-x' \
    'could not join the shared-memory session that mlxdist-launch named (MLXDIST_SHM_SESSION=mlxdist-.*timed out after 2 s .*missing ranks: [01]'
  ;;
badname)
  go -n 2 --timeout 60 --env MLXDIST_SHM_SESSION=bad:name -- "$rankp"
  [ "$rc" -ne 0 ] || fail "the job passed"
  grep -q 'MLXDIST_SHM_SESSION=bad:name.*session name "bad:name" is not valid' "$out" ||
    fail "no rank names the variable and why"
  ;;
inherit)
  MLXDIST_SHM_SESSION=mlxdist-1-00000000000000aa go -n 2 --timeout 60 --env MLXDIST_TRANSPORT=tcp \
    -- sh -c "$nosession" "$rankp"
  passed_over_tcp "an outer job's session"
  ;;
job)
  rank1_fails 'export MLXDIST_JOB_TOKEN=0123456789abcdef0123456789abcdef' \
    '^\[0\] .*rank 1 in shared-memory session mlxdist-.* is of another job than rank 0: its job token or secret differs'
  ;;
machine)
  command -v taskset >/dev/null || { echo "SKIP: no taskset"; exit 0; }
  go -n 2 --timeout 60 --env MLXDIST_TRANSPORT=tcp --env MLX_RING_VERBOSE=1 -- \
    taskset -c 0 sh -c 'export MLXDIST_HOST_ID=h$MLX_RANK; exec "$0"' "$rankp"
  [ "$rc" -eq 0 ] || fail "exit $rc"
  [ "$(oks 2)" -eq 2 ] || fail "expected 2 checked ranks"
  [ "$(grep -c 'rank [01]: 2 ranks on this machine, 1 CPU: TCP waits yield between polls (crowded)' "$out")" -eq 2 ] ||
    fail "a rank did not count both ranks on its machine"
  ;;
*)
  echo "unknown case $case_" >&2
  exit 2
  ;;
esac
echo "ok ($case_)"
