/* A rank program for the record and supervisor tests (test_record.sh), run
 * under mlxdist-launch; public API only. Modes (argv[1]):
 *   hang     every rank does two all_sums; then rank size-1 waits on a recv
 *            from rank 0 that is never sent, the others on a third all_sum
 *            (the launcher's --timeout ends it: its table marks the last
 *            rank as behind);
 *   kill     one all_sum; rank 1 then dies of SIGKILL, the others try a
 *            second all_sum (they fail: lost connection to rank 1);
 *   exitrecv rank 0 queues a recv from rank 1 that is never sent and
 *            returns from main (its exit must not wait for it); rank 1 then
 *            waits on a recv from rank 0, which must fail naming rank 0
 *            within 5 s (exit 0 when it did, 1 otherwise);
 *   stop     one all_sum; rank 1 stops itself (SIGSTOP), the others wait
 *            in a second all_sum. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mlx/c/array.h"
#include "mlx/c/distributed.h"
#include "mlx/c/distributed_group.h"
#include "mlx/c/error.h"
#include "mlx/c/stream.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static char g_err[1024];
static void keep_error(const char* msg, void* data) {
  (void)data;
  snprintf(g_err, sizeof g_err, "%s", msg);
}

static void die(const char* what) {
  fprintf(stderr, "rec_rank: %s failed: %s\n", what, g_err);
  exit(3);
}

/* One all_sum of 4 floats, evaluated. */
static void all_sum(mlx_distributed_group g, mlx_stream s) {
  float v[4] = {1, 2, 3, 4};
  int shape[1] = {4};
  mlx_array x = mlx_array_new_data(v, shape, 1, MLX_FLOAT32);
  mlx_array r = mlx_array_new();
  if (mlx_distributed_all_sum(&r, x, g, s) != 0 || mlx_array_eval(r) != 0) die("all_sum");
  mlx_array_free(r);
  mlx_array_free(x);
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: rec_rank hang|kill|exitrecv|stop\n");
    return 2;
  }
  const char* mode = argv[1];
  mlx_distributed_group g = mlx_distributed_group_new();
  mlx_stream s = mlx_stream_new();
  if (mlx_distributed_init(&g, true, "ring") != 0) die("init");
  int rank = mlx_distributed_group_rank(g), size = mlx_distributed_group_size(g);
  int shape[1] = {4};

  if (strcmp(mode, "hang") == 0) {
    all_sum(g, s);
    all_sum(g, s);
    if (rank == size - 1) {
      mlx_array r = mlx_array_new();
      if (mlx_distributed_recv(&r, shape, 1, MLX_FLOAT32, 0, g, s) != 0) die("recv");
      mlx_array_eval(r); /* never sent: waits until the launcher stops the job */
      mlx_array_free(r);
    } else {
      all_sum(g, s); /* the last rank never joins */
    }
    return 0;
  }
  if (strcmp(mode, "kill") == 0) {
    all_sum(g, s);
    if (rank == 1) raise(SIGKILL);
    usleep(200 * 1000);
    all_sum(g, s);
    return 0;
  }
  if (strcmp(mode, "exitrecv") == 0) {
    mlx_set_error_handler(keep_error, NULL, NULL);
    all_sum(g, s);
    mlx_array r = mlx_array_new();
    if (mlx_distributed_recv(&r, shape, 1, MLX_FLOAT32, rank == 0 ? 1 : 0, g, s) != 0) die("recv");
    if (rank == 0) {
      fprintf(stderr, "rec_rank: rank 0 returns from main with a recv pending\n");
      return 0; /* no eval, no free: the exit must not wait for it */
    }
    double t0 = now_s();
    int rc = mlx_array_eval(r);
    double took = now_s() - t0;
    fprintf(stderr, "rec_rank: rank 1's recv %s after %.2f s: %s\n", rc ? "failed" : "succeeded",
            took, g_err);
    mlx_array_free(r);
    return rc != 0 && took < 5.0 && strstr(g_err, "rank 0") ? 0 : 1;
  }
  if (strcmp(mode, "stop") == 0) {
    all_sum(g, s);
    if (rank == 1) raise(SIGSTOP);
    all_sum(g, s);
    return 0;
  }
  fprintf(stderr, "rec_rank: unknown mode '%s'\n", mode);
  return 2;
}
