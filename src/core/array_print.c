/* mlx_array_tostring: a numpy/MLX-style rendering,
 *   array([[1, 2],
 *          [3, 4]], dtype=int32)
 * Arrays of more than 1000 elements show the first and last three entries
 * of every axis longer than six, with "..." between them. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core_internal.h"
#include "core/error.h"
#include "mlx/c/array.h"
#include "reduce/reduce.h"

#define PRINT_THRESHOLD 1000
#define PRINT_EDGE 3

typedef struct sbuf {
  char* p;
  size_t len, cap;
  bool oom;
} sbuf;

static void sb_grow(sbuf* b, size_t extra) {
  if (b->oom || b->len + extra + 1 <= b->cap) return;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + extra + 1) cap *= 2;
  char* p = realloc(b->p, cap);
  if (!p) {
    b->oom = true;
    return;
  }
  b->p = p;
  b->cap = cap;
}

static void sb_put(sbuf* b, const char* s, size_t n) {
  sb_grow(b, n);
  if (b->oom) return;
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

static void sb_str(sbuf* b, const char* s) { sb_put(b, s, strlen(s)); }

static void sb_fmt(sbuf* b, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_fmt(sbuf* b, const char* fmt, ...) {
  char tmp[128];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n > 0) sb_put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

static void sb_float(sbuf* b, double v) {
  if (isnan(v))
    sb_str(b, "nan");
  else if (isinf(v))
    sb_str(b, v < 0 ? "-inf" : "inf");
  else
    sb_fmt(b, "%g", v);
}

static void put_elem(sbuf* b, mlx_dtype dt, const void* base, size_t i) {
  const char* p = (const char*)base;
  switch (dt) {
    case MLX_BOOL: sb_str(b, p[i] ? "True" : "False"); break;
    case MLX_UINT8: sb_fmt(b, "%u", (unsigned)((const uint8_t*)p)[i]); break;
    case MLX_UINT16: sb_fmt(b, "%u", (unsigned)((const uint16_t*)(const void*)p)[i]); break;
    case MLX_UINT32: sb_fmt(b, "%lu", (unsigned long)((const uint32_t*)(const void*)p)[i]); break;
    case MLX_UINT64:
      sb_fmt(b, "%llu", (unsigned long long)((const uint64_t*)(const void*)p)[i]);
      break;
    case MLX_INT8: sb_fmt(b, "%d", (int)((const int8_t*)p)[i]); break;
    case MLX_INT16: sb_fmt(b, "%d", (int)((const int16_t*)(const void*)p)[i]); break;
    case MLX_INT32: sb_fmt(b, "%ld", (long)((const int32_t*)(const void*)p)[i]); break;
    case MLX_INT64: sb_fmt(b, "%lld", (long long)((const int64_t*)(const void*)p)[i]); break;
    case MLX_FLOAT16: sb_float(b, mlxd_f16_to_f32(((const uint16_t*)(const void*)p)[i])); break;
    case MLX_BFLOAT16: sb_float(b, mlxd_bf16_to_f32(((const uint16_t*)(const void*)p)[i])); break;
    case MLX_FLOAT32: sb_float(b, ((const float*)(const void*)p)[i]); break;
    case MLX_FLOAT64: sb_float(b, ((const double*)(const void*)p)[i]); break;
    case MLX_COMPLEX64: {
      const float* c = (const float*)(const void*)p + 2 * i;
      sb_float(b, c[0]);
      if (isnan(c[1]) || !signbit(c[1])) sb_str(b, "+");
      sb_float(b, c[1]);
      sb_str(b, "j");
      break;
    }
  }
}

static void put_indent(sbuf* b, int n) {
  for (int i = 0; i < n; i++) sb_put(b, " ", 1);
}

/* Print the sub-array at `level` starting at element offset `off`. */
static void put_sub(sbuf* b, const mlxd_array* a, int level, size_t off, bool abbrev) {
  if (level == a->ndim) {
    put_elem(b, a->dtype, a->data, off);
    return;
  }
  sb_str(b, "[");
  size_t n = (size_t)a->shape[level];
  int inner = a->ndim - level - 1;
  for (size_t i = 0; i < n; i++) {
    if (i > 0) {
      if (inner == 0) {
        sb_str(b, ", ");
      } else {
        sb_str(b, ",");
        for (int k = 0; k < inner; k++) sb_str(b, "\n");
        put_indent(b, 7 + level); /* under the first '[' of this level's content */
      }
    }
    if (abbrev && n > 2 * PRINT_EDGE && i == PRINT_EDGE) {
      sb_str(b, "...");
      i = n - PRINT_EDGE - 1;
      continue;
    }
    put_sub(b, a, level + 1, off + i * a->strides[level], abbrev);
  }
  sb_str(b, "]");
}

int mlx_array_tostring(mlx_string* str, const mlx_array arr) {
  mlxd_status st;
  if (!str) {
    mlxd_error("[array] mlx_array_tostring got a NULL result pointer");
    return 1;
  }
  const mlxd_array* a = mlxd_array_readable(arr, "mlx_array_tostring", &st);
  if (!a) return mlxd_error_status(&st);
  sbuf b = {NULL, 0, 0, false};
  sb_str(&b, "array(");
  put_sub(&b, a, 0, 0, a->size > PRINT_THRESHOLD);
  sb_fmt(&b, ", dtype=%s)", mlxd_dtype_name(a->dtype));
  if (b.oom) {
    free(b.p);
    mlxd_error("[array] out of memory rendering an array of %zu elements as a string", a->size);
    return 1;
  }
  int rc = mlxd_string_put(str, b.p, "[array] mlx_array_tostring");
  free(b.p);
  return rc;
}
