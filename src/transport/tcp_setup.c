/* The TCP transport's creation and destruction (the design is in tcp.c;
 * TLS set-up in tcp_tls.c). */
#include "transport/tcp.h"

#include "core/buffer.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "transport/tcp_impl.h"
#include "util/clock.h"
#include "util/tunables.h"

/* Free a message at destruction (its charge goes with the transport). */
static void imsg_drop(tcp_imsg* m) {
  if (m->owned) mlxd_buffer_free(m->buf, m->total);
  free(m);
}

/* Read and drop whatever fd has to give (non-blocking). */
static void drain(int fd) {
  char b[4096];
  while (recv(fd, b, sizeof b, MSG_DONTWAIT) > 0) {
  }
}

/* Close the connections without losing what this rank sent last. A peer's
 * heartbeats may wait unread here, and closing a socket with unread data
 * resets it (RST), which drops the bytes the peer has not read yet; so does
 * a heartbeat that arrives after the close while bytes are still queued. So:
 * FIN first, read and drop what arrived, wait until the peers have
 * acknowledged every byte sent (TIOCOUTQ == 0), reading meanwhile, read once
 * more, close. A slow link (a 4 MiB message through 5 Mbit/s takes 7 s) is
 * waited for as long as its queue keeps shrinking: the wait ends when no
 * queue has shrunk for MLXDIST_TIMEOUT (the peer is taken for dead, as in
 * any wait) and at least TCP_CLOSE_MS have passed, or, for a peer that
 * keeps taking a trickle, after MLXDIST_OP_TIMEOUT in all. A reset after that loses
 * nothing (a peer that reads nothing for that long may still lose bytes, if
 * one of its heartbeats lands between the last read and the close). The
 * chaos soak found it: a split child freed right after an all_sum through a
 * shaped link closed with 2 MB queued, and a peer's heartbeat reset it. */
/* Whether the peer has closed its side of fd (its FIN arrived), or fd is
 * not TCP (an AF_UNIX pair: nothing to wait for). */
static bool peer_closed(int fd) {
  struct tcp_info ti;
  socklen_t len = sizeof ti;
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return true;
  return ti.tcpi_state == TCP_TIME_WAIT || ti.tcpi_state == TCP_CLOSE ||
         ti.tcpi_state == TCP_CLOSE_WAIT || ti.tcpi_state == TCP_LAST_ACK ||
         ti.tcpi_state == TCP_CLOSING;
}

static void close_all(tcp_transport* t, int nc) {
  for (int i = 0; i < nc; i++)
    if (t->conns[i].fd >= 0) shutdown(t->conns[i].fd, SHUT_WR);
  /* A healthy transport waits until its last bytes are acknowledged. A
   * failed one has written its abort record (tcp_live.c): closing while a
   * peer still sends (e.g. the rest of a large message) would reset the
   * connection and drop that record before the peer reads it, so it reads
   * and drops until each peer has closed too, for at most TCP_CLOSE_MS. */
  double start = mlxd_now(), last_progress = start;
  long queued_before = -1;
  for (;;) {
    bool pending = false, slow = false; /* slow: TCP bytes still going out */
    long queued = 0;
    for (int i = 0; i < nc; i++) {
      int fd = t->conns[i].fd, outq = 0;
      if (fd < 0) continue;
      drain(fd);
      if (t->err.code) {
        pending |= !peer_closed(fd);
        continue;
      }
      if (ioctl(fd, TIOCOUTQ, &outq) != 0 || outq <= 0) continue;
      struct tcp_info ti;
      socklen_t len = sizeof ti;
      if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) {
        pending = true; /* not TCP (an AF_UNIX pair): TCP_CLOSE_MS at most */
      } else if (ti.tcpi_state != TCP_CLOSE) {
        /* (a reset connection keeps counting its unsent bytes: nothing will go) */
        pending = slow = true;
        queued += outq;
      }
    }
    double now = mlxd_now(), waited = now - start;
    if (!pending) break;
    if (!slow) {
      if (waited >= TCP_CLOSE_MS * 1e-3) break;
    } else {
      /* healthy, over TCP: as long as the bytes queued keep going out */
      if (queued_before >= 0 && queued < queued_before) last_progress = now;
      queued_before = queued;
      double quiet = t->live.dead_s > TCP_CLOSE_MS * 1e-3 ? t->live.dead_s : TCP_CLOSE_MS * 1e-3;
      if (now - last_progress >= quiet) break;
      if (waited >= t->live.op_s) break; /* a trickle, however long it lasts: MLXDIST_OP_TIMEOUT */
    }
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
  }
  for (int i = 0; i < nc; i++)
    if (t->conns[i].fd >= 0) {
      drain(t->conns[i].fd);
      close(t->conns[i].fd);
    }
}

void mlxd_tcp_forget(mlxd_transport* tt) {
  tcp_transport* t = (tcp_transport*)tt;
  for (int i = 0; t->conns && i < t->base.size * t->nconn; i++)
    if (t->conns[i].fd >= 0) {
      close(t->conns[i].fd);
      t->conns[i].fd = -1;
    }
  if (t->wake_fd >= 0) close(t->wake_fd);
  t->wake_fd = -1;
}

void mlxd_tcp_destroy(mlxd_transport* tt) {
  tcp_transport* t = (tcp_transport*)tt;
  if (!t) return;
  mlxd_tcp_live_stop(t); /* no heartbeat runs from here on */
  int nc = t->base.size * t->nconn;
  for (int i = 0; i < nc && t->conns; i++) mlxd_tls_conn_free(t->conns[i].ssl); /* close_notify */
  if (t->conns) close_all(t, nc);
  for (int i = 0; i < nc && t->conns; i++) {
    free(t->conns[i].rbuf);
    free(t->conns[i].wbuf);
  }
  for (int p = 0; p < t->base.size && t->peers; p++) {
    tcp_peer* pe = &t->peers[p];
    mlxd_match_link* l;
    while ((l = mlxd_match_pop(&pe->arriving))) {
      tcp_imsg* m = MLXD_MATCH_ENTRY(l, tcp_imsg, arr);
      if (!m->req && !m->discard) mlxd_match_remove(&pe->mq.unexpected, &m->ux);
      imsg_drop(m);
    }
    while ((l = mlxd_match_pop(&pe->mq.unexpected))) imsg_drop(MLXD_MATCH_ENTRY(l, tcp_imsg, ux));
  }
  if (t->wake_fd >= 0) close(t->wake_fd);
  mlxd_tls_free(t->tls);
  pthread_mutex_destroy(&t->mu);
  pthread_cond_destroy(&t->cv);
  free(t->conns);
  free(t->peers);
  free(t->pfds);
  free(t->pconn);
  free(t);
}

/* "10.0.0.2:41000" / "[fe80::1]:41000" for a connected inet socket; ""
 * otherwise (a socketpair, or getpeername failing). */
static void peer_addr(int fd, char* out, size_t n) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  char ip[INET6_ADDRSTRLEN];
  out[0] = '\0';
  if (getpeername(fd, (struct sockaddr*)&ss, &len) != 0) return;
  if (ss.ss_family == AF_INET) {
    const struct sockaddr_in* a = (const struct sockaddr_in*)&ss;
    if (inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip))
      snprintf(out, n, "%s:%u", ip, (unsigned)ntohs(a->sin_port));
  } else if (ss.ss_family == AF_INET6) {
    const struct sockaddr_in6* a = (const struct sockaddr_in6*)&ss;
    if (inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip))
      snprintf(out, n, "[%s]:%u", ip, (unsigned)ntohs(a->sin6_port));
  }
}

static void close_fds(const int* fds, int count) {
  for (int i = 0; i < count; i++)
    if (fds[i] >= 0) close(fds[i]);
}

mlxd_transport* mlxd_tcp_transport_new(int rank, int size, const int* fds, int nconn,
                                       mlxd_status* st) {
  if (size < 1 || rank < 0 || rank >= size || nconn < 1 || nconn > 64 || !fds) {
    if (fds && size > 0 && nconn > 0 && size <= (1 << 20) && nconn <= (1 << 10))
      close_fds(fds, size * nconn);
    mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_TCP,
                 "cannot build a TCP transport for rank %d of %d with %d connection(s) per "
                 "peer: expected 0 <= rank < size and 1 <= connections <= 64",
                 rank, size, nconn);
    return NULL;
  }
  int nc = size * nconn;
  for (int p = 0; p < size; p++) {
    for (int c = 0; c < nconn; c++) {
      int fd = fds[p * nconn + c];
      int type = 0;
      socklen_t tl = sizeof type;
      if (p != rank &&
          (fd < 0 || getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_STREAM)) {
        close_fds(fds, nc);
        mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_TCP,
                     "connection %d to rank %d (fd %d) is not a connected stream socket", c, p, fd);
        mlxd_status_set_peer(st, p, NULL);
        return NULL;
      }
    }
  }
  tcp_transport* t = calloc(1, sizeof *t);
  if (!t) {
    close_fds(fds, nc);
    mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_TCP, "out of memory creating the TCP transport");
    return NULL;
  }
  t->base.ops = &mlxd_tcp_ops;
  t->base.rank = rank;
  t->base.size = size;
  t->nconn = nconn;
  t->wake_fd = -1;
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->cv, NULL);
  t->conns = calloc((size_t)nc, sizeof *t->conns);
  t->peers = calloc((size_t)size, sizeof *t->peers);
  t->pfds = calloc((size_t)nc + 1, sizeof *t->pfds);
  t->pconn = calloc((size_t)nc + 1, sizeof *t->pconn);
  bool ok = t->conns && t->peers && t->pfds && t->pconn;
  for (int i = 0; i < nc && t->conns; i++) t->conns[i].fd = -1;
  if (!ok) {
    close_fds(fds, nc);
    mlxd_tcp_destroy(&t->base);
    mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_TCP, "out of memory creating the TCP transport");
    return NULL;
  }
  for (int i = 0; i < nc; i++) {
    tcp_conn* c = &t->conns[i];
    c->peer = i / nconn;
    c->fd = c->peer == rank ? -1 : fds[i];
    if (c->peer == rank && fds[i] >= 0) close(fds[i]);
  }
  for (int p = 0; p < size; p++)
    if (p != rank) peer_addr(t->conns[p * nconn].fd, t->peers[p].addr, sizeof t->peers[p].addr);
  for (int i = 0; i < nc; i++) {
    tcp_conn* c = &t->conns[i];
    if (c->fd < 0) continue;
    c->rbuf = malloc(TCP_RBUF);
    if (!c->rbuf) {
      mlxd_tcp_destroy(&t->base);
      mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_TCP, "out of memory creating the TCP transport");
      return NULL;
    }
    int fl = fcntl(c->fd, F_GETFL);
    if (fl < 0 || fcntl(c->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
      int e = errno;
      mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_TCP,
                   "cannot make the connection to rank %d non-blocking", c->peer);
      mlxd_status_set_peer(st, c->peer, t->peers[c->peer].addr);
      mlxd_status_set_sys(st, "fcntl", e);
      mlxd_tcp_destroy(&t->base);
      return NULL;
    }
    /* Best effort: TCP_NODELAY fails harmlessly on a non-TCP socket, and the
     * buffer sizes are only raised, never lowered (setting them after the
     * connection is up also disables the kernel's auto-tuning, so the
     * connecting side should set them before connect/listen). */
    int one = 1;
    (void)setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int cur = 0;
    socklen_t cl = sizeof cur;
    if (getsockopt(c->fd, SOL_SOCKET, SO_SNDBUF, &cur, &cl) == 0 && cur < TCP_SOCKBUF) {
      int want = TCP_SOCKBUF;
      (void)setsockopt(c->fd, SOL_SOCKET, SO_SNDBUF, &want, sizeof want);
    }
  }
  t->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (t->wake_fd < 0) {
    int e = errno;
    mlxd_tcp_destroy(&t->base);
    mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_TCP, "cannot create an eventfd for the TCP transport");
    mlxd_status_set_sys(st, "eventfd", e);
    return NULL;
  }
  mlxd_live_cfg_load(&t->live);
  double spin = mlxd_tunable_double(MLXD_T_SPIN_US);
  t->spin_s = spin > 0 ? spin * 1e-6 : 0;
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  t->yield_spin = ncpu > 0 && size > ncpu;
  long ux_mb = mlxd_tunable_long(MLXD_T_TCP_UNEXPECTED_MB);
  if (ux_mb <= 0 || ux_mb > (1L << 28)) ux_mb = 4096; /* the validation of tunables names it */
  t->ux_budget = (uint64_t)ux_mb << 20;
  bool tls = false;
  if (mlxd_tls_wanted(&tls, st) != 0 || (tls && mlxd_tcp_tls_start(t, st) != 0)) {
    mlxd_tcp_destroy(&t->base);
    return NULL;
  }
  double now = mlxd_now();
  for (int p = 0; p < size; p++) t->peers[p].heard = now;
  mlxd_tcp_live_start(t);
  return &t->base;
}
