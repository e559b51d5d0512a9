/* The pipeline algorithm: the engine shared by the large all_reduce,
 * all_gather and reduce_scatter. (Called "the ring algorithm" before
 * issue 38: "ring" names the ring backend alone.)
 *
 * The buffer is cut into `size` blocks per direction. In direction d
 * (+1 or -1) rank r sends to r + d and receives from r - d. A schedule of
 * S steps moves one block per step; every block is further cut into C
 * chunks, and work is done unit by unit, unit u = step * C + chunk, so that
 * the chunk received at step s is reduced and forwarded at step s + 1 while
 * the next chunks are still arriving (receives are posted MLXD_PIPELINE_WINDOW
 * units ahead where they reduce, all at once for all_gather; the kernel's
 * socket buffers keep moving data while this thread reduces).
 *
 * Schedules (blocks taken mod size):
 *   AR (all_reduce)      steps 0..n-2 reduce-scatter: send block r - d*s,
 *                        receive block r - d*(s+1) and reduce it with the
 *                        local input; rank r ends with block r + d complete.
 *                        Steps n-1..2n-3 all-gather (t = s - n + 1): send
 *                        block r - d*(t-1), receive block r - d*t into out.
 *   AG (all_gather)      steps 0..n-2: send block r - d*s, receive block
 *                        r - d*(s+1) into out (rank r starts with block r).
 *   RS (reduce_scatter)  steps 0..n-2: send block r - d*(s+1), receive block
 *                        r - d*(s+2) and reduce it; rank r ends with block r.
 * Each step sends what the previous step received, so the send of unit
 * u + C could be posted as soon as unit u is done; it is posted then, or
 * (where the receives are posted fewer than C units ahead) that of u + lead
 * (below).
 *
 * Determinism: every element of a reduced block is combined by exactly one
 * chain of ranks in a fixed order and the final value is computed on one
 * rank and copied to the others, so all ranks hold bit-identical results.
 *
 * Buffer reuse is safe: a region is only overwritten by the all-gather
 * after this rank's earlier send of that region has been received
 * downstream (the data that overwrites it is causally later). */
#include <stdlib.h>
#include <string.h>

#include "algo/algo_impl.h"
#include "core/buffer.h"

#define PIPELINE_MAX_UNITS 32767 /* units per direction fit in 15 tag bits */

typedef struct pipeline_dir {
  int d, to, from;
  const size_t* boff;
  const size_t* blen;
  char* tmp;       /* MLXD_PIPELINE_WINDOW chunk slots (reductions only) */
  mlxd_req** recv; /* U entries */
  mlxd_req** send; /* U entries */
} pipeline_dir;

typedef struct pipeline_ctx {
  mlxd_transport* t;
  const mlxd_pipeline_plan* p;
  uint64_t seq;
  int n, r, S;
  size_t C, U, W, chunk_max;
  pipeline_dir dir[2];
} pipeline_ctx;

static int mod_n(long x, int n) {
  long m = x % n;
  return (int)(m < 0 ? m + n : m);
}

static int send_block(const pipeline_ctx* x, const pipeline_dir* d, int s) {
  switch (x->p->mode) {
    case MLXD_PIPELINE_AR:
      return mod_n(s < x->n - 1 ? x->r - (long)d->d * s : x->r - (long)d->d * (s - x->n), x->n);
    case MLXD_PIPELINE_AG: return mod_n(x->r - (long)d->d * s, x->n);
    default: return mod_n(x->r - (long)d->d * (s + 1), x->n);
  }
}

static int recv_block(const pipeline_ctx* x, const pipeline_dir* d, int s) {
  switch (x->p->mode) {
    case MLXD_PIPELINE_AR:
      return mod_n(s < x->n - 1 ? x->r - (long)d->d * (s + 1) : x->r - (long)d->d * (s - x->n + 1),
                   x->n);
    case MLXD_PIPELINE_AG: return mod_n(x->r - (long)d->d * (s + 1), x->n);
    default: return mod_n(x->r - (long)d->d * (s + 2), x->n);
  }
}

static bool step_reduces(const pipeline_ctx* x, int s) {
  switch (x->p->mode) {
    case MLXD_PIPELINE_AR: return s < x->n - 1;
    case MLXD_PIPELINE_AG: return false;
    default: return true;
  }
}

/* Element range of chunk c of block b in direction d. */
static void chunk_range(const pipeline_ctx* x, const pipeline_dir* d, int b, size_t c, size_t* off,
                        size_t* len) {
  size_t m = d->blen[b], q = m / x->C, rem = m % x->C;
  *off = d->boff[b] + q * c + (c < rem ? c : rem);
  *len = q + (c < rem ? 1 : 0);
}

static uint64_t unit_tag(const pipeline_ctx* x, int di, size_t u) {
  return mlxd_tag(MLXD_TAG_COLL, x->seq, (unsigned)(((unsigned)di << 15) | (unsigned)u));
}

static int post_send(pipeline_ctx* x, int di, size_t u, mlxd_status* st) {
  pipeline_dir* d = &x->dir[di];
  const mlxd_pipeline_plan* p = x->p;
  int s = (int)(u / x->C);
  size_t off, len;
  chunk_range(x, d, send_block(x, d, s), u % x->C, &off, &len);
  const char* src;
  if (p->mode == MLXD_PIPELINE_AG && s == 0 && p->in)
    return x->t->ops->isend(x->t, d->to, unit_tag(x, di, u), p->sig, p->in + (off - p->out_base),
                            len, &d->send[u], st);
  if (p->mode == MLXD_PIPELINE_AG)
    src = p->out;
  else if (s == 0)
    src = p->in;
  else
    src = p->mode == MLXD_PIPELINE_AR ? p->out : p->work;
  return x->t->ops->isend(x->t, d->to, unit_tag(x, di, u), p->sig, src + off * p->esz, len * p->esz,
                          &d->send[u], st);
}

static int post_recv(pipeline_ctx* x, int di, size_t u, mlxd_status* st) {
  pipeline_dir* d = &x->dir[di];
  const mlxd_pipeline_plan* p = x->p;
  int s = (int)(u / x->C);
  size_t off, len;
  chunk_range(x, d, recv_block(x, d, s), u % x->C, &off, &len);
  char* dst =
      step_reduces(x, s) ? d->tmp + (u % x->W) * x->chunk_max * p->esz : p->out + off * p->esz;
  return x->t->ops->irecv(x->t, d->from, unit_tag(x, di, u), p->sig, dst, len * p->esz, &d->recv[u],
                          st);
}

static void process(pipeline_ctx* x, int di, size_t u) {
  pipeline_dir* d = &x->dir[di];
  const mlxd_pipeline_plan* p = x->p;
  int s = (int)(u / x->C);
  if (!step_reduces(x, s)) return;
  size_t off, len;
  chunk_range(x, d, recv_block(x, d, s), u % x->C, &off, &len);
  if (len == 0) return;
  const char* tmp = d->tmp + (u % x->W) * x->chunk_max * p->esz;
  char* dst;
  if (p->mode == MLXD_PIPELINE_AR)
    dst = p->out + off * p->esz;
  else if (s == x->n - 2)
    dst = p->out + (off - p->out_base) * p->esz;
  else
    dst = p->work + off * p->esz;
  /* received partial (from the ranks before us in the chain) OP our input */
  mlxd_reduce3(p->op, p->dtype, dst, tmp, p->in + off * p->esz, len);
}

int mlxd_pipeline_run(mlxd_transport* t, uint64_t seq, const mlxd_pipeline_plan* p,
                      mlxd_status* st) {
  pipeline_ctx x;
  memset(&x, 0, sizeof x);
  x.t = t;
  x.p = p;
  x.seq = seq;
  x.n = t->size;
  x.r = t->rank;
  x.S = p->mode == MLXD_PIPELINE_AR ? 2 * (x.n - 1) : x.n - 1;
  if (x.S <= 0) return 0;
  if (x.S > PIPELINE_MAX_UNITS)
    return mlxd_algo_fail(st, MLXD_EINVAL,
                          "the pipeline algorithms support at most %d ranks, this group has %d",
                          PIPELINE_MAX_UNITS / 2, x.n);
  size_t maxblk = 0;
  for (int di = 0; di < p->ndir; di++)
    for (int b = 0; b < x.n; b++)
      if (p->blen[di][b] > maxblk) maxblk = p->blen[di][b];
  size_t maxbytes = maxblk * p->esz;
  size_t chunk = t->pipeline_chunk ? t->pipeline_chunk : MLXD_PIPELINE_CHUNK;
  x.C = maxbytes / chunk + (maxbytes % chunk != 0);
  if (x.C > (size_t)(PIPELINE_MAX_UNITS / x.S)) x.C = (size_t)(PIPELINE_MAX_UNITS / x.S);
  if (x.C > maxblk) x.C = maxblk;
  if (x.C == 0) x.C = 1;
  x.U = (size_t)x.S * x.C;
  /* all_gather posts every receive up front: each lands in its own part of
   * out, and a chunk with no receive posted yet would be staged by the
   * transport and copied again (the sends run a whole block ahead: 4 ranks
   * x 64 MiB over TCP, three quarters of the data). */
  x.W = x.U < MLXD_PIPELINE_WINDOW || p->mode == MLXD_PIPELINE_AG ? x.U : MLXD_PIPELINE_WINDOW;
  x.chunk_max = maxblk / x.C + (maxblk % x.C != 0);

  bool reduces = p->mode != MLXD_PIPELINE_AG;
  mlxd_req** reqs = calloc((size_t)p->ndir * 2 * x.U, sizeof *reqs);
  char* tmp = NULL;
  if (reduces && x.chunk_max > 0)
    tmp = mlxd_buffer_alloc((size_t)p->ndir * x.W * x.chunk_max * p->esz);
  if (!reqs || (reduces && x.chunk_max > 0 && !tmp)) {
    free(reqs);
    mlxd_buffer_free(tmp, (size_t)p->ndir * x.W * x.chunk_max * p->esz);
    return mlxd_algo_fail(st, MLXD_ENOMEM, "out of memory for a pipeline schedule of %zu chunks",
                          x.U);
  }
  for (int di = 0; di < p->ndir; di++) {
    pipeline_dir* d = &x.dir[di];
    d->d = di == 0 ? 1 : -1;
    d->to = mod_n(x.r + d->d, x.n);
    d->from = mod_n(x.r - d->d, x.n);
    d->boff = p->boff[di];
    d->blen = p->blen[di];
    d->tmp = tmp ? tmp + (size_t)di * x.W * x.chunk_max * p->esz : NULL;
    d->recv = reqs + (size_t)di * 2 * x.U;
    d->send = d->recv + x.U;
  }

  /* Sends run `lead` units ahead of this rank's progress: a block (each
   * step forwards what the last one received) or, where that is more than
   * the receives posted ahead (reductions with more than MLXD_PIPELINE_WINDOW
   * chunks a block), as far as those: a chunk sent before its receive is
   * posted is staged by the transport and copied twice (a rank behind its
   * predecessor still gets a few such; no longer a block's worth). Unit u + lead's
   * data is ready once unit u is done (lead <= C). */
  const size_t lead = x.W < x.C ? x.W : x.C;
  int rc = 0;
  for (size_t c = 0; c < lead && !rc; c++)
    for (int di = 0; di < p->ndir && !rc; di++) rc = post_send(&x, di, c, st);
  for (size_t u = 0; u < x.W && !rc; u++)
    for (int di = 0; di < p->ndir && !rc; di++) rc = post_recv(&x, di, u, st);
  /* AG with a separate input: this rank's block (read from in by the sends
   * just posted) into out while the first chunks travel. */
  if (!rc && p->mode == MLXD_PIPELINE_AG && p->in)
    for (int di = 0; di < p->ndir; di++)
      if (x.dir[di].blen[x.r])
        memcpy(p->out + x.dir[di].boff[x.r], p->in + (x.dir[di].boff[x.r] - p->out_base),
               x.dir[di].blen[x.r]);
  for (size_t u = 0; u < x.U && !rc; u++) {
    mlxd_req* w[2] = {x.dir[0].recv[u], p->ndir > 1 ? x.dir[1].recv[u] : NULL};
    x.dir[0].recv[u] = NULL;
    if (p->ndir > 1) x.dir[1].recv[u] = NULL;
    rc = t->ops->waitall(t, w, 2, st);
    for (int di = 0; di < p->ndir && !rc; di++) {
      process(&x, di, u);
      if (u + x.W < x.U) rc = post_recv(&x, di, u + x.W, st);
      if (!rc && u + lead < x.U) rc = post_send(&x, di, u + lead, st);
    }
  }
  /* Sends complete here on success; on failure everything still posted is
   * drained (it fails fast once the transport has failed). */
  mlxd_algo_drain(t, reqs, (int)((size_t)p->ndir * 2 * x.U), st);
  free(reqs);
  mlxd_buffer_free(tmp, (size_t)p->ndir * x.W * x.chunk_max * p->esz);
  return st->code;
}
