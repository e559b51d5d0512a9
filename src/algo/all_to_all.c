/* all_to_all: every rank sends part j of its input to rank j and receives
 * part i of its output from rank i. One message per ordered pair, each part
 * moved once, straight from the sender's input into the receiver's output
 * where the transport allows (shm's single copy, verbs' zero copy for large
 * messages, tcp's receive in place): nothing is staged. Every receive is
 * posted before any send, the sends go out in a staggered order (rank r
 * sends to r+1, r+2, ... so no rank is everybody's first target) and every
 * request is non-blocking, so no size and no order of arrival can deadlock.
 * The same exchange with empty parts is every collective's form when it
 * moves no bytes (mlxd_algo_empty). */
#include <stdlib.h>
#include <string.h>

#include "algo/algo_impl.h"

/* This rank's own part is copied after the sends are posted when it is
 * small (the peers get their parts one copy sooner, and the copy fills the
 * wait), before them when it is large (the copy would keep this rank from
 * draining its receives): the rule and the bound of all_gather.c. */
#define A2A_OWN_LATE_MAX ((size_t)512 << 10)

/* Post the exchange: every receive first (in the order the senders reach
 * this rank: r-1 sends to r first), then the sends, staggered (r sends to
 * r+1, r+2, ...). Part p of src goes to rank p, part p of dst comes from
 * rank p; reqs[p] and reqs[n + p] hold the requests. 0 or the first
 * posting error (st). */
static int post_exchange(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, const char* src,
                         char* dst, size_t part_bytes, mlxd_req** reqs, mlxd_status* st) {
  int n = t->size, r = t->rank, rc = 0;
  uint64_t tag = mlxd_tag(MLXD_TAG_COLL, seq, 0);
  for (int k = 1; k < n && !rc; k++) {
    int p = (r - k + n) % n;
    char* d = part_bytes ? dst + (size_t)p * part_bytes : NULL;
    rc = t->ops->irecv(t, p, tag, sig, d, part_bytes, &reqs[p], st);
  }
  for (int k = 1; k < n && !rc; k++) {
    int p = (r + k) % n;
    const char* s = part_bytes ? src + (size_t)p * part_bytes : NULL;
    rc = t->ops->isend(t, p, tag, sig, s, part_bytes, &reqs[n + p], st);
  }
  return rc;
}

int mlxd_algo_empty(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, mlxd_status* st) {
  int n = t->size;
  mlxd_req** reqs = calloc(2 * (size_t)n, sizeof *reqs);
  if (!reqs) return mlxd_algo_fail(st, MLXD_ENOMEM, "out of memory for %d requests", 2 * n);
  (void)post_exchange(t, seq, sig, NULL, NULL, 0, reqs, st);
  mlxd_algo_drain(t, reqs, 2 * n, st);
  free(reqs);
  return st->code;
}

int mlxd_algo_all_to_all(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, const void* in,
                         void* out, size_t part_bytes, mlxd_status* st) {
  mlxd_status_clear(st);
  int n = t->size, r = t->rank;
  assert(n >= 2);
  assert(part_bytes == 0 || (in && out && in != out));
  (void)mlxd_algo_mul(part_bytes, (size_t)n);
  if (part_bytes == 0) return mlxd_algo_empty(t, seq, sig, st);
  const char* src = in;
  char* dst = out;
  bool late = part_bytes <= A2A_OWN_LATE_MAX;
  if (!late) memcpy(dst + (size_t)r * part_bytes, src + (size_t)r * part_bytes, part_bytes);
  mlxd_req** reqs = calloc(2 * (size_t)n, sizeof *reqs);
  if (!reqs) return mlxd_algo_fail(st, MLXD_ENOMEM, "out of memory for %d requests", 2 * n);
  int rc = post_exchange(t, seq, sig, src, dst, part_bytes, reqs, st);
  if (!rc && late) memcpy(dst + (size_t)r * part_bytes, src + (size_t)r * part_bytes, part_bytes);
  mlxd_algo_drain(t, reqs, 2 * n, st);
  free(reqs);
  return st->code;
}
