/* Lazy TCP connections (issue 25; net/dialer.c, tcp.h's lazy
 * transport): ranks are real processes with real listening sockets on
 * 127.0.0.1 and the ring's address book; a connection exists only once an op
 * named its peer.
 *   ring      8 ranks, each sends to its right neighbour and receives from
 *             its left (both ends want each other at once: simultaneous
 *             connects): right bytes, and exactly 2 connections per rank,
 *             to the neighbours
 *   pairs     8 ranks, 2 connections per peer, partners r^1, r^2, r^4 in turn
 *             (both ends of every pair connect at once): 6 connections each
 *   intruder  2 ranks; a stranger with the wrong token connects to rank 1
 *             first: rank 1 refuses it with the ring's line, the ranks'
 *             exchange works; then a rank of another job (wrong token) wants
 *             rank 1: its op fails naming rank 1 within MLXDIST_CONNECT_TIMEOUT
 *   storm     32 ranks on one CPU (sched_setaffinity: starved, as at 256
 *             ranks on a loaded host), MLXDIST_CONNECT_TIMEOUT=20: every rank
 *             sends to and receives from every other at once, so every pair
 *             connects from both ends simultaneously, 3 rounds over the same
 *             connections: right bytes, exactly 31 connections each, and no
 *             rank loses a connection its peer kept (the race of two
 *             handshakes for one slot, docs/ring.md)
 *   never     rank 1 listens but never answers (no transport), rank 2 does not
 *             listen at all: rank 0's ops to each fail naming the peer within
 *             MLXDIST_CONNECT_TIMEOUT (2 s)
 *   quiet     honest jobs print nothing: 40 runs of 2 ranks and 10 of 4 (16
 *             and 4 with MLXDIST_TEST_LIGHT=1, as under TSan), every
 *             rank sending to and receiving from every other at once (both
 *             ends of every pair dial together, as a job's first collective
 *             does), each rank's stderr checked for "refused a connection"
 *             (the losing dial of such a pair used to be refused with "it had
 *             sent nothing when the set-up ended", about 1 run in 4) */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* sched_setaffinity */
#endif
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/net.h"
#include "ranks.h"
#include "testutil.h"
#include "transport/tcp.h"
#include "transports.h"

#define MAXN 32
#define NSET 3 /* groups (address books) a run can have: exit makes three */

typedef struct {
  int n, k;
  int g; /* the group's size (n, or n - 1 when the last process floods) */
  int nsets;
  int lfds_set[NSET][MAXN * 2];
  mlxd_net_hosts hosts_set[NSET];
  mlxd_net_auth auth;
  const char* mode;
  char logdir[64];
} ctx;

#define lfds lfds_set[0]
#define hosts hosts_set[0]

static void listen_all(ctx* x) {
  for (int s = 0; s < x->nsets; s++) {
    mlxd_net_hosts* h = &x->hosts_set[s];
    h->size = x->g;
    h->nconn = x->k;
    h->addrs = calloc((size_t)(x->g * x->k), sizeof *h->addrs);
    T_REQUIRE(h->addrs != NULL);
    for (int i = 0; i < x->g * x->k; i++) {
      char why[100];
      mlxd_net_addr* a = &h->addrs[i];
      T_REQUIRE(mlxd_net_parse_addr("127.0.0.1:0", true, a, why, sizeof why) == 0);
      mlxd_status st;
      mlxd_status_clear(&st);
      T_REQUIREF(mlxd_net_listen(a, &x->lfds_set[s][i], &st) == 0, "listen: %s", st.msg);
    }
  }
  memset(&x->auth, 0, sizeof x->auth);
  memset(x->auth.token, 0x5a, sizeof x->auth.token);
}

/* This rank's lazy transport of group set; the other ranks' listeners of
 * that set are closed here. */
static mlxd_transport* open_lazy_set(ctx* x, int set, int rank, const mlxd_net_auth* auth) {
  int mine[2] = {-1, -1};
  int* lf = x->lfds_set[set];
  for (int i = 0; i < x->g * x->k; i++) {
    if (i / x->k == rank)
      mine[i % x->k] = lf[i];
    else if (lf[i] >= 0)
      close(lf[i]);
    lf[i] = -1; /* the dialer's, or closed */
  }
  mlxd_status st;
  mlxd_status_clear(&st);
  struct mlxd_tcp_dialer* d = mlxd_net_dialer_new(rank, &x->hosts_set[set], mine, auth, &st);
  T_REQUIREF(d != NULL, "dialer: %s", st.msg);
  mlxd_transport* t = mlxd_tcp_transport_lazy(rank, x->g, x->k, d, &st);
  T_REQUIREF(t != NULL, "lazy transport: %s", st.msg);
  T_CHECK_EQ(mlxd_tcp_connections(t, NULL), 0);
  return t;
}

static mlxd_transport* open_lazy(ctx* x, int rank, const mlxd_net_auth* auth) {
  return open_lazy_set(x, 0, rank, auth);
}

/* Send to `to` and receive from `from` (64 KiB + rank-dependent bytes). */
static int exchange(mlxd_transport* t, int to, int from, unsigned step) {
  enum { N = 65536 + 3 };
  static unsigned char out[N], in[N];
  for (int i = 0; i < N; i++) out[i] = (unsigned char)(t->rank * 31 + i + step);
  mlxd_req* r[2] = {NULL, NULL};
  mlxd_status st;
  mlxd_status_clear(&st);
  uint64_t tag = mlxd_tag(MLXD_TAG_P2P, 7, step);
  T_REQUIREF(t->ops->irecv(t, from, tag, NULL, in, N, &r[0], &st) == 0, "irecv: %s", st.msg);
  T_REQUIREF(t->ops->isend(t, to, tag, NULL, out, N, &r[1], &st) == 0, "isend: %s", st.msg);
  int rc = t->ops->waitall(t, r, 2, &st);
  T_CHECKF(rc == 0, "rank %d: exchange with %d/%d: %s", t->rank, to, from, st.msg);
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
  mlxd_transport* t = open_lazy(x, rank, &x->auth);
  exchange(t, (rank + 1) % size, (rank + size - 1) % size, 1);
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
  mlxd_transport* t = open_lazy(x, rank, &x->auth);
  for (unsigned b = 1; b < 8; b <<= 1) exchange(t, rank ^ (int)b, rank ^ (int)b, b);
  int n = mlxd_tcp_connections(t, NULL);
  T_CHECKF(n == 3 * x->k, "rank %d holds %d connections, expected %d", rank, n, 3 * x->k);
  t->ops->destroy(t);
  return t_exit_status();
}

static int rank_storm(int rank, int size, const char* session, void* arg) {
  (void)session;
  ctx* x = arg;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(0, &one);
  (void)sched_setaffinity(0, sizeof one, &one); /* best effort: the race needs starvation */
  setenv("MLXDIST_CONNECT_TIMEOUT", "20", 1);
  mlxd_transport* t = open_lazy(x, rank, &x->auth);
  for (unsigned round = 0; round < 3; round++) {
    uint32_t out[MAXN], in[MAXN];
    mlxd_req* r[2 * MAXN];
    int nr = 0;
    mlxd_status st;
    mlxd_status_clear(&st);
    uint64_t tag = mlxd_tag(MLXD_TAG_P2P, 11, round);
    for (int j = 0; j < size; j++) {
      if (j == rank) continue;
      out[j] = (uint32_t)(rank * 1000 + j * 7 + (int)round);
      in[j] = 0;
      T_REQUIREF(t->ops->irecv(t, j, tag, NULL, &in[j], 4, &r[nr++], &st) == 0, "irecv: %s",
                 st.msg);
      T_REQUIREF(t->ops->isend(t, j, tag, NULL, &out[j], 4, &r[nr++], &st) == 0, "isend: %s",
                 st.msg);
    }
    int rc = t->ops->waitall(t, r, nr, &st);
    T_CHECKF(rc == 0, "rank %d: round %u of the all-to-all: %s", rank, round, st.msg);
    for (int j = 0; rc == 0 && j < size; j++)
      if (j != rank)
        T_CHECKF(in[j] == (uint32_t)(j * 1000 + rank * 7 + (int)round),
                 "rank %d: round %u: rank %d sent %u", rank, round, j, (unsigned)in[j]);
    if (rc) break;
  }
  int n = mlxd_tcp_connections(t, NULL);
  T_CHECKF(n == size - 1, "rank %d holds %d connections, expected %d", rank, n, size - 1);
  t->ops->destroy(t);
  return t_exit_status();
}

/* Every rank sends 4 bytes to and receives 4 from every other at once, then
 * destroys its transport; stderr goes to the log the parent reads. */
static int rank_quiet(int rank, int size, const char* session, void* arg) {
  (void)session;
  ctx* x = arg;
  t_rank_log_to(x->logdir, rank);
  mlxd_transport* t = open_lazy(x, rank, &x->auth);
  uint32_t out[MAXN], in[MAXN];
  mlxd_req* r[2 * MAXN];
  int nr = 0;
  mlxd_status st;
  mlxd_status_clear(&st);
  uint64_t tag = mlxd_tag(MLXD_TAG_P2P, 13, 0);
  for (int j = 0; j < size; j++) {
    if (j == rank) continue;
    out[j] = (uint32_t)(rank * 100 + j);
    in[j] = 0;
    T_REQUIREF(t->ops->irecv(t, j, tag, NULL, &in[j], 4, &r[nr++], &st) == 0, "irecv: %s", st.msg);
    T_REQUIREF(t->ops->isend(t, j, tag, NULL, &out[j], 4, &r[nr++], &st) == 0, "isend: %s", st.msg);
  }
  int rc = t->ops->waitall(t, r, nr, &st);
  T_CHECKF(rc == 0, "rank %d: the exchange failed: %s", rank, st.msg);
  for (int j = 0; rc == 0 && j < size; j++)
    if (j != rank)
      T_CHECKF(in[j] == (uint32_t)(j * 100 + rank), "rank %d: rank %d sent %u", rank, j,
               (unsigned)in[j]);
  t->ops->destroy(t);
  return t_exit_status();
}

/* The ranks' log directory: made fresh, and removed with what the ranks
 * of a mode leave there (their stderr, the failed/destroy marks). */
static void logdir_make(ctx* x) {
  snprintf(x->logdir, sizeof x->logdir, "/tmp/test_lazy.XXXXXX");
  T_REQUIRE(mkdtemp(x->logdir) != NULL);
}

static void logdir_remove(const ctx* x, int nranks) {
  char path[128];
  for (int r = 0; r < nranks; r++) {
    snprintf(path, sizeof path, "%s/rank%d.log", x->logdir, r);
    unlink(path);
  }
  const char* marks[] = {"failed",   "destroy",    "exchanged", "tried", "never-done", "contacted",
                         "flooding", "flood-done", "closed",    "needs", "late-done",  "idle"};
  for (size_t i = 0; i < sizeof marks / sizeof marks[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", x->logdir, marks[i]);
    unlink(path);
  }
  rmdir(x->logdir);
}

static void close_parent(void* arg);

/* The quiet mode: runs of n ranks, each with fresh listeners; how many runs
 * had a rank print a refusal (every rank's stderr shown for the first). */
static int quiet_runs(ctx* x, int n, int runs) {
  int loud = 0;
  for (int run = 0; run < runs; run++) {
    x->n = x->g = n;
    for (int i = 0; i < MAXN * 2; i++) x->lfds[i] = -1;
    listen_all(x);
    t_ranks_opts o = {.timeout_s = 30, .grace_s = 5, .after_fork = close_parent, .what = "quiet"};
    int bad = t_run_ranks(n, rank_quiet, x, &o, NULL);
    T_CHECKF(bad == 0, "%d rank(s) of %d failed in run %d", bad, n, run);
    bool said = false;
    for (int r = 0; r < n && !said; r++)
      said = strstr(t_rank_log(x->logdir, r), "refused a connection") != NULL;
    for (int r = 0; r < n && said && !loud; r++) /* the first such run: every rank's stderr */
      fprintf(stderr, "--- run %d of %d ranks, rank %d's stderr:\n%s", run, n, r,
              t_rank_log(x->logdir, r));
    loud += said;
    mlxd_net_hosts_free(&x->hosts);
    if (bad) break;
  }
  fprintf(stderr, "%d rank(s): %d run(s) of %d printed a refused connection\n", n, loud, runs);
  return loud;
}

/* A rank tells the others it reached a point: a file in the log directory. */
static void mark(const ctx* x, const char* name) { t_mark(x->logdir, name); }
static void wait_mark(const ctx* x, const char* name, double limit_s) {
  t_wait_mark(x->logdir, name, limit_s);
}

/* A stranger: connects to addr and sends a well-formed hello with another token. */
static int stranger(const mlxd_net_addr* a, int claim) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || connect(fd, (const struct sockaddr*)&a->sa, a->len) != 0) return -1;
  mlxd_hs_msg h;
  memset(&h, 0, sizeof h);
  h.rank = (uint32_t)claim;
  h.size = 3;
  h.conn = 0;
  h.nconn = 1;
  memset(h.token, 0x77, sizeof h.token);
  unsigned char buf[MLXD_HS_HELLO_BYTES];
  mlxd_hs_encode_hello(buf, &h);
  if (write(fd, buf, sizeof buf) != (ssize_t)sizeof buf) {
    close(fd);
    return -1;
  }
  return fd;
}

static int rank_intruder(int rank, int size, const char* session, void* arg) {
  (void)session;
  (void)size;
  ctx* x = arg;
  t_rank_log_to(x->logdir, rank);
  setenv("MLXDIST_CONNECT_TIMEOUT", "2", 1);
  if (rank == 2) { /* another job's rank 2 (its token differs): wants rank 1 */
    mlxd_net_auth other = x->auth;
    memset(other.token, 0x66, sizeof other.token);
    mlxd_transport* t = open_lazy(x, rank, &other);
    wait_mark(x, "exchanged", 30); /* after the honest exchange */
    double t0 = t_now();
    unsigned char b[4] = {0};
    mlxd_req* r = NULL;
    mlxd_status st;
    mlxd_status_clear(&st);
    int rc = t->ops->isend(t, 1, mlxd_tag(MLXD_TAG_P2P, 9, 0), NULL, b, 4, &r, &st);
    if (rc == 0) rc = t->ops->waitall(t, &r, 1, &st);
    double took = t_now() - t0;
    T_CHECKF(rc != 0, "a rank with another token connected to rank 1");
    T_CHECKF(t_status_names_peer(&st, 1), "the failure does not name rank 1: %s", st.msg);
    T_CHECKF(strstr(st.msg, "MLXDIST_CONNECT_TIMEOUT") != NULL, "no bound named: %s", st.msg);
    T_CHECKF(took < 6, "the failure took %.1f s (MLXDIST_CONNECT_TIMEOUT=2)", took);
    mark(x, "tried");
    t->ops->destroy(t);
    return t_exit_status();
  }
  mlxd_transport* t = open_lazy(x, rank, &x->auth);
  int fd = -1;
  if (rank == 0) {
    fd = stranger(&x->hosts.addrs[1 * x->k], 0);
    T_CHECK(fd >= 0);
    usleep(100000);
  }
  exchange(t, 1 - rank, 1 - rank, 3);
  if (rank == 1) { /* stay until rank 2 has tried (its op runs through this rank's dialer) */
    mark(x, "exchanged");
    unsigned char b[4];
    mlxd_req* r = NULL;
    mlxd_status st;
    mlxd_status_clear(&st);
    /* drive the transport: a receive from rank 0 that arrives once rank 2 has tried */
    T_REQUIRE(t->ops->irecv(t, 0, mlxd_tag(MLXD_TAG_P2P, 11, 0), NULL, b, 4, &r, &st) == 0);
    T_REQUIRE(t->ops->waitall(t, &r, 1, &st) == 0);
  } else {
    wait_mark(x, "tried", 30);
    unsigned char b[4] = {1, 2, 3, 4};
    mlxd_req* r = NULL;
    mlxd_status st;
    mlxd_status_clear(&st);
    T_REQUIRE(t->ops->isend(t, 1, mlxd_tag(MLXD_TAG_P2P, 11, 0), NULL, b, 4, &r, &st) == 0);
    T_REQUIRE(t->ops->waitall(t, &r, 1, &st) == 0);
  }
  if (fd >= 0) close(fd);
  t->ops->destroy(t);
  return t_exit_status();
}

static int rank_never(int rank, int size, const char* session, void* arg) {
  (void)session;
  (void)size;
  ctx* x = arg;
  setenv("MLXDIST_CONNECT_TIMEOUT", "2", 1);
  if (rank == 1) { /* listens, never answers */
    close(x->lfds[0]);
    close(x->lfds[2]);
    wait_mark(x, "never-done", 30); /* until rank 0 has given up on both */
    return 0;
  }
  if (rank == 2) { /* does not listen */
    for (int i = 0; i < 3; i++) close(x->lfds[i]);
    wait_mark(x, "never-done", 30);
    return 0;
  }
  close(x->lfds[2]); /* rank 2's listener is gone in this process too */
  x->lfds[2] = -1;
  close(x->lfds[1]);
  x->lfds[1] = -1;
  for (int peer = 1; peer <= 2; peer++) {
    mlxd_transport* t = open_lazy(x, rank, &x->auth);
    double t0 = t_now();
    unsigned char b[4];
    mlxd_req* r = NULL;
    mlxd_status st;
    mlxd_status_clear(&st);
    int rc = t->ops->irecv(t, peer, mlxd_tag(MLXD_TAG_P2P, 5, 0), NULL, b, 4, &r, &st);
    if (rc == 0) rc = t->ops->waitall(t, &r, 1, &st);
    double took = t_now() - t0;
    T_CHECKF(rc != 0, "a receive from rank %d that never connects succeeded", peer);
    T_CHECKF(t_status_names_peer(&st, peer), "the failure does not name rank %d: %s", peer, st.msg);
    T_CHECKF(took >= 1.5 && took < 6, "the failure took %.1f s (MLXDIST_CONNECT_TIMEOUT=2)", took);
    fprintf(stderr, "[test] rank 0 on rank %d: %s (%.1f s)\n", peer, st.msg, took);
    t->ops->destroy(t);
    if (peer == 1) { /* a second transport for rank 2: listen again */
      mlxd_status s2;
      mlxd_status_clear(&s2);
      char why[100];
      T_REQUIRE(mlxd_net_parse_addr("127.0.0.1:0", true, &x->hosts.addrs[0], why, sizeof why) == 0);
      T_REQUIRE(mlxd_net_listen(&x->hosts.addrs[0], &x->lfds[0], &s2) == 0);
    }
  }
  mark(x, "never-done");
  return t_exit_status();
}

/* Post a receive or a send of n bytes (tag step), wait, return the code. */
static int one_op(mlxd_transport* t, bool send, int peer, unsigned step, void* buf, size_t n,
                  mlxd_status* st) {
  mlxd_req* r = NULL;
  mlxd_status_clear(st);
  uint64_t tag = mlxd_tag(MLXD_TAG_P2P, 13, step);
  int rc = send ? t->ops->isend(t, peer, tag, NULL, buf, n, &r, st)
                : t->ops->irecv(t, peer, tag, NULL, buf, n, &r, st);
  if (rc == 0) rc = t->ops->waitall(t, &r, 1, st);
  return rc;
}

/* refuse: rank 1's transport fails (rank 2 leaves while rank 1 waits for
 * it); rank 0's first contact with rank 1 afterwards is turned down with
 * that failure at once, not after MLXDIST_CONNECT_TIMEOUT (10 s). With a
 * shared secret, so the refusal's MAC is checked. */
static int rank_refuse(int rank, int size, const char* session, void* arg) {
  (void)session;
  (void)size;
  ctx* x = arg;
  t_rank_log_to(x->logdir, rank);
  setenv("MLXDIST_CONNECT_TIMEOUT", "10", 1);
  mlxd_net_auth keyed = x->auth; /* with a secret: the refusal is proven by its MAC */
  keyed.have_key = true;
  memset(keyed.key, 0x2b, sizeof keyed.key);
  mlxd_transport* t = open_lazy(x, rank, &keyed);
  unsigned char b[4] = {1, 2, 3, 4};
  mlxd_status st;
  if (rank == 2) {
    exchange(t, 1, 1, 1);
    _exit(t_exit_status()); /* gone, while rank 1 waits for a message */
  }
  if (rank == 1) {
    exchange(t, 2, 2, 1);
    int rc = one_op(t, false, 2, 2, b, 4, &st);
    T_CHECKF(rc != 0 && strstr(st.msg, "lost connection to rank 2"),
             "rank 1's receive from rank 2 that left: %d %s", rc, st.msg);
    mark(x, "failed");
    wait_mark(x, "contacted", 30); /* failed, alive: its heartbeat tick answers hellos */
    t->ops->destroy(t);
    return t_exit_status();
  }
  wait_mark(x, "failed", 30);
  double t0 = t_now();
  int rc = one_op(t, true, 1, 3, b, 4, &st);
  double took = t_now() - t0;
  mark(x, "contacted");
  fprintf(stderr, "[test] rank 0's first contact with the failed rank 1: %s (%.2f s)\n", st.msg,
          took);
  T_CHECKF(rc != 0, "a send to the failed rank 1 succeeded");
  T_CHECKF(strstr(st.msg, "rank 1 turned this rank's connection down: its group failed") &&
               strstr(st.msg, "lost connection to rank 2"),
           "the failure does not carry rank 1's reason: %s", st.msg);
  T_CHECKF(st.has_reporter && st.reporter == 1, "not reported by rank 1: %s", st.msg);
  T_CHECKF(took < 3, "the refusal took %.1f s (MLXDIST_CONNECT_TIMEOUT=10)", took);
  t->ops->destroy(t);
  return t_exit_status();
}

/* closing: rank 1 destroys its transport while 64 MiB to rank 2 (which
 * reads nothing) keep its close waiting (MLXDIST_TIMEOUT=3); rank 0's first
 * contact meanwhile is told rank 1 is shutting down, at once. */
static int rank_closing(int rank, int size, const char* session, void* arg) {
  (void)session;
  (void)size;
  ctx* x = arg;
  t_rank_log_to(x->logdir, rank);
  setenv("MLXDIST_CONNECT_TIMEOUT", "10", 1);
  setenv("MLXDIST_TIMEOUT", "3", 1);
  mlxd_transport* t = open_lazy(x, rank, &x->auth);
  if (rank == 2) {
    exchange(t, 1, 1, 1);
    mark(x, "idle");               /* out of its last wait: reads nothing from here on */
    wait_mark(x, "contacted", 30); /* until rank 0 has made its contact */
    _exit(t_exit_status());
  }
  if (rank == 1) {
    exchange(t, 2, 2, 1);
    /* rank 2, still in its exchange, would read the 64 MiB (an unexpected message) */
    wait_mark(x, "idle", 30);
    size_t n = (size_t)64 << 20;
    char* big = calloc(1, n);
    T_REQUIRE(big != NULL);
    mlxd_req* r = NULL;
    mlxd_status st;
    mlxd_status_clear(&st);
    T_REQUIRE(t->ops->isend(t, 2, mlxd_tag(MLXD_TAG_P2P, 13, 9), NULL, big, n, &r, &st) == 0);
    /* push it until the socket buffers are full (rank 2 reads nothing): on a
     * busy host the isend alone may not have written a byte yet, and a
     * destroy with nothing in flight has nothing to wait for */
    mlxd_wait_state ws;
    memset(&ws, 0, sizeof ws);
    T_REQUIREF(t->ops->wait_slice(t, &r, 1, 0.5, &ws, &st) == 0 && !ws.done,
               "the 64 MiB send to a rank that reads nothing: %s", st.msg);
    double t0 = t_now();
    mark(x, "destroy");
    t->ops->destroy(t); /* its sockets stay full: the close waits MLXDIST_TIMEOUT */
    fprintf(stderr, "[test] rank 1's destroy took %.2f s\n", t_now() - t0);
    free(r); /* never waited: the transport that held it is gone */
    free(big);
    return t_exit_status();
  }
  wait_mark(x, "destroy", 30);
  usleep(200000); /* rank 1 is in its destroy by now (3 s of it) */
  unsigned char b[4] = {1, 2, 3, 4};
  mlxd_status st;
  double t0 = t_now();
  int rc = one_op(t, true, 1, 3, b, 4, &st);
  double took = t_now() - t0;
  mark(x, "contacted");
  fprintf(stderr, "[test] rank 0's first contact with rank 1 in its destroy: %s (%.2f s)\n", st.msg,
          took);
  T_CHECKF(rc != 0, "a send to rank 1 in its destroy succeeded");
  T_CHECKF(strstr(st.msg, "rank 1 turned this rank's connection down: it is shutting down") != NULL,
           "the failure does not say rank 1 is shutting down: %s", st.msg);
  T_CHECKF(t_status_names_peer(&st, 1), "the failure does not name rank 1: %s", st.msg);
  T_CHECKF(took < 1.5, "the refusal took %.1f s", took);
  t->ops->destroy(t);
  return t_exit_status();
}

/* flood: rank 0 of 8 runs with a small RLIMIT_NOFILE while process 8
 * floods its lazy listener with idle connections; rounds with partners
 * rank ^ 1 .. rank ^ 7 each make new connections (rank 0 accepts them all:
 * the higher rank's connection is kept). Every round passes, and rank 0
 * says once that it ran short. */
static int count_fds(void) {
  int n = 0;
  for (int fd = 0; fd < 4096; fd++)
    if (fcntl(fd, F_GETFD) >= 0) n++;
  return n;
}

static int rank_flood(int rank, int size, const char* session, void* arg) {
  (void)session;
  (void)size;
  ctx* x = arg;
  t_rank_log_to(x->logdir, rank);
  if (rank == x->g) { /* the flooder */
    for (int i = 0; i < x->g * x->k; i++) close(x->lfds[i]);
    int held[1200];
    int nh = 0;
    /* until rank 0's rounds are over (bounded: 30 s), 20 connections every 50 ms */
    char done[128];
    snprintf(done, sizeof done, "%s/flood-done", x->logdir);
    bool on = false;
    for (double until = t_now() + 30; access(done, F_OK) != 0 && t_now() < until;) {
      for (int i = 0; i < 20 && nh < 1200; i++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (fd < 0) break;
        (void)connect(fd, (const struct sockaddr*)&x->hosts.addrs[0].sa, x->hosts.addrs[0].len);
        held[nh++] = fd;
      }
      if (!on && nh >= 100) { /* several times what rank 0 may hold: the flood is on */
        mark(x, "flooding");
        on = true;
      }
      usleep(50000);
    }
    fprintf(stderr, "[test] the flooder made %d idle connections\n", nh);
    for (int i = 0; i < nh; i++) close(held[i]);
    return 0;
  }
  setenv("MLXDIST_CONNECT_TIMEOUT", "20", 1);
  mlxd_transport* t = open_lazy(x, rank, &x->auth);
  if (rank == 0) {
    struct rlimit rl;
    T_REQUIRE(getrlimit(RLIMIT_NOFILE, &rl) == 0);
    int used = count_fds();
    rl.rlim_cur = (rlim_t)used + 16; /* its 7 connections and a few handshakes */
    T_REQUIRE(setrlimit(RLIMIT_NOFILE, &rl) == 0);
    fprintf(stderr, "[test] rank 0: %d descriptors open, RLIMIT_NOFILE %d\n", used, used + 16);
  }
  wait_mark(x, "flooding", 30);
  for (unsigned b = 1; b < 8; b++) {
    if (exchange(t, rank ^ (int)b, rank ^ (int)b, b) != 0) break;
    usleep(150000);
  }
  if (rank == 0) mark(x, "flood-done");
  int n = mlxd_tcp_connections(t, NULL);
  T_CHECKF(n == 7, "rank %d holds %d connections, expected 7", rank, n);
  t->ops->destroy(t);
  return t_exit_status();
}

/* exit: 3 ranks, 3 groups each. Rank 0 sends rank 1 a last 64 KiB message
 * on every group and destroys the three at once, while ranks 1 and 2 keep
 * theirs open and read nothing (MLXDIST_TIMEOUT=20): its destroys must not
 * wait for their FINs (they added up to 3 x 5 s), and rank 1, reading
 * only afterwards (its heartbeats to rank 0's closed sockets reset), still
 * gets every byte; then ranks 1 and 2 exchange on each group. */
static int rank_exit(int rank, int size, const char* session, void* arg) {
  (void)session;
  ctx* x = arg;
  t_rank_log_to(x->logdir, rank);
  setenv("MLXDIST_TIMEOUT", "20", 1);
  enum { N = 65536 + 5 };
  static unsigned char msg[N];
  mlxd_transport* t[NSET];
  for (int s = 0; s < NSET; s++) {
    t[s] = open_lazy_set(x, s, rank, &x->auth);
    exchange(t[s], (rank + 1) % size, (rank + size - 1) % size, (unsigned)s);
  }
  mlxd_status st;
  if (rank == 0) {
    for (int s = 0; s < NSET; s++) {
      for (int i = 0; i < N; i++) msg[i] = (unsigned char)(i * 7 + s);
      T_CHECKF(one_op(t[s], true, 1, 20, msg, N, &st) == 0, "last send: %s", st.msg);
    }
    double t0 = t_now();
    for (int s = 0; s < NSET; s++) t[s]->ops->destroy(t[s]);
    double took = t_now() - t0;
    mark(x, "closed");
    fprintf(stderr, "[test] rank 0 destroyed 3 groups in %.2f s\n", took);
    T_CHECKF(took < 2, "rank 0's three destroys took %.1f s (peers that keep their groups open)",
             took);
    return t_exit_status();
  }
  wait_mark(x, "closed", 30);
  usleep(2500000); /* on purpose: heartbeat ticks (1 s) meet rank 0's closed sockets */
  for (int s = 0; s < NSET; s++) {
    if (rank == 1) {
      memset(msg, 0, N);
      int rc = one_op(t[s], false, 0, 20, msg, N, &st);
      T_CHECKF(rc == 0, "rank 1: rank 0's last message on group %d: %s", s, st.msg);
      for (int i = 0; rc == 0 && i < N; i++)
        if (msg[i] != (unsigned char)(i * 7 + s)) {
          T_CHECKF(false, "rank 1: byte %d of rank 0's last message on group %d is wrong", i, s);
          break;
        }
    }
    exchange(t[s], 3 - rank, 3 - rank, 30 + (unsigned)s); /* 1 <-> 2: not failed */
  }
  for (int s = 0; s < NSET; s++) t[s]->ops->destroy(t[s]);
  return t_exit_status();
}

/* late: rank 1 listens only 3.5 s in; rank 0 first needs it 2.5 s in, with
 * MLXDIST_CONNECT_TIMEOUT=3: its dial is refused, retried, and succeeds (a
 * bound from init would have run out). Then on a second group where rank 1
 * never listens, rank 0's op (2 s after that group was made) fails after
 * the bound, counted from the op, saying how many attempts were refused. */
static int rank_late(int rank, int size, const char* session, void* arg) {
  (void)session;
  (void)size;
  ctx* x = arg;
  t_rank_log_to(x->logdir, rank);
  setenv("MLXDIST_CONNECT_TIMEOUT", "3", 1);
  double start = t_now();
  if (rank == 1) {
    close(x->lfds_set[1][1]); /* never listens in group 1 */
    x->lfds_set[1][1] = -1;
    close(x->lfds[1]); /* not started yet: nothing listens at its address */
    x->lfds[1] = -1;
    wait_mark(x, "needs", 30);
    usleep(1000000); /* on purpose: rank 0's dials are refused for a while */
    mlxd_status st;
    mlxd_status_clear(&st);
    T_REQUIRE(mlxd_net_listen(&x->hosts.addrs[1], &x->lfds[1], &st) == 0);
    mlxd_transport* t = open_lazy(x, rank, &x->auth);
    exchange(t, 0, 0, 1);
    wait_mark(x, "late-done", 30); /* rank 0's second group waits for nothing here */
    t->ops->destroy(t);
    return t_exit_status();
  }
  mlxd_transport* t = open_lazy(x, rank, &x->auth);
  usleep(2500000); /* on purpose: a bound counted from init would run out before rank 1 listens */
  mark(x, "needs");
  double t0 = t_now();
  int rc = exchange(t, 1, 1, 1);
  fprintf(stderr, "[test] rank 0 reached rank 1 %.2f s after first needing it (%.2f s in)\n",
          t_now() - t0, t_now() - start);
  T_CHECKF(rc == 0, "rank 0 did not reach the late rank 1");
  mlxd_transport* t1 = open_lazy_set(x, 1, rank, &x->auth);
  usleep(2000000);
  unsigned char b[4] = {0};
  mlxd_status st;
  t0 = t_now();
  rc = one_op(t1, true, 1, 2, b, 4, &st);
  double took = t_now() - t0;
  fprintf(stderr, "[test] rank 0 on rank 1 that never listens: %s (%.2f s)\n", st.msg, took);
  T_CHECKF(rc != 0, "a send to a rank that never listens succeeded");
  T_CHECKF(took >= 2.5 && took < 6, "the bound ran out after %.1f s of the op (3 s from need)",
           took);
  T_CHECKF(strstr(st.msg, "of first needing it (MLXDIST_CONNECT_TIMEOUT)") &&
               strstr(st.msg, "refused (nothing listened at"),
           "the failure does not count the refusals: %s", st.msg);
  mark(x, "late-done");
  t1->ops->destroy(t1);
  t->ops->destroy(t);
  return t_exit_status();
}

/* The parent's copies of the ranks' listeners. */
static void close_parent(void* arg) {
  ctx* x = arg;
  for (int s = 0; s < NSET; s++)
    for (int i = 0; i < MAXN * 2; i++)
      if (x->lfds_set[s][i] >= 0) close(x->lfds_set[s][i]);
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "ring";
  ctx x;
  memset(&x, 0, sizeof x);
  for (int s = 0; s < NSET; s++)
    for (int i = 0; i < MAXN * 2; i++) x.lfds_set[s][i] = -1;
  x.nsets = 1;
  x.mode = mode;
  x.n = 8;
  x.k = 1;
  t_rank_fn fn = rank_ring;
  if (strcmp(mode, "pairs") == 0) {
    fn = rank_pairs;
    x.k = 2;
  } else if (strcmp(mode, "intruder") == 0) {
    fn = rank_intruder;
    x.n = 3;
  } else if (strcmp(mode, "never") == 0) {
    fn = rank_never;
    x.n = 3;
  } else if (strcmp(mode, "storm") == 0) {
    fn = rank_storm;
    x.n = 32;
  } else if (strcmp(mode, "refuse") == 0) {
    fn = rank_refuse;
    x.n = 3;
  } else if (strcmp(mode, "closing") == 0) {
    fn = rank_closing;
    x.n = 3;
  } else if (strcmp(mode, "flood") == 0) {
    fn = rank_flood;
    x.n = 9;
    x.g = 8;
  } else if (strcmp(mode, "exit") == 0) {
    fn = rank_exit;
    x.n = 3;
    x.nsets = 3;
  } else if (strcmp(mode, "late") == 0) {
    fn = rank_late;
    x.n = 2;
    x.nsets = 2;
  } else if (strcmp(mode, "quiet") == 0) {
    logdir_make(&x);
    /* MLXDIST_TEST_LIGHT=1 (the ThreadSanitizer run): fewer runs */
    int runs2 = t_env_int("MLXDIST_TEST_LIGHT", 0) == 1 ? 16 : 40, runs4 = runs2 / 4;
    int loud2 = quiet_runs(&x, 2, runs2);
    int loud4 = quiet_runs(&x, 4, runs4);
    T_CHECKF(loud2 == 0 && loud4 == 0,
             "honest jobs printed a refused connection: %d of %d runs of 2 ranks, %d of %d of 4",
             loud2, runs2, loud4, runs4);
    logdir_remove(&x, 4);
    return t_exit_status();
  } else if (strcmp(mode, "ring") != 0) {
    fprintf(stderr,
            "usage: test_lazy "
            "ring|pairs|storm|intruder|never|refuse|closing|flood|exit|late|quiet\n");
    return 2;
  }
  if (!x.g) x.g = x.n;
  logdir_make(&x);
  listen_all(&x);
  t_ranks_opts o = {.timeout_s = 60, .grace_s = 15, .after_fork = close_parent, .what = mode};
  int bad = t_run_ranks(x.n, fn, &x, &o, NULL);
  T_CHECKF(bad == 0, "%d rank(s) failed", bad);
  if (strcmp(mode, "intruder") == 0) {
    const char* log1 = t_rank_log(x.logdir, 1);
    T_CHECKF(strstr(log1, "refused a connection from 127.0.0.1") != NULL &&
                 strstr(log1, mlxd_hs_reason(MLXD_HS_TOKEN)) != NULL,
             "rank 1 did not log the stranger's refusal; its stderr:\n%s", log1);
    fprintf(stderr, "rank 1's stderr:\n%s", log1);
    fprintf(stderr, "rank 2's stderr:\n%s", t_rank_log(x.logdir, 2));
  }
  if (strcmp(mode, "flood") == 0) {
    const char* log0 = t_rank_log(x.logdir, 0);
    int said = 0;
    for (const char* q = log0; (q = strstr(q, "(said once)")) != NULL; q++) said++;
    T_CHECKF(said == 1,
             "rank 0 said %d times that it ran short of descriptors (expected once: the flood "
             "must reach its limit); its stderr:\n%s",
             said, log0);
  }
  if (strcmp(x.mode, "ring") != 0 && strcmp(x.mode, "pairs") != 0 && strcmp(x.mode, "storm") != 0 &&
      strcmp(x.mode, "intruder") != 0 && strcmp(x.mode, "never") != 0)
    for (int r = 0; r < x.n; r++)
      fprintf(stderr, "--- rank %d's stderr:\n%s", r, t_rank_log(x.logdir, r));
  logdir_remove(&x, x.n);
  for (int s = 0; s < x.nsets; s++) mlxd_net_hosts_free(&x.hosts_set[s]);
  return t_exit_status();
}
