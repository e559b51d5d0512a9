/* The message engine (engine.h): requests, matching, failures and the wait
 * loop, written once for the shm, verbs and tcp transports. */
#include "transport/engine.h"

#include <assert.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/buffer.h"
#include "util/clock.h"

/* ---- requests ---- */

void mlxd_eng_req_drain(mlxd_engine* e) {
  while (e->free_reqs) {
    mlxd_match_link* nx = e->free_reqs->next;
    free(MLXD_MATCH_ENTRY(e->free_reqs, mlxd_eng_req, link));
    e->free_reqs = nx;
  }
  e->nfree = 0;
}

int mlxd_eng_req_refused(mlxd_engine* e, int kind, int peer, mlxd_status* st) {
  if (e->err.code) return mlxd_eng_fail_status(e, st);
  int rc = mlxd_fail_at(st, MLXD_ENOMEM, e->layer, "out of memory for a %s request",
                        kind == MLXD_ENG_SEND ? "send" : "receive");
  mlxd_status_set_peer(st, e->ops->name(e, peer), e->ops->addr(e, peer));
  return rc;
}

/* ---- failures ---- */

void mlxd_eng_fail_lost(mlxd_engine* e, int pi, const char* why) {
  mlxd_status s;
  mlxd_match_lost(&s, e->layer, e->ops->name(e, pi), e->ops->addr(e, pi), why, NULL, 0);
  e->ops->fail(e, &s);
}

void mlxd_eng_fail_nomem(mlxd_engine* e, int pi, const char* what, size_t n) {
  mlxd_status s;
  int name = e->ops->name(e, pi);
  mlxd_fail_at(&s, MLXD_ENOMEM, e->layer, "out of memory %s (%zu bytes) from rank %d", what, n,
               name);
  mlxd_status_set_peer(&s, name, e->ops->addr(e, pi));
  e->ops->fail(e, &s);
}

/* The clash of this rank's call with peer pi's message fails the transport;
 * other threads of this rank may sleep (from irecv). */
static bool clash(mlxd_engine* e, int pi, const mlxd_sig* mine, const mlxd_sig* theirs) {
  mlxd_status s;
  if (!mlxd_eng_sig_clash(&s, e->layer, e->me, mine, e->ops->name(e, pi), e->ops->addr(e, pi),
                          theirs))
    return false;
  e->ops->fail(e, &s);
  e->ops->wake(e);
  return true;
}

/* System calls a published failure may name (the name is copied back to
 * one of these static strings; anything else is dropped). */
static const char* const k_syscalls[] = {
    "recv",      "sendmsg", "poll",  "fcntl", "eventfd", "process_vm_readv", "shm_open",
    "ftruncate", "mmap",    "fstat", "futex", "connect", "accept",           "getsockopt",
};

void mlxd_fail_rec_fill(mlxd_fail_rec* rec, const mlxd_status* st) {
  memset(rec, 0, sizeof *rec);
  rec->code = st->code;
  rec->layer = st->layer;
  rec->peer = st->peer;
  rec->reporter = st->reporter;
  rec->sys_errno = st->sys_errno;
  rec->has_peer = st->has_peer;
  rec->has_reporter = st->has_reporter;
  snprintf(rec->syscall, sizeof rec->syscall, "%s", st->syscall ? st->syscall : "");
  snprintf(rec->peer_addr, sizeof rec->peer_addr, "%s", st->peer_addr);
  snprintf(rec->detail, sizeof rec->detail, "%s", st->msg);
}

/* Copy a string of at most cap - 1 bytes that may be unterminated, keeping
 * only printable ASCII. */
static void copy_text(char* dst, const char* src, size_t cap) {
  size_t i = 0;
  for (; i + 1 < cap && src[i]; i++) dst[i] = (src[i] >= 0x20 && src[i] < 0x7f) ? src[i] : '?';
  dst[i] = '\0';
}

int mlxd_fail_rec_read(const volatile mlxd_fail_rec* rec, mlxd_layer layer, int size, int from,
                       mlxd_status* st) {
  mlxd_fail_rec v;
  const volatile unsigned char* src = (const volatile unsigned char*)rec;
  unsigned char* dst = (unsigned char*)&v;
  for (size_t i = 0; i < sizeof v; i++) dst[i] = src[i]; /* once: the writer may change it */
  char detail[MLXD_MSG_MAX];
  copy_text(detail, v.detail, sizeof detail);
  int lay = v.layer > MLXD_LAYER_NONE && v.layer <= MLXD_LAYER_LAST ? v.layer : (int)layer;
  int code = v.code > MLXD_OK && v.code <= MLXD_ECALLBACK ? v.code : MLXD_EREMOTE;
  mlxd_fail_at(st, code, (mlxd_layer)lay, "%s", detail[0] ? detail : "failed");
  if (v.has_peer == 1 && v.peer >= 0 && v.peer < size) {
    char addr[MLXD_ADDR_MAX];
    copy_text(addr, v.peer_addr, sizeof addr);
    mlxd_status_set_peer(st, v.peer, addr);
  }
  v.syscall[sizeof v.syscall - 1] = '\0';
  const char* sc = NULL;
  for (size_t i = 0; i < sizeof k_syscalls / sizeof k_syscalls[0]; i++)
    if (strcmp(v.syscall, k_syscalls[i]) == 0) sc = k_syscalls[i];
  int err = v.sys_errno > 0 && v.sys_errno < 4096 ? v.sys_errno : 0;
  if (sc || err) mlxd_status_set_sys(st, sc, err);
  mlxd_status_set_reporter(st, v.has_reporter == 1 && v.reporter >= 0 && v.reporter < size
                                   ? v.reporter
                                   : from);
  return code;
}

/* ---- matching ---- */

/* Whether a message of (tag, sent) from pi clashes with r, the posted
 * receive it matches, or without one any posted receive of the same
 * operation (the transport failed). */
static bool posted_clash(mlxd_engine* e, int pi, mlxd_match_peer* mq, mlxd_eng_req* r, uint64_t tag,
                         const mlxd_sig* sent) {
  if (sent->op == MLXD_SIG_NONE) return false;
  mlxd_eng_req* same = r;
  if (!same) same = MLXD_MATCH_ENTRY(mlxd_match_find_op(&mq->posted, tag), mlxd_eng_req, link);
  return same && clash(e, pi, &same->m.sig, sent);
}

mlxd_eng_req* mlxd_eng_match_posted(mlxd_engine* e, int pi, mlxd_match_peer* mq, uint64_t tag,
                                    const mlxd_sig* sent, bool* clashed) {
  mlxd_eng_req* r = MLXD_MATCH_ENTRY(mlxd_match_find(&mq->posted, tag), mlxd_eng_req, link);
  *clashed = posted_clash(e, pi, mq, r, tag, sent);
  if (*clashed) return NULL;
  if (r) {
    mlxd_match_remove(&mq->posted, &r->link);
    r->where = MLXD_ENG_NONE;
  }
  return r;
}

mlxd_eng_unexp* mlxd_eng_unexp_new(mlxd_engine* e, int pi, mlxd_match_peer* mq, uint64_t tag,
                                   size_t len, const mlxd_sig* sent) {
  mlxd_eng_unexp* u = calloc(1, sizeof *u);
  char* buf = NULL;
  if (len) buf = e->ux_pooled ? mlxd_buffer_alloc(len) : malloc(len);
  if (!u || (len && !buf)) {
    free(u);
    if (e->ux_pooled)
      mlxd_buffer_free(buf, len);
    else
      free(buf);
    mlxd_eng_fail_nomem(e, pi, "buffering a message that arrived before its receive", len);
    return NULL;
  }
  u->len = len;
  u->buf = buf;
  u->sig = *sent;
  mlxd_match_push(&mq->unexpected, &u->link, tag);
  return u;
}

void mlxd_eng_unexp_free(mlxd_engine* e, mlxd_eng_unexp* u) {
  if (e->ux_pooled)
    mlxd_buffer_free(u->buf, u->len);
  else
    free(u->buf);
  free(u);
}

int mlxd_eng_arrive(mlxd_engine* e, int pi, mlxd_eng_peer* p, uint64_t tag, size_t len,
                    const mlxd_sig* sent, bool buffer) {
  mlxd_match_peer* mq = &p->mq;
  mlxd_eng_cur* cur = &p->cur;
  mlxd_eng_req* r = MLXD_MATCH_ENTRY(mlxd_match_find(&mq->posted, tag), mlxd_eng_req, link);
  if (!r && !buffer) {
    e->deferred = true;
    return 1;
  }
  if (posted_clash(e, pi, mq, r, tag, sent)) return -1;
  cur->active = true;
  cur->tag = tag;
  cur->len = len;
  cur->off = 0;
  cur->req = NULL;
  cur->ux = NULL;
  if (r) {
    mlxd_match_remove(&mq->posted, &r->link);
    if (r->m.n != len) {
      r->where = MLXD_ENG_NONE;
      mlxd_match_req_mismatch(&r->m, len);
    } else {
      r->where = MLXD_ENG_CUR;
      cur->req = r;
    }
    return 0;
  }
  cur->ux = mlxd_eng_unexp_new(e, pi, mq, tag, len, sent);
  return cur->ux ? 0 : -1;
}

int mlxd_eng_recv_match(mlxd_engine* e, mlxd_eng_peer* p, mlxd_eng_req* r, mlxd_eng_unexp** taken) {
  mlxd_match_peer* mq = &p->mq;
  mlxd_eng_cur* cur = &p->cur;
  uint64_t tag = r->m.tag;
  /* Compare with a message of the same operation that arrived first. */
  mlxd_eng_unexp* u = MLXD_MATCH_ENTRY(mlxd_match_find(&mq->unexpected, tag), mlxd_eng_unexp, link);
  mlxd_eng_unexp* same = u;
  if (!same && r->m.sig.op != MLXD_SIG_NONE)
    same = MLXD_MATCH_ENTRY(mlxd_match_find_op(&mq->unexpected, tag), mlxd_eng_unexp, link);
  if (same && clash(e, r->m.peer, &r->m.sig, &same->sig)) {
    mlxd_eng_req_release(e, r);
    return -1;
  }
  if (!u) {
    r->where = MLXD_ENG_POSTED;
    mlxd_match_push(&mq->posted, &r->link, tag);
    return 0;
  }
  /* Take over a message that arrived first. */
  mlxd_match_remove(&mq->unexpected, &u->link);
  if (u->fill) { /* still being filled (a pull read, fragments): the transport binds r */
    if (u->len != r->m.n) mlxd_match_req_mismatch(&r->m, u->len);
    *taken = u;
    return 2;
  }
  if (u->len != r->m.n) {
    mlxd_match_req_mismatch(&r->m, u->len);
    if (cur->ux == u) cur->ux = NULL; /* drop the rest */
  } else {
    if (u->got) memcpy(r->buf, u->buf, u->got);
    if (u->complete) {
      r->m.complete = true;
    } else {
      cur->ux = NULL;
      cur->req = r;
      r->where = MLXD_ENG_CUR;
    }
  }
  *taken = u; /* the caller counts a pulled message's bytes, then frees it */
  return 1;
}

void mlxd_eng_drain_queues(mlxd_engine* e, mlxd_match_peer* mq) {
  mlxd_match_link* l;
  while ((l = mlxd_match_pop(&mq->posted)))
    mlxd_eng_req_release(e, MLXD_MATCH_ENTRY(l, mlxd_eng_req, link));
  while ((l = mlxd_match_pop(&mq->unexpected)))
    mlxd_eng_unexp_free(e, MLXD_MATCH_ENTRY(l, mlxd_eng_unexp, link));
}

/* ---- waiting ---- */

bool mlxd_eng_wait(mlxd_engine* e, mlxd_req** reqs, int n, double until, mlxd_wait_state* ws) {
  const mlxd_eng_ops* ops = e->ops;
  bool done = true;
  e->waiting++;
  if (!ws->started) {
    /* The first pass reads no clock: a small message that is already there
     * (the common case of a small collective) costs one pass. It runs even
     * with nothing pending (sends written eagerly, messages that came
     * first): every wait moves its transport once, which is what drives a
     * send left queued by an earlier post while this rank's later waits
     * are on another transport (the router); but then a short one (tcp:
     * one epoll_wait, not a spinning batch). */
    bool was = e->short_pass;
    if (!mlxd_eng_any_pending(reqs, n)) {
      if (ops->quiet && !e->err.code && ops->quiet(e)) {
        ws->polled = true;
        goto out;
      }
      e->short_pass = true;
    }
    int ev = e->err.code ? 0 : ops->progress(e, false);
    e->short_pass = was;
    ws->polled = ev >= 0;
    if (!mlxd_eng_any_pending(reqs, n) || e->err.code) goto out;
    double now = mlxd_now();
    *ws = (mlxd_wait_state){.started = true,
                            .polled = ev >= 0,
                            .start = now,
                            .last_change = now,
                            .next_check = now,
                            .last_event = now};
    if (ops->begin) ops->begin(e, reqs, n, now);
    if (ev > 0 && now >= until) {
      done = false;
      goto out;
    }
  }
  for (;;) {
    int ev = e->err.code ? 0 : ops->progress(e, false);
    ws->polled = ev >= 0;
    /* idle for defer_s: buffer the messages left for their receives */
    if (!ev && e->deferred && !e->err.code && mlxd_now() - ws->last_event >= e->defer_s)
      ev = ops->progress(e, true);
    if (!mlxd_eng_any_pending(reqs, n) || e->err.code) break;
    double now = mlxd_now();
    if (ev > 0) {
      ws->last_event = now;
      if (!e->op_clock_own) ws->last_change = now;
      if (e->check_from_event) ws->next_check = now;
      if (now >= until) {
        done = false;
        break;
      }
      continue;
    }
    if (now - ws->next_check >= e->check_s) {
      ws->next_check = now;
      if (ops->check(e, reqs, n, ws, now)) break;
    }
    if (now >= until) {
      done = false;
      break;
    }
    /* spin, unless another thread is progressing (ev < 0: sleep on it) */
    if (ev == 0 && now - ws->last_event < e->spin_s) {
      ops->unlock(e);
      if (e->yield)
        sched_yield();
      else
        mlxd_cpu_relax();
      ops->lock(e);
      continue;
    }
    if (e->deferred && ops->progress(e, true) > 0) continue;
    double left = e->check_s - (now - ws->next_check);
    if (until - now < left) left = until - now;
    if (ops->sleep(e, left) > 0) { /* it handled events: spin again after them */
      ws->last_event = mlxd_now();
      if (!e->op_clock_own) ws->last_change = ws->last_event;
    }
  }
out:
  e->waiting--;
  return done;
}

void mlxd_eng_unlink(mlxd_engine* e, mlxd_eng_req* r) {
  mlxd_eng_peer* p = e->ops->peer(e, r->m.peer);
  if (r->where == MLXD_ENG_POSTED) {
    mlxd_match_remove(&p->mq.posted, &r->link);
  } else if (r->where == MLXD_ENG_CUR) {
    if (p->cur.req == r) p->cur.req = NULL; /* the rest of it is dropped */
  } else if (r->where >= MLXD_ENG_OWN) {
    e->ops->unlink(e, r);
  }
  r->where = MLXD_ENG_NONE;
}

int mlxd_eng_waitall(mlxd_engine* e, mlxd_req** reqs, int n, mlxd_status* st) {
  assert(n >= 0 && (n == 0 || reqs));
  mlxd_wait_state ws = {0};
  mlxd_eng_wait(e, reqs, n, INFINITY, &ws);
  if (!e->err.code) e->ops->settle(e, &ws);
  return mlxd_eng_wait_end(e, reqs, n, st);
}

int mlxd_eng_wait_slice(mlxd_engine* e, mlxd_req** reqs, int n, double max_s, mlxd_wait_state* ws,
                        mlxd_status* st) {
  assert(n >= 0 && (n == 0 || reqs) && max_s >= 0);
  bool was = e->short_pass;
  e->short_pass = max_s != INFINITY;
  ws->done = mlxd_eng_wait(e, reqs, n, mlxd_now() + max_s, ws);
  e->short_pass = was;
  if (!e->err.code) return 0;
  ws->done = true;
  return mlxd_eng_fail_status(e, st);
}

int mlxd_eng_wait_end(mlxd_engine* e, mlxd_req** reqs, int n, mlxd_status* st) {
  int rc = mlxd_match_result(st, &e->err, e->layer, reqs, n);
  if (rc == 0 && e->err.code) rc = mlxd_eng_fail_status(e, st); /* failed meanwhile */
  for (int i = 0; i < n; i++) {
    mlxd_eng_req* r = (mlxd_eng_req*)reqs[i];
    if (!r) continue;
    if (!r->m.complete) mlxd_eng_unlink(e, r);
    mlxd_eng_req_release(e, r);
    reqs[i] = NULL;
  }
  return rc;
}
