/* mlx_vector_array (a reference-counted list of arrays) and mlx_eval. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/core_internal.h"
#include "core/error.h"
#include "mlx/c/transforms.h"
#include "mlx/c/vector.h"

typedef struct mlxd_vector {
  atomic_int refs;
  pthread_mutex_t mu;
  mlxd_array** items; /* retained; an entry may be NULL (an empty array handle) */
  size_t n, cap;
} mlxd_vector;

static mlxd_vector* vec_alloc(void) {
  mlxd_vector* v = calloc(1, sizeof *v);
  if (!v) return NULL;
  atomic_init(&v->refs, 1);
  pthread_mutex_init(&v->mu, NULL);
  return v;
}

static void vec_destroy(mlxd_vector* v) {
  for (size_t i = 0; i < v->n; i++) mlxd_array_release(v->items[i]);
  free(v->items);
  pthread_mutex_destroy(&v->mu);
  free(v);
}

/* Append under the caller's lock. */
static int vec_append_locked(mlxd_vector* v, const mlx_array* data, size_t size) {
  if (size > v->cap - v->n) {
    size_t cap = v->cap ? v->cap : 4;
    while (cap - v->n < size) {
      if (cap > SIZE_MAX / 2 / sizeof(mlxd_array*)) return 1;
      cap *= 2;
    }
    mlxd_array** p = realloc(v->items, cap * sizeof *p);
    if (!p) return 1;
    v->items = p;
    v->cap = cap;
  }
  for (size_t i = 0; i < size; i++) v->items[v->n++] = mlxd_array_retain(mlxd_array_of(data[i]));
  return 0;
}

static mlx_vector_array vec_handle(mlxd_vector* v) {
  mlx_vector_array h = {v};
  return h;
}

mlx_vector_array mlx_vector_array_new(void) {
  mlxd_vector* v = vec_alloc();
  if (!v) mlxd_error("[vector] out of memory creating a vector of arrays");
  return vec_handle(v);
}

int mlx_vector_array_free(mlx_vector_array vec) {
  mlxd_vector* v = vec.ctx;
  if (v && atomic_fetch_sub_explicit(&v->refs, 1, memory_order_acq_rel) == 1) vec_destroy(v);
  return 0;
}

int mlx_vector_array_set(mlx_vector_array* vec, const mlx_vector_array src) {
  if (!vec) {
    mlxd_error("[vector] mlx_vector_array_set got a NULL destination pointer");
    return 1;
  }
  mlxd_vector* s = src.ctx;
  if (s) atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
  mlx_vector_array_free(*vec);
  vec->ctx = s;
  return 0;
}

static mlxd_vector* vec_from(const mlx_array* data, size_t size, const char* fn) {
  if (!data && size > 0) {
    mlxd_error("[vector] %s got NULL data with size %zu (expected a pointer to %zu arrays)", fn,
               size, size);
    return NULL;
  }
  mlxd_vector* v = vec_alloc();
  if (!v || (size && vec_append_locked(v, data, size))) {
    if (v) vec_destroy(v);
    mlxd_error("[vector] %s: out of memory for %zu arrays", fn, size);
    return NULL;
  }
  return v;
}

mlx_vector_array mlx_vector_array_new_data(const mlx_array* data, size_t size) {
  return vec_handle(vec_from(data, size, "mlx_vector_array_new_data"));
}

mlx_vector_array mlx_vector_array_new_value(const mlx_array val) {
  return vec_handle(vec_from(&val, 1, "mlx_vector_array_new_value"));
}

int mlx_vector_array_set_data(mlx_vector_array* vec, const mlx_array* data, size_t size) {
  if (!vec) {
    mlxd_error("[vector] mlx_vector_array_set_data got a NULL destination pointer");
    return 1;
  }
  mlxd_vector* v = vec_from(data, size, "mlx_vector_array_set_data");
  if (!v) return 1;
  mlx_vector_array_free(*vec);
  vec->ctx = v;
  return 0;
}

int mlx_vector_array_set_value(mlx_vector_array* vec, const mlx_array val) {
  return mlx_vector_array_set_data(vec, &val, 1);
}

int mlx_vector_array_append_data(mlx_vector_array vec, const mlx_array* data, size_t size) {
  mlxd_vector* v = vec.ctx;
  if (!v) {
    mlxd_error(
        "[vector] mlx_vector_array_append_data got an empty vector handle (expected one "
        "from mlx_vector_array_new)");
    return 1;
  }
  if (!data && size > 0) {
    mlxd_error("[vector] mlx_vector_array_append_data got NULL data with size %zu", size);
    return 1;
  }
  pthread_mutex_lock(&v->mu);
  int rc = vec_append_locked(v, data, size);
  pthread_mutex_unlock(&v->mu);
  if (rc) mlxd_error("[vector] out of memory appending %zu arrays", size);
  return rc;
}

int mlx_vector_array_append_value(mlx_vector_array vec, const mlx_array val) {
  return mlx_vector_array_append_data(vec, &val, 1);
}

size_t mlx_vector_array_size(mlx_vector_array vec) {
  mlxd_vector* v = vec.ctx;
  if (!v) return 0;
  pthread_mutex_lock(&v->mu);
  size_t n = v->n;
  pthread_mutex_unlock(&v->mu);
  return n;
}

int mlx_vector_array_get(mlx_array* res, const mlx_vector_array vec, size_t idx) {
  mlxd_vector* v = vec.ctx;
  if (!res) {
    mlxd_error("[vector] mlx_vector_array_get got a NULL result pointer");
    return 1;
  }
  if (!v) {
    mlxd_error("[vector] mlx_vector_array_get got an empty vector handle");
    return 1;
  }
  pthread_mutex_lock(&v->mu);
  size_t n = v->n;
  mlxd_array* a = idx < n ? mlxd_array_retain(v->items[idx]) : NULL;
  pthread_mutex_unlock(&v->mu);
  if (idx >= n) {
    mlxd_error("[vector] index %zu is out of range for a vector of %zu arrays", idx, n);
    return 1;
  }
  mlx_array_free(*res);
  *res = mlxd_array_handle(a);
  return 0;
}

int mlx_eval(const mlx_vector_array outputs) {
  mlxd_vector* v = outputs.ctx;
  if (!v) {
    mlxd_error(
        "[eval] mlx_eval got an empty vector handle (expected one from "
        "mlx_vector_array_new)");
    return 1;
  }
  /* Snapshot the list so no lock is held while waiting. */
  pthread_mutex_lock(&v->mu);
  size_t n = v->n;
  mlxd_array** items = n ? malloc(n * sizeof *items) : NULL;
  if (items)
    for (size_t i = 0; i < n; i++) items[i] = mlxd_array_retain(v->items[i]);
  pthread_mutex_unlock(&v->mu);
  if (n && !items) {
    mlxd_error("[eval] out of memory evaluating %zu arrays", n);
    return 1;
  }
  mlxd_status first;
  mlxd_status_clear(&first);
  for (size_t i = 0; i < n; i++) {
    mlxd_status st;
    if (!items[i]) {
      if (!first.code)
        mlxd_fail(&first, MLXD_EINVAL, "[eval] entry %zu of the vector is an empty array handle",
                  i);
      continue;
    }
    if (mlxd_array_wait(items[i], &st) && !first.code) first = st;
  }
  for (size_t i = 0; i < n; i++) mlxd_array_release(items[i]);
  free(items);
  if (first.code) return mlxd_error_status(&first);
  return 0;
}
