/* mlxdist: the whole public API. */
#ifndef MLX_ALL_H
#define MLX_ALL_H

#include "mlx/c/array.h"
#include "mlx/c/device.h"
#include "mlx/c/distributed.h"
#include "mlx/c/distributed_group.h"
#include "mlx/c/error.h"
#include "mlx/c/export.h"
#include "mlx/c/half.h"
#include "mlx/c/stream.h"
#include "mlx/c/string.h"
#include "mlx/c/transforms.h"
#include "mlx/c/vector.h"
#include "mlx/c/version.h"

#endif /* MLX_ALL_H */
