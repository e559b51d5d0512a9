#!/bin/sh
# procs_limit.sh LAUNCH: a job larger than the host's process and thread limits is refused
# before anything starts, exit status 1, with a message naming the limit (launch_procs):
#  1. more ranks than kernel.pid_max / kernel.threads-max leave room for (about 3 tasks a
#     rank), when that is within the launcher's 65,536 and the open-file hard limit allows
#     the launcher to get that far;
#  2. as an unprivileged user (setpriv to nobody, when run as root), 100 ranks under
#     RLIMIT_NPROC = 50.
# A case whose conditions this host does not meet is skipped and says so; none met: 77.
launch=$1
dir=$(mktemp -d) || exit 1
chmod 755 "$dir"
trap 'rm -rf "$dir"' EXIT
ran=0
refused() { # NAME WANT: the run's output in $dir/out, its status in $rc
  cat "$dir/out"
  [ "$rc" = 1 ] || { echo "FAIL $1: exit status $rc, expected 1"; exit 1; }
  grep -q "$2" "$dir/out" || { echo "FAIL $1: no message naming $2"; exit 1; }
  [ ! -e "$dir/ran" ] || { echo "FAIL $1: a rank ran"; exit 1; }
  echo "PASS $1"
  ran=$((ran + 1))
}
pid_max=$(cat /proc/sys/kernel/pid_max 2>/dev/null || echo 0)
thr_max=$(cat /proc/sys/kernel/threads-max 2>/dev/null || echo 0)
lim=$pid_max
[ "$thr_max" -lt "$lim" ] && lim=$thr_max
n=$((lim / 3 + 1))
# as root, make room in the open-file limits for the launcher to get as far (its check of
# the open-file limit comes first)
if [ "$(id -u)" = 0 ] && [ "$n" -le 65536 ]; then
  ulimit -Hn $((4 * n + 1024)) 2>/dev/null
  ulimit -Sn $((4 * n + 1024)) 2>/dev/null
fi
hard=$(ulimit -Hn)
if [ "$lim" -le 0 ] || [ "$n" -gt 65536 ]; then
  echo "SKIP kernel limits: pid_max $pid_max, threads-max $thr_max leave room for more than 65,536 ranks"
elif [ "$hard" != unlimited ] && [ "$hard" -lt $((4 * n + 64)) ]; then
  echo "SKIP kernel limits: the hard open-file limit ($hard) stops $n ranks first"
else
  "$launch" -n "$n" -- sh -c "touch '$dir/ran'" >"$dir/out" 2>&1
  rc=$?
  refused "kernel limits ($n ranks; pid_max $pid_max, threads-max $thr_max)" "kernel\.\(pid_max\|threads-max\)"
fi
if [ "$(id -u)" != 0 ] || ! command -v setpriv >/dev/null || ! command -v prlimit >/dev/null; then
  echo "SKIP RLIMIT_NPROC: needs root, setpriv and prlimit"
elif ! setpriv --reuid=65534 --regid=65534 --clear-groups "$launch" --help >/dev/null 2>&1; then
  echo "SKIP RLIMIT_NPROC: user 65534 cannot run $launch"
else
  setpriv --reuid=65534 --regid=65534 --clear-groups prlimit --nproc=50 \
    "$launch" -n 100 -- sh -c "touch '$dir/ran'" >"$dir/out" 2>&1
  rc=$?
  refused "RLIMIT_NPROC (100 ranks, limit 50, as user 65534)" "RLIMIT_NPROC"
fi
[ "$ran" -gt 0 ] || exit 77
