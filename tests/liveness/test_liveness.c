/* Liveness apart from progress (issue 11), with real processes through the
 * public API: this program writes an MLX hostfile, forks the ranks with
 * MLX_RANK / MLX_HOSTFILE (ring backend; MLXDIST_TRANSPORT from argv[2]; TR
 * mixed: auto with ranks 0 and 1 on one emulated host (MLXDIST_HOST_ID) and
 * the others on another, so rank 1 is reached over shm by rank 0 and over
 * TCP by rank 2; TR jaccl: the jaccl backend instead, on real verbs, with a
 * device matrix naming LIVE_IBV_DEVICE (default rxe0) in every off-diagonal
 * cell and the coordinator on 127.0.0.1: run inside the soft-RoCE VM,
 * tests/vm/vm_jaccl_fail.sh),
 * each rank's stderr into a file, and acts on them from the parent.
 *
 *   test_liveness slow TR   rank 1 sleeps 2 x MLXDIST_WARN_AFTER + 1 s (5 s, longer
 *                           than MLXDIST_TIMEOUT) before an all_sum: success on both
 *                           ranks, and exactly one warning line, naming rank 1
 *   test_liveness stop TR   3 ranks loop over all_sum; the parent SIGSTOPs rank 1: the
 *                           others fail within MLXDIST_TIMEOUT + 2 s naming it
 *                           (MLXDIST_TIMEOUT 2; 3 under jaccl)
 *   test_liveness kill TR   the same with SIGKILL: within 2 s
 *   test_liveness kill_a2a TR  the same with all_to_all in the loop (parts of 64 int32: over
 *                           mixed, the two-level form gathered per host, rank 1 a member of
 *                           host A, whose leader is rank 0): within 2 s, the error
 *                           "[ring] all_to_all #..." naming rank 1, and the operation
 *                           record each survivor prints shows the failed all_to_all
 *   test_liveness late TR   rank 1 reaches an all_sum after rank 0 gave up on it
 *                           (MLXDIST_OP_TIMEOUT): it fails too, with rank 0's reason */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mlx/c/mlx.h"
#include "ranks.h"
#include "testutil.h"

#define MAX_RANKS 4

static char g_dir[256];
static bool g_mixed; /* TR mixed: ranks 0, 1 on emulated host A, the others on B */
static bool g_jaccl; /* TR jaccl: the jaccl backend (a device matrix, a coordinator) */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* jaccl's configuration: a mesh of n ranks over one device, and the coordinator. */
static void write_matrix(const char* path, int n, char* coord, size_t coord_len) {
  const char* dev = getenv("LIVE_IBV_DEVICE");
  if (!dev || !*dev) dev = "rxe0";
  FILE* f = fopen(path, "w");
  T_ASSERT(f);
  fputs("[", f);
  for (int i = 0; i < n; i++) {
    fputs(i ? ", [" : "[", f);
    for (int j = 0; j < n; j++) {
      if (j) fputs(", ", f);
      if (j == i)
        fputs("null", f);
      else
        fprintf(f, "\"%s\"", dev);
    }
    fputs("]", f);
  }
  fputs("]\n", f);
  fclose(f);
  snprintf(coord, coord_len, "127.0.0.1:%d", t_free_port());
}

static void write_hostfile(const char* path, int n) {
  FILE* f = fopen(path, "w");
  T_ASSERT(f);
  fputs("[", f);
  for (int r = 0; r < n; r++) fprintf(f, "%s[\"127.0.0.1:%d\"]", r ? ", " : "", t_free_port());
  fputs("]\n", f);
  fclose(f);
}

typedef int (*rank_fn)(int rank, int size);

typedef struct run {
  int n;
  pid_t pid[MAX_RANKS];
  int code[MAX_RANKS];      /* exit status, 128 + signal; -1 while running */
  double exited[MAX_RANKS]; /* when the parent reaped it */
} run;

/* Fork n ranks running fn, each with its stderr in g_dir/rank<r>.err. */
static void start(run* R, int n, rank_fn fn) {
  char path[300], coord[64] = "";
  snprintf(path, sizeof path, "%s/%s.json", g_dir, g_jaccl ? "devices" : "hostfile");
  if (g_jaccl)
    write_matrix(path, n, coord, sizeof coord);
  else
    write_hostfile(path, n);
  R->n = n;
  fflush(NULL);
  for (int r = 0; r < n; r++) {
    R->code[r] = -1;
    pid_t p = fork();
    T_ASSERT(p >= 0);
    if (p == 0) {
      char rs[16], ep[300];
      snprintf(rs, sizeof rs, "%d", r);
      setenv("MLX_RANK", rs, 1);
      if (g_jaccl) {
        setenv("MLX_IBV_DEVICES", path, 1);
        setenv("MLX_JACCL_COORDINATOR", coord, 1);
        /* each rank its own emulated host: every pair over verbs, whose liveness
         * these cases test (on one host the router would pick shared memory) */
        char host[32];
        snprintf(host, sizeof host, "vmhost%d", r);
        setenv("MLXDIST_HOST_ID", host, 1);
      } else {
        setenv("MLX_HOSTFILE", path, 1);
      }
      unsetenv("MLX_WORLD_SIZE");
      if (g_mixed) setenv("MLXDIST_HOST_ID", r < 2 ? "hostA" : "hostB", 1);
      snprintf(ep, sizeof ep, "%s/rank%d.err", g_dir, r);
      int fd = open(ep, O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (fd >= 0) {
        dup2(fd, 2);
        close(fd);
      }
      t_capture_errors();
      int rc = fn(r, n);
      fflush(NULL);
      exit(rc ? rc : t_check_failures() ? 1 : 0);
    }
    R->pid[r] = p;
  }
}

/* Reap ranks until those in `which` (bit mask) exited or the deadline passed. */
static void reap(run* R, unsigned which, double deadline) {
  for (;;) {
    bool all = true;
    for (int r = 0; r < R->n; r++)
      if ((which >> r & 1) && R->code[r] < 0) all = false;
    if (all || now_s() > deadline) return;
    int st;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p <= 0) {
      sleep_s(0.01);
      continue;
    }
    for (int r = 0; r < R->n; r++)
      if (R->pid[r] == p) {
        R->code[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        R->exited[r] = now_s();
      }
  }
}

static void kill_all(run* R) {
  for (int r = 0; r < R->n; r++)
    if (R->code[r] < 0) {
      kill(R->pid[r], SIGKILL);
      kill(R->pid[r], SIGCONT);
    }
  reap(R, (1u << R->n) - 1, now_s() + 10);
}

/* The rank's captured stderr (static buffer). */
static const char* rank_err(int r) {
  static char buf[1 << 16];
  char p[300];
  snprintf(p, sizeof p, "%s/rank%d.err", g_dir, r);
  buf[0] = 0;
  FILE* f = fopen(p, "r");
  if (!f) return buf;
  size_t k = fread(buf, 1, sizeof buf - 1, f);
  buf[k] = 0;
  fclose(f);
  return buf;
}

static void show_err(int r) { fprintf(stderr, "--- rank %d stderr:\n%s---\n", r, rank_err(r)); }

static mlx_distributed_group init_ring(void) {
  const char* bk = g_jaccl ? "jaccl" : "ring";
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init(&g, true, bk) != 0) T_FAIL("init %s: %s", bk, t_last_error());
  return g;
}

/* One all_sum of n int32 (each rank's rank + i); 0 if it succeeded with the
 * right values, 1 if it failed (t_last_error says why). */
static int one_sum(mlx_distributed_group g, int size, int n) {
  int rank = mlx_distributed_group_rank(g);
  int* v = malloc(sizeof(int) * (size_t)n);
  for (int i = 0; i < n; i++) v[i] = rank + i;
  int shape[1] = {n};
  mlx_array x = mlx_array_new_data(v, shape, 1, MLX_INT32), y = mlx_array_new();
  free(v);
  int rc = 1;
  t_clear_errors();
  if (mlx_distributed_all_sum(&y, x, g, mlx_stream_new()) == 0 && mlx_array_eval(y) == 0) {
    const int32_t* d = mlx_array_data_int32(y);
    int base = size * (size - 1) / 2;
    rc = 0;
    for (int i = 0; i < n; i++)
      if (d[i] != base + size * i)
        T_FAIL("element %d is %d, expected %d", i, d[i], base + size * i);
  }
  mlx_array_free(x);
  mlx_array_free(y);
  return rc;
}

/* One all_to_all of parts of `part` int32 (part j of rank r's input:
 * r * 1000 + j * part + i); 0 if it succeeded with the right values, 1 if it
 * failed (t_last_error says why). */
static int one_a2a(mlx_distributed_group g, int size, int part) {
  int rank = mlx_distributed_group_rank(g), n = part * size;
  int* v = malloc(sizeof(int) * (size_t)n);
  for (int i = 0; i < n; i++) v[i] = rank * 1000 + i;
  int shape[1] = {n};
  mlx_array x = mlx_array_new_data(v, shape, 1, MLX_INT32), y = mlx_array_new();
  free(v);
  int rc = 1;
  t_clear_errors();
  if (mlx_distributed_all_to_all(&y, x, g, mlx_stream_new()) == 0 && mlx_array_eval(y) == 0) {
    const int32_t* d = mlx_array_data_int32(y);
    rc = 0;
    for (int r = 0; r < size; r++)
      for (int i = 0; i < part; i++) {
        int want = r * 1000 + rank * part + i;
        if (d[r * part + i] != want)
          T_FAIL("part %d element %d is %d, expected %d", r, i, d[r * part + i], want);
      }
  }
  mlx_array_free(x);
  mlx_array_free(y);
  return rc;
}

/* ---- slow: alive but late ---- */

static int slow_rank(int rank, int size) {
  mlx_distributed_group g = init_ring();
  T_EQ_INT(one_sum(g, size, 100), 0);
  if (rank == 1) sleep_s(2 * atof(getenv("MLXDIST_WARN_AFTER")) + 1);
  if (one_sum(g, size, 100) != 0) T_FAIL("the all_sum after the sleep failed: %s", t_last_error());
  T_EQ_INT(one_sum(g, size, 100), 0);
  mlx_distributed_group_free(g);
  return 0;
}

static int count(const char* s, const char* what) {
  int k = 0;
  for (const char* p = strstr(s, what); p; p = strstr(p + 1, what)) k++;
  return k;
}

static void test_slow(void) {
  setenv("MLXDIST_WARN_AFTER", "2", 1);
  setenv("MLXDIST_TIMEOUT", "3", 1); /* the sleep (5 s) is longer than this */
  run R;
  start(&R, 2, slow_rank);
  reap(&R, 3, now_s() + 60);
  int warnings = 0;
  for (int r = 0; r < 2; r++) {
    show_err(r);
    T_CHECKF(R.code[r] == 0, "rank %d exited %d", r, R.code[r]);
    warnings += count(rank_err(r), "warning:");
  }
  kill_all(&R);
  T_CHECKF(warnings == 1, "%d warning lines, expected 1", warnings);
  T_CHECKF(strstr(rank_err(0), "has waited") && strstr(rank_err(0), "for rank 1"),
           "rank 0's warning does not name rank 1");
}

/* ---- stop / kill: a rank stops mid-loop ---- */

static int loop_rank(int rank, int size) {
  mlx_distributed_group g = init_ring();
  double end = now_s() + 60;
  int iters = 0;
  bool a2a = getenv("LIVE_A2A") != NULL; /* all_to_all in the loop instead of all_sum */
  while (now_s() < end) {
    if ((a2a ? one_a2a(g, size, 64) : one_sum(g, size, 1000)) != 0) break;
    if (iters++ == 0) { /* tell the parent this rank is in its loop */
      char p[300];
      snprintf(p, sizeof p, "%s/ready.%d", g_dir, rank);
      FILE* f = fopen(p, "w");
      if (f) fclose(f);
    }
  }
  if (now_s() >= end)
    T_FAIL("rank %d: 60 s of %s without a failure", rank, a2a ? "all_to_all" : "all_sum");
  { /* when the library reported the failure (CLOCK_MONOTONIC is the host's, so the parent
       compares it with its signal's time; the exit that follows is the scheduler's) */
    char p[300];
    snprintf(p, sizeof p, "%s/failed.%d", g_dir, rank);
    FILE* f = fopen(p, "w");
    if (f) {
      fprintf(f, "%.6f\n", now_s());
      fclose(f);
    }
  }
  fprintf(stderr, "rank %d failed after %d %s: %s\n", rank, iters, a2a ? "all_to_alls" : "all_sums",
          t_last_error());
  const char* want = getenv("LIVE_WANT");
  if (!strstr(t_last_error(), want) || !strstr(t_last_error(), "rank 1"))
    T_FAIL("rank %d: error '%s' does not say '%s' about rank 1", rank, t_last_error(), want);
  char op[64];
  snprintf(op, sizeof op, "[%s] %s #", g_jaccl ? "jaccl" : "ring", a2a ? "all_to_all" : "all_sum");
  if (strstr(t_last_error(), op) != t_last_error())
    T_FAIL("rank %d: error '%s' does not start with '%s'", rank, t_last_error(), op);
  return 0;
}

static void test_victim(int sig, double limit_s, const char* want) {
  setenv("LIVE_WANT", want, 1);
  run R;
  start(&R, 3, loop_rank);
  /* every rank is in its loop (its first all_sum passed), then a few more iterations */
  double ready_by = now_s() + 60;
  bool early = false; /* a rank that exited before its loop: no waiting out ready_by */
  for (int r = 0; r < 3 && !early; r++) {
    char p[300];
    snprintf(p, sizeof p, "%s/ready.%d", g_dir, r);
    while (access(p, F_OK) != 0 && now_s() < ready_by && !early) {
      sleep_s(0.02);
      reap(&R, 7, now_s());
      for (int q = 0; q < 3; q++) early = early || R.code[q] >= 0;
    }
  }
  sleep_s(0.5);
  reap(&R, 7, now_s());
  for (int r = 0; r < 3; r++) {
    if (R.code[r] >= 0) show_err(r);
    T_CHECKF(R.code[r] < 0, "rank %d exited %d early", r, R.code[r]);
  }
  for (int r = 0; r < 3; r++) { /* no failure time from an earlier case */
    char p[300];
    snprintf(p, sizeof p, "%s/failed.%d", g_dir, r);
    unlink(p);
  }
  double t0 = now_s();
  kill(R.pid[1], sig);
  reap(&R, 5, t0 + limit_s + 10);
  for (int r = 0; r < 3; r += 2) {
    show_err(r);
    T_CHECKF(R.code[r] == 0, "rank %d exited %d", r, R.code[r]);
    char p[300];
    double failed_at = -1;
    snprintf(p, sizeof p, "%s/failed.%d", g_dir, r);
    FILE* f = fopen(p, "r");
    if (f) {
      if (fscanf(f, "%lf", &failed_at) != 1) failed_at = -1;
      fclose(f);
    }
    if (R.code[r] == 0) {
      T_CHECKF(failed_at > 0, "rank %d wrote no failure time", r);
      T_CHECKF(failed_at - t0 <= limit_s, "rank %d failed %.2f s after the signal (limit %.1f)", r,
               failed_at - t0, limit_s);
    }
    fprintf(stderr, "rank %d failed %.2f s and was out %.2f s after the signal\n", r,
            failed_at - t0, R.exited[r] - t0);
    /* the operation record printed at the failure (docs/troubleshooting.md) names the op:
     * "(failure): failed all_to_all #N" and its line "all_to_all #N int32 768 B: failed" */
    if (getenv("LIVE_A2A")) {
      const char* e = rank_err(r);
      T_CHECKF(strstr(e, "(failure): failed all_to_all #") && strstr(e, " int32 768 B: failed"),
               "rank %d: the record does not show the failed all_to_all", r);
    }
  }
  kill_all(&R);
}

/* ---- late: a rank gets to an op its peer gave up on ---- */

static int late_rank(int rank, int size) {
  mlx_distributed_group g = init_ring();
  T_EQ_INT(one_sum(g, size, 100), 0);
  /* rank 1 gets to the op once rank 0 has given up on it (MLXDIST_OP_TIMEOUT, 2 s) */
  if (rank == 1) t_wait_mark(g_dir, "late-failed", 30);
  int rc = one_sum(g, size, 100);
  if (rank == 0) t_mark(g_dir, "late-failed");
  fprintf(stderr, "rank %d: %s\n", rank, rc ? t_last_error() : "succeeded");
  if (rc == 0) T_FAIL("rank %d: the all_sum its peer gave up on succeeded here", rank);
  const char* e = t_last_error();
  T_CHECKF(strstr(e, "rank 1 is alive but did not get to this operation within 2 s") != NULL,
           "rank %d: %s", rank, e);
  if (rank == 1) T_CHECKF(strstr(e, "reported by rank 0") != NULL, "rank 1: %s", e);
  return 0;
}

static void test_late(void) {
  setenv("MLXDIST_OP_TIMEOUT", "2", 1);
  run R;
  start(&R, 2, late_rank);
  reap(&R, 3, now_s() + 60);
  for (int r = 0; r < 2; r++) {
    show_err(r);
    T_CHECKF(R.code[r] == 0, "rank %d exited %d", r, R.code[r]);
  }
  kill_all(&R);
}

int main(int argc, char** argv) {
  if (argc != 3 || (strcmp(argv[2], "tcp") != 0 && strcmp(argv[2], "shm") != 0 &&
                    strcmp(argv[2], "mixed") != 0 && strcmp(argv[2], "jaccl") != 0)) {
    fprintf(stderr, "usage: %s slow|stop|kill|kill_a2a|late tcp|shm|mixed|jaccl\n", argv[0]);
    return 2;
  }
  g_mixed = strcmp(argv[2], "mixed") == 0;
  g_jaccl = strcmp(argv[2], "jaccl") == 0;
  snprintf(g_dir, sizeof g_dir, "/tmp/mlxd_live_test.XXXXXX");
  T_ASSERT(mkdtemp(g_dir) != NULL);
  if (!g_jaccl) setenv("MLXDIST_TRANSPORT", g_mixed ? "auto" : argv[2], 1);
  const char* m = argv[1];
  if (strcmp(m, "slow") == 0) {
    test_slow();
  } else if (strcmp(m, "stop") == 0) {
    int timeout_s = g_jaccl ? 3 : 2;
    char ts[8];
    snprintf(ts, sizeof ts, "%d", timeout_s);
    setenv("MLXDIST_TIMEOUT", ts, 1);
    test_victim(SIGSTOP, timeout_s + 2, "rank 1 has shown no sign of life");
  } else if (strcmp(m, "kill") == 0) {
    test_victim(SIGKILL, 2, "lost connection to rank 1");
  } else if (strcmp(m, "kill_a2a") == 0) {
    setenv("LIVE_A2A", "1", 1);
    test_victim(SIGKILL, 2, "lost connection to rank 1");
  } else if (strcmp(m, "late") == 0) {
    test_late();
  } else {
    fprintf(stderr, "unknown mode %s\n", m);
    return 2;
  }
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
  return t_exit_status();
}
