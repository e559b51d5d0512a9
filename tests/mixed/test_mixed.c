/* Per-peer transports through the public API: this program writes an MLX
 * hostfile and forks ranks with MLX_RANK, MLX_HOSTFILE and MLXDIST_HOST_ID
 * set, the host of rank r being the r-th digit of HOSTS ("0011": ranks 0,1
 * on one emulated host, 2,3 on another). MLXDIST_TRANSPORT is auto.
 *
 *   test_mixed choice HOSTS    every rank prints exactly the line of docs/ring.md
 *                              ("[ring] rank 0: transports: shm with ranks 1; tcp with
 *                              ranks 2,3"); all_sum / all_gather / sum_scatter /
 *                              all_to_all and send/recv around the ring give the
 *                              reference results;
 *                              split by host gives shm-only children (no TCP line, no
 *                              TCP connection made),
 *                              split off the last rank a child that mixes again;
 *                              MLX_RING_VERBOSE names the algorithm of an all_sum
 *                              (two-level where hosts have several ranks, flat in a
 *                              child made with MLXDIST_ALGO=flat) and which form an
 *                              all_to_all takes (parts gathered per host when small,
 *                              direct when large)
 *   test_mixed kill HOSTS      the last rank is killed inside a 4 MiB all_sum (two-level:
 *                              pipelined in 4 segments): every other rank fails within
 *                              a bound naming a lost rank
 *   test_mixed kill_a2a HOSTS  the same inside an all_to_all of small parts (gathered per
 *                              host: on 3p1 the victim is its host's leader)
 *   test_mixed mismatch HOSTS  rank 0 sums 10 floats, the others 11: every rank fails
 *                              with the mismatch named, none hangs
 *   test_mixed mismatch_a2a HOSTS  all_to_all with parts of 4 floats on rank 0 (gathered
 *                              per host), 1000 on the others (direct): the same */
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "mlx/c/mlx.h"
#include "ranks.h"
#include "testutil.h"

static char g_dir[256];
static const char* g_hosts;

/* Counters every rank shares (mapped before the fork): an order of events between
 * ranks is waited for, never slept for, so it holds on a machine of any speed. */
typedef struct shared {
  atomic_int warm;   /* ranks out of the warm-up */
  atomic_int posted; /* kill: survivors whose big sum is queued */
  atomic_int failed; /* mismatch: ranks whose failure was reported */
} shared;
static shared* g_sh;

/* Add this rank to *c and wait until n ranks have (bounded: 30 s). */
static void arrive_and_wait(atomic_int* c, int n, const char* what) {
  atomic_fetch_add(c, 1);
  t_wait_count(c, n, what, 30.0);
}

typedef int (*rank_fn)(int rank, int size);

typedef struct spawn_arg {
  rank_fn fn;
  const char* hostfile;
} spawn_arg;

/* A rank of spawn: the environment mlxdist-launch would give it, then fn. */
static int spawn_rank(int rank, int size, const char* session, void* arg) {
  (void)session;
  const spawn_arg* a = arg;
  char id[16];
  snprintf(id, sizeof id, "host%c", g_hosts[rank]);
  t_rank_env(rank, size, a->hostfile);
  setenv("MLXDIST_HOST_ID", id, 1);
  setenv("MLXDIST_TRANSPORT", "auto", 1);
  t_capture_errors();
  return a->fn(rank, size);
}

/* Fork n ranks on a fresh hostfile (tests/common/ranks.h, every rank left
 * to end on its own until limit_s); codes[r]: exit code (128 + signal). */
static void spawn(int n, rank_fn fn, int* codes, double limit_s) {
  char path[300];
  snprintf(path, sizeof path, "%s/hostfile.json", g_dir);
  t_write_loopback_hostfile(path, n);
  spawn_arg a = {fn, path};
  t_ranks_opts opts = {.timeout_s = limit_s, .grace_s = -1, .what = g_hosts};
  t_rank_exit ex[T_MAX_RANKS];
  t_run_ranks(n, spawn_rank, &a, &opts, ex);
  for (int r = 0; r < n; r++) {
    codes[r] = ex[r].code;
    if (ex[r].timed_out) T_FAIL("rank %d did not finish within %.0f s", r, limit_s);
  }
}

/* The line C2 (docs/ring.md) wants from rank r of a group whose ranks are
 * gr[0..n) in the parent and whose hosts are g_hosts[gr[i]]. */
static void expected_line(const int* gr, int n, int r, char* out, size_t cap) {
  size_t o = (size_t)snprintf(out, cap, "[ring] rank %d: transports:", r);
  bool printed = false;
  for (int part = 0; part < 2; part++) {
    bool any = false;
    for (int p = 0; p < n; p++) {
      if (p == r || (g_hosts[gr[p]] == g_hosts[gr[r]]) != (part == 0)) continue;
      if (!any)
        o += (size_t)snprintf(out + o, cap - o, "%s %s with ranks ", printed ? ";" : "",
                              part == 0 ? "shm" : "tcp");
      o += (size_t)snprintf(out + o, cap - o, "%s%d", any ? "," : "", p);
      any = printed = true;
    }
  }
  snprintf(out + o, cap - o, "\n");
}

/* Run f with MLX_RING_VERBOSE=1 and stderr in a file; the log into buf. */
static int logged(int rank, const char* what, int (*f)(void* ctx), void* ctx, char* buf, size_t n) {
  char path[300];
  snprintf(path, sizeof path, "%s/%s%d", g_dir, what, rank);
  int fd = open(path, O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC, 0600);
  T_ASSERT(fd >= 0);
  fflush(stderr);
  int saved = dup(2);
  T_ASSERT(saved >= 0 && dup2(fd, 2) == 2);
  setenv("MLX_RING_VERBOSE", "1", 1);
  int rc = f(ctx);
  fflush(stderr);
  unsetenv("MLX_RING_VERBOSE");
  dup2(saved, 2);
  close(saved);
  ssize_t k = pread(fd, buf, n - 1, 0);
  buf[k > 0 ? k : 0] = '\0';
  close(fd);
  return rc;
}

/* Exactly one transports line, and it is want. */
static void check_line(const char* log, const char* want, int rank) {
  const char* a = strstr(log, "transports:");
  if (!a || strstr(a + 1, "transports:"))
    T_FAIL("rank %d: expected one transports line, log:\n%s", rank, log);
  if (!strstr(log, want)) T_FAIL("rank %d: no line '%s' in the log:\n%s", rank, want, log);
}

static int do_init(void* g) { return mlx_distributed_init(g, true, "ring"); }
typedef struct split_ctx {
  mlx_distributed_group parent, *child;
  int color, key;
} split_ctx;
static int do_split(void* p) {
  split_ctx* s = p;
  return mlx_distributed_group_split(s->child, s->parent, s->color, s->key);
}

static void eval_ok(mlx_array a, const char* what) {
  if (mlx_array_eval(a) != 0) T_FAIL("eval of %s failed: %s", what, t_last_error());
}

static mlx_array floats(int n, int rank, float salt) {
  float* v = malloc(sizeof(float) * (size_t)n);
  T_ASSERT(v || n == 0);
  for (int i = 0; i < n; i++) v[i] = (float)(rank * 7 + (i % 1000)) + salt;
  int shape[1] = {n};
  mlx_array x = mlx_array_new_data(v, shape, 1, MLX_FLOAT32);
  free(v);
  return x;
}

/* all_sum, all_gather, sum_scatter and a send/recv around the ring of g
 * on n floats per rank, checked against the sums computed here. */
static void check_collectives(mlx_distributed_group g, int n) {
  int rank = mlx_distributed_group_rank(g), size = mlx_distributed_group_size(g);
  mlx_stream s = mlx_stream_new();
  mlx_array x = floats(n, rank, 0.5f), y = mlx_array_new();
  T_EQ_INT(mlx_distributed_all_sum(&y, x, g, s), 0);
  eval_ok(y, "y");
  const float* d = mlx_array_data_float32(y);
  for (int i = 0; i < n; i++) {
    float want = 0;
    for (int r = 0; r < size; r++) want += (float)(r * 7 + (i % 1000)) + 0.5f;
    if (d[i] != want) T_FAIL("all_sum[%d] = %g, expected %g", i, (double)d[i], (double)want);
  }
  mlx_array_free(y);
  y = mlx_array_new();
  T_EQ_INT(mlx_distributed_all_gather(&y, x, g, s), 0);
  eval_ok(y, "y");
  d = mlx_array_data_float32(y);
  for (int r = 0; r < size; r++)
    for (int i = 0; i < n; i++)
      if (d[(size_t)r * (size_t)n + (size_t)i] != (float)(r * 7 + (i % 1000)) + 0.5f)
        T_FAIL("all_gather: rank %d's element %d is wrong", r, i);
  mlx_array_free(y);
  mlx_array_free(x);
  /* sum_scatter: size * n elements in, n out */
  x = floats(size * n, rank, 0.25f);
  y = mlx_array_new();
  T_EQ_INT(mlx_distributed_sum_scatter(&y, x, g, s), 0);
  eval_ok(y, "y");
  d = mlx_array_data_float32(y);
  for (int i = 0; i < n; i++) {
    int gi = rank * n + i;
    float want = 0;
    for (int r = 0; r < size; r++) want += (float)(r * 7 + (gi % 1000)) + 0.25f;
    if (d[i] != want) T_FAIL("sum_scatter[%d] = %g, expected %g", i, (double)d[i], (double)want);
  }
  mlx_array_free(y);
  mlx_array_free(x);
  /* all_to_all: size parts of n; part j of rank r's input is floats(size * n, r, 0.75)'s
   * elements [j * n, (j + 1) * n), so part r of this rank's output is that of rank r */
  x = floats(size * n, rank, 0.75f);
  y = mlx_array_new();
  T_EQ_INT(mlx_distributed_all_to_all(&y, x, g, s), 0);
  eval_ok(y, "y");
  d = mlx_array_data_float32(y);
  for (int r = 0; r < size; r++)
    for (int i = 0; i < n; i++)
      if (d[(size_t)r * (size_t)n + (size_t)i] != (float)(r * 7 + ((rank * n + i) % 1000)) + 0.75f)
        T_FAIL("all_to_all: element %d of rank %d's part is wrong", i, r);
  mlx_array_free(y);
  mlx_array_free(x);
  /* send to the right, receive from the left (even ranks send first) */
  int right = (rank + 1) % size, left = (rank + size - 1) % size;
  x = floats(n, rank, 0);
  y = mlx_array_new();
  mlx_array sent = mlx_array_new();
  if (rank % 2 == 0) {
    T_EQ_INT(mlx_distributed_send(&sent, x, right, g, s), 0);
    eval_ok(sent, "sent");
    T_EQ_INT(mlx_distributed_recv_like(&y, x, left, g, s), 0);
    eval_ok(y, "y");
  } else {
    T_EQ_INT(mlx_distributed_recv_like(&y, x, left, g, s), 0);
    eval_ok(y, "y");
    T_EQ_INT(mlx_distributed_send(&sent, x, right, g, s), 0);
    eval_ok(sent, "sent");
  }
  d = mlx_array_data_float32(y);
  for (int i = 0; i < n; i++)
    if (d[i] != (float)(left * 7 + (i % 1000))) T_FAIL("recv from rank %d: element %d", left, i);
  mlx_array_free(sent);
  mlx_array_free(y);
  mlx_array_free(x);
}

/* The line MLX_RING_VERBOSE=1 prints for an all_sum of nbytes on the group
 * of the ranks in[0..m) of HOSTS (docs/ring.md): "all_sum 1200000 B: hier
 * (2 hosts x 2)", "... hier (2 hosts: 2+1 ranks)", or "... flat" (one host,
 * or one rank per host, or flat forced). */
static void expected_algo(const int* in, int m, size_t nbytes, bool flat, char* out, size_t cap) {
  char seen[T_MAX_RANKS];
  int count[T_MAX_RANKS] = {0}, nh = 0, most = 0, least = T_MAX_RANKS;
  for (int i = 0; i < m; i++) {
    char hd = g_hosts[in[i]];
    int k = 0;
    while (k < nh && seen[k] != hd) k++;
    if (k == nh) seen[nh++] = hd;
    count[k]++;
  }
  for (int k = 0; k < nh; k++) {
    if (count[k] > most) most = count[k];
    if (count[k] < least) least = count[k];
  }
  int o = snprintf(out, cap, "all_sum %zu B: ", nbytes);
  if (flat || nh < 2 || most < 2) {
    snprintf(out + o, cap - (size_t)o, "flat");
  } else if (most == least) {
    snprintf(out + o, cap - (size_t)o, "hier (%d hosts x %d)", nh, most);
  } else {
    o += snprintf(out + o, cap - (size_t)o, "hier (%d hosts: ", nh);
    for (int k = 0; k < nh; k++)
      o += snprintf(out + o, cap - (size_t)o, "%s%d", k ? "+" : "", count[k]);
    snprintf(out + o, cap - (size_t)o, " ranks)");
  }
}

typedef struct sum_ctx {
  mlx_distributed_group g;
  int n;
} sum_ctx;
static int do_all_sum(void* p) {
  sum_ctx* c = p;
  mlx_stream s = mlx_stream_new();
  mlx_array x = floats(c->n, 0, 0), y = mlx_array_new();
  int rc = mlx_distributed_all_sum(&y, x, c->g, s);
  if (rc == 0) rc = mlx_array_eval(y);
  mlx_array_free(y);
  mlx_array_free(x);
  mlx_stream_free(s);
  return rc;
}

/* The algorithm line of an all_sum of n floats on g (ranks in[0..m) of HOSTS). */
static void check_algo(mlx_distributed_group g, const int* in, int m, int n, bool flat, int rank) {
  static char log[16384];
  char want[160];
  sum_ctx c = {g, n};
  if (logged(rank, "sum", do_all_sum, &c, log, sizeof log) != 0)
    T_FAIL("all_sum: %s\nlog:\n%s", t_last_error(), log);
  expected_algo(in, m, (size_t)n * 4, flat, want, sizeof want);
  if (!strstr(log, want)) T_FAIL("rank %d: no line '%s' in the log:\n%s", rank, want, log);
}

static int do_all_to_all(void* p) {
  sum_ctx* c = p;
  int size = mlx_distributed_group_size(c->g);
  mlx_stream s = mlx_stream_new();
  mlx_array x = floats(c->n * size, 0, 0), y = mlx_array_new();
  int rc = mlx_distributed_all_to_all(&y, x, c->g, s);
  if (rc == 0) rc = mlx_array_eval(y);
  mlx_array_free(y);
  mlx_array_free(x);
  mlx_stream_free(s);
  return rc;
}

/* The algorithm line of an all_to_all of parts of n floats on g, a group of every rank of
 * HOSTS with several ranks on some host: "all_to_all 64 B: hier (2 hosts x 2, parts
 * gathered per host)" (hier_topo.c: parts of 16 B are gathered on every host map here,
 * parts of 4000 B on none). */
static void check_a2a_algo(mlx_distributed_group g, int size, int n, bool gathered, int rank) {
  static char log[16384];
  sum_ctx c = {g, n};
  if (logged(rank, "a2a", do_all_to_all, &c, log, sizeof log) != 0)
    T_FAIL("all_to_all: %s\nlog:\n%s", t_last_error(), log);
  int all[T_MAX_RANKS];
  for (int i = 0; i < size; i++) all[i] = i;
  char want[160], form[200];
  expected_algo(all, size, 0, false, want, sizeof want); /* "all_sum 0 B: hier (...)" */
  char* hier = strstr(want, "hier (");
  T_ASSERT(hier && want[strlen(want) - 1] == ')');
  want[strlen(want) - 1] = 0;
  snprintf(form, sizeof form, "all_to_all %zu B: %s, parts %s)", (size_t)n * 4 * (size_t)size, hier,
           gathered ? "gathered per host" : "direct");
  if (!strstr(log, form)) T_FAIL("rank %d: no line '%s' in the log:\n%s", rank, form, log);
}

static int choice_rank(int rank, int size) {
  setenv("MLXDIST_TIMEOUT", "30", 1);
  static char log[16384];
  char want[512];
  int all[T_MAX_RANKS];
  for (int i = 0; i < size; i++) all[i] = i;
  mlx_distributed_group g = mlx_distributed_group_new();
  if (logged(rank, "init", do_init, &g, log, sizeof log) != 0)
    T_FAIL("init: %s\nlog:\n%s", t_last_error(), log);
  expected_line(all, size, rank, want, sizeof want);
  check_line(log, want, rank);
  const int sizes[] = {1, 1000, 300000}; /* one element, small, above the ring switch */
  for (int i = 0; i < 3; i++) check_collectives(g, sizes[i]);
  /* auto runs the two-level forms at every size, between MLXDIST_SMALL_BYTES
   * (64 KiB) and 1 MiB too (where it once ran the flat ones) */
  check_algo(g, all, size, 300000, false, rank);
  check_algo(g, all, size, 70000, false, rank);
  check_a2a_algo(g, size, 4, true, rank);
  check_a2a_algo(g, size, 1000, false, rank);

  /* split by host: every child is on one host, so it is shm only */
  mlx_distributed_group h = mlx_distributed_group_new();
  split_ctx sc = {g, &h, g_hosts[rank] - '0', rank};
  if (logged(rank, "split1-", do_split, &sc, log, sizeof log) != 0)
    T_FAIL("split by host: %s\nlog:\n%s", t_last_error(), log);
  int gr[T_MAX_RANKS], m = 0, me = 0;
  for (int p = 0; p < size; p++)
    if (g_hosts[p] == g_hosts[rank]) {
      if (p == rank) me = m;
      gr[m++] = p;
    }
  T_EQ_INT(mlx_distributed_group_size(h), m);
  if (m > 1) {
    expected_line(gr, m, me, want, sizeof want);
    check_line(log, want, rank);
    if (strstr(log, "tcp with")) T_FAIL("rank %d: a one-host child uses tcp:\n%s", rank, log);
    /* and builds no TCP mesh at all (net/mesh.c logs every connection) */
    if (strstr(log, ": connection ") || !strstr(log, "no TCP mesh"))
      T_FAIL("rank %d: a one-host child connected over TCP:\n%s", rank, log);
    check_collectives(h, 1000);
  }
  mlx_distributed_group_free(h);

  /* split off the last rank: the others' child spans hosts again */
  h = mlx_distributed_group_new();
  split_ctx sc2 = {g, &h, rank == size - 1, rank};
  if (logged(rank, "split2-", do_split, &sc2, log, sizeof log) != 0)
    T_FAIL("split off the last rank: %s\nlog:\n%s", t_last_error(), log);
  if (rank < size - 1) {
    T_EQ_INT(mlx_distributed_group_size(h), size - 1);
    expected_line(all, size - 1, rank, want, sizeof want);
    check_line(log, want, rank);
    check_collectives(h, 70000);
    check_algo(h, all, size - 1, 300000, false, rank);
  }
  mlx_distributed_group_free(h);

  /* MLXDIST_ALGO=flat, read by a child made of every rank: the one-level
   * algorithms give the same results */
  setenv("MLXDIST_ALGO", "flat", 1);
  h = mlx_distributed_group_new();
  split_ctx sc3 = {g, &h, 0, rank};
  if (logged(rank, "split3-", do_split, &sc3, log, sizeof log) != 0)
    T_FAIL("split with MLXDIST_ALGO=flat: %s\nlog:\n%s", t_last_error(), log);
  unsetenv("MLXDIST_ALGO");
  check_collectives(h, 70000);
  check_algo(h, all, size, 70000, true, rank);
  mlx_distributed_group_free(h);
  T_EXPECT_NO_ERROR();
  mlx_distributed_group_free(g);
  mlx_distributed_clear_backends();
  return 0;
}

static bool g_a2a; /* kill_a2a, mismatch_a2a: the op is all_to_all */

/* The op of kill / mismatch on g: all_sum of x, or all_to_all of x. */
static int the_op(mlx_array* y, mlx_array x, mlx_distributed_group g, mlx_stream s) {
  return g_a2a ? mlx_distributed_all_to_all(y, x, g, s) : mlx_distributed_all_sum(y, x, g, s);
}

static int kill_rank(int rank, int size) {
  setenv("MLXDIST_TIMEOUT", "20", 1);
  /* the two-level sum in 4 segments: the failure reaches a pipeline (hier.c), its column
   * thread and the op's thread each in their own phase */
  setenv("MLXDIST_HIER_SEGMENT", "1048576", 1);
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init(&g, true, "ring") != 0) T_FAIL("init: %s", t_last_error());
  check_collectives(g, 100);
  mlx_stream s = mlx_stream_new();
  /* all_to_all: parts of 16 floats, gathered per host on every host map here */
  mlx_array x = floats(g_a2a ? 16 * size : 1 << 20, rank, 0), y = mlx_array_new();
  if (rank == size - 1) {
    /* Die inside the sum: every other rank is out of the warm-up and has queued its sum,
     * which none can finish without this rank's part. This rank queues its own and dies
     * at once, before most of its 4 MiB can leave. */
    arrive_and_wait(&g_sh->posted, size, "the survivors' ops queued");
    T_EQ_INT(the_op(&y, x, g, s), 0);
    raise(SIGKILL);
  }
  /* Should the dying rank's part all leave before the kill lands (a fast machine, a
   * preempted main thread), a survivor's first sum may succeed; its second cannot (the
   * dead rank queued no other). So a survivor calls until the failure comes, at most twice. */
  double dt = 0;
  for (int i = 0;; i++) {
    t_clear_errors();
    double t0 = t_now();
    int rc = the_op(&y, x, g, s);
    if (i == 0) atomic_fetch_add(&g_sh->posted, 1);
    if (rc == 0) rc = mlx_array_eval(y);
    dt = t_now() - t0;
    if (rc != 0) break;
    if (i == 1) T_FAIL("rank %d: two ops succeeded, rank %d killed", rank, size - 1);
    fprintf(stderr, "rank %d: the op rank %d died in succeeded here; the next fails\n", rank,
            size - 1);
  }
  const char* m = t_last_error();
  fprintf(stderr, "rank %d: %s\n", rank, m);
  /* every survivor names the dead rank: one that heard of it from a neighbour (shm or TCP)
   * relays it before it shuts its sockets, so none sees a bare close of a living rank */
  char lost[64];
  snprintf(lost, sizeof lost, "lost connection to rank %d", size - 1); /* size < 10 */
  if (!strstr(m, g_a2a ? "[ring] all_to_all #" : "[ring] all_sum #") || !strstr(m, lost) ||
      strstr(strstr(m, "[ring]") + 1, "[ring]"))
    T_FAIL("rank %d: unexpected error '%s'", rank, m);
  if (dt > 10.0) T_FAIL("rank %d: the failure took %.1f s", rank, dt);
  mlx_array_free(x);
  mlx_array_free(y);
  mlx_distributed_group_free(g);
  return 0;
}

static int mismatch_rank(int rank, int size) {
  (void)size;
  setenv("MLXDIST_TIMEOUT", "20", 1);
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init(&g, true, "ring") != 0) T_FAIL("init: %s", t_last_error());
  check_collectives(g, 100);
  /* every rank is out of the warm-up before the failure comes */
  arrive_and_wait(&g_sh->warm, size, "the warm-up");
  /* all_to_all: parts of 4 floats on rank 0 (gathered per host), 1000 elsewhere (direct) */
  int n = g_a2a ? (rank == 0 ? 4 : 1000) * size : rank == 0 ? 10 : 11;
  mlx_array x = floats(n, rank, 0), y = mlx_array_new();
  double t0 = t_now();
  t_clear_errors();
  T_ASSERT(the_op(&y, x, g, mlx_stream_new()) != 0 || mlx_array_eval(y) != 0);
  const char* m = t_last_error();
  char want[96];
  snprintf(want, sizeof want, "mismatched calls: rank 0 called %s(float32 x %d), rank ",
           g_a2a ? "all_to_all" : "all_sum", g_a2a ? 4 * size : 10);
  fprintf(stderr, "rank %d: %s\n", rank, m);
  if (!strstr(m, g_a2a ? "[ring] all_to_all #" : "[ring] all_sum #") || !strstr(m, want))
    T_FAIL("rank %d: unexpected error '%s'", rank, m);
  if (t_now() - t0 > 10.0) T_FAIL("rank %d: the failure took %.1f s", rank, t_now() - t0);
  /* Keep the group open until every rank has its failure: a rank that closes its
   * sockets with a peer's bytes unread resets the connection, and the reset can
   * overtake the failure it relayed (TCP's rule, the same without shm). */
  arrive_and_wait(&g_sh->failed, size, "the failures reported");
  mlx_array_free(x);
  mlx_array_free(y);
  mlx_distributed_group_free(g);
  return 0;
}

int main(int argc, char** argv) {
  if (argc != 3 || strlen(argv[2]) < 2 || strlen(argv[2]) > T_MAX_RANKS ||
      strspn(argv[2], "0123456789") != strlen(argv[2])) {
    fprintf(stderr, "usage: %s choice|kill|kill_a2a|mismatch|mismatch_a2a HOSTS\n", argv[0]);
    return 2;
  }
  const char* mode = argv[1];
  g_hosts = argv[2];
  g_a2a = strcmp(mode, "kill_a2a") == 0 || strcmp(mode, "mismatch_a2a") == 0;
  int n = (int)strlen(g_hosts), codes[T_MAX_RANKS];
  snprintf(g_dir, sizeof g_dir, "/tmp/mlxd_mixed_test.XXXXXX");
  T_ASSERT(mkdtemp(g_dir));
  g_sh = mmap(NULL, sizeof *g_sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  T_ASSERT(g_sh != MAP_FAILED);
  atomic_init(&g_sh->warm, 0);
  atomic_init(&g_sh->posted, 0);
  atomic_init(&g_sh->failed, 0);
  if (strcmp(mode, "choice") == 0) {
    spawn(n, choice_rank, codes, 200);
    for (int r = 0; r < n; r++)
      if (codes[r] != 0) T_FAIL("rank %d exited with %d", r, codes[r]);
  } else if (strcmp(mode, "kill") == 0 || strcmp(mode, "kill_a2a") == 0) {
    spawn(n, kill_rank, codes, 60);
    for (int r = 0; r < n - 1; r++)
      if (codes[r] != 0) T_FAIL("rank %d exited with %d", r, codes[r]);
    T_EQ_INT(codes[n - 1], 128 + SIGKILL);
  } else if (strcmp(mode, "mismatch") == 0 || strcmp(mode, "mismatch_a2a") == 0) {
    spawn(n, mismatch_rank, codes, 60);
    for (int r = 0; r < n; r++)
      if (codes[r] != 0) T_FAIL("rank %d exited with %d", r, codes[r]);
  } else {
    T_FAIL("unknown mode '%s'", mode);
  }
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
  printf("test_mixed %s %s: passed\n", mode, g_hosts);
  return 0;
}
