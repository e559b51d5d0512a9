/* Fuzz target: what arrives at either end of the rendezvous
 * (net/rendezvous_wire.c): the launcher's challenge and reply as a
 * rank reads them, a rank's hello and records as the launcher reads them, and
 * MLXDIST_PORT_RANGE / --port-range. Byte 0 picks the parser, byte 1 the job
 * size; the rest is the input. What is accepted must satisfy the checks the
 * callers rely on; an accepted MAC must be the right one (re-encoding gives
 * the same bytes). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/net.h"

static const unsigned char KEY[MLXD_RDV_KEY_BYTES] = {1, 2,  3,  4,  5,  6,  7,  8,
                                                      9, 10, 11, 12, 13, 14, 15, 16};
static const unsigned char SNONCE[MLXD_RDV_NONCE_BYTES] = {7};
static const unsigned char CNONCE[MLXD_RDV_NONCE_BYTES] = {9};

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  int kind = data[0] % 4;
  int n = 1 + data[1] % 8;
  const unsigned char* in = data + 2;
  size_t len = size - 2;
  char why[256];
  if (kind == 0) {
    if (len < MLXD_RDV_CHALLENGE_BYTES) return 0;
    unsigned char nonce[MLXD_RDV_NONCE_BYTES], again[MLXD_RDV_CHALLENGE_BYTES];
    if (mlxd_rdv_challenge_decode(in, nonce, why, sizeof why) == 0) {
      mlxd_rdv_challenge_encode(again, nonce);
      if (memcmp(again, in, sizeof again) != 0) abort();
    }
  } else if (kind == 1) {
    if (len < MLXD_RDV_HELLO_BYTES) return 0;
    mlxd_rdv_hello h;
    if (mlxd_rdv_hello_decode(in, n, &h, why, sizeof why) != 0) return 0;
    if (h.rank >= (uint32_t)n || h.size != (uint32_t)n || h.rec_bytes == 0 ||
        h.rec_bytes % MLXD_RDV_REC_UNIT || h.rec_bytes > MLXD_RDV_MAX_REC_BYTES)
      abort();
    if (len - MLXD_RDV_HELLO_BYTES < h.rec_bytes) return 0; /* the server waits for the rest */
    const unsigned char* recs = in + MLXD_RDV_HELLO_BYTES;
    if (mlxd_rdv_hello_verify(in, &h, KEY, SNONCE, recs)) {
      unsigned char again[MLXD_RDV_HELLO_BYTES];
      if (mlxd_rdv_hello_encode(again, KEY, SNONCE, (int)h.rank, n, h.nonce, recs, h.rec_bytes))
        abort();
      if (memcmp(again, in, sizeof again) != 0) abort();
    }
  } else if (kind == 2) {
    if (len < MLXD_RDV_REPLY_BYTES) return 0;
    uint32_t expect = (uint32_t)n * MLXD_RDV_REC_UNIT;
    mlxd_rdv_reply r;
    if (mlxd_rdv_reply_decode(in, expect, &r, why, sizeof why) != 0) return 0;
    if (r.status > MLXD_RDV_REFUSED) abort();
    if (r.status == MLXD_RDV_OK ? r.len != expect : r.len > MLXD_RDV_MAX_REASON) abort();
    if (len - MLXD_RDV_REPLY_BYTES < r.len) return 0;
    const unsigned char* payload = in + MLXD_RDV_REPLY_BYTES;
    char text[MLXD_RDV_MAX_REASON + 1];
    mlxd_rdv_reason_text(payload, r.len, text, sizeof text);
    if (strlen(text) > r.len) abort();
    for (const char* p = text; *p; p++)
      if (*p < 0x20 || *p > 0x7e) abort();
    if (mlxd_rdv_reply_verify(in, &r, KEY, SNONCE, CNONCE, payload)) {
      unsigned char again[MLXD_RDV_REPLY_BYTES];
      if (mlxd_rdv_reply_encode(again, KEY, SNONCE, CNONCE, r.status, payload, r.len)) abort();
      if (memcmp(again, in, sizeof again) != 0) abort();
    }
  } else {
    char s[64];
    size_t k = len < sizeof s - 1 ? len : sizeof s - 1;
    memcpy(s, in, k);
    s[k] = '\0';
    unsigned lo = 0, hi = 0;
    if (mlxd_rdv_parse_port_range(s, &lo, &hi, why, sizeof why) == 0 &&
        (lo < 1 || lo > hi || hi > 65535))
      abort();
  }
  return 0;
}
