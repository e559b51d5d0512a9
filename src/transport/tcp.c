/* The TCP transport: tag-matched messages over connected stream sockets.
 *
 * Wire format. Every message is sent as one or more fragments; each
 * fragment is a header (tcp_wire.h: tag, offset, length, total, the
 * sender's call signature) followed by `length` payload bytes that belong
 * at `offset` of the `total`-byte message. Small messages are one fragment
 * on one connection (connections to a peer are used round-robin). Larger ones are cut into
 * fragments of at most TCP_FRAG_MAX bytes spread round-robin over all
 * connections to the peer, so K connections carry K streams in parallel.
 * The receiver matches a fragment to a message by (peer, tag): tags must be
 * unique among the messages in flight from one peer to another (the
 * algorithms and the front-end guarantee this with sequence numbers).
 *
 * Matching (the engine's, engine.h; tcp_recv.c). A receive that is posted
 * before its message arrives gets the payload written straight into its
 * buffer. A message that arrives first is buffered (mlxd_buffer_alloc) and
 * copied when its receive is posted, so two ranks that both send before
 * receiving never deadlock; several messages from one peer may be arriving
 * at once (one per connection), each bound to its receive in its own entry
 * (tcp_imsg). Signatures must agree (the message's with its receive's, or
 * with any receive or message of the same operation when the tags differ);
 * a disagreement fails the transport. Sizes of unsigned messages must
 * agree: a mismatch fails that receive only (the bytes are drained and
 * dropped).
 *
 * Progress. There is no background thread; the threads inside waitall
 * drive the sockets through the message engine's wait (engine.h), which
 * spins for MLXDIST_SPIN_US after the last event, checks liveness every
 * MLXD_TCP_CHECK_S without one, and sleeps in between. One thread at a time
 * (the "progressor", t->progressing) polls every socket: zero-timeout
 * epoll_waits while spinning (up to TCP_SPIN_BATCH per lock round, until an
 * event or another thread's completion), a blocking one as its sleep. The
 * others' passes return at once and they sleep on a condition variable
 * (with a timeout), re-checking their requests whenever something
 * completes; the progressor that leaves wakes them, so one takes over.
 * isend writes eagerly from the caller's thread and wakes a blocked
 * progressor through an eventfd when it leaves data queued. All state is
 * protected by one mutex, which the progressor drops only while it sits in
 * epoll_wait. The op clock of a wait moves with its requests' bytes, not
 * with every event (a heartbeat is one).
 *
 * Allocation. Requests of one fragment (every receive; a send of up to
 * TCP_SPLIT_MIN bytes, or TCP_FRAG_MAX over one connection per peer) come
 * from the engine's free list, the entries of incoming messages from the
 * transport's (tcp_impl.h), so a small message allocates nothing once the
 * transport has warmed up.
 *
 * Failure. A peer that closes or resets its connection, a corrupt header,
 * a peer silent for MLXDIST_TIMEOUT or a wait without progress for
 * MLXDIST_OP_TIMEOUT (tcp_live.c: liveness apart from progress) fails the
 * whole transport: every pending and later operation fails with the first
 * error's message, the peers get an abort frame with it (tcp_live.c), and
 * the sockets are shut down so the other ranks learn about it at once
 * instead of waiting for their own timeout. Messages that
 * had fully arrived before the failure can still be received.
 *
 * Sizes. Every length is a size_t and every socket call is capped at
 * TCP_IO_MAX bytes and looped, so messages above 2 GiB (where a single
 * send/recv would be truncated by the kernel) are moved in pieces.
 *
 * Hostile headers. Every header is checked before the receiver acts on it
 * (tcp_wire.h: lengths against the message, the posted receive, and a
 * per-peer budget for messages that arrive before their receive), so a
 * peer cannot make a rank allocate more than the posted receives need plus
 * MLXDIST_TCP_UNEXPECTED_MB.
 *
 * TLS (MLXDIST_TLS=1, tcp_tls.c): the same design; the socket calls go
 * through OpenSSL instead (every SSL object only under the mutex). */
#include "transport/tcp.h"

#include "core/buffer.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "transport/tcp_impl.h"
#include "util/clock.h"

/* ---------------------------------------------------------------- helpers */

/* Whether m waits in the unexpected queue (no receive, not dropped). */
static bool imsg_unexpected(const tcp_imsg* m) { return !m->req && !m->discard; }

static void fail_posted(void* ctx, mlxd_match_link* l) {
  tcp_transport* t = ctx;
  mlxd_tcp_req_fail(t, MLXD_MATCH_ENTRY(l, tcp_req, q.link), t->eng.err.code);
}

/* Fail the whole transport with *st (the first failure wins): the engine's
 * fail op. Called with mu held. */
static void tcp_fail(tcp_transport* t, const mlxd_status* st) {
  if (!mlxd_match_fail_first(&t->eng.err, st)) return;
  int code = t->eng.err.code;
  /* A peer's first contact from now on is answered with this failure
   * (net/mesh_connect.c: a refusal), not left to its MLXDIST_CONNECT_TIMEOUT. */
  if (t->dial) t->dial->ops->refuse(t->dial, &t->eng.err);
  /* The first failure is told to every peer, a relayed one too (keeping
   * its reporter, as shm's published record does): a rank that heard of a
   * death from a shm neighbour and shuts its sockets must not leave its TCP
   * peers with a bare "closed the connection" (the chaos soak's attribution
   * check). One record per connection at most: only the first failure. */
  mlxd_tcp_relay_prepare(t);
  int n = t->base.size;
  for (int p = 0; p < n; p++) {
    tcp_peer* pe = &t->peers[p];
    mlxd_match_fail_posted(&pe->ep.mq, fail_posted, t);
    /* Drop the messages still arriving; keep those that fully arrived and
     * wait for their receive. */
    mlxd_match_link* l;
    while ((l = mlxd_match_pop(&pe->arriving))) {
      tcp_imsg* m = MLXD_MATCH_ENTRY(l, tcp_imsg, arr);
      if (m->req) {
        m->req->im = NULL;
        mlxd_tcp_req_fail(t, m->req, code);
      } else if (imsg_unexpected(m)) {
        mlxd_match_remove(&pe->ep.mq.unexpected, &m->u.link);
      }
      mlxd_tcp_imsg_free(t, m);
    }
  }
  for (int i = 0; i < n * t->nconn; i++) {
    tcp_conn* c = mlxd_tcp_conn_at(t, i);
    if (!c) continue; /* never used: nothing queued, no socket */
    for (tcp_frag* f = c->qhead; f; f = f->next)
      if (f->req) mlxd_tcp_req_fail(t, f->req, code);
    if (i % t->nconn == 0) mlxd_tcp_relay_conn(t, c);
    c->qhead = c->qtail = NULL;
    c->cur = NULL;
    c->in_payload = false;
    c->wpos = c->wlen = 0;
    mlxd_tcp_conn_arm(t, c);
    /* FIN after the abort record. Not SHUT_RD: data a peer still sends to
     * a socket shut for reading is answered with a reset, which would drop
     * the record before the peer reads it (destroy drains instead). */
    if (c->fd >= 0) shutdown(c->fd, SHUT_WR);
  }
  mlxd_tcp_completed(t);
}

/* Fail the transport: the connection to peer is gone (syscall/err: the
 * call that found out; NULL/0 for an orderly close by the peer). */
static void fail_lost(tcp_transport* t, int peer, const char* syscall, int err) {
  /* The peer may have said why before it went (an abort frame, tcp_live.c;
   * sent before its sockets closed): read what it sent first. */
  for (int i = 0; i < t->nconn && !t->eng.err.code; i++) {
    tcp_conn* c = mlxd_tcp_conn_at(t, peer * t->nconn + i);
    if (c && c->fd >= 0 && !c->eof) (void)mlxd_tcp_conn_read(t, c);
  }
  if (t->eng.err.code) return;
  mlxd_status s;
  mlxd_match_lost(&s, MLXD_LAYER_TCP, peer, t->peers[peer].addr,
                  syscall ? "" : ": it closed the connection", syscall, err);
  tcp_fail(t, &s);
}

static void conn_eof(tcp_transport* t, tcp_conn* c);

/* Whether data (not a control frame) is in flight with peer p. */
static bool peer_has_data(tcp_transport* t, int p) {
  tcp_peer* pe = &t->peers[p];
  if (pe->ep.mq.posted.head || pe->arriving.head) return true;
  for (int c = 0; c < t->nconn && t->conns[p]; c++)
    for (tcp_frag* f = t->conns[p][c].qhead; f; f = f->next)
      if (f->req) return true;
  return false;
}

/* Fail the transport: a socket call on c failed with err (an errno from
 * syscall; -2 or EPROTO over TLS: c->tls_why says why). A reset by a peer
 * with nothing in flight is its close: a rank that finished and closed
 * while one of our heartbeats was on the way answers it with a reset; only
 * operations that (later) involve it fail, as after an orderly close. */
static void fail_io(tcp_transport* t, tcp_conn* c, const char* syscall, int err) {
  if ((err == ECONNRESET || err == EPIPE) && !c->ssl && !c->in_payload &&
      !peer_has_data(t, c->peer)) {
    c->qhead = c->qtail = NULL; /* heartbeats only */
    conn_eof(t, c);
    return;
  }
  if (!c->ssl || (err != -2 && err != EPROTO)) {
    fail_lost(t, c->peer, syscall, err);
    return;
  }
  mlxd_status s;
  mlxd_fail_at(&s, MLXD_EREMOTE, MLXD_LAYER_TCP, "TLS error on the connection to rank %d: %s",
               c->peer, c->tls_why);
  mlxd_status_set_peer(&s, c->peer, t->peers[c->peer].addr);
  tcp_fail(t, &s);
}

/* Connection c reached EOF. A peer that closes all its connections after
 * finishing its work is a normal shutdown: only operations still (or
 * later) involving it fail. One that closes in the middle of a message or
 * with operations pending fails the transport. Heartbeats still queued to
 * it (a write that met its close) are not operations: they are dropped. */
static void conn_eof(tcp_transport* t, tcp_conn* c) {
  if (c->in_payload) {
    fail_lost(t, c->peer, NULL, 0);
    return;
  }
  c->eof = true;
  if (t->epfd >= 0) (void)epoll_ctl(t->epfd, EPOLL_CTL_DEL, c->fd, NULL); /* readable for ever */
  for (int i = 0; i < t->nconn; i++)
    if (!t->conns[c->peer][i].eof) return; /* (c is one of them: they exist) */
  if (peer_has_data(t, c->peer)) {
    fail_lost(t, c->peer, NULL, 0);
    return;
  }
  for (int i = 0; i < t->nconn; i++) {
    tcp_conn* q = &t->conns[c->peer][i];
    q->qhead = q->qtail = NULL; /* control frames only */
  }
  t->peers[c->peer].closed = true;
}

static void tcp_wake(tcp_transport* t) {
  if (t->in_poll) {
    uint64_t one = 1;
    ssize_t w = write(t->wake_fd, &one, sizeof one);
    (void)w; /* a full counter already means "wake up" */
  }
}

/* ------------------------------------------------------------ send side */

void mlxd_tcp_conn_advance(tcp_transport* t, tcp_conn* c, size_t w) {
  size_t left = w;
  while (left > 0 && c->qhead) {
    tcp_frag* f = c->qhead;
    size_t need = TCP_HDR + f->len - f->sent;
    size_t take = left < need ? left : need;
    f->sent += take;
    if (f->req) f->req->done += take;
    left -= take;
    if (f->sent == TCP_HDR + f->len) {
      c->qhead = f->next;
      if (!c->qhead) c->qtail = NULL;
      if (f->req && --f->req->frags_left == 0) mlxd_tcp_req_complete(t, f->req);
    }
  }
}

/* Write as much of c's queue as the socket takes. 0 or an errno (-2: a TLS
 * error, c->tls_why says why). */
static int conn_write_now(tcp_transport* t, tcp_conn* c);
static int conn_write(tcp_transport* t, tcp_conn* c) {
  if (c->fd < 0) return 0; /* lazy: not connected yet; written when it is */
  int err = c->ssl ? mlxd_tcp_tls_write(t, c) : conn_write_now(t, c);
  if (!err) mlxd_tcp_conn_arm(t, c);
  return err;
}

static int conn_write_now(tcp_transport* t, tcp_conn* c) {
  while (c->qhead) {
    struct iovec iov[TCP_IOV];
    int k = 0;
    size_t tot = 0;
    for (tcp_frag* f = c->qhead; f && k <= TCP_IOV - 2 && tot < TCP_IO_MAX; f = f->next) {
      size_t s = f->sent;
      if (s < TCP_HDR) {
        iov[k].iov_base = f->hdr + s;
        iov[k].iov_len = TCP_HDR - s;
        tot += TCP_HDR - s;
        k++;
        s = TCP_HDR;
      }
      size_t pdone = s - TCP_HDR;
      if (pdone < f->len) {
        size_t m = f->len - pdone;
        if (m > TCP_IO_MAX - tot) m = TCP_IO_MAX - tot;
        iov[k].iov_base = (char*)(uintptr_t)mlxd_tcp_frag_data(f) + pdone;
        iov[k].iov_len = m;
        tot += m;
        k++;
      }
    }
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = iov;
    mh.msg_iovlen = (size_t)k;
    ssize_t w = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      return errno;
    }
    mlxd_tcp_conn_advance(t, c, (size_t)w);
    if ((size_t)w < tot) return 0; /* the socket is full */
  }
  return 0;
}

static int tcp_isend(mlxd_transport* tt, int peer, uint64_t tag, const mlxd_sig* sig,
                     const void* buf, size_t n, mlxd_req** out, mlxd_status* st) {
  tcp_transport* t = (tcp_transport*)tt;
  assert(peer >= 0 && peer < t->base.size && peer != t->base.rank && (buf || n == 0) && out);
  *out = NULL;
  size_t nfrag = n / TCP_FRAG_MAX + (n % TCP_FRAG_MAX != 0);
  if (nfrag == 0) nfrag = 1;
  if (n > TCP_SPLIT_MIN && nfrag < (size_t)t->nconn) nfrag = (size_t)t->nconn;
  /* A message of one fragment takes its request from the free list (under
   * mu); a larger one allocates it here, outside the lock. */
  tcp_req* r = nfrag > 1 ? calloc(1, sizeof *r + nfrag * sizeof(tcp_frag)) : NULL;
  if (r) r->q.heap = true;

  pthread_mutex_lock(&t->mu);
  if (!r && nfrag == 1) r = (tcp_req*)mlxd_eng_req_alloc(&t->eng, TCP_REQ_SMALL);
  if (!r) {
    int code = mlxd_eng_req_refused(&t->eng, MLXD_ENG_SEND, peer, st);
    pthread_mutex_unlock(&t->mu);
    return code;
  }
  mlxd_eng_req_init(&r->q, MLXD_ENG_SEND, peer, t->peers[peer].addr, tag, sig, buf, n);
  r->frags = (tcp_frag*)(r + 1);
  r->frags_left = nfrag;
  size_t q = n / nfrag, rem = n % nfrag, off = 0;
  for (size_t i = 0; i < nfrag; i++) {
    tcp_frag* f = &r->frags[i];
    f->req = r;
    f->off = off;
    f->len = q + (i < rem);
    off += f->len;
    mlxd_tcp_hdr h = {tag, f->off, f->len, n, r->q.m.sig};
    mlxd_tcp_hdr_encode(f->hdr, &h);
  }

  tcp_peer* pe = &t->peers[peer];
  if (t->eng.err.code || pe->closed) {
    if (!t->eng.err.code) fail_lost(t, peer, NULL, 0);
    int code = mlxd_eng_fail_status(&t->eng, st);
    mlxd_tcp_req_free(t, r);
    pthread_mutex_unlock(&t->mu);
    return code;
  }
  mlxd_status ns;
  mlxd_status_clear(&ns);
  tcp_conn* pc = mlxd_tcp_peer_conns(t, peer, &ns);
  if (!pc) { /* out of memory: this send fails, the transport stays usable */
    int code = ns.code;
    if (st) *st = ns;
    mlxd_tcp_req_free(t, r);
    pthread_mutex_unlock(&t->mu);
    return code;
  }
  mlxd_tcp_want(t, peer);
  r->q.where = TCP_W_SENT;
  unsigned start = pe->rr++;
  bool touched[64] = {false};
  for (size_t i = 0; i < nfrag; i++) {
    int ci = (int)((start + i) % (unsigned)t->nconn);
    tcp_conn* c = &pc[ci];
    tcp_frag* f = &r->frags[i];
    if (c->qtail)
      c->qtail->next = f;
    else
      c->qhead = f;
    c->qtail = f;
    if (ci < 64) touched[ci] = true;
  }
  bool queued = false;
  for (int ci = 0; ci < t->nconn && !t->eng.err.code; ci++) {
    tcp_conn* c = &pc[ci];
    if (ci < 64 && !touched[ci]) continue;
    int err = conn_write(t, c);
    if (err)
      fail_io(t, c, "sendmsg", err);
    else if (c->qhead)
      queued = true;
  }
  if (queued) tcp_wake(t);
  if (t->completed) pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->mu);
  *out = (mlxd_req*)r; /* if the transport failed meanwhile, r already holds the failure */
  return 0;
}

/* ------------------------------------------------------------- progress */

/* The dialer's marker in the epoll set (a connection's is its tcp_conn,
 * the wake eventfd's NULL). */
static char dial_mark;

void mlxd_tcp_conn_arm(tcp_transport* t, tcp_conn* c) {
  if (c->fd < 0 || c->eof || t->epfd < 0) return;
  bool out = (c->qhead != NULL && !c->tls_hs) || (c->ssl && (c->wlen > c->wpos || c->want_write));
  if (out == c->ep_out) return;
  struct epoll_event ev;
  memset(&ev, 0, sizeof ev);
  ev.events = EPOLLIN | (out ? EPOLLOUT : 0);
  ev.data.ptr = c;
  if (epoll_ctl(t->epfd, EPOLL_CTL_MOD, c->fd, &ev) == 0) c->ep_out = out;
}

int mlxd_tcp_dial_attach(tcp_transport* t) {
  struct epoll_event ev;
  memset(&ev, 0, sizeof ev);
  ev.events = EPOLLIN;
  ev.data.ptr = &dial_mark;
  return epoll_ctl(t->epfd, EPOLL_CTL_ADD, t->dial->ops->fd(t->dial), &ev);
}

void mlxd_tcp_dial_step(tcp_transport* t) {
  if (!t->dial) return;
  /* also once failed: the dialer answers hellos with the failure then */
  mlxd_status s;
  mlxd_status_clear(&s);
  if (t->dial->ops->step(t->dial, &s) != 0)
    tcp_fail(t, &s);
  else if (t->tls_hs_n > 0)
    mlxd_tcp_tls_step_all(t); /* lazy TLS handshakes (tcp_tls.c) */
}

void mlxd_tcp_want(tcp_transport* t, int peer) {
  tcp_peer* pe = &t->peers[peer];
  if (!t->dial || pe->wanted || t->eng.err.code) return;
  pe->wanted = true;
  mlxd_status s;
  mlxd_status_clear(&s);
  if (t->dial->ops->want(t->dial, peer, &s) != 0) tcp_fail(t, &s);
  tcp_wake(t); /* a progressor asleep in epoll_wait recomputes the dialer's timers */
}

/* A zero-timeout round of waitall polls the sockets up to this many times
 * with mu dropped (the lock round, the clock reads and the request scan
 * once per batch, not per poll) until an event or a completion by another
 * thread (tcp_impl.h: gen). */
#define TCP_SPIN_BATCH 16

/* One round of waiting for the sockets (mu held; dropped while in
 * epoll_wait). batch > 1 (zero timeout, waitall): poll up to batch times
 * while nothing happens. Returns whether anything had an event. */
static bool progress_round(tcp_transport* t, int timeout_ms, int batch) {
  if (t->dial && timeout_ms > 0) {
    double next = t->dial->ops->next(t->dial);
    if (next != INFINITY) {
      int ms = mlxd_ms_left(next);
      if (ms < timeout_ms) timeout_ms = ms;
    }
  }
  if (t->tls) /* TLS: bytes epoll cannot see; lazy handshakes' bounds (tcp_tls.c) */
    timeout_ms = mlxd_tcp_tls_before_wait(t, timeout_ms);
  /* Drop the lock while waiting, also for a zero-timeout spin, so other
   * threads can post requests meanwhile. Only a blocking wait needs the
   * eventfd kick when they queue data. */
  t->in_poll = timeout_ms > 0;
  /* One poll when blocking; over TLS (OpenSSL may hold bytes epoll cannot
   * see); on a crowded host (the engine's wait yields the CPU between
   * passes) */
  if (timeout_ms > 0 || t->tls || t->eng.yield) batch = 1;
  unsigned gen = atomic_load_explicit(&t->gen, memory_order_relaxed);
  pthread_mutex_unlock(&t->mu);
  /* Unlocked: only the progressor uses evs; gen is a hint (a completion
   * by another thread ends the batch early); the state is read after mu
   * is taken again. */
  int rc;
  for (int k = 1;; k++) {
    rc = epoll_wait(t->epfd, t->evs, t->nevs, timeout_ms);
    if (rc != 0 || k >= batch || atomic_load_explicit(&t->gen, memory_order_relaxed) != gen) break;
  }
  int perr = errno;
  pthread_mutex_lock(&t->mu);
  t->in_poll = false;
  if (rc < 0) {
    if (perr != EINTR) {
      mlxd_status s;
      mlxd_fail_at(&s, MLXD_ESYS, MLXD_LAYER_TCP, "waiting on the connections failed");
      mlxd_status_set_sys(&s, "epoll_wait", perr);
      tcp_fail(t, &s);
    }
    return false;
  }
  bool any = rc > 0;
  if (t->tls)
    for (int i = 0; i < t->base.size * t->nconn; i++) {
      tcp_conn* c = mlxd_tcp_conn_at(t, i);
      if (!c || !c->ssl || c->fd < 0 || c->eof || !(c->kick || mlxd_tls_pending(c->ssl))) continue;
      c->kick = false;
      any = true;
      t->peers[c->peer].heard = mlxd_now();
      int err = mlxd_tcp_conn_read(t, c);
      if (err < 0 && !t->eng.err.code)
        conn_eof(t, c);
      else if (err && !t->eng.err.code)
        fail_io(t, c, "recv", err);
      mlxd_tcp_conn_arm(t, c);
    }
  if (!any) {
    if (t->dial && t->dial->ops->next(t->dial) <= mlxd_now()) mlxd_tcp_dial_step(t);
    return false;
  }
  double now = mlxd_now(); /* peers heard from (liveness) */
  bool dial_due = false;
  for (int i = 0; i < rc && !t->eng.err.code; i++) {
    unsigned ev = t->evs[i].events;
    void* tag = t->evs[i].data.ptr;
    if (!tag) {
      uint64_t v;
      ssize_t k = read(t->wake_fd, &v, sizeof v);
      (void)k;
      continue;
    }
    if (tag == &dial_mark) {
      dial_due = true;
      continue;
    }
    tcp_conn* c = tag;
    if (c->fd < 0 || c->eof) continue;
    if (ev & EPOLLIN) t->peers[c->peer].heard = now;
    if (c->tls_hs && mlxd_tcp_tls_step(t, c) != 0) { /* lazy TLS: no data before it is done */
      mlxd_tcp_conn_arm(t, c);
      continue;
    }
    if (c->want_write && (ev & EPOLLOUT)) {
      c->want_write = false;
      ev |= EPOLLIN; /* the read that waited for the socket to be writable */
    }
    if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
      int err = mlxd_tcp_conn_read(t, c);
      if (err < 0 && !t->eng.err.code)
        conn_eof(t, c);
      else if (err && !t->eng.err.code)
        fail_io(t, c, "recv", err);
    }
    if (!t->eng.err.code && !c->eof && (c->qhead || c->wlen) && (ev & (EPOLLOUT | EPOLLERR))) {
      int err = conn_write(t, c);
      if (err && !t->eng.err.code) fail_io(t, c, "sendmsg", err);
    }
    mlxd_tcp_conn_arm(t, c);
  }
  if (t->dial && (dial_due || t->dial->ops->next(t->dial) <= mlxd_now())) mlxd_tcp_dial_step(t);
  return true;
}

/* Wake the waiters whose requests completed, and another waiter that may
 * be asleep with nobody progressing. mu held. */
static void wake_waiters(tcp_transport* t) {
  t->completed = false;
  pthread_cond_broadcast(&t->cv);
}

static int tcp_waitall(mlxd_transport* tt, mlxd_req** reqs, int n, mlxd_status* st) {
  tcp_transport* t = (tcp_transport*)tt;
  pthread_mutex_lock(&t->mu);
  /* Pending requests can only remain when the transport failed: tcp_fail
   * completed each and detached it from every list. */
  int code = mlxd_eng_waitall(&t->eng, reqs, n, st);
  wake_waiters(t); /* a sleeping waiter takes over the polling */
  pthread_mutex_unlock(&t->mu);
  return code;
}

static int tcp_wait_slice(mlxd_transport* tt, mlxd_req** reqs, int n, double max_s,
                          mlxd_wait_state* ws, mlxd_status* st) {
  tcp_transport* t = (tcp_transport*)tt;
  pthread_mutex_lock(&t->mu);
  int code = mlxd_eng_wait_slice(&t->eng, reqs, n, max_s, ws, st);
  wake_waiters(t);
  pthread_mutex_unlock(&t->mu);
  return code;
}

/* ---- the engine's ops (engine.h) ---- */

/* One round as the poller (mu held; dropped in epoll_wait): waiters whose
 * requests completed are told. Whether anything had an event. */
static bool poll_round(tcp_transport* t, int timeout_ms, int batch) {
  t->progressing = true;
  bool any = progress_round(t, timeout_ms, batch);
  t->progressing = false;
  if (t->completed) wake_waiters(t);
  return any;
}

/* One thread of a rank polls the sockets at a time (t->progressing); the
 * others' passes return -1 and they sleep on the condition variable. */
static int tcp_op_progress(mlxd_engine* e, bool idle) {
  (void)idle; /* tcp always buffers a message that comes first */
  tcp_transport* t = TCP_OF(e);
  if (t->progressing) return -1;
  return poll_round(t, 0, e->short_pass ? 1 : TCP_SPIN_BATCH) ? 1 : 0;
}

static int tcp_op_sleep(mlxd_engine* e, double max_s) {
  tcp_transport* t = TCP_OF(e);
  if (!t->progressing) {
    /* The poller: block in epoll_wait, to the next whole ms (a fraction
     * left before a liveness check is not spun away); a slice's part of a
     * ms is a plain pass (the router's other parts wait). */
    double ms_f = max_s * 1000.0;
    int ms = ms_f >= TCP_BLOCK_MS ? TCP_BLOCK_MS : e->short_pass ? (int)ms_f : (int)ceil(ms_f);
    return poll_round(t, ms, 1) ? 1 : 0;
  }
  /* Another thread polls: wait for its news (a completion, or its leaving) */
  double cv_s = TCP_CV_MS / 1000.0;
  if (max_s < cv_s) cv_s = max_s > 0 ? max_s : 0;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += (long)(cv_s * 1e9);
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  pthread_cond_timedwait(&t->cv, &t->mu, &ts);
  return 0;
}

/* The op clock moves when the requests' bytes do (e->op_clock_own): a
 * heartbeat is an event, not progress (the liveness tests pin this). */
static bool tcp_op_check(mlxd_engine* e, mlxd_req** reqs, int n, mlxd_wait_state* ws, double now) {
  uint64_t sum = 0;
  for (int i = 0; i < n; i++) {
    const tcp_req* r = (const tcp_req*)reqs[i];
    if (r) sum += r->done + (r->q.m.complete ? 1 : 0);
  }
  if (sum != ws->mark) {
    ws->mark = sum;
    ws->last_change = now;
  }
  return mlxd_tcp_live_check(TCP_OF(e), (tcp_req* const*)reqs, n, ws, now);
}

/* Requests that completed without this thread reading the sockets (a
 * message buffered earlier, another thread's progress): read once what has
 * arrived, so that a peer's abort sent before this wait ended fails it
 * (transport.h). */
static void tcp_op_settle(mlxd_engine* e, const mlxd_wait_state* ws) {
  tcp_transport* t = TCP_OF(e);
  if (!ws->polled && !t->progressing) poll_round(t, 0, 1);
}

static void tcp_op_lock(mlxd_engine* e) { pthread_mutex_lock(&TCP_OF(e)->mu); }
static void tcp_op_unlock(mlxd_engine* e) { pthread_mutex_unlock(&TCP_OF(e)->mu); }

static void tcp_op_fail(mlxd_engine* e, const mlxd_status* st) { tcp_fail(TCP_OF(e), st); }
static void tcp_op_wake(mlxd_engine* e) {
  tcp_transport* t = TCP_OF(e);
  tcp_wake(t); /* a progressor may sit in epoll_wait, other waiters on cv */
  pthread_cond_broadcast(&t->cv);
}
static int tcp_op_name(mlxd_engine* e, int pi) {
  (void)e;
  return pi;
}
static const char* tcp_op_addr(mlxd_engine* e, int pi) { return TCP_OF(e)->peers[pi].addr; }
static mlxd_eng_peer* tcp_op_peer(mlxd_engine* e, int pi) { return &TCP_OF(e)->peers[pi].ep; }

/* A receive bound to a message still arriving lets go of it (its rest is
 * drained and dropped). A send's fragments stay queued: tcp_fail empties
 * the queues, and a waitall ends with a send unfinished only then. */
static void tcp_op_unlink(mlxd_engine* e, mlxd_eng_req* q) {
  tcp_req* r = (tcp_req*)q;
  if (q->where == TCP_W_MSG && r->im) {
    mlxd_tcp_imsg_release(TCP_OF(e), r->im);
    r->im->req = NULL;
    r->im->discard = true;
    r->im = NULL;
  }
}

/* A failed transport's requests go back to the heap, not the free list:
 * the relay may have left a partly written fragment of one queued
 * (tcp_live.c); no write follows, but were one to, a freed block is caught
 * by the sanitizers where a reused one would be sent silently. */
static void tcp_op_release(mlxd_engine* e, mlxd_eng_req* q) {
  if (e->err.code) q->heap = true;
}

static const mlxd_eng_ops tcp_eng_ops = {
    .progress = tcp_op_progress,
    .check = tcp_op_check,
    .sleep = tcp_op_sleep,
    .lock = tcp_op_lock,
    .unlock = tcp_op_unlock,
    .settle = tcp_op_settle,
    .fail = tcp_op_fail,
    .wake = tcp_op_wake,
    .name = tcp_op_name,
    .addr = tcp_op_addr,
    .peer = tcp_op_peer,
    .unlink = tcp_op_unlink,
    .release = tcp_op_release,
};

void mlxd_tcp_engine_init(tcp_transport* t) {
  t->eng.ops = &tcp_eng_ops;
  t->eng.layer = MLXD_LAYER_TCP;
  t->eng.me = t->base.rank;
  t->eng.req_size = TCP_REQ_SMALL;
  t->eng.ux_pooled = true;
  t->eng.op_clock_own = true;
  t->eng.check_s = MLXD_TCP_CHECK_S;
  t->eng.defer_s = INFINITY; /* nothing is deferred */
}

int mlxd_tcp_conn_write(tcp_transport* t, tcp_conn* c) { return conn_write(t, c); }
void mlxd_tcp_fail(tcp_transport* t, const mlxd_status* st) { tcp_fail(t, st); }
void mlxd_tcp_wake(tcp_transport* t) { tcp_wake(t); }
void mlxd_tcp_fail_lost(tcp_transport* t, int peer, const char* syscall, int err) {
  fail_lost(t, peer, syscall, err);
}

const mlxd_transport_ops mlxd_tcp_ops = {
    .name = "tcp",
    .isend = tcp_isend,
    .irecv = mlxd_tcp_irecv,
    .waitall = tcp_waitall,
    .wait_slice = tcp_wait_slice,
    .abort = mlxd_tcp_abort,
    .destroy = mlxd_tcp_destroy,
    .forget = mlxd_tcp_forget,
};
