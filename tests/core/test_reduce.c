/* Reduction kernels: every op x dtype against scalar reference code written
 * here (wide arithmetic, explicit modular wrap, a rint/frexp-based 16-bit
 * rounding), every aliasing form, odd lengths, NaN, bool, complex order. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "reduce/reduce.h"
#include "testutil.h"

/* ---------- reference 16-bit float model ---------- */

typedef struct fmt16 {
  int mant_bits; /* explicit mantissa bits */
  int exp_bits;
  int bias;
} fmt16;
static const fmt16 F16 = {10, 5, 15};
static const fmt16 BF16 = {7, 8, 127};

/* value of a bit pattern */
static double ref_decode(fmt16 f, uint16_t h) {
  int sign = h >> 15;
  int e = (h >> f.mant_bits) & ((1 << f.exp_bits) - 1);
  int m = h & ((1 << f.mant_bits) - 1);
  double v;
  if (e == (1 << f.exp_bits) - 1)
    v = m ? NAN : INFINITY;
  else if (e == 0)
    v = ldexp((double)m, 1 - f.bias - f.mant_bits);
  else
    v = ldexp(1.0 + ldexp((double)m, -f.mant_bits), e - f.bias);
  return sign ? -v : v;
}

/* x rounded to the nearest representable value, ties to even (rint). */
static double ref_round(fmt16 f, double x) {
  if (x == 0 || isnan(x) || isinf(x)) return x;
  int e;
  frexp(x, &e);
  int lead = e - 1;
  int emin = 1 - f.bias;
  if (lead < emin) lead = emin;
  double q = ldexp(1.0, lead - f.mant_bits);
  double r = rint(x / q) * q;
  int emax = (1 << f.exp_bits) - 2 - f.bias;
  double maxv = ldexp(2.0 - ldexp(1.0, -f.mant_bits), emax);
  if (fabs(r) > maxv) return x < 0 ? -INFINITY : INFINITY;
  return r;
}

static bool same_value(double a, double b) {
  if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
  return a == b;
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return g_rng;
}

static void test_conversions(void) {
  /* every 16-bit pattern decodes as the reference says and round-trips */
  for (uint32_t h = 0; h < 65536; h++) {
    double rf = ref_decode(F16, (uint16_t)h), rb = ref_decode(BF16, (uint16_t)h);
    float lf = mlxd_f16_to_f32((uint16_t)h), lb = mlxd_bf16_to_f32((uint16_t)h);
    if (!same_value(lf, rf)) T_FAIL("f16 0x%04x: got %g want %g", h, (double)lf, rf);
    if (!same_value(lb, rb)) T_FAIL("bf16 0x%04x: got %g want %g", h, (double)lb, rb);
    if (!isnan(rf)) T_EQ_INT(mlxd_f32_to_f16(lf), h);
    if (!isnan(rb)) T_EQ_INT(mlxd_f32_to_bf16(lb), h);
    if (isnan(rf)) T_ASSERT(isnan(mlxd_f16_to_f32(mlxd_f32_to_f16(lf))));
    if (isnan(rb)) T_ASSERT(isnan(mlxd_bf16_to_f32(mlxd_f32_to_bf16(lb))));
  }
  /* chosen values: ties, overflow, subnormals, signs */
  const float chosen[] = {1.0f,
                          1.0f + 0x1p-11f,
                          1.0f + 3 * 0x1p-11f,
                          1.0f + 0x1p-8f,
                          1.0f + 3 * 0x1p-8f,
                          65504.0f,
                          65519.99f,
                          65520.0f,
                          65536.0f,
                          0x1p-24f,
                          0x1p-25f,
                          1.5f * 0x1p-25f,
                          0x1p-14f,
                          0x1.ffcp-15f,
                          -0.0f,
                          -2.5f,
                          1e-30f,
                          FLT_MAX,
                          -FLT_MAX,
                          3.14159265f,
                          0x1p-130f,
                          0x1.fffffep127f,
                          INFINITY,
                          -INFINITY};
  for (size_t i = 0; i < sizeof chosen / sizeof chosen[0]; i++) {
    float x = chosen[i];
    double wf = ref_round(F16, x), wb = ref_round(BF16, x);
    double gf = ref_decode(F16, mlxd_f32_to_f16(x)), gb = ref_decode(BF16, mlxd_f32_to_bf16(x));
    if (!same_value(gf, wf)) T_FAIL("f32->f16(%a): got %a want %a", (double)x, gf, wf);
    if (!same_value(gb, wb)) T_FAIL("f32->bf16(%a): got %a want %a", (double)x, gb, wb);
  }
  T_EQ_INT(mlxd_f32_to_f16(-0.0f), 0x8000);
  T_EQ_INT(mlxd_f32_to_f16(65520.0f), 0x7c00); /* tie rounds to even: infinity */
  T_EQ_INT(mlxd_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
  T_ASSERT(isnan(mlxd_f16_to_f32(mlxd_f32_to_f16(NAN))));
  T_ASSERT(isnan(mlxd_bf16_to_f32(mlxd_f32_to_bf16(-NAN))));
  /* random floats of every magnitude */
  for (int i = 0; i < 200000; i++) {
    uint32_t u = (uint32_t)rnd();
    float x;
    memcpy(&x, &u, sizeof x);
    if (isnan(x)) continue;
    double wf = ref_round(F16, x), wb = ref_round(BF16, x);
    double gf = ref_decode(F16, mlxd_f32_to_f16(x)), gb = ref_decode(BF16, mlxd_f32_to_bf16(x));
    if (!same_value(gf, wf)) T_FAIL("f32->f16(%a): got %a want %a", (double)x, gf, wf);
    if (!same_value(gb, wb)) T_FAIL("f32->bf16(%a): got %a want %a", (double)x, gb, wb);
  }
}

/* ---------- reference element operations ---------- */

static int64_t wrap_signed(int64_t v, int bits) {
  int64_t m = (int64_t)1 << bits;
  int64_t r = ((v % m) + m) % m;
  return r >= m / 2 ? r - m : r;
}

/* out = a OP b for one element of dtype */
static void ref_op(mlxd_reduce_op op, mlx_dtype dt, const void* a, const void* b, void* out) {
#define SIGNED_CASE(T, BITS)                             \
  {                                                      \
    T x, y, r;                                           \
    memcpy(&x, a, sizeof x);                             \
    memcpy(&y, b, sizeof y);                             \
    if (op == MLXD_SUM)                                  \
      r = (T)wrap_signed((int64_t)x + (int64_t)y, BITS); \
    else                                                 \
      r = (op == MLXD_MAX) == (x > y) ? x : y;           \
    memcpy(out, &r, sizeof r);                           \
    return;                                              \
  }
#define UNSIGNED_CASE(T, MASK)                       \
  {                                                  \
    T x, y, r;                                       \
    memcpy(&x, a, sizeof x);                         \
    memcpy(&y, b, sizeof y);                         \
    if (op == MLXD_SUM)                              \
      r = (T)(((uint64_t)x + (uint64_t)y) & (MASK)); \
    else                                             \
      r = (op == MLXD_MAX) == (x > y) ? x : y;       \
    memcpy(out, &r, sizeof r);                       \
    return;                                          \
  }
  switch (dt) {
    case MLX_BOOL: {
      uint8_t x = *(const uint8_t*)a != 0, y = *(const uint8_t*)b != 0;
      *(uint8_t*)out = op == MLXD_MIN ? (x && y) : (x || y);
      return;
    }
    case MLX_UINT8: UNSIGNED_CASE(uint8_t, 0xffu)
    case MLX_UINT16: UNSIGNED_CASE(uint16_t, 0xffffu)
    case MLX_UINT32: UNSIGNED_CASE(uint32_t, 0xffffffffu)
    case MLX_UINT64: UNSIGNED_CASE(uint64_t, UINT64_MAX)
    case MLX_INT8: SIGNED_CASE(int8_t, 8)
    case MLX_INT16: SIGNED_CASE(int16_t, 16)
    case MLX_INT32: SIGNED_CASE(int32_t, 32)
    case MLX_INT64: {
      int64_t x, y, r;
      memcpy(&x, a, 8);
      memcpy(&y, b, 8);
      if (op == MLXD_SUM) {
        uint64_t s = (uint64_t)x + (uint64_t)y; /* two's complement: same bits */
        memcpy(&r, &s, 8);
      } else {
        r = (op == MLXD_MAX) == (x > y) ? x : y;
      }
      memcpy(out, &r, 8);
      return;
    }
    case MLX_FLOAT32:
    case MLX_FLOAT64: {
      double x, y, r;
      if (dt == MLX_FLOAT32) {
        float fx, fy;
        memcpy(&fx, a, 4);
        memcpy(&fy, b, 4);
        x = fx;
        y = fy;
      } else {
        memcpy(&x, a, 8);
        memcpy(&y, b, 8);
      }
      if (isnan(x) || isnan(y))
        r = NAN;
      else if (op == MLXD_SUM)
        r = dt == MLX_FLOAT32 ? (double)((float)x + (float)y) : x + y;
      else
        r = op == MLXD_MAX ? fmax(x, y) : fmin(x, y);
      if (dt == MLX_FLOAT32) {
        float fr = (float)r;
        memcpy(out, &fr, 4);
      } else {
        memcpy(out, &r, 8);
      }
      return;
    }
    case MLX_FLOAT16:
    case MLX_BFLOAT16: {
      fmt16 f = dt == MLX_FLOAT16 ? F16 : BF16;
      uint16_t hx, hy;
      memcpy(&hx, a, 2);
      memcpy(&hy, b, 2);
      double x = ref_decode(f, hx), y = ref_decode(f, hy);
      uint16_t r;
      if (isnan(x))
        r = hx;
      else if (isnan(y))
        r = hy;
      else if (op == MLXD_SUM) {
        double s = ref_round(f, (double)((float)x + (float)y));
        /* encode by search: the pattern whose value is s (finite or inf) */
        r = 0;
        for (uint32_t c = 0; c < 65536; c++)
          if (ref_decode(f, (uint16_t)c) == s &&
              (s != 0 || ((c >> 15) == (signbit(s) ? 1u : 0u)))) {
            r = (uint16_t)c;
            break;
          }
      } else {
        r = (op == MLXD_MAX) == (x > y) ? hx : hy;
      }
      memcpy(out, &r, 2);
      return;
    }
    case MLX_COMPLEX64: {
      float x[2], y[2], r[2];
      memcpy(x, a, 8);
      memcpy(y, b, 8);
      if (op == MLXD_SUM) {
        r[0] = x[0] + y[0];
        r[1] = x[1] + y[1];
      } else {
        bool xnan = isnan(x[0]) || isnan(x[1]), ynan = isnan(y[0]) || isnan(y[1]);
        bool x_gt = x[0] > y[0] || (x[0] == y[0] && x[1] > y[1]);
        bool x_lt = x[0] < y[0] || (x[0] == y[0] && x[1] < y[1]);
        const float* pick = xnan ? x : ynan ? y : (op == MLXD_MAX ? x_gt : x_lt) ? x : y;
        r[0] = pick[0];
        r[1] = pick[1];
      }
      memcpy(out, r, 8);
      return;
    }
  }
}

/* element equality for the dtype (NaN equals NaN, +0 equals -0) */
static bool elem_eq(mlx_dtype dt, const void* a, const void* b) {
  switch (dt) {
    case MLX_FLOAT32: {
      float x, y;
      memcpy(&x, a, 4);
      memcpy(&y, b, 4);
      return same_value(x, y);
    }
    case MLX_FLOAT64: {
      double x, y;
      memcpy(&x, a, 8);
      memcpy(&y, b, 8);
      return same_value(x, y);
    }
    case MLX_COMPLEX64: {
      float x[2], y[2];
      memcpy(x, a, 8);
      memcpy(y, b, 8);
      return same_value(x[0], y[0]) && same_value(x[1], y[1]);
    }
    case MLX_FLOAT16:
    case MLX_BFLOAT16: {
      uint16_t x, y;
      memcpy(&x, a, 2);
      memcpy(&y, b, 2);
      fmt16 f = dt == MLX_FLOAT16 ? F16 : BF16;
      return same_value(ref_decode(f, x), ref_decode(f, y));
    }
    case MLX_BOOL: return (*(const uint8_t*)a != 0) == (*(const uint8_t*)b != 0);
    default: return memcmp(a, b, mlx_dtype_size(dt)) == 0;
  }
}

static size_t dsize(mlx_dtype dt) {
  static const size_t s[] = {1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 4, 8, 2, 8};
  return s[dt];
}

/* random element with a share of special values */
static void rand_elem(mlx_dtype dt, void* out) {
  uint64_t r = rnd();
  size_t n = dsize(dt);
  unsigned kind = (unsigned)(rnd() % 16);
  switch (dt) {
    case MLX_BOOL: *(uint8_t*)out = (uint8_t)(r & 1); return;
    case MLX_FLOAT32: {
      float f = kind == 0   ? NAN
                : kind == 1 ? INFINITY
                : kind == 2 ? -0.0f
                : kind < 8  ? (float)((int64_t)(r % 2001) - 1000) * 0.25f
                            : (float)((double)(int64_t)r * 0x1p-40);
      memcpy(out, &f, 4);
      return;
    }
    case MLX_FLOAT64: {
      double f = kind == 0   ? NAN
                 : kind == 1 ? -INFINITY
                 : kind < 8  ? (double)((int64_t)(r % 2001) - 1000) * 0.25
                             : (double)(int64_t)r * 0x1p-50;
      memcpy(out, &f, 8);
      return;
    }
    case MLX_COMPLEX64: {
      float c[2] = {(float)(r % 5) - 2.0f, (float)((r >> 8) % 5) - 2.0f};
      if (kind == 0) c[1] = NAN;
      memcpy(out, c, 8);
      return;
    }
    case MLX_FLOAT16:
    case MLX_BFLOAT16: {
      uint16_t h = (uint16_t)r;
      if (kind < 4) h = (uint16_t)(dt == MLX_FLOAT16 ? 0x3c00 + (r % 64) : 0x3f80 + (r % 64));
      memcpy(out, &h, 2);
      return;
    }
    default:
      if (kind == 0) r = 0;
      if (kind == 1) r = UINT64_MAX;                       /* -1 / max */
      if (kind == 2) r = (uint64_t)1 << (8 * n - 1);       /* INT_MIN */
      if (kind == 3) r = ((uint64_t)1 << (8 * n - 1)) - 1; /* INT_MAX */
      memcpy(out, &r, n);
      return;
  }
}

static void check_case(mlxd_reduce_op op, mlx_dtype dt, size_t count) {
  size_t es = dsize(dt);
  size_t nb = count * es + 1;
  unsigned char* a = malloc(nb);
  unsigned char* b = malloc(nb);
  unsigned char* want = malloc(nb);
  unsigned char* out = malloc(nb);
  unsigned char* acc = malloc(nb);
  for (size_t i = 0; i < count; i++) {
    rand_elem(dt, a + i * es);
    rand_elem(dt, b + i * es);
    ref_op(op, dt, a + i * es, b + i * es, want + i * es);
  }
#define CHECK_ALL(BUF, WHAT)                                                                    \
  for (size_t i = 0; i < count; i++)                                                            \
    if (!elem_eq(dt, (BUF) + i * es, want + i * es))                                            \
      T_FAIL("%s %s %s: element %zu of %zu differs", mlxd_reduce_op_name(op), "dtype", WHAT, i, \
             count);
  /* acc = acc OP in */
  memcpy(acc, a, count * es);
  mlxd_reduce(op, dt, acc, b, count);
  CHECK_ALL(acc, "reduce");
  /* out = a OP b, distinct */
  mlxd_reduce3(op, dt, out, a, b, count);
  CHECK_ALL(out, "reduce3");
  /* out == a */
  memcpy(acc, a, count * es);
  mlxd_reduce3(op, dt, acc, acc, b, count);
  CHECK_ALL(acc, "reduce3 out==a");
  /* out == b */
  memcpy(acc, b, count * es);
  mlxd_reduce3(op, dt, acc, a, acc, count);
  CHECK_ALL(acc, "reduce3 out==b");
  /* acc == in: x OP x */
  for (size_t i = 0; i < count; i++) ref_op(op, dt, a + i * es, a + i * es, want + i * es);
  memcpy(acc, a, count * es);
  mlxd_reduce(op, dt, acc, acc, count);
  CHECK_ALL(acc, "reduce acc==in");
  memcpy(acc, a, count * es);
  mlxd_reduce3(op, dt, acc, acc, acc, count);
  CHECK_ALL(acc, "reduce3 all equal");
  mlxd_reduce3(op, dt, out, a, a, count);
  CHECK_ALL(out, "reduce3 a==b");
  free(a);
  free(b);
  free(want);
  free(out);
  free(acc);
}

static void test_all_ops_dtypes(void) {
  const size_t counts[] = {1, 3, 7, 16, 33, 257, 1000};
  for (int op = MLXD_SUM; op <= MLXD_MIN; op++)
    for (int dt = MLX_BOOL; dt <= MLX_COMPLEX64; dt++) {
      size_t nc = (dt == MLX_FLOAT16 || dt == MLX_BFLOAT16) && op == MLXD_SUM ? 5 : 7;
      for (size_t c = 0; c < nc; c++) check_case((mlxd_reduce_op)op, (mlx_dtype)dt, counts[c]);
    }
}

/* hand-picked cases stated by the rules */
static void test_rules(void) {
  /* bool: sum/max or, min and; non-canonical true bytes count as true */
  uint8_t ba[4] = {0, 0, 1, 2}, bb[4] = {0, 1, 0, 1}, bo[4];
  mlxd_reduce3(MLXD_SUM, MLX_BOOL, bo, ba, bb, 4);
  T_ASSERT(bo[0] == 0 && bo[1] == 1 && bo[2] == 1 && bo[3] == 1);
  mlxd_reduce3(MLXD_MIN, MLX_BOOL, bo, ba, bb, 4);
  T_ASSERT(bo[0] == 0 && bo[1] == 0 && bo[2] == 0 && bo[3] == 1);
  /* integers wrap */
  int8_t i8a = 127, i8b = 1;
  mlxd_reduce(MLXD_SUM, MLX_INT8, &i8a, &i8b, 1);
  T_EQ_INT(i8a, -128);
  int64_t i64a = INT64_MAX, i64b = 2;
  mlxd_reduce(MLXD_SUM, MLX_INT64, &i64a, &i64b, 1);
  T_ASSERT(i64a == INT64_MIN + 1);
  uint32_t ua = 0xffffffffu, ub = 3;
  mlxd_reduce(MLXD_SUM, MLX_UINT32, &ua, &ub, 1);
  T_EQ_INT(ua, 2);
  /* NaN propagates through max/min and sum, either side */
  float fa[2] = {NAN, 1.0f}, fb[2] = {5.0f, NAN}, fo[2];
  for (int op = MLXD_SUM; op <= MLXD_MIN; op++) {
    mlxd_reduce3((mlxd_reduce_op)op, MLX_FLOAT32, fo, fa, fb, 2);
    T_ASSERT(isnan(fo[0]) && isnan(fo[1]));
  }
  double da[2] = {1.0, NAN}, db[2] = {NAN, NAN}, dout[2];
  mlxd_reduce3(MLXD_MAX, MLX_FLOAT64, dout, da, db, 2);
  T_ASSERT(isnan(dout[0]) && isnan(dout[1]));
  uint16_t ha = 0x7e00, hb = 0x3c00; /* f16 NaN, 1 */
  mlxd_reduce(MLXD_MIN, MLX_FLOAT16, &hb, &ha, 1);
  T_ASSERT(isnan(mlxd_f16_to_f32(hb)));
  /* complex order: real first, then imaginary */
  float ca[4] = {1, 5, 2, -1}, cb[4] = {1, 6, 1, 100}, co[4];
  mlxd_reduce3(MLXD_MAX, MLX_COMPLEX64, co, ca, cb, 2);
  T_ASSERT(co[0] == 1 && co[1] == 6 && co[2] == 2 && co[3] == -1);
  mlxd_reduce3(MLXD_MIN, MLX_COMPLEX64, co, ca, cb, 2);
  T_ASSERT(co[0] == 1 && co[1] == 5 && co[2] == 1 && co[3] == 100);
  mlxd_reduce3(MLXD_SUM, MLX_COMPLEX64, co, ca, cb, 2);
  T_ASSERT(co[0] == 2 && co[1] == 11 && co[2] == 3 && co[3] == 99);
  /* f16 pairwise rounding: 2048 + 1 is not representable -> ties to even (2048) */
  uint16_t h2048 = mlxd_f32_to_f16(2048.0f), h1 = mlxd_f32_to_f16(1.0f), h3 = mlxd_f32_to_f16(3.0f);
  uint16_t acc16 = h2048;
  mlxd_reduce(MLXD_SUM, MLX_FLOAT16, &acc16, &h1, 1);
  T_ASSERT(mlxd_f16_to_f32(acc16) == 2048.0f);
  acc16 = h2048;
  mlxd_reduce(MLXD_SUM, MLX_FLOAT16, &acc16, &h3, 1);
  T_ASSERT(mlxd_f16_to_f32(acc16) == 2052.0f); /* 2051 -> nearest even multiple of 2: 2052 */
  uint16_t big = 0x7bff;                       /* 65504 + 65504 overflows to inf */
  acc16 = big;
  mlxd_reduce(MLXD_SUM, MLX_FLOAT16, &acc16, &big, 1);
  T_EQ_INT(acc16, 0x7c00);
  uint16_t b256 = mlxd_f32_to_bf16(256.0f), b1 = mlxd_f32_to_bf16(1.0f);
  mlxd_reduce(MLXD_SUM, MLX_BFLOAT16, &b256, &b1, 1);
  T_ASSERT(mlxd_bf16_to_f32(b256) == 256.0f);
  /* unknown op / dtype: no-op */
  int32_t x[2] = {1, 2}, y[2] = {3, 4};
  mlxd_reduce((mlxd_reduce_op)7, MLX_INT32, x, y, 2);
  mlxd_reduce(MLXD_SUM, (mlx_dtype)42, x, y, 2);
  mlxd_reduce3(MLXD_SUM, (mlx_dtype)-1, x, x, y, 2);
  T_ASSERT(x[0] == 1 && x[1] == 2);
  mlxd_reduce(MLXD_SUM, MLX_INT32, x, y, 0);
  T_ASSERT(x[0] == 1);
  T_ASSERT(strcmp(mlxd_reduce_op_name(MLXD_SUM), "sum") == 0);
  T_ASSERT(strcmp(mlxd_reduce_op_name(MLXD_MAX), "max") == 0);
  T_ASSERT(strcmp(mlxd_reduce_op_name(MLXD_MIN), "min") == 0);
}

int main(void) {
  test_conversions();
  test_rules();
  test_all_ops_dtypes();
  printf("test_reduce: OK\n");
  return 0;
}
