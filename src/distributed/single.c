/* The size-one backend: rank 0 of a group of one, and the only code for
 * groups of one (group.c gives every such group this backend, whatever
 * started it). Collectives copy their input to their output (spec: "the
 * input unchanged"); split gives another group of one. send/recv never get
 * here: no rank is a valid peer in a group of one, and ops.c says so. */
#include <stdlib.h>
#include <string.h>

#include "distributed/backend.h"

static void copy_bytes(const void* in, void* out, size_t n) {
  if (n && in != out) memmove(out, in, n);
}

static int single_all_reduce(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t count,
                             mlx_dtype dtype, mlxd_reduce_op op, mlxd_status* st) {
  (void)b, (void)seq, (void)op, (void)st;
  copy_bytes(in, out, count * mlx_dtype_size(dtype));
  return 0;
}

static int single_all_gather(mlxd_backend* b, uint64_t seq, const void* in, void* out,
                             size_t nbytes, mlx_dtype dtype, mlxd_status* st) {
  (void)b, (void)seq, (void)dtype, (void)st;
  copy_bytes(in, out, nbytes);
  return 0;
}

static int single_reduce_scatter(mlxd_backend* b, uint64_t seq, const void* in, void* out,
                                 size_t count, mlx_dtype dtype, mlxd_reduce_op op,
                                 mlxd_status* st) {
  (void)b, (void)seq, (void)op, (void)st;
  copy_bytes(in, out, count * mlx_dtype_size(dtype));
  return 0;
}

static int single_all_to_all(mlxd_backend* b, uint64_t seq, const void* in, void* out,
                             size_t part_bytes, mlx_dtype dtype, mlxd_status* st) {
  (void)b, (void)seq, (void)dtype, (void)st;
  copy_bytes(in, out, part_bytes); /* one rank: one part, its own */
  return 0;
}

static int single_send(mlxd_backend* b, uint64_t seq, const void* buf, size_t nbytes,
                       mlx_dtype dtype, int dst, mlxd_status* st) {
  (void)b, (void)seq, (void)buf, (void)nbytes, (void)dtype;
  return mlxd_fail(st, MLXD_EINVAL,
                   "[distributed] send/recv need a group of at least two processes (send to "
                   "rank %d in a group of one)",
                   dst);
}

static int single_recv(mlxd_backend* b, uint64_t seq, void* buf, size_t nbytes, mlx_dtype dtype,
                       int src, mlxd_status* st) {
  (void)b, (void)seq, (void)buf, (void)nbytes, (void)dtype;
  return mlxd_fail(st, MLXD_EINVAL,
                   "[distributed] send/recv need a group of at least two processes (recv from "
                   "rank %d in a group of one)",
                   src);
}

static int single_split(mlxd_backend* b, uint64_t seq, int color, int key, mlxd_backend** out,
                        mlxd_status* st) {
  (void)b, (void)seq, (void)color, (void)key;
  *out = mlxd_single_backend_new();
  if (!*out) return mlxd_fail(st, MLXD_ENOMEM, "[distributed] out of memory in split");
  return 0;
}

static void single_destroy(mlxd_backend* b) { free(b); }

static const mlxd_backend_ops k_single_ops = {
    .name = "single",
    .all_reduce = single_all_reduce,
    .all_gather = single_all_gather,
    .reduce_scatter = single_reduce_scatter,
    .all_to_all = single_all_to_all,
    .send = single_send, /* unreachable through ops.c; kept so the table is whole */
    .recv = single_recv,
    .split = single_split,
    .destroy = single_destroy,
    .abort = NULL, /* nothing ever waits */
};

const mlxd_backend_ops* mlxd_single_ops(void) { return &k_single_ops; }

mlxd_backend* mlxd_single_backend_new(void) {
  mlxd_backend* b = calloc(1, sizeof *b);
  if (!b) return NULL;
  b->ops = &k_single_ops;
  b->rank = 0;
  b->size = 1;
  b->comm_device = MLX_CPU;
  return b;
}
