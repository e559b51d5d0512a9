/* The TCP transport's creation and destruction (the design is in tcp.c;
 * TLS set-up in tcp_tls.c). */
#include "transport/tcp.h"

#include "core/buffer.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "transport/spin.h"
#include "transport/tcp_impl.h"
#include "util/clock.h"
#include "util/tunables.h"
#include "util/ztable.h"

/* Free a message at destruction (its charge goes with the transport). */
static void imsg_drop(tcp_imsg* m) {
  if (m->owned) mlxd_buffer_free(m->u.buf, m->u.len);
  free(m);
}

/* Close the connections without losing what this rank sent last, and
 * without destroying what a peer still reads (issue 25, orderly exit).
 * Closing a socket with bytes not yet acknowledged loses them if the peer
 * answers with a reset (its heartbeat arriving after the close does), and
 * so does closing with unread data (the close itself is a reset): a rank
 * that finished first and closed made its peers fail with "Connection reset
 * by peer" while they still read what it sent. So: FIN first (shutdown
 * SHUT_WR: after every byte queued), then read and drop what arrives until
 * every byte sent and the FIN are acknowledged (TIOCOUTQ == 0), then close.
 * Once they are, the peer's kernel holds all of it, and a reset that
 * follows (this rank's close, or its answer to a late heartbeat) does not
 * take it back: Linux keeps the bytes a socket received readable, then
 * reports the end (tcp_reset purges only the write queue); the peer's
 * transport takes that reset for the close it is (tcp.c fail_io, a peer
 * with nothing in flight). So the close does not wait for the peers' own
 * FINs: a peer that goes on with other work (another group, its own
 * computation) before closing this one costs nothing, and a process that
 * frees several groups (split children) one after another does not add up
 * waits. Bounds: a slow link is waited for as long as its queue keeps
 * shrinking (until no queue has shrunk for MLXDIST_TIMEOUT, or
 * MLXDIST_OP_TIMEOUT in all, for a trickle). A failed transport has
 * written its abort record (tcp_live.c) and waits TCP_CLOSE_MS at most. The
 * wait sleeps in poll on the sockets still open. The chaos soak found the
 * queued-bytes case: a split child freed right after an all_sum through a
 * shaped link closed with 2 MB queued, and a peer's heartbeat reset it.
 * Meanwhile a lazy transport's dialer answers hellos with a refusal
 * (net/dialer.c: shutting down, or the failure). */
static bool drain_eof(int fd) {
  char b[4096];
  for (;;) {
    ssize_t k = recv(fd, b, sizeof b, MSG_DONTWAIT);
    if (k > 0) continue;
    if (k == 0) return true;
    if (errno == EINTR) continue;
    return errno != EAGAIN && errno != EWOULDBLOCK; /* an error: nothing more will come */
  }
}

static void close_all(tcp_transport* t, int nc) {
  int live = 0;
  for (int i = 0; i < nc; i++) {
    tcp_conn* c = mlxd_tcp_conn_at(t, i);
    if (c && c->fd >= 0) {
      shutdown(c->fd, SHUT_WR);
      live++;
    }
  }
  struct pollfd* pf = live ? calloc((size_t)live + 1, sizeof *pf) : NULL;
  bool* eof = calloc((size_t)nc + 1, sizeof *eof);
  double start = mlxd_now(), last_progress = start;
  double quiet = t->live.dead_s > TCP_CLOSE_MS * 1e-3 ? t->live.dead_s : TCP_CLOSE_MS * 1e-3;
  long queued_before = -1;
  for (int i = 0; eof && i < nc; i++) {
    tcp_conn* c = mlxd_tcp_conn_at(t, i);
    eof[i] = !c || c->fd < 0 || c->eof;
  }
  while (pf && eof) {
    int np = 0;
    long queued = 0;
    for (int i = 0; i < nc; i++) {
      tcp_conn* c = mlxd_tcp_conn_at(t, i);
      int fd = c ? c->fd : -1, outq = 0;
      if (fd < 0) continue;
      if (!eof[i]) eof[i] = drain_eof(fd);
      if (ioctl(fd, TIOCOUTQ, &outq) == 0 && outq > 0) {
        struct tcp_info ti;
        socklen_t len = sizeof ti;
        /* (a reset connection keeps counting its unsent bytes: nothing will go) */
        if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 && ti.tcpi_state != TCP_CLOSE)
          queued += outq;
      }
      if (!eof[i]) pf[np++] = (struct pollfd){fd, POLLIN, 0};
    }
    double now = mlxd_now(), waited = now - start;
    if (queued == 0) break; /* every peer's kernel holds what was sent to it */
    if (t->eng.err.code) {
      if (waited >= TCP_CLOSE_MS * 1e-3) break;
    } else {
      if (queued_before >= 0 && queued < queued_before) last_progress = now;
      queued_before = queued;
      if (now - last_progress >= quiet) break;
      if (waited >= t->live.op_s) break; /* a trickle, however long it lasts */
    }
    /* Sleep until a peer sends or closes (or a hello comes: the dialer);
     * poll sees no acknowledgements, so look again every few ms. */
    int dial = t->dial ? t->dial->ops->fd(t->dial) : -1;
    if (dial >= 0) pf[np++] = (struct pollfd){dial, POLLIN, 0};
    (void)poll(pf, (nfds_t)np, 2);
    if (t->dial) {
      mlxd_status ignore;
      mlxd_status_clear(&ignore);
      (void)t->dial->ops->step(t->dial, &ignore); /* refusals only: nothing is dialed */
    }
  }
  free(pf);
  free(eof);
  for (int i = 0; i < nc; i++) {
    tcp_conn* c = mlxd_tcp_conn_at(t, i);
    if (c && c->fd >= 0) {
      (void)drain_eof(c->fd);
      close(c->fd);
    }
  }
}

/* A transport whose create failed on connected sockets (a TLS handshake, a
 * socket option): nothing was sent on it that a peer must finish reading,
 * so its close takes a failed transport's short bound (TCP_CLOSE_MS), not
 * the orderly wait for acknowledgements, which a silent peer would stretch
 * to MLXDIST_TIMEOUT past the create's own bound. */
static void destroy_unborn(tcp_transport* t, const mlxd_status* st) {
  t->eng.err.code = st->code ? st->code : MLXD_ESYS;
  mlxd_tcp_destroy(&t->base);
}

void mlxd_tcp_forget(mlxd_transport* tt) {
  tcp_transport* t = (tcp_transport*)tt;
  if (t->dial) t->dial->ops->forget(t->dial);
  if (t->epfd >= 0) close(t->epfd);
  t->epfd = -1;
  for (int i = 0; t->conns && i < t->base.size * t->nconn; i++) {
    tcp_conn* c = mlxd_tcp_conn_at(t, i);
    if (c && c->fd >= 0) {
      close(c->fd);
      c->fd = -1;
    }
  }
  if (t->wake_fd >= 0) close(t->wake_fd);
  t->wake_fd = -1;
}

void mlxd_tcp_destroy(mlxd_transport* tt) {
  tcp_transport* t = (tcp_transport*)tt;
  if (!t) return;
  mlxd_tcp_live_stop(t); /* no heartbeat runs from here on */
  /* No new connection from here on: every op that could need one is over.
   * A hello that comes while the connections close is told so (a failed
   * transport's dialer keeps saying it failed). */
  if (t->dial) t->dial->ops->refuse(t->dial, t->eng.err.code ? &t->eng.err : NULL);
  int nc = t->base.size * t->nconn;
  for (int i = 0; i < nc && t->conns; i++) {
    tcp_conn* c = mlxd_tcp_conn_at(t, i);
    if (c) mlxd_tls_conn_free(c->ssl); /* close_notify */
  }
  if (t->conns) close_all(t, nc);
  if (t->dial) t->dial->ops->free(t->dial);
  t->dial = NULL;
  for (int i = 0; i < nc && t->conns; i++) {
    tcp_conn* c = mlxd_tcp_conn_at(t, i);
    if (c) {
      free(c->rbuf);
      free(c->wbuf);
    }
  }
  for (int p = 0; p < t->base.size && t->peers; p++) {
    /* a message arrives only over a connection: a peer never connected has
     * none (and its entry's page may never have been touched) */
    if (!t->conns || !t->conns[p]) continue;
    tcp_peer* pe = &t->peers[p];
    mlxd_match_link* l;
    while ((l = mlxd_match_pop(&pe->arriving))) {
      tcp_imsg* m = MLXD_MATCH_ENTRY(l, tcp_imsg, arr);
      if (!m->req && !m->discard) mlxd_match_remove(&pe->ep.mq.unexpected, &m->u.link);
      imsg_drop(m);
    }
    while ((l = mlxd_match_pop(&pe->ep.mq.unexpected)))
      imsg_drop(MLXD_MATCH_ENTRY(l, tcp_imsg, u.link));
  }
  mlxd_eng_req_drain(&t->eng);
  mlxd_tcp_pool_drain(&t->imsg_pool, sizeof(tcp_imsg));
  if (t->wake_fd >= 0) close(t->wake_fd);
  if (t->epfd >= 0) close(t->epfd);
  mlxd_tls_free(t->tls);
  pthread_mutex_destroy(&t->mu);
  pthread_cond_destroy(&t->cv);
  for (int p = 0; p < t->base.size && t->conns; p++) free(t->conns[p]);
  mlxd_ztable_free(t->conns, (size_t)t->base.size, sizeof *t->conns);
  mlxd_ztable_free(t->peers, (size_t)t->base.size, sizeof *t->peers);
  free(t->evs);
  free(t);
}

/* "10.0.0.2:41000" / "[fe80::1]:41000" for a connected inet socket; ""
 * otherwise (a socketpair, or getpeername failing). */
static void sock_peer_addr(int fd, char* out, size_t n) {
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

/* Set up connection c (fd connected and handshaken): non-blocking, no
 * Nagle, big send buffer, its receive buffer, in the epoll set. 0, or a
 * status (the caller fails or gives up). */
static int conn_attach(tcp_transport* t, tcp_conn* c, int fd, mlxd_status* st) {
  c->fd = fd;
  c->rbuf = malloc(TCP_RBUF);
  if (!c->rbuf)
    return mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_TCP,
                        "out of memory for the connection to rank %d", c->peer);
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
    int e = errno;
    mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_TCP,
                 "cannot make the connection to rank %d non-blocking", c->peer);
    mlxd_status_set_peer(st, c->peer, t->peers[c->peer].addr);
    mlxd_status_set_sys(st, "fcntl", e);
    return st->code;
  }
  /* Best effort: TCP_NODELAY fails harmlessly on a non-TCP socket, and the
   * buffer sizes are only raised, never lowered (setting them after the
   * connection is up also disables the kernel's auto-tuning, so the
   * connecting side should set them before connect/listen). */
  int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  /* The kernel's retransmission back-off at most MLXDIST_TIMEOUT / 6 (1 s to
   * 120 s; Linux 6.15, older kernels refuse it and keep 120 s). Heartbeats
   * share the byte stream with the data, so after a link comes back the
   * peer hears nothing until the kernel's next retransmission, which the
   * default back-off (200 ms doubled at each loss) puts up to twice the
   * outage later: a 7 s drop kept a link silent 12.6 s, past
   * MLXDIST_TIMEOUT=10 (tests/chaos/link_drop.sh). The kernel then gives up
   * on bytes unacknowledged for about twice MLXDIST_TIMEOUT or more
   * (tcp_retries2 counts capped retransmissions: 14 s at the 1 s cap, 113 s
   * at the default's 10 s; it was 15 minutes), a peer that the liveness
   * checks take for dead after one MLXDIST_TIMEOUT. No
   * TCP_USER_TIMEOUT: it would also end a connection whose peer keeps its
   * window closed (busy, reading nothing), which answered zero-window
   * probes keep open for ever. */
  double cap_s = t->live.dead_s / 6;
  int rto_max = cap_s <= 1.0 ? 1000 : cap_s >= 120.0 ? 120000 : (int)(cap_s * 1000);
  (void)setsockopt(fd, IPPROTO_TCP, TCP_RTO_MAX_MS, &rto_max, sizeof rto_max);
  int cur = 0;
  socklen_t cl = sizeof cur;
  if (getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &cur, &cl) == 0 && cur < TCP_SOCKBUF) {
    int want = TCP_SOCKBUF;
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &want, sizeof want);
  }
  struct epoll_event ev;
  memset(&ev, 0, sizeof ev);
  c->ep_out = c->qhead != NULL;
  ev.events = EPOLLIN | (c->ep_out ? EPOLLOUT : 0);
  ev.data.ptr = c;
  if (epoll_ctl(t->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
    int e = errno;
    mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_TCP, "cannot watch the connection to rank %d", c->peer);
    mlxd_status_set_sys(st, "epoll_ctl", e);
    return st->code;
  }
  tcp_peer* pe = &t->peers[c->peer];
  if (!pe->addr[0]) sock_peer_addr(fd, pe->addr, sizeof pe->addr);
  pe->nup++;
  pe->heard = mlxd_now();
  t->nconnected++;
  return 0;
}

tcp_conn* mlxd_tcp_peer_conns(tcp_transport* t, int peer, mlxd_status* st) {
  if (t->conns[peer]) return t->conns[peer];
  tcp_conn* a = calloc((size_t)t->nconn, sizeof *a);
  if (!a) {
    mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_TCP,
                 "out of memory setting up the connections to rank %d", peer);
    mlxd_status_set_peer(st, peer, t->peers[peer].addr);
    return NULL;
  }
  for (int c = 0; c < t->nconn; c++) {
    a[c].fd = -1;
    a[c].peer = peer;
  }
  t->conns[peer] = a;
  return a;
}

/* The dialer made connection conn to peer (mu held, inside want or step). */
static void conn_ready(void* ctx, int peer, int conn, int fd) {
  tcp_transport* t = ctx;
  mlxd_status s;
  mlxd_status_clear(&s);
  tcp_conn* a = t->eng.err.code ? NULL : mlxd_tcp_peer_conns(t, peer, &s);
  tcp_conn* c = a ? &a[conn] : NULL;
  if (!c || c->fd >= 0 || t->eng.err.code) { /* cannot happen (one per slot), or too late */
    close(fd);
    if (s.code) mlxd_tcp_fail(t, &s);
    return;
  }
  if (conn_attach(t, c, fd, &s) != 0 || (t->tls && mlxd_tcp_tls_begin(t, c, &s) != 0)) {
    mlxd_tcp_fail(t, &s);
    return;
  }
  if (c->qhead) { /* what isend queued while it connected */
    int err = mlxd_tcp_conn_write(t, c);
    if (err) mlxd_tcp_fail_lost(t, peer, "sendmsg", err);
  }
  mlxd_tcp_wake(t);
}

/* The transport without connections. NULL with st set. */
mlxd_spin_rule mlxd_tcp_set_local_ranks(mlxd_transport* tt, int local_ranks) {
  tcp_transport* t = (tcp_transport*)tt;
  mlxd_spin_rule spin = mlxd_spin_rule_for(local_ranks);
  pthread_mutex_lock(&t->mu);
  t->eng.spin_s = spin.spin_s;
  t->eng.yield = spin.yield;
  pthread_mutex_unlock(&t->mu);
  return spin;
}

static tcp_transport* tcp_alloc(int rank, int size, int nconn, mlxd_status* st) {
  tcp_transport* t = calloc(1, sizeof *t);
  if (!t) {
    mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_TCP, "out of memory creating the TCP transport");
    return NULL;
  }
  int nc = size * nconn;
  t->base.ops = &mlxd_tcp_ops;
  t->base.rank = rank;
  t->base.size = size;
  t->nconn = nconn;
  mlxd_tcp_engine_init(t);
  t->wake_fd = -1;
  t->epfd = -1;
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->cv, NULL);
  /* Both sized by the group but written only for the peers used (ztable.h):
   * a peer's entry is zero until then (heard 0: liveness counts from the
   * wait's start, tcp_live.c). */
  t->conns = mlxd_ztable_new((size_t)size, sizeof *t->conns); /* each on first use */
  t->peers = mlxd_ztable_new((size_t)size, sizeof *t->peers);
  t->nevs = nc + 2 < 256 ? nc + 2 : 256;
  t->evs = calloc((size_t)t->nevs, sizeof *t->evs);
  if (!t->conns || !t->peers || !t->evs) {
    mlxd_tcp_destroy(&t->base);
    mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_TCP, "out of memory creating the TCP transport");
    return NULL;
  }
  t->epfd = epoll_create1(EPOLL_CLOEXEC);
  t->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  struct epoll_event ev;
  memset(&ev, 0, sizeof ev);
  ev.events = EPOLLIN;
  ev.data.ptr = NULL;
  if (t->epfd < 0 || t->wake_fd < 0 || epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->wake_fd, &ev) != 0) {
    int e = errno;
    mlxd_tcp_destroy(&t->base);
    mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_TCP,
                 "cannot create the TCP transport's event set (epoll, eventfd)");
    mlxd_status_set_sys(st, "epoll_create1", e);
    return NULL;
  }
  mlxd_live_cfg_load(&t->live);
  mlxd_tcp_set_local_ranks(&t->base, size); /* until the ring knows the hosts */
  long ux_mb = mlxd_tunable_long(MLXD_T_TCP_UNEXPECTED_MB);
  if (ux_mb <= 0 || ux_mb > (1L << 28)) ux_mb = 4096; /* the validation of tunables names it */
  t->ux_budget = (uint64_t)ux_mb << 20;
  return t;
}

static bool shape_ok(int rank, int size, int nconn, mlxd_status* st) {
  if (size >= 1 && rank >= 0 && rank < size && nconn >= 1 && nconn <= 64) return true;
  mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_TCP,
               "cannot build a TCP transport for rank %d of %d with %d connection(s) per "
               "peer: expected 0 <= rank < size and 1 <= connections <= 64",
               rank, size, nconn);
  return false;
}

mlxd_transport* mlxd_tcp_transport_lazy(int rank, int size, int nconn, mlxd_tcp_dialer* d,
                                        mlxd_status* st) {
  bool tls = false;
  if (!shape_ok(rank, size, nconn, st) || mlxd_tls_wanted(&tls, st) != 0) {
    if (d) d->ops->free(d);
    return NULL;
  }
  tcp_transport* t = tcp_alloc(rank, size, nconn, st);
  if (!t) {
    d->ops->free(d);
    return NULL;
  }
  if (tls && !(t->tls = mlxd_tls_new(st))) { /* each connection's handshake: tcp_tls.c */
    d->ops->free(d);
    mlxd_tcp_destroy(&t->base);
    return NULL;
  }
  t->dial = d;
  d->ready = conn_ready;
  d->ready_ctx = t;
  if (mlxd_tcp_dial_attach(t) != 0) {
    int e = errno;
    mlxd_tcp_destroy(&t->base);
    mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_TCP, "cannot watch the listening sockets");
    mlxd_status_set_sys(st, "epoll_ctl", e);
    return NULL;
  }
  mlxd_tcp_live_start(t);
  return &t->base;
}

int mlxd_tcp_connections(mlxd_transport* tt, unsigned char* peers) {
  if (!tt || tt->ops != &mlxd_tcp_ops) return -1;
  tcp_transport* t = (tcp_transport*)tt;
  pthread_mutex_lock(&t->mu);
  int n = 0;
  for (int i = 0; i < t->base.size * t->nconn; i++) {
    tcp_conn* c = mlxd_tcp_conn_at(t, i);
    if (!c || c->fd < 0) continue;
    n++;
    if (peers) peers[c->peer] = 1;
  }
  pthread_mutex_unlock(&t->mu);
  return n;
}

mlxd_transport* mlxd_tcp_transport_new(int rank, int size, const int* fds, int nconn,
                                       mlxd_status* st) {
  if (!shape_ok(rank, size, nconn, st) || !fds) {
    if (fds && size > 0 && nconn > 0 && size <= (1 << 20) && nconn <= (1 << 10))
      close_fds(fds, size * nconn);
    if (!fds) shape_ok(-1, size, nconn, st);
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
  tcp_transport* t = tcp_alloc(rank, size, nconn, st);
  if (!t) {
    close_fds(fds, nc);
    return NULL;
  }
  for (int i = 0; i < nc; i++)
    if (i / nconn == rank && fds[i] >= 0) close(fds[i]);
  for (int i = 0; i < nc; i++) {
    if (i / nconn == rank) continue;
    tcp_conn* a = mlxd_tcp_peer_conns(t, i / nconn, st); /* eager: every peer's */
    tcp_conn* c = a ? &a[i % nconn] : NULL;
    if (!c || conn_attach(t, c, fds[i], st) != 0) {
      if (!c) close(fds[i]);
      for (int k = i + 1; k < nc; k++)
        if (k / nconn != rank) close(fds[k]);
      destroy_unborn(t, st);
      return NULL;
    }
  }
  bool tls = false;
  if (mlxd_tls_wanted(&tls, st) != 0 || (tls && mlxd_tcp_tls_start(t, st) != 0)) {
    destroy_unborn(t, st);
    return NULL;
  }
  mlxd_tcp_live_start(t); /* heard: set by conn_attach for every peer */
  return &t->base;
}
