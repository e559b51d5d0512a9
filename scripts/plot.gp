# busbw (or time per op) vs size for one op and rank count, one line per
# implementation: the median over the repeats, error bars from the fastest to
# the slowest run.
# gnuplot -e "summary='R/summary.csv'; n=2; op='all_sum'; out='R/busbw-all_sum-n2.png'" \
#         -e "variants='mlxdist-default mpi-shm'; runs=3" plot.gp
# Optional: metric='time' plots the time per op (log scale) instead of busbw;
# ttl='...' replaces the title (scripts/bench-multihost.sh sets both).
# Input: summary.csv of scripts/bench-vs-openmpi.sh or bench-multihost.sh, columns
#   variant,op,ranks,size,runs,time_med_us,time_min_us,time_max_us,busbw_med,busbw_min,busbw_max
if (!exists("metric")) metric = 'busbw'
if (!exists("ttl")) ttl = sprintf("%s, %d ranks", op, n)
set terminal pngcairo size 900,560 noenhanced
set output out
set datafile separator ","
set logscale x 2
set format x "%.0b%B"
set xlabel "size (bytes)"
set key top left
set grid
if (metric eq 'time') {
  c = 6
  set logscale y 10
  set ylabel sprintf("time per op (us, log): median of %d runs, bars min-max", runs)
  set title sprintf("%s: time per op vs size (lower is better)", ttl)
} else {
  c = 9
  set ylabel sprintf("bus bandwidth (GB/s): median of %d runs, bars min-max", runs)
  set title sprintf("%s: busbw vs size", ttl)
}
plot for [v in variants] summary every ::1 \
     using ((strcol(1) eq v && strcol(2) eq op && $3 == n) ? $4 : 1/0):(column(c)):(column(c+1)):(column(c+2)) \
     with yerrorlines title v
