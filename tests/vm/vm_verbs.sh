#!/usr/bin/env bash
# ctest vm_verbs: the verbs transport (src/transport/verbs.c) on real RDMA, in one VM boot
# (tests/vm/rxe_vm.sh: soft-RoCE rxe0 on the VM's eth0). In it:
#   - the algorithm suite (test_algo) over verbs at 2, 3 and 4 ranks, and with 2 rails;
#   - transport tests: concurrent collectives from threads (test_transport threads), the
#     signature mismatches (test_sig_transport);
#   - liveness (test_verbs_live): a killed rank (3 ranks; 4 ranks with 2 rails: every
#     survivor fails within 2 s naming it), a stopped rank (within MLXDIST_TIMEOUT=3 + 2 s), a busy rank waited for, a
#     stalled op timing out (MLXDIST_OP_TIMEOUT). The measured times are printed.
#   - zero copy (test_verbs_zcopy): p2p across the pull threshold, an unexpected large
#     message, a buffer freed and reallocated at the same address between two large sends
#     (1 and 2 rails), bytes per path printed; the algorithm suite at 2 ranks, 2 rails, with the
#     threshold lowered to 4 KiB (MLXDIST_VERBS_ZCOPY_BYTES), so most messages take the pull path.
#   - all_to_all's parts (test_vm_a2a_zcopy, 3 ranks, and 4 with 2 rails): parts from 1000 B
#     to 5 MiB, each size twice; the bytes by path must be exactly the staged small parts and
#     the RDMA-read (or bounced) large ones, with some zero copy.
#   usage: vm_verbs.sh TEST_ALGO TEST_TRANSPORT TEST_SIG_TRANSPORT TEST_VERBS_LIVE TEST_VERBS_ZCOPY
#          TEST_VM_A2A_ZCOPY
# VM_VERBS_CASES (space-separated names below; default all) runs a subset. Exit 77 (skip)
# where the harness cannot run (not root, no qemu or kernel).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
usage="usage: vm_verbs.sh TEST_ALGO TEST_TRANSPORT TEST_SIG_TRANSPORT TEST_VERBS_LIVE TEST_VERBS_ZCOPY TEST_VM_A2A_ZCOPY"
algo=${1:?$usage}
transport=${2:?$usage}
sigt=${3:?$usage}
live=${4:?$usage}
zcopy=${5:?$usage}
a2azc=${6:?$usage}
share=$(mktemp -d /tmp/mlxdist-vmshare.XXXXXX)
trap 'rm -rf "$share"' EXIT
cp "$algo" "$share/test_algo"
cp "$transport" "$share/test_transport"
cp "$sigt" "$share/test_sig_transport"
cp "$live" "$share/test_verbs_live"
cp "$zcopy" "$share/test_verbs_zcopy"
cp "$a2azc" "$share/test_vm_a2a_zcopy"
cases=${VM_VERBS_CASES:-"algo2 algo3 algo4 algo2r threads sig kill kill4 stop busy stall zc zc2r algozc a2azc3 a2azc4r"}
{
  echo "# runs inside the VM, in /share (busybox sh)"
  echo "VM_VERBS_TAIL=${VM_VERBS_TAIL:-15}"
  echo "cases=\"$cases\""
  [ -z "${VM_VERBS_ENV:-}" ] || echo "export $VM_VERBS_ENV"
  cat <<'RUN'
fail=0
ulimit -l unlimited 2>/dev/null || echo "ulimit -l unlimited refused: $(ulimit -l) KiB lockable"
export TMPDIR=/tmp T_VERBS_DEV=rxe0
run() { # name, then the command
  name=$1
  shift
  case " $cases " in *" $name "*) ;; *) return 0 ;; esac
  echo "== $name: $*"
  s=$(cut -d' ' -f1 /proc/uptime)
  if timeout 120 "$@" >"$name.log" 2>&1; then r=0; else r=$?; fi
  e=$(cut -d' ' -f1 /proc/uptime)
  tail -n "${VM_VERBS_TAIL:-15}" "$name.log"
  echo "-- $name: exit $r in $(awk "BEGIN{printf \"%.1f\", $e - $s}") s"
  [ $r = 0 ] || { echo "FAIL: $name"; fail=1; }
}
run algo2 ./test_algo verbs 2
run algo3 ./test_algo verbs 3
run algo4 ./test_algo verbs 4
run algo2r ./test_algo verbs:2 2
run threads ./test_transport threads 3 verbs 2
run sig ./test_sig_transport verbs
run kill ./test_verbs_live kill 3 verbs
run kill4 ./test_verbs_live kill 4 verbs:2
run stop ./test_verbs_live stop 3 verbs
run busy ./test_verbs_live busy 2 verbs
run stall ./test_verbs_live stall verbs
run zc ./test_verbs_zcopy verbs
run zc2r ./test_verbs_zcopy verbs:2
run algozc env MLXDIST_VERBS_ZCOPY_BYTES=4096 ./test_algo verbs:2 2
run a2azc3 ./test_vm_a2a_zcopy verbs 3
run a2azc4r ./test_vm_a2a_zcopy verbs:2 4
grep -h "survivors failed after\|waited for: ok\|stall over" kill.log kill4.log stop.log busy.log stall.log 2>/dev/null
grep -h "zero-copy" zc.log zc2r.log a2azc3.log a2azc4r.log 2>/dev/null
exit $fail
RUN
} >"$share/run.sh"
rc=0
bash "$here/rxe_vm.sh" "$share" || rc=$?
[ -f "$share/vm.out" ] && cat "$share/vm.out"
[ $rc = 0 ] && echo "vm_verbs: passed" || echo "vm_verbs: exit $rc"
exit $rc
