/* Liveness of the verbs transport on real RDMA (soft-RoCE in the VM,
 * tests/vm/vm_verbs.sh): N forked ranks over the verbs transport
 * (tests/common/transports.h, "verbs[:K]") run an all_reduce while the last
 * rank fails the way the mode says; the survivors must fail in time, naming
 * it (issue 23's bar), and print the time they took.
 *
 *   test_verbs_live kill N [verbs[:K]]   the last rank is SIGKILLed inside the
 *                                        all_reduce: every survivor fails within
 *                                        2 s of the kill, naming it
 *   test_verbs_live stop N [verbs[:K]]   it stops itself (SIGSTOP): every
 *                                        survivor fails within MLXDIST_TIMEOUT
 *                                        (3 s here) + 2 s, naming it
 *   test_verbs_live busy N [verbs[:K]]   it sleeps 4 s before joining (alive:
 *                                        heartbeats): waited for with
 *                                        MLXDIST_TIMEOUT=2, the all_reduce succeeds
 *   test_verbs_live stall [verbs[:K]]    rank 1 never joins (alive):
 *                                        MLXDIST_OP_TIMEOUT=2 fails rank 0 with
 *                                        MLXD_ETIMEDOUT naming it */
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "algo/algo.h"
#include "testutil.h"
#include "transports.h"
#include "util/clock.h"

typedef struct shared {
  volatile double event; /* when the last rank was killed / stopped itself */
  volatile int pid;      /* the last rank's pid */
  volatile double took[16];
  atomic_int inside; /* survivors entering the second all_reduce */
  atomic_int failed; /* survivors done with their failure (stall: rank 0 timed out) */
} shared;

static shared* g_sh;
static const char* g_mode;

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static int live_rank(mlxd_transport* t, void* arg) {
  (void)arg;
  int n = t->size, r = t->rank, last = n - 1;
  size_t count = (size_t)1 << 16; /* 256 KiB of float32: several chunks per step */
  float* buf = calloc(count, 4);
  T_REQUIREF(buf, "out of memory");
  for (size_t i = 0; i < count; i++) buf[i] = (float)(r + 1);
  mlxd_status st;
  int rc;
  /* one all_reduce that works, so the failure hits a running group */
  rc = mlxd_algo_all_reduce(t, 1, NULL, buf, buf, count, MLX_FLOAT32, MLXD_SUM, &st);
  T_REQUIREF(rc == 0, "first all_reduce: %s", st.msg);
  T_CHECKF(buf[0] == (float)(n * (n + 1) / 2), "first all_reduce: %g", (double)buf[0]);
  if (r == last) {
    g_sh->pid = (int)getpid();
    if (strcmp(g_mode, "busy") == 0) {
      sleep_s(4.0);
    } else {
      t_wait_count(&g_sh->inside, n - 1, "the others entering the next all_reduce", 30.0);
      g_sh->event = mlxd_now();
      raise(strcmp(g_mode, "kill") == 0 ? SIGKILL : SIGSTOP);
      sleep_s(60); /* SIGSTOP: continued only to be killed */
      _exit(3);
    }
  }
  atomic_fetch_add(&g_sh->inside, 1);
  rc = mlxd_algo_all_reduce(t, 2, NULL, buf, buf, count, MLX_FLOAT32, MLXD_SUM, &st);
  double done = mlxd_now();
  if (strcmp(g_mode, "busy") == 0) {
    T_CHECKF(rc == 0, "rank %d: a busy rank must be waited for: %s", r, st.msg);
    free(buf);
    return 0;
  }
  double dt = done - g_sh->event;
  g_sh->took[r] = dt;
  fprintf(stderr, "rank %d failed %.2f s after rank %d was %s: %s\n", r, dt, last,
          strcmp(g_mode, "kill") == 0 ? "killed" : "stopped", st.msg);
  T_CHECKF(rc == MLXD_EREMOTE, "rank %d: rc %d: %s", r, rc, st.msg);
  T_CHECKF(t_status_names_peer(&st, last), "rank %d: does not name rank %d: %s", r, last, st.msg);
  double limit = strcmp(g_mode, "kill") == 0 ? 2.0 : 3.0 + 2.0;
  T_CHECKF(dt < limit, "rank %d: took %.2f s (limit %.1f s)", r, dt, limit);
  /* later operations fail fast with the same failure */
  mlxd_status first = st;
  double t0 = mlxd_now();
  rc = mlxd_algo_send(t, 5, NULL, buf, 8, r == 0 ? 1 : 0, &st);
  T_CHECKF(rc == first.code && strcmp(st.msg, first.msg) == 0, "later op: %d '%s' vs '%s'", rc,
           st.msg, first.msg);
  T_CHECKF(mlxd_now() - t0 < 1.0, "later op was not fast");
  atomic_fetch_add(&g_sh->failed, 1);
  if (r == 0 && strcmp(g_mode, "stop") == 0) {
    t_wait_count(&g_sh->failed, n - 1, "the other survivors' failures", 30.0);
    kill((pid_t)g_sh->pid, SIGKILL); /* the stopped rank ends here */
  }
  free(buf);
  return 0;
}

static int stall_rank(mlxd_transport* t, void* arg) {
  (void)arg;
  if (t->rank == 1) { /* alive, not taking part, until rank 0 has timed out */
    t_wait_count(&g_sh->failed, 1, "rank 0's time-out", 30.0);
    return 0;
  }
  float buf[1000];
  memset(buf, 0, sizeof buf);
  mlxd_status st;
  double t0 = mlxd_now();
  int rc = mlxd_algo_all_reduce(t, 1, NULL, buf, buf, 1000, MLX_FLOAT32, MLXD_SUM, &st);
  double dt = mlxd_now() - t0;
  T_CHECKF(rc == MLXD_ETIMEDOUT, "rc %d: %s", rc, st.msg);
  T_CHECKF(t_status_names_peer(&st, 1), "does not name rank 1: %s", st.msg);
  T_CHECKF(dt >= 1.5 && dt < 6.0, "timed out after %.2f s", dt);
  fprintf(stderr, "rank 0: %.2f s: %s\n", dt, st.msg);
  atomic_store(&g_sh->failed, 1);
  return 0;
}

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  if (argc < 2) {
    fprintf(stderr, "usage: %s kill|stop|busy N [verbs[:K]] | stall [verbs[:K]]\n", argv[0]);
    return 2;
  }
  g_mode = argv[1];
  bool stall = strcmp(g_mode, "stall") == 0;
  int n = stall ? 2 : argc > 2 ? atoi(argv[2]) : 3;
  const char* tp = stall ? (argc > 2 ? argv[2] : "verbs") : (argc > 3 ? argv[3] : "verbs");
  t_tp_spec spec;
  if (!t_tp_parse(tp, &spec) || n < 2 || n > 16) T_FAIL("bad arguments");
  g_sh = mmap(NULL, sizeof *g_sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  T_REQUIRE(g_sh != MAP_FAILED);
  memset((void*)g_sh, 0, sizeof *g_sh);
  t_rank_exit ex[16];
  t_ranks_opts o = {.timeout_s = 60, .what = g_mode};
  if (stall) {
    setenv("MLXDIST_OP_TIMEOUT", "2", 1);
    int bad = t_run_transport(&spec, 2, stall_rank, NULL, &o, ex);
    if (bad) T_FAIL("stall over %s: %d rank(s) failed", tp, bad);
    printf("stall over %s: ok\n", tp);
    return 0;
  }
  if (strcmp(g_mode, "kill") == 0) {
    setenv("MLXDIST_TIMEOUT", "30", 1); /* the timeout must not be what notices it */
  } else if (strcmp(g_mode, "stop") == 0) {
    setenv("MLXDIST_TIMEOUT", "3", 1);
  } else if (strcmp(g_mode, "busy") == 0) {
    setenv("MLXDIST_TIMEOUT", "2", 1);
    setenv("MLXDIST_WARN_AFTER", "1", 1);
  } else {
    T_FAIL("unknown mode '%s'", g_mode);
  }
  int bad = t_run_transport(&spec, n, live_rank, NULL, &o, ex);
  int survivors_bad = 0;
  for (int r = 0; r < n - 1; r++) survivors_bad += ex[r].code != 0;
  bool busy = strcmp(g_mode, "busy") == 0;
  if (busy ? bad != 0 : survivors_bad != 0 || ex[n - 1].signal != SIGKILL)
    T_FAIL("%s over %s with %d ranks: %d rank(s) failed (last rank: code %d signal %d)", g_mode, tp,
           n, bad, ex[n - 1].code, ex[n - 1].signal);
  if (!busy) {
    printf("%s over %s with %d ranks: survivors failed after", g_mode, tp, n);
    for (int r = 0; r < n - 1; r++) printf(" %.2f", g_sh->took[r]);
    printf(" s: ok\n");
  } else {
    printf("busy over %s with %d ranks: waited for: ok\n", tp, n);
  }
  return 0;
}
