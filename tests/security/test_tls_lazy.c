/* TLS on lazy connections (MLXDIST_TLS=1 with MLXDIST_CONNECT=lazy; issue
 * 25, docs/security.md "Encryption"): ranks are real processes with real
 * listeners on 127.0.0.1, the ring's address book, the ring's dialer
 * (net/mesh.c) and the lazy TCP transport, keyed from a private secret file.
 * A connection exists only once an op named its peer; its TLS handshake
 * follows the ring's own (tcp_tls.c).
 *   ring      8 ranks, each sends to its right neighbour and receives from
 *             its left (both ends want each other at once), twice: right
 *             bytes, exactly 2 connections per rank, to the neighbours
 *   pairs     8 ranks, 2 connections per peer, partners r^1, r^2, r^4 in turn:
 *             right bytes, 6 connections each
 *   intruder  3 ranks; rank 1's listener gets, while the group lives and
 *             before any connection: garbage (a TLS ClientHello, not the
 *             ring's hello), another job's hello (wrong token), the job's
 *             token claiming rank 0 without the secret's proof; each is
 *             refused by rank 1 with the ring's line and ranks 0 and 1
 *             exchange over TLS; then a rank with another secret wants rank
 *             1: its op fails naming rank 1 (the proof did not match), rank 1
 *             refuses it, logs it, and goes on with rank 0; rank 1 holds 1
 *             connection
 *   mismatch  2 ranks whose ring handshake passes but whose TLS cannot:
 *             keys (rank 1 proves the handshake's secret but keys TLS from
 *             another file, as a party that took over the stream after the
 *             handshake would): both fail naming each other, in seconds;
 *             half (rank 1 runs without TLS): both fail naming each other;
 *             silent (rank 1 is a hand-made peer that completes the ring's
 *             handshake and then never speaks TLS): rank 0 fails after
 *             MLXDIST_CONNECT_TIMEOUT (4 s) naming rank 1 and the bound */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/net.h"
#include "ranks.h"
#include "testutil.h"
#include "transport/tcp.h"
#include "transports.h"

#define MAXN 8

typedef struct {
  int n, k;
  int lfds[MAXN * 2];
  mlxd_net_hosts hosts;
  unsigned char token[MLXD_NET_TOKEN_BYTES];
  char dir[64];
  char secret_a[128], secret_b[128];
  const char* sub; /* mismatch: keys, half, silent */
} ctx;

static void write_secret(const char* path, const char* text) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  T_REQUIRE(fd >= 0);
  T_REQUIRE(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
  close(fd);
}

static void listen_all(ctx* x) {
  x->hosts.size = x->n;
  x->hosts.nconn = x->k;
  free(x->hosts.addrs);
  x->hosts.addrs = calloc((size_t)(x->n * x->k), sizeof *x->hosts.addrs);
  T_REQUIRE(x->hosts.addrs != NULL);
  for (int i = 0; i < x->n * x->k; i++) {
    char why[100];
    mlxd_net_addr* a = &x->hosts.addrs[i];
    T_REQUIRE(mlxd_net_parse_addr("127.0.0.1:0", true, a, why, sizeof why) == 0);
    mlxd_status st;
    mlxd_status_clear(&st);
    T_REQUIREF(mlxd_net_listen(a, &x->lfds[i], &st) == 0, "listen: %s", st.msg);
  }
}

/* The job's auth as a rank loads it: the token, the key of MLXDIST_SECRET_FILE=secret. */
static mlxd_net_auth load_auth(const ctx* x, const char* secret) {
  mlxd_net_auth a;
  mlxd_status st;
  mlxd_status_clear(&st);
  setenv("MLXDIST_SECRET_FILE", secret, 1);
  T_REQUIREF(mlxd_net_auth_load(&a, &st) == 0, "secret: %s", st.msg);
  memcpy(a.token, x->token, sizeof a.token);
  return a;
}

/* Keep only this rank's listeners (the dialer's from here on). */
static void own_listeners(ctx* x, int rank, int* mine) {
  for (int c = 0; c < 2; c++) mine[c] = -1;
  for (int i = 0; i < x->n * x->k; i++) {
    if (i / x->k == rank)
      mine[i % x->k] = x->lfds[i];
    else if (x->lfds[i] >= 0)
      close(x->lfds[i]);
    x->lfds[i] = -1;
  }
}

/* This rank's lazy transport with TLS (MLXDIST_TLS=1, MLXDIST_SECRET_FILE=tls_secret),
 * its handshake keyed by auth. */
static mlxd_transport* open_lazy(ctx* x, int rank, const mlxd_net_auth* auth,
                                 const char* tls_secret, const char* tls) {
  int mine[2];
  own_listeners(x, rank, mine);
  setenv("MLXDIST_TLS", tls, 1);
  setenv("MLXDIST_SECRET_FILE", tls_secret, 1);
  mlxd_status st;
  mlxd_status_clear(&st);
  struct mlxd_tcp_dialer* d = mlxd_net_dialer_new(rank, &x->hosts, mine, auth, &st);
  T_REQUIREF(d != NULL, "dialer: %s", st.msg);
  mlxd_transport* t = mlxd_tcp_transport_lazy(rank, x->n, x->k, d, &st);
  T_REQUIREF(t != NULL, "lazy transport: %s", st.msg);
  T_CHECK_EQ(mlxd_tcp_connections(t, NULL), 0);
  return t;
}

/* Send to `to` and receive from `from` (64 KiB + rank-dependent bytes); st gets the failure. */
static int exchange(mlxd_transport* t, int to, int from, unsigned step, mlxd_status* st) {
  enum { N = 65536 + 3 };
  static unsigned char out[N], in[N];
  for (int i = 0; i < N; i++) out[i] = (unsigned char)(t->rank * 31 + i + step);
  mlxd_req* r[2] = {NULL, NULL};
  mlxd_status_clear(st);
  uint64_t tag = mlxd_tag(MLXD_TAG_P2P, 7, step);
  int rc = t->ops->irecv(t, from, tag, NULL, in, N, &r[0], st);
  if (rc == 0) rc = t->ops->isend(t, to, tag, NULL, out, N, &r[1], st);
  int w = t->ops->waitall(t, r, 2, rc == 0 ? st : NULL);
  if (rc == 0) rc = w;
  for (int i = 0; rc == 0 && i < N; i++)
    if (in[i] != (unsigned char)(from * 31 + i + step)) {
      T_CHECKF(false, "rank %d: byte %d from rank %d is wrong", t->rank, i, from);
      break;
    }
  return rc;
}

static int rank_ring(int rank, int size, const char* session, void* arg) {
  (void)session;
  ctx* x = arg;
  mlxd_net_auth a = load_auth(x, x->secret_a);
  mlxd_transport* t = open_lazy(x, rank, &a, x->secret_a, "1");
  mlxd_status st;
  for (unsigned step = 1; step <= 2; step++) {
    int rc = exchange(t, (rank + 1) % size, (rank + size - 1) % size, step, &st);
    T_CHECKF(rc == 0, "rank %d: neighbour exchange %u: %s", rank, step, st.msg);
  }
  unsigned char on[MAXN] = {0};
  int n = mlxd_tcp_connections(t, on);
  T_CHECKF(n == 2, "rank %d holds %d connections, expected 2 (its neighbours)", rank, n);
  T_CHECK(on[(rank + 1) % size] && on[(rank + size - 1) % size]);
  t->ops->destroy(t);
  return t_exit_status();
}

static int rank_pairs(int rank, int size, const char* session, void* arg) {
  (void)session;
  (void)size;
  ctx* x = arg;
  mlxd_net_auth a = load_auth(x, x->secret_a);
  mlxd_transport* t = open_lazy(x, rank, &a, x->secret_a, "1");
  mlxd_status st;
  for (unsigned b = 1; b < 8; b <<= 1) {
    int rc = exchange(t, rank ^ (int)b, rank ^ (int)b, b, &st);
    T_CHECKF(rc == 0, "rank %d: exchange with rank %d: %s", rank, rank ^ (int)b, st.msg);
  }
  int n = mlxd_tcp_connections(t, NULL);
  T_CHECKF(n == 3 * x->k, "rank %d holds %d connections, expected %d", rank, n, 3 * x->k);
  t->ops->destroy(t);
  return t_exit_status();
}

static int connect_to(const mlxd_net_addr* a) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (connect(fd, (const struct sockaddr*)&a->sa, a->len) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

/* Connect to a and send len bytes; the socket, or -1. */
static int send_raw(const mlxd_net_addr* a, const void* buf, size_t len) {
  int fd = connect_to(a);
  if (fd >= 0 && write(fd, buf, len) != (ssize_t)len) {
    close(fd);
    return -1;
  }
  return fd;
}

/* A hello of this group's shape (rank claim, n ranks, one connection). */
static void hello_of(const ctx* x, unsigned char* out, int claim, const unsigned char* token,
                     unsigned flags) {
  mlxd_hs_msg h;
  memset(&h, 0, sizeof h);
  h.rank = (uint32_t)claim;
  h.size = (uint32_t)x->n;
  h.conn = 0;
  h.nconn = (uint32_t)x->k;
  h.flags = flags;
  memcpy(h.token, token, sizeof h.token);
  for (size_t i = 0; i < sizeof h.nonce; i++) h.nonce[i] = (unsigned char)(i * 7 + 1);
  mlxd_hs_encode_hello(out, &h);
}

static int rank_intruder(int rank, int size, const char* session, void* arg) {
  (void)session;
  (void)size;
  ctx* x = arg;
  t_rank_log_to(x->dir, rank);
  setenv("MLXDIST_CONNECT_TIMEOUT", "10", 1); /* the refusal is immediate; room for a loaded host */
  if (rank == 2) { /* holds the job's token but another secret: wants rank 1 */
    mlxd_net_auth other = load_auth(x, x->secret_b);
    mlxd_transport* t = open_lazy(x, rank, &other, x->secret_b, "1");
    t_wait_mark(x->dir, "exchanged", 30); /* after the intruders and the honest exchange */
    double t0 = t_now();
    unsigned char b[4] = {0};
    mlxd_req* r = NULL;
    mlxd_status st;
    mlxd_status_clear(&st);
    int rc = t->ops->isend(t, 1, mlxd_tag(MLXD_TAG_P2P, 9, 0), NULL, b, 4, &r, &st);
    if (rc == 0) rc = t->ops->waitall(t, &r, 1, &st);
    double took = t_now() - t0;
    T_CHECKF(rc != 0, "a rank with another secret connected to rank 1");
    T_CHECKF(t_status_names_peer(&st, 1), "the failure does not name rank 1: %s", st.msg);
    T_CHECKF(strstr(st.msg, "secret") != NULL, "the failure does not say secret: %s", st.msg);
    T_CHECKF(took < 5, "the failure took %.1f s (a wrong proof fails at once)", took);
    fprintf(stderr, "[test] rank 2 failed as expected in %.2f s: %s\n", took, st.msg);
    t_mark(x->dir, "tried");
    t->ops->destroy(t);
    return t_exit_status();
  }
  mlxd_net_auth a = load_auth(x, x->secret_a);
  const mlxd_net_addr* at1 = &x->hosts.addrs[1 * x->k];
  mlxd_net_addr target = *at1; /* rank 0 keeps rank 1's address for the intruders */
  mlxd_transport* t = open_lazy(x, rank, &a, x->secret_a, "1");
  int fds[3] = {-1, -1, -1};
  if (rank == 0) {
    /* A TLS 1.3 ClientHello's first bytes (record header, handshake type) and more. */
    unsigned char hello_tls[80] = {0x16, 0x03, 0x01, 0x00, 0x4b, 0x01,
                                   0x00, 0x00, 0x47, 0x03, 0x03};
    unsigned char other[MLXD_HS_HELLO_BYTES], claim[MLXD_HS_HELLO_BYTES];
    unsigned char wrong[MLXD_NET_TOKEN_BYTES];
    memset(wrong, 0x77, sizeof wrong);
    hello_of(x, other, 0, wrong, MLXD_HS_FLAG_SECRET);
    hello_of(x, claim, 0, x->token, 0);
    fds[0] = send_raw(&target, hello_tls, sizeof hello_tls);
    fds[1] = send_raw(&target, other, sizeof other);
    fds[2] = send_raw(&target, claim, sizeof claim);
    for (int i = 0; i < 3; i++) T_CHECKF(fds[i] >= 0, "intruder %d could not connect", i);
    usleep(100000);
  }
  mlxd_status st;
  int rc = exchange(t, 1 - rank, 1 - rank, 3, &st);
  T_CHECKF(rc == 0, "rank %d: exchange over TLS with the intruders around: %s", rank, st.msg);
  unsigned char b[4] = {1, 2, 3, 4};
  mlxd_req* r = NULL;
  mlxd_status_clear(&st);
  if (rank == 1) { /* rank 2 tries meanwhile: this rank's progress answers it */
    t_mark(x->dir, "exchanged");
    T_REQUIRE(t->ops->irecv(t, 0, mlxd_tag(MLXD_TAG_P2P, 11, 0), NULL, b, 4, &r, &st) == 0);
    rc = t->ops->waitall(t, &r, 1, &st);
    T_CHECKF(rc == 0, "rank 1 after rank 2's attempt: %s", st.msg);
    unsigned char on[MAXN] = {0};
    int n = mlxd_tcp_connections(t, on);
    T_CHECKF(n == 1 && on[0], "rank 1 holds %d connections, expected 1 (rank 0)", n);
  } else {
    t_wait_mark(x->dir, "tried", 30); /* rank 1 stays in its receive until rank 2 has tried */
    T_REQUIRE(t->ops->isend(t, 1, mlxd_tag(MLXD_TAG_P2P, 11, 0), NULL, b, 4, &r, &st) == 0);
    rc = t->ops->waitall(t, &r, 1, &st);
    T_CHECKF(rc == 0, "rank 0's last send: %s", st.msg);
  }
  for (int i = 0; i < 3; i++)
    if (fds[i] >= 0) close(fds[i]);
  t->ops->destroy(t);
  return t_exit_status();
}

/* ---- mismatch ---- */

/* A hand-made rank 1: completes the ring's handshake with rank 0 (connector,
 * with the secret's proof), then never says a word of TLS; holds the
 * connection until rank 0 closes it. */
static int fake_rank1(ctx* x, const mlxd_net_auth* a) {
  int fd = connect_to(&x->hosts.addrs[0]);
  T_REQUIRE(fd >= 0);
  mlxd_hs_msg h;
  memset(&h, 0, sizeof h);
  h.rank = 1;
  h.size = (uint32_t)x->n;
  h.conn = 0;
  h.nconn = (uint32_t)x->k;
  h.flags = MLXD_HS_FLAG_SECRET;
  memcpy(h.token, a->token, sizeof h.token);
  for (size_t i = 0; i < sizeof h.nonce; i++) h.nonce[i] = (unsigned char)(i * 13 + 5);
  unsigned char hello[MLXD_HS_HELLO_BYTES], reply[MLXD_HS_REPLY_BYTES], conf[MLXD_HS_CONFIRM_BYTES];
  mlxd_hs_encode_hello(hello, &h);
  T_REQUIRE(write(fd, hello, sizeof hello) == (ssize_t)sizeof hello);
  size_t got = 0;
  while (got < sizeof reply) {
    ssize_t k = read(fd, reply + got, sizeof reply - got);
    T_REQUIREF(k > 0, "rank 0 closed the hand-made handshake (%zd)", k);
    got += (size_t)k;
  }
  mlxd_hs_expect ex = {1, x->n, x->k, a->token, true, true};
  mlxd_hs_msg r;
  T_REQUIRE(mlxd_hs_check_reply(reply, got, &ex, 0, 0, &r) == MLXD_HS_OK);
  unsigned char mac[MLXD_HS_MAC_BYTES];
  T_REQUIRE(mlxd_hs_mac(a->key, true, a->token, x->n, x->k, 0, 1, 0, h.nonce, r.nonce, mac) == 0);
  mlxd_hs_encode_confirm(conf, mac);
  T_REQUIRE(write(fd, conf, sizeof conf) == (ssize_t)sizeof conf);
  char sink[256];
  while (read(fd, sink, sizeof sink) > 0) {
  }
  close(fd);
  return t_exit_status();
}

static int rank_mismatch(int rank, int size, const char* session, void* arg) {
  (void)session;
  (void)size;
  ctx* x = arg;
  bool silent = strcmp(x->sub, "silent") == 0;
  /* silent: the bound is what is measured; else a failure that is immediate once connected
   * (and room for the ring's handshake on a loaded host, under a sanitizer) */
  setenv("MLXDIST_CONNECT_TIMEOUT", silent ? "4" : "10", 1);
  setenv("MLXDIST_TIMEOUT", "20", 1);
  mlxd_net_auth a = load_auth(x, x->secret_a);
  if (rank == 1 && silent) {
    int mine[2];
    own_listeners(x, rank, mine);
    if (mine[0] >= 0) close(mine[0]);
    /* rank 0 listens already: its listener is open since before the fork */
    return fake_rank1(x, &a);
  }
  const char* tls = rank == 1 && strcmp(x->sub, "half") == 0 ? "0" : "1";
  const char* tls_secret = rank == 1 && strcmp(x->sub, "keys") == 0 ? x->secret_b : x->secret_a;
  mlxd_transport* t = open_lazy(x, rank, &a, tls_secret, tls);
  double t0 = t_now();
  mlxd_status st;
  int rc = exchange(t, 1 - rank, 1 - rank, 5, &st);
  double took = t_now() - t0;
  T_CHECKF(rc != 0, "rank %d: the exchange succeeded (%s)", rank, x->sub);
  if (rc != 0) {
    T_CHECKF(t_status_names_peer(&st, 1 - rank), "rank %d: the failure does not name rank %d: %s",
             rank, 1 - rank, st.msg);
    if (strcmp(tls, "1") == 0) {
      char want[64];
      snprintf(want, sizeof want, "TLS handshake with rank %d", 1 - rank);
      T_CHECKF(strstr(st.msg, want) != NULL, "rank %d: the failure lacks '%s': %s", rank, want,
               st.msg);
    }
    if (silent) {
      T_CHECKF(strstr(st.msg, "MLXDIST_CONNECT_TIMEOUT") != NULL && took >= 3.5,
               "rank 0: not the handshake's bound (%.1f s): %s", took, st.msg);
    } else if (strcmp(x->sub, "keys") == 0) {
      T_CHECKF(strstr(st.msg, "MLXDIST_SECRET_FILE") != NULL, "rank %d: %s", rank, st.msg);
    }
    T_CHECKF(took < 9, "rank %d: the failure took %.1f s", rank, took);
    fprintf(stderr, "[test] %s: rank %d failed as expected in %.2f s: %s\n", x->sub, rank, took,
            st.msg);
  }
  t->ops->destroy(t);
  return t_exit_status();
}

/* The parent's copies of the ranks' listeners. */
static void close_parent(void* arg) {
  ctx* x = arg;
  for (int i = 0; i < MAXN * 2; i++)
    if (x->lfds[i] >= 0) close(x->lfds[i]);
  for (int i = 0; i < MAXN * 2; i++) x->lfds[i] = -1;
}

static void run(ctx* x, t_rank_fn fn, const char* what) {
  for (int i = 0; i < MAXN * 2; i++) x->lfds[i] = -1;
  listen_all(x);
  t_ranks_opts o = {.timeout_s = 60, .grace_s = 15, .after_fork = close_parent, .what = what};
  int bad = t_run_ranks(x->n, fn, x, &o, NULL);
  T_CHECKF(bad == 0, "%s: %d rank(s) failed", what, bad);
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "ring";
  signal(SIGPIPE, SIG_IGN);
  ctx x;
  memset(&x, 0, sizeof x);
  x.n = 8;
  x.k = 1;
  memset(x.token, 0x5a, sizeof x.token);
  snprintf(x.dir, sizeof x.dir, "/tmp/test_tls_lazy.XXXXXX");
  T_REQUIRE(mkdtemp(x.dir) != NULL);
  snprintf(x.secret_a, sizeof x.secret_a, "%s/a.secret", x.dir);
  snprintf(x.secret_b, sizeof x.secret_b, "%s/b.secret", x.dir);
  write_secret(x.secret_a, "0123456789abcdef-the-first-secret");
  write_secret(x.secret_b, "0123456789abcdef-another-secret!!");
  unsetenv("MLXDIST_CONNECT");
  if (strcmp(mode, "ring") == 0) {
    run(&x, rank_ring, "lazy TLS neighbour exchange");
  } else if (strcmp(mode, "pairs") == 0) {
    x.k = 2;
    run(&x, rank_pairs, "lazy TLS pairs, 2 connections each");
  } else if (strcmp(mode, "intruder") == 0) {
    x.n = 3;
    run(&x, rank_intruder, "lazy TLS with intruders");
    const char* log1 = t_rank_log(x.dir, 1);
    fprintf(stderr, "rank 1's stderr:\n%s", log1);
    const char* want[] = {mlxd_hs_reason(MLXD_HS_MAGIC), mlxd_hs_reason(MLXD_HS_TOKEN),
                          mlxd_hs_reason(MLXD_HS_NO_SECRET), mlxd_hs_reason(MLXD_HS_MAC_E)};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
      T_CHECKF(strstr(log1, want[i]) != NULL, "rank 1 did not log a refusal for '%s'", want[i]);
    T_CHECKF(strstr(log1, "refused a connection from 127.0.0.1") != NULL,
             "rank 1's refusals are not the ring's lines");
    fprintf(stderr, "rank 2's stderr:\n%s", t_rank_log(x.dir, 2));
  } else if (strcmp(mode, "mismatch") == 0) {
    x.n = 2;
    const char* subs[] = {"keys", "half", "silent"};
    for (int i = 0; i < 3; i++) {
      x.sub = subs[i];
      run(&x, rank_mismatch, subs[i]);
    }
  } else {
    fprintf(stderr, "usage: test_tls_lazy ring|pairs|intruder|mismatch\n");
    return 2;
  }
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", x.dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", x.dir);
  free(x.hosts.addrs);
  if (t_exit_status() == 0) printf("%s: ok\n", mode);
  return t_exit_status();
}
