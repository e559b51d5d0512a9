/* The TCP transport's fragment header and its checks (tcp_wire.h). */
#include "transport/tcp_wire.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "transport/liveness.h"
#include "transport/transport.h"
#include "util/status.h"

_Static_assert(MLXD_TCP_BEAT_MAX == MLXD_NOTE_MAX - 1, "a heartbeat carries a note");
_Static_assert(MLXD_TCP_DETAIL_MAX == MLXD_MSG_MAX - 1, "an abort carries a status detail");
_Static_assert(MLXD_TCP_ADDR_MAX == MLXD_ADDR_MAX - 1, "an abort carries a peer address");

#include "transport/match.h"

_Static_assert(MLXD_TCP_HDR == 32 + MLXD_SIG_BYTES, "four u64 fields, then the signature");

static void put_u64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint64_t get_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
  return v;
}

void mlxd_tcp_hdr_encode(unsigned char out[MLXD_TCP_HDR], const mlxd_tcp_hdr* h) {
  put_u64(out, h->tag);
  put_u64(out + 8, h->off);
  put_u64(out + 16, h->len);
  put_u64(out + 24, h->total);
  mlxd_sig_encode(out + 32, &h->sig);
}

int mlxd_tcp_hdr_decode(const unsigned char in[MLXD_TCP_HDR], mlxd_tcp_hdr* out, char* why,
                        size_t why_n) {
  mlxd_tcp_hdr h = {get_u64(in), get_u64(in + 8), get_u64(in + 16), get_u64(in + 24), {0}};
  mlxd_sig_decode(in + 32, &h.sig);
  *out = h;
  if (in[32 + 2] || in[32 + 3]) {
    snprintf(why, why_n, "the signature's padding bytes are 0x%02x%02x, not zero", in[32 + 2],
             in[32 + 3]);
  } else if (h.total > MLXD_TCP_MSG_MAX) {
    snprintf(why, why_n, "total %" PRIu64 " is above the %" PRIu64 "-byte message limit", h.total,
             MLXD_TCP_MSG_MAX);
  } else if (h.total > SIZE_MAX) {
    snprintf(why, why_n, "total %" PRIu64 " does not fit in memory here", h.total);
  } else if (h.len > MLXD_TCP_FRAG_MAX) {
    snprintf(why, why_n, "length %" PRIu64 " is above the %" PRIu64 "-byte fragment limit", h.len,
             MLXD_TCP_FRAG_MAX);
  } else if (h.len > h.total) {
    snprintf(why, why_n, "length %" PRIu64 " is above the total %" PRIu64, h.len, h.total);
  } else if (h.off > h.total - h.len) {
    snprintf(why, why_n, "offset %" PRIu64 " + length %" PRIu64 " is past the total %" PRIu64,
             h.off, h.len, h.total);
  } else if ((h.len == 0) != (h.total == 0)) {
    snprintf(why, why_n, "length 0 in a %" PRIu64 "-byte message", h.total);
  } else {
    return 0;
  }
  return -1;
}

/* A control frame (tag kind MLXD_TAG_CTRL): one fragment, a known step,
 * a bounded payload. */
static mlxd_tcp_admit ctrl_admit(const mlxd_tcp_hdr* h, char* why, size_t why_n) {
  uint64_t seq = (h->tag >> 16) & ((1ull << 44) - 1);
  unsigned step = (unsigned)(h->tag & 0xFFFF);
  uint64_t lo = 0, hi = 0;
  if (step == MLXD_TCP_CTRL_BEAT) {
    hi = MLXD_TCP_BEAT_MAX;
  } else if (step == MLXD_TCP_CTRL_ABORT) {
    lo = MLXD_TCP_ABORT_MIN;
    hi = MLXD_TCP_ABORT_MAX;
  } else {
    snprintf(why, why_n, "control frame of unknown kind %u", step);
    return MLXD_TCP_REJECT;
  }
  if (seq != 0 || h->off != 0 || h->len != h->total) {
    snprintf(why, why_n,
             "control frame with sequence number %" PRIu64 ", offset %" PRIu64
             " (expected 0, 0 and length == total)",
             seq, h->off);
    return MLXD_TCP_REJECT;
  }
  if (h->len < lo || h->len > hi) {
    snprintf(why, why_n,
             "control frame kind %u of %" PRIu64 " bytes (expected %" PRIu64 " to %" PRIu64 ")",
             step, h->len, lo, hi);
    return MLXD_TCP_REJECT;
  }
  return MLXD_TCP_CONTROL;
}

mlxd_tcp_admit mlxd_tcp_hdr_admit(const mlxd_tcp_hdr* h, const mlxd_tcp_rx_state* s, char* why,
                                  size_t why_n) {
  if (mlxd_tag_kind(h->tag) == MLXD_TAG_CTRL) return ctrl_admit(h, why, why_n);
  if (s->arriving) {
    if (h->total != s->arr_total) {
      snprintf(why, why_n,
               "total %" PRIu64 " differs from the %" PRIu64
               " bytes of the message with the same tag still arriving (tags must be unique "
               "among messages in flight)",
               h->total, s->arr_total);
      return MLXD_TCP_REJECT;
    }
    if (s->arr_got > s->arr_total || h->len > s->arr_total - s->arr_got) {
      snprintf(why, why_n,
               "length %" PRIu64 " brings the message past its total %" PRIu64 " (%" PRIu64
               " bytes already received)",
               h->len, s->arr_total, s->arr_got);
      return MLXD_TCP_REJECT;
    }
    return MLXD_TCP_CONTINUE;
  }
  if (s->posted) return h->total == s->posted_n ? MLXD_TCP_DIRECT : MLXD_TCP_MISMATCH;
  uint64_t charge = h->total + MLXD_TCP_UX_OVERHEAD; /* total <= 2^48: no overflow */
  if (s->ux_charged > s->ux_budget || charge > s->ux_budget - s->ux_charged) {
    snprintf(why, why_n,
             "total %" PRIu64
             " of a message no receive is posted for would take the peer's "
             "buffered unexpected messages to %" PRIu64 " bytes, above the %" PRIu64
             "-byte budget (MLXDIST_TCP_UNEXPECTED_MB)",
             h->total, s->ux_charged + charge, s->ux_budget);
    return MLXD_TCP_REJECT;
  }
  return MLXD_TCP_BUFFER;
}

static void put_u32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_u32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}

/* The system calls an abort record may name (index + 1 on the wire). */
static const char* const k_syscalls[] = {"recv", "sendmsg", "poll", "fcntl", "eventfd"};
#define N_SYSCALLS (sizeof k_syscalls / sizeof k_syscalls[0])

size_t mlxd_tcp_abort_encode(unsigned char* out, const mlxd_tcp_abort_rec* r) {
  size_t na = strnlen(r->addr, MLXD_TCP_ADDR_MAX);
  size_t nd = strnlen(r->detail, MLXD_TCP_DETAIL_MAX);
  uint32_t sc = 0;
  for (uint32_t i = 0; r->syscall && i < N_SYSCALLS; i++)
    if (strcmp(r->syscall, k_syscalls[i]) == 0) sc = i + 1;
  put_u32(out, r->code);
  put_u32(out + 4, (uint32_t)r->reporter);
  put_u32(out + 8, (uint32_t)r->peer);
  put_u32(out + 12, (uint32_t)r->sys_errno);
  put_u32(out + 16, sc);
  put_u32(out + 20, (uint32_t)na);
  put_u32(out + 24, (uint32_t)nd);
  memcpy(out + MLXD_TCP_ABORT_MIN, r->addr, na);
  memcpy(out + MLXD_TCP_ABORT_MIN + na, r->detail, nd);
  return MLXD_TCP_ABORT_MIN + na + nd;
}

int mlxd_tcp_abort_decode(const unsigned char* in, size_t len, int size, mlxd_tcp_abort_rec* r,
                          char* why, size_t why_n) {
  memset(r, 0, sizeof *r);
  if (len < MLXD_TCP_ABORT_MIN || len > MLXD_TCP_ABORT_MAX) {
    snprintf(why, why_n, "abort record of %zu bytes (expected %u to %u)", len, MLXD_TCP_ABORT_MIN,
             MLXD_TCP_ABORT_MAX);
    return -1;
  }
  r->code = get_u32(in);
  r->reporter = (int32_t)get_u32(in + 4);
  r->peer = (int32_t)get_u32(in + 8);
  r->sys_errno = (int32_t)get_u32(in + 12);
  uint32_t sc = get_u32(in + 16), na = get_u32(in + 20), nd = get_u32(in + 24);
  if (r->code < MLXD_EINVAL || r->code > MLXD_ECALLBACK) {
    snprintf(why, why_n, "abort record with unknown failure code %" PRIu32, r->code);
  } else if (r->reporter < 0 || r->reporter >= size) {
    snprintf(why, why_n, "abort record names rank %" PRId32 " as its reporter in a group of %d",
             r->reporter, size);
  } else if (r->peer < -1 || r->peer >= size) {
    snprintf(why, why_n, "abort record names rank %" PRId32 " in a group of %d", r->peer, size);
  } else if (r->sys_errno < 0 || r->sys_errno > 4095 || sc > N_SYSCALLS) {
    snprintf(why, why_n, "abort record with errno %" PRId32 " and system call #%" PRIu32,
             r->sys_errno, sc);
  } else if (na > MLXD_TCP_ADDR_MAX || nd > MLXD_TCP_DETAIL_MAX ||
             (size_t)na + nd != len - MLXD_TCP_ABORT_MIN) {
    snprintf(why, why_n,
             "abort record with a %" PRIu32 "-byte address and a %" PRIu32
             "-byte detail in %zu bytes",
             na, nd, len);
  } else {
    r->syscall = sc ? k_syscalls[sc - 1] : NULL;
    mlxd_live_note_clean(r->addr, sizeof r->addr, in + MLXD_TCP_ABORT_MIN, na);
    mlxd_live_note_clean(r->detail, sizeof r->detail, in + MLXD_TCP_ABORT_MIN + na, nd);
    return 0;
  }
  return -1;
}
