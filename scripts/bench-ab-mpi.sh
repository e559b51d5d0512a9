#!/usr/bin/env bash
# Interleaved A/B of the mpi backend: mlxdist-bench under mpirun, 2 ranks,
# --backend mpi, all_sum and all_gather at 4 MiB and 64 MiB, base then new, REPS times.
#   scripts/bench-ab-mpi.sh BUILD_A BUILD_B OUTDIR [REPS]
# (Open MPI: mpirun; the plugin is taken from each build via MLXDIST_PLUGIN_PATH.)
set -euo pipefail
a=$1 b=$2 out=$3 reps=${4:-5}
mkdir -p "$out"
for rep in $(seq 1 "$reps"); do
  for side in A B; do
    build=$a; [ "$side" = B ] && build=$b
    for op in all_sum all_gather; do
      mpirun -np 2 --oversubscribe --allow-run-as-root --bind-to none \
        -x OMPI_MCA_btl_vader_single_copy_mechanism=none -x MLXDIST_PLUGIN_PATH="$build" \
        "$build/tools/mlxdist-bench" --backend mpi --op "$op" -b 4M -e 64M -f 16 -t 300 --csv \
        >"$out/$side-$op-$rep.csv" 2>"$out/$side-$op-$rep.err"
    done
  done
  echo "rep $rep done, load: $(cut -d' ' -f1-3 /proc/loadavg)"
done
python3 - "$out" "$reps" <<'PY'
import csv, statistics, sys, glob, os
out, reps = sys.argv[1], int(sys.argv[2])
def load(side, op):
    rows = {}
    for f in sorted(glob.glob(os.path.join(out, f"{side}-{op}-*.csv"))):
        for line in open(f):
            r = next(csv.reader([line]))
            if len(r) < 7 or not r[3].strip().isdigit():
                continue
            rows.setdefault(int(r[3]), []).append(float(r[6]))
    return rows
for op in ("all_sum", "all_gather"):
    A, B = load("A", op), load("B", op)
    print(f"\n{op}: us per op, median over {reps} runs [min-max]; B/A < 1: B faster")
    for size in sorted(A):
        if size not in B: continue
        ma, mb = statistics.median(A[size]), statistics.median(B[size])
        print(f"{size:>10} A {ma:10.1f} [{min(A[size]):.1f}-{max(A[size]):.1f}]  "
              f"B {mb:10.1f} [{min(B[size]):.1f}-{max(B[size]):.1f}]  B/A {mb/ma:5.2f}")
PY
