#!/bin/sh
# The count table of issue 39, item 1: counts that do not change with the machine's
# speed, per op, for mlxdist (ring backend) and Open MPI on this host.
#
#   scripts/count-table.sh BUILD_DIR OUTDIR
#
# Part 1 (account): mlxdist-bench --account and mpi_ref_bench --account, ops all_sum,
# all_gather, sum_scatter, sendrecv and all_to_all on 2 ranks (all_sum and all_gather
# also on 4), shared memory and TCP, sizes 4 B to 64 MiB x16 (uint8, so that every op
# has a 4-byte row): per op minor and major page faults, context switches and system
# calls, rank 0's and the maximum over the ranks. System calls need tracefs: as root
# without it, the script runs itself again in a private mount namespace
# (unshare -m) with tracefs mounted there; elsewhere they print n/a.
# Part 2 (callgrind): rank 0 of each side under valgrind --tool=callgrind (the other
# ranks native), sizes 4 B to 16 KiB, 1000 and 3000 ops of each row in one batch
# (each COUNT_CG_REPEATS times, the fewest taken);
# instructions per op = (Ir(3000) - Ir(1000)) / 2000 of mlxd_bench_measure inclusive
# (tools/bench/bench_measure.c, shared by both benchmarks: it includes the waiting
# loop, so a rank that waits longer counts more). One dump per row (--dump-after).
#
# Writes OUTDIR/account.csv, OUTDIR/callgrind.csv, OUTDIR/table.md, OUTDIR/conditions.txt
# and OUTDIR/runs/ (each run's output and log). About 4 minutes on the project's
# 2-vCPU VM (part 1 ~1 min, part 2 ~3 min: 24 callgrind runs).
#
# Environment: COUNT_PARTS (default "account callgrind"), COUNT_RANKS4 (1: also the
# 4-rank rows, default 1), COUNT_MIN_TIME_MS (timed work per row, default 100),
# COUNT_CG_REPEATS (callgrind runs of each op count, default 3: per row the fewest
# instructions, as waiting on a preempted peer only adds), COUNT_TIMEOUT (seconds per
# run, default 600).
set -u

if [ $# -ne 2 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  sed -n '2,/^set -u/p' "$0" | sed -e '/^set -u/d' -e 's/^# \{0,1\}//'
  [ $# -ne 2 ] && exit 2 || exit 0
fi
build=$1
out=$2

# system calls: tracefs in a private mount namespace (root only; nothing outside changes)
tp=/sys/kernel/tracing/events/raw_syscalls/sys_enter/id
if [ ! -e "$tp" ] && [ ! -e /sys/kernel/debug/tracing/events/raw_syscalls/sys_enter/id ] &&
  [ -z "${COUNT_TABLE_NS:-}" ] && [ "$(id -u)" = 0 ] && command -v unshare > /dev/null; then
  # shellcheck disable=SC2016
  exec env COUNT_TABLE_NS=1 unshare -m sh -c \
    'mount -t tracefs nodev /sys/kernel/tracing && exec sh "$0" "$@"' "$0" "$@"
fi

parts=${COUNT_PARTS:-account callgrind}
min_time=${COUNT_MIN_TIME_MS:-100}
timeout_s=${COUNT_TIMEOUT:-600}
cg_reps=${COUNT_CG_REPEATS:-3}
launch=$build/tools/mlxdist-launch
bench=$build/tools/mlxdist-bench
ref=$build/tools/mpi_ref_bench
ops2=all_sum,all_gather,sum_scatter,sendrecv,all_to_all
ops4=all_sum,all_gather
for f in "$launch" "$bench"; do
  [ -x "$f" ] || { echo "[count] '$f' is missing; build the tools first." >&2; exit 2; }
done
have_mpi=1
if [ ! -x "$ref" ] || ! command -v mpirun > /dev/null 2>&1; then
  echo "[count] '$ref' or mpirun is missing: the Open MPI columns are n/a." >&2
  have_mpi=0
fi
# both benchmarks take the same --op names (tools/bench/bench_common.c); say so if not
for op in $(echo "$ops2" | tr , ' '); do
  "$bench" --op "$op" --help > /dev/null 2>&1 || echo "[count] mlxdist-bench lacks --op $op" >&2
  [ $have_mpi = 1 ] && ! "$ref" --op "$op" --help > /dev/null 2>&1 &&
    echo "[count] mpi_ref_bench lacks --op $op" >&2
done
mkdir -p "$out/runs" || exit 1
rm -f "$out"/runs/* "$out"/account.csv "$out"/callgrind.csv "$out"/table.md

cpus=$(nproc 2> /dev/null || getconf _NPROCESSORS_ONLN)
mpi_base="--oversubscribe --bind-to none --mca pml ob1"
[ "$(id -u)" = 0 ] && mpi_base="--allow-run-as-root $mpi_base"
# pin as scripts/bench-vs-openmpi.sh does by default: when ranks <= CPUs
bind_opt() { [ "$1" -le "$cpus" ] && echo "--bind"; }
mpi_cmd() { # transport, ranks
  if [ "$1" = tcp ]; then btl=self,tcp; else btl=self,vader; fi
  y=""
  [ "$2" -gt "$cpus" ] && y="--mca mpi_yield_when_idle 1"
  echo "mpirun -np $2 $mpi_base --mca btl $btl $y"
}
# run one side: impl transport ranks name [wrapper...] -- bench args; rank 0's CSV
# (stdout) to runs/NAME.csv, everything else to runs/NAME.log
run_side() {
  impl=$1 t=$2 n=$3 name=$4
  shift 4
  wrap=""
  while [ "$1" != -- ]; do wrap="$wrap $1"; shift; done
  shift
  f=$out/runs/$name
  t0=$(date +%s)
  if [ "$impl" = mlxdist ]; then
    # shellcheck disable=SC2086
    timeout "$timeout_s" "$launch" -n "$n" --timeout "$timeout_s" --env MLXDIST_TRANSPORT="$t" \
      -- $wrap "$bench" --backend ring "$@" > "$f.raw" 2> "$f.log"
    rc=$?
    # rank 0's lines, the launcher's "[0] " taken off: the CSV and any valgrind notes
    sed -n 's/^\[0\] //p' "$f.raw" | grep '^[a-zA-Z][a-zA-Z_-]*,' > "$f.csv"
    mv "$f.raw" "$f.stdout"
  else
    # shellcheck disable=SC2086,SC2046
    timeout "$timeout_s" $(mpi_cmd "$t" "$n") $wrap "$ref" "$@" > "$f.csv" 2> "$f.log"
    rc=$?
  fi
  echo "$name: $(($(date +%s) - t0)) s, exit $rc" >> "$out/runs/index.txt"
  [ $rc = 0 ] || echo "[count] $name failed (exit $rc); see $f.log" >&2
}

start=$(date +%s)
{
  echo "started:  $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "commit:   $(git -C "$(dirname "$0")/.." rev-parse --short HEAD 2> /dev/null)"
  echo "cpu:      $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | sort -u) ($cpus online)"
  echo "kernel:   $(uname -sr)"
  echo "Open MPI: $(mpirun --version 2> /dev/null | head -n 1)"
  echo "shm single copy (mlxdist): $("$build/tools/mlxdist-info" 2> /dev/null |
    sed -n 's/^shm single copy: //p')"
  echo "syscalls: $([ -e "$tp" ] && echo "tracefs mounted" || echo "no tracefs: n/a")"
  echo "load before: $(cat /proc/loadavg)"
} > "$out/conditions.txt"

# ---- part 1: --account -------------------------------------------------------------
if echo "$parts" | grep -qw account; then
  {
    printf 'impl,transport,op,ranks,size,count,dtype,time_us,algbw_gbps,busbw_gbps,cpu_us,check,'
    printf 'iters,batches,batch_min_us,batch_max_us,minflt_r0,minflt_max,majflt_r0,majflt_max,'
    echo 'csw_r0,csw_max,instr_r0,instr_max,syscalls_r0,syscalls_max'
  } > "$out/account.csv"
  ranks="2"
  [ "${COUNT_RANKS4:-1}" = 1 ] && ranks="2 4"
  for n in $ranks; do
    if [ "$n" = 2 ]; then ops=$ops2; else ops=$ops4; fi
    for t in shm tcp; do
      for impl in mlxdist mpi; do
        [ "$impl" = mpi ] && [ $have_mpi = 0 ] && continue
        name=acct-$impl-$t-n$n
        echo "[count] $name" >&2
        # shellcheck disable=SC2046
        run_side "$impl" "$t" "$n" "$name" -- --op "$ops" --dtype uint8 -b 4 -e 64M -f 16 \
          -t "$min_time" --batches 3 --max-batches 3 -w 2 --account --csv $(bind_opt "$n")
        grep -v '^impl,' "$out/runs/$name.csv" | grep ',' | cut -d, -f2- |
          sed "s/^/$impl,$t,/" >> "$out/account.csv"
      done
    done
  done
fi

# ---- part 2: callgrind -------------------------------------------------------------
if echo "$parts" | grep -qw callgrind; then
  if ! command -v valgrind > /dev/null || ! command -v callgrind_annotate > /dev/null; then
    echo "[count] valgrind or callgrind_annotate missing: no instruction counts." >&2
  else
    cgwrap=$out/runs/cg-wrap.sh
    # rank 0 (mlxdist-launch: MLX_RANK; Open MPI: OMPI_COMM_WORLD_RANK) under callgrind,
    # one dump after every mlxd_bench_measure call, i.e. per row; the others native
    cat > "$cgwrap" << 'EOF'
#!/bin/sh
o=$1
shift
if [ "${MLX_RANK:-${OMPI_COMM_WORLD_RANK:-}}" = 0 ]; then
  exec valgrind --tool=callgrind --dump-after=mlxd_bench_measure --callgrind-out-file="$o" "$@"
fi
exec "$@"
EOF
    chmod +x "$cgwrap"
    echo "impl,transport,op,ranks,size,ir_1000,ir_3000,instr_per_op" > "$out/callgrind.csv"
    for t in shm tcp; do
      for impl in mlxdist mpi; do
        [ "$impl" = mpi ] && [ $have_mpi = 0 ] && continue
        for it in 1000 3000; do
          rep=1
          while [ "$rep" -le "$cg_reps" ]; do
            name=cg-$impl-$t-$it-r$rep
            echo "[count] $name" >&2
            rm -f "$out/runs/$name.cg"*
            run_side "$impl" "$t" 2 "$name" "$cgwrap" "$out/runs/$name.cg" -- --op "$ops2" \
              --dtype uint8 -b 4 -e 16K -f 16 -t 0 -n "$it" -w 0 --batches 1 --max-batches 1 --csv
            # dump k is the k-th row of rank 0's CSV: op,ranks,size and Ir of the row
            k=0
            grep -v '^impl,' "$out/runs/$name.csv" | cut -d, -f2-4 | while IFS= read -r row; do
              k=$((k + 1))
              d=$out/runs/$name.cg.$k
              ir=n/a
              [ -f "$d" ] && ir=$(callgrind_annotate --auto=no --inclusive=yes --threshold=100 "$d" |
                sed -n 's/^ *\([0-9,]*\) .*:mlxd_bench_measure .*/\1/p' | head -n 1 | tr -d ,)
              echo "$row,${ir:-n/a}"
            done > "$out/runs/$name.ir"
            rep=$((rep + 1))
          done
          # per row the fewest over the repeats: waiting (a peer preempted) only adds
          awk -F, '{ k = $1 "," $2 "," $3; if (!(k in m)) { keys[++n] = k; m[k] = "n/a" }
              if ($4 ~ /^[0-9]+$/ && (m[k] == "n/a" || $4 + 0 < m[k] + 0)) m[k] = $4 }
            END { for (i = 1; i <= n; i++) print keys[i] "," m[keys[i]] }' \
            "$out/runs/cg-$impl-$t-$it"-r*.ir > "$out/runs/cg-$impl-$t-$it.ir"
        done
        # rows in rank 0's order; Ir per op from the two runs' dumps of the same row
        awk -F, -v p="$impl,$t" 'FNR == NR { a[$1 "," $2 "," $3] = $4; next }
          { k = $1 "," $2 "," $3; lo = (k in a) ? a[k] : "n/a"
            v = (lo ~ /^[0-9]+$/ && $4 ~ /^[0-9]+$/) ? sprintf("%.0f", ($4 - lo) / 2000) : "n/a"
            print p "," k "," lo "," $4 "," v }' \
          "$out/runs/cg-$impl-$t-1000.ir" "$out/runs/cg-$impl-$t-3000.ir" >> "$out/callgrind.csv"
      done
    done
  fi
fi

took=$(($(date +%s) - start))
{
  echo "finished: $(date -u '+%Y-%m-%d %H:%M:%S UTC') ($took s)"
  echo "load after: $(cat /proc/loadavg)"
} >> "$out/conditions.txt"

# ---- the markdown ------------------------------------------------------------------
{
  echo "Counts per op (sendrecv: per round trip), each cell \`r0 / max over ranks\`;"
  echo "n/a: not countable here. Conditions: $(sed -n 's/^cpu: *//p' "$out/conditions.txt")."
  if [ -s "$out/account.csv" ]; then
    for n in 2 4; do
      for t in shm tcp; do
        grep -q "^[a-z]*,$t,[a-z_]*,$n," "$out/account.csv" || continue
        echo
        echo "**$n ranks, $t** (Open MPI: btl $([ $t = tcp ] && echo self,tcp || echo self,vader))"
        echo
        echo "| op | size | minflt mlxdist | minflt MPI | majflt mlxdist | majflt MPI | csw mlxdist | csw MPI | syscalls mlxdist | syscalls MPI |"
        echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
        awk -F, -v t="$t" -v n="$n" '
          function f(v) { if (v !~ /^[0-9.]+$/) return v; v += 0
            if (v == 0) return "0"; if (v >= 100) return sprintf("%.0f", v)
            if (v >= 10) return sprintf("%.1f", v); if (v >= 1) return sprintf("%.2f", v)
            return sprintf("%.3f", v) }
          function sz(b) { return b >= 1048576 ? b / 1048576 " MiB" : b >= 1024 ? b / 1024 " KiB" : b " B" }
          $2 == t && $4 == n && $5 != 64 {
            k = $3 SUBSEP $5; if (!(k in seen)) { seen[k] = 1; keys[++nk] = k }
            # minflt, majflt, csw, syscalls (the instr columns, 23-24, are left out)
            for (i = 0; i < 4; i++) { x = (i < 3) ? 17 + 2 * i : 25; c[$1, k, i] = f($x) " / " f($(x + 1)) }
          }
          END { for (j = 1; j <= nk; j++) { split(keys[j], p, SUBSEP); line = "| " p[1] " | " sz(p[2])
              for (i = 0; i < 4; i++) {
                line = line " | " ((("mlxdist", keys[j], i) in c) ? c["mlxdist", keys[j], i] : "-")
                line = line " | " ((("mpi", keys[j], i) in c) ? c["mpi", keys[j], i] : "-")
              }
              print line " |" } }' "$out/account.csv"
      done
    done
  fi
  if [ -s "$out/callgrind.csv" ]; then
    echo
    echo "**User-space instructions per op, rank 0, 2 ranks** (callgrind, mlxd_bench_measure"
    echo "inclusive, (Ir at 3000 ops - Ir at 1000 ops) / 2000; includes the waiting loop)"
    echo
    echo "| op | size | shm mlxdist | shm MPI (vader) | tcp mlxdist | tcp MPI |"
    echo "|---|---:|---:|---:|---:|---:|"
    awk -F, 'NR > 1 && $5 != 64 { k = $3 SUBSEP $5; if (!(k in seen)) { seen[k] = 1; keys[++nk] = k }
        v[$1, $2, k] = $8 }
      function g(i, t, k) { return ((i, t, k) in v) ? v[i, t, k] : "-" }
      END { for (j = 1; j <= nk; j++) { split(keys[j], p, SUBSEP)
          print "| " p[1] " | " (p[2] >= 1024 ? p[2] / 1024 " KiB" : p[2] " B") " | " g("mlxdist", "shm", keys[j]) \
            " | " g("mpi", "shm", keys[j]) " | " g("mlxdist", "tcp", keys[j]) " | " g("mpi", "tcp", keys[j]) " |" } }' \
      "$out/callgrind.csv"
  fi
} > "$out/table.md"
echo "[count] done in $took s: $out/table.md, $out/account.csv, $out/callgrind.csv" >&2
