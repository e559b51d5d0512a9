#!/usr/bin/env bash
# A TCP group destroyed while its last bytes are still queued on a slow link delivers them
# (found by the chaos soak, scripts/chaos.sh). Two ranks of slow_close_rank over TCP on the
# loopback of a private network namespace whose lo is shaped to 5 Mbit/s with tc tbf (both
# directions); rank 0 sends 4 MiB and frees its group at once, rank 1 must receive every byte
# although its heartbeats (MLXDIST_TIMEOUT=6: one a second) keep reaching rank 0's sockets.
# Needs root, ip and tc (iproute2); skipped (77) otherwise.
#   slow_close.sh RANK_PROGRAM
set -uo pipefail
prog=${1:?usage: slow_close.sh RANK_PROGRAM}
say() { echo "slow_close: $*"; }
[ "$(id -u)" = 0 ] || { say "SKIPPED: needs root for a network namespace (uid $(id -u))"; exit 77; }
for c in ip tc; do
  command -v "$c" >/dev/null 2>&1 || { say "SKIPPED: the '$c' command is not installed (iproute2)"; exit 77; }
done
prefix=mlxdslow
# namespaces of earlier runs that were killed before their trap ran
for f in /run/netns/"$prefix"-*; do
  [ -e "$f" ] || continue
  owner=${f##*/"$prefix"-}
  case $owner in '' | *[!0-9]*) continue ;; esac
  kill -0 "$owner" 2>/dev/null && continue
  for p in $(ip netns pids "${f##*/}" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  ip netns del "${f##*/}" 2>/dev/null
done
ns=$prefix-$$
dir=$(mktemp -d) || exit 1
cleanup() {
  local p
  for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  ip netns del "$ns" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
if ! err=$(ip netns add "$ns" 2>&1); then
  say "SKIPPED: cannot create a network namespace: $err"
  exit 77
fi
ip -n "$ns" link set lo up mtu 1500 || exit 1 # tbf drops packets larger than its burst
if ! err=$(ip netns exec "$ns" tc qdisc add dev lo root tbf rate 5mbit burst 32kb latency 200ms 2>&1); then
  say "SKIPPED: tc tbf does not work in a network namespace here: $err"
  exit 77
fi
echo '[["127.0.0.1:45300"], ["127.0.0.1:45301"]]' >"$dir/hf.json"
n=$((1 << 20)) # 4 MiB of int32: about 7 s at 5 Mbit/s
pids=()
for r in 0 1; do
  ip netns exec "$ns" env MLX_RANK=$r MLX_HOSTFILE="$dir/hf.json" MLXDIST_TRANSPORT=tcp \
    MLXDIST_TIMEOUT=6 timeout 120 "$prog" "$n" >"$dir/rank$r.log" 2>&1 &
  pids+=($!)
done
rc=0
for r in 0 1; do
  wait "${pids[r]}"
  st=$?
  say "rank $r exit status $st: $(tail -n 3 "$dir/rank$r.log" | tr '\n' ' ')"
  [ "$st" = 0 ] || rc=1
done
[ "$rc" = 0 ] && say "PASSED: every byte arrived although rank 0 freed its group right after the send" ||
  say "FAILED"
exit "$rc"
