#!/usr/bin/env bash
# Mixed transports (shared memory within a host, TCP across) against TCP for every pair, on
# emulated hosts: 3 network namespaces x 2 ranks, started through ssh by mlxdist-launch
# (tests/multihost/hosts.sh builds the hosts). mlxdist-bench all_sum, 4 B .. 64 MiB,
# MLXDIST_TRANSPORT=tcp and =auto interleaved (tcp, auto, tcp, auto ...) so a slow phase of
# the machine hits both. Root only.
#
#   scripts/bench-multihost.sh BUILD OUTDIR [REPS]
#
# Environment: MHB_HOSTS (default 3), MHB_NP (ranks per host, default 2), MHB_MAX_BYTES
# (default 64M), MHB_FACTOR (default 8), MHB_MIN_TIME (ms per size, default 200),
# MHB_RATE (e.g. "1gbit": shape every host's uplink with tc tbf at this rate; default none).
# Writes OUTDIR/<tcp|auto>-<rep>.csv and prints, per size, the median time of each over the
# repetitions with its min-max, and tcp/auto (above 1: the mixed transports are faster).
set -euo pipefail
build=${1:?usage: bench-multihost.sh BUILD OUTDIR [REPS]}
out=${2:?usage: bench-multihost.sh BUILD OUTDIR [REPS]}
reps=${3:-3}
hosts=${MHB_HOSTS:-3}
np=${MHB_NP:-2}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
launch=$build/tools/mlxdist-launch
bench=$build/tools/mlxdist-bench
[ -x "$launch" ] && [ -x "$bench" ] || {
  echo "bench-multihost: no mlxdist-launch/mlxdist-bench in $build/tools" >&2
  exit 2
}
mkdir -p "$out"
out=$(cd "$out" && pwd)

set +e # hosts.sh reports its own failures
export MH_PREFIX=mlxdmhb # apart from the tests' namespaces
# shellcheck source=../tests/multihost/hosts.sh
. "$root/tests/multihost/hosts.sh"
mh_setup "$hosts"
set -e
if [ -n "${MHB_RATE:-}" ]; then
  for ((i = 0; i < hosts; i++)); do
    mh_on "$i" tc qdisc add dev eth0 root tbf rate "$MHB_RATE" burst 256kb latency 50ms
  done
  mh_say "every host's uplink shaped to $MHB_RATE (tc tbf)"
fi

for rep in $(seq 1 "$reps"); do
  for t in tcp auto; do
    mh_client "$launch" --ssh "$(mh_ssh_cmd)" --hosts "$(mh_hosts_csv)" -n "$np" --timeout 900 \
      --env "MLXDIST_TRANSPORT=$t" -- "$bench" --op all_sum -b 4 -e "${MHB_MAX_BYTES:-64M}" \
      -f "${MHB_FACTOR:-8}" -t "${MHB_MIN_TIME:-200}" --csv >"$out/$t-$rep.csv"
  done
done

cmd="scripts/bench-multihost.sh BUILD OUTDIR $reps"
[ -n "${MHB_RATE:-}" ] && cmd="MHB_RATE=$MHB_RATE $cmd"
python3 - "$out" "$reps" "$hosts" "$np" "$cmd" <<'PY'
import csv, statistics, sys, glob, os
out, reps, hosts, np, cmd = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
def load(t):
    rows = {}
    for f in sorted(glob.glob(os.path.join(out, f"{t}-*.csv"))):
        with open(f) as fh:
            for line in fh:
                line = line.split("] ", 1)[-1]  # the launcher's "[0] " prefix
                r = next(csv.reader([line]))
                if len(r) < 7 or not r[3].isdigit():
                    continue
                rows.setdefault(int(r[3]), []).append(float(r[6]))
    return rows
T, A = load("tcp"), load("auto")
print(f"all_sum on {hosts} hosts x {np} ranks, time per op in us, median over {reps} runs [min-max]")
print(f"({cmd})")
print(f"{'bytes':>10} {'tcp (every pair)':>26} {'auto (shm within a host)':>26} {'tcp/auto':>8}")
for size in sorted(T):
    if size not in A:
        continue
    mt, ma = statistics.median(T[size]), statistics.median(A[size])
    ft = f"{mt:.1f} [{min(T[size]):.1f}-{max(T[size]):.1f}]"
    fa = f"{ma:.1f} [{min(A[size]):.1f}-{max(A[size]):.1f}]"
    print(f"{size:>10} {ft:>26} {fa:>26} {mt / ma:8.2f}")
PY
