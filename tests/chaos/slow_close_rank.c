/* Rank program of tests/chaos/slow_close.sh (public API only): a group destroyed right
 * after a large send over a slow link must still deliver every byte.
 *
 *   slow_close_rank N
 *
 * Two ranks (MLX_RANK, MLX_HOSTFILE). Rank 0 sends N int32 values to rank 1, frees its
 * group and clears the backends as soon as the send is done (its bytes may still be queued
 * in the kernel: the link is slow), prints how long that took and exits 0. Rank 1 receives
 * them while its heartbeats keep reaching rank 0's sockets, checks every element and exits
 * 0 when all are right (1: a wrong element, 3: the receive failed). Found by the chaos soak:
 * the TCP transport closed its sockets 0.5 s into such a drain, and the next heartbeat from
 * rank 1 reset the connection and dropped the bytes still queued. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "mlx/c/mlx.h"
#include "ranks.h"
#include "testutil.h"

int main(int argc, char** argv) {
  t_capture_errors();
  setvbuf(stdout, NULL, _IOLBF, 0);
  int n = argc == 2 ? atoi(argv[1]) : 0;
  if (n < 1) {
    fprintf(stderr, "usage: slow_close_rank N (N >= 1 int32 values)\n");
    return 2;
  }
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init(&g, true, "ring") != 0) T_FAIL("init ring: %s", t_last_error());
  int rank = mlx_distributed_group_rank(g);
  T_EQ_INT(mlx_distributed_group_size(g), 2);
  int shape[1] = {n};
  if (rank == 0) {
    int32_t* v = malloc(sizeof(int32_t) * (size_t)n);
    T_ASSERT(v);
    for (int i = 0; i < n; i++) v[i] = i * 7 + 3;
    mlx_array x = mlx_array_new_data(v, shape, 1, MLX_INT32), s = mlx_array_new();
    free(v);
    T_EQ_INT(mlx_distributed_send(&s, x, 1, g, mlx_stream_new()), 0);
    if (mlx_array_eval(s) != 0) T_FAIL("send: %s", t_last_error());
    mlx_array_free(x);
    mlx_array_free(s);
    double t0 = t_now();
    mlx_distributed_group_free(g);
    mlx_distributed_clear_backends();
    printf("slow_close_rank: rank 0 sent %d values; freeing the group took %.2f s\n", n,
           t_now() - t0);
    return 0;
  }
  mlx_array r = mlx_array_new();
  T_EQ_INT(mlx_distributed_recv(&r, shape, 1, MLX_INT32, 0, g, mlx_stream_new()), 0);
  if (mlx_array_eval(r) != 0) {
    printf("slow_close_rank: rank 1: recv failed: %s\n", t_last_error());
    return 3;
  }
  const int32_t* d = mlx_array_data_int32(r);
  T_ASSERT(d);
  for (int i = 0; i < n; i++)
    if (d[i] != i * 7 + 3) {
      printf("slow_close_rank: rank 1: element %d is %d, expected %d\n", i, d[i], i * 7 + 3);
      return 1;
    }
  mlx_array_free(r);
  mlx_distributed_group_free(g);
  mlx_distributed_clear_backends();
  printf("slow_close_rank: rank 1 received all %d values\n", n);
  return 0;
}
