#!/usr/bin/env bash
# The main job: set up, build, and launch 4 local ranks of the demo (sum,
# gather, split, send/recv), then a short benchmark of all_sum on 2 ranks.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup-debian.sh"
cmake -S "$root" -B "$root/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$root/build" -j"$(nproc)"
echo "== demo: 4 ranks over the ring backend (TCP, one host) =="
"$root/build/tools/mlxdist-launch" -n 4 --timeout 120 -- "$root/build/examples/demo"
echo "== benchmark: all_sum, 2 ranks =="
"$root/build/tools/mlxdist-launch" -n 2 --timeout 300 -- \
  "$root/build/tools/mlxdist-bench" --op all_sum -b 4 -e 16M -f 4 --check
