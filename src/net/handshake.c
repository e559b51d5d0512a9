/* The connection handshake's wire format and the job token (handshake.h): pure
 * functions over byte buffers; the crypto is libcrypto's (security/secret.h). */
#include "net/handshake.h"

#include <string.h>

#include "net/net.h"
#include "security/secret.h"
#include "util/bytes.h"

#define MAGIC_HELLO 0x4D4C5848u   /* "MLXH" */
#define MAGIC_REPLY 0x4D4C5841u   /* "MLXA" */
#define MAGIC_CONFIRM 0x4D4C5846u /* "MLXF" */
#define MAGIC_REFUSAL 0x4D4C5852u /* "MLXR" */

const char* mlxd_hs_reason(mlxd_hs_err e) {
  switch (e) {
    case MLXD_HS_OK: return "ok";
    case MLXD_HS_SHORT: return "incomplete handshake";
    case MLXD_HS_MAGIC: return "not an mlxdist handshake (wrong magic)";
    case MLXD_HS_VERSION_E: return "unsupported handshake version";
    case MLXD_HS_FLAGS: return "unknown handshake flags";
    case MLXD_HS_TOKEN:
      return "wrong job token (another job, e.g. one started with the same hostfile)";
    case MLXD_HS_SIZE: return "wrong group size or connection count";
    case MLXD_HS_RANK: return "a rank that does not connect to this rank";
    case MLXD_HS_CONN: return "wrong connection index";
    case MLXD_HS_NO_SECRET:
      return "the peer has no shared secret but this rank requires one (MLXDIST_SECRET_FILE)";
    case MLXD_HS_SECRET:
      return "the peer uses a shared secret but this rank has none (MLXDIST_SECRET_FILE)";
    case MLXD_HS_MAC_E:
      return "the proof does not match this rank's secret (a different MLXDIST_SECRET_FILE, "
             "or a replayed handshake)";
    case MLXD_HS_RESERVED_E: return "non-zero reserved bytes";
    case MLXD_HS_REFUSAL_E: return "a refusal of an unknown reason or length";
  }
  return "unknown error";
}

static void put_fields(unsigned char* p, uint32_t magic, const mlxd_hs_msg* m) {
  mlxd_put32(p, magic);
  mlxd_put16(p + 4, MLXD_HS_VERSION);
  mlxd_put16(p + 6, m->flags);
  mlxd_put32(p + 8, m->rank);
  mlxd_put32(p + 12, m->size);
  mlxd_put32(p + 16, m->conn);
  mlxd_put32(p + 20, m->nconn);
  memcpy(p + 24, m->token, MLXD_HS_TOKEN_BYTES);
  memcpy(p + 40, m->nonce, MLXD_HS_NONCE_BYTES);
}

void mlxd_hs_encode_hello(unsigned char out[MLXD_HS_HELLO_BYTES], const mlxd_hs_msg* m) {
  put_fields(out, MAGIC_HELLO, m);
}

void mlxd_hs_encode_reply(unsigned char out[MLXD_HS_REPLY_BYTES], const mlxd_hs_msg* m) {
  put_fields(out, MAGIC_REPLY, m);
  memcpy(out + 72, m->mac, MLXD_HS_MAC_BYTES);
}

void mlxd_hs_encode_confirm(unsigned char out[MLXD_HS_CONFIRM_BYTES],
                            const unsigned char mac[MLXD_HS_MAC_BYTES]) {
  mlxd_put32(out, MAGIC_CONFIRM);
  mlxd_put16(out + 4, MLXD_HS_VERSION);
  mlxd_put16(out + 6, 0);
  memcpy(out + 8, mac, MLXD_HS_MAC_BYTES);
}

/* The checks a hello and a reply share; fills out. */
static mlxd_hs_err check_common(const unsigned char* p, size_t len, size_t need, uint32_t magic,
                                const mlxd_hs_expect* e, mlxd_hs_msg* out) {
  memset(out, 0, sizeof *out);
  /* The magic first, so that garbage is named as such even when it is short. */
  if (len >= 4 && mlxd_get32(p) != magic) return MLXD_HS_MAGIC;
  if (len < need) return MLXD_HS_SHORT;
  if (mlxd_get16(p + 4) != MLXD_HS_VERSION) return MLXD_HS_VERSION_E;
  out->flags = mlxd_get16(p + 6);
  out->rank = mlxd_get32(p + 8);
  out->size = mlxd_get32(p + 12);
  out->conn = mlxd_get32(p + 16);
  out->nconn = mlxd_get32(p + 20);
  memcpy(out->token, p + 24, MLXD_HS_TOKEN_BYTES);
  memcpy(out->nonce, p + 40, MLXD_HS_NONCE_BYTES);
  if (out->flags & ~MLXD_HS_FLAG_SECRET) return MLXD_HS_FLAGS;
  /* The token before anything else about the group: a peer of another job is
   * named as such, whatever its size. */
  if (!mlxd_ct_equal(out->token, e->token, MLXD_HS_TOKEN_BYTES)) return MLXD_HS_TOKEN;
  if (out->size != (uint32_t)e->size || out->nconn != (uint32_t)e->nconn) return MLXD_HS_SIZE;
  bool peer_secret = (out->flags & MLXD_HS_FLAG_SECRET) != 0;
  if (e->secret && !peer_secret) return MLXD_HS_NO_SECRET;
  if (!e->secret && peer_secret) return MLXD_HS_SECRET;
  return MLXD_HS_OK;
}

mlxd_hs_err mlxd_hs_check_hello(const unsigned char* buf, size_t len, const mlxd_hs_expect* e,
                                mlxd_hs_msg* out) {
  mlxd_hs_err r = check_common(buf, len, MLXD_HS_HELLO_BYTES, MAGIC_HELLO, e, out);
  if (r) return r;
  if (out->rank == (uint32_t)e->self || (!e->any_rank && out->rank < (uint32_t)e->self) ||
      out->rank >= (uint32_t)e->size)
    return MLXD_HS_RANK;
  if (out->conn >= (uint32_t)e->nconn) return MLXD_HS_CONN;
  return MLXD_HS_OK;
}

mlxd_hs_err mlxd_hs_check_reply(const unsigned char* buf, size_t len, const mlxd_hs_expect* e,
                                int peer, int conn, mlxd_hs_msg* out) {
  mlxd_hs_err r = check_common(buf, len, MLXD_HS_REPLY_BYTES, MAGIC_REPLY, e, out);
  if (r) return r;
  memcpy(out->mac, buf + 72, MLXD_HS_MAC_BYTES);
  if (out->rank != (uint32_t)peer) return MLXD_HS_RANK;
  if (out->conn != (uint32_t)conn) return MLXD_HS_CONN;
  return MLXD_HS_OK;
}

size_t mlxd_hs_encode_refusal(unsigned char* out, const mlxd_hs_msg* m, unsigned kind,
                              const unsigned char* body, size_t len) {
  if (len > MLXD_HS_REFUSAL_BODY_MAX) len = MLXD_HS_REFUSAL_BODY_MAX;
  put_fields(out, MAGIC_REFUSAL, m);
  memcpy(out + 72, m->mac, MLXD_HS_MAC_BYTES);
  mlxd_put16(out + 104, (uint16_t)kind);
  mlxd_put16(out + 106, (uint16_t)len);
  if (len) memcpy(out + MLXD_HS_REFUSAL_HEAD, body, len);
  return MLXD_HS_REFUSAL_HEAD + len;
}

bool mlxd_hs_is_refusal(const unsigned char* buf, size_t len) {
  return len >= 4 && mlxd_get32(buf) == MAGIC_REFUSAL;
}

mlxd_hs_err mlxd_hs_check_refusal(const unsigned char* buf, size_t len, const mlxd_hs_expect* e,
                                  int peer, int conn, mlxd_hs_msg* out, size_t* need,
                                  unsigned* kind, const unsigned char** body, size_t* body_len) {
  if (need) *need = MLXD_HS_REFUSAL_HEAD;
  mlxd_hs_err r = check_common(buf, len, MLXD_HS_REFUSAL_HEAD, MAGIC_REFUSAL, e, out);
  if (r) return r;
  memcpy(out->mac, buf + 72, MLXD_HS_MAC_BYTES);
  if (out->rank != (uint32_t)peer) return MLXD_HS_RANK;
  if (out->conn != (uint32_t)conn) return MLXD_HS_CONN;
  unsigned k = mlxd_get16(buf + 104);
  size_t n = mlxd_get16(buf + 106);
  /* The length is checked before it is used to read on: at most the bound. */
  if (n > MLXD_HS_REFUSAL_BODY_MAX || (k != MLXD_HS_REFUSE_FAILED && k != MLXD_HS_REFUSE_CLOSING) ||
      (k == MLXD_HS_REFUSE_CLOSING) != (n == 0))
    return MLXD_HS_REFUSAL_E;
  if (need) *need = MLXD_HS_REFUSAL_HEAD + n;
  if (len < MLXD_HS_REFUSAL_HEAD + n) return MLXD_HS_SHORT;
  if (kind) *kind = k;
  if (body) *body = buf + MLXD_HS_REFUSAL_HEAD;
  if (body_len) *body_len = n;
  return MLXD_HS_OK;
}

mlxd_hs_err mlxd_hs_check_confirm(const unsigned char* buf, size_t len,
                                  const unsigned char expect[MLXD_HS_MAC_BYTES]) {
  if (len >= 4 && mlxd_get32(buf) != MAGIC_CONFIRM) return MLXD_HS_MAGIC;
  if (len < MLXD_HS_CONFIRM_BYTES) return MLXD_HS_SHORT;
  if (mlxd_get16(buf + 4) != MLXD_HS_VERSION) return MLXD_HS_VERSION_E;
  if (mlxd_get16(buf + 6) != 0) return MLXD_HS_RESERVED_E;
  if (!mlxd_hs_mac_equal(buf + 8, expect)) return MLXD_HS_MAC_E;
  return MLXD_HS_OK;
}

/* The connection's numbers a MAC covers, big-endian, in this order. */
static void mac_ints(unsigned char ints[20], int size, int nconn, int conn, int rank_connector,
                     int rank_acceptor) {
  mlxd_put32(ints, (uint32_t)size);
  mlxd_put32(ints + 4, (uint32_t)nconn);
  mlxd_put32(ints + 8, (uint32_t)conn);
  mlxd_put32(ints + 12, (uint32_t)rank_connector);
  mlxd_put32(ints + 16, (uint32_t)rank_acceptor);
}

int mlxd_hs_mac(const unsigned char* key, bool dir_connect, const unsigned char* token, int size,
                int nconn, int conn, int rank_connector, int rank_acceptor,
                const unsigned char* nonce_connector, const unsigned char* nonce_acceptor,
                unsigned char out[MLXD_HS_MAC_BYTES]) {
  if (!key) {
    memset(out, 0, MLXD_HS_MAC_BYTES);
    return 0;
  }
  static const char L_CONNECT[] = "mlxdist ring handshake v2: connector";
  static const char L_ACCEPT[] = "mlxdist ring handshake v2: acceptor";
  const char* label = dir_connect ? L_CONNECT : L_ACCEPT;
  unsigned char ints[20];
  mac_ints(ints, size, nconn, conn, rank_connector, rank_acceptor);
  const void* parts[5] = {label, token, ints, nonce_connector, nonce_acceptor};
  const size_t lens[5] = {strlen(label) + 1, MLXD_HS_TOKEN_BYTES, sizeof ints, MLXD_HS_NONCE_BYTES,
                          MLXD_HS_NONCE_BYTES};
  return mlxd_hmac_sha256(key, MLXD_KEY_BYTES, parts, lens, 5, out);
}

int mlxd_hs_mac_refusal(const unsigned char* key, const unsigned char* token, int size, int nconn,
                        int conn, int rank_connector, int rank_acceptor,
                        const unsigned char* nonce_connector, const unsigned char* nonce_acceptor,
                        const unsigned char* rest, size_t rest_len,
                        unsigned char out[MLXD_HS_MAC_BYTES]) {
  if (!key) {
    memset(out, 0, MLXD_HS_MAC_BYTES);
    return 0;
  }
  static const char L_REFUSAL[] = "mlxdist ring handshake v2: refusal";
  unsigned char ints[20];
  mac_ints(ints, size, nconn, conn, rank_connector, rank_acceptor);
  const void* parts[6] = {L_REFUSAL, token, ints, nonce_connector, nonce_acceptor, rest};
  const size_t lens[6] = {sizeof L_REFUSAL,    MLXD_HS_TOKEN_BYTES, sizeof ints,
                          MLXD_HS_NONCE_BYTES, MLXD_HS_NONCE_BYTES, rest_len};
  return mlxd_hmac_sha256(key, MLXD_KEY_BYTES, parts, lens, 6, out);
}

bool mlxd_hs_mac_equal(const unsigned char* a, const unsigned char* b) {
  return mlxd_ct_equal(a, b, MLXD_HS_MAC_BYTES);
}

/* ---- the job token ---- */

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

int mlxd_hs_token_parse(const char* hex, unsigned char out[MLXD_HS_TOKEN_BYTES]) {
  if (!hex || strlen(hex) != 2 * MLXD_HS_TOKEN_BYTES) return -1;
  for (int i = 0; i < MLXD_HS_TOKEN_BYTES; i++) {
    int hi = hexval(hex[2 * i]), lo = hexval(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return -1;
    out[i] = (unsigned char)(hi << 4 | lo);
  }
  return 0;
}

void mlxd_hs_token_hex(const unsigned char token[MLXD_HS_TOKEN_BYTES], char* buf) {
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < MLXD_HS_TOKEN_BYTES; i++) {
    buf[2 * i] = digits[token[i] >> 4];
    buf[2 * i + 1] = digits[token[i] & 15];
  }
  buf[2 * MLXD_HS_TOKEN_BYTES] = '\0';
}

/* SHA-256 of label (with its NUL) and body, truncated to a token. */
static void token_of(const char* label, const unsigned char* body, size_t len,
                     unsigned char out[MLXD_HS_TOKEN_BYTES]) {
  /* one pass through a small buffer is enough for the label; the body is hashed with it */
  unsigned char lh[MLXD_KEY_BYTES], bh[MLXD_KEY_BYTES], both[2 * MLXD_KEY_BYTES];
  mlxd_sha256(label, strlen(label) + 1, lh);
  mlxd_sha256(body, len, bh);
  memcpy(both, lh, sizeof lh);
  memcpy(both + sizeof lh, bh, sizeof bh);
  unsigned char full[MLXD_KEY_BYTES];
  mlxd_sha256(both, sizeof both, full);
  memcpy(out, full, MLXD_HS_TOKEN_BYTES);
}

_Static_assert(MLXD_HS_TOKEN_BYTES == MLXD_NET_TOKEN_BYTES, "the token has one size");

void mlxd_hs_token_hosts(const mlxd_net_hosts* h, unsigned char out[MLXD_HS_TOKEN_BYTES]) {
  /* Each address as family (1), port (2) and the address bytes (16, IPv4 in the
   * first 4): the resolved form, so spelling ("localhost" or "127.0.0.1") does
   * not matter, only where the ranks listen. */
  const size_t per = 19, n = (size_t)h->size * (size_t)h->nconn;
  unsigned char head[8];
  mlxd_put32(head, (uint32_t)h->size);
  mlxd_put32(head + 4, (uint32_t)h->nconn);
  unsigned char acc[MLXD_KEY_BYTES];
  mlxd_sha256(head, sizeof head, acc);
  for (size_t i = 0; i < n; i++) { /* a chain of hashes: no buffer sized by the group */
    unsigned char buf[MLXD_KEY_BYTES + 19];
    memset(buf, 0, sizeof buf);
    memcpy(buf, acc, sizeof acc);
    unsigned char* p = buf + sizeof acc;
    const struct sockaddr_storage* sa = &h->addrs[i].sa;
    if (sa->ss_family == AF_INET) {
      const struct sockaddr_in* in = (const void*)sa;
      p[0] = 4;
      memcpy(p + 1, &in->sin_port, 2);
      memcpy(p + 3, &in->sin_addr, 4);
    } else if (sa->ss_family == AF_INET6) {
      const struct sockaddr_in6* in6 = (const void*)sa;
      p[0] = 6;
      memcpy(p + 1, &in6->sin6_port, 2);
      memcpy(p + 3, &in6->sin6_addr, 16);
    }
    mlxd_sha256(buf, sizeof acc + per, acc);
  }
  token_of("mlxdist job token v1: hostfile", acc, sizeof acc, out);
}

void mlxd_hs_token_records(const unsigned char* recs, size_t len,
                           unsigned char out[MLXD_HS_TOKEN_BYTES]) {
  token_of("mlxdist job token v1: bootstrap records", recs, len, out);
}

void mlxd_hs_token_split(const unsigned char parent[MLXD_HS_TOKEN_BYTES], uint64_t seq, int color,
                         unsigned char out[MLXD_HS_TOKEN_BYTES]) {
  unsigned char body[MLXD_HS_TOKEN_BYTES + 12];
  memcpy(body, parent, MLXD_HS_TOKEN_BYTES);
  mlxd_put32(body + MLXD_HS_TOKEN_BYTES, (uint32_t)(seq >> 32));
  mlxd_put32(body + MLXD_HS_TOKEN_BYTES + 4, (uint32_t)seq);
  mlxd_put32(body + MLXD_HS_TOKEN_BYTES + 8, (uint32_t)color);
  token_of("mlxdist job token v1: split", body, sizeof body, out);
}
