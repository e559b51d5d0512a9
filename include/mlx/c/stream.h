/* mlxdist: streams (mlx-c's stream.h).
 *
 * A stream is an ordered queue of work on one device, run by its own worker
 * thread. Work queued on a stream runs in the order it was queued. The empty
 * handle (ctx == NULL, what mlx_stream_new() returns) is the "null stream":
 * where an op accepts it, the op's backend picks the stream. */
#ifndef MLX_STREAM_H
#define MLX_STREAM_H

#include <stdbool.h>

#include "mlx/c/device.h"
#include "mlx/c/export.h"
#include "mlx/c/string.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A stream handle. ctx == NULL is the null stream. */
typedef struct mlx_stream_ {
  void* ctx;
} mlx_stream;

/** The null (empty) stream. */
MLXDIST_API mlx_stream mlx_stream_new(void);
/** A new stream on dev, with its own worker thread; an unavailable device gives an error and an empty handle. */
MLXDIST_API mlx_stream mlx_stream_new_device(mlx_device dev);
MLXDIST_API int mlx_stream_set(mlx_stream* stream, const mlx_stream src);
MLXDIST_API int mlx_stream_free(mlx_stream stream);
/** "Stream(Device(cpu, 0), 0)". */
MLXDIST_API int mlx_stream_tostring(mlx_string* str, mlx_stream stream);
/** The same stream. */
MLXDIST_API bool mlx_stream_equal(mlx_stream lhs, mlx_stream rhs);
MLXDIST_API int mlx_stream_get_device(mlx_device* dev, mlx_stream stream);
MLXDIST_API int mlx_stream_get_index(int* index, mlx_stream stream);
/** Wait for all work queued on the stream so far. Failures of that work are reported by evaluating its arrays. */
MLXDIST_API int mlx_synchronize(mlx_stream stream);
/** The default stream of dev. */
MLXDIST_API int mlx_get_default_stream(mlx_stream* stream, mlx_device dev);
/** Make stream the default stream of its device. */
MLXDIST_API int mlx_set_default_stream(mlx_stream stream);
/** A handle on the default CPU stream. */
MLXDIST_API mlx_stream mlx_default_cpu_stream_new(void);
/** A handle on the default GPU stream; an error (and empty handle) where no GPU backend is available. */
MLXDIST_API mlx_stream mlx_default_gpu_stream_new(void);

#ifdef __cplusplus
}
#endif
#endif /* MLX_STREAM_H */
