/* The verbs transport's completions (verbs.c has the design): every work
 * completion of the completion queues, its status checked; an error on our
 * work for a peer fails the transport naming it (unless the peer closed
 * first); an arrived chunk is marked for chunks_in and its receive posted
 * again. And the peers' failure records, read by the waits. */
#include "transport/verbs_impl.h"

#include <stdio.h>
#include <string.h>

#include "util/clock.h"

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
  if (t->closing || t->eng.err.code) return; /* flushed after the first failure */
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
  mlxd_eng_fail_lost(&t->eng, pi, why);
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
    /* a data write done frees a send queue entry (chunks_out counts what it
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
    mlxd_vb_fail_proto(t, pi, "a chunk outside the window of credits it was given");
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

int mlxd_vb_poll_cqs(vb_transport* t) {
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
void mlxd_vb_check_records(vb_transport* t) {
  for (int pi = 0; pi < t->base.size && !t->eng.err.code; pi++) {
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
