/* mlxdist: evaluation (the part of mlx-c's transforms.h mlxdist provides). */
#ifndef MLX_TRANSFORMS_H
#define MLX_TRANSFORMS_H

#include "mlx/c/export.h"
#include "mlx/c/vector.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Wait for every array in outputs; non-zero (reporting the first failure) if any failed. */
MLXDIST_API int mlx_eval(const mlx_vector_array outputs);

#ifdef __cplusplus
}
#endif
#endif /* MLX_TRANSFORMS_H */
