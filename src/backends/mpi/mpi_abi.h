/* Private to the mpi plugin: which plugin ABI this build speaks.
 *
 * The plugin is written once against the neutral names below (mpip_*,
 * MPIP_*). A normal build speaks ABI v4 (mlx/c/plugin/plugin_v4.h) and
 * exports mlxdist_plugin_v4; MLXDIST_MPI_PLUGIN_ABI=1, 2 or 3 selects a
 * frozen older header instead (tests/distributed/plugin_v1 builds each to
 * prove such plugins still load): v1 has no describe op (MPIP_HAS_DESCRIBE
 * 0), v1 and v2 have no *_ref ops (MPIP_HAS_REF 0: every collective then
 * works on staging copies, mpi_ops.c), v1-v3 have no run op and no abort
 * (MPIP_HAS_RUN 0: no all_to_all, which the core then refuses by name).
 * Only the chosen header is included: an older build cannot use a newer
 * name. */
#ifndef MLXD_MPI_ABI_H
#define MLXD_MPI_ABI_H

#ifndef MLXDIST_MPI_PLUGIN_ABI
#define MLXDIST_MPI_PLUGIN_ABI 4
#endif

#if MLXDIST_MPI_PLUGIN_ABI == 1
#include <mlx/c/plugin/plugin_v1.h>
#define MPIP_(x) mlxdist_v1_##x
#define MPIP_C(x) MLXDIST_V1_##x
#define MPIP_VERSION MLXDIST_PLUGIN_V1_VERSION
#define MPIP_ENTRY mlxdist_plugin_v1
#define MPIP_HAS_DESCRIBE 0
#define MPIP_HAS_REF 0
#define MPIP_HAS_RUN 0
#elif MLXDIST_MPI_PLUGIN_ABI == 2
#include <mlx/c/plugin/plugin_v2.h>
#define MPIP_(x) mlxdist_v2_##x
#define MPIP_C(x) MLXDIST_V2_##x
#define MPIP_VERSION MLXDIST_PLUGIN_V2_VERSION
#define MPIP_ENTRY mlxdist_plugin_v2
#define MPIP_HAS_DESCRIBE 1
#define MPIP_HAS_REF 0
#define MPIP_HAS_RUN 0
#elif MLXDIST_MPI_PLUGIN_ABI == 3
#include <mlx/c/plugin/plugin_v3.h>
#define MPIP_(x) mlxdist_v3_##x
#define MPIP_C(x) MLXDIST_V3_##x
#define MPIP_VERSION MLXDIST_PLUGIN_V3_VERSION
#define MPIP_ENTRY mlxdist_plugin_v3
#define MPIP_HAS_DESCRIBE 1
#define MPIP_HAS_REF 1
#define MPIP_HAS_RUN 0
#elif MLXDIST_MPI_PLUGIN_ABI == 4
#include <mlx/c/plugin/plugin_v4.h>
#define MPIP_(x) mlxdist_v4_##x
#define MPIP_C(x) MLXDIST_V4_##x
#define MPIP_VERSION MLXDIST_PLUGIN_V4_VERSION
#define MPIP_ENTRY mlxdist_plugin_v4
#define MPIP_HAS_DESCRIBE 1
#define MPIP_HAS_REF 1
#define MPIP_HAS_RUN 1
#else
#error "MLXDIST_MPI_PLUGIN_ABI must be 1, 2, 3 or 4"
#endif

typedef MPIP_(status) mpip_status;
typedef MPIP_(host) mpip_host;
typedef MPIP_(bootstrap) mpip_bootstrap;
typedef MPIP_(backend) mpip_backend;
typedef MPIP_(ops) mpip_ops;
typedef MPIP_(plugin) mpip_plugin;
typedef MPIP_(dtype) mpip_dtype;
typedef MPIP_(op) mpip_op;
#if MPIP_HAS_RUN
typedef MPIP_(call) mpip_call;
#endif
#if MPIP_HAS_REF
typedef MPIP_(bufref) mpip_bufref;
typedef MPIP_(hold) mpip_hold;
#else
/* Never defined: older ABIs have no caller's arrays to hold (always NULL). */
typedef struct mpip_no_bufref mpip_bufref;
typedef struct mpip_hold {
  void* unused;
} mpip_hold;
#endif

enum {
  MPIP_EINVAL = MPIP_C(EINVAL),
  MPIP_ETIMEDOUT = MPIP_C(ETIMEDOUT),
  MPIP_EREMOTE = MPIP_C(EREMOTE),
  MPIP_ESYS = MPIP_C(ESYS),
  MPIP_ENOMEM = MPIP_C(ENOMEM),
  MPIP_EUNAVAIL = MPIP_C(EUNAVAIL),
  MPIP_EABORTED = MPIP_C(EABORTED),
};
enum {
  MPIP_BOOL = MPIP_C(DTYPE_BOOL),
  MPIP_UINT8 = MPIP_C(DTYPE_UINT8),
  MPIP_UINT16 = MPIP_C(DTYPE_UINT16),
  MPIP_UINT32 = MPIP_C(DTYPE_UINT32),
  MPIP_UINT64 = MPIP_C(DTYPE_UINT64),
  MPIP_INT8 = MPIP_C(DTYPE_INT8),
  MPIP_INT16 = MPIP_C(DTYPE_INT16),
  MPIP_INT32 = MPIP_C(DTYPE_INT32),
  MPIP_INT64 = MPIP_C(DTYPE_INT64),
  MPIP_FLOAT16 = MPIP_C(DTYPE_FLOAT16),
  MPIP_FLOAT32 = MPIP_C(DTYPE_FLOAT32),
  MPIP_FLOAT64 = MPIP_C(DTYPE_FLOAT64),
  MPIP_BFLOAT16 = MPIP_C(DTYPE_BFLOAT16),
  MPIP_COMPLEX64 = MPIP_C(DTYPE_COMPLEX64),
  MPIP_DTYPE_COUNT = MPIP_C(DTYPE_COUNT),
};
enum {
  MPIP_SUM = MPIP_C(OP_SUM),
  MPIP_MAX = MPIP_C(OP_MAX),
  MPIP_MIN = MPIP_C(OP_MIN),
  MPIP_OP_COUNT = MPIP_C(OP_COUNT),
};
#define MPIP_DEVICE_CPU MPIP_C(DEVICE_CPU)

#endif
