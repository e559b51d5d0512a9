# shellcheck shell=bash
# Sourced by the chaos tests that run two ranks over TCP on the loopback of a private network
# namespace (slow_close.sh, link_drop.sh); the caller defines say() first.
#   private_ns PREFIX    removes the namespaces PREFIX-<pid> of earlier runs that were killed
#                        before their trap ran, then makes PREFIX-$$ (in $ns) and a temporary
#                        directory (in $dir), both removed at exit; exits 77 when no namespace
#                        can be made here
#   start_ranks PROGRAM ARG TIMEOUT   two ranks of PROGRAM ARG in $ns, with the hostfile
#                        $dir/hf.json and MLXDIST_TIMEOUT=TIMEOUT; their pids in pids[],
#                        their output in $dir/rankR.log
#   wait_ranks           waits for both; prints each exit status and log tail; returns 1
#                        when either failed
private_ns() {
  local prefix=$1 f owner p err
  for f in /run/netns/"$prefix"-*; do
    [ -e "$f" ] || continue
    owner=${f##*/"$prefix"-}
    case $owner in '' | *[!0-9]*) continue ;; esac
    kill -0 "$owner" 2>/dev/null && continue
    for p in $(ip netns pids "${f##*/}" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    ip netns del "${f##*/}" 2>/dev/null
  done
  ns=$prefix-$$
  dir=$(mktemp -d) || exit 1
  trap private_ns_cleanup EXIT
  if ! err=$(ip netns add "$ns" 2>&1); then
    say "SKIPPED: cannot create a network namespace: $err"
    exit 77
  fi
}

private_ns_cleanup() {
  local p
  for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  ip netns del "$ns" 2>/dev/null
  rm -rf "$dir"
}

start_ranks() {
  local r
  pids=()
  for r in 0 1; do
    ip netns exec "$ns" env MLX_RANK=$r MLX_HOSTFILE="$dir/hf.json" MLXDIST_TRANSPORT=tcp \
      MLXDIST_TIMEOUT="$3" timeout 120 "$1" "$2" >"$dir/rank$r.log" 2>&1 &
    pids+=($!)
  done
}

wait_ranks() {
  local r st rc=0
  for r in 0 1; do
    wait "${pids[r]}"
    st=$?
    say "rank $r exit status $st: $(tail -n 3 "$dir/rank$r.log" | tr '\n' ' ')"
    [ "$st" = 0 ] || rc=1
  done
  return "$rc"
}
