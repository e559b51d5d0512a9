#!/bin/sh
# How far two runs of scripts/bench-vs-openmpi.sh agree.
#
#   scripts/bench-compare-runs.sh [--from SIZE] [--within PCT] DIR_A DIR_B
#
# DIR_A and DIR_B are two results directories (each with its summary.csv). For
# every mlxdist variant and its Open MPI peer (mlxdist-tcp with mpi-tcp, the
# others with mpi-shm), op, rank count and size from SIZE up (default 64K; K/M/G
# are powers of 1024), prints the ratio of medians (Open MPI median / mlxdist
# median) of each run and how far apart they are: max(A, B) / min(A, B) - 1, in
# percent (symmetric: the same whichever run comes first). A row more than PCT
# apart (default 25) is marked "MISS". Ends with the count of rows within PCT.
#
# Exit status: 0 when every compared row is within PCT, 1 when some are not (or a
# row is in one run only), 2 on bad arguments or unreadable input.
set -u

from=64K
within=25
while [ $# -gt 0 ]; do
  case $1 in
    --from) [ $# -ge 2 ] || { echo "[compare] --from needs a size." >&2; exit 2; }
      from=$2; shift 2 ;;
    --within) [ $# -ge 2 ] || { echo "[compare] --within needs a percentage." >&2; exit 2; }
      within=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -u/p' "$0" | sed -e '/^set -u/d' -e 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    -*) echo "[compare] unknown option '$1'; see --help." >&2; exit 2 ;;
    *) break ;;
  esac
done
if [ $# -ne 2 ]; then
  echo "[compare] expected two results directories, got $#; see --help." >&2
  exit 2
fi
case $from in
  *[!0-9kKmMgG]* | '' | [!0-9]*) echo "[compare] --from expects a size like 64K, got '$from'." >&2
    exit 2 ;;
esac
case $within in
  *[!0-9.]* | '' | .) echo "[compare] --within expects a percentage like 25, got '$within'." >&2
    exit 2 ;;
esac
for d in "$1" "$2"; do
  if [ ! -r "$d/summary.csv" ]; then
    echo "[compare] '$d/summary.csv' is missing; is '$d' a results directory of" \
      "scripts/bench-vs-openmpi.sh?" >&2
    exit 2
  fi
done

# what the two runs ran under: a loaded run makes the comparison meaningless
for d in "$1" "$2"; do
  if [ -r "$d/conditions.txt" ]; then
    echo "$d: $(sed -n -e 's/^started: *//p' -e 's/^commit: *//p' -e 's/^load before: *\([^ ]* [^ ]* [^ ]*\).*/load before \1/p' \
      "$d/conditions.txt" | tr '\n' ';' | sed 's/;$//; s/;/; /g')"
    grep '^WARNING' "$d/conditions.txt" | sed "s|^|$d: |"
  fi
done
echo

# summary.csv: variant,op,ranks,size,runs,time_med_us,time_min_us,time_max_us,...
awk -F, -v from="$from" -v within="$within" -v na="$1" -v nb="$2" '
  function bytes(s, m) { m = 1; if (s ~ /[kK]/) m = 1024; if (s ~ /[mM]/) m = 1048576
    if (s ~ /[gG]/) m = 1073741824; return (s + 0) * m }
  BEGIN { lo = bytes(from) }
  FNR == 1 { run++; next }
  $4 + 0 >= lo {
    v = $1
    if (v ~ /^mlxdist-/) { side = "mlx"; pair = v } else { side = "mpi"; pair = "" }
    med[run, v, $2, $3, $4] = $6
    if (side == "mlx") {
      k = v SUBSEP $2 SUBSEP $3 SUBSEP $4
      if (!(k in seen)) { seen[k] = 1; keys[++nk] = k }
    }
  }
  function ratio(r, v, op, n, sz, p, a, b) {
    p = (v == "mlxdist-tcp") ? "mpi-tcp" : "mpi-shm"
    a = med[r, v, op, n, sz]; b = med[r, p, op, n, sz]
    if (a == "" || b == "" || a + 0 <= 0) return ""
    return b / a
  }
  END {
    printf "A: %s\nB: %s\n", na, nb
    printf "ratio = Open MPI median / mlxdist median in each run; apart = max/min - 1\n\n"
    printf "%-16s %-11s %5s %10s %8s %8s %7s\n", "mlxdist variant", "op", "ranks", "size(B)",
      "ratio A", "ratio B", "apart"
    ok = 0; total = 0; worst = -1
    for (i = 1; i <= nk; i++) {
      split(keys[i], p, SUBSEP)
      ra = ratio(1, p[1], p[2], p[3], p[4]); rb = ratio(2, p[1], p[2], p[3], p[4])
      total++
      if (ra == "" || rb == "") {
        printf "%-16s %-11s %5s %10s %8s %8s %7s  MISSING\n", p[1], p[2], p[3], p[4],
          ra == "" ? "-" : sprintf("%.3g", ra), rb == "" ? "-" : sprintf("%.3g", rb), "-"
        continue
      }
      apart = ((ra > rb) ? ra / rb : rb / ra) * 100 - 100
      mark = (apart <= within + 0) ? "" : "  MISS"
      if (mark == "") ok++
      if (apart > worst) { worst = apart; wk = p[1] " " p[2] " " p[3] " ranks " p[4] " B" }
      printf "%-16s %-11s %5s %10s %8.3g %8.3g %6.1f%%%s\n", p[1], p[2], p[3], p[4], ra, rb,
        apart, mark
    }
    printf "\n%d of %d rows (sizes from %d B) within %s %%", ok, total, lo, within
    if (worst >= 0) printf "; furthest apart: %.1f %% (%s)", worst, wk
    printf "\n"
    exit (ok == total && total > 0) ? 0 : 1
  }' "$1/summary.csv" "$2/summary.csv"
