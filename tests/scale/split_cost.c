/* What a split costs one rank, and what its child's ops cost (issue 25, item 1;
 * docs/performance.md "split"). Public API only; run under mlxdist-launch -n N.
 *
 * A strict ring init, a 4-byte all_sum over the parent (every connection its
 * small ops need is made), then: a split by parity (timed), the child's
 * all_sum of 4 bytes and of 1 MiB (ITERS each after one warm-up, checked),
 * and the fds this rank holds before and after the split. One line per rank:
 *   split rank R n N split_ms S fds_before A fds_after B sum4_us U sum1m_us V ok
 * A failed check prints "split rank R FAILED: ..." on stderr and exits 1. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "mlx/c/array.h"
#include "mlx/c/distributed.h"
#include "mlx/c/distributed_group.h"
#include "mlx/c/stream.h"

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int open_fds(void) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  while (readdir(d)) n++;
  closedir(d);
  return n - 3; /* ".", ".." and the directory's own fd */
}

/* all_sum of count float32 (rank + 1 each) on g; 0 when every element is right. */
static int sum(mlx_distributed_group g, mlx_stream s, int count) {
  int size = mlx_distributed_group_size(g), rank = mlx_distributed_group_rank(g);
  float* v = malloc(sizeof(float) * (size_t)count);
  if (!v) return -1;
  for (int i = 0; i < count; i++) v[i] = (float)(rank + 1);
  int shape[1] = {count};
  mlx_array x = mlx_array_new_data(v, shape, 1, MLX_FLOAT32), y = mlx_array_new();
  int rc = mlx_distributed_all_sum(&y, x, g, s);
  if (rc == 0) rc = mlx_array_eval(y);
  if (rc == 0) {
    const float* d = mlx_array_data_float32(y);
    float want = (float)size * (float)(size + 1) / 2.0f;
    for (int i = 0; i < count && rc == 0; i++)
      if (d[i] != want) rc = -1;
  }
  mlx_array_free(x);
  mlx_array_free(y);
  free(v);
  return rc;
}

static double timed_sum_us(mlx_distributed_group g, mlx_stream s, int count, int iters, int* rc) {
  *rc = sum(g, s, count); /* warm-up */
  double t0 = now_us();
  for (int i = 0; i < iters && *rc == 0; i++) *rc = sum(g, s, count);
  return (now_us() - t0) / iters;
}

int main(int argc, char** argv) {
  int iters = argc > 1 ? atoi(argv[1]) : 20;
  if (iters < 1) iters = 1;
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init(&g, true, "ring") != 0) return 2;
  int rank = mlx_distributed_group_rank(g), n = mlx_distributed_group_size(g);
  mlx_stream s = mlx_default_cpu_stream_new();
  if (sum(g, s, 1) != 0) {
    fprintf(stderr, "split rank %d FAILED: the parent's all_sum\n", rank);
    return 1;
  }
  int before = open_fds();
  mlx_distributed_group c = mlx_distributed_group_new();
  double t0 = now_us();
  if (mlx_distributed_group_split(&c, g, rank % 2, rank) != 0) return 2;
  double split_ms = (now_us() - t0) / 1e3;
  int after = open_fds();
  int rc4 = 0, rc1m = 0;
  double us4 = timed_sum_us(c, s, 1, iters, &rc4);
  double us1m = timed_sum_us(c, s, 1 << 18, iters, &rc1m);
  if (rc4 || rc1m) {
    fprintf(stderr, "split rank %d FAILED: the child's all_sum (%s)\n", rank,
            rc4 ? "4 bytes" : "1 MiB");
    return 1;
  }
  printf(
      "split rank %d n %d split_ms %.2f fds_before %d fds_after %d sum4_us %.1f sum1m_us %.1f "
      "ok\n",
      rank, n, split_ms, before, after, us4, us1m);
  fflush(stdout);
  mlx_distributed_group_free(c);
  mlx_distributed_group_free(g);
  mlx_stream_free(s);
  return 0;
}
