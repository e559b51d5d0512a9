#!/usr/bin/env bash
# mlxdist under a real Slurm (issue 25, item 4): one cluster (tests/slurm/cluster.sh:
# slurmctld, munged and 3 slurmd hosts in network namespaces) is booted once and every case
# runs on it, in this order (a failing case ends the run, naming the case):
#
#   slurm.sh TEST_COLLECTIVES NETNS_RANK [PMIX_PROBE] [CASE...]
#
#   srun         `srun -N 3 --ntasks-per-node 2 hostname`: two tasks on each of sl0, sl1, sl2
#                (the cluster works; the step time is measured over several steps)
#   pmix         pmix_probe under `srun --mpi=pmix` (when built: libpmix-dev's pmix.pc): a
#                PMIx Put/Commit/Fence/Get all-gather across the nodes without mlxdist, with
#                the block layout (rank r on sl<r/2>, local rank r%2 of 2)
#   conformance  the conformance program, ring backend, `srun -N 3 --ntasks-per-node 2
#                --mpi=pmix`, no hostfile and no launcher: init from PMIx; every rank's
#                transport line says shm with the rank on its host and tcp with the 4 others
#   kill         netns_rank cutoff under srun; rank 2 (on sl1) killed by SIGKILL mid-way: every
#                survivor's op fails with an error (one names rank 2), srun exits non-zero and
#                names task 2, no task left on any node, all within bounds
#   sbatch       a job script (no mlxdist-launch: srun inside) submitted with sbatch: its
#                output file has the hostname step and 6 "passed" lines, the job's exit code 0
#   noresolve    netns_rank collectives under srun --mpi=pmix in tasks where no host name
#                resolves (empty /etc/hosts and resolv.conf in their own mount namespace): every
#                rank listens on its node's interface address, not loopback; all pass
#   nopmix       the collectives under srun without --mpi=pmix: every task's init fails at once
#                with the error that says it runs under Slurm without PMIx and to add --mpi=pmix
#
# CASE...: run only these (default: all, in the order above). Prints "RESULT <what>: ..."
# lines with the measured times (docs/slurm.md). Root only; exit 77 when not root or a
# package is missing (cluster.sh says which).
set -u

collectives=${1:?usage: slurm.sh TEST_COLLECTIVES NETNS_RANK [PMIX_PROBE] [CASE...]}
netns_rank=${2:?netns_rank}
probe=${3:-}
shift 3 2>/dev/null || shift $#
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(srun pmix conformance kill sbatch noresolve nopmix)

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=cluster.sh
. "$here/cluster.sh"

for f in "$collectives" "$netns_rank" ${probe:+"$probe"}; do
  [ -x "$f" ] || mh_fail "'$f' is not an executable file"
done
# the tasks (and the batch script) run in other directories: absolute paths
collectives=$(realpath "$collectives")
netns_rank=$(realpath "$netns_rank")
[ -z "$probe" ] || probe=$(realpath "$probe")

nh=3 # nodes
k=2  # tasks per node
n=$((nh * k))

# ---- helpers ----

# Start `srun -Q ARGS...` in the controller's namespace, in the background, output (stdout and
# stderr) to $MH_DIR/$LOG. Sets spid and t_start.
start_srun() {
  local log=$1
  shift
  t_start=$(mh_now_ms)
  # -Q: no "job queued and waiting for resources" lines among the tasks' output (a job that
  # ends gives its nodes back a moment later), errors still shown
  sl_run srun -Q "$@" >"$MH_DIR/$log" 2>&1 &
  spid=$!
  MH_BG_PIDS+=("$spid")
}
# Wait at most BOUND_S seconds for srun; sets src (its exit status) and took_ms.
wait_srun() {
  local bound_ms=$(($1 * 1000))
  while kill -0 "$spid" 2>/dev/null; do
    if [ $(($(mh_now_ms) - t_start)) -ge "$bound_ms" ]; then
      mh_fail "srun still runs after $1 s (its output: $(tail -n 5 "$MH_DIR/$2" | tr '\n' ' '))"
    fi
    sleep 0.05
  done
  took_ms=$(($(mh_now_ms) - t_start))
  wait "$spid"
  src=$?
}
# The processes on node I other than its slurmd: "pid comm" per line.
job_procs() {
  local p c
  for p in $(mh_pids "$1" all); do
    c=$(cat "/proc/$p/comm" 2>/dev/null) || continue
    [ "$c" = slurmd ] || echo "$p $c"
  done
}
# No task of a job on any node within BOUND_S seconds (slurmstepd may linger briefly);
# sets gone_ms.
check_no_tasks() {
  local bound_ms=$(($1 * 1000)) t0 i left
  t0=$(mh_now_ms)
  while :; do
    left=""
    for ((i = 0; i < nh; i++)); do
      left+=$(job_procs "$i" | grep -v ' slurmstepd$' | sed "s/^/ $(sl_node_name "$i"):/")
    done
    [ -z "$left" ] && break
    [ $(($(mh_now_ms) - t0)) -lt "$bound_ms" ] || mh_fail "$2: tasks still on the nodes $1 s later:$left"
    sleep 0.05
  done
  gone_ms=$(($(mh_now_ms) - t0))
}
# min / median / max of the numbers on stdin
spread() { sort -n | awk '{a[NR]=$1} END {printf "min %d, median %d, max %d ms (%d runs)", a[1], a[int((NR+1)/2)], a[NR], NR}'; }

# ---- the cases ----

case_srun() {
  local i times="" out want
  want=$(for ((i = 0; i < n; i++)); do sl_node_name $((i / k)); done)
  for i in 1 2 3 4 5; do
    start_srun srun.log -N $nh --ntasks-per-node $k hostname
    wait_srun 60 srun.log
    [ "$src" = 0 ] || mh_fail "srun hostname: exit status $src: $(cat "$MH_DIR/srun.log")"
    out=$(sort "$MH_DIR/srun.log")
    [ "$out" = "$want" ] || mh_fail "srun hostname printed '$(echo "$out" | tr '\n' ' ')', expected '$(echo "$want" | tr '\n' ' ')'"
    times+="$took_ms"$'\n'
  done
  echo "RESULT srun step (srun -N $nh --ntasks-per-node $k hostname): $(echo -n "$times" | spread)"
}

case_pmix() {
  local i times="" r line
  if [ -z "$probe" ]; then
    mh_say "pmix: SKIPPED: pmix_probe was not built (libpmix-dev's pmix.pc not found at configure time)"
    return 0
  fi
  for i in 1 2 3; do
    start_srun pmix.log -N $nh --ntasks-per-node $k --mpi=pmix "$probe"
    wait_srun 60 pmix.log
    [ "$src" = 0 ] || mh_fail "pmix_probe under srun --mpi=pmix: exit status $src: $(cat "$MH_DIR/pmix.log")"
    for ((r = 0; r < n; r++)); do
      line="pmix_probe: rank $r of $n on $(sl_node_name $((r / k))) (local rank $((r % k)) of $k): every record right"
      grep -qxF "$line" "$MH_DIR/pmix.log" || mh_fail "pmix_probe: no line '$line' in: $(cat "$MH_DIR/pmix.log")"
    done
    times+="$took_ms"$'\n'
  done
  echo "RESULT PMIx all-gather step (srun -N $nh --ntasks-per-node $k --mpi=pmix pmix_probe): $(echo -n "$times" | spread)"
}

# every rank's C2 line: shm with the other rank of its node, tcp with the rest. srun -l
# prefixes each line with the task id (SLURM_PROCID, block layout: task r on sl<r/k>): the
# line of task r must be rank r's, so the PMIx rank is Slurm's.
check_transport_lines() {
  local log=$1 r s mate others want line
  for ((r = 0; r < n; r++)); do
    mate=""
    others=""
    for ((s = 0; s < n; s++)); do
      [ "$s" = "$r" ] && continue
      if [ $((s / k)) = $((r / k)) ]; then mate+="${mate:+,}$s"; else others+="${others:+,}$s"; fi
    done
    want="[ring] rank $r: transports: shm with ranks $mate; tcp with ranks $others"
    # task r's first transport line is its world group's (split groups print theirs later)
    line=$(grep -E "^ *$r: \[ring\] rank [0-9]+: transports:" "$log" | head -n1)
    [ -n "$line" ] || mh_fail "task $r printed no transport line (contract C2: '$want')"
    case $line in
      *"$want") ;;
      *) mh_fail "task $r on $(sl_node_name $((r / k))): '$line', expected '... $want'" ;;
    esac
  done
  grep -E "^ *[0-9]+: \[ring\] rank [0-9]+: transports:" "$log" | awk '!seen[$1]++' | sort -n | sed 's/^/  /'
}

case_conformance() {
  start_srun conformance.log -N $nh --ntasks-per-node $k --mpi=pmix -l --time=8 \
    --export=ALL,MLX_RING_VERBOSE=1 "$collectives" ring
  wait_srun 500 conformance.log
  [ "$src" = 0 ] || mh_fail "conformance under srun ($nh nodes x $k tasks, --mpi=pmix): srun exit status $src"
  check_transport_lines "$MH_DIR/conformance.log"
  echo "RESULT conformance under srun -N $nh --ntasks-per-node $k --mpi=pmix (ring: shm within a node, tcp across): passed in $took_ms ms"
  check_no_tasks 10 "after the conformance step"
}

case_kill() {
  local r t0 p ms line msg dir=$MH_DIR/kill
  mkdir -p "$dir"
  start_srun kill.log -N $nh --ntasks-per-node $k --mpi=pmix -l --time=3 "$netns_rank" cutoff "$dir"
  t0=$(mh_now_ms)
  for ((r = 0; r < n; r++)); do
    while [ ! -e "$dir/ready.$r" ]; do
      kill -0 "$spid" 2>/dev/null || mh_fail "srun exited before rank $r was ready: $(cat "$MH_DIR/kill.log")"
      [ $(($(mh_now_ms) - t0)) -lt 60000 ] || mh_fail "rank $r not ready after 60 s: $(cat "$MH_DIR/kill.log")"
      sleep 0.05
    done
  done
  sleep 0.5 # a few ops on every rank
  p=$(cat "$dir/ready.2")
  [ "$(readlink "/proc/$p/ns/net")" = "$(nsenter --net="/run/netns/$(mh_ns 1)" readlink /proc/self/ns/net)" ] ||
    mh_fail "rank 2 (pid $p) does not run on $(sl_node_name 1)"
  mh_say "killing rank 2 (pid $p) on $(sl_node_name 1) with SIGKILL"
  t_kill=$(mh_now_ms)
  kill -KILL "$p"
  wait_srun 60 kill.log
  ms=$(($(mh_now_ms) - t_kill))
  [ "$src" != 0 ] || mh_fail "srun exited 0 although rank 2 was killed: $(cat "$MH_DIR/kill.log")"
  check_no_tasks 10 "rank 2 killed"
  sed 's/^/  /' "$MH_DIR/kill.log"
  grep -qE 'srun: error: sl1: task 2: Killed' "$MH_DIR/kill.log" ||
    mh_fail "srun did not say that task 2 on sl1 was killed"
  # every survivor's op failed (exit 3) with an error naming the lost rank, and none ran on
  # into netns_rank's 90 s bound
  for ((r = 0; r < n; r++)); do
    [ "$r" = 2 ] && continue
    line=$(grep -E "^ *$r: netns_rank cutoff: rank $r: all_sum failed after [0-9]+ good ops: " "$MH_DIR/kill.log") ||
      mh_fail "rank $r did not report a failed op after rank 2 was killed"
    echo "${line#*good ops: }" | grep -qE 'rank 2([^0-9]|$)' ||
      mh_fail "rank $r's error does not name rank 2: '$line'"
  done
  msg=$(grep -m1 -E "^ *[0-9]+: netns_rank cutoff: rank [0-9]+: all_sum failed" "$MH_DIR/kill.log" | sed 's/^.*good ops: //')
  echo "RESULT kill under srun: rank 2 on $(sl_node_name 1) killed by SIGKILL: srun exit $src after $ms ms, no task left $gone_ms ms later; a survivor: $msg"
}

case_sbatch() {
  local d=$MH_DIR/sbatch id t0 state ec out r
  mkdir -p "$d"
  cat >"$d/job.sh" <<EOF
#!/bin/bash
#SBATCH --job-name=mlxdist-sbatch
#SBATCH --nodes=$nh
#SBATCH --ntasks-per-node=$k
#SBATCH --time=5
#SBATCH --output=$d/job.%j.out
# a job script as a user writes it: srun starts the ranks, PMIx tells them who they are
set -e
srun -l hostname | sort -n
srun --mpi=pmix "$netns_rank" collectives $n
echo "job script done"
EOF
  t0=$(mh_now_ms)
  id=$(cd "$d" && sl_run sbatch --parsable "$d/job.sh") || mh_fail "sbatch refused the job script: $id"
  id=${id%%;*}
  case $id in '' | *[!0-9]*) mh_fail "sbatch printed no job id: '$id'" ;; esac
  while :; do
    state=$(sl_run squeue -h -j "$id" -o '%T' 2>/dev/null)
    [ -z "$state" ] && break
    [ $(($(mh_now_ms) - t0)) -lt 300000 ] || mh_fail "job $id still $state after 300 s"
    sleep 0.1
  done
  took_ms=$(($(mh_now_ms) - t0))
  out=$d/job.$id.out
  [ -f "$out" ] || mh_fail "job $id wrote no output file $out"
  sed 's/^/  /' "$out"
  ec=$(sl_run scontrol show job -o "$id" 2>/dev/null | grep -oE ' ExitCode=[0-9]+:[0-9]+' | head -n1)
  [ "$ec" = " ExitCode=0:0" ] || mh_fail "job $id: scontrol says '$ec' (expected ExitCode=0:0)"
  for ((r = 0; r < n; r++)); do
    grep -qx "$r: $(sl_node_name $((r / k)))" "$out" || mh_fail "job $id: no '$r: $(sl_node_name $((r / k)))' line from srun -l hostname"
  done
  [ "$(grep -cE "^netns_rank collectives: rank [0-9] of $n passed$" "$out")" = $n ] ||
    mh_fail "job $id: not every rank reported 'passed'"
  grep -qx "job script done" "$out" || mh_fail "job $id: the script did not reach its end"
  echo "RESULT sbatch: job $id ($nh nodes x $k tasks, srun inside) submitted to done in $took_ms ms, exit code 0:0"
}

case_noresolve() {
  local r line
  # the nodes' names do not resolve (a task's own mount namespace with empty /etc/hosts and
  # /etc/resolv.conf): the host-name address is loopback only, and the ranks of a job that
  # spans nodes must listen on an interface's address instead (docs/pmix.md)
  : >"$MH_DIR/empty"
  start_srun noresolve.log -N $nh --ntasks-per-node $k --mpi=pmix -l --time=3 \
    --export=ALL,MLX_RING_VERBOSE=1 unshare --mount /bin/sh -c \
    'mount --bind "$1" /etc/hosts && mount --bind "$1" /etc/resolv.conf || exit 9
     if getent hosts "$(hostname)" >/dev/null; then echo "name resolves"; else echo "name does not resolve"; fi
     exec "$2" collectives "$3"' sh "$MH_DIR/empty" "$netns_rank" $n
  wait_srun 120 noresolve.log
  [ "$src" = 0 ] || mh_fail "collectives under srun with names that do not resolve: srun exit status $src"
  [ "$(grep -cE "^ *[0-9]+: netns_rank collectives: rank [0-9] of $n passed$" "$MH_DIR/noresolve.log")" = $n ] ||
    mh_fail "names that do not resolve: not every rank reported 'passed'"
  check_transport_lines "$MH_DIR/noresolve.log"
  for ((r = 0; r < n; r++)); do
    grep -qE "^ *$r: name does not resolve$" "$MH_DIR/noresolve.log" || {
      mh_say "noresolve: task $r's host name resolves all the same (nss); the fallback is not exercised there"
      continue
    }
    line=$(grep -E "^ *$r: .*loopback only: listening on $MH_SUBNET\.$((r / k + 2)):[0-9]+ \(interface" "$MH_DIR/noresolve.log" | head -n1)
    [ -n "$line" ] || mh_fail "task $r (name unresolved) does not say it listens on its node's address $(mh_ip $((r / k))) instead of loopback"
  done
  grep -E "^ *[0-9]+: .*loopback only: listening on" "$MH_DIR/noresolve.log" | sort -n | sed 's/^/  /'
  echo "RESULT srun with host names that do not resolve: every rank listened on its node's interface address, collectives passed in $took_ms ms"
}

case_nopmix() {
  local r
  # the same kind of step without --mpi=pmix (MpiDefault=none): the tasks are in a Slurm job
  # but nothing can tell them their peers; init must fail at once and say what to add
  start_srun nopmix.log -N $nh --ntasks-per-node 1 -l --time=2 "$netns_rank" collectives $nh
  wait_srun 60 nopmix.log
  sed 's/^/  /' "$MH_DIR/nopmix.log"
  [ "$src" != 0 ] || mh_fail "a step without --mpi=pmix succeeded"
  for ((r = 0; r < nh; r++)); do
    grep -E "^ *$r: .*srun --mpi=pmix" "$MH_DIR/nopmix.log" | grep -q "Slurm" ||
      mh_fail "task $r's error does not say that it runs under Slurm without PMIx and to add --mpi=pmix"
  done
  [ "$took_ms" -lt 30000 ] || mh_fail "the step without PMIx took $took_ms ms to fail (expected at once)"
  echo "RESULT srun without --mpi=pmix: every task's init failed with the message to add it, srun exit $src after $took_ms ms"
}

# ---- run ----

for c in "${cases[@]}"; do
  declare -F "case_$c" >/dev/null || mh_fail "unknown case '$c' (srun pmix conformance kill sbatch noresolve nopmix)"
done
sl_boot $nh
echo "RESULT cluster boot (namespaces, munged, slurmctld, $nh slurmd, every node idle): $SL_BOOT_MS ms"
for c in "${cases[@]}"; do
  mh_say "---- case $c ----"
  "case_$c"
done
mh_say "all cases passed: ${cases[*]}"
