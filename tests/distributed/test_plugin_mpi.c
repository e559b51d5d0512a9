/* The mpi plugin as loaded through a given ABI version, under mpirun:
 *
 *   test_plugin_mpi <abi version 1|2|3|4> <directory the plugin must come from>
 *
 * MLXDIST_PLUGIN_PATH points at the directory. Versions 1, 2 and 3 are the
 * mpi plugin source built again against the frozen plugin_v1.h, plugin_v2.h
 * and plugin_v3.h (tests/distributed/plugin_v1): they must still load and
 * work after v4 exists (v1 and v2 through the plain ops, on staging copies;
 * v3 through the *_ref ops), v1's describe op (new in v2) must be reported
 * absent, and all_to_all (new in v4) must be refused by name, with nothing
 * sent and the group still usable. Version 4 is the real plugin: describe
 * present and naming the MPI library, every op through run on the caller's
 * arrays, all_to_all exact.
 * Checks: strict init("mpi") gives the launcher's rank and size; all_sum,
 * all_max, all_min, all_gather, all_to_all, sum_scatter, send/recv around
 * the ring, and split (parity, and into groups of one, which the front-end
 * serves with the size-one backend) give exact results. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distributed/group_impl.h"
#include "mlx/c/mlx.h"
#include "testutil.h"

static int g_rank, g_size, g_abi;

static void eval_ok(mlx_array a, const char* what) {
  if (mlx_array_eval(a) != 0) T_FAIL("%s: eval failed: %s", what, t_last_error());
}

static void expect_i32(mlx_array a, const int32_t* want, size_t n, const char* what) {
  eval_ok(a, what);
  T_EQ_INT((int)mlx_array_size(a), (int)n);
  const int32_t* got = mlx_array_data_int32(a);
  for (size_t i = 0; i < n; i++)
    if (got[i] != want[i])
      T_FAIL("%s: element %zu is %d, expected %d (rank %d of %d)", what, i, got[i], want[i], g_rank,
             g_size);
}

/* rank r's element i */
static int32_t val(int r, size_t i) { return (int32_t)((i * 7 + (size_t)r * 13) % 61) - 30; }

static void check_collectives(mlx_distributed_group g, int rank, int size) {
  enum { N = 1000 };
  int32_t* buf = malloc(sizeof(int32_t) * N * (size_t)size);
  int32_t* want = malloc(sizeof(int32_t) * N * (size_t)size);
  T_ASSERT(buf && want);
  for (size_t i = 0; i < N; i++) buf[i] = val(rank, i);
  int shape[1] = {N};
  mlx_array x = mlx_array_new_data(buf, shape, 1, MLX_INT32), res = mlx_array_new();
  mlx_stream s = mlx_stream_new();

  T_EQ_INT(mlx_distributed_all_sum(&res, x, g, s), 0);
  for (size_t i = 0; i < N; i++) {
    want[i] = 0;
    for (int r = 0; r < size; r++) want[i] += val(r, i);
  }
  expect_i32(res, want, N, "all_sum");

  T_EQ_INT(mlx_distributed_all_max(&res, x, g, s), 0);
  for (size_t i = 0; i < N; i++) {
    want[i] = val(0, i);
    for (int r = 1; r < size; r++) want[i] = val(r, i) > want[i] ? val(r, i) : want[i];
  }
  expect_i32(res, want, N, "all_max");

  T_EQ_INT(mlx_distributed_all_min(&res, x, g, s), 0);
  for (size_t i = 0; i < N; i++) {
    want[i] = val(0, i);
    for (int r = 1; r < size; r++) want[i] = val(r, i) < want[i] ? val(r, i) : want[i];
  }
  expect_i32(res, want, N, "all_min");

  T_EQ_INT(mlx_distributed_all_gather(&res, x, g, s), 0);
  for (int r = 0; r < size; r++)
    for (size_t i = 0; i < N; i++) want[(size_t)r * N + i] = val(r, i);
  expect_i32(res, want, N * (size_t)size, "all_gather");

  /* all_to_all of size parts of 7: part j goes to rank j. Plugins of ABI
   * v1-v3 refuse it by name (every rank alike, nothing sent); the ops
   * below then show the group still works, in step. */
  int ashape[1] = {7 * size};
  for (size_t i = 0; i < (size_t)ashape[0]; i++) buf[i] = val(rank, i) + (int32_t)i * 100;
  mlx_array xa = mlx_array_new_data(buf, ashape, 1, MLX_INT32);
  if (g_abi >= 4 || size == 1) {
    T_EQ_INT(mlx_distributed_all_to_all(&res, xa, g, s), 0);
    for (int r = 0; r < size; r++)
      for (size_t i = 0; i < 7; i++) {
        size_t at = (size_t)rank * 7 + i; /* rank r's element sent to us */
        want[(size_t)r * 7 + i] = val(r, at) + (int32_t)at * 100;
      }
    expect_i32(res, want, 7 * (size_t)size, "all_to_all");
  } else {
    /* Refused at the call, before it takes a sequence number: the plugin's
     * turnstile never waits for a number it was not given. */
    T_EQ_INT(mlx_distributed_all_to_all(&res, xa, g, s), MLXD_EUNAVAIL);
    char abi_text[64];
    snprintf(abi_text, sizeof abi_text, "speaks plugin ABI v%d; all_to_all needs v4", g_abi);
    T_EXPECT_ERROR("[mpi] all_to_all is not supported by this plugin", abi_text);
  }
  mlx_array_free(xa);

  /* sum_scatter of size * 10 elements: block `rank` of the sum */
  int sshape[1] = {10 * size};
  for (size_t i = 0; i < (size_t)sshape[0]; i++) buf[i] = val(rank, i);
  mlx_array xs = mlx_array_new_data(buf, sshape, 1, MLX_INT32);
  T_EQ_INT(mlx_distributed_sum_scatter(&res, xs, g, s), 0);
  for (size_t i = 0; i < 10; i++) {
    want[i] = 0;
    for (int r = 0; r < size; r++) want[i] += val(r, (size_t)rank * 10 + i);
  }
  expect_i32(res, want, 10, "sum_scatter");
  mlx_array_free(xs);

  if (size >= 2) { /* send to the next rank, receive from the previous one */
    int next = (rank + 1) % size, prev = (rank + size - 1) % size;
    for (size_t i = 0; i < N; i++) buf[i] = val(rank, i) * 3;
    mlx_array xp = mlx_array_new_data(buf, shape, 1, MLX_INT32), sent = mlx_array_new();
    T_EQ_INT(mlx_distributed_send(&sent, xp, next, g, s), 0);
    T_EQ_INT(mlx_distributed_recv(&res, shape, 1, MLX_INT32, prev, g, s), 0);
    for (size_t i = 0; i < N; i++) want[i] = val(prev, i) * 3;
    expect_i32(res, want, N, "recv from the previous rank");
    eval_ok(sent, "send to the next rank");
    mlx_array_free(xp);
    mlx_array_free(sent);
  } else { /* a group of one: no peer */
    mlx_array sent = mlx_array_new();
    T_ASSERT(mlx_distributed_send(&sent, x, 0, g, s) != 0);
    T_EXPECT_ERROR("send/recv need a group of at least two processes");
    mlx_array_free(sent);
  }
  mlx_array_free(x);
  mlx_array_free(res);
  mlx_stream_free(s);
  free(buf);
  free(want);
  T_EXPECT_NO_ERROR();
}

int main(int argc, char** argv) {
  if (argc != 3) T_FAIL("usage: test_plugin_mpi <abi version 1|2|3|4> <plugin directory>");
  int abi = atoi(argv[1]);
  g_abi = abi;
  const char* dir = argv[2];
  t_capture_errors();
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init(&g, true, "mpi") != 0) T_FAIL("init(mpi): %s", t_last_error());
  g_rank = mlx_distributed_group_rank(g);
  g_size = mlx_distributed_group_size(g);
  T_EQ_INT(g_rank, t_env_int("OMPI_COMM_WORLD_RANK", t_env_int("PMI_RANK", g_rank)));
  T_ASSERT(g_size >= 2);

  /* Loaded from the expected file, through the expected ABI, and the v2-only
   * op present exactly when the plugin speaks v2. */
  char line[2048], want[1200];
  mlxd_group_describe(mlxd_group_of(g), line, sizeof line);
  printf("rank %d: %s\n", g_rank, line);
  snprintf(want, sizeof want, "(plugin %s/libmlxdist-mpi.so, ABI v%d", dir, abi);
  if (!strstr(line, want)) T_FAIL("describe: '%s' lacks '%s'", line, want);
  if (abi == 1) {
    if (!strstr(line, "ABI v1: no describe op"))
      T_FAIL("describe: '%s' (v1 has no describe)", line);
  } else {
    if (strstr(line, "no describe op") || !strstr(line, "MPI"))
      T_FAIL("describe: '%s' (expected the plugin's own text, naming MPI)", line);
  }

  check_collectives(g, g_rank, g_size);

  /* split by parity (reversed order), then into groups of one */
  mlx_distributed_group sub = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_group_split(&sub, g, g_rank % 2, g_size - g_rank), 0);
  int members = 0;
  for (int r = 0; r < g_size; r++) members += r % 2 == g_rank % 2;
  T_EQ_INT(mlx_distributed_group_size(sub), members);
  check_collectives(sub, mlx_distributed_group_rank(sub), members);

  mlx_distributed_group solo = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_group_split(&solo, g, g_rank, 0), 0);
  T_EQ_INT(mlx_distributed_group_size(solo), 1);
  mlxd_group_describe(mlxd_group_of(solo), line, sizeof line);
  if (!strstr(line, "rank 0 of 1: the size-one group"))
    T_FAIL("a split into groups of one: '%s' (expected the size-one backend)", line);
  check_collectives(solo, 0, 1);

  mlx_distributed_group_free(solo);
  mlx_distributed_group_free(sub);
  mlx_distributed_group_free(g);
  T_EXPECT_NO_ERROR();
  printf("test_plugin_mpi (ABI v%d) rank %d of %d: ok\n", abi, g_rank, g_size);
  return 0;
}
