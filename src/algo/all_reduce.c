/* all_reduce: one-shot (small groups) or recursive doubling (large ones,
 * logdepth.c) for small payloads, the pipeline otherwise. */
#include <stdlib.h>
#include <string.h>

#include "algo/algo_impl.h"
#include "core/buffer.h"
#include "util/tunables.h"

/* Groups up to this size keep the one-shot's request array on the stack,
 * and contributions of up to this many bytes in all (every rank's) its
 * scratch buffer. */
#define ONESHOT_STACK_RANKS 16
#define ONESHOT_STACK_BYTES 1024

/* Every rank sends its whole buffer to every other rank and then reduces
 * the size contributions in rank order 0..n-1, so every rank performs the
 * same operations on the same values: bit-identical results. Cost: one
 * latency, (n-1) * nbytes sent per rank. */
int mlxd_algo_all_reduce_oneshot(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig,
                                 const void* in, void* out, size_t count, mlx_dtype dtype,
                                 mlxd_reduce_op op, mlxd_status* st) {
  mlxd_status_reset(st); /* not clear: zeroing all 620 bytes costs more than the op's poll */
  assert(t->size >= 2 && (count == 0 || (in && out)));
  size_t esz = mlxd_algo_esize(dtype, op);
  size_t nbytes = mlxd_algo_mul(count, esz), all = mlxd_algo_mul(nbytes, (size_t)t->size);
  int n = t->size, r = t->rank;
  if (count == 0) return mlxd_algo_empty(t, seq, sig, st);
  /* The request array: on the stack up to ONESHOT_STACK_RANKS ranks (no
   * calloc + free per small op), else from the heap. */
  mlxd_req* stack_reqs[2 * ONESHOT_STACK_RANKS];
  mlxd_req** reqs = stack_reqs;
  if (n <= ONESHOT_STACK_RANKS)
    memset(stack_reqs, 0, 2 * (size_t)n * sizeof *reqs);
  else
    reqs = calloc(2 * (size_t)n, sizeof *reqs);
  _Alignas(64) char stack_tmp[ONESHOT_STACK_BYTES];
  char* tmp = all <= sizeof stack_tmp ? stack_tmp : mlxd_buffer_alloc(all);
  if (!tmp || !reqs) {
    if (tmp != stack_tmp) mlxd_buffer_free(tmp, all);
    if (reqs != stack_reqs) free(reqs);
    return mlxd_algo_fail(st, MLXD_ENOMEM, "out of memory for %zu bytes", all);
  }
  uint64_t tag = mlxd_tag(MLXD_TAG_COLL, seq, 0);
  int rc = 0;
  for (int p = 0; p < n && !rc; p++)
    if (p != r) rc = t->ops->irecv(t, p, tag, sig, tmp + (size_t)p * nbytes, nbytes, &reqs[p], st);
  for (int k = 1; k < n && !rc; k++) {
    int p = (r + k) % n; /* stagger the sends so no rank is hit by everyone first */
    rc = t->ops->isend(t, p, tag, sig, in, nbytes, &reqs[n + p], st);
  }
  mlxd_algo_drain(t, reqs, 2 * n, st);
  if (!st->code) {
    /* In rank order on every rank (the same bits everywhere), straight into
     * out: rank r's block is read from in, not copied first (two copies per
     * byte fewer), unless out overlaps in (in place: in is overwritten by
     * the first step, so a rank past 1 keeps a copy of it). */
    const char* own = in;
    if ((const char*)out < own + nbytes && own < (const char*)out + nbytes)
      own = memcpy(tmp + (size_t)r * nbytes, in, nbytes); /* in is no longer being sent */
    mlxd_reduce3(op, dtype, out, r == 0 ? own : tmp, r == 1 ? own : tmp + nbytes, count);
    for (int p = 2; p < n; p++)
      mlxd_reduce(op, dtype, out, p == r ? own : tmp + (size_t)p * nbytes, count);
  }
  if (reqs != stack_reqs) free(reqs);
  if (tmp != stack_tmp) mlxd_buffer_free(tmp, all);
  return st->code;
}

/* Partition elements [base, base + total) into n blocks (the first
 * total % n get one more element). */
static void partition(size_t base, size_t total, int n, size_t* off, size_t* len) {
  size_t q = total / (size_t)n, rem = total % (size_t)n, o = base;
  for (int b = 0; b < n; b++) {
    off[b] = o;
    len[b] = q + ((size_t)b < rem ? 1 : 0);
    o += len[b];
  }
}

int mlxd_algo_all_reduce_pipeline(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig,
                                  const void* in, void* out, size_t count, mlx_dtype dtype,
                                  mlxd_reduce_op op, int bidir, mlxd_status* st) {
  mlxd_status_clear(st);
  assert(t->size >= 2 && (count == 0 || (in && out)));
  size_t esz = mlxd_algo_esize(dtype, op), nbytes = mlxd_algo_mul(count, esz);
  int n = t->size;
  if (count == 0) return mlxd_algo_empty(t, seq, sig, st);
  size_t* tab = malloc(4 * (size_t)n * sizeof *tab);
  if (!tab) return mlxd_algo_fail(st, MLXD_ENOMEM, "out of memory for a pipeline schedule");
  mlxd_pipeline_plan p;
  memset(&p, 0, sizeof p);
  p.mode = MLXD_PIPELINE_AR;
  p.esz = esz;
  p.dtype = dtype;
  p.op = op;
  p.in = in;
  p.out = out;
  p.ndir = mlxd_algo_bidir(n, nbytes, bidir) ? 2 : 1;
  size_t half = p.ndir == 2 ? count / 2 : count;
  for (int di = 0; di < p.ndir; di++) {
    p.boff[di] = tab + (size_t)di * 2 * (size_t)n;
    p.blen[di] = p.boff[di] + n;
  }
  partition(0, half, n, p.boff[0], p.blen[0]);
  if (p.ndir == 2) partition(half, count - half, n, p.boff[1], p.blen[1]);
  p.sig = sig;
  mlxd_pipeline_run(t, seq, &p, st);
  free(tab);
  return st->code;
}

int mlxd_algo_all_reduce_upto(mlxd_transport* t, size_t small, uint64_t seq, const mlxd_sig* sig,
                              const void* in, void* out, size_t count, mlx_dtype dtype,
                              mlxd_reduce_op op, mlxd_status* st) {
  size_t esz = mlxd_algo_esize(dtype, op);
  if (count <= small / esz) {
    if (mlxd_algo_logn(t, MLXD_SMALL_AR, count * esz))
      return mlxd_algo_all_reduce_rd(t, seq, sig, in, out, count, dtype, op, st);
    return mlxd_algo_all_reduce_oneshot(t, seq, sig, in, out, count, dtype, op, st);
  }
  return mlxd_algo_all_reduce_pipeline(t, seq, sig, in, out, count, dtype, op, -1, st);
}

int mlxd_algo_all_reduce(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, const void* in,
                         void* out, size_t count, mlx_dtype dtype, mlxd_reduce_op op,
                         mlxd_status* st) {
  return mlxd_algo_all_reduce_upto(t, mlxd_algo_small_bytes(), seq, sig, in, out, count, dtype, op,
                                   st);
}
