#!/bin/sh
# Compare mlxdist (ring backend) with Open MPI on this host, several times over.
#
#   scripts/bench-vs-openmpi.sh BUILD_DIR [RESULTS_DIR]
#
# The run behind docs/performance.md and the README (build first with
# cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build build -j):
#   BENCH_OPS=all_sum,all_gather BENCH_MAX_BYTES=64M BENCH_FACTOR=16 \
#     sh scripts/bench-vs-openmpi.sh build bench-results
# and for all_gather and sum_scatter (MPI_Allgather, MPI_Reduce_scatter_block; a row's size
# is the whole result of all_gather, the whole input of sum_scatter):
#   BENCH_OPS=all_sum,all_gather,sum_scatter BENCH_MAX_BYTES=64M BENCH_FACTOR=16 \
#     BENCH_MIN_TIME_MS=200 sh scripts/bench-vs-openmpi.sh build bench-results
# and point to point, 1 B to 64 MiB, shared memory and TCP (sendrecv: ping-pong latency,
# half the round trip, as osu_latency; sendrecv_bw: a window of 64 sends then an ack, as
# osu_bw, time per message; both between ranks 0 and 1):
#   BENCH_OPS=sendrecv,sendrecv_bw BENCH_RANKS=2 BENCH_DTYPE=uint8 BENCH_MIN_BYTES=1 \
#     BENCH_MAX_BYTES=64M BENCH_FACTOR=8 sh scripts/bench-vs-openmpi.sh build bench-results-p2p
# and all_to_all against MPI_Alltoall, 64 B to 64 MiB a rank (a row's size is a rank's
# whole input, n parts of size/n, as nccl-tests' alltoall; busbw = algbw x (n-1)/n):
#   BENCH_OPS=all_to_all BENCH_MIN_BYTES=64 BENCH_MAX_BYTES=64M BENCH_FACTOR=16 \
#     BENCH_MIN_TIME_MS=200 BENCH_REPEATS=3 sh scripts/bench-vs-openmpi.sh build bench-results-a2a
#
# Builds nothing: BUILD_DIR must hold tools/mlxdist-launch, tools/mlxdist-bench and
# tools/mpi_ref_bench. Each configuration (rank count x implementation) runs
# BENCH_REPEATS times, mlxdist and Open MPI interleaved (mlxdist, Open MPI, mlxdist,
# Open MPI ...; every other repeat in the reverse order) so that a slow phase of the
# machine hits both. RESULTS_DIR (default BUILD_DIR/bench-results; its runs/ is
# emptied first) receives:
#   conditions.txt   date, commit, CPU, memory, THP, glibc, the time to fault in a
#                    fresh 64 MiB buffer, Open MPI version, MCA options, the shm
#                    single-copy threshold and what chose it (mlxdist-info), load
#                    average before and after, the exact command
#   runs/<variant>-n<N>-r<K>.csv (+ .log)   one run's rows (--csv); variants:
#                    mlxdist-<transport> for every transport in BENCH_TRANSPORTS
#                    ("default": MLXDIST_TRANSPORT unset, i.e. shared memory on one
#                    host; "shm"; "tcp"), mpi-shm (btl self,vader), mpi-tcp (btl self,tcp)
#   runs/index.txt   when each run started, its load average and how long it took
#   summary.csv      per variant, op, ranks and size: runs, median/min/max time (us)
#                    and busbw (GB/s) over the repeats
#   comparison.txt   side-by-side table: median [min-max] of each side, the ratio of
#                    the medians (Open MPI / mlxdist: above 1 = mlxdist faster) with
#                    the range of the per-repeat ratios, and a flag where max/min of
#                    either side exceeds 2 (such a size is noise-dominated)
#   busbw-<op>-n<N>.png  busbw vs size from the medians, min-max error bars (gnuplot)
# How far two such directories agree (ratio of medians per row, the count within
# 25 %): scripts/bench-compare-runs.sh DIR_A DIR_B.
#
# Settings (environment):
#   BENCH_REPEATS     runs of every configuration       (default 5, at least 1)
#   BENCH_RANKS       rank counts                       (default "2 4")
#   BENCH_OPS         --op for both benchmarks          (default all)
#   BENCH_MIN_BYTES   smallest size                     (default 4)
#   BENCH_MAX_BYTES   largest size                      (default 4M)
#   BENCH_FACTOR      size factor                       (default 4)
#   BENCH_MIN_TIME_MS timed work per size, at least     (default 300): both benchmarks
#                     calibrate their iterations per batch from the warm-up so that
#                     the batches take this long together; 0: BENCH_ITERS exactly per batch
#   BENCH_BATCHES     timed batches per size; a row's figure is their median
#                     (default 5; more, up to BENCH_MAX_BATCHES, while the median
#                     is unsettled and the timed total is under 2 x BENCH_MIN_TIME_MS)
#   BENCH_MAX_BATCHES most batches per size             (default 3 x BENCH_BATCHES)
#   BENCH_ITERS       fewest timed iterations per batch (default 1)
#   BENCH_MAX_ITERS   most timed iterations per batch   (default 100000)
#   BENCH_WARMUP      untimed iterations per size (beyond the first only as many as
#                     fit in half of BENCH_MIN_TIME_MS); > 0 also runs one untimed
#                     pass over every op and size first (default 5)
#   BENCH_BIND        auto (default): every rank of both benchmarks pins itself and
#                     its threads to CPU (rank mod CPUs) when there are no more ranks
#                     than CPUs, and nobody pins otherwise; core: always; none: never.
#                     mpirun always gets --bind-to none (its own default binds 2
#                     ranks but not 4), so the benchmarks' pinning is the only one
#   BENCH_DTYPE       element type                      (default float32)
#   BENCH_TRANSPORTS  mlxdist transports                (default "default tcp")
#   BENCH_MPI_MCA     MCA options for every mpirun      (default "--mca pml ob1"; the
#                     btl is set per variant; "--mca mpi_yield_when_idle 1" is added
#                     when there are more ranks than CPUs)
#   BENCH_MPI_ENV     VAR=value ... exported to the Open MPI ranks (default none)
#   BENCH_MLX_ENV     VAR=value ... set in the mlxdist ranks (default none)
#   BENCH_TIMEOUT     seconds allowed per run           (default 600)
#   BENCH_CHECK       1: also verify results            (default 0)
set -u

if [ $# -lt 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  sed -n '2,/^set -u/p' "$0" | sed -e '/^set -u/d' -e 's/^# \{0,1\}//'
  [ $# -lt 1 ] && exit 2 || exit 0
fi

build=$1
results=${2:-$build/bench-results}
# the command as typed, with the BENCH_ settings that were in effect
cmdline="$(env | grep '^BENCH_' | sort | sed "s/=\(.*\)/='\1'/" | tr '\n' ' ')sh $0 $*"
here=$(cd "$(dirname "$0")" && pwd)
launch=$build/tools/mlxdist-launch
bench=$build/tools/mlxdist-bench
ref=$build/tools/mpi_ref_bench

repeats=${BENCH_REPEATS:-5}
ranks=${BENCH_RANKS:-"2 4"}
transports=${BENCH_TRANSPORTS:-"default tcp"}
mca=${BENCH_MPI_MCA:-"--mca pml ob1"}
mpi_env=${BENCH_MPI_ENV:-}
mlx_env=${BENCH_MLX_ENV:-}
bind=${BENCH_BIND:-auto}
min_time=${BENCH_MIN_TIME_MS:-300}
timeout_s=${BENCH_TIMEOUT:-600}
case $repeats in '' | *[!0-9]* | 0)
  echo "[bench] BENCH_REPEATS must be a whole number >= 1, got '$repeats'." >&2; exit 2 ;;
esac
case $bind in auto | core | none) ;;
  *) echo "[bench] BENCH_BIND must be auto, core or none, got '$bind'." >&2; exit 2 ;;
esac
for t in $transports; do
  case $t in default | shm | tcp) ;;
    *) echo "[bench] BENCH_TRANSPORTS: '$t' is not default, shm or tcp." >&2; exit 2 ;;
  esac
done
set -- --op "${BENCH_OPS:-all}" -b "${BENCH_MIN_BYTES:-4}" -e "${BENCH_MAX_BYTES:-4M}" \
  -f "${BENCH_FACTOR:-4}" --min-time "$min_time" --batches "${BENCH_BATCHES:-5}" \
  -n "${BENCH_ITERS:-1}" --max-iters "${BENCH_MAX_ITERS:-100000}" -w "${BENCH_WARMUP:-5}" \
  --dtype "${BENCH_DTYPE:-float32}" --csv
[ -n "${BENCH_MAX_BATCHES:-}" ] && set -- "$@" --max-batches "$BENCH_MAX_BATCHES"
[ "${BENCH_CHECK:-0}" = 1 ] && set -- "$@" --check

for f in "$launch" "$bench"; do
  if [ ! -x "$f" ]; then
    echo "[bench] '$f' is missing; build the tools first (cmake --build $build)." >&2
    exit 2
  fi
done
# refuse bad options before spending minutes on the runs
"$bench" "$@" --help > /dev/null || exit 2
have_mpi=1
if [ ! -x "$ref" ] || ! command -v mpirun > /dev/null 2>&1; then
  echo "[bench] '$ref' or mpirun is missing; running mlxdist only." >&2
  have_mpi=0
fi
mkdir -p "$results" || exit 1
rm -rf "$results/runs" && mkdir "$results/runs" || exit 1
rm -f "$results"/summary.csv "$results"/comparison.txt "$results"/busbw-*.png

cpus=$(nproc 2> /dev/null || getconf _NPROCESSORS_ONLN)
mpi_base="--oversubscribe"
[ "$(id -u)" = 0 ] && mpi_base="$mpi_base --allow-run-as-root"
mpi_base="$mpi_base --bind-to none"
for kv in $mpi_env; do mpi_base="$mpi_base -x $kv"; done
mlx_envopts=""
for kv in $mlx_env; do mlx_envopts="$mlx_envopts --env $kv"; done
# the Open MPI command line of variant $1 with $2 ranks
mpi_cmd() {
  if [ "$1" = mpi-tcp ]; then btl=self,tcp; else btl=self,vader; fi
  yield=""
  [ "$2" -gt "$cpus" ] && yield="--mca mpi_yield_when_idle 1"
  echo "mpirun -np $2 $mpi_base $mca --mca btl $btl $yield"
}
# the benchmark option that pins ranks, for $1 ranks (the same on both sides)
bind_opt() {
  case $bind in
    core) echo "--bind" ;;
    auto) [ "$1" -le "$cpus" ] && echo "--bind" ;;
  esac
}
# the order of one repeat: each mlxdist transport followed by its Open MPI peer
order=""
for t in $transports; do
  order="$order mlxdist-$t"
  if [ $have_mpi = 1 ]; then
    if [ "$t" = tcp ]; then m=mpi-tcp; else m=mpi-shm; fi
    case " $order " in *" $m "*) ;; *) order="$order $m" ;; esac
  fi
done
reverse=""
for v in $order; do reverse="$v $reverse"; done

# ---- conditions -------------------------------------------------------------------
cond=$results/conditions.txt
{
  echo "command:      $cmdline"
  echo "started:      $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  commit=$(git -C "$here/.." rev-parse HEAD 2> /dev/null || echo unknown)
  [ -n "$(git -C "$here/.." status --porcelain --untracked-files=no 2> /dev/null)" ] &&
    commit="$commit (with uncommitted changes)"
  echo "commit:       $commit"
  echo "host:         $(uname -srm)"
  echo "cpu:          $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | sort | uniq -c |
    sed 's/^ *\([0-9]*\) /\1 x /' | tr '\n' ' ')($cpus online)"
  echo "memory:       $(sed -n 's/^MemTotal: *//p' /proc/meminfo)"
  echo "THP:          enabled $(cat /sys/kernel/mm/transparent_hugepage/enabled 2> /dev/null)," \
    "defrag $(cat /sys/kernel/mm/transparent_hugepage/defrag 2> /dev/null)"
  echo "glibc:        $(getconf GNU_LIBC_VERSION 2> /dev/null)"
  echo "load before:  $(cat /proc/loadavg)"
  # what a fresh 64 MiB buffer costs to fault in: Open MPI's large all-reduce pays this
  # on every call here (see docs/performance.md), so it moves its 64 MiB figure most
  echo "64 MiB first touch: $(dd if=/dev/zero of=/dev/null bs=64M count=1 2>&1 |
    sed -n 's/.*copied, \([0-9.]*\) s.*/\1 s (dd bs=64M count=1)/p')"
  if [ $have_mpi = 1 ]; then
    echo "Open MPI:     $(mpirun --version 2> /dev/null | head -n 1)"
    for n in $ranks; do
      for m in mpi-shm mpi-tcp; do
        case " $order " in *" $m "*) echo "$m n=$n:    $(mpi_cmd $m "$n") $ref $* $(bind_opt "$n")" ;; esac
      done
    done
  fi
  for n in $ranks; do
    echo "mlxdist n=$n:  $launch -n $n --timeout $timeout_s$mlx_envopts" \
      "[--env MLXDIST_TRANSPORT=shm|tcp] -- $bench --backend ring $* $(bind_opt "$n")"
  done
  # what the shared-memory transport's single-copy threshold is here and what chose it
  # (MLXDIST_SHM_CMA_BYTES, with BENCH_MLX_ENV's settings as the ranks get them; else this
  # boot's calibration, which this run of mlxdist-info makes or reads: the ranks read the same)
  # shellcheck disable=SC2086
  echo "shm single copy: $(env $mlx_env "$build/tools/mlxdist-info" 2> /dev/null |
    sed -n 's/^shm single copy: //p' | grep . || echo "unknown (mlxdist-info failed)")"
  echo "environment:  $(env | grep -E '^(OMPI_|MLXDIST_|MLX_|GLIBC_TUNABLES|MALLOC_)' | sort |
    tr '\n' ' ')"
  echo "repeats:      $repeats, order per repeat:$order (every other repeat reversed)"
  echo "measurement:  per size >= ${min_time} ms of timed batches, figure = median over the" \
    "batches of the slowest rank's time per op; pinning: BENCH_BIND=$bind"
} > "$cond"
cat "$cond" >&2
# a busy machine makes the figures noise (and hurts the two sides differently:
# Open MPI busy-polls, mlxdist spins then blocks), so say so where it is read
load1=$(cut -d' ' -f1 /proc/loadavg)
if awk -v l="$load1" -v c="$cpus" 'BEGIN { exit !(l > c / 2) }'; then
  echo "WARNING:      load average $load1 on $cpus CPUs before the run; not a publication run" |
    tee -a "$cond" >&2
fi

# ---- how long it will take ----------------------------------------------------------
# on an idle machine: a row takes its timed work (min-time, up to twice that where
# the batches disagree) plus warm-up and calibration, about 1.5 x min-time; a run
# adds ~3 s (start-up, the warm-up pass); an Open MPI all-reduce row from 32 MiB
# adds ~2.5 s (8 ops of 0.3 s: its per-call page faults on this project's VM)
sizes=$(awk -v b="${BENCH_MIN_BYTES:-4}" -v e="${BENCH_MAX_BYTES:-4M}" -v f="${BENCH_FACTOR:-4}" '
  function bytes(s, m) { m = 1; if (s ~ /[kK]/) m = 1024; if (s ~ /[mM]/) m = 1048576
    if (s ~ /[gG]/) m = 1073741824; return (s + 0) * m }
  BEGIN { n = 0; big = 0
    for (x = bytes(b); x <= bytes(e); x = (x * f > x + 1) ? x * f : x + 1) { n++; if (x >= 33554432) big++ }
    print n, big }')
nops=$(echo "${BENCH_OPS:-all}" | awk -F, '{ n = 0; for (i = 1; i <= NF; i++) n += ($i == "all") ? 7 : 1; print n }')
nred=$(echo "${BENCH_OPS:-all}" | awk -F, '{ n = 0; for (i = 1; i <= NF; i++)
  n += ($i == "all") ? 3 : ($i ~ /^(all_sum|all_max|sum_scatter)$/); print n }')
rows=$((${sizes% *} * nops))
nranks=$(echo "$ranks" | wc -w)
nruns=$((repeats * $(echo "$order" | wc -w) * nranks))
nmpi=$((repeats * $(echo "$order" | tr ' ' '\n' | grep -c '^mpi-') * nranks))
est_s=$(awk -v r="$nruns" -v rows="$rows" -v t="$min_time" -v m="$nmpi" -v big="$((${sizes#* } * nred))" \
  'BEGIN { printf "%d", r * (rows * 1.5 * t / 1000 + 3) + m * big * 2.5 }')
echo "estimate:     about $est_s s on an idle machine ($nruns runs of $rows rows," \
  "~1.5 x ${min_time} ms a row); more under load" | tee -a "$cond" >&2

# ---- the runs ---------------------------------------------------------------------
status=0
start=$(date +%s)
r=1
while [ "$r" -le "$repeats" ]; do
  if [ $((r % 2)) = 1 ]; then variants=$order; else variants=$reverse; fi
  for n in $ranks; do
    for v in $variants; do
      base=$results/runs/$v-n$n-r$r
      echo "== repeat $r/$repeats, $n ranks, $v -> $base.csv" >&2
      t0=$(date +%s)
      load=$(cut -d' ' -f1-3 /proc/loadavg)
      case $v in
        mlxdist-*)
          t=${v#mlxdist-}
          if [ "$t" = default ]; then envopt=""; else envopt="--env MLXDIST_TRANSPORT=$t"; fi
          # shellcheck disable=SC2086,SC2046
          "$launch" -n "$n" --timeout "$timeout_s" $mlx_envopts $envopt -- "$bench" \
            --backend ring "$@" $(bind_opt "$n") > "$base.raw" 2> "$base.log"
          rc=$?
          # only rank 0 prints; drop the launcher's "[0] " prefix
          sed -n 's/^\[0\] //p' "$base.raw" > "$base.csv"
          rm -f "$base.raw"
          ;;
        *)
          # shellcheck disable=SC2046
          timeout "$timeout_s" $(mpi_cmd "$v" "$n") "$ref" "$@" $(bind_opt "$n") \
            > "$base.csv" 2> "$base.log"
          rc=$?
          ;;
      esac
      echo "$v n=$n r=$r started $(date -u -d "@$t0" '+%H:%M:%S') load $load took" \
        "$(($(date +%s) - t0)) s exit $rc" >> "$results/runs/index.txt"
      if [ $rc != 0 ]; then
        echo "[bench] $v ($n ranks, repeat $r) failed (exit $rc); see $base.log" >&2
        status=1
      fi
    done
  done
  if [ "$r" = 1 ] && [ "$repeats" -gt 1 ]; then
    took=$(($(date +%s) - start))
    echo "[bench] repeat 1 took $took s; about $((took * (repeats - 1))) s to go" >&2
  fi
  r=$((r + 1))
done
{
  echo "finished:     $(date -u '+%Y-%m-%d %H:%M:%S UTC') ($(($(date +%s) - start)) s)"
  echo "load after:   $(cat /proc/loadavg)"
} >> "$cond"

# ---- statistics over the repeats ---------------------------------------------------
# run CSV columns: impl,op,ranks,size,count,dtype,time_us,algbw_gbps,busbw_gbps,cpu_us,check
(
  cd "$results/runs" || exit 1
  # shellcheck disable=SC2012
  files=$(ls ./*.csv 2> /dev/null)
  [ -n "$files" ] || exit 0
  # shellcheck disable=SC2086
  awk -F, '
    FNR == 1 { v = FILENAME; sub(/^.*\//, "", v); rep = v; sub(/-n[0-9]+-r[0-9]+\.csv$/, "", v)
               sub(/^.*-r/, "", rep); sub(/\.csv$/, "", rep) }
    $4 ~ /^[0-9]+$/ {
      k = v SUBSEP $2 SUBSEP $3 SUBSEP $4
      if (!(k in cnt)) keys[++nk] = k
      c = ++cnt[k]; t[k, c] = $7; bw[k, c] = $9
      print v, $2, $3, $4, rep, $7 > "per-repeat.txt"
    }
    function stat(a, k, n, i, j, x, s) {
      for (i = 1; i <= n; i++) s[i] = a[k, i] + 0
      for (i = 2; i <= n; i++) { x = s[i]; for (j = i - 1; j >= 1 && s[j] > x; j--) s[j + 1] = s[j]; s[j + 1] = x }
      return sprintf("%.3f,%.3f,%.3f", (n % 2) ? s[(n + 1) / 2] : (s[n / 2] + s[n / 2 + 1]) / 2, s[1], s[n])
    }
    END {
      print "variant,op,ranks,size,runs,time_med_us,time_min_us,time_max_us,busbw_med,busbw_min,busbw_max"
      for (i = 1; i <= nk; i++) {
        k = keys[i]; split(k, p, SUBSEP)
        print p[1] "," p[2] "," p[3] "," p[4] "," cnt[k] "," stat(t, k, cnt[k]) "," stat(bw, k, cnt[k])
      }
    }' $files
) > "$results/summary.csv"

# ---- side-by-side table -------------------------------------------------------------
awk -F, -v order="$order" -v repeats="$repeats" '
  FNR == 1 { file++ }
  file == 1 && FNR > 1 {
    k = $1 SUBSEP $3 SUBSEP $2 SUBSEP $4
    if (!(($3 SUBSEP $2 SUBSEP $4) in sk)) { sk[$3 SUBSEP $2 SUBSEP $4] = 1; sizes[++ns] = $3 SUBSEP $2 SUBSEP $4 }
    runs[k] = $5; med[k] = $6; lo[k] = $7; hi[k] = $8
  }
  file == 2 { split($0, f, " "); pr[f[1], f[3], f[2], f[4], f[5]] = f[6] }
  function cell(k) {
    return (k in med) ? sprintf("%10.2f [%.2f-%.2f]", med[k], lo[k], hi[k]) : sprintf("%10s", "-")
  }
  function wide(k) { return (k in med) && lo[k] > 0 && hi[k] / lo[k] > 2 }
  END {
    nv = split(order, vs, " ")
    for (i = 1; i <= nv; i++) {
      if (vs[i] !~ /^mlxdist-/) continue
      a = vs[i]; b = (a == "mlxdist-tcp") ? "mpi-tcp" : "mpi-shm"
      printf "== %s vs %s: time per op in us, median [min-max] of %d runs\n", a, b, repeats
      printf "%-5s %-11s %10s  %-32s %-32s %7s %-13s %s\n", "ranks", "op", "size(B)", a, b,
        "mpi/mlx", "(per-repeat)", "flag"
      last = ""
      for (j = 1; j <= ns; j++) {
        split(sizes[j], p, SUBSEP)
        ka = a SUBSEP sizes[j]; kb = b SUBSEP sizes[j]
        if (!(ka in med)) continue
        if (last != "" && p[1] SUBSEP p[2] != last) print ""
        last = p[1] SUBSEP p[2]
        ratio = "-"; range = ""
        if ((kb in med) && med[ka] > 0) {
          ratio = sprintf("%.3g", med[kb] / med[ka]); rmin = 1e300; rmax = 0
          for (r = 1; r <= repeats; r++) {
            x = pr[a, p[1], p[2], p[3], r]; y = pr[b, p[1], p[2], p[3], r]
            if (x == "" || y == "" || x + 0 == 0) continue
            q = y / x; if (q < rmin) rmin = q; if (q > rmax) rmax = q
          }
          if (rmax > 0) range = sprintf("(%.3g-%.3g)", rmin, rmax)
        }
        flag = ""
        if (wide(ka)) flag = flag " mlxdist-spread>2x"
        if (wide(kb)) flag = flag " mpi-spread>2x"
        if (runs[ka] < repeats || ((kb in med) && runs[kb] < repeats)) flag = flag " missing-runs"
        printf "%-5s %-11s %10s  %-32s %-32s %7s %-13s%s\n", p[1], p[2], p[3], cell(ka), cell(kb),
          ratio, range, flag
      }
      print ""
    }
    print "mpi/mlx = Open MPI median / mlxdist median: above 1, mlxdist is faster; in brackets"
    print "the lowest and highest ratio of runs made back to back in the same repeat."
    print "flag: max/min over the runs above 2 on that side (noise-dominated; do not quote)."
  }' "$results/summary.csv" "$results/runs/per-repeat.txt" > "$results/comparison.txt"
cat "$results/conditions.txt" "$results/comparison.txt"

# ---- plots ----------------------------------------------------------------------
if command -v gnuplot > /dev/null 2>&1; then
  for n in $ranks; do
    awk -F, -v n="$n" 'FNR > 1 && $3 == n { print $2 }' "$results/summary.csv" | sort -u |
      while read -r op; do
        png=$results/busbw-$op-n$n.png
        if gnuplot -e "summary='$results/summary.csv'; n=$n; op='$op'; out='$png';" \
          -e "variants='$order'; runs=$repeats" "$here/plot.gp" 2> "$results/gnuplot.log"; then
          echo "plot: $png" >&2
        else
          echo "[bench] gnuplot failed for $op, $n ranks; see $results/gnuplot.log" >&2
        fi
      done
  done
else
  echo "[bench] gnuplot not found; no plots." >&2
fi
echo "done in $(($(date +%s) - start)) s; results in $results" >&2
exit $status
