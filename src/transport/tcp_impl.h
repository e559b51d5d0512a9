/* Private to the TCP transport: its state, shared by tcp.c (sending,
 * progress, failure), tcp_recv.c (receiving, matching), tcp_setup.c (create / destroy) and tcp_tls.c (the
 * TLS variant of the socket I/O). The design is described in tcp.c. */
#ifndef MLXD_TCP_IMPL_H
#define MLXD_TCP_IMPL_H

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/types.h>

#include "core/buffer.h"
#include "transport/engine.h"
#include "transport/liveness.h"
#include "transport/match.h"
#include "transport/tcp.h"
#include "transport/tcp_wire.h"
#include "transport/tls.h"
#include "transport/transport.h"

#define TCP_HDR MLXD_TCP_HDR
#define TCP_FRAG_MAX ((size_t)MLXD_TCP_FRAG_MAX) /* largest fragment of a large message */
#define TCP_SPLIT_MIN ((size_t)64 << 10)         /* messages above this use every connection */
#define TCP_RBUF ((size_t)64 << 10)              /* per-connection receive staging buffer */
#define TCP_IO_MAX ((size_t)1 << 30)             /* at most this many bytes per syscall */
#define TCP_IOV 64                               /* iovec entries per sendmsg */
#define TCP_SOCKBUF (4 << 20)                    /* SO_SNDBUF / SO_RCVBUF we ask for */
#define TCP_BLOCK_MS 1000                        /* longest single blocking poll */
#define TCP_CV_MS 20                             /* longest single condition-variable sleep */
#define MLXD_TCP_CHECK_S 0.05                    /* liveness checks of a wait (engine check_s) */
#define TCP_TLS_WBUF ((size_t)16 << 10)          /* TLS: headers and small payloads coalesced */
#ifndef TCP_RTO_MAX_MS
#define TCP_RTO_MAX_MS 44 /* Linux 6.15 <linux/tcp.h>; libc headers may not have it yet */
#endif
/* destroy: a failed transport drains this long at most; a healthy one waits for
 * its last bytes to be acknowledged until none went out for MLXDIST_TIMEOUT (and
 * at least this long); neither waits for the peers' FINs (tcp_setup.c close_all) */
#define TCP_CLOSE_MS 500
/* Free list: at most this many message entries kept per transport for
 * reuse (a window of messages arriving before their receives fits); the
 * requests' is the engine's (engine.h) */
#define TCP_POOL_MAX 128

/* ASan: a block in the message entries' free list is poisoned but for its
 * link (LeakSanitizer follows no pointer in poisoned memory: a transport
 * never destroyed before exit would show its free list as leaked), so a use
 * after its entry was freed is still reported as one. */
#if defined(__SANITIZE_ADDRESS__)
#define TCP_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TCP_ASAN 1
#endif
#endif
#ifdef TCP_ASAN
#include <sanitizer/asan_interface.h>
#define TCP_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define TCP_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define TCP_POISON(p, n) ((void)(p), (void)(n))
#define TCP_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

typedef struct tcp_frag tcp_frag;
typedef struct tcp_imsg tcp_imsg;

/* A block in a free list (its first bytes while it is there). */
typedef struct tcp_free {
  struct tcp_free* next;
} tcp_free;
typedef struct tcp_pool {
  tcp_free* head;
  int n; /* blocks in the list, at most TCP_POOL_MAX */
} tcp_pool;

/* Where an unfinished tcp request is, past the engine's places: a receive
 * bound to a message whose fragments arrive (im), a send whose fragments
 * are queued on the connections. */
enum { TCP_W_MSG = MLXD_ENG_OWN, TCP_W_SENT };

/* A request: the engine's part first (engine.h: peer, tag, n, outcome,
 * kind, buffer, its place), so an mlxd_req* points to it. A request of one
 * fragment (every receive) is a TCP_REQ_SMALL block from the engine's free
 * list; a send of several is one heap block (q.heap) with its fragments. */
typedef struct tcp_req {
  mlxd_eng_req q;
  size_t done;       /* bytes moved so far (the op clock: tcp.c wait) */
  size_t frags_left; /* send: fragments not yet fully written */
  tcp_imsg* im;      /* recv: the incoming message it is bound to */
  tcp_frag* frags;   /* send: fragment array (same allocation) */
} tcp_req;

struct tcp_frag {
  tcp_req* req;     /* NULL for a control frame (tcp_live.c) */
  const char* data; /* a control frame's payload */
  unsigned char hdr[TCP_HDR];
  size_t off, len;
  size_t sent; /* bytes of header + payload written */
  tcp_frag* next;
};

/* A message being received (or buffered because no receive was posted):
 * the engine's unexpected-message part first (u: len, got = payload bytes
 * received, the sender's call, buf = the receive's buffer or an owned one,
 * complete; u.fill = the message itself while it is unexpected and still
 * arriving, so a receive that takes it over is bound here). It is in its
 * peer's `arriving` queue until its last fragment is in, and in the peer's
 * unexpected queue (u.link) while it has no receive (req == NULL and not
 * discarded). */
struct tcp_imsg {
  mlxd_eng_unexp u;
  size_t announced; /* payload bytes of the fragments whose header arrived */
  bool owned;       /* u.buf is ours (mlxd_buffer_alloc) */
  bool discard;     /* size mismatch: drain and drop */
  int peer;
  uint64_t charged; /* bytes charged to the peer's unexpected budget */
  tcp_req* req;
  mlxd_match_link arr; /* in arriving (tag = the message's tag) */
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
  /* TLS only (ssl != NULL): */
  mlxd_tls_conn* ssl;
  unsigned char* wbuf; /* the next queue bytes, coalesced (TCP_TLS_WBUF) */
  size_t wpos, wlen;
  bool want_write; /* a read needs the socket writable first */
  bool kick;       /* read before polling: OpenSSL may hold bytes from the handshake */
  bool tls_hs;     /* lazy: its handshake runs (no data until it is done; tcp_tls.c) */
  double tls_by;   /* lazy: the handshake's bound (MLXDIST_CONNECT_TIMEOUT from its start) */
  char tls_why[200];
  /* Control frames (tcp_live.c; only the first connection to a peer sends
   * them): the one being received, and the two this side sends. */
  bool ctrl;          /* the current payload is a control frame's */
  unsigned ctrl_step; /* MLXD_TCP_CTRL_BEAT / _ABORT */
  unsigned char ctrl_buf[MLXD_TCP_ABORT_MAX];
  tcp_frag beat, abort;
  char beat_note[MLXD_TCP_BEAT_MAX];
  double beat_at; /* mlxd_now() when its last heartbeat was queued (0: never) */
  bool ep_out;    /* registered for EPOLLOUT too */
} tcp_conn;

typedef struct tcp_peer {
  /* The engine's queues: posted receives, unexpected messages (ep.cur is
   * unused: several messages arrive at once, each bound in its tcp_imsg) */
  mlxd_eng_peer ep;
  mlxd_match_queue arriving; /* messages with fragments still to come */
  unsigned rr;
  bool closed;              /* every connection reached EOF with nothing pending */
  uint64_t ux_charged;      /* bytes of unexpected messages buffered (tcp_wire.h) */
  char addr[MLXD_ADDR_MAX]; /* "10.0.0.2:41000"; "" when unknown (e.g. AF_UNIX) */
  double heard;             /* mlxd_now() when a byte from it was last read */
  char note[MLXD_NOTE_MAX]; /* what it said it was doing (its last heartbeat) */
  bool wanted;              /* lazy: its connections were asked of the dialer */
  int nup;                  /* connections made to it (nconn: all) */
} tcp_peer;

typedef struct tcp_transport {
  mlxd_transport base;
  /* The message engine (engine.h): requests and their free list, matching,
   * the first failure (eng.err; err.code == 0 while none), the wait. */
  mlxd_engine eng;
  int nconn;
  /* size entries; conns[p]: the nconn connections to p, allocated when p
   * is first used (mlxd_tcp_peer_conns; all at creation when eager), NULL
   * until then, so a rank pays only for the peers it talks to. Allocated
   * under mu (or by create before any other thread sees t); never moved or
   * freed before destroy (epoll's data points into them). Connection
   * p * nconn + c: mlxd_tcp_conn_at. */
  tcp_conn** conns;
  /* size entries, zero until a peer is used; conns and peers are ztables
   * (util/ztable.h): pages of peers never used are never touched */
  tcp_peer* peers;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool progressing;
  bool in_poll;
  bool completed; /* something completed since the last broadcast */
  /* Bumped (mu held) with every completed = true: a progressor polling
   * with mu dropped (tcp.c progress_round) reads it, relaxed, to stop
   * early; a hint only, it acts on nothing it has not read under mu. */
  _Atomic unsigned gen;
  int wake_fd;
  mlxd_live_cfg live;                 /* MLXDIST_TIMEOUT, _WARN_AFTER, _OP_TIMEOUT (liveness.h) */
  int watch;                          /* the heartbeat's watchdog registration (0: none) */
  char abort_pay[MLXD_TCP_ABORT_MAX]; /* this rank's failure record, once failed */
  size_t abort_len;
  uint64_t ux_budget; /* per peer (MLXDIST_TCP_UNEXPECTED_MB) */
  mlxd_tls* tls;      /* MLXDIST_TLS=1; NULL: plain sockets */
  int tls_hs_n;       /* lazy: connections whose TLS handshake runs (tls_hs) */
  int epfd;           /* every connected socket, the wake eventfd, the dialer's fd */
  struct epoll_event* evs;
  int nevs;
  mlxd_tcp_dialer* dial; /* lazy: makes connections on first use (NULL: all made at creation) */
  int nconnected;        /* connections made */
  /* The message entries' free list (mu held; mlxd_tcp_pool_get/put), so
   * that with the engine's free list of requests a small message allocates
   * nothing; at most TCP_POOL_MAX blocks, freed by destroy. */
  tcp_pool imsg_pool;
} tcp_transport;

/* A request of at most one fragment (every receive uses one too). */
#define TCP_REQ_SMALL (sizeof(tcp_req) + sizeof(tcp_frag))
#define TCP_OF(e) ((tcp_transport*)((char*)(e)-offsetof(tcp_transport, eng)))

/* A zeroed block of size bytes from pool (every block of a pool has the
 * same size), or a new one; NULL when out of memory. mu held. */
static inline void* mlxd_tcp_pool_get(tcp_pool* pool, size_t size) {
  tcp_free* b = pool->head;
  if (!b) return calloc(1, size);
  TCP_UNPOISON(b + 1, size - sizeof *b);
  pool->head = b->next;
  pool->n--;
  memset(b, 0, size);
  return b;
}

/* Give p (a block of size bytes from mlxd_tcp_pool_get) back: kept in pool
 * while it holds fewer than TCP_POOL_MAX, else freed. mu held. */
static inline void mlxd_tcp_pool_put(tcp_pool* pool, void* p, size_t size) {
  if (pool->n >= TCP_POOL_MAX) {
    free(p);
    return;
  }
  tcp_free* b = p;
  b->next = pool->head;
  pool->head = b;
  pool->n++;
  TCP_POISON(b + 1, size - sizeof *b);
}

/* Free every block of pool (destroy). */
static inline void mlxd_tcp_pool_drain(tcp_pool* pool, size_t size) {
  while (pool->head) {
    tcp_free* b = pool->head;
    TCP_UNPOISON(b + 1, size - sizeof *b);
    pool->head = b->next;
    free(b);
  }
  pool->n = 0;
}

/* Free request r (mu held; engine.h: a small one goes back to the free
 * list, unless the transport failed: tcp.c's release op). */
static inline void mlxd_tcp_req_free(tcp_transport* t, tcp_req* r) {
  mlxd_eng_req_release(&t->eng, &r->q);
}

extern const mlxd_transport_ops mlxd_tcp_ops;

/* Connection i (peer i / nconn) if its peer's connections exist, else NULL
 * (never used: no socket, nothing queued). mu held, or creation/destroy. */
static inline tcp_conn* mlxd_tcp_conn_at(const tcp_transport* t, int i) {
  tcp_conn* a = t->conns ? t->conns[i / t->nconn] : NULL;
  return a ? &a[i % t->nconn] : NULL;
}
/* tcp_setup.c: peer's nconn connections, allocated and set up (fd -1) on
 * first use (mu held, or creation). Does not block. NULL with st set
 * (MLXD_ENOMEM naming the peer) when out of memory; t is left as it was. */
tcp_conn* mlxd_tcp_peer_conns(tcp_transport* t, int peer, mlxd_status* st);

/* Where a fragment's payload comes from. */
static inline const char* mlxd_tcp_frag_data(const tcp_frag* f) {
  return f->req ? f->req->q.buf + f->off : f->data;
}

/* tcp.c: the engine's ops and settings (creation). */
void mlxd_tcp_engine_init(tcp_transport* t);
/* tcp.c (mu held): account w bytes written from the head of c's queue;
 * write what the socket takes of c's queue (0 or an errno, -2: TLS error);
 * fail the transport for good (the first failure wins); wake a progressor
 * blocked in poll. */
void mlxd_tcp_conn_advance(tcp_transport* t, tcp_conn* c, size_t w);
int mlxd_tcp_conn_write(tcp_transport* t, tcp_conn* c);
/* tcp.c (mu held): register c for EPOLLOUT exactly while it has bytes to
 * write (or a TLS read waits for writability). */
void mlxd_tcp_conn_arm(tcp_transport* t, tcp_conn* c);
/* tcp.c (mu held): a lazy transport needs peer (an isend or irecv names it):
 * ask the dialer once; a failure fails the transport. */
void mlxd_tcp_want(tcp_transport* t, int peer);
/* tcp.c: put the dialer's fd in the epoll set (creation). 0 or -1 (errno). */
int mlxd_tcp_dial_attach(tcp_transport* t);
/* tcp.c (mu held): run the dialer's step (progress, or the heartbeat). */
void mlxd_tcp_dial_step(tcp_transport* t);
/* tcp_recv.c: read what c has (mu held); 0, or an errno / -1 at the end of
 * the stream (the caller fails the transport). */
int mlxd_tcp_conn_read(tcp_transport* t, tcp_conn* c);
int mlxd_tcp_irecv(mlxd_transport* tt, int peer, uint64_t tag, const mlxd_sig* sig, void* buf,
                   size_t n, mlxd_req** out, mlxd_status* st);
/* tcp.c: the connection to peer is gone (syscall/err: how we found out). */
void mlxd_tcp_fail_lost(tcp_transport* t, int peer, const char* syscall, int err);
void mlxd_tcp_fail(tcp_transport* t, const mlxd_status* st);
void mlxd_tcp_wake(tcp_transport* t);

/* tcp_live.c: liveness apart from progress (liveness.h), control frames. */
/* Register / remove the heartbeat (end of create / start of destroy,
 * without mu). */
void mlxd_tcp_live_start(tcp_transport* t);
void mlxd_tcp_live_stop(tcp_transport* t);
/* c (a peer's first connection) of a transport that just failed: queue the
 * failure record after whatever fragment is partly written, drop the rest,
 * and write what the socket takes at once (mu held; the caller failed the
 * dropped fragments' requests). prepare encodes t->err once first. */
void mlxd_tcp_relay_prepare(tcp_transport* t);
void mlxd_tcp_relay_conn(tcp_transport* t, tcp_conn* c);
/* The transport's abort op (transport.h). */
void mlxd_tcp_abort(mlxd_transport* t, const mlxd_status* st);
/* The control frame whose payload c->ctrl_buf holds is in (mu held). */
void mlxd_tcp_ctrl_done(tcp_transport* t, tcp_conn* c);

/* A wait's liveness clocks (transport.h: start, last_change, warned are
 * the ones the checks use). */
typedef mlxd_wait_state tcp_live_wait;
/* Check the peers of the pending reqs (mu held; the engine's check op, every
 * MLXD_TCP_CHECK_S of a wait without events): fails the transport for a
 * silent peer or the op timeout (returns true), prints the one warning. */
bool mlxd_tcp_live_check(tcp_transport* t, tcp_req* const* reqs, int n, tcp_live_wait* w,
                         double now);

/* tcp_setup.c */
void mlxd_tcp_destroy(mlxd_transport* tt);
void mlxd_tcp_forget(mlxd_transport* tt);

/* tcp_tls.c: the TLS variants (mu held). Handshake every connection
 * (inside create). */
int mlxd_tcp_tls_start(tcp_transport* t, mlxd_status* st);
/* Lazy (mu held; none blocks). begin: the dialer handed c over (attached):
 * its SSL object, and the first step of its handshake (a client sends its
 * hello at once); 0, or out of memory (st; the caller fails the transport).
 * step: one step of c's handshake: 0 when it is complete (now or before:
 * c->kick set so that its first read runs; queued bytes go out through the
 * usual writes), 1 while it waits for the socket (c->want_write says
 * which way; register with mlxd_tcp_conn_arm), -1 when it failed (the
 * transport failed, naming the peer). step_all: step every running
 * handshake (the dialer's step: a rank busy outside mlxdist still answers
 * from its heartbeat tick). before_wait: fail the transport for a
 * handshake past its bound (naming the peer), and return the wait's bound
 * in ms (0: OpenSSL holds bytes epoll cannot see; at most the next
 * handshake's bound). */
int mlxd_tcp_tls_begin(tcp_transport* t, tcp_conn* c, mlxd_status* st);
int mlxd_tcp_tls_step(tcp_transport* t, tcp_conn* c);
void mlxd_tcp_tls_step_all(tcp_transport* t);
int mlxd_tcp_tls_before_wait(tcp_transport* t, int timeout_ms);
/* Write as much of c's queue as TLS takes: 0, an errno, or -2 (TLS error,
 * c->tls_why says why). */
int mlxd_tcp_tls_write(tcp_transport* t, tcp_conn* c);
/* As recv(MSG_DONTWAIT): > 0, 0 at end of stream, -1 with errno (EAGAIN:
 * would block; EPROTO: TLS error, c->tls_why says why). */
ssize_t mlxd_tcp_tls_recv(tcp_conn* c, void* buf, size_t n);

/* Requests and incoming messages (mu held). */
/* Something completed (or the transport failed): waiters are to look. */
static inline void mlxd_tcp_completed(tcp_transport* t) {
  t->completed = true;
  /* every writer holds mu: no lost increment without an atomic add */
  atomic_store_explicit(&t->gen, atomic_load_explicit(&t->gen, memory_order_relaxed) + 1,
                        memory_order_relaxed);
}

static inline void mlxd_tcp_req_complete(tcp_transport* t, tcp_req* r) {
  if (!r->q.m.complete) {
    r->q.m.complete = true;
    r->q.where = MLXD_ENG_NONE;
    mlxd_tcp_completed(t);
  }
}

static inline void mlxd_tcp_req_fail(tcp_transport* t, tcp_req* r, int code) {
  if (r->q.m.complete) return;
  r->q.m.code = code;
  mlxd_tcp_req_complete(t, r);
}

/* Free m's buffer (if owned) and give its charge back to the peer's budget. */
static inline void mlxd_tcp_imsg_release(tcp_transport* t, tcp_imsg* m) {
  if (m->owned) mlxd_buffer_free(m->u.buf, m->u.len);
  m->u.buf = NULL;
  m->owned = false;
  t->peers[m->peer].ux_charged -= m->charged;
  m->charged = 0;
}

/* Free m (mu held): its buffer, and the entry back to the free list. */
static inline void mlxd_tcp_imsg_free(tcp_transport* t, tcp_imsg* m) {
  mlxd_tcp_imsg_release(t, m);
  mlxd_tcp_pool_put(&t->imsg_pool, m, sizeof *m);
}

#endif
