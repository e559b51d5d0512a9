/* init_with_all_gather with the ring backend ("bring your own rendezvous").
 * This program forks its ranks itself with MLX_RANK and MLX_WORLD_SIZE only
 * (no hostfile) and bootstraps them through the examples' callbacks
 * (examples/bootstrap/shared_dir.c, tcp_kv.c).
 *
 *   test_bootstrap ok N K          success, ops, split, cached re-init, dtor timing, re-bootstrap
 *   test_bootstrap fail N strict   rank 1's callback fails: every rank fails promptly
 *   test_bootstrap fail N lax      ... non-strict: size-one group, not cached
 *   test_bootstrap garbage N MODE  callback returns zeros / random / swapped blocks
 *   test_bootstrap tcpkv N         the TCP rendezvous example
 *   test_bootstrap env             bad MLX_RANK / MLX_WORLD_SIZE, size one, unsupported backend */
#include <netinet/in.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap_examples.h"
#include "mlx/c/mlx.h"
#include "ranks.h"
#include "testutil.h"

static char g_dir[256];

/* ---- a counting wrapper around the shared-directory callback ---- */
enum { MODE_OK, MODE_FAIL_RANK1, MODE_ZERO, MODE_RANDOM, MODE_SWAP };
typedef struct {
  shared_dir sd;
  int mode;
  int calls;
  atomic_int dtors; /* the dtor may run on a stream worker thread (see dtor_count) */
} counted;

static int counted_gather(void* dst, const void* src, size_t n, int rank, int size, void* p) {
  counted* c = p;
  c->calls++;
  switch (c->mode) {
    case MODE_FAIL_RANK1:
      if (rank == 1) {
        shared_dir_abort(&c->sd); /* tell the others not to wait for us */
        return 7;
      }
      return shared_dir_all_gather(dst, src, n, rank, size, &c->sd);
    case MODE_ZERO: memset(dst, 0, n * (size_t)size); return 0;
    case MODE_RANDOM: {
      unsigned x = 12345u + (unsigned)rank;
      for (size_t i = 0; i < n * (size_t)size; i++) {
        x = x * 1103515245u + 12345u;
        ((unsigned char*)dst)[i] = (unsigned char)(x >> 16);
      }
      return 0;
    }
    case MODE_SWAP: {
      int rc = shared_dir_all_gather(dst, src, n, rank, size, &c->sd);
      if (rc) return rc;
      unsigned char* b = dst;
      unsigned char* tmp = malloc(n);
      memcpy(tmp, b, n); /* swap the blocks of ranks 0 and size-1 */
      memcpy(b, b + (size_t)(size - 1) * n, n);
      memcpy(b + (size_t)(size - 1) * n, tmp, n);
      free(tmp);
      return 0;
    }
    default: return shared_dir_all_gather(dst, src, n, rank, size, &c->sd);
  }
}
static void counted_dtor(void* p) { atomic_fetch_add(&((counted*)p)->dtors, 1); }

/* The dtor runs when the last reference to the group goes. A task that has just
 * completed an op may still hold one for a moment on its stream's worker thread
 * after eval returned, so a count expected to become 1 gets a short bounded wait;
 * then it must be exactly 1 (and stays so: checked again at the end). */
static int dtor_count(counted* c, int expect) {
  double deadline = t_now() + 2.0;
  while (atomic_load(&c->dtors) < expect && t_now() < deadline) usleep(1000);
  return atomic_load(&c->dtors);
}

static void counted_init(counted* c, const char* tag, int mode) {
  memset(c, 0, sizeof *c);
  atomic_init(&c->dtors, 0);
  shared_dir_init(&c->sd, g_dir, tag, 10.0);
  c->mode = mode;
}

static int check_sum(mlx_distributed_group g, int n) {
  int rank = mlx_distributed_group_rank(g), size = mlx_distributed_group_size(g);
  int* v = malloc(sizeof(int) * (size_t)n);
  for (int i = 0; i < n; i++) v[i] = rank * 100 + i;
  int shape[1] = {n};
  mlx_array x = mlx_array_new_data(v, shape, 1, MLX_INT32), y = mlx_array_new();
  T_EQ_INT(mlx_distributed_all_sum(&y, x, g, mlx_stream_new()), 0);
  int rc = mlx_array_eval(y);
  if (rc == 0) {
    const int32_t* d = mlx_array_data_int32(y);
    for (int i = 0; i < n; i++) T_EQ_INT(d[i], 100 * size * (size - 1) / 2 + size * i);
  } else {
    fprintf(stderr, "rank %d of %d: all_sum failed: %s\n", rank, size, t_last_error());
  }
  mlx_array_free(x);
  mlx_array_free(y);
  free(v);
  return rc;
}

/* ---- rank programs ---- */
static int g_arg_n, g_arg_k;
static const char* g_arg_mode;

static int ok_rank(int rank, int size) {
  counted c, c2, c3;
  counted_init(&c, "first", MODE_OK);
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init_with_all_gather(&g, true, "ring", counted_gather, &c, counted_dtor))
    T_FAIL("bootstrap: %s", t_last_error());
  T_EQ_INT(mlx_distributed_group_rank(g), rank);
  T_EQ_INT(mlx_distributed_group_size(g), size);
  T_ASSERT(c.calls >= 1);
  T_EQ_INT(dtor_count(&c, 0), 0);
  T_EQ_INT(check_sum(g, 5000), 0);
  /* send/recv between any pair */
  if (size > 1) {
    int to = (rank + 1) % size, from = (rank + size - 1) % size;
    mlx_array x = mlx_array_new_int(rank), s = mlx_array_new(), r = mlx_array_new();
    T_EQ_INT(mlx_distributed_send(&s, x, to, g, mlx_default_cpu_stream_new()), 0);
    mlx_device cpu = mlx_device_new_type(MLX_CPU, 0);
    mlx_stream other = mlx_stream_new_device(cpu);
    T_EQ_INT(mlx_distributed_recv_like(&r, x, from, g, other), 0);
    int32_t got = -1;
    T_EQ_INT(mlx_array_item_int32(&got, r), 0);
    T_EQ_INT(got, from);
    T_EQ_INT(mlx_array_eval(s), 0);
    mlx_array_free(x);
    mlx_array_free(s);
    mlx_array_free(r);
    mlx_stream_free(other);
    mlx_device_free(cpu);
  }
  /* split of a bootstrapped group (reverse order within each parity) */
  mlx_distributed_group sub = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_group_split(&sub, g, rank % 2, size - rank), 0);
  int m = (size - rank % 2 + 1) / 2;
  T_EQ_INT(mlx_distributed_group_size(sub), m);
  T_EQ_INT(mlx_distributed_group_rank(sub), m - 1 - rank / 2);
  T_EQ_INT(check_sum(sub, 777), 0);
  int calls_before = c.calls;
  T_EQ_INT(c.calls, calls_before); /* split does not use the callback */

  /* cached: a second init returns the group; its callback is not called, its dtor runs now */
  counted_init(&c2, "unused", MODE_OK);
  mlx_distributed_group g2 = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_init_with_all_gather(&g2, true, "ring", counted_gather, &c2,
                                                counted_dtor),
           0);
  T_EQ_INT(c2.calls, 0);
  T_EQ_INT(dtor_count(&c2, 1), 1);
  T_EQ_INT(mlx_distributed_group_size(g2), size);

  /* the kept callback's dtor waits for clear_backends AND every handle, split groups included */
  mlx_distributed_group_free(g2);
  mlx_distributed_group_free(g);
  T_EQ_INT(dtor_count(&c, 0), 0);
  T_EQ_INT(mlx_distributed_clear_backends(), 0);
  T_EQ_INT(dtor_count(&c, 0), 0); /* the split group still holds it */
  T_EQ_INT(check_sum(sub, 10), 0);
  mlx_distributed_group_free(sub);
  T_EQ_INT(dtor_count(&c, 1), 1);
  T_EQ_INT(c.calls, calls_before);

  /* clear and bootstrap again, with a fresh rendezvous */
  counted_init(&c3, "second", MODE_OK);
  g = mlx_distributed_group_new();
  if (mlx_distributed_init_with_all_gather(&g, true, "ring", counted_gather, &c3, counted_dtor))
    T_FAIL("re-bootstrap: %s", t_last_error());
  T_EQ_INT(check_sum(g, 100), 0);
  mlx_distributed_group_free(g);
  T_EQ_INT(dtor_count(&c3, 0), 0);
  T_EQ_INT(mlx_distributed_clear_backends(), 0);
  T_EQ_INT(dtor_count(&c3, 1), 1);
  T_EQ_INT(dtor_count(&c, 1), 1);
  T_EQ_INT(dtor_count(&c2, 1), 1);
  T_EXPECT_NO_ERROR();
  return 0;
}

static int fail_rank(int rank, int size) {
  (void)size;
  bool strict = strcmp(g_arg_mode, "strict") == 0;
  counted c;
  counted_init(&c, "fail", MODE_FAIL_RANK1);
  mlx_distributed_group g = mlx_distributed_group_new();
  double t0 = t_now();
  int rc =
      mlx_distributed_init_with_all_gather(&g, strict, "ring", counted_gather, &c, counted_dtor);
  double dt = t_now() - t0;
  T_ASSERT(dt < 5.0); /* prompt: nobody waits out a timeout */
  T_EQ_INT(dtor_count(&c, 1), 1);
  if (strict) {
    T_ASSERT(rc != 0);
    T_EXPECT_ERROR("all_gather callback returned", rank == 1 ? "returned 7" : "returned 2");
  } else {
    T_EQ_INT(rc, 0);
    T_EXPECT_NO_ERROR();
    T_EQ_INT(mlx_distributed_group_size(g), 1);
    T_EQ_INT(mlx_distributed_group_rank(g), 0);
    mlx_distributed_group_free(g);
    /* not cached: the next init tries again and succeeds */
    counted ok;
    counted_init(&ok, "retry", MODE_OK);
    g = mlx_distributed_group_new();
    if (mlx_distributed_init_with_all_gather(&g, false, "ring", counted_gather, &ok, counted_dtor))
      T_FAIL("retry: %s", t_last_error());
    T_EQ_INT(mlx_distributed_group_size(g), size);
    T_EQ_INT(ok.calls >= 1, 1);
    T_EQ_INT(check_sum(g, 10), 0);
    mlx_distributed_group_free(g);
    mlx_distributed_clear_backends();
    T_EQ_INT(dtor_count(&ok, 1), 1);
  }
  T_EQ_INT(dtor_count(&c, 1), 1);
  return 0;
}

static int garbage_rank(int rank, int size) {
  (void)size;
  (void)rank;
  int mode = strcmp(g_arg_mode, "zero") == 0     ? MODE_ZERO
             : strcmp(g_arg_mode, "random") == 0 ? MODE_RANDOM
                                                 : MODE_SWAP;
  counted c;
  counted_init(&c, "garbage", mode);
  mlx_distributed_group g = mlx_distributed_group_new();
  T_ASSERT(mlx_distributed_init_with_all_gather(&g, true, "ring", counted_gather, &c,
                                                counted_dtor) != 0);
  T_EXPECT_ERROR("[ring]", "malformed address record for rank",
                 mode == MODE_SWAP ? "claims to be from rank" : "rank 0");
  T_EQ_INT(dtor_count(&c, 1), 1);
  /* non-strict: a size-one group */
  counted_init(&c, "garbage2", mode);
  T_EQ_INT(mlx_distributed_init_with_all_gather(&g, false, "ring", counted_gather, &c,
                                                counted_dtor),
           0);
  T_EQ_INT(mlx_distributed_group_size(g), 1);
  T_EQ_INT(dtor_count(&c, 1), 1);
  mlx_distributed_group_free(g);
  return 0;
}

static int g_kv_port;
static int tcpkv_rank(int rank, int size) {
  char spec[64];
  snprintf(spec, sizeof spec, "127.0.0.1:%d", g_kv_port);
  tcp_kv* kv = tcp_kv_new(spec, rank, 20.0);
  T_ASSERT(kv);
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init_with_all_gather(&g, true, "ring", tcp_kv_all_gather, kv, tcp_kv_free))
    T_FAIL("tcp_kv bootstrap: %s", t_last_error());
  T_EQ_INT(mlx_distributed_group_size(g), size);
  T_EQ_INT(check_sum(g, 1000), 0);
  mlx_distributed_group sub = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_group_split(&sub, g, 0, -1), 0);
  T_EQ_INT(mlx_distributed_group_rank(sub), rank);
  T_EQ_INT(check_sum(sub, 10), 0);
  mlx_distributed_group_free(sub);
  mlx_distributed_group_free(g);
  mlx_distributed_clear_backends(); /* runs tcp_kv_free: rank 0's server stops */
  return 0;
}

typedef int (*rank_fn)(int, int);
typedef struct spawn_arg {
  rank_fn fn;
} spawn_arg;

/* A rank of spawn: MLX_RANK and MLX_WORLD_SIZE (no hostfile), then fn. */
static int spawn_rank(int rank, int size, const char* session, void* arg) {
  (void)session;
  t_rank_env(rank, size, NULL);
  t_capture_errors();
  return ((const spawn_arg*)arg)->fn(rank, size);
}

/* Fork n ranks running fn (tests/common/ranks.h, every rank left to end on
 * its own until limit_s); returns how many exited 0. */
static int spawn(int n, rank_fn fn, int* codes, double limit_s) {
  t_ranks_opts opts = {.timeout_s = limit_s, .grace_s = -1, .what = "bootstrap"};
  t_rank_exit ex[T_MAX_RANKS];
  spawn_arg a = {fn};
  int bad = t_run_ranks(n, spawn_rank, &a, &opts, ex);
  for (int r = 0; r < n; r++) {
    codes[r] = ex[r].code;
    if (ex[r].timed_out) T_FAIL("rank %d did not finish within %.0f s", r, limit_s);
  }
  return n - bad;
}

/* ---- configuration errors (one process) ---- */
static int never_called(void* d, const void* s, size_t n, int r, int z, void* p) {
  (void)d, (void)s, (void)n, (void)r, (void)z;
  ((counted*)p)->calls++;
  return 0;
}

static void expect_env_error(const char* rank, const char* size, const char* want) {
  if (rank)
    setenv("MLX_RANK", rank, 1);
  else
    unsetenv("MLX_RANK");
  if (size)
    setenv("MLX_WORLD_SIZE", size, 1);
  else
    unsetenv("MLX_WORLD_SIZE");
  counted c;
  counted_init(&c, "env", MODE_OK);
  mlx_distributed_group g = mlx_distributed_group_new();
  t_clear_errors();
  T_ASSERT(mlx_distributed_init_with_all_gather(&g, true, "ring", never_called, &c, counted_dtor) !=
           0);
  T_EXPECT_ERROR(want);
  T_EQ_INT(c.calls, 0);
  T_EQ_INT(dtor_count(&c, 1), 1);
}

static void env_tests(void) {
  t_capture_errors();
  unsetenv("MLX_HOSTFILE");
  expect_env_error("0", "abc", "MLX_WORLD_SIZE='abc'");
  expect_env_error("0", "0", "MLX_WORLD_SIZE='0'");
  expect_env_error("x", "2", "MLX_RANK='x'");
  expect_env_error("2", "2", "MLX_RANK=2 is outside [0, MLX_WORLD_SIZE=2)");
  expect_env_error(NULL, "2", "MLX_RANK");
  expect_env_error("0", NULL, "MLX_WORLD_SIZE");
  setenv("MLXDIST_RING_ADDR", "not an address", 1);
  expect_env_error("0", "2", "MLXDIST_RING_ADDR");
  setenv("MLXDIST_RING_ADDR", "127.0.0.1", 1);
  setenv("MLXDIST_RING_CONNECTIONS", "0", 1);
  expect_env_error("0", "2", "MLXDIST_RING_CONNECTIONS");
  unsetenv("MLXDIST_RING_CONNECTIONS");
  /* an unsupported backend: error, dtor at once */
  counted c;
  counted_init(&c, "mpi", MODE_OK);
  mlx_distributed_group g = mlx_distributed_group_new();
  T_ASSERT(mlx_distributed_init_with_all_gather(&g, true, "mpi", never_called, &c, counted_dtor) !=
           0);
  T_EQ_INT(t_error_count(), 1);
  t_clear_errors();
  T_EQ_INT(dtor_count(&c, 1), 1);
  /* a world of one: the callback still runs (once), the group has size one */
  setenv("MLX_RANK", "0", 1);
  setenv("MLX_WORLD_SIZE", "1", 1);
  counted one;
  counted_init(&one, "one", MODE_OK);
  T_EQ_INT(mlx_distributed_init_with_all_gather(&g, true, "ring", counted_gather, &one,
                                                counted_dtor),
           0);
  T_EQ_INT(mlx_distributed_group_size(g), 1);
  T_EQ_INT(one.calls, 1);
  T_EQ_INT(check_sum(g, 10), 0);
  mlx_distributed_group_free(g);
  mlx_distributed_clear_backends();
  T_EQ_INT(dtor_count(&one, 1), 1);
  T_EXPECT_NO_ERROR();
}

int main(int argc, char** argv) {
  const char* what = argc > 1 ? argv[1] : "ok";
  g_arg_n = argc > 2 ? atoi(argv[2]) : 2;
  g_arg_mode = argc > 3 ? argv[3] : "";
  g_arg_k = argc > 3 ? atoi(argv[3]) : 1;
  snprintf(g_dir, sizeof g_dir, "/tmp/mlxd_boot_test.XXXXXX");
  T_ASSERT(mkdtemp(g_dir));
  if (!getenv("MLXDIST_TEST_DEFAULT_ADDR")) setenv("MLXDIST_RING_ADDR", "127.0.0.1", 1);
  int codes[16];
  int n = g_arg_n;
  T_ASSERT(n >= 1 && n <= 16);
  if (strcmp(what, "ok") == 0) {
    char k[16];
    snprintf(k, sizeof k, "%d", g_arg_k > 0 ? g_arg_k : 1);
    setenv("MLXDIST_RING_CONNECTIONS", k, 1);
    T_EQ_INT(spawn(n, ok_rank, codes, 60), n);
  } else if (strcmp(what, "fail") == 0) {
    T_EQ_INT(spawn(n, fail_rank, codes, 30), n);
  } else if (strcmp(what, "garbage") == 0) {
    T_EQ_INT(spawn(n, garbage_rank, codes, 30), n);
  } else if (strcmp(what, "tcpkv") == 0) {
    g_kv_port = t_free_port();
    T_EQ_INT(spawn(n, tcpkv_rank, codes, 60), n);
  } else if (strcmp(what, "env") == 0) {
    env_tests();
  } else {
    T_FAIL("unknown mode '%s'", what);
  }
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
  printf("test_bootstrap %s: passed\n", what);
  return 0;
}
