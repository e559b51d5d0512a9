#!/usr/bin/env bash
# Boot a small Linux VM with a soft-RoCE device (rdma_rxe on eth0) and run a
# script in it: the project's harness for tests on real verbs (issue 23).
#   usage: tests/vm/rxe_vm.sh SHARE_DIR [ELF...]
# SHARE_DIR must hold run.sh. The VM mounts SHARE_DIR (9p, read-write) at
# /share, loads the modules, gives eth0 10.0.2.15/24, runs
# `rdma link add rxe0 type rxe netdev eth0`, waits (at most 30 s) for port 1
# to be ACTIVE, then runs `sh run.sh` in /share with the output in
# SHARE_DIR/vm.out and its exit status in SHARE_DIR/vm.rc, and powers off.
# Every ELF named (and every ELF directly in SHARE_DIR) has the shared
# libraries ldd finds for it copied into the initramfs at the same paths, so
# build-tree programs run unchanged (their RUNPATH into the build tree too).
# Exit: run.sh's status; 77 (skip) without root, qemu, the Debian kernel
# package (linux-image-amd64) or the tools; 1 when the VM did not finish
# (the console log is printed). MLXDIST_VM_TIMEOUT bounds the whole VM run
# (default 400 s; a run measured 35-60 s under TCG emulation).
# Two VMs on one wire: rxe_vm2.sh. The shared parts: vm_lib.sh.
set -euo pipefail
share=${1:?usage: rxe_vm.sh SHARE_DIR [ELF...]}
shift
vm_share=$(cd "$share" && pwd)
vm_name=rxe_vm
. "$(dirname "$0")/vm_lib.sh"
vm_check_host
[ -f "$vm_share/run.sh" ] || { echo "rxe_vm: $vm_share/run.sh is missing" >&2; exit 2; }

vm_work=$(mktemp -d /tmp/mlxdist-vm.XXXXXX)
trap 'rm -rf "$vm_work"' EXIT
vm_build_initrd "$vm_work" "$@" "$vm_share"/*

rm -f "$vm_share/vm.rc" "$vm_share/vm.out" "$vm_share/vm.boot" "$vm_share/vm.console"
t1=$(vm_now)
rc=0
vm_qemu_cmd ""
"${vm_cmd[@]}" </dev/null >"$vm_work/console.log" 2>&1 || rc=$?
cp "$vm_work/console.log" "$vm_share/vm.console" 2>/dev/null || true
echo "rxe_vm: VM ran $(vm_since "$t1") s (qemu exit $rc)"
[ -f "$vm_share/vm.boot" ] && cat "$vm_share/vm.boot"
if [ ! -f "$vm_share/vm.rc" ]; then
  echo "rxe_vm: the VM did not finish run.sh (qemu exit $rc$([ $rc = 124 ] && echo ": timed out after ${MLXDIST_VM_TIMEOUT:-400} s")); console:"
  tail -n 60 "$vm_work/console.log"
  exit 1
fi
exit "$(cat "$vm_share/vm.rc")"
