/* Private: what shm.c (lanes, matching, progress) and shm_setup.c (the
 * segment: set-up, liveness, published failures) share. Design notes at
 * the top of shm.c. */
#ifndef MLXD_SHM_IMPL_H
#define MLXD_SHM_IMPL_H

#include "transport/shm.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdalign.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "core/buffer.h"
#include "transport/engine.h"
#include "transport/liveness.h"
#include "transport/match.h"
#include "util/clock.h"
#include "util/tunables.h"

#if defined(__SANITIZE_THREAD__)
#define SHM_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SHM_TSAN 1
#endif
#endif
#ifndef SHM_TSAN
#define SHM_TSAN 0
#endif

#define SHM_MAGIC 0x6d6c786473686d31ull /* "mlxdshm1" */
#define SHM_VERSION \
  9u /* 2: structured failure records; 3: call signatures in slots, heartbeats;
      * 4: lanes in per-pair segments made on first contact; 5: CMA probed per
      * pair, a failure counter, the ranks' pids in pair names; 6: the ranks' pid
      * namespace in their records and in pair names; 7: a pair's control words
      * and slot headers in its first page, chunks of <= SHM_INLINE_BYTES in
      * their header; 8: a boot record per rank after the hello bitmaps; 9: the
      * header's roomy word */
#define SHM_PAIR_MAGIC 0x6d6c786470617231ull /* "mlxdpar1" */
#define SHM_CL 64
#ifndef SHM_SLOT_BYTES
#define SHM_SLOT_BYTES ((size_t)64 * 1024)
#endif
#ifndef SHM_NSLOTS
#define SHM_NSLOTS 16u
#endif
#define SHM_CMA_IO_MAX ((size_t)1 << 30)
#define SHM_NAME_MAX 200
/* The session's name + "~<lo>-<hi>~<pid lo>-<pid hi>" (shm_setup.c pair_name) */
#define SHM_PAIR_NAME_MAX (SHM_NAME_MAX + 64) /* + "~lo-hi~pid-pid~ns" */
/* A stale pair name (both its ranks gone) is removed by the next session's
 * sweep once it is this many MLXDIST_CONNECT_TIMEOUTs old (shm_setup.c). */
#define SHM_SWEEP_AGE_TIMEOUTS 2
/* While joining, each liveness check watches the next SHM_JOIN_WATCH ranks
 * after this one that have counted in (looking at most SHM_JOIN_SCAN
 * records ahead): every rank that counted in is watched by the waiting
 * ranks just before it, so a dead one is found within one check, at the
 * cost of SHM_JOIN_WATCH process checks per rank (not O(N)). */
#define SHM_JOIN_WATCH 2
#define SHM_JOIN_SCAN 32
#define SHM_CHECK_S 0.1 /* liveness checks / longest single sleep */
/* ... on a host with more than SHM_CROWDED_FACTOR times as many of the
 * group's ranks as CPUs: every idle waiter waking 10 times a second to look
 * at its peers costs the CPUs the ranks it waits for need (1,024 ranks on 2
 * cores: 10,000 wake-ups a second, each a context switch of ~20 us here). */
#define SHM_CHECK_CROWDED_S 0.5
#define SHM_CROWDED_FACTOR 8
#define SHM_DEFER_S 20e-6 /* a message without a receive waits in its lane this long (shm.c) */
/* The pipeline's chunk over shared memory (mlxd_transport.pipeline_chunk):
 * a reduction's window of received chunks (8 of them) then stays in the
 * cache. Against 1 MiB, 2 ranks all_sum: 4 MiB 370-400 us vs 440-490, 16 MiB
 * 2.2-2.6 ms vs 3.2-3.6 (docs/performance.md, "Ring chunks"). TCP keeps
 * 1 MiB (256 KiB was 10-20 % slower there). */
#define SHM_PIPELINE_CHUNK ((size_t)256 << 10)

enum { RANK_NONE = 0, RANK_ATTACHED = 1, RANK_CLOSED = 2, RANK_FAILED = 3 };
enum { CMA_UNKNOWN = 0, CMA_OK = 1, CMA_NO = 2 };
enum { SLOT_EAGER = 1, SLOT_RTS = 2 };

/* ---- shared layout ---- */

typedef struct shm_rank_rec {
  alignas(SHM_CL) _Atomic int32_t state;
  _Atomic int32_t pid;
  uint64_t probe_addr; /* published by the state store */
  uint64_t probe_val;
  uint64_t
      pidns; /* the inode of the rank's pid namespace (0: unknown); published by the state store */
  mlxd_fail_rec fail; /* published by state = RANK_FAILED (engine.h) */
  alignas(SHM_CL) _Atomic uint32_t doorbell;
  alignas(SHM_CL) _Atomic uint32_t sleepers;
  /* Liveness (liveness.h): bumped by the rank's watchdog every beat_s, with
   * its note (up to MLXD_NOTE_MAX - 1 bytes, NUL-padded; read word by word,
   * so a note may be torn: it is advice, cleaned before it is printed). */
  alignas(SHM_CL) _Atomic uint64_t beat;
  _Atomic uint64_t note[MLXD_NOTE_MAX / 8];
  /* Bumped (then the doorbell rung) by a peer that made the pair's segment
   * with this rank and set its bit in this rank's hello bitmap (shm.c). */
  alignas(SHM_CL) _Atomic uint32_t hello;
} shm_rank_rec;

typedef struct shm_hdr {
  _Atomic uint64_t magic; /* stored last by the creator */
  uint32_t version;
  uint32_t size;
  uint64_t slot_bytes, nslots, total;
  alignas(SHM_CL) _Atomic uint32_t attached; /* a futex: the last to count in wakes the rest */
  /* Set by every rank that is not on a crowded host (mlxd_spin_rule) before
   * it counts in: once all have, every rank reads the same answer and so
   * the same mlxd_transport.whole_min. */
  _Atomic uint32_t roomy;
  /* Bumped by a rank after it publishes state = RANK_FAILED: a wait's end
   * looks at the ranks' states only when it moved (one load, not one per
   * rank). */
  alignas(SHM_CL) _Atomic uint32_t nfailed;
} shm_hdr;

/* The head of a pair's segment (lanes lo -> hi, then hi -> lo; lo < hi are
 * session ranks). Written by its creator before magic (release); checked by
 * the other rank after it sees magic (acquire). */
typedef struct shm_pair_hdr {
  _Atomic uint64_t magic; /* stored last by the creator */
  uint32_t version, lo, hi, pad_;
  uint64_t slot_bytes, nslots, total;
  alignas(SHM_CL) _Atomic uint32_t attached; /* the second to count in unlinks the name */
  /* reads[0]: whether lo can read hi's memory through CMA, reads[1]: hi lo's
   * (CMA_*; probed by the reader when it maps the pair, only if it has a
   * single-copy threshold, cma_min): a sender uses CMA once its peer said so. */
  _Atomic uint32_t reads[2];
} shm_pair_hdr;

typedef struct shm_lane_ctl {
  alignas(SHM_CL) _Atomic uint64_t head; /* producer */
  alignas(SHM_CL) _Atomic uint64_t tail; /* consumer */
  _Atomic uint64_t acked;                /* consumer: single-copy reads done */
} shm_lane_ctl;

_Static_assert(sizeof(shm_pair_hdr) <= 128 && 128 + 2 * sizeof(shm_lane_ctl) <= 512 &&
                   512 + 2 * SHM_NSLOTS * SHM_CL <= 4096,
               "a pair's header, control words and slot headers fit its first page");

/* A chunk of at most this many bytes travels in its slot's header (the
 * header's page is the pair's first: a pair of ranks that only exchange
 * such messages touches one page of its segment, not one per slot). */
#define SHM_INLINE_BYTES 16

typedef struct shm_slot_hdr {
  uint32_t kind;
  uint32_t pad_;
  uint64_t tag;
  uint64_t msg_len;
  uint64_t chunk_len;
  unsigned char sig[MLXD_SIG_BYTES]; /* the sender's call (mlxd_sig_encode); first chunk only */
  union {
    uint64_t addr;                        /* SLOT_RTS: the sender's buffer */
    unsigned char data[SHM_INLINE_BYTES]; /* SLOT_EAGER, chunk_len <= SHM_INLINE_BYTES */
  } u;
} shm_slot_hdr;

_Static_assert(sizeof(shm_slot_hdr) == SHM_CL, "slot header is one cache line");

/* ---- local state ---- */

/* The transport's lock (shm_transport.mu): a futex mutex, 0 free, 1 held,
 * 2 held with a thread asleep on it. Uncontended, taking it is one inline
 * compare-and-swap and dropping it one exchange (a pthread mutex costs ~57
 * instructions per round through the PLT, and a small op takes the
 * transport's lock three times, more while it spins). Held only inside the
 * transport's ops, never across a sleep or a call out of the transport, so
 * a wait for it is bounded by the holder's few steps. Process-private. */
typedef struct shm_lock {
  _Atomic uint32_t v;
} shm_lock;
void mlxd_shm_lock_slow(shm_lock* l, uint32_t seen);
void mlxd_shm_lock_wake(shm_lock* l);
static inline void shm_lock_acquire(shm_lock* l) {
  uint32_t c = 0;
  if (!atomic_compare_exchange_strong_explicit(&l->v, &c, 1, memory_order_acquire,
                                               memory_order_relaxed))
    mlxd_shm_lock_slow(l, c);
}
static inline void shm_lock_release(shm_lock* l) {
  if (atomic_exchange_explicit(&l->v, 0, memory_order_release) == 2) mlxd_shm_lock_wake(l);
}

enum { REQ_SEND = MLXD_ENG_SEND, REQ_RECV = MLXD_ENG_RECV };
/* Where a request is besides the engine's places (engine.h). */
enum { W_SENDQ = MLXD_ENG_OWN, W_ACKQ };

typedef struct shm_req {
  mlxd_eng_req q; /* first: the engine's part (engine.h) */
  size_t off;
  bool cma; /* by the single copy (CMA): one RTS slot, done on its ack */
  uint64_t ticket;
  struct shm_req* next; /* send / ack queue */
} shm_req;

typedef struct shm_peer {
  /* outgoing lane (this rank -> peer) */
  shm_lane_ctl* out;
  shm_slot_hdr* out_hdrs; /* SHM_NSLOTS headers (the pair's first page) */
  char* out_slots;        /* SHM_NSLOTS data slots of SHM_SLOT_BYTES */
  uint64_t out_head, out_tail_seen;
  shm_req *sq_head, *sq_tail;   /* sends not yet fully in the lane */
  shm_req *ack_head, *ack_tail; /* single-copy sends waiting for their ack */
  uint64_t rts_sent;
  _Atomic uint32_t* peer_reads; /* the pair header's word: CMA_OK if the peer can read our memory */
  /* incoming lane (peer -> this rank) */
  shm_lane_ctl* in;
  shm_slot_hdr* in_hdrs;
  char* in_slots;
  uint64_t in_tail;
  mlxd_eng_peer ep; /* posted receives, unexpected messages, the message coming in */
  /* Who the peer is, read from its record on first need (mlxd_shm_peer_ident:
   * a rank that never talks to pi never touches pi's record, which at 1,024
   * ranks is 256 pages of the host segment, each a page fault). */
  bool known; /* pid, pidns and addr are set */
  pid_t pid;
  uint64_t pidns;     /* its pid namespace's inode (0: unknown), from its record */
  char addr[24];      /* "pid 1234": where the peer lives, for statuses */
  uint64_t beat_seen; /* its heartbeat counter when last looked at */
  double heard;       /* mlxd_now() when it last changed */
  /* The pair's segment, mapped on first contact (mlxd_shm_pair_attach). */
  void* pair_map;
  bool mapped;   /* pair_map, in, out are set; the peer is in t->active */
  bool unlinked; /* the name is gone (both counted in, or this rank removed it) */
} shm_peer;

typedef struct shm_transport {
  mlxd_transport base;
  shm_lock mu; /* every field below but the immutable geometry */
  char path[SHM_NAME_MAX + 2];
  void* map;
  size_t map_len;
  shm_hdr* hdr;
  shm_peer* peers;
  int* active;           /* the peers whose pair is mapped, in mapping order */
  uint32_t nfailed_seen; /* hdr->nfailed when check_failed last scanned */
  int nactive;           /* ... how many */
  uint32_t hello_seen;   /* this rank's hello counter when its bitmap was last read */
  int* names;            /* names[i]: the number messages give local rank i (a group rank when
                   * the session is part of a larger group: router.c); NULL: i itself */
  int name_limit;        /* published ranks must be below this (the group size) */
  mlxd_live_cfg live;    /* MLXDIST_TIMEOUT, _WARN_AFTER, _OP_TIMEOUT (liveness.h) */
  int watch;             /* the heartbeat's watchdog registration (0: none) */
  mlxd_engine eng;       /* requests, matching, the first failure, the wait (engine.h); its check_s:
                    * liveness checks / longest sleep of a wait, SHM_CHECK_S or _CROWDED_S */
  size_t cma_min;        /* single copy from this size (spin.h mlxd_shm_cma_bytes_for); 0: never */
  size_t cma_p2p_min;    /* the same for point to point (mlxd_shm_cma_p2p_bytes_for) */
  bool oversubscribed;
  volatile uint64_t probe; /* read by peers through CMA at set-up */
  uint64_t pidns;          /* this process's pid namespace inode (0: unknown), as in its record */
} shm_transport;

/* ---- geometry ---- */

static inline size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

static inline size_t ranks_off(void) { return round_up(sizeof(shm_hdr), 4096); }
/* The host segment: header, one record per rank, one hello bitmap per rank
 * (bit p of rank r's: p made the pair (p, r)). Lanes live in pair segments. */
static inline size_t hello_words(int size) { return ((size_t)size + 63) / 64; }
static inline size_t hello_off(int size) {
  return round_up(ranks_off() + (size_t)size * sizeof(shm_rank_rec), SHM_CL);
}
/* ... then one boot record of MLXD_SHM_BOOT_BYTES per rank (the ring's
 * host record when its ranks meet here first: mlxd_shm_transport_join),
 * packed so that reading every rank's costs a few pages, not one a rank. */
static inline size_t boot_off(int size) {
  return round_up(hello_off(size) + (size_t)size * hello_words(size) * 8, SHM_CL);
}
static inline size_t total_bytes(int size) {
  return round_up(boot_off(size) + (size_t)size * MLXD_SHM_BOOT_BYTES, 4096);
}
/* A pair's segment: page 0 holds its header, the two lanes' control words
 * (lane 0: lo -> hi, lane 1: hi -> lo) and their slot headers; then lane
 * 0's data slots, then lane 1's. */
#define SHM_PAIR_CTL_OFF 128
#define SHM_PAIR_HDRS_OFF 512
static inline shm_lane_ctl* pair_ctl(void* m, int lane) {
  return (shm_lane_ctl*)((char*)m + SHM_PAIR_CTL_OFF + (size_t)lane * sizeof(shm_lane_ctl));
}
static inline shm_slot_hdr* pair_hdrs(void* m, int lane) {
  return (shm_slot_hdr*)((char*)m + SHM_PAIR_HDRS_OFF +
                         (size_t)lane * SHM_NSLOTS * sizeof(shm_slot_hdr));
}
/* Data slots are SHM_SLOT_STRIDE apart (one line more than a slot), so
 * that the slots' first lines do not all fall in the same cache sets. */
#define SHM_SLOT_STRIDE (SHM_SLOT_BYTES + SHM_CL)
static inline char* pair_data(void* m, int lane) {
  return (char*)m + 4096 + (size_t)lane * SHM_NSLOTS * SHM_SLOT_STRIDE;
}
static inline size_t pair_bytes(void) {
  return round_up(4096 + 2 * (size_t)SHM_NSLOTS * SHM_SLOT_STRIDE, 4096);
}

static inline int shm_name(const shm_transport* t, int i) { return t->names ? t->names[i] : i; }

static inline shm_rank_rec* rank_rec(shm_transport* t, int r) {
  return (shm_rank_rec*)((char*)t->map + ranks_off() + (size_t)r * sizeof(shm_rank_rec));
}
static inline unsigned char* boot_rec(shm_transport* t, int r) {
  return (unsigned char*)t->map + boot_off(t->base.size) + (size_t)r * MLXD_SHM_BOOT_BYTES;
}
static inline _Atomic uint64_t* hello_bits(shm_transport* t, int r) {
  return (_Atomic uint64_t*)((char*)t->map + hello_off(t->base.size) +
                             (size_t)r * hello_words(t->base.size) * 8);
}

/* ---- shm_setup.c ---- */

/* Fill peer pi's pid, pid namespace and address from its record the first
 * time they are needed (records are complete once the join ended: every
 * rank wrote its own before it counted in). Cheap after the first call;
 * never blocks. */
void mlxd_shm_peer_ident_slow(shm_transport* t, int pi);
static inline void mlxd_shm_peer_ident(shm_transport* t, int pi) {
  if (!t->peers[pi].known) mlxd_shm_peer_ident_slow(t, pi);
}

/* Set the engine's part of a new transport (its ops, this rank's name as
 * its own rank; shm.c). */
void mlxd_shm_engine_init(shm_transport* t);
/* Whether process pid is gone (no such process, or a zombie). */
bool mlxd_shm_pid_dead(pid_t pid);
/* Rank r's published failure into st (validated); returns its code. */
int mlxd_shm_fail_read(shm_transport* t, int r, mlxd_status* st);
/* Register / remove this rank's heartbeat (end of create / start of
 * destroy, without mu). */
void mlxd_shm_live_start(shm_transport* t);
void mlxd_shm_live_stop(shm_transport* t);
/* Rank r's note, cleaned (liveness.h). */
void mlxd_shm_note_read(shm_transport* t, int r, char* out, size_t n);
/* Read n bytes at src of process pid into dst (process_vm_readv, looped).
 * 0, or -1 with *err set. */
int mlxd_shm_cma_read(pid_t pid, void* dst, uint64_t src, size_t n, int* err);

/* Map the pair (this rank, pi) on first contact: create its segment, or
 * (when pi made it first) open it and wait, bounded by
 * MLXDIST_CONNECT_TIMEOUT, for its creator to initialise it, watching pi's
 * process. Sets p->in/out and adds pi to t->active; a creator then tells pi
 * through its hello bitmap. 0, or the status (naming pi and the segment)
 * without failing the transport. mu held; with drop, mu is released around
 * each sleep of that wait (ops never sleep under it: transport.h) and state
 * re-checked after: 0 if another thread mapped the pair meanwhile, the
 * transport's failure if it failed (abort) meanwhile. Without drop it never
 * sleeps only when pi already wrote the magic (its hello bit says so). */
int mlxd_shm_pair_attach(shm_transport* t, int pi, bool drop, mlxd_status* st);
/* Read this rank's hello bitmap and map the pairs peers made with it (so
 * their messages are drained as today, before a receive names them).
 * Returns -1 if the transport failed. mu held. */
int mlxd_shm_pair_hellos(shm_transport* t);
/* Unmap every pair; unlink the names this rank must (destroy). */
void mlxd_shm_pair_release_all(shm_transport* t);

/* Liveness apart from progress (liveness.h), checked every t->check_s of
 * a wait without progress (shm.c wait_loop); true if the transport failed.
 * mu held. */
bool mlxd_shm_live_check(shm_transport* t, shm_req** reqs, int n, double start, double last,
                         double now, bool* warned);

/* ---- shm.c ---- */

/* Fail the whole transport with *st (the first failure wins; published to
 * the peers). mu held. */
void mlxd_shm_fail(shm_transport* t, const mlxd_status* st);

extern const mlxd_transport_ops mlxd_shm_ops;
void mlxd_shm_destroy(mlxd_transport* t);

#endif
