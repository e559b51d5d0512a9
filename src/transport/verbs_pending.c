/* TEMPORARY (branch jbackend): stands in for the verbs transport
 * (transport/verbs.c, branch vtrans) until that branch is merged; the merge
 * removes this file. Never reached on a machine without an active RDMA
 * port: jaccl's create fails before it. */
#include "transport/verbs.h"

mlxd_transport* mlxd_verbs_transport_new(int rank, int size, const mlxd_verbs_peer* peers,
                                         mlxd_verbs_allgather_fn ag, void* ag_ctx,
                                         mlxd_status* st) {
  (void)rank;
  (void)size;
  (void)peers;
  (void)ag;
  (void)ag_ctx;
  mlxd_fail_at(st, MLXD_EUNAVAIL, MLXD_LAYER_VERBS,
               "the verbs transport is not built in this tree yet (docs/jaccl.md)");
  return NULL;
}
