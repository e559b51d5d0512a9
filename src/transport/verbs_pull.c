/* The verbs transport's pull path (zero copy; verbs.c has the rest).
 *
 * A send of at least MLXDIST_VERBS_ZCOPY_BYTES whose buffer registers (the
 * registration cache, verbs_mr.h, on each device of the peer's rails) goes
 * as one offer chunk (VB_CK_RTS) through the slots: {address, cookie, rkey
 * per rail}; it then waits on the peer's pull queue. The receiver,
 * processing chunks in order, takes the offer at once (so the slots and the
 * no-deadlock rule stay as they are): matched to a posted receive, it
 * registers that buffer and RDMA-reads the data straight into it (no copy);
 * unmatched, it reads into a malloc'd bounce buffer (one copy when the
 * receive comes). Reads are <= VB_READ_MAX, rails round robin,
 * VB_RD_PER_RAIL in flight per queue pair. When the last read completed, the
 * receiver queues a FIN chunk (tag = cookie) behind its own sends; the
 * sender's request completes on it (the caller's buffer stays registered
 * and unchanged until then: the isend contract). A size mismatch reads
 * nothing and answers FIN; a buffer that does not register answers FIN with
 * total 1 (NACK): the sender sends it staged. */
#include "transport/verbs_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/buffer.h"

void mlxd_vb_mre_put_all(vb_transport* t, mlxd_vbmr_ent** mre) {
  for (int m = 0; m < MLXD_VERBS_MAX_RAILS; m++) {
    mlxd_vbmr_put(&t->mrc, mre[m]);
    mre[m] = NULL;
  }
}

int mlxd_vb_dev_of_mr(vb_peer* p, int m) {
  for (int r = 0; r < p->nrails; r++)
    if (p->rail[r].mr == m) return p->rail[r].dev;
  return p->rail[0].dev;
}

static vb_req* fin_queue(vb_transport* t, int pi, uint64_t cookie) {
  vb_peer* p = &t->peers[pi];
  vb_req* f = (vb_req*)mlxd_eng_req_alloc(&t->eng, sizeof(vb_req));
  if (!f) {
    mlxd_eng_fail_nomem(&t->eng, pi, "for the end of a pull", sizeof *f);
    return NULL;
  }
  f->q.kind = VB_REQ_SEND;
  f->fin = true;
  f->cookie = cookie;
  f->q.m.peer = pi;
  f->q.where = VB_W_SENDQ;
  if (p->sq_tail)
    p->sq_tail->next = f;
  else
    p->sq_head = f;
  p->sq_tail = f;
  return f;
}

static void rd_finish(vb_transport* t, int pi, vb_rd* rd) {
  mlxd_vb_mre_put_all(t, rd->mre);
  if (rd->req) {
    if (rd->ux) {
      memcpy(rd->req->buf, rd->ux->buf, (size_t)rd->total);
      mlxd_vb_bytes[2] += rd->total;
      mlxd_eng_unexp_free(&t->eng, rd->ux);
    } else if (!rd->drop) {
      mlxd_vb_bytes[1] += rd->total;
    }
    if (!rd->drop) {
      rd->req->m.complete = true;
      rd->req->where = MLXD_ENG_NONE;
    }
  } else if (rd->ux) {
    if (rd->orphan) {
      mlxd_eng_unexp_free(&t->eng, rd->ux);
    } else {
      rd->ux->complete = true;
      rd->ux->got = (size_t)rd->total;
      rd->ux->fill = NULL;
    }
  }
  rd->active = false;
  rd->req = NULL;
  rd->ux = NULL;
  fin_queue(t, pi, rd->cookie);
}

/* Post the reads of pi's pulls as far as the queue pairs allow; finish
 * those whose reads all completed. Returns reads posted. */
int mlxd_vb_pull_reads(vb_transport* t, int pi) {
  vb_peer* p = &t->peers[pi];
  int ev = 0;
  for (int i = 0; i < VB_RD_SLOTS && !t->eng.err.code; i++) {
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

/* An offer (RTS) or FIN chunk from pi (header h, payload pl). 1: consumed, 0: not
 * now (every read slot busy), -1: the transport failed. */
int mlxd_vb_pull_chunk(vb_transport* t, int pi, const vb_chunk_hdr* h, const char* pl) {
  vb_peer* p = &t->peers[pi];
  if (p->ep.cur.active) {
    mlxd_vb_fail_proto(t, pi, "a control chunk inside a message");
    return -1;
  }
  if (h->kind == VB_CK_FIN) {
    if (h->len != 0 || h->total > 1) {
      mlxd_vb_fail_proto(t, pi, "a malformed end of a pull");
      return -1;
    }
    for (vb_req** pp = &p->pull_head; *pp; pp = &(*pp)->next) {
      vb_req* r = *pp;
      if (r->cookie != h->tag) continue;
      *pp = r->next;
      r->next = NULL;
      mlxd_vb_mre_put_all(t, r->mre);
      r->pull = false;
      if (h->total == 1) { /* the receiver could not register: send it staged */
        r->off = 0;
        r->q.where = VB_W_SENDQ;
        if (p->sq_tail)
          p->sq_tail->next = r;
        else
          p->sq_head = r;
        p->sq_tail = r;
        return 1;
      }
      r->q.where = MLXD_ENG_NONE;
      r->q.m.complete = true;
      return 1;
    }
    mlxd_vb_fail_proto(t, pi, "the end of a pull it was never offered");
    return -1;
  }
  size_t want = 20 + 4 * (size_t)p->nrails;
  if (h->kind != VB_CK_RTS || h->len != want || h->off != 0 || h->total == 0 ||
      h->total > SIZE_MAX / 2) {
    mlxd_vb_fail_proto(t, pi, "an unknown kind of chunk or a malformed pull offer");
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
    mlxd_vb_fail_proto(t, pi, "a pull offer for another number of rails");
    return -1;
  }
  memcpy(rd->rkey, pl + 20, 4 * (size_t)p->nrails);
  rd->total = h->total;
  size_t len = (size_t)h->total;
  mlxd_sig sent;
  mlxd_sig_decode(h->sig, &sent);
  bool clashed, owned = false;
  mlxd_eng_req* r = mlxd_eng_match_posted(&t->eng, pi, &p->ep.mq, h->tag, &sent, &clashed);
  if (clashed) return -1;
  if (r) {
    if (r->m.n != len) {
      mlxd_match_req_mismatch(&r->m, len);
      rd->drop = true;
    } else {
      rd->req = r;
      rd->dst = r->buf;
      r->where = VB_W_RD;
      owned = mlxd_buffer_owns(r->buf, len) != 0;
    }
  } else {
    mlxd_eng_unexp* u = mlxd_eng_unexp_new(&t->eng, pi, &p->ep.mq, h->tag, len, &sent);
    if (!u) return -1;
    u->fill = rd;
    u->pulled = true;
    rd->ux = u;
    rd->dst = u->buf;
  }
  rd->active = true;
  if (rd->dst) {
    for (int m = 0; m < p->nmr; m++) {
      mlxd_status s;
      rd->mre[m] = mlxd_vbmr_get(&t->mrc, mlxd_vb_dev_of_mr(p, m), rd->dst, len, owned, &s);
      if (!rd->mre[m]) { /* no zero copy here: the sender sends it staged */
        if (!t->reg_warned) {
          t->reg_warned = true;
          fprintf(stderr, "mlxdist: verbs: %zu-byte receive staged instead of zero-copy: %s\n", len,
                  s.msg);
        }
        mlxd_vb_mre_put_all(t, rd->mre);
        if (rd->req) {
          rd->req->where = MLXD_ENG_POSTED;
          mlxd_match_push(&p->ep.mq.posted, &rd->req->link, h->tag);
        } else {
          mlxd_match_remove(&p->ep.mq.unexpected, &rd->ux->link);
          mlxd_eng_unexp_free(&t->eng, rd->ux);
        }
        rd->active = false;
        vb_req* f = fin_queue(t, pi, rd->cookie);
        if (!f) return -1;
        f->q.m.n = 1; /* NACK: send it again, staged */
        return 1;
      }
    }
  }
  return 1;
}

/* Consume the chunks from pi that arrived, in sequence order. Returns
 * chunks consumed, or -1 (the transport failed). */

bool mlxd_vb_pull_offer(vb_transport* t, vb_req* r, const void* buf, size_t n, bool owned) {
  vb_peer* p = &t->peers[r->q.m.peer];
  /* Register (cached) on each device of the peer's rails; any failure
   * (memlock, EFAULT, the cache's bounds): the staged path. */
  r->pull = true;
  for (int m = 0; m < p->nmr && r->pull; m++) {
    mlxd_status s;
    r->mre[m] = mlxd_vbmr_get(&t->mrc, mlxd_vb_dev_of_mr(p, m), buf, n, owned, &s);
    if (!r->mre[m]) {
      if (!t->reg_warned) {
        t->reg_warned = true;
        fprintf(stderr, "mlxdist: verbs: %zu-byte send staged instead of zero-copy: %s\n", n,
                s.msg);
      }
      mlxd_vb_mre_put_all(t, r->mre);
      r->pull = false;
    }
  }
  if (r->pull) r->cookie = ++t->next_cookie;
  return r->pull;
}
