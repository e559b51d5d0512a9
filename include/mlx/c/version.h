/* mlxdist: library version. */
#ifndef MLX_VERSION_H
#define MLX_VERSION_H

#include "mlx/c/export.h"
#include "mlx/c/string.h"

#define MLXDIST_VERSION_MAJOR 0
#define MLXDIST_VERSION_MINOR 1
#define MLXDIST_VERSION_PATCH 0
/** The version as one number: major * 10000 + minor * 100 + patch. */
#define MLXDIST_VERSION                                          \
  (MLXDIST_VERSION_MAJOR * 10000 + MLXDIST_VERSION_MINOR * 100 + \
   MLXDIST_VERSION_PATCH)
#define MLXDIST_VERSION_STRING "0.1.0"

#ifdef __cplusplus
extern "C" {
#endif

/** Write the library's version ("0.1.0") to *str_. */
MLXDIST_API int mlx_version(mlx_string* str_);

#ifdef __cplusplus
}
#endif
#endif /* MLX_VERSION_H */
