/* Private: the message engine under every transport (shm.c, verbs.c,
 * tcp.c).
 *
 * The engine owns what a point-to-point transport does the same way
 * whatever moves its bytes: requests and their free list, tag matching of
 * a message's first chunk against the posted receives (match.h) and of a
 * receive against the messages that came first, the mismatch signatures
 * (mlxd_eng_sig_clash, tcp's too), the transport's first failure and the
 * failure record a rank publishes for its peers (mlxd_fail_rec: the shm
 * segment's rank records and the verbs record cells), and the wait: its
 * progress passes, spinning, liveness checks and sleeping, bounded as
 * transport.h says.
 *
 * A transport supplies how bytes move through an ops table (mlxd_eng_ops)
 * it sets once when it is made: a progress pass over its channels (shm:
 * the pairs' lanes; verbs: the completion queues, chunks, credits and pull
 * reads; tcp: its sockets through epoll), the liveness check of a wait, a
 * sleep until its channel moves,
 * its lock, its failure (published its own way), and the parts of a
 * request only it knows (its send lists; its single-copy and zero-copy
 * paths: shm's CMA sends, verbs' pull path). Its isend and irecv stay its
 * own and call the engine directly: the small-message post calls no op of
 * the table (releasing a request tests for the optional release op); a wait
 * calls progress once per pass and settle once at its end.
 *
 * Everything here runs with the transport's lock held (it is dropped only
 * inside mlxd_eng_wait, around a spin step or a sleep); nothing here is
 * thread-safe by itself. */
#ifndef MLXD_ENGINE_H
#define MLXD_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "transport/match.h"
#include "transport/transport.h"
#include "util/status.h"

enum { MLXD_ENG_SEND = 1, MLXD_ENG_RECV = 2 };
/* Where an unfinished request is: nowhere, the posted receives, the message
 * being received, or a list of its transport's (>= MLXD_ENG_OWN). */
enum { MLXD_ENG_NONE = 0, MLXD_ENG_POSTED, MLXD_ENG_CUR, MLXD_ENG_OWN };

/* The start of every request (a transport's request struct starts with it,
 * so an mlxd_req* and an mlxd_match_req* point to it). */
typedef struct mlxd_eng_req {
  mlxd_match_req m;     /* first: peer, tag, n, outcome (match.h) */
  int kind;             /* MLXD_ENG_SEND / _RECV */
  int where;            /* MLXD_ENG_* or the transport's own */
  char* buf;            /* the caller's (a send's is only read) */
  bool heap;            /* not req_size bytes (tcp's multi-fragment sends): freed, never kept */
  mlxd_match_link link; /* recv: in the posted queue; free: the free list */
} mlxd_eng_req;

/* A message that arrived (or is arriving) before its receive. */
typedef struct mlxd_eng_unexp {
  size_t len, got;
  mlxd_sig sig; /* the sender's call */
  char* buf;
  bool complete;
  bool pulled; /* verbs: it came by the pull path (read into buf) */
  /* The transport's own filling of it, until it completes (NULL: none):
   * verbs' pull read; tcp's message entry, whose fragments arrive at any
   * offset over several connections. A receive that takes it over is
   * bound by the transport (mlxd_eng_recv_match returns 2). */
  void* fill;
  mlxd_match_link link; /* in the unexpected queue */
} mlxd_eng_unexp;

/* Per peer: the message whose chunks are being received. req == ux == NULL
 * while active: the rest is dropped (a mismatch, or its receive gone). */
typedef struct mlxd_eng_cur {
  bool active;
  mlxd_eng_req* req;
  mlxd_eng_unexp* ux;
  uint64_t tag;
  size_t len, off;
} mlxd_eng_cur;

/* Per peer, what the engine keeps: its queues and its current message. */
typedef struct mlxd_eng_peer {
  mlxd_match_peer mq; /* posted receives, unexpected messages */
  mlxd_eng_cur cur;
} mlxd_eng_peer;

typedef struct mlxd_engine mlxd_engine;

/* What a transport supplies. Every member is called by the engine only,
 * with the transport's lock held (but lock), and says what shm, verbs and
 * tcp do. The router's composite (router.c, named "mixed") has no engine:
 * it drives its parts' waits in slices. */
typedef struct mlxd_eng_ops {
  /* One progress pass over every channel: move what can move, complete
   * requests. `idle`: a wait found nothing for a while (shm: a message
   * left in its lane for its receive is buffered now; verbs: unused, it
   * always buffers; tcp: unused, it always buffers). Returns the events
   * seen (0: nothing moved), or -1: another thread of this rank is
   * progressing the channel (tcp: its one poller), so this wait does not
   * spin but sleeps (the sleep op waits for that thread). Never blocks
   * beyond its lock (shm: a first contact may wait for a peer's pair,
   * bounded by MLXDIST_CONNECT_TIMEOUT; verbs: never; tcp: the lock is
   * dropped around a zero-timeout epoll_wait, repeated up to 16 times while
   * nothing comes unless short_pass); failures go to fail, not to the
   * caller. shm: progress_all; verbs: mlxd_vb_progress (completion queues,
   * chunks, credits, pull reads, failure records); tcp: a round over the
   * ready sockets (reads, writes, the dialer, lazy TLS handshakes). */
  int (*progress)(mlxd_engine* e, bool idle);
  /* A wait found no progress for check_s: check the peers reqs[0..n) wait
   * for (exited, closed, failed, heartbeats, the op clock; verbs also
   * probes them). true if the transport failed. Never blocks (shm may run
   * one more progress pass). shm: check_peers + mlxd_shm_live_check;
   * verbs: live_check; tcp: mlxd_tcp_live_check, after it moved the op
   * clock (op_clock_own). */
  bool (*check)(mlxd_engine* e, mlxd_req** reqs, int n, mlxd_wait_state* ws, double now);
  /* Sleep until the channel may have moved, at most max_s (> 0): the lock
   * is held on entry and exit and dropped while asleep. shm: its rank's
   * futex doorbell (unless a progress pass moves something first); verbs:
   * poll() on the completion channels and its eventfd (another thread
   * sleeping there: a 1 ms nap; a send waiting for credit: at most
   * VB_CREDIT_NAP_S); tcp: a blocking round of progress as the poller
   * (epoll_wait), or, with another thread polling, its condition variable
   * (at most 20 ms). Returns the events it handled (shm, verbs: 0, they
   * leave them to the next pass). Errors are ignored (the next pass sees
   * them). */
  int (*sleep)(mlxd_engine* e, double max_s);
  /* Take (called without it) / drop (with it) the transport's lock around a
   * spin step (shm: its futex lock; verbs, tcp: its pthread mutex). lock
   * blocks only for the lock's holder; neither fails. */
  void (*lock)(mlxd_engine* e);
  void (*unlock)(mlxd_engine* e);
  /* Fail the transport with st (the first failure wins, mlxd_eng_fail_first)
   * and tell the peers (shm: its rank record and doorbells; verbs: record
   * writes, best effort; tcp: an abort frame on each peer's first
   * connection, what the socket takes, then FIN; the dialer refuses new
   * peers with it). Completes every request it detaches. Never blocks. */
  void (*fail)(mlxd_engine* e, const mlxd_status* st);
  /* Wake the other threads of this rank waiting on this transport (shm: its
   * own doorbell; verbs: the eventfd of the channel sleeper; tcp: the
   * poller's eventfd and the condition variable). Never blocks. */
  void (*wake)(mlxd_engine* e);
  /* How peer pi is named in statuses, and its address (shm: its group rank
   * and "pid P"; verbs: pi and "<ip> qp <n>"; tcp: pi and "<ip>:<port>").
   * Never fail. */
  int (*name)(mlxd_engine* e, int pi);
  const char* (*addr)(mlxd_engine* e, int pi);
  /* Peer pi's queues and current message (every transport keeps them in
   * its peer table; tcp uses no current message). Never fails. */
  mlxd_eng_peer* (*peer)(mlxd_engine* e, int pi);
  /* Take an unfinished request out of the transport's own lists (where >=
   * MLXD_ENG_OWN: shm's send and ack queues; verbs' send queue, its pull
   * sends and reads; tcp: a receive's arriving message, dropped); the
   * engine has done the rest. Never fails. */
  void (*unlink)(mlxd_engine* e, mlxd_eng_req* r);
  /* Optional (NULL: none): release what a request holds of the transport's
   * before it is freed (verbs: the registrations of a pull send; tcp: a
   * failed transport's requests are freed, not kept, heap set). */
  void (*release)(mlxd_engine* e, mlxd_eng_req* r);
  /* The end of a waitall that found the transport not failed: look once
   * for a failure a peer published (it gave up on an operation, maybe this
   * one: transport.h). Never blocks. shm: the segment's failure counter,
   * the ranks' states only when it moved; verbs: the peers' record cells
   * (a failure relayed, a close noted); tcp: unless the wait's last pass
   * was its own (ws->polled), one zero-timeout round of progress. */
  void (*settle)(mlxd_engine* e, const mlxd_wait_state* ws);
  /* Optional (NULL: none): the first pass of a wait found requests pending
   * at `now` (verbs: their peers are probed at the first check). */
  void (*begin)(mlxd_engine* e, mlxd_req** reqs, int n, double now);
  /* Optional (NULL: every wait makes its first pass): true when a pass
   * would move nothing that anyone waits for but the wait's own requests:
   * no send queued for room, no peer asking for first contact. A wait whose
   * requests are all complete then makes no pass at all: posting already
   * polled (shm's irecv takes a small message that is there, its isend
   * writes it), so a small op polls once, not twice. Never blocks, lock
   * held. shm: shm_op_quiet. */
  bool (*quiet)(mlxd_engine* e);
} mlxd_eng_ops;

struct mlxd_engine {
  const mlxd_eng_ops* ops; /* set once by the transport */
  mlxd_layer layer;        /* MLXD_LAYER_SHM / _VERBS / _TCP */
  int me;                  /* this rank's name in statuses */
  mlxd_status err;         /* the first failure; err.code == 0 while none */
  size_t req_size;         /* the transport's request struct */
  bool ux_pooled;          /* buffer messages in mlxd_buffer_alloc (shm), else malloc (verbs) */
  bool yield;              /* spin with sched_yield (else a pause) */
  bool check_from_event;   /* liveness checks count check_s from the last event too */
  /* The op clock (ws->last_change) is the check op's to move (tcp: when
   * its requests' bytes move, a heartbeat being an event too), not every
   * event's. */
  bool op_clock_own;
  /* A hint, set while a slice (wait_slice) waits, and for the first pass
   * of a wait with nothing pending: progress passes stay short (tcp: one
   * epoll_wait), the router's other parts are waiting, or nobody is. */
  bool short_pass;
  bool deferred; /* the last pass left a message for its receive (shm) */
  int waiting;   /* threads inside mlxd_eng_wait */
  double spin_s, check_s, defer_s;
  mlxd_match_link* free_reqs;
  int nfree;
};

/* ---- requests ---- */

/* A zeroed request of `size` bytes (the transport's request struct, always
 * the same: e->req_size; a constant here, so the clearing is inlined), or
 * NULL (out of memory). */
static inline mlxd_eng_req* mlxd_eng_req_alloc(mlxd_engine* e, size_t size) {
  mlxd_match_link* l = e->free_reqs;
  void* r;
  if (l) {
    e->free_reqs = l->next;
    e->nfree--;
    r = MLXD_MATCH_ENTRY(l, mlxd_eng_req, link);
  } else {
    r = malloc(size);
    if (!r) return NULL;
  }
  memset(r, 0, size);
  return (mlxd_eng_req*)r;
}
/* Back to the free list (at most 64 kept), after the transport's release
 * op if it has one. */
static inline void mlxd_eng_req_release(mlxd_engine* e, mlxd_eng_req* r) {
  if (e->ops->release) e->ops->release(e, r);
  if (e->nfree < 64 && !r->heap) {
    r->link.next = e->free_reqs;
    e->free_reqs = &r->link;
    e->nfree++;
  } else {
    free(r);
  }
}
/* Free the free list (destroy). */
void mlxd_eng_req_drain(mlxd_engine* e);
/* r's outcome fields and place for (peer, addr, tag, sig, buf, n). */
static inline void mlxd_eng_req_init(mlxd_eng_req* r, int kind, int peer, const char* addr,
                                     uint64_t tag, const mlxd_sig* sig, const void* buf, size_t n) {
  r->kind = kind;
  r->m.peer = peer;
  r->m.addr = addr;
  r->m.tag = tag;
  r->m.sig = mlxd_sig_or_none(sig);
  r->buf = (char*)(uintptr_t)buf; /* a send's buffer is only read */
  r->m.n = n;
}
/* The status of a request that could not be made into *st: the transport's
 * failure, or out of memory. Returns its code. */
int mlxd_eng_req_refused(mlxd_engine* e, int kind, int peer, mlxd_status* st);

/* ---- failures ---- */

/* The transport's failure into st (if st); returns its code. */
static inline int mlxd_eng_fail_status(const mlxd_engine* e, mlxd_status* st) {
  if (st) *st = e->err;
  return e->err.code;
}
/* Fail the transport: peer pi is gone (why: ": its process exited"). */
void mlxd_eng_fail_lost(mlxd_engine* e, int pi, const char* why);
/* Fail the transport: out of memory handling peer pi's message. */
void mlxd_eng_fail_nomem(mlxd_engine* e, int pi, const char* what, size_t n);
/* Whether this rank's call `mine` and a message of the same operation from
 * peer (named `peer` in statuses, at addr) signed `theirs` disagree: if so
 * *st says how, naming both calls (mlxd_sig_check). Equal calls agree at
 * once, inline: every message of a matching collective takes this test, in
 * every transport (tcp included), and makes no call for it. */
static inline bool mlxd_eng_sig_clash(mlxd_status* st, mlxd_layer layer, int me,
                                      const mlxd_sig* mine, int peer, const char* addr,
                                      const mlxd_sig* theirs) {
  if (mine->op == theirs->op && mine->dtype == theirs->dtype && mine->size == theirs->size &&
      mine->count == theirs->count)
    return false;
  return mlxd_sig_check(st, layer, me, mine, peer, addr, theirs) != 0; /* its rule (match.h) */
}

/* A rank's failure as published for its peers (mlxd_status without its
 * pointers): shm's rank record in the host segment, verbs' record cell in
 * each peer's memory. Hostile when read: every field is validated. */
typedef struct mlxd_fail_rec {
  int32_t code, layer, peer, reporter, sys_errno;
  uint8_t has_peer, has_reporter, pad_[2];
  char syscall[24];
  char peer_addr[MLXD_ADDR_MAX];
  char detail[MLXD_MSG_MAX];
} mlxd_fail_rec;
void mlxd_fail_rec_fill(mlxd_fail_rec* rec, const mlxd_status* st);
/* The record (read as volatile, copied first) into st: an unknown layer
 * becomes `layer`, an unknown code MLXD_EREMOTE, peers and reporters must
 * be below `size`, the reporter is `from` unless the record relays one.
 * Returns the code. */
int mlxd_fail_rec_read(const volatile mlxd_fail_rec* rec, mlxd_layer layer, int size, int from,
                       mlxd_status* st);

/* ---- matching ---- */

/* The first chunk of a message (tag, len, the sender's signature `sent`)
 * from peer pi (p: its queues and current message):
 * compare signatures (a clash fails the transport: -1), bind it to the
 * first posted receive of that tag (a size mismatch fails that receive;
 * the bytes are dropped) or, when `buffer`, to a new unexpected buffer
 * (out of memory fails the transport: -1); without `buffer` and a receive:
 * 1, it stays where it is (e->deferred set). 0: cur is active. */
int mlxd_eng_arrive(mlxd_engine* e, int pi, mlxd_eng_peer* p, uint64_t tag, size_t len,
                    const mlxd_sig* sent, bool buffer);
/* The posted receive a message of (tag, sent) from pi matches, taken out of
 * the posted queue (NULL: none); -1 in *clash when the signatures clash
 * (the transport failed). For a transport's own kinds of first chunk
 * (verbs' pull offer). */
mlxd_eng_req* mlxd_eng_match_posted(mlxd_engine* e, int pi, mlxd_match_peer* mq, uint64_t tag,
                                    const mlxd_sig* sent, bool* clash);
/* A new unexpected message of len bytes (its buffer allocated), queued; NULL:
 * out of memory (the transport failed). */
mlxd_eng_unexp* mlxd_eng_unexp_new(mlxd_engine* e, int pi, mlxd_match_peer* mq, uint64_t tag,
                                   size_t len, const mlxd_sig* sent);
void mlxd_eng_unexp_free(mlxd_engine* e, mlxd_eng_unexp* u);
/* The current message ends: its receive or buffer is complete. */
static inline void mlxd_eng_finish(mlxd_eng_cur* cur) {
  if (cur->req) {
    cur->req->m.complete = true;
    cur->req->where = MLXD_ENG_NONE;
  }
  if (cur->ux) {
    cur->ux->complete = true;
    cur->ux->got = cur->len;
  }
  cur->active = false;
  cur->req = NULL;
  cur->ux = NULL;
}
/* Where the current message's bytes go (NULL: dropped). */
static inline char* mlxd_eng_dest(const mlxd_eng_cur* cur) {
  if (cur->req) return cur->req->buf;
  if (cur->ux) return cur->ux->buf;
  return NULL;
}
/* irecv's matching of r (initialised, not queued) against the messages from
 * its peer (p) that came first. -1: the signatures clash (the transport
 * failed; r is released); 0: none came, r is posted; 1: r took one over
 * (complete, or the current message; *taken: the message, out of the queue,
 * for the caller to free); 2: r matched one that the transport still fills
 * (u->fill: verbs' pull read, tcp's arriving fragments; *taken: it, out of
 * the queue; a size mismatch has failed r already): the transport binds
 * them. */
int mlxd_eng_recv_match(mlxd_engine* e, mlxd_eng_peer* p, mlxd_eng_req* r, mlxd_eng_unexp** taken);
static inline int mlxd_eng_recv(mlxd_engine* e, mlxd_eng_peer* p, mlxd_eng_req* r,
                                mlxd_eng_unexp** taken) {
  if (p->mq.unexpected.head) return mlxd_eng_recv_match(e, p, r, taken);
  /* Nothing came first (the common case): nothing to compare or take. */
  r->where = MLXD_ENG_POSTED;
  mlxd_match_push(&p->mq.posted, &r->link, r->m.tag);
  return 0;
}
/* Free the posted receives and unexpected messages of mq (destroy). */
void mlxd_eng_drain_queues(mlxd_engine* e, mlxd_match_peer* mq);

/* ---- waiting ---- */

static inline bool mlxd_eng_any_pending(mlxd_req* const* reqs, int n) {
  for (int i = 0; i < n; i++)
    if (reqs[i] && !((const mlxd_match_req*)reqs[i])->complete) return true;
  return false;
}
/* Drive the transport (ops) until no request of reqs is pending (true; also
 * when the transport failed) or until `until` (false, after at least one
 * pass). ws keeps the wait's clocks across calls (ws->polled: the last
 * pass was this thread's own, not another's: progress did not return -1).
 * A wait without progress checks its peers every check_s and never sleeps
 * longer than that. Lock held (dropped while spinning or asleep). */
bool mlxd_eng_wait(mlxd_engine* e, mlxd_req** reqs, int n, double until, mlxd_wait_state* ws);
/* The body of a transport's waitall and wait_slice (transport.h), the
 * transport's lock held: wait (mlxd_eng_wait), settle, then report and free
 * every request (waitall), or report the transport's failure (a slice). */
int mlxd_eng_waitall(mlxd_engine* e, mlxd_req** reqs, int n, mlxd_status* st);
int mlxd_eng_wait_slice(mlxd_engine* e, mlxd_req** reqs, int n, double max_s, mlxd_wait_state* ws,
                        mlxd_status* st);
/* The end of a waitall: the outcome (mlxd_match_result; a failure of the
 * transport meanwhile is not a success), then every request unlinked if
 * unfinished and released. Lock held. */
int mlxd_eng_wait_end(mlxd_engine* e, mlxd_req** reqs, int n, mlxd_status* st);
/* Take an unfinished request out of wherever it is (the rest of a current
 * message is dropped). Lock held. */
void mlxd_eng_unlink(mlxd_engine* e, mlxd_eng_req* r);

/* A pause in a spin loop. */
static inline void mlxd_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

#endif
