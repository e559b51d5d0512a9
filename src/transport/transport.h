/* Private: the point-to-point transport interface the collective algorithms
 * (src/algo) are written against. Implementations: tcp.c (TCP and Unix
 * sockets), shm.c (shared memory on one host), verbs.c (RDMA reliable
 * connections: jaccl's transport), and router.c (each peer over the first
 * of them that can reach it). tcp, shm and verbs run on one message engine
 * (engine.h: requests, matching, failures, the wait loop; each supplies how
 * its bytes move); the tag matching and failure plumbing under it is in
 * match.h.
 *
 * Messages are matched by (peer, tag): a receive posted for (p, t) gets
 * the bytes of the send from p with tag t, whatever order they are posted
 * in on either side, and whatever other messages are in flight. Tags must
 * be unique among the messages in flight from one rank to another (the
 * algorithms and the front-end guarantee it with sequence numbers). A send
 * completes when its data has been handed to the transport (it may be
 * buffered by the receiver if no receive is posted yet), so two ranks that
 * both send before they receive never deadlock. Signatures of the calls
 * behind a message and its receive must agree (see mlxd_sig, below): a
 * disagreement fails the transport. Sizes of a matched pair of unsigned
 * messages must agree: a mismatch fails that receive only.
 *
 * Threads and locks. Every op but destroy may be called from any thread,
 * concurrently with the others on the same transport. Each transport
 * serialises its state with one internal mutex, held only inside its ops
 * and never across a call out of the transport (it calls no callbacks and
 * takes no lock of the caller's), so a caller may hold its own locks
 * around transport calls (none in the tree does today: the group mutex is
 * released before a backend op runs); the lock order is always caller's
 * locks, then the transport's.
 *
 * Preconditions (asserted, not checked: the front-end rejects bad calls
 * with a message before they get here: distributed/ops.c check_peer):
 * 0 <= peer < size and peer != rank, buf != NULL when n > 0, req != NULL.
 * What arrives from the network or from another process (headers, sizes,
 * a peer's published failure) is hostile input and fails with a status.
 *
 * Failures are structured statuses (util/status.h): layer MLXD_LAYER_TCP,
 * MLXD_LAYER_SHM or MLXD_LAYER_VERBS (mixed passes on its parts'), a detail
 * without any "[tag]" prefix ("lost connection to rank 2: it closed the
 * connection"), the peer and its address where known ("10.0.0.2:41000" over
 * TCP, "pid 1234" over shm, "10.0.2.15 qp 17" over verbs), the system call and
 * errno where one failed, and the reporting rank where another rank's
 * failure is relayed. The backend renders them (mlxd_status_render).
 *
 * A failure of the transport (a peer closed/reset/died, a corrupt header, a
 * timeout, a failed system call, out of memory while receiving) fails it
 * for good: every pending and later operation fails fast with that first
 * status. A size mismatch of unsigned messages fails only its receive. */
#ifndef MLXD_TRANSPORT_H
#define MLXD_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/status.h"

typedef struct mlxd_transport mlxd_transport;
typedef struct mlxd_req mlxd_req;

/* What the rank posting a message says it is doing: the operation, the
 * element type, the element count (collectives: per rank as the caller
 * passed it; point to point: bytes) and the group size. Every message
 * carries its sender's signature; a receiver compares it with its own for
 * the same operation (the same tag kind and sequence number, whatever the
 * step), so ranks that disagree on the call fail at once with both sides
 * named (mlxd_sig_mismatch, match.h) instead of hanging or mixing data.
 * An all-zero signature (op == MLXD_SIG_NONE, or a NULL pointer where one
 * is taken) is never compared: set-up exchanges and tests use it. */
typedef enum mlxd_sig_op {
  MLXD_SIG_NONE = 0,
  MLXD_SIG_ALL_SUM,
  MLXD_SIG_ALL_MAX,
  MLXD_SIG_ALL_MIN,
  MLXD_SIG_ALL_GATHER,
  MLXD_SIG_SUM_SCATTER,
  MLXD_SIG_MAX_SCATTER,
  MLXD_SIG_MIN_SCATTER,
  MLXD_SIG_SEND, /* a send and its matching recv carry MLXD_SIG_SEND / MLXD_SIG_RECV */
  MLXD_SIG_RECV,
  MLXD_SIG_SPLIT,
  MLXD_SIG_ALL_TO_ALL, /* count: the elements of the caller's whole input */
  MLXD_SIG_COUNT
} mlxd_sig_op;

#define MLXD_SIG_BYTES 16
#define MLXD_SIG_NO_DTYPE 0xFF /* the op has no element type (split) */
typedef struct mlxd_sig {
  uint8_t op;     /* mlxd_sig_op */
  uint8_t dtype;  /* mlx_dtype, or MLXD_SIG_NO_DTYPE */
  uint16_t pad;   /* zero */
  uint32_t size;  /* the group size the caller sees */
  uint64_t count; /* elements (collectives), bytes (send/recv, split) */
} mlxd_sig;

/* What one wait keeps between its slices (wait_slice): the liveness
 * clocks run from the wait's first slice, not from each slice. Zero it
 * before the first slice of a wait; the transport fills the rest. */
typedef struct mlxd_wait_state {
  bool started;       /* the first slice ran */
  bool done;          /* out: no request is pending any more (or the transport failed) */
  bool warned;        /* the one MLXDIST_WARN_AFTER warning of this wait was printed */
  bool polled;        /* the last pass was this thread's own (tcp: it read the sockets) */
  double start;       /* when the wait began: silence before it does not count */
  double last_change; /* the last progress of its requests (the op clock) */
  double last_event;  /* the last event the transport saw (spinning window) */
  double next_check;  /* the last liveness check */
  uint64_t mark;      /* tcp: its requests' bytes moved, at the last check */
} mlxd_wait_state;

typedef struct mlxd_transport_ops {
  const char* name; /* "tcp", "shm", "verbs", "mixed" (the router's composite) */
  /* Start sending n bytes of buf to peer with tag. Never blocks beyond the
   * transport's mutex: it writes what the wire takes at once (non-blocking)
   * and leaves the rest to waitall. buf must stay valid and unchanged until
   * waitall returned for *req. Returns 0 with *req set (a request that may
   * already have failed: waitall reports it), or an error with *req NULL and
   * st set: the transport's first failure (the transport failed earlier, or
   * peer closed its connections after finishing its work), or MLXD_ENOMEM.
   * Allocates at most one block per request; takes no lock but the
   * transport's. */
  /* sig: what the caller is doing (NULL: nothing to compare); copied. */
  int (*isend)(mlxd_transport* t, int peer, uint64_t tag, const mlxd_sig* sig, const void* buf,
               size_t n, mlxd_req** req, mlxd_status* st);
  /* Post a receive of exactly n bytes from peer with tag into buf. Never
   * blocks beyond the transport's mutex; a message that already arrived is
   * copied (or taken over) at once. buf must stay valid until waitall
   * returned for *req. Returns as isend; a size mismatch is not reported
   * here but by waitall (MLXD_EINVAL, this request only). A signature that
   * differs from the sender's (for the same tag kind and sequence number)
   * fails the whole transport with mlxd_sig_mismatch's status, on both
   * ranks (the failure is relayed to the peer). */
  int (*irecv)(mlxd_transport* t, int peer, uint64_t tag, const mlxd_sig* sig, void* buf, size_t n,
               mlxd_req** req, mlxd_status* st);
  /* Wait until every reqs[i] (NULL entries are skipped; n >= 0) completes,
   * then free them all and set reqs[i] = NULL (also on failure). The calling
   * thread drives the transport (there is no progress thread): it polls the
   * wire, spins for MLXDIST_SPIN_US after the last event, then sleeps at most
   * ~0.1-1 s at a time. Several threads may wait at once on disjoint sets;
   * each request is waited exactly once.
   * Bounded, with liveness apart from progress (liveness.h): a peer this
   * wait involves that shows no sign of life (no byte, no heartbeat) for
   * MLXDIST_TIMEOUT seconds fails the transport (MLXD_EREMOTE, "rank 1 ...
   * has shown no sign of life"); a peer that is alive but has not got to
   * the matching operation is waited for: one warning line after
   * MLXDIST_WARN_AFTER seconds, MLXD_ETIMEDOUT after MLXDIST_OP_TIMEOUT
   * seconds without progress. A dead or failed peer is noticed sooner (a
   * socket error; shm: a check every 100 ms).
   * Returns 0, or the first failed request's status: MLXD_EINVAL for a size
   * mismatch (the transport stays usable), else the transport's first
   * failure (MLXD_EREMOTE, MLXD_ETIMEDOUT, MLXD_ESYS, MLXD_ENOMEM, a
   * signature mismatch, a peer's relayed failure keeping its code). When
   * the transport has failed by the time the wait ends, the wait fails even
   * if its requests completed (a peer that gave up on this operation must
   * not see it succeed here). */
  int (*waitall)(mlxd_transport* t, mlxd_req** reqs, int n, mlxd_status* st);
  /* One slice of a wait, for a caller that waits on requests of several
   * transports at once (router.c): drive the transport towards completing
   * reqs as waitall does, for at most max_s seconds (0: one non-blocking
   * pass over the wire; a blocking sleep is cut to what is left of max_s),
   * WITHOUT freeing them. ws carries the wait's liveness clocks from slice
   * to slice (MLXDIST_TIMEOUT, MLXDIST_WARN_AFTER and MLXDIST_OP_TIMEOUT
   * count from the first slice and from the last progress, as in one
   * waitall); ws->last_event tells the caller when the transport last saw
   * something happen (to keep spinning while it is busy). Returns 0 with
   * ws->done set when no request is pending any more, 0 with it clear when
   * the time ran out, or the transport's first failure (ws->done set). A
   * size mismatch is not reported here. Either way the wait ends with
   * waitall on the same requests: it returns at once, reports what waitall
   * reports and frees them. Same threads rules as waitall. */
  int (*wait_slice)(mlxd_transport* t, mlxd_req** reqs, int n, double max_s, mlxd_wait_state* ws,
                    mlxd_status* st);
  /* Fail the transport for good with st (unless it failed already): every
   * pending and later operation fails with it, waiters wake up, and the
   * peers are told (they fail with st relayed, "reported by" this rank).
   * Never blocks beyond the transport's mutex (what the wire does not take
   * at once is dropped). Any thread; not after destroy. */
  void (*abort)(mlxd_transport* t, const mlxd_status* st);
  /* Close the transport and free it (NULL is a no-op). Call it once, from
   * one thread, after every request was waited and with no other op in
   * flight. Blocks only over TCP, for the orderly close (tcp_setup.c
   * close_all): until every peer's kernel has acknowledged the last bytes
   * sent and the FIN (a reset after that loses nothing a peer still reads;
   * the peers' own FINs are not waited for), as long as bytes queued to a
   * slow link keep draining (bounded by MLXDIST_TIMEOUT without progress and
   * MLXDIST_OP_TIMEOUT in all); a failed transport waits TCP_CLOSE_MS
   * (0.5 s) at most. A lazy transport's dialer answers hellos with a
   * refusal meanwhile. Sockets are closed (peers see an orderly close),
   * shm marks this rank closed and wakes its peers, and the segment is
   * unmapped. Messages that arrived without a receive are dropped. */
  void (*destroy)(mlxd_transport* t);
  /* Optional (NULL: the transport holds no descriptor). In a child made by
   * fork(), from its pthread_atfork handler (one thread; async-signal-safe
   * calls only, no lock taken: a lock may be held by a thread that is not
   * in the child): close the child's copies of the transport's descriptors
   * with close() (never shutdown(), never a byte sent or written to shared
   * memory: they are the parent's connections) and mark them closed. The
   * child never uses or destroys the transport after this
   * (core/fork.h). */
  void (*forget)(mlxd_transport* t);
} mlxd_transport_ops;

struct mlxd_transport {
  const mlxd_transport_ops* ops;
  int rank;
  int size;
  /* Bytes per chunk of the pipeline algorithms on this transport
   * (src/algo/pipeline.c); 0: MLXD_PIPELINE_CHUNK. Every rank of a group has
   * the same kind of transport with the same value (the ranks' chunks must
   * match). */
  size_t pipeline_chunk;
  /* Blocks of at least this many bytes go to each peer whole, one message
   * apiece, instead of in pipeline chunks, where an algorithm has that choice
   * (all_gather: src/algo/all_gather.c); 0: never. Shared memory sets it on
   * a crowded host (shm_setup.c, spin.h): there the transport moves a whole
   * message in one copy that only its receiver has to be on a CPU for,
   * while a pipeline step needs the sender and the receiver running at once.
   * The same on every rank of a group (the algorithm choice follows it; the
   * shared-memory ranks agree on it when they join). */
  size_t whole_min;
};

/* Tags, from the top bit down:
 *
 *   63..60  kind             4 bits (below)
 *   59..57  phase            3 bits (MLXD_TAG_PHASE_SHIFT; 0..7)
 *   56..49  segment          8 bits (MLXD_TAG_SEGMENT_SHIFT; 0..255)
 *   48..33  group           16 bits (MLXD_TAG_GROUP_SHIFT; 0..65535)
 *   32..16  sequence number 17 bits (MLXD_TAG_SEQ_BITS; the op's number, modulo 2^17)
 *   15..0   step            16 bits (the algorithm's: 0 for one-shot; direction and unit
 *                                    for the pipeline, src/algo/pipeline.c)
 *
 * The phase and the segment are 0 for every message an algorithm posts on
 * a group's own transport; a view (view.h) sets them, so that the phases of
 * a two-level collective (src/algo/hier.c), which reuse one sequence number
 * on subsets of the ranks, and the segments of a segmented one, which run
 * the same phase on several parts of the buffer at once, never match each
 * other's messages: two messages of one call differ in phase, segment or
 * step. The group is 0 on a group's own transport; a split child's view
 * of its parent's transport (view.h, mlxd_view_child_new) sets it to the
 * child's id, the same on every member and different from every other
 * group over that transport this rank belongs to, so a child's messages
 * never match its parent's or another child's. Messages of one call share
 * kind, group and sequence number whatever their phase, segment and step
 * (mlxd_tag_op, match.h): their signatures are compared. The sequence
 * number wraps after 2^17 collectives on a group: a collective's ranks are
 * never more than a few ops apart. A point-to-point message has no steps:
 * its step field holds its number's next 16 bits (src/algo/sendrecv.c), so
 * its tag wraps only after 2^33 messages between two ranks in one
 * direction, however many of them are unreceived on however many
 * connections. */
/* Kind 3 is unused (split's exchange is a collective: MLXD_TAG_COLL).
 * Kind 15 (MLXD_TAG_CTRL) is the transports' own: control frames between
 * two ranks' transports (tcp: heartbeats and abort records, tcp_wire.h),
 * never matched with a receive; callers never use it. */
enum { MLXD_TAG_P2P = 1, MLXD_TAG_COLL = 2, MLXD_TAG_BOOT = 4, MLXD_TAG_CTRL = 15 };
#define MLXD_TAG_PHASE_SHIFT 57
#define MLXD_TAG_PHASES 8 /* phases 0..7 */
#define MLXD_TAG_SEGMENT_SHIFT 49
#define MLXD_TAG_SEGMENTS 256 /* segments 0..255 */
#define MLXD_TAG_GROUP_SHIFT 33
#define MLXD_TAG_GROUPS 65536 /* groups 0..65535 */
#define MLXD_TAG_SEQ_BITS 17
static inline uint64_t mlxd_tag(unsigned kind, uint64_t seq, unsigned step) {
  return ((uint64_t)(kind & 0xF) << 60) | ((seq & ((1ull << MLXD_TAG_SEQ_BITS) - 1)) << 16) |
         (step & 0xFFFF);
}
/* tag's kind (MLXD_TAG_P2P, MLXD_TAG_COLL...). */
static inline unsigned mlxd_tag_kind(uint64_t tag) { return (unsigned)(tag >> 60) & 0xF; }
/* tag with its phase set to phase (0..7). */
static inline uint64_t mlxd_tag_with_phase(uint64_t tag, unsigned phase) {
  return (tag & ~((uint64_t)7 << MLXD_TAG_PHASE_SHIFT)) |
         ((uint64_t)(phase & 7) << MLXD_TAG_PHASE_SHIFT);
}
static inline unsigned mlxd_tag_phase(uint64_t tag) {
  return (unsigned)(tag >> MLXD_TAG_PHASE_SHIFT) & 7;
}
/* tag with its segment set to segment (0..255). */
static inline uint64_t mlxd_tag_with_segment(uint64_t tag, unsigned segment) {
  return (tag & ~((uint64_t)0xFF << MLXD_TAG_SEGMENT_SHIFT)) |
         ((uint64_t)(segment & 0xFF) << MLXD_TAG_SEGMENT_SHIFT);
}
static inline unsigned mlxd_tag_segment(uint64_t tag) {
  return (unsigned)(tag >> MLXD_TAG_SEGMENT_SHIFT) & 0xFF;
}
/* tag with its group set to group (0..65535). */
static inline uint64_t mlxd_tag_with_group(uint64_t tag, unsigned group) {
  return (tag & ~((uint64_t)0xFFFF << MLXD_TAG_GROUP_SHIFT)) |
         ((uint64_t)(group & 0xFFFF) << MLXD_TAG_GROUP_SHIFT);
}
static inline unsigned mlxd_tag_group(uint64_t tag) {
  return (unsigned)(tag >> MLXD_TAG_GROUP_SHIFT) & 0xFFFF;
}
/* The sequence number a tag carries (modulo 2^17). */
static inline uint64_t mlxd_tag_seq(uint64_t tag) {
  return (tag >> 16) & ((1ull << MLXD_TAG_SEQ_BITS) - 1);
}

#endif
