#!/usr/bin/env bash
# mlxdist against itself and against Open MPI across emulated hosts: MHB_HOSTS network
# namespaces x MHB_NP ranks, hanging off one bridge (tests/multihost/hosts.sh builds them,
# each with its own sshd), optionally with every host's uplink shaped by tc tbf. float32
# all_sum (or MHB_OP), 4 B .. 64 MiB, in ONE interleaved run: per repetition every variant once
# (auto, flat, ompi, auto, flat, ompi, ...; every other repetition in the reverse order),
# so that a slow phase of the machine (other jobs) hits all of them. Root only.
#
#   scripts/bench-multihost.sh BUILD OUTDIR [REPS]
#
# Variants (MHB_VARIANTS, default "auto flat ompi"; the first is the reference of the ratios):
#   auto  mlxdist-launch over ssh, MLXDIST_TRANSPORT=auto (shared memory within a host, TCP
#         across), MLXDIST_ALGO=auto (the library picks flat or two-level)
#   flat  the same with MLXDIST_ALGO=flat (the flat pipeline/one-shot over the same transports)
#   hier  the same with MLXDIST_ALGO=hier
#   whole auto with MLXDIST_HIER_SEGMENT=0: the two-level all_sum in one piece, its phases not
#         pipelined (as before the pipeline)
#   tcp   MLXDIST_TRANSPORT=tcp (TCP for every pair, the algorithm left to the library)
#   ompi  Open MPI's mpirun from the client namespace, its daemons started through the
#         hosts' sshds (--mca plm_rsh_agent: a wrapper around the harness's ssh config),
#         -H h1:K,h2:K, btl self,vader,tcp with tcp on the bridge subnet only, pml ob1,
#         --bind-to none, mpi_yield_when_idle 1 when the ranks outnumber this machine's
#         CPUs; running BUILD/tools/mpi_ref_bench (same options, sizes and measurement
#         rule as mlxdist-bench).
# Where BUILD's library does not know MLXDIST_ALGO (before the two-level code), auto, flat
# and hier run the same code; conditions.txt and the table say so. Otherwise conditions.txt
# names the algorithm each mlxdist variant runs at 4 B and 1 MiB (MLX_RING_VERBOSE).
# Before the runs it prints an estimate of their duration on an idle machine.
#
# Environment: MHB_HOSTS (default 3), MHB_NP (ranks per host, default 2), MHB_VARIANTS,
# MHB_OP (all_sum, all_max, all_gather, sum_scatter, sendrecv, sendrecv_bw or all_to_all: the op
# measured, default all_sum; sizes are mlxdist-bench's: the whole result of all_gather, the whole
# input of sum_scatter, a rank's whole input of all_to_all (MPI_Alltoall on the Open MPI side,
# e.g. MHB_HOSTS=2 MHB_NP=2 MHB_OP=all_to_all MHB_MIN_BYTES=64); sendrecv and sendrecv_bw run between ranks 0 and 1, so across two hosts with
# MHB_HOSTS=2 MHB_NP=1, e.g. MHB_HOSTS=2 MHB_NP=1 MHB_OP=sendrecv MHB_VARIANTS="tcp ompi"),
# MHB_MIN_BYTES (smallest size, default 4), MHB_MAX_BYTES (default 64M), MHB_FACTOR
# (default 8), MHB_MIN_TIME (ms of timed work per size, default 200), MHB_BATCHES (timed batches per size, default 5), MHB_RATE (e.g.
# "1gbit": shape every host's uplink, eth0 egress, with tc tbf at this rate; default none),
# MHB_MPI_MCA (extra mpirun options, default none), MHB_TIMEOUT (seconds per run,
# default 900), MHB_PREFIX (the namespaces' and temp dirs' name prefix, default mlxdmhb: give
# each concurrent user of this script its own).
#
# Writes to OUTDIR: runs/<variant>-<rep>.csv (+ .log), runs/index.txt (start, load average,
# duration and exit status of every run), conditions.txt (date, commit, load before/after,
# the exact commands), summary.csv (per variant and size: runs, median/min/max time in us
# and busbw in GB/s; scripts/plot.gp's input), table.txt (printed: median [min-max] per
# variant and, for every other variant X, X/ref = time of X / time of the reference, the
# ratio of the medians with the range of the per-repetition ratios in brackets: above 1,
# the reference (mlxdist auto by default) is faster), time.png and busbw.png (gnuplot).
set -euo pipefail
build=${1:?usage: bench-multihost.sh BUILD OUTDIR [REPS]}
out=${2:?usage: bench-multihost.sh BUILD OUTDIR [REPS]}
reps=${3:-3}
hosts=${MHB_HOSTS:-3}
np=${MHB_NP:-2}
variants=${MHB_VARIANTS:-auto flat ompi}
op=${MHB_OP:-all_sum}
min_bytes=${MHB_MIN_BYTES:-4}
max_bytes=${MHB_MAX_BYTES:-64M}
factor=${MHB_FACTOR:-8}
min_time=${MHB_MIN_TIME:-200}
batches=${MHB_BATCHES:-5}
timeout_s=${MHB_TIMEOUT:-900}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=$(cd "$build" && pwd)
launch=$build/tools/mlxdist-launch
bench=$build/tools/mlxdist-bench
ref=$build/tools/mpi_ref_bench
if [ ! -x "$launch" ] || [ ! -x "$bench" ]; then
  echo "bench-multihost: no mlxdist-launch/mlxdist-bench in $build/tools" >&2
  exit 2
fi
case $op in all_sum | all_max | all_gather | sum_scatter | sendrecv | sendrecv_bw | all_to_all) ;;
  *)
    echo "bench-multihost: MHB_OP: '$op' is not all_sum, all_max, all_gather, sum_scatter," \
      "sendrecv, sendrecv_bw or all_to_all" >&2
    exit 2
    ;;
esac
for v in $variants; do
  case $v in auto | flat | hier | tcp | whole) ;;
    ompi)
      if [ ! -x "$ref" ] || ! command -v mpirun >/dev/null 2>&1; then
        echo "bench-multihost: variant ompi needs mpirun and $ref (build with Open MPI installed)" >&2
        exit 2
      fi
      ;;
    *)
      echo "bench-multihost: MHB_VARIANTS: '$v' is not auto, flat, hier, whole, tcp or ompi" >&2
      exit 2
      ;;
  esac
done
case $reps in '' | *[!0-9]* | 0)
  echo "bench-multihost: REPS must be a whole number >= 1, got '$reps'" >&2
  exit 2
  ;;
esac
cpus=$(nproc)
ranks=$((hosts * np))
# the same options for both benchmarks
bopts=(--op "$op" -b "$min_bytes" -e "$max_bytes" -f "$factor" -t "$min_time" --batches "$batches" --csv)
"$bench" "${bopts[@]}" --help >/dev/null || exit 2 # refuse bad options before any set-up
algo_known=0
# the library names the tunables it reads: MLXDIST_ALGO there = the two-level code is in
for so in "$build"/libmlxdist.so* "$build"/libmlxdist.a; do
  [ -f "$so" ] && grep -aq MLXDIST_ALGO "$so" && algo_known=1 && break
done
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -rf "$out/runs" && mkdir "$out/runs"
rm -f "$out"/summary.csv "$out"/table.txt "$out"/*.png

set +e # hosts.sh reports its own failures
export MH_PREFIX=${MHB_PREFIX:-mlxdmhb} # apart from the tests' namespaces
# shellcheck source=../tests/multihost/hosts.sh
. "$root/tests/multihost/hosts.sh"
mh_setup "$hosts"
set -e
if [ -n "${MHB_RATE:-}" ]; then
  for ((i = 0; i < hosts; i++)); do
    mh_on "$i" tc qdisc add dev eth0 root tbf rate "$MHB_RATE" burst 256kb latency 50ms
  done
  mh_say "every host's uplink shaped to $MHB_RATE (tc tbf)"
fi

# Open MPI: its daemons go through the hosts' sshds like mlxdist's ranks
agent=$MH_DIR/ompi-rsh
printf '#!/bin/sh\nexec ssh -F %s/ssh_config "$@"\n' "$MH_DIR" >"$agent"
chmod 755 "$agent"
hlist=""
for ((i = 0; i < hosts; i++)); do hlist+="${hlist:+,}$(mh_ip "$i"):$np"; done
# shellcheck disable=SC2054 # the commas are Open MPI's list syntax
mpi_cmd=(mpirun --allow-run-as-root -np "$ranks" -H "$hlist" --bind-to none
  --mca plm_rsh_agent "$agent" --mca plm_rsh_no_tree_spawn 1
  --mca oob_tcp_if_include "$MH_SUBNET.0/24" --mca pml ob1 --mca btl self,vader,tcp
  --mca btl_tcp_if_include "$MH_SUBNET.0/24")
[ "$ranks" -gt "$cpus" ] && mpi_cmd+=(--mca mpi_yield_when_idle 1)
# shellcheck disable=SC2206
[ -n "${MHB_MPI_MCA:-}" ] && mpi_cmd+=($MHB_MPI_MCA)
mlx_cmd=("$launch" --ssh "$(mh_ssh_cmd)" --hosts "$(mh_hosts_csv)" -n "$np" --timeout "$timeout_s")

run_variant() { # $1 variant, $2 output base
  case $1 in
    ompi) mh_client timeout "$timeout_s" "${mpi_cmd[@]}" "$ref" "${bopts[@]}" ;;
    tcp) mh_client "${mlx_cmd[@]}" --env MLXDIST_TRANSPORT=tcp -- "$bench" "${bopts[@]}" ;;
    whole)
      mh_client "${mlx_cmd[@]}" --env MLXDIST_TRANSPORT=auto --env MLXDIST_ALGO=auto \
        --env MLXDIST_HIER_SEGMENT=0 -- "$bench" "${bopts[@]}"
      ;;
    *)
      mh_client "${mlx_cmd[@]}" --env MLXDIST_TRANSPORT=auto --env "MLXDIST_ALGO=$1" -- \
        "$bench" "${bopts[@]}"
      ;;
  esac >"$2.csv" 2>"$2.log"
}

# ---- conditions and the estimate ------------------------------------------------------
cmd="MHB_HOSTS=$hosts MHB_NP=$np MHB_VARIANTS='$variants' MHB_MAX_BYTES=$max_bytes"
[ "$op" != all_sum ] && cmd+=" MHB_OP=$op"
[ "$min_bytes" != 4 ] && cmd+=" MHB_MIN_BYTES=$min_bytes"
cmd+=" MHB_FACTOR=$factor MHB_MIN_TIME=$min_time MHB_BATCHES=$batches"
[ -n "${MHB_RATE:-}" ] && cmd+=" MHB_RATE=$MHB_RATE"
[ -n "${MHB_MPI_MCA:-}" ] && cmd+=" MHB_MPI_MCA='$MHB_MPI_MCA'"
cmd+=" scripts/bench-multihost.sh BUILD OUTDIR $reps"
# per run: ~1.5 x min-time per size plus ~4 s of start-up over ssh; at a shaped rate, every
# size whose op takes longer than min-time/batches costs (1 + warm-up + batches) ops
# instead, an op moving ~2 x the size through the busiest uplink (flat pipeline, >= 2 hosts)
est=$(awk -v lo="$min_bytes" -v e="$max_bytes" -v f="$factor" -v t="$min_time" -v b="$batches" -v rate="${MHB_RATE:-}" \
  -v runs="$((reps * $(echo "$variants" | wc -w)))" '
  function bytes(s, m) { m = 1; if (s ~ /[kK]/) m = 1024; if (s ~ /[mM]/) m = 1048576
    if (s ~ /[gG]/) m = 1073741824; return (s + 0) * m }
  BEGIN { r = 0; if (rate ~ /gbit$/) r = (rate + 0) * 1e9 / 8; else if (rate ~ /mbit$/) r = (rate + 0) * 1e6 / 8
    if (r == 0) r = 1e9  # unshaped veth through a bridge on this VM: ~1 GB/s
    s = 4
    for (x = bytes(lo); x <= bytes(e); x = x * f) { op = 2 * x / r; row = 1.5 * t / 1000
      if (op > t / 1000 / b) row = (2 + b) * op + t / 1000; s += row }
    printf "%d", runs * s }')
{
  echo "command:      $cmd"
  echo "started:      $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
  [ -n "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ] &&
    commit="$commit (with uncommitted changes)"
  echo "commit:       $commit"
  echo "host:         $(uname -srm), $cpus CPUs, $(sed -n 's/^MemTotal: *//p' /proc/meminfo)"
  echo "layout:       $hosts hosts (network namespaces $(mh_hosts_csv)) x $np ranks, $ranks ranks on $cpus CPUs"
  if [ -n "${MHB_RATE:-}" ]; then
    echo "links:        every host's eth0 egress shaped to $MHB_RATE (tc tbf burst 256kb latency 50ms)"
  else
    echo "links:        unshaped veth pairs through a bridge"
  fi
  echo "MLXDIST_ALGO: $([ $algo_known = 1 ] && echo "known to this build" ||
    echo "NOT known to this build: auto, flat and hier run the same (flat) code")"
  echo "Open MPI:     $(mpirun --version 2>/dev/null | head -n 1)"
  echo "ompi run:     ${mpi_cmd[*]} $ref ${bopts[*]}"
  case " $variants " in *" ompi "*)
    # where mpirun puts its ranks (hostname = the host namespace's sshd's mh<i>)
    echo "ompi ranks:   on $(mh_client timeout 60 "${mpi_cmd[@]}" hostname 2>&1 | sort | uniq -c | tr -s ' \n' ' ')" ;;
  esac
  echo "mlxdist run:  ${mlx_cmd[*]} --env MLXDIST_TRANSPORT=auto --env MLXDIST_ALGO=<v> -- $bench ${bopts[*]}"
  if [ $algo_known = 1 ]; then
    # which algorithm each mlxdist variant runs for all_sum, small and large
    # (MLX_RING_VERBOSE, rank 0; it names all_sum's choice whatever MHB_OP is)
    for v in $variants; do
      case $v in ompi | tcp | whole) continue ;; esac
      echo "mlxdist $v (all_sum's choice):$(mh_client "${mlx_cmd[@]}" --env MLXDIST_TRANSPORT=auto --env "MLXDIST_ALGO=$v" \
        --env MLX_RING_VERBOSE=1 -- "$bench" --op all_sum -b 4 -e 1M -f 262144 -t 0 -n 1 -w 0 \
        --batches 1 2>&1 | sed -n 's/.*\[ring\] rank 0: all_sum \([0-9]* B: .*\)/\1/p' | sort -u |
        tr '\n' ';' | sed 's/;$//; s/;/; /g; s/^/ /')"
    done
  fi
  echo "load before:  $(cat /proc/loadavg)"
  echo "estimate:     about $est s on an idle machine; more under load"
} >"$out/conditions.txt"
cat "$out/conditions.txt"

# ---- the runs -------------------------------------------------------------------------
order=$variants
reverse=""
for v in $order; do reverse="$v $reverse"; done
start=$(date +%s)
status=0
for rep in $(seq 1 "$reps"); do
  if [ $((rep % 2)) = 1 ]; then vs=$order; else vs=$reverse; fi
  for v in $vs; do
    t0=$(date +%s)
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    rc=0
    run_variant "$v" "$out/runs/$v-$rep" || rc=$?
    echo "$v rep $rep started $(date -u -d "@$t0" '+%H:%M:%S') load $load took $(($(date +%s) - t0)) s exit $rc" |
      tee -a "$out/runs/index.txt"
    if [ "$rc" != 0 ]; then
      echo "bench-multihost: $v (repetition $rep) failed (exit $rc); see $out/runs/$v-$rep.log" >&2
      tail -n 5 "$out/runs/$v-$rep.log" >&2
      status=1
    fi
  done
  [ "$rep" = 1 ] && [ "$reps" -gt 1 ] &&
    echo "bench-multihost: repetition 1 took $(($(date +%s) - start)) s; about $(($(date +%s) - start))" \
      "s per repetition to go"
done
{
  echo "finished:     $(date -u '+%Y-%m-%d %H:%M:%S UTC') ($(($(date +%s) - start)) s)"
  echo "load after:   $(cat /proc/loadavg)"
} >>"$out/conditions.txt"

# ---- statistics, the table -----------------------------------------------------------
# shellcheck disable=SC2086 # one argument per variant
python3 - "$out" "$reps" "$hosts" "$np" "$cmd" "$algo_known" "$op" $variants <<'PY'
import csv, statistics, sys, os
out, reps, hosts, np, cmd, algo_known, op = sys.argv[1:8]
variants = sys.argv[8:]
reps = int(reps)
names = {"auto": "mlxdist-auto", "flat": "mlxdist-flat", "hier": "mlxdist-hier",
         "tcp": "mlxdist-tcp", "ompi": "openmpi", "whole": "mlxdist-whole"}
# per variant: size -> {rep: (time_us, busbw)}
data = {}
for v in variants:
    rows = data.setdefault(v, {})
    for rep in range(1, reps + 1):
        f = os.path.join(out, "runs", f"{v}-{rep}.csv")
        if not os.path.exists(f):
            continue
        with open(f) as fh:
            for line in fh:
                line = line.split("] ", 1)[-1]  # the launcher's "[0] " prefix
                r = next(csv.reader([line]), [])
                if len(r) < 9 or not r[3].isdigit():
                    continue
                rows.setdefault(int(r[3]), {})[rep] = (float(r[6]), float(r[8]))
ranks = int(hosts) * int(np)
with open(os.path.join(out, "summary.csv"), "w") as fh:
    fh.write("variant,op,ranks,size,runs,time_med_us,time_min_us,time_max_us,"
             "busbw_med,busbw_min,busbw_max\n")
    for v in variants:
        for size in sorted(data[v]):
            t = [x[0] for x in data[v][size].values()]
            b = [x[1] for x in data[v][size].values()]
            fh.write(f"{names[v]},{op},{ranks},{size},{len(t)},{statistics.median(t):.3f},"
                     f"{min(t):.3f},{max(t):.3f},{statistics.median(b):.4f},{min(b):.4f},{max(b):.4f}\n")
ref = variants[0]
sizes = sorted(set().union(*[set(d) for d in data.values()]))
def fmt(x):
    return f"{x:.1f}" if x < 1000 else f"{x:,.0f}"
def cell(v, size):
    d = data[v].get(size)
    if not d:
        return "-"
    t = [x[0] for x in d.values()]
    return f"{fmt(statistics.median(t))} [{fmt(min(t))}-{fmt(max(t))}]"
def ratio(v, size):
    a, b = data[ref].get(size), data[v].get(size)
    if not a or not b:
        return "-"
    m = statistics.median([x[0] for x in b.values()]) / statistics.median([x[0] for x in a.values()])
    per = [b[r][0] / a[r][0] for r in a if r in b and a[r][0] > 0]
    return f"{m:.2f} ({min(per):.2f}-{max(per):.2f})" if per else f"{m:.2f}"
lines = []
lines.append(f"{op} float32 on {hosts} hosts x {np} ranks, time per op in us, median over {reps} runs [min-max]")
lines.append(f"({cmd})")
if algo_known != "1":
    lines.append("NOTE: this build does not know MLXDIST_ALGO: auto, flat and hier ran the same flat code")
others = [v for v in variants if v != ref]
hdr = f"{'bytes':>9} " + " ".join(f"{names[v]:>27}" for v in variants)
hdr += "".join(f" {v + '/' + ref:>17}" for v in others)
lines.append(hdr)
for size in sizes:
    row = f"{size:>9} " + " ".join(f"{cell(v, size):>27}" for v in variants)
    row += "".join(f" {ratio(v, size):>17}" for v in others)
    lines.append(row)
lines.append(f"X/{ref} = median time of X / median time of {names[ref]} (in brackets: the lowest and")
lines.append(f"highest ratio of runs of the same repetition); above 1, {names[ref]} is faster.")
text = "\n".join(lines) + "\n"
with open(os.path.join(out, "table.txt"), "w") as fh:
    fh.write(text)
print(text, end="")
PY

# ---- plots ----------------------------------------------------------------------------
if command -v gnuplot >/dev/null 2>&1; then
  pv=""
  for v in $variants; do
    case $v in ompi) pv+=" openmpi" ;; *) pv+=" mlxdist-$v" ;; esac
  done
  ttl="$op float32, $hosts hosts x $np ranks${MHB_RATE:+, uplinks $MHB_RATE}"
  for m in time busbw; do
    if gnuplot -e "summary='$out/summary.csv'; n=$ranks; op='$op'; out='$out/$m.png'" \
      -e "variants='${pv# }'; runs=$reps; metric='$m'; ttl='$ttl'" "$root/scripts/plot.gp" \
      2>"$out/gnuplot.log"; then
      echo "plot: $out/$m.png"
    else
      echo "bench-multihost: gnuplot failed; see $out/gnuplot.log" >&2
    fi
  done
fi
exit $status
