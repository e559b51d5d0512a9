#!/usr/bin/env bash
# Two builds of mlxdist side by side, interleaved (A, B, A, B ...), so a slow
# phase of the machine hits both: mlxdist-bench all_sum (AB_OP) over each transport.
#
#   scripts/bench-ab.sh BUILD_A BUILD_B OUTDIR [REPS]
#
# Environment: AB_OP (mlxdist-bench --op, one op; default all_sum),
# AB_NP (ranks, default 2), AB_TRANSPORTS (default "shm tcp"),
# AB_MIN_BYTES (default 4), AB_MAX_BYTES (default 64M), AB_FACTOR (default 8),
# AB_MIN_TIME (ms per size, default 200). Writes OUTDIR/<A|B>-<transport>-<rep>.csv
# and prints, per transport and size, the median time of each build over the
# repetitions, its min-max, and B/A (above 1: B is slower).
set -euo pipefail
a=${1:?usage: bench-ab.sh BUILD_A BUILD_B OUTDIR [REPS]}
b=${2:?usage: bench-ab.sh BUILD_A BUILD_B OUTDIR [REPS]}
out=${3:?usage: bench-ab.sh BUILD_A BUILD_B OUTDIR [REPS]}
reps=${4:-3}
np=${AB_NP:-2}
mkdir -p "$out"
for rep in $(seq 1 "$reps"); do
  for t in ${AB_TRANSPORTS:-shm tcp}; do
    for side in A B; do
      build=$a
      [ "$side" = B ] && build=$b
      "$build/tools/mlxdist-launch" -n "$np" --timeout 600 --env "MLXDIST_TRANSPORT=$t" -- \
        "$build/tools/mlxdist-bench" --op "${AB_OP:-all_sum}" -b "${AB_MIN_BYTES:-4}" \
        -e "${AB_MAX_BYTES:-64M}" -f "${AB_FACTOR:-8}" -t "${AB_MIN_TIME:-200}" \
        --csv >"$out/$side-$t-$rep.csv"
    done
  done
done
python3 - "$out" "$reps" ${AB_TRANSPORTS:-shm tcp} <<'PY'
import csv, statistics, sys, glob, os
out, reps, transports = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def load(side, t):
    rows = {}
    for f in sorted(glob.glob(os.path.join(out, f"{side}-{t}-*.csv"))):
        with open(f) as fh:
            for line in fh:
                line = line.split("] ", 1)[-1]  # the launcher's "[0] " prefix
                r = next(csv.reader([line]))
                if len(r) < 7 or not r[3].isdigit():
                    continue
                rows.setdefault(int(r[3]), []).append(float(r[6]))
    return rows
for t in transports:
    A, B = load("A", t), load("B", t)
    print(f"\n{t}: time per {os.environ.get('AB_OP', 'all_sum')} in us, median over {reps} runs [min-max]")
    print(f"{'bytes':>10} {'A':>24} {'B':>24} {'B/A':>6}")
    for size in sorted(A):
        if size not in B:
            continue
        ma, mb = statistics.median(A[size]), statistics.median(B[size])
        fa = f"{ma:.2f} [{min(A[size]):.2f}-{max(A[size]):.2f}]"
        fb = f"{mb:.2f} [{min(B[size]):.2f}-{max(B[size]):.2f}]"
        print(f"{size:>10} {fa:>24} {fb:>24} {mb / ma:6.2f}")
PY
