# busbw vs size for one op and rank count, one line per implementation: the
# median over the repeats, error bars from the fastest to the slowest run.
# gnuplot -e "summary='R/summary.csv'; n=2; op='all_sum'; out='R/busbw-all_sum-n2.png'" \
#         -e "variants='mlxdist-default mpi-shm'; runs=3" plot.gp
# Input: summary.csv of scripts/bench-vs-openmpi.sh, columns
#   variant,op,ranks,size,runs,time_med_us,time_min_us,time_max_us,busbw_med,busbw_min,busbw_max
set terminal pngcairo size 900,560 noenhanced
set output out
set datafile separator ","
set logscale x 2
set format x "%.0b%B"
set xlabel "size (bytes)"
set ylabel sprintf("bus bandwidth (GB/s): median of %d runs, bars min-max", runs)
set title sprintf("%s, %d ranks: busbw vs size", op, n)
set key top left
set grid
plot for [v in variants] summary every ::1 \
     using ((strcol(1) eq v && strcol(2) eq op && $3 == n) ? $4 : 1/0):9:10:11 \
     with yerrorlines title v
