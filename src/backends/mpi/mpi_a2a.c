/* The mpi plugin's all_to_all (plugin ABI v4, through run), the memory
 * checks of run's descriptor, and abort.
 *
 * all_to_all is MPI_Ialltoall of bytes on the caller's arrays (the core
 * promises in and out are distinct; ref holds them if a request outlives
 * the op), issued in its turn like every collective and waited for with
 * the same bounded poll (mlxd_mpi_wait_reqs_keep). MPI counts are int: a
 * part larger than the chunk bound (1 GiB, or MLXDIST_MPI_CHUNK_BYTES) goes
 * in pieces, piece k being bytes [k*c, k*c + c) of every part, sent and
 * received as one element of a type of c bytes whose extent is the part
 * size, so rank j's piece lands at j * part + k*c. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "backends/mpi/mpi_internal.h"

#if MPIP_HAS_RUN

/* Whether [a, a+na) and [b, b+nb) share a byte. */
static bool overlap(const void* a, size_t na, const void* b, size_t nb) {
  uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
  return na && nb && x < y + nb && y < x + na;
}

/* Issue the pieces of the all_to_all (MPI lock held): 0, or the MPI failure
 * with *issued requests posted. */
static int issue(mpi_group* g, const char* in, char* out, size_t part, size_t ch, MPI_Request* reqs,
                 int* issued, const char* what, mlxd_status* st) {
  if (part <= ch) {
    int mrc = MPI_Ialltoall(in, (int)part, MPI_BYTE, out, (int)part, MPI_BYTE, g->comm, &reqs[0]);
    if (mrc != MPI_SUCCESS) return mlxd_mpi_fail_call(st, MPIP_EREMOTE, mrc, "MPI_Ialltoall", what);
    *issued = 1;
    return 0;
  }
  for (size_t off = 0; off < part; off += ch) {
    size_t c = part - off < ch ? part - off : ch;
    MPI_Datatype piece = MPI_DATATYPE_NULL, strided = MPI_DATATYPE_NULL;
    int mrc = MPI_Type_contiguous((int)c, MPI_BYTE, &piece);
    if (mrc == MPI_SUCCESS) mrc = MPI_Type_create_resized(piece, 0, (MPI_Aint)part, &strided);
    if (mrc == MPI_SUCCESS) mrc = MPI_Type_commit(&strided);
    if (mrc == MPI_SUCCESS)
      mrc = MPI_Ialltoall(in + off, 1, strided, out + off, 1, strided, g->comm, &reqs[*issued]);
    /* Freeing a type in use by a pending request is allowed: MPI keeps it. */
    if (piece != MPI_DATATYPE_NULL) MPI_Type_free(&piece);
    if (strided != MPI_DATATYPE_NULL) MPI_Type_free(&strided);
    if (mrc != MPI_SUCCESS) return mlxd_mpi_fail_call(st, MPIP_EREMOTE, mrc, "MPI_Ialltoall", what);
    (*issued)++;
  }
  return 0;
}

static int all_to_all_impl(mpi_group* g, uint64_t seq, const void* in, void* out, size_t part,
                           const mpip_bufref* ref, mlxd_status* st) {
  char what[128];
  snprintf(what, sizeof what, "all_to_all of %zu bytes a part", part);
  size_t total = part * (size_t)g->base.size;
  size_t ch = mlxd_mpi_chunk_bytes();
  if (ch > (size_t)INT_MAX) ch = (size_t)INT_MAX;
  int nreq = part == 0 ? 0 : (int)((part + ch - 1) / ch);
  MPI_Request one = MPI_REQUEST_NULL;
  MPI_Request* reqs = nreq <= 1 ? &one : malloc(sizeof(MPI_Request) * (size_t)nreq);
  int rc = mlxd_mpi_op_begin(st);
  if (rc) goto out_free;
  rc = mlxd_mpi_turn_wait(g, seq, what, st);
  if (rc) goto out;
  if (g->check) {
    mpip_sig sig = mlxd_mpi_sig(g, MPIP_SIG_ALL_TO_ALL, -1, part, seq);
    rc = mlxd_mpi_check_coll(g, &sig, "all_to_all", st);
    if (rc) {
      mlxd_mpi_turn_done(g);
      goto out;
    }
  }
  if (part == 0) {
    mlxd_mpi_turn_done(g);
    goto out;
  }
  if (!reqs || !ref || overlap(in, total, out, total)) {
    /* Out of memory, or a call the core never makes (run always gives the
     * arrays, which never overlap): the other ranks issued it, so this
     * group is out of step. */
    mlxd_mpi_turn_done(g);
    rc = !reqs ? mlxd_mpi_fail(st, MPIP_ENOMEM, "out of memory in %s", what)
               : mlxd_mpi_fail(st, MPIP_EINVAL,
                               "%s: %s (the core passes distinct arrays with their bufref)", what,
                               ref ? "the input and the output overlap" : "no bufref was given");
    mlxd_mpi_group_fail(g, st);
    goto out;
  }
  int issued = 0;
  mlxd_mpi_call_lock();
  rc = issue(g, in, out, part, ch, reqs, &issued, what, st);
  mlxd_mpi_call_unlock();
  mlxd_mpi_turn_done(g);
  mpi_keep keep = {.ref = ref};
  if (rc) {
    mlxd_mpi_abandon_keep(reqs, issued, &keep);
    mlxd_mpi_group_fail(g, st);
  } else {
    rc = mlxd_mpi_wait_reqs_keep(g, reqs, issued, NULL, false, &keep, what, -1, st);
  }
out:
  mlxd_mpi_op_end();
out_free:
  if (reqs && reqs != &one) free(reqs);
  return rc;
}

int mlxd_mpi_all_to_all(mpip_backend* b, uint64_t seq, const void* in, void* out, size_t part_bytes,
                        const mpip_bufref* ref, mpip_status* st) {
  mlxd_status s;
  mlxd_status_reset(&s);
  int rc = all_to_all_impl((mpi_group*)b, seq, in, out, part_bytes, ref, &s);
  return mlxd_mpi_group_done((mpi_group*)b, rc, &s, "all_to_all", seq, st);
}

/* The memory kinds MPI reaches here: host memory, and CUDA managed memory
 * (addressable by the host; a CUDA-aware MPI is not assumed). */
static bool host_reachable(const MPIP_(buf) * buf) {
  return buf->bytes == 0 || buf->mem == MPIP_C(MEM_HOST) || buf->mem == MPIP_C(MEM_MANAGED);
}

int mlxd_mpi_run_check(mpip_backend* b, const mpip_call* call, const char* name, mpip_status* st) {
  const MPIP_(buf)* bad = !host_reachable(&call->in)    ? &call->in
                          : !host_reachable(&call->out) ? &call->out
                                                        : NULL;
  if (!bad) return 0;
  mpi_group* g = (mpi_group*)b;
  mlxd_status s;
  mlxd_status_reset(&s);
  char kind[48];
  if (bad->mem == MPIP_C(MEM_DEVICE))
    snprintf(kind, sizeof kind, "device memory of GPU %d", (int)bad->device);
  else
    snprintf(kind, sizeof kind, "memory of an unknown kind (%d)", (int)bad->mem);
  int rc = mlxd_mpi_fail(&s, MPIP_EINVAL,
                         "the %s (%zu bytes) is in %s, which this plugin cannot read or write "
                         "(host or managed memory only)",
                         bad == &call->in ? "input" : "output", bad->bytes, kind);
  /* The other ranks of a collective may have issued it: out of step. */
  if (call->kind != MPIP_C(KIND_SEND) && call->kind != MPIP_C(KIND_RECV))
    mlxd_mpi_group_fail(g, &s);
  return mlxd_mpi_done(rc, &s, name, call->seq, g->base.rank, st);
}

void mlxd_mpi_abort(mpip_backend* b, const char* reason) {
  mpi_group* g = (mpi_group*)b;
  mlxd_status s;
  mlxd_status_reset(&s);
  mlxd_mpi_fail(&s, MPIP_EABORTED, "%s", reason && reason[0] ? reason : "aborted");
  mlxd_mpi_group_fail(g, &s); /* the first failure stays the group's */
  __atomic_store_n(&g->abort_flag, 1, __ATOMIC_RELEASE);
}

#endif
