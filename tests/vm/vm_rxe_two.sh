#!/usr/bin/env bash
# ctest vm_rxe_two: two VMs joined by a virtual wire (tests/vm/rxe_vm2.sh, one
# boot of each), each with rxe0 on the wire (MTU 9000, active_mtu 4096):
#  - ibv_rc_pingpong (RC send/recv) and, when perftest is installed,
#    ib_write_bw (RDMA writes) from VM 2 to VM 1: the wire carries verbs;
#  - the conformance program (tests/conformance/test_collectives.c) across
#    the two VMs, half of the ranks in each, one case per CASE argument:
#      jaccl:N        MLX's jaccl, mesh: every cell "rxe0" (each VM's rxe0
#                     reaches the other VM's and its own), coordinator rank 0
#                     on VM 1 (192.168.77.1)
#      jaccl-gather:N the same as jaccl:N through the caller's all-gather
#                     (test_collectives --all-gather DIR, DIR in the common
#                     9p share) instead of the coordinator
#      jaccl-ring:N   MLX_JACCL_RING=1 and only the neighbours' cells filled
#                     (the other pairs go over TCP across the wire)
#      ring:N         the ring backend over TCP on the wire (the harness's
#                     own check: needs no verbs)
#    N even; MLXDIST_TEST_LIGHT=1 (emulated CPUs are ~10x slower).
#   usage: vm_rxe_two.sh [TEST_COLLECTIVES [CASE...]]
# VM_TWO_ENV="NAME=VALUE ..." is exported in both VMs (e.g.
# MLXDIST_TEST_VERBOSE=1); VM_TWO_KEEP=1 keeps the share (every rank's output)
# and prints its path.
# Exit 77 (skip) where the harness cannot run (not root, no qemu or kernel).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
share=$(mktemp -d /tmp/mlxdist-vmshare2.XXXXXX)
if [ "${VM_TWO_KEEP:-0}" = 1 ]; then
  trap 'echo "vm_rxe_two: the share is kept in $share"' EXIT
else
  trap 'rm -rf "$share"' EXIT
fi
cp "$here/vm_guest.sh" "$share/"
echo "${VM_TWO_ENV:-}" >"$share/env"
cases=()
if [ $# -gt 0 ]; then
  cp "$1" "$share/test_collectives"
  shift
  cases=("$@")
fi
for c in "${cases[@]}"; do
  case $c in
    jaccl:[0-9]* | jaccl-gather:[0-9]* | jaccl-ring:[0-9]* | ring:[0-9]*) n=${c#*:} ;;
    *) echo "vm_rxe_two: unknown case '$c' (expected jaccl:N, jaccl-gather:N, jaccl-ring:N or ring:N)" >&2; exit 2 ;;
  esac
  [ $((n % 2)) = 0 ] && [ "$n" -ge 2 ] || { echo "vm_rxe_two: case '$c': N must be even and >= 2" >&2; exit 2; }
done
echo "${cases[*]}" >"$share/cases"
cat >"$share/run.sh" <<'RUN'
# runs in each VM, in /share (busybox sh); VM_ID, VM_IP, PEER_IP from /init
. ./vm_guest.sh
ulimit -l unlimited 2>/dev/null || echo "ulimit -l unlimited refused: $(ulimit -l) KiB lockable"
export MLXDIST_CONNECT_TIMEOUT=60
for e in $(cat env); do export "$e"; done
t0=$(now_ms)
el() { echo "$(( ($(now_ms) - t0) ))"; }
g=$(gid_index rxe0 "$VM_IP")
[ -n "$g" ] || no "rxe0 has no RoCE v2 GID for $VM_IP"
echo "== vm$VM_ID: rxe0 on eth1 ($VM_IP, MTU $(cat /sys/class/net/eth1/mtu)), GID index $g"
ibv_devinfo -d rxe0 >devinfo.$VM_ID 2>&1
grep -E 'state|active_mtu' devinfo.$VM_ID
grep -q 'active_mtu:.*4096' devinfo.$VM_ID || no "rxe0's active_mtu is not 4096 on an MTU 9000 wire"

echo "== ibv_rc_pingpong across the wire (RC send/recv, 4096-byte MTU)"
if [ "$VM_ID" = 1 ]; then
  timeout 90 ibv_rc_pingpong -d rxe0 -g "$g" -m 4096 -n 200 >pp.$VM_ID 2>&1 || no "ibv_rc_pingpong (server) exit $?"
else
  retry 60 timeout 30 ibv_rc_pingpong -d rxe0 -g "$g" -m 4096 -n 200 "$PEER_IP" >pp.$VM_ID 2>&1 ||
    no "ibv_rc_pingpong (client) exit $?"
fi
cat pp.$VM_ID
grep -q '200 iters' pp.$VM_ID || no "ibv_rc_pingpong did not finish its 200 iterations"
echo "   ($(el) ms)"

if command -v ib_write_bw >/dev/null; then
  echo "== ib_write_bw across the wire (RC RDMA writes, 64 KiB)"
  if [ "$VM_ID" = 1 ]; then
    timeout 90 ib_write_bw -d rxe0 -x "$g" -s 65536 -n 200 -F -p 18517 >bw.$VM_ID 2>&1 || no "ib_write_bw (server) exit $?"
  else
    retry 60 timeout 30 ib_write_bw -d rxe0 -x "$g" -s 65536 -n 200 -F -p 18517 "$PEER_IP" >bw.$VM_ID 2>&1 ||
      no "ib_write_bw (client) exit $?"
  fi
  grep -E '^ *65536 ' bw.$VM_ID || { cat bw.$VM_ID; no "ib_write_bw printed no result"; }
  echo "   ($(el) ms)"
else
  echo "== ib_write_bw not installed (perftest): not run"
fi

# conf BACKEND N PORT: the conformance program at N ranks, ranks (VM_ID-1)*N/2 .. here.
conf() {
  b=$1 n=$2 port=$3 half=$(($2 / 2)) tag=$1.$2
  first=$(((VM_ID - 1) * half))
  echo "== test_collectives under $b, $n ranks across the two VMs (ranks $first..$((first + half - 1)) here)"
  i=0 rows=
  while [ $i -lt "$n" ]; do
    if [ "$b" = ring ]; then # the hostfile: rank i's address, on its VM's wire
      row="\"192.168.77.$((i / half + 1)):$((port + i))\""
    else # the device matrix: rxe0 in every off-diagonal cell (a ring: the neighbours' only)
      j=0 row=
      while [ $j -lt "$n" ]; do
        d=$(((i - j + n) % n))
        if [ $i = $j ]; then
          cell=null
        elif [ "$b" != jaccl-ring ] || [ $d = 1 ] || [ $d = $((n - 1)) ]; then
          cell='"rxe0"'
        else
          cell=null
        fi
        row=${row:+$row, }$cell
        j=$((j + 1))
      done
    fi
    rows=${rows:+$rows, }[$row]
    i=$((i + 1))
  done
  echo "[$rows]" >/tmp/$tag.json
  cat /tmp/$tag.json
  ts=$(now_ms)
  r=$first
  while [ $r -lt $((first + half)) ]; do
    case $b in
      ring) set -- MLX_HOSTFILE=/tmp/$tag.json ;;
      jaccl) set -- MLX_IBV_DEVICES=/tmp/$tag.json MLX_JACCL_COORDINATOR=192.168.77.1:$port ;;
      jaccl-ring) set -- MLX_IBV_DEVICES=/tmp/$tag.json MLX_JACCL_COORDINATOR=192.168.77.1:$port MLX_JACCL_RING=1 ;;
      jaccl-gather) set -- MLX_IBV_DEVICES=/tmp/$tag.json ;;
    esac
    set -- "$@" timeout 300 ./test_collectives ${b%-*}
    if [ "$b" = jaccl-gather ]; then # the all-gather's files, seen by both VMs
      mkdir -p "/share/gather.$tag"
      set -- "$@" --all-gather "/share/gather.$tag"
    fi
    (env MLX_RANK=$r MLXDIST_TEST_LIGHT=1 "$@" >c.$tag.r$r 2>&1
     echo $? >/tmp/$tag.r$r.rc) &
    r=$((r + 1))
  done
  wait
  r=$first
  while [ $r -lt $((first + half)) ]; do
    rc=$(cat /tmp/$tag.r$r.rc)
    tail -n 3 c.$tag.r$r
    [ "$rc" = 0 ] || { tail -n 30 c.$tag.r$r; no "test_collectives $b, $n ranks: rank $r exit $rc"; }
    r=$((r + 1))
  done
  echo "   ($(($(now_ms) - ts)) ms)"
  barrier "$tag" 300 || no "the other VM did not finish $b at $n ranks"
}
port=32323
for c in $(cat cases); do
  conf "${c%:*}" "${c#*:}" $port
  port=$((port + 16))
done
barrier end 300 || no "the other VM did not finish"
echo "== vm$VM_ID done in $(el) ms, $([ $fail = 0 ] && echo passed || echo FAILED)"
exit $fail
RUN
rc=0
bash "$here/rxe_vm2.sh" "$share" || rc=$?
for n in 1 2; do
  echo "---- VM $n"
  [ -f "$share/vm$n.out" ] && cat "$share/vm$n.out"
done
[ $rc = 0 ] && echo "vm_rxe_two: passed" || echo "vm_rxe_two: exit $rc"
exit $rc
