/* Two-level collectives (hier.h): compositions of the flat algorithms on
 * views of the group's transport. Phases (tag phases, view.h):
 *   all_reduce small   1 gather to the leader, 2 leaders, 3 leader to its host
 *   all_reduce large   1 reduce-scatter in the host, 2 column, 3 all-gather in the host,
 *                      each segment of the buffer with its own tag segment (segmented)
 *   all_gather         4 column, 5 in the host
 *   sum_scatter        4 in the host, 5 column
 * (all_gather / sum_scatter through the all_reduce use 1-3.) Phases that
 * follow each other use different tag phases, so a rank still finishing
 * phase k never takes a message of a peer already in phase k + 1. */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "algo/algo_impl.h"
#include "algo/hier.h"
#include "core/buffer.h"
#include "transport/view.h"
#include "util/env.h"

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

/* The one-shot limit of a phase across hosts (v: the leaders or a column,
 * one rank per host): MLXDIST_SMALL_BYTES between two hosts, where the
 * one-shot and the pipeline send the same bytes; from three hosts at most
 * MLXD_HIER_CROSS_SMALL (hier.h), as the one-shot sends more through every
 * uplink than the pipeline. */
static size_t cross_small(const mlxd_transport* v) {
  size_t s = mlxd_algo_small_bytes();
  return v->size <= 2 || s < MLXD_HIER_CROSS_SMALL ? s : MLXD_HIER_CROSS_SMALL;
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

/* Whether a host of nlocal ranks takes the log-depth forms inside the host
 * (recursive doubling, a binomial tree) instead of the leader's gather and
 * broadcast or the one-shot: from MLXD_LOGN_SHM_WIDE_RANKS, where making a
 * pair of lanes with every rank of the host costs more than the steps. The
 * same on every rank of the group (h->nlocal is the same on a host; the
 * columns form needs every host alike). */
static bool host_wide(const mlxd_hier* h) { return h->nlocal >= MLXD_LOGN_SHM_WIDE_RANKS; }

/* Phase 3 of a wide host: a binomial tree from local 0 (each rank receives
 * once, then sends to the ranks mask above it): log2 n peers, not n - 1. */
static int host_bcast_tree(mlxd_transport* v, uint64_t seq, const mlxd_sig* sig, void* out,
                           size_t nbytes, mlxd_status* st) {
  int n = v->size, r = v->rank;
  uint64_t tag = mlxd_tag(MLXD_TAG_COLL, seq, 0);
  int mask = 1;
  while (mask <= r) mask <<= 1; /* the round in which r receives: from r - mask / 2 */
  if (r != 0) {
    mlxd_req* q = NULL;
    if (v->ops->irecv(v, r - mask / 2, tag, sig, out, nbytes, &q, st)) return st->code;
    if (v->ops->waitall(v, &q, 1, st)) return st->code;
  }
  for (; r + mask < n && !st->code; mask <<= 1) {
    mlxd_req* q = NULL;
    if (v->ops->isend(v, r + mask, tag, sig, out, nbytes, &q, st)) return st->code;
    v->ops->waitall(v, &q, 1, st);
  }
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
    if (host_wide(h) ? mlxd_algo_all_reduce_rd(&v.base, seq, sig, in, out, count, dtype, op, st)
                     : gather_reduce(&v.base, seq, sig, in, out, count, nbytes, dtype, op, st))
      return phase_failed(t, st);
    src = out;
  }
  if (h->local_rank == 0) {
    mlxd_view_init(&v, t, h->leaders, h->nhosts, h->host, PH_LEADERS);
    if (mlxd_algo_all_reduce_upto(&v.base, cross_small(&v.base), seq, sig, src, out, count, dtype,
                                  op, st))
      return phase_failed(t, st);
  }
  if (h->nlocal > 1) {
    host_view(&v, t, h, PH_BCAST);
    if (host_wide(h) ? host_bcast_tree(&v.base, seq, sig, out, nbytes, st)
                     : host_bcast(&v.base, seq, sig, out, nbytes, st))
      return phase_failed(t, st);
  }
  return 0;
}

/* Phase 1: one-shot inside the host (every rank gets the host's sum, in
 * local order; recursive doubling's order on a wide host: the same on every
 * rank of it); phase 2: one-shot of the host sums in each column (host
 * order). Every rank does the same operations on the same values. */
static int all_reduce_columns(mlxd_transport* t, const mlxd_hier* h, uint64_t seq,
                              const mlxd_sig* sig, const void* in, void* out, size_t count,
                              mlx_dtype dtype, mlxd_reduce_op op, mlxd_status* st) {
  mlxd_view v;
  host_view(&v, t, h, PH_GATHER);
  if (host_wide(h) ? mlxd_algo_all_reduce_rd(&v.base, seq, sig, in, out, count, dtype, op, st)
                   : mlxd_algo_all_reduce_oneshot(&v.base, seq, sig, in, out, count, dtype, op, st))
    return phase_failed(t, st);
  mlxd_view_init(&v, t, h->col, h->nhosts, h->host, PH_LEADERS);
  if (mlxd_algo_all_reduce_oneshot(&v.base, seq, sig, out, out, count, dtype, op, st))
    return phase_failed(t, st);
  return 0;
}

/* ------------------------------------------- all_reduce large: slices
 *
 * The buffer is cut into nseg segments (segments(): about h->seg_bytes
 * each, at most MLXD_TAG_SEGMENTS, the first count % nseg one element
 * longer) and every segment k goes through the three phases of the slices
 * form (hier.h), each in its own view with tag phase and segment k:
 *   RS(k)   reduce-scatter of segment k inside the host: its c parts (c the
 *           fewest ranks any host has), part i to the host's local index i;
 *   COL(k)  all-reduce of part local_rank of segment k in this rank's column
 *           (skipped by a rank without a column or with an empty part: the
 *           whole column computes the same lengths and skips it alike);
 *   AG(k)   all-gather of segment k's parts inside the host.
 *
 * Overlap (nseg >= 2, several ranks on the host and a column): the column
 * phases run on a helper thread, the "column thread", so that segment k
 * crosses the hosts while segment k+1.. are reduce-scattered and k-1 is
 * all-gathered over shared memory:
 *   caller's thread   RS(0) RS(1) ... RS(nseg-1), then AG(0) ... AG(nseg-1),
 *                     AG(k) once COL(k) is done;
 *   column thread     COL(0) ... COL(nseg-1), COL(k) once RS(k) is done.
 * Otherwise one thread runs RS(0..nseg-1), then COL(k), AG(k) for each k
 * (also the fallback when the thread cannot start).
 *
 * No deadlock: order the phases RS(0) < ... < RS(nseg-1) < COL(0) < AG(0)
 * < COL(1) < AG(1) < ...; each thread above runs its phases in this order,
 * and a phase waits only for the same phase (same segment) on its peers and
 * for earlier phases on its own rank. So the earliest phase not yet done
 * everywhere is reached by every rank it involves (whatever ran before it on
 * their threads is earlier, hence done), and ends. Every (phase, segment)
 * pair has its own tags (transport.h), so no phase takes another's
 * messages, however the threads and the ranks interleave.
 *
 * Waits are bounded: the transport waits are (transport.h); a thread that
 * waits for the other's hand-over (handover_wait) wakes when that phase
 * ends, in success or failure, and every phase ends (its waits are bounded,
 * and a failure anywhere aborts the transport, which ends every other wait
 * at once).
 *
 * Results: each element is reduced in a fixed order that depends only on
 * count, the host map and h->seg_bytes (the same on every rank), on one
 * rank, and copied to the others: bit-identical everywhere, the same from
 * run to run, whichever thread runs which phase. */

/* Part i of count elements cut into parts parts (the first count % parts one
 * longer); parts from `parts` on are empty, at the end. */
static void part_one(size_t count, int parts, int i, size_t* off, size_t* len) {
  size_t q = count / (size_t)parts, rem = count % (size_t)parts, k = (size_t)i;
  if (i >= parts) {
    *off = count;
    *len = 0;
    return;
  }
  *off = q * k + (k < rem ? k : rem);
  *len = q + (k < rem ? 1 : 0);
}

typedef struct slices {
  mlxd_transport* t;
  const mlxd_hier* h;
  uint64_t seq;
  const mlxd_sig* sig;
  const char* in;
  char* out;
  size_t count, esz;
  mlx_dtype dtype;
  mlxd_reduce_op op;
  int nseg;
  /* the hand-over between the caller's thread and the column thread */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int rs_done;        /* segments reduce-scattered (caller -> column thread) */
  int col_done;       /* segments all-reduced across hosts (column thread -> caller) */
  bool failed;        /* a phase failed on either thread; the transport is aborted */
  mlxd_status col_st; /* the column thread's failure */
} slices;

static int segments(const mlxd_hier* h, size_t count, size_t esz) {
  if (h->seg_bytes == 0 || count == 0) return 1;
  size_t per = h->seg_bytes / esz;
  if (per == 0) per = 1;
  size_t n = count / per + (count % per != 0);
  return n > MLXD_TAG_SEGMENTS ? MLXD_TAG_SEGMENTS : (int)n;
}

/* Elements [*off, *off + *len) of the buffer are segment k. */
static void segment(const slices* s, int k, size_t* off, size_t* len) {
  part_one(s->count, s->nseg, k, off, len);
}

/* RS(k); off, len: c entries each (scratch). */
static int rs_seg(slices* s, int k, size_t* off, size_t* len, mlxd_status* st) {
  const mlxd_hier* h = s->h;
  size_t so, sn;
  segment(s, k, &so, &sn);
  for (int b = 0; b < h->nlocal; b++) part_one(sn, h->min_local, b, &off[b], &len[b]);
  mlxd_view v;
  host_view(&v, s->t, h, PH_RS);
  mlxd_view_set_segment(&v, (unsigned)k);
  return mlxd_algo_reduce_scatter_blocks(&v.base, s->seq, s->sig, s->in + so * s->esz,
                                         s->out + (so + off[h->local_rank]) * s->esz, off, len,
                                         s->dtype, s->op, st);
}

/* COL(k): this rank's part of segment k, in place in out once RS(k) put it
 * there (from in on a host of one rank). */
static int col_seg(slices* s, int k, mlxd_status* st) {
  const mlxd_hier* h = s->h;
  size_t so, sn, po, pn;
  segment(s, k, &so, &sn);
  part_one(sn, h->min_local, h->local_rank, &po, &pn);
  if (!h->col || pn == 0) return 0;
  const char* src = h->nlocal > 1 ? s->out : s->in;
  mlxd_view v;
  mlxd_view_init(&v, s->t, h->col, h->nhosts, h->host, PH_COL);
  mlxd_view_set_segment(&v, (unsigned)k);
  return mlxd_algo_all_reduce_upto(&v.base, cross_small(&v.base), s->seq, s->sig,
                                   src + (so + po) * s->esz, s->out + (so + po) * s->esz, pn,
                                   s->dtype, s->op, st);
}

/* AG(k); off, len: c entries each (scratch). */
static int ag_seg(slices* s, int k, size_t* off, size_t* len, mlxd_status* st) {
  const mlxd_hier* h = s->h;
  size_t so, sn;
  segment(s, k, &so, &sn);
  for (int b = 0; b < h->nlocal; b++) {
    part_one(sn, h->min_local, b, &off[b], &len[b]);
    off[b] *= s->esz;
    len[b] *= s->esz;
  }
  mlxd_view v;
  host_view(&v, s->t, h, PH_AG);
  mlxd_view_set_segment(&v, (unsigned)k);
  return mlxd_algo_all_gather_blocks(&v.base, s->seq, s->sig, s->out + so * s->esz, off, len, st);
}

/* Publish *counter = value to the other thread. */
static void handover_post(slices* s, int* counter, int value) {
  pthread_mutex_lock(&s->mu);
  *counter = value;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* A phase failed on this thread (the transport is aborted already): tell
 * the other one. from_column: keep st as the column thread's failure. */
static void handover_fail(slices* s, const mlxd_status* st, bool from_column) {
  pthread_mutex_lock(&s->mu);
  if (from_column && !s->failed) s->col_st = *st;
  s->failed = true;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* Wait until *counter >= value (true) or a phase failed (false). Bounded by
 * the other thread's phases (see above); sleeps in slices of 100 ms. */
static bool handover_wait(slices* s, const int* counter, int value) {
  pthread_mutex_lock(&s->mu);
  while (*counter < value && !s->failed) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_nsec += 100000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&s->cv, &s->mu, &ts);
  }
  bool ok = *counter >= value;
  pthread_mutex_unlock(&s->mu);
  return ok;
}

static void* column_main(void* arg) {
  slices* s = arg;
  mlxd_status st;
  mlxd_status_clear(&st);
  for (int k = 0; k < s->nseg; k++) {
    if (!handover_wait(s, &s->rs_done, k + 1)) break;
    if (col_seg(s, k, &st)) {
      phase_failed(s->t, &st);
      handover_fail(s, &st, true);
      break;
    }
    handover_post(s, &s->col_done, k + 1);
  }
  return NULL;
}

/* Start the column thread (signals blocked: they go to the application's
 * threads). false: it could not start (the caller runs COL itself). */
static bool column_start(slices* s, pthread_t* th) {
  pthread_condattr_t ca;
  if (pthread_condattr_init(&ca)) return false;
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  int rc = pthread_cond_init(&s->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (rc) return false;
  if (pthread_mutex_init(&s->mu, NULL)) {
    pthread_cond_destroy(&s->cv);
    return false;
  }
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  rc = mlxd_thread_start(th, "column", column_main, s);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc) {
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    return false;
  }
  return true;
}

static int all_reduce_large(mlxd_transport* t, const mlxd_hier* h, uint64_t seq,
                            const mlxd_sig* sig, const void* in, void* out, size_t count,
                            mlx_dtype dtype, mlxd_reduce_op op, mlxd_status* st) {
  int c = h->nlocal;
  size_t* off = malloc(2 * (size_t)c * sizeof *off);
  if (!off) {
    mlxd_algo_fail(st, MLXD_ENOMEM, "out of memory for %d blocks", c);
    return phase_failed(t, st);
  }
  size_t* len = off + c;
  slices s = {.t = t,
              .h = h,
              .seq = seq,
              .sig = sig,
              .in = in,
              .out = out,
              .count = count,
              .esz = mlxd_algo_esize(dtype, op),
              .dtype = dtype,
              .op = op};
  s.nseg = segments(h, count, s.esz);
  pthread_t th;
  bool threaded = s.nseg > 1 && c > 1 && h->col && column_start(&s, &th);
  int rc = 0;
  for (int k = 0; k < s.nseg && c > 1 && !rc; k++) {
    rc = rs_seg(&s, k, off, len, st);
    if (!rc && threaded) handover_post(&s, &s.rs_done, k + 1);
  }
  for (int k = 0; k < s.nseg && !rc; k++) {
    if (threaded) {
      if (!handover_wait(&s, &s.col_done, k + 1)) {
        *st = s.col_st;
        rc = st->code;
        break;
      }
    } else {
      rc = col_seg(&s, k, st);
    }
    if (!rc && c > 1) rc = ag_seg(&s, k, off, len, st);
  }
  if (rc) {
    phase_failed(t, st);
    if (threaded) handover_fail(&s, st, false);
  }
  if (threaded) {
    pthread_join(th, NULL);
    pthread_mutex_destroy(&s.mu);
    pthread_cond_destroy(&s.cv);
  }
  free(off);
  return rc;
}

int mlxd_algo_hier_all_reduce(mlxd_transport* t, const mlxd_hier* h, uint64_t seq,
                              const mlxd_sig* sig, const void* in, void* out, size_t count,
                              mlx_dtype dtype, mlxd_reduce_op op, mlxd_status* st) {
  mlxd_status_clear(st);
  assert(mlxd_hier_applies(h) && t->rank == h->rank && t->size == h->size);
  assert(count == 0 || (in && out));
  size_t nbytes = mlxd_algo_mul(count, mlxd_algo_esize(dtype, op));
  if (count == 0) return mlxd_algo_empty(t, seq, sig, st);
  switch (mlxd_hier_pick(h, nbytes)) {
    case MLXD_HIER_COLUMNS:
      return all_reduce_columns(t, h, seq, sig, in, out, count, dtype, op, st);
    case MLXD_HIER_LEADERS:
      return all_reduce_small(t, h, seq, sig, in, out, count, nbytes, dtype, op, st);
    default: return all_reduce_large(t, h, seq, sig, in, out, count, dtype, op, st);
  }
}

/* ---------------------------------------------------------- all_gather */

static bool regular(const mlxd_hier* h) { return h->min_local == h->max_local; }

/* The two scratch buffers of the column forms of all_gather and
 * sum_scatter; false (the transport failed with st) when out of memory. */
static bool scratch2(mlxd_transport* t, char** a, size_t na, char** b, size_t nb, mlxd_status* st) {
  *a = mlxd_buffer_alloc(na);
  *b = mlxd_buffer_alloc(nb);
  if (*a && *b) return true;
  mlxd_buffer_free(*a, na);
  mlxd_buffer_free(*b, nb);
  mlxd_algo_fail(st, MLXD_ENOMEM, "out of memory for %zu bytes", na + nb);
  phase_failed(t, st);
  return false;
}

int mlxd_algo_hier_all_gather(mlxd_transport* t, const mlxd_hier* h, uint64_t seq,
                              const mlxd_sig* sig, const void* in, void* out, size_t nbytes,
                              mlxd_status* st) {
  mlxd_status_clear(st);
  assert(mlxd_hier_applies(h) && t->rank == h->rank && t->size == h->size);
  assert(nbytes == 0 || (in && out));
  int n = h->size, H = h->nhosts, c = h->nlocal;
  size_t total = mlxd_algo_mul(nbytes, (size_t)n);
  if (nbytes == 0) return mlxd_algo_empty(t, seq, sig, st);
  char* own = (char*)out + (size_t)h->rank * nbytes;
  if (!regular(h)) {
    /* byte-wise max over zeros and each rank's block: exact for any bytes */
    if (own != (const char*)in) memmove(own, in, nbytes);
    memset(out, 0, (size_t)h->rank * nbytes);
    memset(own + nbytes, 0, total - (size_t)(h->rank + 1) * nbytes);
    return mlxd_algo_hier_all_reduce(t, h, seq, sig, out, out, total, MLX_UINT8, MLXD_MAX, st);
  }
  /* column: block of every host's rank with my local index, host order;
   * host: those of every local index, local order */
  size_t colb = mlxd_algo_mul(nbytes, (size_t)H);
  char *a, *b;
  if (!scratch2(t, &a, colb, &b, total, st)) return st->code;
  mlxd_view v;
  mlxd_view_init(&v, t, h->col, H, h->host, PH_X_FIRST);
  if (mlxd_algo_all_gather_upto(&v.base, cross_small(&v.base), seq, sig, in, a, nbytes, st) == 0) {
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
  if (count == 0) return mlxd_algo_empty(t, seq, sig, st);
  if (!regular(h)) {
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
  char *p, *q;
  if (!scratch2(t, &p, total, &q, colb, st)) return st->code;
  for (int i = 0; i < c; i++)
    for (int g = 0; g < H; g++)
      memcpy(p + ((size_t)i * (size_t)H + (size_t)g) * blk,
             (const char*)in + (size_t)h->by_host[h->host_start[g] + i] * blk, blk);
  mlxd_view v;
  host_view(&v, t, h, PH_X_FIRST);
  if (mlxd_algo_reduce_scatter(&v.base, seq, sig, p, q, count * (size_t)H, dtype, op, st) == 0) {
    mlxd_view_init(&v, t, h->col, H, h->host, PH_X_SECOND);
    mlxd_algo_reduce_scatter_upto(&v.base, cross_small(&v.base), seq, sig, q, out, count, dtype, op,
                                  st);
  }
  mlxd_buffer_free(p, total);
  mlxd_buffer_free(q, colb);
  return phase_failed(t, st);
}
