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
 * Matching. A receive that is posted before its message arrives gets the
 * payload written straight into its buffer. A message that arrives first
 * is buffered (mlxd_buffer_alloc) and copied when its receive is posted, so two ranks
 * that both send before receiving never deadlock. Signatures must agree
 * (sig_clash: the message's with its receive's, or with any receive or
 * message of the same operation when the tags differ); a disagreement fails
 * the transport. Sizes of unsigned messages must agree: a mismatch fails
 * that receive only (the bytes are drained and dropped).
 *
 * Progress. There is no background thread; the threads inside waitall
 * drive the sockets. One of them at a time (the "progressor") polls every
 * socket, spinning with zero-timeout polls for MLXDIST_SPIN_US after the
 * last event and then blocking in poll with a bounded timeout; the others
 * sleep on a condition variable (with a timeout) and re-check their
 * requests whenever something completes. isend writes eagerly from the
 * caller's thread and wakes a blocked progressor through an eventfd when
 * it leaves data queued. All state is protected by one mutex, which the
 * progressor drops only while it sits in poll() (a spinning waitall polls
 * up to TCP_SPIN_BATCH times per lock round, until an event or another
 * thread's completion).
 *
 * Allocation. Requests of one fragment (every receive; a send of up to
 * TCP_SPLIT_MIN bytes, or TCP_FRAG_MAX over one connection per peer) and
 * the entries of incoming messages come from the transport's free lists
 * (tcp_impl.h, at most TCP_POOL_MAX each), so a small message allocates
 * nothing once the transport has warmed up.
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
  mlxd_tcp_req_fail(t, MLXD_MATCH_ENTRY(l, struct mlxd_req, link), t->err.code);
}

/* Fail the whole transport with *st (the first failure wins). Called with
 * mu held. */
static void tcp_fail(tcp_transport* t, const mlxd_status* st) {
  if (!mlxd_match_fail_first(&t->err, st)) return;
  int code = t->err.code;
  /* A peer's first contact from now on is answered with this failure
   * (net/mesh_connect.c: a refusal), not left to its MLXDIST_CONNECT_TIMEOUT. */
  if (t->dial) t->dial->ops->refuse(t->dial, &t->err);
  /* The first failure is told to every peer, a relayed one too (keeping
   * its reporter, as shm's published record does): a rank that heard of a
   * death from a shm neighbour and shuts its sockets must not leave its TCP
   * peers with a bare "closed the connection" (the chaos soak's attribution
   * check). One record per connection at most: only the first failure. */
  mlxd_tcp_relay_prepare(t);
  int n = t->base.size;
  for (int p = 0; p < n; p++) {
    tcp_peer* pe = &t->peers[p];
    mlxd_match_fail_posted(&pe->mq, fail_posted, t);
    /* Drop the messages still arriving; keep those that fully arrived and
     * wait for their receive. */
    mlxd_match_link* l;
    while ((l = mlxd_match_pop(&pe->arriving))) {
      tcp_imsg* m = MLXD_MATCH_ENTRY(l, tcp_imsg, arr);
      if (m->req) {
        m->req->im = NULL;
        mlxd_tcp_req_fail(t, m->req, code);
      } else if (imsg_unexpected(m)) {
        mlxd_match_remove(&pe->mq.unexpected, &m->ux);
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
  for (int i = 0; i < t->nconn && !t->err.code; i++) {
    tcp_conn* c = mlxd_tcp_conn_at(t, peer * t->nconn + i);
    if (c && c->fd >= 0 && !c->eof) (void)mlxd_tcp_conn_read(t, c);
  }
  if (t->err.code) return;
  mlxd_status s;
  mlxd_match_lost(&s, MLXD_LAYER_TCP, peer, t->peers[peer].addr,
                  syscall ? "" : ": it closed the connection", syscall, err);
  tcp_fail(t, &s);
}

static void conn_eof(tcp_transport* t, tcp_conn* c);

/* Whether data (not a control frame) is in flight with peer p. */
static bool peer_has_data(tcp_transport* t, int p) {
  tcp_peer* pe = &t->peers[p];
  if (pe->mq.posted.head || pe->arriving.head) return true;
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

/* The transport's failure into st; returns its code. */
static int fail_status(tcp_transport* t, mlxd_status* st) {
  if (st) *st = t->err;
  return t->err.code;
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

/* isend out of memory for its request: st says so; returns its code. */
static int send_oom(tcp_transport* t, int peer, mlxd_status* st) {
  int code = mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_TCP,
                          "out of memory posting a send to rank %d", peer);
  mlxd_status_set_peer(st, peer, t->peers[peer].addr);
  return code;
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
  struct mlxd_req* r = nfrag > 1 ? calloc(1, sizeof *r + nfrag * sizeof(tcp_frag)) : NULL;
  if (nfrag > 1 && !r) return send_oom(t, peer, st);

  pthread_mutex_lock(&t->mu);
  if (!r) {
    r = mlxd_tcp_pool_get(&t->req_pool, TCP_REQ_SMALL);
    if (!r) {
      pthread_mutex_unlock(&t->mu);
      return send_oom(t, peer, st);
    }
    r->small = true;
  }
  r->is_send = true;
  r->m.sig = mlxd_sig_or_none(sig);
  r->m.peer = peer;
  r->m.addr = t->peers[peer].addr;
  r->m.tag = tag;
  r->buf = (char*)(uintptr_t)buf; /* only read */
  r->m.n = n;
  r->frags = (tcp_frag*)(r + 1);
  r->frags_left = nfrag;
  size_t q = n / nfrag, rem = n % nfrag, off = 0;
  for (size_t i = 0; i < nfrag; i++) {
    tcp_frag* f = &r->frags[i];
    f->req = r;
    f->off = off;
    f->len = q + (i < rem);
    off += f->len;
    mlxd_tcp_hdr h = {tag, f->off, f->len, n, r->m.sig};
    mlxd_tcp_hdr_encode(f->hdr, &h);
  }

  tcp_peer* pe = &t->peers[peer];
  if (t->err.code || pe->closed) {
    if (!t->err.code) fail_lost(t, peer, NULL, 0);
    int code = fail_status(t, st);
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
  for (int ci = 0; ci < t->nconn && !t->err.code; ci++) {
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
  *out = r; /* if the transport failed meanwhile, r already holds the failure */
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
  if (!t->dial || pe->wanted || t->err.code) return;
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
   * see); on a crowded host (wait_run yields the CPU between polls) */
  if (timeout_ms > 0 || t->tls || t->yield_spin) batch = 1;
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
      if (err < 0 && !t->err.code)
        conn_eof(t, c);
      else if (err && !t->err.code)
        fail_io(t, c, "recv", err);
      mlxd_tcp_conn_arm(t, c);
    }
  if (!any) {
    if (t->dial && t->dial->ops->next(t->dial) <= mlxd_now()) mlxd_tcp_dial_step(t);
    return false;
  }
  double now = mlxd_now(); /* peers heard from (liveness) */
  bool dial_due = false;
  for (int i = 0; i < rc && !t->err.code; i++) {
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
      if (err < 0 && !t->err.code)
        conn_eof(t, c);
      else if (err && !t->err.code)
        fail_io(t, c, "recv", err);
    }
    if (!t->err.code && !c->eof && (c->qhead || c->wlen) && (ev & (EPOLLOUT | EPOLLERR))) {
      int err = conn_write(t, c);
      if (err && !t->err.code) fail_io(t, c, "sendmsg", err);
    }
    mlxd_tcp_conn_arm(t, c);
  }
  if (t->dial && (dial_due || t->dial->ops->next(t->dial) <= mlxd_now())) mlxd_tcp_dial_step(t);
  return true;
}

/* Drive the sockets until no request of reqs is pending (returns true;
 * also when the transport failed) or until `until` (returns false, after
 * at least one pass). lw keeps the wait's clocks across calls. mu held. */
static bool wait_run(tcp_transport* t, mlxd_req** reqs, int n, double until, tcp_live_wait* lw) {
  double now = mlxd_now();
  if (!lw->started) {
    *lw = (tcp_live_wait){.started = true,
                          .start = now,
                          .last_change = now,
                          .next_check = now,
                          .deadline = now,
                          .last_event = now, /* spin right away */
                          .mark = UINT64_MAX};
  }
  for (;;) {
    uint64_t sum = 0;
    struct mlxd_req* waiting = NULL;
    for (int i = 0; i < n; i++) {
      struct mlxd_req* r = reqs[i];
      if (!r) continue;
      sum += r->done + (r->m.complete ? 1 : 0);
      if (!r->m.complete && !waiting) waiting = r;
    }
    if (!waiting) return true;
    now = mlxd_now();
    if (sum != lw->mark) {
      lw->mark = sum;
      lw->last_change = now;
    }
    /* the checks run every LIVE_CHECK_S (tcp_live.c) or at the wait's deadline */
    if ((now >= lw->next_check || now >= lw->deadline) && mlxd_tcp_live_check(t, reqs, n, lw, now))
      return true;
    if (!t->progressing) {
      t->progressing = true;
      int ms = 0;
      if (now - lw->last_event >= t->spin_s) {
        ms = mlxd_ms_left(lw->deadline);
        if (ms > TCP_BLOCK_MS) ms = TCP_BLOCK_MS;
        if (until - now < (double)ms / 1000.0) ms = (int)((until - now) * 1000.0);
        if (ms < 0) ms = 0;
      }
      if (progress_round(t, ms, until == INFINITY ? TCP_SPIN_BATCH : 1))
        lw->last_event = mlxd_now();
      else if (ms == 0 && t->yield_spin && until == INFINITY)
        sched_yield(); /* the rank we wait for may need this CPU (not in a slice: router.c) */
      lw->polled = true;
      t->progressing = false;
      /* Let a sleeping waiter take over if we leave, and tell waiters
       * whose requests completed. */
      if (t->completed) {
        t->completed = false;
        pthread_cond_broadcast(&t->cv);
      }
    } else {
      lw->polled = false;
      double cv_s = TCP_CV_MS / 1000.0;
      if (until - now < cv_s) cv_s = until - now > 0 ? until - now : 0;
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += (long)(cv_s * 1e9);
      if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
      }
      pthread_cond_timedwait(&t->cv, &t->mu, &ts);
    }
    if (until < INFINITY && mlxd_now() >= until) return false;
  }
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
  tcp_live_wait lw = {0};
  wait_run(t, reqs, n, INFINITY, &lw);
  /* Requests that completed without this thread reading the sockets (a
   * message buffered earlier, another thread's progress): read once what
   * has arrived, so that a peer's abort sent before this wait ended fails
   * it (transport.h). */
  if (!lw.polled && !t->err.code && !t->progressing && n > 0) {
    t->progressing = true;
    progress_round(t, 0, 1);
    t->progressing = false;
  }
  wake_waiters(t);
  int code = mlxd_match_result(st, &t->err, MLXD_LAYER_TCP, reqs, n);
  if (code == 0 && t->err.code) code = fail_status(t, st); /* failed meanwhile: not a success */
  /* Pending requests can only remain when the transport failed, and tcp_fail
   * detached every request from its lists, so they can all be freed. */
  for (int i = 0; i < n; i++) {
    struct mlxd_req* r = reqs[i];
    if (!r) continue;
    /* Nothing refers to r any more: tcp_fail emptied every connection's
     * queue after the relay's one write (a partly written fragment's rest
     * and the abort record go only as far as the socket takes them then,
     * tcp_live.c), and no queue is written once the transport failed. A
     * failed transport's request goes back to the heap, not the free list. */
    if (t->err.code)
      free(r);
    else
      mlxd_tcp_req_free(t, r);
    reqs[i] = NULL;
  }
  pthread_mutex_unlock(&t->mu);
  return code;
}

static int tcp_wait_slice(mlxd_transport* tt, mlxd_req** reqs, int n, double max_s,
                          mlxd_wait_state* ws, mlxd_status* st) {
  tcp_transport* t = (tcp_transport*)tt;
  pthread_mutex_lock(&t->mu);
  ws->done = wait_run(t, reqs, n, mlxd_now() + max_s, ws);
  wake_waiters(t);
  int code = 0;
  if (t->err.code) {
    ws->done = true;
    code = fail_status(t, st);
  }
  pthread_mutex_unlock(&t->mu);
  return code;
}

int mlxd_tcp_conn_write(tcp_transport* t, tcp_conn* c) { return conn_write(t, c); }
void mlxd_tcp_fail(tcp_transport* t, const mlxd_status* st) { tcp_fail(t, st); }
void mlxd_tcp_wake(tcp_transport* t) { tcp_wake(t); }
void mlxd_tcp_fail_lost(tcp_transport* t, int peer, const char* syscall, int err) {
  fail_lost(t, peer, syscall, err);
}
int mlxd_tcp_fail_status(tcp_transport* t, mlxd_status* st) { return fail_status(t, st); }

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
