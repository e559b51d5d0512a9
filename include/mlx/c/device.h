/* mlxdist: devices (mlx-c's device.h). */
#ifndef MLX_DEVICE_H
#define MLX_DEVICE_H

#include <stdbool.h>

#include "mlx/c/export.h"
#include "mlx/c/string.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A device handle. ctx == NULL is the empty handle. */
typedef struct mlx_device_ {
  void* ctx;
} mlx_device;

/** Device kinds, with mlx-c's values. */
typedef enum mlx_device_type_ { MLX_CPU, MLX_GPU } mlx_device_type;

/** An empty handle. */
MLXDIST_API mlx_device mlx_device_new(void);
/** A handle for device `index` of `type` (it need not be available; see mlx_device_is_available). */
MLXDIST_API mlx_device mlx_device_new_type(mlx_device_type type, int index);
MLXDIST_API int mlx_device_free(mlx_device dev);
MLXDIST_API int mlx_device_set(mlx_device* dev, const mlx_device src);
/** "Device(cpu, 0)" or "Device(gpu, 0)". */
MLXDIST_API int mlx_device_tostring(mlx_string* str, mlx_device dev);
/** Same type and index. Two empty handles are equal. */
MLXDIST_API bool mlx_device_equal(mlx_device lhs, mlx_device rhs);
MLXDIST_API int mlx_device_get_index(int* index, mlx_device dev);
MLXDIST_API int mlx_device_get_type(mlx_device_type* type, mlx_device dev);
/** The default device: the CPU unless mlx_set_default_device chose another. */
MLXDIST_API int mlx_get_default_device(mlx_device* dev);
/** Set the default device; an unavailable device is an error. */
MLXDIST_API int mlx_set_default_device(mlx_device dev);
/** Whether the device can run work in this process (CPU: yes; GPU: only with a GPU backend). */
MLXDIST_API int mlx_device_is_available(bool* avail, mlx_device dev);
/** How many devices of this type are available. */
MLXDIST_API int mlx_device_count(int* count, mlx_device_type type);

#ifdef __cplusplus
}
#endif
#endif /* MLX_DEVICE_H */
