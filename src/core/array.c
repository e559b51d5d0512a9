/* Arrays: reference-counted, immutable blocks of host memory with a dtype and
 * a row-major shape; pending until the task that produces them completes. */
#include <limits.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/buffer.h"
#include "core/core_internal.h"
#include "core/error.h"
#include "core/fork.h"
#include "core/pool.h"
#include "core/stream_impl.h"
#include "mlx/c/array.h"
#include "util/clock.h"
#include "util/tunables.h"

/* ---------- spin budget ---------- */

static pthread_once_t g_spin_once = PTHREAD_ONCE_INIT;
static double g_spin_s;

static void spin_init(void) {
  double us = mlxd_tunable_double(MLXD_T_SPIN_US);
  if (!(us > 0)) us = 0;
  if (us > 1e6) us = 1e6; /* at most one second of polling */
  g_spin_s = us * 1e-6;
}

double mlxd_core_spin_s(void) {
  pthread_once(&g_spin_once, spin_init);
  return g_spin_s;
}

/* ---------- allocation ---------- */

static void noop_dtor(void* p) { (void)p; }

/* Validate (shape, ndim, dtype) and compute the element and byte counts.
 * One pass over the shape for a valid one (every op's result goes through
 * here); the messages come from the slow path. */
static int shape_fail(const int* shape, int ndim, int dtype, mlxd_status* st) {
  if (mlxd_dtype_check(dtype, st)) return st->code;
  if (ndim < 0)
    return mlxd_fail(st, MLXD_EINVAL, "[array] the number of dimensions is %d (expected >= 0)",
                     ndim);
  if (ndim > 0 && !shape)
    return mlxd_fail(st, MLXD_EINVAL,
                     "[array] shape is NULL but the number of dimensions is %d (expected a "
                     "pointer to %d dimensions)",
                     ndim, ndim);
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 0)
      return mlxd_fail(st, MLXD_EINVAL,
                       "[array] dimension %d of the shape is %d (expected a size >= 0)", i,
                       shape[i]);
  return mlxd_fail(st, MLXD_EINVAL,
                   "[array] the shape's byte size overflows size_t (%d dimensions of %s); "
                   "expected an array that fits in memory",
                   ndim, mlxd_dtype_name((mlx_dtype)dtype));
}

static int shape_check(const int* shape, int ndim, int dtype, size_t* size_out, size_t* nbytes_out,
                       mlxd_status* st) {
  size_t esz = mlx_dtype_size((mlx_dtype)dtype); /* 0: not a dtype */
  if (esz == 0 || ndim < 0 || (ndim > 0 && !shape)) return shape_fail(shape, ndim, dtype, st);
  /* The product of the dimensions saturates at SIZE_MAX once it overflows
   * (so a zero dimension after an overflow still gives an empty array, as
   * the dimensions' order does not matter); a negative one fails. */
  size_t size = 1;
  bool overflow = false;
  for (int i = 0; i < ndim; i++) {
    int d = shape[i];
    if (d < 0) return shape_fail(shape, ndim, dtype, st);
    if (d == 0) {
      size = 0;
      overflow = false;
      for (int j = i + 1; j < ndim; j++)
        if (shape[j] < 0) return shape_fail(shape, ndim, dtype, st);
      break;
    }
    if (!overflow && __builtin_mul_overflow(size, (size_t)d, &size)) overflow = true;
  }
  size_t nbytes = 0;
  /* keep room to round the allocation up to the alignment */
  if (overflow || __builtin_mul_overflow(size, esz, &nbytes) || nbytes > SIZE_MAX - MLXD_ALIGN)
    return shape_fail(shape, ndim, dtype, st);
  *size_out = size;
  *nbytes_out = nbytes;
  return 0;
}

/* The failure of an array whose failure could not be copied (out of memory). */
static mlxd_status k_oom_status = {
    .code = MLXD_ENOMEM,
    .rendered = true,
    .msg =
        "[array] the work producing this array failed, and there was no memory left to "
        "keep its message"};

/* Undo what array_meta did to a fresh block (before it goes back to the heap). */
static void block_fini(void* p) {
  mlxd_array* a = p;
  pthread_mutex_destroy(&a->mu);
  pthread_cond_destroy(&a->cv);
}

/* A new array (refs 1, READY, no data) with shape and strides: a block from
 * the calling thread's pool (core/pool.h), so a small array costs no
 * allocation. */
static mlxd_array* array_meta(const int* shape, int ndim, mlx_dtype dtype, size_t size,
                              size_t nbytes, mlxd_status* st) {
  int fresh;
  mlxd_array* a = mlxd_pool_get(MLXD_POOL_ARRAY, sizeof *a, &fresh);
  if (!a) {
    mlxd_fail(st, MLXD_ENOMEM, "[array] out of memory allocating an array header (%d dimensions)",
              ndim);
    return NULL;
  }
  if (fresh) {
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    atomic_init(&a->waiters, 0);
  }
  if (ndim <= MLXD_ARRAY_INLINE_NDIM) {
    a->strides = ndim ? a->strides_inline : NULL;
    a->shape = ndim ? a->shape_inline : NULL;
  } else {
    size_t* m = malloc((size_t)ndim * (sizeof(size_t) + sizeof(int)));
    if (!m) {
      mlxd_pool_put(MLXD_POOL_ARRAY, a, sizeof *a, block_fini);
      mlxd_fail(st, MLXD_ENOMEM,
                "[array] out of memory allocating the shape of an array (%d dimensions)", ndim);
      return NULL;
    }
    a->strides = m;
    a->shape = (int*)(void*)(m + ndim);
  }
  atomic_init(&a->refs, 1);
  a->dtype = dtype;
  a->ndim = ndim;
  size_t stride = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    a->shape[i] = shape[i];
    a->strides[i] = stride;
    stride *= (size_t)shape[i]; /* as MLX: a zero dimension zeroes the strides before it */
  }
  a->size = size;
  a->nbytes = nbytes;
  a->data = NULL;
  a->dtor = NULL;
  a->dtor_arg = NULL;
  a->data_inline = false;
  atomic_init(&a->state, MLXD_ARRAY_READY);
  a->error = NULL;
  atomic_init(&a->producer, NULL);
  a->pid = mlxd_self_pid();
  return a;
}

/* Drop a's reference to its producer, if it holds one (a retained stream
 * is replaced under mu: see array_impl.h). */
static void producer_set(mlxd_array* a, mlxd_stream* s) {
  mlxd_stream* old = atomic_load_explicit(&a->producer, memory_order_relaxed);
  if (old && !mlxd_stream_is_static(old)) {
    pthread_mutex_lock(&a->mu);
    atomic_store_explicit(&a->producer, s, memory_order_release);
    pthread_mutex_unlock(&a->mu);
    mlxd_stream_release(old);
  } else if (old != s) {
    atomic_store_explicit(&a->producer, s, memory_order_release);
  }
}

static void array_destroy(mlxd_array* a) {
  if (atomic_load_explicit(&a->state, memory_order_relaxed) == MLXD_ARRAY_PENDING &&
      mlxd_fork_foreign(a->pid)) {
    /* The parent's pending array, in a forked child: its lock and condition
     * are copies of the parent's in whatever state they were; start them
     * afresh (nobody here waits on them) before the block is reused. */
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
    atomic_store(&a->waiters, 0);
  }
  producer_set(a, NULL); /* non-NULL only if it died pending */
  if (a->dtor)
    a->dtor(a->dtor_arg);
  else if (!a->data_inline)
    mlxd_buffer_free(a->data, a->nbytes);
  if (a->ndim > MLXD_ARRAY_INLINE_NDIM) free(a->strides);
  if (a->error != &k_oom_status) free(a->error);
  mlxd_pool_put(MLXD_POOL_ARRAY, a, sizeof *a, block_fini);
}

mlxd_array* mlxd_array_alloc(const int* shape, int ndim, mlx_dtype dtype, bool pending,
                             mlxd_status* st) {
  size_t size = 0, nbytes = 0; /* shape_check sets both; gcc -O3 cannot tell */
  if (shape_check(shape, ndim, (int)dtype, &size, &nbytes, st)) return NULL;
  mlxd_array* a = array_meta(shape, ndim, dtype, size, nbytes, st);
  if (!a) return NULL;
  /* Never NULL, also for zero bytes. */
  if (nbytes <= MLXD_ARRAY_INLINE_BYTES) {
    a->data = a->small;
    a->data_inline = true;
  } else {
    a->data = mlxd_buffer_alloc(nbytes);
    if (!a->data) {
      array_destroy(a);
      mlxd_fail(st, MLXD_ENOMEM, "[array] out of memory allocating %zu bytes for a %s array",
                nbytes, mlxd_dtype_name(dtype));
      return NULL;
    }
  }
  if (pending) atomic_store_explicit(&a->state, MLXD_ARRAY_PENDING, memory_order_relaxed);
  return a;
}

mlxd_array* mlxd_array_retain(mlxd_array* a) {
  if (a) atomic_fetch_add_explicit(&a->refs, 1, memory_order_relaxed);
  return a;
}

void mlxd_array_release(mlxd_array* a) {
  if (a && atomic_fetch_sub_explicit(&a->refs, 1, memory_order_acq_rel) == 1) array_destroy(a);
}

/* ---------- completion ---------- */

static int failed_code(const mlxd_array* a) {
  return a->error && a->error->code ? a->error->code : 1;
}

int mlxd_array_wait(mlxd_array* a, mlxd_status* st) {
  int s = atomic_load_explicit(&a->state, memory_order_acquire);
  if (s == MLXD_ARRAY_PENDING && mlxd_fork_foreign(a->pid)) {
    mlxd_status local;
    return mlxd_fork_refuse(st ? st : &local, "[array] waiting for an array", "pending array",
                            a->pid,
                            "its result is computed in that process only (wait for it there "
                            "before fork)");
  }
  if (s == MLXD_ARRAY_PENDING) {
    mlxd_stream_help(a);
    s = atomic_load_explicit(&a->state, memory_order_acquire);
  }
  if (s == MLXD_ARRAY_PENDING) {
    double spin = mlxd_core_spin_s();
    if (spin > 0) {
      double deadline = mlxd_now() + spin;
      for (unsigned i = 1;; i++) {
        mlxd_cpu_relax();
        s = atomic_load_explicit(&a->state, memory_order_acquire);
        if (s != MLXD_ARRAY_PENDING) break;
        if ((i & 63) == 0 && mlxd_now() >= deadline) break;
      }
    }
    if (s == MLXD_ARRAY_PENDING) {
      /* Bounded by the producing task (see array_impl.h). The count tells
       * mlxd_array_complete to wake us; it is raised before the state is
       * read again (both sequentially consistent), so either complete sees
       * it or we see the new state. */
      pthread_mutex_lock(&a->mu);
      atomic_fetch_add(&a->waiters, 1);
      while ((s = atomic_load(&a->state)) == MLXD_ARRAY_PENDING) pthread_cond_wait(&a->cv, &a->mu);
      atomic_fetch_sub(&a->waiters, 1);
      pthread_mutex_unlock(&a->mu);
    }
  }
  if (s == MLXD_ARRAY_FAILED) {
    if (st) *st = a->error ? *a->error : k_oom_status;
    return failed_code(a);
  }
  return 0;
}

void mlxd_array_complete(mlxd_array* a, const mlxd_status* st) {
  int to = MLXD_ARRAY_READY;
  if (st && st->code) {
    mlxd_status* e = malloc(sizeof *e);
    if (e) {
      *e = *st;
      if (!e->msg[0])
        mlxd_fail(e, st->code, "[array] the work producing this array failed (code %d)", st->code);
    }
    if (a->error != &k_oom_status) free(a->error); /* completed twice: the last failure */
    a->error = e ? e : &k_oom_status;
    to = MLXD_ARRAY_FAILED;
  }
  /* The caller holds a reference (a task holds its outputs until it is
   * freed), so a stays valid after the store that lets waiters go on. */
  producer_set(a, NULL);
  atomic_store(&a->state, to);
  if (atomic_load(&a->waiters) > 0) {
    pthread_mutex_lock(&a->mu);
    pthread_cond_broadcast(&a->cv);
    pthread_mutex_unlock(&a->mu);
  }
}

void mlxd_array_set_producer(mlxd_array* a, mlxd_stream* s) {
  if (atomic_load_explicit(&a->state, memory_order_acquire) != MLXD_ARRAY_PENDING) s = NULL;
  producer_set(a, s && !mlxd_stream_is_static(s) ? mlxd_stream_retain(s) : s);
}

mlxd_stream* mlxd_array_producer_retain(mlxd_array* a) {
  mlxd_stream* s = atomic_load_explicit(&a->producer, memory_order_acquire);
  if (!s || mlxd_stream_is_static(s)) return s;
  pthread_mutex_lock(&a->mu);
  s = mlxd_stream_retain(atomic_load_explicit(&a->producer, memory_order_acquire));
  pthread_mutex_unlock(&a->mu);
  return s;
}

mlxd_array* mlxd_array_readable(mlx_array arr, const char* fn, mlxd_status* st) {
  mlxd_array* a = mlxd_array_of(arr);
  if (!a) {
    mlxd_fail(st, MLXD_EINVAL,
              "[array] %s got an empty array handle (expected an array made by a constructor "
              "or an op)",
              fn);
    return NULL;
  }
  if (mlxd_array_wait(a, st)) return NULL;
  return a;
}

/* ---------- constructors ---------- */

static mlx_array report_null(mlxd_status* st) {
  mlxd_error_status(st);
  return mlx_array_new();
}

mlx_array mlx_array_new(void) {
  mlx_array h = {NULL};
  return h;
}

int mlx_array_free(mlx_array arr) {
  mlxd_array_release(mlxd_array_of(arr));
  return 0;
}

static mlxd_array* new_copy(const void* data, const int* shape, int dim, mlx_dtype dtype,
                            mlxd_status* st) {
  size_t size = 0, nbytes = 0; /* shape_check sets both; gcc -O3 cannot tell */
  if (shape_check(shape, dim, (int)dtype, &size, &nbytes, st)) return NULL;
  if (!data && size > 0) {
    mlxd_fail(st, MLXD_EINVAL,
              "[array] data is NULL but the shape has %zu elements (NULL data is allowed only "
              "for a shape with no elements)",
              size);
    return NULL;
  }
  mlxd_array* a = mlxd_array_alloc(shape, dim, dtype, false, st);
  if (a && nbytes) memcpy(a->data, data, nbytes);
  return a;
}

mlx_array mlx_array_new_data(const void* data, const int* shape, int dim, mlx_dtype dtype) {
  mlxd_status st;
  mlxd_array* a = new_copy(data, shape, dim, dtype, &st);
  return a ? mlxd_array_handle(a) : report_null(&st);
}

static mlx_array new_managed(void* data, const int* shape, int dim, mlx_dtype dtype, void* dtor_arg,
                             void (*dtor)(void*)) {
  mlxd_status st;
  size_t size = 0, nbytes = 0; /* shape_check sets both; gcc -O3 cannot tell */
  if (shape_check(shape, dim, (int)dtype, &size, &nbytes, &st)) return report_null(&st);
  if (!data && size > 0) {
    mlxd_fail(&st, MLXD_EINVAL,
              "[array] data is NULL but the shape has %zu elements (NULL data is allowed only "
              "for a shape with no elements)",
              size);
    return report_null(&st);
  }
  mlxd_array* a = array_meta(shape, dim, dtype, size, nbytes, &st);
  if (!a) return report_null(&st);
  a->data = data;
  a->dtor = dtor ? dtor : noop_dtor;
  a->dtor_arg = dtor_arg;
  return mlxd_array_handle(a);
}

mlx_array mlx_array_new_data_managed(void* data, const int* shape, int dim, mlx_dtype dtype,
                                     void (*dtor)(void*)) {
  return new_managed(data, shape, dim, dtype, data, dtor);
}

mlx_array mlx_array_new_data_managed_payload(void* data, const int* shape, int dim, mlx_dtype dtype,
                                             void* payload, void (*dtor)(void*)) {
  return new_managed(data, shape, dim, dtype, payload, dtor);
}

static mlx_array new_scalar(const void* val, mlx_dtype dtype) {
  mlxd_status st;
  mlxd_array* a = mlxd_array_alloc(NULL, 0, dtype, false, &st);
  if (!a) return report_null(&st);
  memcpy(a->data, val, mlx_dtype_size(dtype));
  return mlxd_array_handle(a);
}

mlx_array mlx_array_new_bool(bool val) { return new_scalar(&val, MLX_BOOL); }
mlx_array mlx_array_new_int(int val) {
  int32_t v = (int32_t)val;
  return new_scalar(&v, MLX_INT32);
}
mlx_array mlx_array_new_float32(float val) { return new_scalar(&val, MLX_FLOAT32); }
mlx_array mlx_array_new_float(float val) { return new_scalar(&val, MLX_FLOAT32); }
mlx_array mlx_array_new_float64(double val) { return new_scalar(&val, MLX_FLOAT64); }
mlx_array mlx_array_new_double(double val) { return new_scalar(&val, MLX_FLOAT64); }
mlx_array mlx_array_new_complex(float real_val, float imag_val) {
  float v[2] = {real_val, imag_val};
  return new_scalar(v, MLX_COMPLEX64);
}

/* Replace *arr with h (a new array) unless h is empty (an error was reported). */
static int replace(mlx_array* arr, mlx_array h, const char* fn) {
  if (!arr) {
    mlx_array_free(h);
    mlxd_error("[array] %s got a NULL destination pointer (expected a mlx_array*)", fn);
    return 1;
  }
  if (!h.ctx) return 1;
  mlx_array_free(*arr);
  *arr = h;
  return 0;
}

int mlx_array_set(mlx_array* arr, const mlx_array src) {
  if (!arr) {
    mlxd_error("[array] mlx_array_set got a NULL destination pointer (expected a mlx_array*)");
    return 1;
  }
  mlxd_array_retain(mlxd_array_of(src));
  mlx_array_free(*arr);
  *arr = src;
  return 0;
}

#define NULL_DST_CHECK(fn)                                                               \
  if (!arr) {                                                                            \
    mlxd_error("[array] " fn " got a NULL destination pointer (expected a mlx_array*)"); \
    return 1;                                                                            \
  }

int mlx_array_set_bool(mlx_array* arr, bool val) {
  NULL_DST_CHECK("mlx_array_set_bool");
  return replace(arr, mlx_array_new_bool(val), "mlx_array_set_bool");
}
int mlx_array_set_int(mlx_array* arr, int val) {
  NULL_DST_CHECK("mlx_array_set_int");
  return replace(arr, mlx_array_new_int(val), "mlx_array_set_int");
}
int mlx_array_set_float32(mlx_array* arr, float val) {
  NULL_DST_CHECK("mlx_array_set_float32");
  return replace(arr, mlx_array_new_float32(val), "mlx_array_set_float32");
}
int mlx_array_set_float(mlx_array* arr, float val) {
  NULL_DST_CHECK("mlx_array_set_float");
  return replace(arr, mlx_array_new_float(val), "mlx_array_set_float");
}
int mlx_array_set_float64(mlx_array* arr, double val) {
  NULL_DST_CHECK("mlx_array_set_float64");
  return replace(arr, mlx_array_new_float64(val), "mlx_array_set_float64");
}
int mlx_array_set_double(mlx_array* arr, double val) {
  NULL_DST_CHECK("mlx_array_set_double");
  return replace(arr, mlx_array_new_double(val), "mlx_array_set_double");
}
int mlx_array_set_complex(mlx_array* arr, float real_val, float imag_val) {
  NULL_DST_CHECK("mlx_array_set_complex");
  return replace(arr, mlx_array_new_complex(real_val, imag_val), "mlx_array_set_complex");
}
int mlx_array_set_data(mlx_array* arr, const void* data, const int* shape, int dim,
                       mlx_dtype dtype) {
  NULL_DST_CHECK("mlx_array_set_data");
  return replace(arr, mlx_array_new_data(data, shape, dim, dtype), "mlx_array_set_data");
}

/* ---------- metadata (never waits) ---------- */

size_t mlx_array_itemsize(const mlx_array arr) {
  mlxd_array* a = mlxd_array_of(arr);
  return a ? mlx_dtype_size(a->dtype) : 0;
}
size_t mlx_array_size(const mlx_array arr) {
  mlxd_array* a = mlxd_array_of(arr);
  return a ? a->size : 0;
}
size_t mlx_array_nbytes(const mlx_array arr) {
  mlxd_array* a = mlxd_array_of(arr);
  return a ? a->nbytes : 0;
}
size_t mlx_array_ndim(const mlx_array arr) {
  mlxd_array* a = mlxd_array_of(arr);
  return a ? (size_t)a->ndim : 0;
}
const int* mlx_array_shape(const mlx_array arr) {
  mlxd_array* a = mlxd_array_of(arr);
  return a ? a->shape : NULL;
}
const size_t* mlx_array_strides(const mlx_array arr) {
  mlxd_array* a = mlxd_array_of(arr);
  return a ? a->strides : NULL;
}
int mlx_array_dim(const mlx_array arr, int dim) {
  mlxd_array* a = mlxd_array_of(arr);
  if (!a) {
    mlxd_error("[array] mlx_array_dim got an empty array handle");
    return 0;
  }
  int d = dim < 0 ? dim + a->ndim : dim;
  if (d < 0 || d >= a->ndim) {
    mlxd_error(
        "[array] mlx_array_dim: axis %d is out of range for an array with %d dimensions "
        "(expected %d <= axis < %d)",
        dim, a->ndim, -a->ndim, a->ndim);
    return 0;
  }
  return a->shape[d];
}
mlx_dtype mlx_array_dtype(const mlx_array arr) {
  mlxd_array* a = mlxd_array_of(arr);
  return a ? a->dtype : MLX_BOOL;
}

/* ---------- evaluation and element access ---------- */

int mlx_array_eval(mlx_array arr) {
  mlxd_status st;
  if (!mlxd_array_readable(arr, "mlx_array_eval", &st)) return mlxd_error_status(&st);
  return 0;
}

static mlxd_array* typed(mlx_array arr, size_t csize, const char* fn, const char* cname,
                         mlxd_status* st) {
  mlxd_array* a = mlxd_array_of(arr);
  if (a) {
    size_t isz = mlx_dtype_size(a->dtype);
    if (isz != csize) {
      mlxd_fail(st, MLXD_EINVAL,
                "[array] %s cannot read a %s array (%zu-byte elements) as %s (%zu bytes); use the "
                "accessor of the array's dtype",
                fn, mlxd_dtype_name(a->dtype), isz, cname, csize);
      return NULL;
    }
  }
  return mlxd_array_readable(arr, fn, st);
}

static int item_impl(void* res, size_t csize, mlx_array arr, const char* fn, const char* cname) {
  mlxd_status st;
  if (!res) {
    mlxd_error("[array] %s got a NULL result pointer", fn);
    return 1;
  }
  mlxd_array* a = typed(arr, csize, fn, cname, &st);
  if (!a) return mlxd_error_status(&st);
  if (a->size != 1) {
    mlxd_error("[array] %s needs an array with exactly one element, got %zu elements", fn, a->size);
    return 1;
  }
  memcpy(res, a->data, csize);
  return 0;
}

static const void* data_impl(size_t csize, mlx_array arr, const char* fn, const char* cname) {
  mlxd_status st;
  mlxd_array* a = typed(arr, csize, fn, cname, &st);
  if (!a) {
    mlxd_error_status(&st);
    return NULL;
  }
  return a->data;
}

#define MLXD_ACCESSORS(NAME, T)                                                 \
  int mlx_array_item_##NAME(T* res, const mlx_array arr) {                      \
    return item_impl(res, sizeof(T), arr, "mlx_array_item_" #NAME, #NAME);      \
  }                                                                             \
  const T* mlx_array_data_##NAME(const mlx_array arr) {                         \
    return (const T*)data_impl(sizeof(T), arr, "mlx_array_data_" #NAME, #NAME); \
  }

MLXD_ACCESSORS(bool, bool)
MLXD_ACCESSORS(uint8, uint8_t)
MLXD_ACCESSORS(uint16, uint16_t)
MLXD_ACCESSORS(uint32, uint32_t)
MLXD_ACCESSORS(uint64, uint64_t)
MLXD_ACCESSORS(int8, int8_t)
MLXD_ACCESSORS(int16, int16_t)
MLXD_ACCESSORS(int32, int32_t)
MLXD_ACCESSORS(int64, int64_t)
MLXD_ACCESSORS(float32, float)
MLXD_ACCESSORS(float64, double)
MLXD_ACCESSORS(complex64, mlx_complex64_t)
#ifdef HAS_FLOAT16
MLXD_ACCESSORS(float16, float16_t)
#endif
#ifdef HAS_BFLOAT16
MLXD_ACCESSORS(bfloat16, bfloat16_t)
#endif
