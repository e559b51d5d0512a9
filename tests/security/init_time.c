/* The cost of the connection set-up (docs/security.md): run under mlxdist-launch,
 * every rank times N rounds of init + a 4-byte all_sum + clear, and rank 0
 * prints the median and the minimum of the init times. Not a test: the numbers
 * for the docs, with and without MLXDIST_JOB_TOKEN / --secret.
 *   mlxdist-launch -n 4 [--secret] -- init_time [N] */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "mlx/c/mlx.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 20;
  if (n < 1 || n > 1000) n = 20;
  double* t = calloc((size_t)n, sizeof *t);
  int rank = -1, size = 0;
  for (int i = 0; i < n; i++) {
    mlx_distributed_group g = mlx_distributed_group_new();
    double t0 = now_s();
    if (mlx_distributed_init(&g, true, "ring") != 0) {
      fprintf(stderr, "init failed\n");
      return 1;
    }
    t[i] = now_s() - t0;
    rank = mlx_distributed_group_rank(g);
    size = mlx_distributed_group_size(g);
    mlx_array x = mlx_array_new_int(1), y = mlx_array_new();
    if (mlx_distributed_all_sum(&y, x, g, mlx_stream_new()) != 0 || mlx_array_eval(y) != 0) {
      fprintf(stderr, "all_sum failed\n");
      return 1;
    }
    mlx_array_free(x);
    mlx_array_free(y);
    mlx_distributed_group_free(g);
    mlx_distributed_clear_backends();
  }
  qsort(t, (size_t)n, sizeof *t, cmp);
  if (rank == 0)
    printf("init_time: %d ranks, %d inits: median %.2f ms, min %.2f ms, max %.2f ms\n", size, n,
           t[n / 2] * 1e3, t[0] * 1e3, t[n - 1] * 1e3);
  free(t);
  return 0;
}
