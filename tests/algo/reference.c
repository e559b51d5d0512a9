/* Inputs and references for the algorithm tests (see reference.h). The
 * 16-bit float conversions are written here, not taken from the library. */
#include "reference.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

size_t r_esize(int dt) {
  static const size_t sz[] = {1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 4, 8, 2, 8};
  return sz[dt];
}
const char* r_dt_name(int dt) {
  static const char* nm[] = {"bool",    "uint8",   "uint16",   "uint32",   "uint64",
                             "int8",    "int16",   "int32",    "int64",    "float16",
                             "float32", "float64", "bfloat16", "complex64"};
  return nm[dt];
}
const char* r_op_name(int op) { return op == 0 ? "sum" : op == 1 ? "max" : "min"; }

/* float <-> 16-bit conversions written here (round to nearest even). */
static float t_f16_to_f32(uint16_t h) {
  int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  float v;
  if (e == 0)
    v = ldexpf((float)m, -24);
  else if (e == 31)
    v = m ? NAN : INFINITY;
  else
    v = ldexpf((float)(m | 1024), e - 25);
  return s ? -v : v;
}
static uint16_t t_f32_to_f16(float f) {
  /* exact search-free rounding via double arithmetic */
  uint16_t sign = signbit(f) ? 0x8000 : 0;
  double a = fabs((double)f);
  if (isnan(f)) return 0x7e00;
  if (a >= 65520.0) return sign | 0x7c00;
  if (a < ldexp(1.0, -14)) { /* subnormal: units of 2^-24 */
    double q = nearbyint(a * ldexp(1.0, 24));
    return (uint16_t)(sign | (uint16_t)q);
  }
  int e;
  double fr = frexp(a, &e);          /* a = fr * 2^e, fr in [0.5, 1) */
  double q = nearbyint(fr * 2048.0); /* 11 significant bits */
  if (q >= 2048.0) {
    q /= 2;
    e++;
  }
  int be = e - 1 + 15;
  if (be >= 31) return sign | 0x7c00;
  return (uint16_t)(sign | (uint16_t)(be << 10) | ((uint16_t)q & 1023));
}
static float t_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint16_t t_f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if (isnan(f)) return 0x7fc0;
  u += 0x7fff + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

/* Value of element i of rank p's input (exact: small integers). */
static void gen(int dt, int p, size_t i, bool exact, uint64_t salt, void* dst) {
  uint64_t h = mix(((uint64_t)p << 48) ^ (uint64_t)i ^ (salt << 40) ^ ((uint64_t)dt << 56));
  float small = (float)((int)(h % 7) - 3);
  float any = (float)((double)(h >> 11) * 0x1.0p-53 * 2.0 - 1.0);
  float v = exact ? small : any;
  switch (dt) {
    case 0: *(uint8_t*)dst = (uint8_t)(h & 1); break;
    case 1:
    case 5: *(uint8_t*)dst = (uint8_t)h; break;
    case 2:
    case 6: {
      uint16_t x = (uint16_t)h;
      memcpy(dst, &x, 2);
      break;
    }
    case 3:
    case 7: {
      uint32_t x = (uint32_t)h;
      memcpy(dst, &x, 4);
      break;
    }
    case 4:
    case 8: memcpy(dst, &h, 8); break;
    case 9: {
      uint16_t x = t_f32_to_f16(v);
      memcpy(dst, &x, 2);
      break;
    }
    case 10: memcpy(dst, &v, 4); break;
    case 11: {
      double d = exact ? (double)small : (double)(h >> 11) * 0x1.0p-53 - 0.5;
      memcpy(dst, &d, 8);
      break;
    }
    case 12: {
      uint16_t x = t_f32_to_bf16(v);
      memcpy(dst, &x, 2);
      break;
    }
    case 13: {
      float c[2] = {v, exact ? (float)((int)((h >> 20) % 5) - 2)
                             : (float)((h >> 40) & 0xffff) / 65536.0f};
      memcpy(dst, c, 8);
      break;
    }
  }
}

void r_fill(int dt, int p, size_t first, size_t count, bool exact, uint64_t salt, void* buf) {
  size_t es = r_esize(dt);
  for (size_t i = 0; i < count; i++) gen(dt, p, first + i, exact, salt, (char*)buf + i * es);
}

/* acc = acc OP x for one element, computed in this file. */
static void ref_op1(int op, int dt, void* acc, const void* x) {
#define INTOP(T)                                                              \
  do {                                                                        \
    T a, b;                                                                   \
    memcpy(&a, acc, sizeof a);                                                \
    memcpy(&b, x, sizeof b);                                                  \
    T r = op == 0 ? (T)(a + b) : op == 1 ? (a > b ? a : b) : (a < b ? a : b); \
    memcpy(acc, &r, sizeof r);                                                \
  } while (0)
#define SINTOP(T, U)                                                                \
  do {                                                                              \
    T a, b;                                                                         \
    memcpy(&a, acc, sizeof a);                                                      \
    memcpy(&b, x, sizeof b);                                                        \
    T r = op == 0 ? (T)((U)a + (U)b) : op == 1 ? (a > b ? a : b) : (a < b ? a : b); \
    memcpy(acc, &r, sizeof r);                                                      \
  } while (0)
  switch (dt) {
    case 0: {
      uint8_t a = *(uint8_t*)acc != 0, b = *(const uint8_t*)x != 0;
      *(uint8_t*)acc = (uint8_t)(op == 2 ? (a && b) : (a || b));
      break;
    }
    case 1: INTOP(uint8_t); break;
    case 2: INTOP(uint16_t); break;
    case 3: INTOP(uint32_t); break;
    case 4: INTOP(uint64_t); break;
    case 5: SINTOP(int8_t, uint8_t); break;
    case 6: SINTOP(int16_t, uint16_t); break;
    case 7: SINTOP(int32_t, uint32_t); break;
    case 8: SINTOP(int64_t, uint64_t); break;
    case 10: INTOP(float); break;
    case 11: INTOP(double); break;
    case 9:
    case 12: {
      uint16_t ha, hb;
      memcpy(&ha, acc, 2);
      memcpy(&hb, x, 2);
      float a = dt == 9 ? t_f16_to_f32(ha) : t_bf16_to_f32(ha);
      float b = dt == 9 ? t_f16_to_f32(hb) : t_bf16_to_f32(hb);
      float r = op == 0 ? a + b : op == 1 ? (a > b ? a : b) : (a < b ? a : b);
      uint16_t hr = dt == 9 ? t_f32_to_f16(r) : t_f32_to_bf16(r);
      memcpy(acc, &hr, 2);
      break;
    }
    case 13: {
      float a[2], b[2];
      memcpy(a, acc, 8);
      memcpy(b, x, 8);
      if (op == 0) {
        a[0] += b[0];
        a[1] += b[1];
      } else {
        bool b_greater = b[0] > a[0] || (b[0] == a[0] && b[1] > a[1]);
        bool b_less = b[0] < a[0] || (b[0] == a[0] && b[1] < a[1]);
        if ((op == 1 && b_greater) || (op == 2 && b_less)) memcpy(a, b, 8);
      }
      memcpy(acc, a, 8);
      break;
    }
  }
#undef INTOP
#undef SINTOP
}

void r_reduce(int op, int dt, int n, size_t first, size_t count, bool exact, uint64_t salt,
              void* out) {
  size_t es = r_esize(dt);
  unsigned char x[8];
  for (size_t i = 0; i < count; i++) {
    char* acc = (char*)out + i * es;
    gen(dt, 0, first + i, exact, salt, acc);
    for (int p = 1; p < n; p++) {
      gen(dt, p, first + i, exact, salt, x);
      ref_op1(op, dt, acc, x);
    }
  }
}

bool r_is_float(int dt) { return dt >= 9; }

double r_as_double(int dt, const void* p, int part) {
  uint16_t h;
  float f[2];
  double d;
  switch (dt) {
    case 9: memcpy(&h, p, 2); return t_f16_to_f32(h);
    case 12: memcpy(&h, p, 2); return t_bf16_to_f32(h);
    case 10: memcpy(f, p, 4); return f[0];
    case 11: memcpy(&d, p, 8); return d;
    case 13: memcpy(f, p, 8); return f[part];
    default: return 0;
  }
}

void r_format(int dt, const void* p, char* buf, size_t n) {
  uint8_t u8;
  uint16_t u16;
  uint32_t u32;
  uint64_t u64;
  switch (dt) {
    case 0:
    case 1:
      memcpy(&u8, p, 1);
      snprintf(buf, n, "%u", (unsigned)u8);
      break;
    case 5:
      memcpy(&u8, p, 1);
      snprintf(buf, n, "%d", (int)(int8_t)u8);
      break;
    case 2:
      memcpy(&u16, p, 2);
      snprintf(buf, n, "%u", (unsigned)u16);
      break;
    case 6:
      memcpy(&u16, p, 2);
      snprintf(buf, n, "%d", (int)(int16_t)u16);
      break;
    case 3:
      memcpy(&u32, p, 4);
      snprintf(buf, n, "%u", (unsigned)u32);
      break;
    case 7:
      memcpy(&u32, p, 4);
      snprintf(buf, n, "%d", (int)(int32_t)u32);
      break;
    case 4:
      memcpy(&u64, p, 8);
      snprintf(buf, n, "%llu", (unsigned long long)u64);
      break;
    case 8:
      memcpy(&u64, p, 8);
      snprintf(buf, n, "%lld", (long long)(int64_t)u64);
      break;
    case 13: snprintf(buf, n, "(%.9g, %.9g)", r_as_double(dt, p, 0), r_as_double(dt, p, 1)); break;
    default: snprintf(buf, n, "%.17g", r_as_double(dt, p, 0)); break;
  }
}
