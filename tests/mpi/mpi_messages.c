/* What the mpi backend's failures say, under mpirun with 2 ranks (public API
 * only; run over Open MPI's shared-memory btl and over tcp). Every message
 * must name the backend, the op as users call it with its sequence number,
 * this rank, and the peer where there is one:
 *   [mpi] <op> #<seq> on rank <R>: <detail>
 *
 * Cases, each on a fresh group (MLXDIST_TIMEOUT=2):
 *  - bytes: rank 0 sends 40 bytes, rank 1 receives 44 (recv #0: "had 40
 *    bytes, but this recv expects 44"); then 48 into 44 (recv #1, MPI's
 *    MPI_ERR_TRUNCATE); rank 1's next recv (#2) fails at once naming recv #1.
 *  - check (MLXDIST_CHECK=1, set before init): all_sum #0 matches, #1
 *    differs in count on rank 1 (both ranks name both calls), #2 fails at
 *    once naming all_sum #1; then send(40 bytes) against recv(44 bytes):
 *    rank 1's recv #0 names both calls, and rank 0's next op, a recv #0 from
 *    rank 1, fails naming send #0 (its send returned before the answer).
 *  - invalid input (a peer out of range, the caller's own rank): the
 *    front-end's "[distributed] send: dst is 2, not a rank of this group".
 *  - send timeout: rank 0 sends 1 MiB that rank 1 takes only late: the send
 *    fails in the background after 2 s, rank 0's next op names it (send #0).
 *  - timeout: rank 0 receives from rank 1, which never sends: after 2 s,
 *    "timed out after 2 s in recv of 40 bytes from rank 1".
 * mpi_messages kill: see kill_case. */
#include <mpi.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mlx/c/mlx.h"
#include "testutil.h"

static int g_rank;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A fresh group; the ranks first meet in an MPI_Barrier (once MPI runs), so
 * a case's waits never eat into the next group's bounded set-up. */
static mlx_distributed_group fresh_group(void) {
  int init = 0;
  MPI_Initialized(&init);
  if (init) T_EQ_INT(MPI_Barrier(MPI_COMM_WORLD), MPI_SUCCESS);
  T_EQ_INT(mlx_distributed_clear_backends(), 0);
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init(&g, true, "mpi") != 0) T_FAIL("init(mpi): %s", t_last_error());
  int size = 0;
  T_EQ_INT(mlx_distributed_group_get_rank(&g_rank, g), 0);
  T_EQ_INT(mlx_distributed_group_get_size(&size, g), 0);
  T_ASSERT(size == 2);
  return g;
}

static mlx_array ones(size_t n) {
  float* v = calloc(n ? n : 1, sizeof(float));
  T_ASSERT(v != NULL);
  for (size_t i = 0; i < n; i++) v[i] = 1.0f;
  mlx_array a = mlx_array_new_data(v, (int[]){(int)n}, 1, MLX_FLOAT32);
  free(v);
  return a;
}

/* The last error starts with head ("[mpi] recv #1 on rank 1: ") and holds
 * every one of the NULL-terminated strings after it. */
static void expect_msg(const char* label, const char* head, ...) {
  const char* e = t_last_error();
  printf("rank %d %s: %s\n", g_rank, label, e);
  T_CHECKF(strncmp(e, head, strlen(head)) == 0,
           "%s: rank %d got \"%s\", expected it to start \"%s\"", label, g_rank, e, head);
  va_list ap;
  va_start(ap, head);
  for (const char* want; (want = va_arg(ap, const char*)) != NULL;)
    T_CHECKF(strstr(e, want) != NULL, "%s: rank %d got \"%s\", expected \"%s\" in it", label,
             g_rank, e, want);
  va_end(ap);
}

static int send_n(mlx_distributed_group g, size_t n, int dst) {
  mlx_array x = ones(n), r = mlx_array_new();
  int rc = mlx_distributed_send(&r, x, dst, g, mlx_stream_new());
  if (rc == 0) rc = mlx_array_eval(r);
  mlx_array_free(x), mlx_array_free(r);
  return rc;
}
static int recv_n(mlx_distributed_group g, size_t n, int src) {
  mlx_array r = mlx_array_new();
  int rc = mlx_distributed_recv(&r, (int[]){(int)n}, 1, MLX_FLOAT32, src, g, mlx_stream_new());
  if (rc == 0) rc = mlx_array_eval(r);
  mlx_array_free(r);
  return rc;
}
static int all_sum_n(mlx_distributed_group g, size_t n) {
  mlx_array x = ones(n), r = mlx_array_new();
  int rc = mlx_distributed_all_sum(&r, x, g, mlx_stream_new());
  if (rc == 0) rc = mlx_array_eval(r);
  mlx_array_free(x), mlx_array_free(r);
  return rc;
}

static void bytes_case(void) {
  mlx_distributed_group g = fresh_group();
  t_clear_errors();
  if (g_rank == 0) {
    T_EQ_INT(send_n(g, 10, 1), 0); /* send #0: 40 bytes */
    T_EQ_INT(send_n(g, 12, 1), 0); /* send #1: 48 bytes */
  } else {
    T_CHECK(recv_n(g, 11, 0) != 0);
    expect_msg("bytes, fewer", "[mpi] recv #0 on rank 1: ",
               "the message from rank 0 had 40 bytes, but this recv expects 44", NULL);
    t_clear_errors();
    T_CHECK(recv_n(g, 11, 0) != 0);
    expect_msg("bytes, more", "[mpi] recv #1 on rank 1: ",
               "recv of 44 bytes from rank 0: the message that arrived is larger",
               "MPI_ERR_TRUNCATE", NULL);
    t_clear_errors();
    double t0 = now_s();
    T_CHECK(recv_n(g, 11, 0) != 0);
    T_CHECKF(now_s() - t0 < 1, "the recv after the truncation took %.1f s", now_s() - t0);
    expect_msg("bytes, next", "[mpi] recv #2 on rank 1: ", "MPI_ERR_TRUNCATE",
               "(the group failed in recv #1)", NULL);
  }
  t_clear_errors();
  mlx_distributed_group_free(g);
}

static void check_case(void) {
  setenv("MLXDIST_CHECK", "1", 1);
  mlx_distributed_group g = fresh_group();
  t_clear_errors();
  T_EQ_INT(all_sum_n(g, 4), 0); /* #0 */
  char head[64];
  snprintf(head, sizeof head, "[mpi] all_sum #1 on rank %d: ", g_rank);
  double t0 = now_s();
  T_CHECK(all_sum_n(g, g_rank == 1 ? 5 : 4) != 0);
  T_CHECKF(now_s() - t0 < 1.5, "the mismatch took %.1f s", now_s() - t0);
  const char* both =
      "mismatched calls: rank 0 called all_sum(float32 x 4), rank 1 called all_sum(float32 x 5)";
  expect_msg("check, collective", head, both, NULL);
  t_clear_errors();
  snprintf(head, sizeof head, "[mpi] all_sum #2 on rank %d: ", g_rank);
  t0 = now_s();
  T_CHECK(all_sum_n(g, 4) != 0);
  T_CHECKF(now_s() - t0 < 1, "the op after the mismatch took %.1f s", now_s() - t0);
  expect_msg("check, collective next", head, both, "(the group failed in all_sum #1)", NULL);
  t_clear_errors();
  mlx_distributed_group_free(g);

  g = fresh_group();
  const char* pair = "mismatched calls: rank 0 called send(40 bytes), rank 1 called recv(44 bytes)";
  if (g_rank == 0) {
    (void)send_n(g, 10, 1); /* returns once posted: the answer comes later */
    t_clear_errors();
    T_CHECK(recv_n(g, 10, 1) != 0);
    expect_msg("check, sender", "[mpi] recv #0 on rank 0: ", pair, "(the group failed in send #0)",
               NULL);
  } else {
    T_CHECK(recv_n(g, 11, 0) != 0);
    expect_msg("check, receiver", "[mpi] recv #0 on rank 1: ", pair, NULL);
  }
  t_clear_errors();
  mlx_distributed_group_free(g);
  unsetenv("MLXDIST_CHECK");
}

/* Invalid input never reaches the plugin: the front-end names the problem
 * (the same under every backend), and the group stays usable. */
static void invalid_case(void) {
  mlx_distributed_group g = fresh_group();
  t_clear_errors();
  mlx_array x = ones(4), r = mlx_array_new();
  T_CHECK(mlx_distributed_send(&r, x, 2, g, mlx_stream_new()) != 0);
  expect_msg("invalid, dst", "[distributed] send: dst is 2, not a rank of this group", NULL);
  t_clear_errors();
  T_CHECK(mlx_distributed_recv_like(&r, x, g_rank, g, mlx_stream_new()) != 0);
  char want[96];
  snprintf(want, sizeof want, "src is %d, this process's own rank", g_rank);
  expect_msg("invalid, src", "[distributed] recv_like: ", want, NULL);
  t_clear_errors();
  mlx_array_free(x), mlx_array_free(r);
  T_EQ_INT(all_sum_n(g, 4), 0); /* all_sum #0 */
  mlx_distributed_group_free(g);
}

/* A send nobody takes: rank 0's 1 MiB send (#0) returns once posted and
 * fails in the background after MLXDIST_TIMEOUT; its next op, a recv, fails
 * at once naming it. Rank 1 takes the data late, so MPI completes the
 * request (and can finalise). */
static void send_timeout_case(void) {
  mlx_distributed_group g = fresh_group();
  t_clear_errors();
  size_t n = 1u << 18; /* 1 MiB: above the eager limits, it waits for its receiver */
  if (g_rank == 0) {
    T_EQ_INT(send_n(g, n, 1), 0);
    sleep(4);
    double t0 = now_s();
    T_CHECK(recv_n(g, 10, 1) != 0);
    T_CHECKF(now_s() - t0 < 1, "the recv after the failed send took %.1f s", now_s() - t0);
    expect_msg("send timeout", "[mpi] recv #0 on rank 0: ",
               "timed out after 2 s in send of 1048576 bytes to rank 1: the receiver never took "
               "the data",
               "(the group failed in send #0)", NULL);
  }
  T_EQ_INT(MPI_Barrier(MPI_COMM_WORLD), MPI_SUCCESS);
  if (g_rank == 1) T_EQ_INT(recv_n(g, n, 0), 0);
  t_clear_errors();
  mlx_distributed_group_free(g);
}

static void timeout_case(void) {
  mlx_distributed_group g = fresh_group();
  t_clear_errors();
  if (g_rank == 0) {
    double t0 = now_s();
    T_CHECK(recv_n(g, 10, 1) != 0);
    double dt = now_s() - t0;
    T_CHECKF(dt > 1.5 && dt < 6, "the recv timed out after %.1f s (MLXDIST_TIMEOUT=2)", dt);
    expect_msg("timeout",
               "[mpi] recv #0 on rank 0: ", "timed out after 2 s in recv of 40 bytes from rank 1",
               "MLXDIST_TIMEOUT", NULL);
  }
  t_clear_errors();
  mlx_distributed_group_free(g);
}

/* mpi_messages kill: a peer killed mid-op. Rank 1 SIGKILLs itself instead
 * of joining all_sum #1 (1M floats). Open MPI's mpirun normally aborts the
 * whole job then (rank 0 is killed too, with nothing left to say); under
 * "mpirun --enable-recovery" rank 0 lives on, MPI reports no error for the
 * dead peer (Open MPI 4.1 has no ULFM), and rank 0's all_sum fails after
 * MLXDIST_TIMEOUT=2 naming the op, its number and the rank. */
static int kill_case(void) {
  mlx_distributed_group g = fresh_group();
  t_clear_errors();
  T_EQ_INT(all_sum_n(g, 4), 0); /* #0 */
  if (g_rank == 1) raise(SIGKILL);
  double t0 = now_s();
  T_CHECK(all_sum_n(g, 1u << 20) != 0);
  double dt = now_s() - t0;
  T_CHECKF(dt > 1.5 && dt < 6, "the all_sum failed after %.1f s (MLXDIST_TIMEOUT=2)", dt);
  expect_msg("kill",
             "[mpi] all_sum #1 on rank 0: ", "timed out after 2 s in all_sum of 1048576 elements",
             "a peer may have died", NULL);
  printf("rank %d: mpi_messages kill %s\n", g_rank, t_check_failures() ? "FAILED" : "OK");
  return t_exit_status();
}

int main(int argc, char** argv) {
  t_capture_errors();
  setvbuf(stdout, NULL, _IOLBF, 0);
  unsetenv("MLXDIST_CHECK");
  if (argc > 1 && strcmp(argv[1], "kill") == 0) return kill_case();
  bytes_case();
  invalid_case();
  check_case();
  send_timeout_case();
  timeout_case(); /* last: rank 1 goes on to exit (MPI_Finalize waits for rank 0) */
  printf("rank %d: mpi_messages %s\n", g_rank, t_check_failures() ? "FAILED" : "OK");
  return t_exit_status();
}
