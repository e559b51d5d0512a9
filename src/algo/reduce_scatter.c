/* reduce_scatter: direct exchange (small groups) or recursive halving
 * (large ones, logdepth.c) for small payloads, the pipeline otherwise.
 * Rank r ends with block r (count elements) of the reduction of every
 * rank's input (size * count elements). */
#include <stdlib.h>
#include <string.h>

#include "algo/algo_impl.h"
#include "core/buffer.h"
#include "util/tunables.h"

/* The caller's contract (algo.h), asserted; returns the element size and
 * sets *blk to the bytes of one block. */
static size_t rs_prologue(mlxd_transport* t, const void* in, void* out, size_t count,
                          mlx_dtype dtype, mlxd_reduce_op op, size_t* blk, mlxd_status* st) {
  mlxd_status_clear(st);
  assert(t->size >= 2 && (count == 0 || (in && out)));
  (void)in;
  (void)out;
  size_t esz = mlxd_algo_esize(dtype, op);
  *blk = mlxd_algo_mul(count, esz);
  (void)mlxd_algo_mul(*blk, (size_t)t->size);
  return esz;
}

/* Every rank sends block p of its input to rank p, then each rank reduces
 * the size contributions to its block in rank order. */
int mlxd_algo_reduce_scatter_direct(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig,
                                    const void* in, void* out, size_t count, mlx_dtype dtype,
                                    mlxd_reduce_op op, mlxd_status* st) {
  size_t blk;
  rs_prologue(t, in, out, count, dtype, op, &blk, st);
  int n = t->size, r = t->rank;
  const char* own = (const char*)in + (size_t)r * blk;
  if (count == 0) return mlxd_algo_empty(t, seq, sig, st);
  char* tmp = mlxd_buffer_alloc(blk * (size_t)n);
  mlxd_req** reqs = calloc(2 * (size_t)n, sizeof *reqs);
  if (!tmp || !reqs) {
    mlxd_buffer_free(tmp, blk * (size_t)n);
    free(reqs);
    return mlxd_algo_fail(st, MLXD_ENOMEM, "out of memory for %zu bytes", blk * (size_t)n);
  }
  uint64_t tag = mlxd_tag(MLXD_TAG_COLL, seq, 0);
  int rc = 0;
  for (int p = 0; p < n && !rc; p++)
    if (p != r) rc = t->ops->irecv(t, p, tag, sig, tmp + (size_t)p * blk, blk, &reqs[p], st);
  for (int k = 1; k < n && !rc; k++) {
    int p = (r + k) % n;
    rc = t->ops->isend(t, p, tag, sig, (const char*)in + (size_t)p * blk, blk, &reqs[n + p], st);
  }
  mlxd_algo_drain(t, reqs, 2 * n, st);
  if (!st->code) {
    memcpy(tmp + (size_t)r * blk, own, blk);
    memcpy(out, tmp, blk);
    for (int p = 1; p < n; p++) mlxd_reduce(op, dtype, out, tmp + (size_t)p * blk, count);
  }
  free(reqs);
  mlxd_buffer_free(tmp, blk * (size_t)n);
  return st->code;
}

/* The pipeline over in's blocks (off/len, in elements of esz bytes;
 * algo_impl.h) in ndir directions, block `rank` reduced into out: the one
 * schedule of both entry points below. */
static int reduce_scatter_run(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, const void* in,
                              void* out, const size_t* off, const size_t* len, size_t esz,
                              mlx_dtype dtype, mlxd_reduce_op op, int ndir, mlxd_status* st) {
  int n = t->size;
  size_t bytes = (off[n - 1] + len[n - 1]) * esz;
  size_t* tab = malloc(4 * (size_t)n * sizeof *tab);
  /* Partial sums of the blocks that pass through this rank; only blocks
   * other than ours are written, but the layout mirrors `in`. */
  char* work = n > 2 ? mlxd_buffer_alloc(bytes) : NULL;
  if (!tab || (n > 2 && !work)) {
    free(tab);
    mlxd_buffer_free(work, bytes);
    return mlxd_algo_fail(st, MLXD_ENOMEM, "out of memory for a pipeline schedule");
  }
  mlxd_pipeline_plan p;
  memset(&p, 0, sizeof p);
  p.mode = MLXD_PIPELINE_RS;
  p.esz = esz;
  p.dtype = dtype;
  p.op = op;
  p.in = in;
  p.out = out;
  p.work = work;
  p.out_base = off[t->rank];
  p.ndir = ndir;
  mlxd_algo_split_blocks(off, len, n, ndir, tab, p.boff, p.blen);
  p.sig = sig;
  mlxd_pipeline_run(t, seq, &p, st);
  free(tab);
  mlxd_buffer_free(work, bytes);
  return st->code;
}

int mlxd_algo_reduce_scatter_pipeline(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig,
                                      const void* in, void* out, size_t count, mlx_dtype dtype,
                                      mlxd_reduce_op op, int bidir, mlxd_status* st) {
  size_t blk;
  size_t esz = rs_prologue(t, in, out, count, dtype, op, &blk, st);
  int n = t->size;
  if (count == 0) return mlxd_algo_empty(t, seq, sig, st);
  size_t* ol = mlxd_algo_equal_blocks(n, count, st);
  if (!ol) return st->code;
  int ndir = mlxd_algo_bidir(n, blk * (size_t)n, bidir) && count >= 2 ? 2 : 1;
  reduce_scatter_run(t, seq, sig, in, out, ol, ol + n, esz, dtype, op, ndir, st);
  free(ol);
  return st->code;
}

int mlxd_algo_reduce_scatter_blocks(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig,
                                    const void* in, void* out, const size_t* off, const size_t* len,
                                    mlx_dtype dtype, mlxd_reduce_op op, mlxd_status* st) {
  mlxd_status_clear(st);
  int n = t->size;
  assert(n >= 2 && off[0] == 0);
  size_t esz = mlxd_algo_esize(dtype, op);
  size_t total = off[n - 1] + len[n - 1], bytes = mlxd_algo_mul(total, esz);
  assert(total == 0 || (in && (out || len[t->rank] == 0)));
  if (total == 0) return 0;
  return reduce_scatter_run(t, seq, sig, in, out, off, len, esz, dtype, op,
                            mlxd_algo_bidir(n, bytes, -1) ? 2 : 1, st);
}

int mlxd_algo_reduce_scatter_upto(mlxd_transport* t, size_t small, uint64_t seq,
                                  const mlxd_sig* sig, const void* in, void* out, size_t count,
                                  mlx_dtype dtype, mlxd_reduce_op op, mlxd_status* st) {
  size_t blk;
  rs_prologue(t, in, out, count, dtype, op, &blk, st);
  if (blk <= small / (size_t)t->size) {
    if (mlxd_algo_logn(t, MLXD_SMALL_RS, blk * (size_t)t->size))
      return mlxd_algo_reduce_scatter_rh(t, seq, sig, in, out, count, dtype, op, st);
    return mlxd_algo_reduce_scatter_direct(t, seq, sig, in, out, count, dtype, op, st);
  }
  return mlxd_algo_reduce_scatter_pipeline(t, seq, sig, in, out, count, dtype, op, -1, st);
}

int mlxd_algo_reduce_scatter(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, const void* in,
                             void* out, size_t count, mlx_dtype dtype, mlxd_reduce_op op,
                             mlxd_status* st) {
  return mlxd_algo_reduce_scatter_upto(t, mlxd_algo_small_bytes(), seq, sig, in, out, count, dtype,
                                       op, st);
}
