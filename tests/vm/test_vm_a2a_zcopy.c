/* How all_to_all's parts move over the verbs transport, on real RDMA
 * (soft-RoCE in the VM, tests/vm/vm_verbs.sh's a2azc cases): N forked ranks
 * over "verbs[:K]" (tests/common/transports.h) run the direct all_to_all
 * (mlxd_algo_all_to_all) on buffers of mlxdist's own (mlxd_buffer_alloc, as
 * the arrays of the API are) at part sizes on both sides of
 * MLXDIST_VERBS_ZCOPY_BYTES (256 KiB), each twice (the second finds its
 * registrations cached, and is preceded by an all_to_all of 1-byte parts,
 * so that every rank enters it at about the same time), every byte checked. Then each rank's bytes by path
 * (mlxd_verbs_copy_counts) must be exactly what the parts make: every part
 * below the threshold staged once by its sender, every part from it read by
 * RDMA into the receiver's output (zero copy) or, when the peer's offer came
 * before this rank had posted its receive, into a bounce buffer; nothing
 * else staged, and some zero copy. The share of large bytes that bounced is
 * printed for the first (unsynchronised) and the second round.
 *
 *   test_vm_a2a_zcopy [verbs[:K]] [ranks] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo/algo.h"
#include "core/buffer.h"
#include "testutil.h"
#include "transport/verbs.h"
#include "transports.h"

#define ZC ((size_t)256 << 10)

/* Byte k of part j of rank i's input. */
static unsigned char val(int i, int j, size_t k) {
  return (unsigned char)(i * 37 + j * 11 + (int)(k * 7) + (int)(k >> 10) + 1);
}

static int a2a_rank(mlxd_transport* t, void* arg) {
  (void)arg;
  static const size_t parts[] = {1000, ((size_t)64 << 10) + 1, ZC - 1,
                                 ZC,   ((size_t)1 << 20) + 3,  (size_t)5 << 20};
  int n = t->size, r = t->rank;
  uint64_t staged = 0, large_in = 0, seq = 1;
  uint64_t bounced[2] = {0, 0}, large[2] = {0, 0}; /* per round: bytes bounced, large bytes in */
  for (size_t k = 0; k < sizeof parts / sizeof parts[0]; k++) {
    size_t P = parts[k], total = P * (size_t)n;
    unsigned char* in = mlxd_buffer_alloc(total);
    unsigned char* out = mlxd_buffer_alloc(total);
    T_REQUIRE(in && out);
    for (int rep = 0; rep < 2; rep++, seq++) {
      for (int j = 0; j < n; j++)
        for (size_t b = 0; b < P; b++) in[(size_t)j * P + b] = val(r, j, b + (size_t)rep);
      memset(out, 0xEE, total);
      mlxd_status st;
      int rc;
      if (rep == 1) { /* 1-byte parts: every rank is in this op before any leaves it */
        unsigned char one[8] = {0}, got[8];
        rc = mlxd_algo_all_to_all(t, seq++, NULL, one, got, 1, &st);
        T_REQUIREF(rc == 0, "rank %d: all_to_all of 1-byte parts: %s", r, st.msg);
        staged += (uint64_t)(n - 1);
      }
      uint64_t c0[3], c1[3];
      mlxd_verbs_copy_counts(c0);
      rc = mlxd_algo_all_to_all(t, seq, NULL, in, out, P, &st);
      mlxd_verbs_copy_counts(c1);
      T_REQUIREF(rc == 0, "rank %d: all_to_all of %zu-byte parts: %s", r, P, st.msg);
      for (int i = 0; i < n; i++)
        for (size_t b = 0; b < P; b++)
          if (out[(size_t)i * P + b] != val(i, r, b + (size_t)rep))
            T_FAIL("rank %d: %zu-byte parts, part %d byte %zu wrong", r, P, i, b);
      if (P < ZC) {
        staged += (uint64_t)P * (uint64_t)(n - 1);
      } else {
        large_in += (uint64_t)P * (uint64_t)(n - 1);
        large[rep] += (uint64_t)P * (uint64_t)(n - 1);
        bounced[rep] += c1[2] - c0[2];
      }
    }
    mlxd_buffer_free(in, total);
    mlxd_buffer_free(out, total);
  }
  uint64_t c[3];
  mlxd_verbs_copy_counts(c);
  printf(
      "rank %d of %d: staged %llu, zero-copy %llu, bounced %llu bytes; of the parts from "
      "256 KiB bounced: %.1f %% unsynchronised, %.1f %% after a 1-byte all_to_all\n",
      r, n, (unsigned long long)c[0], (unsigned long long)c[1], (unsigned long long)c[2],
      large[0] ? 100.0 * (double)bounced[0] / (double)large[0] : 0.0,
      large[1] ? 100.0 * (double)bounced[1] / (double)large[1] : 0.0);
  T_CHECKF(c[0] == staged, "rank %d: %llu bytes staged, %llu expected (the parts below 256 KiB)", r,
           (unsigned long long)c[0], (unsigned long long)staged);
  T_CHECKF(c[1] + c[2] == large_in, "rank %d: %llu + %llu large bytes in, %llu expected", r,
           (unsigned long long)c[1], (unsigned long long)c[2], (unsigned long long)large_in);
  T_CHECKF(c[1] > 0, "rank %d: no part went zero-copy", r);
  return t_check_failures() ? 1 : 0;
}

int main(int argc, char** argv) {
  const char* tp = argc > 1 ? argv[1] : "verbs";
  int n = argc > 2 ? atoi(argv[2]) : 3;
  t_tp_spec spec;
  if (!t_tp_parse(tp, &spec)) T_FAIL("bad transport '%s'", tp);
  if (n < 2 || n > 8) T_FAIL("ranks must be 2 to 8, not '%s'", argv[2]);
  setenv("MLXDIST_VERBS_ZCOPY_BYTES", "262144", 1);
  t_rank_exit ex[8];
  t_ranks_opts o = {.timeout_s = 100, .what = "a2azc"};
  int bad = t_run_transport(&spec, n, a2a_rank, NULL, &o, ex);
  if (bad) T_FAIL("all_to_all zero copy over %s, %d ranks: %d rank(s) failed", tp, n, bad);
  printf("all_to_all zero copy over %s, %d ranks: ok\n", tp, n);
  return 0;
}
