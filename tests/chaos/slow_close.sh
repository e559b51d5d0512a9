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
# shellcheck source=tests/chaos/private_ns.sh
. "$(dirname "$0")/private_ns.sh"
private_ns mlxdslow
ip -n "$ns" link set lo up mtu 1500 || exit 1 # tbf drops packets larger than its burst
if ! err=$(ip netns exec "$ns" tc qdisc add dev lo root tbf rate 5mbit burst 32kb latency 200ms 2>&1); then
  say "SKIPPED: tc tbf does not work in a network namespace here: $err"
  exit 77
fi
echo '[["127.0.0.1:45300"], ["127.0.0.1:45301"]]' >"$dir/hf.json"
n=$((1 << 20)) # 4 MiB of int32: about 7 s at 5 Mbit/s
start_ranks "$prog" "$n" 6
rc=0
wait_ranks || rc=1
[ "$rc" = 0 ] && say "PASSED: every byte arrived although rank 0 freed its group right after the send" ||
  say "FAILED"
exit "$rc"
