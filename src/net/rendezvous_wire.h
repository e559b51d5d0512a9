/* Private: the rendezvous protocol between a rank and mlxdist-launch (the
 * launcher acting as the job's all-gather), as PURE functions: encoding,
 * decoding and checking every message, no I/O (fuzzed by fuzz_rendezvous).
 * Used by both ends: src/net/rendezvous.c (the rank) and
 * tools/launch/rendezvous.c (the launcher). docs/ring.md describes it.
 *
 * Version 1, one TCP connection per rank, integers big-endian:
 *
 *   launcher -> rank, on accept: the CHALLENGE (24 bytes)
 *     0 magic "MXRC"  4 version (u16)  6 zero (u16)  8 server nonce (16 random bytes)
 *   rank -> launcher: the HELLO (68 bytes), then its records (rec_bytes)
 *     0 magic "MXRH"  4 version (u16)  6 zero (u16)  8 rank (u32)  12 size (u32)
 *    16 rec_bytes (u32: a multiple of 64, at most 64 * 64)  20 client nonce (16)
 *    36 MAC = HMAC-SHA256(token, "mlxdist rendezvous hello v1" | server nonce |
 *             bytes 0..35 | records)
 *   launcher -> rank, once every rank arrived or the launcher gave up: the
 *   REPLY (44 bytes), then len bytes of payload
 *     0 magic "MXRR"  4 version (u16)  6 status (u16: 0 ok, 1 failed, 2 refused)
 *     8 len (u32: ok: size * rec_bytes, every rank's records in rank order;
 *                 failed/refused: a reason, printable text of at most 512 bytes)
 *    12 MAC = HMAC-SHA256(token, "mlxdist rendezvous reply v1" | server nonce |
 *             client nonce | bytes 0..11 | payload)
 *
 * The token is MLXDIST_JOB_TOKEN's 16 bytes, known only to the launcher and
 * the job's ranks: the hello proves the rank holds it (bound to this
 * connection by the server's nonce: no replay), the reply proves the launcher
 * does (bound to the rank's nonce). "refused" answers a hello that did not
 * authenticate: its MAC is the launcher's, which the rank cannot check with a
 * wrong token, so the rank reports the refusal as a token mismatch. */
#ifndef MLXD_RENDEZVOUS_WIRE_H
#define MLXD_RENDEZVOUS_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MLXD_RDV_VERSION 1u
#define MLXD_RDV_KEY_BYTES 16 /* the job token */
#define MLXD_RDV_NONCE_BYTES 16
#define MLXD_RDV_MAC_BYTES 32
#define MLXD_RDV_CHALLENGE_BYTES 24
#define MLXD_RDV_HELLO_BYTES 68
#define MLXD_RDV_REPLY_BYTES 44
#define MLXD_RDV_REC_UNIT 64                            /* MLXD_NET_REC_BYTES */
#define MLXD_RDV_MAX_REC_BYTES (64 * MLXD_RDV_REC_UNIT) /* one rank: 64 connections */
#define MLXD_RDV_MAX_RANKS 65536
#define MLXD_RDV_MAX_TOTAL (64u << 20) /* size * rec_bytes */
#define MLXD_RDV_MAX_REASON 512

enum { MLXD_RDV_OK = 0, MLXD_RDV_FAILED = 1, MLXD_RDV_REFUSED = 2 };

typedef struct mlxd_rdv_hello {
  uint32_t rank, size, rec_bytes;
  unsigned char nonce[MLXD_RDV_NONCE_BYTES];
  unsigned char mac[MLXD_RDV_MAC_BYTES];
} mlxd_rdv_hello;

typedef struct mlxd_rdv_reply {
  unsigned status;
  uint32_t len;
  unsigned char mac[MLXD_RDV_MAC_BYTES];
} mlxd_rdv_reply;

void mlxd_rdv_challenge_encode(unsigned char out[MLXD_RDV_CHALLENGE_BYTES],
                               const unsigned char nonce[MLXD_RDV_NONCE_BYTES]);
/* 0, or -1 with why ("bad magic: not an mlxdist launcher's rendezvous"). */
int mlxd_rdv_challenge_decode(const unsigned char in[MLXD_RDV_CHALLENGE_BYTES],
                              unsigned char nonce[MLXD_RDV_NONCE_BYTES], char* why, size_t why_len);

/* The hello of rank (of size) with rec_bytes of records recs, MAC'd with key
 * over the server's nonce snonce. 0, or -1 (libcrypto failed). */
int mlxd_rdv_hello_encode(unsigned char out[MLXD_RDV_HELLO_BYTES],
                          const unsigned char key[MLXD_RDV_KEY_BYTES],
                          const unsigned char snonce[MLXD_RDV_NONCE_BYTES], int rank, int size,
                          const unsigned char cnonce[MLXD_RDV_NONCE_BYTES], const void* recs,
                          size_t rec_bytes);
/* Check a hello's header for a job of n ranks (magic, version, zero, rank < n,
 * size == n, rec_bytes a non-zero multiple of 64 of at most the max, n *
 * rec_bytes within the max); the MAC is checked by mlxd_rdv_hello_verify once
 * the records are in. 0, or -1 with why. */
int mlxd_rdv_hello_decode(const unsigned char in[MLXD_RDV_HELLO_BYTES], int n, mlxd_rdv_hello* h,
                          char* why, size_t why_len);
/* Whether the hello (raw header in, decoded h) with its records is MAC'd with key. */
bool mlxd_rdv_hello_verify(const unsigned char in[MLXD_RDV_HELLO_BYTES], const mlxd_rdv_hello* h,
                           const unsigned char key[MLXD_RDV_KEY_BYTES],
                           const unsigned char snonce[MLXD_RDV_NONCE_BYTES], const void* recs);

/* A reply of status with len bytes of payload. 0, or -1 (libcrypto failed). */
int mlxd_rdv_reply_encode(unsigned char out[MLXD_RDV_REPLY_BYTES],
                          const unsigned char key[MLXD_RDV_KEY_BYTES],
                          const unsigned char snonce[MLXD_RDV_NONCE_BYTES],
                          const unsigned char cnonce[MLXD_RDV_NONCE_BYTES], unsigned status,
                          const void* payload, uint32_t len);
/* Check a reply's header: magic, version, a known status, and len: exactly
 * expect_len for ok, at most MLXD_RDV_MAX_REASON otherwise. 0, or -1 with why. */
int mlxd_rdv_reply_decode(const unsigned char in[MLXD_RDV_REPLY_BYTES], uint32_t expect_len,
                          mlxd_rdv_reply* r, char* why, size_t why_len);
bool mlxd_rdv_reply_verify(const unsigned char in[MLXD_RDV_REPLY_BYTES], const mlxd_rdv_reply* r,
                           const unsigned char key[MLXD_RDV_KEY_BYTES],
                           const unsigned char snonce[MLXD_RDV_NONCE_BYTES],
                           const unsigned char cnonce[MLXD_RDV_NONCE_BYTES], const void* payload);
/* A reason as received (len bytes, any content) as printable text in out:
 * control and non-ASCII bytes become '?'. Returns out. */
char* mlxd_rdv_reason_text(const void* reason, size_t len, char* out, size_t out_len);

/* "A-B" (decimal, 1 <= A <= B <= 65535, nothing else): 0, or -1 with why. */
int mlxd_rdv_parse_port_range(const char* s, unsigned* lo, unsigned* hi, char* why, size_t why_len);

#endif
