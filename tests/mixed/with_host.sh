#!/bin/sh
# usage: with_host.sh HOSTS PROGRAM [ARGS...]
# Run PROGRAM with MLXDIST_HOST_ID=host<d>, d being the MLX_RANK-th digit of HOSTS
# (one digit per rank), so that one machine emulates several hosts.
hosts=$1
shift
case ${MLX_RANK:-} in
  '' | *[!0-9]*) echo "with_host.sh: MLX_RANK='${MLX_RANK:-}' is not a rank" >&2; exit 2 ;;
esac
d=$(printf '%s' "$hosts" | cut -c$((MLX_RANK + 1)))
if [ -z "$d" ]; then
  echo "with_host.sh: no host digit for rank $MLX_RANK in '$hosts'" >&2
  exit 2
fi
MLXDIST_HOST_ID=host$d exec "$@"
