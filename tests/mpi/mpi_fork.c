/* Fork safety under the mpi plugin (docs/api.md "Fork"), 2 ranks under the
 * MPI launcher: rank 0 forks after an all_sum; the child's all_sum and split
 * fail at once with "[mpi] all_sum #1: this group was made by process P;
 * process C (a fork of it) cannot use it", then it frees the group, clears
 * the backends and exit()s: the plugin's exit hook must neither finalize MPI
 * nor join its progress thread there (a hang, or the parent's MPI
 * disturbed). The parent and rank 1 then run two checked all_sums. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mlx/c/mlx.h"
#include "ranks.h"
#include "testutil.h"

#define N 257

static void all_sum_checked(mlx_distributed_group g, float salt) {
  int rank = mlx_distributed_group_rank(g), size = mlx_distributed_group_size(g);
  float v[N];
  for (int i = 0; i < N; i++) v[i] = (float)(rank * 1000 + i) + salt;
  int shape[1] = {N};
  mlx_array x = mlx_array_new_data(v, shape, 1, MLX_FLOAT32), y = mlx_array_new();
  T_REQUIREF(mlx_distributed_all_sum(&y, x, g, mlx_stream_new()) == 0, "%s", t_last_error());
  T_REQUIREF(mlx_array_eval(y) == 0, "all_sum: %s", t_last_error());
  const float* d = mlx_array_data_float32(y);
  for (int i = 0; i < N; i++) {
    float want = 0;
    for (int r = 0; r < size; r++) want += (float)(r * 1000 + i) + salt;
    if (d[i] != want) T_FAIL("all_sum[%d] = %g, expected %g", i, (double)d[i], (double)want);
  }
  mlx_array_free(y);
  mlx_array_free(x);
}

static int child(mlx_distributed_group g) {
  char want[160];
  snprintf(want, sizeof want,
           "this group was made by process %ld; process %ld (a fork of it) cannot use it",
           (long)getppid(), (long)getpid());
  int shape[1] = {N};
  float v[N] = {0};
  mlx_array x = mlx_array_new_data(v, shape, 1, MLX_FLOAT32), y = mlx_array_new();
  int bad = 0;
  double t0 = t_now();
  int rc = mlx_distributed_all_sum(&y, x, g, mlx_stream_new());
  if (rc == 0 || !strstr(t_last_error(), want) ||
      strncmp(t_last_error(), "[mpi] all_sum #1: ", 18) != 0 || t_now() - t0 > 2.0) {
    fprintf(stderr, "child: all_sum gave %d: '%s'\n", rc, t_last_error());
    bad++;
  }
  t_clear_errors();
  mlx_distributed_group sub = mlx_distributed_group_new();
  rc = mlx_distributed_group_split(&sub, g, 0, 0);
  if (rc == 0 || !strstr(t_last_error(), want)) {
    fprintf(stderr, "child: split gave %d: '%s'\n", rc, t_last_error());
    bad++;
  }
  t_clear_errors();
  mlx_array_free(y);
  mlx_array_free(x);
  mlx_distributed_group_free(g);
  mlx_distributed_clear_backends();
  return bad ? 1 : 0;
}

int main(void) {
  t_capture_errors();
  mlx_distributed_group g = mlx_distributed_group_new();
  T_REQUIREF(mlx_distributed_init(&g, true, "mpi") == 0, "init: %s", t_last_error());
  T_EQ_INT(mlx_distributed_group_size(g), 2);
  int rank = mlx_distributed_group_rank(g);
  all_sum_checked(g, 0.5f);
  if (rank == 0) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    T_ASSERT(pid >= 0);
    if (pid == 0) exit(child(g));
    double end = t_now() + 30;
    int status = 0;
    pid_t r;
    while ((r = waitpid(pid, &status, WNOHANG)) == 0 && t_now() < end) usleep(10000);
    if (r == 0) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      T_FAIL("the forked child did not end within 30 s (hung)");
    }
    T_REQUIREF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the forked child failed (status %d)",
               status);
  }
  all_sum_checked(g, 1.5f); /* #1: the number the child tried */
  all_sum_checked(g, 2.5f);
  T_CHECKF(t_error_count() == 0, "an unexpected error: %s", t_last_error());
  mlx_distributed_group_free(g);
  mlx_distributed_clear_backends();
  printf("mpi_fork rank %d: passed\n", rank);
  return t_exit_status();
}
