/* Point-to-point send / recv between any two ranks. The tag carries the
 * front-end's per-(peer, direction) sequence number, so the k-th send to a
 * rank matches that rank's k-th receive from us whatever the posting order.
 * The peer and buffer were checked by the front-end (algo.h); asserted. */
#include "algo/algo_impl.h"

static void p2p_prologue(mlxd_transport* t, const void* buf, size_t nbytes, int peer,
                         mlxd_status* st) {
  mlxd_status_reset(st); /* not cleared: a 620-byte memset on every message */
  assert(peer >= 0 && peer < t->size && peer != t->rank);
  assert(nbytes == 0 || buf);
  (void)t;
  (void)buf;
  (void)nbytes;
  (void)peer;
}

int mlxd_algo_send(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, const void* buf,
                   size_t nbytes, int dst, mlxd_status* st) {
  p2p_prologue(t, buf, nbytes, dst, st);
  mlxd_req* r = NULL;
  if (t->ops->isend(t, dst, mlxd_tag(MLXD_TAG_P2P, seq, 0), sig, buf, nbytes, &r, st))
    return st->code;
  return t->ops->waitall(t, &r, 1, st);
}

int mlxd_algo_recv(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, void* buf, size_t nbytes,
                   int src, mlxd_status* st) {
  p2p_prologue(t, buf, nbytes, src, st);
  mlxd_req* r = NULL;
  if (t->ops->irecv(t, src, mlxd_tag(MLXD_TAG_P2P, seq, 0), sig, buf, nbytes, &r, st))
    return st->code;
  return t->ops->waitall(t, &r, 1, st);
}
