/* Private to the ring backend (ring.c, select.c): the group's record, its
 * constructors and the transport choice. The networking it stands on
 * (hostfiles, addresses, the handshake, the mesh, bootstrap) is the
 * networking layer's: net/net.h. See docs/ring.md and docs/bootstrap.md.
 *
 * Errors below ring.c are structured (util/status.h): set-up failures use
 * MLXD_LAYER_BOOTSTRAP with the peer, its address and the failing system
 * call where known; nothing here writes "[ring]" into a message. ring.c
 * renders every status once, when it returns to the front-end. */
#ifndef MLXD_RING_INTERNAL_H
#define MLXD_RING_INTERNAL_H

#include <stdbool.h>

#include "backends/common/xgroup.h" /* g.t: tcp, shm or the router's composite (select.c), NULL when size == 1; g.hier; g.verbose: MLX_RING_VERBOSE */
#include "distributed/backend.h"
#include "net/net.h"
#include "transport/transport.h"
#include "util/status.h"

/* select.c: MLXDIST_TRANSPORT and the transport a group uses (docs/ring.md). */
enum { MLXD_RING_T_AUTO = 0, MLXD_RING_T_TCP = 1, MLXD_RING_T_SHM = 2 };
/* Parse MLXDIST_TRANSPORT; an invalid value is an error naming the variable and the choices. */
int mlxd_ring_transport_mode(int* mode, mlxd_status* st);
const char* mlxd_ring_mode_name(int mode);
/* Collective over the fresh TCP transport *t (size >= 2): exchange host records and, as the
 * setting allows, replace *t by a shared-memory transport (every rank on one host; the TCP
 * one is destroyed) or by the router's composite (shm to this host's ranks, TCP to the others).
 * host_of (size entries) receives each rank's host as the lowest rank on it; session
 * (MLXD_RING_SESSION_MAX bytes) the group's shared-memory session name (rank 0's), from
 * which split derives its children's. On error *t is left as it was. */
#define MLXD_RING_SESSION_MAX 128
int mlxd_ring_select_transport(mlxd_transport** t, int* host_of, char* session, mlxd_status* st);
/* The same choice for ranks that mlxdist-launch started on this host
 * (MLXDIST_SHM_SESSION set; a process's first group only): every rank joins
 * that session and the host records travel through it instead of over TCP.
 * Then *shm is the group's transport when every rank is on this host and
 * MLXDIST_TRANSPORT is not tcp (session: its name); else *shm is NULL and
 * the caller goes on with mlxd_ring_select_transport. Unset, size < 2 or a
 * later group: 0 at once, *shm NULL. Blocks until every rank has joined
 * (bounded by MLXDIST_CONNECT_TIMEOUT); settings that disagree fail here as
 * there, and so does a rank whose job token or secret (auth) differs; a rank
 * that cannot join fails (the others cannot go on without it: the launcher
 * stops them). */
int mlxd_ring_select_local(int rank, int size, const mlxd_net_auth* auth, mlxd_transport** shm,
                           char* session, mlxd_status* st);
/* Print the line of docs/ring.md that says what rank chose (MLX_RING_VERBOSE=1):
 * "[ring] rank 0: transports: shm with ranks 1; tcp with ranks 2,3"; on_shm[p]: peer p is
 * reached over shared memory. */
void mlxd_ring_log_transports(int rank, int size, const bool* on_shm);

/* ring.c: the backend proper. */
typedef struct mlxd_ring {
  mlxd_xgroup g; /* first: the ops over g.t (backends/common/xgroup.h), tag "ring" */
  int nconn;
  mlxd_net_addr self; /* the address this rank listens on (port 0 form is reused by split) */
  mlxd_net_auth auth; /* the group's token and key; split derives its child's from them */
  int* host_of;       /* host_of[p]: the lowest rank on rank p's host (NULL when size == 1) */
  char session[MLXD_RING_SESSION_MAX]; /* the group's shm session name */
  /* A group made at init, once split: its transport shared with its split
   * children's views (transport/view.h), released rather than destroyed;
   * NULL before the first split and in a child (whose g.t is a view). */
  struct mlxd_tshare* share;
} mlxd_ring;

/* Finish a group from connected fds (takes ownership of fds; closes them on failure). */
int mlxd_ring_backend_new(int rank, int size, int nconn, const mlxd_net_addr* self,
                          const mlxd_net_auth* auth, int* fds, mlxd_backend** out, mlxd_status* st);
/* The same over a transport made already (taken over, destroyed on failure;
 * NULL when size == 1). */
int mlxd_ring_backend_new_t(int rank, int size, int nconn, const mlxd_net_addr* self,
                            const mlxd_net_auth* auth, mlxd_transport* t, mlxd_backend** out,
                            mlxd_status* st);
/* The same over the transport mlxd_ring_select_local chose (every rank on
 * this host, shared-memory session `session`): no exchange. */
int mlxd_ring_backend_new_local(int rank, int size, int nconn, const mlxd_net_addr* self,
                                const mlxd_net_auth* auth, mlxd_transport* shm, const char* session,
                                mlxd_backend** out, mlxd_status* st);
#endif
