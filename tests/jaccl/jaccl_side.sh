#!/usr/bin/env bash
# ctest jaccl_side_*: jaccl's side channel (the coordinator's TCP star) between
# real processes over real sockets on this host, no RDMA needed: the all-gather
# at 2-4 ranks, strangers and another job's rank refused with one line each
# while the job still starts, the secret, a missing rank named within
# MLXDIST_CONNECT_TIMEOUT, malformed frames named.
#   usage: jaccl_side.sh TEST_JACCL_SIDE CASE   (CASE: a function below)
set -uo pipefail
prog=${1:?usage: jaccl_side.sh TEST_JACCL_SIDE CASE}
case_name=${2:?usage: jaccl_side.sh TEST_JACCL_SIDE CASE}
dir=$(mktemp -d /tmp/mlxdist-jside.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
fail=0
no() { echo "FAIL: $*"; fail=1; }

# A mesh matrix of n ranks (the devices need not exist: the side channel never opens them).
matrix() {
  local n=$1 i j row text="["
  for ((i = 0; i < n; i++)); do
    row="["
    for ((j = 0; j < n; j++)); do
      [ $j -gt 0 ] && row+=","
      if [ $i = $j ]; then row+="null"; else row+="\"dev0\""; fi
    done
    text+="$row]"
    [ $i -lt $((n - 1)) ] && text+=","
  done
  echo "$text]" >"$dir/m$n.json"
  echo "$dir/m$n.json"
}

port=$("$prog" port) || { echo "no free port"; exit 1; }
export MLX_JACCL_COORDINATOR=127.0.0.1:$port
export MLXDIST_CONNECT_TIMEOUT=${MLXDIST_CONNECT_TIMEOUT:-10}
unset JACCL_RANK JACCL_IBV_DEVICES JACCL_COORDINATOR MLXDIST_JOB_TOKEN MLXDIST_SECRET_FILE

# start_rank NAME RANK [ARGS...]: a rank in the background, output in $dir/NAME.out
start_rank() {
  local name=$1 r=$2
  shift 2
  MLX_RANK=$r "$prog" "$@" >"$dir/$name.out" 2>"$dir/$name.err" &
  pids+=($!)
  eval "pid_$name=$!"
}
# listening PORT: wait (at most 30 s) until something listens at 127.0.0.1:PORT, from the
# kernel's table (no probe connection, which the coordinator would refuse and log). A rank
# started in the background may need seconds to get there under the sanitizers on a busy
# host: a peer started too soon spends its own MLXDIST_CONNECT_TIMEOUT on the wait, and a
# stranger finds no one.
listening() {
  local hex i
  hex=$(printf '%04X' "$1")
  for ((i = 0; i < 600; i++)); do
    grep -q ":$hex 00000000:0000 0A " /proc/net/tcp && return 0
    sleep 0.05
  done
  no "nothing listens at 127.0.0.1:$1 after 30 s"
  return 1
}
wait_for() { # wait_for NAME: its exit status
  local p
  eval "p=\$pid_$1"
  wait "$p"
}
expect_out() { grep -qF -- "$2" "$dir/$1.out" "$dir/$1.err" || no "$1 does not say '$2': $(cat "$dir/$1.out" "$dir/$1.err")"; }

allgather() { # the all-gather through the coordinator at 2, 3 and 4 ranks, ranks started in any order
  for n in 2 3 4; do
    port=$("$prog" port)
    export MLX_JACCL_COORDINATOR=127.0.0.1:$port MLX_IBV_DEVICES=$(matrix $n)
    for ((r = n - 1; r >= 0; r--)); do start_rank "r$r" $r rank 5; done
    for ((r = 0; r < n; r++)); do
      wait_for "r$r" || no "$n ranks: rank $r exit $?"
      expect_out "r$r" "ok: rank $r of $n, 5 all-gathers"
    done
  done
  # with the launcher's token and a shared secret on every rank
  export MLXDIST_JOB_TOKEN=00112233445566778899aabbccddeeff
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/secret"
  chmod 600 "$dir/secret"
  export MLXDIST_SECRET_FILE=$dir/secret
  export MLX_JACCL_COORDINATOR=127.0.0.1:$("$prog" port) MLX_IBV_DEVICES=$(matrix 3)
  for r in 0 1 2; do start_rank "s$r" $r rank 3; done
  for r in 0 1 2; do
    wait_for "s$r" || no "secret: rank $r exit $?"
    expect_out "s$r" "ok: rank $r of 3"
  done
}

strangers() { # garbage, silence and another job's rank at the coordinator: refused, the job starts
  export MLX_IBV_DEVICES=$(matrix 2) MLXDIST_JOB_TOKEN=00112233445566778899aabbccddeeff
  start_rank r0 0 rank 2
  listening $port
  (exec 3<>/dev/tcp/127.0.0.1/$port && printf 'GET / HTTP/1.0\r\n\r\n' >&3 && sleep 1) &
  pids+=($!)
  (exec 3<>/dev/tcp/127.0.0.1/$port && sleep 5) &
  pids+=($!)
  MLXDIST_JOB_TOKEN=ffeeddccbbaa99887766554433221100 MLXDIST_CONNECT_TIMEOUT=2 start_rank other 1 rank 2
  wait_for other && no "another job's rank 1 was let in"
  expect_out other "closed this rank's handshake"
  start_rank r1 1 rank 2
  wait_for r0 || no "rank 0 exit $?"
  wait_for r1 || no "rank 1 exit $?"
  expect_out r0 "ok: rank 0 of 2"
  expect_out r1 "ok: rank 1 of 2"
  grep -F "[jaccl] rank 0: refused a connection from 127.0.0.1:" "$dir/r0.err" || no "no refusal logged"
  grep -q "refused a connection from .*another job" "$dir/r0.err" || no "the other job's rank is not named as such: $(cat "$dir/r0.err")"
  grep -q "refused a connection from .*not a handshake\|refused a connection from .*magic" "$dir/r0.err" ||
    no "the garbage is not refused as such: $(cat "$dir/r0.err")"
  # a secret on rank 0 only: rank 1 is refused, and says why
  head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/secret"
  chmod 600 "$dir/secret"
  port=$("$prog" port)
  export MLX_JACCL_COORDINATOR=127.0.0.1:$port MLXDIST_CONNECT_TIMEOUT=3
  MLXDIST_SECRET_FILE=$dir/secret start_rank q0 0 rank 1
  listening $port
  start_rank q1 1 rank 1
  wait_for q1 && no "rank 1 without the secret was let in"
  wait_for q0 && no "rank 0 with the secret started without rank 1"
  expect_out q1 "shared secret"
  expect_out q0 "rank 1 did not connect"
}

missing() { # 3 ranks, rank 2 never starts: named within MLXDIST_CONNECT_TIMEOUT (+1 s)
  export MLX_IBV_DEVICES=$(matrix 3) MLXDIST_CONNECT_TIMEOUT=2
  local t0=$(date +%s%N)
  start_rank r0 0 rank 1
  listening $port
  start_rank r1 1 rank 1
  wait_for r0 && no "rank 0 started without rank 2"
  local ms=$((($(date +%s%N) - t0) / 1000000))
  echo "rank 0 failed after $ms ms: $(cat "$dir/r0.out")"
  expect_out r0 "rank 2 did not connect to this rank (0, listening on 127.0.0.1:$port) within 2 s"
  # The bound is checked on rank 0's own clock, from the open of the star: the start, the
  # configuration (OpenSSL loaded) and the exit of a process add 1-2 s under TSan on a busy
  # host (3.1-4.1 s from here to its end, up to 4 s before it listens), which says nothing
  # of the bound; the wall clock only backs it up, generously.
  local own
  own=$(sed -n 's/^failed \([0-9]*\) ms after the star began to open$/\1/p' "$dir/r0.out")
  [ -n "$own" ] && [ "$own" -le 3000 ] || no "rank 0 failed ${own:-?} ms after it began to open the star (MLXDIST_CONNECT_TIMEOUT=2)"
  [ $ms -le 10000 ] || no "rank 0 ended $ms ms after its start (MLXDIST_CONNECT_TIMEOUT=2)"
  wait_for r1 && no "rank 1 finished without rank 2"
  expect_out r1 "the coordinator (rank 0 at 127.0.0.1:$port) closed the side channel"
}

malformed() { # frames with another rank's number, another length, another round: named
  export MLX_IBV_DEVICES=$(matrix 2)
  start_rank r0 0 rank 1
  start_rank bad 1 bad-up
  wait_for r0 && no "rank 0 took another rank's frame"
  expect_out r0 "rank 1 sent a malformed side-channel frame in all-gather #0: it claims rank 0"
  kill "$pid_bad" 2>/dev/null
  export MLX_JACCL_COORDINATOR=127.0.0.1:$("$prog" port)
  start_rank r0 0 rank 1
  start_rank bad 1 bad-len
  wait_for r0 && no "rank 0 took a frame of another length"
  expect_out r0 "rank 1 sent a malformed side-channel frame in all-gather #0: it carries 1048576 bytes per rank, this rank 8"
  kill "$pid_bad" 2>/dev/null
  port=$("$prog" port)
  export MLX_JACCL_COORDINATOR=127.0.0.1:$port
  start_rank bad 0 bad-down
  start_rank r1 1 rank 1
  wait_for r1 && no "rank 1 took a frame of another round"
  expect_out r1 "the coordinator (rank 0 at 127.0.0.1:$port) sent a malformed side-channel frame in all-gather #0: it is for all-gather #7"
  kill "$pid_bad" 2>/dev/null
}

"$case_name"
[ $fail = 0 ] && echo "jaccl_side $case_name: passed" || echo "jaccl_side $case_name: FAILED"
exit $fail
