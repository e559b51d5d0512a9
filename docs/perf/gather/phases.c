/* Built by hand against a build tree (not part of the build), e.g.
 *   gcc -O2 -D_GNU_SOURCE -Isrc -Iinclude -Itests/common -o phases docs/perf/gather/phases.c \
 *     tests/common/{testutil,ranks,transports}.c BUILD/libmlxdist.a -lpthread -lm -lcrypto -lssl
 *   ./phases shm 2 131072 1000 */
/* all_gather over the shm transport, phases of the direct exchange (min and median over iters):
 * own = own-block copy, post = irecv+isend (isend copies what fits into the ring), wait = waitall. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "algo/algo.h"
#include "algo/algo_impl.h"
#include "testutil.h"
#include "transports.h"
static int cmpd(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}
static size_t g_nb;
static int g_iters;
static int rank_main(mlxd_transport* t, void* arg) {
  (void)arg;
  int n = t->size, r = t->rank;
  size_t nb = g_nb;
  char* in = malloc(nb);
  char* out = malloc(nb * n);
  memset(in, r + 1, nb);
  memset(out, 0, nb * n);
  double *own = calloc(g_iters, 8), *post = calloc(g_iters, 8), *wt = calloc(g_iters, 8),
         *tot = calloc(g_iters, 8), *api = calloc(g_iters, 8);
  mlxd_req** reqs = calloc(2 * n, sizeof *reqs);
  mlxd_status st;
  uint64_t seq = 1;
  for (int it = 0; it < g_iters; it++) {
    uint64_t x = 1, all[64];
    mlxd_algo_all_gather_direct(t, seq++, NULL, &x, all, 8, &st); /* line up */
    double t0 = t_now();
    memmove(out + (size_t)r * nb, in, nb);
    double t1 = t_now();
    uint64_t tag = mlxd_tag(MLXD_TAG_COLL, seq++, 0);
    for (int p = 0; p < n; p++)
      if (p != r) t->ops->irecv(t, p, tag, NULL, out + (size_t)p * nb, nb, &reqs[p], &st);
    for (int k = 1; k < n; k++) {
      int p = (r + k) % n;
      t->ops->isend(t, p, tag, NULL, in, nb, &reqs[n + p], &st);
    }
    double t2 = t_now();
    if (t->ops->waitall(t, reqs, 2 * n, &st)) {
      fprintf(stderr, "fail %s\n", st.msg);
      return 1;
    }
    double t3 = t_now();
    own[it] = t1 - t0;
    post[it] = t2 - t1;
    wt[it] = t3 - t2;
    tot[it] = t3 - t0;
    mlxd_algo_all_gather_direct(t, seq++, NULL, &x, all, 8, &st);
    double t4 = t_now();
    mlxd_algo_all_gather(t, seq++, NULL, in, out, nb, &st);
    api[it] = t_now() - t4;
  }
  {
    uint64_t x = 1, all[64];
    mlxd_algo_all_gather_direct(t, seq++, NULL, &x, all, 8, &st);
    double b0 = t_now();
    for (int it = 0; it < g_iters; it++) mlxd_algo_all_gather(t, seq++, NULL, in, out, nb, &st);
    double b1 = t_now();
    if (r == 0) printf("rank 0 block %zu back-to-back %.2f us/op\n", nb, (b1 - b0) / g_iters * 1e6);
  }
  double* v[] = {own, post, wt, tot, api};
  const char* nm[] = {"own", "post", "wait", "total", "algo"};
  if (r == 0 || r == 1) {
    printf("rank %d block %zu n=%d:", r, nb, n);
    for (int k = 0; k < 5; k++) {
      qsort(v[k], g_iters, 8, cmpd);
      printf("  %s %.2f/%.2f", nm[k], v[k][0] * 1e6, v[k][g_iters / 2] * 1e6);
    }
    printf("  (min/median us)\n");
  }
  return 0;
}
int main(int argc, char** argv) {
  t_tp_spec spec;
  t_tp_parse(argv[1], &spec);
  int n = atoi(argv[2]);
  g_nb = strtoull(argv[3], 0, 0);
  g_iters = atoi(argv[4]);
  t_ranks_opts o = {.timeout_s = 120, .what = argv[1]};
  return t_run_transport(&spec, n, rank_main, NULL, &o, NULL);
}
