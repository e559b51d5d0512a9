/* The rendezvous protocol's messages (rendezvous_wire.h): pure functions. */
#include "net/rendezvous_wire.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "security/secret.h"
#include "util/bytes.h"

#define MAGIC_CHALLENGE 0x4D585243u /* "MXRC" */
#define MAGIC_HELLO 0x4D585248u     /* "MXRH" */
#define MAGIC_REPLY 0x4D585252u     /* "MXRR" */
#define HELLO_MAC_AT 36
#define REPLY_MAC_AT 12

static const char hello_label[] = "mlxdist rendezvous hello v1";
static const char reply_label[] = "mlxdist rendezvous reply v1";

static int fail(char* why, size_t why_len, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(char* why, size_t why_len, const char* fmt, ...) {
  if (why && why_len) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
  }
  return -1;
}

void mlxd_rdv_challenge_encode(unsigned char out[MLXD_RDV_CHALLENGE_BYTES],
                               const unsigned char nonce[MLXD_RDV_NONCE_BYTES]) {
  memset(out, 0, MLXD_RDV_CHALLENGE_BYTES);
  mlxd_put32(out, MAGIC_CHALLENGE);
  mlxd_put16(out + 4, MLXD_RDV_VERSION);
  memcpy(out + 8, nonce, MLXD_RDV_NONCE_BYTES);
}

int mlxd_rdv_challenge_decode(const unsigned char in[MLXD_RDV_CHALLENGE_BYTES],
                              unsigned char nonce[MLXD_RDV_NONCE_BYTES], char* why,
                              size_t why_len) {
  if (mlxd_get32(in) != MAGIC_CHALLENGE)
    return fail(why, why_len, "bad magic 0x%08x: not an mlxdist launcher's rendezvous",
                (unsigned)mlxd_get32(in));
  if (mlxd_get16(in + 4) != MLXD_RDV_VERSION)
    return fail(why, why_len, "protocol version %u, this rank speaks %u", mlxd_get16(in + 4),
                MLXD_RDV_VERSION);
  if (mlxd_get16(in + 6) != 0)
    return fail(why, why_len, "non-zero reserved bytes (0x%04x)", mlxd_get16(in + 6));
  memcpy(nonce, in + 8, MLXD_RDV_NONCE_BYTES);
  return 0;
}

int mlxd_rdv_hello_encode(unsigned char out[MLXD_RDV_HELLO_BYTES],
                          const unsigned char key[MLXD_RDV_KEY_BYTES],
                          const unsigned char snonce[MLXD_RDV_NONCE_BYTES], int rank, int size,
                          const unsigned char cnonce[MLXD_RDV_NONCE_BYTES], const void* recs,
                          size_t rec_bytes) {
  memset(out, 0, MLXD_RDV_HELLO_BYTES);
  mlxd_put32(out, MAGIC_HELLO);
  mlxd_put16(out + 4, MLXD_RDV_VERSION);
  mlxd_put32(out + 8, (uint32_t)rank);
  mlxd_put32(out + 12, (uint32_t)size);
  mlxd_put32(out + 16, (uint32_t)rec_bytes);
  memcpy(out + 20, cnonce, MLXD_RDV_NONCE_BYTES);
  const void* parts[] = {hello_label, snonce, out, recs};
  const size_t lens[] = {sizeof hello_label - 1, MLXD_RDV_NONCE_BYTES, HELLO_MAC_AT, rec_bytes};
  return mlxd_hmac_sha256(key, MLXD_RDV_KEY_BYTES, parts, lens, 4, out + HELLO_MAC_AT);
}

int mlxd_rdv_hello_decode(const unsigned char in[MLXD_RDV_HELLO_BYTES], int n, mlxd_rdv_hello* h,
                          char* why, size_t why_len) {
  if (mlxd_get32(in) != MAGIC_HELLO)
    return fail(why, why_len, "bad magic 0x%08x: not an mlxdist rank's hello",
                (unsigned)mlxd_get32(in));
  if (mlxd_get16(in + 4) != MLXD_RDV_VERSION)
    return fail(why, why_len, "protocol version %u, the launcher speaks %u", mlxd_get16(in + 4),
                MLXD_RDV_VERSION);
  if (mlxd_get16(in + 6) != 0)
    return fail(why, why_len, "non-zero reserved bytes (0x%04x)", mlxd_get16(in + 6));
  h->rank = mlxd_get32(in + 8);
  h->size = mlxd_get32(in + 12);
  h->rec_bytes = mlxd_get32(in + 16);
  if (n < 1 || n > MLXD_RDV_MAX_RANKS)
    return fail(why, why_len, "the job size %u is outside [1, %u]", (unsigned)n,
                MLXD_RDV_MAX_RANKS);
  if (h->size != (uint32_t)n)
    return fail(why, why_len, "it says the job has %u ranks, the launcher started %u", h->size,
                (unsigned)n);
  if (h->rank >= (uint32_t)n)
    return fail(why, why_len, "rank %u is outside [0, %u)", h->rank, (unsigned)n);
  if (h->rec_bytes == 0 || h->rec_bytes % MLXD_RDV_REC_UNIT != 0 ||
      h->rec_bytes > MLXD_RDV_MAX_REC_BYTES)
    return fail(why, why_len, "it posts %u bytes of records (expected a multiple of 64 up to %u)",
                h->rec_bytes, MLXD_RDV_MAX_REC_BYTES);
  if ((uint64_t)h->rec_bytes * (uint64_t)n > MLXD_RDV_MAX_TOTAL)
    return fail(why, why_len, "%u ranks of %u bytes of records are more than the rendezvous holds",
                (unsigned)n, h->rec_bytes);
  memcpy(h->nonce, in + 20, MLXD_RDV_NONCE_BYTES);
  memcpy(h->mac, in + HELLO_MAC_AT, MLXD_RDV_MAC_BYTES);
  return 0;
}

bool mlxd_rdv_hello_verify(const unsigned char in[MLXD_RDV_HELLO_BYTES], const mlxd_rdv_hello* h,
                           const unsigned char key[MLXD_RDV_KEY_BYTES],
                           const unsigned char snonce[MLXD_RDV_NONCE_BYTES], const void* recs) {
  unsigned char mac[MLXD_RDV_MAC_BYTES];
  const void* parts[] = {hello_label, snonce, in, recs};
  const size_t lens[] = {sizeof hello_label - 1, MLXD_RDV_NONCE_BYTES, HELLO_MAC_AT, h->rec_bytes};
  if (mlxd_hmac_sha256(key, MLXD_RDV_KEY_BYTES, parts, lens, 4, mac) != 0) return false;
  return mlxd_ct_equal(mac, h->mac, MLXD_RDV_MAC_BYTES);
}

int mlxd_rdv_reply_encode(unsigned char out[MLXD_RDV_REPLY_BYTES],
                          const unsigned char key[MLXD_RDV_KEY_BYTES],
                          const unsigned char snonce[MLXD_RDV_NONCE_BYTES],
                          const unsigned char cnonce[MLXD_RDV_NONCE_BYTES], unsigned status,
                          const void* payload, uint32_t len) {
  memset(out, 0, MLXD_RDV_REPLY_BYTES);
  mlxd_put32(out, MAGIC_REPLY);
  mlxd_put16(out + 4, MLXD_RDV_VERSION);
  mlxd_put16(out + 6, status);
  mlxd_put32(out + 8, len);
  const void* parts[] = {reply_label, snonce, cnonce, out, payload};
  const size_t lens[] = {sizeof reply_label - 1, MLXD_RDV_NONCE_BYTES, MLXD_RDV_NONCE_BYTES,
                         REPLY_MAC_AT, len};
  return mlxd_hmac_sha256(key, MLXD_RDV_KEY_BYTES, parts, lens, 5, out + REPLY_MAC_AT);
}

int mlxd_rdv_reply_decode(const unsigned char in[MLXD_RDV_REPLY_BYTES], uint32_t expect_len,
                          mlxd_rdv_reply* r, char* why, size_t why_len) {
  if (mlxd_get32(in) != MAGIC_REPLY)
    return fail(why, why_len, "bad magic 0x%08x: not an mlxdist launcher's reply",
                (unsigned)mlxd_get32(in));
  if (mlxd_get16(in + 4) != MLXD_RDV_VERSION)
    return fail(why, why_len, "protocol version %u, this rank speaks %u", mlxd_get16(in + 4),
                MLXD_RDV_VERSION);
  r->status = mlxd_get16(in + 6);
  r->len = mlxd_get32(in + 8);
  if (r->status > MLXD_RDV_REFUSED) return fail(why, why_len, "unknown status %u", r->status);
  if (r->status == MLXD_RDV_OK && r->len != expect_len)
    return fail(why, why_len, "it carries %u bytes of records, expected %u", r->len, expect_len);
  if (r->status != MLXD_RDV_OK && r->len > MLXD_RDV_MAX_REASON)
    return fail(why, why_len, "its reason is %u bytes long (at most %u)", r->len,
                MLXD_RDV_MAX_REASON);
  memcpy(r->mac, in + REPLY_MAC_AT, MLXD_RDV_MAC_BYTES);
  return 0;
}

bool mlxd_rdv_reply_verify(const unsigned char in[MLXD_RDV_REPLY_BYTES], const mlxd_rdv_reply* r,
                           const unsigned char key[MLXD_RDV_KEY_BYTES],
                           const unsigned char snonce[MLXD_RDV_NONCE_BYTES],
                           const unsigned char cnonce[MLXD_RDV_NONCE_BYTES], const void* payload) {
  unsigned char mac[MLXD_RDV_MAC_BYTES];
  const void* parts[] = {reply_label, snonce, cnonce, in, payload};
  const size_t lens[] = {sizeof reply_label - 1, MLXD_RDV_NONCE_BYTES, MLXD_RDV_NONCE_BYTES,
                         REPLY_MAC_AT, r->len};
  if (mlxd_hmac_sha256(key, MLXD_RDV_KEY_BYTES, parts, lens, 5, mac) != 0) return false;
  return mlxd_ct_equal(mac, r->mac, MLXD_RDV_MAC_BYTES);
}

char* mlxd_rdv_reason_text(const void* reason, size_t len, char* out, size_t out_len) {
  if (!out_len) return out;
  const unsigned char* p = reason;
  size_t o = 0;
  for (size_t i = 0; i < len && o + 1 < out_len; i++)
    out[o++] = (p[i] >= 0x20 && p[i] < 0x7f) ? (char)p[i] : '?';
  out[o] = '\0';
  return out;
}

static int parse_port(const char** s, unsigned* v) {
  unsigned x = 0;
  int digits = 0;
  while (**s >= '0' && **s <= '9') {
    x = x * 10 + (unsigned)(**s - '0');
    if (x > 65535) return -1;
    (*s)++;
    digits++;
  }
  if (!digits || digits > 5) return -1;
  *v = x;
  return 0;
}

int mlxd_rdv_parse_port_range(const char* s, unsigned* lo, unsigned* hi, char* why,
                              size_t why_len) {
  const char* p = s;
  unsigned a = 0, b = 0;
  if (parse_port(&p, &a) != 0 || *p != '-' || (p++, parse_port(&p, &b)) != 0 || *p != '\0') {
    if (why && why_len)
      snprintf(why, why_len, "'%.40s' is not a port range (expected A-B, e.g. 50000-50100)", s);
    return -1;
  }
  if (a < 1 || a > b) {
    if (why && why_len)
      snprintf(why, why_len, "'%.40s' is not a port range: expected 1 <= A <= B <= 65535", s);
    return -1;
  }
  *lo = a;
  *hi = b;
  return 0;
}
