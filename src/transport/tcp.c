/* The TCP transport: tag-matched messages over connected stream sockets.
 *
 * Wire format. Every message is sent as one or more fragments; each
 * fragment is a 32-byte header (tag, offset, length, total; little-endian
 * u64) followed by `length` payload bytes that belong at `offset` of the
 * `total`-byte message. Small messages are one fragment on one connection
 * (connections to a peer are used round-robin). Larger ones are cut into
 * fragments of at most TCP_FRAG_MAX bytes spread round-robin over all
 * connections to the peer, so K connections carry K streams in parallel.
 * The receiver matches a fragment to a message by (peer, tag): tags must be
 * unique among the messages in flight from one peer to another (the
 * algorithms and the front-end guarantee this with sequence numbers).
 *
 * Matching. A receive that is posted before its message arrives gets the
 * payload written straight into its buffer. A message that arrives first
 * is buffered (mlxd_buffer_alloc) and copied when its receive is posted, so two ranks
 * that both send before receiving never deadlock. Sizes must agree: a
 * mismatch fails that receive only (the bytes are drained and dropped).
 *
 * Progress. There is no background thread; the threads inside waitall
 * drive the sockets. One of them at a time (the "progressor") polls every
 * socket, spinning with zero-timeout polls for MLXDIST_SPIN_US after the
 * last event and then blocking in poll with a bounded timeout; the others
 * sleep on a condition variable (with a timeout) and re-check their
 * requests whenever something completes. isend writes eagerly from the
 * caller's thread and wakes a blocked progressor through an eventfd when
 * it leaves data queued. All state is protected by one mutex, which the
 * progressor drops only while it sits in poll().
 *
 * Failure. A peer that closes or resets its connection, a corrupt header,
 * or a wait that makes no progress for MLXDIST_TIMEOUT seconds fails the
 * whole transport: every pending and later operation fails with the first
 * error's message, and the sockets are shut down so the other ranks learn
 * about it at once instead of waiting for their own timeout. Messages that
 * had fully arrived before the failure can still be received.
 *
 * Sizes. Every length is a size_t and every socket call is capped at
 * TCP_IO_MAX bytes and looped, so messages above 2 GiB (where a single
 * send/recv would be truncated by the kernel) are moved in pieces. */
#include "transport/tcp.h"

#include "core/buffer.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "transport/match.h"
#include "util/clock.h"
#include "util/tunables.h"

#define TCP_HDR 32u
#define TCP_FRAG_MAX ((size_t)1 << 20)   /* largest fragment of a large message */
#define TCP_SPLIT_MIN ((size_t)64 << 10) /* messages above this use every connection */
#define TCP_RBUF ((size_t)64 << 10)      /* per-connection receive staging buffer */
#define TCP_IO_MAX ((size_t)1 << 30)     /* at most this many bytes per syscall */
#define TCP_IOV 64                       /* iovec entries per sendmsg */
#define TCP_SOCKBUF (4 << 20)            /* SO_SNDBUF / SO_RCVBUF we ask for */
#define TCP_BLOCK_MS 1000                /* longest single blocking poll */
#define TCP_CV_MS 20                     /* longest single condition-variable sleep */

typedef struct tcp_frag tcp_frag;
typedef struct tcp_imsg tcp_imsg;

struct mlxd_req {
  mlxd_match_req m; /* first: peer, tag, n, outcome (match.h) */
  bool is_send;
  char* buf;
  size_t done;          /* bytes moved so far (for progress detection) */
  size_t frags_left;    /* send: fragments not yet fully written */
  mlxd_match_link link; /* recv: in the peer's posted queue */
  tcp_imsg* im;         /* recv: the incoming message it is attached to */
  tcp_frag* frags;      /* send: fragment array (same allocation) */
};

struct tcp_frag {
  struct mlxd_req* req;
  unsigned char hdr[TCP_HDR];
  size_t off, len;
  size_t sent; /* bytes of header + payload written */
  tcp_frag* next;
};

/* A message being received (or buffered because no receive was posted).
 * It is in its peer's `arriving` queue until its last fragment is in, and
 * in the peer's unexpected queue while it has no receive (req == NULL and
 * not discarded). */
struct tcp_imsg {
  size_t total, got;
  char* buf;    /* the receive's buffer, or an owned one (unexpected) */
  bool owned;   /* buf is ours (malloc) */
  bool discard; /* size mismatch: drain and drop */
  bool complete;
  struct mlxd_req* req;
  mlxd_match_link arr; /* in arriving (tag = the message's tag) */
  mlxd_match_link ux;  /* in the unexpected queue */
};

typedef struct tcp_conn {
  int fd;
  int peer;
  bool eof; /* the peer closed this connection (everything before it was read) */
  tcp_frag *qhead, *qtail;
  unsigned char* rbuf;
  size_t rpos, rlen;
  bool in_payload;
  tcp_imsg* cur;
  size_t cur_off, cur_len, cur_got;
} tcp_conn;

typedef struct tcp_peer {
  mlxd_match_peer mq;        /* posted receives, unexpected messages */
  mlxd_match_queue arriving; /* messages with fragments still to come */
  unsigned rr;
  bool closed;              /* every connection reached EOF with nothing pending */
  char addr[MLXD_ADDR_MAX]; /* "10.0.0.2:41000"; "" when unknown (e.g. AF_UNIX) */
} tcp_peer;

typedef struct tcp_transport {
  mlxd_transport base;
  int nconn;
  tcp_conn* conns; /* size * nconn; conns[p * nconn + c] */
  tcp_peer* peers;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool progressing;
  bool in_poll;
  bool completed; /* something completed since the last broadcast */
  int wake_fd;
  mlxd_status err; /* the first failure; err.code == 0 while none */
  double timeout_s;
  double spin_s;
  bool yield_spin; /* more ranks than CPUs: give the CPU away between spin polls */
  struct pollfd* pfds;
  tcp_conn** pconn;
} tcp_transport;

static const mlxd_transport_ops tcp_ops;

/* ---------------------------------------------------------------- helpers */

static void put_u64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint64_t get_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static void req_complete(tcp_transport* t, struct mlxd_req* r) {
  if (!r->m.complete) {
    r->m.complete = true;
    t->completed = true;
  }
}

static void req_fail(tcp_transport* t, struct mlxd_req* r, int code) {
  if (r->m.complete) return;
  r->m.code = code;
  req_complete(t, r);
}

static void imsg_free(tcp_imsg* m) {
  if (m->owned) mlxd_buffer_free(m->buf, m->total);
  free(m);
}

/* Whether m waits in the unexpected queue (no receive, not dropped). */
static bool imsg_unexpected(const tcp_imsg* m) { return !m->req && !m->discard; }

static void fail_posted(void* ctx, mlxd_match_link* l) {
  tcp_transport* t = ctx;
  req_fail(t, MLXD_MATCH_ENTRY(l, struct mlxd_req, link), t->err.code);
}

/* Fail the whole transport with *st (the first failure wins). Called with
 * mu held. */
static void tcp_fail(tcp_transport* t, const mlxd_status* st) {
  if (!mlxd_match_fail_first(&t->err, st)) return;
  int code = t->err.code;
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
        req_fail(t, m->req, code);
      } else if (imsg_unexpected(m)) {
        mlxd_match_remove(&pe->mq.unexpected, &m->ux);
      }
      imsg_free(m);
    }
  }
  for (int i = 0; i < n * t->nconn; i++) {
    tcp_conn* c = &t->conns[i];
    for (tcp_frag* f = c->qhead; f; f = f->next) req_fail(t, f->req, code);
    c->qhead = c->qtail = NULL;
    c->cur = NULL;
    c->in_payload = false;
    if (c->fd >= 0) shutdown(c->fd, SHUT_RDWR);
  }
  t->completed = true;
}

/* Fail the transport: the connection to peer is gone (syscall/err: the
 * call that found out; NULL/0 for an orderly close by the peer). */
static void fail_lost(tcp_transport* t, int peer, const char* syscall, int err) {
  mlxd_status s;
  mlxd_match_lost(&s, MLXD_LAYER_TCP, peer, t->peers[peer].addr,
                  syscall ? "" : ": it closed the connection", syscall, err);
  tcp_fail(t, &s);
}

/* The transport's failure into st; returns its code. */
static int fail_status(tcp_transport* t, mlxd_status* st) {
  if (st) *st = t->err;
  return t->err.code;
}

/* Whether anything is still in flight with peer p. */
static bool peer_busy(tcp_transport* t, int p) {
  tcp_peer* pe = &t->peers[p];
  if (pe->mq.posted.head || pe->arriving.head) return true;
  for (int c = 0; c < t->nconn; c++)
    if (t->conns[p * t->nconn + c].qhead) return true;
  return false;
}

/* Connection c reached EOF. A peer that closes all its connections after
 * finishing its work is a normal shutdown: only operations still (or
 * later) involving it fail. One that closes in the middle of a message or
 * with operations pending fails the transport. */
static void conn_eof(tcp_transport* t, tcp_conn* c) {
  if (c->in_payload) {
    fail_lost(t, c->peer, NULL, 0);
    return;
  }
  c->eof = true;
  for (int i = 0; i < t->nconn; i++)
    if (!t->conns[c->peer * t->nconn + i].eof) return;
  if (peer_busy(t, c->peer))
    fail_lost(t, c->peer, NULL, 0);
  else
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

/* Write as much of c's queue as the socket takes. 0 or an errno. */
static int conn_write(tcp_transport* t, tcp_conn* c) {
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
        iov[k].iov_base = f->req->buf + f->off + pdone;
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
    size_t left = (size_t)w;
    while (left > 0 && c->qhead) {
      tcp_frag* f = c->qhead;
      size_t need = TCP_HDR + f->len - f->sent;
      size_t take = left < need ? left : need;
      f->sent += take;
      f->req->done += take;
      left -= take;
      if (f->sent == TCP_HDR + f->len) {
        c->qhead = f->next;
        if (!c->qhead) c->qtail = NULL;
        if (--f->req->frags_left == 0) req_complete(t, f->req);
      }
    }
    if ((size_t)w < tot) return 0; /* the socket is full */
  }
  return 0;
}

static int tcp_isend(mlxd_transport* tt, int peer, uint64_t tag, const void* buf, size_t n,
                     mlxd_req** out, mlxd_status* st) {
  tcp_transport* t = (tcp_transport*)tt;
  assert(peer >= 0 && peer < t->base.size && peer != t->base.rank && (buf || n == 0) && out);
  *out = NULL;
  size_t nfrag = n / TCP_FRAG_MAX + (n % TCP_FRAG_MAX != 0);
  if (nfrag == 0) nfrag = 1;
  if (n > TCP_SPLIT_MIN && nfrag < (size_t)t->nconn) nfrag = (size_t)t->nconn;
  struct mlxd_req* r = calloc(1, sizeof *r + nfrag * sizeof(tcp_frag));
  if (!r) {
    int code = mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_TCP,
                            "out of memory posting a send to rank %d", peer);
    mlxd_status_set_peer(st, peer, t->peers[peer].addr);
    return code;
  }
  r->is_send = true;
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
    put_u64(f->hdr, tag);
    put_u64(f->hdr + 8, f->off);
    put_u64(f->hdr + 16, f->len);
    put_u64(f->hdr + 24, n);
  }

  pthread_mutex_lock(&t->mu);
  tcp_peer* pe = &t->peers[peer];
  if (t->err.code || pe->closed) {
    if (!t->err.code) fail_lost(t, peer, NULL, 0);
    int code = fail_status(t, st);
    pthread_mutex_unlock(&t->mu);
    free(r);
    return code;
  }
  unsigned start = pe->rr++;
  bool touched[64] = {false};
  for (size_t i = 0; i < nfrag; i++) {
    int ci = (int)((start + i) % (unsigned)t->nconn);
    tcp_conn* c = &t->conns[peer * t->nconn + ci];
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
    tcp_conn* c = &t->conns[peer * t->nconn + ci];
    if (ci < 64 && !touched[ci]) continue;
    int err = conn_write(t, c);
    if (err)
      fail_lost(t, peer, "sendmsg", err);
    else if (c->qhead)
      queued = true;
  }
  if (queued) tcp_wake(t);
  if (t->completed) pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->mu);
  *out = r; /* if the transport failed meanwhile, r already holds the failure */
  return 0;
}

/* --------------------------------------------------------- receive side */

static int tcp_irecv(mlxd_transport* tt, int peer, uint64_t tag, void* buf, size_t n,
                     mlxd_req** out, mlxd_status* st) {
  tcp_transport* t = (tcp_transport*)tt;
  assert(peer >= 0 && peer < t->base.size && peer != t->base.rank && (buf || n == 0) && out);
  *out = NULL;
  struct mlxd_req* r = calloc(1, sizeof *r);
  if (!r) {
    int code = mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_TCP,
                            "out of memory posting a receive from rank %d", peer);
    mlxd_status_set_peer(st, peer, t->peers[peer].addr);
    return code;
  }
  r->m.peer = peer;
  r->m.addr = t->peers[peer].addr;
  r->m.tag = tag;
  r->buf = buf;
  r->m.n = n;

  pthread_mutex_lock(&t->mu);
  tcp_peer* pe = &t->peers[peer];
  tcp_imsg* m = MLXD_MATCH_ENTRY(mlxd_match_take(&pe->mq.unexpected, tag), tcp_imsg, ux);
  if (m) {
    if (m->total != n) {
      r->m.code = MLXD_EINVAL;
      r->m.mismatch = true;
      r->m.sent = m->total;
      r->m.complete = true;
      if (m->complete) {
        imsg_free(m);
      } else { /* still arriving: drain and drop the rest */
        if (m->owned) mlxd_buffer_free(m->buf, m->total);
        m->buf = NULL;
        m->owned = false;
        m->discard = true;
      }
    } else if (m->complete) {
      if (n) memcpy(buf, m->buf, n);
      r->done = n;
      r->m.complete = true;
      imsg_free(m);
    } else {
      m->req = r;
      r->im = m;
      r->done = m->got;
    }
  } else if (t->err.code || pe->closed) {
    if (!t->err.code) fail_lost(t, peer, NULL, 0);
    int code = fail_status(t, st);
    pthread_mutex_unlock(&t->mu);
    free(r);
    return code;
  } else {
    mlxd_match_push(&pe->mq.posted, &r->link, tag);
  }
  pthread_mutex_unlock(&t->mu);
  *out = r;
  return 0;
}

/* A fragment header arrived on c: find or create its message. 0 or -1 (failed). */
static int on_header(tcp_transport* t, tcp_conn* c, const unsigned char* h) {
  uint64_t tag = get_u64(h), off = get_u64(h + 8), len = get_u64(h + 16), total = get_u64(h + 24);
  tcp_peer* pe = &t->peers[c->peer];
  char ts[64];
  mlxd_status s;
  if (len > total || off > total - len || total > (uint64_t)SIZE_MAX) {
    mlxd_match_tag_str(tag, ts, sizeof ts);
    mlxd_fail_at(&s, MLXD_EREMOTE, MLXD_LAYER_TCP,
                 "corrupt message header from rank %d (%s: offset %" PRIu64 ", length %" PRIu64
                 ", total %" PRIu64 "); is the peer an mlxdist rank of the same version?",
                 c->peer, ts, off, len, total);
    mlxd_status_set_peer(&s, c->peer, pe->addr);
    tcp_fail(t, &s);
    return -1;
  }
  tcp_imsg* m = MLXD_MATCH_ENTRY(mlxd_match_find(&pe->arriving, tag), tcp_imsg, arr);
  if (m && m->total != total) {
    mlxd_match_tag_str(tag, ts, sizeof ts);
    mlxd_fail_at(&s, MLXD_EREMOTE, MLXD_LAYER_TCP,
                 "rank %d sent two messages with the same tag (%s) at once (%zu and %" PRIu64
                 " bytes); tags must be unique among messages in flight",
                 c->peer, ts, m->total, total);
    mlxd_status_set_peer(&s, c->peer, pe->addr);
    tcp_fail(t, &s);
    return -1;
  }
  if (!m) {
    m = calloc(1, sizeof *m);
    if (!m) {
      mlxd_fail_at(&s, MLXD_ENOMEM, MLXD_LAYER_TCP,
                   "out of memory receiving a message from rank %d", c->peer);
      mlxd_status_set_peer(&s, c->peer, pe->addr);
      tcp_fail(t, &s);
      return -1;
    }
    m->total = (size_t)total;
    struct mlxd_req* r =
        MLXD_MATCH_ENTRY(mlxd_match_take(&pe->mq.posted, tag), struct mlxd_req, link);
    if (r) {
      if (r->m.n == m->total) {
        m->buf = r->buf;
        m->req = r;
        r->im = m;
      } else {
        r->m.mismatch = true;
        r->m.sent = m->total;
        req_fail(t, r, MLXD_EINVAL);
        m->discard = true;
      }
    } else {
      m->owned = true;
      m->buf = mlxd_buffer_alloc(m->total);
      if (!m->buf) {
        free(m);
        mlxd_fail_at(&s, MLXD_ENOMEM, MLXD_LAYER_TCP,
                     "out of memory buffering a %" PRIu64 "-byte message from rank %d", total,
                     c->peer);
        mlxd_status_set_peer(&s, c->peer, pe->addr);
        tcp_fail(t, &s);
        return -1;
      }
      mlxd_match_push(&pe->mq.unexpected, &m->ux, tag);
    }
    mlxd_match_push(&pe->arriving, &m->arr, tag);
  }
  c->cur = m;
  c->cur_off = (size_t)off;
  c->cur_len = (size_t)len;
  c->cur_got = 0;
  c->in_payload = true;
  return 0;
}

/* The current fragment of c is complete. */
static void frag_done(tcp_transport* t, tcp_conn* c) {
  tcp_imsg* m = c->cur;
  tcp_peer* pe = &t->peers[c->peer];
  c->cur = NULL;
  c->in_payload = false;
  m->got += c->cur_len;
  if (m->got < m->total) return;
  m->complete = true;
  mlxd_match_remove(&pe->arriving, &m->arr);
  if (m->req) {
    struct mlxd_req* r = m->req;
    if (m->owned && r->m.n) memcpy(r->buf, m->buf, r->m.n);
    r->im = NULL;
    r->done = r->m.n;
    req_complete(t, r);
    imsg_free(m);
  } else if (m->discard) {
    imsg_free(m);
  }
  /* else: an unexpected message, kept until its receive is posted */
}

static void payload_got(tcp_conn* c, size_t k) {
  c->cur_got += k;
  if (c->cur->req) c->cur->req->done += k;
}

/* Read everything available on c. 0 or an errno (-1 for EOF). */
static int conn_read(tcp_transport* t, tcp_conn* c) {
  for (;;) {
    if (t->err.code) return 0;
    if (!c->in_payload) {
      size_t avail = c->rlen - c->rpos;
      if (avail >= TCP_HDR) {
        const unsigned char* h = c->rbuf + c->rpos;
        c->rpos += TCP_HDR;
        if (on_header(t, c, h) != 0) return 0;
        continue;
      }
      if (c->rpos > 0) {
        memmove(c->rbuf, c->rbuf + c->rpos, avail);
        c->rlen = avail;
        c->rpos = 0;
      }
      ssize_t k = recv(c->fd, c->rbuf + c->rlen, TCP_RBUF - c->rlen, MSG_DONTWAIT);
      if (k == 0) return -1;
      if (k < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
        return errno;
      }
      c->rlen += (size_t)k;
      continue;
    }
    size_t need = c->cur_len - c->cur_got;
    if (need == 0) {
      frag_done(t, c);
      continue;
    }
    tcp_imsg* m = c->cur;
    char* dst = m->buf ? m->buf + c->cur_off + c->cur_got : NULL; /* NULL: discard */
    size_t avail = c->rlen - c->rpos;
    if (avail > 0) {
      size_t k = avail < need ? avail : need;
      if (dst) memcpy(dst, c->rbuf + c->rpos, k);
      c->rpos += k;
      payload_got(c, k);
      continue;
    }
    c->rpos = c->rlen = 0;
    ssize_t k;
    if (dst && need >= TCP_RBUF / 2) {
      k = recv(c->fd, dst, need < TCP_IO_MAX ? need : TCP_IO_MAX, MSG_DONTWAIT);
      if (k > 0) {
        payload_got(c, (size_t)k);
        continue;
      }
    } else {
      k = recv(c->fd, c->rbuf, TCP_RBUF, MSG_DONTWAIT);
      if (k > 0) {
        c->rlen = (size_t)k;
        continue;
      }
    }
    if (k == 0) return -1;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    return errno;
  }
}

/* ------------------------------------------------------------- progress */

/* One round of polling (mu held; dropped while in poll). Returns whether
 * any socket had an event. */
static bool progress_round(tcp_transport* t, int timeout_ms) {
  int np = 0;
  t->pfds[np].fd = t->wake_fd;
  t->pfds[np].events = POLLIN;
  t->pconn[np] = NULL;
  np++;
  int nc = t->base.size * t->nconn;
  for (int i = 0; i < nc; i++) {
    tcp_conn* c = &t->conns[i];
    if (c->fd < 0 || c->eof) continue;
    t->pfds[np].fd = c->fd;
    t->pfds[np].events = (short)(POLLIN | (c->qhead ? POLLOUT : 0));
    t->pconn[np] = c;
    np++;
  }
  /* Drop the lock while polling, also for a zero-timeout spin, so other
   * threads can post requests meanwhile. Only a blocking poll needs the
   * eventfd kick when they queue data. */
  t->in_poll = timeout_ms > 0;
  pthread_mutex_unlock(&t->mu);
  int rc = poll(t->pfds, (nfds_t)np, timeout_ms);
  int perr = errno;
  pthread_mutex_lock(&t->mu);
  t->in_poll = false;
  if (rc < 0) {
    if (perr != EINTR) {
      mlxd_status s;
      mlxd_fail_at(&s, MLXD_ESYS, MLXD_LAYER_TCP, "poll on the connections failed");
      mlxd_status_set_sys(&s, "poll", perr);
      tcp_fail(t, &s);
    }
    return false;
  }
  if (rc == 0) return false;
  for (int i = 0; i < np && !t->err.code; i++) {
    short ev = t->pfds[i].revents;
    if (!ev) continue;
    tcp_conn* c = t->pconn[i];
    if (!c) {
      uint64_t v;
      ssize_t k = read(t->wake_fd, &v, sizeof v);
      (void)k;
      continue;
    }
    if (ev & (POLLIN | POLLHUP | POLLERR)) {
      int err = conn_read(t, c);
      if (err < 0 && !t->err.code)
        conn_eof(t, c);
      else if (err && !t->err.code)
        fail_lost(t, c->peer, "recv", err);
    }
    if (!t->err.code && !c->eof && c->qhead && (ev & (POLLOUT | POLLERR))) {
      int err = conn_write(t, c);
      if (err && !t->err.code) fail_lost(t, c->peer, "sendmsg", err);
    }
  }
  return true;
}

static int tcp_waitall(mlxd_transport* tt, mlxd_req** reqs, int n, mlxd_status* st) {
  tcp_transport* t = (tcp_transport*)tt;
  pthread_mutex_lock(&t->mu);
  double now = mlxd_now();
  double last_change = now;
  size_t last_sum = (size_t)-1;
  double last_event = now; /* spin right away */
  for (;;) {
    size_t sum = 0;
    struct mlxd_req* waiting = NULL;
    for (int i = 0; i < n; i++) {
      struct mlxd_req* r = reqs[i];
      if (!r) continue;
      sum += r->done + (r->m.complete ? 1 : 0);
      if (!r->m.complete && !waiting) waiting = r;
    }
    if (!waiting) break;
    now = mlxd_now();
    if (sum != last_sum) {
      last_sum = sum;
      last_change = now;
    }
    double deadline = last_change + t->timeout_s;
    if (now >= deadline) {
      mlxd_status s;
      mlxd_match_timeout(&s, MLXD_LAYER_TCP, t->timeout_s, waiting->m.peer,
                         t->peers[waiting->m.peer].addr, waiting->is_send, waiting->m.n,
                         waiting->m.tag, waiting->done);
      tcp_fail(t, &s);
      break;
    }
    if (!t->progressing) {
      t->progressing = true;
      int ms = 0;
      if (now - last_event >= t->spin_s) {
        ms = mlxd_ms_left(deadline);
        if (ms > TCP_BLOCK_MS) ms = TCP_BLOCK_MS;
      }
      if (progress_round(t, ms))
        last_event = mlxd_now();
      else if (ms == 0 && t->yield_spin)
        sched_yield(); /* the rank we wait for may need this CPU */
      t->progressing = false;
      /* Let a sleeping waiter take over if we leave, and tell waiters
       * whose requests completed. */
      if (t->completed) {
        t->completed = false;
        pthread_cond_broadcast(&t->cv);
      }
    } else {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += TCP_CV_MS * 1000000L;
      if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
      }
      pthread_cond_timedwait(&t->cv, &t->mu, &ts);
    }
  }
  if (t->completed) {
    t->completed = false;
    pthread_cond_broadcast(&t->cv);
  }
  /* Another waiter may be asleep with nobody progressing: wake one up. */
  pthread_cond_broadcast(&t->cv);
  int code = mlxd_match_result(st, &t->err, MLXD_LAYER_TCP, reqs, n);
  /* Pending requests can only remain when the transport failed, and tcp_fail
   * detached every request from its lists, so they can all be freed. */
  for (int i = 0; i < n; i++) {
    struct mlxd_req* r = reqs[i];
    if (!r) continue;
    free(r);
    reqs[i] = NULL;
  }
  pthread_mutex_unlock(&t->mu);
  return code;
}

/* ------------------------------------------------------ create / destroy */

static void tcp_destroy(mlxd_transport* tt) {
  tcp_transport* t = (tcp_transport*)tt;
  if (!t) return;
  int nc = t->base.size * t->nconn;
  for (int i = 0; i < nc && t->conns; i++) {
    if (t->conns[i].fd >= 0) close(t->conns[i].fd);
    free(t->conns[i].rbuf);
  }
  for (int p = 0; p < t->base.size && t->peers; p++) {
    tcp_peer* pe = &t->peers[p];
    mlxd_match_link* l;
    while ((l = mlxd_match_pop(&pe->arriving))) {
      tcp_imsg* m = MLXD_MATCH_ENTRY(l, tcp_imsg, arr);
      if (imsg_unexpected(m)) mlxd_match_remove(&pe->mq.unexpected, &m->ux);
      imsg_free(m);
    }
    while ((l = mlxd_match_pop(&pe->mq.unexpected))) imsg_free(MLXD_MATCH_ENTRY(l, tcp_imsg, ux));
  }
  if (t->wake_fd >= 0) close(t->wake_fd);
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
  t->base.ops = &tcp_ops;
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
    tcp_destroy(&t->base);
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
      tcp_destroy(&t->base);
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
      tcp_destroy(&t->base);
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
    tcp_destroy(&t->base);
    mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_TCP, "cannot create an eventfd for the TCP transport");
    mlxd_status_set_sys(st, "eventfd", e);
    return NULL;
  }
  double to = mlxd_tunable_double(MLXD_T_TIMEOUT);
  t->timeout_s = to > 0 ? to : 60;
  double spin = mlxd_tunable_double(MLXD_T_SPIN_US);
  t->spin_s = spin > 0 ? spin * 1e-6 : 0;
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  t->yield_spin = ncpu > 0 && size > ncpu;
  return &t->base;
}

static const mlxd_transport_ops tcp_ops = {"tcp", tcp_isend, tcp_irecv, tcp_waitall, tcp_destroy};
