/* One rank of a group on the example plugin (examples/plugin/uds.c, built out
 * of the tree against the installed package by check_plugin_kit.sh), through
 * the public API only. Usage: plugin_ranks MODE [BACKEND]
 *   ops        init "uds" strictly and check all_sum, all_max, all_min,
 *              all_gather, sum_scatter, send/recv (a ring of 4 MiB messages:
 *              every rank sends before it receives), and a split, against
 *              values computed here
 *   unconf     strict init must fail naming MLX_UDS_DIR; non-strict gives size 1
 *   alone      strict init must fail within 3 x MLXDIST_TIMEOUT naming rank 0
 *   die        rank 1 exits after init; rank 0's all_sum must fail naming rank 1
 *   unknown    strict init of BACKEND (no such plugin) must fail naming its file
 * Prints "plugin_ranks: MODE ok" on success, the reason and exit 1 on failure. */
#define _POSIX_C_SOURCE 200809L
#include <mlx/c/mlx.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static char last_error[4096];
static void on_error(const char* msg, void* data) {
  (void)data;
  snprintf(last_error, sizeof last_error, "%s", msg);
}

#define CHECK(cond)                                                                             \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      fprintf(stderr, "plugin_ranks rank %d: %s:%d: check failed: %s (last error: %s)\n", rank, \
              __FILE__, __LINE__, #cond, last_error);                                           \
      exit(1);                                                                                  \
    }                                                                                           \
  } while (0)

static int rank = -1;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const int32_t* ready_i32(mlx_array a) {
  CHECK(mlx_array_eval(a) == 0);
  return mlx_array_data_int32(a);
}

static void check_ops(mlx_distributed_group g, int size) {
  mlx_stream s = mlx_stream_new();
  mlx_array r = mlx_array_new();

  /* all_sum, all_max, all_min of 1000 int32: x[i] = rank * 1000 + i */
  enum { N = 1000 };
  int32_t* x = malloc(N * sizeof *x);
  CHECK(x);
  for (int i = 0; i < N; i++) x[i] = rank * 1000 + i;
  int shape[1] = {N};
  mlx_array a = mlx_array_new_data(x, shape, 1, MLX_INT32);
  CHECK(mlx_distributed_all_sum(&r, a, g, s) == 0);
  const int32_t* v = ready_i32(r);
  for (int i = 0; i < N; i++) CHECK(v[i] == 1000 * size * (size - 1) / 2 + size * i);
  CHECK(mlx_distributed_all_max(&r, a, g, s) == 0);
  v = ready_i32(r);
  for (int i = 0; i < N; i++) CHECK(v[i] == (size - 1) * 1000 + i);
  CHECK(mlx_distributed_all_min(&r, a, g, s) == 0);
  v = ready_i32(r);
  for (int i = 0; i < N; i++) CHECK(v[i] == i);

  /* all_sum of float32 (the host's kernels through the plugin) */
  mlx_array f = mlx_array_new_float32(0.5f + (float)rank);
  CHECK(mlx_distributed_all_sum(&r, f, g, s) == 0);
  float fs = 0;
  CHECK(mlx_array_item_float32(&fs, r) == 0);
  CHECK(fs == 0.5f * (float)size + (float)(size * (size - 1) / 2));

  /* all_gather: rank order along axis 0 */
  CHECK(mlx_distributed_all_gather(&r, a, g, s) == 0);
  v = ready_i32(r);
  CHECK(mlx_array_size(r) == (size_t)(N * size));
  for (int q = 0; q < size; q++)
    for (int i = 0; i < N; i++) CHECK(v[q * N + i] == q * 1000 + i);

  /* sum_scatter of size * 3 elements: block `rank` of the sum */
  int32_t y[3 * 8];
  for (int i = 0; i < 3 * size; i++) y[i] = (rank + 1) * (i + 1);
  int yshape[1] = {3 * size};
  mlx_array ya = mlx_array_new_data(y, yshape, 1, MLX_INT32);
  CHECK(mlx_distributed_sum_scatter(&r, ya, g, s) == 0);
  v = ready_i32(r);
  CHECK(mlx_array_size(r) == 3);
  for (int i = 0; i < 3; i++) CHECK(v[i] == size * (size + 1) / 2 * (rank * 3 + i + 1));

  /* send/recv around the ring, 4 MiB each: every rank sends first */
  enum { M = 1 << 20 };
  int32_t* big = malloc(M * sizeof *big);
  CHECK(big);
  for (int i = 0; i < M; i++) big[i] = rank * 7 + i;
  int bshape[1] = {M};
  mlx_array b = mlx_array_new_data(big, bshape, 1, MLX_INT32);
  int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  mlx_array sent = mlx_array_new();
  CHECK(mlx_distributed_send(&sent, b, next, g, s) == 0);
  CHECK(mlx_distributed_recv(&r, bshape, 1, MLX_INT32, prev, g, s) == 0);
  CHECK(mlx_array_eval(sent) == 0);
  v = ready_i32(r);
  for (int i = 0; i < M; i++) CHECK(v[i] == prev * 7 + i);

  /* split: even and odd ranks, keyed in reverse; sum of the parent ranks */
  mlx_distributed_group sub = mlx_distributed_group_new();
  CHECK(mlx_distributed_group_split(&sub, g, rank % 2, size - rank) == 0);
  int srank = -1, ssize = -1, expect_size = (size + 1 - rank % 2) / 2, expect_sum = 0, above = 0;
  for (int q = rank % 2; q < size; q += 2) expect_sum += q, above += q > rank;
  CHECK(mlx_distributed_group_get_rank(&srank, sub) == 0 && srank == above);
  CHECK(mlx_distributed_group_get_size(&ssize, sub) == 0 && ssize == expect_size);
  mlx_array me = mlx_array_new_int(rank);
  CHECK(mlx_distributed_all_sum(&r, me, sub, s) == 0);
  int32_t sum = -1;
  CHECK(mlx_array_item_int32(&sum, r) == 0 && sum == expect_sum);

  mlx_array_free(me);
  mlx_distributed_group_free(sub);
  mlx_array_free(sent), mlx_array_free(b), mlx_array_free(ya), mlx_array_free(f);
  mlx_array_free(a), mlx_array_free(r);
  mlx_stream_free(s);
  free(big), free(x);
}

int main(int argc, char** argv) {
  mlx_set_error_handler(on_error, NULL, NULL);
  const char* mode = argc > 1 ? argv[1] : "ops";
  const char* env_rank = getenv("MLX_RANK");
  rank = env_rank ? atoi(env_rank) : 0;
  mlx_distributed_group g = mlx_distributed_group_new();
  if (strcmp(mode, "ops") == 0 || strcmp(mode, "die") == 0) {
    CHECK(mlx_distributed_init(&g, true, "uds") == 0);
    int size = 0, grank = -1;
    CHECK(mlx_distributed_group_get_rank(&grank, g) == 0 && grank == rank);
    CHECK(mlx_distributed_group_get_size(&size, g) == 0);
    CHECK(size == atoi(getenv("MLX_WORLD_SIZE")));
    if (strcmp(mode, "ops") == 0) {
      check_ops(g, size);
    } else if (rank == 1) {
      printf("plugin_ranks: %s ok (rank %d)\n", mode, rank);
      fflush(stdout);
      _Exit(0); /* the peer is lost in the middle of the job */
    } else {
      mlx_stream s = mlx_stream_new();
      mlx_array x = mlx_array_new_int(1), r = mlx_array_new();
      int rc = mlx_distributed_all_sum(&r, x, g, s);
      if (rc == 0) rc = mlx_array_eval(r);
      CHECK(rc != 0);
      CHECK(strstr(last_error, "[uds] all_reduce #") && strstr(last_error, "rank 1"));
      fprintf(stderr, "rank 0 got: %s\n", last_error);
      mlx_array_free(x), mlx_array_free(r), mlx_stream_free(s);
    }
  } else if (strcmp(mode, "unconf") == 0) {
    CHECK(mlx_distributed_init(&g, true, "uds") != 0);
    CHECK(strstr(last_error, "MLX_UDS_DIR is not set"));
    fprintf(stderr, "strict init: %s\n", last_error);
    CHECK(mlx_distributed_init(&g, false, "uds") == 0);
    int size = 0;
    CHECK(mlx_distributed_group_get_size(&size, g) == 0 && size == 1);
  } else if (strcmp(mode, "alone") == 0) {
    double t0 = now_s(), limit = 3 * atof(getenv("MLXDIST_TIMEOUT"));
    CHECK(mlx_distributed_init(&g, true, "uds") != 0);
    double took = now_s() - t0;
    fprintf(stderr, "strict init alone (%.1f s): %s\n", took, last_error);
    CHECK(took < limit);
    CHECK(strstr(last_error, "rank 0 did not listen"));
  } else if (strcmp(mode, "unknown") == 0 && argc > 2) {
    CHECK(mlx_distributed_init(&g, true, argv[2]) != 0);
    char file[128];
    snprintf(file, sizeof file, "libmlxdist-%s.so", argv[2]);
    CHECK(strstr(last_error, "unknown backend") && strstr(last_error, file));
    fprintf(stderr, "strict init of %s: %s\n", argv[2], last_error);
    CHECK(!mlx_distributed_is_available(argv[2]));
  } else {
    fprintf(stderr, "usage: plugin_ranks ops|unconf|alone|die|unknown NAME\n");
    return 2;
  }
  mlx_distributed_group_free(g);
  printf("plugin_ranks: %s ok (rank %d)\n", mode, rank);
  return 0;
}
