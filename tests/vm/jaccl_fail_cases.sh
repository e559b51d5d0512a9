# The jaccl backend's failure cases on real verbs, for a run.sh inside the
# soft-RoCE VM (busybox sh; rxe0 on eth0, 10.0.2.15): each case is a function
# taking the programs it runs as arguments, prints PASS/FAIL NAME with its
# time and what was measured, and sets fail=1 when it fails. Sourced after
# vm_guest.sh (fail, no, now_ms). tests/vm/vm_jaccl_fail.sh runs them all in
# one boot; another run.sh may source this file and call any of them.
#   jf_kill TEST_LIVENESS      3 ranks loop over all_sum, rank 1 SIGKILLed: every
#                              survivor fails within 2 s naming it
#   jf_kill_a2a TEST_LIVENESS  the same in a loop of all_to_all (issue 40)
#   jf_stop TEST_LIVENESS      the same with SIGSTOP, MLXDIST_TIMEOUT=3: within 5 s
#   jf_busy TEST_LIVENESS      rank 1 sleeps 5 s between two all_sums with
#                              MLXDIST_TIMEOUT=3: waited for, both succeed, one
#                              warning naming rank 1
#   jf_late TEST_LIVENESS      rank 1 reaches an all_sum rank 0 gave up on
#                              (MLXDIST_OP_TIMEOUT=2): both fail with rank 0's reason
#   jf_mismatch TEST_MISMATCH  2 ranks make different calls (count, count_large,
#                              dtype, reduce_op, op_kind, sendrecv, a2a_gather,
#                              a2a_parts, count_zero, a2a_zero): both fail fast
#                              naming both calls,
#                              "[jaccl] op #seq: ..."
#   jf_matrix TEST_COLLECTIVES bad matrices at a strict init: not a list, a row of
#                              the wrong length, an empty device name, a device
#                              this machine does not have: each refused at once
#                              with its named error
#   jf_port_down TEST_COLLECTIVES  eth0 down (rxe0's port DOWN): a strict init
#                              names the port; eth0 is up again (port ACTIVE) after

# jf_report NAME T0 RC [DETAIL]: the PASS/FAIL line of a case.
jf_report() {
  ms=$(($(now_ms) - $2))
  if [ "$3" = 0 ]; then
    echo "PASS $1 ($ms ms)${4:+: $4}"
  else
    echo "FAIL $1 ($ms ms)${4:+: $4}"
    fail=1
  fi
}

# jf_liveness MODE TEST_LIVENESS [NAME]: one test_liveness case under jaccl.
jf_liveness() {
  t0=$(now_ms)
  timeout 120 "$2" "$1" jaccl >/tmp/jf_$1.out 2>&1
  rc=$?
  # the survivors' measured times ("rank R out X s after the signal"), else the warning
  det=$(grep -E 'out .* after the signal|has waited|failed after|: rank 1 |succeeded' /tmp/jf_$1.out |
    grep -v '^---' | head -n 4 | tr '\n' ';')
  [ $rc = 0 ] || tail -n 40 /tmp/jf_$1.out
  jf_report "jaccl_${3:-$1}" "$t0" $rc "$det"
}
jf_kill() { jf_liveness kill "$1"; }
jf_kill_a2a() { jf_liveness kill_a2a "$1"; }
jf_stop() { jf_liveness stop "$1"; }
jf_busy() { jf_liveness slow "$1" busy; }
jf_late() { jf_liveness late "$1"; }

jf_mismatch() {
  for c in count count_large dtype reduce_op op_kind sendrecv a2a_gather a2a_parts count_zero a2a_zero; do
    t0=$(now_ms)
    MISMATCH_BACKEND=jaccl timeout 150 "$1" $c >/tmp/jf_mm_$c.out 2>&1
    rc=$?
    [ $rc = 0 ] || tail -n 30 /tmp/jf_mm_$c.out
    jf_report "jaccl_mismatch_$c" "$t0" $rc "$(grep -m1 'rank 0: ' /tmp/jf_mm_$c.out)"
  done
}

# jf_init_fails NAME TEST_COLLECTIVES MATRIX_TEXT EXPECTED...: a strict init
# of rank 0 of the matrix fails within 10 s with every EXPECTED text.
jf_init_fails() {
  name=$1 prog=$2 text=$3
  shift 3
  echo "$text" >/tmp/jf_$name.json
  t0=$(now_ms)
  env MLX_RANK=0 MLX_IBV_DEVICES=/tmp/jf_$name.json MLX_JACCL_COORDINATOR=127.0.0.1:32399 \
    MLXDIST_CONNECT_TIMEOUT=20 timeout 60 "$prog" jaccl >/tmp/jf_$name.out 2>&1
  rc=$?
  ms=$(($(now_ms) - t0))
  ok=0
  if [ $rc = 0 ] || [ $rc = 124 ]; then
    ok=1
    echo "  $name: exit $rc (expected a failed init)"
  fi
  [ $ms -le 10000 ] || { ok=1; echo "  $name: took $ms ms (limit 10000)"; }
  for w in "$@"; do
    grep -qF "$w" /tmp/jf_$name.out || { ok=1; echo "  $name: the message lacks '$w'"; }
  done
  [ $ok = 0 ] || cat /tmp/jf_$name.out
  jf_report "jaccl_$name" "$t0" $ok "$(grep -m1 -o 'init(jaccl): .*' /tmp/jf_$name.out | cut -c1-300)"
}

jf_matrix() {
  jf_init_fails matrix_not_list "$1" '{"rxe0": 1}' \
    "is not a non-empty JSON list: it is an object" "MLX_IBV_DEVICES"
  jf_init_fails matrix_row_length "$1" '[[null, "rxe0"], ["rxe0"]]' \
    "row 1 has 1 cells but the matrix has 2 rows"
  jf_init_fails matrix_empty_name "$1" '[[null, ""], ["rxe0", null]]' \
    "row 0, column 1" "is an empty string"
  jf_init_fails matrix_no_device "$1" '[[null, ["rxe0", "mlx5_9"]], ["rxe0", null]]' \
    "names 'mlx5_9' at row 0, column 1" "this machine has no such RDMA device (devices here: rxe0"
}

jf_port_state() { cat /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null; }
# jf_wait_port ACTIVE|DOWN: at most 10 s
jf_wait_port() {
  i=0
  while [ $i -lt 100 ]; do
    case "$(jf_port_state)" in *"$1"*) return 0 ;; esac
    sleep 0.1
    i=$((i + 1))
  done
  return 1
}

jf_port_down() {
  ip link set eth0 down
  jf_wait_port DOWN || no "rxe0's port is '$(jf_port_state)' 10 s after eth0 went down"
  jf_init_fails port_down "$1" '[[null, "rxe0"], ["rxe0", null]]' \
    "device 'rxe0' (row 0, column 1 of '" "has no active port (port 1 DOWN)"
  ip link set eth0 up
  jf_wait_port ACTIVE || no "rxe0's port is '$(jf_port_state)' 10 s after eth0 came back up"
}
