/* The GPU side, on a machine with an NVIDIA GPU (scripts/gpu-check.sh runs
 * it; everywhere else it exits 77, "skipped", saying why):
 *   test_nccl_gpu provider   the core's GPU provider and GPU streams
 *   test_nccl_gpu plugin     libmlxdist-nccl.so's table directly, one-rank
 *                            communicators: every op and dtype against the
 *                            CPU result, dtypes NCCL lacks refused, split,
 *                            an init that times out and is aborted
 *   test_nccl_gpu tworank    two ranks through the API: on one GPU, NCCL's
 *                            refusal reported clearly within a bound; on two
 *                            or more, all_sum on the null stream (the GPU
 *                            stream), a CPU stream refused, clear_backends
 * NOT YET RUN ON A GPU: written and built where there is none (docs/nccl.md). */
#include <dlfcn.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/gpu.h"
#include "mlx/c/mlx.h"
#include "mlx/c/plugin/plugin_v4.h"
#include "testutil.h"
#include "util/clock.h"

#ifndef MLXDIST_TEST_NCCL_PLUGIN
#define MLXDIST_TEST_NCCL_PLUGIN ""
#endif

#define SKIP 77

/* ---- provider ---- */

static int run_provider(void) {
  mlxd_status st;
  mlxd_status_clear(&st);
  int n = mlxd_gpu_count();
  printf("gpus: %d (%s, runtime %d)\n", n, mlxd_gpu_probe()->lib,
         mlxd_gpu_probe()->runtime_version);
  void* s = NULL;
  void* none = NULL;
  T_REQUIREF(mlxd_gpu_stream_create(n, &none, &st) != 0, "device %d should not exist", n);
  T_ASSERT(strstr(st.msg, "does not exist") && none == NULL);
  T_REQUIREF(mlxd_gpu_stream_create(0, &s, &st) == 0, "%s", st.msg);
  size_t bytes = 1 << 20;
  unsigned char* m = mlxd_gpu_alloc_managed(bytes, &st);
  T_REQUIREF(m != NULL, "%s", st.msg);
  unsigned char* h = malloc(bytes);
  for (size_t i = 0; i < bytes; i++) h[i] = (unsigned char)(i * 31 + 7);
  T_REQUIREF(mlxd_gpu_copy(m, h, bytes, s, &st) == 0, "%s", st.msg);
  T_REQUIREF(mlxd_gpu_stream_sync(s, &st) == 0, "%s", st.msg);
  T_CHECK(memcmp(m, h, bytes) == 0); /* managed memory: the host reads it after the wait */
  memset(h, 0, bytes);
  T_REQUIREF(mlxd_gpu_copy(h, m, bytes, s, &st) == 0, "%s", st.msg);
  T_CHECK(h[12345] == (unsigned char)(12345 * 31 + 7));
  mlxd_gpu_free(m);
  free(h);
  mlxd_gpu_stream_destroy(s);

  /* the API: devices and GPU streams */
  int count = 0;
  T_EQ_INT(mlx_device_count(&count, MLX_GPU), 0);
  T_EQ_INT(count, n);
  mlx_device gpu = mlx_device_new_type(MLX_GPU, 0);
  bool avail = false;
  T_EQ_INT(mlx_device_is_available(&avail, gpu), 0);
  T_ASSERT(avail);
  mlx_stream d = mlx_default_gpu_stream_new();
  T_REQUIREF(d.ctx != NULL, "%s", t_last_error());
  mlx_stream e = mlx_stream_new_device(gpu);
  T_REQUIREF(e.ctx != NULL, "%s", t_last_error());
  T_EQ_INT(mlx_synchronize(d), 0);
  T_EQ_INT(mlx_synchronize(e), 0);
  mlx_device got = mlx_device_new();
  T_EQ_INT(mlx_stream_get_device(&got, e), 0);
  T_ASSERT(mlx_device_equal(got, gpu));
  T_ASSERT(mlx_set_default_stream(e) != 0);
  T_EXPECT_ERROR("only a CPU stream");
  mlx_device bad = mlx_device_new_type(MLX_GPU, n);
  T_ASSERT(mlx_stream_new_device(bad).ctx == NULL);
  T_EXPECT_ERROR("does not exist");
  mlx_stream def = mlx_stream_new();
  T_ASSERT(mlx_get_default_stream(&def, bad) != 0);
  T_EXPECT_ERROR("does not exist");
  mlx_device_free(bad);
  mlx_device_free(got);
  mlx_stream_free(e);
  mlx_stream_free(d);
  mlx_device_free(gpu);
  return t_exit_status();
}

/* ---- the plugin's table, one rank ---- */

static size_t k_size[MLXDIST_V4_DTYPE_COUNT] = {1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 4, 8, 2, 8};
static double g_timeout = 5;
static size_t h_dtype_size(mlxdist_v4_dtype d) {
  return d >= 0 && d < MLXDIST_V4_DTYPE_COUNT ? k_size[d] : 0;
}
static double h_timeout(void) { return g_timeout; }
static double h_spin(void) { return 0; }
static const mlxdist_v4_host k_host = {.struct_size = sizeof(mlxdist_v4_host),
                                       .version = 4,
                                       .dtype_size = h_dtype_size,
                                       .timeout_s = h_timeout,
                                       .spin_us = h_spin};

static int32_t local_gather(mlxdist_v4_bootstrap* bs, void* dst, const void* src, size_t n,
                            mlxdist_v4_status* st) {
  (void)st;
  T_ASSERT(bs->size == 1 && bs->rank == 0);
  memcpy(dst, src, n);
  return 0;
}

/* Rank 0 of 2 where rank 1 never comes: its part is a copy of rank 0's. */
static int32_t lonely_gather(mlxdist_v4_bootstrap* bs, void* dst, const void* src, size_t n,
                             mlxdist_v4_status* st) {
  (void)st;
  T_ASSERT(bs->size == 2 && bs->rank == 0);
  memcpy(dst, src, n);
  memcpy((char*)dst + n, src, n);
  return 0;
}

static const mlxdist_v4_plugin* load_plugin(void) {
  const char* path = MLXDIST_TEST_NCCL_PLUGIN;
  if (!*path) {
    printf("SKIP: the nccl plugin was not built (no CUDA/NCCL headers at configure time)\n");
    exit(SKIP);
  }
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  T_REQUIREF(h != NULL, "dlopen %s: %s", path, dlerror());
  mlxdist_v4_entry entry = NULL;
  void* f = dlsym(h, MLXDIST_PLUGIN_V4_SYMBOL);
  memcpy(&entry, &f, sizeof f);
  T_ASSERT(entry != NULL);
  const mlxdist_v4_plugin* p = entry(&k_host);
  T_ASSERT(p != NULL);
  char why[512] = "";
  T_REQUIREF(p->is_available(why, sizeof why), "nccl unavailable: %s", why);
  return p;
}

static void fill(unsigned char* b, size_t n, mlxdist_v4_dtype d) {
  for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(i * 13 + 5);
  if (d == MLXDIST_V4_DTYPE_FLOAT16 || d == MLXDIST_V4_DTYPE_BFLOAT16 ||
      d == MLXDIST_V4_DTYPE_FLOAT32 || d == MLXDIST_V4_DTYPE_FLOAT64 ||
      d == MLXDIST_V4_DTYPE_COMPLEX64) {
    /* finite values only (a NaN never compares equal to itself) */
    for (size_t i = 0; i < n; i += k_size[d])
      b[i + k_size[d] - 1] = (unsigned char)(b[i + k_size[d] - 1] & 0x3f);
    if (d == MLXDIST_V4_DTYPE_COMPLEX64)
      for (size_t i = 3; i < n; i += 4) b[i] &= 0x3f;
  }
}

static int run_plugin(void) {
  const mlxdist_v4_plugin* p = load_plugin();
  setenv("MLX_RANK", "0", 1);
  setenv("MLX_WORLD_SIZE", "1", 1);
  mlxdist_v4_bootstrap bs = {.struct_size = sizeof bs, .all_gather = local_gather};
  mlxdist_v4_status st;
  memset(&st, 0, sizeof st);
  mlxdist_v4_backend* b = NULL;
  T_REQUIREF(p->create(&bs, &b, &st) == 0, "%s", st.msg);
  T_EQ_INT(b->rank, 0);
  T_EQ_INT(b->size, 1);
  T_EQ_INT(b->device, MLXDIST_V4_DEVICE_GPU);
  char line[256];
  b->ops->describe(b, line, sizeof line);
  printf("instance: %s\n", line);
  const size_t count = 1000;
  unsigned char in[8 * 1000], out[8 * 1000];
  uint64_t seq = 0;
  static const char* ops[] = {"sum", "max", "min"};
  for (int d = 0; d < MLXDIST_V4_DTYPE_COUNT; d++) {
    size_t bytes = count * k_size[d];
    fill(in, bytes, d);
    for (int op = 0; op < MLXDIST_V4_OP_COUNT; op++) {
      bool lacks = d == MLXDIST_V4_DTYPE_BOOL || d == MLXDIST_V4_DTYPE_INT16 ||
                   d == MLXDIST_V4_DTYPE_UINT16 ||
                   (d == MLXDIST_V4_DTYPE_COMPLEX64 && op != MLXDIST_V4_OP_SUM);
      for (int rs = 0; rs < 2; rs++) {
        memset(out, 0xAB, bytes);
        memset(&st, 0, sizeof st);
        int32_t rc = rs ? b->ops->reduce_scatter(b, seq++, in, out, count, d, op, &st)
                        : b->ops->all_reduce(b, seq++, in, out, count, d, op, &st);
        if (lacks) {
          T_CHECKF(rc == MLXDIST_V4_EINVAL && strstr(st.msg, "NCCL cannot reduce"),
                   "dtype %d op %s: rc %d %s", d, ops[op], rc, st.msg);
        } else {
          /* one rank: the CPU's result is the input itself */
          T_CHECKF(rc == 0, "dtype %d op %s: %s", d, ops[op], st.msg);
          T_CHECKF(memcmp(in, out, bytes) == 0, "dtype %d op %s %s: wrong result", d, ops[op],
                   rs ? "reduce_scatter" : "all_reduce");
        }
      }
    }
    memset(out, 0, bytes);
    T_CHECKF(b->ops->all_gather(b, seq++, in, out, bytes, &st) == 0, "%s", st.msg);
    T_CHECK(memcmp(in, out, bytes) == 0);
    /* ABI v4: all_to_all through run, host buffers (staged), the plugin's own stream */
    memset(out, 0, bytes);
    mlxdist_v4_call call = {.struct_size = sizeof call,
                            .kind = MLXDIST_V4_KIND_ALL_TO_ALL,
                            .seq = seq++,
                            .dtype = d,
                            .count = count,
                            .peer = -1,
                            .stream_device = -1,
                            .in = {in, bytes, MLXDIST_V4_MEM_HOST, -1},
                            .out = {out, bytes, MLXDIST_V4_MEM_HOST, -1}};
    T_REQUIRE(b->ops->run_kinds & MLXDIST_V4_KIND_BIT(MLXDIST_V4_KIND_ALL_TO_ALL));
    T_CHECKF(b->ops->run(b, &call, &st) == 0, "all_to_all dtype %d: %s", d, st.msg);
    T_CHECK(memcmp(in, out, bytes) == 0);
  }
  /* another GPU's device memory is refused by name, before anything is queued */
  {
    mlxdist_v4_call call = {.struct_size = sizeof call,
                            .kind = MLXDIST_V4_KIND_ALL_TO_ALL,
                            .seq = seq,
                            .dtype = MLXDIST_V4_DTYPE_UINT8,
                            .count = 8,
                            .peer = -1,
                            .stream_device = -1,
                            .in = {in, 8, MLXDIST_V4_MEM_DEVICE, 99},
                            .out = {out, 8, MLXDIST_V4_MEM_HOST, -1}};
    T_CHECKF(b->ops->run(b, &call, &st) == MLXDIST_V4_EINVAL && strstr(st.msg, "cannot use"), "%s",
             st.msg);
  }
  /* split into a one-rank child; it works too */
  mlxdist_v4_backend* c = NULL;
  T_CHECKF(b->ops->split(b, seq++, 0, 0, &c, &st) == 0, "%s", st.msg);
  if (c) {
    T_EQ_INT(c->size, 1);
    fill(in, 64, MLXDIST_V4_DTYPE_FLOAT32);
    T_CHECKF(c->ops->all_reduce(c, 0, in, out, 16, MLXDIST_V4_DTYPE_FLOAT32, 0, &st) == 0, "%s",
             st.msg);
    T_CHECK(memcmp(in, out, 64) == 0);
    /* ABI v4's abort: the next op fails at once, naming the reason */
    c->ops->abort(c, "the test aborts it");
    T_CHECK(c->ops->all_reduce(c, 1, in, out, 16, MLXDIST_V4_DTYPE_FLOAT32, 0, &st) ==
            MLXDIST_V4_EABORTED);
    T_CHECKF(strstr(st.msg, "aborted: the test aborts it") != NULL, "%s", st.msg);
    c->ops->destroy(c);
  }
  b->ops->destroy(b);

  /* an init that cannot complete (rank 1 of 2 never comes): bounded, aborted, named */
  setenv("MLX_WORLD_SIZE", "2", 1);
  g_timeout = 3;
  mlxdist_v4_bootstrap bs2 = {.struct_size = sizeof bs2, .all_gather = lonely_gather};
  b = NULL;
  double t0 = mlxd_now();
  int32_t rc = p->create(&bs2, &b, &st);
  T_CHECKF(rc == MLXDIST_V4_ETIMEDOUT, "rc %d: %s", rc, st.msg);
  T_CHECKF(strstr(st.msg, "[nccl] init #0 on rank 0: not complete after 3 s") != NULL, "%s",
           st.msg);
  T_CHECK(mlxd_now() - t0 < 30);
  T_CHECK(b == NULL);
  return t_exit_status();
}

/* ---- two ranks through the API ---- */

static int free_port(void) {
  /* a port nobody listens on now: the kernel's choice for a socket bound and closed */
  FILE* f = popen(
      "python3 -c 'import socket;s=socket.socket();s.bind((\"127.0.0.1\",0));"
      "print(s.getsockname()[1])'",
      "r");
  int port = 0;
  if (f) {
    if (fscanf(f, "%d", &port) != 1) port = 0;
    pclose(f);
  }
  return port ? port : 29500 + (int)(getpid() % 1000);
}

static int rank_child(int rank, int port, bool expect_ok) {
  char r[8], p[8];
  snprintf(r, sizeof r, "%d", rank);
  snprintf(p, sizeof p, "%d", port);
  setenv("MLX_RANK", r, 1);
  setenv("MLX_WORLD_SIZE", "2", 1);
  setenv("NCCL_HOST_IP", "127.0.0.1", 1);
  setenv("NCCL_PORT", p, 1);
  setenv("MLX_NCCL_TIMEOUT", "20000", 1);
  setenv("MLXDIST_TIMEOUT", "20", 1);
  mlx_distributed_group g = mlx_distributed_group_new();
  double t0 = mlxd_now();
  int rc = mlx_distributed_init(&g, true, "nccl");
  if (!expect_ok) {
    /* NCCL refuses two ranks on one GPU ("Duplicate GPU detected"): a clear failure */
    T_CHECK(rc != 0);
    T_CHECKF(strstr(t_last_error(), "[nccl]") != NULL, "%s", t_last_error());
    T_CHECK(mlxd_now() - t0 < 60);
    fprintf(stderr, "rank %d (expected failure): %s\n", rank, t_last_error());
    return t_exit_status();
  }
  T_REQUIREF(rc == 0, "%s", t_last_error());
  float x[256];
  for (int i = 0; i < 256; i++) x[i] = (float)(i + rank * 1000);
  int shape[] = {256};
  mlx_array a = mlx_array_new_data(x, shape, 1, MLX_FLOAT32);
  mlx_array res = mlx_array_new();
  /* the null stream: the default GPU stream */
  T_EQ_INT(mlx_distributed_all_sum(&res, a, g, mlx_stream_new()), 0);
  T_EQ_INT(mlx_array_eval(res), 0);
  const float* y = mlx_array_data_float32(res);
  for (int i = 0; i < 256; i++) T_CHECK(y[i] == (float)(2 * i + 1000));
  /* an explicit CPU stream: refused at call time, saying so */
  mlx_stream cpu = mlx_default_cpu_stream_new();
  T_ASSERT(mlx_distributed_all_sum(&res, a, g, cpu) != 0);
  T_CHECKF(strstr(t_last_error(), "communicates on the gpu") != NULL, "%s", t_last_error());
  t_clear_errors();
  mlx_stream_free(cpu);
  /* clear_backends with a live communicator */
  T_EQ_INT(mlx_distributed_group_free(g), 0);
  T_EQ_INT(mlx_distributed_clear_backends(), 0);
  mlx_array_free(a);
  mlx_array_free(res);
  return t_exit_status();
}

static int run_tworank(void) {
  if (!*MLXDIST_TEST_NCCL_PLUGIN) {
    printf("SKIP: the nccl plugin was not built\n");
    return SKIP;
  }
  bool two = mlxd_gpu_count() >= 2;
  int port = free_port();
  pid_t kids[2];
  for (int r = 0; r < 2; r++) {
    kids[r] = fork();
    if (kids[r] == 0) _exit(rank_child(r, port, two));
  }
  int failed = 0;
  double deadline = mlxd_now() + 120;
  for (int r = 0; r < 2; r++) {
    int status = 0;
    while (waitpid(kids[r], &status, WNOHANG) == 0) {
      if (mlxd_now() > deadline) {
        fprintf(stderr, "rank %d hangs: killed\n", r);
        kill(kids[r], SIGKILL);
        waitpid(kids[r], &status, 0);
        failed++;
        break;
      }
      usleep(100 * 1000);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) failed++;
  }
  printf("tworank (%s): %s\n", two ? "two GPUs: a real group" : "one GPU: expected refusal",
         failed ? "FAILED" : "ok");
  return failed ? 1 : 0;
}

int main(int argc, char** argv) {
  t_capture_errors();
  if (argc < 2) {
    fprintf(stderr, "usage: test_nccl_gpu provider|plugin|tworank\n");
    return 2;
  }
  if (mlxd_gpu_count() == 0) {
    printf("SKIP: no GPU: %s\n", mlxd_gpu_probe()->why);
    return SKIP;
  }
  if (strcmp(argv[1], "provider") == 0) return run_provider();
  if (strcmp(argv[1], "plugin") == 0) return run_plugin();
  if (strcmp(argv[1], "tworank") == 0) return run_tworank();
  fprintf(stderr, "unknown mode %s\n", argv[1]);
  return 2;
}
