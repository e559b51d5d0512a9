/* Private: the point-to-point transport interface the collective algorithms
 * (src/algo) are written against. Implementations: tcp.c, (shm.c).
 *
 * Messages are matched by (peer, tag): a receive posted for (p, t) gets
 * the bytes of the send from p with tag t, whatever order they are posted
 * in on either side, and whatever other messages are in flight. A send
 * completes when its data has been handed to the transport (it may be
 * buffered by the receiver if no receive is posted yet), so two ranks that
 * both send before they receive never deadlock. Sizes of a matched pair
 * must agree: a mismatch fails the receive with a message.
 *
 * Requests are owned by the transport: wait frees them. A failure (a peer
 * closed/reset, a timeout) fails the whole transport: every pending and
 * later operation fails fast with the first error's message. */
#ifndef MLXD_TRANSPORT_H
#define MLXD_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct mlxd_transport mlxd_transport;
typedef struct mlxd_req mlxd_req;

typedef struct mlxd_transport_ops {
  const char* name; /* "tcp", "shm" */
  int (*isend)(mlxd_transport* t, int peer, uint64_t tag, const void* buf, size_t n,
               mlxd_req** req, mlxd_status* st);
  int (*irecv)(mlxd_transport* t, int peer, uint64_t tag, void* buf, size_t n,
               mlxd_req** req, mlxd_status* st);
  /* Wait until every reqs[i] (NULL entries are skipped) completes, then free
   * them all (also on failure). Fails with MLXD_ETIMEDOUT if no progress is
   * made for MLXDIST_TIMEOUT seconds. */
  int (*waitall)(mlxd_transport* t, mlxd_req** reqs, int n, mlxd_status* st);
  void (*destroy)(mlxd_transport* t);
} mlxd_transport_ops;

struct mlxd_transport {
  const mlxd_transport_ops* ops;
  int rank;
  int size;
};

/* Tags: kind (4 bits) | sequence number (44 bits) | step (16 bits). */
enum { MLXD_TAG_P2P = 1, MLXD_TAG_COLL = 2, MLXD_TAG_SPLIT = 3, MLXD_TAG_BOOT = 4 };
static inline uint64_t mlxd_tag(unsigned kind, uint64_t seq, unsigned step) {
  return ((uint64_t)(kind & 0xF) << 60) | ((seq & ((1ull << 44) - 1)) << 16) | (step & 0xFFFF);
}

#endif
