#!/bin/bash
# Interleaved A/B, order alternating per round; builds in /tmp/bA and /tmp/bB (Release,
# tools only); BIND=--bind pins the ranks. usage: ab-bound.sh ROUNDS OUTDIR OPS MIN MAX [NP]
rounds=$1; out=$2; ops=$3; mn=$4; mx=$5; np=${6:-2}; mkdir -p $out
for r in $(seq $rounds); do
  if [ $((r % 2)) = 0 ]; then ord="A B"; else ord="B A"; fi
  for v in $ord; do
    b=/tmp/b$v
    $b/tools/mlxdist-launch -n $np --timeout 300 -- $b/tools/mlxdist-bench --op $ops -b $mn -e $mx -f 4 --min-time 200 $BIND --csv > $out/$v.$r.csv 2>$out/$v.$r.err
  done
done
cd $out; for op in ${ops//,/ }; do for sz in $(cat A.1.csv | grep ",$op,$np," | awk -F, '{print $4}'); do for v in A B; do printf "%s %s %s: " $op $sz $v; cat $v.*.csv | grep ",$op,$np,$sz," | awk -F, '{print $7}' | sort -n | tr '\n' ' '; echo; done; done; done
