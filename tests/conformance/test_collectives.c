/* The shared collective conformance suite: one rank program, public API only.
 *
 *   test_collectives [BACKEND] [--big] [--all-gather DIR]
 *                                           (BACKEND: "any" by default; strict init)
 *
 * --all-gather DIR: every init (the first and the re-init after
 * clear_backends) is init_with_all_gather with the caller's all-gather over
 * the directory DIR that every rank sees (examples/bootstrap/shared_dir.c),
 * instead of the backend's own side channel.
 *
 * Run it under a launcher (mlxdist-launch, mpirun). It checks every op
 * (all_sum/max/min, all_gather, sum_scatter, all_to_all, send/recv/recv_like) for all 14
 * dtypes and sizes {0, 1, 7, 10, 1024, 1024*1024} against references computed
 * here from deterministic rank-dependent inputs, reduced in rank order with
 * scalar code (above 64 Ki elements on a dense sample: see checked()).
 * MLXDIST_TEST_LIGHT=1 keeps the 1 Mi-element size for four dtypes only and
 * exchanges 16 MiB instead of 64.
 *
 * Comparison rule. "Exact" inputs are multiples of 1/4 in [-3.5, 3.5] (ints:
 * arbitrary bits, wrapping), so every partial sum over <= 8 ranks is exactly
 * representable even in bfloat16: the result does not depend on the order in
 * which the backend reduces, and is compared bit for bit for every dtype.
 * "Noisy" float inputs (size 1024) are not exact: the reference is a double
 * sum, compared with a tolerance of (rank count) * epsilon-of-dtype * sum|x|
 * (16-bit floats: each pairwise add is done in float32 and rounded back, which
 * this bound covers), and the result must be bit-identical on every rank
 * (checked with an all_gather of the result bytes).
 *
 * Also: null group and null stream, explicit streams, neighbour and
 * non-neighbour send/recv in both orders, a 64 MiB exchange where both ranks
 * send first, split by parity and with reversed keys (and collectives on the
 * split groups), init caching, clear_backends and re-init. */
#include <malloc.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bootstrap_examples.h"
#include "mlx/c/mlx.h"
#include "testutil.h"

enum { OP_SUM, OP_MAX, OP_MIN };
static const char* op_name[] = {"all_sum", "all_max", "all_min"};
static const char* dt_name[] = {"bool",    "uint8",   "uint16",   "uint32",   "uint64",
                                "int8",    "int16",   "int32",    "int64",    "float16",
                                "float32", "float64", "bfloat16", "complex64"};
#define NDT 14

static int g_rank, g_size;

/* MLXDIST_TEST_VERBOSE=1: print the time of each phase to stderr. */
static void phase(const char* name) {
  static double t0 = -1;
  if (!getenv("MLXDIST_TEST_VERBOSE")) return;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  double t = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
  if (t0 < 0) t0 = t;
  fprintf(stderr, "rank %d: %7.3f s %s\n", g_rank, t - t0, name);
}

/* ---- 16-bit float encode/decode (round to nearest even; normal numbers and zero) ---- */
static uint16_t f16_enc(double v) {
  if (v == 0) return 0;
  uint16_t s = v < 0 ? 0x8000 : 0;
  int e;
  double m = frexp(fabs(v), &e); /* |v| = m * 2^e, m in [0.5, 1) */
  double frac = nearbyint((m * 2 - 1) * 1024.0);
  int E = e - 1 + 15;
  if (frac >= 1024) {
    frac = 0;
    E++;
  }
  if (E <= 0 || E >= 31) return (uint16_t)(s | 0x7C00); /* not used by this test's values */
  return (uint16_t)(s | (E << 10) | (int)frac);
}
static double f16_dec(uint16_t h) {
  int E = (h >> 10) & 31, f = h & 1023;
  double v = E == 0 ? ldexp(f, -24) : ldexp(1024 + f, E - 25);
  return (h & 0x8000) ? -v : v;
}
static uint16_t bf16_enc(double v) {
  float f = (float)v;
  uint32_t b;
  memcpy(&b, &f, 4);
  b += 0x7FFF + ((b >> 16) & 1);
  return (uint16_t)(b >> 16);
}
static double bf16_dec(uint16_t h) {
  uint32_t b = (uint32_t)h << 16;
  float f;
  memcpy(&f, &b, 4);
  return f;
}

/* ---- values ---- */
typedef struct {
  uint64_t u;    /* integers and bool (low bits) */
  double re, im; /* floats (im: complex only) */
} val;

static bool is_int(mlx_dtype d) { return d <= MLX_INT64; }
static bool is_signed(mlx_dtype d) { return d >= MLX_INT8 && d <= MLX_INT64; }
static int width_bits(mlx_dtype d) { return (int)mlx_dtype_size(d) * 8; }
static uint64_t mask(mlx_dtype d) {
  int w = width_bits(d);
  return w == 64 ? ~0ull : ((1ull << w) - 1);
}
static int64_t sext(mlx_dtype d, uint64_t u) {
  int w = width_bits(d);
  if (w == 64) return (int64_t)u;
  uint64_t sign = 1ull << (w - 1);
  u &= mask(d);
  return (int64_t)((u ^ sign) - sign);
}

/* The dtype's own rounding of a double. */
static double round_to(mlx_dtype d, double v) {
  switch (d) {
    case MLX_FLOAT16: return f16_dec(f16_enc(v));
    case MLX_BFLOAT16: return bf16_dec(bf16_enc(v));
    case MLX_FLOAT32:
    case MLX_COMPLEX64: return (float)v;
    default: return v;
  }
}

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}

static val gen(mlx_dtype d, int r, size_t i, bool noisy) {
  val v = {0, 0, 0};
  if (d == MLX_BOOL) {
    v.u = ((size_t)r * 5 + i) % 3 == 0;
  } else if (is_int(d)) {
    v.u = mix(((uint64_t)r << 40) ^ (i * 2654435761ull) ^ (uint64_t)d) & mask(d);
  } else if (!noisy) {
    v.re = (double)((long)((r * 37 + (long)i * 11) % 29) - 14) * 0.25;
    v.im = (double)((long)((r * 13 + (long)i * 7) % 23) - 11) * 0.25;
  } else {
    uint64_t m = mix(((uint64_t)r << 32) ^ i ^ ((uint64_t)d << 56));
    v.re = round_to(d, (double)(m % 20000) / 997.0 - 10.0);
    v.im = round_to(d, (double)((m >> 20) % 20000) / 991.0 - 10.0);
    if (fabs(v.re) < 0.01) v.re = 0.5;
    if (fabs(v.im) < 0.01) v.im = 0.5;
  }
  if (d != MLX_COMPLEX64) v.im = 0;
  return v;
}

static void store(mlx_dtype d, void* buf, size_t i, val v) {
  switch (d) {
    case MLX_BOOL: ((uint8_t*)buf)[i] = v.u ? 1 : 0; break;
    case MLX_UINT8:
    case MLX_INT8: ((uint8_t*)buf)[i] = (uint8_t)v.u; break;
    case MLX_UINT16:
    case MLX_INT16: ((uint16_t*)buf)[i] = (uint16_t)v.u; break;
    case MLX_UINT32:
    case MLX_INT32: ((uint32_t*)buf)[i] = (uint32_t)v.u; break;
    case MLX_UINT64:
    case MLX_INT64: ((uint64_t*)buf)[i] = v.u; break;
    case MLX_FLOAT16: ((uint16_t*)buf)[i] = f16_enc(v.re); break;
    case MLX_BFLOAT16: ((uint16_t*)buf)[i] = bf16_enc(v.re); break;
    case MLX_FLOAT32: ((float*)buf)[i] = (float)v.re; break;
    case MLX_FLOAT64: ((double*)buf)[i] = v.re; break;
    case MLX_COMPLEX64:
      ((float*)buf)[2 * i] = (float)v.re;
      ((float*)buf)[2 * i + 1] = (float)v.im;
      break;
  }
}

static val load(mlx_dtype d, const void* buf, size_t i) {
  val v = {0, 0, 0};
  switch (d) {
    case MLX_BOOL:
    case MLX_UINT8:
    case MLX_INT8: v.u = ((const uint8_t*)buf)[i]; break;
    case MLX_UINT16:
    case MLX_INT16: v.u = ((const uint16_t*)buf)[i]; break;
    case MLX_UINT32:
    case MLX_INT32: v.u = ((const uint32_t*)buf)[i]; break;
    case MLX_UINT64:
    case MLX_INT64: v.u = ((const uint64_t*)buf)[i]; break;
    case MLX_FLOAT16: v.re = f16_dec(((const uint16_t*)buf)[i]); break;
    case MLX_BFLOAT16: v.re = bf16_dec(((const uint16_t*)buf)[i]); break;
    case MLX_FLOAT32: v.re = ((const float*)buf)[i]; break;
    case MLX_FLOAT64: v.re = ((const double*)buf)[i]; break;
    case MLX_COMPLEX64:
      v.re = ((const float*)buf)[2 * i];
      v.im = ((const float*)buf)[2 * i + 1];
      break;
  }
  return v;
}

/* a OP b, in the reference's scalar arithmetic. */
static val combine(mlx_dtype d, int op, val a, val b) {
  val r = a;
  if (d == MLX_BOOL) {
    r.u = op == OP_MIN ? (a.u && b.u) : (a.u || b.u);
  } else if (is_int(d)) {
    if (op == OP_SUM) {
      r.u = (a.u + b.u) & mask(d);
    } else {
      bool less = is_signed(d) ? sext(d, b.u) < sext(d, a.u) : b.u < a.u;
      bool take_b = op == OP_MAX ? (!less && b.u != a.u) : less;
      if (take_b) r = b;
    }
  } else if (op == OP_SUM) {
    r.re = a.re + b.re;
    r.im = a.im + b.im;
  } else {
    bool b_less = d == MLX_COMPLEX64 ? (b.re < a.re || (b.re == a.re && b.im < a.im)) : b.re < a.re;
    bool b_greater =
        d == MLX_COMPLEX64 ? (b.re > a.re || (b.re == a.re && b.im > a.im)) : b.re > a.re;
    if ((op == OP_MAX && b_greater) || (op == OP_MIN && b_less)) r = b;
  }
  return r;
}

/* Which elements a check compares against the scalar reference: all of them up to
 * 64 Ki elements; above, the first and last 4096 and every 7th in between (7 is
 * coprime with every power-of-two chunk size, so every chunk of >= 7 elements an
 * algorithm may cut is still checked). This keeps 4 ranks on 2 cores fast. */
static bool checked(size_t i, size_t n) {
  return n <= 65536 || i < 4096 || i >= n - 4096 || i % 7 == 0;
}

/* ---- array helpers ---- */
static const void* raw(mlx_array a) {
  switch (mlx_array_itemsize(a)) {
    case 1: return mlx_array_data_uint8(a);
    case 2: return mlx_array_data_uint16(a);
    case 4: return mlx_array_data_uint32(a);
    case 8: return mlx_array_data_uint64(a);
    default: return NULL;
  }
}

static mlx_array make_input_new(mlx_dtype d, int r, size_t n, bool noisy) {
  size_t bytes = n * mlx_dtype_size(d);
  void* buf = malloc(bytes ? bytes : 1);
  T_ASSERT(buf);
  for (size_t i = 0; i < n; i++) store(d, buf, i, gen(d, r, i, noisy));
  int shape[1] = {(int)n};
  mlx_array a = mlx_array_new_data(buf, shape, 1, d);
  free(buf);
  T_ASSERT(a.ctx);
  return a;
}

/* The last input made, kept so the several ops of one (dtype, size) share it. */
static struct {
  int d, r;
  size_t n;
  bool noisy;
  mlx_array a;
} g_input_cache;

static mlx_array make_input(mlx_dtype d, int r, size_t n, bool noisy) {
  if (!g_input_cache.a.ctx || g_input_cache.d != (int)d || g_input_cache.r != r ||
      g_input_cache.n != n || g_input_cache.noisy != noisy) {
    mlx_array_free(g_input_cache.a);
    g_input_cache.a = make_input_new(d, r, n, noisy);
    g_input_cache.d = (int)d;
    g_input_cache.r = r;
    g_input_cache.n = n;
    g_input_cache.noisy = noisy;
  }
  mlx_array a = mlx_array_new();
  T_EQ_INT(mlx_array_set(&a, g_input_cache.a), 0);
  return a;
}

static mlx_stream g_streams[3]; /* null, default cpu, a new cpu stream */
static int g_next_stream;
static mlx_stream next_stream(void) { return g_streams[g_next_stream++ % 3]; }

static void expect_eval_ok(mlx_array a, const char* what) {
  if (mlx_array_eval(a) != 0) T_FAIL("%s: eval failed: %s", what, t_last_error());
  T_EXPECT_NO_ERROR();
}

/* members[i] = parent rank of group rank i (reference over these). */
static void check_reduce(mlx_distributed_group g, const int* members, int gsize, int grank,
                         mlx_dtype d, int op, size_t n, bool noisy) {
  int me = members[grank];
  mlx_array x = make_input(d, me, n, noisy);
  mlx_array res = mlx_array_new();
  int (*fn)(mlx_array*, const mlx_array, const mlx_distributed_group, const mlx_stream) =
      op == OP_SUM   ? mlx_distributed_all_sum
      : op == OP_MAX ? mlx_distributed_all_max
                     : mlx_distributed_all_min;
  char what[128];
  snprintf(what, sizeof what, "%s %s n=%zu%s", op_name[op], dt_name[d], n, noisy ? " noisy" : "");
  T_EQ_INT(fn(&res, x, g, next_stream()), 0);
  expect_eval_ok(res, what);
  T_EQ_INT(mlx_array_dtype(res), d);
  T_EQ_INT(mlx_array_size(res), n);
  size_t isz = mlx_dtype_size(d);
  const void* got = n ? raw(res) : NULL;
  T_ASSERT(n == 0 || got);
  unsigned char* want = malloc(n * isz + 1);
  T_ASSERT(want);
  for (size_t i = 0; i < n; i++) {
    if (!checked(i, n)) continue;
    val acc = gen(d, members[0], i, noisy);
    double mag = fabs(acc.re) + fabs(acc.im);
    for (int r = 1; r < gsize; r++) {
      val b = gen(d, members[r], i, noisy);
      mag += fabs(b.re) + fabs(b.im);
      acc = combine(d, op, acc, b);
    }
    if (!noisy || op != OP_SUM) {
      store(d, want, i, acc);
    } else {
      val v = load(d, got, i);
      double eps = d == MLX_FLOAT16    ? 1e-3
                   : d == MLX_BFLOAT16 ? 8e-3
                   : d == MLX_FLOAT64  ? 1e-15
                                       : 2e-7;
      double tol = (double)gsize * eps * mag;
      if (fabs(v.re - acc.re) > tol || fabs(v.im - acc.im) > tol)
        T_FAIL("%s: element %zu is (%.9g, %.9g), reference (%.9g, %.9g), tolerance %.3g", what, i,
               v.re, v.im, acc.re, acc.im, tol);
    }
  }
  if (!noisy || op != OP_SUM) {
    for (size_t i = 0; i < n; i++) {
      if (!checked(i, n)) continue;
      if (memcmp((const unsigned char*)got + i * isz, want + i * isz, isz) != 0) {
        val gv = load(d, got, i), wv = load(d, want, i);
        T_FAIL(
            "%s: element %zu differs (got u=%llu re=%.9g im=%.9g, want u=%llu re=%.9g "
            "im=%.9g)",
            what, i, (unsigned long long)gv.u, gv.re, gv.im, (unsigned long long)wv.u, wv.re,
            wv.im);
      }
    }
  } else if (gsize > 1) {
    /* the same bits on every rank */
    int shape[1] = {(int)(n * isz)};
    mlx_array bytes = mlx_array_new_data(got, shape, 1, MLX_UINT8);
    mlx_array all = mlx_array_new();
    T_EQ_INT(mlx_distributed_all_gather(&all, bytes, g, next_stream()), 0);
    expect_eval_ok(all, "all_gather of result bytes");
    const uint8_t* ab = mlx_array_data_uint8(all);
    for (int r = 0; r < gsize; r++)
      if (memcmp(ab + (size_t)r * n * isz, got, n * isz) != 0)
        T_FAIL("%s: rank %d's result differs from this rank's (results must be bit-identical)",
               what, r);
    mlx_array_free(all);
    mlx_array_free(bytes);
  }
  free(want);
  mlx_array_free(res);
  mlx_array_free(x);
}

static void check_gather(mlx_distributed_group g, const int* members, int gsize, int grank,
                         mlx_dtype d, size_t n) {
  mlx_array x = make_input(d, members[grank], n, false);
  mlx_array res = mlx_array_new();
  T_EQ_INT(mlx_distributed_all_gather(&res, x, g, next_stream()), 0);
  char what[96];
  snprintf(what, sizeof what, "all_gather %s n=%zu", dt_name[d], n);
  expect_eval_ok(res, what);
  T_EQ_INT(mlx_array_ndim(res), 1);
  T_EQ_INT(mlx_array_shape(res)[0], (long long)n * gsize);
  size_t isz = mlx_dtype_size(d);
  const unsigned char* got = n ? raw(res) : NULL;
  unsigned char* want = malloc(isz + 1);
  for (int r = 0; r < gsize; r++)
    for (size_t i = 0; i < n; i++) {
      if (!checked(i, n)) continue;
      store(d, want, 0, gen(d, members[r], i, false));
      if (memcmp(got + ((size_t)r * n + i) * isz, want, isz) != 0)
        T_FAIL("%s: block of rank %d, element %zu differs", what, r, i);
    }
  free(want);
  mlx_array_free(res);
  mlx_array_free(x);
}

static void check_scatter(mlx_distributed_group g, const int* members, int gsize, int grank,
                          mlx_dtype d, size_t n) {
  size_t per = (n + (size_t)gsize - 1) / (size_t)gsize;
  size_t total = per * (size_t)gsize;
  mlx_array x = make_input(d, members[grank], total, false);
  mlx_array res = mlx_array_new();
  T_EQ_INT(mlx_distributed_sum_scatter(&res, x, g, next_stream()), 0);
  char what[96];
  snprintf(what, sizeof what, "sum_scatter %s n=%zu", dt_name[d], total);
  expect_eval_ok(res, what);
  T_EQ_INT(mlx_array_shape(res)[0], (long long)per);
  size_t isz = mlx_dtype_size(d);
  const unsigned char* got = per ? raw(res) : NULL;
  unsigned char* want = malloc(isz + 1);
  for (size_t i = 0; i < per; i++) {
    if (!checked(i, per)) continue;
    size_t gi = (size_t)grank * per + i;
    val acc = gen(d, members[0], gi, false);
    for (int r = 1; r < gsize; r++) acc = combine(d, OP_SUM, acc, gen(d, members[r], gi, false));
    store(d, want, 0, acc);
    if (memcmp(got + i * isz, want, isz) != 0) T_FAIL("%s: element %zu differs", what, i);
  }
  free(want);
  mlx_array_free(res);
  mlx_array_free(x);
}

/* Rank `me` sends its input to dst and receives src's, on two streams, in either order. */
static void check_sendrecv(mlx_distributed_group g, int grank, int dst, int src, mlx_dtype d,
                           size_t n, bool recv_first, bool like) {
  mlx_array x = make_input(d, grank, n, false);
  mlx_array sent = mlx_array_new(), got = mlx_array_new();
  mlx_stream s1 = g_streams[1], s2 = g_streams[2];
  int shape[1] = {(int)n};
  if (recv_first) {
    T_EQ_INT(like ? mlx_distributed_recv_like(&got, x, src, g, s2)
                  : mlx_distributed_recv(&got, shape, 1, d, src, g, s2),
             0);
    T_EQ_INT(mlx_distributed_send(&sent, x, dst, g, s1), 0);
  } else {
    T_EQ_INT(mlx_distributed_send(&sent, x, dst, g, s1), 0);
    T_EQ_INT(like ? mlx_distributed_recv_like(&got, x, src, g, s2)
                  : mlx_distributed_recv(&got, shape, 1, d, src, g, s2),
             0);
  }
  char what[128];
  snprintf(what, sizeof what, "send/recv %s n=%zu %d->%d<-%d", dt_name[d], n, src, grank, dst);
  expect_eval_ok(sent, what);
  expect_eval_ok(got, what);
  T_EQ_INT(mlx_array_dtype(got), d);
  T_EQ_INT(mlx_array_size(got), n);
  size_t isz = mlx_dtype_size(d);
  if (n) {
    T_ASSERT(memcmp(raw(sent), raw(x), n * isz) == 0);
    const unsigned char* gb = raw(got);
    unsigned char want[16];
    for (size_t i = 0; i < n; i++) {
      if (!checked(i, n)) continue;
      store(d, want, 0, gen(d, src, i, false));
      if (memcmp(gb + i * isz, want, isz) != 0) T_FAIL("%s: element %zu differs", what, i);
    }
  }
  mlx_array_free(sent);
  mlx_array_free(got);
  mlx_array_free(x);
}

/* MLXDIST_TEST_LIGHT=1 (scripts/test.sh sets it for the ThreadSanitizer run, where computing
 * the references is ~10x slower): sizes above 64 Ki elements for one dtype of each width
 * only; every dtype still runs every smaller size. */
static bool g_light;
static bool big_size_for(mlx_dtype d) {
  return !g_light || d == MLX_UINT8 || d == MLX_INT16 || d == MLX_FLOAT32 || d == MLX_INT64;
}

/* all_to_all: x (per * gsize elements) is cut into gsize parts; part j goes
 * to group rank j, and part i of the result is part grank of rank i's x. */
static void check_all_to_all(mlx_distributed_group g, const int* members, int gsize, int grank,
                             mlx_dtype d, size_t n) {
  size_t per = (n + (size_t)gsize - 1) / (size_t)gsize;
  size_t total = per * (size_t)gsize;
  mlx_array x = make_input(d, members[grank], total, false);
  mlx_array res = mlx_array_new();
  T_EQ_INT(mlx_distributed_all_to_all(&res, x, g, next_stream()), 0);
  char what[96];
  snprintf(what, sizeof what, "all_to_all %s n=%zu", dt_name[d], total);
  expect_eval_ok(res, what);
  T_EQ_INT(mlx_array_ndim(res), 1);
  T_EQ_INT(mlx_array_shape(res)[0], (long long)total);
  T_EQ_INT(mlx_array_dtype(res), d);
  size_t isz = mlx_dtype_size(d);
  const unsigned char* got = total ? raw(res) : NULL;
  unsigned char* want = malloc(isz + 1);
  for (int r = 0; r < gsize; r++)
    for (size_t i = 0; i < per; i++) {
      if (!checked(i, per)) continue;
      store(d, want, 0, gen(d, members[r], (size_t)grank * per + i, false));
      if (memcmp(got + ((size_t)r * per + i) * isz, want, isz) != 0)
        T_FAIL("%s: part from rank %d, element %zu differs", what, r, i);
    }
  free(want);
  mlx_array_free(res);
  mlx_array_free(x);
}

/* all_to_all on a 2-d array: parts are rows of axis 0 (2 rows of 3 per rank). */
static void check_all_to_all_2d(mlx_distributed_group g, int gsize, int grank) {
  int shape[2] = {2 * gsize, 3};
  int32_t buf[64 * 6];
  for (int i = 0; i < 2 * gsize * 3; i++) buf[i] = grank * 1000 + i;
  mlx_array x = mlx_array_new_data(buf, shape, 2, MLX_INT32);
  mlx_array res = mlx_array_new();
  T_EQ_INT(mlx_distributed_all_to_all(&res, x, g, next_stream()), 0);
  expect_eval_ok(res, "all_to_all 2-d");
  T_EQ_INT(mlx_array_ndim(res), 2);
  T_EQ_INT(mlx_array_shape(res)[0], 2 * gsize);
  T_EQ_INT(mlx_array_shape(res)[1], 3);
  const int32_t* got = mlx_array_data_int32(res);
  for (int r = 0; r < gsize; r++)
    for (int k = 0; k < 6; k++) T_EQ_INT(got[r * 6 + k], r * 1000 + grank * 6 + k);
  mlx_array_free(res);
  mlx_array_free(x);
}

static void run_all_dtypes(mlx_distributed_group g, const int* members, int gsize, int grank,
                           const size_t* sizes, int nsizes) {
  for (int d = 0; d < NDT; d++) {
    for (int k = 0; k < nsizes; k++) {
      size_t n = sizes[k];
      if (n > 65536 && !big_size_for((mlx_dtype)d)) continue;
      for (int op = 0; op < 3; op++)
        check_reduce(g, members, gsize, grank, (mlx_dtype)d, op, n, false);
      check_gather(g, members, gsize, grank, (mlx_dtype)d, n);
      check_scatter(g, members, gsize, grank, (mlx_dtype)d, n);
      check_all_to_all(g, members, gsize, grank, (mlx_dtype)d, n);
    }
    if (d >= MLX_FLOAT16) check_reduce(g, members, gsize, grank, (mlx_dtype)d, OP_SUM, 1024, true);
    phase(dt_name[d]);
  }
}

/* Big exchange: ranks 0 and 1 both send 64 MiB (light: 16 MiB, still far beyond any socket
 * or shared-memory buffering) first, then receive. */
static void check_big_exchange(mlx_distributed_group g, int rank) {
  if (rank > 1) return;
  int peer = 1 - rank;
  size_t n = ((g_light ? 16u : 64u) << 20) / 4;
  mlx_array x = make_input(MLX_UINT32, rank, n, false);
  mlx_array sent = mlx_array_new(), got = mlx_array_new();
  mlx_stream s = g_streams[1];
  T_EQ_INT(mlx_distributed_send(&sent, x, peer, g, s), 0);
  T_EQ_INT(mlx_distributed_recv_like(&got, x, peer, g, s), 0);
  expect_eval_ok(got, "64 MiB exchange");
  expect_eval_ok(sent, "64 MiB exchange");
  const uint32_t* gb = mlx_array_data_uint32(got);
  for (size_t i = 0; i < n; i += 4099) {
    val v = gen(MLX_UINT32, peer, i, false);
    if (gb[i] != (uint32_t)v.u) T_FAIL("64 MiB exchange: element %zu differs", i);
  }
  T_ASSERT(gb[n - 1] == (uint32_t)gen(MLX_UINT32, peer, n - 1, false).u);
  mlx_array_free(sent);
  mlx_array_free(got);
  mlx_array_free(x);
}

static void check_split(mlx_distributed_group g, int rank, int size) {
  /* by parity, parent order */
  mlx_distributed_group sub = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_group_split(&sub, g, rank % 2, -1), 0);
  int members[64], m = 0;
  for (int r = rank % 2; r < size; r += 2) members[m++] = r;
  int sr = -1, ss = -1;
  T_EQ_INT(mlx_distributed_group_get_rank(&sr, sub), 0);
  T_EQ_INT(mlx_distributed_group_get_size(&ss, sub), 0);
  T_EQ_INT(ss, m);
  T_EQ_INT(sr, rank / 2);
  const size_t sizes[] = {0, 7, 1024};
  for (int d = 0; d < NDT; d += 3) {
    for (int k = 0; k < 3; k++) {
      check_reduce(sub, members, m, sr, (mlx_dtype)d, OP_SUM, sizes[k], false);
      check_reduce(sub, members, m, sr, (mlx_dtype)d, OP_MAX, sizes[k], false);
      check_gather(sub, members, m, sr, (mlx_dtype)d, sizes[k]);
      check_scatter(sub, members, m, sr, (mlx_dtype)d, sizes[k]);
      check_all_to_all(sub, members, m, sr, (mlx_dtype)d, sizes[k]);
    }
  }
  if (m > 1) {
    /* send/recv inside the subgroup use subgroup ranks; inputs are keyed by subgroup rank */
    check_sendrecv(sub, sr, (sr + 1) % m, (sr + m - 1) % m, MLX_INT32, 1000, false, false);
  }
  /* split of a split: everyone alone */
  mlx_distributed_group solo = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_group_split(&solo, sub, sr, -1), 0);
  T_EQ_INT(mlx_distributed_group_size(solo), 1);
  T_EQ_INT(mlx_distributed_group_rank(solo), 0);
  {
    int one[1] = {rank}; /* a group of one: x unchanged */
    check_all_to_all(solo, one, 1, 0, MLX_INT16, 7);
    check_all_to_all_2d(solo, 1, 0);
  }
  mlx_distributed_group_free(solo);
  mlx_distributed_group_free(sub);

  /* one group, reversed keys: rank r becomes size-1-r */
  mlx_distributed_group rev = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_group_split(&rev, g, 7, size - rank), 0);
  T_EQ_INT(mlx_distributed_group_size(rev), size);
  T_EQ_INT(mlx_distributed_group_rank(rev), size - 1 - rank);
  int rmembers[64];
  for (int i = 0; i < size; i++) rmembers[i] = size - 1 - i;
  mlx_array me = mlx_array_new_int(rank);
  mlx_array all = mlx_array_new();
  T_EQ_INT(mlx_distributed_all_gather(&all, me, rev, next_stream()), 0);
  expect_eval_ok(all, "all_gather on reversed split");
  const int32_t* ar = mlx_array_data_int32(all);
  for (int i = 0; i < size; i++) T_EQ_INT(ar[i], size - 1 - i);
  check_reduce(rev, rmembers, size, size - 1 - rank, MLX_FLOAT32, OP_SUM, 1000, false);
  check_scatter(rev, rmembers, size, size - 1 - rank, MLX_INT64, 64);
  check_all_to_all(rev, rmembers, size, size - 1 - rank, MLX_FLOAT16, 4096);
  check_all_to_all_2d(rev, size, size - 1 - rank);
  mlx_array_free(all);
  mlx_array_free(me);
  mlx_distributed_group_free(rev);
}

static void check_errors(mlx_distributed_group g, int rank, int size) {
  mlx_array x = mlx_array_new_int(1);
  mlx_array r = mlx_array_new();
  t_clear_errors();
  T_ASSERT(mlx_distributed_send(&r, x, rank, g, g_streams[0]) != 0);
  T_EQ_INT(t_error_count(), 1);
  t_clear_errors();
  T_ASSERT(mlx_distributed_recv_like(&r, x, size, g, g_streams[0]) != 0);
  T_EQ_INT(t_error_count(), 1);
  t_clear_errors();
  if (size > 1) {
    int shape[1] = {size + 1};
    float buf[128] = {0};
    mlx_array y = mlx_array_new_data(buf, shape, 1, MLX_FLOAT32);
    T_ASSERT(mlx_distributed_sum_scatter(&r, y, g, g_streams[0]) != 0);
    T_EQ_INT(t_error_count(), 1);
    t_clear_errors();
    T_ASSERT(mlx_distributed_all_to_all(&r, y, g, g_streams[0]) != 0);
    T_EQ_INT(t_error_count(), 1);
    T_ASSERT(strstr(t_last_error(), "all_to_all") && strstr(t_last_error(), "group size"));
    t_clear_errors();
    mlx_array_free(y);
  }
  mlx_array_free(r);
  mlx_array_free(x);
}

/* init(bk), or with --all-gather DIR init_with_all_gather through DIR (a
 * fresh tag per init: the callback's rounds start again). */
static const char* g_gather_dir;
static int init_group(mlx_distributed_group* g, const char* bk) {
  if (!g_gather_dir) return mlx_distributed_init(g, true, bk);
  static shared_dir sd[2]; /* kept by the group until it is released */
  static int inits;
  T_ASSERT(inits < 2);
  shared_dir* d = &sd[inits];
  shared_dir_init(d, g_gather_dir, inits == 0 ? "init" : "reinit", 120.0);
  inits++;
  return mlx_distributed_init_with_all_gather(g, true, bk, shared_dir_all_gather, d, NULL);
}

int main(int argc, char** argv) {
  const char* bk = "any";
  bool big = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--big") == 0)
      big = true;
    else if (strcmp(argv[i], "--all-gather") == 0 && i + 1 < argc)
      g_gather_dir = argv[++i];
    else
      bk = argv[i];
  }
  t_capture_errors();
  g_light = t_env_int("MLXDIST_TEST_LIGHT", 0) == 1;
  /* keep freed buffers for reuse instead of returning them to the kernel after every op
   * (fresh pages cost a page fault each; this is speed only) */
  mallopt(M_MMAP_THRESHOLD, 512 << 20);
  mallopt(M_TRIM_THRESHOLD, 1024 << 20);
  g_streams[0] = mlx_stream_new();
  g_streams[1] = mlx_default_cpu_stream_new();
  mlx_device cpu = mlx_device_new_type(MLX_CPU, 0);
  g_streams[2] = mlx_stream_new_device(cpu);
  T_ASSERT(g_streams[1].ctx && g_streams[2].ctx);

  mlx_distributed_group g = mlx_distributed_group_new();
  if (init_group(&g, bk) != 0) T_FAIL("init(%s): %s", bk, t_last_error());
  T_EXPECT_NO_ERROR();
  int rank = -1, size = -1;
  T_EQ_INT(mlx_distributed_group_get_rank(&rank, g), 0);
  T_EQ_INT(mlx_distributed_group_get_size(&size, g), 0);
  T_ASSERT(size >= 1 && size <= 64 && rank >= 0 && rank < size);
  g_rank = rank;
  g_size = size;
  int env_rank = t_env_int("MLX_RANK", -1);
  if (env_rank >= 0 && strcmp(bk, "mpi") != 0) T_EQ_INT(rank, env_rank);

  /* init caching: a second init gives the same group */
  mlx_distributed_group g2 = mlx_distributed_group_new();
  T_EQ_INT(mlx_distributed_init(&g2, true, bk), 0);
  T_EQ_INT(mlx_distributed_group_rank(g2), rank);
  T_EQ_INT(mlx_distributed_group_size(g2), size);
  mlx_distributed_group_free(g2);

  int members[64];
  for (int i = 0; i < size; i++) members[i] = i;
  const size_t sizes[] = {0, 1, 7, 10, 1024, 1024 * 1024};
  phase("init");
  run_all_dtypes(g, members, size, rank, sizes, 6);
  phase("all dtypes");

  /* the null group is the default group (what init "any" gives) */
  {
    mlx_distributed_group null_group = mlx_distributed_group_new();
    check_reduce(null_group, members, size, rank, MLX_INT32, OP_SUM, 1000, false);
    check_gather(null_group, members, size, rank, MLX_FLOAT32, 33);
    check_all_to_all(null_group, members, size, rank, MLX_INT32, 33);
    check_all_to_all_2d(null_group, size, rank);
  }

  if (size > 1) {
    for (int d = 0; d < NDT; d++) {
      for (int k = 0; k < 6; k++) {
        if (sizes[k] > 65536 && !big_size_for((mlx_dtype)d)) continue;
        /* neighbour, both orders; recv_like on alternate sizes */
        check_sendrecv(g, rank, (rank + 1) % size, (rank + size - 1) % size, (mlx_dtype)d, sizes[k],
                       k % 2 == 1, k % 3 == 2);
      }
      /* non-neighbour: distance 2 (or 1 when size == 2), reversed direction */
      int dist = size > 2 ? 2 : 1;
      check_sendrecv(g, rank, (rank + size - dist) % size, (rank + dist) % size, (mlx_dtype)d, 10,
                     d % 2 == 0, false);
    }
    phase("send/recv");
    check_big_exchange(g, rank);
    phase("64 MiB exchange");
  }
  check_errors(g, rank, size);
  check_split(g, rank, size);
  phase("split");

  if (big) {
    size_t n = (64u << 20) / 4 + 4097; /* > 64 MiB of float32 */
    check_reduce(g, members, size, rank, MLX_FLOAT32, OP_SUM, n, false);
  }

  phase("big");
  /* clear_backends and init again in the same process */
  mlx_distributed_group_free(g);
  T_EQ_INT(mlx_distributed_clear_backends(), 0);
  g = mlx_distributed_group_new();
  if (init_group(&g, bk) != 0) T_FAIL("re-init(%s): %s", bk, t_last_error());
  T_EQ_INT(mlx_distributed_group_rank(g), rank);
  T_EQ_INT(mlx_distributed_group_size(g), size);
  check_reduce(g, members, size, rank, MLX_FLOAT32, OP_SUM, 4096, false);
  check_reduce(g, members, size, rank, MLX_INT64, OP_MIN, 100, false);
  mlx_distributed_group_free(g);
  T_EQ_INT(mlx_distributed_clear_backends(), 0);
  phase("re-init");

  mlx_array_free(g_input_cache.a);
  for (int i = 0; i < 3; i++) mlx_stream_free(g_streams[i]);
  mlx_device_free(cpu);
  T_EXPECT_NO_ERROR();
  printf("test_collectives: rank %d of %d (%s): all checks passed\n", rank, size, bk);
  return 0;
}
