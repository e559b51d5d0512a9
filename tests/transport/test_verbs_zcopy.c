/* Zero-copy (pull path) messages of the verbs transport on real RDMA
 * (soft-RoCE in the VM, tests/vm/vm_verbs.sh): two forked ranks over
 * "verbs[:K]" (tests/common/transports.h).
 *
 *   test_verbs_zcopy [verbs[:K]]
 *
 * 1. p2p both ways at sizes around MLXDIST_VERBS_ZCOPY_BYTES (256 KiB) and
 *    up to 9 MiB (several 4 MiB reads), every byte checked;
 * 2. an unexpected large message (its offer is taken while the receiver
 *    waits for a later small one): read into a bounce buffer, then copied;
 * 3. the stale-registration case: a large buffer of mlxdist's own
 *    (mlxd_buffer_alloc, MLXDIST_BUFFER_CACHE_MB=0 so freeing unmaps it)
 *    is sent, freed, allocated again (at the same address where the kernel
 *    gives it) and filled with new data, and sent again; the receiver must
 *    get the new data (a cached registration of the old pages would carry
 *    the old bytes). The same on the receiving side.
 * 4. each rank's bytes by path (mlxd_verbs_copy_counts) are checked
 *    against what it sent and received, and printed. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/buffer.h"
#include "testutil.h"
#include "transport/verbs.h"
#include "transports.h"

#define ZC ((size_t)256 << 10)

static void fill(unsigned char* b, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) b[i] = (unsigned char)(i * 131u + seed * 7u + (i >> 12));
}

static size_t bad_at(const unsigned char* b, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++)
    if (b[i] != (unsigned char)(i * 131u + seed * 7u + (i >> 12))) return i;
  return SIZE_MAX;
}

static void xfer(mlxd_transport* t, int from, uint64_t tag, void* buf, size_t n) {
  mlxd_status st;
  mlxd_req* rq = NULL;
  int rc;
  if (t->rank == from) {
    rc = t->ops->isend(t, 1 - from, tag, NULL, buf, n, &rq, &st);
  } else {
    rc = t->ops->irecv(t, from, tag, NULL, buf, n, &rq, &st);
  }
  T_REQUIREF(rc == 0, "rank %d: post of %zu bytes: %s", t->rank, n, st.msg);
  rc = t->ops->waitall(t, &rq, 1, &st);
  T_REQUIREF(rc == 0, "rank %d: %zu bytes (tag %llu): %s", t->rank, n, (unsigned long long)tag,
             st.msg);
}

static int zc_rank(mlxd_transport* t, void* arg) {
  (void)arg;
  static const size_t sizes[] = {1000,           ZC - 1,  ZC, ZC + 1, (size_t)1 << 20,
                                 (5u << 20) + 3, 9u << 20};
  size_t ns = sizeof sizes / sizeof sizes[0];
  uint64_t staged = 0, large_in = 0, bounced_min = 0, tag = 1;
  unsigned char* buf = malloc(9u << 20);
  T_REQUIRE(buf);
  /* 1. p2p both ways */
  for (int from = 0; from < 2; from++) {
    for (size_t k = 0; k < ns; k++, tag++) {
      size_t n = sizes[k];
      if (t->rank == from) {
        fill(buf, n, (unsigned)tag);
        if (n < ZC) staged += n;
      } else {
        memset(buf, 0, n);
      }
      xfer(t, from, tag, buf, n);
      if (t->rank != from) {
        size_t b = bad_at(buf, n, (unsigned)tag);
        T_REQUIREF(b == SIZE_MAX, "p2p %zu bytes from rank %d: byte %zu wrong", n, from, b);
        if (n >= ZC) large_in += n;
      }
    }
  }
  /* 2. unexpected: rank 0 sends the large message, then a small one; rank 1
   * receives the small one first (its wait takes the large one's offer,
   * which comes first, with no receive posted), then the large one */
  size_t n = (size_t)3 << 20;
  {
    uint64_t small = 0x5a5a, tl = tag++, ts = tag++;
    mlxd_req* rq[2] = {NULL, NULL};
    mlxd_status st;
    if (t->rank == 0) {
      fill(buf, n, 77);
      T_REQUIRE(t->ops->isend(t, 1, tl, NULL, buf, n, &rq[0], &st) == 0);
      T_REQUIRE(t->ops->isend(t, 1, ts, NULL, &small, 8, &rq[1], &st) == 0);
      T_REQUIREF(t->ops->waitall(t, rq, 2, &st) == 0, "unexpected case: %s", st.msg);
      staged += 8;
    } else {
      memset(buf, 0, n);
      uint64_t got = 0;
      T_REQUIRE(t->ops->irecv(t, 0, ts, NULL, &got, 8, &rq[1], &st) == 0);
      T_REQUIREF(t->ops->waitall(t, &rq[1], 1, &st) == 0, "unexpected case: %s", st.msg);
      T_CHECK(got == small);
      T_REQUIRE(t->ops->irecv(t, 0, tl, NULL, buf, n, &rq[0], &st) == 0);
      T_REQUIREF(t->ops->waitall(t, &rq[0], 1, &st) == 0, "unexpected case: %s", st.msg);
      size_t b = bad_at(buf, n, 77);
      T_REQUIREF(b == SIZE_MAX, "unexpected %zu bytes: byte %zu wrong", n, b);
      large_in += n;
      bounced_min += n;
    }
  }
  /* 3. stale registrations: free and reallocate between two large sends */
  n = (size_t)2 << 20;
  int same = 0;
  for (int round = 0; round < 2; round++) {
    unsigned char* a = mlxd_buffer_alloc(n);
    T_REQUIRE(a);
    T_CHECKF(mlxd_buffer_owns(a, n), "mlxd_buffer_owns: false for its own buffer");
    unsigned char* b;
    for (int i = 0; i < 2; i++) {
      unsigned seed = 100u + (unsigned)(round * 2 + i);
      if (t->rank == round) fill(a, n, seed);
      if (t->rank != round) memset(a, 0xEE, n);
      xfer(t, round, tag++, a, n);
      if (t->rank != round) {
        size_t at = bad_at(a, n, seed);
        T_REQUIREF(at == SIZE_MAX, "stale case (round %d, message %d): byte %zu wrong: %s", round,
                   i, at, i ? "a registration of the freed buffer was reused" : "first message");
        large_in += n;
      }
      mlxd_buffer_free(a, n);
      b = mlxd_buffer_alloc(n); /* the same address where the kernel gives it back */
      T_REQUIRE(b);
      same += b == a;
      a = b;
    }
    mlxd_buffer_free(a, n);
  }
  T_CHECKF(!mlxd_buffer_owns(buf, 16), "mlxd_buffer_owns: true for malloc'd memory");
  free(buf);
  uint64_t c[3];
  mlxd_verbs_copy_counts(c);
  printf(
      "rank %d: staged %llu, zero-copy %llu, bounced %llu bytes; reallocations at the same "
      "address %d/4\n",
      t->rank, (unsigned long long)c[0], (unsigned long long)c[1], (unsigned long long)c[2], same);
  T_CHECKF(c[0] == staged, "rank %d: %llu bytes staged, %llu expected (the small sends)", t->rank,
           (unsigned long long)c[0], (unsigned long long)staged);
  T_CHECKF(c[1] + c[2] == large_in, "rank %d: %llu + %llu large bytes in, %llu expected", t->rank,
           (unsigned long long)c[1], (unsigned long long)c[2], (unsigned long long)large_in);
  T_CHECKF(c[2] >= bounced_min, "rank %d: %llu bytes bounced, at least %llu expected", t->rank,
           (unsigned long long)c[2], (unsigned long long)bounced_min);
  T_CHECKF(large_in == 0 || c[1] > 0, "rank %d: nothing went zero-copy", t->rank);
  return t_check_failures() ? 1 : 0;
}

int main(int argc, char** argv) {
  const char* tp = argc > 1 ? argv[1] : "verbs";
  t_tp_spec spec;
  if (!t_tp_parse(tp, &spec)) T_FAIL("bad transport '%s'", tp);
  setenv("MLXDIST_BUFFER_CACHE_MB", "0", 1); /* a freed large buffer is unmapped */
  setenv("MLXDIST_VERBS_ZCOPY_BYTES", "262144", 1);
  t_rank_exit ex[2];
  t_ranks_opts o = {.timeout_s = 90, .what = "zcopy"};
  int bad = t_run_transport(&spec, 2, zc_rank, NULL, &o, ex);
  if (bad) T_FAIL("zcopy over %s: %d rank(s) failed", tp, bad);
  printf("zcopy over %s: ok\n", tp);
  return 0;
}
