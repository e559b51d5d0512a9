#!/usr/bin/env bash
# The ring backend across emulated hosts: three network namespaces ("hosts"), each with
# its own address on a private test subnet, joined by veth pairs to a Linux bridge in a
# fourth "switch" namespace. Nothing is added to the caller's namespace and no packet
# leaves the namespaces created here.
#
#   netns_ring.sh RANK_PROGRAM [SANITIZE]
#
# Phase A: RANK_PROGRAM collectives on every host (MLX_RANK + MLX_HOSTFILE, the default
#          MLXDIST_TRANSPORT=auto): every rank exits 0 and logs that it chose TCP because
#          the others are in another network namespace.
# Phase B: RANK_PROGRAM cutoff with MLXDIST_TIMEOUT=3; once every rank is running, host 2
#          is cut off by nftables inside its namespace (input and output dropped: nothing
#          closes a connection). Ranks 0 and 1 must fail within MLXDIST_TIMEOUT + 2 s (no
#          heartbeat, no byte from rank 2: liveness apart from progress) with "[ring]
#          all_sum #N: rank 2 has shown no sign of life" (found there or relayed by the
#          other); rank 2 fails too or is killed here.
#
# Needs root, ip (iproute2) and nft (nftables); without them, or where namespaces cannot
# be created, it prints why and exits 77 (CTest's skip code). SANITIZE (MLXDIST_SANITIZE of
# the build) only widens the time bounds. Every wait is bounded; an overall watchdog and
# the EXIT trap kill the ranks and delete the namespaces on success, failure or timeout.
set -u

prog=${1:?usage: netns_ring.sh RANK_PROGRAM [SANITIZE]}
sanitize=${2:-}
nhosts=3
subnet=10.200.0           # the hosts are $subnet.1 .. $subnet.$nhosts
prefix=mlxdnetns          # namespace names: $prefix-<driver pid>-h<r> / -sw
cut_timeout_s=3           # MLXDIST_TIMEOUT of phase B
cut_bound_s=$((cut_timeout_s + 2)) # ranks 0 and 1 must fail within this after the cut
phase_a_s=60
total_s=110               # under the CTest TIMEOUT (120)
if [ -n "$sanitize" ]; then
  cut_bound_s=$((cut_timeout_s + 4)) # a sanitized build's heartbeats and polls are slower
  phase_a_s=80
fi

say() { echo "netns_ring: $*"; }
skip() {
  say "SKIPPED: $*"
  exit 77
}

hosts=()
sw=""
pids=()
dir=""
watchdog=""
created=()

dump_logs() {
  [ -n "$dir" ] || return 0
  local f
  for f in "$dir"/out.* "$dir"/err.*; do
    [ -s "$f" ] || continue
    echo "---- ${f##*/} ----"
    tail -n 40 "$f"
  done
}
fail() {
  echo "netns_ring: FAILED: $*" >&2
  dump_logs
  exit 1
}

cleanup() {
  local p ns
  [ -n "$watchdog" ] && kill "$watchdog" 2>/dev/null
  for p in "${pids[@]}"; do
    [ -n "$p" ] && kill -KILL "$p" 2>/dev/null
  done
  for p in "${pids[@]}"; do
    [ -n "$p" ] && wait "$p" 2>/dev/null
  done
  for ns in "${created[@]}"; do
    # anything still running inside a namespace made here was started by this run
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
  [ -n "$dir" ] && rm -rf "$dir"
  return 0
}
trap cleanup EXIT
trap 'fail "overall time limit of ${total_s} s reached"' TERM
trap 'fail "interrupted"' INT

# ---- can this machine do it? ----
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces, veth pairs and nftables rules (running as uid $(id -u))"
command -v ip >/dev/null 2>&1 || skip "the 'ip' command (iproute2) is not installed"
command -v nft >/dev/null 2>&1 || skip "the 'nft' command (nftables) is not installed"
[ -x "$prog" ] || fail "rank program '$prog' is not an executable file"

now_ms() {
  local t=${EPOCHREALTIME//[!0-9]/}
  echo $((t / 1000))
}

# namespaces of earlier runs that were killed before their trap ran (their driver is gone)
for f in /run/netns/"$prefix"-*; do
  [ -e "$f" ] || continue
  name=${f##*/}
  owner=${name#"$prefix"-}
  owner=${owner%%-*}
  case $owner in '' | *[!0-9]*) continue ;; esac
  if ! kill -0 "$owner" 2>/dev/null; then
    for p in $(ip netns pids "$name" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    ip netns del "$name" 2>/dev/null && say "removed stale namespace $name"
  fi
done
for f in /tmp/"$prefix".*; do
  [ -d "$f" ] || continue
  owner=${f#/tmp/"$prefix".}
  owner=${owner%%.*}
  case $owner in '' | *[!0-9]*) continue ;; esac
  kill -0 "$owner" 2>/dev/null || rm -rf "$f"
done

# the watchdog: its sleep must not outlive the run (it would hold CTest's output pipe open)
(
  trap 'kill "$s" 2>/dev/null; wait "$s"; exit 0' TERM
  sleep "$total_s" &
  s=$!
  wait "$s" || exit 0
  # only while the driver is still this subshell's parent (after a SIGKILL of the driver
  # its pid may belong to someone else)
  read -r _ _ _ parent _ <"/proc/$BASHPID/stat" && [ "$parent" = $$ ] && kill -TERM $$
) >/dev/null 2>&1 &
watchdog=$!

dir=$(mktemp -d "/tmp/$prefix.$$.XXXXXX") || fail "mktemp failed"

# ---- the network ----
sw=$prefix-$$-sw
if ! err=$(ip netns add "$sw" 2>&1); then
  skip "cannot create a network namespace ('ip netns add' failed: $err; a container without CAP_SYS_ADMIN?)"
fi
created+=("$sw")
for ((r = 0; r < nhosts; r++)); do
  hosts[r]=$prefix-$$-h$r
  ip netns add "${hosts[r]}" || fail "ip netns add ${hosts[r]}"
  created+=("${hosts[r]}")
done
# nftables must work inside a namespace (nf_tables may be missing from the kernel)
if ! err=$(ip netns exec "$sw" nft add table inet mlxd_probe 2>&1); then
  skip "nftables does not work inside a network namespace here (nft: $err)"
fi
ip netns exec "$sw" nft delete table inet mlxd_probe || fail "nft delete table (probe)"

ip -n "$sw" link set lo up || fail "switch: lo up"
ip -n "$sw" link add br0 type bridge || fail "switch: cannot add bridge br0"
ip -n "$sw" link set br0 up || fail "switch: br0 up"
for ((r = 0; r < nhosts; r++)); do
  h=${hosts[r]}
  # created inside the switch namespace, peer moved straight into the host's namespace
  ip -n "$sw" link add "p$r" type veth peer name "h$r" netns "$h" || fail "veth p$r/h$r"
  ip -n "$sw" link set "p$r" master br0 || fail "p$r into br0"
  ip -n "$sw" link set "p$r" up || fail "p$r up"
  ip -n "$h" link set lo up || fail "$h: lo up"
  ip -n "$h" addr add "$subnet.$((r + 1))/24" dev "h$r" || fail "$h: address"
  ip -n "$h" link set "h$r" up || fail "$h: h$r up"
done
say "hosts ${hosts[*]} on $subnet.0/24, bridge br0 in $sw"

write_hostfile() { # PATH PORT
  local r s="["
  for ((r = 0; r < nhosts; r++)); do
    s+="$([ $r -gt 0 ] && echo ', ')[\"$subnet.$((r + 1)):$2\"]"
  done
  echo "$s]" >"$1"
}

start_ranks() { # HOSTFILE ENV... -- ARGS...
  local hf=$1 r
  shift
  local envs=()
  while [ "$1" != "--" ]; do
    envs+=("$1")
    shift
  done
  shift
  for ((r = 0; r < nhosts; r++)); do
    ip netns exec "${hosts[r]}" env -u MLXDIST_TRANSPORT -u MLX_WORLD_SIZE \
      MLX_RANK=$r MLX_HOSTFILE="$hf" MLX_RING_VERBOSE=1 MLXDIST_CONNECT_TIMEOUT=20 \
      "${envs[@]}" "$prog" "$@" >"$dir/out.$r" 2>"$dir/err.$r" &
    pids[r]=$!
  done
}

alive() { kill -0 "$1" 2>/dev/null; }

# ---- phase A: collectives across the hosts ----
hf=$dir/hostfile_a.json
write_hostfile "$hf" 5000
start_ranks "$hf" -- collectives "$nhosts"
deadline=$(($(now_ms) + phase_a_s * 1000))
for ((r = 0; r < nhosts; r++)); do
  while alive "${pids[r]}"; do
    [ "$(now_ms)" -lt "$deadline" ] || fail "phase A: rank $r still running after ${phase_a_s} s"
    sleep 0.1
  done
  wait "${pids[r]}"
  rc=$?
  pids[r]=""
  [ "$rc" = 0 ] || fail "phase A: rank $r exited with status $rc"
done
for ((r = 0; r < nhosts; r++)); do
  # one rank per namespace: alone on its host, so TCP to every peer (docs/ring.md's line)
  grep -q "^\[ring\] rank $r: transports: tcp with ranks [0-9,]*\$" "$dir/err.$r" &&
    grep -q "rank $r of $nhosts: transport tcp (no other rank on host" "$dir/err.$r" ||
    fail "phase A: rank $r did not log choosing TCP to every peer (alone in its network namespace)"
  grep -q "netns_rank collectives: rank $r of $nhosts passed" "$dir/out.$r" ||
    fail "phase A: rank $r did not report its checks"
done
say "phase A passed: all_sum, all_gather, send/recv between every pair over TCP across $nhosts hosts"

# ---- phase B: host 2 cut off ----
hf=$dir/hostfile_b.json
write_hostfile "$hf" 5001
start_ranks "$hf" MLXDIST_TIMEOUT=$cut_timeout_s -- cutoff "$dir"
deadline=$(($(now_ms) + 40000))
for ((r = 0; r < nhosts; r++)); do
  while [ ! -e "$dir/ready.$r" ]; do
    alive "${pids[r]}" || fail "phase B: rank $r exited before it was ready"
    [ "$(now_ms)" -lt "$deadline" ] || fail "phase B: rank $r not ready after 40 s"
    sleep 0.1
  done
done
sleep 0.5 # a few loop iterations on every rank
for ((r = 0; r < nhosts; r++)); do
  alive "${pids[r]}" || fail "phase B: rank $r stopped before host 2 was cut off"
done
ip netns exec "${hosts[2]}" nft -f - <<'EOF' || fail "phase B: nft could not install the cut-off rules"
table inet mlxd_cut {
  chain in { type filter hook input priority 0; policy drop; }
  chain out { type filter hook output priority 0; policy drop; }
}
EOF
t_cut=$(now_ms)
say "host 2 (${hosts[2]}) cut off: input and output dropped by nftables"

declare -A took
deadline=$((t_cut + cut_bound_s * 1000))
for r in 0 1; do
  while alive "${pids[r]}"; do
    [ "$(now_ms)" -lt "$deadline" ] ||
      fail "phase B: rank $r still running ${cut_bound_s} s after host 2 was cut off"
    sleep 0.05
  done
  took[$r]=$(($(now_ms) - t_cut))
  wait "${pids[r]}"
  rc=$?
  pids[r]=""
  [ "$rc" = 3 ] || fail "phase B: rank $r exited with status $rc (expected 3: an operation failed)"
  grep -Eq "\[ring\] all_sum #[0-9]+: rank 2 has shown no sign of life" "$dir/err.$r" ||
    fail "phase B: rank $r's error is not '[ring] all_sum #N: rank 2 has shown no sign of life'"
  say "rank $r failed $((took[$r])) ms after the cut: $(grep -m1 'netns_rank cutoff' "$dir/err.$r")"
done
# rank 2 cannot reach anyone either: it fails by itself (timeout) or is killed here
deadline=$(($(now_ms) + 10000))
while alive "${pids[2]}" && [ "$(now_ms)" -lt "$deadline" ]; do sleep 0.1; done
if alive "${pids[2]}"; then
  kill -KILL "${pids[2]}"
  wait "${pids[2]}"
  say "rank 2 still running 10 s after ranks 0 and 1 failed: killed"
else
  wait "${pids[2]}"
  rc=$?
  [ "$rc" != 0 ] || fail "phase B: rank 2 exited 0 although host 2 was cut off"
  say "rank 2 exited with status $rc: $(grep -m1 'netns_rank cutoff' "$dir/err.2")"
fi
pids[2]=""
say "phase B passed"
say "passed"
exit 0
