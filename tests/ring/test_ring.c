/* Ring backend tests that launch their ranks by hand: this program writes an
 * MLX hostfile itself and forks N ranks with only MLX_RANK and MLX_HOSTFILE
 * set (no mlxdist tool, no MLX_WORLD_SIZE), as MLX's own launcher does.
 *
 *   test_ring basic N K   collectives, split, any-backend, clear + re-init on the same ports
 *   test_ring kill        a rank dies (SIGKILL); the survivor fails promptly, later ops fail fast
 *   test_ring split       split children over the parent's connections: siblings, an
 *                         overlapping child and the parent summing at once from threads,
 *                         the parent freed first, a split of a split, no new descriptor
 *   test_ring split_kill  a rank dies inside a child's op: the child fails naming it,
 *                         and a sibling child sharing the connections fails fast
 *   test_ring exit3       3 ranks; rank 2 _exits mid-collective; survivors fail within a bound
 *   test_ring stall       a peer stops participating; MLXDIST_OP_TIMEOUT=2 gives a timeout error
 *   test_ring badhost     malformed hostfiles and MLX_RANK values (strict / non-strict)
 *   test_ring idle        an idle initialised group uses ~0 CPU (no busy spin)
 *   test_ring transport   MLXDIST_TRANSPORT: auto picks shm on one host and, when a rank
 *                         is in another IPC namespace (an emulated host), shm between the
 *                         two others and tcp to that rank; shm with such a
 *                         rank fails naming it; bad / disagreeing values (also of
 *                         MLXDIST_ALGO) fail clearly */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "mlx/c/mlx.h"
#include "ranks.h"
#include "testutil.h"

static char g_dir[256];

static void write_text(const char* path, const char* text) {
  FILE* f = fopen(path, "w");
  T_ASSERT(f);
  fputs(text, f);
  fclose(f);
}

/* A hostfile for n ranks with k loopback addresses each. */
static void write_hostfile(const char* path, int n, int k) {
  char buf[8192];
  size_t o = 0;
  o += (size_t)snprintf(buf + o, sizeof buf - o, "[");
  for (int r = 0; r < n; r++) {
    o += (size_t)snprintf(buf + o, sizeof buf - o, "%s[", r ? ", " : "");
    for (int c = 0; c < k; c++)
      o += (size_t)snprintf(buf + o, sizeof buf - o, "%s\"127.0.0.1:%d\"", c ? ", " : "",
                            t_free_port());
    o += (size_t)snprintf(buf + o, sizeof buf - o, "]");
  }
  snprintf(buf + o, sizeof buf - o, "]\n");
  write_text(path, buf);
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
  t_rank_env(rank, size, a->hostfile);
  t_capture_errors();
  return a->fn(rank, size);
}

/* Fork n ranks running fn (tests/common/ranks.h, every rank left to end on
 * its own until limit_s) and return how many exited 0. codes[r] receives
 * each rank's exit status (128+signal when killed). */
static int spawn(int n, int k, rank_fn fn, int* codes, double limit_s) {
  char path[300];
  snprintf(path, sizeof path, "%s/hostfile.json", g_dir);
  write_hostfile(path, n, k);
  spawn_arg a = {fn, path};
  t_ranks_opts opts = {.timeout_s = limit_s, .grace_s = -1, .what = "ring"};
  t_rank_exit ex[T_MAX_RANKS];
  int bad = t_run_ranks(n, spawn_rank, &a, &opts, ex);
  for (int r = 0; r < n; r++) {
    codes[r] = ex[r].code;
    if (ex[r].timed_out) T_FAIL("rank %d did not finish within %.0f s", r, limit_s);
  }
  return n - bad;
}

static mlx_distributed_group init_ring(void) {
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init(&g, true, "ring") != 0) T_FAIL("init ring: %s", t_last_error());
  return g;
}

/* all_sum of [rank, rank+1, ...] (n int32) must be sum over ranks. */
static int check_sum(mlx_distributed_group g, int size, int n) {
  int* v = malloc(sizeof(int) * (size_t)n);
  int rank = mlx_distributed_group_rank(g);
  for (int i = 0; i < n; i++) v[i] = rank * 1000 + i;
  int shape[1] = {n};
  mlx_array x = mlx_array_new_data(v, shape, 1, MLX_INT32), y = mlx_array_new();
  T_EQ_INT(mlx_distributed_all_sum(&y, x, g, mlx_stream_new()), 0);
  int rc = mlx_array_eval(y);
  if (rc == 0) {
    const int32_t* d = mlx_array_data_int32(y);
    for (int i = 0; i < n; i++) T_EQ_INT(d[i], 1000 * size * (size - 1) / 2 + size * i);
  }
  mlx_array_free(x);
  mlx_array_free(y);
  free(v);
  return rc;
}

/* ---- basic ---- */
static int basic_rank(int rank, int size) {
  mlx_distributed_group g = init_ring();
  T_EQ_INT(mlx_distributed_group_rank(g), rank);
  T_EQ_INT(mlx_distributed_group_size(g), size);
  T_EQ_INT(check_sum(g, size, 100000), 0);
  /* any pair may talk: rank 0 <-> rank size-1 */
  if (size > 2 && (rank == 0 || rank == size - 1)) {
    int peer = rank == 0 ? size - 1 : 0;
    mlx_array x = mlx_array_new_int(rank + 40), s = mlx_array_new(), r = mlx_array_new();
    T_EQ_INT(mlx_distributed_send(&s, x, peer, g, mlx_stream_new()), 0);
    T_EQ_INT(mlx_distributed_recv_like(&r, x, peer, g, mlx_stream_new()), 0);
    int32_t got = 0;
    T_EQ_INT(mlx_array_item_int32(&got, r), 0);
    T_EQ_INT(got, peer + 40);
    mlx_array_free(x);
    mlx_array_free(s);
    mlx_array_free(r);
  }
  /* "any" resolves to the cached ring group */
  mlx_distributed_group a = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_init(&a, false, NULL), 0);
  T_EQ_INT(mlx_distributed_group_size(a), size);
  mlx_distributed_group_free(a);
  /* split into halves */
  mlx_distributed_group h = mlx_distributed_group_new();
  if (mlx_distributed_group_split(&h, g, rank < size / 2, rank) != 0)
    T_FAIL("rank %d: split failed: %s", rank, t_last_error());
  int hs = mlx_distributed_group_size(h);
  T_EQ_INT(hs, rank < size / 2 ? size / 2 : size - size / 2);
  T_EQ_INT(check_sum(h, hs, 1000), 0);
  mlx_distributed_group_free(h);
  /* clear + re-init binds the same hostfile ports again (SO_REUSEADDR) */
  for (int round = 0; round < 2; round++) {
    mlx_distributed_group_free(g);
    T_EQ_INT(mlx_distributed_clear_backends(), 0);
    g = init_ring();
    T_EQ_INT(mlx_distributed_group_rank(g), rank);
    T_EQ_INT(check_sum(g, size, 4096), 0);
  }
  mlx_distributed_group_free(g);
  mlx_distributed_clear_backends();
  T_EXPECT_NO_ERROR();
  return 0;
}

/* ---- a rank killed ---- */

/* Over TCP a lost connection's message carries the peer's address, rendered
 * after the detail: "... lost connection to rank 2 (127.0.0.1:41000; ...)". */
static bool on_tcp(void) {
  const char* v = getenv("MLXDIST_TRANSPORT");
  return v && strcmp(v, "tcp") == 0;
}

/* The last error was rendered once, by the ring: one "[ring]" tag (the front-end
 * may put its own words before it) and no lower layer's tag inside. */
static void rendered_once(void) {
  const char* m = t_last_error();
  const char* tag = strstr(m, "[ring] ");
  if (!tag || strstr(tag + 1, "[ring]") || strstr(m, "[shm]") || strstr(m, "[tcp]"))
    T_FAIL("error '%s' is not rendered once by the ring", m);
}

/* ---- split: children are views of the parent's connections ---- */

/* all_sum of n int32 [base + rank*7 + i] on g's stream s; 0 when the sum is right. */
static int split_sum(mlx_distributed_group g, mlx_stream s, int base, int n) {
  int size = mlx_distributed_group_size(g), rank = mlx_distributed_group_rank(g);
  int32_t* v = malloc(sizeof(int32_t) * (size_t)n);
  T_ASSERT(v);
  for (int i = 0; i < n; i++) v[i] = base + rank * 7 + i;
  int shape[1] = {n};
  mlx_array x = mlx_array_new_data(v, shape, 1, MLX_INT32), y = mlx_array_new();
  int rc = mlx_distributed_all_sum(&y, x, g, s);
  if (rc == 0) rc = mlx_array_eval(y);
  if (rc == 0) {
    const int32_t* d = mlx_array_data_int32(y);
    for (int i = 0; i < n && rc == 0; i++)
      if (d[i] != size * (base + i) + 7 * size * (size - 1) / 2) {
        T_CHECKF(false, "rank %d: group of %d, base %d: element %d is %d", rank, size, base, i,
                 d[i]);
        rc = -1;
      }
  }
  mlx_array_free(x);
  mlx_array_free(y);
  free(v);
  return rc;
}

static int open_fds(void) {
  int n = 0;
  char path[64];
  for (int fd = 0; fd < 4096; fd++) {
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    if (access(path, F_OK) == 0) n++;
  }
  return n;
}

typedef struct split_job {
  mlx_distributed_group g;
  int base, iters;
  int failed;
} split_job;

/* One thread's ops on one group, on a stream of its own: sums of a small
 * (one-shot or log-depth), a middle and a ring size, each checked. */
static void* split_thread(void* p) {
  split_job* j = p;
  mlx_device cpu = mlx_device_new_type(MLX_CPU, 0);
  mlx_stream s = mlx_stream_new_device(cpu);
  mlx_device_free(cpu);
  static const int sizes[] = {1, 3000, 70000};
  for (int i = 0; i < j->iters && !j->failed; i++)
    if (split_sum(j->g, s, j->base + i, sizes[i % 3]) != 0) j->failed = 1;
  mlx_stream_free(s);
  return NULL;
}

/* 4 ranks: siblings (odd/even) of one split, a child of every rank (keys
 * reversed) of another, and the parent, all summing at once from threads
 * with the same sequence numbers and different values; then the parent is
 * freed before its children, a child splits again, and (tcp) no split adds
 * a descriptor. */
static int split_rank(int rank, int size) {
  mlx_distributed_group g = init_ring();
  T_EQ_INT(check_sum(g, size, 100), 0); /* every pair has talked: no connection is left to make */
  int fds = open_fds();
  mlx_distributed_group sib = mlx_distributed_group_new(), rev = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_group_split(&sib, g, rank % 2, rank), 0);
  T_EQ_INT(mlx_distributed_group_split(&rev, g, 0, size - rank), 0);
  T_EQ_INT(mlx_distributed_group_size(sib), size / 2);
  T_EQ_INT(mlx_distributed_group_rank(sib), rank / 2);
  T_EQ_INT(mlx_distributed_group_rank(rev), size - 1 - rank);
  if (on_tcp()) T_EQ_INT(open_fds(), fds);
  split_job jobs[3] = {{g, 1000, 30, 0}, {sib, 5000 + 100 * (rank % 2), 30, 0}, {rev, 9000, 30, 0}};
  pthread_t th[3];
  for (int i = 0; i < 3; i++) T_ASSERT(pthread_create(&th[i], NULL, split_thread, &jobs[i]) == 0);
  for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < 3; i++)
    T_CHECKF(!jobs[i].failed, "rank %d: group %d failed: %s", rank, i, t_last_error());
  /* the parent goes first: its children keep the connections */
  mlx_distributed_group_free(g);
  mlx_stream s = mlx_default_cpu_stream_new();
  T_EQ_INT(split_sum(rev, s, 300, 70000), 0);
  T_EQ_INT(split_sum(sib, s, 400, 10), 0);
  /* a split of a split (of a freed parent): pairs, ranked by the reversed child */
  mlx_distributed_group pair = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_group_split(&pair, rev, (size - 1 - rank) / 2, rank), 0);
  T_EQ_INT(mlx_distributed_group_size(pair), 2);
  mlx_distributed_group_free(rev);
  T_EQ_INT(split_sum(pair, s, 500, 3000), 0);
  T_EQ_INT(split_sum(sib, s, 600, 3000), 0);
  /* point to point in the grandchild */
  int peer = 1 - mlx_distributed_group_rank(pair);
  mlx_array x = mlx_array_new_int(rank + 40), r = mlx_array_new(), sent = mlx_array_new();
  T_EQ_INT(mlx_distributed_send(&sent, x, peer, pair, s), 0);
  T_EQ_INT(mlx_distributed_recv_like(&r, x, peer, pair, s), 0);
  int32_t got = -1;
  T_EQ_INT(mlx_array_item_int32(&got, r), 0);
  T_EQ_INT(got, (rank ^ 1) + 40); /* keys size - rank pair ranks {0,1} and {2,3} */
  mlx_array_free(x);
  mlx_array_free(r);
  mlx_array_free(sent);
  if (on_tcp()) T_ASSERT(open_fds() <= fds);
  mlx_distributed_group_free(pair);
  mlx_distributed_group_free(sib);
  mlx_stream_free(s);
  mlx_distributed_clear_backends();
  T_EXPECT_NO_ERROR();
  return 0;
}

/* 3 ranks; rank 2 changes MLXDIST_ALGO after init: a split that puts it with
 * the others fails on every rank naming the setting (the split exchange's
 * check, net/split.c), one that gives it a color of its own succeeds (only
 * the ranks of one color are compared), and the parent still works. */
static int split_disagree_rank(int rank, int size) {
  mlx_distributed_group g = init_ring();
  if (rank == 2) setenv("MLXDIST_ALGO", "flat", 1);
  mlx_distributed_group c = mlx_distributed_group_new();
  T_ASSERT(mlx_distributed_group_split(&c, g, 0, rank) != 0);
  T_EXPECT_ERROR("[ring] split #", "ranks of the new group disagree on MLXDIST_ALGO",
                 rank == 2 ? "has flat" : "has auto");
  T_EQ_INT(mlx_distributed_group_split(&c, g, rank == 2, rank), 0);
  T_EQ_INT(mlx_distributed_group_size(c), rank == 2 ? 1 : 2);
  T_EQ_INT(check_sum(g, size, 10), 0);
  mlx_distributed_group_free(c);
  mlx_distributed_group_free(g);
  mlx_distributed_clear_backends();
  T_EXPECT_NO_ERROR();
  return 0;
}

/* 3 ranks, a child of all (keys reversed: child rank 2 - r), the parent freed;
 * rank 2 dies inside the child's sum: the survivors' child fails naming the
 * lost rank, and so does the parent's transport it shares (a later child op fails fast). */
static int split_kill_rank(int rank, int size) {
  setenv("MLXDIST_TIMEOUT", "20", 1);
  mlx_distributed_group g = init_ring();
  mlx_distributed_group c = mlx_distributed_group_new(), c2 = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_group_split(&c, g, 0, size - rank), 0);
  T_EQ_INT(mlx_distributed_group_split(&c2, g, rank < 2, rank), 0);
  mlx_distributed_group_free(g);
  mlx_stream s = mlx_default_cpu_stream_new();
  T_EQ_INT(split_sum(c, s, 1, 1000), 0);
  if (rank == size - 1) raise(SIGKILL);
  double t0 = t_now();
  t_clear_errors();
  T_ASSERT(split_sum(c, s, 2, 1 << 20) != 0);
  rendered_once();
  T_EXPECT_ERROR("[ring] all_sum #1: lost connection to rank ");
  T_ASSERT(t_now() - t0 < 10.0);
  /* the sibling group of ranks 0 and 1 shares the failed connections: it fails fast */
  t0 = t_now();
  T_ASSERT(split_sum(c2, s, 3, 10) != 0);
  T_EXPECT_ERROR("[ring] all_sum #0: lost connection to rank ");
  T_ASSERT(t_now() - t0 < 1.0);
  mlx_distributed_group_free(c);
  mlx_distributed_group_free(c2);
  mlx_stream_free(s);
  return 0;
}

/* Before rank `dying` is killed: every other rank tells it, by a message,
 * that its first operation is done, and it waits for all of them. A rank
 * killed as soon as its own part of an operation is done may take with it
 * bytes a peer has not read yet (a close with unread data resets the
 * connection, and what the kernel still held for the peer is dropped), and
 * that peer's operation, which must succeed, failed: ring_kill_tcp, 2 runs
 * in 40 under load, before this. */
static void settle_before_death(mlx_distributed_group g, int rank, int size, int dying) {
  mlx_array x = mlx_array_new_int(rank);
  for (int p = 0; p < size; p++) {
    if (p == dying || (rank != dying && rank != p)) continue;
    mlx_array m = mlx_array_new();
    if (rank == dying)
      T_EQ_INT(mlx_distributed_recv_like(&m, x, p, g, mlx_stream_new()), 0);
    else
      T_EQ_INT(mlx_distributed_send(&m, x, dying, g, mlx_stream_new()), 0);
    T_EQ_INT(mlx_array_eval(m), 0);
    mlx_array_free(m);
  }
  mlx_array_free(x);
}

static int kill_rank(int rank, int size) {
  setenv("MLXDIST_TIMEOUT", "20", 1);
  mlx_distributed_group g = init_ring();
  T_EQ_INT(check_sum(g, size, 1000), 0);
  settle_before_death(g, rank, size, size - 1);
  if (rank == size - 1) raise(SIGKILL);
  double t0 = t_now();
  t_clear_errors();
  int rc = check_sum(g, size, 1 << 20);
  double dt = t_now() - t0;
  T_ASSERT(rc != 0);
  /* Every survivor has a connection to the dead rank (full mesh). A survivor that
   * notices first shuts its own sockets down so the others learn at once: a survivor
   * may therefore report either the dead rank or that survivor. The message names
   * the op as users called it and its number in the group (#0 was the first sum). */
  rendered_once();
  if (on_tcp())
    T_EXPECT_ERROR("[ring] all_sum #1: lost connection to rank ", " (127.0.0.1:");
  else
    T_EXPECT_ERROR("[ring] all_sum #1: lost connection to rank ");
  T_ASSERT(dt < 10.0);
  /* every later op fails fast, under its own name and number */
  t0 = t_now();
  T_ASSERT(check_sum(g, size, 10) != 0);
  T_EXPECT_ERROR("[ring] all_sum #2: lost connection to rank ");
  mlx_array x = mlx_array_new_int(rank), r = mlx_array_new();
  T_EQ_INT(mlx_distributed_recv_like(&r, x, rank == 0 ? 1 : 0, g, mlx_stream_new()), 0);
  T_ASSERT(mlx_array_eval(r) != 0);
  T_EXPECT_ERROR("[ring] recv #0: lost connection to rank ");
  T_ASSERT(t_now() - t0 < 1.0);
  mlx_array_free(x);
  mlx_array_free(r);
  mlx_distributed_group_free(g);
  mlx_distributed_clear_backends();
  return 0;
}

static int kill2_rank(int rank, int size) {
  setenv("MLXDIST_TIMEOUT", "20", 1);
  mlx_distributed_group g = init_ring();
  T_EQ_INT(check_sum(g, size, 1000), 0);
  settle_before_death(g, rank, size, 1);
  if (rank == 1) raise(SIGKILL);
  double t0 = t_now();
  t_clear_errors();
  T_ASSERT(check_sum(g, size, 1 << 20) != 0);
  rendered_once();
  T_EXPECT_ERROR("[ring] all_sum #1: lost connection to rank 1");
  T_ASSERT(t_now() - t0 < 5.0);
  mlx_distributed_group_free(g);
  return 0;
}

/* Shared by every rank (mapped before the fork): a rank waits for another's
 * event instead of sleeping, so the order holds at any speed. */
typedef struct shared {
  atomic_int eval_tid; /* exit3: rank 2's thread that waits for its sum (0: not yet) */
  atomic_int pid;      /* exit3: rank 2's pid (0: not yet) */
  atomic_int failed;   /* stall: rank 0 has its failure */
} shared;
static shared* g_sh;

/* Rank 2 has exited: its pid is known and the process is a zombie or gone. */
static bool rank2_gone(long unused) {
  (void)unused;
  int pid = atomic_load(&g_sh->pid);
  return pid != 0 && t_pid_gone(pid);
}

static void* eval_in_thread(void* p) {
  atomic_store(&g_sh->eval_tid, (int)syscall(SYS_gettid));
  mlx_array_eval(*(mlx_array*)p);
  return NULL;
}

/* rank 2 of 3 runs a 16 MiB all_sum and _exits while it is inside it (a
 * thread of its own blocked in the wait for it): the others join once rank 2
 * has exited, so rank 2 cannot have finished when it exits. */
static int exit3_rank(int rank, int size) {
  setenv("MLXDIST_TIMEOUT", "4", 1);
  mlx_distributed_group g = init_ring();
  T_EQ_INT(check_sum(g, size, 1000), 0);
  size_t n = (16u << 20) / 4;
  float* v = calloc(n, sizeof(float));
  int shape[1] = {(int)n};
  mlx_array x = mlx_array_new_data(v, shape, 1, MLX_FLOAT32), y = mlx_array_new();
  free(v);
  if (rank != 2) t_wait_until(rank2_gone, 0, "rank 2's exit", 20.0);
  T_EQ_INT(mlx_distributed_all_sum(&y, x, g, mlx_stream_new()), 0);
  if (rank == 2) {
    pthread_t th;
    T_EQ_INT(pthread_create(&th, NULL, eval_in_thread, &y), 0);
    t_wait_count(&g_sh->eval_tid, 1, "the waiting thread's start", 20.0);
    t_wait_until(t_thread_asleep, atomic_load(&g_sh->eval_tid), "the thread blocked in the wait",
                 20.0);
    atomic_store(&g_sh->pid, (int)getpid());
    /* The raw system call: exit at once, also under ThreadSanitizer, whose
     * _exit would first report the running thread (while that thread kept
     * going and could finish the collective). */
    syscall(SYS_exit_group, 0);
  }
  double t0 = t_now();
  t_clear_errors();
  T_ASSERT(mlx_array_eval(y) != 0);
  /* rank 2's death, or (for a rank waiting on another survivor) the bounded wait */
  rendered_once();
  T_ASSERT(strstr(t_last_error(), "[ring] all_sum #1: lost connection to rank ") ||
           strstr(t_last_error(), "[ring] all_sum #1: timed out after "));
  T_ASSERT(t_now() - t0 < 10.0);
  mlx_array_free(x);
  mlx_array_free(y);
  mlx_distributed_group_free(g);
  return 0;
}

/* ---- a stalled peer: alive (heartbeats), so only MLXDIST_OP_TIMEOUT ends the wait ---- */
static int stall_rank(int rank, int size) {
  setenv("MLXDIST_TIMEOUT", "60", 1);
  setenv("MLXDIST_OP_TIMEOUT", "2", 1);
  mlx_distributed_group g = init_ring();
  T_EQ_INT(check_sum(g, size, 1000), 0);
  if (rank == 1) { /* alive, connected, but not taking part, until rank 0 has timed out */
    t_wait_count(&g_sh->failed, 1, "rank 0's time-out", 20.0);
    return 0;
  }
  double t0 = t_now();
  t_clear_errors();
  int rc = check_sum(g, size, 1000);
  double dt = t_now() - t0;
  atomic_store(&g_sh->failed, 1);
  T_ASSERT(rc != 0);
  rendered_once();
  T_EXPECT_ERROR("[ring] all_sum #1: rank 1 is alive but did not get to this operation within 2 s",
                 "MLXDIST_OP_TIMEOUT");
  T_ASSERT(dt >= 1.5 && dt < 5.0);
  mlx_distributed_group_free(g);
  return 0;
}

/* ---- idle CPU ---- */
static double cpu_seconds(void) {
  FILE* f = fopen("/proc/self/stat", "r");
  T_ASSERT(f);
  char buf[2048];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  char* p = strrchr(buf, ')'); /* fields after the command name */
  T_ASSERT(p);
  unsigned long ut = 0, stt = 0;
  /* after ")": state(3) ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
  T_ASSERT(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &stt) == 2);
  return (double)(ut + stt) / (double)sysconf(_SC_CLK_TCK);
}

static int idle_rank(int rank, int size) {
  (void)rank;
  mlx_distributed_group g = init_ring();
  T_EQ_INT(check_sum(g, size, 1000), 0);
  usleep(200000);
  double c0 = cpu_seconds(), t0 = t_now();
  sleep(3);
  double used = cpu_seconds() - c0, wall = t_now() - t0;
  fprintf(stderr, "idle: rank %d used %.3f s CPU in %.2f s\n", rank, used, wall);
  T_ASSERT(used < 0.05 * wall);
  if (check_sum(g, size, 1000) != 0) /* still works after idling */
    T_FAIL("rank %d: all_sum after idling failed: %s", rank, t_last_error());
  mlx_distributed_group_free(g);
  return 0;
}

/* ---- heartbeat frames: how many arrive while both ranks idle ---- */
/* Data segments this process's established TCP sockets have received
 * (the kernel's count, whether or not anyone read them). */
static long tcp_segs_in(void) {
  DIR* d = opendir("/proc/self/fd");
  T_ASSERT(d);
  long segs = 0;
  struct dirent* e;
  while ((e = readdir(d)) != NULL) {
    int fd = atoi(e->d_name);
    if (e->d_name[0] < '0' || e->d_name[0] > '9' || fd == dirfd(d)) continue;
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 &&
        ti.tcpi_state == 1 /* ESTABLISHED */)
      segs += (long)ti.tcpi_data_segs_in;
  }
  closedir(d);
  return segs;
}

/* argv: MLXDIST_TIMEOUT, then the fewest and most frames a rank may receive
 * in 3 s of idling (heartbeat frames every min(MLXDIST_TIMEOUT,
 * MLXDIST_WARN_AFTER) / 6 seconds, within [the watchdog's tick, 10 s]; the
 * tick is MLXDIST_TIMEOUT / 6 within [0.05 s, 1 s]). */
static const char* g_beat_timeout;
static long g_beat_lo, g_beat_hi;
static int beats_rank(int rank, int size) {
  setenv("MLXDIST_TRANSPORT", "tcp", 1);
  setenv("MLXDIST_TIMEOUT", g_beat_timeout, 1);
  setenv("MLXDIST_WARN_AFTER", "60", 1); /* the period follows the smaller of the two */
  mlx_distributed_group g = init_ring();
  T_EQ_INT(check_sum(g, size, 1000), 0);
  usleep(1200000); /* the first frame on a new connection goes at the first tick */
  long s0 = tcp_segs_in();
  double t0 = t_now();
  sleep(3);
  long got = tcp_segs_in() - s0;
  double dt = t_now() - t0;
  fprintf(stderr, "beats: rank %d got %ld frames in %.2f s (MLXDIST_TIMEOUT %s)\n", rank, got, dt,
          g_beat_timeout);
  if (dt < 3.5) { /* a rank descheduled for long on a loaded machine proves nothing */
    T_ASSERT(got >= g_beat_lo);
    T_ASSERT(got <= g_beat_hi);
  }
  T_EQ_INT(check_sum(g, size, 1000), 0);
  mlx_distributed_group_free(g);
  return 0;
}

/* ---- transport selection ---- */
static int g_tmode; /* 0: one host, 1: rank 2 in its own IPC namespace, 2: shm cannot start */
static const char* g_tsetting; /* MLXDIST_TRANSPORT for every rank (NULL: rank-dependent) */
static bool g_algo_split;      /* MLXDIST_ALGO flat on rank 0, auto elsewhere */
static bool g_segment_split;   /* MLXDIST_HIER_SEGMENT 1 MiB on rank 1, the default elsewhere */

/* A separate "host": a new IPC namespace (as root, else inside a user namespace). */
static bool other_host(void) {
  if (unshare(CLONE_NEWIPC) == 0) return true;
  return unshare(CLONE_NEWUSER | CLONE_NEWIPC) == 0;
}

/* init with MLX_RING_VERBOSE=1 and stderr in a file; returns init's rc, log in buf. */
static int init_logged(mlx_distributed_group* g, int rank, char* buf, size_t n) {
  char path[300];
  snprintf(path, sizeof path, "%s/log%d", g_dir, rank);
  int fd = open(path, O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC, 0600);
  T_ASSERT(fd >= 0);
  fflush(stderr);
  int saved = dup(2);
  T_ASSERT(saved >= 0 && dup2(fd, 2) == 2);
  setenv("MLX_RING_VERBOSE", "1", 1);
  int rc = mlx_distributed_init(g, true, "ring");
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  ssize_t k = pread(fd, buf, n - 1, 0);
  buf[k > 0 ? k : 0] = '\0';
  close(fd);
  unsetenv("MLX_RING_VERBOSE");
  return rc;
}

static int transport_rank(int rank, int size) {
  if (g_tmode == 1 && rank == 2) T_ASSERT(other_host());
  if (g_tmode == 2) { /* files of at most 4 KiB: the host segment (> 4 KiB at 4 ranks) cannot be
                         sized (ftruncate: EFBIG, the signal ignored), the logs can be written */
    struct rlimit rl;
    T_ASSERT(getrlimit(RLIMIT_FSIZE, &rl) == 0);
    rl.rlim_cur = 4096;
    signal(SIGXFSZ, SIG_IGN);
    T_ASSERT(setrlimit(RLIMIT_FSIZE, &rl) == 0);
  }
  if (g_tsetting)
    setenv("MLXDIST_TRANSPORT", g_tsetting, 1);
  else /* disagreeing settings */
    setenv("MLXDIST_TRANSPORT", rank == 0 ? "tcp" : "auto", 1);
  if (g_algo_split) setenv("MLXDIST_ALGO", rank == 0 ? "flat" : "auto", 1);
  if (g_segment_split && rank == 1) setenv("MLXDIST_HIER_SEGMENT", "1048576", 1);
  static char log[16384];
  mlx_distributed_group g = mlx_distributed_group_new();
  t_clear_errors();
  int rc = init_logged(&g, rank, log, sizeof log);
  if (g_algo_split) {
    T_ASSERT(rc != 0);
    T_EXPECT_ERROR("[ring] ranks disagree on MLXDIST_ALGO", "flat", "auto");
  } else if (g_segment_split) {
    T_ASSERT(rc != 0);
    T_EXPECT_ERROR("[ring] ranks disagree on MLXDIST_HIER_SEGMENT", "1048576", "4194304");
  } else if (!g_tsetting) {
    T_ASSERT(rc != 0);
    T_EXPECT_ERROR("[ring] ranks disagree on MLXDIST_TRANSPORT", "tcp", "auto");
  } else if (g_tmode == 2 && strcmp(g_tsetting, "shm") == 0) {
    T_ASSERT(rc != 0); /* every rank has the reason of the first rank that failed */
    T_EXPECT_ERROR(
        "[ring] MLXDIST_TRANSPORT=shm but the shared-memory transport could not start "
        "on rank 0",
        "could not size shared memory", "File too large");
  } else if (g_tmode == 1 && strcmp(g_tsetting, "shm") == 0) {
    T_ASSERT(rc != 0);
    T_EXPECT_ERROR("[ring] MLXDIST_TRANSPORT=shm needs every rank on one host", "rank 2 is",
                   "IPC namespace");
  } else {
    if (rc != 0) T_FAIL("init: %s\nlog:\n%s", t_last_error(), log);
    /* mode 1, auto: per peer (ranks 0 and 1 share a host, rank 2 is alone) */
    static const char* const per_peer[] = {
        "[ring] rank 0: transports: shm with ranks 1; tcp with ranks 2\n",
        "[ring] rank 1: transports: shm with ranks 0; tcp with ranks 2\n",
        "[ring] rank 2: transports: tcp with ranks 0,1\n"};
    const char* want = strcmp(g_tsetting, "tcp") == 0 ? "transport tcp (MLXDIST_TRANSPORT=tcp)"
                       : g_tmode == 2 ? "falling back to transport tcp (MLXDIST_TRANSPORT=auto)"
                       : g_tmode == 1 ? per_peer[rank]
                                      : "transport shm (all ";
    if (!strstr(log, want)) T_FAIL("rank %d: no '%s' in the log:\n%s", rank, want, log);
    if (g_tmode == 2 && (!strstr(log, "shared memory could not start on rank 0 (") ||
                         !strstr(log, "could not size shared memory")))
      T_FAIL("rank %d: no reason from rank 0 in the log:\n%s", rank, log);
    T_EQ_INT(check_sum(g, size, 100000), 0);
    /* split children choose again: ranks 0 and 1 share the first host in mode 1 */
    mlx_distributed_group h = mlx_distributed_group_new();
    T_EQ_INT(mlx_distributed_group_split(&h, g, rank < 2, rank), 0);
    T_EQ_INT(check_sum(h, rank < 2 ? 2 : size - 2, 1000), 0);
    mlx_distributed_group_free(h);
    T_EXPECT_NO_ERROR();
  }
  mlx_distributed_group_free(g);
  mlx_distributed_clear_backends();
  return 0;
}

static void transport_modes(void) {
  int codes[16];
  /* one host: auto -> shm, tcp -> tcp */
  g_tmode = 0;
  g_tsetting = "auto";
  T_EQ_INT(spawn(3, 1, transport_rank, codes, 60), 3);
  g_tsetting = "tcp";
  T_EQ_INT(spawn(2, 1, transport_rank, codes, 60), 2);
  /* disagreeing settings fail on every rank, without waiting */
  g_tsetting = NULL;
  T_EQ_INT(spawn(2, 1, transport_rank, codes, 60), 2);
  /* and on MLXDIST_ALGO (the two-level collectives need every rank) */
  g_tsetting = "auto";
  g_algo_split = true;
  T_EQ_INT(spawn(2, 1, transport_rank, codes, 60), 2);
  g_algo_split = false;
  /* and on a size that picks an algorithm */
  g_segment_split = true;
  T_EQ_INT(spawn(2, 1, transport_rank, codes, 60), 2);
  g_segment_split = false;
  /* shared memory that cannot start on any rank: auto falls back to TCP, shm fails; both
   * with the first failed rank's reason (an all-gather only when a rank failed) */
  g_tmode = 2;
  g_tsetting = "auto";
  T_EQ_INT(spawn(4, 1, transport_rank, codes, 60), 4);
  g_tsetting = "shm";
  T_EQ_INT(spawn(4, 1, transport_rank, codes, 60), 4);
  g_tmode = 0;
  /* an emulated second host (needs an IPC namespace; probe in a child) */
  pid_t p = fork();
  T_ASSERT(p >= 0);
  if (p == 0) _exit(other_host() ? 0 : 1);
  int status = 0;
  T_ASSERT(waitpid(p, &status, 0) == p);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    g_tmode = 1;
    g_tsetting = "shm";
    T_EQ_INT(spawn(3, 1, transport_rank, codes, 60), 3);
    g_tsetting = "auto";
    T_EQ_INT(spawn(3, 1, transport_rank, codes, 60), 3);
  } else {
    printf(
        "test_ring transport: no IPC namespace available (unshare: not permitted), "
        "skipping the two-host cases\n");
  }
  /* a bogus value: a clear error before any connection is attempted */
  t_capture_errors();
  char path[300];
  snprintf(path, sizeof path, "%s/two.json", g_dir);
  write_hostfile(path, 2, 1);
  setenv("MLX_RANK", "1", 1);
  setenv("MLX_HOSTFILE", path, 1);
  setenv("MLXDIST_TRANSPORT", "carrier-pigeon", 1);
  t_clear_errors();
  mlx_distributed_group g = mlx_distributed_group_new();
  double t0 = t_now();
  T_ASSERT(mlx_distributed_init(&g, true, "ring") != 0);
  /* every MLXDIST_* value is checked when init starts (util/tunables.h) */
  T_EXPECT_ERROR("MLXDIST_TRANSPORT='carrier-pigeon' is not valid", "auto, tcp or shm");
  T_ASSERT(t_now() - t0 < 1.0);
  mlx_distributed_group_free(g);
  unsetenv("MLXDIST_TRANSPORT");
}

/* ---- bad hostfiles (single process) ---- */
static void expect_bad_ex(const char* content, const char* rank, const char* want,
                          bool names_file) {
  char path[300];
  snprintf(path, sizeof path, "%s/bad.json", g_dir);
  if (content)
    write_text(path, content);
  else
    unlink(path);
  setenv("MLX_RANK", rank, 1);
  setenv("MLX_HOSTFILE", path, 1);
  t_clear_errors();
  mlx_distributed_group g = mlx_distributed_group_new();
  T_ASSERT(mlx_distributed_init(&g, true, "ring") != 0);
  rendered_once();
  if (names_file)
    T_EXPECT_ERROR("[ring]", path, want);
  else
    T_EXPECT_ERROR("[ring]", want);
  /* non-strict: a size-one group, not cached (a later strict init tries again) */
  T_EQ_INT(mlx_distributed_init(&g, false, "ring"), 0);
  T_EXPECT_NO_ERROR();
  T_EQ_INT(mlx_distributed_group_size(g), 1);
  T_EQ_INT(mlx_distributed_group_rank(g), 0);
  mlx_distributed_group_free(g);
  g = mlx_distributed_group_new();
  T_ASSERT(mlx_distributed_init(&g, true, "ring") != 0);
  T_EQ_INT(t_error_count(), 1);
  t_clear_errors();
}

static void expect_bad(const char* content, const char* rank, const char* want) {
  expect_bad_ex(content, rank, want, content && strstr(want, "MLX_RANK") == NULL);
}

static void badhost(void) {
  t_capture_errors();
  expect_bad(NULL, "0", "No such file");
  expect_bad("[[\"127.0.0.1:5000\"", "0", "not valid JSON");
  expect_bad("{\"hosts\": 1}", "0", "not a non-empty JSON list");
  expect_bad("[]", "0", "not a non-empty JSON list");
  expect_bad("[[\"127.0.0.1:5000\"], \"127.0.0.1:5001\"]", "0", "rank 1 is not a non-empty list");
  expect_bad("[[\"127.0.0.1:5000\", 7]]", "0", "not a list of strings");
  expect_bad("[[\"127.0.0.1\"]]", "0", "no ':port'");
  expect_bad("[[\"127.0.0.1:99999\"]]", "0", "invalid port");
  expect_bad("[[\"127.0.0.1:x1\"]]", "0", "invalid port");
  expect_bad("[[\":5000\"]]", "0", "empty or too long host");
  expect_bad("[[\"no-such-host.invalid:5000\"]]", "0", "cannot resolve");
  expect_bad("[[\"127.0.0.1:5000\", \"127.0.0.1:5001\"], [\"127.0.0.1:5002\"]]", "0",
             "rank 1 lists 1 addresses but rank 0 lists 2");
  expect_bad("[[\"127.0.0.1:5000\"], [\"127.0.0.1:5001\"]]", "2",
             "MLX_RANK=2 is outside the hostfile");
  expect_bad("[[\"127.0.0.1:5000\"], [\"127.0.0.1:5001\"]]", "one", "MLX_RANK='one'");
  expect_bad("[[\"127.0.0.1:5000\"], [\"127.0.0.1:5001\"]]", "-1", "MLX_RANK='-1'");
  /* a one-rank hostfile is a valid ring of size one */
  setenv("MLX_RANK", "0", 1);
  char path[300];
  snprintf(path, sizeof path, "%s/one.json", g_dir);
  write_hostfile(path, 1, 1);
  setenv("MLX_HOSTFILE", path, 1);
  mlx_distributed_group g = init_ring();
  T_EQ_INT(mlx_distributed_group_size(g), 1);
  mlx_distributed_group_free(g);
  mlx_distributed_clear_backends();
  /* an occupied port: the error names the address */
  int blocker = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  T_ASSERT(bind(blocker, (struct sockaddr*)&a, sizeof a) == 0 && listen(blocker, 1) == 0);
  socklen_t len = sizeof a;
  getsockname(blocker, (struct sockaddr*)&a, &len);
  char text[200], addr[64], want[200];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(a.sin_port));
  snprintf(text, sizeof text, "[[\"%s\"], [\"127.0.0.1:%d\"]]", addr, t_free_port());
  /* the failing call and its errno come after the detail */
  snprintf(want, sizeof want, "cannot bind this rank's listen address %s (bind: %s)", addr,
           strerror(EADDRINUSE));
  expect_bad_ex(text, "0", want, false);
  close(blocker);
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "basic";
  snprintf(g_dir, sizeof g_dir, "/tmp/mlxd_ring_test.XXXXXX");
  T_ASSERT(mkdtemp(g_dir));
  g_sh = mmap(NULL, sizeof *g_sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  T_ASSERT(g_sh != MAP_FAILED);
  atomic_init(&g_sh->eval_tid, 0);
  atomic_init(&g_sh->pid, 0);
  atomic_init(&g_sh->failed, 0);
  int codes[16];
  int ok = 0, n = 0;
  if (strcmp(mode, "basic") == 0) {
    n = argc > 2 ? atoi(argv[2]) : 2;
    int k = argc > 3 ? atoi(argv[3]) : 1;
    ok = spawn(n, k, basic_rank, codes, 60);
    T_EQ_INT(ok, n);
  } else if (strcmp(mode, "kill") == 0) {
    n = 2;
    ok = spawn(n, 1, kill2_rank, codes, 30);
    T_EQ_INT(codes[0], 0);
    T_EQ_INT(codes[1], 128 + SIGKILL);
    n = 3;
    ok = spawn(n, 2, kill_rank, codes, 30);
    T_EQ_INT(codes[0], 0);
    T_EQ_INT(codes[1], 0);
    T_EQ_INT(codes[2], 128 + SIGKILL);
  } else if (strcmp(mode, "split") == 0) {
    n = 4;
    ok = spawn(n, 1, split_rank, codes, 60);
    T_EQ_INT(ok, 4);
  } else if (strcmp(mode, "split_disagree") == 0) {
    n = 3;
    ok = spawn(n, 1, split_disagree_rank, codes, 30);
    T_EQ_INT(ok, 3);
  } else if (strcmp(mode, "split_kill") == 0) {
    n = 3;
    ok = spawn(n, 1, split_kill_rank, codes, 30);
    T_EQ_INT(codes[0], 0);
    T_EQ_INT(codes[1], 0);
    T_EQ_INT(codes[2], 128 + SIGKILL);
  } else if (strcmp(mode, "exit3") == 0) {
    n = 3;
    ok = spawn(n, 1, exit3_rank, codes, 30);
    T_EQ_INT(ok, 3);
  } else if (strcmp(mode, "stall") == 0) {
    n = 2;
    ok = spawn(n, 1, stall_rank, codes, 30);
    T_EQ_INT(ok, 2);
  } else if (strcmp(mode, "idle") == 0) {
    n = 2;
    ok = spawn(n, 1, idle_rank, codes, 30);
    T_EQ_INT(ok, 2);
  } else if (strcmp(mode, "beats") == 0) {
    T_ASSERT(argc == 5);
    g_beat_timeout = argv[2];
    g_beat_lo = atol(argv[3]);
    g_beat_hi = atol(argv[4]);
    n = 2;
    ok = spawn(n, 1, beats_rank, codes, 30);
    T_EQ_INT(ok, 2);
  } else if (strcmp(mode, "badhost") == 0) {
    badhost();
  } else if (strcmp(mode, "transport") == 0) {
    transport_modes();
  } else {
    T_FAIL("unknown mode '%s'", mode);
  }
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
  printf("test_ring %s: passed\n", mode);
  return 0;
}
