#!/bin/sh
# launch_n.sh N SOFT LAUNCH RANK: N ranks of scale_rank under mlxdist-launch, started with
# the soft RLIMIT_NOFILE lowered to SOFT (the hard limit as it is); passes when the launcher
# exits 0 and all N ranks printed their checked "ok" line. Bounded: --timeout 50.
n=$1 soft=$2 launch=$3 rank=$4
out=$(mktemp) || exit 1
trap 'rm -f "$out"' EXIT
hard=$(ulimit -Hn)
if [ "$hard" != unlimited ] && [ "$hard" -lt $((4 * n + 64)) ]; then
  echo "SKIP: the hard open-file limit ($hard) is below what $n ranks need"
  exit 77
fi
ulimit -Sn "$soft" || exit 1
start=$(date +%s)
"$launch" -n "$n" --timeout 50 -- "$rank" >"$out" 2>&1
rc=$?
took=$(($(date +%s) - start))
ok=$(grep -cE "^\[[0-9]+\] scale rank [0-9]+ n $n .* ok$" "$out")
echo "exit $rc, $ok of $n ranks ok, ${took} s (soft open-file limit $soft)"
if [ "$rc" != 0 ] || [ "$ok" != "$n" ]; then
  grep -v ' ok$' "$out" | head -20
  exit 1
fi
grep -E "scale job" "$out"
