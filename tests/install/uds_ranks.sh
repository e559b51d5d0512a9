#!/usr/bin/env bash
# Start N ranks of plugin_ranks MODE as real processes on the example plugin (examples/plugin,
# libmlxdist-uds.so in PLUGIN_DIR), each with MLX_RANK, MLX_WORLD_SIZE and a fresh MLX_UDS_DIR;
# every rank must exit 0 and print "plugin_ranks: MODE ok (rank R)".
#   usage: uds_ranks.sh PLUGIN_RANKS PLUGIN_DIR N MODE
set -uo pipefail
bin=$1
dir=$2
n=$3
mode=$4
sock=$(mktemp -d)
pids=()
# shellcheck disable=SC2317  # (called by the trap)
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$sock"
}
trap cleanup EXIT
unset MLX_HOSTFILE MLXDIST_RENDEZVOUS
for ((r = 0; r < n; r++)); do
  MLX_RANK=$r MLX_WORLD_SIZE=$n MLX_UDS_DIR=$sock MLXDIST_PLUGIN_PATH=$dir \
    MLXDIST_TIMEOUT=${MLXDIST_TIMEOUT:-30} timeout 120 "$bin" "$mode" >"$sock/out.$r" 2>&1 &
  pids+=($!)
done
rc=0
for ((r = 0; r < n; r++)); do wait "${pids[$r]}" || rc=1; done
pids=()
for ((r = 0; r < n; r++)); do
  out=$(cat "$sock/out.$r")
  echo "  [$n ranks, $mode, rank $r] $out"
  grep -q "plugin_ranks: $mode ok (rank $r)" <<<"$out" || rc=1
done
[ $rc = 0 ] || echo "uds_ranks: FAIL: $n ranks of $bin $mode with the plugin in $dir (see above)"
exit $rc
