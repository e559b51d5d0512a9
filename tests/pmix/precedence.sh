#!/bin/sh
# MLX's configuration keeps precedence under a PMIx server: mpirun -n 2 with MLX_HOSTFILE and
# MLX_RANK set (ranks reversed against mpirun's) starts the ring from the hostfile, not from PMIx.
#   precedence.sh MPIRUN "MPIRUN_FLAGS" PMIX_CHECK
# (re-invoked by mpirun as: precedence.sh --rank PMIX_CHECK)
set -eu
if [ "$1" = --rank ]; then
  MLX_RANK=$((1 - ${OMPI_COMM_WORLD_RANK:-${PMIX_RANK:?}}))
  export MLX_RANK
  exec "$2" ok ring 2
fi
mpirun=$1 flags=$(printf %s "$2" | tr ";" " ") check=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
base=$((20000 + $$ % 12000)) # below the ephemeral range (32768-)
printf '[["127.0.0.1:%d"], ["127.0.0.1:%d"]]\n' "$base" $((base + 1)) > "$dir/hosts.json"
# shellcheck disable=SC2086
MLX_HOSTFILE=$dir/hosts.json MLX_RING_VERBOSE=1 \
  "$mpirun" -n 2 $flags -x MLX_HOSTFILE -x MLX_RING_VERBOSE "$0" --rank "$check" > "$dir/out" 2>&1 || {
  cat "$dir/out"; echo "precedence.sh: mpirun failed"; exit 1; }
cat "$dir/out"
grep -q "from hostfile" "$dir/out" || { echo "precedence.sh: the ring did not use the hostfile"; exit 1; }
if grep -q "through PMIx" "$dir/out"; then echo "precedence.sh: the ring used PMIx"; exit 1; fi
echo "precedence.sh: ok"
