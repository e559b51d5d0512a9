/* The TCP transport's fragment header and its checks (tcp_wire.h). */
#include "transport/tcp_wire.h"

#include <inttypes.h>
#include <stdio.h>

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

mlxd_tcp_admit mlxd_tcp_hdr_admit(const mlxd_tcp_hdr* h, const mlxd_tcp_rx_state* s, char* why,
                                  size_t why_n) {
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
