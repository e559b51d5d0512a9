/* Two-level collectives (hier.h): compositions of the flat algorithms on
 * views of the group's transport. Phases (tag phases, view.h):
 *   all_reduce small   1 gather to the leader, 2 leaders, 3 leader to its host
 *   all_reduce large   1 reduce-scatter in the host, 2 column, 3 all-gather in the host
 *   all_gather         4 column, 5 in the host
 *   sum_scatter        4 in the host, 5 column
 * (all_gather / sum_scatter through the all_reduce use 1-3.) Phases that
 * follow each other use different tag phases, so a rank still finishing
 * phase k never takes a message of a peer already in phase k + 1. */
#include <stdlib.h>
#include <string.h>

#include "algo/algo_impl.h"
#include "algo/hier.h"
#include "core/buffer.h"
#include "transport/view.h"

enum { PH_GATHER = 1, PH_LEADERS = 2, PH_BCAST = 3 };
enum { PH_RS = 1, PH_COL = 2, PH_AG = 3 };
enum { PH_X_FIRST = 4, PH_X_SECOND = 5 };

/* A phase failed on this rank: fail the whole group's transport with it, so
 * that no rank waits in another phase for a peer that has given up. */
static int phase_failed(mlxd_transport* t, mlxd_status* st) {
  if (st->code) t->ops->abort(t, st);
  return st->code;
}

static void host_view(mlxd_view* v, mlxd_transport* t, const mlxd_hier* h, unsigned phase) {
  mlxd_view_init(v, t, h->by_host + h->host_start[h->host], h->nlocal, h->local_rank, phase);
}

/* ---------------------------------------------------------- all_reduce */

/* Phase 1: the host's ranks send in to the leader (local 0), which
 * reduces all of them in local order into out. */
static int gather_reduce(mlxd_transport* v, uint64_t seq, const mlxd_sig* sig, const void* in,
                         void* out, size_t count, size_t nbytes, mlx_dtype dtype, mlxd_reduce_op op,
                         mlxd_status* st) {
  int n = v->size;
  uint64_t tag = mlxd_tag(MLXD_TAG_COLL, seq, 0);
  if (v->rank != 0) {
    mlxd_req* r = NULL;
    if (v->ops->isend(v, 0, tag, sig, in, nbytes, &r, st)) return st->code;
    return v->ops->waitall(v, &r, 1, st);
  }
  size_t all = mlxd_algo_mul(nbytes, (size_t)n);
  char* tmp = mlxd_buffer_alloc(all);
  mlxd_req** reqs = calloc((size_t)n, sizeof *reqs);
  if (!tmp || !reqs) {
    mlxd_buffer_free(tmp, all);
    free(reqs);
    return mlxd_algo_fail(st, MLXD_ENOMEM, "out of memory for %zu bytes", all);
  }
  int rc = 0;
  for (int p = 1; p < n && !rc; p++)
    rc = v->ops->irecv(v, p, tag, sig, tmp + (size_t)p * nbytes, nbytes, &reqs[p], st);
  mlxd_algo_drain(v, reqs, n, st);
  if (!st->code) {
    if (out != in) memcpy(out, in, nbytes);
    for (int p = 1; p < n; p++) mlxd_reduce(op, dtype, out, tmp + (size_t)p * nbytes, count);
  }
  free(reqs);
  mlxd_buffer_free(tmp, all);
  return st->code;
}

/* Phase 3: the leader sends out to its host's ranks. */
static int host_bcast(mlxd_transport* v, uint64_t seq, const mlxd_sig* sig, void* out,
                      size_t nbytes, mlxd_status* st) {
  int n = v->size;
  uint64_t tag = mlxd_tag(MLXD_TAG_COLL, seq, 0);
  if (v->rank != 0) {
    mlxd_req* r = NULL;
    if (v->ops->irecv(v, 0, tag, sig, out, nbytes, &r, st)) return st->code;
    return v->ops->waitall(v, &r, 1, st);
  }
  mlxd_req** reqs = calloc((size_t)n, sizeof *reqs);
  if (!reqs) return mlxd_algo_fail(st, MLXD_ENOMEM, "out of memory for %d requests", n);
  int rc = 0;
  for (int p = 1; p < n && !rc; p++) rc = v->ops->isend(v, p, tag, sig, out, nbytes, &reqs[p], st);
  mlxd_algo_drain(v, reqs, n, st);
  free(reqs);
  return st->code;
}

static int all_reduce_small(mlxd_transport* t, const mlxd_hier* h, uint64_t seq,
                            const mlxd_sig* sig, const void* in, void* out, size_t count,
                            size_t nbytes, mlx_dtype dtype, mlxd_reduce_op op, mlxd_status* st) {
  mlxd_view v;
  const void* src = in;
  if (h->nlocal > 1) {
    host_view(&v, t, h, PH_GATHER);
    if (gather_reduce(&v.base, seq, sig, in, out, count, nbytes, dtype, op, st))
      return phase_failed(t, st);
    src = out;
  }
  if (h->local_rank == 0) {
    mlxd_view_init(&v, t, h->leaders, h->nhosts, h->host, PH_LEADERS);
    if (mlxd_algo_all_reduce(&v.base, seq, sig, src, out, count, dtype, op, st))
      return phase_failed(t, st);
  }
  if (h->nlocal > 1) {
    host_view(&v, t, h, PH_BCAST);
    if (host_bcast(&v.base, seq, sig, out, nbytes, st)) return phase_failed(t, st);
  }
  return 0;
}

/* Element offsets and lengths of the blocks of count elements cut into
 * parts equal parts (the first count % parts one longer), followed by
 * empty blocks up to n. */
static void part_blocks(size_t count, int parts, int n, size_t* off, size_t* len) {
  size_t q = count / (size_t)parts, rem = count % (size_t)parts, o = 0;
  for (int b = 0; b < n; b++) {
    off[b] = o;
    len[b] = b < parts ? q + ((size_t)b < rem ? 1 : 0) : 0;
    o += len[b];
  }
}

static int all_reduce_large(mlxd_transport* t, const mlxd_hier* h, uint64_t seq,
                            const mlxd_sig* sig, const void* in, void* out, size_t count,
                            mlx_dtype dtype, mlxd_reduce_op op, mlxd_status* st) {
  size_t esz = mlxd_algo_esize(dtype, op);
  int c = h->nlocal, li = h->local_rank;
  size_t* off = malloc(2 * (size_t)c * sizeof *off);
  if (!off) return mlxd_algo_fail(st, MLXD_ENOMEM, "out of memory for %d blocks", c);
  size_t* len = off + c;
  part_blocks(count, h->min_local, c, off, len);
  mlxd_view v;
  const char* src = in;
  if (c > 1) {
    host_view(&v, t, h, PH_RS);
    if (mlxd_algo_reduce_scatter_blocks(&v.base, seq, sig, in, (char*)out + off[li] * esz, off, len,
                                        dtype, op, st))
      goto fail;
    src = out;
  }
  if (h->col && len[li] > 0) {
    mlxd_view_init(&v, t, h->col, h->nhosts, h->host, PH_COL);
    if (mlxd_algo_all_reduce(&v.base, seq, sig, src + off[li] * esz, (char*)out + off[li] * esz,
                             len[li], dtype, op, st))
      goto fail;
  }
  if (c > 1) {
    for (int b = 0; b < c; b++) {
      off[b] *= esz;
      len[b] *= esz;
    }
    host_view(&v, t, h, PH_AG);
    if (mlxd_algo_all_gather_blocks(&v.base, seq, sig, out, off, len, st)) goto fail;
  }
  free(off);
  return 0;
fail:
  free(off);
  return phase_failed(t, st);
}

int mlxd_algo_hier_all_reduce(mlxd_transport* t, const mlxd_hier* h, uint64_t seq,
                              const mlxd_sig* sig, const void* in, void* out, size_t count,
                              mlx_dtype dtype, mlxd_reduce_op op, mlxd_status* st) {
  mlxd_status_clear(st);
  assert(mlxd_hier_applies(h) && t->rank == h->rank && t->size == h->size);
  assert(count == 0 || (in && out));
  size_t nbytes = mlxd_algo_mul(count, mlxd_algo_esize(dtype, op));
  if (count == 0) return 0;
  if (mlxd_hier_small(nbytes))
    return all_reduce_small(t, h, seq, sig, in, out, count, nbytes, dtype, op, st);
  return all_reduce_large(t, h, seq, sig, in, out, count, dtype, op, st);
}

/* ---------------------------------------------------------- all_gather */

static bool regular(const mlxd_hier* h) { return h->min_local == h->max_local; }

int mlxd_algo_hier_all_gather(mlxd_transport* t, const mlxd_hier* h, uint64_t seq,
                              const mlxd_sig* sig, const void* in, void* out, size_t nbytes,
                              mlxd_status* st) {
  mlxd_status_clear(st);
  assert(mlxd_hier_applies(h) && t->rank == h->rank && t->size == h->size);
  assert(nbytes == 0 || (in && out));
  int n = h->size, H = h->nhosts, c = h->nlocal;
  size_t total = mlxd_algo_mul(nbytes, (size_t)n);
  if (nbytes == 0) return 0;
  char* own = (char*)out + (size_t)h->rank * nbytes;
  if (mlxd_hier_small(total) || !regular(h)) {
    /* byte-wise max over zeros and each rank's block: exact for any bytes */
    if (own != (const char*)in) memmove(own, in, nbytes);
    memset(out, 0, (size_t)h->rank * nbytes);
    memset(own + nbytes, 0, total - (size_t)(h->rank + 1) * nbytes);
    return mlxd_algo_hier_all_reduce(t, h, seq, sig, out, out, total, MLX_UINT8, MLXD_MAX, st);
  }
  /* column: block of every host's rank with my local index, host order;
   * host: those of every local index, local order */
  size_t colb = mlxd_algo_mul(nbytes, (size_t)H);
  char* a = mlxd_buffer_alloc(colb);
  char* b = mlxd_buffer_alloc(total);
  if (!a || !b) {
    mlxd_buffer_free(a, colb);
    mlxd_buffer_free(b, total);
    mlxd_algo_fail(st, MLXD_ENOMEM, "out of memory for %zu bytes", colb + total);
    return phase_failed(t, st);
  }
  mlxd_view v;
  mlxd_view_init(&v, t, h->col, H, h->host, PH_X_FIRST);
  if (mlxd_algo_all_gather(&v.base, seq, sig, in, a, nbytes, st) == 0) {
    host_view(&v, t, h, PH_X_SECOND);
    mlxd_algo_all_gather(&v.base, seq, sig, a, b, colb, st);
  }
  if (!st->code)
    for (int i = 0; i < c; i++)
      for (int g = 0; g < H; g++)
        memcpy((char*)out + (size_t)h->by_host[h->host_start[g] + i] * nbytes,
               b + ((size_t)i * (size_t)H + (size_t)g) * nbytes, nbytes);
  mlxd_buffer_free(a, colb);
  mlxd_buffer_free(b, total);
  return phase_failed(t, st);
}

/* --------------------------------------------------------- sum_scatter */

int mlxd_algo_hier_reduce_scatter(mlxd_transport* t, const mlxd_hier* h, uint64_t seq,
                                  const mlxd_sig* sig, const void* in, void* out, size_t count,
                                  mlx_dtype dtype, mlxd_reduce_op op, mlxd_status* st) {
  mlxd_status_clear(st);
  assert(mlxd_hier_applies(h) && t->rank == h->rank && t->size == h->size);
  assert(count == 0 || (in && out));
  int n = h->size, H = h->nhosts, c = h->nlocal;
  size_t esz = mlxd_algo_esize(dtype, op), blk = mlxd_algo_mul(count, esz);
  size_t total = mlxd_algo_mul(blk, (size_t)n);
  if (count == 0) return 0;
  if (mlxd_hier_small(total) || !regular(h)) {
    char* all = mlxd_buffer_alloc(total);
    if (!all) {
      mlxd_algo_fail(st, MLXD_ENOMEM, "out of memory for %zu bytes", total);
      return phase_failed(t, st);
    }
    int rc = mlxd_algo_hier_all_reduce(t, h, seq, sig, in, all, count * (size_t)n, dtype, op, st);
    if (!rc) memcpy(out, all + (size_t)h->rank * blk, blk);
    mlxd_buffer_free(all, total);
    return rc;
  }
  /* in, reordered local index first, host second: block (i, g) is the
   * input block of host g's rank with local index i */
  size_t colb = mlxd_algo_mul(blk, (size_t)H);
  char* p = mlxd_buffer_alloc(total);
  char* q = mlxd_buffer_alloc(colb);
  if (!p || !q) {
    mlxd_buffer_free(p, total);
    mlxd_buffer_free(q, colb);
    mlxd_algo_fail(st, MLXD_ENOMEM, "out of memory for %zu bytes", total + colb);
    return phase_failed(t, st);
  }
  for (int i = 0; i < c; i++)
    for (int g = 0; g < H; g++)
      memcpy(p + ((size_t)i * (size_t)H + (size_t)g) * blk,
             (const char*)in + (size_t)h->by_host[h->host_start[g] + i] * blk, blk);
  mlxd_view v;
  host_view(&v, t, h, PH_X_FIRST);
  if (mlxd_algo_reduce_scatter(&v.base, seq, sig, p, q, count * (size_t)H, dtype, op, st) == 0) {
    mlxd_view_init(&v, t, h->col, H, h->host, PH_X_SECOND);
    mlxd_algo_reduce_scatter(&v.base, seq, sig, q, out, count, dtype, op, st);
  }
  mlxd_buffer_free(p, total);
  mlxd_buffer_free(q, colb);
  return phase_failed(t, st);
}
