/* Private to plugin_adapter.c: compile-time proof that the adapter may read
 * every plugin ABI version through the newest one's types (v4): the ABI's
 * fixed values equal the core's enums, older versions' values equal v4's,
 * and every table of v1, v2 and v3 is a layout prefix of v4's, member by
 * member (docs/plugin-abi.md, "The rules"). Included once. */
#ifndef MLXD_PLUGIN_LAYOUT_H
#define MLXD_PLUGIN_LAYOUT_H

#include <stddef.h>

#include <mlx/c/plugin/plugin_v1.h>
#include <mlx/c/plugin/plugin_v2.h>
#include <mlx/c/plugin/plugin_v3.h>
#include <mlx/c/plugin/plugin_v4.h>
#include "mlx/c/array.h"
#include "mlx/c/device.h"
#include "reduce/reduce.h"
#include "util/status.h"

/* ---- the ABI's values are the core's ---- */

/* Compared as ints: the ABI's enums are not the core's enum types. */
#define EQ(a, b) ((int)(a) == (int)(b))
_Static_assert(EQ(MLXDIST_V4_OK, MLXD_OK) && EQ(MLXDIST_V4_EINVAL, MLXD_EINVAL) &&
                   EQ(MLXDIST_V4_ETIMEDOUT, MLXD_ETIMEDOUT) &&
                   EQ(MLXDIST_V4_EREMOTE, MLXD_EREMOTE) && EQ(MLXDIST_V4_ESYS, MLXD_ESYS) &&
                   EQ(MLXDIST_V4_ENOMEM, MLXD_ENOMEM) && EQ(MLXDIST_V4_EUNAVAIL, MLXD_EUNAVAIL) &&
                   EQ(MLXDIST_V4_EABORTED, MLXD_EABORTED) &&
                   EQ(MLXDIST_V4_ECALLBACK, MLXD_ECALLBACK),
               "plugin ABI status codes must equal mlxd_code");
_Static_assert(EQ(MLXDIST_V4_DTYPE_BOOL, MLX_BOOL) && EQ(MLXDIST_V4_DTYPE_UINT8, MLX_UINT8) &&
                   EQ(MLXDIST_V4_DTYPE_UINT16, MLX_UINT16) &&
                   EQ(MLXDIST_V4_DTYPE_UINT32, MLX_UINT32) &&
                   EQ(MLXDIST_V4_DTYPE_UINT64, MLX_UINT64) && EQ(MLXDIST_V4_DTYPE_INT8, MLX_INT8) &&
                   EQ(MLXDIST_V4_DTYPE_INT16, MLX_INT16) && EQ(MLXDIST_V4_DTYPE_INT32, MLX_INT32) &&
                   EQ(MLXDIST_V4_DTYPE_INT64, MLX_INT64) &&
                   EQ(MLXDIST_V4_DTYPE_FLOAT16, MLX_FLOAT16) &&
                   EQ(MLXDIST_V4_DTYPE_FLOAT32, MLX_FLOAT32) &&
                   EQ(MLXDIST_V4_DTYPE_FLOAT64, MLX_FLOAT64) &&
                   EQ(MLXDIST_V4_DTYPE_BFLOAT16, MLX_BFLOAT16) &&
                   EQ(MLXDIST_V4_DTYPE_COMPLEX64, MLX_COMPLEX64) &&
                   EQ(MLXDIST_V4_DTYPE_COUNT, MLX_COMPLEX64 + 1),
               "plugin ABI dtypes must equal mlx_dtype");
_Static_assert(EQ(MLXDIST_V4_OP_SUM, MLXD_SUM) && EQ(MLXDIST_V4_OP_MAX, MLXD_MAX) &&
                   EQ(MLXDIST_V4_OP_MIN, MLXD_MIN) && MLXDIST_V4_OP_COUNT == 3,
               "plugin ABI reduce ops must equal mlxd_reduce_op");
_Static_assert(EQ(MLXDIST_V4_DEVICE_CPU, MLX_CPU) && EQ(MLXDIST_V4_DEVICE_GPU, MLX_GPU),
               "plugin ABI devices must equal mlx_device_type");
_Static_assert(MLXDIST_V4_MSG_MAX <= MLXD_MSG_MAX, "a plugin's message must fit in mlxd_status");

/* v1, v2 and v3 values are v4 values */
_Static_assert(EQ(MLXDIST_V1_ECALLBACK, MLXDIST_V4_ECALLBACK) &&
                   EQ(MLXDIST_V1_DTYPE_COMPLEX64, MLXDIST_V4_DTYPE_COMPLEX64) &&
                   EQ(MLXDIST_V1_OP_MIN, MLXDIST_V4_OP_MIN) &&
                   EQ(MLXDIST_V1_DEVICE_GPU, MLXDIST_V4_DEVICE_GPU) &&
                   EQ(MLXDIST_V1_MSG_MAX, MLXDIST_V4_MSG_MAX),
               "v1 values must equal v4 values");
_Static_assert(EQ(MLXDIST_V2_ECALLBACK, MLXDIST_V4_ECALLBACK) &&
                   EQ(MLXDIST_V2_DTYPE_COMPLEX64, MLXDIST_V4_DTYPE_COMPLEX64) &&
                   EQ(MLXDIST_V2_OP_MIN, MLXDIST_V4_OP_MIN) &&
                   EQ(MLXDIST_V2_DEVICE_GPU, MLXDIST_V4_DEVICE_GPU) &&
                   EQ(MLXDIST_V2_MSG_MAX, MLXDIST_V4_MSG_MAX),
               "v2 values must equal v4 values");
_Static_assert(EQ(MLXDIST_V3_ECALLBACK, MLXDIST_V4_ECALLBACK) &&
                   EQ(MLXDIST_V3_DTYPE_COMPLEX64, MLXDIST_V4_DTYPE_COMPLEX64) &&
                   EQ(MLXDIST_V3_OP_MIN, MLXDIST_V4_OP_MIN) &&
                   EQ(MLXDIST_V3_DEVICE_GPU, MLXDIST_V4_DEVICE_GPU) &&
                   EQ(MLXDIST_V3_MSG_MAX, MLXDIST_V4_MSG_MAX) &&
                   EQ(MLXDIST_V3_HOLD_WORDS, MLXDIST_V4_HOLD_WORDS),
               "v3 values must equal v4 values");

_Static_assert(MLXDIST_PLUGIN_V1_VERSION == 1 && MLXDIST_PLUGIN_V2_VERSION == 2 &&
                   MLXDIST_PLUGIN_V3_VERSION == 3 && MLXDIST_PLUGIN_V4_VERSION == 4,
               "each header's version is its number");
_Static_assert(MLXDIST_V4_KIND_COUNT <= 64, "run_kinds has a bit for every kind");

/* v1, v2 and v3 tables are prefixes of v4 tables */
#define SAME_MEMBER(T1, T2, m)                                                                     \
  _Static_assert(offsetof(T1, m) == offsetof(T2, m) && sizeof(((T1*)0)->m) == sizeof(((T2*)0)->m), \
                 #T1 "." #m " must sit where " #T2 "." #m " does")
SAME_MEMBER(mlxdist_v1_status, mlxdist_v4_status, code);
SAME_MEMBER(mlxdist_v1_status, mlxdist_v4_status, has_peer);
SAME_MEMBER(mlxdist_v1_status, mlxdist_v4_status, peer);
SAME_MEMBER(mlxdist_v1_status, mlxdist_v4_status, sys_errno);
SAME_MEMBER(mlxdist_v1_status, mlxdist_v4_status, msg);
_Static_assert(sizeof(mlxdist_v1_status) == sizeof(mlxdist_v4_status), "status size");
SAME_MEMBER(mlxdist_v1_host, mlxdist_v4_host, struct_size);
SAME_MEMBER(mlxdist_v1_host, mlxdist_v4_host, version);
SAME_MEMBER(mlxdist_v1_host, mlxdist_v4_host, reduce);
SAME_MEMBER(mlxdist_v1_host, mlxdist_v4_host, dtype_size);
SAME_MEMBER(mlxdist_v1_host, mlxdist_v4_host, timeout_s);
SAME_MEMBER(mlxdist_v1_host, mlxdist_v4_host, spin_us);
SAME_MEMBER(mlxdist_v1_bootstrap, mlxdist_v4_bootstrap, struct_size);
SAME_MEMBER(mlxdist_v1_bootstrap, mlxdist_v4_bootstrap, rank);
SAME_MEMBER(mlxdist_v1_bootstrap, mlxdist_v4_bootstrap, size);
SAME_MEMBER(mlxdist_v1_bootstrap, mlxdist_v4_bootstrap, all_gather);
SAME_MEMBER(mlxdist_v1_backend, mlxdist_v4_backend, ops);
SAME_MEMBER(mlxdist_v1_backend, mlxdist_v4_backend, rank);
SAME_MEMBER(mlxdist_v1_backend, mlxdist_v4_backend, size);
SAME_MEMBER(mlxdist_v1_backend, mlxdist_v4_backend, device);
SAME_MEMBER(mlxdist_v1_ops, mlxdist_v4_ops, struct_size);
SAME_MEMBER(mlxdist_v1_ops, mlxdist_v4_ops, all_reduce);
SAME_MEMBER(mlxdist_v1_ops, mlxdist_v4_ops, all_gather);
SAME_MEMBER(mlxdist_v1_ops, mlxdist_v4_ops, reduce_scatter);
SAME_MEMBER(mlxdist_v1_ops, mlxdist_v4_ops, send);
SAME_MEMBER(mlxdist_v1_ops, mlxdist_v4_ops, recv);
SAME_MEMBER(mlxdist_v1_ops, mlxdist_v4_ops, split);
SAME_MEMBER(mlxdist_v1_ops, mlxdist_v4_ops, destroy);
SAME_MEMBER(mlxdist_v1_plugin, mlxdist_v4_plugin, struct_size);
SAME_MEMBER(mlxdist_v1_plugin, mlxdist_v4_plugin, version);
SAME_MEMBER(mlxdist_v1_plugin, mlxdist_v4_plugin, name);
SAME_MEMBER(mlxdist_v1_plugin, mlxdist_v4_plugin, is_available);
SAME_MEMBER(mlxdist_v1_plugin, mlxdist_v4_plugin, is_configured);
SAME_MEMBER(mlxdist_v1_plugin, mlxdist_v4_plugin, supports_bootstrap);
SAME_MEMBER(mlxdist_v1_plugin, mlxdist_v4_plugin, create);
_Static_assert(sizeof(mlxdist_v1_plugin) == sizeof(mlxdist_v4_plugin),
               "v2, v3 and v4 added no plugin member");
_Static_assert(sizeof(mlxdist_v1_host) == sizeof(mlxdist_v4_host),
               "v2, v3 and v4 added no host member");

SAME_MEMBER(mlxdist_v2_status, mlxdist_v4_status, code);
SAME_MEMBER(mlxdist_v2_status, mlxdist_v4_status, has_peer);
SAME_MEMBER(mlxdist_v2_status, mlxdist_v4_status, peer);
SAME_MEMBER(mlxdist_v2_status, mlxdist_v4_status, sys_errno);
SAME_MEMBER(mlxdist_v2_status, mlxdist_v4_status, msg);
SAME_MEMBER(mlxdist_v2_host, mlxdist_v4_host, struct_size);
SAME_MEMBER(mlxdist_v2_host, mlxdist_v4_host, version);
SAME_MEMBER(mlxdist_v2_host, mlxdist_v4_host, reduce);
SAME_MEMBER(mlxdist_v2_host, mlxdist_v4_host, dtype_size);
SAME_MEMBER(mlxdist_v2_host, mlxdist_v4_host, timeout_s);
SAME_MEMBER(mlxdist_v2_host, mlxdist_v4_host, spin_us);
SAME_MEMBER(mlxdist_v2_bootstrap, mlxdist_v4_bootstrap, struct_size);
SAME_MEMBER(mlxdist_v2_bootstrap, mlxdist_v4_bootstrap, rank);
SAME_MEMBER(mlxdist_v2_bootstrap, mlxdist_v4_bootstrap, size);
SAME_MEMBER(mlxdist_v2_bootstrap, mlxdist_v4_bootstrap, all_gather);
SAME_MEMBER(mlxdist_v2_backend, mlxdist_v4_backend, ops);
SAME_MEMBER(mlxdist_v2_backend, mlxdist_v4_backend, rank);
SAME_MEMBER(mlxdist_v2_backend, mlxdist_v4_backend, size);
SAME_MEMBER(mlxdist_v2_backend, mlxdist_v4_backend, device);
SAME_MEMBER(mlxdist_v2_ops, mlxdist_v4_ops, struct_size);
SAME_MEMBER(mlxdist_v2_ops, mlxdist_v4_ops, all_reduce);
SAME_MEMBER(mlxdist_v2_ops, mlxdist_v4_ops, all_gather);
SAME_MEMBER(mlxdist_v2_ops, mlxdist_v4_ops, reduce_scatter);
SAME_MEMBER(mlxdist_v2_ops, mlxdist_v4_ops, send);
SAME_MEMBER(mlxdist_v2_ops, mlxdist_v4_ops, recv);
SAME_MEMBER(mlxdist_v2_ops, mlxdist_v4_ops, split);
SAME_MEMBER(mlxdist_v2_ops, mlxdist_v4_ops, destroy);
SAME_MEMBER(mlxdist_v2_plugin, mlxdist_v4_plugin, struct_size);
SAME_MEMBER(mlxdist_v2_plugin, mlxdist_v4_plugin, version);
SAME_MEMBER(mlxdist_v2_plugin, mlxdist_v4_plugin, name);
SAME_MEMBER(mlxdist_v2_plugin, mlxdist_v4_plugin, is_available);
SAME_MEMBER(mlxdist_v2_plugin, mlxdist_v4_plugin, is_configured);
SAME_MEMBER(mlxdist_v2_plugin, mlxdist_v4_plugin, supports_bootstrap);
SAME_MEMBER(mlxdist_v2_plugin, mlxdist_v4_plugin, create);
SAME_MEMBER(mlxdist_v2_ops, mlxdist_v4_ops, describe);
_Static_assert(sizeof(mlxdist_v2_status) == sizeof(mlxdist_v4_status), "status size");
_Static_assert(sizeof(mlxdist_v2_plugin) == sizeof(mlxdist_v4_plugin),
               "v3 and v4 added no plugin member");
_Static_assert(sizeof(mlxdist_v2_host) == sizeof(mlxdist_v4_host),
               "v3 and v4 added no host member");
_Static_assert(sizeof(mlxdist_v2_bootstrap) == sizeof(mlxdist_v4_bootstrap),
               "v3 and v4 changed no bootstrap");
_Static_assert(sizeof(mlxdist_v2_backend) == sizeof(mlxdist_v4_backend),
               "v3 and v4 changed no backend");

SAME_MEMBER(mlxdist_v3_status, mlxdist_v4_status, code);
SAME_MEMBER(mlxdist_v3_status, mlxdist_v4_status, has_peer);
SAME_MEMBER(mlxdist_v3_status, mlxdist_v4_status, peer);
SAME_MEMBER(mlxdist_v3_status, mlxdist_v4_status, sys_errno);
SAME_MEMBER(mlxdist_v3_status, mlxdist_v4_status, msg);
SAME_MEMBER(mlxdist_v3_host, mlxdist_v4_host, struct_size);
SAME_MEMBER(mlxdist_v3_host, mlxdist_v4_host, version);
SAME_MEMBER(mlxdist_v3_host, mlxdist_v4_host, reduce);
SAME_MEMBER(mlxdist_v3_host, mlxdist_v4_host, dtype_size);
SAME_MEMBER(mlxdist_v3_host, mlxdist_v4_host, timeout_s);
SAME_MEMBER(mlxdist_v3_host, mlxdist_v4_host, spin_us);
SAME_MEMBER(mlxdist_v3_bootstrap, mlxdist_v4_bootstrap, struct_size);
SAME_MEMBER(mlxdist_v3_bootstrap, mlxdist_v4_bootstrap, rank);
SAME_MEMBER(mlxdist_v3_bootstrap, mlxdist_v4_bootstrap, size);
SAME_MEMBER(mlxdist_v3_bootstrap, mlxdist_v4_bootstrap, all_gather);
SAME_MEMBER(mlxdist_v3_backend, mlxdist_v4_backend, ops);
SAME_MEMBER(mlxdist_v3_backend, mlxdist_v4_backend, rank);
SAME_MEMBER(mlxdist_v3_backend, mlxdist_v4_backend, size);
SAME_MEMBER(mlxdist_v3_backend, mlxdist_v4_backend, device);
SAME_MEMBER(mlxdist_v3_hold, mlxdist_v4_hold, word);
SAME_MEMBER(mlxdist_v3_bufref, mlxdist_v4_bufref, struct_size);
SAME_MEMBER(mlxdist_v3_bufref, mlxdist_v4_bufref, ctx);
SAME_MEMBER(mlxdist_v3_bufref, mlxdist_v4_bufref, hold);
SAME_MEMBER(mlxdist_v3_bufref, mlxdist_v4_bufref, release);
SAME_MEMBER(mlxdist_v3_ops, mlxdist_v4_ops, struct_size);
SAME_MEMBER(mlxdist_v3_ops, mlxdist_v4_ops, all_reduce);
SAME_MEMBER(mlxdist_v3_ops, mlxdist_v4_ops, all_gather);
SAME_MEMBER(mlxdist_v3_ops, mlxdist_v4_ops, reduce_scatter);
SAME_MEMBER(mlxdist_v3_ops, mlxdist_v4_ops, send);
SAME_MEMBER(mlxdist_v3_ops, mlxdist_v4_ops, recv);
SAME_MEMBER(mlxdist_v3_ops, mlxdist_v4_ops, split);
SAME_MEMBER(mlxdist_v3_ops, mlxdist_v4_ops, destroy);
SAME_MEMBER(mlxdist_v3_ops, mlxdist_v4_ops, describe);
SAME_MEMBER(mlxdist_v3_ops, mlxdist_v4_ops, all_reduce_ref);
SAME_MEMBER(mlxdist_v3_ops, mlxdist_v4_ops, all_gather_ref);
SAME_MEMBER(mlxdist_v3_ops, mlxdist_v4_ops, reduce_scatter_ref);
SAME_MEMBER(mlxdist_v3_ops, mlxdist_v4_ops, send_ref);
SAME_MEMBER(mlxdist_v3_ops, mlxdist_v4_ops, recv_ref);
SAME_MEMBER(mlxdist_v3_plugin, mlxdist_v4_plugin, struct_size);
SAME_MEMBER(mlxdist_v3_plugin, mlxdist_v4_plugin, version);
SAME_MEMBER(mlxdist_v3_plugin, mlxdist_v4_plugin, name);
SAME_MEMBER(mlxdist_v3_plugin, mlxdist_v4_plugin, is_available);
SAME_MEMBER(mlxdist_v3_plugin, mlxdist_v4_plugin, is_configured);
SAME_MEMBER(mlxdist_v3_plugin, mlxdist_v4_plugin, supports_bootstrap);
SAME_MEMBER(mlxdist_v3_plugin, mlxdist_v4_plugin, create);
_Static_assert(sizeof(mlxdist_v3_status) == sizeof(mlxdist_v4_status), "status size");
_Static_assert(sizeof(mlxdist_v3_plugin) == sizeof(mlxdist_v4_plugin), "v4 added no plugin member");
_Static_assert(sizeof(mlxdist_v3_host) == sizeof(mlxdist_v4_host), "v4 added no host member");
_Static_assert(sizeof(mlxdist_v3_bootstrap) == sizeof(mlxdist_v4_bootstrap),
               "v4 changed no bootstrap");
_Static_assert(sizeof(mlxdist_v3_backend) == sizeof(mlxdist_v4_backend), "v4 changed no backend");
_Static_assert(sizeof(mlxdist_v3_bufref) == sizeof(mlxdist_v4_bufref), "v4 changed no bufref");
_Static_assert(sizeof(mlxdist_v3_ops) < sizeof(mlxdist_v4_ops), "v4 appends to the ops table");

#endif
