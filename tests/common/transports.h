/* Ranks connected by a real transport, for the tests below the API: the
 * rank harness (ranks.h) forks the ranks, each builds its mlxd_transport
 * and runs a function on it.
 *   tcp[:K]   the TCP transport over loopback TCP connections, K per pair
 *   unix[:K]  the TCP transport over socketpair(AF_UNIX) connections
 *   shm       the shared-memory transport
 *   mixed:H   the router (transport/router.h) over shm and tcp: one digit per rank
 *             names its emulated host ("mixed:0011": ranks 0,1 on host 0,
 *             2,3 on host 1); shm inside a host, loopback TCP across
 *   verbs[:K] the verbs transport (transport/verbs.h), K rails (queue pairs)
 *             per pair, all on the device named by $T_VERBS_DEV (default
 *             rxe0); its set-up all-gather runs over AF_UNIX socketpairs
 *             (real RDMA only: the VM tests, tests/vm/vm_verbs.sh)
 * The connections are made by the parent before the fork (each rank keeps
 * its own ends), so set-up cannot race or time out; connection set-up over
 * a hostfile is the ring backend's and is tested there. */
#ifndef MLXDIST_TEST_TRANSPORTS_H
#define MLXDIST_TEST_TRANSPORTS_H

#include <stdbool.h>

#include "ranks.h"
#include "transport/transport.h"

typedef enum { T_TP_TCP, T_TP_UNIX, T_TP_SHM, T_TP_MIXED, T_TP_VERBS } t_tp_kind;

typedef struct t_tp_spec {
  t_tp_kind kind;
  int nconn; /* connections per pair (tcp, unix, mixed's tcp), rails (verbs): 1..8 */
  char hosts[T_MAX_RANKS + 1]; /* mixed: each rank's host digit; the group size is its length */
} t_tp_spec;

/* Parse "tcp", "tcp:2", "unix", "unix:1", "shm", "mixed:0011", "verbs", "verbs:2"; false on
 * anything else. */
bool t_tp_parse(const char* text, t_tp_spec* out);
/* "tcp:2" etc. */
const char* t_tp_name(const t_tp_spec* spec);

typedef int (*t_tp_fn)(mlxd_transport* t, void* arg);

/* Fork size ranks connected by spec; each runs fn on its transport (which
 * is destroyed after fn returns) and exits with its result. opts as for
 * t_run_ranks (after_fork is the harness's own here and must be NULL).
 * Returns the number of failed ranks. */
int t_run_transport(const t_tp_spec* spec, int size, t_tp_fn fn, void* arg,
                    const t_ranks_opts* opts, t_rank_exit* exits);

/* Whether a failure names rank peer: in the structured field (peer) or,
 * for a plain status, as "rank <peer>" in the text. Assert on this and the
 * code rather than on message wording. */
bool t_status_names_peer(const mlxd_status* st, int peer);

#endif
