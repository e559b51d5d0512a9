/* Private: elementwise reduction kernels, one per (op, dtype).
 *
 * Rules: bool sum = or, max = or, min = and. complex64: sum adds,
 * max/min compare the real part, then the imaginary part. float16 and
 * bfloat16: each pairwise operation is done in float32 and rounded back
 * (round to nearest even). Integers wrap (unsigned arithmetic).
 * Floating max/min (float16/32/64, bfloat16) propagate NaN as MLX does: if
 * either operand is NaN the result is NaN; complex64 likewise when either
 * part of an operand is NaN. */
#ifndef MLXD_REDUCE_H
#define MLXD_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "mlx/c/array.h"

typedef enum mlxd_reduce_op { MLXD_SUM = 0, MLXD_MAX = 1, MLXD_MIN = 2 } mlxd_reduce_op;

/* acc[i] = acc[i] OP in[i] for i < count. acc and in must not overlap
 * (they may be equal only if identical). Unknown op/dtype: no-op. */
void mlxd_reduce(mlxd_reduce_op op, mlx_dtype dtype, void* acc, const void* in, size_t count);
/* out[i] = a[i] OP b[i]. out may equal a or b. */
void mlxd_reduce3(mlxd_reduce_op op, mlx_dtype dtype, void* out, const void* a, const void* b,
                  size_t count);
const char* mlxd_reduce_op_name(mlxd_reduce_op op);

/* 16-bit float conversions (round to nearest even; NaN stays NaN). */
float mlxd_f16_to_f32(uint16_t h);
uint16_t mlxd_f32_to_f16(float f);
float mlxd_bf16_to_f32(uint16_t h);
uint16_t mlxd_f32_to_bf16(float f);

#endif
