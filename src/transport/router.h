/* Private: the per-peer router. For each peer of a group, the first
 * transport in the order of preference that can reach it (shm: the peer is
 * on this rank's host; verbs: the group's device matrix links the pair; tcp:
 * always), and one mlxd_transport over any number of them that sends each
 * message over its peer's. The ring backend (backends/ring/select.c) and
 * jaccl (backends/jaccl/jaccl.c) both choose their transports here. Design
 * notes at the top of router.c. */
#ifndef MLXD_ROUTER_H
#define MLXD_ROUTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "transport/transport.h"

/* The transports a router composes, in the order of preference. */
typedef enum mlxd_route_kind {
  MLXD_ROUTE_SHM = 0,
  MLXD_ROUTE_VERBS,
  MLXD_ROUTE_TCP,
  MLXD_ROUTE_KINDS /* also: no transport reaches the pair */
} mlxd_route_kind;

/* "shm", "verbs", "tcp" ("none" for MLXD_ROUTE_KINDS). */
const char* mlxd_route_kind_name(mlxd_route_kind k);

/* What every rank of a group knows alike about the group, from which every
 * rank computes the same routes (a pair's two ranks pick the same kind). */
typedef struct mlxd_route_facts {
  int rank, size;
  const uint64_t* host;         /* size entries: each rank's host key; NULL: no shared host */
  const int* rails;             /* size * size: the device matrix's links; NULL: none */
  bool allow[MLXD_ROUTE_KINDS]; /* the kinds the group may use (tcp: also as the fallback) */
} mlxd_route_facts;

/* The can-connect test of kind k for the pair (a, b), a != b: shm when both
 * have the same host key, verbs when the matrix has rails both ways, tcp
 * always; false for a kind the facts do not allow. Symmetric. */
bool mlxd_route_can_connect(const mlxd_route_facts* f, mlxd_route_kind k, int a, int b);
/* The first kind in the order of preference that can connect a and b
 * (MLXD_ROUTE_KINDS: none). */
mlxd_route_kind mlxd_route_pick(const mlxd_route_facts* f, int a, int b);
/* The kinds any pair of the group picks (bit k: kind k). Every rank gets the
 * same mask: collective set-ups (verbs, a TCP mesh) run iff their bit is set. */
unsigned mlxd_route_group_kinds(const mlxd_route_facts* f);
/* This rank's host's ranks in increasing order (members: size entries) that
 * it reaches over shm, itself included: their count, with *me this rank's
 * index among them (a shared-memory session of these ranks, named by their
 * group ranks: mlxd_shm_transport_new_named). */
int mlxd_route_shm_members(const mlxd_route_facts* f, int* members, int* me);
/* The line a user sees (MLX_RING_VERBOSE), one per rank, each kind with its
 * peers: "[tag] rank 2: transports: shm with ranks 3; tcp with ranks 0,1".
 * kind_of: size entries (kind_of[rank] is ignored). */
void mlxd_route_log(const char* tag, int rank, int size, const mlxd_route_kind* kind_of);

/* Host identity: the 192 bytes that say which host this process is on (0:
 * its network namespace's inode, 8: its IPC namespace's, 16: the kernel boot
 * id (48), 64: the host name (128)), or with host_id (MLXDIST_HOST_ID) set,
 * only that id (16: "MLXDIST_HOST_ID", 64: the id). Its FNV-1a hash is the
 * host key that shm's can-connect test compares. */
#define MLXD_ROUTE_HOST_BYTES 192
#define MLXD_ROUTE_HOST_ID_MARK "MLXDIST_HOST_ID"
void mlxd_route_host_record(unsigned char rec[MLXD_ROUTE_HOST_BYTES], const char* host_id);
uint64_t mlxd_route_hash(uint64_t h, const unsigned char* p, size_t n); /* FNV-1a from h */
#define MLXD_ROUTE_HASH_START 1469598103934665603ull
/* The hash of the kernel boot id: which ranks share this machine's CPUs
 * (whatever MLXDIST_HOST_ID says). */
uint64_t mlxd_route_machine_key(void);
/* MLXDIST_HOST_ID, checked: *out NULL when unset, MLXD_EINVAL when too long. */
int mlxd_route_host_id(const char** out, mlxd_status* st);

typedef struct mlxd_router_opts {
  /* A wait with requests on several parts sleeps in one (shm's doorbell,
   * else tcp's poll, else verbs) for 100 us at a time while polling the
   * others without blocking; while nothing happens the sleep doubles up to
   * max_idle_s (<= 100 us: never) and what arrives over the other parts
   * waits at most that long. */
  double max_idle_s;
  size_t pipeline_chunk; /* the composite's (transport.h; 0: the default) */
  int machine_ranks;     /* the group's ranks on this machine's CPUs (spin.h); 0: all */
  /* A rank whose every peer is on one part gets that part bare, not a
   * composite of one (the ring: a rank alone on its host keeps plain tcp).
   * Without it only a group that uses one kind for every pair gets it bare
   * (then every rank has the same transport, as the algorithms need). */
  bool bare_alone;
  /* Non-NULL: the bytes sent over each part are printed at destroy as
   * "[tag] rank R: bytes sent: shm N, verbs N, tcp N" (MLX_RING_VERBOSE). */
  const char* stats_tag;
} mlxd_router_opts;

/* The transport for f's rank: parts[k] carries the peers that pick kind k
 * (mlxd_route_pick), shm naming them by their index among
 * mlxd_route_shm_members, verbs and tcp by their group ranks. A part no peer
 * picks is destroyed; a part a peer picks must be there (else MLXD_EINVAL,
 * naming the peer). When one part carries every peer (see bare_alone) it is
 * returned itself. Takes ownership of every part on success only; NULL with
 * st set (out of memory, a missing part). */
mlxd_transport* mlxd_router_new(const mlxd_route_facts* f, mlxd_transport* parts[MLXD_ROUTE_KINDS],
                                const mlxd_router_opts* o, mlxd_status* st);

#endif
