/* Bootstrapping a ring group through a tiny TCP rendezvous.
 *
 *   MLX_RANK=r MLX_WORLD_SIZE=n MLXDIST_EXAMPLE_KV=host:port ./bootstrap_tcp_kv
 *
 * Rank 0 runs a server thread on host:port. For every all-gather round each
 * rank connects, sends a header {rank, size, n} and its n bytes, and gets
 * back size * n bytes once every rank's part has arrived. The dtor (run by
 * mlxdist once the group is gone) stops the server. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap_examples.h"
#include "mlx/c/mlx.h"

struct tcp_kv {
  struct sockaddr_in addr;
  double timeout_s;
  int listen_fd; /* rank 0 only */
  pthread_t server;
  atomic_int stop;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Move n bytes, giving up at the deadline. 0 ok, -1 error/timeout. */
static int io_all(int fd, void* buf, size_t n, int writing, double deadline) {
  char* p = buf;
  while (n > 0) {
    struct pollfd pfd = {fd, (short)(writing ? POLLOUT : POLLIN), 0};
    int ms = (int)((deadline - now_s()) * 1000);
    if (ms <= 0 || poll(&pfd, 1, ms) <= 0) return -1;
    ssize_t k = writing ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
    if (k <= 0) return -1;
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

/* The server: one round at a time, collect `size` parts, answer everyone. */
static void* serve(void* arg) {
  tcp_kv* kv = arg;
  while (!atomic_load(&kv->stop)) {
    int fds[1024], size = -1, got = 0;
    uint64_t n = 0;
    char* all = NULL;
    int bad = 0;
    double deadline = 0;
    while (!atomic_load(&kv->stop) && (size < 0 || got < size)) {
      struct pollfd pfd = {kv->listen_fd, POLLIN, 0};
      if (poll(&pfd, 1, 100) <= 0) {
        if (size > 0 && now_s() > deadline) bad = 1; /* someone never came */
        if (bad) break;
        continue;
      }
      int fd = accept(kv->listen_fd, NULL, NULL);
      if (fd < 0) continue;
      uint32_t h[3]; /* rank, size, n (network order) */
      if (io_all(fd, h, sizeof h, 0, now_s() + kv->timeout_s) != 0) {
        close(fd);
        continue;
      }
      int r = (int)ntohl(h[0]), s = (int)ntohl(h[1]);
      uint64_t len = ntohl(h[2]);
      if (size < 0) {
        if (s < 1 || s > 1024 || len > (64u << 20)) {
          close(fd);
          continue;
        }
        size = s;
        n = len;
        all = calloc((size_t)size, n ? n : 1);
        for (int i = 0; i < size; i++) fds[i] = -1;
        deadline = now_s() + kv->timeout_s;
      }
      if (s != size || len != n || r < 0 || r >= size || fds[r] >= 0 || !all ||
          io_all(fd, all + (size_t)r * n, n, 0, deadline) != 0) {
        close(fd); /* inconsistent or broken client: it sees the connection close */
        bad = 1;
        break;
      }
      fds[r] = fd;
      got++;
    }
    for (int i = 0; i < size && i < 1024; i++) {
      if (fds[i] < 0) continue;
      if (!bad) (void)io_all(fds[i], all, (size_t)size * n, 1, now_s() + kv->timeout_s);
      close(fds[i]);
    }
    free(all);
  }
  return NULL;
}

tcp_kv* tcp_kv_new(const char* spec, int rank, double timeout_s) {
  char host[128];
  const char* colon = spec ? strrchr(spec, ':') : NULL;
  if (!colon || colon == spec || (size_t)(colon - spec) >= sizeof host) {
    fprintf(stderr, "tcp_kv: expected host:port, got '%s'\n", spec ? spec : "(null)");
    return NULL;
  }
  memcpy(host, spec, (size_t)(colon - spec));
  host[colon - spec] = '\0';
  tcp_kv* kv = calloc(1, sizeof *kv);
  if (!kv) return NULL;
  kv->timeout_s = timeout_s;
  kv->listen_fd = -1;
  struct addrinfo hints = {0}, *res = NULL;
  hints.ai_family = AF_INET;
  if (getaddrinfo(host, colon + 1, &hints, &res) != 0 || !res) {
    fprintf(stderr, "tcp_kv: cannot resolve '%s'\n", spec);
    free(kv);
    return NULL;
  }
  memcpy(&kv->addr, res->ai_addr, sizeof kv->addr);
  freeaddrinfo(res);
  if (rank == 0) {
    int one = 1;
    kv->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(kv->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(kv->listen_fd, (struct sockaddr*)&kv->addr, sizeof kv->addr) != 0 ||
        listen(kv->listen_fd, 1024) != 0 || pthread_create(&kv->server, NULL, serve, kv) != 0) {
      fprintf(stderr, "tcp_kv: cannot serve on '%s': %s\n", spec, strerror(errno));
      close(kv->listen_fd);
      free(kv);
      return NULL;
    }
  }
  return kv;
}

void tcp_kv_free(void* p) {
  tcp_kv* kv = p;
  if (!kv) return;
  if (kv->listen_fd >= 0) {
    atomic_store(&kv->stop, 1);
    pthread_join(kv->server, NULL);
    close(kv->listen_fd);
  }
  free(kv);
}

int tcp_kv_all_gather(void* dst, const void* src, size_t n, int rank, int size, void* payload) {
  tcp_kv* kv = payload;
  double deadline = now_s() + kv->timeout_s;
  for (;;) { /* the server may not be up yet: retry until the deadline */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 4;
    if (connect(fd, (struct sockaddr*)&kv->addr, sizeof kv->addr) == 0) {
      uint32_t h[3] = {htonl((uint32_t)rank), htonl((uint32_t)size), htonl((uint32_t)n)};
      int rc = io_all(fd, h, sizeof h, 1, deadline) || io_all(fd, (void*)src, n, 1, deadline) ||
               io_all(fd, dst, (size_t)size * n, 0, deadline);
      close(fd);
      return rc ? 5 : 0;
    }
    close(fd);
    if (now_s() > deadline) return 3;
    usleep(20000);
  }
}

#ifndef MLXDIST_EXAMPLE_NO_MAIN
int main(void) {
  const char* spec = getenv("MLXDIST_EXAMPLE_KV");
  const char* rs = getenv("MLX_RANK");
  if (!spec || !rs) {
    fprintf(stderr, "set MLX_RANK, MLX_WORLD_SIZE and MLXDIST_EXAMPLE_KV=host:port\n");
    return 2;
  }
  tcp_kv* kv = tcp_kv_new(spec, atoi(rs), 30.0);
  if (!kv) return 1;
  mlx_distributed_group g = mlx_distributed_group_new();
  /* mlxdist owns kv from here: tcp_kv_free runs exactly once, when it is no longer needed */
  mlx_distributed_init_with_all_gather(&g, true, "ring", tcp_kv_all_gather, kv, tcp_kv_free);
  int rank = 0, size = 0;
  mlx_distributed_group_get_rank(&rank, g);
  mlx_distributed_group_get_size(&size, g);
  mlx_array x = mlx_array_new_int(rank + 1), y = mlx_array_new();
  mlx_distributed_all_sum(&y, x, g, mlx_stream_new());
  int32_t total = 0;
  mlx_array_item_int32(&total, y);
  printf("rank %d of %d: all_sum of (rank + 1) = %d\n", rank, size, total);
  mlx_array_free(x);
  mlx_array_free(y);
  mlx_distributed_group_free(g);
  mlx_distributed_clear_backends();
  return 0;
}
#endif
