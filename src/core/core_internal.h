/* Private to src/core: helpers shared between the core's source files. */
#ifndef MLXD_CORE_INTERNAL_H
#define MLXD_CORE_INTERNAL_H

#include <stddef.h>

#include "core/array_impl.h"
#include "mlx/c/device.h"
#include "mlx/c/string.h"
#include "util/status.h"

/* Strings (string.c). */
/* A new string holding n bytes of str; empty handle (not reported) on failure. */
mlx_string mlxd_string_from(const char* str, size_t n);
/* Replace *res with a new string of str; reports (prefixed by tag) and returns non-zero on failure. */
int mlxd_string_put(mlx_string* res, const char* str, const char* tag);

/* Devices (device.c). */
/* A new device handle; empty handle with st set on failure. */
mlx_device mlxd_device_make(mlx_device_type type, int index, mlxd_status* st);
/* Read a device handle; non-zero with st set for an empty handle. */
int mlxd_device_read(mlx_device dev, mlx_device_type* type, int* index, mlxd_status* st);
/* Whether (type, index) is usable in this process; non-zero with st set if not. */
int mlxd_device_check_available(mlx_device_type type, int index, mlxd_status* st);
const char* mlxd_device_type_name(mlx_device_type type);

/* Arrays (array.c). */
/* MLXDIST_SPIN_US in seconds, read once per process. */
double mlxd_core_spin_s(void);
/* Check a handle for reading: non-empty, waited for, not failed. NULL with st set otherwise. */
mlxd_array* mlxd_array_readable(mlx_array arr, const char* fn, mlxd_status* st);

/* A pause hint for spin loops. */
static inline void mlxd_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
  __asm__ __volatile__("yield");
#endif
}

#endif
