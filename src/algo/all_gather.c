/* all_gather: direct exchange for small payloads, pipelined ring otherwise. */
#include <stdlib.h>
#include <string.h>

#include "algo/algo_impl.h"
#include "util/tunables.h"

/* The caller's contract (algo.h), asserted; then this rank's own block. */
static void gather_prologue(mlxd_transport* t, const void* in, void* out, size_t nbytes,
                            mlxd_status* st) {
  mlxd_status_clear(st);
  assert(t->size >= 2);
  assert(nbytes == 0 || (in && out));
  (void)mlxd_algo_mul(nbytes, (size_t)t->size);
  char* own = (char*)out + (size_t)t->rank * nbytes;
  if (nbytes > 0 && own != (const char*)in) memmove(own, in, nbytes);
}

/* Every rank sends its block to every other rank. */
int mlxd_algo_all_gather_direct(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig,
                                const void* in, void* out, size_t nbytes, mlxd_status* st) {
  gather_prologue(t, in, out, nbytes, st);
  int n = t->size, r = t->rank;
  if (nbytes == 0) return 0;
  mlxd_req** reqs = calloc(2 * (size_t)n, sizeof *reqs);
  if (!reqs) return mlxd_algo_fail(st, MLXD_ENOMEM, "out of memory for %d requests", 2 * n);
  uint64_t tag = mlxd_tag(MLXD_TAG_COLL, seq, 0);
  const char* own = (const char*)out + (size_t)r * nbytes;
  int rc = 0;
  for (int p = 0; p < n && !rc; p++)
    if (p != r)
      rc = t->ops->irecv(t, p, tag, sig, (char*)out + (size_t)p * nbytes, nbytes, &reqs[p], st);
  for (int k = 1; k < n && !rc; k++) {
    int p = (r + k) % n;
    rc = t->ops->isend(t, p, tag, sig, own, nbytes, &reqs[n + p], st);
  }
  mlxd_algo_drain(t, reqs, 2 * n, st);
  free(reqs);
  return st->code;
}

int mlxd_algo_all_gather_ring(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, const void* in,
                              void* out, size_t nbytes, int bidir, mlxd_status* st) {
  gather_prologue(t, in, out, nbytes, st);
  int n = t->size;
  if (nbytes == 0) return 0;
  size_t total = nbytes * (size_t)n;
  size_t* tab = malloc(4 * (size_t)n * sizeof *tab);
  if (!tab) return mlxd_algo_fail(st, MLXD_ENOMEM, "out of memory for a ring schedule");
  mlxd_ring_plan p;
  memset(&p, 0, sizeof p);
  p.mode = MLXD_RING_AG;
  p.esz = 1;
  p.out = out;
  p.ndir = mlxd_algo_bidir(n, total, bidir) && nbytes >= 2 ? 2 : 1;
  size_t half = p.ndir == 2 ? nbytes / 2 : nbytes;
  for (int di = 0; di < p.ndir; di++) {
    p.boff[di] = tab + (size_t)di * 2 * (size_t)n;
    p.blen[di] = p.boff[di] + n;
    for (int b = 0; b < n; b++) {
      p.boff[di][b] = (size_t)b * nbytes + (di == 0 ? 0 : half);
      p.blen[di][b] = di == 0 ? half : nbytes - half;
    }
  }
  p.sig = sig;
  mlxd_ring_run(t, seq, &p, st);
  free(tab);
  return st->code;
}

int mlxd_algo_all_gather_blocks(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, void* buf,
                                const size_t* off, const size_t* len, mlxd_status* st) {
  mlxd_status_clear(st);
  int n = t->size;
  assert(n >= 2 && off[0] == 0);
  size_t total = off[n - 1] + len[n - 1];
  assert(total == 0 || buf);
  if (total == 0) return 0;
  size_t* tab = malloc(4 * (size_t)n * sizeof *tab);
  if (!tab) return mlxd_algo_fail(st, MLXD_ENOMEM, "out of memory for a ring schedule");
  mlxd_ring_plan p;
  memset(&p, 0, sizeof p);
  p.mode = MLXD_RING_AG;
  p.esz = 1;
  p.out = buf;
  p.ndir = mlxd_algo_bidir(n, total, -1) ? 2 : 1;
  mlxd_algo_split_blocks(off, len, n, p.ndir, tab, p.boff, p.blen);
  p.sig = sig;
  mlxd_ring_run(t, seq, &p, st);
  free(tab);
  return st->code;
}

int mlxd_algo_all_gather(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, const void* in,
                         void* out, size_t nbytes, mlxd_status* st) {
  size_t total = mlxd_algo_mul(nbytes, (size_t)t->size);
  long small = mlxd_tunable_long(MLXD_T_SMALL_BYTES);
  if (t->size <= 2 || total <= (small > 0 ? (size_t)small : 0))
    return mlxd_algo_all_gather_direct(t, seq, sig, in, out, nbytes, st);
  return mlxd_algo_all_gather_ring(t, seq, sig, in, out, nbytes, -1, st);
}
