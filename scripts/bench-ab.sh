#!/usr/bin/env bash
# Two builds of mlxdist side by side, interleaved (A, B, A, B ...), so a slow
# phase of the machine hits both: mlxdist-bench all_sum (AB_OP) over each transport.
#
#   scripts/bench-ab.sh BUILD_A BUILD_B OUTDIR [REPS]
#
# Environment: AB_OP (mlxdist-bench --op: one op or a comma-separated list; default all_sum),
# AB_NP (ranks, default 2), AB_TRANSPORTS (default "shm tcp"),
# AB_MIN_BYTES (default 4), AB_MAX_BYTES (default 64M), AB_FACTOR (default 8),
# AB_MIN_TIME (ms per size, default 200), AB_ENV_A / AB_ENV_B (VAR=VALUE ... for the
# ranks of that side only: the same build twice with two settings). Writes OUTDIR/<A|B>-<transport>-<rep>.csv
# and prints, per transport, op and size, the median time of each build over the
# repetitions, its min-max, B/A (above 1: B is slower) and in how many rounds B was
# faster than the A run just before it.
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
      build=$a side_env=${AB_ENV_A:-}
      [ "$side" = B ] && build=$b side_env=${AB_ENV_B:-}
      envs=()
      for kv in $side_env; do envs+=(--env "$kv"); done
      "$build/tools/mlxdist-launch" -n "$np" --timeout 600 --env "MLXDIST_TRANSPORT=$t" \
        ${envs[@]+"${envs[@]}"} -- \
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
    rows = {}  # (op, bytes) -> {rep: time}
    for f in sorted(glob.glob(os.path.join(out, f"{side}-{t}-*.csv"))):
        rep = f.rsplit("-", 1)[1][:-4]
        with open(f) as fh:
            for line in fh:
                line = line.split("] ", 1)[-1]  # the launcher's "[0] " prefix
                r = next(csv.reader([line]))
                if len(r) < 7 or not r[3].isdigit():
                    continue
                rows.setdefault((r[1], int(r[3])), {})[rep] = float(r[6])
    return rows
for t in transports:
    A, B = load("A", t), load("B", t)
    print(f"\n{t}: time per op in us, median over {reps} runs [min-max]")
    print(f"{'op':>12} {'bytes':>10} {'A':>26} {'B':>26} {'B/A':>6} B faster")
    for key in sorted(A):
        if key not in B:
            continue
        a_, b_ = list(A[key].values()), list(B[key].values())
        ma, mb = statistics.median(a_), statistics.median(b_)
        fa = f"{ma:.2f} [{min(a_):.2f}-{max(a_):.2f}]"
        fb = f"{mb:.2f} [{min(b_):.2f}-{max(b_):.2f}]"
        both = [r for r in A[key] if r in B[key]]
        wins = sum(1 for r in both if B[key][r] < A[key][r])
        print(f"{key[0]:>12} {key[1]:>10} {fa:>26} {fb:>26} {mb / ma:6.2f} {wins:>4}/{len(both)}")
PY
