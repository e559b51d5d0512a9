#!/usr/bin/env bash
# mlxdist-launch across emulated hosts (issue 12, item 3): every case starts its own hosts
# (tests/multihost/hosts.sh: network namespaces on a bridge, each with its own sshd) and
# runs the launcher in the client namespace, which starts the ranks through ssh.
#
#   multihost.sh CASE LAUNCH TEST_COLLECTIVES NETNS_RANK MPI_RANKS
#
#   conformance  the conformance program on 3 hosts x 2 ranks (--hosts ip1,ip2,ip3 -n 2
#                --verbose); every rank's transport line: shm with the rank on its host, tcp
#                with the 4 others
#   hostfile     netns_rank collectives from MLX launcher hostfiles: the list form
#                [{"ssh","ips"}] and the object form {"backend","envs","hosts"} (whose envs
#                force MLXDIST_TRANSPORT=tcp: every pair tcp)
#   kill         (with --port-range: the ranks' connections are from their host's address
#                with a listening end in the range, and the rendezvous port too) a rank on
#                host 2 killed by SIGKILL in the middle of collectives: every rank on every
#                host gone within a few seconds, launcher exit non-zero naming the rank and
#                the host
#   sshd         sshd stopped on one host, then that host unreachable (nftables), then the
#                program missing on one host, then a firewall on one host that lets ssh in but
#                not its ranks out to the launcher's rendezvous port: each time a clear error
#                naming the host in bounded time, nothing left on the others
#   cut          a host cut off by nftables during a collective (MLXDIST_TIMEOUT=3): error,
#                no process of the job left on any host
#   mpi          --backend mpi across the same hosts (mpirun through the same ssh)
#
# Every failure case prints "RESULT <case>: <time> ms: <the launcher's message>" (the
# numbers of docs/multihost.md). Root only (exit 77 otherwise, from hosts.sh).
set -u

case_name=${1:?usage: multihost.sh CASE LAUNCH TEST_COLLECTIVES NETNS_RANK MPI_RANKS}
launch=${2:?launcher}
collectives=${3:?test_collectives}
netns_rank=${4:?netns_rank}
mpi_ranks=${5:-}

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=hosts.sh
. "$here/hosts.sh"

for f in "$launch" "$collectives" "$netns_rank"; do
  [ -x "$f" ] || mh_fail "'$f' is not an executable file"
done

nh=3 # hosts
k=2  # ranks per host
n=$((nh * k))

# ---- helpers ----

# Start the launcher in the client namespace, in the background: ARGS... (output to
# $MH_DIR/launch.log). Sets lpid and t_start.
start_launch() {
  t_start=$(mh_now_ms)
  mh_client "$launch" "$@" >"$MH_DIR/launch.log" 2>&1 &
  lpid=$!
  MH_BG_PIDS+=("$lpid")
}
# Wait at most BOUND_S seconds for the launcher; sets lrc (its exit status) and took_ms.
wait_launch() {
  local bound_ms=$(($1 * 1000))
  while kill -0 "$lpid" 2>/dev/null; do
    if [ $(($(mh_now_ms) - t_start)) -ge "$bound_ms" ]; then
      mh_fail "the launcher still runs after $1 s"
    fi
    sleep 0.05
  done
  took_ms=$(($(mh_now_ms) - t_start))
  wait "$lpid"
  lrc=$?
}
launch_lines() { grep '\[launch\]' "$MH_DIR/launch.log"; }
# The launcher's first failure message (its first [launch] line saying something failed;
# --verbose's plan lines name ranks and hosts too).
first_failure() {
  grep -m1 -iE '\[launch\].*(cannot|exited|killed|signal|not found|fail|refused|unreachable|timed out|did not|lost|no such|denied)' \
    "$MH_DIR/launch.log"
}
# Nothing of the job on any host within BOUND_S s (the sshd listeners aside).
# What is still on the hosts (for the log: a slow teardown shows what lingers).
show_left() {
  local i
  for ((i = 0; i < MH_N; i++)); do
    mh_ps "$i" | sed "s/^/  $1: host $(mh_ip "$i") still has: /"
  done
}
# Processes of the job on host I other than sshd (its listener and its sessions).
job_count() {
  local p c=0
  for p in $(mh_pids "$1"); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = sshd ] || c=$((c + 1))
  done
  echo "$c"
}
# Sets gone_ms.
check_all_gone() {
  gone_ms=$(mh_wait_all_gone $(($1 * 1000))) ||
    mh_fail "$2: processes of the job still on the hosts $1 s later (listed above)"
}
# pid of the rank program with MLX_RANK=R on host I
rank_pid() {
  local i=$1 r=$2 p
  for p in $(mh_pids "$i"); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$(basename "$netns_rank" | cut -c1-15)" ] || continue
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "MLX_RANK=$r" && {
      echo "$p"
      return 0
    }
  done
  return 1
}
# every rank's C2 line: shm with the other rank of its host (unless FORCE_TCP), tcp with the rest
check_transport_lines() {
  local force_tcp=${1:-} r h mate others s line want
  for ((r = 0; r < n; r++)); do
    h=$((r / k))
    others=""
    mate=""
    for ((s = 0; s < n; s++)); do
      [ "$s" = "$r" ] && continue
      if [ $((s / k)) = "$h" ] && [ -z "$force_tcp" ]; then
        mate+="${mate:+,}$s"
      else
        others+="${others:+,}$s"
      fi
    done
    want="[ring] rank $r: transports: "
    [ -n "$mate" ] && want+="shm with ranks $mate"
    [ -n "$mate" ] && [ -n "$others" ] && want+="; "
    [ -n "$others" ] && want+="tcp with ranks $others"
    line=$(grep -F "[ring] rank $r: transports:" "$MH_DIR/launch.log" | head -n1)
    [ -n "$line" ] || mh_fail "rank $r printed no transport line (contract C2: '$want')"
    case $line in
      *"$want") ;;
      *) mh_fail "rank $r on host $(mh_ip "$h"): '$line', expected '... $want'" ;;
    esac
    # --verbose prefixes the host: the line came from the rank's own host
    case $line in
      *"$(mh_ip "$h")"*"[ring]"*) ;;
      *) mh_fail "rank $r's transport line does not name its host $(mh_ip "$h"): '$line'" ;;
    esac
  done
  grep -F "transports:" "$MH_DIR/launch.log" | sort -t' ' -k4,4n | sed 's/^/  /'
  mh_say "transport lines of all $n ranks as expected ($([ -n "$force_tcp" ] && echo "all tcp" || echo "shm within a host, tcp across"))"
}

# ---- the cases ----

case_conformance() {
  start_launch --ssh "$(mh_ssh_cmd)" --hosts "$(mh_hosts_csv)" -n $k --verbose --timeout 500 \
    --env MLX_RING_VERBOSE=1 -- "$collectives" ring
  wait_launch 520
  [ "$lrc" = 0 ] || mh_fail "conformance on $nh hosts x $k ranks: launcher exit status $lrc"
  check_transport_lines
  mh_say "conformance on $nh hosts x $k ranks passed in $took_ms ms"
  check_all_gone 5 "after a successful run"
}

case_hostfile() {
  local hf=$MH_DIR/hosts.json i
  {
    echo "["
    for ((i = 0; i < nh; i++)); do
      echo "  {\"ssh\": \"$(mh_ip "$i")\", \"ips\": [\"$(mh_ip "$i")\"]}$([ $i -lt $((nh - 1)) ] && echo ,)"
    done
    echo "]"
  } >"$hf"
  start_launch --ssh "$(mh_ssh_cmd)" --hostfile "$hf" -n $k --verbose --timeout 100 \
    --env MLX_RING_VERBOSE=1 -- "$netns_rank" collectives $n
  wait_launch 120
  [ "$lrc" = 0 ] || mh_fail "hostfile (list form): launcher exit status $lrc"
  check_transport_lines
  [ "$(grep -c "netns_rank collectives: rank [0-9] of $n passed" "$MH_DIR/launch.log")" = $n ] ||
    mh_fail "hostfile (list form): not every rank reported its checks"
  mh_say "MLX hostfile, list form: $n ranks passed in $took_ms ms"

  # the object form; its envs force TCP for every pair
  {
    echo "{\"backend\": \"ring\", \"envs\": [\"MLXDIST_TRANSPORT=tcp\"], \"hosts\": ["
    for ((i = 0; i < nh; i++)); do
      echo "  {\"ssh\": \"$(mh_ip "$i")\", \"ips\": [\"$(mh_ip "$i")\"]}$([ $i -lt $((nh - 1)) ] && echo ,)"
    done
    echo "]}"
  } >"$hf"
  start_launch --ssh "$(mh_ssh_cmd)" --hostfile "$hf" -n $k --verbose --timeout 100 \
    --env MLX_RING_VERBOSE=1 -- "$netns_rank" collectives $n
  wait_launch 120
  [ "$lrc" = 0 ] || mh_fail "hostfile (object form): launcher exit status $lrc"
  check_transport_lines force_tcp
  mh_say "MLX hostfile, object form with envs MLXDIST_TRANSPORT=tcp: $n ranks passed in $took_ms ms"
  check_all_gone 5 "after a successful run"
}

# Start netns_rank cutoff on all hosts and wait (bounded) until every rank is in its loop.
start_cutoff_job() {
  local r t0
  start_launch --ssh "$(mh_ssh_cmd)" --hosts "$(mh_hosts_csv)" -n $k --verbose --timeout 100 \
    --connect-timeout 10 "$@" -- "$netns_rank" cutoff "$MH_DIR"
  t0=$(mh_now_ms)
  for ((r = 0; r < n; r++)); do
    while [ ! -e "$MH_DIR/ready.$r" ]; do
      kill -0 "$lpid" 2>/dev/null || mh_fail "the launcher exited before rank $r was ready"
      [ $(($(mh_now_ms) - t0)) -lt 60000 ] || mh_fail "rank $r not ready after 60 s"
      sleep 0.1
    done
  done
  sleep 0.5 # a few iterations on every rank
}

# The ranks' TCP connections on every host: from the host's address, and each one has the
# listening end of a rank on a port of --port-range A-B (the ranks close their listeners once
# connected: one end of every rank-to-rank connection is the port a rank listened on); the
# launcher's rendezvous port is in the range too.
check_ports() {
  local a=$1 b=$2 i line la ra lp rp cnt rdv port
  for ((i = 0; i < MH_N; i++)); do
    cnt=0
    while read -r line; do
      [ -n "$line" ] || continue
      la=$(echo "$line" | awk '{print $3}')
      ra=$(echo "$line" | awk '{print $4}')
      lp=${la##*:}
      rp=${ra##*:}
      [ "${la%:*}" = "$(mh_ip "$i")" ] || mh_fail "host $(mh_ip "$i"): a rank's connection from $la, not from its host's address: $line"
      [ "${ra%:*}" = "$MH_SUBNET.1" ] && continue # to the launcher's rendezvous
      { [ "$lp" -ge "$a" ] && [ "$lp" -le "$b" ]; } || { [ "$rp" -ge "$a" ] && [ "$rp" -le "$b" ]; } ||
        mh_fail "host $(mh_ip "$i"): connection $la -> $ra: neither end within --port-range $a-$b"
      cnt=$((cnt + 1))
    done < <(mh_on "$i" ss -Htnp state established | grep -F '"'"$(basename "$netns_rank")"'"')
    [ "$cnt" -ge 1 ] || mh_fail "host $(mh_ip "$i"): no TCP connection of its ranks"
  done
  rdv=$(grep -oE 'rendezvous at [0-9.]+:[0-9]+' "$MH_DIR/launch.log" | head -n1)
  port=${rdv##*:}
  [ -n "$port" ] && [ "$port" -ge "$a" ] && [ "$port" -le "$b" ] ||
    mh_fail "the launcher's '$rdv' is not within --port-range $a-$b"
  mh_say "every rank-to-rank connection from the hosts' addresses with a listening end within --port-range $a-$b; $rdv"
}

case_kill() {
  local p ms msg
  start_cutoff_job --port-range 42100-42140
  check_ports 42100 42140
  p=$(rank_pid 1 2) || mh_fail "rank 2 not found among the processes of host 1 ($(mh_ip 1))"
  mh_say "killing rank 2 (pid $p) on host $(mh_ip 1) with SIGKILL; processes per host: $(for i in 0 1 2; do printf '%s ' "$(mh_count $i)"; done)"
  t_kill=$(mh_now_ms)
  kill -KILL "$p"
  check_all_gone 10 "rank 2 killed"
  ms=$gone_ms
  mh_say "every process of the job gone from every host $ms ms after the kill"
  wait_launch 30
  [ "$lrc" != 0 ] || mh_fail "the launcher exited 0 although rank 2 was killed"
  msg=$(first_failure)
  echo "$msg" | grep -q "rank 2" && echo "$msg" | grep -qF "$(mh_ip 1)" ||
    mh_fail "the launcher's first failure message does not name rank 2 on host $(mh_ip 1): '$msg'"
  echo "RESULT kill: rank 2 on host $(mh_ip 1) killed by SIGKILL: all gone after $ms ms, launcher exit $lrc after $(($(mh_now_ms) - t_kill)) ms: $msg"
}

case_sshd() {
  local ms msg bound=20 i
  # (a) sshd stopped on host 2: connection refused
  mh_sshd_stop 2
  start_launch --ssh "$(mh_ssh_cmd)" --hosts "$(mh_hosts_csv)" -n $k --connect-timeout 5 \
    --timeout 60 -- "$netns_rank" collectives $n
  wait_launch $bound
  [ "$lrc" != 0 ] || mh_fail "sshd stopped: the launcher exited 0"
  show_left "at the launcher's exit"
  msg=$(first_failure)
  echo "$msg" | grep -qF "$(mh_ip 2)" || mh_fail "sshd stopped on host $(mh_ip 2): the message does not name it: '$msg'"
  check_all_gone 10 "sshd stopped on one host"
  ms=$gone_ms
  echo "RESULT sshd-stopped: launcher exit $lrc after $took_ms ms (nothing left after $ms ms more): $msg"

  # (b) host 2 unreachable (every packet dropped): ssh's connect times out
  mh_cut 2 || mh_fail "nft (cut host 2)"
  start_launch --ssh "$(mh_ssh_cmd)" --hosts "$(mh_hosts_csv)" -n $k --connect-timeout 4 \
    --timeout 60 -- "$netns_rank" collectives $n
  wait_launch $bound
  [ "$lrc" != 0 ] || mh_fail "host unreachable: the launcher exited 0"
  msg=$(first_failure)
  echo "$msg" | grep -qF "$(mh_ip 2)" || mh_fail "host $(mh_ip 2) unreachable: the message does not name it: '$msg'"
  [ "$took_ms" -le $(((4 + 8) * 1000)) ] || mh_fail "host unreachable: took $took_ms ms with --connect-timeout 4"
  show_left "at the launcher's exit"
  # the cut host runs nothing of the job (ssh never got there); the others must empty
  check_all_gone 10 "host unreachable"
  ms=$gone_ms
  echo "RESULT host-unreachable: launcher exit $lrc after $took_ms ms (--connect-timeout 4; nothing left after $ms ms more): $msg"

  # (c) the program missing on host 1 only (a tmpfs over its directory in that host's
  # mount namespace; the sshds of hosts 0 and 1 still run)
  mkdir -p "$MH_DIR/bin" && cp "$netns_rank" "$MH_DIR/bin/rankprog" || mh_fail "copy the rank program"
  nsenter -t "${MH_SSHD_PIDS[1]}" -m mount -t tmpfs none "$MH_DIR/bin" ||
    mh_fail "cannot hide $MH_DIR/bin on host 1"
  start_launch --ssh "$(mh_ssh_cmd)" --hosts "$(mh_ip 0),$(mh_ip 1)" -n $k --connect-timeout 5 \
    --timeout 60 -- "$MH_DIR/bin/rankprog" collectives 4
  wait_launch $bound
  [ "$lrc" != 0 ] || mh_fail "program missing on host 1: the launcher exited 0"
  msg=$(first_failure)
  echo "$msg" | grep -qF "$(mh_ip 1)" || mh_fail "program missing on host $(mh_ip 1): the message does not name it: '$msg'"
  check_all_gone 10 "program missing on one host"
  ms=$gone_ms
  echo "RESULT program-missing: launcher exit $lrc after $took_ms ms (nothing left after $ms ms more): $msg"

  # (d) a firewall on host 1 lets ssh through but not its ranks' connections to the
  # launcher's rendezvous port: the rendezvous gives up after 3 connect timeouts
  mh_on 1 nft -f - <<EOF || mh_fail "nft (firewall on host 1)"
table inet mlxd_mh_fw {
  chain out { type filter hook output priority 0; ip daddr $MH_SUBNET.1 tcp sport != 22 drop; }
}
EOF
  start_launch --ssh "$(mh_ssh_cmd)" --hosts "$(mh_ip 0),$(mh_ip 1)" -n $k --connect-timeout 3 \
    --timeout 60 -- "$netns_rank" collectives 4
  wait_launch 30
  [ "$lrc" != 0 ] || mh_fail "rendezvous port blocked on host 1: the launcher exited 0"
  msg=$(first_failure)
  echo "$msg" | grep -qF "$(mh_ip 1)" || mh_fail "rendezvous port blocked on host $(mh_ip 1): the message does not name it: '$msg'"
  check_all_gone 10 "rendezvous port blocked on one host"
  ms=$gone_ms
  echo "RESULT rendezvous-blocked: launcher exit $lrc after $took_ms ms (--connect-timeout 3; nothing left after $ms ms more): $msg"
  launch_lines | grep -i rendezvous | head -n 4
}

case_cut() {
  local ms msg i
  start_cutoff_job --env MLXDIST_TIMEOUT=3
  mh_cut 2 || mh_fail "nft (cut host 2)"
  t_cut=$(mh_now_ms)
  mh_say "host $(mh_ip 2) cut off by nftables during all_sums (MLXDIST_TIMEOUT=3)"
  # the launcher must notice (ranks 0..3 fail) and stop everything it can reach
  while kill -0 "$lpid" 2>/dev/null; do
    [ $(($(mh_now_ms) - t_cut)) -lt 40000 ] || mh_fail "the launcher still runs 40 s after the cut"
    sleep 0.05
  done
  took_ms=$(($(mh_now_ms) - t_cut))
  wait "$lpid"
  lrc=$?
  [ "$lrc" != 0 ] || mh_fail "the launcher exited 0 although host 2 was cut off"
  msg=$(first_failure)
  for i in 0 1; do
    ms=$(($(mh_now_ms) - t_cut))
    [ "$(mh_count $i)" = 0 ] || mh_fail "processes left on host $(mh_ip $i) after the launcher exited: $(mh_ps $i)"
  done
  # the cut host cannot be told anything: its ranks fail on their own (no sign of life
  # within MLXDIST_TIMEOUT), the launcher's script there ends with them; then sshd ends the
  # sessions (ClientAlive: 3 x 5 s here) once it gives up on the client
  local t_prog=""
  while :; do
    if [ -z "$t_prog" ] && [ "$(job_count 2)" = 0 ]; then
      t_prog=$(($(mh_now_ms) - t_cut))
    fi
    [ "$(mh_count 2)" = 0 ] && break
    [ $(($(mh_now_ms) - t_cut)) -lt 60000 ] || {
      show_left "60 s after the cut"
      mh_fail "host 2 cut off: processes still there 60 s after the cut"
    }
    sleep 0.1
  done
  [ -n "$t_prog" ] || t_prog=$(($(mh_now_ms) - t_cut))
  [ "$t_prog" -le 15000 ] || mh_fail "host 2 cut off: its ranks still ran $t_prog ms after the cut (MLXDIST_TIMEOUT=3)"
  echo "RESULT cut: launcher exit $lrc $took_ms ms after the cut; on the cut host the job's processes gone $t_prog ms after it, its sshd sessions $(($(mh_now_ms) - t_cut)) ms after it: $msg"
  grep -E '\[ring\].*(no sign of life|rank [45])' "$MH_DIR/launch.log" | head -n 3
}

case_mpi() {
  [ -n "$mpi_ranks" ] && [ -x "$mpi_ranks" ] || mh_skip "the mpi plugin and its test program are not built"
  command -v mpirun >/dev/null 2>&1 || mh_skip "mpirun is not installed"
  # Open MPI: root needs both variables; more ranks than cores need yield_when_idle; the
  # daemons and the TCP BTL stay on the test subnet.
  start_launch_mpi() {
    t_start=$(mh_now_ms)
    mh_client env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_oob_tcp_if_include=$MH_SUBNET.0/24 \
      OMPI_MCA_btl_tcp_if_include=$MH_SUBNET.0/24 OMPI_MCA_btl_vader_single_copy_mechanism=none \
      "$launch" "$@" >"$MH_DIR/launch.log" 2>&1 &
    lpid=$!
    MH_BG_PIDS+=("$lpid")
  }
  # where mpirun put each rank: rank r on host r / k (host-major, as the ring)
  local r line where=""
  start_launch_mpi --backend mpi --ssh "$(mh_ssh_cmd)" --hosts "$(mh_hosts_csv)" -n $k \
    --timeout 60 -- /bin/hostname
  wait_launch 80
  [ "$lrc" = 0 ] || mh_fail "--backend mpi, hostname on every rank: launcher exit status $lrc"
  for ((r = 0; r < n; r++)); do
    line=$(grep -E "^\[[0-9]+,$r\]<stdout>:|^\[$r\] " "$MH_DIR/launch.log" | head -n1)
    [ "${line##*[:\] ]}" = "mh$((r / k))" ] || mh_fail "--backend mpi: rank $r ran on '${line}', expected host mh$((r / k))"
    where+=" $r:${line##*[:\] ]}"
  done
  mh_say "--backend mpi: rank:host$where"
  start_launch_mpi --backend mpi --ssh "$(mh_ssh_cmd)" --hosts "$(mh_hosts_csv)" -n $k --verbose \
    --timeout 200 -- "$mpi_ranks" quick
  wait_launch 220
  [ "$lrc" = 0 ] || mh_fail "--backend mpi across $nh hosts: launcher exit status $lrc"
  [ "$(grep -c "rank [0-9]/$n: mpi_ranks all OK" "$MH_DIR/launch.log")" = $n ] ||
    mh_fail "--backend mpi: not every rank of $n reported OK"
  mh_say "--backend mpi across $nh hosts x $k ranks passed in $took_ms ms"
  check_all_gone 10 "after the mpi run"
}

case $case_name in
  conformance | hostfile | kill | sshd | cut | mpi) ;;
  *) mh_fail "unknown case '$case_name'" ;;
esac
mh_setup $nh
"case_$case_name"
mh_say "launcher's messages:"
launch_lines | head -n 12
mh_say "$case_name passed"
exit 0
