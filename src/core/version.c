/* mlx_version. */
#include "mlx/c/version.h"
#include "core/core_internal.h"

int mlx_version(mlx_string* str_) {
  return mlxd_string_put(str_, MLXDIST_VERSION_STRING, "[version]");
}
