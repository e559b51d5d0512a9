/* The ring backend started by a PMIx server, one rank program (public API):
 *
 *   pmix_check ok BACKEND N   strict init(BACKEND) gives a group of N ranks whose rank is
 *                             MLX_RANK when set (MLX's configuration keeps precedence), else
 *                             PMIX_RANK; an all_sum and a split work; clear_backends and a
 *                             second init (a second PMIx round) give the same group
 *   pmix_check both N [mpi-first]
 *                             init("ring") over PMIx and init("mpi") in one process (in this
 *                             order, or mpi first): both groups of N work, the exit is clean
 *                             (77: no mpi backend here)
 *   pmix_check fail TEXT...   strict init("ring") fails, its message holding every TEXT;
 *                             non-strict gives a group of one
 *   pmix_check late N SECS    the last of N ranks sleeps SECS before its init; the others'
 *                             strict init("ring") fails within MLXDIST_TIMEOUT + 5 s, naming
 *                             the PMIx fence; the late one's fails too, within the same bound
 *
 * Run under mpirun (tests/pmix/CMakeLists.txt) or srun --mpi=pmix (tests/slurm). */
#include <stdbool.h>
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

static void check_sum(mlx_distributed_group g) {
  int rank = mlx_distributed_group_rank(g), size = mlx_distributed_group_size(g);
  int32_t v[3] = {rank, 1, 7 * rank};
  int shape[1] = {3};
  mlx_array x = mlx_array_new_data(v, shape, 1, MLX_INT32), y = mlx_array_new();
  T_EQ_INT(mlx_distributed_all_sum(&y, x, g, mlx_stream_new()), 0);
  T_REQUIREF(mlx_array_eval(y) == 0, "all_sum: %s", t_last_error());
  const int32_t* d = mlx_array_data_int32(y);
  T_EQ_INT(d[0], size * (size - 1) / 2);
  T_EQ_INT(d[1], size);
  T_EQ_INT(d[2], 7 * size * (size - 1) / 2);
  mlx_array_free(x);
  mlx_array_free(y);
}

static int mode_ok(const char* bk, int n) {
  int want = t_env_int("MLX_RANK", -1);
  if (want < 0) want = t_env_int("PMIX_RANK", -1);
  T_REQUIREF(want >= 0, "neither MLX_RANK nor PMIX_RANK is set: not under a PMIx server");
  for (int round = 0; round < 2; round++) {
    mlx_distributed_group g = mlx_distributed_group_new();
    T_REQUIREF(mlx_distributed_init(&g, true, bk) == 0, "init(%s): %s", bk, t_last_error());
    T_EQ_INT(mlx_distributed_group_size(g), n);
    T_EQ_INT(mlx_distributed_group_rank(g), want);
    check_sum(g);
    mlx_distributed_group sub = mlx_distributed_group_new();
    T_EQ_INT(mlx_distributed_group_split(&sub, g, want % 2, n - want), 0);
    T_EQ_INT(mlx_distributed_group_size(sub), (n - want % 2 + 1) / 2);
    if (mlx_distributed_group_size(sub) > 1) check_sum(sub);
    mlx_distributed_group_free(sub);
    mlx_distributed_group_free(g);
    T_EQ_INT(mlx_distributed_clear_backends(), 0);
  }
  T_EXPECT_NO_ERROR();
  printf("pmix_check: rank %d of %d (%s): ok\n", want, n, bk);
  return 0;
}

/* init("ring") over PMIx and init("mpi") in one process: PMIx is initialised twice
 * (counted), both groups work, the process exits cleanly (MPI_Finalize, then PMIx_Finalize). */
static int mode_both(int n, bool mpi_first) {
  int want = t_env_int("PMIX_RANK", -1);
  T_REQUIREF(want >= 0, "PMIX_RANK is not set: not under a PMIx server");
  if (!mlx_distributed_is_available("mpi")) {
    printf("pmix_check: the mpi backend is not available here: skipped\n");
    return 77;
  }
  /* the same order on every rank: each init is collective (MPI_Init fences through PMIx too) */
  const char* order[2][2] = {{"ring", "mpi"}, {"mpi", "ring"}};
  const char* const* o = order[mpi_first ? 1 : 0];
  mlx_distributed_group g[2];
  for (int i = 0; i < 2; i++) {
    g[i] = mlx_distributed_group_new();
    T_REQUIREF(mlx_distributed_init(&g[i], true, o[i]) == 0, "init(%s): %s", o[i], t_last_error());
    T_EQ_INT(mlx_distributed_group_size(g[i]), n);
    T_EQ_INT(mlx_distributed_group_rank(g[i]), want);
  }
  for (int i = 0; i < 2; i++) check_sum(g[i]);
  for (int i = 0; i < 2; i++) mlx_distributed_group_free(g[i]);
  T_EXPECT_NO_ERROR();
  printf("pmix_check: rank %d of %d: ring over PMIx and mpi in one process: ok\n", want, n);
  return 0;
}

static int mode_fail(int argc, char** argv) {
  mlx_distributed_group g = mlx_distributed_group_new();
  T_ASSERT(mlx_distributed_init(&g, true, "ring") != 0);
  const char* msg = t_last_error();
  for (int i = 0; i < argc; i++)
    T_REQUIREF(strstr(msg, argv[i]) != NULL, "the error does not say '%s': %s", argv[i], msg);
  printf("pmix_check: init failed as expected: %s\n", msg);
  t_clear_errors();
  T_EQ_INT(mlx_distributed_init(&g, false, "ring"), 0);
  T_EQ_INT(mlx_distributed_group_size(g), 1);
  mlx_distributed_group_free(g);
  return 0;
}

static int mode_late(int n, int secs) {
  int me = t_env_int("PMIX_RANK", -1);
  T_REQUIREF(me >= 0, "PMIX_RANK is not set: not under a PMIx server");
  /* the late rank comes after the others gave up: its init fails too (its peers are
   * gone), within the same bound; it calls init so that the launcher sees a PMIx client */
  if (me == n - 1) sleep((unsigned)secs);
  double bound = t_env_int("MLXDIST_TIMEOUT", 60) + 5.0;
  double t0 = now_s();
  mlx_distributed_group g = mlx_distributed_group_new();
  T_ASSERT(mlx_distributed_init(&g, true, "ring") != 0);
  double took = now_s() - t0;
  const char* msg = t_last_error();
  if (me != n - 1)
    T_REQUIREF(strstr(msg, "PMIx_Fence") != NULL, "the error does not name the fence: %s", msg);
  T_REQUIREF(took < bound, "init took %.1f s (bound %.1f s)", took, bound);
  printf("pmix_check: rank %d: init failed after %.1f s: %s\n", me, took, msg);
  t_clear_errors();
  return 0;
}

int main(int argc, char** argv) {
  t_capture_errors();
  if (argc >= 4 && strcmp(argv[1], "ok") == 0) return mode_ok(argv[2], atoi(argv[3]));
  if (argc >= 3 && strcmp(argv[1], "both") == 0)
    return mode_both(atoi(argv[2]), argc >= 4 && strcmp(argv[3], "mpi-first") == 0);
  if (argc >= 3 && strcmp(argv[1], "fail") == 0) return mode_fail(argc - 2, argv + 2);
  if (argc >= 4 && strcmp(argv[1], "late") == 0) return mode_late(atoi(argv[2]), atoi(argv[3]));
  fprintf(stderr,
          "usage: pmix_check ok BACKEND N | both N [mpi-first] | fail TEXT... | late N SECS\n");
  return 2;
}
