/* The mpi backend's call checks (MLXDIST_CHECK=1), run under mpirun with 3
 * ranks (public API only).
 *
 *   mpi_check mismatch   every kind of mismatched call, each on a fresh group:
 *                        dtype, element count (1M vs 1M+1), reduce op, op
 *                        kind (all_sum vs all_gather, vs sum_scatter, vs
 *                        split; all_to_all vs all_gather of the same bytes),
 *                        all_to_all part size, send/recv byte count. Every rank involved
 *                        must fail with "mismatched calls: rank A called X,
 *                        rank B called Y", well before MLXDIST_TIMEOUT, and
 *                        the group's next op must fail fast with the same
 *                        words.
 *   mpi_check match      the same ops with matching calls still give the
 *                        right results (both ranks sending first included).
 *   mpi_check partial    rank 0 alone sets MLXDIST_CHECK=1 (before init),
 *                        the others unset it: the group still checks on
 *                        every rank.
 *
 * The test sets MLXDIST_TIMEOUT=20: a mismatch noticed by a timeout instead
 * of the check would take 20 s, and each case must end within 10 s. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mlx/c/mlx.h"
#include "testutil.h"

static int g_rank, g_size;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A fresh group: every case starts on a group nobody has failed yet. */
static mlx_distributed_group fresh_group(void) {
  T_EQ_INT(mlx_distributed_clear_backends(), 0);
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init(&g, true, "mpi") != 0) T_FAIL("init(mpi): %s", t_last_error());
  T_EQ_INT(mlx_distributed_group_get_rank(&g_rank, g), 0);
  T_EQ_INT(mlx_distributed_group_get_size(&g_size, g), 0);
  T_ASSERT(g_size == 3);
  return g;
}

static mlx_array filled(mlx_dtype d, size_t n, double v) {
  size_t esz = mlx_dtype_size(d);
  unsigned char* buf = calloc(n ? n : 1, esz);
  T_ASSERT(buf != NULL);
  for (size_t i = 0; i < n; i++) {
    if (d == MLX_FLOAT32) {
      float f = (float)v;
      memcpy(buf + i * esz, &f, esz);
    } else if (d == MLX_INT32) {
      int32_t x = (int32_t)v;
      memcpy(buf + i * esz, &x, esz);
    }
  }
  int shape[1] = {(int)n};
  mlx_array a = mlx_array_new_data(buf, shape, 1, d);
  free(buf);
  return a;
}

typedef enum { OP_SUM, OP_MAX, OP_GATHER, OP_SCATTER, OP_A2A, OP_SPLIT } coll;

/* Queue and evaluate one collective; returns eval's result (errors recorded). */
static int run_coll(mlx_distributed_group g, coll op, mlx_dtype d, size_t n) {
  mlx_array x = filled(d, n, 1), r = mlx_array_new();
  mlx_stream s = mlx_stream_new();
  int rc = 0;
  switch (op) {
    case OP_SUM: rc = mlx_distributed_all_sum(&r, x, g, s); break;
    case OP_MAX: rc = mlx_distributed_all_max(&r, x, g, s); break;
    case OP_GATHER: rc = mlx_distributed_all_gather(&r, x, g, s); break;
    case OP_SCATTER: rc = mlx_distributed_sum_scatter(&r, x, g, s); break;
    case OP_A2A: rc = mlx_distributed_all_to_all(&r, x, g, s); break;
    case OP_SPLIT: {
      mlx_distributed_group sub = mlx_distributed_group_new();
      rc = mlx_distributed_group_split(&sub, g, 0, g_rank);
      if (rc == 0) mlx_distributed_group_free(sub);
      mlx_array_free(x), mlx_array_free(r);
      return rc;
    }
  }
  if (rc == 0) rc = mlx_array_eval(r);
  mlx_array_free(x), mlx_array_free(r);
  return rc;
}

/* One collective mismatch: rank `odd` calls (op2, d2, n2), the others
 * (op1, d1, n1); every rank must fail with `want`. */
static void coll_case(const char* label, int odd, coll op1, mlx_dtype d1, size_t n1, coll op2,
                      mlx_dtype d2, size_t n2, const char* want) {
  mlx_distributed_group g = fresh_group();
  t_clear_errors();
  bool me = g_rank == odd;
  double t0 = now_s();
  int rc = run_coll(g, me ? op2 : op1, me ? d2 : d1, me ? n2 : n1);
  double dt = now_s() - t0;
  T_CHECKF(rc != 0, "%s: the mismatched call succeeded on rank %d", label, g_rank);
  T_CHECKF(strstr(t_last_error(), want) != NULL, "%s: rank %d got \"%s\", expected \"%s\"", label,
           g_rank, t_last_error(), want);
  T_CHECKF(strstr(t_last_error(), "[mpi] ") == t_last_error(), "%s: \"%s\"", label, t_last_error());
  T_CHECKF(dt < 10, "%s: took %.1f s", label, dt);
  /* The group failed: the next op fails at once, with the same words. */
  t_clear_errors();
  t0 = now_s();
  T_CHECKF(run_coll(g, OP_SUM, MLX_FLOAT32, 4) != 0, "%s: the next op succeeded", label);
  T_CHECKF(strstr(t_last_error(), want) != NULL, "%s: next op: \"%s\"", label, t_last_error());
  T_CHECKF(now_s() - t0 < 1, "%s: the next op took %.1f s", label, now_s() - t0);
  if (g_rank == 0) printf("%s: %s (%.3f s)\n", label, t_last_error(), dt);
  t_clear_errors();
  mlx_distributed_group_free(g);
}

/* Rank 0 sends 10 float32 (40 bytes), rank 1 receives 11 (44 bytes); rank
 * 2 takes no part. The receiver fails at its recv; the sender's send has
 * returned (sends do not wait for the receiver), and its next op on the
 * group, a recv from rank 1, fails with the same words once the answer
 * arrived. */
static void p2p_case(void) {
  const char* want = "mismatched calls: rank 0 called send(40 bytes), rank 1 called recv(44 bytes)";
  mlx_distributed_group g = fresh_group();
  t_clear_errors();
  mlx_stream s = mlx_stream_new();
  double t0 = now_s();
  if (g_rank == 0) {
    mlx_array x = filled(MLX_FLOAT32, 10, 1), r = mlx_array_new();
    T_EQ_INT(mlx_distributed_send(&r, x, 1, g, s), 0);
    (void)mlx_array_eval(r); /* may succeed: the check's answer comes later */
    mlx_array_free(r);
    t_clear_errors();
    r = mlx_array_new();
    int rc = mlx_distributed_recv_like(&r, x, 1, g, s);
    if (rc == 0) rc = mlx_array_eval(r);
    T_CHECKF(rc != 0, "p2p: rank 0's recv after the mismatched send succeeded");
    mlx_array_free(x), mlx_array_free(r);
  } else if (g_rank == 1) {
    mlx_array r = mlx_array_new();
    int shape[1] = {11};
    int rc = mlx_distributed_recv(&r, shape, 1, MLX_FLOAT32, 0, g, s);
    if (rc == 0) rc = mlx_array_eval(r);
    T_CHECKF(rc != 0, "p2p: the mismatched recv succeeded");
    mlx_array_free(r);
  }
  double dt = now_s() - t0;
  if (g_rank <= 1) {
    T_CHECKF(strstr(t_last_error(), want) != NULL, "p2p: rank %d got \"%s\"", g_rank,
             t_last_error());
    T_CHECKF(dt < 10, "p2p: took %.1f s", dt);
    printf("p2p, rank %d: %s (%.3f s)\n", g_rank, t_last_error(), dt);
  }
  t_clear_errors();
  mlx_distributed_group_free(g);
}

static int run_mismatch(void) {
  /* Rank 2 differs: the message names rank 0 and rank 2 on every rank. */
  coll_case("dtype", 2, OP_SUM, MLX_FLOAT32, 10, OP_SUM, MLX_INT32, 10,
            "mismatched calls: rank 0 called all_sum(float32 x 10), rank 2 called "
            "all_sum(int32 x 10)");
  coll_case("count 1M vs 1M+1", 1, OP_SUM, MLX_FLOAT32, 1u << 20, OP_SUM, MLX_FLOAT32,
            (1u << 20) + 1,
            "mismatched calls: rank 0 called all_sum(float32 x 1048576), rank 1 called "
            "all_sum(float32 x 1048577)");
  coll_case("reduce op", 1, OP_SUM, MLX_FLOAT32, 10, OP_MAX, MLX_FLOAT32, 10,
            "mismatched calls: rank 0 called all_sum(float32 x 10), rank 1 called "
            "all_max(float32 x 10)");
  coll_case("op kind", 1, OP_SUM, MLX_FLOAT32, 10, OP_GATHER, MLX_FLOAT32, 5,
            "mismatched calls: rank 0 called all_sum(float32 x 10), rank 1 called "
            "all_gather(20 bytes)");
  /* Rank 0 is the odd one: every other rank differs from it, rank 1 is named. */
  coll_case("sum_scatter vs all_sum", 0, OP_SUM, MLX_FLOAT32, 3, OP_SCATTER, MLX_FLOAT32, 6,
            "mismatched calls: rank 0 called sum_scatter(float32 x 2), rank 1 called "
            "all_sum(float32 x 3)");
  coll_case("split vs all_sum", 2, OP_SUM, MLX_FLOAT32, 10, OP_SPLIT, MLX_FLOAT32, 0,
            "mismatched calls: rank 0 called all_sum(float32 x 10), rank 2 called split");
  /* all_to_all (parts of 8 bytes) on ranks 0 and 2, all_gather of 8 bytes on rank 1. */
  coll_case("all_to_all vs all_gather", 1, OP_A2A, MLX_FLOAT32, 6, OP_GATHER, MLX_FLOAT32, 2,
            "mismatched calls: rank 0 called all_to_all(8 bytes a part), rank 1 called "
            "all_gather(8 bytes)");
  coll_case("all_to_all part size", 2, OP_A2A, MLX_FLOAT32, 6, OP_A2A, MLX_FLOAT32, 9,
            "mismatched calls: rank 0 called all_to_all(8 bytes a part), rank 2 called "
            "all_to_all(12 bytes a part)");
  p2p_case();
  printf("rank %d: mpi_check mismatch %s\n", g_rank, t_check_failures() ? "FAILED" : "OK");
  return t_exit_status();
}

static int run_match(void) {
  mlx_distributed_group g = fresh_group();
  mlx_stream s = mlx_stream_new();
  /* all_sum, all_max, all_gather, sum_scatter, all_to_all, split, with the check on. */
  mlx_array x = filled(MLX_FLOAT32, 6, 1), r = mlx_array_new();
  T_EQ_INT(mlx_distributed_all_sum(&r, x, g, s), 0);
  T_EQ_INT(mlx_array_eval(r), 0);
  T_CHECK(mlx_array_data_float32(r)[5] == 3.0f);
  T_EQ_INT(mlx_distributed_all_max(&r, x, g, s), 0);
  T_EQ_INT(mlx_array_eval(r), 0);
  T_CHECK(mlx_array_data_float32(r)[0] == 1.0f);
  T_EQ_INT(mlx_distributed_all_gather(&r, x, g, s), 0);
  T_EQ_INT(mlx_array_eval(r), 0);
  T_CHECK(mlx_array_size(r) == 18);
  T_EQ_INT(mlx_distributed_sum_scatter(&r, x, g, s), 0);
  T_EQ_INT(mlx_array_eval(r), 0);
  T_CHECK(mlx_array_size(r) == 2 && mlx_array_data_float32(r)[1] == 3.0f);
  /* all_to_all: part i of the result is rank i's part for this rank. */
  mlx_array y = filled(MLX_FLOAT32, 6, g_rank + 1);
  T_EQ_INT(mlx_distributed_all_to_all(&r, y, g, s), 0);
  T_EQ_INT(mlx_array_eval(r), 0);
  T_CHECK(mlx_array_size(r) == 6);
  for (int i = 0; i < 3; i++) T_CHECK(mlx_array_data_float32(r)[2 * i + 1] == (float)(i + 1));
  mlx_array_free(y);
  mlx_distributed_group sub = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_group_split(&sub, g, g_rank % 2, g_rank), 0);
  T_CHECK(mlx_distributed_group_size(sub) == (g_rank % 2 ? 1 : 2));
  mlx_distributed_group_free(sub);
  /* Both ranks send first (1 MiB), then receive, on one stream. */
  if (g_rank <= 1) {
    mlx_array big = filled(MLX_FLOAT32, 1u << 18, g_rank + 1), sent = mlx_array_new(),
              got = mlx_array_new();
    T_EQ_INT(mlx_distributed_send(&sent, big, 1 - g_rank, g, s), 0);
    T_EQ_INT(mlx_distributed_recv_like(&got, big, 1 - g_rank, g, s), 0);
    T_EQ_INT(mlx_array_eval(sent), 0);
    T_EQ_INT(mlx_array_eval(got), 0);
    T_CHECK(mlx_array_data_float32(got)[12345] == (float)(2 - g_rank));
    mlx_array_free(big), mlx_array_free(sent), mlx_array_free(got);
  }
  T_EQ_INT(mlx_distributed_all_sum(&r, x, g, s), 0);
  T_EQ_INT(mlx_array_eval(r), 0);
  mlx_array_free(x), mlx_array_free(r);
  mlx_distributed_group_free(g);
  T_EQ_INT(t_error_count(), 0);
  printf("rank %d: mpi_check match %s\n", g_rank, t_check_failures() ? "FAILED" : "OK");
  return t_exit_status();
}

static int run_partial(void) {
  const char* lr = getenv("OMPI_COMM_WORLD_RANK");
  if (!lr) lr = getenv("PMI_RANK");
  T_ASSERT(lr != NULL);
  if (atoi(lr) == 0)
    setenv("MLXDIST_CHECK", "1", 1);
  else
    unsetenv("MLXDIST_CHECK");
  coll_case("dtype, the check set on rank 0 only", 1, OP_SUM, MLX_FLOAT32, 10, OP_SUM, MLX_INT32,
            10,
            "mismatched calls: rank 0 called all_sum(float32 x 10), rank 1 called "
            "all_sum(int32 x 10)");
  printf("rank %d: mpi_check partial %s\n", g_rank, t_check_failures() ? "FAILED" : "OK");
  return t_exit_status();
}

int main(int argc, char** argv) {
  t_capture_errors();
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char* mode = argc > 1 ? argv[1] : "mismatch";
  if (strcmp(mode, "match") == 0) return run_match();
  if (strcmp(mode, "mismatch") == 0) return run_mismatch();
  if (strcmp(mode, "partial") == 0) return run_partial();
  fprintf(stderr, "usage: mpi_check mismatch|match|partial\n");
  return 2;
}
