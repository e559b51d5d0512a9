/* Private: what verbs.c (matching, progress, waiting, liveness) and
 * verbs_setup.c (devices, registered memory, queue pairs, the address
 * exchange, heartbeats, failure records), verbs_pull.c (the pull path) and
 * verbs_cq.c (completions) share. Design notes at the top of verbs.c. */
#ifndef MLXD_VERBS_IMPL_H
#define MLXD_VERBS_IMPL_H

#include "transport/verbs.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rdma/ibv.h"
#include "transport/engine.h"
#include "transport/liveness.h"
#include "transport/match.h"
#include "transport/verbs_mr.h"

#define VB_NSLOTS 16u                   /* slots per peer and direction */
#define VB_PAYLOAD ((size_t)64 << 10)   /* payload bytes per slot */
#define VB_HDR 64u                      /* the chunk header at the start of a slot */
#define VB_STRIDE (VB_HDR + VB_PAYLOAD) /* bytes per slot */
#define VB_SLOTS_BYTES ((size_t)VB_NSLOTS * VB_STRIDE)
#define VB_CELLS_OFF (2 * VB_SLOTS_BYTES) /* after the receive slots and the send staging */
#define VB_BLOCK_BYTES (VB_CELLS_OFF + (size_t)8192) /* one peer's registered block */
#define VB_SQ_DEPTH ((int)VB_NSLOTS + 8)      /* data writes + credit, heartbeat, probe, record */
#define VB_RQ_DEPTH ((int)VB_NSLOTS + 4)      /* zero-length receives per queue pair */
#define VB_DATA_MAX ((int)VB_NSLOTS + 2)      /* data writes outstanding on one queue pair */
#define VB_CHECK_S 0.1                        /* liveness checks / longest single sleep */
#define VB_CREDIT_NAP_S 1e-3                  /* longest sleep while a send waits for credit */
#define VB_PROBE_S 0.25                       /* probe writes to a peer a wait is blocked on */
#define VB_PIPELINE_CHUNK ((size_t)256 << 10) /* mlxd_transport.pipeline_chunk: 4 slots */
#define VB_MAX_DEVS 64                        /* distinct devices in one transport */
#define VB_READ_MAX ((size_t)4 << 20)         /* bytes per RDMA read of the pull path */
#define VB_RD_SLOTS 8                         /* pull reads in progress per peer */
#define VB_RD_PER_RAIL 4                      /* RDMA reads outstanding per queue pair */
#define VB_MR_ENTRIES 64                      /* registrations kept by the cache */
/* A chunk's kind (vb_chunk_hdr.kind). */
enum { VB_CK_DATA = 0, VB_CK_RTS = 1, VB_CK_FIN = 2 };

/* The header of a chunk in its slot (written by the sender, hostile to the
 * receiver: every field is checked against what it expects). */
typedef struct vb_chunk_hdr {
  uint64_t seq;                      /* the per-peer chunk sequence number */
  uint64_t tag;                      /* the message's tag */
  uint64_t total;                    /* the message's size */
  uint64_t off;                      /* this chunk's offset in the message */
  uint32_t len;                      /* payload bytes in this slot (<= VB_PAYLOAD) */
  uint32_t kind;                     /* VB_CK_*: data; a pull offer (payload: address, cookie,
                     rkeys; total: the message's size); its end (tag: the cookie) */
  unsigned char sig[MLXD_SIG_BYTES]; /* the sender's call (mlxd_sig_encode) */
  uint64_t pad2_;
} vb_chunk_hdr;
_Static_assert(sizeof(vb_chunk_hdr) == VB_HDR, "chunk header size");

/* A heartbeat cell: the sender's counter and its note (core/oprec.h). */
typedef struct vb_beat {
  uint64_t count;
  char note[MLXD_NOTE_MAX];
} vb_beat;

enum { VB_REC_NONE = 0, VB_REC_FAILED = 1, VB_REC_CLOSED = 2 };
/* A rank's failure (or its orderly close) as written into its peers'
 * memory (mlxd_status without its pointers). Hostile when read: every
 * field is validated (mlxd_vb_rec_read). */
typedef struct vb_rec {
  uint32_t state;  /* VB_REC_* */
  mlxd_fail_rec f; /* VB_REC_FAILED: the failure (engine.h) */
} vb_rec;

/* The cells at VB_CELLS_OFF of each peer's block: the first half is written
 * by the peer's RDMA writes, the second is the local source of ours (a
 * source is not touched while a write from it is in flight). */
typedef struct vb_cells {
  /* written by the peer */
  volatile uint64_t credit_in; /* how many of our chunks the peer consumed */
  uint64_t pad0_[7];
  volatile vb_beat beat_in;
  volatile vb_rec rec_in;
  volatile uint64_t probe_in;
  uint64_t pad1_[7];
  /* sources of our writes */
  uint64_t credit_out;
  uint64_t pad2_[7];
  vb_beat beat_out;
  vb_rec rec_out;
  uint64_t probe_out;
} vb_cells;
_Static_assert(sizeof(vb_cells) <= 8192, "cells fit their pages");

enum { VB_REQ_SEND = MLXD_ENG_SEND, VB_REQ_RECV = MLXD_ENG_RECV };
/* Where a request is besides the engine's places (engine.h): the send
 * queue, the pull sends waiting for their FIN, a pull read filling it. */
enum { VB_W_SENDQ = MLXD_ENG_OWN, VB_W_PULLQ, VB_W_RD };
/* What a work request is (its wr_id: peer << 32 | seq16 << 16 | rail << 8 | kind). */
enum { VB_WR_DATA = 1, VB_WR_CREDIT, VB_WR_BEAT, VB_WR_PROBE, VB_WR_REC, VB_WR_RECV, VB_WR_READ };

typedef struct vb_req {
  mlxd_eng_req q; /* first: the engine's part (engine.h) */
  size_t off;
  bool started;    /* send: its first chunk is posted */
  bool pull;       /* send: by the pull path (mre registered), completes on its FIN */
  bool fin;        /* internal: a FIN chunk for cookie (no caller owns it) */
  uint64_t cookie; /* pull: its id; fin: the sender's id */
  mlxd_vbmr_ent* mre[MLXD_VERBS_MAX_RAILS]; /* pull: per registration index of the peer */
  struct vb_req* next;                      /* send queue, pull queue */
} vb_req;

/* A pull read in progress at the receiver: the sender's buffer
 * (raddr, rkey per rail) read into dst in reads of <= VB_READ_MAX. */
typedef struct vb_rd {
  bool active, drop, orphan; /* drop: no read (size mismatch); orphan: ux unmatched, freed at end */
  uint64_t cookie, total, posted;
  uint64_t raddr;
  uint32_t rkey[MLXD_VERBS_MAX_RAILS];
  int outstanding, next_rail;
  char* dst;
  mlxd_eng_req* req;  /* the posted receive it fills (or NULL) */
  mlxd_eng_unexp* ux; /* the bounce buffer (or NULL) */
  mlxd_vbmr_ent* mre[MLXD_VERBS_MAX_RAILS];
} vb_rd;

typedef struct vb_rail {
  mlxd_ibv_qp* qp;
  int dev;         /* index into vb_transport.devs */
  int mr;          /* index into vb_peer.mr */
  int outstanding; /* our work requests not yet completed */
  int data_out;    /* of which data writes */
  int rd_out;      /* of which RDMA reads */
  uint64_t raddr;  /* the peer's block for us */
  uint32_t rkey;
} vb_rail;

typedef struct vb_peer {
  int nrails;
  vb_rail rail[MLXD_VERBS_MAX_RAILS];
  char* block; /* VB_BLOCK_BYTES, page aligned */
  mlxd_ibv_mr mr[MLXD_VERBS_MAX_RAILS];
  int nmr;
  vb_cells* cells;
  char addr[MLXD_ADDR_MAX]; /* "10.0.2.15 qp 17": the peer, for statuses */
  /* sending */
  uint64_t sent; /* chunks posted */
  vb_req *sq_head, *sq_tail;
  uint64_t slot_tag[VB_NSLOTS]; /* the tag of the chunk last posted in each slot */
  vb_req* pull_head;            /* pull sends waiting for their FIN */
  vb_rd rd[VB_RD_SLOTS];        /* pull reads from this peer */
  bool beat_busy, probe_busy, rec_busy;
  double last_probe;
  /* receiving */
  uint64_t consumed;    /* chunks processed */
  uint64_t credit_sent; /* the count last written to the peer */
  bool credit_busy;     /* a credit write is in flight */
  bool arrived[VB_NSLOTS];
  mlxd_eng_peer ep; /* posted receives, unexpected messages, the message coming in */
  /* liveness */
  uint64_t beat_seen;
  double heard;
  bool closed; /* it wrote VB_REC_CLOSED: it destroyed its transport */
} vb_peer;

typedef struct vb_transport {
  mlxd_transport base;
  pthread_mutex_t mu;
  mlxd_ibv_dev* devs[VB_MAX_DEVS];
  int ndevs;
  vb_peer* peers;
  mlxd_live_cfg live;
  mlxd_engine eng; /* requests, matching, the first failure, the wait (engine.h) */
  int watch;
  double last_beat;     /* when this rank last sent its heartbeats (mu) */
  atomic_bool beat_due; /* the watchdog found mu taken: a waiter sends them (verbs_setup.c) */
  bool closing;         /* destroy runs: completions of dying work are not failures */
  bool forgotten;       /* a forked child's copy */
  bool chan_owner;      /* a waiter sleeps on the completion channels */
  int wake_fd;          /* eventfd: wakes the channel sleeper (abort, another waiter's progress) */
  /* the pull path (zero copy) */
  size_t zcopy_min;   /* MLXDIST_VERBS_ZCOPY_BYTES (0: off) */
  size_t block_bytes; /* registered by set-up (for the memlock check) */
  mlxd_vbmr mrc;      /* the registration cache (mu) */
  int buf_watch;      /* mlxd_buffer_watch id */
  uint64_t next_cookie;
  bool reg_warned;
} vb_transport;

/* ---- verbs.c ---- */
extern const mlxd_transport_ops mlxd_verbs_ops;
/* Bytes moved by path: staged, pulled straight, pulled then copied
 * (mlxd_verbs_copy_counts). */
extern _Atomic uint64_t mlxd_vb_bytes[3];
void mlxd_vb_fail(vb_transport* t, const mlxd_status* st); /* mu held */
/* Fail the transport: peer pi wrote a chunk it should not have (what). */
void mlxd_vb_fail_proto(vb_transport* t, int pi, const char* what);
/* Set the engine's part of a new transport (its ops; spin_s). */
void mlxd_vb_engine_init(vb_transport* t, double spin_s);
/* One pass: every completion queue, every peer's arrivals, credits, sends
 * and (records) failure record; isend/irecv leave the records to the waits,
 * as the other transports do. Returns events (chunks in or out), mu held. */
int mlxd_vb_progress(vb_transport* t, bool records);
void mlxd_vb_destroy(mlxd_transport* tt);

/* ---- verbs_pull.c: the pull path (zero copy) ---- */
/* The device of peer p's registration index m. */
int mlxd_vb_dev_of_mr(vb_peer* p, int m);
/* Release a request's or a read's registrations. */
void mlxd_vb_mre_put_all(vb_transport* t, mlxd_vbmr_ent** mre);
/* Make send r (n bytes of buf; owned: from mlxd_buffer_alloc) a pull offer:
 * its buffer registered on each device of the peer's rails. false: it did
 * not register (warned once): r goes staged. mu held. */
bool mlxd_vb_pull_offer(vb_transport* t, vb_req* r, const void* buf, size_t n, bool owned);
/* An offer or FIN chunk from pi (header h, payload pl). 1: consumed, 0: not
 * now (every read slot busy), -1: the transport failed. mu held. */
int mlxd_vb_pull_chunk(vb_transport* t, int pi, const vb_chunk_hdr* h, const char* pl);
/* Post pi's pull reads as far as the queue pairs allow; finish those whose
 * reads all completed (a FIN queued). Returns reads posted. mu held. */
int mlxd_vb_pull_reads(vb_transport* t, int pi);

/* ---- verbs_cq.c: completions ---- */
/* Poll every completion queue; returns events (chunks arrived, reads done). */
int mlxd_vb_poll_cqs(vb_transport* t);
/* The peers' records: relay a failure, note a close. mu held. */
void mlxd_vb_check_records(vb_transport* t);

/* ---- verbs_setup.c ---- */
/* Post a small control write (credit, heartbeat, probe, record) of n bytes
 * from the cells of peer pi at `off` to the same cell in the peer's memory,
 * on rail 0. false when the queue pair is full or in error (the caller
 * drops it: control writes are repeated or best effort). mu held. */
bool mlxd_vb_post_cell(vb_transport* t, int pi, int kind, size_t off, size_t n);
/* The record rank pi wrote (validated) into st; returns its code. */
int mlxd_vb_rec_read(vb_transport* t, int pi, mlxd_status* st);
/* Fill this rank's record source for peers with st / a close mark. */
void mlxd_vb_rec_fill(vb_rec* rec, uint32_t state, const mlxd_status* st);
void mlxd_vb_note_read(vb_transport* t, int pi, char* out, size_t n);
void mlxd_vb_live_start(vb_transport* t);
/* Send the heartbeats now if the watchdog left them to a waiter or they are
 * overdue (1.5 periods): a waiter calls it on every pass, since it keeps mu
 * through a stream of events. mu held. */
void mlxd_vb_beat_if_due(vb_transport* t, double now);
void mlxd_vb_live_stop(vb_transport* t);
/* Free what set-up made (queue pairs, memory, devices) after destroy's
 * drain; mu not held, no other thread. */
void mlxd_vb_teardown(vb_transport* t);
/* The registration cache's hooks (verbs_setup.c): register with the
 * memlock check first; the buffer release watcher. */
int mlxd_vb_mr_reg(void* ctx, int dev, void* addr, size_t len, mlxd_ibv_mr* out, mlxd_status* st);
void mlxd_vb_mr_dereg(void* ctx, mlxd_ibv_mr* mr);
void mlxd_vb_mr_release(void* ctx, const void* base, size_t len);

#endif
