/* The verbs transport's set-up and teardown (devices, registered blocks,
 * queue pairs, the address exchange), its heartbeats and its failure
 * records (design notes at the top of verbs.c). */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "core/buffer.h"
#include "core/oprec.h"
#include "core/watchdog.h"
#include "transport/verbs_impl.h"
#include "util/clock.h"
#include "util/tunables.h"

/* ---- control writes ---- */

bool mlxd_vb_post_cell(vb_transport* t, int pi, int kind, size_t off, size_t n) {
  vb_peer* p = &t->peers[pi];
  vb_rail* rl = &p->rail[0];
  if (!rl->qp || rl->outstanding >= VB_SQ_DEPTH) return false;
  /* the same cell of the peer's block: *_out sits as far from *_in as the
   * peer's copy of ours is from its own (one layout on both sides) */
  size_t in_off = off - offsetof(vb_cells, credit_out) + offsetof(vb_cells, credit_in);
  uint64_t wr = ((uint64_t)pi << 32) | (uint64_t)kind;
  mlxd_status s;
  if (mlxd_ibv_post_write(rl->qp, wr, (char*)p->cells + off, n, p->mr[rl->mr].lkey,
                          rl->raddr + VB_CELLS_OFF + in_off, rl->rkey, true, &s))
    return false;
  rl->outstanding++;
  return true;
}

_Static_assert(offsetof(vb_cells, beat_out) - offsetof(vb_cells, credit_out) ==
                   offsetof(vb_cells, beat_in) - offsetof(vb_cells, credit_in),
               "cells: beat mirrors credit");
_Static_assert(offsetof(vb_cells, rec_out) - offsetof(vb_cells, credit_out) ==
                   offsetof(vb_cells, rec_in) - offsetof(vb_cells, credit_in),
               "cells: record mirrors credit");
_Static_assert(offsetof(vb_cells, probe_out) - offsetof(vb_cells, credit_out) ==
                   offsetof(vb_cells, probe_in) - offsetof(vb_cells, credit_in),
               "cells: probe mirrors credit");

/* ---- failure records ---- */

void mlxd_vb_rec_fill(vb_rec* rec, uint32_t state, const mlxd_status* st) {
  memset(rec, 0, sizeof *rec);
  rec->state = state;
  if (st) mlxd_fail_rec_fill(&rec->f, st);
}

int mlxd_vb_rec_read(vb_transport* t, int pi, mlxd_status* st) {
  return mlxd_fail_rec_read(&t->peers[pi].cells->rec_in.f, MLXD_LAYER_VERBS, t->base.size, pi, st);
}

void mlxd_vb_note_read(vb_transport* t, int pi, char* out, size_t n) {
  unsigned char raw[MLXD_NOTE_MAX];
  const volatile char* src = t->peers[pi].cells->beat_in.note;
  size_t len = 0;
  while (len < sizeof raw && src[len]) {
    raw[len] = (unsigned char)src[len];
    len++;
  }
  mlxd_live_note_clean(out, n, raw, len);
}

/* ---- heartbeats ---- */

/* Send every linked peer this rank's heartbeat (mu held). */
static void beat_locked(vb_transport* t, double now) {
  t->last_beat = now;
  atomic_store_explicit(&t->beat_due, false, memory_order_relaxed);
  if (t->eng.err.code || t->closing) return;
  char note[MLXD_NOTE_MAX] = {0};
  mlxd_oprec_note(note, sizeof note);
  note[sizeof note - 1] = '\0';
  mlxd_vb_progress(t, true); /* completions of earlier beats, and whatever else came */
  for (int pi = 0; pi < t->base.size && !t->eng.err.code; pi++) {
    vb_peer* p = &t->peers[pi];
    if (pi == t->base.rank || !p->nrails || p->beat_busy || p->closed) continue;
    p->cells->beat_out.count++;
    memcpy(p->cells->beat_out.note, note, sizeof note);
    if (mlxd_vb_post_cell(t, pi, VB_WR_BEAT, offsetof(vb_cells, beat_out), sizeof(vb_beat)))
      p->beat_busy = true;
  }
}

/* The watchdog's tick never waits for mu. A waiter keeps mu through a
 * stream of events (it lets go only to sleep), and glibc's mutex is not
 * fair: a tick blocked on it missed its beats for as long as the events
 * came (a bystander rank was taken for dead after 30 s in a 4-rank ring
 * under emulation), and held back every other registration's tick. When
 * mu is taken the beat is left to the waiter (mlxd_vb_beat_if_due); when
 * the holder is not a waiter, the next tick sends it. */
static void vb_beat_tick(void* ctx, double now) {
  vb_transport* t = ctx;
  if (pthread_mutex_trylock(&t->mu) != 0) {
    atomic_store_explicit(&t->beat_due, true, memory_order_relaxed);
    return;
  }
  beat_locked(t, now);
  pthread_mutex_unlock(&t->mu);
}

void mlxd_vb_beat_if_due(vb_transport* t, double now) {
  if (t->watch <= 0) return; /* no heartbeats (a group of one, or the watchdog failed) */
  if (atomic_load_explicit(&t->beat_due, memory_order_relaxed) ||
      now - t->last_beat >= 1.5 * t->live.beat_s)
    beat_locked(t, now);
}

void mlxd_vb_live_start(vb_transport* t) {
  t->last_beat = mlxd_now();
  if (t->base.size > 1) t->watch = mlxd_watchdog_add(vb_beat_tick, t, t->live.beat_s);
}

void mlxd_vb_live_stop(vb_transport* t) {
  mlxd_watchdog_remove(t->watch);
  t->watch = 0;
}

/* ---- the registration cache's hooks ---- */

int mlxd_vb_mr_reg(void* ctx, int dev, void* addr, size_t len, mlxd_ibv_mr* out, mlxd_status* st) {
  vb_transport* t = ctx;
  if (mlxd_ibv_memlock_check(t->block_bytes + t->mrc.bytes + len, st)) return st->code;
  return mlxd_ibv_reg(t->devs[dev], addr, len, MLXD_IBV_REMOTE_READ, out, st);
}

void mlxd_vb_mr_dereg(void* ctx, mlxd_ibv_mr* mr) {
  (void)ctx;
  mlxd_ibv_dereg(mr);
}

void mlxd_vb_mr_release(void* ctx, const void* base, size_t len) {
  vb_transport* t = ctx;
  if (t->forgotten) return; /* a forked child's copy: the registrations are the parent's */
  pthread_mutex_lock(&t->mu);
  mlxd_vbmr_invalidate(&t->mrc, base, len);
  pthread_mutex_unlock(&t->mu);
}

/* ---- teardown ---- */

void mlxd_vb_teardown(vb_transport* t) {
  if (t->peers) {
    for (int pi = 0; pi < t->base.size; pi++)
      for (int r = 0; r < t->peers[pi].nrails; r++)
        if (t->peers[pi].rail[r].qp) mlxd_ibv_qp_kill(t->peers[pi].rail[r].qp);
    /* the flushed work completes at once: take it off the queues (bounded) */
    mlxd_ibv_wc wc[32];
    for (int d = 0; d < t->ndevs; d++) {
      for (int i = 0; i < 64; i++) {
        mlxd_status s;
        if (mlxd_ibv_poll(t->devs[d], wc, 32, &s) <= 0) break;
      }
    }
    for (int pi = 0; pi < t->base.size; pi++) {
      vb_peer* p = &t->peers[pi];
      for (int r = 0; r < p->nrails; r++) mlxd_ibv_qp_destroy(p->rail[r].qp);
      for (int m = 0; m < p->nmr; m++) mlxd_ibv_dereg(&p->mr[m]);
      free(p->block);
    }
  }
  mlxd_vbmr_clear(&t->mrc);
  for (int d = 0; d < t->ndevs; d++) mlxd_ibv_dev_close(t->devs[d]);
  t->ndevs = 0;
  free(t->peers);
  t->peers = NULL;
}

/* ---- set-up ---- */

#define VB_MAGIC 0x6d6c786476726231ull /* "mlxdvrb1" */
#define VB_REC_HDR 16
#define VB_RAIL_REC (MLXD_IBV_QP_INFO_BYTES + 16)
#define VB_PEER_REC (8 + MLXD_VERBS_MAX_RAILS * VB_RAIL_REC)

static void put32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (24 - 8 * i));
}
static void put64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (56 - 8 * i));
}
static uint32_t get32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v = v << 8 | p[i];
  return v;
}
static uint64_t get64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = v << 8 | p[i];
  return v;
}

static int dev_index(vb_transport* t, const char* name) {
  for (int d = 0; d < t->ndevs; d++)
    if (strcmp(mlxd_ibv_dev_name(t->devs[d]), name) == 0) return d;
  return -1;
}

/* "10.0.2.15 qp 17", "gid fe80::1 qp 17", "lid 3 qp 17": the peer. */
static void qp_addr(char* out, size_t n, const mlxd_ibv_qp_info* q) {
  static const unsigned char v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  char a[INET6_ADDRSTRLEN] = "";
  if (q->global && memcmp(q->gid, v4, 12) == 0) {
    char a4[INET_ADDRSTRLEN] = "";
    inet_ntop(AF_INET, q->gid + 12, a4, sizeof a4);
    snprintf(out, n, "%s qp %u", a4, q->qpn);
  } else if (q->global) {
    inet_ntop(AF_INET6, q->gid, a, sizeof a);
    snprintf(out, n, "gid %s qp %u", a, q->qpn);
  } else {
    snprintf(out, n, "lid %u qp %u", q->lid, q->qpn);
  }
}

static mlxd_transport* setup_fail(vb_transport* t, mlxd_status* st, const mlxd_status* why) {
  if (why && why != st) *st = *why;
  if (t) {
    t->closing = true;
    mlxd_vb_teardown(t);
    if (t->wake_fd >= 0) close(t->wake_fd);
    pthread_mutex_destroy(&t->mu);
    free(t);
  }
  return NULL;
}

mlxd_transport* mlxd_verbs_transport_new(int rank, int size, const mlxd_verbs_peer* peers,
                                         mlxd_verbs_allgather_fn ag, void* ag_ctx,
                                         mlxd_status* st) {
  mlxd_status_clear(st);
  if (size < 1 || rank < 0 || rank >= size || !peers || !ag) {
    mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_VERBS, "bad arguments (rank %d of %d)", rank, size);
    return NULL;
  }
  /* What must be registered: a block per peer per distinct device of its rails. */
  size_t need = 0;
  for (int p = 0; p < size; p++) {
    if (p == rank) continue;
    int k = peers[p].nrails;
    if (k < 0 || k > MLXD_VERBS_MAX_RAILS) {
      mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_VERBS, "%d rails to rank %d (0..%d allowed)", k, p,
                   MLXD_VERBS_MAX_RAILS);
      return NULL;
    }
    int distinct = 0;
    for (int r = 0; r < k; r++) {
      if (!peers[p].dev[r] || !peers[p].dev[r][0]) {
        mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_VERBS, "rail %d to rank %d names no device", r, p);
        return NULL;
      }
      bool seen = false;
      for (int q = 0; q < r; q++) seen = seen || strcmp(peers[p].dev[q], peers[p].dev[r]) == 0;
      distinct += !seen;
    }
    need += (size_t)distinct * VB_BLOCK_BYTES;
  }
  if (need && mlxd_ibv_memlock_check(need, st)) return NULL;
  vb_transport* t = calloc(1, sizeof *t);
  if (!t) {
    mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_VERBS, "out of memory for the transport");
    return NULL;
  }
  pthread_mutex_init(&t->mu, NULL);
  t->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); /* -1: waiters sleep 0.1 s at most */
  t->base.ops = &mlxd_verbs_ops;
  t->base.rank = rank;
  t->base.size = size;
  t->base.pipeline_chunk = VB_PIPELINE_CHUNK;
  mlxd_live_cfg_load(&t->live);
  double spin_s = mlxd_tunable_double(MLXD_T_SPIN_US) * 1e-6;
  mlxd_vb_engine_init(t, spin_s >= 0 ? spin_s : 50e-6);
  long zc = mlxd_tunable_long(MLXD_T_VERBS_ZCOPY_BYTES);
  t->zcopy_min = zc > 0 ? (size_t)zc : 0;
  t->block_bytes = need;
  long mrmb = mlxd_tunable_long(MLXD_T_VERBS_MR_CACHE_MB);
  mlxd_vbmr_init(&t->mrc, VB_MR_ENTRIES, (size_t)(mrmb > 0 ? mrmb : 256) << 20, mlxd_vb_mr_reg,
                 mlxd_vb_mr_dereg, t);
  t->peers = calloc((size_t)size, sizeof *t->peers);
  if (!t->peers) {
    mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_VERBS, "out of memory for the transport");
    return setup_fail(t, st, NULL);
  }
  /* Devices: each distinct one once, its queue sized for every queue pair on it. */
  for (int p = 0; p < size; p++) {
    if (p == rank) continue;
    for (int r = 0; r < peers[p].nrails; r++) {
      if (dev_index(t, peers[p].dev[r]) >= 0) continue;
      int on = 0;
      for (int q = 0; q < size; q++)
        for (int s = 0; q != rank && s < peers[q].nrails; s++)
          on += strcmp(peers[q].dev[s], peers[p].dev[r]) == 0;
      if (t->ndevs == VB_MAX_DEVS) {
        mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_VERBS, "more than %d devices", VB_MAX_DEVS);
        return setup_fail(t, st, NULL);
      }
      if (mlxd_ibv_dev_open(peers[p].dev[r], on * (VB_SQ_DEPTH + VB_RQ_DEPTH) + 16,
                            &t->devs[t->ndevs], st))
        return setup_fail(t, st, NULL);
      t->ndevs++;
    }
  }
  /* Blocks, registrations, queue pairs, receives; this rank's record. */
  size_t rec_n = VB_REC_HDR + (size_t)size * VB_PEER_REC;
  unsigned char* mine = calloc(1, rec_n);
  unsigned char* all = calloc((size_t)size, rec_n);
  if (!mine || !all) {
    free(mine);
    free(all);
    mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_VERBS, "out of memory for the address exchange");
    return setup_fail(t, st, NULL);
  }
  mlxd_ibv_qp_info self[MLXD_VERBS_MAX_RAILS];
  put64(mine, VB_MAGIC);
  put32(mine + 8, (uint32_t)rank);
  put32(mine + 12, (uint32_t)size);
  int rc = 0;
  for (int pi = 0; pi < size && !rc; pi++) {
    if (pi == rank || !peers[pi].nrails) continue;
    vb_peer* p = &t->peers[pi];
    p->nrails = peers[pi].nrails;
    if (posix_memalign((void**)&p->block, 4096, VB_BLOCK_BYTES)) {
      p->block = NULL;
      rc = mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_VERBS, "out of memory for rank %d's block", pi);
      break;
    }
    memset(p->block, 0, VB_BLOCK_BYTES);
    p->cells = (vb_cells*)(p->block + VB_CELLS_OFF);
    unsigned char* pr = mine + VB_REC_HDR + (size_t)pi * VB_PEER_REC;
    put32(pr, (uint32_t)p->nrails);
    for (int r = 0; r < p->nrails && !rc; r++) {
      vb_rail* rl = &p->rail[r];
      rl->dev = dev_index(t, peers[pi].dev[r]);
      rl->mr = -1;
      for (int q = 0; q < r; q++)
        if (p->rail[q].dev == rl->dev) rl->mr = p->rail[q].mr;
      if (rl->mr < 0) {
        rl->mr = p->nmr;
        if ((rc = mlxd_ibv_reg(t->devs[rl->dev], p->block, VB_BLOCK_BYTES, MLXD_IBV_REMOTE_WRITE,
                               &p->mr[p->nmr], st)))
          break;
        p->nmr++;
      }
      if ((rc = mlxd_ibv_qp_create(t->devs[rl->dev], VB_SQ_DEPTH, VB_RQ_DEPTH, &rl->qp, &self[r],
                                   st)))
        break;
      for (int k = 0; k < (int)VB_NSLOTS && !rc; k++)
        rc = mlxd_ibv_post_recv(rl->qp, ((uint64_t)pi << 32) | ((uint64_t)r << 8) | VB_WR_RECV, st);
      if (rc) break;
      unsigned char* rr = pr + 8 + (size_t)r * VB_RAIL_REC;
      mlxd_ibv_qp_info_encode(rr, &self[r]);
      put64(rr + MLXD_IBV_QP_INFO_BYTES, (uint64_t)(uintptr_t)p->block);
      put32(rr + MLXD_IBV_QP_INFO_BYTES + 8, p->mr[rl->mr].rkey);
    }
  }
  if (!rc) rc = ag(ag_ctx, mine, all, rec_n, st);
  /* Check every rank's record for us, connect. */
  for (int pi = 0; pi < size && !rc; pi++) {
    if (pi == rank) continue;
    const unsigned char* rec = all + (size_t)pi * rec_n;
    if (get64(rec) != VB_MAGIC || get32(rec + 8) != (uint32_t)pi ||
        get32(rec + 12) != (uint32_t)size) {
      rc = mlxd_fail_at(st, MLXD_EREMOTE, MLXD_LAYER_VERBS,
                        "rank %d's set-up record is not one of this transport's (wrong magic, "
                        "rank or group size)",
                        pi);
      mlxd_status_set_peer(st, pi, "");
      break;
    }
    const unsigned char* pr = rec + VB_REC_HDR + (size_t)rank * VB_PEER_REC;
    uint32_t theirs = get32(pr);
    vb_peer* p = &t->peers[pi];
    if (theirs != (uint32_t)peers[pi].nrails) {
      rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_VERBS,
                        "rank %d has %u rail(s) to rank %d but rank %d has %d to rank %d: both "
                        "ends of a link must name as many devices",
                        pi, theirs, rank, rank, peers[pi].nrails, pi);
      mlxd_status_set_peer(st, pi, "");
      break;
    }
    for (int r = 0; r < p->nrails && !rc; r++) {
      const unsigned char* rr = pr + 8 + (size_t)r * VB_RAIL_REC;
      char what[96];
      snprintf(what, sizeof what, "rank %d's queue pair for rank %d, rail %d", pi, rank, r);
      mlxd_ibv_qp_info q;
      if ((rc = mlxd_ibv_qp_info_decode(rr, what, &q, st))) break;
      if (r == 0) qp_addr(p->addr, sizeof p->addr, &q);
      p->rail[r].raddr = get64(rr + MLXD_IBV_QP_INFO_BYTES);
      p->rail[r].rkey = get32(rr + MLXD_IBV_QP_INFO_BYTES + 8);
      if ((rc = mlxd_ibv_qp_connect(p->rail[r].qp, &q, st))) {
        mlxd_status_set_peer(st, pi, p->addr);
        break;
      }
    }
  }
  /* A barrier: no rank writes before every peer's queue pairs are ready. */
  if (!rc) {
    unsigned char one = 1, got[1024];
    unsigned char* g = (size_t)size <= sizeof got ? got : malloc((size_t)size);
    if (!g) {
      rc = mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_VERBS, "out of memory for the barrier");
    } else {
      rc = ag(ag_ctx, &one, g, 1, st);
      if (g != got) free(g);
    }
  }
  free(mine);
  free(all);
  if (rc) return setup_fail(t, st, NULL);
  double now = mlxd_now();
  for (int pi = 0; pi < size; pi++) t->peers[pi].heard = now;
  mlxd_vb_live_start(t);
  t->buf_watch = mlxd_buffer_watch(mlxd_vb_mr_release, t);
  if (!t->buf_watch) t->zcopy_min = 0; /* no invalidation: no pull path */
  return &t->base;
}
