#!/usr/bin/env bash
# jaccl vs the ring backend over TCP, measured by mlxdist-bench in ONE boot of
# the soft-RoCE VM (tests/vm/rxe_vm.sh: qemu TCG, rdma_rxe on eth0, 1 vCPU).
#   usage: sudo scripts/bench-jaccl-vm.sh [BUILD_DIR]   (default: build)
# Needs BUILD_DIR/tools/mlxdist-bench and mlxdist-launch. In the VM, 2 ranks
# on the one host run, for each op (all_sum, all_gather, all_to_all, sendrecv) and each
# round, first under jaccl (a mesh of 2: MLX_IBV_DEVICES naming rxe0; the two
# ranks share the VM's host, so jaccl's router gives the pair shared memory,
# docs/jaccl.md; before the router, RC queue pairs over rxe's loopback) and
# then under the ring backend with MLXDIST_TRANSPORT=tcp (loopback TCP), the
# same sizes and bench options: the two backends are interleaved, so a slow
# phase of the emulator hits both. Then the host prints one table: per op and size the median of
# the rounds' medians (us per op), the fastest and slowest batch over all
# rounds (min-max), and jaccl's time / TCP's time.
# This is SOFTWARE EMULATION: the CPU is emulated (TCG) and the RDMA device is
# the kernel's rxe; the figures say nothing about RDMA hardware and swing
# widely between runs: compare within one run only.
# Tunables (environment): BENCH_ROUNDS (default 2), BENCH_OPS (default
# "all_sum all_gather all_to_all sendrecv"; all_to_all's size is a rank's whole input,
# 2 parts), BENCH_ARGS (default "-b 16 -e 16M -f 16
# -t 100 --batches 5": 16 B, 256 B, 4 KiB, 64 KiB, 1 MiB, 16 MiB),
# BENCH_OUT (a directory: the raw CSV and the table are copied there),
# MLXDIST_VM_TIMEOUT (the VM's bound, default 600 s).
# A/B of two builds' jaccl over verbs: BENCH_BUILD_B=DIR runs DIR's jaccl in
# place of the ring over TCP, and both builds' ranks each get their own
# MLXDIST_HOST_ID (vmhost0, vmhost1), so the pair talks over verbs (RC queue
# pairs through rxe's loopback) as two hosts would, not over shared memory;
# the table's columns are then A (BUILD_DIR) and B, and its ratio B/A.
# Exit: 0, 1 when a bench run failed, 77 (skip) without root, qemu or the
# kernel package (as the VM tests), 2 on bad usage.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
for p in mlxdist-bench mlxdist-launch; do
  [ -x "$build/tools/$p" ] || { echo "bench-jaccl-vm: $build/tools/$p is missing (build it first)" >&2; exit 2; }
done
rounds=${BENCH_ROUNDS:-2}
ops=${BENCH_OPS:-all_sum all_gather all_to_all sendrecv}
args=${BENCH_ARGS:--b 16 -e 16M -f 16 -t 100 --batches 5}
case $rounds in '' | *[!0-9]* | 0) echo "bench-jaccl-vm: BENCH_ROUNDS must be a positive integer" >&2; exit 2 ;; esac

share=$(mktemp -d /tmp/mlxdist-vmshare.XXXXXX)
trap 'rm -rf "$share"' EXIT
cp "$build/tools/mlxdist-bench" "$build/tools/mlxdist-launch" "$share/"
build_b=${BENCH_BUILD_B:-}
if [ -n "$build_b" ]; then
  for p in mlxdist-bench mlxdist-launch; do
    [ -x "$build_b/tools/$p" ] || { echo "bench-jaccl-vm: $build_b/tools/$p is missing" >&2; exit 2; }
  done
  mkdir "$share/b"
  cp "$build_b/tools/mlxdist-bench" "$build_b/tools/mlxdist-launch" "$share/b/"
fi
printf '%s\n' "$rounds" >"$share/rounds"
printf '%s\n' "$ops" >"$share/ops"
printf '%s\n' "$args" >"$share/args"
export MLXDIST_VM_TIMEOUT=${MLXDIST_VM_TIMEOUT:-600}
cat >"$share/run.sh" <<'RUN'
# runs inside the VM, in /share (busybox sh)
ulimit -l unlimited 2>/dev/null
export MLXDIST_CONNECT_TIMEOUT=60 MLXDIST_TIMEOUT=30
rounds=$(cat rounds) ops=$(cat ops) args=$(cat args)
now() { cut -d' ' -f1 /proc/uptime; }
echo '[[null,"rxe0"],["rxe0",null]]' >/tmp/m.json
: >bench.csv
fail=0
# one KIND ROUND OP: one launch of 2 ranks; rank 0's CSV rows go to bench.csv
one() {
  kind=$1 round=$2 op=$3
  t0=$(now)
  if [ -d b ] && [ "$kind" != tcp ]; then # A/B: each rank its own emulated host (verbs)
    dir=.
    [ "$kind" = b ] && dir=./b
    $dir/mlxdist-launch --backend jaccl --ibv-devices /tmp/m.json --timeout 300 -- \
      sh -c 'MLXDIST_HOST_ID=vmhost$MLX_RANK exec "$@"' rank $dir/mlxdist-bench --backend jaccl \
      --op "$op" $args --csv >/tmp/out 2>&1
  elif [ "$kind" = jaccl ]; then
    ./mlxdist-launch --backend jaccl --ibv-devices /tmp/m.json --timeout 300 -- \
      ./mlxdist-bench --backend jaccl --op "$op" $args --csv >/tmp/out 2>&1
  else
    ./mlxdist-launch -n 2 --env MLXDIST_TRANSPORT=tcp --timeout 300 -- \
      ./mlxdist-bench --backend ring --op "$op" $args --csv >/tmp/out 2>&1
  fi
  rc=$?
  t1=$(now)
  rows=$(grep -c '^\[0\] mlxdist-' /tmp/out)
  echo "$kind round $round $op: exit $rc, $rows rows, $(awk "BEGIN{print $t1 - $t0}") s"
  if [ $rc != 0 ] || [ "$rows" = 0 ]; then
    fail=1
    tail -n 20 /tmp/out
  fi
  grep '^\[0\] mlxdist-' /tmp/out | sed "s/^\[0\] /$kind,$round,/" >>bench.csv
}
r=1
while [ $r -le $rounds ]; do
  for op in $ops; do
    one jaccl $r $op
    if [ -d b ]; then one b $r $op; else one tcp $r $op; fi
  done
  r=$((r + 1))
done
exit $fail
RUN
rc=0
# (B's programs named: rxe_vm.sh copies the libraries of the ELFs directly in the share
# and of those it is given)
bash "$root/tests/vm/rxe_vm.sh" "$share" ${build_b:+"$share/b/mlxdist-bench" "$share/b/mlxdist-launch"} || rc=$?
[ $rc = 77 ] && exit 77
[ -f "$share/vm.out" ] && cat "$share/vm.out"
if [ ! -s "$share/bench.csv" ]; then
  echo "bench-jaccl-vm: no measurements came back (exit $rc)"
  exit 1
fi

# The table. CSV row: kind,round,impl,op,ranks,size,count,dtype,time_us,algbw,busbw,cpu_us,
# check,iters,batches,batch_min_us,batch_max_us
table() {
  awk -F, '
    function med(list,   a, n, i, j, t) {
      n = split(list, a, " ")
      for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function human(b) {
      if (b >= 1048576 && b % 1048576 == 0) return (b / 1048576) " MiB"
      if (b >= 1024 && b % 1024 == 0) return (b / 1024) " KiB"
      return b " B"
    }
    {
      k = $4 SUBSEP $6 SUBSEP $1
      if (!(($4 SUBSEP $6) in seen)) { seen[$4 SUBSEP $6] = 1; order[++n] = $4 SUBSEP $6 }
      t[k] = t[k] " " $9
      if (!(k in lo) || $16 + 0 < lo[k]) lo[k] = $16 + 0
      if (!(k in hi) || $17 + 0 > hi[k]) hi[k] = $17 + 0
      nr[k]++
    }
    END {
      if (second == "b") printf "| op | size | A us/op (min-max) | B us/op (min-max) | B/A |\n"
      else printf "| op | size | jaccl us/op (min-max) | tcp us/op (min-max) | jaccl/tcp |\n"
      printf "|---|---:|---:|---:|---:|\n"
      for (i = 1; i <= n; i++) {
        split(order[i], p, SUBSEP)
        kj = order[i] SUBSEP "jaccl"; kt = order[i] SUBSEP second
        mj = (kj in t) ? med(t[kj]) : -1; mt = (kt in t) ? med(t[kt]) : -1
        cj = mj < 0 ? "-" : sprintf("%.1f (%.1f-%.1f)", mj, lo[kj], hi[kj])
        ct = mt < 0 ? "-" : sprintf("%.1f (%.1f-%.1f)", mt, lo[kt], hi[kt])
        ratio = (mj > 0 && mt > 0) ? sprintf("%.2f", second == "b" ? mt / mj : mj / mt) : "-"
        printf "| %s | %s | %s | %s | %s |\n", p[1], human(p[2]), cj, ct, ratio
      }
    }' second="$2" "$1"
}
echo
if [ -n "$build_b" ]; then
  echo "jaccl over verbs (each rank its own MLXDIST_HOST_ID), A = $build vs B = $build_b, 2 ranks, one VM (qemu TCG, soft-RoCE: emulation)"
  echo "bench: $args; $rounds round(s), interleaved; columns: A, B, and B/A (above 1: B is slower)"
  table "$share/bench.csv" b | tee "$share/table.md"
else
  echo "jaccl (one host: shm through the router) vs ring over TCP (MLXDIST_TRANSPORT=tcp), 2 ranks, one VM (qemu TCG, soft-RoCE: emulation)"
  echo "bench: $args; $rounds round(s), interleaved; us/op = median of the rounds' medians, min-max = fastest and slowest batch"
  table "$share/bench.csv" tcp | tee "$share/table.md"
fi
if [ -n "${BENCH_OUT:-}" ]; then
  mkdir -p "$BENCH_OUT"
  cp "$share/bench.csv" "$share/table.md" "$share/vm.out" "$BENCH_OUT/"
fi
exit $rc
