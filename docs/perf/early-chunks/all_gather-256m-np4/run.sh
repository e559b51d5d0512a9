#!/bin/bash
out=/tmp/big; mkdir -p $out
for r in 8 9 10 11 12 13; do
  if [ $((r % 2)) = 0 ]; then ord="A B"; else ord="B A"; fi
  for v in $ord; do
    b=/tmp/b$v
    timeout 300 $b/tools/mlxdist-launch -n 4 --timeout 280 -- $b/tools/mlxdist-bench --op all_gather -b 256M -e 256M --min-time 200 -w 2 --csv > $out/$v.$r.csv 2>$out/$v.$r.err
    echo "$v $r $(grep ',all_gather,' $out/$v.$r.csv | awk -F, '{print $7, $14, $15}')"
  done
done
