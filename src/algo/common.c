/* Helpers shared by the collective algorithms: argument checks and
 * draining outstanding requests on an error path. */
#include <stdint.h>

#include "algo/algo_impl.h"

size_t mlxd_algo_check(const char* what, mlx_dtype dtype, mlxd_reduce_op op, bool check_op,
                       mlxd_status* st) {
  size_t esz = ((int)dtype >= 0 && (int)dtype <= (int)MLX_COMPLEX64) ? mlx_dtype_size(dtype) : 0;
  if (esz == 0) {
    mlxd_fail(st, MLXD_EINVAL, "[ring] %s: unknown dtype %d (expected an mlx_dtype value 0..%d)",
              what, (int)dtype, (int)MLX_COMPLEX64);
    return 0;
  }
  if (check_op && (op < MLXD_SUM || op > MLXD_MIN)) {
    mlxd_fail(st, MLXD_EINVAL, "[ring] %s: unknown reduction %d (expected sum, max or min)",
              what, (int)op);
    return 0;
  }
  return esz;
}

int mlxd_algo_mul(const char* what, size_t a, size_t b, size_t* res, mlxd_status* st) {
  if (a != 0 && b > SIZE_MAX / a)
    return mlxd_fail(st, MLXD_EINVAL, "[ring] %s: %zu x %zu bytes does not fit in size_t", what,
                     a, b);
  *res = a * b;
  return 0;
}

int mlxd_algo_drain(mlxd_transport* t, mlxd_req** reqs, int n, mlxd_status* st) {
  bool any = false;
  for (int i = 0; i < n && !any; i++) any = reqs[i] != NULL;
  if (!any) return st->code;
  mlxd_status tmp;
  mlxd_status_clear(&tmp);
  int rc = t->ops->waitall(t, reqs, n, &tmp);
  if (rc && !st->code) *st = tmp;
  return st->code;
}

bool mlxd_algo_bidir(int size, size_t nbytes, int bidir) {
  if (bidir >= 0) return bidir > 0 && size >= 2;
  return size >= MLXD_RING_BIDIR_MIN_RANKS && nbytes >= MLXD_RING_BIDIR_MIN_BYTES;
}
