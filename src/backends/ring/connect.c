/* Connection set-up for the ring backend: listen, connect with retries and
 * exponential back-off, accept, and a small handshake that identifies every
 * connection. The result is a full mesh: nconn sockets between every pair
 * of ranks, so send/recv works between any two ranks.
 *
 * Order (deterministic, deadlock-free): every rank first listens, then
 * connects to every lower rank j (connection c to j's address c) and sends
 * a hello {magic, version, rank, size, conn, nconn}; then accepts from every
 * higher rank, checks its hello and answers with its own; finally it reads
 * the answers on its outgoing connections. Connecting only needs the peer to
 * be listening (the kernel completes it from the backlog), so no rank waits
 * on another rank's progress until all connections exist. */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "backends/ring/ring_internal.h"
#include "util/bytes.h"
#include "util/clock.h"
#include "util/tunables.h"

#define HELLO_MAGIC 0x4D4C5852u /* "MLXR" */
#define HELLO_VERSION 1u
#define HELLO_BYTES 24
#define SOCK_BUF_BYTES (4 << 20)

bool mlxd_ring_verbose(void) {
  const char* v = getenv("MLX_RING_VERBOSE");
  return v && *v && strcmp(v, "0") != 0;
}

void mlxd_ring_log(const char* fmt, ...) {
  if (!mlxd_ring_verbose()) return;
  char line[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "[ring] %s\n", line);
}

void mlxd_ring_close_all(int* fds, int n) {
  for (int i = 0; i < n; i++) {
    if (fds[i] >= 0) close(fds[i]);
    fds[i] = -1;
  }
}

static void set_buffers(int fd) {
  int v = SOCK_BUF_BYTES;
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof v);
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof v);
}

static void set_nodelay(int fd) {
  int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static int set_nonblock(int fd, bool on) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0) return -1;
  return fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}

/* A failed system call while setting up this rank's own sockets. */
static int setup_fail_sys(mlxd_status* st, const char* what, const char* addr, const char* call,
                          int err) {
  mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP, "%s %s", what, addr);
  mlxd_status_set_sys(st, call, err);
  return MLXD_ESYS;
}

int mlxd_ring_listen(mlxd_ring_addr* addr, int* fd_out, mlxd_status* st) {
  *fd_out = -1;
  int fd = socket(addr->sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return setup_fail_sys(st, "cannot create a socket to listen on", addr->text, "socket", errno);
  int one = 1;
  (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  set_buffers(fd); /* inherited by accepted sockets; must precede listen for window scaling */
  if (bind(fd, (struct sockaddr*)&addr->sa, addr->len) != 0) {
    int e = errno;
    close(fd);
    return setup_fail_sys(st, "cannot bind this rank's listen address", addr->text, "bind", e);
  }
  if (listen(fd, SOMAXCONN) != 0) {
    int e = errno;
    close(fd);
    return setup_fail_sys(st, "cannot listen on", addr->text, "listen", e);
  }
  socklen_t len = sizeof addr->sa;
  if (getsockname(fd, (struct sockaddr*)&addr->sa, &len) == 0) {
    addr->len = len;
    mlxd_ring_format_addr((struct sockaddr*)&addr->sa, addr->text, sizeof addr->text);
  }
  mlxd_ring_log("listening on %s", addr->text);
  *fd_out = fd;
  return 0;
}

int mlxd_ring_listen_many(const mlxd_ring_addr* host, int nconn, int* lfds, mlxd_ring_addr* addrs,
                          mlxd_status* st) {
  for (int c = 0; c < nconn; c++) lfds[c] = -1;
  for (int c = 0; c < nconn; c++) {
    addrs[c] = *host;
    if (addrs[c].sa.ss_family == AF_INET)
      ((struct sockaddr_in*)(void*)&addrs[c].sa)->sin_port = 0;
    else
      ((struct sockaddr_in6*)(void*)&addrs[c].sa)->sin6_port = 0;
    if (mlxd_ring_listen(&addrs[c], &lfds[c], st) != 0) {
      mlxd_ring_close_all(lfds, nconn);
      return st->code;
    }
  }
  return 0;
}

/* ---- bounded I/O on non-blocking sockets ---- */

static int io_all(int fd, void* buf, size_t n, bool wr, double deadline) {
  unsigned char* p = buf;
  while (n > 0) {
    ssize_t k = wr ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
    if (k > 0) {
      p += k;
      n -= (size_t)k;
      continue;
    }
    if (k == 0) {
      errno = ECONNRESET;
      return -1;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    struct pollfd pfd = {fd, (short)(wr ? POLLOUT : POLLIN), 0};
    int left = mlxd_ms_left(deadline);
    if (left == 0) {
      errno = ETIMEDOUT;
      return -1;
    }
    if (poll(&pfd, 1, left) < 0 && errno != EINTR) return -1;
  }
  return 0;
}

static void hello_encode(unsigned char* h, int rank, int size, int conn, int nconn) {
  mlxd_put32(h, HELLO_MAGIC);
  mlxd_put32(h + 4, HELLO_VERSION);
  mlxd_put32(h + 8, (uint32_t)rank);
  mlxd_put32(h + 12, (uint32_t)size);
  mlxd_put32(h + 16, (uint32_t)conn);
  mlxd_put32(h + 20, (uint32_t)nconn);
}

/* One attempt-loop to connect to a; returns a connected non-blocking fd or -1 (st set). */
static int connect_retry(const mlxd_ring_addr* a, int peer, double deadline, double budget,
                         mlxd_status* st) {
  double backoff = 0.01;
  int last = 0;
  int attempts = 0;
  for (;;) {
    attempts++;
    int fd = socket(a->sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      int e = errno;
      mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP,
                   "cannot create a socket to connect to rank %d", peer);
      mlxd_status_set_peer(st, peer, a->text);
      mlxd_status_set_sys(st, "socket", e);
      return -1;
    }
    set_buffers(fd);
    int rc = connect(fd, (const struct sockaddr*)&a->sa, a->len);
    if (rc != 0 && errno == EINPROGRESS) {
      struct pollfd pfd = {fd, POLLOUT, 0};
      int left = mlxd_ms_left(deadline);
      int pr = poll(&pfd, 1, left);
      if (pr == 1) {
        int err = 0;
        socklen_t el = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
        rc = err ? -1 : 0;
        errno = err;
      } else {
        rc = -1;
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) {
      set_nodelay(fd);
      if (attempts > 1)
        mlxd_ring_log("connected to rank %d at %s after %d attempts", peer, a->text, attempts);
      return fd;
    }
    last = errno;
    close(fd);
    bool transient = last == ECONNREFUSED || last == ETIMEDOUT || last == ENETUNREACH ||
                     last == EHOSTUNREACH || last == ECONNRESET || last == EADDRNOTAVAIL ||
                     last == EAGAIN || last == EINTR;
    if (!transient) break;
    double now = mlxd_now();
    if (now >= deadline) break;
    double pause = backoff;
    if (now + pause > deadline) pause = deadline - now;
    struct timespec ts = {(time_t)pause, (long)((pause - (double)(time_t)pause) * 1e9)};
    nanosleep(&ts, NULL);
    backoff = backoff * 2 > 0.5 ? 0.5 : backoff * 2;
  }
  mlxd_fail_at(st, last == ECONNREFUSED || last == ETIMEDOUT ? MLXD_ETIMEDOUT : MLXD_ESYS,
               MLXD_LAYER_BOOTSTRAP,
               "cannot connect to rank %d within %g s (MLXDIST_CONNECT_TIMEOUT) after %d "
               "attempt%s",
               peer, budget, attempts, attempts == 1 ? "" : "s");
  mlxd_status_set_peer(st, peer, a->text);
  mlxd_status_set_sys(st, "connect", last);
  return -1;
}

int mlxd_ring_mesh(int rank, const mlxd_ring_hosts* hosts, const int* listen_fds, int* fds,
                   mlxd_status* st) {
  const int size = hosts->size, K = hosts->nconn;
  const int total = size * K;
  for (int i = 0; i < total; i++) fds[i] = -1;
  double budget = mlxd_tunable_double(MLXD_T_CONNECT_TIMEOUT);
  if (!(budget > 0)) budget = 30;
  const double deadline = mlxd_now() + budget;
  unsigned char h[HELLO_BYTES];

  /* 1. connect to every lower rank and say hello */
  for (int j = 0; j < rank; j++) {
    for (int c = 0; c < K; c++) {
      const mlxd_ring_addr* a = &hosts->addrs[j * K + c];
      int fd = connect_retry(a, j, deadline, budget, st);
      if (fd < 0) goto fail;
      fds[j * K + c] = fd;
      hello_encode(h, rank, size, c, K);
      if (io_all(fd, h, HELLO_BYTES, true, deadline) != 0) {
        int e = errno;
        mlxd_fail_at(st, e == ETIMEDOUT ? MLXD_ETIMEDOUT : MLXD_EREMOTE, MLXD_LAYER_BOOTSTRAP,
                     "cannot send the handshake to rank %d", j);
        mlxd_status_set_peer(st, j, a->text);
        mlxd_status_set_sys(st, "send", e);
        goto fail;
      }
    }
  }

  /* 2. accept every higher rank */
  int expected = (size - 1 - rank) * K;
  struct pollfd* pfds = calloc((size_t)K, sizeof *pfds);
  if (!pfds) {
    mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory setting up connections");
    goto fail;
  }
  while (expected > 0) {
    for (int c = 0; c < K; c++) pfds[c] = (struct pollfd){listen_fds[c], POLLIN, 0};
    int left = mlxd_ms_left(deadline);
    int pr = left ? poll(pfds, (nfds_t)K, left) : 0;
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) {
      int missing = -1;
      for (int j = rank + 1; j < size && missing < 0; j++)
        for (int c = 0; c < K; c++)
          if (fds[j * K + c] < 0) missing = j;
      free(pfds);
      mlxd_fail_at(st, MLXD_ETIMEDOUT, MLXD_LAYER_BOOTSTRAP,
                   "rank %d did not connect to this rank (%d, listening on %s) within %g s "
                   "(MLXDIST_CONNECT_TIMEOUT); is it running with the same hostfile?",
                   missing, rank, hosts->addrs[rank * K].text, budget);
      if (missing >= 0) mlxd_status_set_peer(st, missing, NULL);
      goto fail;
    }
    for (int c = 0; c < K; c++) {
      if (!(pfds[c].revents & POLLIN)) continue;
      int fd = accept4(listen_fds[c], NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) continue;
      set_nodelay(fd);
      double hd = mlxd_now() + 5.0;
      if (hd > deadline) hd = deadline;
      if (io_all(fd, h, HELLO_BYTES, false, hd) != 0 || mlxd_get32(h) != HELLO_MAGIC ||
          mlxd_get32(h + 4) != HELLO_VERSION) {
        mlxd_ring_log("rank %d: ignored a connection without a valid handshake", rank);
        close(fd);
        continue;
      }
      uint32_t pr_ = mlxd_get32(h + 8), ps = mlxd_get32(h + 12), pc = mlxd_get32(h + 16),
               pk = mlxd_get32(h + 20);
      if (ps != (uint32_t)size || pk != (uint32_t)K || pr_ <= (uint32_t)rank ||
          pr_ >= (uint32_t)size || pc >= (uint32_t)K) {
        close(fd);
        free(pfds);
        mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                     "rank %u connected to rank %d as connection %u of %u in a group of %u, "
                     "but this rank expects %d connections per peer in a group of %d (are all "
                     "ranks using the same hostfile / settings?)",
                     pr_, rank, pc, pk, ps, K, size);
        goto fail;
      }
      int slot = (int)pr_ * K + (int)pc;
      if (fds[slot] >= 0) {
        mlxd_ring_log("rank %d: duplicate connection %u from rank %u ignored", rank, pc, pr_);
        close(fd);
        continue;
      }
      hello_encode(h, rank, size, (int)pc, K);
      if (io_all(fd, h, HELLO_BYTES, true, deadline) != 0) {
        mlxd_ring_log("rank %d: could not answer rank %u: %s", rank, pr_, strerror(errno));
        close(fd);
        continue;
      }
      fds[slot] = fd;
      expected--;
      mlxd_ring_log("rank %d: accepted connection %u from rank %u", rank, pc, pr_);
    }
  }
  free(pfds);

  /* 3. read the answers on the outgoing connections */
  for (int j = 0; j < rank; j++) {
    for (int c = 0; c < K; c++) {
      int fd = fds[j * K + c];
      const char* at = hosts->addrs[j * K + c].text;
      if (io_all(fd, h, HELLO_BYTES, false, deadline) != 0) {
        int e = errno;
        mlxd_fail_at(st, e == ETIMEDOUT ? MLXD_ETIMEDOUT : MLXD_EREMOTE, MLXD_LAYER_BOOTSTRAP,
                     "no handshake answer from rank %d", j);
        mlxd_status_set_peer(st, j, at);
        mlxd_status_set_sys(st, "recv", e);
        goto fail;
      }
      if (mlxd_get32(h) != HELLO_MAGIC || mlxd_get32(h + 4) != HELLO_VERSION ||
          mlxd_get32(h + 8) != (uint32_t)j || mlxd_get32(h + 16) != (uint32_t)c) {
        mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                     "the process listening at rank %d's address is not rank %d of this group "
                     "(handshake mismatch); check the hostfile",
                     j, j);
        mlxd_status_set_peer(st, j, at);
        goto fail;
      }
      mlxd_ring_log("rank %d: connection %d to rank %d at %s ready", rank, c, j, at);
    }
  }
  for (int i = 0; i < total; i++)
    if (fds[i] >= 0) set_nonblock(fds[i], false);
  return 0;
fail:
  mlxd_ring_close_all(fds, total);
  return st->code ? st->code : MLXD_ESYS;
}
