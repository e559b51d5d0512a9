/* Private: the mixed transport (shm to the ranks on this host, tcp to the
 * others). Design notes at the top of mixed.c. */
#ifndef MLXD_MIXED_H
#define MLXD_MIXED_H

#include "transport/transport.h"

/* Combine the group's TCP transport (group ranks) and a shared-memory
 * session of this host's ranks (created with mlxd_shm_transport_new_named
 * so that it names group ranks). local[p] is peer p's index in the shm
 * session, or -1 for a peer reached over TCP (local[rank] is ignored).
 * Takes ownership of both parts on success only; NULL with st set (out of
 * memory). */
mlxd_transport* mlxd_mixed_transport_new(mlxd_transport* tcp, mlxd_transport* shm, const int* local,
                                         mlxd_status* st);

#endif
