/* all_gather: direct exchange (small groups) or recursive doubling (large
 * ones, logdepth.c) for small payloads, the pipeline otherwise, and the
 * direct exchange again for blocks the transport moves best whole
 * (mlxd_transport.whole_min: shared memory on a crowded host). */
#include <stdlib.h>
#include <string.h>

#include "algo/algo_impl.h"
#include "util/tunables.h"

/* The caller's contract (algo.h), asserted. */
static void gather_prologue(mlxd_transport* t, const void* in, void* out, size_t nbytes,
                            mlxd_status* st) {
  mlxd_status_clear(st);
  assert(t->size >= 2);
  assert(nbytes == 0 || (in && out));
  (void)in;
  (void)out;
  (void)mlxd_algo_mul(nbytes, (size_t)t->size);
}

/* This rank's own block of out (in may already be it: in place). Blocks up
 * to OWN_LATE_MAX are copied after the sends are posted (they read in), so
 * the peers get this rank's data one block copy sooner and the copy fills
 * this rank's wait for theirs (256 KiB over shm, 2 ranks: 13.5 -> 11.5 us).
 * Larger ones are copied first: the copy would hold up the transfer (the
 * shm lane fills while this rank copies instead of draining; 4 MiB, 2
 * ranks: 207 -> 231 us; docs/performance.md). */
#define OWN_LATE_MAX ((size_t)512 << 10)
static void gather_own(mlxd_transport* t, const void* in, void* out, size_t nbytes) {
  char* own = (char*)out + (size_t)t->rank * nbytes;
  if (nbytes > 0 && own != (const char*)in) memmove(own, in, nbytes);
}

/* Every rank sends its block to every other rank. */
int mlxd_algo_all_gather_direct(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig,
                                const void* in, void* out, size_t nbytes, mlxd_status* st) {
  gather_prologue(t, in, out, nbytes, st);
  int n = t->size, r = t->rank;
  if (nbytes == 0) return mlxd_algo_empty(t, seq, sig, st);
  mlxd_req** reqs = calloc(2 * (size_t)n, sizeof *reqs);
  if (!reqs) return mlxd_algo_fail(st, MLXD_ENOMEM, "out of memory for %d requests", 2 * n);
  uint64_t tag = mlxd_tag(MLXD_TAG_COLL, seq, 0);
  bool late = nbytes <= OWN_LATE_MAX;
  if (!late) gather_own(t, in, out, nbytes);
  int rc = 0;
  for (int p = 0; p < n && !rc; p++)
    if (p != r)
      rc = t->ops->irecv(t, p, tag, sig, (char*)out + (size_t)p * nbytes, nbytes, &reqs[p], st);
  for (int k = 1; k < n && !rc; k++) {
    int p = (r + k) % n;
    rc = t->ops->isend(t, p, tag, sig, in, nbytes, &reqs[n + p], st);
  }
  if (!rc && late) gather_own(t, in, out, nbytes);
  mlxd_algo_drain(t, reqs, 2 * n, st);
  free(reqs);
  return st->code;
}

/* The pipeline over buf's blocks (off/len, in bytes; algo_impl.h) in
 * ndir directions: the one schedule of both entry points below. */
static int all_gather_run(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, const void* in,
                          void* buf, const size_t* off, const size_t* len, int ndir,
                          mlxd_status* st) {
  int n = t->size;
  size_t* tab = malloc(4 * (size_t)n * sizeof *tab);
  if (!tab) return mlxd_algo_fail(st, MLXD_ENOMEM, "out of memory for a pipeline schedule");
  mlxd_pipeline_plan p;
  memset(&p, 0, sizeof p);
  p.mode = MLXD_PIPELINE_AG;
  p.esz = 1;
  p.out = buf;
  p.in = in; /* NULL: block `rank` is in buf already */
  p.out_base = off[t->rank];
  p.ndir = ndir;
  mlxd_algo_split_blocks(off, len, n, ndir, tab, p.boff, p.blen);
  p.sig = sig;
  mlxd_pipeline_run(t, seq, &p, st);
  free(tab);
  return st->code;
}

int mlxd_algo_all_gather_pipeline(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig,
                                  const void* in, void* out, size_t nbytes, int bidir,
                                  mlxd_status* st) {
  gather_prologue(t, in, out, nbytes, st);
  int n = t->size;
  if (nbytes == 0) return mlxd_algo_empty(t, seq, sig, st);
  size_t* ol = mlxd_algo_equal_blocks(n, nbytes, st);
  if (!ol) return st->code;
  int ndir = mlxd_algo_bidir(n, nbytes * (size_t)n, bidir) && nbytes >= 2 ? 2 : 1;
  /* the pipeline copies the own block after posting when given in */
  bool late = nbytes <= OWN_LATE_MAX;
  if (!late) gather_own(t, in, out, nbytes);
  bool in_place = (char*)out + (size_t)t->rank * nbytes == (const char*)in;
  all_gather_run(t, seq, sig, late && !in_place ? in : NULL, out, ol, ol + n, ndir, st);
  free(ol);
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
  return all_gather_run(t, seq, sig, NULL, buf, off, len, mlxd_algo_bidir(n, total, -1) ? 2 : 1,
                        st);
}

int mlxd_algo_all_gather_upto(mlxd_transport* t, size_t small, uint64_t seq, const mlxd_sig* sig,
                              const void* in, void* out, size_t nbytes, mlxd_status* st) {
  size_t total = mlxd_algo_mul(nbytes, (size_t)t->size);
  /* Each block whole, from its owner to every peer: on a crowded host each
   * rank then reads its peers' inputs in one copy apiece, with no peer on a
   * CPU, where every pipeline chunk is copied twice by two ranks that must run
   * at the same time (docs/performance.md, "The large all_gather on a
   * crowded host"). */
  if (t->whole_min && nbytes >= t->whole_min)
    return mlxd_algo_all_gather_direct(t, seq, sig, in, out, nbytes, st);
  if (t->size <= 2 || total <= small) {
    if (total <= small && mlxd_algo_logn(t, MLXD_SMALL_AG, total))
      return mlxd_algo_all_gather_logn(t, seq, sig, in, out, nbytes, st);
    return mlxd_algo_all_gather_direct(t, seq, sig, in, out, nbytes, st);
  }
  return mlxd_algo_all_gather_pipeline(t, seq, sig, in, out, nbytes, -1, st);
}

int mlxd_algo_all_gather(mlxd_transport* t, uint64_t seq, const mlxd_sig* sig, const void* in,
                         void* out, size_t nbytes, mlxd_status* st) {
  return mlxd_algo_all_gather_upto(t, mlxd_algo_small_bytes(), seq, sig, in, out, nbytes, st);
}

int mlxd_algo_all_gather_setup(mlxd_transport* t, uint64_t seq, const void* in, void* out,
                               size_t nbytes, mlxd_status* st) {
  size_t total = mlxd_algo_mul(nbytes, (size_t)t->size);
  if (t->size > 2 && total > ((size_t)256 << 10))
    return mlxd_algo_all_gather_pipeline(t, seq, NULL, in, out, nbytes, -1, st);
  if (t->size >= MLXD_LOGN_NET_AG_RANKS)
    return mlxd_algo_all_gather_rd(t, seq, NULL, in, out, nbytes, st);
  return mlxd_algo_all_gather_direct(t, seq, NULL, in, out, nbytes, st);
}
