#!/usr/bin/env bash
# Build the libFuzzer targets (clang, ASan+UBSan) and run each for a while.
#   usage: scripts/fuzz.sh [seconds-per-target] [target...]
# Default 60 s per target; no target names: all of them. Seeds come from
# tests/fuzz/corpus/<name>/ (read only); new inputs go to $FUZZ_WORK/<name>/
# (default build-fuzz/work). A crash stops the script with exit 1 and leaves the
# input in $FUZZ_WORK/<name>/crash-*: fix it, then add the input to the corpus.
# Environment: FUZZ_BUILD (build dir, default build-fuzz), FUZZ_WORK.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
secs=${1:-60}
shift || true
case $secs in
  '' | *[!0-9]*) echo "scripts/fuzz.sh: seconds must be a whole number, got '$secs'" >&2; exit 2 ;;
esac
build=${FUZZ_BUILD:-$root/build-fuzz}
work=${FUZZ_WORK:-$build/work}
command -v clang >/dev/null || { echo "scripts/fuzz.sh: needs clang (scripts/setup-debian.sh)" >&2; exit 2; }
CC=clang cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Debug -DMLXDIST_FUZZ=ON \
  -DMLXDIST_BUILD_TESTS=OFF -DMLXDIST_BUILD_TOOLS=OFF -DMLXDIST_BUILD_EXAMPLES=OFF \
  -DMLXDIST_WITH_MPI=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" >/dev/null
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for d in "$root"/tests/fuzz/corpus/*/; do targets+=("$(basename "$d")"); done
fi
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
for t in "${targets[@]}"; do
  exe="$build/tests/fuzz/fuzz_$t"
  [ -x "$exe" ] || { echo "scripts/fuzz.sh: no fuzz target '$t' ($exe)" >&2; exit 2; }
  mkdir -p "$work/$t"
  echo "== fuzz_$t: $secs s =="
  # -max_len: every parser here takes small inputs; 64 KiB also reaches the size limits' edges.
  if ! "$exe" -max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$work/$t/" "$work/$t" \
      "$root/tests/fuzz/corpus/$t" 2>"$work/$t.log"; then
    tail -40 "$work/$t.log" >&2
    echo "scripts/fuzz.sh: fuzz_$t found a crash; the input is in $work/$t/" >&2
    exit 1
  fi
  grep -E '^stat::number_of_executed_units|^Done [0-9]+ runs' "$work/$t.log" | tail -2
done
echo "== fuzzing: no crash =="
