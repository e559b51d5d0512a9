/* Groups and the backend registry in one process, without a launcher:
 *   test_dist_group basic     init / is_available / getters / split / errors / threads
 *   test_dist_group gather    init_with_all_gather: dtor exactly once on every
 *                             failure path, and for a kept callback (a size-one
 *                             ring group bootstrapped by a local all-gather)
 * Every launcher variable is removed first, so no backend is configured. */
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "mlx/c/mlx.h"
#include "testutil.h"

static void clear_env(void) {
  const char* vars[] = {"MLX_RANK",
                        "MLX_HOSTFILE",
                        "MLX_WORLD_SIZE",
                        "MLX_IBV_DEVICES",
                        "MLX_JACCL_COORDINATOR",
                        "NCCL_HOST_IP",
                        "NCCL_PORT",
                        "OMPI_COMM_WORLD_SIZE",
                        "OMPI_COMM_WORLD_RANK",
                        "PMI_SIZE",
                        "PMI_RANK",
                        "PMIX_RANK"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) unsetenv(vars[i]);
}

/* The nccl kind's reason for being unusable on a machine without a GPU: not
 * built (no CUDA headers), or built and the plugin says what is missing. */
static void expect_nccl_unavailable(void) {
  T_ASSERT(!mlx_distributed_is_available("nccl"));
  const char* e = t_last_error();
  T_REQUIREF(strstr(e, "[nccl] ") != NULL, "%s", e);
  T_REQUIREF(strstr(e, "mlxdist was built without NCCL support") ||
                 strstr(e, "[nccl] no GPU: CUDA runtime ") || strstr(e, "[nccl] no CUDA runtime") ||
                 strstr(e, "libnccl.so.2 cannot be loaded"),
             "%s", e);
  T_EXPECT_ERROR("[nccl] ");
}

static int rank_of(mlx_distributed_group g) {
  int r = -1;
  T_EQ_INT(mlx_distributed_group_get_rank(&r, g), 0);
  return r;
}
static int size_of(mlx_distributed_group g) {
  int s = -1;
  T_EQ_INT(mlx_distributed_group_get_size(&s, g), 0);
  return s;
}

/* ------------------------------------------------------------------ */

static void test_is_available(void) {
  T_ASSERT(mlx_distributed_is_available("ring"));
  T_ASSERT(mlx_distributed_is_available(NULL));
  T_ASSERT(mlx_distributed_is_available("any"));
  /* nccl: either answer, but a true one: available only with a GPU, and
   * unavailable with the reason (strict init names it). */
  if (mlx_distributed_is_available("nccl")) {
    int gpus = 0;
    T_EQ_INT(mlx_device_count(&gpus, MLX_GPU), 0);
    T_ASSERT(gpus > 0);
  } else {
    mlx_distributed_group g = mlx_distributed_group_new();
    T_ASSERT(mlx_distributed_init(&g, true, "nccl") != 0);
    expect_nccl_unavailable();
    T_ASSERT(g.ctx == NULL);
  }
  T_ASSERT(!mlx_distributed_is_available("jaccl")); /* no active RDMA port on a test machine */
  T_ASSERT(!mlx_distributed_is_available("bogus"));
  T_ASSERT(!mlx_distributed_is_available(""));
  T_ASSERT(!mlx_distributed_is_available("RING")); /* names are exact */
  (void)mlx_distributed_is_available("mpi");       /* either answer; must not report */
  T_EXPECT_NO_ERROR();
}

static void test_nonstrict_not_cached(void) {
  mlx_distributed_group a = mlx_distributed_group_new();
  T_ASSERT(a.ctx == NULL);
  T_EQ_INT(mlx_distributed_init(&a, false, NULL), 0);
  T_EXPECT_NO_ERROR();
  T_ASSERT(a.ctx != NULL);
  T_EQ_INT(rank_of(a), 0);
  T_EQ_INT(size_of(a), 1);
  T_EQ_INT(mlx_distributed_group_rank(a), 0);
  T_EQ_INT(mlx_distributed_group_size(a), 1);

  /* Not cached: the second init tries again and gives another group. */
  mlx_distributed_group b = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_init(&b, false, "any"), 0);
  T_ASSERT(b.ctx != NULL && b.ctx != a.ctx);
  mlx_distributed_group c = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_init(&c, false, "ring"), 0);
  T_ASSERT(c.ctx != NULL && c.ctx != a.ctx && c.ctx != b.ctx);
  T_EQ_INT(size_of(c), 1);

  /* *res that already holds a group is replaced (the old one released). */
  T_EQ_INT(mlx_distributed_init(&c, false, "nccl"), 0);
  T_EQ_INT(size_of(c), 1);
  T_EQ_INT(mlx_distributed_init(&c, false, "jaccl"), 0);
  T_EQ_INT(mlx_distributed_init(&c, false, "mpi"), 0);
  T_EQ_INT(size_of(c), 1);
  T_EXPECT_NO_ERROR();

  T_EQ_INT(mlx_distributed_group_free(a), 0);
  T_EQ_INT(mlx_distributed_group_free(b), 0);
  T_EQ_INT(mlx_distributed_group_free(c), 0);
  T_EQ_INT(mlx_distributed_group_free(mlx_distributed_group_new()), 0);
  T_EXPECT_NO_ERROR();
}

static void test_strict_failures(void) {
  mlx_distributed_group g = mlx_distributed_group_new();
  T_ASSERT(mlx_distributed_init(&g, true, "ring") != 0);
  T_EXPECT_ERROR("[distributed]", "ring", "MLX_RANK", "MLX_HOSTFILE");
  T_ASSERT(g.ctx == NULL);

  /* Only one of the two set: still not configured, and still named. */
  setenv("MLX_RANK", "0", 1);
  T_ASSERT(mlx_distributed_init(&g, true, "ring") != 0);
  T_EXPECT_ERROR("MLX_HOSTFILE");
  unsetenv("MLX_RANK");

  if (!mlx_distributed_is_available("nccl")) { /* with a GPU: scripts/gpu-check.sh */
    T_ASSERT(mlx_distributed_init(&g, true, "nccl") != 0);
    expect_nccl_unavailable();
  }
  T_ASSERT(mlx_distributed_init(&g, true, "jaccl") != 0);
  /* the configuration's error first (tests/config/test_jaccl_config.c has every case) */
  T_EXPECT_ERROR("[jaccl]", "MLX_RANK, MLX_IBV_DEVICES, MLX_JACCL_COORDINATOR not set",
                 "could not run jaccl anyway");

  /* any: says what each backend lacked. */
  T_ASSERT(mlx_distributed_init(&g, true, NULL) != 0);
  T_EXPECT_ERROR("[distributed]", "nccl:", "ring:", "MLX_HOSTFILE", "mpi:", "jaccl:");
  T_ASSERT(mlx_distributed_init(&g, true, "any") != 0);
  T_EXPECT_ERROR("no backend could be started");

  T_ASSERT(mlx_distributed_init(&g, true, "mpi") != 0); /* not launched by mpirun */
  T_EXPECT_ERROR("mpi");
  T_ASSERT(g.ctx == NULL);

  /* A failed strict init leaves a held handle as it was. */
  T_EQ_INT(mlx_distributed_init(&g, false, NULL), 0);
  void* before = g.ctx;
  T_ASSERT(mlx_distributed_init(&g, true, "ring") != 0);
  T_EXPECT_ERROR("MLX_RANK");
  T_ASSERT(g.ctx == before);
  T_EQ_INT(size_of(g), 1);
  mlx_distributed_group_free(g);
}

static void test_argument_errors(void) {
  mlx_distributed_group g = mlx_distributed_group_new();
  T_ASSERT(mlx_distributed_init(&g, false, "bogus") != 0); /* even non-strict */
  T_EXPECT_ERROR("unknown backend \"bogus\"", "\"any\"", "\"ring\"", "\"mpi\"", "\"nccl\"",
                 "\"jaccl\"", "the name of a backend plugin", "libmlxdist-bogus.so (no such file)");
  T_ASSERT(g.ctx == NULL);
  T_ASSERT(!mlx_distributed_is_available("bogus"));
  T_ASSERT(mlx_distributed_init(&g, true, "") != 0);
  T_EXPECT_ERROR("unknown backend \"\"", "cannot name a plugin");
  /* a name that could leave the plugin directory is never looked up */
  T_ASSERT(mlx_distributed_init(&g, true, "../lib/x") != 0);
  T_EXPECT_ERROR("unknown backend \"../lib/x\"", "cannot name a plugin");
  T_ASSERT(!mlx_distributed_is_available("../lib/x"));
  T_ASSERT(mlx_distributed_init(NULL, false, NULL) != 0);
  T_EXPECT_ERROR("[distributed] init: res is NULL");

  int v = 42;
  mlx_distributed_group empty = mlx_distributed_group_new();
  T_ASSERT(mlx_distributed_group_get_rank(&v, empty) != 0);
  T_EXPECT_ERROR("[distributed] group_get_rank", "empty handle");
  T_ASSERT(mlx_distributed_group_get_size(&v, empty) != 0);
  T_EXPECT_ERROR("[distributed] group_get_size", "empty handle");
  T_EQ_INT(v, 42);
  T_EQ_INT(mlx_distributed_group_rank(empty), 0);
  T_EXPECT_ERROR("[distributed] group_rank", "empty handle");
  T_EQ_INT(mlx_distributed_group_size(empty), 0);
  T_EXPECT_ERROR("[distributed] group_size", "empty handle");

  T_EQ_INT(mlx_distributed_init(&g, false, NULL), 0);
  T_ASSERT(mlx_distributed_group_get_rank(NULL, g) != 0);
  T_EXPECT_ERROR("[distributed] group_get_rank: res is NULL");
  T_ASSERT(mlx_distributed_group_get_size(NULL, g) != 0);
  T_EXPECT_ERROR("[distributed] group_get_size: res is NULL");
  mlx_distributed_group_free(g);
}

static void test_split(void) {
  mlx_distributed_group g = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_init(&g, false, NULL), 0);
  mlx_distributed_group s1 = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_group_split(&s1, g, 0, -1), 0);
  T_ASSERT(s1.ctx != NULL && s1.ctx != g.ctx);
  T_EQ_INT(rank_of(s1), 0);
  T_EQ_INT(size_of(s1), 1);
  mlx_distributed_group s2 = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_group_split(&s2, s1, 7, 3), 0);
  T_EQ_INT(size_of(s2), 1);
  /* split into a handle that holds something: replaced */
  T_EQ_INT(mlx_distributed_group_split(&s2, s2, 1, 0), 0);
  T_EQ_INT(size_of(s2), 1);
  /* the parent may go first */
  mlx_distributed_group_free(g);
  mlx_distributed_group_free(s1);
  T_EQ_INT(size_of(s2), 1);
  T_EXPECT_NO_ERROR();

  T_ASSERT(mlx_distributed_group_split(NULL, s2, 0, 0) != 0);
  T_EXPECT_ERROR("[distributed] group_split: res is NULL");
  mlx_distributed_group out = mlx_distributed_group_new();
  T_ASSERT(mlx_distributed_group_split(&out, mlx_distributed_group_new(), 0, 0) != 0);
  T_EXPECT_ERROR("[distributed] group_split", "empty handle");
  T_ASSERT(mlx_distributed_group_split(&out, s2, -2, 0) != 0);
  T_EXPECT_ERROR("[distributed] group_split: color is -2");
  T_ASSERT(out.ctx == NULL);
  mlx_distributed_group_free(s2);
}

static void test_clear_with_held(void) {
  mlx_distributed_group g = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_init(&g, false, NULL), 0);
  T_EQ_INT(mlx_distributed_clear_backends(), 0);
  T_EQ_INT(mlx_distributed_clear_backends(), 0); /* nothing cached: fine */
  T_EQ_INT(size_of(g), 1);
  mlx_distributed_group_free(g);
  T_EXPECT_NO_ERROR();
}

/* The registry from several threads at once (run under TSan in CI). */
static void* registry_thread(void* arg) {
  (void)arg;
  for (int i = 0; i < 50; i++) {
    mlx_distributed_group g = mlx_distributed_group_new();
    if (mlx_distributed_init(&g, false, i % 2 ? "ring" : NULL) != 0) return (void*)1;
    int s = 0;
    if (mlx_distributed_group_get_size(&s, g) != 0 || s != 1) return (void*)1;
    mlx_distributed_group c = mlx_distributed_group_new();
    if (mlx_distributed_group_split(&c, g, 0, -1) != 0) return (void*)1;
    if (!mlx_distributed_is_available("ring")) return (void*)1;
    if (i % 10 == 0) mlx_distributed_clear_backends();
    mlx_distributed_group_free(g);
    mlx_distributed_group_free(c);
  }
  return NULL;
}

static void test_threads(void) {
  pthread_t th[4];
  for (int i = 0; i < 4; i++) T_EQ_INT(pthread_create(&th[i], NULL, registry_thread, NULL), 0);
  for (int i = 0; i < 4; i++) {
    void* r = (void*)1;
    pthread_join(th[i], &r);
    T_ASSERT(r == NULL);
  }
  T_EXPECT_NO_ERROR();
}

/* ------------------------------------------------------------------ */
/* init_with_all_gather                                                */

typedef struct counter {
  int dtor_calls;
  int fn_calls;
  int fail_with; /* the callback's return value */
} counter;

static void count_dtor(void* p) { ((counter*)p)->dtor_calls++; }

/* A correct all-gather for a group of one: dst = src. */
static int gather_one(void* dst, const void* src, size_t n, int rank, int size, void* payload) {
  counter* c = payload;
  c->fn_calls++;
  if (size != 1 || rank != 0) return 99;
  memcpy(dst, src, n);
  return c->fail_with;
}

static void test_gather_failures(void) {
  mlx_distributed_group g = mlx_distributed_group_new();
  counter c;

  /* argument errors */
  memset(&c, 0, sizeof c);
  T_ASSERT(mlx_distributed_init_with_all_gather(NULL, true, "ring", gather_one, &c, count_dtor) !=
           0);
  T_EXPECT_ERROR("[distributed] init_with_all_gather: res is NULL");
  T_EQ_INT(c.dtor_calls, 1);

  memset(&c, 0, sizeof c);
  T_ASSERT(mlx_distributed_init_with_all_gather(&g, false, "ring", NULL, &c, count_dtor) != 0);
  T_EXPECT_ERROR("[distributed] init_with_all_gather: all_gather is NULL");
  T_EQ_INT(c.dtor_calls, 1);

  memset(&c, 0, sizeof c);
  T_ASSERT(mlx_distributed_init_with_all_gather(&g, false, "tcp", gather_one, &c, count_dtor) != 0);
  T_EXPECT_ERROR("unknown backend \"tcp\"", "\"ring\"", "\"jaccl\"", "\"any\"");
  T_EQ_INT(c.dtor_calls, 1);

  memset(&c, 0, sizeof c);
  T_ASSERT(mlx_distributed_init_with_all_gather(&g, false, "mpi", gather_one, &c, count_dtor) != 0);
  T_EXPECT_ERROR("[distributed] init_with_all_gather", "mpi",
                 "cannot be started with a caller's all_gather", "\"ring\"", "\"jaccl\"");
  T_EQ_INT(c.dtor_calls, 1);
  T_EQ_INT(c.fn_calls, 0);
  /* nccl takes a caller's all-gather (beyond MLX), but cannot run without a GPU */
  if (!mlx_distributed_is_available("nccl")) { /* with a GPU: scripts/gpu-check.sh */
    memset(&c, 0, sizeof c);
    T_ASSERT(mlx_distributed_init_with_all_gather(&g, true, "nccl", gather_one, &c, count_dtor) !=
             0);
    expect_nccl_unavailable();
    T_EQ_INT(c.dtor_calls, 1);
    T_EQ_INT(c.fn_calls, 0);
  }
  /* a NULL dtor is fine */
  T_ASSERT(mlx_distributed_init_with_all_gather(&g, false, "mpi", gather_one, &c, NULL) != 0);
  T_EXPECT_ERROR("\"mpi\"");
  T_ASSERT(g.ctx == NULL);

  /* not configured: MLX_RANK / MLX_WORLD_SIZE unset */
  const char* names[] = {"ring", "any", NULL};
  for (int i = 0; i < 3; i++) {
    memset(&c, 0, sizeof c);
    T_ASSERT(mlx_distributed_init_with_all_gather(&g, true, names[i], gather_one, &c, count_dtor) !=
             0);
    T_EXPECT_ERROR("MLX_WORLD_SIZE");
    T_EQ_INT(c.dtor_calls, 1);
    T_EQ_INT(c.fn_calls, 0);
    T_ASSERT(g.ctx == NULL);

    memset(&c, 0, sizeof c);
    T_EQ_INT(mlx_distributed_init_with_all_gather(&g, false, names[i], gather_one, &c, count_dtor),
             0);
    T_EXPECT_NO_ERROR();
    T_EQ_INT(c.dtor_calls, 1); /* the fallback does not keep the callback */
    T_EQ_INT(size_of(g), 1);
    T_EQ_INT(rank_of(g), 0);
    /* and is not cached */
    mlx_distributed_group g2 = mlx_distributed_group_new();
    T_EQ_INT(mlx_distributed_init(&g2, false, names[i]), 0);
    T_ASSERT(g2.ctx != g.ctx);
    mlx_distributed_group_free(g2);
    mlx_distributed_group_free(g);
    g = mlx_distributed_group_new();
    T_EQ_INT(c.dtor_calls, 1);
  }

  /* jaccl: not configured (and no active RDMA port here); the coordinator is not needed */
  memset(&c, 0, sizeof c);
  T_ASSERT(mlx_distributed_init_with_all_gather(&g, true, "jaccl", gather_one, &c, count_dtor) !=
           0);
  T_EXPECT_ERROR("[jaccl]", "MLX_RANK, MLX_IBV_DEVICES not set");
  T_EQ_INT(c.dtor_calls, 1);
  T_EQ_INT(c.fn_calls, 0);

  /* configured but invalid */
  const char* bad[][2] = {{"5", "2"}, {"0", "abc"}, {"-1", "2"}, {"0", "0"}};
  for (int i = 0; i < 4; i++) {
    setenv("MLX_RANK", bad[i][0], 1);
    setenv("MLX_WORLD_SIZE", bad[i][1], 1);
    memset(&c, 0, sizeof c);
    T_ASSERT(mlx_distributed_init_with_all_gather(&g, true, "ring", gather_one, &c, count_dtor) !=
             0);
    T_EXPECT_ERROR("[ring]", "MLX_");
    T_EQ_INT(c.dtor_calls, 1);
    T_EQ_INT(c.fn_calls, 0);
    memset(&c, 0, sizeof c);
    T_EQ_INT(mlx_distributed_init_with_all_gather(&g, false, "ring", gather_one, &c, count_dtor),
             0);
    T_EXPECT_NO_ERROR();
    T_EQ_INT(c.dtor_calls, 1);
    T_EQ_INT(size_of(g), 1);
    mlx_distributed_group_free(g);
    g = mlx_distributed_group_new();
  }

  /* the callback fails (a group of one still exchanges its record) */
  setenv("MLX_RANK", "0", 1);
  setenv("MLX_WORLD_SIZE", "1", 1);
  memset(&c, 0, sizeof c);
  c.fail_with = 7;
  T_ASSERT(mlx_distributed_init_with_all_gather(&g, true, "ring", gather_one, &c, count_dtor) != 0);
  T_EXPECT_ERROR("the all_gather callback returned 7");
  T_EQ_INT(c.fn_calls, 1);
  T_EQ_INT(c.dtor_calls, 1);
  memset(&c, 0, sizeof c);
  c.fail_with = -3;
  T_EQ_INT(mlx_distributed_init_with_all_gather(&g, false, "any", gather_one, &c, count_dtor), 0);
  T_EXPECT_NO_ERROR();
  T_EQ_INT(c.fn_calls, 1);
  T_EQ_INT(c.dtor_calls, 1);
  T_EQ_INT(size_of(g), 1);
  mlx_distributed_group_free(g);
  unsetenv("MLX_RANK");
  unsetenv("MLX_WORLD_SIZE");
}

/* A callback that is kept: a ring group of one, bootstrapped through gather_one. */
static void test_gather_kept(void) {
  setenv("MLX_RANK", "0", 1);
  setenv("MLX_WORLD_SIZE", "1", 1);
  counter c;
  memset(&c, 0, sizeof c);
  mlx_distributed_group g = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_init_with_all_gather(&g, true, "ring", gather_one, &c, count_dtor), 0);
  T_EXPECT_NO_ERROR();
  T_EQ_INT(c.fn_calls, 1);
  T_EQ_INT(c.dtor_calls, 0);
  T_EQ_INT(size_of(g), 1);

  /* cached under "ring" and "any" */
  mlx_distributed_group r = mlx_distributed_group_new(), a = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_init(&r, true, "ring"), 0);
  T_EQ_INT(mlx_distributed_init(&a, true, NULL), 0);
  T_ASSERT(r.ctx == g.ctx && a.ctx == g.ctx);

  /* a cached group returned: the new callback is not called, its dtor runs at once */
  counter c2;
  memset(&c2, 0, sizeof c2);
  mlx_distributed_group g2 = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_init_with_all_gather(&g2, true, "any", gather_one, &c2, count_dtor), 0);
  T_ASSERT(g2.ctx == g.ctx);
  T_EQ_INT(c2.fn_calls, 0);
  T_EQ_INT(c2.dtor_calls, 1);

  /* a group split from it keeps it too */
  mlx_distributed_group s = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_group_split(&s, g, 0, -1), 0);
  T_EQ_INT(size_of(s), 1);

  T_EQ_INT(mlx_distributed_clear_backends(), 0);
  T_EQ_INT(c.dtor_calls, 0); /* handles still held */
  T_EQ_INT(size_of(g), 1);   /* and valid */
  mlx_distributed_group_free(g);
  mlx_distributed_group_free(r);
  mlx_distributed_group_free(a);
  mlx_distributed_group_free(g2);
  T_EQ_INT(c.dtor_calls, 0); /* the split group still keeps it */
  T_EQ_INT(size_of(s), 1);
  mlx_distributed_group_free(s);
  T_EQ_INT(c.dtor_calls, 1);
  g = mlx_distributed_group_new(); /* g was freed: *res must not hold a freed group */

  /* after clear, a new init starts again (and calls the callback again) */
  memset(&c, 0, sizeof c);
  T_EQ_INT(mlx_distributed_init_with_all_gather(&g, true, "ring", gather_one, &c, count_dtor), 0);
  T_EQ_INT(c.fn_calls, 1);
  mlx_distributed_group_free(g);
  T_EQ_INT(c.dtor_calls, 0); /* the cache still holds it */
  T_EQ_INT(mlx_distributed_clear_backends(), 0);
  T_EQ_INT(c.dtor_calls, 1);
  T_EQ_INT(c.fn_calls, 1);
  T_EXPECT_NO_ERROR();
  unsetenv("MLX_RANK");
  unsetenv("MLX_WORLD_SIZE");
}

int main(int argc, char** argv) {
  clear_env();
  t_capture_errors();
  const char* mode = argc > 1 ? argv[1] : "basic";
  if (strcmp(mode, "basic") == 0) {
    test_is_available();
    test_nonstrict_not_cached();
    test_strict_failures();
    test_argument_errors();
    test_split();
    test_clear_with_held();
    test_threads();
  } else if (strcmp(mode, "gather") == 0) {
    test_gather_failures();
    test_gather_kept();
  } else {
    T_FAIL("unknown mode '%s' (expected basic or gather)", mode);
  }
  printf("test_dist_group %s: ok\n", mode);
  return 0;
}
