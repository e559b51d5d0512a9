/* Log-depth forms of the small collectives, for large groups: recursive
 * doubling all_reduce and all_gather, and recursive halving
 * reduce_scatter. Each rank talks to about log2(size) peers per op instead of
 * size - 1 (the one-shot / direct forms), and sends fewer bytes: the
 * dispatchers (all_reduce.c, reduce_scatter.c, all_gather.c) choose them
 * for small buffers in large groups (mlxd_algo_logn, common.c; the
 * measurements are in docs/performance.md).
 *
 * Groups that are not a power of two are folded: with p2 the largest power
 * of two <= size and rem = size - p2, ranks 2v and 2v + 1 (v < rem) pair up:
 * the even one hands its data to the odd one, which takes part as virtual
 * rank v; rank r >= 2 rem is virtual rank r - rem. Virtual ranks keep the
 * real ranks' order. The three forms pair the same ranks (the fold's
 * pairs, then virtual ranks v and v ^ d), so a group that runs all three
 * connects each rank to at most log2(size) + 1 peers. Bruck's all_gather
 * (send to r - d, receive from r + d: twice as many peers) is kept for
 * shared memory below MLXD_LOGN_SHM_WIDE_RANKS ranks, where a peer costs no
 * connection and its steps, not pairwise exchanges, wait less on a crowded
 * host (mlxd_algo_all_gather_logn; docs/performance.md).
 *
 * The reduction order (bit-identical results on every rank, for every
 * dtype and op): a pair of the fold combines (rank 2v) OP (rank 2v + 1);
 * then for d = p2/2, p2/4, ..., 1, the partials of virtual ranks v and
 * v ^ d (each covering the same number of virtual ranks) combine as
 * (lower virtual rank's partial) OP (higher one's), with mlxd_reduce3 on
 * both sides. Every element of the all_reduce and every block of the
 * reduce_scatter is therefore the same expression tree of the ranks'
 * inputs, whichever rank computes it (for 8 ranks:
 * ((r0 r4)(r2 r6))((r1 r5)(r3 r7))). It is a different tree from the
 * one-shot's (((r0 r1) r2) r3 ...), so floating-point sums may differ in
 * the last bits between the forms, never between ranks. */
#include <stdlib.h>
#include <string.h>

#include "algo/algo_impl.h"
#include "core/buffer.h"

/* Steps of the tags (16 bits): the fold's two hand-overs, then one per
 * doubling or halving step (at most 31 of them). */
enum { STEP_FOLD_IN = 1, STEP_FOLD_OUT = 2, STEP_FIRST = 3 };

/* Scratch of up to this many bytes lives on the stack. */
#define LOGN_STACK_BYTES 1024

static int pow2_floor(int n) {
  int p = 1;
  while (p <= n / 2) p *= 2;
  return p;
}
/* The real rank that takes part as virtual rank v. */
static int real_of(int v, int rem) { return v < rem ? 2 * v + 1 : v + rem; }
/* The virtual rank of real rank r; -1 for the even rank of a fold pair. */
static int virt_of(int r, int rem) {
  if (r >= 2 * rem) return r - rem;
  return (r & 1) ? r / 2 : -1;
}
/* The first real rank that virtual rank v stands for (v == p2: size). */
static int first_real(int v, int rem) { return v < rem ? 2 * v : v + rem; }

static bool overlap(const void* a, size_t an, const void* b, size_t bn) {
  const char *x = a, *y = b;
  return an && bn && x < y + bn && y < x + an;
}

/* Send sn bytes of sbuf to peer and receive rn bytes from it into rbuf (or
 * only one of the two when its count is 0), both posted at once; waits for
 * both. */
static int exchange(mlxd_transport* t, int peer, uint64_t tag, const mlxd_sig* sig,
                    const void* sbuf, size_t sn, void* rbuf, size_t rn, mlxd_status* st) {
  mlxd_req* reqs[2] = {NULL, NULL};
  int rc = 0;
  if (rn) rc = t->ops->irecv(t, peer, tag, sig, rbuf, rn, &reqs[0], st);
  if (!rc && sn) rc = t->ops->isend(t, peer, tag, sig, sbuf, sn, &reqs[1], st);
  return mlxd_algo_drain(t, reqs, 2, st);
}

/* The even rank of a fold pair: hand sn bytes of sbuf to rank r + 1, get
 * the rn-byte result back into rbuf (posted together unless they overlap). */
static int fold_even(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, const void* sbuf,
                     size_t sn, void* rbuf, size_t rn, mlxd_status* st) {
  int peer = t->rank + 1;
  uint64_t tin = mlxd_tag(MLXD_TAG_COLL, seq, STEP_FOLD_IN);
  uint64_t tout = mlxd_tag(MLXD_TAG_COLL, seq, STEP_FOLD_OUT);
  if (overlap(sbuf, sn, rbuf, rn)) {
    if (exchange(t, peer, tin, sig, sbuf, sn, NULL, 0, st)) return st->code;
    return exchange(t, peer, tout, sig, NULL, 0, rbuf, rn, st);
  }
  mlxd_req* reqs[2] = {NULL, NULL};
  int rc = t->ops->irecv(t, peer, tout, sig, rbuf, rn, &reqs[0], st);
  if (!rc) rc = t->ops->isend(t, peer, tin, sig, sbuf, sn, &reqs[1], st);
  return mlxd_algo_drain(t, reqs, 2, st);
}

int mlxd_algo_all_reduce_rd(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, const void* in,
                            void* out, size_t count, mlx_dtype dtype, mlxd_reduce_op op,
                            mlxd_status* st) {
  mlxd_status_reset(st);
  assert(t->size >= 2 && (count == 0 || (in && out)));
  size_t esz = mlxd_algo_esize(dtype, op), nbytes = mlxd_algo_mul(count, esz);
  int n = t->size, r = t->rank, p2 = pow2_floor(n), rem = n - p2, v = virt_of(r, rem);
  if (count == 0) return mlxd_algo_empty(t, seq, sig, st);
  if (v < 0) return fold_even(t, seq, sig, in, nbytes, out, nbytes, st);
  _Alignas(64) char stack_tmp[LOGN_STACK_BYTES];
  char* tmp = nbytes <= sizeof stack_tmp ? stack_tmp : mlxd_buffer_alloc(nbytes);
  if (!tmp) return mlxd_algo_fail(st, MLXD_ENOMEM, "out of memory for %zu bytes", nbytes);
  if (r < 2 * rem) {
    /* the odd rank of a fold pair: out = (rank r - 1) OP (this rank) */
    uint64_t tin = mlxd_tag(MLXD_TAG_COLL, seq, STEP_FOLD_IN);
    if (exchange(t, r - 1, tin, sig, NULL, 0, tmp, nbytes, st) == 0)
      mlxd_reduce3(op, dtype, out, tmp, in, count);
  } else if (out != in) {
    memcpy(out, in, nbytes);
  }
  unsigned step = STEP_FIRST;
  for (int d = p2 / 2; d >= 1 && !st->code; d /= 2, step++) {
    int pv = v ^ d;
    uint64_t tag = mlxd_tag(MLXD_TAG_COLL, seq, step);
    if (exchange(t, real_of(pv, rem), tag, sig, out, nbytes, tmp, nbytes, st)) break;
    if (pv < v)
      mlxd_reduce3(op, dtype, out, tmp, out, count);
    else
      mlxd_reduce3(op, dtype, out, out, tmp, count);
  }
  if (!st->code && r < 2 * rem)
    exchange(t, r - 1, mlxd_tag(MLXD_TAG_COLL, seq, STEP_FOLD_OUT), sig, out, nbytes, NULL, 0, st);
  if (tmp != stack_tmp) mlxd_buffer_free(tmp, nbytes);
  return st->code;
}

int mlxd_algo_reduce_scatter_rh(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig,
                                const void* in, void* out, size_t count, mlx_dtype dtype,
                                mlxd_reduce_op op, mlxd_status* st) {
  mlxd_status_reset(st);
  assert(t->size >= 2 && (count == 0 || (in && out)));
  size_t esz = mlxd_algo_esize(dtype, op), blk = mlxd_algo_mul(count, esz);
  int n = t->size, r = t->rank, p2 = pow2_floor(n), rem = n - p2, v = virt_of(r, rem);
  size_t all = mlxd_algo_mul(blk, (size_t)n);
  if (count == 0) return mlxd_algo_empty(t, seq, sig, st);
  if (v < 0) return fold_even(t, seq, sig, in, all, out, blk, st);
  /* work: this rank's partial sums (layout of in); recv: what the partner
   * sends for the half it keeps (the fold can make the halves uneven: at
   * most all) */
  size_t wbytes = 2 * all;
  char* work = mlxd_buffer_alloc(wbytes);
  if (!work) return mlxd_algo_fail(st, MLXD_ENOMEM, "out of memory for %zu bytes", wbytes);
  char* recv = work + all;
  const char* cur = in;
  if (r < 2 * rem) {
    uint64_t tin = mlxd_tag(MLXD_TAG_COLL, seq, STEP_FOLD_IN);
    if (exchange(t, r - 1, tin, sig, NULL, 0, work, all, st) == 0)
      mlxd_reduce3(op, dtype, work, work, in, count * (size_t)n);
    cur = work;
  }
  /* the virtual ranks [lo, hi) whose blocks this rank still holds */
  int lo = 0, hi = p2;
  unsigned step = STEP_FIRST;
  for (int d = p2 / 2; d >= 1 && !st->code; d /= 2, step++) {
    int mid = lo + d, pv = v ^ d;
    int klo = v < mid ? lo : mid, khi = v < mid ? mid : hi;
    int slo = v < mid ? mid : lo, shi = v < mid ? hi : mid;
    size_t koff = (size_t)first_real(klo, rem) * blk, kend = (size_t)first_real(khi, rem) * blk;
    size_t soff = (size_t)first_real(slo, rem) * blk, send_end = (size_t)first_real(shi, rem) * blk;
    uint64_t tag = mlxd_tag(MLXD_TAG_COLL, seq, step);
    if (exchange(t, real_of(pv, rem), tag, sig, cur + soff, send_end - soff, recv, kend - koff, st))
      break;
    size_t cnt = (kend - koff) / esz;
    if (pv < v)
      mlxd_reduce3(op, dtype, work + koff, recv, cur + koff, cnt);
    else
      mlxd_reduce3(op, dtype, work + koff, cur + koff, recv, cnt);
    cur = work;
    lo = klo;
    hi = khi;
  }
  if (!st->code) {
    memcpy(out, work + (size_t)r * blk, blk);
    if (r < 2 * rem)
      exchange(t, r - 1, mlxd_tag(MLXD_TAG_COLL, seq, STEP_FOLD_OUT), sig,
               work + (size_t)(r - 1) * blk, blk, NULL, 0, st);
  }
  mlxd_buffer_free(work, wbytes);
  return st->code;
}

int mlxd_algo_all_gather_rd(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, const void* in,
                            void* out, size_t nbytes, mlxd_status* st) {
  mlxd_status_reset(st);
  assert(t->size >= 2 && (nbytes == 0 || (in && out)));
  int n = t->size, r = t->rank, p2 = pow2_floor(n), rem = n - p2, v = virt_of(r, rem);
  size_t all = mlxd_algo_mul(nbytes, (size_t)n);
  if (nbytes == 0) return mlxd_algo_empty(t, seq, sig, st);
  if (v < 0) return fold_even(t, seq, sig, in, nbytes, out, all, st);
  /* out is the work area: virtual rank w's blocks are those of the real
   * ranks [first_real(w), first_real(w + 1)), at their place in out */
  char* o = out;
  char* own = o + (size_t)r * nbytes;
  if (own != (const char*)in) memmove(own, in, nbytes);
  if (r < 2 * rem) { /* the odd rank of a fold pair also holds rank r - 1's block */
    uint64_t tin = mlxd_tag(MLXD_TAG_COLL, seq, STEP_FOLD_IN);
    if (exchange(t, r - 1, tin, sig, NULL, 0, own - nbytes, nbytes, st)) return st->code;
  }
  /* before the step with distance d this rank holds the aligned run of d
   * virtual ranks around v; the partner v ^ d holds the run next to it */
  unsigned step = STEP_FIRST;
  for (int d = 1; d < p2; d *= 2, step++) {
    int lo = v & ~(d - 1), plo = (v ^ d) & ~(d - 1);
    size_t soff = (size_t)first_real(lo, rem) * nbytes;
    size_t send = (size_t)first_real(lo + d, rem) * nbytes - soff;
    size_t roff = (size_t)first_real(plo, rem) * nbytes;
    size_t rn = (size_t)first_real(plo + d, rem) * nbytes - roff;
    uint64_t tag = mlxd_tag(MLXD_TAG_COLL, seq, step);
    if (exchange(t, real_of(v ^ d, rem), tag, sig, o + soff, send, o + roff, rn, st))
      return st->code;
  }
  if (r < 2 * rem)
    exchange(t, r - 1, mlxd_tag(MLXD_TAG_COLL, seq, STEP_FOLD_OUT), sig, out, all, NULL, 0, st);
  return st->code;
}

int mlxd_algo_all_gather_bruck(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, const void* in,
                               void* out, size_t nbytes, mlxd_status* st) {
  mlxd_status_reset(st);
  assert(t->size >= 2 && (nbytes == 0 || (in && out)));
  int n = t->size, r = t->rank;
  size_t all = mlxd_algo_mul(nbytes, (size_t)n);
  if (nbytes == 0) return mlxd_algo_empty(t, seq, sig, st);
  /* tmp holds blocks r, r + 1, ... (mod n) in that order */
  _Alignas(64) char stack_tmp[LOGN_STACK_BYTES];
  char* tmp = all <= sizeof stack_tmp ? stack_tmp : mlxd_buffer_alloc(all);
  if (!tmp) return mlxd_algo_fail(st, MLXD_ENOMEM, "out of memory for %zu bytes", all);
  memcpy(tmp, in, nbytes);
  unsigned step = STEP_FIRST;
  for (int d = 1; d < n; d *= 2, step++) {
    size_t cnt = (size_t)(d < n - d ? d : n - d) * nbytes;
    uint64_t tag = mlxd_tag(MLXD_TAG_COLL, seq, step);
    mlxd_req* reqs[2] = {NULL, NULL};
    int rc = t->ops->irecv(t, (r + d) % n, tag, sig, tmp + (size_t)d * nbytes, cnt, &reqs[0], st);
    if (!rc) rc = t->ops->isend(t, (r - d + n) % n, tag, sig, tmp, cnt, &reqs[1], st);
    if (mlxd_algo_drain(t, reqs, 2, st)) break;
    if (d > n / 2) break; /* d * 2 would overflow no sooner than here */
  }
  if (!st->code) {
    size_t head = (size_t)(n - r) * nbytes; /* blocks r..n-1 */
    memcpy((char*)out + (size_t)r * nbytes, tmp, head);
    memcpy(out, tmp + head, all - head);
  }
  if (tmp != stack_tmp) mlxd_buffer_free(tmp, all);
  return st->code;
}

int mlxd_algo_all_gather_logn(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, const void* in,
                              void* out, size_t nbytes, mlxd_status* st) {
  if (strcmp(t->ops->name, "shm") == 0 && t->size < MLXD_LOGN_SHM_WIDE_RANKS)
    return mlxd_algo_all_gather_bruck(t, seq, sig, in, out, nbytes, st);
  return mlxd_algo_all_gather_rd(t, seq, sig, in, out, nbytes, st);
}
