/* Private: the verbs transport (an mlxd_transport over RDMA reliable
 * connections: soft-RoCE, RoCE, InfiniBand). Design notes at the top of
 * verbs.c; the device layer it stands on is rdma/ibv.h. */
#ifndef MLXD_VERBS_TRANSPORT_H
#define MLXD_VERBS_TRANSPORT_H

#include "transport/transport.h"

#define MLXD_VERBS_MAX_RAILS 16 /* devices (queue pairs) to one peer */

/* How this rank reaches peer p: the local devices, one queue pair on each
 * (several: multi-rail, used in parallel). nrails == 0: no link to p (the
 * caller routes p's messages elsewhere, and never passes p to this
 * transport's isend/irecv). peers[rank] is ignored. Both ends of a link
 * must agree on the number of rails (peer p's entry for this rank). */
typedef struct mlxd_verbs_peer {
  int nrails;
  const char* dev[MLXD_VERBS_MAX_RAILS];
} mlxd_verbs_peer;

/* An all-gather over the `size` ranks of the group being built: every
 * rank passes n bytes in src (n the same on every rank) and gets rank r's
 * bytes at dst + r * n. Collective: every rank calls it the same number of
 * times with the same n. Bounded by its own means; returns 0 or an error
 * with st set (the set-up then fails with it). */
typedef int (*mlxd_verbs_allgather_fn)(void* ctx, const void* src, void* dst, size_t n,
                                       mlxd_status* st);

/* Build the transport: open the devices, register this rank's memory, create
 * one reliable-connection queue pair per rail, exchange their addresses
 * through ag, connect them. Collective over the group. Returns the transport
 * or NULL with st set (MLXD_LAYER_VERBS: a missing device, a port that is
 * not active, RLIMIT_MEMLOCK too low for the memory it must register,
 * a peer's malformed record, ...). Every wait is bounded. */
mlxd_transport* mlxd_verbs_transport_new(int rank, int size, const mlxd_verbs_peer* peers,
                                         mlxd_verbs_allgather_fn ag, void* ag_ctx, mlxd_status* st);

/* Bytes of messages this process moved over verbs transports, by path
 * (process-wide, for tests and docs/jaccl.md): out[0] staged (two copies
 * per byte: into the sender's slot, out of the receiver's), out[1]
 * zero-copy (RDMA read straight into the posted receive's buffer), out[2]
 * read before their receive was posted (one copy: out of a bounce buffer).
 * Never blocks; no lock. */
void mlxd_verbs_copy_counts(uint64_t out[3]);

#endif
