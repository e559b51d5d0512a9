/* Fuzz target: the TCP transport's fragment header (MLXD_TCP_HDR bytes: four
 * u64 and the sender's call signature) and the checks a receiver makes before
 * it acts on one (transport/tcp_wire.h). Input: the header (zero-padded to
 * MLXD_TCP_HDR bytes), then one byte choosing what the receiver
 * knows about the tag (a message arriving, a receive posted, neither), then
 * the state's numbers as little-endian u64s (missing bytes are zero).
 * Whatever the bytes, decoding and admitting must not crash, and what is
 * accepted must keep every bound the transport relies on: the header
 * re-encodes to the same bytes (signature included: padding is refused), any
 * decoded signature can be printed and compared, the fragment lies
 * within its message, never beyond what a message arriving still lacks, and
 * an unexpected message is buffered only within the peer's budget. A
 * control frame (tag kind 15) must be one bounded fragment; for one, the
 * bytes after the state are also decoded as an abort record. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "transport/match.h"
#include "transport/tcp_wire.h"

static uint64_t take_u64(const uint8_t** p, size_t* left) {
  uint64_t v = 0;
  for (int i = 0; i < 8 && *left > 0; i++, (*p)++, (*left)--) v |= (uint64_t) * *p << (8 * i);
  return v;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  unsigned char raw[MLXD_TCP_HDR] = {0};
  size_t n = size < sizeof raw ? size : sizeof raw;
  memcpy(raw, data, n);
  const uint8_t* p = data + n;
  size_t left = size - n;
  char why[256] = "";
  mlxd_tcp_hdr h;
  if (mlxd_tcp_hdr_decode(raw, &h, why, sizeof why) != 0) {
    if (!why[0]) abort(); /* a refusal always says why */
    return 0;
  }
  if (h.sig.pad != 0) abort();
  char text[128];
  mlxd_sig_str(&h.sig, text, sizeof text); /* any op or dtype is printable */
  mlxd_sig none = {0};
  if (!mlxd_sig_agree(&h.sig, &none) || !mlxd_sig_agree(&h.sig, &h.sig)) abort();
  mlxd_status st;
  if (mlxd_sig_check(&st, MLXD_LAYER_TCP, 0, &none, 1, "", &h.sig) != 0) abort();
  if (h.len > h.total || h.off > h.total || h.off + h.len > h.total) abort();
  if (h.total > MLXD_TCP_MSG_MAX || h.len > MLXD_TCP_FRAG_MAX) abort();
  if ((h.len == 0) != (h.total == 0)) abort();
  unsigned char again[MLXD_TCP_HDR];
  mlxd_tcp_hdr_encode(again, &h);
  if (memcmp(again, raw, sizeof raw) != 0) abort();

  unsigned mode = left > 0 ? *p : 0;
  if (left > 0) {
    p++;
    left--;
  }
  mlxd_tcp_rx_state s = {0};
  s.arriving = (mode & 3) == 1;
  s.posted = (mode & 3) == 2;
  s.arr_total = take_u64(&p, &left);
  s.arr_got = take_u64(&p, &left);
  s.posted_n = take_u64(&p, &left);
  s.ux_charged = take_u64(&p, &left);
  s.ux_budget = take_u64(&p, &left);
  if (mode & 4) s.arr_total = h.total; /* reach the continuation checks often */
  if (mode & 8) s.posted_n = h.total;
  why[0] = '\0';
  switch (mlxd_tcp_hdr_admit(&h, &s, why, sizeof why)) {
    case MLXD_TCP_REJECT:
      if (!why[0]) abort();
      break;
    case MLXD_TCP_CONTINUE:
      if (!s.arriving || h.total != s.arr_total || s.arr_got > s.arr_total ||
          h.len > s.arr_total - s.arr_got)
        abort();
      break;
    case MLXD_TCP_DIRECT:
      if (s.arriving || !s.posted || h.total != s.posted_n) abort();
      break;
    case MLXD_TCP_MISMATCH:
      if (s.arriving || !s.posted || h.total == s.posted_n) abort();
      break;
    case MLXD_TCP_BUFFER:
      if (s.arriving || s.posted || s.ux_charged > s.ux_budget ||
          h.total + MLXD_TCP_UX_OVERHEAD > s.ux_budget - s.ux_charged)
        abort();
      break;
    case MLXD_TCP_CONTROL: {
      /* a control frame: one bounded fragment; the rest of the input as
       * its record must decode to a bounded, printable one or be refused */
      if ((h.tag >> 60) != 15 || h.off != 0 || h.len != h.total || h.len > MLXD_TCP_ABORT_MAX)
        abort();
      mlxd_tcp_abort_rec r;
      why[0] = '\0';
      size_t rl = left < MLXD_TCP_ABORT_MAX + 8 ? left : MLXD_TCP_ABORT_MAX + 8;
      if (mlxd_tcp_abort_decode(p, rl, 4, &r, why, sizeof why) != 0) {
        if (!why[0]) abort();
      } else {
        if (r.reporter < 0 || r.reporter >= 4 || r.peer < -1 || r.peer >= 4 || r.code == 0) abort();
        for (const char* c = r.detail; *c; c++)
          if (*c < 0x20 || *c > 0x7e) abort();
      }
      break;
    }
    default: abort();
  }
  return 0;
}
