/* Devices: small reference-counted {type, index} objects. The CPU (index 0)
 * always exists; GPUs exist where the GPU provider (core/gpu.h) finds the
 * CUDA runtime and it reports devices. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/core_internal.h"
#include "core/error.h"
#include "core/fork.h"
#include "core/gpu.h"
#include "mlx/c/device.h"

typedef struct mlxd_device {
  atomic_int refs;
  mlx_device_type type;
  int index;
} mlxd_device;

static pthread_mutex_t g_default_mu = PTHREAD_MUTEX_INITIALIZER;
__attribute__((constructor)) static void device_fork_guard(void) { mlxd_fork_guard(&g_default_mu); }
static mlx_device_type g_default_type = MLX_CPU;
static int g_default_index = 0;

const char* mlxd_device_type_name(mlx_device_type type) {
  switch (type) {
    case MLX_CPU: return "cpu";
    case MLX_GPU: return "gpu";
  }
  return "unknown";
}

mlx_device mlxd_device_make(mlx_device_type type, int index, mlxd_status* st) {
  mlx_device h = {NULL};
  if (type != MLX_CPU && type != MLX_GPU) {
    mlxd_fail(st, MLXD_EINVAL, "[device] unknown device type %d (expected MLX_CPU or MLX_GPU)",
              (int)type);
    return h;
  }
  if (index < 0) {
    mlxd_fail(st, MLXD_EINVAL, "[device] device index %d is negative (expected >= 0)", index);
    return h;
  }
  mlxd_device* d = malloc(sizeof *d);
  if (!d) {
    mlxd_fail(st, MLXD_ENOMEM, "[device] out of memory creating a device handle");
    return h;
  }
  atomic_init(&d->refs, 1);
  d->type = type;
  d->index = index;
  h.ctx = d;
  return h;
}

int mlxd_device_read(mlx_device dev, mlx_device_type* type, int* index, mlxd_status* st) {
  mlxd_device* d = dev.ctx;
  if (!d)
    return mlxd_fail(st, MLXD_EINVAL,
                     "[device] empty device handle (expected one from mlx_device_new_type or "
                     "mlx_get_default_device)");
  if (type) *type = d->type;
  if (index) *index = d->index;
  return 0;
}

int mlxd_device_check_available(mlx_device_type type, int index, mlxd_status* st) {
  if (type == MLX_GPU) {
    int n = mlxd_gpu_count();
    if (n <= 0) {
      mlxd_status why;
      mlxd_gpu_unavailable(&why, "");
      return mlxd_fail(st, MLXD_EUNAVAIL,
                       "[device] Device(gpu, %d) is not available:%.400s (use the CPU, Device(cpu, "
                       "0))",
                       index, why.msg);
    }
    if (index >= n)
      return mlxd_fail(st, MLXD_EUNAVAIL, "[device] Device(gpu, %d) does not exist (%d GPU%s here)",
                       index, n, n == 1 ? "" : "s");
    return 0;
  }
  if (type != MLX_CPU)
    return mlxd_fail(st, MLXD_EINVAL,
                     "[device] unknown device type %d (expected MLX_CPU or MLX_GPU)", (int)type);
  if (index != 0)
    return mlxd_fail(st, MLXD_EUNAVAIL,
                     "[device] Device(cpu, %d) does not exist (the only CPU device is index 0)",
                     index);
  return 0;
}

mlx_device mlx_device_new(void) {
  mlx_device h = {NULL};
  return h;
}

mlx_device mlx_device_new_type(mlx_device_type type, int index) {
  mlxd_status st;
  mlxd_status_clear(&st);
  mlx_device h = mlxd_device_make(type, index, &st);
  if (!h.ctx) mlxd_error_status(&st);
  return h;
}

int mlx_device_free(mlx_device dev) {
  mlxd_device* d = dev.ctx;
  if (d && atomic_fetch_sub_explicit(&d->refs, 1, memory_order_acq_rel) == 1) free(d);
  return 0;
}

int mlx_device_set(mlx_device* dev, const mlx_device src) {
  if (!dev) {
    mlxd_error("[device] mlx_device_set got a NULL destination pointer");
    return 1;
  }
  mlxd_device* s = src.ctx;
  if (s) atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
  mlx_device_free(*dev);
  dev->ctx = s;
  return 0;
}

int mlx_device_tostring(mlx_string* str, mlx_device dev) {
  mlxd_status st;
  mlx_device_type type = MLX_CPU; /* set by mlxd_device_read; initialised for gcc's */
  int index = 0;                  /* -Wmaybe-uninitialized (it cannot see mlxd_fail != 0) */
  if (mlxd_device_read(dev, &type, &index, &st)) return mlxd_error_status(&st);
  char buf[64];
  snprintf(buf, sizeof buf, "Device(%s, %d)", mlxd_device_type_name(type), index);
  return mlxd_string_put(str, buf, "[device] mlx_device_tostring");
}

bool mlx_device_equal(mlx_device lhs, mlx_device rhs) {
  mlxd_device* a = lhs.ctx;
  mlxd_device* b = rhs.ctx;
  if (!a || !b) return a == b;
  return a->type == b->type && a->index == b->index;
}

int mlx_device_get_index(int* index, mlx_device dev) {
  mlxd_status st;
  if (!index) {
    mlxd_error("[device] mlx_device_get_index got a NULL result pointer");
    return 1;
  }
  if (mlxd_device_read(dev, NULL, index, &st)) return mlxd_error_status(&st);
  return 0;
}

int mlx_device_get_type(mlx_device_type* type, mlx_device dev) {
  mlxd_status st;
  if (!type) {
    mlxd_error("[device] mlx_device_get_type got a NULL result pointer");
    return 1;
  }
  if (mlxd_device_read(dev, type, NULL, &st)) return mlxd_error_status(&st);
  return 0;
}

int mlx_get_default_device(mlx_device* dev) {
  if (!dev) {
    mlxd_error("[device] mlx_get_default_device got a NULL result pointer");
    return 1;
  }
  pthread_mutex_lock(&g_default_mu);
  mlx_device_type type = g_default_type;
  int index = g_default_index;
  pthread_mutex_unlock(&g_default_mu);
  mlxd_status st;
  mlx_device h = mlxd_device_make(type, index, &st);
  if (!h.ctx) return mlxd_error_status(&st);
  mlx_device_free(*dev);
  *dev = h;
  return 0;
}

int mlx_set_default_device(mlx_device dev) {
  mlxd_status st;
  mlx_device_type type = MLX_CPU; /* set by mlxd_device_read; initialised for gcc's */
  int index = 0;                  /* -Wmaybe-uninitialized (it cannot see mlxd_fail != 0) */
  if (mlxd_device_read(dev, &type, &index, &st) || mlxd_device_check_available(type, index, &st))
    return mlxd_error_status(&st);
  pthread_mutex_lock(&g_default_mu);
  g_default_type = type;
  g_default_index = index;
  pthread_mutex_unlock(&g_default_mu);
  return 0;
}

int mlx_device_is_available(bool* avail, mlx_device dev) {
  mlxd_status st;
  mlx_device_type type = MLX_CPU; /* set by mlxd_device_read; initialised for gcc's */
  int index = 0;                  /* -Wmaybe-uninitialized (it cannot see mlxd_fail != 0) */
  if (!avail) {
    mlxd_error("[device] mlx_device_is_available got a NULL result pointer");
    return 1;
  }
  if (mlxd_device_read(dev, &type, &index, &st)) return mlxd_error_status(&st);
  *avail = mlxd_device_check_available(type, index, &st) == 0;
  return 0;
}

int mlx_device_count(int* count, mlx_device_type type) {
  if (!count) {
    mlxd_error("[device] mlx_device_count got a NULL result pointer");
    return 1;
  }
  switch (type) {
    case MLX_CPU: *count = 1; return 0;
    case MLX_GPU: *count = mlxd_gpu_count(); return 0;
  }
  mlxd_error("[device] unknown device type %d (expected MLX_CPU or MLX_GPU)", (int)type);
  return 1;
}
