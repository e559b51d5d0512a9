/* mlxdist: owned strings (mlx-c's string.h). */
#ifndef MLX_STRING_H
#define MLX_STRING_H

#include "mlx/c/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A reference-counted, immutable C string. ctx == NULL is the empty handle. */
typedef struct mlx_string_ {
  void* ctx;
} mlx_string;

/** An empty handle. */
MLXDIST_API mlx_string mlx_string_new(void);
/** A new string holding a copy of str (NULL gives an empty handle and an error). */
MLXDIST_API mlx_string mlx_string_new_data(const char* str);
/** Make *str refer to what src refers to (releasing what *str held). */
MLXDIST_API int mlx_string_set(mlx_string* str, const mlx_string src);
/** The characters, valid while the handle lives; NULL for an empty handle. */
MLXDIST_API const char* mlx_string_data(mlx_string str);
/** Release one reference; freeing an empty handle is fine. */
MLXDIST_API int mlx_string_free(mlx_string str);

#ifdef __cplusplus
}
#endif
#endif /* MLX_STRING_H */
