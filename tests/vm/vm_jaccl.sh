#!/usr/bin/env bash
# ctest vm_jaccl: the jaccl backend on real verbs (soft-RoCE) in ONE VM boot
# (tests/vm/rxe_vm.sh): the conformance program (tests/conformance) under
# jaccl at 2, 3 and 4 ranks, mesh and ring (MLX_JACCL_RING; at 4 ranks the
# ring links only neighbours, so the other pairs go over TCP), through the
# coordinator and through the caller's all-gather (--all-gather DIR),
# mlxdist-launch --backend jaccl|jaccl-ring on the VM's one host, and
# mlxdist-bench --backend jaccl --check under it. Each case is a shell
# function of run.sh below (the VM's busybox sh); every case's time is printed.
#   usage: vm_jaccl.sh TEST_COLLECTIVES MLXDIST_LAUNCH MLXDIST_BENCH
# The default set leaves out the ring at 2 and 3 ranks (conf_2_ring_*,
# conf_3_ring_*): a ring that small links every pair, so it builds the
# same transports as the mesh (measured passing: 10-21 s each); the ring at 4
# ranks is the one with unlinked pairs. It also leaves out the cases ctest
# vm_rxe_two runs across two VMs with the same program (MLXDIST_TEST_LIGHT):
# the mesh of 2 and of 4 and the ring of 4 through the coordinator
# (conf_2_mesh_coord, conf_4_mesh_coord, conf_4_ring_coord: its jaccl:2,
# jaccl:4 with two ranks in each VM, jaccl-ring:4) and the mesh of 2 through
# the all-gather (conf_2_mesh_gather: its jaccl-gather:2); ~89 s of the 246 s.
# MLXDIST_VM_CASES="case ..." runs only those cases (any function below,
# "all" for every one). The VM is given MLXDIST_VM_TIMEOUT=600 s unless set
# (the former default set ran 4.5 min). Exit 77 (skip) where the harness
# cannot run (not root, no qemu or kernel).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
coll=${1:?usage: vm_jaccl.sh TEST_COLLECTIVES MLXDIST_LAUNCH MLXDIST_BENCH}
launch=${2:?usage: vm_jaccl.sh TEST_COLLECTIVES MLXDIST_LAUNCH MLXDIST_BENCH}
bench=${3:?usage: vm_jaccl.sh TEST_COLLECTIVES MLXDIST_LAUNCH MLXDIST_BENCH}
share=$(mktemp -d /tmp/mlxdist-vmshare.XXXXXX)
trap 'rm -rf "$share"' EXIT
cp "$coll" "$share/test_collectives"
cp "$launch" "$share/mlxdist-launch"
cp "$bench" "$share/mlxdist-bench"
echo "${MLXDIST_VM_CASES:-}" >"$share/cases"
export MLXDIST_VM_TIMEOUT=${MLXDIST_VM_TIMEOUT:-600}
cat >"$share/run.sh" <<'RUN'
# runs inside the VM, in /share (busybox sh)
ulimit -l unlimited 2>/dev/null
export MLXDIST_TEST_LIGHT=1 MLXDIST_CONNECT_TIMEOUT=60 MLXDIST_TIMEOUT=30
fail=0
now() { cut -d' ' -f1 /proc/uptime; }
# matrix FILE N mesh|ring: every off-diagonal cell rxe0, or only the neighbours'
matrix() {
  f=$1 n=$2 kind=$3 i=0 text="["
  while [ $i -lt $n ]; do
    j=0 row="["
    while [ $j -lt $n ]; do
      [ $j -gt 0 ] && row="$row,"
      d=$(((i - j + n) % n))
      if [ $i = $j ]; then row="${row}null"
      elif [ $kind = mesh ] || [ $d = 1 ] || [ $d = $((n - 1)) ]; then row="$row\"rxe0\""
      else row="${row}null"; fi
      j=$((j + 1))
    done
    text="$text$row]"
    i=$((i + 1))
    [ $i -lt $n ] && text="$text,"
  done
  echo "$text]" >"$f"
}
port=40000
# conf N mesh|ring coord|gather [HOSTS]: N ranks of the conformance program. HOSTS: one
# letter per rank, its MLXDIST_HOST_ID ("aabb": ranks 0,1 on emulated host a, 2,3 on b), or
# "same" for none (every rank on the VM's one host, so jaccl's router gives every pair shared
# memory); both with MLX_RING_VERBOSE=1 (the routes and the bytes sent per transport logged).
# Default: a host per rank, so every pair takes verbs (TCP where a ring has no link).
conf() {
  n=$1 topo=$2 path=$3 hosts=${4:-} name="conf_$1_$2_$3${4:+_$4}"
  port=$((port + 1))
  m=/tmp/$name.json
  matrix "$m" "$n" "$topo"
  ring=
  [ "$topo" = ring ] && ring=1
  rm -rf "/tmp/$name.d" && mkdir -p "/tmp/$name.d"
  t0=$(now)
  r=0 pids=
  while [ $r -lt $n ]; do
    hid=vmhost$r verbose=
    [ -n "$hosts" ] && hid= verbose=1
    [ -n "$hosts" ] && [ "$hosts" != same ] && hid=vmhost$(echo "$hosts" | cut -c$((r + 1)))
    if [ "$path" = coord ]; then
      env ${hid:+MLXDIST_HOST_ID=$hid} ${verbose:+MLX_RING_VERBOSE=1} MLX_RANK=$r MLX_IBV_DEVICES=$m MLX_JACCL_COORDINATOR=10.0.2.15:$port ${ring:+MLX_JACCL_RING=1} \
        ./test_collectives jaccl >"/tmp/$name.$r" 2>&1 &
    else
      env ${hid:+MLXDIST_HOST_ID=$hid} ${verbose:+MLX_RING_VERBOSE=1} MLX_RANK=$r MLX_IBV_DEVICES=$m ${ring:+MLX_JACCL_RING=1} \
        ./test_collectives jaccl --all-gather "/tmp/$name.d" >"/tmp/$name.$r" 2>&1 &
    fi
    pids="$pids $!"
    r=$((r + 1))
  done
  ok=1
  for p in $pids; do wait $p || ok=0; done
  t1=$(now)
  r=0
  while [ $r -lt $n ]; do
    grep -q "rank $r of $n (jaccl): all checks passed" "/tmp/$name.$r" || ok=0
    r=$((r + 1))
  done
  if [ $ok = 1 ]; then
    echo "PASS $name $(awk "BEGIN{print $t1 - $t0}") s"
  else
    echo "FAIL $name $(awk "BEGIN{print $t1 - $t0}") s"
    fail=1
    for f in /tmp/$name.[0-9]*; do echo "--- $f"; tail -n 15 "$f"; done
  fi
}
# route NAME RANK LINE: rank RANK's log of case NAME has LINE (a fixed string)
route() {
  grep -qF "$3" "/tmp/$1.$2" && return 0
  echo "FAIL $1: rank $2 logged no line '$3':"
  grep '^\[jaccl\]' "/tmp/$1.$2" | head -n 12
  fail=1
}
# sent NAME RANK KIND...: some 'bytes sent' line of rank RANK has more than 0 bytes of each KIND
sent() {
  f=/tmp/$1.$2
  shift 2
  for k in "$@"; do
    if ! grep 'bytes sent:' "$f" | grep -q "$k [1-9]"; then
      echo "FAIL: no bytes sent over $k in $f:"
      grep 'bytes sent:' "$f"
      fail=1
    fi
  done
  grep -h 'bytes sent:' "$f" | tail -n 1
}
# jaccl between ranks of one host: shared memory (the router), no verbs transport at all
same_2_mesh() {
  conf 2 mesh coord same
  for r in 0 1; do
    route conf_2_mesh_coord_same $r "[jaccl] rank $r: transports: shm with ranks $((1 - r))"
    route conf_2_mesh_coord_same $r "[jaccl] rank $r of 2 ready (mesh, shm transport)"
  done
}
# two emulated hosts of two ranks: shm within a host, verbs across (a mesh)
route_4_mesh() {
  conf 4 mesh coord aabb
  route conf_4_mesh_coord_aabb 0 "[jaccl] rank 0: transports: shm with ranks 1; verbs with ranks 2,3"
  route conf_4_mesh_coord_aabb 3 "[jaccl] rank 3: transports: shm with ranks 2; verbs with ranks 0,1"
  sent conf_4_mesh_coord_aabb 0 shm verbs
}
# ... and a ring: shm within a host, verbs to the linked neighbour, TCP to the unlinked rank
route_4_ring() {
  conf 4 ring gather aabb
  route conf_4_ring_gather_aabb 0 "[jaccl] rank 0: transports: shm with ranks 1; verbs with ranks 3; tcp with ranks 2"
  route conf_4_ring_gather_aabb 1 "[jaccl] rank 1: transports: shm with ranks 0; verbs with ranks 2; tcp with ranks 3"
  sent conf_4_ring_gather_aabb 0 shm verbs tcp
}
conf_2_mesh_coord() { conf 2 mesh coord; }
conf_3_mesh_coord() { conf 3 mesh coord; }
conf_4_mesh_coord() { conf 4 mesh coord; }
conf_2_ring_coord() { conf 2 ring coord; }
conf_3_ring_coord() { conf 3 ring coord; }
conf_4_ring_coord() { conf 4 ring coord; }
conf_2_mesh_gather() { conf 2 mesh gather; }
conf_3_mesh_gather() { conf 3 mesh gather; }
conf_4_mesh_gather() { conf 4 mesh gather; }
conf_2_ring_gather() { conf 2 ring gather; }
conf_3_ring_gather() { conf 3 ring gather; }
conf_4_ring_gather() { conf 4 ring gather; }
# mlxdist-launch --backend jaccl (a mesh of 2) and jaccl-ring (a ring of 3) on this host
launch_jaccl() {
  matrix /tmp/launch2.json 2 mesh
  matrix /tmp/launch3.json 3 ring
  for spec in "jaccl /tmp/launch2.json 2" "jaccl-ring /tmp/launch3.json 3"; do
    set -- $spec
    t0=$(now)
    ./mlxdist-launch --backend "$1" --ibv-devices "$2" --timeout 200 -- ./test_collectives jaccl \
      >/tmp/launch.out 2>&1
    rc=$?
    t1=$(now)
    if [ $rc = 0 ] && [ "$(grep -c "of $3 (jaccl): all checks passed" /tmp/launch.out)" = "$3" ]; then
      echo "PASS launch_$1 $(awk "BEGIN{print $t1 - $t0}") s"
    else
      echo "FAIL launch_$1 (exit $rc) $(awk "BEGIN{print $t1 - $t0}") s"
      tail -n 30 /tmp/launch.out
      fail=1
    fi
  done
}
# mlxdist-bench under jaccl (2 ranks, every op, results checked)
bench_jaccl() {
  matrix /tmp/bench2.json 2 mesh
  t0=$(now)
  ./mlxdist-launch --backend jaccl --ibv-devices /tmp/bench2.json --timeout 200 -- \
    ./mlxdist-bench --backend jaccl --op all -b 4 -e 1M -f 32 -t 20 --batches 2 --check \
    >/tmp/bench.out 2>&1
  rc=$?
  t1=$(now)
  cat /tmp/bench.out
  if [ $rc = 0 ] && grep -q ' ok ' /tmp/bench.out && ! grep -q FAIL /tmp/bench.out; then
    echo "PASS bench_jaccl $(awk "BEGIN{print $t1 - $t0}") s"
  else
    echo "FAIL bench_jaccl (exit $rc) $(awk "BEGIN{print $t1 - $t0}") s"
    fail=1
  fi
}
default="conf_3_mesh_coord conf_3_mesh_gather conf_4_mesh_gather conf_4_ring_gather launch_jaccl
bench_jaccl same_2_mesh route_4_mesh route_4_ring"
all="conf_2_mesh_coord conf_3_mesh_coord conf_4_mesh_coord conf_2_ring_coord conf_3_ring_coord
conf_4_ring_coord conf_2_mesh_gather conf_3_mesh_gather conf_4_mesh_gather conf_2_ring_gather
conf_3_ring_gather conf_4_ring_gather launch_jaccl bench_jaccl same_2_mesh route_4_mesh route_4_ring"
cases=$(cat cases)
[ -n "$cases" ] || cases=$default
[ "$cases" = all ] && cases=$all
for c in $cases; do $c; done
exit $fail
RUN
rc=0
bash "$here/rxe_vm.sh" "$share" || rc=$?
[ -f "$share/vm.out" ] && cat "$share/vm.out"
[ $rc = 0 ] && echo "vm_jaccl: passed" || echo "vm_jaccl: exit $rc"
exit $rc
