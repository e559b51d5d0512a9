#!/usr/bin/env bash
# The scale measurement (issue 25, item 5; docs/scale.md): scale_rank (tests/scale) under
# mlxdist-launch -n N on this host, for each N given (default 64 256 1024) and each transport
# (SCALE_TRANSPORTS, default "default tcp": MLXDIST_TRANSPORT unset, then =tcp). Prints one
# markdown table row per run: the whole job's wall time (launcher start to exit), pass/fail
# (exit status 0 and N checked "ok" lines), and max / median over the ranks of the per-rank
# numbers scale_rank reports (phase times, fds, threads, RSS, TCP connections, /dev/shm mapped),
# and the job's /dev/shm use sampled by rank 0 while every rank waits in a barrier.
#
#   scripts/scale.sh [N...]
#     BUILD=build             where mlxdist-launch and tests/scale/scale_rank are
#     SCALE_TRANSPORTS="default tcp"
#     SCALE_REPEAT=1          runs per (N, transport)
#     SCALE_TIMEOUT=300       the launcher's --timeout per run, seconds
#     SCALE_ENV="K=V ..."     more variables for the ranks (--env each), e.g. MLXDIST_SPIN_US=0
#                             for CPU times without spinning (the cost model's runs)
#     SCALE_LOGS=DIR          keep every run's output there (default: a temporary directory,
#                             kept when a run fails; its path is printed)
#     SCALE_LOCK=/tmp/big.lock  runs of >= 64 ranks take this lock (flock), so that two big
#                             jobs on a shared machine never overlap; empty: no lock
# Exit status: 0 when every run passed, 1 otherwise.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
launch=$build/tools/mlxdist-launch
rankp=$build/tests/scale/scale_rank
[ -x "$launch" ] || launch=$(find "$build" -name mlxdist-launch -type f -perm -u+x | head -1)
for f in "$launch" "$rankp"; do
  [ -n "$f" ] && [ -x "$f" ] || { echo "scale.sh: no $f (build first: cmake --build $build)" >&2; exit 2; }
done
sizes=${*:-64 256 1024}
transports=${SCALE_TRANSPORTS:-default tcp}
repeat=${SCALE_REPEAT:-1}
timeout=${SCALE_TIMEOUT:-300}
lock=${SCALE_LOCK-/tmp/big.lock}
logs=${SCALE_LOGS:-}
keep=1
if [ -z "$logs" ]; then logs=$(mktemp -d /tmp/mlxdist-scale.XXXXXX); keep=0; fi
mkdir -p "$logs"

echo "# scale_rank under mlxdist-launch on $(hostname): $(nproc) cores, $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo '?'), $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "# per rank: max/median; times in ms (wall; CPU: the rank's user+system); faults: minor page faults (in init; from start); rss, shm in KiB; shm job = /dev/shm used during the barrier"
echo "| N | transport | result | wall s | init ms | all_sum ms | all_gather ms | ring ms | fds | threads | RSS KiB | TCP conns | shm mapped KiB | shm job KiB | TCP kernel mem KiB | init CPU ms | all_sum CPU ms | init faults | faults |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"

# max/median of field $1 over the "scale rank" lines of file $2
stat() {
  awk -v k="$1" '/scale rank [0-9]+ n [0-9]+ .* ok$/ {
      for (i = 1; i < NF; i++) if ($i == k) print $(i + 1) + 0 }' "$2" | sort -g |
    awk '{ v[++n] = $1 }
      END {
        if (n == 0) { print "-"; exit }
        med = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
        fmt = (v[n] == int(v[n]) && med == int(med)) ? "%d / %d" : "%.1f / %.1f"
        printf fmt "\n", v[n], med }'
}
job() { awk -v k="$1" '/scale job n / { for (i = 1; i < NF; i++) if ($i == k) print $(i + 1) }' "$2" | tail -1; }

all_ok=0
for n in $sizes; do
  for tr in $transports; do
    for rep in $(seq 1 "$repeat"); do
      log=$logs/n$n-$tr-$rep.log
      env=()
      [ "$tr" = default ] || env=(--env "MLXDIST_TRANSPORT=$tr")
      for kv in ${SCALE_ENV:-}; do env+=(--env "$kv"); done
      cmd=("$launch" -n "$n" --timeout "$timeout" "${env[@]}" -- "$rankp")
      lk=()
      if [ -n "$lock" ] && [ "$n" -ge 64 ]; then lk=(flock "$lock"); fi
      # the wall time starts once the lock is held: launcher start to its exit
      LOG=$log "${lk[@]}" env -u MLXDIST_TRANSPORT bash -c '
        t0=$(date +%s%N); export SCALE_T0_NS=$t0
        "$@" >"$LOG" 2>&1; rc=$?
        echo "scale wall_ns $(( $(date +%s%N) - t0 )) rc $rc" >>"$LOG"' _ "${cmd[@]}"
      wall_ns=$(awk '/^scale wall_ns/ {print $3}' "$log")
      rc=$(awk '/^scale wall_ns/ {print $5}' "$log")
      oks=$(grep -cE 'scale rank [0-9]+ n [0-9]+ .* ok$' "$log")
      if [ "$rc" = 0 ] && [ "$oks" = "$n" ]; then
        res=pass
      else
        res="FAIL (exit $rc, $oks/$n ok)"
        all_ok=1
        keep=1
      fi
      wall=$(awk -v w="$wall_ns" 'BEGIN { printf "%.2f", w / 1e9 }')
      echo "| $n | $tr | $res | $wall | $(stat init_ms "$log") | $(stat sum_ms "$log") | $(stat gather_ms "$log") | $(stat ring_ms "$log") | $(stat fds "$log") | $(stat threads "$log") | $(stat rss_kb "$log") | $(stat tcp "$log") | $(stat shm_map_kb "$log") | $(job shm_used_kb "$log") | $(job tcp_mem_kb "$log") | $(stat init_cpu_ms "$log") | $(stat sum_cpu_ms "$log") | $(stat init_flt "$log") | $(stat flt "$log") |"
      if [ "$res" != pass ]; then
        grep -m3 -E '^\[launch\]|FAILED' "$log" | sed 's/^/#   /'
      fi
    done
  done
done
if [ "$keep" = 1 ]; then echo "# logs: $logs"; else rm -rf "$logs"; fi
exit $all_ok
