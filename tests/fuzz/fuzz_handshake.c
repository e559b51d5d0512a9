/* Fuzz target: the connection handshake's messages (a refusal when bit 3 of
 * byte 0 is set) (net/handshake.c),
 * as an acceptor or a connector receives them from the network. Input: byte 0
 * picks the message kind and whether a secret is in use, bytes 1..3 this
 * rank, the group size and the connection count; the rest is what arrived (any
 * length: a short read is checked too). A message that is accepted must encode
 * back to the same bytes; a MAC that is accepted must be the right one. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/net.h"

static const unsigned char TOKEN[MLXD_HS_TOKEN_BYTES] = {1, 2,  3,  4,  5,  6,  7,  8,
                                                         9, 10, 11, 12, 13, 14, 15, 16};
static const unsigned char KEY[32] = {42};

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  int kind = data[0] % 3;
  bool secret = (data[0] >> 2) & 1;
  int gsize = 2 + data[2] % 8;
  int self = data[1] % gsize;
  int nconn = 1 + data[3] % 4;
  const unsigned char* msg = data + 4;
  size_t len = size - 4;
  mlxd_hs_expect e = {self, gsize, nconn, TOKEN, secret, false};
  mlxd_hs_msg m;
  unsigned char again[MLXD_HS_REPLY_BYTES];
  if (kind == 0) {
    if (mlxd_hs_check_hello(msg, len, &e, &m) == MLXD_HS_OK) {
      if (m.rank <= (uint32_t)self || m.rank >= (uint32_t)gsize || m.conn >= (uint32_t)nconn)
        abort();
      mlxd_hs_encode_hello(again, &m);
      if (memcmp(again, msg, MLXD_HS_HELLO_BYTES) != 0) abort();
    }
  } else if (kind == 1 && (data[0] >> 3) & 1) { /* a refusal in the reply's place */
    int peer = (self + 1) % gsize;
    int conn = nconn - 1;
    size_t need = 0, blen = 0;
    unsigned rk = 0;
    const unsigned char* body = NULL;
    if (mlxd_hs_check_refusal(msg, len, &e, peer, conn, &m, &need, &rk, &body, &blen) ==
        MLXD_HS_OK) {
      if (blen > MLXD_HS_REFUSAL_BODY_MAX || body != msg + MLXD_HS_REFUSAL_HEAD ||
          need != MLXD_HS_REFUSAL_HEAD + blen || need > len)
        abort();
      unsigned char re[MLXD_HS_REFUSAL_MAX];
      if (mlxd_hs_encode_refusal(re, &m, rk, body, blen) != need || memcmp(re, msg, need) != 0)
        abort();
    } else if (need > MLXD_HS_REFUSAL_MAX) {
      abort(); /* a reader is never told to read past the bound */
    }
  } else if (kind == 1) {
    int peer = (self + 1) % gsize;
    int conn = nconn - 1;
    if (mlxd_hs_check_reply(msg, len, &e, peer, conn, &m) == MLXD_HS_OK) {
      if (m.rank != (uint32_t)peer || m.conn != (uint32_t)conn) abort();
      mlxd_hs_encode_reply(again, &m);
      if (memcmp(again, msg, MLXD_HS_REPLY_BYTES) != 0) abort();
      /* the MAC check the connector makes: only the right MAC passes */
      unsigned char nonce_c[MLXD_HS_NONCE_BYTES] = {7};
      unsigned char mac[MLXD_HS_MAC_BYTES];
      if (mlxd_hs_mac(secret ? KEY : NULL, false, TOKEN, gsize, nconn, conn, self, peer, nonce_c,
                      m.nonce, mac) != 0)
        abort();
      if (mlxd_hs_mac_equal(mac, m.mac) != (memcmp(mac, m.mac, sizeof mac) == 0)) abort();
    }
  } else {
    unsigned char expect[MLXD_HS_MAC_BYTES];
    memset(expect, data[1], sizeof expect);
    if (mlxd_hs_check_confirm(msg, len, expect) == MLXD_HS_OK) {
      mlxd_hs_encode_confirm(again, expect);
      if (memcmp(again, msg, MLXD_HS_CONFIRM_BYTES) != 0) abort();
    }
  }
  (void)mlxd_hs_reason((mlxd_hs_err)(data[3] % 16));
  return 0;
}
