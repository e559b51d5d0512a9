/* Timing (prints only, no assertions): float32 all_reduce (sum) through
 * mlxd_algo_all_reduce over the shm transport and over the TCP transport
 * (loopback sockets), forked ranks, median microseconds per call.
 * Usage: bench_shm <ranks> [shm|tcp|both] [max_bytes] */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <sys/socket.h>

#include "algo/algo.h"
#include "harness.h"
#include "transport/shm.h"
#include "transport/tcp.h"

static const size_t k_bytes[] = {4, 64 << 10, 1 << 20, 16 << 20, 64 << 20};
#define NB (sizeof k_bytes / sizeof k_bytes[0])

typedef struct bench_arg {
  int use_tcp;
  int* fds; /* size * size, fds[r * size + p] is rank r's socket to p */
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

static int bench_rank(int rank, int size, const char* name, void* argp) {
  bench_arg* a = argp;
  mlxd_status st;
  mlxd_transport* t;
  if (a->use_tcp) {
    int* mine = malloc((size_t)size * sizeof *mine);
    for (int r = 0; r < size; r++)
      for (int p = 0; p < size; p++) {
        int fd = a->fds[r * size + p];
        if (r == rank)
          mine[p] = fd;
        else if (fd >= 0)
          close(fd);
      }
    t = mlxd_tcp_transport_new(rank, size, mine, 1, &st);
    free(mine);
  } else {
    t = mlxd_shm_transport_new(rank, size, name, &st);
  }
  if (!t) {
    fprintf(stderr, "rank %d: %s\n", rank, st.msg);
    return 1;
  }
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
      double t0 = h_now();
      if (mlxd_algo_all_reduce(t, seq++, in, out, b / 4, MLX_FLOAT32, MLXD_SUM, &st) != 0) {
        fprintf(stderr, "rank %d: %s\n", rank, st.msg);
        return 1;
      }
      if (i >= 0) ts[i] = h_now() - t0;
    }
    qsort(ts, (size_t)it, sizeof *ts, cmp_d);
    if (rank == 0) {
      float want = 0;
      for (int r = 0; r < size; r++) want += (float)((b / 4 - 1) % 100) + (float)r;
      printf("%s N=%d %9zu B: median %10.1f us  (min %10.1f, %d iters)%s\n",
             a->use_tcp ? "tcp" : "shm", size, b, ts[it / 2] * 1e6, ts[0] * 1e6, it,
             out[b / 4 - 1] == want ? "" : "  WRONG RESULT");
      fflush(stdout);
    }
    free(ts);
  }
  free(in);
  free(out);
  t->ops->destroy(t);
  return 0;
}

/* A connected loopback TCP pair. */
static void tcp_pair(int* x, int* y) {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  if (l < 0 || bind(l, (struct sockaddr*)&sa, sizeof sa) != 0 || listen(l, 1) != 0 ||
      getsockname(l, (struct sockaddr*)&sa, &len) != 0) {
    perror("listen");
    exit(1);
  }
  int c = socket(AF_INET, SOCK_STREAM, 0);
  if (c < 0 || connect(c, (struct sockaddr*)&sa, sizeof sa) != 0) {
    perror("connect");
    exit(1);
  }
  int s = accept(l, NULL, NULL);
  if (s < 0) {
    perror("accept");
    exit(1);
  }
  close(l);
  int one = 1;
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  *x = c;
  *y = s;
}

int main(int argc, char** argv) {
  int n = argc > 1 ? atoi(argv[1]) : 2;
  const char* which = argc > 2 ? argv[2] : "both";
  size_t maxb = argc > 3 ? (size_t)strtoull(argv[3], NULL, 10) : ((size_t)64 << 20);
  if (n < 2 || n > 16) {
    fprintf(stderr, "usage: %s <ranks 2..16> [shm|tcp|both] [max_bytes]\n", argv[0]);
    return 2;
  }
  int codes[64];
  for (int pass = 0; pass < 2; pass++) {
    bench_arg a = {pass, NULL, maxb};
    if (pass == 0 && strcmp(which, "tcp") == 0) continue;
    if (pass == 1 && strcmp(which, "shm") == 0) continue;
    if (pass == 1) {
      a.fds = malloc((size_t)n * (size_t)n * sizeof *a.fds);
      for (int i = 0; i < n * n; i++) a.fds[i] = -1;
      for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++) tcp_pair(&a.fds[i * n + j], &a.fds[j * n + i]);
    }
    h_run(n, 600, bench_rank, &a, codes);
    if (a.fds) {
      for (int i = 0; i < n * n; i++)
        if (a.fds[i] >= 0) close(a.fds[i]);
      free(a.fds);
    }
  }
  return 0;
}
