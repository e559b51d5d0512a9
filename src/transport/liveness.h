/* Private: liveness apart from progress, the policy every transport's wait
 * follows (tcp_live.c, shm.c and verbs.c through the engine's check op,
 * engine.h; router.c through its parts), and the words it uses.
 *
 * Three clocks, each from the environment (util/tunables.h):
 *  - MLXDIST_TIMEOUT (default 60 s): a peer that shows no sign of life
 *    (no byte of data and no heartbeat) for this long while this rank waits
 *    on it is dead (stopped, frozen, cut off): the wait fails at once,
 *    MLXD_EREMOTE, naming it. A peer whose process or connection is gone is
 *    noticed sooner, by the transport's own means.
 *  - MLXDIST_WARN_AFTER (default 60 s): a peer that is alive but has not got
 *    to the matching operation for this long gets one warning line on
 *    stderr (mlxd_live_warn), with what it said it was doing last.
 *  - MLXDIST_OP_TIMEOUT (default 1800 s): a wait that made no progress for
 *    this long fails (MLXD_ETIMEDOUT) even though its peers are alive.
 * Heartbeats: every rank with a transport gives each peer a sign of life
 * from the watchdog thread (core/watchdog.h), which ticks every
 * mlxd_live_cfg.beat_s seconds (a counter in shared memory, an RDMA write;
 * over TCP a frame every frame_s, at most 10 s: a frame wakes the peer, and
 * at 1,024 ranks 1 s frames were 8% of a job's CPU), so a rank busy in its
 * own computation for an hour is never taken for dead. A heartbeat carries the sender's note (a short
 * printable text from core/oprec.h: "in all_sum #17 for 3.2 s"), kept by
 * the receiver for its warnings.
 *
 * Nothing here blocks or takes a lock. */
#ifndef MLXD_LIVENESS_H
#define MLXD_LIVENESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/status.h"

#define MLXD_NOTE_MAX 64 /* a peer's note, NUL included */

typedef struct mlxd_live_cfg {
  double dead_s;  /* MLXDIST_TIMEOUT */
  double warn_s;  /* MLXDIST_WARN_AFTER (0: never warn) */
  double op_s;    /* MLXDIST_OP_TIMEOUT */
  double beat_s;  /* the watchdog tick: dead_s / 6, within [0.05 s, 1 s] */
  double frame_s; /* TCP: a heartbeat frame to each peer: min(dead_s, warn_s) / 6, within
                   * [beat_s, 10 s] (a peer's note in a warning is at most this old) */
} mlxd_live_cfg;

/* Read the three variables (values were validated at init). */
void mlxd_live_cfg_load(mlxd_live_cfg* c);

/* Make a note received from a peer safe to print: at most n - 1 bytes of
 * src (len bytes, not NUL-terminated), every byte outside printable ASCII
 * replaced by '?', NUL-terminated. */
void mlxd_live_note_clean(char* out, size_t n, const unsigned char* src, size_t len);

/* A peer showed no sign of life for silent_s seconds: "rank 1 has shown no
 * sign of life for 10.0 s (no data, no heartbeat): it is stopped, frozen,
 * or cut off from this host; MLXDIST_TIMEOUT sets the limit". note: what
 * the peer said it was doing last ("" if nothing). MLXD_EREMOTE. */
int mlxd_live_dead(mlxd_status* st, mlxd_layer layer, int peer, const char* addr, double silent_s,
                   const char* note);

/* A wait made no progress for op_s seconds while its peer was alive:
 * "rank 1 is alive but did not get to this operation within 1800 s (it
 * was: <note>); MLXDIST_OP_TIMEOUT sets the limit". MLXD_ETIMEDOUT. */
int mlxd_live_op_timeout(mlxd_status* st, mlxd_layer layer, int peer, const char* addr, double op_s,
                         bool is_send, size_t n, uint64_t tag, const char* note);

/* Print the one warning of a long wait on stderr, then this process's
 * operation record (mlxd_oprec_dump): "[mlxdist] rank 0: waiting 61 s for
 * rank 1 (collective #17 step 0); it is alive (last heard 0.3 s ago), it
 * was: after all_sum #16, 61.2 s ago". layer names the transport. */
void mlxd_live_warn(mlxd_layer layer, int rank, int peer, const char* addr, double waited_s,
                    uint64_t tag, double heard_ago_s, const char* note);

#endif
