/* The mpi plugin's group ops: groups and their staging buffers, the
 * collectives (all_reduce, all_gather, reduce_scatter), ABI v4's run, split
 * and destroy, and the ops table (send and recv are in mpi_p2p.c,
 * all_to_all and abort in mpi_a2a.c). Large arrays are
 * issued in pieces whose counts fit MPI's int. */
#include <assert.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/mpi/mpi_internal.h"
#include "util/clock.h"

/* Largest piece handed to one MPI call, in bytes (counts are int). */
#define MPI_DEFAULT_CHUNK_BYTES ((size_t)1 << 30)

/* Test knob: MLXDIST_MPI_CHUNK_BYTES makes the "count above INT_MAX" paths
 * run on small arrays (docs/mpi.md). */
size_t mlxd_mpi_chunk_bytes(void) {
  static size_t cached;
  size_t c = __atomic_load_n(&cached, __ATOMIC_RELAXED);
  if (c) return c;
  c = MPI_DEFAULT_CHUNK_BYTES;
  const char* v = getenv("MLXDIST_MPI_CHUNK_BYTES");
  if (v && *v) {
    char* end = NULL;
    unsigned long long x = strtoull(v, &end, 10);
    if (end && *end == '\0' && x >= 16 && x <= MPI_DEFAULT_CHUNK_BYTES)
      c = (size_t)x;
    else
      fprintf(stderr,
              "[mpi] ignoring MLXDIST_MPI_CHUNK_BYTES=%s: expected a byte count in [16, %zu]\n", v,
              MPI_DEFAULT_CHUNK_BYTES);
  }
  __atomic_store_n(&cached, c, __ATOMIC_RELAXED);
  return c;
}
static size_t chunk_elems(size_t esz) {
  size_t c = mlxd_mpi_chunk_bytes() / (esz ? esz : 1);
  return c ? c : 1;
}

static const mpip_ops k_mpi_ops;

mpi_group* mlxd_mpi_group_new(MPI_Comm comm, mlxd_status* st) {
  mpi_group* g = calloc(1, sizeof *g);
  if (!g) {
    mlxd_mpi_fail(st, MPIP_ENOMEM, "out of memory creating a group");
    return NULL;
  }
  int rank = 0, size = 1;
  mlxd_mpi_call_lock();
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  mlxd_mpi_call_unlock();
  g->base.ops = &k_mpi_ops;
  g->base.rank = rank;
  g->base.size = size;
  g->base.device = MPIP_DEVICE_CPU;
  g->comm = comm;
  pthread_mutex_init(&g->mu, NULL);
  mlxd_mpi_cv_init_monotonic(&g->cv);
  return g;
}

/* Staging buffers, for the plain ops (a host of ABI v1/v2, which cannot
 * lend its arrays): MPI works on the plugin's own memory, never on the
 * caller's arrays, because after a timeout a request may still be pending
 * (MPI has no way to cancel a collective) and a late peer would then make
 * MPI write into an array the caller has freed. Such a staging buffer is
 * handed to mlxd_mpi_abandon_keep and freed once MPI completes the request.
 * The *_ref ops of ABI v3 need none: they hold the caller's arrays instead.
 * A few buffers are pooled per group (grow-only). */
int mlxd_mpi_stage_get(mpi_group* g, size_t n, stage* out) {
  out->p = NULL;
  out->cap = 0;
  if (n == 0) n = 1;
  pthread_mutex_lock(&g->mu);
  int best = -1;
  for (int i = 0; i < MPI_STAGE_POOL; i++)
    if (g->pool[i].p && g->pool[i].cap >= n && (best < 0 || g->pool[i].cap < g->pool[best].cap))
      best = i;
  if (best >= 0) {
    *out = g->pool[best];
    g->pool[best].p = NULL;
    g->pool[best].cap = 0;
  }
  pthread_mutex_unlock(&g->mu);
  if (out->p) return 0;
  out->p = malloc(n);
  out->cap = n;
  return out->p ? 0 : MPIP_ENOMEM;
}

void mlxd_mpi_stage_put(mpi_group* g, stage* sgs) {
  if (!sgs->p) return;
  pthread_mutex_lock(&g->mu);
  int slot = -1;
  for (int i = 0; i < MPI_STAGE_POOL; i++) {
    if (!g->pool[i].p) {
      slot = i;
      break;
    }
    if (g->pool[i].cap < sgs->cap && (slot < 0 || g->pool[i].cap < g->pool[slot].cap)) slot = i;
  }
  stage old = {NULL, 0};
  if (slot >= 0) {
    old = g->pool[slot];
    g->pool[slot] = *sgs;
  } else {
    old = *sgs;
  }
  pthread_mutex_unlock(&g->mu);
  free(old.p);
  sgs->p = NULL;
}

/* Whether [a, a+na) and [b, b+nb) share a byte. */
static bool overlap(const void* a, size_t na, const void* b, size_t nb) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return na && nb && x < y + nb && y < x + na;
}

/* Common tail of a collective: after issuing (turn still held), release the
 * turn and wait. Staged (ref NULL): on success copy the result out of the
 * staging buffer. Direct (ref set: MPI works on the caller's arrays): on a
 * failure with requests still pending, the caller's arrays are held until
 * MPI completes them (mlxd_mpi_abandon_keep). A staging buffer that MPI may
 * still use is freed the same way, once MPI is done with it. */
static int coll_finish(mpi_group* g, MPI_Request* reqs, int issued, int rc, stage* sg,
                       const mpip_bufref* ref, const void* result, void* out, size_t out_bytes,
                       const char* what, mlxd_status* st) {
  mlxd_mpi_turn_done(g);
  mpi_keep keep = {.ref = ref, .own = ref ? NULL : sg->p};
  if (rc) {
    mlxd_mpi_abandon_keep(reqs, issued, &keep);
    mlxd_mpi_group_fail(g, st);
  } else {
    rc = mlxd_mpi_wait_reqs_keep(g, reqs, issued, NULL, false, &keep, what, -1, st);
  }
  if (rc == 0) {
    if (!ref && out_bytes) memcpy(out, result, out_bytes);
    mlxd_mpi_stage_put(g, sg);
  } else if (!ref) {
    sg->p = NULL; /* taken by mlxd_mpi_abandon_keep: freed once MPI is done with it */
  }
  return rc;
}

/* The collectives. ref == NULL (the plain ops of every ABI): MPI works on a
 * staging copy. ref set (ABI v3's *_ref ops): on the caller's in and out,
 * with no copy; the core promises they do not overlap, and where they would
 * (not a call the core makes) the staging copy is used, since MPI allows
 * aliasing only through MPI_IN_PLACE. */
static int all_reduce_impl(mpip_backend* b, uint64_t seq, const void* in, void* out, size_t count,
                           mpip_dtype dtype, mpip_op op, const mpip_bufref* ref, mlxd_status* st) {
  mpi_group* g = (mpi_group*)b;
  char what[128];
  snprintf(what, sizeof what, "%s of %zu elements", mlxd_mpi_reduce_name(op), count);
  /* The front-end guarantees a valid dtype and op (plugin ABI contract). */
  assert(dtype >= 0 && dtype < MPIP_DTYPE_COUNT && op >= 0 && op < MPIP_OP_COUNT);
  MPI_Datatype dt = mlxd_mpi_dtype(dtype);
  MPI_Op mop = mlxd_mpi_op(dtype, op);
  size_t esz = mlxd_mpi_host.dtype_size(dtype);
  assert(mop != MPI_OP_NULL && esz > 0);
  /* in == out is MPI_IN_PLACE; a partial overlap has no MPI form: staged. */
  if (ref && in != out && overlap(in, count * esz, out, count * esz)) ref = NULL;
  size_t ch = chunk_elems(esz);
  if (ch > (size_t)INT_MAX) ch = (size_t)INT_MAX;
  int nreq = count == 0 ? 0 : (int)((count + ch - 1) / ch);
  MPI_Request one = MPI_REQUEST_NULL;
  MPI_Request* reqs = nreq <= 1 ? &one : malloc(sizeof(MPI_Request) * (size_t)nreq);
  stage sg = {NULL, 0};
  bool nomem = !reqs || (!ref && count && mlxd_mpi_stage_get(g, count * esz, &sg) != 0);
  int rc = mlxd_mpi_op_begin(st);
  if (rc) goto out_free;
  rc = mlxd_mpi_turn_wait(g, seq, what, st);
  if (rc) goto out;
  if (g->check) {
    mpip_sig sig = mlxd_mpi_sig(g, MPIP_SIG_ALL_SUM + op, dtype, count, seq);
    rc = mlxd_mpi_check_coll(g, &sig, mlxd_mpi_reduce_name(op), st);
    if (rc) {
      mlxd_mpi_turn_done(g);
      goto out;
    }
  }
  if (count == 0) {
    mlxd_mpi_turn_done(g);
    goto out;
  }
  if (nomem) {
    mlxd_mpi_turn_done(g);
    rc = mlxd_mpi_fail(st, MPIP_ENOMEM, "out of memory in %s", what);
    mlxd_mpi_group_fail(g, st); /* the other ranks issued it: this group is out of step */
    goto out;
  }
  /* Staged: in place on the copy. Direct: in to out (in place when equal). */
  bool in_place = !ref || in == out;
  char* rbuf = ref ? (char*)out : (char*)sg.p;
  if (!ref) memcpy(sg.p, in, count * esz);
  int issued = 0;
  mlxd_mpi_call_lock();
  for (size_t off = 0; off < count; off += ch) {
    size_t c = count - off < ch ? count - off : ch;
    const void* sbuf = in_place ? MPI_IN_PLACE : (const char*)in + off * esz;
    int mrc = MPI_Iallreduce(sbuf, rbuf + off * esz, (int)c, dt, mop, g->comm, &reqs[issued]);
    if (mrc != MPI_SUCCESS) {
      rc = mlxd_mpi_fail_call(st, MPIP_EREMOTE, mrc, "MPI_Iallreduce", what);
      break;
    }
    issued++;
  }
  mlxd_mpi_call_unlock();
  rc = coll_finish(g, reqs, issued, rc, &sg, ref, sg.p, out, count * esz, what, st);
out:
  mlxd_mpi_op_end();
out_free:
  mlxd_mpi_stage_put(g, &sg); /* no-op when taken or already returned */
  if (reqs && reqs != &one) free(reqs);
  return rc;
}

static int all_gather_impl(mpip_backend* b, uint64_t seq, const void* in, void* out, size_t nbytes,
                           const mpip_bufref* ref, mlxd_status* st) {
  mpi_group* g = (mpi_group*)b;
  char what[128];
  snprintf(what, sizeof what, "all_gather of %zu bytes per rank", nbytes);
  size_t total = nbytes * (size_t)g->base.size;
  if (ref && overlap(in, nbytes, out, total)) ref = NULL; /* MPI forbids aliasing: staged */
  size_t ch = mlxd_mpi_chunk_bytes();
  if (ch > (size_t)INT_MAX) ch = (size_t)INT_MAX;
  int nreq = nbytes == 0 ? 0 : (int)((nbytes + ch - 1) / ch);
  MPI_Request one = MPI_REQUEST_NULL;
  MPI_Request* reqs = nreq <= 1 ? &one : malloc(sizeof(MPI_Request) * (size_t)nreq);
  stage sg = {NULL, 0};
  bool nomem = !reqs || (!ref && nbytes && mlxd_mpi_stage_get(g, total, &sg) != 0);
  int rc = mlxd_mpi_op_begin(st);
  if (rc) goto out_free;
  rc = mlxd_mpi_turn_wait(g, seq, what, st);
  if (rc) goto out;
  if (g->check) {
    mpip_sig sig = mlxd_mpi_sig(g, MPIP_SIG_ALL_GATHER, -1, nbytes, seq);
    rc = mlxd_mpi_check_coll(g, &sig, "all_gather", st);
    if (rc) {
      mlxd_mpi_turn_done(g);
      goto out;
    }
  }
  if (nbytes == 0) {
    mlxd_mpi_turn_done(g);
    goto out;
  }
  if (nomem) {
    mlxd_mpi_turn_done(g);
    rc = mlxd_mpi_fail(st, MPIP_ENOMEM, "out of memory in %s", what);
    mlxd_mpi_group_fail(g, st);
    goto out;
  }
  /* Staged: our block in place in the copy. Direct: from in into out. */
  char* rbuf = ref ? (char*)out : (char*)sg.p;
  if (!ref) memcpy(rbuf + (size_t)g->base.rank * nbytes, in, nbytes);
  int issued = 0;
  mlxd_mpi_call_lock();
  if (nreq == 1) {
    const void* sbuf = ref ? in : MPI_IN_PLACE;
    int mrc =
        MPI_Iallgather(sbuf, (int)nbytes, MPI_BYTE, rbuf, (int)nbytes, MPI_BYTE, g->comm, &reqs[0]);
    if (mrc != MPI_SUCCESS)
      rc = mlxd_mpi_fail_call(st, MPIP_EREMOTE, mrc, "MPI_Iallgather", what);
    else
      issued = 1;
  } else {
    /* Piece [off, off+c) of every rank's block: a receive type of c bytes
     * whose extent is nbytes places rank r's piece at r * nbytes + off. */
    for (size_t off = 0; off < nbytes && rc == 0; off += ch) {
      size_t c = nbytes - off < ch ? nbytes - off : ch;
      const void* sbuf = ref ? (const char*)in + off : MPI_IN_PLACE;
      MPI_Datatype piece = MPI_DATATYPE_NULL, strided = MPI_DATATYPE_NULL;
      int mrc = MPI_Type_contiguous((int)c, MPI_BYTE, &piece);
      if (mrc == MPI_SUCCESS) mrc = MPI_Type_create_resized(piece, 0, (MPI_Aint)nbytes, &strided);
      if (mrc == MPI_SUCCESS) mrc = MPI_Type_commit(&strided);
      if (mrc == MPI_SUCCESS)
        mrc =
            MPI_Iallgather(sbuf, (int)c, MPI_BYTE, rbuf + off, 1, strided, g->comm, &reqs[issued]);
      if (piece != MPI_DATATYPE_NULL) MPI_Type_free(&piece);
      if (strided != MPI_DATATYPE_NULL) MPI_Type_free(&strided);
      if (mrc != MPI_SUCCESS)
        rc = mlxd_mpi_fail_call(st, MPIP_EREMOTE, mrc, "MPI_Iallgather", what);
      else
        issued++;
    }
  }
  mlxd_mpi_call_unlock();
  rc = coll_finish(g, reqs, issued, rc, &sg, ref, sg.p, out, total, what, st);
out:
  mlxd_mpi_op_end();
out_free:
  mlxd_mpi_stage_put(g, &sg);
  if (reqs && reqs != &one) free(reqs);
  return rc;
}

static int reduce_scatter_impl(mpip_backend* b, uint64_t seq, const void* in, void* out,
                               size_t count, mpip_dtype dtype, mpip_op op, const mpip_bufref* ref,
                               mlxd_status* st) {
  mpi_group* g = (mpi_group*)b;
  char what[128];
  snprintf(what, sizeof what, "%s of %zu elements per rank", mlxd_mpi_scatter_name(op), count);
  /* The front-end guarantees a valid dtype and op (plugin ABI contract). */
  assert(dtype >= 0 && dtype < MPIP_DTYPE_COUNT && op >= 0 && op < MPIP_OP_COUNT);
  MPI_Datatype dt = mlxd_mpi_dtype(dtype);
  MPI_Op mop = mlxd_mpi_op(dtype, op);
  size_t esz = mlxd_mpi_host.dtype_size(dtype);
  assert(mop != MPI_OP_NULL && esz > 0);
  int size = g->base.size, rank = g->base.rank;
  if (ref && overlap(in, count * esz * (size_t)size, out, count * esz)) ref = NULL; /* staged */
  size_t ch = chunk_elems(esz);
  if (ch > (size_t)INT_MAX) ch = (size_t)INT_MAX;
  size_t npieces = count == 0 ? 0 : (count + ch - 1) / ch;
  int nreq = npieces <= 1 ? 1 : (int)(npieces * (size_t)size);
  MPI_Request one = MPI_REQUEST_NULL;
  MPI_Request* reqs = nreq == 1 ? &one : malloc(sizeof(MPI_Request) * (size_t)nreq);
  stage sg = {NULL, 0};
  bool nomem =
      !reqs || (!ref && count && mlxd_mpi_stage_get(g, count * esz * (size_t)size, &sg) != 0);
  int rc = mlxd_mpi_op_begin(st);
  if (rc) goto out_free;
  rc = mlxd_mpi_turn_wait(g, seq, what, st);
  if (rc) goto out;
  if (g->check) {
    mpip_sig sig = mlxd_mpi_sig(g, MPIP_SIG_SUM_SCATTER + op, dtype, count, seq);
    rc = mlxd_mpi_check_coll(g, &sig, mlxd_mpi_scatter_name(op), st);
    if (rc) {
      mlxd_mpi_turn_done(g);
      goto out;
    }
  }
  if (count == 0) {
    mlxd_mpi_turn_done(g);
    goto out;
  }
  if (nomem) {
    mlxd_mpi_turn_done(g);
    rc = mlxd_mpi_fail(st, MPIP_ENOMEM, "out of memory in %s", what);
    mlxd_mpi_group_fail(g, st);
    goto out;
  }
  if (!ref) memcpy(sg.p, in, count * esz * (size_t)size);
  const char* result = sg.p;
  int issued = 0;
  mlxd_mpi_call_lock();
  if (npieces == 1) {
    /* Staged: in place, the result lands at the start of the copy. Direct: in to out. */
    int mrc =
        ref ? MPI_Ireduce_scatter_block(in, out, (int)count, dt, mop, g->comm, &reqs[0])
            : MPI_Ireduce_scatter_block(MPI_IN_PLACE, sg.p, (int)count, dt, mop, g->comm, &reqs[0]);
    if (mrc != MPI_SUCCESS)
      rc = mlxd_mpi_fail_call(st, MPIP_EREMOTE, mrc, "MPI_Ireduce_scatter_block", what);
    else
      issued = 1;
  } else {
    /* Piece by piece: reduce piece [off, off+c) of block r onto rank r.
     * Staged: in place there, so our result ends up in our own block of the
     * copy. Direct: from in, into out at off on rank r. */
    result = (const char*)sg.p + (size_t)rank * count * esz;
    const char* src = ref ? (const char*)in : (const char*)sg.p;
    for (size_t off = 0; off < count && rc == 0; off += ch) {
      size_t c = count - off < ch ? count - off : ch;
      for (int r = 0; r < size && rc == 0; r++) {
        const char* blk = src + ((size_t)r * count + off) * esz;
        int mrc;
        if (r != rank)
          mrc = MPI_Ireduce(blk, NULL, (int)c, dt, mop, r, g->comm, &reqs[issued]);
        else if (ref)
          mrc =
              MPI_Ireduce(blk, (char*)out + off * esz, (int)c, dt, mop, r, g->comm, &reqs[issued]);
        else
          mrc = MPI_Ireduce(MPI_IN_PLACE, (char*)blk, (int)c, dt, mop, r, g->comm, &reqs[issued]);
        if (mrc != MPI_SUCCESS)
          rc = mlxd_mpi_fail_call(st, MPIP_EREMOTE, mrc, "MPI_Ireduce", what);
        else
          issued++;
      }
    }
  }
  mlxd_mpi_call_unlock();
  rc = coll_finish(g, reqs, issued, rc, &sg, ref, result, out, count * esz, what, st);
out:
  mlxd_mpi_op_end();
out_free:
  mlxd_mpi_stage_put(g, &sg);
  if (reqs && reqs != &one) free(reqs);
  return rc;
}

/* The ops of the table: plain (staged) and, in ABI v3, *_ref (direct).
 * Each renders its failure once, here (mlxd_mpi_group_done); its status is
 * set up with mlxd_status_reset, which leaves the text buffers alone. */
static int mpi_all_reduce(mpip_backend* b, uint64_t seq, const void* in, void* out, size_t count,
                          mpip_dtype dtype, mpip_op op, mpip_status* st) {
  mlxd_status s;
  mlxd_status_reset(&s);
  int rc = all_reduce_impl(b, seq, in, out, count, dtype, op, NULL, &s);
  return mlxd_mpi_group_done((mpi_group*)b, rc, &s, mlxd_mpi_reduce_name(op), seq, st);
}
static int mpi_all_gather(mpip_backend* b, uint64_t seq, const void* in, void* out, size_t nbytes,
                          mpip_status* st) {
  mlxd_status s;
  mlxd_status_reset(&s);
  int rc = all_gather_impl(b, seq, in, out, nbytes, NULL, &s);
  return mlxd_mpi_group_done((mpi_group*)b, rc, &s, "all_gather", seq, st);
}
static int mpi_reduce_scatter(mpip_backend* b, uint64_t seq, const void* in, void* out,
                              size_t count, mpip_dtype dtype, mpip_op op, mpip_status* st) {
  mlxd_status s;
  mlxd_status_reset(&s);
  int rc = reduce_scatter_impl(b, seq, in, out, count, dtype, op, NULL, &s);
  return mlxd_mpi_group_done((mpi_group*)b, rc, &s, mlxd_mpi_scatter_name(op), seq, st);
}
#if MPIP_HAS_REF
static int mpi_all_reduce_ref(mpip_backend* b, uint64_t seq, const void* in, void* out,
                              size_t count, mpip_dtype dtype, mpip_op op, const mpip_bufref* ref,
                              mpip_status* st) {
  mlxd_status s;
  mlxd_status_reset(&s);
  int rc = all_reduce_impl(b, seq, in, out, count, dtype, op, ref, &s);
  return mlxd_mpi_group_done((mpi_group*)b, rc, &s, mlxd_mpi_reduce_name(op), seq, st);
}
static int mpi_all_gather_ref(mpip_backend* b, uint64_t seq, const void* in, void* out,
                              size_t nbytes, const mpip_bufref* ref, mpip_status* st) {
  mlxd_status s;
  mlxd_status_reset(&s);
  int rc = all_gather_impl(b, seq, in, out, nbytes, ref, &s);
  return mlxd_mpi_group_done((mpi_group*)b, rc, &s, "all_gather", seq, st);
}
static int mpi_reduce_scatter_ref(mpip_backend* b, uint64_t seq, const void* in, void* out,
                                  size_t count, mpip_dtype dtype, mpip_op op,
                                  const mpip_bufref* ref, mpip_status* st) {
  mlxd_status s;
  mlxd_status_reset(&s);
  int rc = reduce_scatter_impl(b, seq, in, out, count, dtype, op, ref, &s);
  return mlxd_mpi_group_done((mpi_group*)b, rc, &s, mlxd_mpi_scatter_name(op), seq, st);
}
#endif

#if MPIP_HAS_RUN
/* ABI v4's run: every kind, told by the descriptor, on the caller's arrays
 * (the same code as the *_ref ops); all_to_all exists only here. */
static int mpi_run(mpip_backend* b, const mpip_call* c, mpip_status* st) {
  const char* name = c->kind == MPIP_C(KIND_ALL_REDUCE)       ? mlxd_mpi_reduce_name(c->reduce)
                     : c->kind == MPIP_C(KIND_REDUCE_SCATTER) ? mlxd_mpi_scatter_name(c->reduce)
                     : c->kind == MPIP_C(KIND_ALL_GATHER)     ? "all_gather"
                     : c->kind == MPIP_C(KIND_ALL_TO_ALL)     ? "all_to_all"
                     : c->kind == MPIP_C(KIND_SEND)           ? "send"
                                                              : "recv";
  int rc = mlxd_mpi_run_check(b, c, name, st);
  if (rc) return rc;
  size_t bytes = c->count * mlxd_mpi_host.dtype_size(c->dtype);
  switch (c->kind) {
    case MPIP_C(KIND_ALL_REDUCE):
      return mpi_all_reduce_ref(b, c->seq, c->in.data, c->out.data, c->count, c->dtype, c->reduce,
                                c->ref, st);
    case MPIP_C(KIND_ALL_GATHER):
      return mpi_all_gather_ref(b, c->seq, c->in.data, c->out.data, bytes, c->ref, st);
    case MPIP_C(KIND_REDUCE_SCATTER):
      return mpi_reduce_scatter_ref(b, c->seq, c->in.data, c->out.data, c->count, c->dtype,
                                    c->reduce, c->ref, st);
    case MPIP_C(KIND_ALL_TO_ALL):
      return mlxd_mpi_all_to_all(b, c->seq, c->in.data, c->out.data, bytes, c->ref, st);
    case MPIP_C(KIND_SEND):
      return mlxd_mpi_send_ref(b, c->seq, c->in.data, bytes, c->peer, c->ref, st);
    case MPIP_C(KIND_RECV):
      return mlxd_mpi_recv_ref(b, c->seq, c->out.data, bytes, c->peer, c->ref, st);
    default: { /* never: the core passes only the kinds of run_kinds */
      mlxd_status s;
      mlxd_status_reset(&s);
      rc = mlxd_mpi_fail(&s, MPIP_EUNAVAIL, "op kind %d is not supported by this plugin",
                         (int)c->kind);
      return mlxd_mpi_done(rc, &s, "run", c->seq, b->rank, st);
    }
  }
}
#endif

/* Split: exchange (color, key) with a bounded all-gather, then MPI_Comm_split
 * (every rank has arrived by then, so it returns promptly). Colors are
 * renumbered densely so any int works. */
static int cmp_int(const void* a, const void* b) {
  int x = *(const int*)a, y = *(const int*)b;
  return (x > y) - (x < y);
}

static int split_impl(mpip_backend* b, uint64_t seq, int color, int key, mpip_backend** out,
                      mlxd_status* st) {
  mpi_group* g = (mpi_group*)b;
  *out = NULL;
  char what[96];
  snprintf(what, sizeof what, "split (color %d, key %d)", color, key);
  int size = g->base.size;
  /* all: every rank's (color, key), then ours (the send buffer: MPI may
   * read it after a timeout, so it is not on the stack). */
  int* all = malloc(sizeof(int) * (2 * (size_t)size + 2));
  int* colors = malloc(sizeof(int) * (size_t)size);
  int rc = mlxd_mpi_op_begin(st);
  if (rc) {
    free(all);
    free(colors);
    return rc;
  }
  rc = mlxd_mpi_turn_wait(g, seq, what, st);
  if (rc) goto out;
  if (g->check) {
    mpip_sig sig = mlxd_mpi_sig(g, MPIP_SIG_SPLIT, -1, 0, seq);
    rc = mlxd_mpi_check_coll(g, &sig, "split", st);
    if (rc) {
      mlxd_mpi_turn_done(g);
      goto out;
    }
  }
  if (!all || !colors) {
    mlxd_mpi_turn_done(g);
    rc = mlxd_mpi_fail(st, MPIP_ENOMEM, "out of memory in %s", what);
    mlxd_mpi_group_fail(g, st);
    goto out;
  }
  /* The turn is held until MPI_Comm_split returns: both are collectives on g->comm. */
  int* mine = all + 2 * (size_t)size;
  mine[0] = color;
  mine[1] = key;
  MPI_Request req = MPI_REQUEST_NULL;
  mlxd_mpi_call_lock();
  int mrc = MPI_Iallgather(mine, 2, MPI_INT, all, 2, MPI_INT, g->comm, &req);
  mlxd_mpi_call_unlock();
  if (mrc != MPI_SUCCESS) {
    mlxd_mpi_turn_done(g);
    rc = mlxd_mpi_fail_call(st, MPIP_EREMOTE, mrc, "MPI_Iallgather", what);
    mlxd_mpi_group_fail(g, st);
    goto out;
  }
  mpi_keep keep = {.ref = NULL, .own = all};
  rc = mlxd_mpi_wait_reqs_keep(g, &req, 1, NULL, false, &keep, what, -1, st);
  if (rc) {
    all = NULL; /* taken by keep: freed once MPI is done with it */
    mlxd_mpi_turn_done(g);
    goto out;
  }
  for (int r = 0; r < size; r++) colors[r] = all[2 * r];
  qsort(colors, (size_t)size, sizeof(int), cmp_int);
  int dense = 0;
  for (int r = 0; r < size; r++) {
    if (r > 0 && colors[r] != colors[r - 1]) dense++;
    if (colors[r] == color) break;
  }
  MPI_Comm nc = MPI_COMM_NULL;
  mlxd_mpi_call_lock();
  mrc = MPI_Comm_split(g->comm, dense, key, &nc);
  mlxd_mpi_call_unlock();
  mlxd_mpi_turn_done(g);
  if (mrc != MPI_SUCCESS) {
    rc = mlxd_mpi_fail_call(st, MPIP_EREMOTE, mrc, "MPI_Comm_split", what);
    mlxd_mpi_group_fail(g, st);
    goto out;
  }
  mpi_group* child = mlxd_mpi_group_new(nc, st);
  if (!child) {
    mlxd_mpi_call_lock();
    MPI_Comm_free(&nc);
    mlxd_mpi_call_unlock();
    rc = MPIP_ENOMEM;
    goto out;
  }
  child->check = g->check; /* agreed by every rank of the parent */
  *out = &child->base;
out:
  free(all);
  free(colors);
  mlxd_mpi_op_end();
  return rc;
}

static int mpi_split(mpip_backend* b, uint64_t seq, int color, int key, mpip_backend** out,
                     mpip_status* st) {
  mlxd_status s;
  mlxd_status_reset(&s);
  int rc = split_impl(b, seq, color, key, out, &s);
  return mlxd_mpi_group_done((mpi_group*)b, rc, &s, "split", seq, st);
}

static void mpi_destroy(mpip_backend* b) {
  if (!b) return;
  mpi_group* g = (mpi_group*)b;
  /* Sends still in flight finish in the background without the group. */
  mlxd_mpi_sends_forget_group(g);
  /* MPI_Comm_free only marks the communicator; pending operations go on. */
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin && g->comm != MPI_COMM_NULL) {
    mlxd_mpi_call_lock();
    MPI_Comm_free(&g->comm);
    mlxd_mpi_call_unlock();
  }
  for (int i = 0; i < MPI_STAGE_POOL; i++) free(g->pool[i].p);
  pthread_mutex_destroy(&g->mu);
  pthread_cond_destroy(&g->cv);
  free(g);
}

static const mpip_ops k_mpi_ops = {
    .struct_size = sizeof(mpip_ops),
    .all_reduce = mpi_all_reduce,
    .all_gather = mpi_all_gather,
    .reduce_scatter = mpi_reduce_scatter,
    .send = mlxd_mpi_send,
    .recv = mlxd_mpi_recv,
    .split = mpi_split,
    .destroy = mpi_destroy,
#if MPIP_HAS_DESCRIBE
    .describe = mlxd_mpi_describe, /* new in ABI v2 */
#endif
#if MPIP_HAS_REF
    /* New in ABI v3: MPI on the caller's arrays, no staging copy. */
    .all_reduce_ref = mpi_all_reduce_ref,
    .all_gather_ref = mpi_all_gather_ref,
    .reduce_scatter_ref = mpi_reduce_scatter_ref,
    .send_ref = mlxd_mpi_send_ref,
    .recv_ref = mlxd_mpi_recv_ref,
#endif
#if MPIP_HAS_RUN
    /* New in ABI v4: every kind through run (all_to_all only there), and abort. */
    .run_kinds =
        MPIP_C(KIND_BIT)(MPIP_C(KIND_ALL_REDUCE)) | MPIP_C(KIND_BIT)(MPIP_C(KIND_ALL_GATHER)) |
        MPIP_C(KIND_BIT)(MPIP_C(KIND_REDUCE_SCATTER)) | MPIP_C(KIND_BIT)(MPIP_C(KIND_SEND)) |
        MPIP_C(KIND_BIT)(MPIP_C(KIND_RECV)) | MPIP_C(KIND_BIT)(MPIP_C(KIND_ALL_TO_ALL)),
    .run = mpi_run,
    .abort = mlxd_mpi_abort,
#endif
};
