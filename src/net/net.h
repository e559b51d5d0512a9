/* The networking layer's public header (src/net/): what the backends (ring,
 * jaccl, nccl) and mlxdist-launch use to find, authenticate and connect the
 * ranks of a job. Files of src/net (docs/design.md):
 *   hostfile.c, endpoint.c  hostfiles and addresses
 *   auth.c, handshake.c     job identity (token, secret) and the handshake
 *   listen.c, log.c         listening sockets; MLX_RING_VERBOSE's lines
 *   mesh*.c, dialer.c       the full mesh and the lazy dialer
 *   fdlimit.c               RLIMIT_NOFILE for a group's connections
 *   hostfile_boot.c, bootstrap.c, rendezvous.c, pmix_boot.c, pmix.c
 *                           bootstrap by a hostfile, a caller's all-gather, the
 *                           launcher's rendezvous, PMIx
 *   split.c                 the split exchange of ring and jaccl groups
 * The wire formats (handshake.h, rendezvous_wire.h) come with it, for the
 * backends and tools that speak them (nccl's exchange, the launcher).
 * See docs/ring.md, docs/bootstrap.md and docs/security.md.
 *
 * Errors here are structured (util/status.h): set-up failures use
 * MLXD_LAYER_BOOTSTRAP with the peer, its address and the failing system
 * call where known; nothing here writes "[ring]" into a message. The
 * backend renders every status once, when it returns to the front-end. */
#ifndef MLXD_NET_H
#define MLXD_NET_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "distributed/backend.h"
#include "transport/transport.h"
#include "util/status.h"

/* One peer address: what a rank listens on for one of its connections. */
typedef struct mlxd_net_addr {
  struct sockaddr_storage sa;
  socklen_t len;
  char text[80]; /* "ip:port" as written / as formatted, for messages */
} mlxd_net_addr;

/* The whole group's addresses: addrs[r * nconn + c] is rank r's address for connection c. */
typedef struct mlxd_net_hosts {
  int size;
  int nconn;
  mlxd_net_addr* addrs;
} mlxd_net_hosts;

void mlxd_net_hosts_free(mlxd_net_hosts* h);

/* hostfile.c: MLX_HOSTFILE, MLX's JSON (a list with one list of "ip:port"
 * strings per rank). The rules (docs/ring.md): only the bytes JSON allows
 * (util/json_bytes.h); exactly one JSON document and
 * nothing but whitespace after it; limits checked before the work they bound;
 * only a regular file is read, and never more than its limit; every address
 * once. Every error names the file, what is wrong, where (rank, connection)
 * and what was expected. */
#define MLXD_NET_HOSTFILE_MAX_BYTES (16 << 20)
#define MLXD_NET_HOSTFILE_MAX_RANKS 65536
#define MLXD_NET_HOSTFILE_MAX_CONNECTIONS 64
#define MLXD_NET_HOSTFILE_MAX_ADDRS (1 << 18) /* ranks x connections */
#define MLXD_NET_ADDR_MAX_CHARS 79            /* one "ip:port" string (mlxd_net_addr.text) */
/* Read, parse and resolve path. */
int mlxd_net_hostfile_load(const char* path, mlxd_net_hosts* out, mlxd_status* st);
/* Read path, a regular file of at most MLXD_NET_HOSTFILE_MAX_BYTES, without
 * blocking (a FIFO or device is refused by its kind, not opened for reading);
 * *text is NUL-terminated, free() it. */
int mlxd_net_hostfile_read(const char* path, char** text, size_t* len, mlxd_status* st);
/* Parse len bytes of text (no NUL needed) named name in messages. Pure: no
 * files, no name lookups; an address with a host name (not an IP literal)
 * is left unresolved (sa.ss_family == AF_UNSPEC, text kept). */
int mlxd_net_hostfile_parse(const char* text, size_t len, const char* name, mlxd_net_hosts* out,
                            mlxd_status* st);
/* The same answer by the general path alone (cJSON, every fault named), which
 * mlxd_net_hostfile_parse takes for any file that is not plain (strings
 * without escapes: what mlxdist-launch writes). For the differential check of
 * fuzz_hostfile: both must agree on every input. */
int mlxd_net_hostfile_parse_json(const char* text, size_t len, const char* name,
                                 mlxd_net_hosts* out, mlxd_status* st);
/* Resolve the host names parse left, then check again that no two addresses are the same. */
int mlxd_net_hostfile_resolve(const char* name, mlxd_net_hosts* h, mlxd_status* st);
/* Parse "ip:port" (also "[v6]:port", "host:port"); port 0 allowed only if allow_port0. */
int mlxd_net_parse_addr(const char* s, bool allow_port0, mlxd_net_addr* out, char* why,
                        size_t why_len);
void mlxd_net_format_addr(const struct sockaddr* sa, char* buf, size_t n);

/* What every connection of a group proves (handshake.h, docs/security.md):
 * the job token, and with MLXDIST_SECRET_FILE the key derived from the secret. */
#define MLXD_NET_TOKEN_BYTES 16
typedef struct mlxd_net_auth {
  unsigned char token[MLXD_NET_TOKEN_BYTES];
  bool have_key;
  unsigned char key[32]; /* mlxd_secret_derive(secret, "handshake") */
} mlxd_net_auth;

/* log.c: MLX_RING_VERBOSE's lines ("[ring] ..." on stderr). */
bool mlxd_net_verbose(void);
void mlxd_net_log(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
/* Load MLXDIST_SECRET_FILE (if set) into a's key; the token is zeroed. */
int mlxd_net_auth_load(mlxd_net_auth* a, mlxd_status* st);
/* MLXDIST_JOB_TOKEN into a->token: *found false when unset; an error naming the
 * variable when it is not 32 hex digits. */
int mlxd_net_auth_env_token(mlxd_net_auth* a, bool* found, mlxd_status* st);
/* Wipe the key. */
void mlxd_net_auth_clear(mlxd_net_auth* a);
/* Listen on addr (port 0: an ephemeral port; addr is updated with the port chosen). */
int mlxd_net_listen(mlxd_net_addr* addr, int* fd_out, mlxd_status* st);
/* Build the full mesh: rank connects to every lower rank (connection c goes to
 * peer's address c) and accepts every higher rank on listen_fds (nconn of them);
 * every connection completes the handshake of handshake.h with auth. Foreign,
 * silent or malformed connections are refused with one line on stderr and
 * never fill a slot. fds (size * nconn entries) receives the connected
 * sockets, -1 for self. Bounded by MLXDIST_CONNECT_TIMEOUT. Closes nothing of
 * listen_fds. */
int mlxd_net_mesh(int rank, const mlxd_net_hosts* hosts, const int* listen_fds,
                  const mlxd_net_auth* auth, int* fds, mlxd_status* st);
/* The same with choices (NULL: the ring's defaults), for the other users of
 * the mesh (jaccl: its coordinator star, and a TCP mesh beside RDMA links). */
typedef struct mlxd_net_mesh_opts {
  const char* tag;  /* the refused-connection lines' "[tag]" ("ring" when NULL) */
  const bool* link; /* link[j]: this rank and rank j are connected (size entries; NULL: all).
                     * Must agree on both ends (rank j's link[rank] == link[j]): a rank
                     * that has no link to this one is refused like a stranger */
  const char* what; /* what the ranks share, for the messages ("hostfile" when NULL) */
} mlxd_net_mesh_opts;
int mlxd_net_mesh_with(int rank, const mlxd_net_hosts* hosts, const int* listen_fds,
                       const mlxd_net_auth* auth, const mlxd_net_mesh_opts* opts, int* fds,
                       mlxd_status* st);

/* Lazy connections (MLXDIST_CONNECT=lazy, the default; not with MLXDIST_TLS=1):
 * whether this group connects on first use. */
bool mlxd_net_connect_lazy(void);
/* RLIMIT_NOFILE for a group of size ranks x nconn connections: the soft limit
 * is raised (up to the hard one) to what a full mesh needs; when it cannot be,
 * an eager group fails naming the limit, a lazy one goes on (socket() and
 * accept() name the limit if it runs out). */
int mlxd_net_nofile(int size, int nconn, bool lazy, mlxd_status* st);
/* The lazy TCP transport's dialer (transport/tcp.h) over the address book hosts
 * (copied) for rank, listening on lfds (nconn of them: taken over and set to -1
 * on success; closed by the dialer's free). Connections prove auth as the mesh's
 * do, any rank may connect to any other, and simultaneous connects keep the
 * higher rank's connection (mesh.h). NULL with st set.
 * mlxd_net_dialer_take: the same, but hosts is taken over, not copied (on
 * success it is left empty, as by mlxd_net_hosts_free; on failure it stays
 * the caller's): a copy writes every rank's entry. */
struct mlxd_tcp_dialer;
struct mlxd_tcp_dialer* mlxd_net_dialer_new(int rank, const mlxd_net_hosts* hosts, int* lfds,
                                            const mlxd_net_auth* auth, mlxd_status* st);
struct mlxd_tcp_dialer* mlxd_net_dialer_take(int rank, mlxd_net_hosts* hosts, int* lfds,
                                             const mlxd_net_auth* auth, mlxd_status* st);
/* listen.c: listen on nconn ephemeral ports on host (port ignored); fills
 * recs' addresses. */
int mlxd_net_listen_many(const mlxd_net_addr* host, int nconn, int* lfds, mlxd_net_addr* addrs,
                         mlxd_status* st);
void mlxd_net_close_all(int* fds, int n);

/* mesh.c: the group's TCP transport over hosts: lazy (a dialer) or eager (the
 * mesh), as MLXDIST_CONNECT says; hosts and lfds as for the dialer (left to the
 * caller when eager; hosts may be emptied even when this fails). */
int mlxd_net_tcp_open(int rank, mlxd_net_hosts* hosts, int* lfds, const mlxd_net_auth* auth,
                      mlxd_transport** out, mlxd_status* st);

/* bootstrap.c: the 64-byte address record exchanged through an all-gather. */
#define MLXD_NET_REC_BYTES 64
#define MLXD_NET_REC_NONCE_BYTES 16
/* nonce: MLXD_NET_REC_NONCE_BYTES random bytes of this rank (NULL: zeros). */
void mlxd_net_rec_encode(unsigned char* rec, int rank, int size, int conn, int nconn,
                         const mlxd_net_addr* a, const unsigned char* nonce);
/* Validate rank r's record c and decode it into out; on error st names rank r. */
int mlxd_net_rec_decode(const unsigned char* rec, int r, int size, int conn, int nconn,
                        const char* via, mlxd_net_addr* out, mlxd_status* st);
/* The address to listen on when bootstrapped (MLXDIST_RING_ADDR or a default). */
int mlxd_net_default_addr(mlxd_net_addr* out, mlxd_status* st);
/* What a backend gives a bootstrap: check (NULL: none) runs before this rank
 * listens or waits on anyone (the backend's own settings: a bad one fails
 * before the others wait); make turns the connected group into the backend:
 * self is the address this rank listens on, auth the group's identity (make
 * copies it), t the TCP transport (taken over, destroyed on failure; NULL
 * when size == 1). */
typedef struct mlxd_net_maker {
  int (*check)(mlxd_status* st);
  int (*make)(int rank, int size, int nconn, const mlxd_net_addr* self, const mlxd_net_auth* auth,
              mlxd_transport* t, mlxd_backend** out, mlxd_status* st);
  /* The hostfile bootstrap only (NULL: none): once this rank listens, before
   * it connects, the backend may make the group without TCP (*made true,
   * *out or st set); *made false: the bootstrap connects. */
  int (*local)(int rank, int size, int nconn, const mlxd_net_addr* self, const mlxd_net_auth* auth,
               bool* made, mlxd_backend** out, mlxd_status* st);
} mlxd_net_maker;
/* Bootstrap with a caller's all-gather (rank and size from MLX_RANK,
 * MLX_WORLD_SIZE): every rank listens, all-gathers its records, connects
 * (mlxd_net_tcp_open) and hands the group to maker. */
int mlxd_net_bootstrap(mlxd_bootstrap* bs, const mlxd_net_maker* maker, mlxd_backend** out,
                       mlxd_status* st);
/* hostfile_boot.c: bootstrap from MLX_RANK and MLX_HOSTFILE (the job token:
 * MLXDIST_JOB_TOKEN, else derived from the file). */
int mlxd_net_bootstrap_hostfile(const mlxd_net_maker* maker, mlxd_backend** out, mlxd_status* st);
/* The same with bs->rank and bs->size already set (0 <= rank < size <= 2^20) by
 * whoever provides the all-gather; via names it in MLX_RING_VERBOSE's lines;
 * listen_on: the address to listen on (port ignored), NULL: mlxd_net_default_addr. */
int mlxd_net_bootstrap_ranked(mlxd_bootstrap* bs, const char* via, const mlxd_net_addr* listen_on,
                              const mlxd_net_maker* maker, mlxd_backend** out, mlxd_status* st);

/* endpoint.c: where a bootstrapped rank listens. */
/* 0.0.0.0 or :: (never listened on by a bootstrapped rank). */
bool mlxd_net_addr_is_wildcard(const mlxd_net_addr* a);
/* MLXDIST_IFNAME: name's first IPv4 address, else its IPv6 one (port 0); an
 * unknown interface or one without an address is an error naming it (and the
 * interfaces that exist). */
int mlxd_net_ifname_addr(const char* name, mlxd_net_addr* out, mlxd_status* st);
/* MLXDIST_PORT_RANGE: *lo = *hi = 0 when unset; bad syntax is an error. */
int mlxd_net_port_range(unsigned* lo, unsigned* hi, mlxd_status* st);
/* Listen on addr's IP at the first free port of lo..hi (addr gets the port);
 * none free: an error naming the range. */
int mlxd_net_listen_in_range(mlxd_net_addr* addr, unsigned lo, unsigned hi, int* fd_out,
                             mlxd_status* st);

/* pmix_boot.c: started by a PMIx server (srun --mpi=pmix, mpirun) with no other
 * configuration (docs/pmix.md). */
/* Which configuration a ring started without a caller's all-gather uses. */
enum { MLXD_NET_CFG_HOSTFILE = 0, MLXD_NET_CFG_RENDEZVOUS, MLXD_NET_CFG_PMIX };
/* The precedence: MLXDIST_RENDEZVOUS (without MLX_HOSTFILE), then MLX_RANK or
 * MLX_HOSTFILE (MLX's launcher), then PMIx (unless MLXDIST_PMIX=off), else the
 * hostfile path, whose error names what is missing. Environment only. */
int mlxd_net_config_choice(void);
/* Whether init("any") may take PMIx as the ring's configuration
 * (MLXDIST_PMIX=on; with auto only init("ring") does). */
bool mlxd_net_pmix_for_any(void);
/* Bootstrap from PMIx (mlxd_net_config_choice() == MLXD_NET_CFG_PMIX). */
int mlxd_net_bootstrap_pmix(const mlxd_net_maker* maker, mlxd_backend** out, mlxd_status* st);
/* Without PMIx: Slurm's variables (SLURM_JOB_ID, SLURM_PROCID) alone give an
 * error saying what to add (srun --mpi=pmix); 0 when they are absent. */
int mlxd_net_slurm_without_pmix(mlxd_status* st);

/* rendezvous.c: started by mlxdist-launch across hosts (MLXDIST_RENDEZVOUS). */
/* MLXDIST_RENDEZVOUS is set and MLX_HOSTFILE is not. */
bool mlxd_net_rendezvous_configured(void);
/* Bootstrap as mlxd_net_bootstrap, the all-gather done by the launcher. */
int mlxd_net_bootstrap_rendezvous(const mlxd_net_maker* maker, mlxd_backend** out, mlxd_status* st);

/* split.c: the split exchange of a group's split() (ring, jaccl). */
typedef struct mlxd_net_member {
  int key, prank;             /* its key; its rank in the parent */
  const unsigned char* extra; /* its extra bytes (in the exchange's all) */
} mlxd_net_member;
typedef struct mlxd_net_split {
  int m, me;                /* the new group's size; this rank's place in it (-1: none) */
  mlxd_net_member* members; /* m of them, ordered by key, then parent rank */
  unsigned char* all;       /* every parent rank's record */
} mlxd_net_split;
/* Called for every parent rank p of this rank's color, in parent-rank order,
 * with this rank's extra bytes and p's: nonzero (st set) fails the exchange. */
typedef int (*mlxd_net_split_check)(void* ctx, const unsigned char* mine,
                                    const unsigned char* theirs, int p, mlxd_status* st);
/* All-gather color, key and extra (extra_len bytes, the backend's own) over t
 * (the parent: size ranks, this one rank) under seq, as one MLXD_SIG_SPLIT
 * message; out receives the members of color (check, when not NULL, may
 * refuse one). This rank missing from them is an error. Free out with
 * mlxd_net_split_free, also after a failure. */
int mlxd_net_split_exchange(mlxd_transport* t, uint64_t seq, int rank, int size, int color, int key,
                            const void* extra, size_t extra_len, mlxd_net_split_check check,
                            void* ctx, mlxd_net_split* out, mlxd_status* st);
void mlxd_net_split_free(mlxd_net_split* s);

/* The wire formats of the handshake and of the launcher's rendezvous. */
#include "net/handshake.h"       /* IWYU pragma: export */
#include "net/rendezvous_wire.h" /* IWYU pragma: export */

#endif
