#!/bin/sh
# mlxdist-launch across hosts with real processes, through a stand-in ssh
# (fake_ssh.sh: runs the remote command here; hosts are 127.0.0.2 and
# 127.0.0.3, both this machine's loopback, so the ranks listen on distinct
# addresses and reach the launcher's real rendezvous over real sockets).
#   test_launch_hosts.sh CASE LAUNCHER RANK_PROGRAM (hosts_rank.c) FAKE_SSH
# Cases:
#   sum      2 hosts x 2 ranks: the ring group's all_sum is right on every rank,
#            each rank listens on its host's address, lines are prefixed
#   verbose  --verbose: "[r host] " prefixes and the launcher's plan
#   kill     rank 2 (host 127.0.0.3) dies of SIGKILL: exit 137 within 10 s, the
#            launcher names rank and host, and no process of the job is left
#   down     ssh to 127.0.0.3 fails: "cannot reach host 127.0.0.3 over ssh: ...",
#            exit 255, nothing left
#   gone     127.0.0.3 never answers while a rank on 127.0.0.2 fails: the ssh
#            client is ended after the grace; exit within 10 s, nothing left
#   missing  the program does not exist on the hosts: "program not found on
#            host ...", exit 127
#   token    the job token (and --secret's contents) on no process's command
#            line while the job runs, and the all_sum right
#   ifname   --ifname lo --port-range: no MLXDIST_RING_ADDR, the ranks pick lo's
#            address and ports in the range; the all_sum right
#   mixed    localhost (forked here) and 127.0.0.2 (over ssh) in one job
#   typo     MLXDIST_TIMEUOT in the launcher's environment and an unknown --env
#            name, ranks forked here and over ssh: the launcher warns once per
#            name, no rank repeats it (MLXDIST_ENV_REPORTED), the all_sum right
#   start    a rank never reaches the rendezvous (host gone): the rendezvous
#            gives up after its bound (3 x --connect-timeout 1), the launcher
#            stops the job (rank 0's own exit status 255 is not taken for ssh's)
set -u
case_=$1
launch=$2
prog=$3
fake="sh $4"
out=$(mktemp)
mark="mlxdist_hosts_$$_$(date +%s%N)"
trap 'rm -f "$out"' EXIT
fail=0
unset MLX_HOSTFILE MLXDIST_LAUNCH_TIMEOUT FAKE_SSH_DOWN FAKE_SSH_GONE

check() { # check DESCRIPTION GREP-PATTERN
  if grep -E -q -- "$2" "$out"; then
    echo "ok: $1"
  else
    echo "FAIL: $1 (no line matches: $2)"
    fail=1
  fi
}

check_not() { # check_not DESCRIPTION GREP-PATTERN
  if grep -E -q -- "$2" "$out"; then
    echo "FAIL: $1 (a line matches: $2)"
    fail=1
  else
    echo "ok: $1"
  fi
}

run() { # run EXPECTED-STATUS MAX-SECONDS ARGS...
  want=$1
  max=$2
  shift 2
  t0=$(date +%s.%N)
  "$launch" "$@" >"$out" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  sed 's/^/    | /' "$out"
  took=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
  echo "took ${took} s, exit $rc"
  if [ "$want" = nz ] && [ "$rc" -ne 0 ]; then
    :
  elif [ "$want" = nz ] || [ "$rc" -ne "$want" ]; then
    echo "FAIL: exit status $rc, expected $want"
    fail=1
  fi
  if awk -v t="$took" -v m="$max" 'BEGIN { exit !(t > m) }'; then
    echo "FAIL: took ${took} s, more than ${max} s"
    fail=1
  fi
}

none_left() { # no process of the job (its unique mark on the command line)
  if pgrep -f "$mark" >/dev/null; then
    echo "FAIL: processes of the job are left:"
    pgrep -af "$mark"
    pkill -KILL -f "$mark"
    fail=1
  else
    echo "ok: no process of the job is left"
  fi
}

hosts="--ssh $fake --hosts 127.0.0.2,127.0.0.3 -n 2 --timeout 60"
case $case_ in
  sum)
    run 0 30 --ssh "$fake" --hosts 127.0.0.2,127.0.0.3 -n 2 --timeout 60 -- "$prog" sum
    for r in 0 1; do check "rank $r on 127.0.0.2" "^\[$r\] rank $r/4 addr 127.0.0.2: all_sum ok$"; done
    for r in 2 3; do check "rank $r on 127.0.0.3" "^\[$r\] rank $r/4 addr 127.0.0.3: all_sum ok$"; done
    ;;
  verbose)
    run 0 30 --ssh "$fake" --hosts 127.0.0.2,127.0.0.3 --verbose --timeout 60 -- "$prog" sum
    check "the plan" "^\[launch\] starting 2 ranks of '.*' on 2 hosts; rendezvous at 127\.0\.0\.1:[0-9]+"
    check "host lines" "^\[launch\]   host 127\.0\.0\.3: rank 1\.\.1, over ssh, listening on 127\.0\.0\.3"
    check "rank and host prefix" "^\[1 127\.0\.0\.3\] rank 1/2 addr 127\.0\.0\.3: all_sum ok$"
    ;;
  typo)
    MLXDIST_TIMEUOT=5 run 0 30 --ssh "$fake" --hosts localhost,127.0.0.2,127.0.0.3 -n 2 \
      --env MLXDIST_NOPE_NOPE=1 --timeout 60 -- "$prog" sum
    for r in 0 1 2 3 4 5; do check "rank $r" "^\[$r\] rank $r/6 addr .*: all_sum ok$"; done
    check "the launcher tells the typo" "^\[launch\] warning: MLXDIST_TIMEUOT is not a variable mlxdist knows \(did you mean MLXDIST_TIMEOUT\?\); it is ignored \(told here once, not by every rank\)\.$"
    check "and the --env name" "^\[launch\] warning: MLXDIST_NOPE_NOPE is not a variable mlxdist knows \(no close name\)"
    n=$(grep -c "is not a variable" "$out")
    if [ "$n" -eq 2 ]; then echo "ok: 2 lines in all, none from the 6 ranks"; else echo "FAIL: $n lines about unknown names, expected 2"; fail=1; fi
    ;;
  kill)
    run 137 10 --ssh "$fake" --hosts 127.0.0.2,127.0.0.3 -n 2 --timeout 60 -- "$prog" die 2 "$mark"
    check "names rank and host" "^\[launch\] rank 2 on host 127\.0\.0\.3 was killed by signal 9"
    check "the summary" "^\[launch\] first failure: rank 2 \(127\.0\.0\.3\)"
    none_left
    ;;
  down)
    FAKE_SSH_DOWN=127.0.0.3 run 255 10 --ssh "$fake" --hosts 127.0.0.2,127.0.0.3 --timeout 60 \
      -- "$prog" hang "$mark"
    check "cannot reach" "^\[launch\] cannot reach host 127\.0\.0\.3 over ssh: ssh: connect to host 127\.0\.0\.3 port 22: Connection refused \(rank 1\)"
    none_left
    ;;
  gone)
    FAKE_SSH_GONE=127.0.0.3 run 137 10 --ssh "$fake" --hosts 127.0.0.2,127.0.0.3 -n 2 --timeout 60 \
      -- "$prog" die 0 "$mark"
    check "rank 0 named" "^\[launch\] rank 0 on host 127\.0\.0\.2 was killed by signal 9"
    check "the silent host's ssh ended" "^\[launch\] rank 2 on host 127\.0\.0\.3: its ssh is still there"
    none_left
    ;;
  missing)
    run 127 10 --ssh "$fake" --hosts 127.0.0.2,127.0.0.3 --timeout 60 -- "/nonexistent/$mark" x
    check "program not found" "^\[launch\] program not found on host 127\.0\.0\.[23] \(rank [01]\)"
    none_left
    ;;
  token)
    run 0 30 --ssh "$fake" --secret --hosts 127.0.0.2,127.0.0.3 -n 2 --timeout 60 -- "$prog" token
    for r in 0 1 2 3; do check "rank $r: not on a command line" "^\[$r\] token not on any command line \(nor the secret\)$"; done
    check_not "no command line" "is on the command line"
    for r in 0 1 2 3; do check "rank $r all_sum" "^\[$r\] rank $r/4 addr .*: all_sum ok$"; done
    ;;
  ifname)
    run 0 30 --ssh "$fake" --hosts 127.0.0.2,127.0.0.3 -n 2 --ifname lo --port-range 31000-31999 \
      --timeout 60 -- "$prog" sum
    for r in 0 1 2 3; do check "rank $r on lo's address" "^\[$r\] rank $r/4 addr -: all_sum ok$"; done
    ;;
  mixed)
    log=$(mktemp)
    FAKE_SSH_LOG=$log run 0 30 --ssh "$fake" --hosts localhost,127.0.0.2 -n 2 --timeout 60 -- "$prog" sum
    for r in 0 1; do check "rank $r local" "^\[$r\] rank $r/4 addr 127\.0\.0\.1: all_sum ok$"; done
    for r in 2 3; do check "rank $r over ssh" "^\[$r\] rank $r/4 addr 127\.0\.0\.2: all_sum ok$"; done
    n=$(grep -c . "$log")
    if [ "$n" -eq 2 ] && ! grep -q localhost "$log"; then echo "ok: ssh only for 127.0.0.2"; else echo "FAIL: ssh calls: $(cat "$log")"; fail=1; fi
    rm -f "$log"
    ;;
  start)
    FAKE_SSH_GONE=127.0.0.3 run nz 15 --ssh "$fake" --hosts 127.0.0.2,127.0.0.3 --connect-timeout 1 \
      --timeout 60 -- "$prog" sum
    check "the rendezvous names the missing rank" "^\[launch\] rank 1 \(host 127\.0\.0\.3\) did not reach the rendezvous within 3 s"
    # rank 0 fails its init (told by the launcher; exit 255) or the launcher stops the job
    # first, whichever it sees first; never an ssh failure
    check "the job stopped" "^\[launch\] (the rendezvous failed \(see above\); stopping the job|rank 0 on host 127\.0\.0\.2 exited with status 255)"
    check_not "rank 0's 255 not taken for ssh's" "cannot reach host"
    none_left
    ;;
  *)
    echo "unknown case $case_"
    exit 2
    ;;
esac
exit $fail
