#!/bin/sh
# A stand-in for the ssh client in test_launch_hosts.sh, so that a job
# "across hosts" runs on one machine: it skips ssh's options, takes the host
# and runs the remote command with sh -c in a session of its own (apart from
# the client, as sshd would), its stdin the client's stdin, and exits with
# its status. Everything else is real: the launcher, the remote script, the
# rendezvous, the ranks and their sockets. The real ssh is exercised by
# tests/multihost.
#   FAKE_SSH_DOWN="h1 h2"   those hosts refuse (ssh's message, exit 255)
#   FAKE_SSH_GONE="h3"      those hosts never answer (no output, no exit)
#   FAKE_SSH_LOG=FILE       each call's arguments are appended to FILE
while [ $# -gt 0 ]; do
  case $1 in
    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host=$1
shift
[ -n "${FAKE_SSH_LOG:-}" ] && printf '%s\n' "$host $*" >>"$FAKE_SSH_LOG"
case " ${FAKE_SSH_DOWN:-} " in
  *" $host "*)
    echo "ssh: connect to host $host port 22: Connection refused" >&2
    exit 255
    ;;
esac
case " ${FAKE_SSH_GONE:-} " in
  *" $host "*) exec sleep 300 ;;
esac
exec 3<&0
setsid sh -c "$*" <&3 3<&- &
exec 3<&-
wait $!
