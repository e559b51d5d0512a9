/* Private: the TCP transport's fragment header, and the checks every
 * header passes before the receiver acts on it (allocates, copies, matches).
 * Pure functions (no I/O, no allocation, no global state), so the fuzz
 * target tests/fuzz/fuzz_tcp_header.c drives them directly.
 *
 * A message of `total` bytes is sent as fragments; each fragment is a
 * 48-byte header (MLXD_TCP_HDR: tag, offset, length, total as little-endian
 * u64, then the sender's 16-byte call signature, mlxd_sig_encode) followed
 * by `length` payload bytes that belong at `offset` of the message. Every
 * fragment of a message carries the same signature; the receiver compares
 * the first one's with its own call (tcp.c, match.h: mlxd_sig_check).
 *
 * What a receiver accepts (anything else fails the transport with a
 * message naming the peer and the field):
 *  - the header alone: the signature's padding bytes are zero (any op
 *    and dtype pass: an unknown one is a mismatch, named as such),
 *    length <= total, offset + length <= total (no
 *    overflow), total <= MLXD_TCP_MSG_MAX, length <= MLXD_TCP_FRAG_MAX, and
 *    length > 0 exactly when total > 0 (a sender never sends an empty
 *    fragment of a non-empty message);
 *  - against a message of the same tag still arriving: the same total, and
 *    no more payload than total in all (duplicates are refused);
 *  - against the receive posted for the tag: total must equal its size.
 *    A different total fails that receive only (MLXD_EINVAL) and the
 *    payload is drained into nothing: it allocates no memory;
 *  - with no receive posted (an "unexpected" message): it is buffered only
 *    if the peer's unexpected messages, this one included, stay within the
 *    budget (MLXDIST_TCP_UNEXPECTED_MB per peer; each message is charged its
 *    total plus MLXD_TCP_UX_OVERHEAD). So a header claiming 2^60 bytes
 *    allocates nothing.
 *
 * Control frames (tag kind MLXD_TAG_CTRL, transport.h) carry no message:
 * they are never matched, buffered or charged to the budget. Their header
 * must have sequence number 0, offset 0, length == total, and a known
 * step: MLXD_TCP_CTRL_BEAT (a heartbeat; payload: the sender's note, at
 * most MLXD_TCP_BEAT_MAX bytes, possibly none) or MLXD_TCP_CTRL_ABORT (the
 * sender's transport failed; payload: a failure record of
 * MLXD_TCP_ABORT_MIN..MLXD_TCP_ABORT_MAX bytes, mlxd_tcp_abort_decode). */
#ifndef MLXD_TCP_WIRE_H
#define MLXD_TCP_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "transport/transport.h"

#define MLXD_TCP_HDR 48u                      /* 4 u64 + the signature (MLXD_SIG_BYTES) */
#define MLXD_TCP_FRAG_MAX ((uint64_t)1 << 20) /* largest fragment a sender makes */
#define MLXD_TCP_MSG_MAX ((uint64_t)1 << 48)  /* largest message (256 TiB) */
#define MLXD_TCP_UX_OVERHEAD 256u             /* bytes charged per unexpected message */

/* Control frames (steps of tag kind MLXD_TAG_CTRL). */
enum { MLXD_TCP_CTRL_BEAT = 1, MLXD_TCP_CTRL_ABORT = 2 };
#define MLXD_TCP_BEAT_MAX 63u    /* a heartbeat's note (liveness.h: MLXD_NOTE_MAX - 1) */
#define MLXD_TCP_DETAIL_MAX 511u /* an abort record's detail (status.h: MLXD_MSG_MAX - 1) */
#define MLXD_TCP_ADDR_MAX 63u    /* an abort record's peer address (MLXD_ADDR_MAX - 1) */
/* code, reporter, peer, errno, syscall, address length, detail length
 * (u32 LE each), then the address, then the detail */
#define MLXD_TCP_ABORT_MIN 28u
#define MLXD_TCP_ABORT_MAX (MLXD_TCP_ABORT_MIN + MLXD_TCP_ADDR_MAX + MLXD_TCP_DETAIL_MAX)

typedef struct mlxd_tcp_hdr {
  uint64_t tag, off, len, total;
  mlxd_sig sig; /* the sender's call (all zero: unchecked) */
} mlxd_tcp_hdr;

void mlxd_tcp_hdr_encode(unsigned char out[MLXD_TCP_HDR], const mlxd_tcp_hdr* h);

/* Decode and check a header on its own. 0, or -1 with why set to the bad
 * field ("length 2097152 is above the 1048576-byte fragment limit"). */
int mlxd_tcp_hdr_decode(const unsigned char in[MLXD_TCP_HDR], mlxd_tcp_hdr* out, char* why,
                        size_t why_n);

/* What the receiver knows about the header's tag when it arrives. */
typedef struct mlxd_tcp_rx_state {
  bool arriving;       /* a message with this tag is still arriving */
  uint64_t arr_total;  /* its total */
  uint64_t arr_got;    /* payload bytes already received or announced */
  bool posted;         /* (not arriving) a receive is posted for the tag */
  uint64_t posted_n;   /* its size */
  uint64_t ux_charged; /* bytes of unexpected messages buffered from the peer */
  uint64_t ux_budget;  /* the most that may be */
} mlxd_tcp_rx_state;

typedef enum mlxd_tcp_admit {
  MLXD_TCP_REJECT,   /* protocol violation: why says which field */
  MLXD_TCP_CONTINUE, /* another fragment of the arriving message */
  MLXD_TCP_DIRECT,   /* first fragment of the posted receive's message */
  MLXD_TCP_MISMATCH, /* the posted receive expects another size: drain, fail it */
  MLXD_TCP_BUFFER,   /* unexpected: buffer total bytes (charge total + overhead) */
  MLXD_TCP_CONTROL,  /* a control frame within its bounds: read its payload, no message */
} mlxd_tcp_admit;

/* Decide what to do with a decoded header h given s. */
mlxd_tcp_admit mlxd_tcp_hdr_admit(const mlxd_tcp_hdr* h, const mlxd_tcp_rx_state* s, char* why,
                                  size_t why_n);

/* An abort record: the sender's failure. */
typedef struct mlxd_tcp_abort_rec {
  uint32_t code;                        /* an mlxd_code, MLXD_EINVAL..MLXD_ECALLBACK */
  int32_t reporter;                     /* the rank that found it (the sender, or one it relays) */
  int32_t peer;                         /* the rank the failure is about, or -1 */
  int32_t sys_errno;                    /* 0..4095 */
  const char* syscall;                  /* one of a fixed list of names (static), or NULL */
  char addr[MLXD_TCP_ADDR_MAX + 1];     /* the peer's address; printable, NUL-terminated */
  char detail[MLXD_TCP_DETAIL_MAX + 1]; /* printable ASCII, NUL-terminated */
} mlxd_tcp_abort_rec;

/* Encode r into out (at least MLXD_TCP_ABORT_MAX bytes; the texts are cut
 * to their bounds; a syscall not in the list travels as none); returns the
 * length. */
size_t mlxd_tcp_abort_encode(unsigned char* out, const mlxd_tcp_abort_rec* r);

/* Decode and check an abort record of len bytes from a rank of a group of
 * `size`: a known code, the reporter a rank, peer -1 or a rank, errno
 * and syscall in range, the lengths within bounds and adding up to len.
 * Text bytes outside printable ASCII become '?'. 0, or -1 with why set. */
int mlxd_tcp_abort_decode(const unsigned char* in, size_t len, int size, mlxd_tcp_abort_rec* r,
                          char* why, size_t why_n);

#endif
