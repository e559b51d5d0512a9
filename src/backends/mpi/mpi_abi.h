/* Private to the mpi plugin: which plugin ABI this build speaks.
 *
 * The plugin is written once against the neutral names below (mpip_*,
 * MPIP_*). A normal build speaks ABI v2 (distributed/abi/plugin_v2.h) and
 * exports mlxdist_plugin_v2; MLXDIST_MPI_PLUGIN_ABI=1 selects the frozen v1
 * header instead (tests/distributed/plugin_v1 builds it that way to prove a
 * v1 plugin still loads), which has no describe op (MPIP_HAS_DESCRIBE 0).
 * Only the chosen header is included: a v1 build cannot use a v2 name. */
#ifndef MLXD_MPI_ABI_H
#define MLXD_MPI_ABI_H

#ifndef MLXDIST_MPI_PLUGIN_ABI
#define MLXDIST_MPI_PLUGIN_ABI 2
#endif

#if MLXDIST_MPI_PLUGIN_ABI == 1
#include "distributed/abi/plugin_v1.h"
#define MPIP_(x) mlxdist_v1_##x
#define MPIP_C(x) MLXDIST_V1_##x
#define MPIP_VERSION MLXDIST_PLUGIN_V1_VERSION
#define MPIP_ENTRY mlxdist_plugin_v1
#define MPIP_HAS_DESCRIBE 0
#elif MLXDIST_MPI_PLUGIN_ABI == 2
#include "distributed/abi/plugin_v2.h"
#define MPIP_(x) mlxdist_v2_##x
#define MPIP_C(x) MLXDIST_V2_##x
#define MPIP_VERSION MLXDIST_PLUGIN_V2_VERSION
#define MPIP_ENTRY mlxdist_plugin_v2
#define MPIP_HAS_DESCRIBE 1
#else
#error "MLXDIST_MPI_PLUGIN_ABI must be 1 or 2"
#endif

typedef MPIP_(status) mpip_status;
typedef MPIP_(host) mpip_host;
typedef MPIP_(bootstrap) mpip_bootstrap;
typedef MPIP_(backend) mpip_backend;
typedef MPIP_(ops) mpip_ops;
typedef MPIP_(plugin) mpip_plugin;
typedef MPIP_(dtype) mpip_dtype;
typedef MPIP_(op) mpip_op;

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
