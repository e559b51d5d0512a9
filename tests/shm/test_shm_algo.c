/* The collective algorithms (src/algo) over the shared-memory transport, in
 * forked processes: all_reduce (every dtype, sum/max/min), all_gather,
 * reduce_scatter and send/recv, for counts {0, 1, 7, 1024, 1024*1024+3};
 * references are computed here from each rank's known inputs.
 * Usage: test_shm_algo <ranks> [cma] (cma: single-copy path from 64 KiB on). */
#include <stdint.h>

#include "algo/algo.h"
#include "harness.h"
#include "mlx/c/array.h"
#include "testutil.h"
#include "transport/shm.h"

static int g_rank = -1;

#define R_CHECK(cond, ...)                                                       \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "%s:%d: rank %d: FAILED: %s: ", __FILE__, __LINE__, g_rank, #cond); \
      fprintf(stderr, __VA_ARGS__);                                              \
      fprintf(stderr, "\n");                                                     \
      _exit(1);                                                                  \
    }                                                                            \
  } while (0)

static const char* dt_name(mlx_dtype d) {
  static const char* names[] = {"bool",  "uint8", "uint16",  "uint32",  "uint64",
                                "int8",  "int16", "int32",   "int64",   "float16",
                                "float32", "float64", "bfloat16", "complex64"};
  return (unsigned)d < 14 ? names[d] : "?";
}

static size_t dt_size(mlx_dtype d) {
  switch (d) {
    case MLX_BOOL: case MLX_UINT8: case MLX_INT8: return 1;
    case MLX_UINT16: case MLX_INT16: case MLX_FLOAT16: case MLX_BFLOAT16: return 2;
    case MLX_UINT32: case MLX_INT32: case MLX_FLOAT32: return 4;
    default: return 8;
  }
}

/* Rank r's element i: small integers, exact in every type (also 16-bit floats). */
static long long xval(mlx_dtype d, int r, size_t i) {
  if (d == MLX_BOOL) return (long long)((i + (size_t)r) % 3 == 0);
  long long v = (long long)(r + 1) * (long long)(i % 13) + (long long)(i % 7);
  bool is_unsigned = d == MLX_UINT8 || d == MLX_UINT16 || d == MLX_UINT32 || d == MLX_UINT64;
  return is_unsigned ? v : v - 5;
}
static long long yval(int r, size_t i) { return (long long)(r * 3) + (long long)(i % 5) - 2; }

static uint16_t to_f16(float f) { /* exact values only */
  uint32_t b;
  memcpy(&b, &f, 4);
  uint32_t sign = b >> 31, exp = (b >> 23) & 0xff;
  if (exp == 0) return (uint16_t)(sign << 15);
  return (uint16_t)((sign << 15) | ((exp - 127 + 15) << 10) | ((b >> 13) & 0x3ff));
}
static uint16_t to_bf16(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return (uint16_t)(b >> 16);
}

static void put(mlx_dtype d, void* p, long long x, long long y) {
  unsigned long long u = (unsigned long long)x;
  switch (d) {
    case MLX_BOOL: { bool v = x != 0; memcpy(p, &v, 1); break; }
    case MLX_UINT8: case MLX_INT8: { uint8_t v = (uint8_t)u; memcpy(p, &v, 1); break; }
    case MLX_UINT16: case MLX_INT16: { uint16_t v = (uint16_t)u; memcpy(p, &v, 2); break; }
    case MLX_UINT32: case MLX_INT32: { uint32_t v = (uint32_t)u; memcpy(p, &v, 4); break; }
    case MLX_UINT64: case MLX_INT64: memcpy(p, &u, 8); break;
    case MLX_FLOAT16: { uint16_t v = to_f16((float)x); memcpy(p, &v, 2); break; }
    case MLX_BFLOAT16: { uint16_t v = to_bf16((float)x); memcpy(p, &v, 2); break; }
    case MLX_FLOAT32: { float v = (float)x; memcpy(p, &v, 4); break; }
    case MLX_FLOAT64: { double v = (double)x; memcpy(p, &v, 8); break; }
    case MLX_COMPLEX64: { float v[2] = {(float)x, (float)y}; memcpy(p, v, 8); break; }
  }
}

/* Reference of element i over ranks 0..size-1. */
static void ref(mlx_dtype d, mlxd_reduce_op op, int size, size_t i, long long* rx, long long* ry) {
  long long ax = xval(d, 0, i), ay = yval(0, i);
  for (int r = 1; r < size; r++) {
    long long x = xval(d, r, i), y = yval(r, i);
    if (d == MLX_BOOL) {
      ax = op == MLXD_MIN ? (ax && x) : (ax || x);
    } else if (op == MLXD_SUM) {
      ax += x;
      ay += y;
    } else {
      bool greater = d == MLX_COMPLEX64 ? (x > ax || (x == ax && y > ay)) : x > ax;
      bool less = d == MLX_COMPLEX64 ? (x < ax || (x == ax && y < ay)) : x < ax;
      if ((op == MLXD_MAX && greater) || (op == MLXD_MIN && less)) {
        ax = x;
        ay = y;
      }
    }
  }
  *rx = ax;
  *ry = ay;
}

static uint64_t g_seq = 1;

static void check_all_reduce(mlxd_transport* t, mlx_dtype d, mlxd_reduce_op op, size_t count,
                             bool inplace) {
  size_t esz = dt_size(d);
  R_CHECK(esz == mlx_dtype_size(d), "dtype size of %s", dt_name(d));
  char* in = malloc(count * esz + 1);
  char* out = inplace ? in : malloc(count * esz + 1);
  char e[8];
  R_CHECK(in && out, "malloc");
  for (size_t i = 0; i < count; i++) put(d, in + i * esz, xval(d, t->rank, i), yval(t->rank, i));
  mlxd_status st;
  int rc = mlxd_algo_all_reduce(t, g_seq++, count ? in : NULL, count ? out : NULL, count, d, op,
                                &st);
  R_CHECK(rc == 0, "all_reduce %s %s count %zu: %s", dt_name(d), mlxd_reduce_op_name(op), count,
          st.msg);
  for (size_t i = 0; i < count; i++) {
    long long x, y;
    ref(d, op, t->size, i, &x, &y);
    put(d, e, x, y);
    R_CHECK(memcmp(e, out + i * esz, esz) == 0, "all_reduce %s %s count %zu: element %zu wrong",
            dt_name(d), mlxd_reduce_op_name(op), count, i);
  }
  if (!inplace) free(out);
  free(in);
}

static void check_reduce_scatter(mlxd_transport* t, mlx_dtype d, mlxd_reduce_op op,
                                 size_t count) {
  size_t esz = dt_size(d), all = count * (size_t)t->size;
  char* in = malloc(all * esz + 1);
  char* out = malloc(count * esz + 1);
  char e[8];
  R_CHECK(in && out, "malloc");
  for (size_t i = 0; i < all; i++) put(d, in + i * esz, xval(d, t->rank, i), yval(t->rank, i));
  mlxd_status st;
  int rc = mlxd_algo_reduce_scatter(t, g_seq++, in, out, count, d, op, &st);
  R_CHECK(rc == 0, "reduce_scatter %s count %zu: %s", dt_name(d), count, st.msg);
  for (size_t i = 0; i < count; i++) {
    long long x, y;
    ref(d, op, t->size, (size_t)t->rank * count + i, &x, &y);
    put(d, e, x, y);
    R_CHECK(memcmp(e, out + i * esz, esz) == 0, "reduce_scatter %s count %zu: element %zu wrong",
            dt_name(d), count, i);
  }
  free(in);
  free(out);
}

static unsigned char bval(int r, size_t i) { return (unsigned char)(r * 77 + i * 5 + (i >> 11)); }

static void check_all_gather(mlxd_transport* t, size_t n) {
  unsigned char* in = malloc(n + 1);
  unsigned char* out = malloc(n * (size_t)t->size + 1);
  R_CHECK(in && out, "malloc");
  for (size_t i = 0; i < n; i++) in[i] = bval(t->rank, i);
  mlxd_status st;
  R_CHECK(mlxd_algo_all_gather(t, g_seq++, in, out, n, &st) == 0, "all_gather %zu: %s", n,
          st.msg);
  for (int r = 0; r < t->size; r++)
    for (size_t i = 0; i < n; i++)
      R_CHECK(out[(size_t)r * n + i] == bval(r, i), "all_gather %zu: rank %d byte %zu", n, r, i);
  free(in);
  free(out);
}

static void check_sendrecv(mlxd_transport* t, size_t n, uint64_t seq) {
  int to = (t->rank + 1) % t->size, from = (t->rank + t->size - 1) % t->size;
  unsigned char* s = malloc(n + 1);
  unsigned char* r = malloc(n + 1);
  R_CHECK(s && r, "malloc");
  for (size_t i = 0; i < n; i++) s[i] = bval(t->rank + 10, i);
  mlxd_status st;
  /* everyone sends first: must not deadlock */
  R_CHECK(mlxd_algo_send(t, seq, s, n, to, &st) == 0, "send %zu: %s", n, st.msg);
  R_CHECK(mlxd_algo_recv(t, seq, r, n, from, &st) == 0, "recv %zu: %s", n, st.msg);
  for (size_t i = 0; i < n; i++)
    R_CHECK(r[i] == bval(from + 10, i), "recv %zu: byte %zu", n, i);
  free(s);
  free(r);
}

static int rank_main(int rank, int size, const char* name, void* arg) {
  (void)arg;
  g_rank = rank;
  mlxd_status st;
  mlxd_transport* t = mlxd_shm_transport_new(rank, size, name, &st);
  R_CHECK(t, "%s", st.msg);
  const size_t counts[] = {0, 1, 7, 1024, 1024 * 1024 + 3};
  const mlxd_reduce_op ops[] = {MLXD_SUM, MLXD_MAX, MLXD_MIN};
  for (int d = 0; d < 14; d++)
    for (int o = 0; o < 3; o++)
      for (int c = 0; c < 4; c++) check_all_reduce(t, (mlx_dtype)d, ops[o], counts[c], c == 2);
  size_t big = counts[4];
  check_all_reduce(t, MLX_FLOAT32, MLXD_SUM, big, false);
  check_all_reduce(t, MLX_FLOAT32, MLXD_MAX, big, true);
  check_all_reduce(t, MLX_FLOAT32, MLXD_MIN, big, false);
  check_all_reduce(t, MLX_FLOAT16, MLXD_SUM, big, false);
  check_all_reduce(t, MLX_BFLOAT16, MLXD_SUM, big, false);
  check_all_reduce(t, MLX_INT64, MLXD_SUM, big, false);
  check_all_reduce(t, MLX_BOOL, MLXD_MIN, big, false);
  check_all_reduce(t, MLX_COMPLEX64, MLXD_MAX, big, false);
  check_all_reduce(t, MLX_UINT8, MLXD_SUM, big, false);
  for (int c = 0; c < 5; c++) {
    check_reduce_scatter(t, MLX_FLOAT32, MLXD_SUM, counts[c]);
    check_reduce_scatter(t, MLX_INT32, MLXD_MAX, counts[c]);
    check_all_gather(t, counts[c]);
    check_sendrecv(t, counts[c], (uint64_t)c + 1);
  }
  check_reduce_scatter(t, MLX_BFLOAT16, MLXD_SUM, 1000);
  t->ops->destroy(t);
  return 0;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s <ranks> [cma]\n", argv[0]);
    return 2;
  }
  int n = atoi(argv[1]);
  T_ASSERT(n >= 1 && n <= 16);
  if (argc > 2 && strcmp(argv[2], "cma") == 0) setenv("MLXDIST_SHM_CMA_BYTES", "65536", 1);
  int codes[64];
  int bad = h_run(n, 240, rank_main, NULL, codes);
  for (int r = 0; r < n; r++)
    if (codes[r] != 0) fprintf(stderr, "rank %d exited with %d\n", r, codes[r]);
  if (bad) T_FAIL("collectives over shm with %d ranks failed", n);
  printf("collectives over shm with %d ranks: ok\n", n);
  return 0;
}
