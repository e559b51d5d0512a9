#!/usr/bin/env bash
# Chaos soak: ranks spread over emulated hosts run a loop of mixed collectives and exchanges of
# random sizes and dtypes, every result checked exactly, while this script stops and continues
# ranks, drops links, shapes and unshapes them, and finally kills one rank. Root only.
#
#   scripts/chaos.sh [MINUTES]        (default 30; a decimal number >= 1)
#
# Hosts: CHAOS_HOSTS (default 3) network namespaces on a bridge, each with its own sshd
# (tests/multihost/hosts.sh), CHAOS_PER_HOST (default 2) ranks on each, started by hand in the
# host's namespace with MLX_RANK and a hostfile (so shared memory within a host, TCP across:
# the mixed transport and the two-level collectives). The rank program, tests/chaos/chaos_rank
# (CHAOS_RANK, default build/tests/chaos/chaos_rank), derives its op, dtype, size and data from
# (seed, iteration, rank) and compares every result bit for bit (see its header).
#
# Chaos (one disruption at a time, each shorter than MLXDIST_TIMEOUT with margin, so none of
# them may fail an op):
#   stop   SIGSTOP one rank (1 in 4: both ranks of a host) for 1..CHAOS_MAX_STOP s (default 8),
#          then SIGCONT
#   drop   nftables drops every packet on one host's eth0 for 1..CHAOS_MAX_DROP s (default 6),
#          then a quiet time as long as the drop plus 2 s: TCP's retransmission back-off can
#          keep a link silent for about twice the drop (a 6 s drop: up to ~12.6 s) where the
#          kernel lacks TCP_RTO_MAX_MS (Linux 6.15); with it the transport caps the back-off at
#          MLXDIST_TIMEOUT / 6, and a link is heard again that long after the drop at most
#   shape  tc tbf on one host's eth0 egress at 5, 20, 100 or 1000 mbit, or off again
# with 1..3 s between events. Then every link is unshaped, 8 s of quiet (at least; every rank
# must make progress in it), and one random rank is killed with SIGKILL at about MINUTES after
# the start minus 15 s. MLXDIST_TIMEOUT is CHAOS_TIMEOUT (default 20 s).
#
# Pass (exit 0): no wrong result, no failure before the kill (a "false failure"), no rank
# stalled in the quiet time, and every survivor failed within CHAOS_KILL_BOUND s (default 5)
# of the kill with a message naming the killed rank. Otherwise exit 1 (the logs are kept and
# their directory printed). Exit 77: not root, or ip/nft/tc/sshd missing (as the multihost
# tests). Exit 2: bad arguments or no chaos_rank.
#
# Other settings: CHAOS_SEED (default: from the clock; printed, so a run can be repeated),
# CHAOS_MAX_BYTES (largest op in bytes, default 4194304), CHAOS_LOGDIR (rank logs and the
# event log; default /tmp/mlxdist-chaos.<pid>, removed after a passing run unless
# CHAOS_KEEP_LOGS=1), CHAOS_PREFIX (namespace name prefix, default mlxdchaos). Namespaces,
# processes and temp dirs are removed on exit (trap), and those of an earlier run that was
# killed before its trap ran are removed first.
set -uo pipefail
minutes=${1:-30}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
say() { echo "chaos: $*"; }
usage_error() {
  echo "chaos: $*" >&2
  exit 2
}
[[ $minutes =~ ^[0-9]+(\.[0-9]+)?$ ]] || usage_error "MINUTES must be a number, got '$minutes'"
total_s=$(awk -v m="$minutes" 'BEGIN { printf "%d", m * 60 }')
[ "$total_s" -ge 60 ] || usage_error "MINUTES must be at least 1, got '$minutes'"
rankbin=${CHAOS_RANK:-$root/build/tests/chaos/chaos_rank}
[ -x "$rankbin" ] || usage_error "no rank program at '$rankbin' (build the chaos_rank target or set CHAOS_RANK)"
nh=${CHAOS_HOSTS:-3}
per=${CHAOS_PER_HOST:-2}
tmo=${CHAOS_TIMEOUT:-20}
max_stop=${CHAOS_MAX_STOP:-8}
max_drop=${CHAOS_MAX_DROP:-6}
kill_bound=${CHAOS_KILL_BOUND:-5}
max_bytes=${CHAOS_MAX_BYTES:-4194304}
seed=${CHAOS_SEED:-$(date +%s)}
for v in nh per tmo max_stop max_drop kill_bound max_bytes seed; do
  [[ ${!v} =~ ^[0-9]+$ ]] && [ "${!v}" -ge 1 ] || usage_error "$v must be a whole number >= 1, got '${!v}'"
done
n=$((nh * per))
[ "$n" -ge 2 ] && [ "$n" -le 8 ] || usage_error "CHAOS_HOSTS x CHAOS_PER_HOST must be 2 to 8 ranks, got $n"
# a stop is silence for its length; a drop for up to about twice its length (TCP back-off)
[ $((max_stop + 4)) -le "$tmo" ] && [ $((2 * max_drop + 4)) -le "$tmo" ] ||
  usage_error "disruptions too long for MLXDIST_TIMEOUT=$tmo: need CHAOS_MAX_STOP + 4 and 2 x CHAOS_MAX_DROP + 4 <= CHAOS_TIMEOUT"
RANDOM=$((seed % 32768))

logdir=${CHAOS_LOGDIR:-/tmp/mlxdist-chaos.$$}
mkdir -p "$logdir" || usage_error "cannot create '$logdir'"
rm -f "$logdir"/rank*.log "$logdir"/events.log "$logdir"/ready.* "$logdir"/hostfile.json
events=$logdir/events.log

export MH_PREFIX=${CHAOS_PREFIX:-mlxdchaos} # apart from the tests' and the bench's namespaces
# shellcheck source=../tests/multihost/hosts.sh
. "$root/tests/multihost/hosts.sh"
command -v tc >/dev/null 2>&1 || mh_skip "the 'tc' command is not installed (Debian: iproute2)"
t_start=$(mh_now_ms)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
mh_setup "$nh"
if ! err=$(mh_on 0 tc qdisc add dev eth0 root tbf rate 1gbit burst 64kb latency 100ms 2>&1); then
  mh_skip "tc tbf does not work in a network namespace here: $err"
fi
mh_on 0 tc qdisc del dev eth0 root

now() { mh_now_ms; }
ev() {
  local t
  t=$(now)
  echo "$(((t - t_start) / 1000))s $*" >>"$events"
  echo "chaos: +$(((t - t_start) / 1000))s $*"
}

# ---- the job ----
hf=$logdir/hostfile.json
{
  printf '['
  for ((r = 0; r < n; r++)); do
    printf '%s["%s:%d"]' "$([ $r -gt 0 ] && echo ,)" "$(mh_ip $((r / per)))" $((45100 + r % per))
  done
  printf ']\n'
} >"$hf"
t_kill_at=$((t_start + total_s * 1000 - 15000))
deadline=$((t_kill_at + 120000))
pids=()
for ((r = 0; r < n; r++)); do
  ip netns exec "$(mh_ns $((r / per)))" env MLX_RANK=$r MLX_HOSTFILE="$hf" MLXDIST_TIMEOUT="$tmo" \
    MLX_RING_VERBOSE=1 "$rankbin" "$seed" "$per" "$max_bytes" "$deadline" "$logdir" \
    >"$logdir/rank$r.log" 2>&1 &
  pids[r]=$!
  MH_BG_PIDS+=("$!")
done
t0=$(now)
for ((r = 0; r < n; r++)); do
  while [ ! -e "$logdir/ready.$r" ]; do
    kill -0 "${pids[r]}" 2>/dev/null || mh_fail "rank $r exited during init: $(tail -n 5 "$logdir/rank$r.log")"
    [ $(($(now) - t0)) -lt 60000 ] || mh_fail "rank $r not ready after 60 s: $(tail -n 5 "$logdir/rank$r.log")"
    sleep 0.1
  done
done
for ((r = 0; r < n; r++)); do
  [ "$(cat "$logdir/ready.$r")" = "${pids[r]}" ] || mh_fail "rank $r's pid is $(cat "$logdir/ready.$r"), not ${pids[r]}"
done
say "$n ranks ready in $(($(now) - t0)) ms on $nh hosts ($(mh_hosts_csv)), $per per host; seed $seed, MLXDIST_TIMEOUT=$tmo, logs in $logdir"
for ((r = 0; r < n; r++)); do grep -m1 "transports:" "$logdir/rank$r.log" | sed 's/^/  /'; done

# ---- chaos ----
n_stop=0 n_hoststop=0 stop_total=0 stop_max=0 n_drop=0 drop_total=0 drop_max=0 n_shape=0 n_unshape=0
shaped=()
early=""
# Any rank gone before the kill: a false failure; stop the chaos.
all_alive() {
  local r
  for ((r = 0; r < n; r++)); do
    kill -0 "${pids[r]}" 2>/dev/null || {
      early+="${early:+ }$r"
      return 1
    }
  done
  return 0
}
# sleep S seconds, checking every second that every rank is still there
watch_sleep() {
  local end=$(($(now) + $1 * 1000))
  while [ "$(now)" -lt "$end" ]; do
    all_alive || return 1
    sleep 0.5
  done
  return 0
}
drop_on() {
  mh_on "$1" nft -f - <<'EOF'
table inet mlxd_chaos_drop {
  chain in { type filter hook input priority 0; policy accept; iifname "eth0" drop; }
  chain out { type filter hook output priority 0; policy accept; oifname "eth0" drop; }
}
EOF
}
drop_off() { mh_on "$1" nft delete table inet mlxd_chaos_drop; }
chaos_end=$((t_kill_at - 8000))
while [ "$(now)" -lt "$chaos_end" ] && all_alive; do
  left=$(((chaos_end - $(now)) / 1000))
  kind=$((RANDOM % 10))
  if [ "$kind" -lt 4 ]; then
    d=$((1 + RANDOM % max_stop))
    [ "$d" -le "$left" ] || d=$((left > 0 ? left : 1))
    if [ $((RANDOM % 4)) = 0 ]; then
      h=$((RANDOM % nh))
      victims=()
      for ((r = h * per; r < (h + 1) * per; r++)); do victims+=("$r"); done
      ev "stop host $h (ranks ${victims[*]}) for $d s"
      n_hoststop=$((n_hoststop + 1))
    else
      victims=($((RANDOM % n)))
      ev "stop rank ${victims[0]} for $d s"
    fi
    for r in "${victims[@]}"; do kill -STOP "${pids[r]}" 2>/dev/null; done
    watch_sleep "$d"
    for r in "${victims[@]}"; do kill -CONT "${pids[r]}" 2>/dev/null; done
    n_stop=$((n_stop + 1))
    stop_total=$((stop_total + d))
    [ "$d" -le "$stop_max" ] || stop_max=$d
    watch_sleep $((1 + RANDOM % 3)) || break
  elif [ "$kind" -lt 7 ]; then
    d=$((1 + RANDOM % max_drop))
    h=$((RANDOM % nh))
    ev "drop host $h's link for $d s"
    drop_on "$h" || mh_fail "nft: cannot drop host $h's link"
    watch_sleep "$d"
    drop_off "$h" || mh_fail "nft: cannot restore host $h's link"
    n_drop=$((n_drop + 1))
    drop_total=$((drop_total + d))
    [ "$d" -le "$drop_max" ] || drop_max=$d
    watch_sleep $((d + 2)) || break
  else
    h=$((RANDOM % nh))
    if [ -n "${shaped[h]:-}" ]; then
      ev "unshape host $h's uplink (was ${shaped[h]})"
      mh_on "$h" tc qdisc del dev eth0 root || mh_fail "tc: cannot unshape host $h"
      shaped[h]=""
      n_unshape=$((n_unshape + 1))
    else
      rates=(5mbit 20mbit 100mbit 1000mbit)
      rate=${rates[RANDOM % 4]}
      ev "shape host $h's uplink to $rate (tbf)"
      mh_on "$h" tc qdisc replace dev eth0 root tbf rate "$rate" burst 64kb latency 100ms ||
        mh_fail "tc: cannot shape host $h"
      shaped[h]=$rate
      n_shape=$((n_shape + 1))
    fi
    watch_sleep $((1 + RANDOM % 3)) || break
  fi
done
for ((r = 0; r < n; r++)); do kill -CONT "${pids[r]}" 2>/dev/null; done
for ((h = 0; h < nh; h++)); do
  [ -z "${shaped[h]:-}" ] || mh_on "$h" tc qdisc del dev eth0 root
  shaped[h]=""
done

# ---- quiet, then the kill ----
stalled=""
victim=-1
t_kill=0
if [ -z "$early" ] && all_alive; then
  t_quiet=$(now)
  ev "every link unshaped, quiet until the kill"
  # at least 8 s of quiet, also when the last event ran past its end (a drop's recovery)
  [ "$t_kill_at" -ge $((t_quiet + 8000)) ] || t_kill_at=$((t_quiet + 8000))
  while [ "$(now)" -lt "$t_kill_at" ] && all_alive; do sleep 0.2; done
  for ((r = 0; r < n; r++)); do
    last=$(grep -o 'PROGRESS .* t_ms [0-9]*' "$logdir/rank$r.log" | tail -n1 | awk '{print $NF}')
    [ -n "$last" ] && [ "$last" -gt "$t_quiet" ] || stalled+="${stalled:+ }$r"
  done
fi
if [ -z "$early" ] && all_alive; then
  victim=$((RANDOM % n))
  t_kill=$(now)
  kill -KILL "${pids[victim]}"
  wait "${pids[victim]}" 2>/dev/null
  ev "kill rank $victim (host $((victim / per)), pid ${pids[victim]}) with SIGKILL"
  # every survivor must exit (bounded: well past the bound, to measure a late one too)
  cap=$((t_kill + kill_bound * 1000 + 30000))
  for ((r = 0; r < n; r++)); do
    [ "$r" = "$victim" ] && continue
    while kill -0 "${pids[r]}" 2>/dev/null && [ "$(now)" -lt "$cap" ]; do sleep 0.05; done
  done
fi
for ((r = 0; r < n; r++)); do kill -CONT "${pids[r]}" 2>/dev/null; done
for ((r = 0; r < n; r++)); do
  kill -0 "${pids[r]}" 2>/dev/null && kill -KILL "${pids[r]}" 2>/dev/null
  wait "${pids[r]}" 2>/dev/null
done

# ---- the figures ----
wrong=0 nfalse=0 late=0 unnamed=0
for ((r = 0; r < n; r++)); do
  w=$(grep -c '^CHAOS WRONG' "$logdir/rank$r.log")
  s=$(grep -o '^CHAOS SUMMARY .* wrong [0-9]*' "$logdir/rank$r.log" | awk '{print $NF}')
  [ -n "$s" ] && [ "$s" -gt "$w" ] && w=$s
  wrong=$((wrong + w))
done
summary_line=""
for ((r = 0; r < n; r++)); do
  [ "$r" = "$victim" ] && continue
  summary_line=$(grep -m1 '^CHAOS SUMMARY' "$logdir/rank$r.log") && break
done
ops=$(echo "$summary_line" | awk '{print $6}')
echo
echo "==== chaos soak summary ===="
printf '%-26s %s\n' "hosts x ranks" "$nh x $per (shm within a host, tcp across), $minutes min, seed $seed"
printf '%-26s %s\n' "MLXDIST_TIMEOUT" "$tmo s"
printf '%-26s %s\n' "load average" "before $load_before, after $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs)"
printf '%-26s %s\n' "stops" "$n_stop ($n_hoststop of a whole host), ${stop_total} s in all, longest $stop_max s"
printf '%-26s %s\n' "link drops" "$n_drop, ${drop_total} s in all, longest $drop_max s"
printf '%-26s %s\n' "shapings" "$n_shape on, $n_unshape off (tbf 5-1000 mbit)"
printf '%-26s %s\n' "ops done" "${ops:-?} per rank ($(echo "$summary_line" | cut -d" " -f11-))"
printf '%-26s %s\n' "bytes in (per rank)" "$(echo "$summary_line" | awk '{print $10}')"
printf '%-26s %s\n' "wrong results" "$wrong"
if [ -n "$early" ]; then
  for r in $early; do
    msg=$(grep -m1 '^CHAOS FAIL' "$logdir/rank$r.log")
    echo "  false failure: rank $r exited before the kill: ${msg:-$(tail -n 3 "$logdir/rank$r.log")}"
  done
fi
for ((r = 0; r < n; r++)); do
  line=$(grep -m1 '^CHAOS FAIL' "$logdir/rank$r.log") || continue
  t=$(echo "$line" | sed -n 's/.* t_ms \([0-9]*\):.*/\1/p')
  if [ "$t_kill" = 0 ] || [ "${t:-0}" -lt "$t_kill" ]; then
    nfalse=$((nfalse + 1))
    case " $early " in *" $r "*) ;; *) echo "  false failure: rank $r: $line" ;; esac
  fi
done
[ -z "$early" ] || [ "$nfalse" -gt 0 ] || nfalse=$(echo "$early" | wc -w)
printf '%-26s %s\n' "false failures" "$nfalse"
printf '%-26s %s\n' "stalled in the quiet time" "${stalled:-none}"
if [ "$victim" -ge 0 ]; then
  printf '%-26s %s\n' "killed" "rank $victim (host $((victim / per)))"
  worst=0
  for ((r = 0; r < n; r++)); do
    [ "$r" = "$victim" ] && continue
    line=$(grep -m1 '^CHAOS FAIL' "$logdir/rank$r.log")
    t=$(echo "$line" | sed -n 's/.* t_ms \([0-9]*\):.*/\1/p')
    if [ -z "$t" ]; then
      late=$((late + 1))
      echo "  rank $r: no error reported (last lines: $(tail -n 2 "$logdir/rank$r.log" | tr '\n' ' '))"
      continue
    fi
    dt=$((t - t_kill))
    [ "$dt" -le "$worst" ] || worst=$dt
    [ "$dt" -le $((kill_bound * 1000)) ] || late=$((late + 1))
    msg=${line#*: }
    if ! [[ $msg =~ rank\ $victim([^0-9]|$) ]]; then unnamed=$((unnamed + 1)); fi
    printf '  rank %d: error %5d ms after the kill: %s\n' "$r" "$dt" "$(echo "$msg" | cut -c1-200)"
  done
  printf '%-26s %s\n' "kill to error" "at most $worst ms (bound $kill_bound s); late or missing: $late; not naming rank $victim: $unnamed"
fi
rc=0
{ [ "$wrong" = 0 ] && [ "$nfalse" = 0 ] && [ -z "$early" ] && [ -z "$stalled" ] && [ "$victim" -ge 0 ] &&
  [ "$late" = 0 ] && [ "$unnamed" = 0 ]; } || rc=1
if [ "$rc" = 0 ]; then
  echo "RESULT chaos: PASSED"
  [ "${CHAOS_KEEP_LOGS:-0}" = 1 ] || [ -n "${CHAOS_LOGDIR:-}" ] || rm -rf "$logdir"
else
  for ((r = 0; r < n; r++)); do
    echo "---- rank $r (last 6 lines of $logdir/rank$r.log) ----"
    tail -n 6 "$logdir/rank$r.log"
  done
  echo "---- the last 10 events ----"
  tail -n 10 "$events"
  echo "RESULT chaos: FAILED (logs kept in $logdir)"
fi
exit "$rc"
