/* No getenv on a thread of the library's own (util/env.h).
 *
 * This program defines getenv and secure_getenv itself, so every call the
 * library (and anything it loads) makes lands here first: a call on a thread
 * named "mlxd-..." (every thread mlxd_thread_start starts, and the mpi
 * plugin's progress thread) aborts at once, naming the variable and the
 * thread, whatever the timing. Then:
 *
 *  - snapshot: what a library thread sees (the value read on the caller's
 *    thread before it, unset for a name no caller's thread ever read, a thread
 *    named mlxd-<job>), and that the library's own readers go through it;
 *  - setenv_loop: ranks over TCP and over shared memory run collectives and
 *    point-to-point on several streams (new streams too, whose workers start
 *    while the loop runs) while the main thread calls setenv and unsetenv in a
 *    loop, growing and shrinking the environment so that glibc moves its array
 *    (what crashed a library thread inside getenv before). Every result is
 *    checked; no read on a library thread may miss the snapshot. Once more
 *    over TCP with TLS (OpenSSL reads variables of its own), and (argument
 *    "mpi", under mpirun) over the mpi plugin and Open MPI.
 * It runs under ASan+UBSan and TSan like every test (scripts/test.sh). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mlx/c/mlx.h"
#include "ranks.h"
#include "testutil.h"
#include "util/env.h"
#include "util/tunables.h"

extern char** environ;

/* ---- the interposed readers ---- */

static bool on_library_thread(char name[16]) {
  name[0] = '\0';
  if (prctl(PR_GET_NAME, name, 0, 0, 0) != 0) return false;
  name[15] = '\0';
  return strncmp(name, "mlxd-", 5) == 0;
}

static char* lookup(const char* name) {
  char thread[16];
  if (on_library_thread(thread)) {
    /* write(2), not stdio: nothing here may depend on the state being sane */
    char msg[300];
    int n = snprintf(msg, sizeof msg,
                     "FAIL: getenv(\"%.100s\") on the library's thread '%s' (util/env.h: no "
                     "getenv on a thread of mlxdist's own)\n",
                     name ? name : "(null)", thread);
    if (n > 0) (void)!write(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1);
    abort();
  }
  if (!name || !environ) return NULL;
  size_t len = strlen(name);
  for (char** e = environ; *e; e++)
    if (strncmp(*e, name, len) == 0 && (*e)[len] == '=') return *e + len + 1;
  return NULL;
}

char* getenv(const char* name) { return lookup(name); }
char* secure_getenv(const char* name) { return lookup(name); }

/* ---- the snapshot, on threads of the library's own ---- */

typedef struct probe {
  const char* name;
  const char* seen;
  char thread[16];
  unsigned long misses_before, misses_after;
} probe;

static void* probe_main(void* arg) {
  probe* p = arg;
  prctl(PR_GET_NAME, p->thread, 0, 0, 0);
  p->thread[15] = '\0';
  p->misses_before = mlxd_env_misses();
  p->seen = mlxd_env_get(p->name);
  p->misses_after = mlxd_env_misses();
  return NULL;
}

static const char* on_own_thread(const char* name, probe* p) {
  memset(p, 0, sizeof *p);
  p->name = name;
  pthread_t th;
  T_EQ_INT(mlxd_thread_start(&th, "probe-a-long-name", probe_main, p), 0);
  T_EQ_INT(pthread_join(th, NULL), 0);
  return p->seen;
}

static void test_snapshot(void) {
  probe p;
  T_ASSERT(!mlxd_thread_is_own());
  /* read on this thread: the library's thread sees that value, not a later one */
  setenv("MLXDIST_TEST_ENV_A", "one", 1);
  T_ASSERT(strcmp(mlxd_env_get("MLXDIST_TEST_ENV_A"), "one") == 0);
  setenv("MLXDIST_TEST_ENV_A", "two", 1);
  const char* v = on_own_thread("MLXDIST_TEST_ENV_A", &p);
  T_ASSERT(v && strcmp(v, "one") == 0);
  /* thread names are cut to the 15 bytes a name holds */
  T_ASSERT(strcmp(p.thread, "mlxd-probe-a-lo") == 0);
  T_EQ_INT(p.misses_after, p.misses_before);
  /* a refresh reads it again; an unset reads as unset */
  mlxd_env_refresh();
  v = on_own_thread("MLXDIST_TEST_ENV_A", &p);
  T_ASSERT(v && strcmp(v, "two") == 0);
  unsetenv("MLXDIST_TEST_ENV_A");
  mlxd_env_refresh();
  T_ASSERT(on_own_thread("MLXDIST_TEST_ENV_A", &p) == NULL);
  T_EQ_INT(p.misses_after, p.misses_before);
  /* a tunable, through the tunables' reader: set here, seen there */
  setenv("MLXDIST_WARN_AFTER", "77", 1);
  mlxd_env_refresh();
  v = on_own_thread("MLXDIST_WARN_AFTER", &p);
  T_ASSERT(v && strcmp(v, "77") == 0);
  unsetenv("MLXDIST_WARN_AFTER");
  mlxd_env_refresh();
  /* a name no caller's thread ever read: unset there, and counted as a miss */
  setenv("MLXDIST_TEST_ENV_NEVER_READ", "x", 1);
  T_ASSERT(on_own_thread("MLXDIST_TEST_ENV_NEVER_READ", &p) == NULL);
  T_EQ_INT(p.misses_after, p.misses_before + 1);
  unsetenv("MLXDIST_TEST_ENV_NEVER_READ");
  /* a value kept is kept: the pointer a library thread holds stays valid and
   * the same value is not copied twice */
  setenv("MLXDIST_TEST_ENV_B", "same", 1);
  const char* first = mlxd_env_get("MLXDIST_TEST_ENV_B");
  setenv("MLXDIST_TEST_ENV_B", "other", 1);
  (void)mlxd_env_get("MLXDIST_TEST_ENV_B");
  setenv("MLXDIST_TEST_ENV_B", "same", 1);
  T_ASSERT(mlxd_env_get("MLXDIST_TEST_ENV_B") == first && strcmp(first, "same") == 0);
  unsetenv("MLXDIST_TEST_ENV_B");
  printf("snapshot: ok\n");
}

/* ---- setenv on the caller's thread while ops run ---- */

#define STREAMS 3
#define NOISE 64   /* distinct names set and unset: the environment grows and shrinks */
#define ROUNDS 200 /* rounds of ops a rank runs (bounded, and so is the time: DEADLINE_S) */
#define DEADLINE_S 60.0

static void noise(int round) {
  char name[64], value[64];
  for (int k = 0; k < NOISE; k++) {
    snprintf(name, sizeof name, "MLXDIST_TEST_ENV_NOISE_%d", k);
    if ((k + round) % 3 == 0) {
      unsetenv(name);
    } else {
      snprintf(value, sizeof value, "%d-%d", round, k);
      setenv(name, value, 1);
    }
  }
  /* a variable the library's threads read too: a flag whose value only sets
   * a worker's priority, so ranks that read it differently still agree */
  if (round % 2)
    setenv("MLXDIST_WORKER_IDLE", round % 4 == 1 ? "1" : "0", 1);
  else
    unsetenv("MLXDIST_WORKER_IDLE");
}

static mlx_array ints(int n, int rank, int round) {
  int32_t* v = malloc(sizeof *v * (size_t)n);
  for (int i = 0; i < n; i++) v[i] = rank * 7 + i + round;
  int shape[1] = {n};
  mlx_array a = mlx_array_new_data(v, shape, 1, MLX_INT32);
  free(v);
  return a;
}

typedef struct loop_arg {
  const char* transport;
  char hostfile[256];
  char secret[256]; /* non-empty: TLS over TCP, keyed by this secret file */
} loop_arg;

static int run_loop(const char* backend);

static int loop_rank(int rank, int size, const char* session, void* arg) {
  (void)session;
  const loop_arg* a = arg;
  t_rank_env(rank, size, a->hostfile);
  setenv("MLXDIST_TRANSPORT", a->transport, 1);
  if (a->secret[0]) {
    setenv("MLXDIST_SECRET_FILE", a->secret, 1);
    setenv("MLXDIST_TLS", "1", 1);
  }
  t_capture_errors();
  return run_loop("ring");
}

/* Init backend, then ROUNDS rounds of ops on new streams with setenv between
 * them, every result checked. */
static int run_loop(const char* backend) {
  unsigned long misses = mlxd_env_misses(); /* the snapshot test's, before the fork */
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init(&g, true, backend) != 0) T_FAIL("init: %s", t_last_error());
  int rank = mlx_distributed_group_rank(g), size = mlx_distributed_group_size(g);
  double deadline = t_now() + DEADLINE_S;
  for (int round = 0; round < ROUNDS && t_now() < deadline; round++) {
    mlx_stream s[STREAMS];
    /* one stream new each round: its worker starts while the loop runs */
    for (int i = 0; i < STREAMS; i++) s[i] = mlx_stream_new();
    mlx_array x = ints(4096, rank, round), sum = mlx_array_new(), gat = mlx_array_new();
    mlx_array big = ints(1 << 18, rank, round), bigsum = mlx_array_new();
    mlx_array sent = mlx_array_new(), got = mlx_array_new();
    T_EQ_INT(mlx_distributed_all_sum(&sum, x, g, s[0]), 0);
    T_EQ_INT(mlx_distributed_all_gather(&gat, x, g, s[1]), 0);
    T_EQ_INT(mlx_distributed_all_sum(&bigsum, big, g, s[2]), 0);
    noise(round); /* while the ops are queued or running on the workers */
    int peer = (rank + 1) % size, from = (rank + size - 1) % size;
    T_EQ_INT(mlx_distributed_send(&sent, x, peer, g, s[0]), 0);
    T_EQ_INT(mlx_distributed_recv_like(&got, x, from, g, s[1]), 0);
    noise(round + 1);
    if (mlx_array_eval(sum) || mlx_array_eval(gat) || mlx_array_eval(bigsum) ||
        mlx_array_eval(sent) || mlx_array_eval(got))
      T_FAIL("rank %d round %d: %s", rank, round, t_last_error());
    const int32_t* ds = mlx_array_data_int32(sum);
    const int32_t* dg = mlx_array_data_int32(gat);
    const int32_t* db = mlx_array_data_int32(bigsum);
    const int32_t* dr = mlx_array_data_int32(got);
    int ranks7 = 7 * size * (size - 1) / 2;
    for (int i = 0; i < 4096; i++) {
      if (ds[i] != ranks7 + size * (i + round)) T_FAIL("rank %d: sum[%d] = %d", rank, i, ds[i]);
      if (dr[i] != from * 7 + i + round) T_FAIL("rank %d: recv[%d] = %d", rank, i, dr[i]);
      for (int r = 0; r < size; r++)
        if (dg[r * 4096 + i] != r * 7 + i + round) T_FAIL("rank %d: gather[%d][%d]", rank, r, i);
    }
    for (int i = 0; i < (1 << 18); i += 997)
      if (db[i] != ranks7 + size * (i + round)) T_FAIL("rank %d: big[%d] = %d", rank, i, db[i]);
    mlx_array_free(x);
    mlx_array_free(sum);
    mlx_array_free(gat);
    mlx_array_free(big);
    mlx_array_free(bigsum);
    mlx_array_free(sent);
    mlx_array_free(got);
    for (int i = 0; i < STREAMS; i++) mlx_stream_free(s[i]);
  }
  if (mlxd_env_misses() != misses)
    T_FAIL("rank %d: %lu reads on the library's threads missed the snapshot", rank,
           mlxd_env_misses() - misses);
  T_EXPECT_NO_ERROR();
  mlx_distributed_group_free(g);
  mlx_distributed_clear_backends();
  return 0;
}

static void test_setenv_loop(const char* transport, int size, bool tls) {
  char session[128];
  loop_arg a = {.transport = transport};
  t_session_name(session, sizeof session, "envloop");
  snprintf(a.hostfile, sizeof a.hostfile, "/tmp/%s.json", session);
  if (tls) {
    /* TLS 1.3 keyed by a shared secret (docs/security.md): OpenSSL reads its
     * own variables too, and must do so on a caller's thread */
    snprintf(a.secret, sizeof a.secret, "/tmp/%s.secret", session);
    FILE* f = fopen(a.secret, "w");
    T_ASSERT(f != NULL);
    fprintf(f, "%s\n", session); /* private to this run; the file is mode 0600 */
    fclose(f);
    T_EQ_INT(chmod(a.secret, 0600), 0);
  }
  t_write_loopback_hostfile(a.hostfile, size);
  t_ranks_opts opts = {.timeout_s = 120, .what = transport};
  int bad = t_run_ranks(size, loop_rank, &a, &opts, NULL);
  unlink(a.hostfile);
  if (tls) unlink(a.secret);
  if (bad) T_FAIL("setenv_loop over %s%s: %d rank(s) failed", transport, tls ? "+tls" : "", bad);
  printf("setenv_loop %s%s x %d: ok\n", transport, tls ? "+tls" : "", size);
}

int main(int argc, char** argv) {
  const char* only = argc > 1 ? argv[1] : "all";
  if (!strcmp(only, "all") || !strcmp(only, "snapshot")) test_snapshot();
  if (!strcmp(only, "all") || !strcmp(only, "tcp")) test_setenv_loop("tcp", 2, false);
  if (!strcmp(only, "all") || !strcmp(only, "shm")) test_setenv_loop("shm", 3, false);
  if (!strcmp(only, "all") || !strcmp(only, "tls")) test_setenv_loop("tcp", 2, true);
  if (!strcmp(only, "mpi")) { /* a rank of mpirun (tests/core/CMakeLists.txt) */
    t_capture_errors();
    run_loop("mpi");
    printf("setenv_loop mpi: ok\n");
  }
  return 0;
}
