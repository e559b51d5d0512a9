#!/usr/bin/env bash
# ctest vm_ibv: one VM boot (tests/vm/rxe_vm.sh) on soft-RoCE, and in it
# test_vm_ibv checks the verbs device layer (rdma/ibv.c) on rxe0 with real
# data between two processes (write, write with immediate data, read, the
# completion channel, a killed peer reported by an error completion), a
# malformed queue pair address, and RLIMIT_MEMLOCK's error.
#   usage: vm_ibv.sh TEST_VM_IBV
# Exit 77 (skip) where the harness cannot run (not root, no qemu or kernel).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
prog=${1:?usage: vm_ibv.sh TEST_VM_IBV}
share=$(mktemp -d /tmp/mlxdist-vmshare.XXXXXX)
trap 'rm -rf "$share"' EXIT
cp "$prog" "$share/test_vm_ibv"
cat >"$share/run.sh" <<'RUN'
# runs inside the VM, in /share (busybox sh)
echo "== test_vm_ibv rxe0 3"
./test_vm_ibv rxe0 3
RUN
rc=0
bash "$here/rxe_vm.sh" "$share" || rc=$?
[ -f "$share/vm.out" ] && cat "$share/vm.out"
[ $rc = 0 ] && echo "vm_ibv: passed" || echo "vm_ibv: exit $rc"
exit $rc
