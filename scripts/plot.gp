# busbw vs size for one op and rank count, one line per implementation.
# gnuplot -e "dir='R'; n=2; op='all_sum'; out='R/busbw-all_sum-n2.png'; variants='mlxdist-default mpi-shm'" plot.gp
# Input: DIR/<variant>-n<N>.csv with columns
#   impl,op,ranks,size,count,dtype,time_us,algbw_gbps,busbw_gbps,cpu_us,check
set terminal pngcairo size 900,560 noenhanced
set output out
set datafile separator ","
set logscale x 2
set format x "%.0b%B"
set xlabel "size (bytes)"
set ylabel "bus bandwidth (GB/s)"
set title sprintf("%s, %d ranks: busbw vs size", op, n)
set key top left
set grid
plot for [v in variants] sprintf("%s/%s-n%d.csv", dir, v, n) \
     using (strcol(2) eq op ? $4 : 1/0):9 with linespoints title v
