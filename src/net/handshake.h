/* The networking layer's connection handshake's wire format and the
 * job token, as PURE functions (no I/O, no globals; fuzzed by fuzz_handshake).
 * The mesh (mesh_connect.c, mesh_accept.c) drives them over the sockets.
 * docs/ring.md and docs/security.md.
 *
 * Three messages per connection (integers big-endian):
 *
 *   hello   connector -> acceptor, HELLO_BYTES
 *     0 magic "MLXH"  4 version (u16)  6 flags (u16: bit 0 = a secret is in use)
 *     8 rank   12 size   16 conn   20 nconn          (u32 each; the connector's rank)
 *    24 job token (16 bytes)   40 connector's nonce (32 bytes)
 *   reply   acceptor -> connector, REPLY_BYTES
 *     0 magic "MLXA"  then the same fields as the hello for the acceptor (its rank,
 *       the connection index echoed), its own fresh nonce at 40, and at 72 a MAC
 *       (32 bytes: HMAC-SHA256 with the secret's handshake key over the transcript,
 *       direction "accept"; zeros without a secret)
 *   confirm connector -> acceptor, CONFIRM_BYTES
 *     0 magic "MLXF"  4 version  6 zero (u16)  8 MAC (direction "connect"; zeros
 *       without a secret)
 *
 *   refusal acceptor -> connector, in place of the reply, REFUSAL_HEAD + length bytes
 *     0 magic "MLXR"  then the reply's fields (its rank, the connection echoed, its nonce
 *       at 40), at 72 a MAC (direction "refusal", over the transcript and bytes 104..:
 *       zeros without a secret), at 104 the reason (u16: MLXD_HS_REFUSE_*), at 106 the
 *       body's length (u16, at most MLXD_HS_REFUSAL_BODY_MAX), at 108 the body: for
 *       MLXD_HS_REFUSE_FAILED the acceptor's failure as a TCP abort record
 *       (transport/tcp_wire.h, checked by the connector with mlxd_tcp_abort_decode),
 *       for MLXD_HS_REFUSE_CLOSING nothing.
 *     A lazy rank whose transport failed, or that is being destroyed, sends it to a
 *     hello that passed every check, then closes: the connector fails at once with
 *     the acceptor's reason instead of waiting out MLXDIST_CONNECT_TIMEOUT. The hello,
 *     reply and confirm are unchanged (version 2): an acceptor that never refuses is
 *     unaffected, and a connector of before refusals reads one as a wrong magic (it
 *     fails at once too, naming the listener as not the rank it expected).
 *
 * The transcript both MACs cover: a direction label, the token, size, nconn, the
 * connection index, both ranks and both nonces. So a MAC proves knowledge of
 * the key for this very connection: it cannot be replayed (the other side's
 * nonce is fresh), moved to another rank, connection or job, or reflected (the
 * two directions use different labels). */
#ifndef MLXD_NET_HANDSHAKE_H
#define MLXD_NET_HANDSHAKE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "net/net.h"

#define MLXD_HS_VERSION 2u
#define MLXD_HS_TOKEN_BYTES 16 /* MLXD_NET_TOKEN_BYTES (net.h) */
#define MLXD_HS_NONCE_BYTES 32
#define MLXD_HS_MAC_BYTES 32
#define MLXD_HS_HELLO_BYTES 72
#define MLXD_HS_REPLY_BYTES 104
#define MLXD_HS_CONFIRM_BYTES 40
#define MLXD_HS_FLAG_SECRET 1u
#define MLXD_HS_REFUSAL_HEAD 108
#define MLXD_HS_REFUSAL_BODY_MAX 640 /* >= an abort record's largest (tcp_wire.h) */
#define MLXD_HS_REFUSAL_MAX (MLXD_HS_REFUSAL_HEAD + MLXD_HS_REFUSAL_BODY_MAX)

/* Why a refusal is sent. */
enum { MLXD_HS_REFUSE_FAILED = 1, MLXD_HS_REFUSE_CLOSING = 2 };

/* A hello or a reply, decoded. */
typedef struct mlxd_hs_msg {
  uint32_t rank, size, conn, nconn;
  unsigned flags;
  unsigned char token[MLXD_HS_TOKEN_BYTES];
  unsigned char nonce[MLXD_HS_NONCE_BYTES];
  unsigned char mac[MLXD_HS_MAC_BYTES]; /* reply only */
} mlxd_hs_msg;

/* What this rank expects of every message: its group and job. */
typedef struct mlxd_hs_expect {
  int self; /* this rank */
  int size, nconn;
  const unsigned char* token; /* MLXD_HS_TOKEN_BYTES */
  bool secret;                /* this rank uses a secret */
  bool any_rank;              /* lazy connections: a lower rank may connect too */
} mlxd_hs_expect;

/* Why a message was refused (mlxd_hs_reason names it for the log). */
typedef enum mlxd_hs_err {
  MLXD_HS_OK = 0,
  MLXD_HS_SHORT,      /* fewer bytes than the message has */
  MLXD_HS_MAGIC,      /* not a handshake of this kind */
  MLXD_HS_VERSION_E,  /* another protocol version */
  MLXD_HS_FLAGS,      /* unknown flag bits */
  MLXD_HS_TOKEN,      /* another job */
  MLXD_HS_SIZE,       /* another group size or connection count */
  MLXD_HS_RANK,       /* a rank that does not connect to this one */
  MLXD_HS_CONN,       /* a connection index out of range or not the one asked */
  MLXD_HS_NO_SECRET,  /* the peer uses no secret, this rank does */
  MLXD_HS_SECRET,     /* the peer uses a secret, this rank does not */
  MLXD_HS_MAC_E,      /* the proof does not match this rank's secret */
  MLXD_HS_RESERVED_E, /* non-zero reserved bytes */
  MLXD_HS_REFUSAL_E,  /* a refusal whose reason or body length is not one this version sends */
} mlxd_hs_err;

const char* mlxd_hs_reason(mlxd_hs_err e);

void mlxd_hs_encode_hello(unsigned char out[MLXD_HS_HELLO_BYTES], const mlxd_hs_msg* m);
void mlxd_hs_encode_reply(unsigned char out[MLXD_HS_REPLY_BYTES], const mlxd_hs_msg* m);
void mlxd_hs_encode_confirm(unsigned char out[MLXD_HS_CONFIRM_BYTES],
                            const unsigned char mac[MLXD_HS_MAC_BYTES]);

/* A hello received by the acceptor e->self: decoded into out and checked
 * (magic, version, flags, size, nconn, token, a higher rank (any other rank with
 * e->any_rank), conn < nconn, the
 * same use of a secret). len is the number of bytes received. */
mlxd_hs_err mlxd_hs_check_hello(const unsigned char* buf, size_t len, const mlxd_hs_expect* e,
                                mlxd_hs_msg* out);
/* A reply received by the connector e->self from rank peer for connection conn. */
mlxd_hs_err mlxd_hs_check_reply(const unsigned char* buf, size_t len, const mlxd_hs_expect* e,
                                int peer, int conn, mlxd_hs_msg* out);
/* A refusal (m: the reply's fields, its MAC unchecked; kind MLXD_HS_REFUSE_*; body:
 * len bytes). out must hold MLXD_HS_REFUSAL_HEAD + len bytes; returns the length. */
size_t mlxd_hs_encode_refusal(unsigned char* out, const mlxd_hs_msg* m, unsigned kind,
                              const unsigned char* body, size_t len);
/* A refusal received by the connector e->self from rank peer for connection conn:
 * the reply's checks, then a known reason, a body length within
 * MLXD_HS_REFUSAL_BODY_MAX (none for MLXD_HS_REFUSE_CLOSING, some for _FAILED).
 * MLXD_HS_SHORT until all of it (the head tells how much) is in len; *need
 * (may be NULL) is then the whole length once the head is in. On MLXD_HS_OK,
 * *kind, *body and *body_len (into buf) are set; the MAC (out->mac) is the
 * caller's to check (mlxd_hs_mac_refusal). */
mlxd_hs_err mlxd_hs_check_refusal(const unsigned char* buf, size_t len, const mlxd_hs_expect* e,
                                  int peer, int conn, mlxd_hs_msg* out, size_t* need,
                                  unsigned* kind, const unsigned char** body, size_t* body_len);
/* Whether buf (len >= 4) starts like a refusal. */
bool mlxd_hs_is_refusal(const unsigned char* buf, size_t len);
/* A confirm: the MAC must equal expect (constant-time compare). */
mlxd_hs_err mlxd_hs_check_confirm(const unsigned char* buf, size_t len,
                                  const unsigned char expect[MLXD_HS_MAC_BYTES]);

/* The MAC over the transcript of one connection; dir_connect: the connector's
 * proof, else the acceptor's. Zeros when key is NULL. 0, or -1 (libcrypto failed). */
int mlxd_hs_mac(const unsigned char* key, bool dir_connect, const unsigned char* token, int size,
                int nconn, int conn, int rank_connector, int rank_acceptor,
                const unsigned char* nonce_connector, const unsigned char* nonce_acceptor,
                unsigned char out[MLXD_HS_MAC_BYTES]);
/* A refusal's MAC: the transcript (direction "refusal") and the refusal's bytes from
 * its reason on (rest: reason, length and body, 4 + body length bytes). Zeros when
 * key is NULL. 0, or -1. */
int mlxd_hs_mac_refusal(const unsigned char* key, const unsigned char* token, int size, int nconn,
                        int conn, int rank_connector, int rank_acceptor,
                        const unsigned char* nonce_connector, const unsigned char* nonce_acceptor,
                        const unsigned char* rest, size_t rest_len,
                        unsigned char out[MLXD_HS_MAC_BYTES]);
/* Constant-time comparison of two MACs. */
bool mlxd_hs_mac_equal(const unsigned char* a, const unsigned char* b);

/* ---- the job token ---- */

/* MLXDIST_JOB_TOKEN's form: exactly 2 * MLXD_HS_TOKEN_BYTES hex digits. 0 or -1. */
int mlxd_hs_token_parse(const char* hex, unsigned char out[MLXD_HS_TOKEN_BYTES]);
/* Format a token as hex (buf: at least 2 * MLXD_HS_TOKEN_BYTES + 1). */
void mlxd_hs_token_hex(const unsigned char token[MLXD_HS_TOKEN_BYTES], char* buf);
/* A hostfile job's token: SHA-256 of the group's resolved address list (every
 * rank with the same hostfile gets the same one). Cross-job protection only. */
void mlxd_hs_token_hosts(const struct mlxd_net_hosts* h, unsigned char out[MLXD_HS_TOKEN_BYTES]);
/* A caller-bootstrap job's token: SHA-256 of every rank's address records
 * (each carries a fresh random nonce), identical after the all-gather. */
void mlxd_hs_token_records(const unsigned char* recs, size_t len,
                           unsigned char out[MLXD_HS_TOKEN_BYTES]);
/* A split child's token: from the parent's, the split's sequence number and the color. */
void mlxd_hs_token_split(const unsigned char parent[MLXD_HS_TOKEN_BYTES], uint64_t seq, int color,
                         unsigned char out[MLXD_HS_TOKEN_BYTES]);

#endif
