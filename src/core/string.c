/* mlx_string: a reference-counted, immutable C string. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/core_internal.h"
#include "core/error.h"
#include "mlx/c/string.h"

typedef struct mlxd_string {
  atomic_int refs;
  char data[];
} mlxd_string;

mlx_string mlx_string_new(void) {
  mlx_string s = {NULL};
  return s;
}

/* Internal: a new string from n bytes of str (not reported on failure). */
mlx_string mlxd_string_from(const char* str, size_t n) {
  mlx_string h = {NULL};
  mlxd_string* s = malloc(sizeof *s + n + 1);
  if (!s) return h;
  atomic_init(&s->refs, 1);
  memcpy(s->data, str, n);
  s->data[n] = '\0';
  h.ctx = s;
  return h;
}

mlx_string mlx_string_new_data(const char* str) {
  if (!str) {
    mlxd_error(
        "[string] mlx_string_new_data got a NULL pointer (expected a NUL-terminated string)");
    return mlx_string_new();
  }
  mlx_string h = mlxd_string_from(str, strlen(str));
  if (!h.ctx) mlxd_error("[string] out of memory copying a string of %zu bytes", strlen(str));
  return h;
}

int mlx_string_set(mlx_string* str, const mlx_string src) {
  if (!str) {
    mlxd_error("[string] mlx_string_set got a NULL destination pointer");
    return 1;
  }
  mlxd_string* s = src.ctx;
  if (s) atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
  mlx_string_free(*str);
  str->ctx = s;
  return 0;
}

const char* mlx_string_data(mlx_string str) {
  mlxd_string* s = str.ctx;
  return s ? s->data : NULL;
}

int mlx_string_free(mlx_string str) {
  mlxd_string* s = str.ctx;
  if (s && atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) == 1) free(s);
  return 0;
}

int mlxd_string_put(mlx_string* res, const char* str, const char* tag) {
  if (!res) {
    mlxd_error("%s got a NULL result pointer (expected a mlx_string* from mlx_string_new())", tag);
    return 1;
  }
  mlx_string h = mlxd_string_from(str, strlen(str));
  if (!h.ctx) {
    mlxd_error("%s out of memory creating a string of %zu bytes", tag, strlen(str));
    return 1;
  }
  mlx_string_free(*res);
  *res = h;
  return 0;
}
