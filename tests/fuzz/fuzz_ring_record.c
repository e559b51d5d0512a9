/* Fuzz target: the 64-byte bootstrap address record (net/bootstrap.c),
 * as it comes back from a caller's all-gather. Input: 4 bytes choose the
 * expected rank, size, connection and connection count, the rest is the record
 * (short inputs are zero-padded: the decoder always gets a full record, as
 * the bootstrap path guarantees). Decoding must never crash and must only
 * accept a record that encodes back to the same bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/net.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  int nconn = 1 + data[3] % 4;
  int conn = data[2] % nconn;
  int gsize = 2 + data[1] % 8;
  int rank = data[0] % gsize;
  unsigned char rec[MLXD_NET_REC_BYTES] = {0};
  size_t n = size - 4 < sizeof rec ? size - 4 : sizeof rec;
  memcpy(rec, data + 4, n);
  mlxd_status st = {0};
  mlxd_net_addr a;
  if (mlxd_net_rec_decode(rec, rank, gsize, conn, nconn, "fuzz", &a, &st) == 0) {
    unsigned char again[MLXD_NET_REC_BYTES];
    mlxd_net_rec_encode(again, rank, gsize, conn, nconn, &a, rec + 40); /* the nonce */
    if (memcmp(again, rec, sizeof rec) != 0) abort(); /* accepted something it would not write */
  }
  return 0;
}
