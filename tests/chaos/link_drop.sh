#!/usr/bin/env bash
# A link drop shorter than MLXDIST_TIMEOUT fails no rank (found by the chaos soak,
# scripts/chaos.sh: a rank heard nothing from a live peer, no data and no heartbeat, for
# 20.6 s after drops of 5 and 6 s). Two ranks of link_drop_rank over TCP on the loopback of a
# private network namespace run 64 KiB all_sums back to back (bytes always in flight), with
# MLXDIST_TIMEOUT=10; once both run, nftables drops every packet arriving on lo for 7 s (the
# input hook only: a loss on the way, as a cut link or a peer host's drop is; a packet the
# sender's own output hook drops is a local error, which the kernel retries without the
# back-off). The kernel retransmits what was lost with an exponential back-off (200 ms,
# doubled at each loss: retransmissions 0.2, 0.6, 1.4, 3.0, 6.2, 12.6 s after the loss) and
# each rank's heartbeats wait in the same byte stream behind those bytes: without a cap on
# the back-off, nothing moves until 12.6 s after the loss and both ranks take each other for
# dead after 10 s (4 of 4 runs before the fix). The transport caps it at MLXDIST_TIMEOUT / 6
# (TCP_RTO_MAX_MS, tcp_setup.c): the link moves again within 1.7 s of its return. Needs root,
# ip, nft and a kernel with TCP_RTO_MAX_MS (Linux 6.15); skipped (77) otherwise.
# LINK_TIMEOUT, LINK_DROP_S and LINK_RUN_S change the 10 s, the 7 s and the 30 s of sums.
#   link_drop.sh RANK_PROGRAM
set -uo pipefail
prog=${1:?usage: link_drop.sh RANK_PROGRAM}
say() { echo "link_drop: $*"; }
[ "$(id -u)" = 0 ] || { say "SKIPPED: needs root for a network namespace (uid $(id -u))"; exit 77; }
for c in ip nft; do
  command -v "$c" >/dev/null 2>&1 || { say "SKIPPED: the '$c' command is not installed"; exit 77; }
done
[ -e /proc/sys/net/ipv4/tcp_rto_max_ms ] ||
  { say "SKIPPED: this kernel ($(uname -r)) has no TCP_RTO_MAX_MS (Linux 6.15)"; exit 77; }
# shellcheck source=tests/chaos/private_ns.sh
. "$(dirname "$0")/private_ns.sh"
private_ns mlxdlinkdrop
ip -n "$ns" link set lo up || exit 1
if ! err=$(ip netns exec "$ns" nft add table inet probe 2>&1); then
  say "SKIPPED: nftables does not work in a network namespace here: $err"
  exit 77
fi
ip netns exec "$ns" nft delete table inet probe
tmo=${LINK_TIMEOUT:-10} drop_s=${LINK_DROP_S:-7} run_s=${LINK_RUN_S:-30}
echo '[["127.0.0.1:45320"], ["127.0.0.1:45321"]]' >"$dir/hf.json"
start_ranks "$prog" "$run_s" "$tmo"
# both ranks past their first sum (bounded)
for ((i = 0; i < 300; i++)); do
  grep -qs "LINK READY" "$dir/rank0.log" && grep -qs "LINK READY" "$dir/rank1.log" && break
  sleep 0.1
done
grep -qs "LINK READY" "$dir/rank0.log" && grep -qs "LINK READY" "$dir/rank1.log" ||
  { say "FAILED: the ranks did not start: $(cat "$dir"/rank*.log)"; exit 1; }
say "dropping every packet on lo for $drop_s s (MLXDIST_TIMEOUT=$tmo)"
ip netns exec "$ns" nft -f - <<'EOF' || exit 1
table inet mlxd_link_drop {
  chain in { type filter hook input priority 0; policy drop; }
}
EOF
sleep "$drop_s"
ip netns exec "$ns" nft delete table inet mlxd_link_drop || exit 1
say "link restored"
rc=0
wait_ranks || rc=1
if [ "$rc" = 0 ]; then
  say "PASSED: a $drop_s s drop failed no rank with MLXDIST_TIMEOUT=$tmo"
else
  say "FAILED"
fi
exit "$rc"
