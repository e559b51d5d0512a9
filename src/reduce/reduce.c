/* Elementwise reduction kernels: acc = acc OP in, out = a OP b.
 *
 * One plain loop per (op, dtype, aliasing form) over restrict pointers, so
 * that the compiler vectorises them at -O3 (see CMakeLists.txt).
 *
 * Rules (also in reduce.h):
 *  - bool: sum and max are logical or, min is logical and (results are 0/1).
 *  - integers wrap around (signed sums are done in unsigned arithmetic).
 *  - float32/float64 max/min propagate NaN as MLX does: if either operand is
 *    NaN the result is NaN (the first operand's NaN if both are).
 *  - float16/bfloat16: every pairwise operation is done in float32 and the
 *    result rounded back to 16 bits, round-to-nearest-even (so a sum over
 *    ranks is a chain of such pairwise roundings). max/min return one of the
 *    operands unchanged; NaN propagates as for float32.
 *  - complex64: sum adds the real and imaginary parts; max/min order values
 *    by real part, then imaginary part; a NaN in either part of an operand
 *    propagates that operand.
 * The conversions below are pure bit manipulation (no _Float16 needed). */
#include "reduce/reduce.h"

#include <string.h>

/* ---------- 16-bit float conversions ---------- */

static inline uint32_t f2u(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
static inline float u2f(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Written as selects rather than branches so that loops over them vectorise. */
static inline float h2f(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t em = h & 0x7fffu;                      /* exponent and mantissa */
  uint32_t nrm = (em << 13) + (112u << 23);       /* rebias 15 -> 127 */
  nrm = em >= 0x7c00u ? nrm + (112u << 23) : nrm; /* inf / NaN: exponent 255, payload kept */
  float sub = (float)(int32_t)em * 0x1p-24f;      /* zero / subnormal: exact */
  return u2f((em < 0x400u ? f2u(sub) : nrm) | sign);
}

static inline uint16_t f2h(float f) {
  uint32_t x = f2u(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t ax = x & 0x7fffffffu;
  /* normal range: drop 13 mantissa bits, round to nearest even (a carry may
   * reach the exponent, up to infinity: correct) */
  uint32_t hn = (ax >> 13) - (112u << 10);
  uint32_t rem = ax & 0x1fffu;
  hn += (uint32_t)(rem > 0x1000u) | ((uint32_t)(rem == 0x1000u) & hn & 1u);
  /* below 2^-14: adding 0.5 makes the FPU round to a multiple of 2^-24
   * (ties to even); the low bits are then the subnormal's mantissa */
  uint32_t hs = f2u(u2f(ax) + 0.5f) - f2u(0.5f);
  /* >= 65536, inf, NaN (kept quiet, top payload bits kept) */
  uint32_t hi = ax > 0x7f800000u ? (0x7e00u | ((ax >> 13) & 0x3ffu)) : 0x7c00u;
  uint32_t h = ax >= 0x47800000u ? hi : ax < 0x38800000u ? hs : hn;
  return (uint16_t)(sign | h);
}

static inline float b2f(uint16_t h) { return u2f((uint32_t)h << 16); }

static inline uint16_t f2b(float f) {
  uint32_t x = f2u(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x0040u); /* quiet NaN */
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

float mlxd_f16_to_f32(uint16_t h) { return h2f(h); }
uint16_t mlxd_f32_to_f16(float f) { return f2h(f); }
float mlxd_bf16_to_f32(uint16_t h) { return b2f(h); }
uint16_t mlxd_f32_to_bf16(float f) { return f2b(f); }

const char* mlxd_reduce_op_name(mlxd_reduce_op op) {
  switch (op) {
    case MLXD_SUM: return "sum";
    case MLXD_MAX: return "max";
    case MLXD_MIN: return "min";
  }
  return "unknown";
}

/* ---------- element operations: x OP y ---------- */

typedef struct c64 {
  float re, im;
} c64;

#define OP_OR(x, y) ((uint8_t)(((x) | (y)) != 0))
#define OP_AND(x, y) ((uint8_t)(((x) != 0) & ((y) != 0)))
#define OP_ADD(x, y) ((x) + (y))
#define OP_UADD(U, T, x, y) ((T)((U)(x) + (U)(y)))
#define OP_MAX(x, y) ((x) > (y) ? (x) : (y))
#define OP_MIN(x, y) ((x) < (y) ? (x) : (y))
/* NaN-propagating float max/min */
#define OP_FMAX(x, y) ((x) != (x) ? (x) : (y) != (y) ? (y) : (x) > (y) ? (x) : (y))
#define OP_FMIN(x, y) ((x) != (x) ? (x) : (y) != (y) ? (y) : (x) < (y) ? (x) : (y))

static inline uint16_t h_add(uint16_t x, uint16_t y) { return f2h(h2f(x) + h2f(y)); }
static inline uint16_t h_max(uint16_t x, uint16_t y) {
  float a = h2f(x), b = h2f(y);
  return a != a ? x : b != b ? y : a > b ? x : y;
}
static inline uint16_t h_min(uint16_t x, uint16_t y) {
  float a = h2f(x), b = h2f(y);
  return a != a ? x : b != b ? y : a < b ? x : y;
}
static inline uint16_t b_add(uint16_t x, uint16_t y) { return f2b(b2f(x) + b2f(y)); }
static inline uint16_t b_max(uint16_t x, uint16_t y) {
  float a = b2f(x), b = b2f(y);
  return a != a ? x : b != b ? y : a > b ? x : y;
}
static inline uint16_t b_min(uint16_t x, uint16_t y) {
  float a = b2f(x), b = b2f(y);
  return a != a ? x : b != b ? y : a < b ? x : y;
}
static inline int c_nan(c64 v) { return v.re != v.re || v.im != v.im; }
static inline c64 c_max(c64 x, c64 y) {
  if (c_nan(x)) return x;
  if (c_nan(y)) return y;
  return (x.re > y.re || (x.re == y.re && x.im > y.im)) ? x : y;
}
static inline c64 c_min(c64 x, c64 y) {
  if (c_nan(x)) return x;
  if (c_nan(y)) return y;
  return (x.re < y.re || (x.re == y.re && x.im < y.im)) ? x : y;
}

/* ---------- kernels ---------- */

/* Four loops per (op, type):
 *   _2  acc = acc OP in      (acc, in distinct)
 *   _2r acc = in OP acc      (acc, in distinct; for out == b)
 *   _3  out = a OP b         (out distinct from a and b; a may equal b)
 *   _g  out = a OP b         (any exact aliasing) */
#define KERNELS(NAME, T, EXPR)                                                          \
  static void NAME##_2(void* restrict accv, const void* restrict inv, size_t n) {       \
    T* restrict acc = accv;                                                             \
    const T* restrict in = inv;                                                         \
    for (size_t i = 0; i < n; i++) {                                                    \
      T x = acc[i], y = in[i];                                                          \
      acc[i] = EXPR;                                                                    \
    }                                                                                   \
  }                                                                                     \
  static void NAME##_2r(void* restrict accv, const void* restrict inv, size_t n) {      \
    T* restrict acc = accv;                                                             \
    const T* restrict in = inv;                                                         \
    for (size_t i = 0; i < n; i++) {                                                    \
      T x = in[i], y = acc[i];                                                          \
      acc[i] = EXPR;                                                                    \
    }                                                                                   \
  }                                                                                     \
  static void NAME##_3(void* restrict outv, const void* av, const void* bv, size_t n) { \
    T* restrict out = outv;                                                             \
    const T* a = av;                                                                    \
    const T* b = bv;                                                                    \
    for (size_t i = 0; i < n; i++) {                                                    \
      T x = a[i], y = b[i];                                                             \
      out[i] = EXPR;                                                                    \
    }                                                                                   \
  }                                                                                     \
  static void NAME##_g(void* outv, const void* av, const void* bv, size_t n) {          \
    T* out = outv;                                                                      \
    const T* a = av;                                                                    \
    const T* b = bv;                                                                    \
    for (size_t i = 0; i < n; i++) {                                                    \
      T x = a[i], y = b[i];                                                             \
      out[i] = EXPR;                                                                    \
    }                                                                                   \
  }

KERNELS(or_b, uint8_t, OP_OR(x, y))
KERNELS(and_b, uint8_t, OP_AND(x, y))

KERNELS(sum_u8, uint8_t, (uint8_t)(x + y))
KERNELS(sum_u16, uint16_t, (uint16_t)(x + y))
KERNELS(sum_u32, uint32_t, x + y)
KERNELS(sum_u64, uint64_t, x + y)
KERNELS(sum_i8, int8_t, OP_UADD(uint8_t, int8_t, x, y))
KERNELS(sum_i16, int16_t, OP_UADD(uint16_t, int16_t, x, y))
KERNELS(sum_i32, int32_t, OP_UADD(uint32_t, int32_t, x, y))
KERNELS(sum_i64, int64_t, OP_UADD(uint64_t, int64_t, x, y))
KERNELS(sum_f32, float, x + y)
KERNELS(sum_f64, double, x + y)
KERNELS(sum_f16, uint16_t, h_add(x, y))
KERNELS(sum_bf16, uint16_t, b_add(x, y))

#define MINMAX(TAG, T)                \
  KERNELS(max_##TAG, T, OP_MAX(x, y)) \
  KERNELS(min_##TAG, T, OP_MIN(x, y))
MINMAX(u8, uint8_t)
MINMAX(u16, uint16_t)
MINMAX(u32, uint32_t)
MINMAX(u64, uint64_t)
MINMAX(i8, int8_t)
MINMAX(i16, int16_t)
MINMAX(i32, int32_t)
MINMAX(i64, int64_t)
KERNELS(max_f32, float, OP_FMAX(x, y))
KERNELS(min_f32, float, OP_FMIN(x, y))
KERNELS(max_f64, double, OP_FMAX(x, y))
KERNELS(min_f64, double, OP_FMIN(x, y))
KERNELS(max_f16, uint16_t, h_max(x, y))
KERNELS(min_f16, uint16_t, h_min(x, y))
KERNELS(max_bf16, uint16_t, b_max(x, y))
KERNELS(min_bf16, uint16_t, b_min(x, y))
KERNELS(max_c64, c64, c_max(x, y))
KERNELS(min_c64, c64, c_min(x, y))

typedef struct kernel {
  void (*k2)(void* restrict, const void* restrict, size_t);
  void (*k2r)(void* restrict, const void* restrict, size_t);
  void (*k3)(void* restrict, const void*, const void*, size_t);
  void (*kg)(void*, const void*, const void*, size_t);
  size_t scale; /* elements of the kernel's type per array element */
} kernel;

#define K(NAME, SCALE) \
  { NAME##_2, NAME##_2r, NAME##_3, NAME##_g, SCALE }
#define NDT 14

static const kernel k_table[3][NDT] =
    {
        [MLXD_SUM] =
            {
                [MLX_BOOL] = K(or_b, 1),
                [MLX_UINT8] = K(sum_u8, 1),
                [MLX_UINT16] = K(sum_u16, 1),
                [MLX_UINT32] = K(sum_u32, 1),
                [MLX_UINT64] = K(sum_u64, 1),
                [MLX_INT8] = K(sum_i8, 1),
                [MLX_INT16] = K(sum_i16, 1),
                [MLX_INT32] = K(sum_i32, 1),
                [MLX_INT64] = K(sum_i64, 1),
                [MLX_FLOAT16] = K(sum_f16, 1),
                [MLX_FLOAT32] = K(sum_f32, 1),
                [MLX_FLOAT64] = K(sum_f64, 1),
                [MLX_BFLOAT16] = K(sum_bf16, 1),
                [MLX_COMPLEX64] = K(sum_f32, 2),
            },
        [MLXD_MAX] =
            {
                [MLX_BOOL] = K(or_b, 1),
                [MLX_UINT8] = K(max_u8, 1),
                [MLX_UINT16] = K(max_u16, 1),
                [MLX_UINT32] = K(max_u32, 1),
                [MLX_UINT64] = K(max_u64, 1),
                [MLX_INT8] = K(max_i8, 1),
                [MLX_INT16] = K(max_i16, 1),
                [MLX_INT32] = K(max_i32, 1),
                [MLX_INT64] = K(max_i64, 1),
                [MLX_FLOAT16] = K(max_f16, 1),
                [MLX_FLOAT32] = K(max_f32, 1),
                [MLX_FLOAT64] = K(max_f64, 1),
                [MLX_BFLOAT16] = K(max_bf16, 1),
                [MLX_COMPLEX64] = K(max_c64, 1),
            },
        [MLXD_MIN] =
            {
                [MLX_BOOL] = K(and_b, 1),
                [MLX_UINT8] = K(min_u8, 1),
                [MLX_UINT16] = K(min_u16, 1),
                [MLX_UINT32] = K(min_u32, 1),
                [MLX_UINT64] = K(min_u64, 1),
                [MLX_INT8] = K(min_i8, 1),
                [MLX_INT16] = K(min_i16, 1),
                [MLX_INT32] = K(min_i32, 1),
                [MLX_INT64] = K(min_i64, 1),
                [MLX_FLOAT16] = K(min_f16, 1),
                [MLX_FLOAT32] = K(min_f32, 1),
                [MLX_FLOAT64] = K(min_f64, 1),
                [MLX_BFLOAT16] = K(min_bf16, 1),
                [MLX_COMPLEX64] = K(min_c64, 1),
            },
};

static const kernel* lookup(mlxd_reduce_op op, mlx_dtype dtype) {
  if ((int)op < 0 || (int)op > 2 || (int)dtype < 0 || (int)dtype >= NDT) return NULL;
  return &k_table[op][dtype];
}

void mlxd_reduce(mlxd_reduce_op op, mlx_dtype dtype, void* acc, const void* in, size_t count) {
  const kernel* k = lookup(op, dtype);
  if (!k || count == 0) return;
  size_t n = count * k->scale;
  if (acc == in)
    k->kg(acc, acc, acc, n);
  else
    k->k2(acc, in, n);
}

void mlxd_reduce3(mlxd_reduce_op op, mlx_dtype dtype, void* out, const void* a, const void* b,
                  size_t count) {
  const kernel* k = lookup(op, dtype);
  if (!k || count == 0) return;
  size_t n = count * k->scale;
  if (out == a && out == b)
    k->kg(out, a, b, n);
  else if (out == a)
    k->k2(out, b, n);
  else if (out == b)
    k->k2r(out, a, n);
  else
    k->k3(out, a, b, n);
}
