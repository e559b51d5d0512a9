/* mlxdist: distributed operations (mlx-c's distributed.h).
 *
 * Each op checks its arguments at once (an error queues nothing), queues
 * the communication on stream s and returns a pending result; evaluating
 * the result waits for it and reports a failure of the communication.
 * group may be empty (the default group); s may be empty (the null stream:
 * the group's communication stream, the default CPU stream for ring, mpi
 * and jaccl, the default GPU stream for nccl). */
#ifndef MLX_DISTRIBUTED_H
#define MLX_DISTRIBUTED_H

#include <stddef.h>

#include "mlx/c/array.h"
#include "mlx/c/distributed_group.h"
#include "mlx/c/export.h"
#include "mlx/c/stream.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Elementwise sum over the ranks of group (bool: logical or). */
MLXDIST_API int mlx_distributed_all_sum(
    mlx_array* res,
    const mlx_array x,
    const mlx_distributed_group group,
    const mlx_stream s);
/** Elementwise maximum over the ranks (complex: by real part, then imaginary). */
MLXDIST_API int mlx_distributed_all_max(
    mlx_array* res,
    const mlx_array x,
    const mlx_distributed_group group,
    const mlx_stream s);
/** Elementwise minimum over the ranks (bool: logical and). */
MLXDIST_API int mlx_distributed_all_min(
    mlx_array* res,
    const mlx_array x,
    const mlx_distributed_group group,
    const mlx_stream s);
/** Concatenate every rank's x along axis 0, in rank order (a 0-d x gives shape [size]). */
MLXDIST_API int mlx_distributed_all_gather(
    mlx_array* res,
    const mlx_array x,
    const mlx_distributed_group group,
    const mlx_stream S);
/** Block `rank` (along axis 0) of the all_sum; shape[0] must divide by the group size. */
MLXDIST_API int mlx_distributed_sum_scatter(
    mlx_array* res,
    const mlx_array x,
    const mlx_distributed_group group,
    const mlx_stream s);
/** Send x to rank dst; the result equals x and is ready when the data has left. */
MLXDIST_API int mlx_distributed_send(
    mlx_array* res,
    const mlx_array x,
    int dst,
    const mlx_distributed_group group,
    const mlx_stream s);
/** Receive an array of the given shape and dtype from rank src. */
MLXDIST_API int mlx_distributed_recv(
    mlx_array* res,
    const int* shape,
    size_t shape_num,
    mlx_dtype dtype,
    int src,
    const mlx_distributed_group group,
    const mlx_stream s);
/** Receive an array shaped like x from rank src. */
MLXDIST_API int mlx_distributed_recv_like(
    mlx_array* res,
    const mlx_array x,
    int src,
    const mlx_distributed_group group,
    const mlx_stream s);

/* An mlxdist extension until mlx-c binds MLX's all_to_all (MLX's branch
 * "all-to-all": all_to_all(x, group, stream)); test for it with
 * #ifdef MLXDIST_HAS_ALL_TO_ALL. */
#define MLXDIST_HAS_ALL_TO_ALL 1
/** Exchange parts: x's axis 0 is cut into `size` equal parts, part j goes
 *  to rank j, and the result (x's shape and dtype) holds, as its part i, the
 *  part rank i sent to this rank. shape[0] must divide by the group size;
 *  a 0-d x is an error; a group of one gives x unchanged. */
MLXDIST_API int mlx_distributed_all_to_all(
    mlx_array* res,
    const mlx_array x,
    const mlx_distributed_group group,
    const mlx_stream s);

#ifdef __cplusplus
}
#endif
#endif /* MLX_DISTRIBUTED_H */
