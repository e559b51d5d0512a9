/* The verbs transport: tag-matched messages over RDMA reliable connections
 * (soft-RoCE, RoCE, InfiniBand), on the device layer rdma/ibv.h.
 *
 * Links. To each peer p with nrails > 0 (verbs.h) this rank has one RC
 * queue pair per rail, each on its device; a device is opened once per
 * transport and its completion queue is shared by every queue pair on it.
 * Set-up (verbs_setup.c) exchanges the queue pairs' addresses and the
 * registered blocks' addresses and keys through the caller's all-gather,
 * connects, then runs a second all-gather as a barrier, so no rank writes
 * to a queue pair its peer has not connected yet.
 *
 * Memory. Per peer one block of VB_BLOCK_BYTES (2 x 16 x (64 KiB + 64) +
 * 8 KiB = 2.0 MiB + 10 KiB), registered for remote write on each distinct
 * device of that peer's rails: 16 receive slots the peer writes into, 16
 * send staging slots our writes read from, and the cells (vb_cells: the
 * credit word, the heartbeat cell, the failure record, a probe word, each
 * written by the peer; and the sources of our own writes of them). So a
 * transport registers (2 MiB + 10 KiB) x (peers x devices per peer);
 * RLIMIT_MEMLOCK is checked for that up front (mlxd_ibv_memlock_check).
 *
 * Large messages (>= MLXDIST_VERBS_ZCOPY_BYTES) go by the pull path instead:
 * the receiver RDMA-reads them from the sender's registered buffer
 * (verbs_pull.c, and verbs_mr.h for the registration cache).
 *
 * Files: verbs.c moves chunks (chunks_in / chunks_out), credits and the
 * transport ops, and supplies the message engine's ops (engine.h: requests,
 * matching, failures and the wait loop are the engine's); verbs_pull.c the
 * pull path; verbs_cq.c the completions and the peers' records;
 * verbs_setup.c devices, memory, queue pairs, heartbeats and records.
 *
 * Protocol: eager and staged, with credits. A message is cut into chunks
 * of at most 64 KiB (a zero-byte message is one empty chunk); chunks of
 * one message go out consecutively (messages to one peer never interleave).
 * Chunk number `seq` (per peer) is written with its header (tag, total
 * size, offset, length, seq, the sender's call signature) into staging
 * slot seq % 16, then RDMA WRITE WITH IMMEDIATE (imm = seq's low 32 bits)
 * into the peer's receive slot seq % 16, on rail seq % nrails. A slot may
 * be used only while (sent - the peer's consumed count) < 16: the receiver
 * processes chunks strictly in sequence order (rails may complete out of
 * order: an arrived[] bit per slot), and returns credit by an RDMA WRITE
 * (no immediate) of its consumed count into our credit word. Each queue
 * pair has 16 zero-length receives posted at set-up, and one is posted
 * again for each that completes; only data consumes them. A send completes
 * when its last chunk is posted (the staging copy carries it from there,
 * so the caller may reuse its buffer); a send that finds no credit waits in
 * the peer's send queue and is pushed by every progress pass (isend's,
 * irecv's and any wait's), and a receiver copies a message with no posted
 * receive into a malloc'd buffer at once, so its slots free up: two ranks
 * that both send first never deadlock.
 *
 * Matching as match.h and engine.h say (posted vs unexpected queues, the
 * first match wins); signatures are compared with mlxd_eng_sig_clash (a clash fails the
 * transport, relayed to the peers); a size mismatch fails that receive
 * only (the chunks are consumed and dropped). Every field of a chunk
 * header is checked against what the receiver expects (the next seq, the
 * current message's tag, size and offset, len <= 64 KiB): anything else
 * fails the transport naming the peer.
 *
 * Completions. Every work completion's status is checked. An error on one
 * of our writes to p (data, credit, heartbeat, probe, record) fails the
 * transport: "lost connection to rank 2: RDMA write of collective #3 step
 * 0 failed: transport retry counter exceeded; its process died or the link
 * is down" (MLXD_LAYER_VERBS, peer set) -- unless p wrote its close mark
 * first (it destroyed its transport: its queue pairs are gone, so our
 * heartbeat fails; that is no failure unless we still wait on p).
 *
 * Liveness (liveness.h). The watchdog thread writes, every beat_s, a
 * heartbeat cell {counter, note} into each peer's memory (RDMA WRITE, no
 * immediate: it consumes no receive and no credit, so a stalled peer can
 * never block it), and polls the completion queues (so a rank that never
 * waits still gets its heartbeats' completions). A waiter checks, every
 * VB_CHECK_S without progress, the peers its pending requests involve: a
 * counter that did not move (and no data) for MLXDIST_TIMEOUT -> dead
 * (mlxd_live_dead); no progress for MLXDIST_WARN_AFTER -> one warning, for
 * MLXDIST_OP_TIMEOUT -> MLXD_ETIMEDOUT. A killed peer's queue pairs vanish
 * with its process: our next write to it (the heartbeat, or a probe write
 * the waiter posts every VB_PROBE_S to each peer it is blocked on) ends in
 * IBV_WC_RETRY_EXC_ERR after (MLXD_IBV_RETRY + 1) x ~67 ms ~ 0.5 s, so a
 * killed peer is named within ~0.25 + 0.55 s of the wait blocking on it.
 *
 * Failure records. A failure (the transport's first) is written into this
 * rank's record cell in each peer's memory (vb_rec: validated field by
 * field when read); a waiter reads its peers' records on every pass and
 * fails with a peer's failure relayed ("reported by rank R"). destroy
 * writes a close mark (VB_REC_CLOSED) the same way, after its last data
 * writes completed.
 *
 * Waiting. No progress thread: the waiting thread polls the completion
 * queues, spins MLXDIST_SPIN_US after the last event, then arms the
 * queues and sleeps in poll() on the devices' completion channels (one
 * thread at a time, with an eventfd that abort and the other waiters' progress
 * write to wake it; another waiter naps 1 ms) for at most VB_CHECK_S, so
 * liveness checks run (at most 1 ms while a queued send waits for credit:
 * a credit write raises no completion here). One mutex per transport, held inside the ops and
 * the heartbeat tick only, never across a sleep. */
#include "transport/verbs_impl.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "core/buffer.h"
#include "util/clock.h"

/* Bytes moved by path (mlxd_verbs_copy_counts). */

_Atomic uint64_t mlxd_vb_bytes[3];

void mlxd_verbs_copy_counts(uint64_t out[3]) {
  out[0] = mlxd_vb_bytes[0];
  out[1] = mlxd_vb_bytes[1];
  out[2] = mlxd_vb_bytes[2];
}

/* ---- failures ---- */

static void fail_posted_cb(void* ctx, mlxd_match_link* l) {
  (void)ctx;
  mlxd_eng_req* r = MLXD_MATCH_ENTRY(l, mlxd_eng_req, link);
  r->where = MLXD_ENG_NONE; /* stays incomplete: the wait reports the transport's failure */
}

void mlxd_vb_fail(vb_transport* t, const mlxd_status* st) {
  if (!mlxd_match_fail_first(&t->eng.err, st)) return;
  for (int p = 0; p < t->base.size; p++) {
    if (p == t->base.rank || !t->peers[p].nrails) continue;
    vb_peer* pp = &t->peers[p];
    mlxd_match_fail_posted(&pp->ep.mq, fail_posted_cb, t);
    if (t->closing || pp->closed || pp->rec_busy) continue;
    /* Tell the peer (best effort: what its queue pair does not take is dropped). */
    mlxd_vb_rec_fill(&pp->cells->rec_out, VB_REC_FAILED, &t->eng.err);
    if (mlxd_vb_post_cell(t, p, VB_WR_REC, offsetof(vb_cells, rec_out), sizeof(vb_rec)))
      pp->rec_busy = true;
  }
}

void mlxd_vb_fail_proto(vb_transport* t, int pi, const char* what) {
  mlxd_status s;
  mlxd_fail_at(&s, MLXD_EREMOTE, MLXD_LAYER_VERBS, "bad chunk from rank %d: %s", pi, what);
  mlxd_status_set_peer(&s, pi, t->peers[pi].addr);
  mlxd_vb_fail(t, &s);
}

static void sq_remove(vb_peer* p, vb_req* r) {
  vb_req* prev = NULL;
  for (vb_req* c = p->sq_head; c; prev = c, c = c->next) {
    if (c != r) continue;
    if (prev)
      prev->next = c->next;
    else
      p->sq_head = c->next;
    if (p->sq_tail == c) p->sq_tail = prev;
    c->next = NULL;
    return;
  }
}

/* The engine's unlink (engine.h): the send queue, the pull queue, a read. */
static void own_unlink(vb_transport* t, vb_req* r) {
  vb_peer* p = &t->peers[r->q.m.peer];
  switch (r->q.where) {
    case VB_W_SENDQ: sq_remove(p, r); break;
    case VB_W_PULLQ:
      for (vb_req** pp = &p->pull_head; *pp; pp = &(*pp)->next)
        if (*pp == r) {
          *pp = r->next;
          break;
        }
      break;
    case VB_W_RD:
      for (int i = 0; i < VB_RD_SLOTS; i++)
        if (p->rd[i].active && p->rd[i].req == &r->q) {
          p->rd[i].req = NULL; /* only after a failure: its reads are flushed */
          p->rd[i].dst = NULL;
          if (p->rd[i].ux) p->rd[i].orphan = true;
        }
      break;
    default: break;
  }
}

/* ---- chunks ---- */

static vb_chunk_hdr* in_slot(vb_peer* p, uint64_t seq) {
  return (vb_chunk_hdr*)(p->block + (size_t)(seq % VB_NSLOTS) * VB_STRIDE);
}
static vb_chunk_hdr* out_slot(vb_peer* p, uint64_t seq) {
  return (vb_chunk_hdr*)(p->block + VB_SLOTS_BYTES + (size_t)(seq % VB_NSLOTS) * VB_STRIDE);
}

/* The first chunk of a message from pi: compare signatures, bind it to a
 * posted receive or a new unexpected buffer. false: the transport failed. */

static int chunks_in(vb_transport* t, int pi) {
  vb_peer* p = &t->peers[pi];
  int ev = 0;
  while (!t->eng.err.code && p->arrived[p->consumed % VB_NSLOTS]) {
    vb_chunk_hdr h;
    const vb_chunk_hdr* s = in_slot(p, p->consumed);
    memcpy(&h, s, sizeof h);
    if (h.seq != p->consumed) {
      char w[96];
      snprintf(w, sizeof w, "chunk %llu where %llu was due", (unsigned long long)h.seq,
               (unsigned long long)p->consumed);
      mlxd_vb_fail_proto(t, pi, w);
      return -1;
    }
    if (h.kind != VB_CK_DATA) {
      int k = mlxd_vb_pull_chunk(t, pi, &h, (const char*)s + VB_HDR);
      if (k < 0) return -1;
      if (k == 0) break; /* no room for another read yet */
      p->arrived[p->consumed % VB_NSLOTS] = false;
      p->consumed++;
      ev++;
      continue;
    }
    if (h.len > VB_PAYLOAD || h.off > h.total || h.total - h.off < h.len ||
        (h.len == 0 && h.total != 0) || h.total > SIZE_MAX / 2) {
      mlxd_vb_fail_proto(t, pi, "a length out of range");
      return -1;
    }
    if (!p->ep.cur.active) {
      if (h.off != 0) {
        mlxd_vb_fail_proto(t, pi, "a message that does not start at offset 0");
        return -1;
      }
      mlxd_sig sent;
      mlxd_sig_decode(h.sig, &sent);
      if (mlxd_eng_arrive(&t->eng, pi, &p->ep, h.tag, (size_t)h.total, &sent, true) < 0) return -1;
    } else if (h.tag != p->ep.cur.tag || h.total != p->ep.cur.len || h.off != p->ep.cur.off ||
               h.len == 0) {
      mlxd_vb_fail_proto(t, pi, "a chunk that does not continue the message in progress");
      return -1;
    }
    char* dst = mlxd_eng_dest(&p->ep.cur);
    if (dst && h.len) memcpy(dst + h.off, (const char*)s + VB_HDR, h.len);
    p->ep.cur.off += h.len;
    if (p->ep.cur.ux) p->ep.cur.ux->got = (size_t)p->ep.cur.off;
    p->arrived[p->consumed % VB_NSLOTS] = false;
    p->consumed++;
    ev++;
    if (p->ep.cur.off == p->ep.cur.len) mlxd_eng_finish(&p->ep.cur);
  }
  return ev;
}

/* Give pi our consumed count when it moved and no credit write is in flight. */
static void credit_out(vb_transport* t, int pi) {
  vb_peer* p = &t->peers[pi];
  if (p->credit_busy || p->credit_sent == p->consumed || p->closed) return;
  p->cells->credit_out = p->consumed;
  if (mlxd_vb_post_cell(t, pi, VB_WR_CREDIT, offsetof(vb_cells, credit_out), 8)) {
    p->credit_busy = true;
    p->credit_sent = p->consumed;
  }
}

/* ---- sending ---- */

/* Post the queued sends to pi as far as credits and queue pairs allow. */
static int chunks_out(vb_transport* t, int pi) {
  vb_peer* p = &t->peers[pi];
  int pushed = 0;
  while (p->sq_head && !t->eng.err.code) {
    uint64_t consumed = p->cells->credit_in;
    if (consumed > p->sent) {
      mlxd_vb_fail_proto(t, pi, "credit returned for chunks never sent");
      return pushed;
    }
    if (p->sent - consumed >= VB_NSLOTS) break;
    int ri = (int)(p->sent % (uint64_t)p->nrails);
    vb_rail* rl = &p->rail[ri];
    if (rl->data_out >= VB_DATA_MAX || rl->outstanding >= VB_SQ_DEPTH - 4) break;
    vb_req* r = p->sq_head;
    size_t c = r->q.m.n - r->off < VB_PAYLOAD ? r->q.m.n - r->off : VB_PAYLOAD;
    vb_chunk_hdr* h = out_slot(p, p->sent);
    memset(h, 0, sizeof *h);
    h->seq = p->sent;
    h->tag = r->q.m.tag;
    h->total = r->q.m.n;
    h->off = r->off;
    h->len = (uint32_t)c;
    mlxd_sig_encode(h->sig, &r->q.m.sig);
    if (r->fin) {
      h->kind = VB_CK_FIN;
      h->tag = r->cookie;
      h->total = r->q.m.n; /* 1: NACK (send it staged) */
      h->len = 0;
      c = 0;
    } else if (r->pull) {
      h->kind = VB_CK_RTS;
      char* pl = (char*)h + VB_HDR;
      uint64_t a = (uint64_t)(uintptr_t)r->q.buf;
      uint32_t nr = (uint32_t)p->nrails;
      memcpy(pl, &a, 8);
      memcpy(pl + 8, &r->cookie, 8);
      memcpy(pl + 16, &nr, 4);
      for (int k = 0; k < p->nrails; k++)
        memcpy(pl + 20 + 4 * k, &r->mre[p->rail[k].mr]->mr.rkey, 4);
      h->len = 20 + 4 * nr;
      c = h->len;
    } else if (c) {
      memcpy((char*)h + VB_HDR, r->q.buf + r->off, c);
      mlxd_vb_bytes[0] += c;
    }
    size_t slot_off = (size_t)(p->sent % VB_NSLOTS) * VB_STRIDE;
    uint64_t wr =
        ((uint64_t)pi << 32) | ((p->sent & 0xFFFF) << 16) | ((uint64_t)ri << 8) | VB_WR_DATA;
    mlxd_status s;
    if (mlxd_ibv_post_write_imm(rl->qp, wr, h, VB_HDR + c, p->mr[rl->mr].lkey, rl->raddr + slot_off,
                                rl->rkey, (uint32_t)p->sent, true, &s)) {
      mlxd_status_set_peer(&s, pi, p->addr);
      mlxd_vb_fail(t, &s);
      return pushed;
    }
    p->slot_tag[p->sent % VB_NSLOTS] = r->q.m.tag;
    rl->outstanding++;
    rl->data_out++;
    p->sent++;
    pushed++;
    r->started = true;
    if (r->fin || r->pull) {
      p->sq_head = r->next;
      if (!p->sq_head) p->sq_tail = NULL;
      r->next = NULL;
      if (r->fin) {
        mlxd_eng_req_release(&t->eng, &r->q);
      } else {
        r->q.where = VB_W_PULLQ;
        r->next = p->pull_head;
        p->pull_head = r;
      }
      continue;
    }
    r->off += c;
    if (r->off == r->q.m.n) {
      p->sq_head = r->next;
      if (!p->sq_head) p->sq_tail = NULL;
      r->next = NULL;
      r->q.where = MLXD_ENG_NONE;
      r->q.m.complete = true;
    }
  }
  return pushed;
}

int mlxd_vb_progress(vb_transport* t, bool records) {
  if (t->eng.err.code) return 0;
  int ev = mlxd_vb_poll_cqs(t);
  for (int pi = 0; pi < t->base.size && !t->eng.err.code; pi++) {
    vb_peer* p = &t->peers[pi];
    if (pi == t->base.rank || !p->nrails) continue;
    int a = chunks_in(t, pi);
    if (a < 0) break;
    ev += a;
    credit_out(t, pi);
    ev += mlxd_vb_pull_reads(t, pi);
    ev += chunks_out(t, pi);
  }
  if (records) mlxd_vb_check_records(t);
  return ev;
}

/* ---- ops ---- */

/* Common start of isend/irecv: a request for (peer, tag, buf, n) with mu
 * held, or NULL with mu released, st and *rc set. */
static vb_req* vb_req_start(vb_transport* t, int kind, int peer, uint64_t tag, const mlxd_sig* sig,
                            const void* buf, size_t n, mlxd_req** req, mlxd_status* st, int* rc) {
  assert(req && peer >= 0 && peer < t->base.size && peer != t->base.rank && (buf || n == 0));
  assert(t->peers[peer].nrails > 0);
  *req = NULL;
  pthread_mutex_lock(&t->mu);
  vb_peer* p = &t->peers[peer];
  if (!t->eng.err.code && p->closed) {
    mlxd_vb_check_records(t);
    if (!t->eng.err.code) {
      char why[96];
      snprintf(why, sizeof why, ": it closed its transport while rank %d still %s it", t->base.rank,
               kind == VB_REQ_SEND ? "sends to" : "waits for");
      mlxd_eng_fail_lost(&t->eng, peer, why);
    }
  }
  vb_req* r = t->eng.err.code ? NULL : (vb_req*)mlxd_eng_req_alloc(&t->eng, sizeof(vb_req));
  if (!r) {
    *rc = mlxd_eng_req_refused(&t->eng, kind, peer, st);
    pthread_mutex_unlock(&t->mu);
    return NULL;
  }
  mlxd_eng_req_init(&r->q, kind, peer, p->addr, tag, sig, buf, n);
  return r;
}

static int vb_isend(mlxd_transport* tt, int peer, uint64_t tag, const mlxd_sig* sig,
                    const void* buf, size_t n, mlxd_req** req, mlxd_status* st) {
  vb_transport* t = (vb_transport*)tt;
  int rc = 0;
  bool zc = t->zcopy_min && n >= t->zcopy_min;
  bool owned = zc && mlxd_buffer_owns(buf, n);
  vb_req* r = vb_req_start(t, VB_REQ_SEND, peer, tag, sig, buf, n, req, st, &rc);
  if (!r) return rc;
  vb_peer* p = &t->peers[peer];
  if (zc) mlxd_vb_pull_offer(t, r, buf, n, owned);
  r->q.where = VB_W_SENDQ;
  r->next = NULL;
  if (p->sq_tail)
    p->sq_tail->next = r;
  else
    p->sq_head = r;
  p->sq_tail = r;
  mlxd_vb_progress(t, false);
  pthread_mutex_unlock(&t->mu);
  *req = (mlxd_req*)r;
  return 0;
}

static int vb_irecv(mlxd_transport* tt, int peer, uint64_t tag, const mlxd_sig* sig, void* buf,
                    size_t n, mlxd_req** req, mlxd_status* st) {
  vb_transport* t = (vb_transport*)tt;
  int rc = 0;
  vb_req* r = vb_req_start(t, VB_REQ_RECV, peer, tag, sig, buf, n, req, st, &rc);
  if (!r) return rc;
  mlxd_eng_unexp* u = NULL;
  int k = mlxd_eng_recv(&t->eng, &t->peers[peer].ep, &r->q, &u);
  if (k < 0) {
    rc = mlxd_eng_fail_status(&t->eng, st);
    pthread_mutex_unlock(&t->mu);
    return rc;
  }
  if (k == 2) { /* being pulled: its read's end fills r */
    vb_rd* rd = u->fill;
    if (r->q.m.mismatch) {
      rd->orphan = true;
    } else {
      rd->req = &r->q;
      r->q.where = VB_W_RD;
    }
  } else if (k == 1) {
    if (u->pulled && !r->q.m.mismatch) mlxd_vb_bytes[2] += u->got;
    mlxd_eng_unexp_free(&t->eng, u);
  }
  mlxd_vb_progress(t, false);
  pthread_mutex_unlock(&t->mu);
  *req = (mlxd_req*)r;
  return 0;
}

/* ---- liveness of a wait ---- */

/* Every VB_CHECK_S without progress: closed peers, heartbeats, the op
 * clock, probes. true if the transport failed. mu held. */
static bool live_check(vb_transport* t, vb_req** reqs, int n, mlxd_wait_state* ws, double now) {
  vb_req* w = NULL;
  char note[MLXD_NOTE_MAX];
  for (int i = 0; i < n && !t->eng.err.code; i++) {
    vb_req* r = reqs[i];
    if (!r || r->q.m.complete) continue;
    if (!w) w = r;
    int pi = r->q.m.peer;
    vb_peer* p = &t->peers[pi];
    if (p->closed) {
      mlxd_vb_progress(t, true); /* what it sent before closing may still be in a queue */
      if (r->q.m.complete || t->eng.err.code) continue;
      char why[96];
      snprintf(why, sizeof why, ": it closed its transport while rank %d still waits for it",
               t->base.rank);
      mlxd_eng_fail_lost(&t->eng, pi, why);
      return true;
    }
    uint64_t b = p->cells->beat_in.count;
    if (b != p->beat_seen) {
      p->beat_seen = b;
      p->heard = now;
    }
    double heard = p->heard > ws->start ? p->heard : ws->start;
    if (now - heard >= t->live.dead_s) {
      mlxd_status s;
      mlxd_vb_note_read(t, pi, note, sizeof note);
      mlxd_live_dead(&s, MLXD_LAYER_VERBS, pi, p->addr, now - heard, note);
      mlxd_vb_fail(t, &s);
      return true;
    }
    /* A killed peer answers no write: a probe finds out in ~0.5 s. */
    if (!p->probe_busy && now - p->last_probe >= VB_PROBE_S) {
      p->last_probe = now;
      p->cells->probe_out++;
      if (mlxd_vb_post_cell(t, pi, VB_WR_PROBE, offsetof(vb_cells, probe_out), 8))
        p->probe_busy = true;
    }
  }
  if (!w || t->eng.err.code) return t->eng.err.code != 0;
  vb_peer* p = &t->peers[w->q.m.peer];
  if (now - ws->last_change >= t->live.op_s) {
    mlxd_status s;
    mlxd_vb_note_read(t, w->q.m.peer, note, sizeof note);
    mlxd_live_op_timeout(&s, MLXD_LAYER_VERBS, w->q.m.peer, p->addr, t->live.op_s,
                         w->q.kind == VB_REQ_SEND, w->q.m.n, w->q.m.tag, note);
    mlxd_vb_fail(t, &s);
    return true;
  }
  if (!ws->warned && t->live.warn_s > 0 && now - ws->last_change >= t->live.warn_s) {
    ws->warned = true;
    double heard = p->heard > ws->start ? p->heard : ws->start;
    mlxd_vb_note_read(t, w->q.m.peer, note, sizeof note);
    mlxd_live_warn(MLXD_LAYER_VERBS, t->base.rank, w->q.m.peer, p->addr, now - ws->last_change,
                   w->q.m.tag, now - heard, note);
  }
  return false;
}

/* Wake the thread asleep on the completion channels, if any (mu held). */
static void kick(vb_transport* t) {
  if (!t->chan_owner || t->wake_fd < 0) return;
  uint64_t one = 1;
  ssize_t w = write(t->wake_fd, &one, sizeof one);
  (void)w; /* a full counter already wakes it */
}

/* Sleep on the completion channels for at most max_s (mu held on entry
 * and exit, dropped while asleep). */
static void channel_sleep(vb_transport* t, double max_s) {
  if (max_s > VB_CHECK_S) max_s = VB_CHECK_S;
  if (max_s < 1e-4) max_s = 1e-4;
  if (t->chan_owner) { /* another thread sleeps on the channels: nap */
    pthread_mutex_unlock(&t->mu);
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&t->mu);
    return;
  }
  struct pollfd fds[VB_MAX_DEVS + 1];
  int nf = 0, map[VB_MAX_DEVS + 1];
  for (int d = 0; d < t->ndevs; d++) {
    int fd = mlxd_ibv_fd(t->devs[d]);
    mlxd_status s;
    if (fd < 0 || mlxd_ibv_arm(t->devs[d], &s)) continue;
    fds[nf].fd = fd;
    fds[nf].events = POLLIN;
    fds[nf].revents = 0;
    map[nf++] = d;
  }
  if (t->wake_fd >= 0) {
    fds[nf].fd = t->wake_fd;
    fds[nf].events = POLLIN;
    fds[nf].revents = 0;
    map[nf++] = -1;
  }
  /* Armed: anything that completed before the arm is seen by this pass. */
  if (mlxd_vb_progress(t, true) > 0 || t->eng.err.code) return;
  t->chan_owner = true;
  pthread_mutex_unlock(&t->mu);
  if (nf > 0) {
    int rc = poll(fds, (nfds_t)nf, (int)ceil(max_s * 1e3));
    for (int i = 0; rc > 0 && i < nf; i++) {
      if (!(fds[i].revents & POLLIN)) continue;
      if (map[i] >= 0) {
        mlxd_ibv_ack(t->devs[map[i]]);
      } else {
        uint64_t v;
        ssize_t r = read(t->wake_fd, &v, sizeof v);
        (void)r;
      }
    }
  } else {
    struct timespec ts = {0, (long)(max_s < 1e-3 ? max_s * 1e9 : 1e6)};
    nanosleep(&ts, NULL);
  }
  pthread_mutex_lock(&t->mu);
  t->chan_owner = false;
}

/* A queued send to some peer waits for credit: the peer returns credit by an
 * RDMA write without immediate, which raises no completion here, so a sleep
 * on the completion channels would not end when it lands. mu held. */
static bool credit_blocked(vb_transport* t) {
  for (int pi = 0; pi < t->base.size; pi++) {
    vb_peer* p = &t->peers[pi];
    if (pi != t->base.rank && p->sq_head && p->sent - p->cells->credit_in >= VB_NSLOTS) return true;
  }
  return false;
}

/* ---- the engine's ops (engine.h) ---- */

#define VB_OF(e) ((vb_transport*)((char*)(e)-offsetof(vb_transport, eng)))

static int vb_op_progress(mlxd_engine* e, bool idle) {
  (void)idle; /* verbs buffers at once: nothing is left for idle time */
  vb_transport* t = VB_OF(e);
  int ev = mlxd_vb_progress(t, true);
  if (ev && t->eng.waiting > 1) kick(t); /* it may have been another waiter's progress */
  mlxd_vb_beat_if_due(t, mlxd_now());
  return ev;
}

static bool vb_op_check(mlxd_engine* e, mlxd_req** reqs, int n, mlxd_wait_state* ws, double now) {
  return live_check(VB_OF(e), (vb_req**)reqs, n, ws, now);
}

static int vb_op_sleep(mlxd_engine* e, double max_s) {
  vb_transport* t = VB_OF(e);
  if (max_s > VB_CREDIT_NAP_S && credit_blocked(t)) max_s = VB_CREDIT_NAP_S;
  channel_sleep(t, max_s);
  return 0; /* the next pass moves what woke it */
}

static void vb_op_begin(mlxd_engine* e, mlxd_req** reqs, int n, double now) {
  vb_transport* t = VB_OF(e);
  for (int i = 0; i < n; i++) /* silence before the wait does not count */
    if (reqs[i] && !((vb_req*)reqs[i])->q.m.complete)
      t->peers[((vb_req*)reqs[i])->q.m.peer].last_probe = now - VB_PROBE_S; /* probe at once */
}

static void vb_op_lock(mlxd_engine* e) { pthread_mutex_lock(&VB_OF(e)->mu); }
static void vb_op_unlock(mlxd_engine* e) { pthread_mutex_unlock(&VB_OF(e)->mu); }
static void vb_op_fail(mlxd_engine* e, const mlxd_status* st) { mlxd_vb_fail(VB_OF(e), st); }
static void vb_op_settle(mlxd_engine* e, const mlxd_wait_state* ws) {
  (void)ws;
  mlxd_vb_check_records(VB_OF(e));
}
static void vb_op_wake(mlxd_engine* e) { kick(VB_OF(e)); }
static int vb_op_name(mlxd_engine* e, int pi) {
  (void)e;
  return pi;
}
static const char* vb_op_addr(mlxd_engine* e, int pi) { return VB_OF(e)->peers[pi].addr; }
static mlxd_eng_peer* vb_op_peer(mlxd_engine* e, int pi) { return &VB_OF(e)->peers[pi].ep; }
static void vb_op_unlink(mlxd_engine* e, mlxd_eng_req* r) { own_unlink(VB_OF(e), (vb_req*)r); }
static void vb_op_release(mlxd_engine* e, mlxd_eng_req* q) {
  vb_req* r = (vb_req*)q;
  if (r->pull) mlxd_vb_mre_put_all(VB_OF(e), r->mre);
}

static const mlxd_eng_ops vb_ops_table = {
    .progress = vb_op_progress,
    .check = vb_op_check,
    .sleep = vb_op_sleep,
    .lock = vb_op_lock,
    .unlock = vb_op_unlock,
    .fail = vb_op_fail,
    .wake = vb_op_wake,
    .name = vb_op_name,
    .addr = vb_op_addr,
    .peer = vb_op_peer,
    .unlink = vb_op_unlink,
    .release = vb_op_release,
    .settle = vb_op_settle,
    .begin = vb_op_begin,
};

void mlxd_vb_engine_init(vb_transport* t, double spin_s) {
  t->eng.ops = &vb_ops_table;
  t->eng.layer = MLXD_LAYER_VERBS;
  t->eng.me = t->base.rank;
  t->eng.req_size = sizeof(vb_req);
  t->eng.yield = true;
  t->eng.spin_s = spin_s;
  t->eng.check_s = VB_CHECK_S;
}

static int vb_waitall(mlxd_transport* tt, mlxd_req** rr, int n, mlxd_status* st) {
  vb_transport* t = (vb_transport*)tt;
  pthread_mutex_lock(&t->mu);
  int rc = mlxd_eng_waitall(&t->eng, rr, n, st);
  pthread_mutex_unlock(&t->mu);
  return rc;
}

static int vb_wait_slice(mlxd_transport* tt, mlxd_req** rr, int n, double max_s,
                         mlxd_wait_state* ws, mlxd_status* st) {
  vb_transport* t = (vb_transport*)tt;
  pthread_mutex_lock(&t->mu);
  int rc = mlxd_eng_wait_slice(&t->eng, rr, n, max_s, ws, st);
  pthread_mutex_unlock(&t->mu);
  return rc;
}

static void vb_abort(mlxd_transport* tt, const mlxd_status* st) {
  vb_transport* t = (vb_transport*)tt;
  pthread_mutex_lock(&t->mu);
  mlxd_vb_fail(t, st);
  kick(t); /* a waiter asleep on the channels sees it now */
  pthread_mutex_unlock(&t->mu);
}

static bool writes_in_flight(vb_transport* t) {
  for (int pi = 0; pi < t->base.size; pi++) {
    if (pi == t->base.rank) continue;
    vb_peer* p = &t->peers[pi];
    for (int r = 0; r < p->nrails; r++)
      if (p->rail[r].outstanding) return true;
  }
  return false;
}

void mlxd_vb_destroy(mlxd_transport* tt) {
  vb_transport* t = (vb_transport*)tt;
  if (!t) return;
  if (t->forgotten) return; /* a forked child's copy: nothing of it is ours to close */
  mlxd_vb_live_stop(t);
  mlxd_buffer_unwatch(t->buf_watch);
  if (t->peers) {
    pthread_mutex_lock(&t->mu);
    /* Let our last data and credit writes land (bounded: 0.25 s), then tell
     * the peers we are gone (so their heartbeats' failures are expected),
     * and let that land (the rest of the 0.5 s). */
    double t0 = mlxd_now();
    while (!t->eng.err.code && writes_in_flight(t) && mlxd_now() - t0 < 0.25) {
      if (!mlxd_vb_poll_cqs(t)) sched_yield();
    }
    t->closing = true;
    if (!t->eng.err.code) {
      for (int pi = 0; pi < t->base.size; pi++) {
        vb_peer* p = &t->peers[pi];
        if (pi == t->base.rank || !p->nrails || p->closed || p->rec_busy) continue;
        mlxd_vb_rec_fill(&p->cells->rec_out, VB_REC_CLOSED, NULL);
        if (mlxd_vb_post_cell(t, pi, VB_WR_REC, offsetof(vb_cells, rec_out), sizeof(vb_rec)))
          p->rec_busy = true;
      }
    }
    while (writes_in_flight(t) && mlxd_now() - t0 < 0.5) {
      if (!mlxd_vb_poll_cqs(t)) sched_yield();
    }
    pthread_mutex_unlock(&t->mu);
    for (int pi = 0; pi < t->base.size; pi++) {
      vb_peer* p = &t->peers[pi];
      if (pi == t->base.rank) continue;
      while (p->sq_head) {
        vb_req* r = p->sq_head;
        p->sq_head = r->next;
        mlxd_eng_req_release(&t->eng, &r->q);
      }
      while (p->pull_head) {
        vb_req* r = p->pull_head;
        p->pull_head = r->next;
        mlxd_eng_req_release(&t->eng, &r->q);
      }
      for (int i = 0; i < VB_RD_SLOTS; i++) {
        vb_rd* rd = &p->rd[i];
        if (!rd->active) continue;
        mlxd_vb_mre_put_all(t, rd->mre);
        if (rd->ux && (rd->req || rd->orphan)) /* not in the unexpected queue */
          mlxd_eng_unexp_free(&t->eng, rd->ux);
        rd->active = false;
      }
      mlxd_eng_drain_queues(&t->eng, &p->ep.mq);
    }
  }
  mlxd_vb_teardown(t);
  if (t->wake_fd >= 0) close(t->wake_fd);
  mlxd_eng_req_drain(&t->eng);
  pthread_mutex_destroy(&t->mu);
  free(t);
}

/* A forked child's copy: close only our own eventfd (the devices'
 * descriptors and the registered memory are the device layer's and the
 * parent's; libibverbs opens them close-on-exec), send nothing; mark it. */
static void vb_forget(mlxd_transport* tt) {
  vb_transport* t = (vb_transport*)tt;
  t->forgotten = true;
  if (t->wake_fd >= 0) close(t->wake_fd); /* ours alone: the child's copy */
  t->wake_fd = -1;
}

const mlxd_transport_ops mlxd_verbs_ops = {
    .name = "verbs",
    .isend = vb_isend,
    .irecv = vb_irecv,
    .waitall = vb_waitall,
    .wait_slice = vb_wait_slice,
    .abort = vb_abort,
    .destroy = mlxd_vb_destroy,
    .forget = vb_forget,
};
