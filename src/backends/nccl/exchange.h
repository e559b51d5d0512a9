/* Private: the nccl backend's side channel (docs/nccl.md). NCCL needs one
 * ncclUniqueId (128 bytes) made by rank 0 on every rank. MLX sends it raw
 * to whoever connects to rank 0's port; mlxdist sends it only to peers that
 * prove the job, with the networking layer's handshake (net/handshake.h): the
 * job token always, and with MLXDIST_SECRET_FILE an HMAC proof both ways.
 *
 * The exchange is a star all-gather, usable as a backend's bootstrap
 * (backend.h): rank 0 listens on NCCL_HOST_IP:NCCL_PORT; every other rank
 * connects (retrying while rank 0 is not yet listening), completes the
 * handshake (hello, reply, confirm) and sends its n bytes; once rank 0 has
 * every rank's bytes it sends the whole size * n to each. A connection that
 * fails the handshake (another job's token, no or another secret, a rank
 * out of range or already taken, silence, garbage) is closed, with one line
 * on stderr, and never receives a byte of the result. Nothing here needs
 * a GPU or NCCL: tests/nccl runs it over real sockets.
 *
 * Every wait is bounded by the deadline (cfg.timeout_s from the call's
 * start). No locks; one exchange per call; not thread-safe per object. */
#ifndef MLXD_NCCL_EXCHANGE_H
#define MLXD_NCCL_EXCHANGE_H

#include <stdbool.h>
#include <stddef.h>

#include "distributed/backend.h"
#include "net/net.h"
#include "util/status.h"

typedef struct mlxd_nccl_xchg {
  mlxd_bootstrap bs;  /* first: the all-gather (as a backend's bootstrap) */
  int rank, size;     /* this rank, the group's size */
  mlxd_net_addr root; /* rank 0's address (NCCL_HOST_IP:NCCL_PORT) */
  mlxd_net_auth auth; /* the token (and key) every connection proves */
  double timeout_s;   /* each all-gather's bound */
  int listen_fd;      /* rank 0: listening socket (-1: listen on root at the first call) */
  bool own_listen;    /* close listen_fd in mlxd_nccl_xchg_close */
} mlxd_nccl_xchg;

/* From the environment: MLX_RANK, MLX_WORLD_SIZE, NCCL_HOST_IP, NCCL_PORT
 * (MLX's names), MLX_NCCL_TIMEOUT (milliseconds, default 300000, as MLX),
 * MLXDIST_JOB_TOKEN (unset: a token derived from the address and size:
 * cross-job protection only) and MLXDIST_SECRET_FILE. An error names the
 * variable that is missing or bad. Listens on nothing yet. */
int mlxd_nccl_xchg_from_env(mlxd_nccl_xchg* x, mlxd_status* st);
/* Explicit set-up (tests): root "ip:port" (rank 0 may give port 0 and call
 * mlxd_nccl_xchg_listen to learn the port chosen). token: 16 bytes; key:
 * 32 bytes or NULL. */
int mlxd_nccl_xchg_init(mlxd_nccl_xchg* x, int rank, int size, const char* root,
                        const unsigned char* token, const unsigned char* key, double timeout_s,
                        mlxd_status* st);
/* Rank 0: listen on root now (root's port is updated if it was 0). */
int mlxd_nccl_xchg_listen(mlxd_nccl_xchg* x, mlxd_status* st);
/* The all-gather (x->bs.all_gather calls it): dst gets size * n bytes, rank
 * r's src at r * n. Blocks up to timeout_s. Rank 0 fails naming the ranks
 * that never proved themselves and those proven whose part never came
 * whole; a peer fails naming rank 0's address (a peer reset by a full rank
 * 0 before its hello was read connects again). Rank 0 holds O(connections)
 * state plus 5 bytes and, once finished, a socket per rank. */
int mlxd_nccl_xchg_gather(mlxd_nccl_xchg* x, void* dst, const void* src, size_t n, mlxd_status* st);
/* Close the listening socket and wipe the key. */
void mlxd_nccl_xchg_close(mlxd_nccl_xchg* x);

#endif
