# shellcheck shell=bash
# Emulated hosts for the multihost tests: a sourceable bash library.
#
#   . tests/multihost/hosts.sh
#   mh_setup 3            # 3 "hosts" + a client namespace, every host running its own sshd
#   mh_client mlxdist-launch --ssh "$(mh_ssh_cmd)" --hosts "$(mh_hosts_csv)" -n 2 -- prog
#
# Network: a "switch" namespace holds a Linux bridge; every host namespace and the client
# namespace hang off it by a veth pair, on the private subnet 10.201.0.0/24 (tests/netns
# uses 10.200.0.0/24: both can run at once). The client is 10.201.0.1, host i (0-based)
# is 10.201.0.(i+2). Nothing is added to the caller's namespace; no packet leaves.
#
# ssh: per run, in a private temp dir (mode 700): one host key (shared by the hosts) and
# one client key, authorized_keys, a known_hosts listing every host's address with that
# host key, one sshd_config per host (ListenAddress = the host's address only, PidFile in
# the temp dir, UsePAM no, root login by key only) and an ssh_config for the client
# (IdentityFile, UserKnownHostsFile, StrictHostKeyChecking yes, BatchMode yes, LogLevel
# ERROR). Each sshd runs in its host's namespace under `unshare --uts` with hostname
# mh<i>, so `hostname` tells the hosts apart, and with an empty ~/.bashrc bound over
# root's in the sshd's own mount namespace (root's shell reads it even for `ssh host cmd`:
# the machine's may be slow or take locks that a killed rank would leave behind). mh_setup waits (bounded) until every sshd
# runs a command over ssh.
#
# Cleanup (mh_cleanup, installed as the EXIT trap by mh_setup): kills every process in
# every namespace made here (`ip netns pids`), deletes the namespaces and the temp dir.
# Namespaces and temp dirs of earlier runs whose driver is gone are removed first.
#
# Needs root, ip (iproute2), nft (nftables), sshd (openssh-server), ssh, ssh-keygen and
# unshare; otherwise mh_setup prints why and exits 77 (CTest's skip code).
#
# Functions (after mh_setup):
#   mh_ip I            address of host I (0-based)
#   mh_hosts_csv       "10.201.0.2,10.201.0.3,..."
#   mh_ns I            namespace name of host I;  MH_CLIENT_NS: the client's
#   mh_ssh_cmd         the --ssh string: "ssh -F <dir>/ssh_config"
#   mh_client CMD...   run CMD in the client namespace
#   mh_on I CMD...     run CMD directly in host I's namespace (not through ssh)
#   mh_pids I [all]    pids of processes in host I's namespace, except its sshd listener
#                      (with "all": including it), one per line
#   mh_count I         how many of those
#   mh_sshd_stop I     stop host I's sshd (listener only)
#   mh_cut I           drop every packet in and out of host I (nftables in its namespace)
#   mh_now_ms          monotonic-enough wall clock in milliseconds
#   MH_DIR             the private temp dir (free for the test's own files)

MH_PREFIX=${MH_PREFIX:-mlxdmh}
MH_SUBNET=${MH_SUBNET:-10.201.0} # the first three octets of the /24 (tests/slurm uses another)
MH_DIR=""
MH_CLIENT_NS=""
MH_SW_NS=""
MH_N=0
MH_NS=()
MH_SSHD_PIDS=()
MH_CREATED=()
MH_BG_PIDS=()

mh_say() { echo "${MH_TAG:-multihost}: $*"; }
mh_skip() {
  mh_say "SKIPPED: $*"
  exit 77
}
mh_fail() {
  echo "${MH_TAG:-multihost}: FAILED: $*" >&2
  mh_dump_logs >&2
  exit 1
}

mh_now_ms() {
  local t=${EPOCHREALTIME//[!0-9]/}
  echo $((t / 1000))
}

mh_dump_logs() {
  [ -n "$MH_DIR" ] && [ -d "$MH_DIR" ] || return 0
  local f
  for f in "$MH_DIR"/*.log; do
    [ -s "$f" ] || continue
    echo "---- ${f##*/} (last 40 lines) ----"
    tail -n 40 "$f"
  done
}

mh_cleanup() {
  local p ns
  set +e # also for callers under set -e: a failed kill or wait must not end the cleanup
  for p in "${MH_BG_PIDS[@]}"; do
    [ -n "$p" ] && kill -KILL "$p" 2>/dev/null
  done
  for ns in "${MH_CREATED[@]}"; do
    # everything running inside a namespace made here was started by this run
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  done
  for p in "${MH_BG_PIDS[@]}" "${MH_SSHD_PIDS[@]}"; do
    [ -n "$p" ] && wait "$p" 2>/dev/null
  done
  for ns in "${MH_CREATED[@]}"; do
    ip netns del "$ns" 2>/dev/null
  done
  MH_CREATED=()
  [ -n "$MH_DIR" ] && rm -rf "$MH_DIR"
  MH_DIR=""
  return 0
}

# Remove what earlier runs left when they were killed before their trap ran.
mh_remove_stale() {
  local f name owner p
  for f in /run/netns/"$MH_PREFIX"-*; do
    [ -e "$f" ] || continue
    name=${f##*/}
    owner=${name#"$MH_PREFIX"-}
    owner=${owner%%-*}
    case $owner in '' | *[!0-9]*) continue ;; esac
    if ! kill -0 "$owner" 2>/dev/null; then
      for p in $(ip netns pids "$name" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
      ip netns del "$name" 2>/dev/null && mh_say "removed stale namespace $name"
    fi
  done
  for f in /tmp/"$MH_PREFIX".*; do
    [ -d "$f" ] || continue
    owner=${f#/tmp/"$MH_PREFIX".}
    owner=${owner%%.*}
    case $owner in '' | *[!0-9]*) continue ;; esac
    kill -0 "$owner" 2>/dev/null || rm -rf "$f"
  done
}

mh_ip() { echo "$MH_SUBNET.$(($1 + 2))"; }
mh_ns() { echo "${MH_NS[$1]}"; }
mh_hosts_csv() {
  local i s=""
  for ((i = 0; i < MH_N; i++)); do s+="${s:+,}$(mh_ip "$i")"; done
  echo "$s"
}
mh_ssh_cmd() { echo "ssh -F $MH_DIR/ssh_config"; }
mh_client() { ip netns exec "$MH_CLIENT_NS" "$@"; }
mh_on() {
  local i=$1
  shift
  ip netns exec "${MH_NS[$i]}" "$@"
}
mh_pids() {
  local i=$1 p
  for p in $(ip netns pids "${MH_NS[$i]}" 2>/dev/null); do
    [ "${2:-}" != all ] && [ "$p" = "${MH_SSHD_PIDS[$i]}" ] && continue
    echo "$p"
  done
}
mh_count() { mh_pids "$1" | wc -l; }
# One line per process of host I (except the sshd listener): "pid comm args".
mh_ps() {
  local p
  for p in $(mh_pids "$1"); do
    [ -r "/proc/$p/cmdline" ] || continue
    echo "$p $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-120)"
  done
}
mh_sshd_stop() {
  local i=$1
  kill -TERM "${MH_SSHD_PIDS[$i]}" 2>/dev/null
  wait "${MH_SSHD_PIDS[$i]}" 2>/dev/null
  MH_SSHD_PIDS[i]=""
}
mh_cut() {
  ip netns exec "${MH_NS[$1]}" nft -f - <<'EOF'
table inet mlxd_mh_cut {
  chain in { type filter hook input priority 0; policy drop; }
  chain out { type filter hook output priority 0; policy drop; }
}
EOF
}

# Wait until no process of the job is left on any host (sshd listeners aside), at most
# BOUND_MS milliseconds. Prints the time taken; on timeout lists what is left, returns 1.
mh_wait_all_gone() {
  local bound_ms=$1 t0 i left
  t0=$(mh_now_ms)
  while :; do
    left=0
    for ((i = 0; i < MH_N; i++)); do left=$((left + $(mh_count "$i"))); done
    [ "$left" = 0 ] && {
      echo $(($(mh_now_ms) - t0))
      return 0
    }
    if [ $(($(mh_now_ms) - t0)) -ge "$bound_ms" ]; then
      for ((i = 0; i < MH_N; i++)); do
        mh_ps "$i" | sed "s/^/host $i ($(mh_ip "$i")) left: /" >&2
      done
      return 1
    fi
    sleep 0.1
  done
}

mh_write_ssh_files() {
  local d=$MH_DIR i
  ssh-keygen -q -t ed25519 -N '' -C mlxdist-mh-host -f "$d/host_key" || mh_fail "ssh-keygen (host key)"
  ssh-keygen -q -t ed25519 -N '' -C mlxdist-mh-client -f "$d/client_key" || mh_fail "ssh-keygen (client key)"
  cp "$d/client_key.pub" "$d/authorized_keys"
  chmod 600 "$d/authorized_keys"
  : >"$d/known_hosts"
  for ((i = 0; i < MH_N; i++)); do
    echo "$(mh_ip "$i") $(cut -d' ' -f1,2 "$d/host_key.pub")" >>"$d/known_hosts"
    cat >"$d/sshd_config.$i" <<EOF
ListenAddress $(mh_ip "$i"):22
HostKey $d/host_key
PidFile $d/sshd.$i.pid
AuthorizedKeysFile $d/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
X11Forwarding no
PrintMotd no
PrintLastLog no
UseDNS no
MaxStartups 64:30:128
MaxSessions 64
ClientAliveInterval 5
ClientAliveCountMax 3
LogLevel ERROR
EOF
  done
  cat >"$d/ssh_config" <<EOF
Host *
  User root
  IdentityFile $d/client_key
  IdentitiesOnly yes
  UserKnownHostsFile $d/known_hosts
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  BatchMode yes
  LogLevel ERROR
  ConnectTimeout 5
  ServerAliveInterval 5
  ServerAliveCountMax 3
EOF
}

# mh_net_setup N: the network only (the switch, the client and N host namespaces, MH_DIR),
# no sshd: for harnesses that start daemons of their own in the hosts (tests/slurm).
# Installs mh_cleanup as the EXIT trap.
mh_net_setup() {
  local n=${1:?mh_net_setup N} i ns err
  [ "$(id -u)" = 0 ] || mh_skip "needs root to create network namespaces (running as uid $(id -u))"
  local c
  for c in ip nft unshare; do
    command -v "$c" >/dev/null 2>&1 || mh_skip "the '$c' command is not installed"
  done
  MH_N=$n
  trap 'mh_cleanup 2>/dev/null' EXIT
  trap 'mh_fail "terminated (SIGTERM)"' TERM
  trap 'mh_fail "interrupted"' INT
  mh_remove_stale
  MH_DIR=$(mktemp -d "/tmp/$MH_PREFIX.$$.XXXXXX") || mh_fail "mktemp failed"
  chmod 700 "$MH_DIR"

  MH_SW_NS=$MH_PREFIX-$$-sw
  if ! err=$(ip netns add "$MH_SW_NS" 2>&1); then
    mh_skip "cannot create a network namespace ('ip netns add' failed: $err)"
  fi
  MH_CREATED+=("$MH_SW_NS")
  if ! err=$(ip netns exec "$MH_SW_NS" nft add table inet mlxd_probe 2>&1); then
    mh_skip "nftables does not work inside a network namespace here (nft: $err)"
  fi
  ip netns exec "$MH_SW_NS" nft delete table inet mlxd_probe || mh_fail "nft delete table (probe)"
  ip -n "$MH_SW_NS" link set lo up || mh_fail "switch: lo up"
  ip -n "$MH_SW_NS" link add br0 type bridge || mh_fail "switch: cannot add bridge br0"
  ip -n "$MH_SW_NS" link set br0 up || mh_fail "switch: br0 up"

  # port p<k> in the switch <-> eth0 in namespace k (k = 0: the client, k >= 1: host k-1)
  local names=("$MH_PREFIX-$$-c") addrs=("$MH_SUBNET.1")
  for ((i = 0; i < n; i++)); do
    names+=("$MH_PREFIX-$$-h$i")
    addrs+=("$(mh_ip "$i")")
  done
  for ((i = 0; i <= n; i++)); do
    ns=${names[i]}
    ip netns add "$ns" || mh_fail "ip netns add $ns"
    MH_CREATED+=("$ns")
    ip -n "$MH_SW_NS" link add "p$i" type veth peer name eth0 netns "$ns" || mh_fail "veth p$i"
    ip -n "$MH_SW_NS" link set "p$i" master br0 || mh_fail "p$i into br0"
    ip -n "$MH_SW_NS" link set "p$i" up || mh_fail "p$i up"
    ip -n "$ns" link set lo up || mh_fail "$ns: lo up"
    ip -n "$ns" addr add "${addrs[i]}/24" dev eth0 || mh_fail "$ns: address"
    ip -n "$ns" link set eth0 up || mh_fail "$ns: eth0 up"
  done
  MH_CLIENT_NS=${names[0]}
  MH_NS=("${names[@]:1}")
}

# mh_setup N: build the network and start the sshds. Installs mh_cleanup as the EXIT trap.
mh_setup() {
  local n=${1:?mh_setup N} i t0 out c
  [ "$(id -u)" = 0 ] || mh_skip "needs root to create network namespaces and run sshd (running as uid $(id -u))"
  for c in ssh ssh-keygen; do
    command -v "$c" >/dev/null 2>&1 || mh_skip "the '$c' command is not installed"
  done
  [ -x /usr/sbin/sshd ] || mh_skip "/usr/sbin/sshd is not installed (Debian: openssh-server)"
  mh_net_setup "$n"

  mh_write_ssh_files
  mkdir -p /run/sshd && chmod 755 /run/sshd # sshd's privilege separation directory
  # root's sessions on the hosts run bash, which reads ~/.bashrc even for `ssh host cmd`; this
  # machine's may be slow or take locks (a rank killed mid-way would leave them behind)
  echo '# mlxdist multihost test host: nothing to set up' >"$MH_DIR/bashrc"
  for ((i = 0; i < n; i++)); do
    # `ip netns exec` gives the sshd a mount namespace of its own (slave to ours): the empty
    # rc file bound over root's ~/.bashrc there is seen by this host's sessions only
    ip netns exec "${MH_NS[i]}" unshare --uts /bin/sh -c \
      'hostname "$1" && { [ ! -e "$HOME/.bashrc" ] || mount --bind "$3" "$HOME/.bashrc"; } &&
       exec /usr/sbin/sshd -D -e -f "$2"' sh "mh$i" "$MH_DIR/sshd_config.$i" "$MH_DIR/bashrc" \
      >"$MH_DIR/sshd.$i.log" 2>&1 &
    MH_SSHD_PIDS[i]=$!
  done

  # bounded wait: every sshd runs a command for the client key
  t0=$(mh_now_ms)
  for ((i = 0; i < n; i++)); do
    while ! out=$(mh_client ssh -F "$MH_DIR/ssh_config" -o ConnectTimeout=2 "root@$(mh_ip "$i")" hostname 2>&1) ||
      [ "$out" != "mh$i" ]; do
      kill -0 "${MH_SSHD_PIDS[i]}" 2>/dev/null || mh_fail "sshd of host $i exited: $(cat "$MH_DIR/sshd.$i.log")"
      [ $(($(mh_now_ms) - t0)) -lt 60000 ] || mh_fail "sshd of host $i ($(mh_ip "$i")) does not answer after 60 s: $out"
      sleep 0.2
    done
  done
  mh_say "$n hosts $(mh_hosts_csv) (namespaces ${MH_NS[*]}), client $MH_SUBNET.1 ($MH_CLIENT_NS); every sshd answered in $(($(mh_now_ms) - t0)) ms"
}
