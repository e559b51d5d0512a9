/* Private: the mixed transport: one transport over two (ring: shm to the
 * ranks on this host, tcp to the others; jaccl: verbs to the ranks it has
 * RDMA links to, tcp to the others). Design notes at the top of mixed.c. */
#ifndef MLXD_MIXED_H
#define MLXD_MIXED_H

#include <stdbool.h>

#include "transport/transport.h"

/* Combine two transports of one group: `rest` names every peer by its group
 * rank and carries every peer that `part` does not; `part` carries peer p
 * when local[p] >= 0, naming it local[p] (its index in part: the group rank
 * again when part spans the whole group, as jaccl's verbs transport does,
 * or the peer's index in a shared-memory session of this host's ranks,
 * created with mlxd_shm_transport_new_named so that it names group ranks).
 * local[rank] is ignored. sleep_on_part: which part a wait on both sleeps
 * on (for at most 100 us at a time, while the other is polled without
 * blocking): the one with a cheap wake-up for its own peers (shm's doorbell;
 * tcp's poll). max_idle_s > 100 us: while nothing happens the sleep doubles
 * up to it (back to 100 us at the next event), so a long wait on both parts
 * does not wake 10,000 times a second; what arrives over the other part
 * then waits at most that long.
 * ring_chunk: the composite's (transport.h; 0: the default).
 * Takes ownership of both parts on success only; NULL with st set (out of
 * memory). */
mlxd_transport* mlxd_mixed_combine(mlxd_transport* rest, mlxd_transport* part, const int* local,
                                   bool sleep_on_part, double max_idle_s, size_t ring_chunk,
                                   mlxd_status* st);

/* The ring's: tcp to every peer, shm for local[p] >= 0, sleeping on shm for
 * at most 100 us at a time. */
mlxd_transport* mlxd_mixed_transport_new(mlxd_transport* tcp, mlxd_transport* shm, const int* local,
                                         mlxd_status* st);
/* How a wait on both parts spins (spin.h): machine_ranks, the group's ranks on this machine's
 * CPUs (more than this host's where hosts are emulated on one machine). Set once, after
 * create and before any op (no lock). */
void mlxd_mixed_set_local_ranks(mlxd_transport* mixed, int machine_ranks);

#endif
