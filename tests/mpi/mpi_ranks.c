/* The mpi backend's rank program (public API only), run under mpirun.
 *
 *   mpi_ranks [all|quick|timeout]
 *
 * all: strict init("mpi") (rank/size must equal the launcher's), init
 * caching, init("any") picks mpi under mpirun, every op x 14 dtypes x sizes
 * {0, 1, 7, 10, 1024, 1024*1024} against references computed here, send/recv
 * for every ordered pair (both ranks sending first, 8 MiB), split by parity
 * and with reversed keys, ops queued on several streams at once (they must be
 * issued in queue order), clear_backends + re-init.
 * Inputs are small integers (or quarters), so every partial sum is exact in
 * every dtype and the result does not depend on the reduction order.
 *
 * timeout (MLXDIST_TIMEOUT=2, 2 ranks): rank 1 joins an all_sum late; rank 0
 * must fail with "[mpi] all_sum #0 on rank 0: timed out after 2 s in all_sum
 * of 1 elements", and its next op (#1) fail fast with the same detail, naming
 * all_sum #0 as the op that failed the group. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mlx/c/mlx.h"
#include "ranks.h"
#include "testutil.h"

#define NDT 14
static int g_rank, g_size;
static bool g_quick; /* "quick": 1M elements only for float32, bfloat16, complex64 */

/* ---- exact values and encodings ---- */
static uint16_t f16_bits(double v) { /* v an integer or quarter with |v| < 2048 */
  if (v == 0) return 0;
  uint16_t s = v < 0 ? 0x8000 : 0;
  double a = v < 0 ? -v : v;
  int e = 0;
  while (a >= 2) a /= 2, e++;
  while (a < 1) a *= 2, e--;
  return (uint16_t)(s | ((e + 15) << 10) | (uint16_t)((a - 1) * 1024));
}
static uint16_t bf16_bits(double v) {
  float f = (float)v;
  uint32_t b;
  memcpy(&b, &f, 4);
  return (uint16_t)(b >> 16); /* exact: these values have <= 8 significant bits */
}

/* Element i of rank r's input, as a number (floats) or raw bits (ints). */
static double num(size_t i, int r) { return (double)((long)((i * 7 + (size_t)r * 13) % 61) - 30); }
static uint64_t bits(size_t i, int r) {
  return (i + 1) * 0x9E3779B97F4A7C15ull + (uint64_t)r * 0xBF58476D1CE4E5B9ull;
}
static bool bval(size_t i, int r) { return (i * 7 + (size_t)r * 3) % 5 == 0; }

static void put(mlx_dtype d, void* buf, size_t i, int r) {
  uint64_t u = bits(i, r);
  double v = num(i, r);
  switch (d) {
    case MLX_BOOL: ((uint8_t*)buf)[i] = bval(i, r); break;
    case MLX_UINT8:
    case MLX_INT8: ((uint8_t*)buf)[i] = (uint8_t)u; break;
    case MLX_UINT16:
    case MLX_INT16: ((uint16_t*)buf)[i] = (uint16_t)u; break;
    case MLX_UINT32:
    case MLX_INT32: ((uint32_t*)buf)[i] = (uint32_t)u; break;
    case MLX_UINT64:
    case MLX_INT64: ((uint64_t*)buf)[i] = u; break;
    case MLX_FLOAT16: ((uint16_t*)buf)[i] = f16_bits(v); break;
    case MLX_BFLOAT16: ((uint16_t*)buf)[i] = bf16_bits(v); break;
    case MLX_FLOAT32: ((float*)buf)[i] = (float)(v / 4); break;
    case MLX_FLOAT64: ((double*)buf)[i] = v / 4; break;
    case MLX_COMPLEX64: {
      float c[2] = {(float)((long)((i + (size_t)r) % 3) - 1), (float)v};
      memcpy((char*)buf + 8 * i, c, 8);
      break;
    }
  }
}

static bool is_signed(mlx_dtype d) { return d >= MLX_INT8 && d <= MLX_INT64; }
static int64_t sext(uint64_t u, size_t esz) {
  int sh = 64 - 8 * (int)esz;
  return (int64_t)(u << sh) >> sh;
}

/* Reference of op (0 sum, 1 max, 2 min) over ranks for element i, written at ref[i]. */
static void ref_elem(mlx_dtype d, int op, void* ref, size_t i) {
  size_t esz = mlx_dtype_size(d);
  if (d == MLX_BOOL) {
    bool acc = bval(i, 0);
    for (int r = 1; r < g_size; r++) acc = op == 2 ? (acc && bval(i, r)) : (acc || bval(i, r));
    ((uint8_t*)ref)[i] = acc;
  } else if (d <= MLX_INT64) {
    uint64_t mask = esz == 8 ? ~0ull : ((1ull << (8 * esz)) - 1);
    uint64_t acc = bits(i, 0) & mask;
    for (int r = 1; r < g_size; r++) {
      uint64_t x = bits(i, r) & mask;
      if (op == 0) {
        acc = (acc + x) & mask;
      } else {
        bool gt = is_signed(d) ? sext(x, esz) > sext(acc, esz) : x > acc;
        bool lt = is_signed(d) ? sext(x, esz) < sext(acc, esz) : x < acc;
        if ((op == 1 && gt) || (op == 2 && lt)) acc = x;
      }
    }
    memcpy((char*)ref + i * esz, &acc, esz); /* little endian */
  } else if (d == MLX_COMPLEX64) {
    float best[2];
    double sre = 0, sim = 0;
    for (int r = 0; r < g_size; r++) {
      float c[2];
      c[0] = (float)((long)((i + (size_t)r) % 3) - 1);
      c[1] = (float)num(i, r);
      sre += c[0];
      sim += c[1];
      if (r == 0 || (op == 1 && (c[0] > best[0] || (c[0] == best[0] && c[1] > best[1]))) ||
          (op == 2 && (c[0] < best[0] || (c[0] == best[0] && c[1] < best[1]))))
        memcpy(best, c, 8);
    }
    if (op == 0) best[0] = (float)sre, best[1] = (float)sim;
    memcpy((char*)ref + 8 * i, best, 8);
  } else {
    double scale = (d == MLX_FLOAT32 || d == MLX_FLOAT64) ? 0.25 : 1.0;
    double acc = num(i, 0) * scale;
    for (int r = 1; r < g_size; r++) {
      double x = num(i, r) * scale;
      acc = op == 0 ? acc + x : op == 1 ? (x > acc ? x : acc) : (x < acc ? x : acc);
    }
    if (d == MLX_FLOAT16)
      ((uint16_t*)ref)[i] = f16_bits(acc);
    else if (d == MLX_BFLOAT16)
      ((uint16_t*)ref)[i] = bf16_bits(acc);
    else if (d == MLX_FLOAT32)
      ((float*)ref)[i] = (float)acc;
    else
      ((double*)ref)[i] = acc;
  }
}

static mlx_array make_input(mlx_dtype d, size_t n, int r) {
  size_t esz = mlx_dtype_size(d);
  char* buf = malloc(n * esz + 8);
  T_ASSERT(buf);
  for (size_t i = 0; i < n; i++) put(d, buf, i, r);
  int shape[1] = {(int)n};
  mlx_array a = mlx_array_new_data(buf, shape, 1, d);
  free(buf);
  T_ASSERT(a.ctx);
  return a;
}

static const void* raw(mlx_array a) {
  switch (mlx_array_itemsize(a)) {
    case 1: return mlx_array_data_uint8(a);
    case 2: return mlx_array_data_uint16(a);
    case 4: return mlx_array_data_uint32(a);
    default: return mlx_array_data_uint64(a);
  }
}

static void eval_ok(mlx_array a, const char* what) {
  if (mlx_array_eval(a) != 0) T_FAIL("%s: eval failed: %s", what, t_last_error());
}

static void check_bytes(mlx_array res, const void* ref, size_t nbytes, const char* what) {
  eval_ok(res, what);
  T_ASSERT((size_t)mlx_array_nbytes(res) == nbytes);
  if (nbytes == 0) return;
  const unsigned char* got = raw(res);
  if (!got) T_FAIL("%s: no data: %s", what, t_last_error());
  if (memcmp(got, ref, nbytes) != 0) {
    size_t k = 0;
    while (got[k] == ((const unsigned char*)ref)[k]) k++;
    T_FAIL("%s: byte %zu differs (got %u, expected %u) on rank %d", what, k, got[k],
           ((const unsigned char*)ref)[k], g_rank);
  }
}

static const size_t k_sizes[] = {0, 1, 7, 10, 1024, 1024 * 1024};
#define NSIZES (sizeof k_sizes / sizeof k_sizes[0])

static void test_reductions(mlx_distributed_group g) {
  mlx_stream s = mlx_stream_new();
  int (*fn[3])(mlx_array*, const mlx_array, const mlx_distributed_group,
               const mlx_stream) = {mlx_distributed_all_sum, mlx_distributed_all_max,
                                    mlx_distributed_all_min};
  for (int d = 0; d < NDT; d++)
    for (size_t k = 0; k < NSIZES; k++) {
      size_t n = k_sizes[k], esz = mlx_dtype_size((mlx_dtype)d);
      if (g_quick && n > 1024 && d != MLX_FLOAT32 && d != MLX_BFLOAT16 && d != MLX_COMPLEX64)
        continue;
      mlx_array x = make_input((mlx_dtype)d, n, g_rank);
      char* ref = malloc(n * esz * (size_t)g_size + 8);
      T_ASSERT(ref);
      for (int op = 0; op < 3; op++) {
        for (size_t i = 0; i < n; i++) ref_elem((mlx_dtype)d, op, ref, i);
        mlx_array res = mlx_array_new();
        T_EQ_INT(fn[op](&res, x, g, s), 0);
        char what[96];
        snprintf(what, sizeof what, "op %d dtype %d n %zu", op, d, n);
        check_bytes(res, ref, n * esz, what);
        mlx_array_free(res);
      }
      /* all_gather: every rank's input in rank order */
      for (int r = 0; r < g_size; r++)
        for (size_t i = 0; i < n; i++) put((mlx_dtype)d, ref + (size_t)r * n * esz, i, r);
      mlx_array res = mlx_array_new();
      T_EQ_INT(mlx_distributed_all_gather(&res, x, g, s), 0);
      char what[96];
      snprintf(what, sizeof what, "all_gather dtype %d n %zu", d, n);
      check_bytes(res, ref, n * esz * (size_t)g_size, what);
      T_EQ_INT(mlx_array_dim(res, 0), (int)n * g_size);
      mlx_array_free(res);
      mlx_array_free(x);
      /* sum_scatter of size*n elements: block `rank` of the sum */
      x = make_input((mlx_dtype)d, n * (size_t)g_size, g_rank);
      char* full = malloc(n * esz * (size_t)g_size + 8);
      T_ASSERT(full);
      for (size_t i = 0; i < n * (size_t)g_size; i++) ref_elem((mlx_dtype)d, 0, full, i);
      res = mlx_array_new();
      T_EQ_INT(mlx_distributed_sum_scatter(&res, x, g, s), 0);
      snprintf(what, sizeof what, "sum_scatter dtype %d n %zu", d, n);
      check_bytes(res, full + (size_t)g_rank * n * esz, n * esz, what);
      mlx_array_free(res);
      mlx_array_free(x);
      free(full);
      free(ref);
    }
  mlx_stream_free(s);
}

static void test_send_recv(mlx_distributed_group g) {
  mlx_stream s = mlx_stream_new();
  const size_t n = 2 * 1024 * 1024; /* 8 MiB of float32: beyond every eager limit */
  for (int a = 0; a < g_size; a++)
    for (int b = a + 1; b < g_size; b++) {
      if (g_rank != a && g_rank != b) continue;
      int peer = g_rank == a ? b : a;
      /* Both send first, then receive (must not deadlock). */
      mlx_array x = make_input(MLX_FLOAT32, n, g_rank * 100 + peer);
      mlx_array sent = mlx_array_new(), got = mlx_array_new(), got2 = mlx_array_new();
      T_EQ_INT(mlx_distributed_send(&sent, x, peer, g, s), 0);
      int shape[1] = {(int)n};
      T_EQ_INT(mlx_distributed_recv(&got, shape, 1, MLX_FLOAT32, peer, g, s), 0);
      eval_ok(sent, "send");
      mlx_array ref = make_input(MLX_FLOAT32, n, peer * 100 + g_rank);
      check_bytes(got, raw(ref), n * 4, "recv");
      /* Then one direction at a time, a small int16 message with recv_like. */
      mlx_array y = make_input(MLX_INT16, 7, g_rank), yref = make_input(MLX_INT16, 7, peer);
      for (int turn = 0; turn < 2; turn++) {
        bool sender = (turn == 0) == (g_rank == a);
        mlx_array r = mlx_array_new();
        if (sender) {
          T_EQ_INT(mlx_distributed_send(&r, y, peer, g, s), 0);
          eval_ok(r, "send small");
        } else {
          T_EQ_INT(mlx_distributed_recv_like(&got2, y, peer, g, s), 0);
          check_bytes(got2, raw(yref), 14, "recv_like small");
        }
        mlx_array_free(r);
      }
      mlx_array_free(x), mlx_array_free(sent), mlx_array_free(got), mlx_array_free(got2);
      mlx_array_free(ref), mlx_array_free(y), mlx_array_free(yref);
    }
  mlx_stream_free(s);
}

static int32_t gathered_sum(mlx_distributed_group g, int32_t v, int32_t* out, int n) {
  mlx_array x = mlx_array_new_data(&v, (int[]){1}, 1, MLX_INT32), res = mlx_array_new();
  T_EQ_INT(mlx_distributed_all_gather(&res, x, g, mlx_stream_new()), 0);
  eval_ok(res, "all_gather int32");
  T_EQ_INT(mlx_array_size(res), n);
  const int32_t* p = mlx_array_data_int32(res);
  int32_t s = 0;
  for (int i = 0; i < n; i++) out[i] = p[i], s += p[i];
  mlx_array_free(x), mlx_array_free(res);
  return s;
}

static void test_split(mlx_distributed_group g) {
  int32_t got[64];
  /* by parity, parent order */
  mlx_distributed_group sub = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_group_split(&sub, g, g_rank % 2, -1), 0);
  int sr = -1, ss = -1;
  T_EQ_INT(mlx_distributed_group_get_rank(&sr, sub), 0);
  T_EQ_INT(mlx_distributed_group_get_size(&ss, sub), 0);
  T_EQ_INT(sr, g_rank / 2);
  T_EQ_INT(ss, g_rank % 2 ? g_size / 2 : (g_size + 1) / 2);
  gathered_sum(sub, g_rank, got, ss);
  for (int i = 0; i < ss; i++) T_EQ_INT(got[i], 2 * i + g_rank % 2);
  /* everyone, reversed by key; a colour far from 0 */
  mlx_distributed_group rev = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_group_split(&rev, g, 7, g_size - g_rank), 0);
  T_EQ_INT(mlx_distributed_group_rank(rev), g_size - 1 - g_rank);
  gathered_sum(rev, g_rank, got, g_size);
  for (int i = 0; i < g_size; i++) T_EQ_INT(got[i], g_size - 1 - i);
  /* a split of a split: singletons */
  mlx_distributed_group one = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_group_split(&one, rev, g_rank, 0), 0);
  T_EQ_INT(mlx_distributed_group_size(one), 1);
  mlx_distributed_group_free(one), mlx_distributed_group_free(rev), mlx_distributed_group_free(sub);
}

/* Collectives queued alternately on three streams: the workers run them
 * concurrently, but each rank must issue them in queue order. */
static void test_streams(mlx_distributed_group g) {
  mlx_device cpu = mlx_device_new_type(MLX_CPU, 0);
  mlx_stream st[3];
  for (int i = 0; i < 3; i++) st[i] = mlx_stream_new_device(cpu);
  enum { K = 30 };
  mlx_array res[K], in[K];
  for (int k = 0; k < K; k++) {
    int32_t v[5];
    for (int j = 0; j < 5; j++) v[j] = (g_rank + 1) * (k * 5 + j);
    in[k] = mlx_array_new_data(v, (int[]){5}, 1, MLX_INT32);
    res[k] = mlx_array_new();
    T_EQ_INT(mlx_distributed_all_sum(&res[k], in[k], g, st[k % 3]), 0);
  }
  int32_t tri = g_size * (g_size + 1) / 2;
  for (int k = K - 1; k >= 0; k--) {
    eval_ok(res[k], "stream all_sum");
    const int32_t* p = mlx_array_data_int32(res[k]);
    for (int j = 0; j < 5; j++) T_EQ_INT(p[j], tri * (k * 5 + j));
    mlx_array_free(res[k]), mlx_array_free(in[k]);
  }
  for (int i = 0; i < 3; i++) mlx_stream_free(st[i]);
  mlx_device_free(cpu);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int launcher_int(const char* a, const char* b) {
  const char* v = getenv(a);
  if (!v) v = getenv(b);
  return v ? atoi(v) : -1;
}

static mlx_distributed_group init_mpi(void) {
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init(&g, true, "mpi") != 0) T_FAIL("init(mpi): %s", t_last_error());
  T_EQ_INT(mlx_distributed_group_get_rank(&g_rank, g), 0);
  T_EQ_INT(mlx_distributed_group_get_size(&g_size, g), 0);
  int lr = launcher_int("OMPI_COMM_WORLD_RANK", "PMI_RANK");
  int ls = launcher_int("OMPI_COMM_WORLD_SIZE", "PMI_SIZE");
  if (lr >= 0) T_EQ_INT(g_rank, lr);
  if (ls >= 0) T_EQ_INT(g_size, ls);
  T_ASSERT(g_size >= 2);
  return g;
}

static int run_all(void) {
  T_ASSERT(mlx_distributed_is_available("mpi"));
  mlx_distributed_group g = init_mpi();
  /* caching: the same group again */
  mlx_distributed_group g2 = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_init(&g2, true, "mpi"), 0);
  T_ASSERT(g2.ctx == g.ctx);
  T_EQ_INT(mlx_distributed_group_rank(g2), g_rank);
  /* "any" under mpirun, without the ring's variables: the mpi group */
  unsetenv("MLX_RANK");
  unsetenv("MLX_HOSTFILE");
  mlx_distributed_group ga = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_init(&ga, true, "any"), 0);
  T_EQ_INT(mlx_distributed_group_size(ga), g_size);
  T_EQ_INT(mlx_distributed_group_rank(ga), g_rank);

  double t0 = now_s();
  test_reductions(g);
  double t1 = now_s();
  test_send_recv(g);
  double t2 = now_s();
  test_split(g);
  test_streams(g);
  double t3 = now_s();
  if (g_rank == 0)
    printf("reductions %.2f s, send/recv %.2f s, split+streams %.2f s\n", t1 - t0, t2 - t1,
           t3 - t2);
  /* the null group is the cached "any" group */
  int32_t v = 1;
  mlx_array x = mlx_array_new_data(&v, (int[]){1}, 1, MLX_INT32), r = mlx_array_new();
  T_EQ_INT(mlx_distributed_all_sum(&r, x, mlx_distributed_group_new(), mlx_stream_new()), 0);
  int32_t item = 0;
  T_EQ_INT(mlx_array_item_int32(&item, r), 0);
  T_EQ_INT(item, g_size);
  mlx_array_free(r);

  /* clear_backends, then a new group in the same process; old handles stay valid */
  T_EQ_INT(mlx_distributed_clear_backends(), 0);
  mlx_distributed_group h = init_mpi();
  T_ASSERT(h.ctx != g.ctx);
  r = mlx_array_new();
  T_EQ_INT(mlx_distributed_all_sum(&r, x, h, mlx_stream_new()), 0);
  T_EQ_INT(mlx_array_item_int32(&item, r), 0);
  T_EQ_INT(item, g_size);
  mlx_array_free(r);
  r = mlx_array_new();
  T_EQ_INT(mlx_distributed_all_sum(&r, x, g, mlx_stream_new()), 0); /* the old group */
  T_EQ_INT(mlx_array_item_int32(&item, r), 0);
  T_EQ_INT(item, g_size);
  mlx_array_free(r), mlx_array_free(x);
  mlx_distributed_group_free(g), mlx_distributed_group_free(g2), mlx_distributed_group_free(ga);
  mlx_distributed_group_free(h);
  T_EQ_INT(t_error_count(), 0);
  printf("rank %d/%d: mpi_ranks all OK\n", g_rank, g_size);
  return 0;
}

static int run_timeout(void) {
  mlx_distributed_group g = init_mpi();
  float v = 1;
  mlx_array x = mlx_array_new_data(&v, (int[]){1}, 1, MLX_FLOAT32), r = mlx_array_new();
  /* rank 1 comes once rank 0 has given up on both ops (MLXDIST_TIMEOUT=2 s each) */
  char marks[300];
  t_job_marks_dir(marks, sizeof marks);
  if (g_rank == 1) {
    t_wait_mark(marks, "timeout-given-up", 60);
    t_job_marks_remove(marks, "timeout-given-up", (const char*)NULL);
  }
  T_EQ_INT(mlx_distributed_all_sum(&r, x, g, mlx_stream_new()), 0);
  int rc = mlx_array_eval(r);
  if (g_rank == 0) {
    T_ASSERT(rc != 0);
    const char* want = "[mpi] all_sum #0 on rank 0: timed out after 2 s in all_sum of 1 elements";
    T_CHECKF(strstr(t_last_error(), want) == t_last_error(), "got \"%s\"", t_last_error());
    t_clear_errors();
    mlx_array r2 = mlx_array_new();
    T_EQ_INT(mlx_distributed_all_sum(&r2, x, g, mlx_stream_new()), 0);
    T_ASSERT(mlx_array_eval(r2) != 0);
    T_CHECKF(strstr(t_last_error(), "[mpi] all_sum #1 on rank 0: timed out after 2 s") ==
                     t_last_error() &&
                 strstr(t_last_error(), "(the group failed in all_sum #0)") != NULL,
             "next op: got \"%s\"", t_last_error());
    mlx_array_free(r2);
    t_mark(marks, "timeout-given-up");
  } else {
    T_EQ_INT(rc, 0); /* rank 0's request was still posted: this one completes */
  }
  printf("rank %d: mpi_ranks timeout OK\n", g_rank);
  fflush(stdout);
  mlx_array_free(r), mlx_array_free(x);
  mlx_distributed_group_free(g);
  return t_exit_status();
}

int main(int argc, char** argv) {
  t_capture_errors();
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char* mode = argc > 1 ? argv[1] : "all";
  if (strcmp(mode, "timeout") == 0) return run_timeout();
  g_quick = strcmp(mode, "quick") == 0;
  return run_all();
}
