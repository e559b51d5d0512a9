/* dtypes: sizes, names, validation. */
#include "core/array_impl.h"

static const size_t k_sizes[] = {
    [MLX_BOOL] = 1,     [MLX_UINT8] = 1,     [MLX_UINT16] = 2,  [MLX_UINT32] = 4,
    [MLX_UINT64] = 8,   [MLX_INT8] = 1,      [MLX_INT16] = 2,   [MLX_INT32] = 4,
    [MLX_INT64] = 8,    [MLX_FLOAT16] = 2,   [MLX_FLOAT32] = 4, [MLX_FLOAT64] = 8,
    [MLX_BFLOAT16] = 2, [MLX_COMPLEX64] = 8,
};
static const char* const k_names[] = {
    [MLX_BOOL] = "bool",         [MLX_UINT8] = "uint8",         [MLX_UINT16] = "uint16",
    [MLX_UINT32] = "uint32",     [MLX_UINT64] = "uint64",       [MLX_INT8] = "int8",
    [MLX_INT16] = "int16",       [MLX_INT32] = "int32",         [MLX_INT64] = "int64",
    [MLX_FLOAT16] = "float16",   [MLX_FLOAT32] = "float32",     [MLX_FLOAT64] = "float64",
    [MLX_BFLOAT16] = "bfloat16", [MLX_COMPLEX64] = "complex64",
};
#define N_DTYPES ((int)(sizeof k_sizes / sizeof k_sizes[0]))

static int known(int d) { return d >= 0 && d < N_DTYPES; }

size_t mlx_dtype_size(mlx_dtype dtype) { return known((int)dtype) ? k_sizes[dtype] : 0; }

const char* mlxd_dtype_name(mlx_dtype dtype) {
  return known((int)dtype) ? k_names[dtype] : "unknown";
}

int mlxd_dtype_check(int dtype, mlxd_status* st) {
  if (known(dtype)) return 0;
  return mlxd_fail(st, MLXD_EINVAL,
                   "[array] unknown dtype %d (expected an mlx_dtype value from 0 (MLX_BOOL) to "
                   "%d (MLX_COMPLEX64))",
                   dtype, N_DTYPES - 1);
}
