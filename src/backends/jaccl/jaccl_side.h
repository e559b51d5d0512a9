/* Private to the jaccl backend: the side channel (MLX's coordinator), a TCP
 * star around rank 0 that carries the all-gathers of the set-up (the verbs
 * transport's queue pair addresses, the TCP mesh's address records), then
 * closes. See docs/jaccl.md, "The side channel".
 *
 * Rank 0 listens on the coordinator's address (MLX_JACCL_COORDINATOR or
 * JACCL_COORDINATOR; under mlxdist-launch the port the launcher held until
 * this rank started); every other rank connects to it. Each connection
 * completes the networking layer's handshake (net/handshake.h) with the job
 * token (MLXDIST_JOB_TOKEN, else one derived from the device matrix and the
 * coordinator's address, which every rank of the job shares) and, with
 * MLXDIST_SECRET_FILE, the proof of the secret: a stranger, another job or a
 * rank that is already connected is refused with one line on stderr
 * ("[jaccl] rank 0: refused a connection from A: why") and never fills a
 * slot. Set-up is bounded by MLXDIST_CONNECT_TIMEOUT; a rank that did not
 * connect is named.
 *
 * The all-gather, round k (integers big-endian; 24-byte headers):
 *   rank r -> rank 0   "MXJU" version (u16) 0 (u16) k (u32) r (u32) n (u64), n bytes
 *   rank 0 -> rank r   "MXJD" version (u16) 0 (u16) k (u32) size (u32) n (u64), size*n bytes
 * Everything read is checked before it is used (magic, version, round, the
 * rank the connection proved, the size, n against this rank's own n): a
 * malformed frame fails the set-up naming the rank that sent it, and no
 * length from the wire sizes anything. Each round is bounded by
 * MLXDIST_CONNECT_TIMEOUT; a rank that closes its connection (it failed or
 * exited) is named at once. */
#ifndef MLXD_JACCL_SIDE_H
#define MLXD_JACCL_SIDE_H

#include <stddef.h>
#include <stdint.h>

#include "backends/jaccl/jaccl_config.h"
#include "net/net.h"
#include "util/status.h"

#define MLXD_JACCL_SIDE_HDR 24
#define MLXD_JACCL_SIDE_MAX_BYTES ((size_t)1 << 30) /* size * n of one round */

typedef struct mlxd_jaccl_side {
  int rank, size;
  int* fds;       /* rank 0: fds[r], r in 1..size-1 (fds[0] = -1); others: fds[0] */
  uint32_t round; /* all-gathers done */
  double budget;  /* MLXDIST_CONNECT_TIMEOUT, per round */
  char coord[80]; /* the coordinator's address, for messages */
} mlxd_jaccl_side;

/* The job's identity for the side channel: a's token from MLXDIST_JOB_TOKEN,
 * else derived from cfg's matrix and coordinator; its key from
 * MLXDIST_SECRET_FILE. An error names the bad variable or file. */
int mlxd_jaccl_side_auth(const mlxd_jaccl_config* cfg, mlxd_net_auth* a, mlxd_status* st);
/* Open the star (collective; blocks at most MLXDIST_CONNECT_TIMEOUT). cfg
 * needs have_coord. A group of one opens nothing. On error nothing is left
 * open and st names the problem (MLXD_LAYER_BOOTSTRAP). */
int mlxd_jaccl_side_open(const mlxd_jaccl_config* cfg, const mlxd_net_auth* auth,
                         mlxd_jaccl_side* sc, mlxd_status* st);
/* An all-gather through the star (transport/verbs.h's mlxd_verbs_allgather_fn;
 * ctx is the mlxd_jaccl_side): every rank passes n bytes (the same n) and
 * gets rank r's at dst + r * n. Collective; bounded per round. After a
 * failure the channel is closed: every later call fails at once. */
int mlxd_jaccl_side_allgather(void* ctx, const void* src, void* dst, size_t n, mlxd_status* st);
/* Close every connection (idempotent). */
void mlxd_jaccl_side_close(mlxd_jaccl_side* sc);

#endif
