#!/usr/bin/env bash
# ctest vm_jaccl_fail: the jaccl backend's failure cases on real verbs in ONE
# soft-RoCE VM boot (tests/vm/rxe_vm.sh; rxe0 on eth0): a killed rank, a
# stopped rank, a busy rank, a rank late to an op its peer gave up on
# (tests/liveness; and a rank killed in a loop of all_to_all), mismatched calls (tests/mismatch), bad matrices, a device
# this machine lacks and a strict init with the port down (the conformance
# program's init). The cases are the functions of tests/vm/jaccl_fail_cases.sh
# (each takes the programs it runs as arguments); every case prints its time
# and what it measured (the survivors' times after the signal).
#   usage: vm_jaccl_fail.sh TEST_LIVENESS TEST_MISMATCH TEST_COLLECTIVES
# VM_FAIL_CASES="kill stop ..." runs only those (kill kill_a2a stop busy late mismatch
# matrix port_down; default all). Exit 77 (skip) where the harness cannot run.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
usage="usage: vm_jaccl_fail.sh TEST_LIVENESS TEST_MISMATCH TEST_COLLECTIVES"
live=${1:?$usage}
mm=${2:?$usage}
coll=${3:?$usage}
share=$(mktemp -d /tmp/mlxdist-vmshare.XXXXXX)
trap 'rm -rf "$share"' EXIT
cp "$live" "$share/test_liveness"
cp "$mm" "$share/test_mismatch"
cp "$coll" "$share/test_collectives"
cp "$here/vm_guest.sh" "$here/jaccl_fail_cases.sh" "$share/"
cases=${VM_FAIL_CASES:-"kill kill_a2a stop busy late mismatch matrix port_down"}
for c in $cases; do
  case $c in
    kill | kill_a2a | stop | busy | late | mismatch | matrix | port_down) ;;
    *) echo "vm_jaccl_fail: unknown case '$c' (expected kill kill_a2a stop busy late mismatch matrix port_down)" >&2; exit 2 ;;
  esac
done
{
  echo "# runs inside the VM, in /share (busybox sh)"
  echo "cases=\"$cases\""
  cat <<'RUN'
. ./vm_guest.sh
. ./jaccl_fail_cases.sh
ulimit -l unlimited 2>/dev/null || echo "ulimit -l unlimited refused: $(ulimit -l) KiB lockable"
export TMPDIR=/tmp
t_all=$(now_ms)
for c in $cases; do
  case $c in
    kill | kill_a2a | stop | busy | late) jf_$c ./test_liveness ;;
    mismatch) jf_mismatch ./test_mismatch ;;
    matrix | port_down) jf_$c ./test_collectives ;;
  esac
done
echo "all cases: $(($(now_ms) - t_all)) ms, $([ $fail = 0 ] && echo passed || echo FAILED)"
exit $fail
RUN
} >"$share/run.sh"
rc=0
bash "$here/rxe_vm.sh" "$share" || rc=$?
[ -f "$share/vm.out" ] && cat "$share/vm.out"
[ $rc = 0 ] && echo "vm_jaccl_fail: passed" || echo "vm_jaccl_fail: exit $rc"
exit $rc
