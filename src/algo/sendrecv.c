/* Point-to-point send / recv between any two ranks. The tag carries the
 * front-end's per-(peer, direction) sequence number, so the k-th send to a
 * rank matches that rank's k-th receive from us whatever the posting order.
 * A message has no steps, so its tag's step field holds the number's bits
 * above the tag's 17 (p2p_tag): sends a receiver has not taken yet may be
 * spread over several connections (tcp's K), and two of them 2^17 apart
 * must never share a tag.
 * The peer and buffer were checked by the front-end (algo.h); asserted. */
#include "algo/algo_impl.h"

static uint64_t p2p_tag(uint64_t seq) {
  return mlxd_tag(MLXD_TAG_P2P, seq, (unsigned)(seq >> MLXD_TAG_SEQ_BITS) & 0xFFFFu);
}

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
  if (t->ops->isend(t, dst, p2p_tag(seq), sig, buf, nbytes, &r, st)) return st->code;
  return t->ops->waitall(t, &r, 1, st);
}

int mlxd_algo_recv(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, void* buf, size_t nbytes,
                   int src, mlxd_status* st) {
  p2p_prologue(t, buf, nbytes, src, st);
  mlxd_req* r = NULL;
  if (t->ops->irecv(t, src, p2p_tag(seq), sig, buf, nbytes, &r, st)) return st->code;
  return t->ops->waitall(t, &r, 1, st);
}
