/* Timing (prints only, no assertions): float32 all_reduce (sum) through
 * mlxd_algo_all_reduce over the shm transport and over the TCP transport
 * (loopback sockets), forked ranks, median microseconds per call.
 * Usage: bench_shm <ranks> [shm|tcp|both] [max_bytes] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo/algo.h"
#include "transports.h"

static const size_t k_bytes[] = {4, 64 << 10, 1 << 20, 16 << 20, 64 << 20};
#define NB (sizeof k_bytes / sizeof k_bytes[0])

typedef struct bench_arg {
  size_t max_bytes;
} bench_arg;

static int iters_for(size_t b) {
  if (b <= 4096) return 2000;
  if (b <= (64 << 10)) return 400;
  if (b <= (1 << 20)) return 60;
  if (b <= (16 << 20)) return 12;
  return 6;
}

static int cmp_d(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static int bench_rank(mlxd_transport* t, void* argp) {
  bench_arg* a = argp;
  mlxd_status st;
  int rank = t->rank, size = t->size;
  size_t maxb = a->max_bytes;
  float* in = malloc(maxb);
  float* out = malloc(maxb);
  for (size_t i = 0; i < maxb / 4; i++) in[i] = (float)(i % 100) + (float)rank;
  memset(out, 0, maxb);
  uint64_t seq = 1;
  for (size_t k = 0; k < NB; k++) {
    size_t b = k_bytes[k];
    if (b > maxb) break;
    int it = iters_for(b), warm = it / 10 + 1;
    double* ts = malloc((size_t)it * sizeof *ts);
    for (int i = -warm; i < it; i++) {
      double t0 = t_now();
      if (mlxd_algo_all_reduce(t, seq++, NULL, in, out, b / 4, MLX_FLOAT32, MLXD_SUM, &st) != 0) {
        fprintf(stderr, "rank %d: %s\n", rank, st.msg);
        return 1;
      }
      if (i >= 0) ts[i] = t_now() - t0;
    }
    qsort(ts, (size_t)it, sizeof *ts, cmp_d);
    if (rank == 0) {
      float want = 0;
      for (int r = 0; r < size; r++) want += (float)((b / 4 - 1) % 100) + (float)r;
      printf("%s N=%d %9zu B: median %10.1f us  (min %10.1f, %d iters)%s\n", t->ops->name, size, b,
             ts[it / 2] * 1e6, ts[0] * 1e6, it, out[b / 4 - 1] == want ? "" : "  WRONG RESULT");
      fflush(stdout);
    }
    free(ts);
  }
  free(in);
  free(out);
  return 0;
}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  const char* which = argc > 2 ? argv[2] : "both";
  size_t maxb = argc > 3 ? (size_t)strtoull(argv[3], NULL, 10) : ((size_t)64 << 20);
  if (n < 2 || n > 16) {
    fprintf(stderr, "usage: %s <ranks 2..16> [shm|tcp|both] [max_bytes]\n", argv[0]);
    return 2;
  }
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 0 && strcmp(which, "tcp") == 0) continue;
    if (pass == 1 && strcmp(which, "shm") == 0) continue;
    bench_arg a = {maxb};
    t_tp_spec spec = {.kind = pass == 0 ? T_TP_SHM : T_TP_TCP, .nconn = 1};
    t_ranks_opts o = {.timeout_s = 600};
    t_run_transport(&spec, n, bench_rank, &a, &o, NULL);
  }
  return 0;
}
