#!/usr/bin/env bash
# ctest vm_rxe_probe: one VM boot (tests/vm/rxe_vm.sh) on soft-RoCE, and in it
# mlxdist-info lists rxe0 port 1 ACTIVE with its MTU and the RoCE v2 IPv4 GID,
# test_vm_probe checks the probe and jaccl's init on it (port up, then with
# eth0 down), and ibv_rc_pingpong between two processes checks the harness.
#   usage: vm_rxe_probe.sh MLXDIST_INFO TEST_VM_PROBE
# Exit 77 (skip) where the harness cannot run (not root, no qemu or kernel).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
info=${1:?usage: vm_rxe_probe.sh MLXDIST_INFO TEST_VM_PROBE}
prog=${2:?usage: vm_rxe_probe.sh MLXDIST_INFO TEST_VM_PROBE}
share=$(mktemp -d /tmp/mlxdist-vmshare.XXXXXX)
trap 'rm -rf "$share"' EXIT
cp "$info" "$share/mlxdist-info"
cp "$prog" "$share/test_vm_probe"
cat >"$share/run.sh" <<'RUN'
# runs inside the VM, in /share (busybox sh)
fail=0
no() { echo "FAIL: $*"; fail=1; }
echo "== mlxdist-info"
./mlxdist-info >info.txt 2>&1 || no "mlxdist-info exit $?"
cat info.txt
grep -Eq '^  rxe0 port 1: ACTIVE, mtu 1024, Ethernet, GID [0-9]+ ::ffff:10\.0\.2\.15 \(RoCE v2\)$' info.txt ||
  no "mlxdist-info does not list rxe0 port 1 ACTIVE, mtu 1024, with the GID ::ffff:10.0.2.15 (RoCE v2)"
grep -q '^  jaccl  available' info.txt || no "mlxdist-info does not list jaccl as available"
echo "== test_vm_probe up"
TMPDIR=/tmp ./test_vm_probe up 10.0.2.15 || no "test_vm_probe up exit $?"
echo "== ibv_rc_pingpong (RC send/recv between two processes over rxe0)"
if command -v ibv_rc_pingpong >/dev/null; then
  timeout 60 ibv_rc_pingpong -d rxe0 -g 1 -n 50 >pp_server.txt 2>&1 &
  srv=$!
  ok=0
  for i in 1 2 3 4 5 6 7 8 9 10; do
    sleep 1
    timeout 60 ibv_rc_pingpong -d rxe0 -g 1 -n 50 10.0.2.15 >pp_client.txt 2>&1 && { ok=1; break; }
  done
  wait $srv || ok=0
  cat pp_server.txt pp_client.txt
  [ $ok = 1 ] && grep -q '50 iters' pp_client.txt || no "ibv_rc_pingpong failed"
else
  echo "ibv_rc_pingpong not installed (ibverbs-utils): not run"
fi
echo "== eth0 down: the port goes DOWN"
ip link set eth0 down
i=0
while [ $i -lt 100 ] && grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state; do
  sleep 0.1; i=$((i + 1))
done
cat /sys/class/infiniband/rxe0/ports/1/state
TMPDIR=/tmp ./test_vm_probe down || no "test_vm_probe down exit $?"
ip link set eth0 up
exit $fail
RUN
rc=0
bash "$here/rxe_vm.sh" "$share" || rc=$?
[ -f "$share/vm.out" ] && cat "$share/vm.out"
[ $rc = 0 ] && echo "vm_rxe_probe: passed" || echo "vm_rxe_probe: exit $rc"
exit $rc
