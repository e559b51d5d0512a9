/* Point-to-point send / recv between any two ranks. The tag carries the
 * front-end's per-(peer, direction) sequence number, so the k-th send to a
 * rank matches that rank's k-th receive from us whatever the posting order. */
#include "algo/algo_impl.h"

static int p2p_check(mlxd_transport* t, const char* what, const void* buf, size_t nbytes,
                     int peer, mlxd_status* st) {
  mlxd_status_clear(st);
  if (peer < 0 || peer >= t->size || peer == t->rank)
    return mlxd_fail(st, MLXD_EINVAL,
                     "[ring] %s: invalid peer rank %d (expected a rank in [0, %d) other than "
                     "this rank, %d)",
                     what, peer, t->size, t->rank);
  if (nbytes > 0 && !buf)
    return mlxd_fail(st, MLXD_EINVAL, "[ring] %s: NULL buffer for %zu bytes", what, nbytes);
  return 0;
}

int mlxd_algo_send(mlxd_transport* t, uint64_t seq, const void* buf, size_t nbytes, int dst,
                   mlxd_status* st) {
  if (p2p_check(t, "send", buf, nbytes, dst, st)) return st->code;
  mlxd_req* r = NULL;
  if (t->ops->isend(t, dst, mlxd_tag(MLXD_TAG_P2P, seq, 0), buf, nbytes, &r, st))
    return st->code;
  return t->ops->waitall(t, &r, 1, st);
}

int mlxd_algo_recv(mlxd_transport* t, uint64_t seq, void* buf, size_t nbytes, int src,
                   mlxd_status* st) {
  if (p2p_check(t, "recv", buf, nbytes, src, st)) return st->code;
  mlxd_req* r = NULL;
  if (t->ops->irecv(t, src, mlxd_tag(MLXD_TAG_P2P, seq, 0), buf, nbytes, &r, st))
    return st->code;
  return t->ops->waitall(t, &r, 1, st);
}
