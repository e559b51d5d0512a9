# shellcheck shell=bash
# A real Slurm cluster in network namespaces, for the tests: a sourceable bash library.
#
#   . tests/slurm/cluster.sh
#   sl_boot 3                         # slurmctld + 3 slurmd "hosts", every node idle
#   sl_run srun -N 3 --ntasks-per-node 2 --mpi=pmix prog
#
# Network (tests/multihost/hosts.sh's mh_net_setup, no sshd): a bridge in a "switch"
# namespace, the controller's namespace at 10.202.0.1 (hostname slctl) and node i (0-based)
# at 10.202.0.(i+2) (hostname sl<i>), on a private /24 of their own (tests/netns uses
# 10.200.0.0/24, tests/multihost 10.201.0.0/24: all of them can run at once).
#
# Per run, in hosts.sh's private temp dir (MH_DIR): a fresh munge key (1 KiB of
# /dev/urandom, mode 0400) and one munged for the whole cluster (its socket is a file: the
# network namespaces do not matter to it; slurm.conf names it with AuthInfo=socket=...),
# slurm.conf (SlurmUser root, auth/munge, SlurmctldHost=slctl(10.202.0.1), one NodeName per
# host with its NodeAddr: no /etc/hosts edits; per-node spool, log, pid file and TmpFS
# through %n; proctrack/linuxproc and task/none: no cgroup set-up is needed from the
# machine; MpiDefault=none, so a step asks for PMIx with --mpi=pmix). Every daemon runs in
# the foreground (-D, -F) under setsid (its own session: a signal to the driver's process
# group does not reach it) inside its namespace, entered with `nsenter --net` (not
# `ip netns exec`, which remounts /sys: slurmd 22.05 then finds no cgroup tree) and with its
# own hostname (`unshare --uts`) and its own mount namespace (`unshare --mount`), where a
# per-run hosts file is bound over /etc/hosts: every host's name resolves to its address
# there, as on a real cluster (the ring's PMIx bootstrap listens on the address of the host
# name; it falls back to 127.0.0.1 where that does not resolve). Clients (srun, sbatch,
# squeue, ...) run in the controller's namespace with SLURM_CONF set (sl_run).
#
# Cleanup: hosts.sh's mh_cleanup (the EXIT trap) kills every process in every namespace
# made here (munged, slurmctld, the slurmds and whatever they started) and removes the
# namespaces and the temp dir; namespaces and temp dirs of earlier runs whose driver is
# gone are removed first.
#
# Needs root and Debian's slurmctld, slurmd, slurm-client, munge and libpmix-dev (Slurm's
# pmix plugin loads the unversioned libpmix.so, which only libpmix-dev ships); otherwise
# sl_boot prints what is missing and exits 77 (CTest's skip code).
#
# After sl_boot:
#   sl_run CMD...          run CMD in the controller's namespace with SLURM_CONF set
#   sl_node_name I         sl<I>;  mh_ip I: its address;  mh_on I CMD: run CMD in its namespace
#   SL_BOOT_MS             how long sl_boot took (namespaces to every node idle)
#   SL_CONF                the slurm.conf path;  MH_DIR: the temp dir (free for the test's files)

# shellcheck disable=SC2034 # read by hosts.sh
MH_PREFIX=mlxdsl
MH_SUBNET=10.202.0
MH_TAG=${MH_TAG:-slurm}
_sl_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=../multihost/hosts.sh
. "$_sl_here/../multihost/hosts.sh"

SL_CONF=""
SL_BOOT_MS=0
SL_CTL_NAME=slctl
SL_PLUGIN_DIR=""
SL_DAEMONS=() # "pid what on host (log)" per daemon

sl_node_name() { echo "sl$1"; }

sl_run() {
  nsenter --net="/run/netns/$MH_CLIENT_NS" env SLURM_CONF="$SL_CONF" "$@"
}

# Start CMD... as a daemon in namespace NS with hostname NAME: its own session (setsid),
# output to LOG. Its pid goes to MH_BG_PIDS (mh_cleanup kills it in any case: it is in a
# namespace made here).
_sl_daemon() {
  local ns=$1 name=$2 log=$3
  shift 3
  setsid nsenter --net="/run/netns/$ns" unshare --uts --mount /bin/sh -c \
    'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"' \
    sh "$name" "$MH_DIR/hosts" "$@" </dev/null >"$log" 2>&1 &
  MH_BG_PIDS+=("$!")
  SL_DAEMONS+=("$! $1 on $name ($log)")
}

# Fail (naming it, with the end of its log) if a daemon started by _sl_daemon has exited.
_sl_check_daemons() {
  local d pid what log
  for d in "${SL_DAEMONS[@]}"; do
    pid=${d%% *}
    kill -0 "$pid" 2>/dev/null && continue
    what=${d#* }
    log=${what##*(}
    log=${log%)}
    mh_fail "${what%% (*} exited during the boot; the end of its log: $(tail -n 8 "$log" 2>/dev/null)"
  done
}

# Which of the needed programs and files are missing: one Debian package name per line.
_sl_missing() {
  local c
  for c in slurmctld slurmd; do command -v "$c" >/dev/null 2>&1 || echo "$c"; done
  for c in srun sbatch squeue sinfo scontrol; do
    command -v "$c" >/dev/null 2>&1 || {
      echo slurm-client
      break
    }
  done
  command -v munged >/dev/null 2>&1 || echo munge
  command -v nsenter >/dev/null 2>&1 && command -v setsid >/dev/null 2>&1 || echo util-linux
  [ -n "$SL_PLUGIN_DIR" ] && [ -e "$SL_PLUGIN_DIR/mpi_pmix.so" ] || echo slurm-wlm-basic-plugins
  compgen -G '/usr/lib/*/libpmix.so' >/dev/null || compgen -G '/usr/lib*/libpmix.so' >/dev/null ||
    echo libpmix-dev
}

_sl_write_conf() {
  local d=$MH_DIR i
  {
    cat <<EOF
# made by tests/slurm/cluster.sh for one test run
ClusterName=mlxdtest
SlurmctldHost=$SL_CTL_NAME($MH_SUBNET.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$d/munge/munge.socket.2
CredType=cred/munge
SlurmctldPort=6817
SlurmdPort=6818
SrunPortRange=60001-63000
StateSaveLocation=$d/ctld
SlurmctldPidFile=$d/slurmctld.pid
SlurmctldLogFile=$d/slurmctld.log
SlurmdSpoolDir=$d/spool/%n
SlurmdPidFile=$d/spool/%n/slurmd.pid
SlurmdLogFile=$d/slurmd.%n.log
TmpFS=$d/tmp/%n
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
PropagateResourceLimitsExcept=MEMLOCK
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=10
KillWait=5
InactiveLimit=0
MinJobAge=30
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
EOF
    for ((i = 0; i < MH_N; i++)); do
      echo "NodeName=$(sl_node_name "$i") NodeAddr=$(mh_ip "$i") CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=1000 State=UNKNOWN"
    done
    echo "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
  } >"$d/slurm.conf"
  SL_CONF=$d/slurm.conf
  # every host's name resolves on every host (as DNS or /etc/hosts does on a real cluster):
  # bound over /etc/hosts in each daemon's own mount namespace, so the tasks see it too
  {
    echo "127.0.0.1 localhost"
    echo "$MH_SUBNET.1 $SL_CTL_NAME"
    for ((i = 0; i < MH_N; i++)); do echo "$(mh_ip "$i") $(sl_node_name "$i")"; done
  } >"$d/hosts"
  chmod 644 "$d/hosts"
  # slurmd 22.05 sets up cgroups whatever the proctrack/task plugins are. Under cgroup v2 it
  # asks systemd (over D-Bus) for a scope for its steps; a machine without D-Bus (a minimal
  # VM) would stop it there: make that directory by hand instead.
  cat >"$d/cgroup.conf" <<EOF
CgroupPlugin=autodetect
IgnoreSystemdOnFailure=yes
EOF
  mkdir -p "$d/ctld"
  for ((i = 0; i < MH_N; i++)); do mkdir -p "$d/spool/$(sl_node_name "$i")" "$d/tmp/$(sl_node_name "$i")"; done
}

_sl_start_munge() {
  local d=$MH_DIR t0
  mkdir -p "$d/munge"
  chmod 755 "$d/munge" # munged: its socket's directory must be searchable by all
  dd if=/dev/urandom of="$d/munge/munge.key" bs=1024 count=1 status=none || mh_fail "cannot write a munge key"
  chmod 400 "$d/munge/munge.key" # munged refuses a key that others (or the group) can read
  _sl_daemon "$MH_CLIENT_NS" "$SL_CTL_NAME" "$d/munged.log" munged -F --force \
    --socket="$d/munge/munge.socket.2" --key-file="$d/munge/munge.key" \
    --pid-file="$d/munge/munged.pid" --seed-file="$d/munge/munged.seed" --log-file="$d/munge/munged.log" \
    --origin="$MH_SUBNET.1"
  t0=$(mh_now_ms)
  until munge -n -S "$d/munge/munge.socket.2" </dev/null 2>/dev/null | unmunge -S "$d/munge/munge.socket.2" >/dev/null 2>&1; do
    [ $(($(mh_now_ms) - t0)) -lt 10000 ] ||
      mh_fail "munged does not answer after 10 s: $(cat "$d/munged.log" "$d/munge/munged.log" 2>/dev/null | tail -n 5)"
    sleep 0.05
  done
}

# sl_boot N: the network, munged, slurmctld and N slurmds; returns once every node is idle
# (bounded: 60 s). Installs mh_cleanup as the EXIT trap.
sl_boot() {
  local n=${1:?sl_boot N} i t0 states want missing
  [ "$(id -u)" = 0 ] || mh_skip "needs root to create network namespaces and run Slurm's daemons (running as uid $(id -u))"
  SL_PLUGIN_DIR=""
  for i in /usr/lib/x86_64-linux-gnu/slurm-wlm /usr/lib/*/slurm-wlm /usr/lib/slurm /usr/lib64/slurm; do
    [ -e "$i/mpi_pmix.so" ] && SL_PLUGIN_DIR=$i && break
  done
  missing=$(_sl_missing | sort -u | tr '\n' ' ')
  [ -z "$missing" ] || mh_skip "Slurm's test cluster needs these Debian packages: ${missing% } (scripts/setup-debian.sh installs them)"
  t0=$(mh_now_ms)
  mh_net_setup "$n"
  chmod 711 "$MH_DIR" # munged checks that its socket's directory is reachable by all
  _sl_write_conf
  _sl_start_munge
  _sl_daemon "$MH_CLIENT_NS" "$SL_CTL_NAME" "$MH_DIR/slurmctld.out" slurmctld -D -i -f "$SL_CONF"
  for ((i = 0; i < n; i++)); do
    _sl_daemon "${MH_NS[i]}" "$(sl_node_name "$i")" "$MH_DIR/slurmd.$i.out" \
      slurmd -D -N "$(sl_node_name "$i")" -f "$SL_CONF"
  done
  want=$(for ((i = 0; i < n; i++)); do echo "$(sl_node_name "$i") idle"; done)
  while :; do
    states=$(sl_run sinfo -h -N -o '%N %t' 2>/dev/null | sort)
    [ "$states" = "$want" ] && break
    _sl_check_daemons
    [ $(($(mh_now_ms) - t0)) -lt 60000 ] || mh_fail "the nodes are not all idle 60 s after the start: sinfo says: $(echo "$states" | tr '\n' ';')"
    sleep 0.1
  done
  SL_BOOT_MS=$(($(mh_now_ms) - t0))
  mh_say "Slurm cluster up: slurmctld on $SL_CTL_NAME ($MH_SUBNET.1), $n nodes $(mh_hosts_csv) idle after $SL_BOOT_MS ms"
}
