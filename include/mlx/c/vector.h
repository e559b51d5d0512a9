/* mlxdist: vectors of arrays (mlx-c's vector.h, the array part). */
#ifndef MLX_VECTOR_H
#define MLX_VECTOR_H

#include <stddef.h>

#include "mlx/c/array.h"
#include "mlx/c/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A reference-counted list of arrays. ctx == NULL is the empty handle. */
typedef struct mlx_vector_array_ {
  void* ctx;
} mlx_vector_array;

/** A new, empty vector (a valid, non-NULL handle with size 0). */
MLXDIST_API mlx_vector_array mlx_vector_array_new(void);
MLXDIST_API int mlx_vector_array_set(
    mlx_vector_array* vec,
    const mlx_vector_array src);
MLXDIST_API int mlx_vector_array_free(mlx_vector_array vec);
/** A new vector holding references to data[0..size). */
MLXDIST_API mlx_vector_array
mlx_vector_array_new_data(const mlx_array* data, size_t size);
/** A new vector holding one reference to val. */
MLXDIST_API mlx_vector_array mlx_vector_array_new_value(const mlx_array val);
MLXDIST_API int mlx_vector_array_set_data(
    mlx_vector_array* vec,
    const mlx_array* data,
    size_t size);
MLXDIST_API int mlx_vector_array_set_value(
    mlx_vector_array* vec,
    const mlx_array val);
MLXDIST_API int mlx_vector_array_append_data(
    mlx_vector_array vec,
    const mlx_array* data,
    size_t size);
MLXDIST_API int mlx_vector_array_append_value(
    mlx_vector_array vec,
    const mlx_array val);
MLXDIST_API size_t mlx_vector_array_size(mlx_vector_array vec);
/** *res = vec[idx] (a new reference); an index out of range is an error. */
MLXDIST_API int mlx_vector_array_get(
    mlx_array* res,
    const mlx_vector_array vec,
    size_t idx);

#ifdef __cplusplus
}
#endif
#endif /* MLX_VECTOR_H */
