#!/usr/bin/env bash
# Boot two small Linux VMs joined by a virtual wire, each with a soft-RoCE
# device on it, and run a script in each: the harness for tests across two
# RDMA devices that reach each other over a real (emulated) link (issue 23).
#   usage: tests/vm/rxe_vm2.sh SHARE_DIR [ELF...]
# Both VMs mount SHARE_DIR (9p) at /share; VM N runs runN.sh (run.sh when
# there is no runN.sh) with VM_ID=N, VM_IP (its wire address) and PEER_IP
# (the other's), its output in SHARE_DIR/vmN.out, its status in vmN.rc, the
# console in vmN.console. The VMs (1 vCPU, 1 GiB each, the initramfs and
# /init of vm_lib.sh, shared with rxe_vm.sh) each have eth0 on a user-mode
# network of their own (10.0.2.15) and eth1 on the wire: a qemu stream netdev
# over a unix socket (VM 1 listens, VM 2 connects once the socket listens:
# a connecting side that finds nobody fails silently), MTU 9000 (rxe's
# active_mtu 4096), 192.168.77.1/24 and .2/24, rxe0 on eth1.
# Not a `-netdev socket,listen=` wire: its accepted socket lacks TCP_NODELAY
# (~50 ms per small round trip); not UDP: it drops frames under load.
# Exit: 0 when both scripts exit 0, else the first non-zero status (VM 1's
# first); 77 (skip) as rxe_vm.sh; 1 when a VM did not finish (its console's
# tail is printed). MLXDIST_VM_TIMEOUT bounds each VM (default 400 s).
set -euo pipefail
share=${1:?usage: rxe_vm2.sh SHARE_DIR [ELF...]}
shift
vm_share=$(cd "$share" && pwd)
vm_name=rxe_vm2
. "$(dirname "$0")/vm_lib.sh"
vm_check_host
command -v ss >/dev/null || vm_skip "no ss (iproute2)"
for n in 1 2; do
  [ -f "$vm_share/run$n.sh" ] || [ -f "$vm_share/run.sh" ] ||
    { echo "rxe_vm2: $vm_share has neither run$n.sh nor run.sh" >&2; exit 2; }
done

vm_work=$(mktemp -d /tmp/mlxdist-vm2.XXXXXX)
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$vm_work"
}
trap cleanup EXIT
trap 'exit 143' TERM INT  # the EXIT trap stops the VMs
vm_build_initrd "$vm_work" "$@" "$vm_share"/*
for n in 1 2; do rm -f "$vm_share/vm$n".{rc,out,boot,console}; done

sock=$vm_work/wire.sock
t1=$(vm_now)
vm_qemu_cmd "mlxvm.id=1 mlxvm.wire=192.168.77.1/24 mlxvm.peer=192.168.77.2" \
  -netdev "stream,id=w,server=on,addr.type=unix,addr.path=$sock" \
  -device virtio-net-pci,netdev=w,mac=52:54:00:77:00:01,romfile=
"${vm_cmd[@]}" </dev/null >"$vm_work/vm1.log" 2>&1 &
pids+=($!)
# VM 2 connects only once VM 1's qemu listens on the socket (at most 30 s).
i=0
until ss -xlH 2>/dev/null | grep -qF " $sock "; do
  i=$((i + 1))
  if [ $i -gt 300 ] || ! kill -0 "${pids[0]}" 2>/dev/null; then
    echo "rxe_vm2: VM 1's qemu did not listen on $sock; its log:"
    tail -n 30 "$vm_work/vm1.log"
    exit 1
  fi
  sleep 0.1
done
echo "rxe_vm2: wire listening after $(vm_since "$t1") s"
vm_qemu_cmd "mlxvm.id=2 mlxvm.wire=192.168.77.2/24 mlxvm.peer=192.168.77.1" \
  -netdev "stream,id=w,server=off,addr.type=unix,addr.path=$sock" \
  -device virtio-net-pci,netdev=w,mac=52:54:00:77:00:02,romfile=
"${vm_cmd[@]}" </dev/null >"$vm_work/vm2.log" 2>&1 &
pids+=($!)
qrc=()
for n in 1 2; do
  r=0
  wait "${pids[$((n - 1))]}" || r=$?
  qrc+=("$r")
  echo "rxe_vm2: VM $n ran $(vm_since "$t1") s (qemu exit $r)"
done
pids=()
rc=0
for n in 1 2; do
  cp "$vm_work/vm$n.log" "$vm_share/vm$n.console" 2>/dev/null || true
  [ -f "$vm_share/vm$n.boot" ] && cat "$vm_share/vm$n.boot"
  if [ ! -f "$vm_share/vm$n.rc" ]; then
    r=${qrc[$((n - 1))]}
    echo "rxe_vm2: VM $n did not finish its script (qemu exit $r$([ "$r" = 124 ] && echo ": timed out after ${MLXDIST_VM_TIMEOUT:-400} s")); console:"
    tail -n 60 "$vm_work/vm$n.log"
    rc=1
  elif [ $rc = 0 ]; then
    rc=$(cat "$vm_share/vm$n.rc")
  fi
done
exit "$rc"
