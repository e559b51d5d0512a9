/* Rank program for the emulated-hosts ring test (tests/netns/netns_ring.sh starts one
 * per network namespace with MLX_RANK and MLX_HOSTFILE; tests/multihost through
 * mlxdist-launch; tests/slurm under srun, PMIx; public API only).
 *
 *   netns_rank collectives N   all_sum (int32, float32), all_gather and send/recv between
 *                              every ordered pair of ranks, checked against values computed
 *                              here; exits 0 when all of it is right
 *   netns_rank cutoff DIR      one checked all_sum, then writes DIR/ready.RANK and repeats
 *                              small all_sums until one fails; prints the error and exits 3
 *                              (exit 4: still no failure after 90 s) */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mlx/c/mlx.h"
#include "testutil.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* all_sum of v[i] = f(rank, i) with f = rank * 7919 + i (int32); returns eval's rc and,
 * when it succeeded, checks every element against the sum over ranks. */
static int checked_sum_int32(mlx_distributed_group g, int rank, int size, int n) {
  int32_t* v = malloc(sizeof(int32_t) * (size_t)n);
  T_ASSERT(v);
  for (int i = 0; i < n; i++) v[i] = rank * 7919 + i;
  int shape[1] = {n};
  mlx_array x = mlx_array_new_data(v, shape, 1, MLX_INT32), y = mlx_array_new();
  free(v);
  T_EQ_INT(mlx_distributed_all_sum(&y, x, g, mlx_stream_new()), 0);
  int rc = mlx_array_eval(y);
  if (rc == 0) {
    const int32_t* d = mlx_array_data_int32(y);
    T_ASSERT(d);
    for (int i = 0; i < n; i++) {
      int64_t want = 0;
      for (int r = 0; r < size; r++) want += (int64_t)r * 7919 + i;
      if (d[i] != want) T_FAIL("all_sum int32[%d] = %d, expected %lld", i, d[i], (long long)want);
    }
  }
  mlx_array_free(x);
  mlx_array_free(y);
  return rc;
}

static int collectives(int size_expected) {
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init(&g, true, "ring") != 0) T_FAIL("init ring: %s", t_last_error());
  int rank = mlx_distributed_group_rank(g), size = mlx_distributed_group_size(g);
  T_EQ_INT(size, size_expected);
  /* the rank the bootstrap gave: MLX_RANK's (a hostfile), or Slurm's task id under srun (PMIx) */
  T_EQ_INT(rank, getenv("MLX_RANK") ? t_env_int("MLX_RANK", -1) : t_env_int("SLURM_PROCID", -1));

  /* int32: small and 1 Mi elements (4 MiB: many TCP segments through the bridge) */
  T_EQ_INT(checked_sum_int32(g, rank, size, 10), 0);
  T_EQ_INT(checked_sum_int32(g, rank, size, 1 << 20), 0);

  /* float32: multiples of 1/4, so every partial sum is exact whatever the order */
  {
    int n = 4099;
    float* v = malloc(sizeof(float) * (size_t)n);
    T_ASSERT(v);
    for (int i = 0; i < n; i++) v[i] = (float)((i * 13 + rank * 5) % 29 - 14) * 0.25f;
    int shape[1] = {n};
    mlx_array x = mlx_array_new_data(v, shape, 1, MLX_FLOAT32), y = mlx_array_new();
    free(v);
    T_EQ_INT(mlx_distributed_all_sum(&y, x, g, mlx_stream_new()), 0);
    T_EQ_INT(mlx_array_eval(y), 0);
    const float* d = mlx_array_data_float32(y);
    for (int i = 0; i < n; i++) {
      double want = 0;
      for (int r = 0; r < size; r++) want += (double)((i * 13 + r * 5) % 29 - 14) * 0.25;
      if ((double)d[i] != want) T_FAIL("all_sum float32[%d] = %g, expected %g", i, d[i], want);
    }
    mlx_array_free(x);
    mlx_array_free(y);
  }

  /* all_gather: a [2, m] block per rank, stacked along the first axis in rank order */
  {
    int m = 1000;
    int32_t* v = malloc(sizeof(int32_t) * 2 * (size_t)m);
    T_ASSERT(v);
    for (int i = 0; i < 2 * m; i++) v[i] = (rank + 1) * 100000 + i;
    int shape[2] = {2, m};
    mlx_array x = mlx_array_new_data(v, shape, 2, MLX_INT32), y = mlx_array_new();
    free(v);
    T_EQ_INT(mlx_distributed_all_gather(&y, x, g, mlx_stream_new()), 0);
    T_EQ_INT(mlx_array_eval(y), 0);
    T_EQ_INT(mlx_array_ndim(y), 2);
    T_EQ_INT(mlx_array_shape(y)[0], 2 * size);
    T_EQ_INT(mlx_array_shape(y)[1], m);
    const int32_t* d = mlx_array_data_int32(y);
    for (int r = 0; r < size; r++)
      for (int i = 0; i < 2 * m; i++)
        if (d[r * 2 * m + i] != (r + 1) * 100000 + i)
          T_FAIL("all_gather: rank %d's element %d is %d", r, i, d[r * 2 * m + i]);
    mlx_array_free(x);
    mlx_array_free(y);
  }

  /* send/recv over every connection of the mesh, both directions: pair (a, b) in one fixed
   * order on every rank, so a send never waits on a receive posted later */
  for (int a = 0; a < size; a++) {
    for (int b = 0; b < size; b++) {
      if (a == b || (rank != a && rank != b)) continue;
      int n = 65537;
      int shape[1] = {n};
      if (rank == a) {
        int32_t* v = malloc(sizeof(int32_t) * (size_t)n);
        T_ASSERT(v);
        for (int i = 0; i < n; i++) v[i] = a * 1000003 + b * 1009 + i;
        mlx_array x = mlx_array_new_data(v, shape, 1, MLX_INT32), s = mlx_array_new();
        free(v);
        T_EQ_INT(mlx_distributed_send(&s, x, b, g, mlx_stream_new()), 0);
        T_EQ_INT(mlx_array_eval(s), 0);
        mlx_array_free(x);
        mlx_array_free(s);
      } else {
        mlx_array r = mlx_array_new();
        T_EQ_INT(mlx_distributed_recv(&r, shape, 1, MLX_INT32, a, g, mlx_stream_new()), 0);
        T_EQ_INT(mlx_array_eval(r), 0);
        const int32_t* d = mlx_array_data_int32(r);
        for (int i = 0; i < n; i++)
          if (d[i] != a * 1000003 + b * 1009 + i)
            T_FAIL("recv from rank %d: element %d is %d", a, i, d[i]);
        mlx_array_free(r);
      }
    }
  }
  T_EQ_INT(checked_sum_int32(g, rank, size, 1000), 0); /* still in step after the pairs */
  T_EXPECT_NO_ERROR();
  mlx_distributed_group_free(g);
  mlx_distributed_clear_backends();
  printf("netns_rank collectives: rank %d of %d passed\n", rank, size);
  return 0;
}

static int cutoff(const char* dir) {
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init(&g, true, "ring") != 0) T_FAIL("init ring: %s", t_last_error());
  int rank = mlx_distributed_group_rank(g), size = mlx_distributed_group_size(g);
  T_EQ_INT(checked_sum_int32(g, rank, size, 1000), 0);
  T_EXPECT_NO_ERROR();

  /* tell the driver this rank is running (rename: the file appears complete) */
  char tmp[512], path[512];
  snprintf(tmp, sizeof tmp, "%s/.ready.%d", dir, rank);
  snprintf(path, sizeof path, "%s/ready.%d", dir, rank);
  FILE* f = fopen(tmp, "w");
  T_ASSERT(f);
  fprintf(f, "%d\n", (int)getpid());
  T_ASSERT(fclose(f) == 0);
  T_ASSERT(rename(tmp, path) == 0);

  double t0 = now_s();
  long ok = 0;
  int rc = 0;
  while (now_s() - t0 < 90.0) {
    rc = checked_sum_int32(g, rank, size, 64);
    if (rc != 0) break;
    ok++;
    usleep(20000); /* a steady trickle of small ops, not a busy loop */
  }
  if (rc == 0) {
    fprintf(stderr, "netns_rank cutoff: rank %d: no operation failed in 90 s (%ld ops)\n", rank,
            ok);
    mlx_distributed_group_free(g);
    return 4;
  }
  /* the message, for the driver to check */
  fprintf(stderr, "netns_rank cutoff: rank %d: all_sum failed after %ld good ops: %s\n", rank, ok,
          t_last_error());
  mlx_distributed_group_free(g);
  mlx_distributed_clear_backends();
  return 3;
}

int main(int argc, char** argv) {
  t_capture_errors();
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char* mode = argc > 1 ? argv[1] : "";
  if (strcmp(mode, "collectives") == 0 && argc > 2) return collectives(atoi(argv[2]));
  if (strcmp(mode, "cutoff") == 0 && argc > 2) return cutoff(argv[2]);
  fprintf(stderr, "usage: netns_rank collectives N | netns_rank cutoff DIR\n");
  return 2;
}
