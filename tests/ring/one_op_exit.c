/* N ranks x one collective, then exit (issue 25): strict init of the ring, one
 * 4-byte all_sum checked, exit. Under mlxdist-launch, every rank must exit 0:
 * a rank that finishes first must not destroy data its peers still read
 * (orderly exit, src/transport/tcp_setup.c). Prints rank 0's wall times.
 *   mlxdist-launch -n 64 --env MLXDIST_TRANSPORT=tcp -- one_op_exit */
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "mlx/c/mlx.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(void) {
  double t0 = now_s();
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init(&g, true, "ring") != 0) {
    fprintf(stderr, "one_op_exit: init failed\n");
    return 1;
  }
  double t1 = now_s();
  int rank = mlx_distributed_group_rank(g), size = mlx_distributed_group_size(g);
  mlx_array x = mlx_array_new_int(rank + 1), y = mlx_array_new();
  mlx_stream s = mlx_stream_new();
  if (mlx_distributed_all_sum(&y, x, g, s) != 0 || mlx_array_eval(y) != 0) {
    fprintf(stderr, "one_op_exit: rank %d: all_sum failed\n", rank);
    return 1;
  }
  int got = 0;
  const int32_t* p = mlx_array_data_int32(y);
  if (p) got = p[0];
  long want = (long)size * (size + 1) / 2;
  if (got != want) {
    fprintf(stderr, "one_op_exit: rank %d: all_sum gave %d, expected %ld\n", rank, got, want);
    return 1;
  }
  if (rank == 0)
    printf("one_op_exit: %d ranks: init %.3f s, all_sum %.3f s\n", size, t1 - t0, now_s() - t1);
  mlx_array_free(x);
  mlx_array_free(y);
  mlx_stream_free(s);
  mlx_distributed_group_free(g);
  return 0;
}
