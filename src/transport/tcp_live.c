/* The TCP transport's liveness apart from progress (liveness.h) and its
 * control frames (tcp_wire.h: tag kind MLXD_TAG_CTRL, never matched).
 *
 * Heartbeats. The watchdog thread (core/watchdog.h) calls beat() every
 * mlxd_live_cfg.beat_s: it runs a lazy transport's dialer once when no
 * thread is progressing (a rank busy outside mlxdist still answers its
 * peers' handshakes); then for every peer it has a connection to, when the
 * first connection's send queue is empty and its last heartbeat is
 * mlxd_live_cfg.frame_s old, it queues a heartbeat frame carrying this rank's note
 * (core/oprec.h) and writes what the socket takes at once; when the queue
 * is not empty and no thread is progressing, it writes what the socket
 * takes of it (a rank busy in its own computation still finishes a
 * heartbeat that was only partly written). It never blocks: a peer that
 * reads nothing (it is stopped) fills the socket and gets no more. A
 * heartbeat written goes in the byte stream behind every byte queued in the
 * kernel before it: after a link outage the peer hears it only with the
 * kernel's next retransmission, whose back-off every connection caps at
 * MLXDIST_TIMEOUT / 6 (tcp_setup.c conn_attach).
 *
 * Hearing. Any byte read from a peer counts as a sign of life (tcp.c
 * stamps tcp_peer.heard in each progress round with input from it); only
 * a thread that waits reads, so silence is measured from
 * max(heard, the wait's start): a rank that computed for an hour without
 * reading does not take its peers for dead when it gets back.
 *
 * The checks of a wait (mlxd_tcp_live_check, every MLXD_TCP_CHECK_S of a
 * wait without events: the engine's wait calls them, engine.h): a peer
 * of a pending request silent for MLXDIST_TIMEOUT fails the transport
 * (mlxd_live_dead, naming it and its last note); no progress for
 * MLXDIST_WARN_AFTER prints one warning (mlxd_live_warn); no progress for
 * MLXDIST_OP_TIMEOUT fails it (mlxd_live_op_timeout).
 *
 * Relay. A transport that fails (the first failure only, found on this
 * rank or relayed to it) queues an abort frame holding its status on the
 * first connection to every peer, after a fragment that is partly written
 * (the rest is dropped), and writes what the socket takes before the
 * sockets are shut down. A peer that reads it fails with that status, its
 * code kept, "reported by" the rank that found it (this rank, or the
 * reporter of the failure relayed to it). */
#include <stdio.h>
#include <string.h>

#include "core/oprec.h"
#include "core/watchdog.h"
#include "transport/tcp_impl.h"
#include "util/clock.h"

static void frag_ctrl(tcp_frag* f, unsigned step, const char* data, size_t len) {
  mlxd_tcp_hdr h = {mlxd_tag(MLXD_TAG_CTRL, 0, step), 0, len, len, {0}};
  mlxd_tcp_hdr_encode(f->hdr, &h);
  f->req = NULL;
  f->data = data;
  f->off = 0;
  f->len = len;
  f->sent = 0;
  f->next = NULL;
}

static void enqueue(tcp_conn* c, tcp_frag* f) {
  if (c->qtail)
    c->qtail->next = f;
  else
    c->qhead = f;
  c->qtail = f;
}

static void beat(void* ctx, double now) {
  tcp_transport* t = ctx;
  char note[MLXD_NOTE_MAX];
  mlxd_oprec_note(note, sizeof note);
  size_t len = strnlen(note, MLXD_TCP_BEAT_MAX);
  pthread_mutex_lock(&t->mu);
  /* Lazy: answer handshakes even while this rank is busy outside mlxdist,
   * so that an honest peer connecting now is not kept waiting. */
  if (!t->progressing) mlxd_tcp_dial_step(t);
  bool queued = false;
  for (int p = 0; p < t->base.size && !t->eng.err.code; p++) {
    tcp_conn* c = t->conns[p]; /* its first connection; NULL: never used */
    if (p == t->base.rank || !c || c->fd < 0 || c->eof) continue;
    if (!c->qhead) {
      /* half a tick early: the ticks are not exact */
      if (c->beat_at > 0 && now - c->beat_at < t->live.frame_s - t->live.beat_s / 2) continue;
      c->beat_at = now;
      memcpy(c->beat_note, note, len);
      frag_ctrl(&c->beat, MLXD_TCP_CTRL_BEAT, c->beat_note, len);
      enqueue(c, &c->beat);
    } else if (t->progressing) {
      continue; /* the progressor writes it */
    }
    int err = mlxd_tcp_conn_write(t, c);
    if (err == 0 && c->qhead) queued = true;
    /* A write error is left to the next wait, which reads the same socket
     * and words it (a heartbeat does not fail the transport). */
  }
  if (queued) mlxd_tcp_wake(t);
  pthread_mutex_unlock(&t->mu);
}

void mlxd_tcp_live_start(tcp_transport* t) {
  if (t->base.size > 1) t->watch = mlxd_watchdog_add(beat, t, t->live.beat_s);
}

void mlxd_tcp_live_stop(tcp_transport* t) {
  mlxd_watchdog_remove(t->watch);
  t->watch = 0;
}

void mlxd_tcp_abort(mlxd_transport* tt, const mlxd_status* st) {
  tcp_transport* t = (tcp_transport*)tt;
  pthread_mutex_lock(&t->mu);
  mlxd_tcp_fail(t, st); /* relayed to the peers */
  mlxd_tcp_wake(t);
  pthread_cond_broadcast(&t->cv);
  pthread_mutex_unlock(&t->mu);
}

void mlxd_tcp_relay_prepare(tcp_transport* t) {
  mlxd_tcp_abort_rec r;
  memset(&r, 0, sizeof r);
  r.code = (uint32_t)t->eng.err.code;
  r.reporter = t->eng.err.has_reporter ? t->eng.err.reporter : t->base.rank;
  r.peer = t->eng.err.has_peer ? t->eng.err.peer : -1;
  r.sys_errno = t->eng.err.sys_errno > 0 && t->eng.err.sys_errno < 4096 ? t->eng.err.sys_errno : 0;
  r.syscall = t->eng.err.syscall;
  snprintf(r.addr, sizeof r.addr, "%s", t->eng.err.has_peer ? t->eng.err.peer_addr : "");
  snprintf(r.detail, sizeof r.detail, "%s", t->eng.err.msg);
  t->abort_len = mlxd_tcp_abort_encode((unsigned char*)t->abort_pay, &r);
}

void mlxd_tcp_relay_conn(tcp_transport* t, tcp_conn* c) {
  if (c->fd < 0 || c->eof || c->peer == t->base.rank) return;
  if (!(c->ssl && c->wlen > c->wpos)) {
    /* Keep a fragment that is partly on the wire (the stream must stay
     * whole), drop the ones not started. Over TLS with bytes staged, they
     * may span several fragments: the record goes after all of them. */
    tcp_frag* h = c->qhead;
    if (h && h->sent == 0) h = NULL;
    if (h) h->next = NULL;
    c->qhead = c->qtail = h;
  }
  frag_ctrl(&c->abort, MLXD_TCP_CTRL_ABORT, t->abort_pay, t->abort_len);
  enqueue(c, &c->abort);
  (void)mlxd_tcp_conn_write(t, c); /* best effort */
}

void mlxd_tcp_ctrl_done(tcp_transport* t, tcp_conn* c) {
  tcp_peer* pe = &t->peers[c->peer];
  if (c->ctrl_step == MLXD_TCP_CTRL_BEAT) {
    mlxd_live_note_clean(pe->note, sizeof pe->note, c->ctrl_buf, c->cur_len);
    return;
  }
  mlxd_tcp_abort_rec r;
  char why[200];
  mlxd_status s;
  if (mlxd_tcp_abort_decode(c->ctrl_buf, c->cur_len, t->base.size, &r, why, sizeof why) != 0) {
    mlxd_fail_at(&s, MLXD_EREMOTE, MLXD_LAYER_TCP,
                 "bad abort record from rank %d: %s; is the peer an mlxdist rank of the same "
                 "version?",
                 c->peer, why);
    mlxd_status_set_peer(&s, c->peer, pe->addr);
  } else {
    mlxd_fail_at(&s, (int)r.code, MLXD_LAYER_TCP, "%s", r.detail[0] ? r.detail : "failed");
    if (r.peer >= 0) mlxd_status_set_peer(&s, r.peer, r.addr);
    if (r.syscall || r.sys_errno) mlxd_status_set_sys(&s, r.syscall, r.sys_errno);
    mlxd_status_set_reporter(&s, r.reporter);
  }
  mlxd_tcp_fail(t, &s);
}

bool mlxd_tcp_live_check(tcp_transport* t, tcp_req* const* reqs, int n, tcp_live_wait* w,
                         double now) {
  const mlxd_live_cfg* cfg = &t->live;
  tcp_req* first = NULL;
  for (int i = 0; i < n; i++) {
    tcp_req* r = reqs[i];
    if (!r || r->q.m.complete) continue;
    if (!first) first = r;
    tcp_peer* pe = &t->peers[r->q.m.peer];
    if (pe->nup == 0)
      continue; /* lazy: connecting, within MLXDIST_CONNECT_TIMEOUT (net/dialer.c) */
    double heard = pe->heard > w->start ? pe->heard : w->start;
    if (now - heard >= cfg->dead_s) {
      mlxd_status s;
      mlxd_live_dead(&s, MLXD_LAYER_TCP, r->q.m.peer, pe->addr, now - heard, pe->note);
      mlxd_tcp_fail(t, &s);
      return true;
    }
  }
  if (!first) return false;
  tcp_peer* pe = &t->peers[first->q.m.peer];
  if (now - w->last_change >= cfg->op_s) {
    mlxd_status s;
    mlxd_live_op_timeout(&s, MLXD_LAYER_TCP, first->q.m.peer, pe->addr, cfg->op_s,
                         first->q.kind == MLXD_ENG_SEND, first->q.m.n, first->q.m.tag, pe->note);
    mlxd_tcp_fail(t, &s);
    return true;
  }
  if (!w->warned && cfg->warn_s > 0 && now - w->last_change >= cfg->warn_s) {
    w->warned = true;
    double heard = pe->heard > w->start ? pe->heard : w->start;
    mlxd_live_warn(MLXD_LAYER_TCP, t->base.rank, first->q.m.peer, pe->addr, now - w->last_change,
                   first->q.m.tag, now - heard, pe->note);
  }
  return false;
}
