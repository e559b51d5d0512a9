#!/bin/bash
# The rendezvous (MLXDIST_RENDEZVOUS) with real processes and sockets: the
# launcher's server driven by rdv_server, ranks started here as mlxdist-launch
# would start them across hosts (MLX_RANK, MLX_WORLD_SIZE, MLXDIST_JOB_TOKEN,
# MLXDIST_RENDEZVOUS, no MLX_HOSTFILE).
#
#   run.sh CASE RDV_SERVER RDV_RANK TEST_COLLECTIVES
set -u
case_=$1 server=$2 rank_exe=$3 coll=$4
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL ($case_): $*"; for f in "$dir"/*.out "$dir"/*.err; do [ -s "$f" ] && { echo "--- $f"; cat "$f"; }; done; exit 1; }
tok=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
other=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
now() { date +%s.%N; }
elapsed() { awk -v a="$(now)" -v b="$1" 'BEGIN { printf "%.2f", a - b }'; }
lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }

# start_server N TIMEOUT [HOSTS...] [RANGE via $RANGE]: sets $addr
start_server() {
  local n=$1 t=$2
  shift 2
  "$server" "$n" "$tok" 127.0.0.1 "${RANGE:--}" "$t" "$@" >"$dir/server.out" 2>"$dir/server.err" &
  spid=$!
  pids+=("$spid")
  for _ in $(seq 100); do
    addr=$(sed -n 's/^ADDR //p' "$dir/server.out")
    [ -n "$addr" ] && return 0
    kill -0 "$spid" 2>/dev/null || fail "the server did not start"
    sleep 0.05
  done
  fail "no address from the server"
}
# start_rank R N [ENV...] -- start rank R of N with extra env, program $PROG (default rdv_rank)
start_rank() {
  local r=$1 n=$2
  shift 2
  env -u MLX_HOSTFILE MLX_RANK="$r" MLX_WORLD_SIZE="$n" MLXDIST_JOB_TOKEN="$tok" \
    MLXDIST_RENDEZVOUS="$addr" MLXDIST_TIMEOUT=30 "$@" ${PROG:-$rank_exe} ${PROG_ARGS:-} \
    >"$dir/rank$r.out" 2>"$dir/rank$r.err" &
  rpids[$r]=$!
  pids+=("$!")
}
# wait_pid PID SECONDS: the exit status, 124 if it did not end in time
wait_pid() {
  local p=$1 t=$2 i
  for ((i = 0; i < t * 20; i++)); do
    if ! kill -0 "$p" 2>/dev/null; then
      wait "$p"
      return $?
    fi
    sleep 0.05
  done
  return 124
}
expect_ok() { # every rank 0..N-1 and the server succeeded
  local n=$1 t=$2 r
  for ((r = 0; r < n; r++)); do
    wait_pid "${rpids[$r]}" "$t" || fail "rank $r failed (status $?)"
    grep -q "rank $r of $n: rendezvous ok" "$dir/rank$r.out" || [ -n "${PROG:-}" ] || fail "rank $r printed no result"
  done
  if [ -n "${RDV_LINGER:-}" ]; then kill -TERM "$spid"; fi
  wait_pid "$spid" 5 || fail "the server did not report done"
  grep -q "rdv_server: done" "$dir/server.err" || fail "the server is not done"
}
grep_in() { grep -q -- "$2" "$1" || fail "expected '$2' in $(basename "$1")"; }

# hold_ports K: hold K consecutive ports of 127.0.0.1 (below the ephemeral range, a new random
# base on a collision) until the end; sets $base
hold_ports() {
  local k=$1 try
  for try in 1 2 3 4 5 6 7 8 9 10; do
    base=$((10000 + RANDOM % 20000))
    : >"$dir/hold.out"
    "$server" hold 127.0.0.1 "$base" "$((base + k - 1))" 60 >"$dir/hold.out" 2>&1 &
    local hp=$!
    pids+=("$hp")
    for _ in $(seq 200); do
      grep -q HELD "$dir/hold.out" && return 0
      kill -0 "$hp" 2>/dev/null || break
      sleep 0.05
    done
    kill -9 "$hp" 2>/dev/null
  done
  fail "could not hold $k ports"
}
declare -a rpids
case $case_ in
  ok4) # 4 ranks, in reverse order, bootstrapped through the rendezvous and running collectives
    start_server 4 30
    for r in 3 2 1 0; do start_rank $r 4; done
    expect_ok 4 40
    ;;
  conformance4) # the collective conformance suite, 4 ranks, through the rendezvous; it also
    # initialises again after clear_backends: a second round of the rendezvous
    export RDV_LINGER=280
    start_server 4 60
    PROG=$coll PROG_ARGS=ring
    for r in 0 1 2 3; do start_rank $r 4; done
    expect_ok 4 280
    ;;
  connections2) # two connections per peer: 128 bytes of records per rank
    start_server 3 30
    for r in 0 1 2; do start_rank $r 3 MLXDIST_RING_CONNECTIONS=2; done
    expect_ok 3 40
    ;;
  wrong_token) # rank 1 holds another job's token: refused on both sides; rank 0 told why
    start_server 2 4 hostA hostB
    start_rank 0 2
    start_rank 1 2 MLXDIST_JOB_TOKEN="$other"
    wait_pid "${rpids[1]}" 10 && fail "rank 1 with a wrong token succeeded"
    grep_in "$dir/rank1.err" "MLXDIST_JOB_TOKEN is not the launcher's job token"
    grep_in "$dir/server.err" "does not authenticate with this job's token"
    wait_pid "${rpids[0]}" 10 && fail "rank 0 succeeded without rank 1"
    grep_in "$dir/rank0.err" "the launcher gave up: rank 1 (host hostB) did not reach the rendezvous within 4 s"
    wait_pid "$spid" 5 && fail "the server reported done"
    ;;
  no_token) # MLXDIST_RENDEZVOUS without MLXDIST_JOB_TOKEN: a clear error at once
    addr=127.0.0.1:9
    t0=$(now)
    start_rank 0 2 MLXDIST_JOB_TOKEN=
    wait_pid "${rpids[0]}" 10 && fail "a rank without a token succeeded"
    grep_in "$dir/rank0.err" "MLXDIST_RENDEZVOUS is set (127.0.0.1:9) but MLXDIST_JOB_TOKEN is not"
    lt "$(elapsed "$t0")" 5 || fail "took $(elapsed "$t0") s"
    ;;
  intruders) # garbage, a partial hello and a silent connection do not hold up the real ranks
    start_server 3 30
    ip=${addr%:*} port=${addr##*:}
    (exec 3<>"/dev/tcp/$ip/$port" && printf 'GET / HTTP/1.0\r\n\r\n%064d' 0 >&3 && sleep 20) 2>/dev/null &
    pids+=("$!")
    (exec 3<>"/dev/tcp/$ip/$port" && printf 'MXRH\0\1\0\0' >&3 && sleep 20) 2>/dev/null &
    pids+=("$!")
    (exec 3<>"/dev/tcp/$ip/$port" && sleep 20) 2>/dev/null &
    pids+=("$!")
    sleep 0.5
    t0=$(now)
    for r in 0 1 2; do start_rank $r 3; done
    expect_ok 3 20
    e=$(elapsed "$t0")
    lt "$e" 9 || fail "the ranks needed $e s (held up by the intruders? they hold on for 10 s)"
    grep_in "$dir/server.err" "malformed hello (bad magic"
    echo "ranks done in $e s with 3 intruders connected"
    ;;
  missing) # rank 2 never comes: every connected rank fails within the bound, naming it
    export RDV_LINGER=20
    start_server 3 3 10.9.0.1 10.9.0.2 10.9.0.3
    t0=$(now)
    start_rank 0 3
    start_rank 1 3
    for r in 0 1; do
      wait_pid "${rpids[$r]}" 10 && fail "rank $r succeeded"
      grep_in "$dir/rank$r.err" "the launcher gave up: rank 2 (host 10.9.0.3) did not reach the rendezvous within 3 s"
    done
    e=$(elapsed "$t0")
    lt "$e" 8 || fail "the ranks failed only after $e s (their own bound is 30 s)"
    grep_in "$dir/server.err" "\[launch\] rank 2 (host 10.9.0.3) did not reach the rendezvous within 3 s"
    grep_in "$dir/server.err" "rdv_server: failed after 3"
    echo "both ranks failed after $e s"
    # rank 2 arrives late: told why at once
    t0=$(now)
    start_rank 2 3
    wait_pid "${rpids[2]}" 10 && fail "the late rank 2 succeeded"
    grep_in "$dir/rank2.err" "the launcher gave up: rank 2 (host 10.9.0.3) did not reach the rendezvous within 3 s"
    e=$(elapsed "$t0")
    lt "$e" 8 || fail "the late rank failed only after $e s (its own bound is 30 s)"
    kill -TERM "$spid"
    wait_pid "$spid" 5 && fail "the server reported done"
    ;;
  no_launcher) # nobody listens at MLXDIST_RENDEZVOUS: bounded by MLXDIST_LAUNCH_TIMEOUT
    addr=127.0.0.1:1
    t0=$(now)
    start_rank 0 2 MLXDIST_LAUNCH_TIMEOUT=2
    wait_pid "${rpids[0]}" 10 && fail "rank 0 succeeded"
    grep_in "$dir/rank0.err" "did not reach the launcher within 2 s"
    e=$(elapsed "$t0")
    lt "$e" 7 || fail "took $e s (MLXDIST_LAUNCH_TIMEOUT=2)"
    ;;
  ifname_lo) # MLXDIST_IFNAME=lo: ranks listen on 127.0.0.1
    start_server 2 30
    for r in 0 1; do start_rank $r 2 MLXDIST_IFNAME=lo MLX_RING_VERBOSE=1; done
    expect_ok 2 30
    grep_in "$dir/rank0.err" "MLXDIST_IFNAME=lo: listening on 127.0.0.1"
    ;;
  ifname_nosuch) # an unknown interface: an error naming it and the ones that exist
    start_server 1 5
    start_rank 0 1 MLXDIST_IFNAME=nosuch0
    wait_pid "${rpids[0]}" 10 && fail "rank 0 succeeded"
    grep_in "$dir/rank0.err" "MLXDIST_IFNAME='nosuch0': no such network interface on this host (it has: lo"
    ;;
  wildcard) # MLXDIST_RING_ADDR=0.0.0.0: refused, a rank never listens on the wildcard address
    start_server 1 5
    start_rank 0 1 MLXDIST_RING_ADDR=0.0.0.0
    wait_pid "${rpids[0]}" 10 && fail "rank 0 succeeded"
    grep_in "$dir/rank0.err" "MLXDIST_RING_ADDR='0.0.0.0' is the wildcard address"
    ;;
  port_range) # a busy port of the range is skipped
    hold_ports 1
    start_server 2 30
    for r in 0 1; do
      start_rank $r 2 MLXDIST_PORT_RANGE="$base-$((base + 20))" MLX_RING_VERBOSE=1 MLXDIST_RING_ADDR=127.0.0.1
    done
    expect_ok 2 30
    grep -h "listening on" "$dir"/rank*.err
    grep -q "listening on 127.0.0.1:$base$" "$dir"/rank*.err && fail "a rank listened on the busy port $base"
    grep -q "listening on 127.0.0.1:$((base + 1))$" "$dir"/rank*.err || fail "no rank took port $((base + 1))"
    ;;
  port_range_full) # every port of the range busy: an error naming the range; bad syntax too
    hold_ports 3
    start_server 2 3
    start_rank 0 2 MLXDIST_PORT_RANGE="$base-$((base + 2))" MLXDIST_RING_ADDR=127.0.0.1
    start_rank 1 2 MLXDIST_PORT_RANGE="9-x" MLXDIST_RING_ADDR=127.0.0.1
    wait_pid "${rpids[0]}" 10 && fail "rank 0 succeeded"
    grep_in "$dir/rank0.err" "no free port to listen on in MLXDIST_PORT_RANGE=$base-$((base + 2))"
    wait_pid "${rpids[1]}" 10 && fail "rank 1 succeeded"
    grep_in "$dir/rank1.err" "MLXDIST_PORT_RANGE: '9-x' is not a port range"
    ;;
  server_port_range) # the launcher's --port-range: a busy port skipped, all busy an error
    hold_ports 2
    RANGE="$base-$((base + 5))" start_server 2 30
    [ "$addr" = "127.0.0.1:$((base + 2))" ] || fail "the server listens on $addr, expected port $((base + 2))"
    for r in 0 1; do start_rank $r 2; done
    expect_ok 2 30
    "$server" 1 "$tok" 127.0.0.1 "$base-$((base + 1))" 5 >"$dir/full.out" 2>"$dir/full.err" &&
      fail "the server started with every port of its range busy"
    grep_in "$dir/full.err" "no free port to listen on in --port-range $base-$((base + 1)) on 127.0.0.1"
    ;;
  *) fail "unknown case" ;;
esac
for f in "$dir"/server.err; do [ -f "$f" ] && cat "$f"; done
# a sanitizer build's report fails the case even where a failure was expected
if grep -l "Sanitizer\|runtime error:" "$dir"/*.err 2>/dev/null; then fail "a sanitizer reported"; fi
echo "PASS ($case_)"
