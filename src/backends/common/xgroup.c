/* The ops of a backend over one transport (xgroup.h): each maps to the
 * algorithms of src/algo (the two-level forms where the group has a host
 * map) and renders its failure once, with the backend's tag. */
#include "backends/common/xgroup.h"

#include <assert.h>
#include <stdio.h>

#include "algo/algo.h"
#include "algo/hier.h"

int mlxd_xg_done(const char* tag, int rc, mlxd_status* st, const char* op, uint64_t seq) {
  if (rc == 0) return 0;
  if (st->code == 0)
    mlxd_fail_at(st, rc, MLXD_LAYER_BACKEND, "the operation failed without a message (code %d)",
                 rc);
  if (op) mlxd_status_set_op(st, op, seq);
  mlxd_status_render(st, tag);
  return st->code;
}

const char* mlxd_xg_reduce_name(mlxd_reduce_op op) {
  return op == MLXD_MAX ? "all_max" : op == MLXD_MIN ? "all_min" : "all_sum";
}

mlxd_sig mlxd_xg_sig(const mlxd_backend* b, mlxd_sig_op op, mlx_dtype dtype, size_t count) {
  return (mlxd_sig){(uint8_t)op, (uint8_t)dtype, 0, (uint32_t)b->size, (uint64_t)count};
}

/* With verbose: which algorithm a collective of nbytes (this rank's input)
 * runs: "[ring] rank 0: all_sum 1048576 B: hier (2 hosts x 2)". */
static void log_algo_note(const mlxd_xgroup* g, const char* op, size_t nbytes, const char* note) {
  const mlxd_hier* h = g->hier;
  char where[96] = "";
  if (h) mlxd_hier_describe(h, where, sizeof where);
  fprintf(stderr, "[%s] rank %d: %s %zu B: %s%s%s%s\n", g->tag, g->base.rank, op, nbytes,
          h ? "hier (" : "flat", where, h ? note : "", h ? ")" : "");
}

static void log_algo(const mlxd_xgroup* g, const char* op, size_t nbytes, size_t whole) {
  const mlxd_hier* h = g->hier;
  log_algo_note(g, op, nbytes, h ? mlxd_hier_form_note(mlxd_hier_pick(h, whole)) : "");
}

/* Every op runs on a group of two or more ranks (the front-end answers size
 * one itself) with the arguments backend.h guarantees: asserted, not
 * checked again. */
int mlxd_xg_all_reduce(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t count,
                       mlx_dtype dtype, mlxd_reduce_op op, mlxd_status* st) {
  mlxd_xgroup* g = (mlxd_xgroup*)b;
  assert(g->t);
  mlxd_sig sig = mlxd_xg_sig(b, MLXD_SIG_ALL_SUM + (op - MLXD_SUM), dtype, count);
  size_t nbytes = count * mlx_dtype_size(dtype);
  if (g->verbose) log_algo(g, mlxd_xg_reduce_name(op), nbytes, nbytes);
  const mlxd_hier* h = g->hier;
  int rc = h ? mlxd_algo_hier_all_reduce(g->t, h, seq, &sig, in, out, count, dtype, op, st)
             : mlxd_algo_all_reduce(g->t, seq, &sig, in, out, count, dtype, op, st);
  return mlxd_xg_done(g->tag, rc, st, mlxd_xg_reduce_name(op), seq);
}

int mlxd_xg_all_gather(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t nbytes,
                       mlx_dtype dtype, mlxd_status* st) {
  mlxd_xgroup* g = (mlxd_xgroup*)b;
  assert(g->t);
  mlxd_sig sig = mlxd_xg_sig(b, MLXD_SIG_ALL_GATHER, dtype, nbytes / mlx_dtype_size(dtype));
  if (g->verbose) log_algo(g, "all_gather", nbytes, nbytes * (size_t)b->size);
  const mlxd_hier* h = g->hier;
  int rc = h ? mlxd_algo_hier_all_gather(g->t, h, seq, &sig, in, out, nbytes, st)
             : mlxd_algo_all_gather(g->t, seq, &sig, in, out, nbytes, st);
  return mlxd_xg_done(g->tag, rc, st, "all_gather", seq);
}

int mlxd_xg_reduce_scatter(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t count,
                           mlx_dtype dtype, mlxd_reduce_op op, mlxd_status* st) {
  mlxd_xgroup* g = (mlxd_xgroup*)b;
  assert(g->t);
  mlxd_sig sig = mlxd_xg_sig(b, MLXD_SIG_SUM_SCATTER + (op - MLXD_SUM), dtype, count);
  const char* name = op == MLXD_SUM ? "sum_scatter" : "reduce_scatter";
  size_t nbytes = count * mlx_dtype_size(dtype) * (size_t)b->size;
  if (g->verbose) log_algo(g, name, nbytes, nbytes);
  const mlxd_hier* h = g->hier;
  int rc = h ? mlxd_algo_hier_reduce_scatter(g->t, h, seq, &sig, in, out, count, dtype, op, st)
             : mlxd_algo_reduce_scatter(g->t, seq, &sig, in, out, count, dtype, op, st);
  return mlxd_xg_done(g->tag, rc, st, name, seq);
}

int mlxd_xg_all_to_all(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t part_bytes,
                       mlx_dtype dtype, mlxd_status* st) {
  mlxd_xgroup* g = (mlxd_xgroup*)b;
  assert(g->t);
  size_t nbytes = part_bytes * (size_t)b->size;
  mlxd_sig sig = mlxd_xg_sig(b, MLXD_SIG_ALL_TO_ALL, dtype, nbytes / mlx_dtype_size(dtype));
  const mlxd_hier* h = g->hier;
  if (g->verbose)
    log_algo_note(g, "all_to_all", nbytes, h ? mlxd_hier_a2a_note(h, part_bytes) : "");
  int rc = h ? mlxd_algo_hier_all_to_all(g->t, h, seq, &sig, in, out, part_bytes, st)
             : mlxd_algo_all_to_all(g->t, seq, &sig, in, out, part_bytes, st);
  return mlxd_xg_done(g->tag, rc, st, "all_to_all", seq);
}

int mlxd_xg_send(mlxd_backend* b, uint64_t seq, const void* buf, size_t nbytes, mlx_dtype dtype,
                 int dst, mlxd_status* st) {
  mlxd_xgroup* g = (mlxd_xgroup*)b;
  assert(g->t && dst >= 0 && dst < b->size && dst != b->rank);
  mlxd_sig sig = mlxd_xg_sig(b, MLXD_SIG_SEND, dtype, nbytes);
  return mlxd_xg_done(g->tag, mlxd_algo_send(g->t, seq, &sig, buf, nbytes, dst, st), st, "send",
                      seq);
}

int mlxd_xg_recv(mlxd_backend* b, uint64_t seq, void* buf, size_t nbytes, mlx_dtype dtype, int src,
                 mlxd_status* st) {
  mlxd_xgroup* g = (mlxd_xgroup*)b;
  assert(g->t && src >= 0 && src < b->size && src != b->rank);
  mlxd_sig sig = mlxd_xg_sig(b, MLXD_SIG_RECV, dtype, nbytes);
  return mlxd_xg_done(g->tag, mlxd_algo_recv(g->t, seq, &sig, buf, nbytes, src, st), st, "recv",
                      seq);
}

void mlxd_xg_abort(mlxd_backend* b, const mlxd_status* st) {
  mlxd_xgroup* g = (mlxd_xgroup*)b;
  if (g->t) g->t->ops->abort(g->t, st);
}

void mlxd_xg_forget(mlxd_backend* b) {
  mlxd_xgroup* g = (mlxd_xgroup*)b;
  if (g->t && g->t->ops->forget) g->t->ops->forget(g->t);
}
