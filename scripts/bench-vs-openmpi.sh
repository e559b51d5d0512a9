#!/bin/sh
# Compare mlxdist (ring backend) with Open MPI on this host.
#
#   scripts/bench-vs-openmpi.sh BUILD_DIR [RESULTS_DIR]
#
# Builds nothing: BUILD_DIR must hold tools/mlxdist-launch, tools/mlxdist-bench and
# tools/mpi_ref_bench. For every rank count it runs, each with --csv into RESULTS_DIR
# (default: BUILD_DIR/bench-results):
#   mlxdist-<transport>-n<N>.csv  mlxdist-bench under mlxdist-launch, for every transport
#                                 in BENCH_TRANSPORTS ("default": MLXDIST_TRANSPORT unset,
#                                 i.e. auto = shared memory on one host; "tcp", "shm")
#   mpi-tcp-n<N>.csv              mpi_ref_bench under mpirun --mca btl self,tcp
#   mpi-shm-n<N>.csv              mpi_ref_bench under mpirun --mca btl self,vader
# then prints a side-by-side table of the times with ratios (mlxdist time / Open MPI
# time; default and shm are compared with Open MPI's shared memory, tcp with its tcp),
# and draws busbw-vs-size plots (busbw-<op>-n<N>.png) with gnuplot (scripts/plot.gp).
#
# Settings (environment):
#   BENCH_RANKS       rank counts                    (default "2 4")
#   BENCH_OPS         --op for both benchmarks       (default all)
#   BENCH_MIN_BYTES   smallest size                  (default 4)
#   BENCH_MAX_BYTES   largest size                   (default 4M; 64M for a full run)
#   BENCH_FACTOR      size factor                    (default 4)
#   BENCH_ITERS       timed iterations               (default 10)
#   BENCH_WARMUP      warm-up iterations             (default 3)
#   BENCH_DTYPE       element type                   (default float32)
#   BENCH_TRANSPORTS  mlxdist transports             (default "default tcp")
#   BENCH_TIMEOUT     seconds allowed per run        (default 300)
#   BENCH_CHECK       1: also verify results         (default 0)
# The defaults take well under 2 minutes on a small machine.
set -u

if [ $# -lt 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  sed -n '2,/^set -u/p' "$0" | sed -e '/^set -u/d' -e 's/^# \{0,1\}//'
  [ $# -lt 1 ] && exit 2 || exit 0
fi

build=$1
results=${2:-$build/bench-results}
here=$(cd "$(dirname "$0")" && pwd)
launch=$build/tools/mlxdist-launch
bench=$build/tools/mlxdist-bench
ref=$build/tools/mpi_ref_bench

ranks=${BENCH_RANKS:-"2 4"}
ops=${BENCH_OPS:-all}
transports=${BENCH_TRANSPORTS:-"default tcp"}
timeout_s=${BENCH_TIMEOUT:-300}
set -- --op "$ops" -b "${BENCH_MIN_BYTES:-4}" -e "${BENCH_MAX_BYTES:-4M}" \
  -f "${BENCH_FACTOR:-4}" -n "${BENCH_ITERS:-10}" -w "${BENCH_WARMUP:-3}" \
  --dtype "${BENCH_DTYPE:-float32}" --csv
[ "${BENCH_CHECK:-0}" = 1 ] && set -- "$@" --check

for f in "$launch" "$bench"; do
  if [ ! -x "$f" ]; then
    echo "[bench] '$f' is missing; build the tools first (cmake --build $build)." >&2
    exit 2
  fi
done
have_mpi=1
if [ ! -x "$ref" ] || ! command -v mpirun >/dev/null 2>&1; then
  echo "[bench] '$ref' or mpirun is missing; running mlxdist only." >&2
  have_mpi=0
fi
mkdir -p "$results" || exit 1

mpi_flags="--oversubscribe"
[ "$(id -u)" = 0 ] && mpi_flags="$mpi_flags --allow-run-as-root"
status=0
start=$(date +%s)

for n in $ranks; do
  for t in $transports; do
    out=$results/mlxdist-$t-n$n.csv
    echo "== mlxdist, $n ranks, transport $t -> $out" >&2
    if [ "$t" = default ]; then envopt=""; else envopt="--env MLXDIST_TRANSPORT=$t"; fi
    # only rank 0 prints; drop the launcher's "[0] " prefix
    # shellcheck disable=SC2086
    if "$launch" -n "$n" --timeout "$timeout_s" $envopt -- "$bench" --backend ring "$@" \
        > "$results/.raw" 2> "$results/mlxdist-$t-n$n.log"; then
      sed -n 's/^\[0\] //p' "$results/.raw" > "$out"
    else
      echo "[bench] mlxdist run ($n ranks, $t) failed; see $results/mlxdist-$t-n$n.log" >&2
      sed -n 's/^\[0\] //p' "$results/.raw" > "$out"
      status=1
    fi
  done
  if [ $have_mpi = 1 ]; then
    for m in tcp shm; do
      if [ $m = tcp ]; then btl=self,tcp; else btl=self,vader; fi
      out=$results/mpi-$m-n$n.csv
      echo "== Open MPI, $n ranks, btl $btl -> $out" >&2
      # shellcheck disable=SC2086
      if ! timeout "$timeout_s" mpirun -np "$n" $mpi_flags --mca pml ob1 --mca btl "$btl" \
          "$ref" "$@" > "$out" 2> "$results/mpi-$m-n$n.log"; then
        echo "[bench] Open MPI run ($n ranks, $btl) failed; see $results/mpi-$m-n$n.log" >&2
        status=1
      fi
    done
  fi
done
rm -f "$results/.raw"

# ---- side-by-side table -------------------------------------------------------
# CSV columns: impl,op,ranks,size,count,dtype,time_us,algbw_gbps,busbw_gbps,cpu_us,check
table=$results/comparison.txt
(
  cd "$results" || exit 1
  # shellcheck disable=SC2012
  files=$(ls mlxdist-*-n*.csv mpi-*-n*.csv 2>/dev/null)
  [ -n "$files" ] || exit 0
  # shellcheck disable=SC2086
  awk -F, -v transports="$transports" '
    FNR == 1 { v = FILENAME; sub(/-n[0-9]+\.csv$/, "", v); seen[v] = 1; next }
    $4 ~ /^[0-9]+$/ {
      k = $3 SUBSEP $2 SUBSEP $4
      if (!(k in known)) { known[k] = 1; keys[++nk] = k }
      t[k, v] = $7; bw[k, v] = $9
    }
    function ratio(a, b) { return (a == "" || b == "" || b + 0 == 0) ? "-" : sprintf("%.2f", a / b) }
    function cell(x) { return x == "" ? "-" : x }
    END {
      nt = split(transports, tr, " ")
      hdr = sprintf("%-5s %-11s %10s", "ranks", "op", "size(B)")
      for (i = 1; i <= nt; i++) hdr = hdr sprintf(" %12s", "mlx-" tr[i] "(us)")
      hdr = hdr sprintf(" %12s %12s", "mpi-shm(us)", "mpi-tcp(us)")
      for (i = 1; i <= nt; i++) hdr = hdr sprintf(" %11s", tr[i] "/mpi")
      print hdr
      last = ""
      for (j = 1; j <= nk; j++) {
        k = keys[j]; split(k, p, SUBSEP)
        if (p[1] SUBSEP p[2] != last && last != "") print ""
        last = p[1] SUBSEP p[2]
        line = sprintf("%-5s %-11s %10s", p[1], p[2], p[3])
        for (i = 1; i <= nt; i++) line = line sprintf(" %12s", cell(t[k, "mlxdist-" tr[i]]))
        line = line sprintf(" %12s %12s", cell(t[k, "mpi-shm"]), cell(t[k, "mpi-tcp"]))
        for (i = 1; i <= nt; i++) {
          ref = (tr[i] == "tcp") ? "mpi-tcp" : "mpi-shm"
          line = line sprintf(" %11s", ratio(t[k, "mlxdist-" tr[i]], t[k, ref]))
        }
        print line
      }
      print ""
      print "ratio = mlxdist time / Open MPI time (tcp vs btl tcp; default/shm vs btl vader);"
      print "below 1 means mlxdist is faster."
    }' $files
) > "$table"
cat "$table"

# ---- plots ----------------------------------------------------------------------
if command -v gnuplot >/dev/null 2>&1; then
  for n in $ranks; do
    variants=""
    for t in $transports; do
      [ -s "$results/mlxdist-$t-n$n.csv" ] && variants="$variants mlxdist-$t"
    done
    for m in shm tcp; do
      [ -s "$results/mpi-$m-n$n.csv" ] && variants="$variants mpi-$m"
    done
    [ -n "$variants" ] || continue
    awk -F, '$4 ~ /^[0-9]+$/ { print $2 }' "$results"/*-n"$n".csv | sort -u |
    while read -r op; do
      png=$results/busbw-$op-n$n.png
      if gnuplot -e "dir='$results'; n=$n; op='$op'; out='$png'; variants='$variants'" \
          "$here/plot.gp" 2> "$results/gnuplot.log"; then
        echo "plot: $png" >&2
      else
        echo "[bench] gnuplot failed for $op, $n ranks; see $results/gnuplot.log" >&2
      fi
    done
  done
else
  echo "[bench] gnuplot not found; no plots." >&2
fi
echo "done in $(( $(date +%s) - start )) s; results in $results" >&2
exit $status
