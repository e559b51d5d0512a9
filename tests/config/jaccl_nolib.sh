#!/bin/sh
# jaccl on a machine without libibverbs: the same checks (test_jaccl_config init, mlxdist-info's
# test) with every libibverbs.so.1 on the loader's path hidden behind an empty file, in a mount
# namespace of this test's own (nothing outside it changes). Needs root and unshare: exit 77
# (skipped) otherwise.
#   usage: jaccl_nolib.sh TEST_JACCL_CONFIG TEST_INFO MLXDIST_INFO
set -eu
if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null 2>&1; then
  echo "skipped: needs root and unshare"
  exit 77
fi
if ! unshare -m true 2>/dev/null; then
  echo "skipped: unshare -m is not allowed here"
  exit 77
fi
# shellcheck disable=SC2016 # the script below expands its own variables
exec unshare -m sh -eu -c '
  hidden=0
  for f in $(ldconfig -p | sed -n "s/.*libibverbs\.so\.1 .*=> //p"); do
    mount --bind /dev/null "$(readlink -f "$f")"
    hidden=$((hidden + 1))
  done
  echo "hid $hidden libibverbs.so.1"
  out=$("$1" init) || { echo "$out"; echo "test_jaccl_config init failed"; exit 1; }
  echo "$out"
  case "$out" in
    *"libibverbs does not load here"*"init: OK"*) ;;
    *) echo "expected the no-library branch"; exit 1 ;;
  esac
  "$2" "$3"
' sh "$@"
