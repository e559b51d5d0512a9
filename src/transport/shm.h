/* Private: the shared-memory transport (an mlxd_transport between processes
 * on one host). Design notes at the top of shm.c. */
#ifndef MLXD_SHM_H
#define MLXD_SHM_H

#include "transport/transport.h"

/* Join the shared-memory session `name` as `rank` of `size`. Every rank
 * passes the same name (letters, digits, '-', '_', '.'; at most 200 chars;
 * unique per session). Rank 0 creates the segment /dev/shm/<name>, the
 * others open it, retrying for MLXDIST_CONNECT_TIMEOUT seconds; the name is
 * unlinked as soon as every rank has mapped it. Returns when all ranks have
 * joined, or NULL with st set (the name is unlinked on failure too). */
mlxd_transport* mlxd_shm_transport_new(int rank, int size, const char* name, mlxd_status* st);
/* The same for a session that is part of a larger group (router.c): local
 * rank i is called rank names[i] in every message and status (copied;
 * names[i] < name_limit, the group's size). machine_ranks: how many ranks
 * of the group run on this machine (more than the session's when hosts
 * are emulated with MLXDIST_HOST_ID): more than its CPUs and a waiter
 * gives the CPU away while it spins. */
mlxd_transport* mlxd_shm_transport_new_named(int rank, int size, const char* name, const int* names,
                                             int name_limit, int machine_ranks, mlxd_status* st);
/* mlxd_shm_transport_new that also all-gathers a record of
 * MLXD_SHM_BOOT_BYTES per rank through the session (the ring's first
 * exchange when mlxdist-launch started every rank on this host): rank r
 * writes mine into its slot before it counts in, and once every rank has
 * counted in, all (size * MLXD_SHM_BOOT_BYTES bytes) holds every rank's
 * record, rank order. The records are unchecked bytes: the caller
 * validates them. Blocks like mlxd_shm_transport_new, bounded the same. */
#define MLXD_SHM_BOOT_BYTES 64
mlxd_transport* mlxd_shm_transport_join(int rank, int size, const char* name, const void* mine,
                                        void* all, mlxd_status* st);

#endif
