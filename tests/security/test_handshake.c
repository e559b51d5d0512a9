/* The connection handshake's pure functions (net/handshake.h): every
 * message round-trips, every refusal has its reason, a MAC depends on every
 * field of the transcript, and the job tokens are shared where they must be
 * and differ where they must. */
#include <arpa/inet.h>
#include <string.h>

#include "net/net.h"
#include "testutil.h"

static const unsigned char TOK[MLXD_HS_TOKEN_BYTES] = {9, 8, 7, 6, 5, 4, 3, 2,
                                                       1, 0, 1, 2, 3, 4, 5, 6};

static mlxd_hs_msg msg(int rank, int size, int conn, int nconn, unsigned flags) {
  mlxd_hs_msg m;
  memset(&m, 0, sizeof m);
  m.rank = (uint32_t)rank;
  m.size = (uint32_t)size;
  m.conn = (uint32_t)conn;
  m.nconn = (uint32_t)nconn;
  m.flags = flags;
  memcpy(m.token, TOK, sizeof TOK);
  for (int i = 0; i < MLXD_HS_NONCE_BYTES; i++) m.nonce[i] = (unsigned char)(3 * i + 1);
  for (int i = 0; i < MLXD_HS_MAC_BYTES; i++) m.mac[i] = (unsigned char)(5 * i + 2);
  return m;
}

static mlxd_hs_err hello_err(mlxd_hs_msg m, const mlxd_hs_expect* e) {
  unsigned char b[MLXD_HS_HELLO_BYTES];
  mlxd_hs_encode_hello(b, &m);
  mlxd_hs_msg out;
  return mlxd_hs_check_hello(b, sizeof b, e, &out);
}

static void messages(void) {
  mlxd_hs_expect e = {1, 4, 2, TOK, false, false};
  unsigned char b[MLXD_HS_REPLY_BYTES];
  mlxd_hs_msg m = msg(3, 4, 1, 2, 0), out;
  mlxd_hs_encode_hello(b, &m);
  T_EQ_INT(mlxd_hs_check_hello(b, MLXD_HS_HELLO_BYTES, &e, &out), MLXD_HS_OK);
  T_CHECK(out.rank == 3 && out.conn == 1 && memcmp(out.nonce, m.nonce, sizeof m.nonce) == 0);
  /* short, garbage, version, flags */
  T_EQ_INT(mlxd_hs_check_hello(b, MLXD_HS_HELLO_BYTES - 1, &e, &out), MLXD_HS_SHORT);
  b[0] ^= 1;
  T_EQ_INT(mlxd_hs_check_hello(b, MLXD_HS_HELLO_BYTES, &e, &out), MLXD_HS_MAGIC);
  T_EQ_INT(mlxd_hs_check_hello(b, 4, &e, &out), MLXD_HS_MAGIC); /* known from 4 bytes */
  b[0] ^= 1;
  b[5] ^= 1;
  T_EQ_INT(mlxd_hs_check_hello(b, MLXD_HS_HELLO_BYTES, &e, &out), MLXD_HS_VERSION_E);
  b[5] ^= 1;
  T_EQ_INT(hello_err(msg(3, 4, 1, 2, 2), &e), MLXD_HS_FLAGS);
  /* token first: another job with another shape is "another job" */
  mlxd_hs_msg other = msg(3, 9, 1, 2, 0);
  other.token[15] ^= 1;
  T_EQ_INT(hello_err(other, &e), MLXD_HS_TOKEN);
  T_EQ_INT(hello_err(msg(3, 5, 1, 2, 0), &e), MLXD_HS_SIZE);
  T_EQ_INT(hello_err(msg(3, 4, 1, 3, 0), &e), MLXD_HS_SIZE);
  T_EQ_INT(hello_err(msg(1, 4, 1, 2, 0), &e), MLXD_HS_RANK); /* itself */
  T_EQ_INT(hello_err(msg(0, 4, 1, 2, 0), &e), MLXD_HS_RANK); /* a lower rank */
  T_EQ_INT(hello_err(msg(4, 4, 1, 2, 0), &e), MLXD_HS_RANK); /* out of range */
  T_EQ_INT(hello_err(msg(2, 4, 2, 2, 0), &e), MLXD_HS_CONN);
  T_EQ_INT(hello_err(msg(2, 4, 0, 2, MLXD_HS_FLAG_SECRET), &e), MLXD_HS_SECRET);
  mlxd_hs_expect es = e;
  es.secret = true;
  T_EQ_INT(hello_err(msg(2, 4, 0, 2, 0), &es), MLXD_HS_NO_SECRET);
  T_EQ_INT(hello_err(msg(2, 4, 0, 2, MLXD_HS_FLAG_SECRET), &es), MLXD_HS_OK);

  /* the reply: from the peer asked, for the connection asked, the MAC carried */
  mlxd_hs_expect ec = {3, 4, 2, TOK, false, false};
  m = msg(1, 4, 1, 2, 0);
  mlxd_hs_encode_reply(b, &m);
  T_EQ_INT(mlxd_hs_check_reply(b, sizeof b, &ec, 1, 1, &out), MLXD_HS_OK);
  T_CHECK(memcmp(out.mac, m.mac, sizeof m.mac) == 0);
  T_EQ_INT(mlxd_hs_check_reply(b, sizeof b, &ec, 0, 1, &out), MLXD_HS_RANK);
  T_EQ_INT(mlxd_hs_check_reply(b, sizeof b, &ec, 1, 0, &out), MLXD_HS_CONN);
  T_EQ_INT(mlxd_hs_check_reply(b, sizeof b - 1, &ec, 1, 1, &out), MLXD_HS_SHORT);
  T_EQ_INT(mlxd_hs_check_hello(b, sizeof b, &ec, &out), MLXD_HS_MAGIC); /* a reply is no hello */

  /* the confirm */
  unsigned char mac[MLXD_HS_MAC_BYTES], c[MLXD_HS_CONFIRM_BYTES];
  memset(mac, 0x3c, sizeof mac);
  mlxd_hs_encode_confirm(c, mac);
  T_EQ_INT(mlxd_hs_check_confirm(c, sizeof c, mac), MLXD_HS_OK);
  mac[31] ^= 1;
  T_EQ_INT(mlxd_hs_check_confirm(c, sizeof c, mac), MLXD_HS_MAC_E);
  c[7] = 1;
  T_EQ_INT(mlxd_hs_check_confirm(c, sizeof c, mac), MLXD_HS_RESERVED_E);
  for (int r = 0; r <= MLXD_HS_REFUSAL_E; r++) T_CHECK(strlen(mlxd_hs_reason(r)) > 1);
}

/* The refusal: the reply's checks, a known reason, a bounded body, its
 * length told by its head; its MAC covers the reason and the body. */
static void refusals(void) {
  mlxd_hs_expect ec = {3, 4, 2, TOK, false, false};
  mlxd_hs_msg m = msg(1, 4, 1, 2, 0), out;
  unsigned char b[MLXD_HS_REFUSAL_MAX], body[40];
  for (size_t i = 0; i < sizeof body; i++) body[i] = (unsigned char)('a' + i % 26);
  size_t n = mlxd_hs_encode_refusal(b, &m, MLXD_HS_REFUSE_FAILED, body, sizeof body);
  T_EQ_INT((int)n, MLXD_HS_REFUSAL_HEAD + (int)sizeof body);
  T_CHECK(mlxd_hs_is_refusal(b, 4));
  unsigned kind = 0;
  const unsigned char* got = NULL;
  size_t glen = 0, need = 0;
  T_EQ_INT(mlxd_hs_check_refusal(b, n, &ec, 1, 1, &out, &need, &kind, &got, &glen), MLXD_HS_OK);
  T_CHECK(kind == MLXD_HS_REFUSE_FAILED && glen == sizeof body && got == b + MLXD_HS_REFUSAL_HEAD);
  T_CHECK(memcmp(out.mac, m.mac, sizeof m.mac) == 0);
  /* short: the head first, then as much as it says */
  T_EQ_INT(mlxd_hs_check_refusal(b, 50, &ec, 1, 1, &out, &need, NULL, NULL, NULL), MLXD_HS_SHORT);
  T_EQ_INT((int)need, MLXD_HS_REFUSAL_HEAD);
  T_EQ_INT(mlxd_hs_check_refusal(b, n - 1, &ec, 1, 1, &out, &need, NULL, NULL, NULL),
           MLXD_HS_SHORT);
  T_EQ_INT((int)need, (int)n);
  T_EQ_INT(mlxd_hs_check_refusal(b, n, &ec, 0, 1, &out, NULL, NULL, NULL, NULL), MLXD_HS_RANK);
  T_EQ_INT(mlxd_hs_check_reply(b, n, &ec, 1, 1, &out), MLXD_HS_MAGIC); /* no reply */
  unsigned char tok2[MLXD_HS_TOKEN_BYTES];
  memcpy(tok2, TOK, sizeof tok2);
  tok2[3] ^= 1;
  mlxd_hs_expect eo = ec;
  eo.token = tok2;
  T_EQ_INT(mlxd_hs_check_refusal(b, n, &eo, 1, 1, &out, NULL, NULL, NULL, NULL), MLXD_HS_TOKEN);
  /* a length past the bound is refused before anything is read on */
  unsigned char bad[MLXD_HS_REFUSAL_MAX];
  memcpy(bad, b, n);
  bad[106] = 0xff;
  bad[107] = 0xff;
  T_EQ_INT(mlxd_hs_check_refusal(bad, MLXD_HS_REFUSAL_HEAD, &ec, 1, 1, &out, &need, NULL, NULL,
                                 NULL),
           MLXD_HS_REFUSAL_E);
  memcpy(bad, b, n);
  bad[105] = 7; /* an unknown reason */
  T_EQ_INT(mlxd_hs_check_refusal(bad, n, &ec, 1, 1, &out, NULL, NULL, NULL, NULL),
           MLXD_HS_REFUSAL_E);
  /* closing carries nothing; failed carries something */
  n = mlxd_hs_encode_refusal(b, &m, MLXD_HS_REFUSE_CLOSING, NULL, 0);
  T_EQ_INT(mlxd_hs_check_refusal(b, n, &ec, 1, 1, &out, NULL, &kind, NULL, &glen), MLXD_HS_OK);
  T_CHECK(kind == MLXD_HS_REFUSE_CLOSING && glen == 0);
  n = mlxd_hs_encode_refusal(b, &m, MLXD_HS_REFUSE_CLOSING, body, 3);
  T_EQ_INT(mlxd_hs_check_refusal(b, n, &ec, 1, 1, &out, NULL, NULL, NULL, NULL), MLXD_HS_REFUSAL_E);
  n = mlxd_hs_encode_refusal(b, &m, MLXD_HS_REFUSE_FAILED, NULL, 0);
  T_EQ_INT(mlxd_hs_check_refusal(b, n, &ec, 1, 1, &out, NULL, NULL, NULL, NULL), MLXD_HS_REFUSAL_E);
  /* the MAC: keyed, and over the reason and the body */
  unsigned char key[32], nc[MLXD_HS_NONCE_BYTES], na[MLXD_HS_NONCE_BYTES], m1[32], m2[32];
  memset(key, 1, sizeof key);
  memset(nc, 4, sizeof nc);
  memset(na, 5, sizeof na);
  unsigned char rest[8] = {0, 1, 0, 4, 'a', 'b', 'c', 'd'};
  T_EQ_INT(mlxd_hs_mac_refusal(key, TOK, 4, 2, 1, 3, 1, nc, na, rest, sizeof rest, m1), 0);
  rest[7] ^= 1;
  T_EQ_INT(mlxd_hs_mac_refusal(key, TOK, 4, 2, 1, 3, 1, nc, na, rest, sizeof rest, m2), 0);
  T_CHECK(!mlxd_hs_mac_equal(m1, m2));
  T_EQ_INT(mlxd_hs_mac(key, false, TOK, 4, 2, 1, 3, 1, nc, na, m2), 0); /* not the reply's */
  T_CHECK(!mlxd_hs_mac_equal(m1, m2));
}

static void macs(void) {
  unsigned char key[32], key2[32], nc[MLXD_HS_NONCE_BYTES], na[MLXD_HS_NONCE_BYTES];
  memset(key, 1, sizeof key);
  memset(key2, 1, sizeof key2);
  key2[0] = 2;
  memset(nc, 4, sizeof nc);
  memset(na, 5, sizeof na);
  unsigned char base[32], v[32];
  T_EQ_INT(mlxd_hs_mac(key, true, TOK, 4, 2, 1, 3, 1, nc, na, base), 0);
  T_EQ_INT(mlxd_hs_mac(key, true, TOK, 4, 2, 1, 3, 1, nc, na, v), 0);
  T_CHECK(mlxd_hs_mac_equal(base, v));
  /* every input changes it: key, direction, token, size, nconn, conn, both ranks, both nonces */
  unsigned char tok2[MLXD_HS_TOKEN_BYTES];
  memcpy(tok2, TOK, sizeof tok2);
  tok2[0] ^= 1;
  unsigned char nc2[MLXD_HS_NONCE_BYTES];
  memcpy(nc2, nc, sizeof nc2);
  nc2[31] ^= 1;
  struct {
    const unsigned char* k;
    bool d;
    const unsigned char* t;
    int s, K, c, rc, ra;
    const unsigned char *n1, *n2;
  } vs[] = {{key2, true, TOK, 4, 2, 1, 3, 1, nc, na}, {key, false, TOK, 4, 2, 1, 3, 1, nc, na},
            {key, true, tok2, 4, 2, 1, 3, 1, nc, na}, {key, true, TOK, 5, 2, 1, 3, 1, nc, na},
            {key, true, TOK, 4, 3, 1, 3, 1, nc, na},  {key, true, TOK, 4, 2, 0, 3, 1, nc, na},
            {key, true, TOK, 4, 2, 1, 2, 1, nc, na},  {key, true, TOK, 4, 2, 1, 3, 0, nc, na},
            {key, true, TOK, 4, 2, 1, 3, 1, nc2, na}, {key, true, TOK, 4, 2, 1, 3, 1, nc, nc2},
            {key, true, TOK, 4, 2, 1, 3, 1, na, nc}};
  for (size_t i = 0; i < sizeof vs / sizeof vs[0]; i++) {
    T_EQ_INT(mlxd_hs_mac(vs[i].k, vs[i].d, vs[i].t, vs[i].s, vs[i].K, vs[i].c, vs[i].rc, vs[i].ra,
                         vs[i].n1, vs[i].n2, v),
             0);
    T_CHECKF(!mlxd_hs_mac_equal(base, v), "variant %zu gives the same MAC", i);
  }
  /* no key: zeros */
  T_EQ_INT(mlxd_hs_mac(NULL, true, TOK, 4, 2, 1, 3, 1, nc, na, v), 0);
  unsigned char zero[32] = {0};
  T_CHECK(memcmp(v, zero, 32) == 0);
}

static void set_addr(mlxd_net_addr* a, const char* ip, int port) {
  memset(a, 0, sizeof *a);
  struct sockaddr_in* in = (struct sockaddr_in*)(void*)&a->sa;
  in->sin_family = AF_INET;
  in->sin_port = htons((uint16_t)port);
  inet_pton(AF_INET, ip, &in->sin_addr);
  a->len = sizeof *in;
}

static void tokens(void) {
  unsigned char t[MLXD_HS_TOKEN_BYTES];
  char hex[2 * MLXD_HS_TOKEN_BYTES + 1];
  T_EQ_INT(mlxd_hs_token_parse("00112233445566778899AABBccddeeff", t), 0);
  mlxd_hs_token_hex(t, hex);
  T_CHECK(strcmp(hex, "00112233445566778899aabbccddeeff") == 0);
  T_CHECK(mlxd_hs_token_parse("00112233445566778899aabbccddeef", t) != 0);
  T_CHECK(mlxd_hs_token_parse("00112233445566778899aabbccddeeff0", t) != 0);
  T_CHECK(mlxd_hs_token_parse("0011223344556677889 aabbccddeeff", t) != 0);
  T_CHECK(mlxd_hs_token_parse("", t) != 0);

  mlxd_net_addr a[2], b[2];
  set_addr(&a[0], "127.0.0.1", 5000);
  set_addr(&a[1], "127.0.0.1", 5001);
  memcpy(b, a, sizeof a);
  snprintf(b[0].text, sizeof b[0].text, "localhost:5000"); /* spelling does not count */
  mlxd_net_hosts ha = {2, 1, a}, hb = {2, 1, b};
  unsigned char ta[MLXD_HS_TOKEN_BYTES], tb[MLXD_HS_TOKEN_BYTES];
  mlxd_hs_token_hosts(&ha, ta);
  mlxd_hs_token_hosts(&hb, tb);
  T_CHECK(memcmp(ta, tb, sizeof ta) == 0);
  set_addr(&b[1], "127.0.0.1", 5002);
  mlxd_hs_token_hosts(&hb, tb);
  T_CHECK(memcmp(ta, tb, sizeof ta) != 0);
  mlxd_net_hosts h1 = {1, 2, a}; /* the same addresses as one rank with two connections */
  mlxd_hs_token_hosts(&h1, tb);
  T_CHECK(memcmp(ta, tb, sizeof ta) != 0);

  unsigned char s1[MLXD_HS_TOKEN_BYTES], s2[MLXD_HS_TOKEN_BYTES], s3[MLXD_HS_TOKEN_BYTES];
  mlxd_hs_token_split(ta, 7, 0, s1);
  mlxd_hs_token_split(ta, 7, 1, s2);
  mlxd_hs_token_split(ta, 8, 0, s3);
  T_CHECK(memcmp(s1, s2, sizeof s1) != 0 && memcmp(s1, s3, sizeof s1) != 0);
  T_CHECK(memcmp(s1, ta, sizeof s1) != 0);
  mlxd_hs_token_split(ta, 7, 0, s2);
  T_CHECK(memcmp(s1, s2, sizeof s1) == 0);

  unsigned char recs[128] = {1}, r1[MLXD_HS_TOKEN_BYTES], r2[MLXD_HS_TOKEN_BYTES];
  mlxd_hs_token_records(recs, sizeof recs, r1);
  recs[100] = 1; /* another rank's nonce */
  mlxd_hs_token_records(recs, sizeof recs, r2);
  T_CHECK(memcmp(r1, r2, sizeof r1) != 0);
}

int main(void) {
  refusals();
  messages();
  macs();
  tokens();
  if (t_exit_status() == 0) printf("test_handshake: passed\n");
  return t_exit_status();
}
