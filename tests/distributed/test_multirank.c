/* The front-end on a real group of N ranks (run under mlxdist-launch):
 * argument errors that only a group of two or more can reach, the default
 * group, result shapes, send's result, every pair of ranks talking, split,
 * and a group that outlives clear_backends. Expected values are computed
 * here from the ranks, independently of the library. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mlx/c/mlx.h"
#include "testutil.h"

static int g_rank, g_size;

static void expect_int32(mlx_array a, const int32_t* want, size_t n, const char* what) {
  if (mlx_array_eval(a) != 0) T_FAIL("%s: eval failed: %s", what, t_last_error());
  T_EQ_INT(mlx_array_size(a), n);
  T_EQ_INT(mlx_array_dtype(a), MLX_INT32);
  const int32_t* d = mlx_array_data_int32(a);
  T_ASSERT(d != NULL);
  for (size_t i = 0; i < n; i++)
    if (d[i] != want[i]) T_FAIL("%s: element %zu is %d, expected %d", what, i, d[i], want[i]);
}

static void test_errors(mlx_distributed_group g) {
  mlx_stream s = mlx_stream_new();
  mlx_array res = mlx_array_new();
  int32_t v[3] = {1, 2, 3};
  int shape[1] = {3};
  mlx_array x = mlx_array_new_data(v, shape, 1, MLX_INT32);
  const int bad[] = {g_rank, g_size, -1, g_size + 5};
  const char* want[] = {"own rank", "not a rank of this group", "not a rank of this group",
                        "not a rank of this group"};
  for (int i = 0; i < 4; i++) {
    T_ASSERT(mlx_distributed_send(&res, x, bad[i], g, s) != 0);
    T_EXPECT_ERROR("[distributed] send: dst is", want[i]);
    T_ASSERT(mlx_distributed_recv(&res, shape, 1, MLX_INT32, bad[i], g, s) != 0);
    T_EXPECT_ERROR("[distributed] recv: src is", want[i]);
    T_ASSERT(mlx_distributed_recv_like(&res, x, bad[i], g, s) != 0);
    T_EXPECT_ERROR("[distributed] recv_like: src is", want[i]);
  }
  /* axis 0 not a multiple of the size */
  int odd[2] = {g_size + 1, 2};
  int32_t* buf = calloc((size_t)(g_size + 1) * 2, sizeof(int32_t));
  mlx_array y = mlx_array_new_data(buf, odd, 2, MLX_INT32);
  T_ASSERT(mlx_distributed_sum_scatter(&res, y, g, s) != 0);
  T_EXPECT_ERROR("[distributed] sum_scatter", "does not divide by the group size");
  T_ASSERT(res.ctx == NULL);
  mlx_array_free(y);
  free(buf);
  mlx_array_free(x);
  /* none of that queued anything: a collective still lines up on every rank */
  mlx_array one = mlx_array_new_int(1);
  T_EQ_INT(mlx_distributed_all_sum(&res, one, g, s), 0);
  int32_t n = g_size;
  expect_int32(res, &n, 1, "all_sum after errors");
  mlx_array_free(one);
  mlx_array_free(res);
}

static void test_shapes(mlx_distributed_group g) {
  /* all_gather of a 0-d array: shape [size], rank order */
  mlx_array r = mlx_array_new_int(g_rank * 10);
  mlx_array res = mlx_array_new();
  T_EQ_INT(mlx_distributed_all_gather(&res, r, g, mlx_stream_new()), 0);
  T_EQ_INT(mlx_array_ndim(res), 1);
  T_EQ_INT(mlx_array_shape(res)[0], g_size);
  int32_t want[64];
  for (int i = 0; i < g_size; i++) want[i] = i * 10;
  expect_int32(res, want, (size_t)g_size, "all_gather 0-d");

  /* all_gather [2,3] -> [2*size,3]; sum_scatter [2*size,3] -> [2,3] */
  int32_t v[6];
  for (int i = 0; i < 6; i++) v[i] = g_rank * 6 + i;
  int shape[2] = {2, 3};
  mlx_array x = mlx_array_new_data(v, shape, 2, MLX_INT32);
  T_EQ_INT(mlx_distributed_all_gather(&res, x, g, mlx_stream_new()), 0);
  T_EQ_INT(mlx_array_shape(res)[0], 2 * g_size);
  T_EQ_INT(mlx_array_shape(res)[1], 3);
  int32_t* all = malloc(sizeof(int32_t) * 6 * (size_t)g_size);
  for (int i = 0; i < 6 * g_size; i++) all[i] = i; /* rank r's block is r*6 .. r*6+5 */
  expect_int32(res, all, 6 * (size_t)g_size, "all_gather [2,3]");

  mlx_array z = mlx_array_new();
  T_EQ_INT(mlx_distributed_sum_scatter(&z, res, g, mlx_stream_new()), 0);
  T_EQ_INT(mlx_array_ndim(z), 2);
  T_EQ_INT(mlx_array_shape(z)[0], 2); /* [2*size, 3] scattered over size ranks */
  T_EQ_INT(mlx_array_shape(z)[1], 3);
  /* every rank contributed the same gathered array: block `rank` times size */
  int32_t exp[6];
  for (int i = 0; i < 6; i++) exp[i] = all[g_rank * 6 + i] * g_size;
  expect_int32(z, exp, 6, "sum_scatter");
  free(all);
  mlx_array_free(z);
  mlx_array_free(x);
  mlx_array_free(r);
  mlx_array_free(res);
}

/* Every rank sends to every other rank, sends posted before receives. */
static void test_all_pairs(mlx_distributed_group g) {
  int n = 1000;
  int shape[1] = {n};
  mlx_array sent[64], got[64];
  int32_t* buf = malloc(sizeof(int32_t) * (size_t)n);
  for (int p = 0; p < g_size; p++) {
    sent[p] = got[p] = mlx_array_new();
    if (p == g_rank) continue;
    for (int i = 0; i < n; i++) buf[i] = g_rank * 1000000 + p * 1000 + i;
    mlx_array x = mlx_array_new_data(buf, shape, 1, MLX_INT32);
    T_EQ_INT(mlx_distributed_send(&sent[p], x, p, g, mlx_stream_new()), 0);
    mlx_array_free(x); /* the result keeps the data alive */
  }
  for (int p = 0; p < g_size; p++) {
    if (p == g_rank) continue;
    T_EQ_INT(mlx_distributed_recv(&got[p], shape, 1, MLX_INT32, p, g, mlx_stream_new()), 0);
  }
  for (int p = 0; p < g_size; p++) {
    if (p == g_rank) continue;
    for (int i = 0; i < n; i++) buf[i] = g_rank * 1000000 + p * 1000 + i;
    expect_int32(sent[p], buf, (size_t)n, "send result");
    for (int i = 0; i < n; i++) buf[i] = p * 1000000 + g_rank * 1000 + i;
    expect_int32(got[p], buf, (size_t)n, "recv");
    mlx_array_free(sent[p]);
    mlx_array_free(got[p]);
  }
  free(buf);
  T_EXPECT_NO_ERROR();
}

static void test_split(mlx_distributed_group g) {
  mlx_distributed_group s = mlx_distributed_group_new();
  int color = g_rank % 2;
  T_EQ_INT(mlx_distributed_group_split(&s, g, color, g_size - g_rank), 0); /* reversed order */
  int members = 0, my_pos = 0;
  for (int r = 0; r < g_size; r++)
    if (r % 2 == color) members++;
  for (int r = g_size - 1; r > g_rank; r--)
    if (r % 2 == color) my_pos++;
  T_EQ_INT(mlx_distributed_group_size(s), members);
  T_EQ_INT(mlx_distributed_group_rank(s), my_pos);
  mlx_array x = mlx_array_new_int(g_rank + 1), res = mlx_array_new();
  T_EQ_INT(mlx_distributed_all_sum(&res, x, s, mlx_stream_new()), 0);
  int32_t want = 0;
  for (int r = 0; r < g_size; r++)
    if (r % 2 == color) want += r + 1;
  expect_int32(res, &want, 1, "all_sum over the split group");
  mlx_array_free(x);
  mlx_array_free(res);
  mlx_distributed_group_free(s);
  T_EXPECT_NO_ERROR();
}

/* A split into groups of one: the front-end serves them with the size-one
 * backend (backends never see size 1): collectives give the input
 * unchanged, shape included, and send/recv have no valid peer. */
static void test_singletons(mlx_distributed_group g) {
  mlx_distributed_group s = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_group_split(&s, g, g_rank, 0), 0);
  T_EQ_INT(mlx_distributed_group_size(s), 1);
  T_EQ_INT(mlx_distributed_group_rank(s), 0);
  mlx_array x = mlx_array_new_int(g_rank + 5), res = mlx_array_new();
  int32_t want = g_rank + 5;
  T_EQ_INT(mlx_distributed_all_sum(&res, x, s, mlx_stream_new()), 0);
  expect_int32(res, &want, 1, "all_sum over a group of one");
  T_EQ_INT(mlx_distributed_all_gather(&res, x, s, mlx_stream_new()), 0);
  T_EQ_INT((int)mlx_array_ndim(res), 0); /* the input unchanged: still 0-d */
  expect_int32(res, &want, 1, "all_gather over a group of one");
  T_ASSERT(mlx_distributed_send(&res, x, 0, s, mlx_stream_new()) != 0);
  T_EXPECT_ERROR("[distributed] send", "at least two processes");
  /* a split of a group of one is another */
  mlx_distributed_group s2 = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_group_split(&s2, s, 3, -1), 0);
  T_EQ_INT(mlx_distributed_group_size(s2), 1);
  mlx_distributed_group_free(s2);
  mlx_array_free(x);
  mlx_array_free(res);
  mlx_distributed_group_free(s);
  T_EXPECT_NO_ERROR();
}

int main(void) {
  t_capture_errors();
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init(&g, true, NULL) != 0) T_FAIL("init: %s", t_last_error());
  g_rank = mlx_distributed_group_rank(g);
  g_size = mlx_distributed_group_size(g);
  T_ASSERT(g_size >= 2 && g_size <= 64);

  /* cached: non-strict and named inits give the same group */
  mlx_distributed_group g2 = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_init(&g2, false, "any"), 0);
  T_ASSERT(g2.ctx == g.ctx);
  mlx_distributed_group_free(g2);

  /* the empty group handle is that group */
  mlx_array x = mlx_array_new_int(g_rank), res = mlx_array_new();
  T_EQ_INT(mlx_distributed_all_sum(&res, x, mlx_distributed_group_new(), mlx_stream_new()), 0);
  int32_t want = g_size * (g_size - 1) / 2;
  expect_int32(res, &want, 1, "all_sum on the default group");
  mlx_array_free(x);
  mlx_array_free(res);

  test_errors(g);
  test_shapes(g);
  test_all_pairs(g);
  test_split(g);
  test_singletons(g);

  /* clear_backends: the held handle keeps working */
  T_EQ_INT(mlx_distributed_clear_backends(), 0);
  test_all_pairs(g);
  mlx_distributed_group_free(g);
  T_EXPECT_NO_ERROR();
  printf("test_dist_multirank rank %d of %d: ok\n", g_rank, g_size);
  return 0;
}
