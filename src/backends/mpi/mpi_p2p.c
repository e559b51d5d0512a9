/* The mpi plugin's point-to-point ops. A send posts its data and hands it
 * to the progress thread (mpi_progress.c); a recv waits, bounded, and
 * checks the size that arrived. Through ABI v3's send_ref/recv_ref both use
 * the caller's arrays directly (a send holds its array until the data has
 * left); through the plain ops, a copy. */
#include <assert.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/mpi/mpi_internal.h"
#include "util/clock.h"

/* Post the data pieces of p on its communicator (p->reqs has room for
 * p->nreq). On failure p->nreq is the number posted. */
int mlxd_mpi_send_post_data(pending_send* p, mlxd_status* st) {
  size_t ch = mlxd_mpi_chunk_bytes();
  if (ch > (size_t)INT_MAX) ch = (size_t)INT_MAX;
  int rc = 0, issued = 0;
  mlxd_mpi_call_lock();
  for (size_t off = 0; issued < p->nreq; off += ch) {
    size_t c = p->nbytes - off < ch ? p->nbytes - off : ch;
    int mrc = MPI_Isend((char*)p->buf + off, (int)c, MPI_BYTE, p->dst, p->data_tag, p->comm,
                        &p->reqs[issued]);
    if (mrc != MPI_SUCCESS) {
      char what[96];
      snprintf(what, sizeof what, "send of %zu bytes to rank %d", p->nbytes, p->dst);
      rc = mlxd_mpi_fail_call(st, MPIP_EREMOTE, mrc, "MPI_Isend", what);
      mlxd_status_set_peer(st, p->dst, NULL);
      break;
    }
    issued++;
  }
  mlxd_mpi_call_unlock();
  p->nreq = issued;
  p->left = issued;
  return rc;
}

/* Without a progress thread: complete p here, bounded (the check's answer
 * first, then the data). */
static int send_complete_inline(mpi_group* g, pending_send* p, mlxd_status* st) {
  char what[128];
  snprintf(what, sizeof what, "send of %zu bytes to rank %d", p->nbytes, p->dst);
  if (p->awaiting_answer) {
    char check[192];
    snprintf(check, sizeof check, "the call check (MLXDIST_CHECK=1) of a %s", what);
    int rc = mlxd_mpi_wait_reqs(g, p->check_reqs, 2, NULL, false, check, p->dst, st);
    if (rc) return rc; /* p is kept: MPI may still use it */
    p->awaiting_answer = false;
    rc = mlxd_mpi_check_send_answer(p, g->base.rank, st);
    if (rc) {
      mlxd_mpi_group_fail(g, st);
      mlxd_mpi_pending_free(p); /* nothing of it reached MPI but the completed check */
      return rc;
    }
    rc = mlxd_mpi_send_post_data(p, st);
    if (rc) {
      mlxd_mpi_group_fail(g, st);
      if (p->nreq)
        mlxd_mpi_abandon(p->reqs, p->nreq); /* p is kept: they may still read it */
      else
        mlxd_mpi_pending_free(p);
      return rc;
    }
  }
  int rc = mlxd_mpi_wait_reqs(g, p->reqs, p->nreq, NULL, false, what, p->dst, st);
  if (rc == 0) mlxd_mpi_pending_free(p);
  return rc;
}

/* send. ref == NULL (the plain op): MPI sends a copy, freed once the data
 * has left. ref set (ABI v3): MPI sends from the caller's array, held until
 * the data has left (released by the progress thread off its lock). Either
 * way the op returns once the data is posted (see mpi_internal.h). */
static int send_impl(mpip_backend* b, uint64_t seq, const void* buf, size_t nbytes, int dst,
                     const mpip_bufref* ref, mlxd_status* st) {
  mpi_group* g = (mpi_group*)b;
  /* The front-end guarantees a valid peer (plugin ABI contract). */
  assert(dst >= 0 && dst < g->base.size && dst != g->base.rank);
  int rc = mlxd_mpi_group_check(g, st);
  if (rc) return rc;
  rc = mlxd_mpi_op_begin(st);
  if (rc) return rc;
  size_t ch = mlxd_mpi_chunk_bytes();
  if (ch > (size_t)INT_MAX) ch = (size_t)INT_MAX;
  int nreq = nbytes == 0 ? 1 : (int)((nbytes + ch - 1) / ch);
  pending_send* p = calloc(1, sizeof *p);
  if (p) {
    p->reqs = malloc(sizeof(MPI_Request) * (size_t)nreq);
    if (!ref) p->buf = malloc(nbytes ? nbytes : 1);
  }
  if (!p || !p->reqs || (!ref && !p->buf)) {
    if (p) mlxd_mpi_pending_free(p);
    rc = mlxd_mpi_fail(st, MPIP_ENOMEM, "out of memory copying %zu bytes for a send to rank %d",
                       nbytes, dst);
    goto out;
  }
#if MPIP_HAS_REF
  if (ref) {
    /* Posted from the caller's memory: held from now until MPI is done. */
    p->buf = (void*)(uintptr_t)buf;
    ref->hold(ref, &p->hold);
    p->held = true;
    p->release = ref->release;
  }
#endif
  if (!ref && nbytes) memcpy(p->buf, buf, nbytes);
  p->g = g;
  p->nbytes = nbytes;
  p->dst = dst;
  p->nreq = nreq;
  p->comm = g->comm;
  p->seq = seq;
  p->data_tag = mlxd_mpi_p2p_tags(g, seq).data;
  p->check_reqs[0] = p->check_reqs[1] = MPI_REQUEST_NULL;
  /* With the check, only the signature goes now; the data follows the answer. */
  rc = g->check ? mlxd_mpi_check_send_post(p, g, seq, st) : mlxd_mpi_send_post_data(p, st);
  if (rc) {
    if (g->check) {
      if (p->check_reqs[0] != MPI_REQUEST_NULL || p->check_reqs[1] != MPI_REQUEST_NULL) {
        /* p itself is kept: MPI may still write the answer into p->check_buf.
         * The data was never posted: its copy or hold goes now. */
        mlxd_mpi_abandon(p->check_reqs, 2);
        free(p->reqs);
        p->reqs = NULL;
        if (!p->held) free(p->buf);
#if MPIP_HAS_REF
        else
          p->release(&p->hold);
#endif
        p->buf = NULL;
        p->held = false;
      } else {
        mlxd_mpi_pending_free(p);
      }
    } else if (p->nreq) {
      /* The issued pieces may still read p->buf: a copy is kept (leaked), a
       * held array stays held until they complete. */
      mpi_keep keep = {.held = p->held ? &p->hold : NULL, .release = p->release};
      mlxd_mpi_abandon_keep(p->reqs, p->nreq, &keep);
      free(p->reqs);
      free(p);
    } else {
      mlxd_mpi_pending_free(p);
    }
    mlxd_mpi_group_fail(g, st);
    goto out;
  }
  p->deadline = mlxd_now() + mlxd_mpi_timeout_s();
  rc = mlxd_mpi_sends_add(p, st);
  if (rc) rc = send_complete_inline(g, p, st); /* no progress thread */
out:
  mlxd_mpi_op_end();
  return rc;
}

/* The ops of the table: each renders its failure once (mlxd_mpi_group_done),
 * as mpi_ops.c's do. */
int mlxd_mpi_send(mpip_backend* b, uint64_t seq, const void* buf, size_t nbytes, int dst,
                  mpip_status* st) {
  mlxd_status s;
  mlxd_status_reset(&s);
  int rc = send_impl(b, seq, buf, nbytes, dst, NULL, &s);
  return mlxd_mpi_group_done((mpi_group*)b, rc, &s, "send", seq, st);
}

#if MPIP_HAS_REF
int mlxd_mpi_send_ref(mpip_backend* b, uint64_t seq, const void* buf, size_t nbytes, int dst,
                      const mpip_bufref* ref, mpip_status* st) {
  mlxd_status s;
  mlxd_status_reset(&s);
  int rc = send_impl(b, seq, buf, nbytes, dst, ref, &s);
  return mlxd_mpi_group_done((mpi_group*)b, rc, &s, "send", seq, st);
}
#endif

/* recv. ref == NULL (the plain op): into a staging copy. ref set (ABI v3):
 * into the caller's result array directly. A piece that cannot be cancelled
 * after a failure keeps its buffer alive until MPI completes it: the staging
 * copy, or the caller's array under a hold (mlxd_mpi_abandon_keep). */
static int recv_impl(mpip_backend* b, uint64_t seq, void* buf, size_t nbytes, int src,
                     const mpip_bufref* ref, mlxd_status* st) {
  mpi_group* g = (mpi_group*)b;
  assert(src >= 0 && src < g->base.size && src != g->base.rank);
  int rc = mlxd_mpi_group_check(g, st);
  if (rc) return rc;
  rc = mlxd_mpi_op_begin(st);
  if (rc) return rc;
  char what[96];
  snprintf(what, sizeof what, "recv of %zu bytes from rank %d", nbytes, src);
  size_t ch = mlxd_mpi_chunk_bytes();
  if (ch > (size_t)INT_MAX) ch = (size_t)INT_MAX;
  int nreq = nbytes == 0 ? 1 : (int)((nbytes + ch - 1) / ch);
  MPI_Request one = MPI_REQUEST_NULL;
  MPI_Status one_st;
  MPI_Request* reqs = nreq == 1 ? &one : malloc(sizeof(MPI_Request) * (size_t)nreq);
  MPI_Status* sts = nreq == 1 ? &one_st : malloc(sizeof(MPI_Status) * (size_t)nreq);
  stage sg = {NULL, 0};
  if (!reqs || !sts || (!ref && mlxd_mpi_stage_get(g, nbytes, &sg) != 0)) {
    rc = mlxd_mpi_fail(st, MPIP_ENOMEM, "out of memory in %s", what);
    goto done;
  }
  if (g->check && (rc = mlxd_mpi_check_recv(g, seq, nbytes, src, st)) != 0) goto done;
  char* dst = ref ? (char*)buf : (char*)sg.p;
  mpi_keep keep = {.ref = ref, .own = ref ? NULL : sg.p};
  int tag = mlxd_mpi_p2p_tags(g, seq).data;
  int issued = 0;
  mlxd_mpi_call_lock();
  for (size_t off = 0; issued < nreq; off += ch) {
    size_t c = nbytes - off < ch ? nbytes - off : ch;
    int mrc = MPI_Irecv(dst + off, (int)c, MPI_BYTE, src, tag, g->comm, &reqs[issued]);
    if (mrc != MPI_SUCCESS) {
      rc = mlxd_mpi_fail_call(st, MPIP_EREMOTE, mrc, "MPI_Irecv", what);
      mlxd_status_set_peer(st, src, NULL);
      break;
    }
    issued++;
  }
  mlxd_mpi_call_unlock();
  if (rc) {
    if (issued) {
      /* Cancel the pieces already posted; the group is out of step now.
       * What cannot be cancelled keeps its buffer (keep is taken). */
      mlxd_status ignore = {0};
      mlxd_mpi_call_lock();
      for (int i = 0; i < issued; i++) MPI_Cancel(&reqs[i]);
      mlxd_mpi_call_unlock();
      if (mlxd_mpi_wait_reqs_keep(g, reqs, issued, NULL, true, &keep, what, src, &ignore) != 0)
        sg.p = NULL;
    }
    mlxd_mpi_group_fail(g, st);
    goto done;
  }
  rc = mlxd_mpi_wait_reqs_keep(g, reqs, issued, sts, true, &keep, what, src, st);
  if (rc) {
    sg.p = NULL; /* taken by keep: freed once no request uses it */
    goto done;
  }
  size_t got = 0;
  for (int i = 0; i < issued; i++) {
    int n = 0;
    MPI_Get_count(&sts[i], MPI_BYTE, &n);
    got += n > 0 ? (size_t)n : 0;
  }
  if (got != nbytes) {
    rc = mlxd_mpi_fail(st, MPIP_EINVAL,
                       "the message from rank %d had %zu bytes, but this recv expects %zu "
                       "(shape and dtype of send and recv must match)",
                       src, got, nbytes);
    mlxd_status_set_peer(st, src, NULL);
  } else if (nbytes && !ref)
    memcpy(buf, sg.p, nbytes);
done:
  mlxd_mpi_stage_put(g, &sg);
  if (reqs && reqs != &one) free(reqs);
  if (sts && sts != &one_st) free(sts);
  mlxd_mpi_op_end();
  return rc;
}

int mlxd_mpi_recv(mpip_backend* b, uint64_t seq, void* buf, size_t nbytes, int src,
                  mpip_status* st) {
  mlxd_status s;
  mlxd_status_reset(&s);
  int rc = recv_impl(b, seq, buf, nbytes, src, NULL, &s);
  return mlxd_mpi_group_done((mpi_group*)b, rc, &s, "recv", seq, st);
}

#if MPIP_HAS_REF
int mlxd_mpi_recv_ref(mpip_backend* b, uint64_t seq, void* buf, size_t nbytes, int src,
                      const mpip_bufref* ref, mpip_status* st) {
  mlxd_status s;
  mlxd_status_reset(&s);
  int rc = recv_impl(b, seq, buf, nbytes, src, ref, &s);
  return mlxd_mpi_group_done((mpi_group*)b, rc, &s, "recv", seq, st);
}
#endif
