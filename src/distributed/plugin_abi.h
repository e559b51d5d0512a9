/* Private: the ABI between libmlxdist and backend plugins.
 *
 * A plugin is a shared object named libmlxdist-<name>.so (e.g.
 * libmlxdist-mpi.so) that exports one symbol, MLXD_PLUGIN_SYMBOL. It does
 * not link libmlxdist: whatever it needs from the core comes through the
 * host table. Both tables start with (abi_version, struct_size) so that
 * later versions can grow them at the end. */
#ifndef MLXD_PLUGIN_ABI_H
#define MLXD_PLUGIN_ABI_H

#include <stddef.h>
#include <stdint.h>

#include "distributed/backend.h"

#define MLXD_PLUGIN_ABI_VERSION 1u
#define MLXD_PLUGIN_SYMBOL "mlxdist_plugin_v1"

typedef struct mlxd_host_api {
  uint32_t abi_version; /* MLXD_PLUGIN_ABI_VERSION */
  uint32_t struct_size; /* sizeof(mlxd_host_api) */
  void (*reduce)(mlxd_reduce_op op, mlx_dtype dtype, void* acc, const void* in, size_t count);
  size_t (*dtype_size)(mlx_dtype dtype);
  double (*timeout_s)(void); /* MLXDIST_TIMEOUT */
  double (*spin_us)(void);   /* MLXDIST_SPIN_US */
} mlxd_host_api;

typedef struct mlxd_plugin {
  uint32_t abi_version; /* MLXD_PLUGIN_ABI_VERSION */
  uint32_t struct_size; /* sizeof(mlxd_plugin) */
  mlxd_backend_kind kind;
} mlxd_plugin;

/* The one exported entry point. Returns NULL if the host is incompatible. */
typedef const mlxd_plugin* (*mlxd_plugin_entry)(const mlxd_host_api* host);

/* Core side (distributed/plugin.c): load libmlxdist-<name>.so and return its
 * kind, or NULL with why set (searched paths, dlerror text). Cached. */
const mlxd_backend_kind* mlxd_plugin_load(const char* name, char* why, size_t why_len);

#endif
