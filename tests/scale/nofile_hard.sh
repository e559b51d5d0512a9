#!/bin/sh
# nofile_hard.sh LAUNCH: under a hard open-file limit of 200, mlxdist-launch -n 64 (about 320
# fds in the launcher) refuses to start, exit status 1, with a message naming the limit;
# nothing runs (the program would leave a file).
launch=$1
dir=$(mktemp -d) || exit 1
trap 'rm -rf "$dir"' EXIT
ulimit -n 200 || exit 1
"$launch" -n 64 -- sh -c "touch '$dir/ran'" >"$dir/out" 2>&1
rc=$?
cat "$dir/out"
[ "$rc" = 1 ] || { echo "FAIL: exit status $rc, expected 1"; exit 1; }
grep -q "hard limit RLIMIT_NOFILE is 200" "$dir/out" || { echo "FAIL: no message naming the limit"; exit 1; }
[ ! -e "$dir/ran" ] || { echo "FAIL: a rank ran"; exit 1; }
echo "refused as expected"
