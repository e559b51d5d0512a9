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
 * Large messages (>= MLXDIST_VERBS_ZCOPY_BYTES) go by rendezvous instead:
 * the receiver RDMA-reads them from the sender's registered buffer (see
 * "rendezvous" below, and verbs_mr.h for the registration cache).
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
 * Matching as match.h says (posted vs unexpected queues, the first match
 * wins); signatures are compared with mlxd_sig_check (a clash fails the
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
static _Atomic uint64_t g_bytes_staged, g_bytes_zcopy, g_bytes_bounced;

void mlxd_verbs_copy_counts(uint64_t out[3]) {
  out[0] = g_bytes_staged;
  out[1] = g_bytes_zcopy;
  out[2] = g_bytes_bounced;
}

/* ---- failures ---- */

static void fail_posted_cb(void* ctx, mlxd_match_link* l) {
  (void)ctx;
  vb_req* r = MLXD_MATCH_ENTRY(l, vb_req, link);
  r->where = VB_W_NONE; /* stays incomplete: the wait reports the transport's failure */
}

void mlxd_vb_fail(vb_transport* t, const mlxd_status* st) {
  if (!mlxd_match_fail_first(&t->err, st)) return;
  for (int p = 0; p < t->base.size; p++) {
    if (p == t->base.rank || !t->peers[p].nrails) continue;
    vb_peer* pp = &t->peers[p];
    mlxd_match_fail_posted(&pp->mq, fail_posted_cb, t);
    if (t->closing || pp->closed || pp->rec_busy) continue;
    /* Tell the peer (best effort: what its queue pair does not take is dropped). */
    mlxd_vb_rec_fill(&pp->cells->rec_out, VB_REC_FAILED, &t->err);
    if (mlxd_vb_post_cell(t, p, VB_WR_REC, offsetof(vb_cells, rec_out), sizeof(vb_rec)))
      pp->rec_busy = true;
  }
}

static void fail_lost(vb_transport* t, int pi, const char* why) {
  mlxd_status s;
  mlxd_match_lost(&s, MLXD_LAYER_VERBS, pi, t->peers[pi].addr, why, NULL, 0);
  mlxd_vb_fail(t, &s);
}

static void fail_proto(vb_transport* t, int pi, const char* what) {
  mlxd_status s;
  mlxd_fail_at(&s, MLXD_EREMOTE, MLXD_LAYER_VERBS, "bad chunk from rank %d: %s", pi, what);
  mlxd_status_set_peer(&s, pi, t->peers[pi].addr);
  mlxd_vb_fail(t, &s);
}

static void fail_nomem(vb_transport* t, int pi, const char* what, size_t n) {
  mlxd_status s;
  mlxd_fail_at(&s, MLXD_ENOMEM, MLXD_LAYER_VERBS, "out of memory %s (%zu bytes) from rank %d", what,
               n, pi);
  mlxd_status_set_peer(&s, pi, t->peers[pi].addr);
  mlxd_vb_fail(t, &s);
}

/* ---- requests ---- */

static vb_req* req_alloc(vb_transport* t) {
  vb_req* r = t->free_reqs;
  if (r) {
    t->free_reqs = r->next;
    t->nfree--;
  } else {
    r = malloc(sizeof *r);
    if (!r) return NULL;
  }
  memset(r, 0, sizeof *r);
  return r;
}

static void mre_put_all(vb_transport* t, mlxd_vbmr_ent** mre);
static void req_release(vb_transport* t, vb_req* r) {
  if (r->rdv) mre_put_all(t, r->mre);
  if (t->nfree < 64) {
    r->next = t->free_reqs;
    t->free_reqs = r;
    t->nfree++;
  } else {
    free(r);
  }
}

static void req_mismatch(vb_req* r, size_t sent) {
  r->m.complete = true;
  r->m.code = MLXD_EINVAL;
  r->m.mismatch = true;
  r->m.sent = sent;
}

static void mre_put_all(vb_transport* t, mlxd_vbmr_ent** mre) {
  for (int m = 0; m < MLXD_VERBS_MAX_RAILS; m++) {
    mlxd_vbmr_put(&t->mrc, mre[m]);
    mre[m] = NULL;
  }
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

static void req_unlink(vb_transport* t, vb_req* r) {
  vb_peer* p = &t->peers[r->m.peer];
  switch (r->where) {
    case VB_W_SENDQ: sq_remove(p, r); break;
    case VB_W_POSTED: mlxd_match_remove(&p->mq.posted, &r->link); break;
    case VB_W_CUR:
      if (p->cur_req == r) p->cur_req = NULL; /* the rest of it is dropped */
      break;
    case VB_W_RDV:
      for (vb_req** pp = &p->rdv_head; *pp; pp = &(*pp)->next)
        if (*pp == r) {
          *pp = r->next;
          break;
        }
      break;
    case VB_W_RD:
      for (int i = 0; i < VB_RD_SLOTS; i++)
        if (p->rd[i].active && p->rd[i].req == r) {
          p->rd[i].req = NULL; /* only after a failure: its reads are flushed */
          p->rd[i].dst = NULL;
          if (p->rd[i].ux) p->rd[i].orphan = true;
        }
      break;
    default: break;
  }
  r->where = VB_W_NONE;
}

/* ---- signatures ---- */

static bool sig_clash(vb_transport* t, int pi, const mlxd_sig* mine, const mlxd_sig* theirs) {
  if (mine->op == theirs->op && mine->dtype == theirs->dtype && mine->size == theirs->size &&
      mine->count == theirs->count)
    return false;
  mlxd_status s;
  if (!mlxd_sig_check(&s, MLXD_LAYER_VERBS, t->base.rank, mine, pi, t->peers[pi].addr, theirs))
    return false;
  mlxd_vb_fail(t, &s);
  return true;
}

/* ---- receiving ---- */

static vb_chunk_hdr* in_slot(vb_peer* p, uint64_t seq) {
  return (vb_chunk_hdr*)(p->block + (size_t)(seq % VB_NSLOTS) * VB_STRIDE);
}
static vb_chunk_hdr* out_slot(vb_peer* p, uint64_t seq) {
  return (vb_chunk_hdr*)(p->block + VB_SLOTS_BYTES + (size_t)(seq % VB_NSLOTS) * VB_STRIDE);
}

/* The first chunk of a message from pi: compare signatures, bind it to a
 * posted receive or a new unexpected buffer. false: the transport failed. */
static bool start_message(vb_transport* t, int pi, const vb_chunk_hdr* h) {
  vb_peer* p = &t->peers[pi];
  uint64_t tag = h->tag;
  size_t len = (size_t)h->total;
  vb_req* r = MLXD_MATCH_ENTRY(mlxd_match_find(&p->mq.posted, tag), vb_req, link);
  mlxd_sig sent;
  mlxd_sig_decode(h->sig, &sent);
  if (sent.op != MLXD_SIG_NONE) {
    vb_req* same = r;
    if (!same) same = MLXD_MATCH_ENTRY(mlxd_match_find_op(&p->mq.posted, tag), vb_req, link);
    if (same && sig_clash(t, pi, &same->m.sig, &sent)) return false;
  }
  p->cur_active = true;
  p->cur_tag = tag;
  p->cur_total = h->total;
  p->cur_off = 0;
  p->cur_req = NULL;
  p->cur_ux = NULL;
  if (r) {
    mlxd_match_remove(&p->mq.posted, &r->link);
    r->where = VB_W_NONE;
    if (r->m.n != len) {
      req_mismatch(r, len);
    } else {
      r->where = VB_W_CUR;
      p->cur_req = r;
    }
    return true;
  }
  vb_unexp* u = calloc(1, sizeof *u);
  char* buf = len ? malloc(len) : NULL;
  if (!u || (len && !buf)) {
    free(u);
    free(buf);
    fail_nomem(t, pi, "buffering a message that arrived before its receive", len);
    return false;
  }
  u->len = len;
  u->buf = buf;
  u->sig = sent;
  mlxd_match_push(&p->mq.unexpected, &u->link, tag);
  p->cur_ux = u;
  return true;
}

static void finish_message(vb_peer* p) {
  if (p->cur_req) {
    p->cur_req->m.complete = true;
    p->cur_req->where = VB_W_NONE;
  }
  if (p->cur_ux) {
    p->cur_ux->complete = true;
    p->cur_ux->got = (size_t)p->cur_total;
  }
  p->cur_active = false;
  p->cur_req = NULL;
  p->cur_ux = NULL;
}

/* ---- rendezvous (zero copy) ----
 *
 * A send of at least MLXDIST_VERBS_ZCOPY_BYTES whose buffer registers (the
 * registration cache, verbs_mr.h, on each device of the peer's rails) goes
 * as one RTS chunk through the slots: {address, cookie, rkey per rail};
 * it then waits on the peer's rdv list. The receiver, processing chunks in
 * order, takes the RTS at once (so the slots and the no-deadlock rule stay
 * as they are): matched to a posted receive, it registers that buffer and
 * RDMA-reads the data straight into it (no copy); unmatched, it reads into
 * a malloc'd bounce buffer (one copy when the receive comes). Reads are
 * <= VB_READ_MAX, rails round robin, VB_RD_PER_RAIL in flight per queue
 * pair. When the last read completed, the receiver queues a FIN chunk
 * (tag = cookie) behind its own sends; the sender's request completes on
 * it (the caller's buffer stays registered and unchanged until then: the
 * isend contract). A size mismatch reads nothing and answers FIN. */

static int dev_of_mr(vb_peer* p, int m) {
  for (int r = 0; r < p->nrails; r++)
    if (p->rail[r].mr == m) return p->rail[r].dev;
  return p->rail[0].dev;
}

static vb_req* fin_queue(vb_transport* t, int pi, uint64_t cookie) {
  vb_peer* p = &t->peers[pi];
  vb_req* f = req_alloc(t);
  if (!f) {
    fail_nomem(t, pi, "for a rendezvous end", sizeof *f);
    return NULL;
  }
  f->kind = VB_REQ_SEND;
  f->fin = true;
  f->cookie = cookie;
  f->m.peer = pi;
  f->where = VB_W_SENDQ;
  if (p->sq_tail)
    p->sq_tail->next = f;
  else
    p->sq_head = f;
  p->sq_tail = f;
  return f;
}

static void rd_finish(vb_transport* t, int pi, vb_rd* rd) {
  mre_put_all(t, rd->mre);
  if (rd->req) {
    if (rd->ux) {
      memcpy(rd->req->buf, rd->ux->buf, (size_t)rd->total);
      g_bytes_bounced += rd->total;
      free(rd->ux->buf);
      free(rd->ux);
    } else if (!rd->drop) {
      g_bytes_zcopy += rd->total;
    }
    if (!rd->drop) {
      rd->req->m.complete = true;
      rd->req->where = VB_W_NONE;
    }
  } else if (rd->ux) {
    if (rd->orphan) {
      free(rd->ux->buf);
      free(rd->ux);
    } else {
      rd->ux->complete = true;
      rd->ux->got = (size_t)rd->total;
      rd->ux->rd = NULL;
    }
  }
  rd->active = false;
  rd->req = NULL;
  rd->ux = NULL;
  fin_queue(t, pi, rd->cookie);
}

/* Post the reads of pi's rendezvous as far as the queue pairs allow; finish
 * those whose reads all completed. Returns reads posted. */
static int rd_progress(vb_transport* t, int pi) {
  vb_peer* p = &t->peers[pi];
  int ev = 0;
  for (int i = 0; i < VB_RD_SLOTS && !t->err.code; i++) {
    vb_rd* rd = &p->rd[i];
    if (!rd->active) continue;
    while (!rd->drop && rd->dst && rd->posted < rd->total) {
      int ri = rd->next_rail;
      vb_rail* rl = &p->rail[ri];
      if (rl->rd_out >= VB_RD_PER_RAIL || rl->outstanding >= VB_SQ_DEPTH - 4) break;
      size_t c =
          rd->total - rd->posted < VB_READ_MAX ? (size_t)(rd->total - rd->posted) : VB_READ_MAX;
      uint64_t wr = ((uint64_t)pi << 32) | ((uint64_t)i << 16) | ((uint64_t)ri << 8) | VB_WR_READ;
      mlxd_status s;
      if (mlxd_ibv_post_read(rl->qp, wr, rd->dst + rd->posted, c, rd->mre[rl->mr]->mr.lkey,
                             rd->raddr + rd->posted, rd->rkey[ri], &s)) {
        mlxd_status_set_peer(&s, pi, p->addr);
        mlxd_vb_fail(t, &s);
        return ev;
      }
      rl->outstanding++;
      rl->rd_out++;
      rd->outstanding++;
      rd->posted += c;
      rd->next_rail = (ri + 1) % p->nrails;
      ev++;
    }
    if ((rd->drop || !rd->dst || rd->posted == rd->total) && rd->outstanding == 0)
      rd_finish(t, pi, rd);
  }
  return ev;
}

/* An RTS or FIN chunk from pi (header h, payload pl). 1: consumed, 0: not
 * now (every read slot busy), -1: the transport failed. */
static int control_chunk(vb_transport* t, int pi, const vb_chunk_hdr* h, const char* pl) {
  vb_peer* p = &t->peers[pi];
  if (p->cur_active) {
    fail_proto(t, pi, "a control chunk inside a message");
    return -1;
  }
  if (h->kind == VB_CK_FIN) {
    if (h->len != 0 || h->total > 1) {
      fail_proto(t, pi, "a malformed rendezvous end");
      return -1;
    }
    for (vb_req** pp = &p->rdv_head; *pp; pp = &(*pp)->next) {
      vb_req* r = *pp;
      if (r->cookie != h->tag) continue;
      *pp = r->next;
      r->next = NULL;
      mre_put_all(t, r->mre);
      r->rdv = false;
      if (h->total == 1) { /* the receiver could not register: send it staged */
        r->off = 0;
        r->where = VB_W_SENDQ;
        if (p->sq_tail)
          p->sq_tail->next = r;
        else
          p->sq_head = r;
        p->sq_tail = r;
        return 1;
      }
      r->where = VB_W_NONE;
      r->m.complete = true;
      return 1;
    }
    fail_proto(t, pi, "the end of a rendezvous it was never offered");
    return -1;
  }
  size_t want = 20 + 4 * (size_t)p->nrails;
  if (h->kind != VB_CK_RTS || h->len != want || h->off != 0 || h->total == 0 ||
      h->total > SIZE_MAX / 2) {
    fail_proto(t, pi, "an unknown kind of chunk or a malformed rendezvous offer");
    return -1;
  }
  vb_rd* rd = NULL;
  for (int i = 0; i < VB_RD_SLOTS && !rd; i++)
    if (!p->rd[i].active) rd = &p->rd[i];
  if (!rd) return 0;
  memset(rd, 0, sizeof *rd);
  memcpy(&rd->raddr, pl, 8);
  memcpy(&rd->cookie, pl + 8, 8);
  uint32_t nr;
  memcpy(&nr, pl + 16, 4);
  if (nr != (uint32_t)p->nrails) {
    fail_proto(t, pi, "a rendezvous offer for another number of rails");
    return -1;
  }
  memcpy(rd->rkey, pl + 20, 4 * (size_t)p->nrails);
  rd->total = h->total;
  size_t len = (size_t)h->total;
  /* match as start_message does */
  vb_req* r = MLXD_MATCH_ENTRY(mlxd_match_find(&p->mq.posted, h->tag), vb_req, link);
  mlxd_sig sent;
  mlxd_sig_decode(h->sig, &sent);
  if (sent.op != MLXD_SIG_NONE) {
    vb_req* same = r;
    if (!same) same = MLXD_MATCH_ENTRY(mlxd_match_find_op(&p->mq.posted, h->tag), vb_req, link);
    if (same && sig_clash(t, pi, &same->m.sig, &sent)) return -1;
  }
  bool owned = false;
  if (r) {
    mlxd_match_remove(&p->mq.posted, &r->link);
    r->where = VB_W_NONE;
    if (r->m.n != len) {
      req_mismatch(r, len);
      rd->drop = true;
    } else {
      rd->req = r;
      rd->dst = r->buf;
      r->where = VB_W_RD;
      owned = mlxd_buffer_owns(r->buf, len) != 0;
    }
  } else {
    vb_unexp* u = calloc(1, sizeof *u);
    char* buf = malloc(len);
    if (!u || !buf) {
      free(u);
      free(buf);
      fail_nomem(t, pi, "buffering a message that arrived before its receive", len);
      return -1;
    }
    u->len = len;
    u->buf = buf;
    u->sig = sent;
    u->rd = rd;
    u->rdv = true;
    mlxd_match_push(&p->mq.unexpected, &u->link, h->tag);
    rd->ux = u;
    rd->dst = buf;
  }
  rd->active = true;
  if (rd->dst) {
    for (int m = 0; m < p->nmr; m++) {
      mlxd_status s;
      rd->mre[m] = mlxd_vbmr_get(&t->mrc, dev_of_mr(p, m), rd->dst, len, owned, &s);
      if (!rd->mre[m]) { /* no zero copy here: the sender sends it staged */
        if (!t->reg_warned) {
          t->reg_warned = true;
          fprintf(stderr, "mlxdist: verbs: %zu-byte receive staged instead of zero-copy: %s\n", len,
                  s.msg);
        }
        mre_put_all(t, rd->mre);
        if (rd->req) {
          rd->req->where = VB_W_POSTED;
          mlxd_match_push(&p->mq.posted, &rd->req->link, h->tag);
        } else {
          mlxd_match_remove(&p->mq.unexpected, &rd->ux->link);
          free(rd->ux->buf);
          free(rd->ux);
        }
        rd->active = false;
        vb_req* f = fin_queue(t, pi, rd->cookie);
        if (!f) return -1;
        f->m.n = 1; /* NACK: send it again, staged */
        return 1;
      }
    }
  }
  return 1;
}

/* Consume the chunks from pi that arrived, in sequence order. Returns
 * chunks consumed, or -1 (the transport failed). */
static int progress_in(vb_transport* t, int pi) {
  vb_peer* p = &t->peers[pi];
  int ev = 0;
  while (!t->err.code && p->arrived[p->consumed % VB_NSLOTS]) {
    vb_chunk_hdr h;
    const vb_chunk_hdr* s = in_slot(p, p->consumed);
    memcpy(&h, s, sizeof h);
    if (h.seq != p->consumed) {
      char w[96];
      snprintf(w, sizeof w, "chunk %llu where %llu was due", (unsigned long long)h.seq,
               (unsigned long long)p->consumed);
      fail_proto(t, pi, w);
      return -1;
    }
    if (h.kind != VB_CK_DATA) {
      int k = control_chunk(t, pi, &h, (const char*)s + VB_HDR);
      if (k < 0) return -1;
      if (k == 0) break; /* no room for another read yet */
      p->arrived[p->consumed % VB_NSLOTS] = false;
      p->consumed++;
      ev++;
      continue;
    }
    if (h.len > VB_PAYLOAD || h.off > h.total || h.total - h.off < h.len ||
        (h.len == 0 && h.total != 0) || h.total > SIZE_MAX / 2) {
      fail_proto(t, pi, "a length out of range");
      return -1;
    }
    if (!p->cur_active) {
      if (h.off != 0) {
        fail_proto(t, pi, "a message that does not start at offset 0");
        return -1;
      }
      if (!start_message(t, pi, &h)) return -1;
    } else if (h.tag != p->cur_tag || h.total != p->cur_total || h.off != p->cur_off ||
               h.len == 0) {
      fail_proto(t, pi, "a chunk that does not continue the message in progress");
      return -1;
    }
    char* dst = p->cur_req ? p->cur_req->buf : p->cur_ux ? p->cur_ux->buf : NULL;
    if (dst && h.len) memcpy(dst + h.off, (const char*)s + VB_HDR, h.len);
    p->cur_off += h.len;
    if (p->cur_ux) p->cur_ux->got = (size_t)p->cur_off;
    p->arrived[p->consumed % VB_NSLOTS] = false;
    p->consumed++;
    ev++;
    if (p->cur_off == p->cur_total) finish_message(p);
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
static int progress_out(vb_transport* t, int pi) {
  vb_peer* p = &t->peers[pi];
  int pushed = 0;
  while (p->sq_head && !t->err.code) {
    uint64_t consumed = p->cells->credit_in;
    if (consumed > p->sent) {
      fail_proto(t, pi, "credit returned for chunks never sent");
      return pushed;
    }
    if (p->sent - consumed >= VB_NSLOTS) break;
    int ri = (int)(p->sent % (uint64_t)p->nrails);
    vb_rail* rl = &p->rail[ri];
    if (rl->data_out >= VB_DATA_MAX || rl->outstanding >= VB_SQ_DEPTH - 4) break;
    vb_req* r = p->sq_head;
    size_t c = r->m.n - r->off < VB_PAYLOAD ? r->m.n - r->off : VB_PAYLOAD;
    vb_chunk_hdr* h = out_slot(p, p->sent);
    memset(h, 0, sizeof *h);
    h->seq = p->sent;
    h->tag = r->m.tag;
    h->total = r->m.n;
    h->off = r->off;
    h->len = (uint32_t)c;
    mlxd_sig_encode(h->sig, &r->m.sig);
    if (r->fin) {
      h->kind = VB_CK_FIN;
      h->tag = r->cookie;
      h->total = r->m.n; /* 1: NACK (send it staged) */
      h->len = 0;
      c = 0;
    } else if (r->rdv) {
      h->kind = VB_CK_RTS;
      char* pl = (char*)h + VB_HDR;
      uint64_t a = (uint64_t)(uintptr_t)r->buf;
      uint32_t nr = (uint32_t)p->nrails;
      memcpy(pl, &a, 8);
      memcpy(pl + 8, &r->cookie, 8);
      memcpy(pl + 16, &nr, 4);
      for (int k = 0; k < p->nrails; k++)
        memcpy(pl + 20 + 4 * k, &r->mre[p->rail[k].mr]->mr.rkey, 4);
      h->len = 20 + 4 * nr;
      c = h->len;
    } else if (c) {
      memcpy((char*)h + VB_HDR, r->buf + r->off, c);
      g_bytes_staged += c;
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
    p->slot_tag[p->sent % VB_NSLOTS] = r->m.tag;
    rl->outstanding++;
    rl->data_out++;
    p->sent++;
    pushed++;
    r->started = true;
    if (r->fin || r->rdv) {
      p->sq_head = r->next;
      if (!p->sq_head) p->sq_tail = NULL;
      r->next = NULL;
      if (r->fin) {
        req_release(t, r);
      } else {
        r->where = VB_W_RDV;
        r->next = p->rdv_head;
        p->rdv_head = r;
      }
      continue;
    }
    r->off += c;
    if (r->off == r->m.n) {
      p->sq_head = r->next;
      if (!p->sq_head) p->sq_tail = NULL;
      r->next = NULL;
      r->where = VB_W_NONE;
      r->m.complete = true;
    }
  }
  return pushed;
}

/* ---- completions ---- */

static const char* wr_what(int kind) {
  switch (kind) {
    case VB_WR_DATA: return "RDMA write";
    case VB_WR_CREDIT: return "RDMA write of credit";
    case VB_WR_BEAT: return "RDMA write of a heartbeat";
    case VB_WR_PROBE: return "RDMA write of a probe";
    case VB_WR_REC: return "RDMA write of a failure record";
    case VB_WR_READ: return "RDMA read";
    default: return "RDMA receive";
  }
}

/* An error completion of work for peer pi. */
static void wc_failed(vb_transport* t, int pi, int kind, uint64_t wr, const mlxd_ibv_wc* wc) {
  vb_peer* p = &t->peers[pi];
  if (t->closing || t->err.code) return; /* flushed after the first failure */
  if (p->cells->rec_in.state == VB_REC_CLOSED) p->closed = true;
  if (p->closed) return; /* it destroyed its transport: not a failure unless we wait on it */
  if (p->cells->rec_in.state == VB_REC_FAILED) {
    mlxd_status s;
    mlxd_vb_rec_read(t, pi, &s);
    mlxd_vb_fail(t, &s);
    return;
  }
  char ts[64] = "", why[MLXD_MSG_MAX / 2];
  if (kind == VB_WR_DATA) {
    char tw[56];
    mlxd_match_tag_str(p->slot_tag[((wr >> 16) & 0xFFFF) % VB_NSLOTS], tw, sizeof tw);
    snprintf(ts, sizeof ts, " of %s", tw);
  }
  bool gone = wc->status == 12 /* IBV_WC_RETRY_EXC_ERR */ || wc->status == 13;
  snprintf(why, sizeof why, ": %s%s failed: %s%s", wr_what(kind), ts,
           mlxd_ibv_wc_status_str(wc->status),
           gone ? "; its process died or the link is down" : "");
  if (!gone && wc->vendor_err) {
    size_t l = strlen(why);
    snprintf(why + l, sizeof why - l, " (vendor error 0x%x)", wc->vendor_err);
  }
  fail_lost(t, pi, why);
}

static int handle_wc(vb_transport* t, int dev, const mlxd_ibv_wc* wc) {
  int kind = (int)(wc->wr_id & 0xFF);
  int ri = (int)((wc->wr_id >> 8) & 0xFF);
  int pi = (int)(wc->wr_id >> 32);
  if (pi < 0 || pi >= t->base.size || pi == t->base.rank || ri >= t->peers[pi].nrails ||
      kind < VB_WR_DATA || kind > VB_WR_READ)
    return 0; /* not ours: cannot happen (wr_ids are ours) */
  vb_peer* p = &t->peers[pi];
  vb_rail* rl = &p->rail[ri];
  (void)dev;
  if (kind != VB_WR_RECV) {
    if (rl->outstanding > 0) rl->outstanding--;
    if (kind == VB_WR_DATA && rl->data_out > 0) rl->data_out--;
    if (kind == VB_WR_CREDIT) p->credit_busy = false;
    if (kind == VB_WR_BEAT) p->beat_busy = false;
    if (kind == VB_WR_PROBE) p->probe_busy = false;
    if (kind == VB_WR_REC) p->rec_busy = false;
    if (wc->status) wc_failed(t, pi, kind, wc->wr_id, wc);
    if (kind == VB_WR_READ) {
      if (rl->rd_out > 0) rl->rd_out--;
      int i = (int)((wc->wr_id >> 16) & 0xFFFF);
      if (i < VB_RD_SLOTS && p->rd[i].outstanding > 0) p->rd[i].outstanding--;
      return wc->status ? 0 : 1;
    }
    /* a data write done frees a send queue entry (progress_out counts what it
     * lets through); heartbeats, probes and credits are not progress */
    return 0;
  }
  if (wc->status) {
    wc_failed(t, pi, kind, wc->wr_id, wc);
    return 1;
  }
  /* A chunk arrived: its seq is within the window [consumed, consumed + 16). */
  uint32_t d = wc->imm - (uint32_t)p->consumed;
  if (d >= VB_NSLOTS || p->arrived[(p->consumed + d) % VB_NSLOTS]) {
    fail_proto(t, pi, "a chunk outside the window of credits it was given");
    return 1;
  }
  p->arrived[(p->consumed + d) % VB_NSLOTS] = true;
  p->heard = mlxd_now();
  mlxd_status s;
  if (!t->closing &&
      mlxd_ibv_post_recv(rl->qp, ((uint64_t)pi << 32) | ((uint64_t)ri << 8) | VB_WR_RECV, &s)) {
    mlxd_status_set_peer(&s, pi, p->addr);
    mlxd_vb_fail(t, &s);
  }
  return 1;
}

static int poll_cqs(vb_transport* t) {
  int ev = 0;
  mlxd_ibv_wc wc[32];
  for (int d = 0; d < t->ndevs; d++) {
    for (;;) {
      mlxd_status s;
      int n = mlxd_ibv_poll(t->devs[d], wc, 32, &s);
      if (n < 0) {
        if (!t->closing) mlxd_vb_fail(t, &s);
        break;
      }
      for (int i = 0; i < n; i++) ev += handle_wc(t, d, &wc[i]);
      if (n < 32) break;
    }
  }
  return ev;
}

/* A peer's record: relay its failure, note its close. */
static void check_records(vb_transport* t) {
  for (int pi = 0; pi < t->base.size && !t->err.code; pi++) {
    vb_peer* p = &t->peers[pi];
    if (pi == t->base.rank || !p->nrails) continue;
    uint32_t st = p->cells->rec_in.state;
    if (st == VB_REC_FAILED) {
      mlxd_status s;
      mlxd_vb_rec_read(t, pi, &s);
      mlxd_vb_fail(t, &s);
    } else if (st == VB_REC_CLOSED) {
      p->closed = true;
    }
  }
}

int mlxd_vb_progress(vb_transport* t, bool records) {
  if (t->err.code) return 0;
  int ev = poll_cqs(t);
  for (int pi = 0; pi < t->base.size && !t->err.code; pi++) {
    vb_peer* p = &t->peers[pi];
    if (pi == t->base.rank || !p->nrails) continue;
    int a = progress_in(t, pi);
    if (a < 0) break;
    ev += a;
    credit_out(t, pi);
    ev += rd_progress(t, pi);
    ev += progress_out(t, pi);
  }
  if (records) check_records(t);
  return ev;
}

/* ---- ops ---- */

static int fail_status(vb_transport* t, mlxd_status* st) {
  if (st) *st = t->err;
  return t->err.code;
}

static vb_req* req_start(vb_transport* t, int kind, int peer, uint64_t tag, const mlxd_sig* sig,
                         const void* buf, size_t n, mlxd_req** req, mlxd_status* st, int* rc) {
  assert(req && peer >= 0 && peer < t->base.size && peer != t->base.rank && (buf || n == 0));
  assert(t->peers[peer].nrails > 0);
  *req = NULL;
  pthread_mutex_lock(&t->mu);
  vb_peer* p = &t->peers[peer];
  if (!t->err.code && p->closed) {
    check_records(t);
    if (!t->err.code) {
      char why[96];
      snprintf(why, sizeof why, ": it closed its transport while rank %d still %s it", t->base.rank,
               kind == VB_REQ_SEND ? "sends to" : "waits for");
      fail_lost(t, peer, why);
    }
  }
  vb_req* r = t->err.code ? NULL : req_alloc(t);
  if (!r) {
    if (t->err.code) {
      *rc = fail_status(t, st);
    } else {
      *rc = mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_VERBS, "out of memory for a %s request",
                         kind == VB_REQ_SEND ? "send" : "receive");
      mlxd_status_set_peer(st, peer, p->addr);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
  }
  r->kind = kind;
  r->m.peer = peer;
  r->m.addr = p->addr;
  r->m.tag = tag;
  r->m.sig = mlxd_sig_or_none(sig);
  r->buf = (char*)(uintptr_t)buf; /* a send's buffer is only read */
  r->m.n = n;
  return r;
}

static int vb_isend(mlxd_transport* tt, int peer, uint64_t tag, const mlxd_sig* sig,
                    const void* buf, size_t n, mlxd_req** req, mlxd_status* st) {
  vb_transport* t = (vb_transport*)tt;
  int rc = 0;
  bool zc = t->zcopy_min && n >= t->zcopy_min;
  bool owned = zc && mlxd_buffer_owns(buf, n);
  vb_req* r = req_start(t, VB_REQ_SEND, peer, tag, sig, buf, n, req, st, &rc);
  if (!r) return rc;
  vb_peer* p = &t->peers[peer];
  if (zc) {
    /* Register (cached) on each device of the peer's rails; any failure
     * (memlock, EFAULT, the cache's bounds): the staged path. */
    r->rdv = true;
    for (int m = 0; m < p->nmr && r->rdv; m++) {
      mlxd_status s;
      r->mre[m] = mlxd_vbmr_get(&t->mrc, dev_of_mr(p, m), buf, n, owned, &s);
      if (!r->mre[m]) {
        if (!t->reg_warned) {
          t->reg_warned = true;
          fprintf(stderr, "mlxdist: verbs: %zu-byte send staged instead of zero-copy: %s\n", n,
                  s.msg);
        }
        mre_put_all(t, r->mre);
        r->rdv = false;
      }
    }
    if (r->rdv) r->cookie = ++t->next_cookie;
  }
  r->where = VB_W_SENDQ;
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
  vb_req* r = req_start(t, VB_REQ_RECV, peer, tag, sig, buf, n, req, st, &rc);
  if (!r) return rc;
  vb_peer* p = &t->peers[peer];
  vb_unexp* u = MLXD_MATCH_ENTRY(mlxd_match_find(&p->mq.unexpected, tag), vb_unexp, link);
  vb_unexp* same = u;
  if (!same && r->m.sig.op != MLXD_SIG_NONE)
    same = MLXD_MATCH_ENTRY(mlxd_match_find_op(&p->mq.unexpected, tag), vb_unexp, link);
  if (same && sig_clash(t, peer, &r->m.sig, &same->sig)) {
    req_release(t, r);
    rc = fail_status(t, st);
    pthread_mutex_unlock(&t->mu);
    return rc;
  }
  if (u && u->rd) { /* being read (rendezvous): its end fills r */
    mlxd_match_remove(&p->mq.unexpected, &u->link);
    if (u->len != n) {
      req_mismatch(r, u->len);
      u->rd->orphan = true;
    } else {
      u->rd->req = r;
      r->where = VB_W_RD;
    }
  } else if (u) {
    mlxd_match_remove(&p->mq.unexpected, &u->link);
    bool current = p->cur_ux == u;
    if (u->len != n) {
      req_mismatch(r, u->len);
      if (current) p->cur_ux = NULL; /* drop the rest */
    } else {
      if (u->got) memcpy(r->buf, u->buf, u->got);
      if (u->rdv) g_bytes_bounced += u->got;
      if (u->complete) {
        r->m.complete = true;
      } else {
        p->cur_ux = NULL;
        p->cur_req = r;
        r->where = VB_W_CUR;
      }
    }
    free(u->buf);
    free(u);
  } else {
    r->where = VB_W_POSTED;
    mlxd_match_push(&p->mq.posted, &r->link, tag);
  }
  mlxd_vb_progress(t, false);
  pthread_mutex_unlock(&t->mu);
  *req = (mlxd_req*)r;
  return 0;
}

static bool any_pending(vb_req** reqs, int n) {
  for (int i = 0; i < n; i++)
    if (reqs[i] && !reqs[i]->m.complete) return true;
  return false;
}

/* ---- liveness of a wait ---- */

/* Every VB_CHECK_S without progress: closed peers, heartbeats, the op
 * clock, probes. true if the transport failed. mu held. */
static bool live_check(vb_transport* t, vb_req** reqs, int n, mlxd_wait_state* ws, double now) {
  vb_req* w = NULL;
  char note[MLXD_NOTE_MAX];
  for (int i = 0; i < n && !t->err.code; i++) {
    vb_req* r = reqs[i];
    if (!r || r->m.complete) continue;
    if (!w) w = r;
    int pi = r->m.peer;
    vb_peer* p = &t->peers[pi];
    if (p->closed) {
      mlxd_vb_progress(t, true); /* what it sent before closing may still be in a queue */
      if (r->m.complete || t->err.code) continue;
      char why[96];
      snprintf(why, sizeof why, ": it closed its transport while rank %d still waits for it",
               t->base.rank);
      fail_lost(t, pi, why);
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
  if (!w || t->err.code) return t->err.code != 0;
  vb_peer* p = &t->peers[w->m.peer];
  if (now - ws->last_change >= t->live.op_s) {
    mlxd_status s;
    mlxd_vb_note_read(t, w->m.peer, note, sizeof note);
    mlxd_live_op_timeout(&s, MLXD_LAYER_VERBS, w->m.peer, p->addr, t->live.op_s,
                         w->kind == VB_REQ_SEND, w->m.n, w->m.tag, note);
    mlxd_vb_fail(t, &s);
    return true;
  }
  if (!ws->warned && t->live.warn_s > 0 && now - ws->last_change >= t->live.warn_s) {
    ws->warned = true;
    double heard = p->heard > ws->start ? p->heard : ws->start;
    mlxd_vb_note_read(t, w->m.peer, note, sizeof note);
    mlxd_live_warn(MLXD_LAYER_VERBS, t->base.rank, w->m.peer, p->addr, now - ws->last_change,
                   w->m.tag, now - heard, note);
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
static void block_wait(vb_transport* t, double max_s) {
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
  if (mlxd_vb_progress(t, true) > 0 || t->err.code) return;
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

/* Drive the transport until no request of reqs is pending (true; also when
 * the transport failed) or until `until` (false). mu held. */
static bool wait_loop(vb_transport* t, vb_req** reqs, int n, double until, mlxd_wait_state* ws) {
  if (!ws->started) {
    int ev = mlxd_vb_progress(t, true);
    if (!any_pending(reqs, n) || t->err.code) return true;
    double now = mlxd_now();
    *ws = (mlxd_wait_state){
        .started = true, .start = now, .last_change = now, .next_check = now, .last_event = now};
    for (int i = 0; i < n; i++) /* silence before the wait does not count */
      if (reqs[i] && !reqs[i]->m.complete) {
        vb_peer* p = &t->peers[reqs[i]->m.peer];
        p->last_probe = now - VB_PROBE_S; /* the first check probes at once */
      }
    if (ev && now >= until) return false;
  }
  for (;;) {
    int ev = mlxd_vb_progress(t, true);
    if (ev && t->waiting > 1) kick(t); /* it may have been another waiter's progress */
    if (!any_pending(reqs, n) || t->err.code) return true;
    double now = mlxd_now();
    mlxd_vb_beat_if_due(t, now);
    if (ev) {
      ws->last_change = ws->last_event = now;
      if (now >= until) return false;
      continue;
    }
    if (now - ws->next_check >= VB_CHECK_S) {
      ws->next_check = now;
      if (live_check(t, reqs, n, ws, now)) return true;
    }
    if (now >= until) return false;
    if (now - ws->last_event < t->spin_s) {
      pthread_mutex_unlock(&t->mu);
      sched_yield();
      pthread_mutex_lock(&t->mu);
      continue;
    }
    double left = VB_CHECK_S - (now - ws->next_check);
    if (until - now < left) left = until - now;
    if (left > VB_CREDIT_NAP_S && credit_blocked(t)) left = VB_CREDIT_NAP_S;
    block_wait(t, left);
  }
}

static int vb_waitall(mlxd_transport* tt, mlxd_req** rr, int n, mlxd_status* st) {
  vb_transport* t = (vb_transport*)tt;
  vb_req** reqs = (vb_req**)rr;
  assert(n >= 0 && (n == 0 || reqs));
  pthread_mutex_lock(&t->mu);
  mlxd_wait_state ws = {0};
  t->waiting++;
  wait_loop(t, reqs, n, INFINITY, &ws);
  t->waiting--;
  if (!t->err.code) check_records(t);
  int rc = mlxd_match_result(st, &t->err, MLXD_LAYER_VERBS, rr, n);
  if (rc == 0 && t->err.code) rc = fail_status(t, st);
  for (int i = 0; i < n; i++) {
    vb_req* r = reqs[i];
    if (!r) continue;
    if (!r->m.complete) req_unlink(t, r);
    req_release(t, r);
    reqs[i] = NULL;
  }
  pthread_mutex_unlock(&t->mu);
  return rc;
}

static int vb_wait_slice(mlxd_transport* tt, mlxd_req** rr, int n, double max_s,
                         mlxd_wait_state* ws, mlxd_status* st) {
  vb_transport* t = (vb_transport*)tt;
  assert(n >= 0 && (n == 0 || rr) && max_s >= 0);
  pthread_mutex_lock(&t->mu);
  t->waiting++;
  ws->done = wait_loop(t, (vb_req**)rr, n, mlxd_now() + max_s, ws);
  t->waiting--;
  int rc = 0;
  if (t->err.code) {
    ws->done = true;
    rc = fail_status(t, st);
  }
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
    while (!t->err.code && writes_in_flight(t) && mlxd_now() - t0 < 0.25) {
      if (!poll_cqs(t)) sched_yield();
    }
    t->closing = true;
    if (!t->err.code) {
      for (int pi = 0; pi < t->base.size; pi++) {
        vb_peer* p = &t->peers[pi];
        if (pi == t->base.rank || !p->nrails || p->closed || p->rec_busy) continue;
        mlxd_vb_rec_fill(&p->cells->rec_out, VB_REC_CLOSED, NULL);
        if (mlxd_vb_post_cell(t, pi, VB_WR_REC, offsetof(vb_cells, rec_out), sizeof(vb_rec)))
          p->rec_busy = true;
      }
    }
    while (writes_in_flight(t) && mlxd_now() - t0 < 0.5) {
      if (!poll_cqs(t)) sched_yield();
    }
    pthread_mutex_unlock(&t->mu);
    for (int pi = 0; pi < t->base.size; pi++) {
      vb_peer* p = &t->peers[pi];
      if (pi == t->base.rank) continue;
      while (p->sq_head) {
        vb_req* r = p->sq_head;
        p->sq_head = r->next;
        req_release(t, r);
      }
      while (p->rdv_head) {
        vb_req* r = p->rdv_head;
        p->rdv_head = r->next;
        req_release(t, r);
      }
      for (int i = 0; i < VB_RD_SLOTS; i++) {
        vb_rd* rd = &p->rd[i];
        if (!rd->active) continue;
        mre_put_all(t, rd->mre);
        if (rd->ux && (rd->req || rd->orphan)) { /* not in the unexpected queue */
          free(rd->ux->buf);
          free(rd->ux);
        }
        rd->active = false;
      }
      mlxd_match_link* l;
      while ((l = mlxd_match_pop(&p->mq.posted))) req_release(t, MLXD_MATCH_ENTRY(l, vb_req, link));
      while ((l = mlxd_match_pop(&p->mq.unexpected))) {
        vb_unexp* u = MLXD_MATCH_ENTRY(l, vb_unexp, link);
        free(u->buf);
        free(u);
      }
    }
  }
  mlxd_vb_teardown(t);
  if (t->wake_fd >= 0) close(t->wake_fd);
  while (t->free_reqs) {
    vb_req* nx = t->free_reqs->next;
    free(t->free_reqs);
    t->free_reqs = nx;
  }
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
