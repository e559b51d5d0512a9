/* The nccl backend's side channel (backends/nccl/exchange.h) over real
 * sockets on 127.0.0.1, without a GPU or NCCL: the 128-byte id reaches
 * every rank of the job and nobody else. Ranks and intruders are threads
 * of this process, each with its own socket. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/nccl/exchange.h"
#include "net/net.h"
#include "testutil.h"
#include "util/clock.h"

#define ID_BYTES 128
#define MAXR 8

static const unsigned char k_token[16] = "job-token-16byte";
static const unsigned char k_other[16] = "another-job-tok!";
static unsigned char k_key[32], k_key2[32];

typedef struct rank_arg {
  int rank, size;
  char root[96];
  const unsigned char* token;
  const unsigned char* key;
  double timeout;
  size_t n;
  mlxd_nccl_xchg* x0; /* rank 0: set up (listening) by the caller */
  unsigned char dst[MAXR * ID_BYTES];
  int rc;
  mlxd_status st;
} rank_arg;

static void* rank_main(void* p) {
  rank_arg* a = p;
  unsigned char src[ID_BYTES];
  memset(src, 0x40 + a->rank, sizeof src);
  memset(a->dst, 0xEE, sizeof a->dst);
  mlxd_status_clear(&a->st);
  if (a->x0) {
    a->rc = mlxd_nccl_xchg_gather(a->x0, a->dst, src, a->n, &a->st);
    return NULL;
  }
  mlxd_nccl_xchg x;
  a->rc = mlxd_nccl_xchg_init(&x, a->rank, a->size, a->root, a->token, a->key, a->timeout, &a->st);
  if (a->rc == 0) a->rc = x.bs.all_gather(&x.bs, a->dst, src, a->n, &a->st);
  mlxd_nccl_xchg_close(&x);
  return NULL;
}

/* Rank 0 listening on an ephemeral port; root gets "127.0.0.1:<port>". */
static void root_up(mlxd_nccl_xchg* x, int size, const unsigned char* key, double timeout,
                    char* root) { /* root: 96 bytes */
  mlxd_status st;
  mlxd_status_clear(&st);
  T_REQUIREF(mlxd_nccl_xchg_init(x, 0, size, "127.0.0.1:0", k_token, key, timeout, &st) == 0, "%s",
             st.msg);
  T_REQUIREF(mlxd_nccl_xchg_listen(x, &st) == 0, "%s", st.msg);
  snprintf(root, 96, "%s", x->root.text);
}

static void start(pthread_t* t, rank_arg* a, int rank, int size, const char* root,
                  const unsigned char* token, const unsigned char* key, double timeout,
                  mlxd_nccl_xchg* x0) {
  size_t n = a->n ? a->n : ID_BYTES; /* a length set by the caller beforehand stays */
  memset(a, 0, sizeof *a);
  a->rank = rank;
  a->size = size;
  snprintf(a->root, sizeof a->root, "%s", root);
  a->token = token;
  a->key = key;
  a->timeout = timeout;
  a->n = n;
  a->x0 = x0;
  T_ASSERT(pthread_create(t, NULL, rank_main, a) == 0);
}

/* Every rank got every rank's part (rank r's bytes are 0x40 + r). */
static void check_result(const rank_arg* a, int size) {
  T_CHECKF(a->rc == 0, "rank %d: %s", a->rank, a->st.msg);
  for (int r = 0; r < size; r++)
    for (int i = 0; i < ID_BYTES; i++)
      if (a->dst[r * ID_BYTES + i] != 0x40 + r) {
        T_CHECKF(false, "rank %d: byte %d of rank %d's part is %#x", a->rank, i, r,
                 a->dst[r * ID_BYTES + i]);
        return;
      }
}

static bool untouched(const rank_arg* a) {
  for (size_t i = 0; i < sizeof a->dst; i++)
    if (a->dst[i] != 0xEE) return false;
  return true;
}

/* A raw TCP client: connect to root, send len bytes of buf, keep open. */
static int raw_connect(const char* root) { /* root: 96 bytes */
  const char* colon = strrchr(root, ':');
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  T_ASSERT(fd >= 0);
  T_ASSERT(connect(fd, (struct sockaddr*)&sa, sizeof sa) == 0);
  return fd;
}

/* Bytes the server sends to fd within secs (until it closes): -1 on error. */
static long drain(int fd, double secs) {
  struct timeval tv = {.tv_sec = (long)secs, .tv_usec = (long)((secs - (long)secs) * 1e6)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  long total = 0;
  unsigned char b[4096];
  for (;;) {
    ssize_t r = recv(fd, b, sizeof b, 0);
    if (r <= 0) return total;
    total += r;
  }
}

static void test_group(int size, const unsigned char* key) {
  mlxd_nccl_xchg x0;
  char root[96];
  root_up(&x0, size, key, 20, root);
  pthread_t t[MAXR];
  rank_arg* a = calloc(MAXR, sizeof *a);
  /* peers first: they retry until rank 0 serves */
  for (int r = 1; r < size; r++) start(&t[r], &a[r], r, size, root, k_token, key, 20, NULL);
  start(&t[0], &a[0], 0, size, root, k_token, key, 20, &x0);
  for (int r = 0; r < size; r++) pthread_join(t[r], NULL);
  for (int r = 0; r < size; r++) check_result(&a[r], size);
  mlxd_nccl_xchg_close(&x0);
  free(a);
}

/* Intruders while the job runs: none gets a byte of the result, the job completes. */
static void test_intruders(const unsigned char* key) {
  const int size = 3;
  mlxd_nccl_xchg x0;
  char root[96];
  root_up(&x0, size, key, 20, root);
  pthread_t t[MAXR], ti[4];
  rank_arg* a = calloc(MAXR, sizeof *a);
  rank_arg* in = calloc(4, sizeof *in);
  start(&t[0], &a[0], 0, size, root, k_token, key, 20, &x0);
  /* raw: garbage, a silent squatter, and a hello of the right job that stops there */
  int garbage = raw_connect(root);
  unsigned char junk[MLXD_HS_HELLO_BYTES];
  memset(junk, 'A', sizeof junk);
  T_ASSERT(send(garbage, junk, sizeof junk, 0) == (ssize_t)sizeof junk);
  int silent = raw_connect(root);
  int squat = raw_connect(root);
  mlxd_hs_msg h = {.rank = 1,
                   .size = (uint32_t)size,
                   .conn = 0,
                   .nconn = 1,
                   .flags = key ? MLXD_HS_FLAG_SECRET : 0u};
  memcpy(h.token, k_token, sizeof h.token);
  unsigned char hello[MLXD_HS_HELLO_BYTES];
  mlxd_hs_encode_hello(hello, &h);
  T_ASSERT(send(squat, hello, sizeof hello, 0) == (ssize_t)sizeof hello);
  /* clients of the protocol: another job's token, and (with a secret) none or another one */
  int ni = 0;
  start(&ti[ni], &in[ni], 1, size, root, k_other, key, 3, NULL);
  ni++;
  if (key) {
    start(&ti[ni], &in[ni], 2, size, root, k_token, NULL, 3, NULL);
    ni++;
    start(&ti[ni], &in[ni], 2, size, root, k_token, k_key2, 3, NULL);
    ni++;
  } else {
    start(&ti[ni], &in[ni], 2, 5, root, k_token, NULL, 3, NULL); /* another size */
    ni++;
  }
  for (int i = 0; i < ni; i++) pthread_join(ti[i], NULL);
  for (int i = 0; i < ni; i++) {
    T_CHECKF(in[i].rc != 0, "intruder %d was let in", i);
    T_CHECKF(untouched(&in[i]), "intruder %d received result bytes", i);
    T_CHECKF(strstr(in[i].st.msg, "[nccl] rank") != NULL, "intruder %d: %s", i, in[i].st.msg);
  }
  /* the job's own ranks now; the squatter still holds its half-done rank 1 */
  for (int r = 1; r < size; r++) start(&t[r], &a[r], r, size, root, k_token, key, 20, NULL);
  for (int r = 0; r < size; r++) pthread_join(t[r], NULL);
  for (int r = 0; r < size; r++) check_result(&a[r], size);
  T_CHECK_EQ(drain(garbage, 1), 0);
  T_CHECK_EQ(drain(squat, 1), (long)MLXD_HS_REPLY_BYTES); /* a reply, never the result */
  T_CHECK_EQ(drain(silent, 1), 0);
  close(garbage);
  close(silent);
  close(squat);
  mlxd_nccl_xchg_close(&x0);
  free(a);
  free(in);
}

/* More silent connections than rank 0 keeps (MAX_PENDING + the group's):
 * the oldest unproven ones are dropped, the group's ranks still get in. */
static void test_flood(void) {
  const int size = 3, nflood = 80;
  mlxd_nccl_xchg x0;
  char root[96];
  root_up(&x0, size, NULL, 20, root);
  pthread_t t[MAXR];
  rank_arg* a = calloc(MAXR, sizeof *a);
  start(&t[0], &a[0], 0, size, root, k_token, NULL, 20, &x0);
  int fds[80];
  for (int i = 0; i < nflood; i++) fds[i] = raw_connect(root);
  usleep(200 * 1000); /* rank 0 accepts them all before the ranks come */
  for (int r = 1; r < size; r++) start(&t[r], &a[r], r, size, root, k_token, NULL, 20, NULL);
  for (int r = 0; r < size; r++) pthread_join(t[r], NULL);
  for (int r = 0; r < size; r++) check_result(&a[r], size);
  long got = 0;
  for (int i = 0; i < nflood; i++) {
    got += drain(fds[i], 0.2);
    close(fds[i]);
  }
  T_CHECK_EQ(got, 0);
  mlxd_nccl_xchg_close(&x0);
  free(a);
}

static void test_timeouts(void) {
  /* rank 0 waits for ranks that never come: a bounded failure naming them */
  mlxd_nccl_xchg x0;
  char root[96];
  root_up(&x0, 3, NULL, 0.5, root);
  pthread_t t[2];
  rank_arg* a = calloc(2, sizeof *a);
  start(&t[1], &a[1], 1, 3, root, k_token, NULL, 5, NULL);
  double t0 = mlxd_now();
  start(&t[0], &a[0], 0, 3, root, k_token, NULL, 0.5, &x0);
  pthread_join(t[0], NULL);
  T_CHECK(mlxd_now() - t0 < 5);
  T_CHECK(a[0].rc == MLXD_ETIMEDOUT);
  T_CHECKF(strstr(a[0].st.msg, "never proved this job: 2") != NULL, "%s", a[0].st.msg);
  T_CHECKF(strstr(a[0].st.msg, "MLX_NCCL_TIMEOUT") != NULL, "%s", a[0].st.msg);
  mlxd_nccl_xchg_close(&x0); /* rank 1 sees rank 0 close on it */
  pthread_join(t[1], NULL);
  T_CHECK(a[1].rc != 0);
  T_CHECK(untouched(&a[1]));
  free(a);

  /* a peer with nobody at rank 0's address: retries, then a bounded failure */
  int probe = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  socklen_t sl = sizeof sa;
  T_ASSERT(bind(probe, (struct sockaddr*)&sa, sizeof sa) == 0);
  T_ASSERT(getsockname(probe, (struct sockaddr*)&sa, &sl) == 0);
  close(probe);
  char nobody[64];
  snprintf(nobody, sizeof nobody, "127.0.0.1:%u", ntohs(sa.sin_port));
  rank_arg* b = calloc(1, sizeof *b);
  pthread_t tb;
  t0 = mlxd_now();
  start(&tb, b, 1, 2, nobody, k_token, NULL, 0.5, NULL);
  pthread_join(tb, NULL);
  T_CHECK(mlxd_now() - t0 < 5);
  T_CHECK(b->rc == MLXD_ETIMEDOUT);
  T_CHECKF(strstr(b->st.msg, "could not reach rank 0 at 127.0.0.1:") != NULL, "%s", b->st.msg);
  free(b);
}

/* A proven rank that sends another length: the job is broken, rank 0 says so. */
static void test_length_mismatch(void) {
  mlxd_nccl_xchg x0;
  char root[96];
  root_up(&x0, 2, NULL, 5, root);
  pthread_t t[2];
  rank_arg* a = calloc(2, sizeof *a);
  a[1].n = 64;
  start(&t[1], &a[1], 1, 2, root, k_token, NULL, 5, NULL);
  start(&t[0], &a[0], 0, 2, root, k_token, NULL, 5, &x0);
  pthread_join(t[0], NULL);
  pthread_join(t[1], NULL);
  T_CHECKF(strstr(a[0].st.msg, "rank 1 sent 64 bytes to the id exchange, rank 0 expects 128") !=
               NULL,
           "%s", a[0].st.msg);
  T_CHECK(a[1].rc != 0);
  T_CHECK(untouched(&a[1]));
  mlxd_nccl_xchg_close(&x0);
  free(a);
}

/* Raw client of the protocol without a secret (the MAC is all zeros):
 * hello as `rank`, read the reply, send the confirm and the length. */
static int raw_proven(const char* root, int rank, int size) {
  int fd = raw_connect(root);
  mlxd_hs_msg h = {.rank = (uint32_t)rank, .size = (uint32_t)size, .conn = 0, .nconn = 1};
  memcpy(h.token, k_token, sizeof h.token);
  unsigned char hello[MLXD_HS_HELLO_BYTES], reply[MLXD_HS_REPLY_BYTES];
  mlxd_hs_encode_hello(hello, &h);
  T_ASSERT(send(fd, hello, sizeof hello, 0) == (ssize_t)sizeof hello);
  T_ASSERT(recv(fd, reply, sizeof reply, MSG_WAITALL) == (ssize_t)sizeof reply);
  unsigned char zero[MLXD_HS_MAC_BYTES] = {0}, tail[MLXD_HS_CONFIRM_BYTES + 8] = {0};
  mlxd_hs_encode_confirm(tail, zero);
  tail[MLXD_HS_CONFIRM_BYTES + 7] = ID_BYTES; /* the length, big-endian */
  T_ASSERT(send(fd, tail, sizeof tail, 0) == (ssize_t)sizeof tail);
  return fd;
}

/* Two connections claim rank 1 and both prove the job before either sends
 * its part: the second is refused; rank 2 never comes, so rank 0 must time
 * out naming it, never count rank 1 twice and send a result without rank 2's. */
static void test_duplicate_rank(void) {
  mlxd_nccl_xchg x0;
  char root[96];
  root_up(&x0, 3, NULL, 1.5, root);
  pthread_t t;
  rank_arg* a = calloc(1, sizeof *a);
  start(&t, a, 0, 3, root, k_token, NULL, 1.5, &x0);
  int c1 = raw_proven(root, 1, 3), c2 = raw_proven(root, 1, 3);
  usleep(100 * 1000); /* rank 0 reads both confirms */
  unsigned char part[ID_BYTES];
  memset(part, 0x41, sizeof part);
  (void)send(c1, part, sizeof part, MSG_NOSIGNAL);
  (void)send(c2, part, sizeof part, MSG_NOSIGNAL);
  pthread_join(t, NULL);
  T_CHECKF(a->rc == MLXD_ETIMEDOUT, "rank 0: rc %d: %s", a->rc, a->st.msg);
  T_CHECKF(strstr(a->st.msg, "never proved this job: 2") != NULL, "%s", a->st.msg);
  T_CHECK_EQ(drain(c1, 0.2), 0);
  T_CHECK_EQ(drain(c2, 0.2), 0);
  close(c1);
  close(c2);
  mlxd_nccl_xchg_close(&x0);
  free(a);
}

/* A raw rank 1 of 2 (no secret): hello, then the reply read; the caller
 * confirms with raw_finish. */
static int raw_hello(const char* root) {
  int fd = raw_connect(root);
  mlxd_hs_msg h = {.rank = 1, .size = 2, .conn = 0, .nconn = 1};
  memcpy(h.token, k_token, sizeof h.token);
  unsigned char hello[MLXD_HS_HELLO_BYTES], reply[MLXD_HS_REPLY_BYTES];
  mlxd_hs_encode_hello(hello, &h);
  T_ASSERT(send(fd, hello, sizeof hello, 0) == (ssize_t)sizeof hello);
  T_ASSERT(recv(fd, reply, sizeof reply, MSG_WAITALL) == (ssize_t)sizeof reply);
  return fd;
}

/* The confirm, the length and rank 1's part; then the whole result (true). */
static bool raw_finish(int fd) {
  unsigned char zero[MLXD_HS_MAC_BYTES] = {0}, tail[MLXD_HS_CONFIRM_BYTES + 8] = {0};
  mlxd_hs_encode_confirm(tail, zero);
  tail[MLXD_HS_CONFIRM_BYTES + 7] = ID_BYTES;
  unsigned char part[ID_BYTES], all[2 * ID_BYTES];
  memset(part, 0x41, sizeof part);
  if (send(fd, tail, sizeof tail, MSG_NOSIGNAL) != (ssize_t)sizeof tail ||
      send(fd, part, sizeof part, MSG_NOSIGNAL) != (ssize_t)sizeof part)
    return false;
  struct timeval tv = {.tv_sec = 5};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return recv(fd, all, sizeof all, MSG_WAITALL) == (ssize_t)sizeof all && all[0] == 0x40 &&
         all[ID_BYTES] == 0x41;
}

/* A real rank slow between its reply and its confirm while more
 * connections than rank 0 keeps flood in: it must not be the one dropped. */
static void test_flood_slow_rank(void) {
  enum { NFLOOD = 200 };
  mlxd_nccl_xchg x0;
  char root[96];
  root_up(&x0, 2, NULL, 10, root);
  pthread_t t;
  rank_arg* a = calloc(1, sizeof *a);
  start(&t, a, 0, 2, root, k_token, NULL, 10, &x0);
  int real = raw_hello(root);
  int* fds = malloc(NFLOOD * sizeof *fds);
  for (int i = 0; i < NFLOOD; i++) fds[i] = raw_connect(root);
  usleep(300 * 1000); /* rank 0 accepts them all (dropping some) before the confirm */
  T_CHECK(raw_finish(real));
  pthread_join(t, NULL);
  check_result(a, 2);
  close(real);
  for (int i = 0; i < NFLOOD; i++) close(fds[i]);
  free(fds);
  mlxd_nccl_xchg_close(&x0);
  free(a);
}

/* Connections that each send a byte (so none is "silent") keep coming while
 * the group's ranks join: they still get in (dropped ones reconnect). */
typedef struct flood_arg {
  char root[96];
  atomic_bool stop;
  int opened;
} flood_arg;

static void* flood_main(void* p) {
  flood_arg* f = p;
  enum { KEEP = 300 };
  int fds[KEEP];
  for (int i = 0; i < KEEP; i++) fds[i] = -1;
  const char* colon = strrchr(f->root, ':');
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  while (!atomic_load(&f->stop)) {
    int k = f->opened % KEEP;
    if (fds[k] >= 0) close(fds[k]);
    fds[k] = socket(AF_INET, SOCK_STREAM, 0);
    if (fds[k] >= 0 && connect(fds[k], (struct sockaddr*)&sa, sizeof sa) == 0)
      (void)send(fds[k], "x", 1, MSG_NOSIGNAL);
    f->opened++;
    usleep(200);
  }
  for (int i = 0; i < KEEP; i++)
    if (fds[i] >= 0) close(fds[i]);
  return NULL;
}

static void test_flood_chatty(void) {
  const int size = 4;
  mlxd_nccl_xchg x0;
  char root[96];
  root_up(&x0, size, NULL, 20, root);
  flood_arg* f = calloc(1, sizeof *f);
  snprintf(f->root, sizeof f->root, "%s", root);
  pthread_t ft, t[MAXR];
  rank_arg* a = calloc(MAXR, sizeof *a);
  start(&t[0], &a[0], 0, size, root, k_token, NULL, 20, &x0);
  T_ASSERT(pthread_create(&ft, NULL, flood_main, f) == 0);
  usleep(300 * 1000); /* rank 0's table is full of them */
  for (int r = 1; r < size; r++) start(&t[r], &a[r], r, size, root, k_token, NULL, 20, NULL);
  for (int r = 0; r < size; r++) pthread_join(t[r], NULL);
  atomic_store(&f->stop, true);
  pthread_join(ft, NULL);
  T_CHECKF(f->opened > 100, "only %d flood connections", f->opened);
  for (int r = 0; r < size; r++) check_result(&a[r], size);
  mlxd_nccl_xchg_close(&x0);
  free(a);
  free(f);
}

/* A rank proves itself, then its connection drops half-way through its
 * part: rank 0's timeout says so, not that it "never proved this job". */
static void test_proven_dropped(void) {
  mlxd_nccl_xchg x0;
  char root[96];
  root_up(&x0, 3, NULL, 1, root);
  pthread_t t;
  rank_arg* a = calloc(1, sizeof *a);
  start(&t, a, 0, 3, root, k_token, NULL, 1, &x0);
  int c = raw_proven(root, 1, 3);
  unsigned char half[ID_BYTES / 2];
  memset(half, 0x41, sizeof half);
  T_ASSERT(send(c, half, sizeof half, MSG_NOSIGNAL) == (ssize_t)sizeof half);
  usleep(100 * 1000);
  close(c);
  pthread_join(t, NULL);
  T_CHECKF(a->rc == MLXD_ETIMEDOUT, "rank 0: rc %d: %s", a->rc, a->st.msg);
  T_CHECKF(strstr(a->st.msg, "ranks that never proved this job: 2;") != NULL, "%s", a->st.msg);
  T_CHECKF(strstr(a->st.msg, "proved this job but whose part never arrived whole") != NULL &&
               strstr(a->st.msg, "stalled): 1") != NULL,
           "%s", a->st.msg);
  mlxd_nccl_xchg_close(&x0);
  free(a);
}

/* MLX_WORLD_SIZE may be 2^20: rank 0's state is per connection plus a few
 * bytes per rank, not a connection slot per rank (~200 MB). */
static void test_large_world(void) {
  mlxd_nccl_xchg x0;
  char root[96];
  root_up(&x0, 1 << 20, NULL, 0.3, root);
  struct rusage before, after;
  getrusage(RUSAGE_SELF, &before);
  rank_arg* a = calloc(1, sizeof *a);
  pthread_t t;
  double t0 = mlxd_now();
  start(&t, a, 0, 1 << 20, root, k_token, NULL, 0.3, &x0);
  pthread_join(t, NULL);
  getrusage(RUSAGE_SELF, &after);
  T_CHECK(a->rc == MLXD_ETIMEDOUT);
  T_CHECKF(strstr(a->st.msg, "never proved this job: 1, 2, 3") != NULL, "%s", a->st.msg);
  T_CHECKF(after.ru_maxrss - before.ru_maxrss < 32 * 1024, "rank 0 grew by %ld KiB",
           after.ru_maxrss - before.ru_maxrss);
  T_CHECK(mlxd_now() - t0 < 3);
  mlxd_nccl_xchg_close(&x0);
  free(a);
}

static void env_case(const char* rank, const char* size, const char* host, const char* port,
                     const char* timeout, const char* want) {
  const char* names[] = {"MLX_RANK", "MLX_WORLD_SIZE", "NCCL_HOST_IP", "NCCL_PORT",
                         "MLX_NCCL_TIMEOUT"};
  const char* vals[] = {rank, size, host, port, timeout};
  for (int i = 0; i < 5; i++) {
    if (vals[i])
      setenv(names[i], vals[i], 1);
    else
      unsetenv(names[i]);
  }
  mlxd_nccl_xchg x;
  mlxd_status st;
  mlxd_status_clear(&st);
  int rc = mlxd_nccl_xchg_from_env(&x, &st);
  if (!want) {
    T_CHECKF(rc == 0, "%s", st.msg);
    if (rc == 0) {
      /* MLX_NCCL_TIMEOUT is in milliseconds, as MLX's; unset: 300 s */
      double want_s = timeout ? atof(timeout) / 1000.0 : 300.0;
      T_CHECKF(x.timeout_s == want_s, "MLX_NCCL_TIMEOUT=%s: %g s", timeout ? timeout : "(unset)",
               x.timeout_s);
      mlxd_nccl_xchg_close(&x);
    }
    return;
  }
  T_CHECKF(rc != 0 && strstr(st.msg, want) != NULL, "want '%s', got '%s'", want, st.msg);
}

static void test_env(void) {
  env_case("1", "2", "127.0.0.1", "4000", NULL, NULL);
  env_case("1", "2", "127.0.0.1", "4000", "2500", NULL);
  env_case("1", "2", "127.0.0.1", "4000", "300000", NULL); /* MLX's default */
  env_case(NULL, "2", "127.0.0.1", "4000", NULL, "MLX_RANK is not set");
  env_case("1", NULL, "127.0.0.1", "4000", NULL, "MLX_WORLD_SIZE is not set");
  env_case("1", "2", NULL, "4000", NULL, "NCCL_HOST_IP is not set");
  env_case("1", "2", "127.0.0.1", NULL, NULL, "NCCL_PORT is not set");
  env_case("2", "2", "127.0.0.1", "4000", NULL, "MLX_RANK=2 is outside");
  env_case("x", "2", "127.0.0.1", "4000", NULL, "MLX_RANK='x' is not an integer");
  env_case("1", "2", "127.0.0.1", "70000", NULL,
           "NCCL_PORT='70000' is not an integer in [1, 65535]");
  env_case("1", "2", "127.0.0.1", "4000", "-1", "MLX_NCCL_TIMEOUT='-1'");
  env_case("1", "2", "127.0.0.1", "4000", "86400001", "number of milliseconds");
  env_case("1", "2", "127.0.0.1", "4000", "nan", "MLX_NCCL_TIMEOUT='nan'");
  env_case("1", "2", "bad host!", "4000", NULL, "rank 0's address");
  setenv("MLXDIST_JOB_TOKEN", "zz", 1);
  env_case("1", "2", "127.0.0.1", "4000", NULL, "MLXDIST_JOB_TOKEN='zz' is not a job token");
  unsetenv("MLXDIST_JOB_TOKEN");
}

/* Two processes configured as MLX's launcher does (MLX_RANK, MLX_WORLD_SIZE,
 * NCCL_HOST_IP, NCCL_PORT), each with its own MLXDIST_JOB_TOKEN (NULL:
 * unset, derived from the address and size). Returns how many ranks got
 * the id; rank 1's exit status says whether it did. */
static int env_pair(const char* tok0, const char* tok1, int port) {
  pid_t kids[2];
  for (int r = 0; r < 2; r++) {
    kids[r] = fork();
    T_ASSERT(kids[r] >= 0);
    if (kids[r] == 0) {
      char rs[8], ps[8];
      snprintf(rs, sizeof rs, "%d", r);
      snprintf(ps, sizeof ps, "%d", port);
      setenv("MLX_RANK", rs, 1);
      setenv("MLX_WORLD_SIZE", "2", 1);
      setenv("NCCL_HOST_IP", "127.0.0.1", 1);
      setenv("NCCL_PORT", ps, 1);
      setenv("MLX_NCCL_TIMEOUT", "3000", 1);
      const char* tok = r ? tok1 : tok0;
      if (tok)
        setenv("MLXDIST_JOB_TOKEN", tok, 1);
      else
        unsetenv("MLXDIST_JOB_TOKEN");
      mlxd_nccl_xchg x;
      mlxd_status st;
      mlxd_status_clear(&st);
      if (mlxd_nccl_xchg_from_env(&x, &st)) _exit(2);
      unsigned char src[ID_BYTES], dst[2 * ID_BYTES];
      memset(src, 0x40 + r, sizeof src);
      int rc = x.bs.all_gather(&x.bs, dst, src, sizeof src, &st);
      mlxd_nccl_xchg_close(&x);
      if (rc) {
        fprintf(stderr, "rank %d (expected when the tokens differ): %s\n", r, st.msg);
        _exit(1);
      }
      _exit(dst[0] == 0x40 && dst[ID_BYTES] == 0x41 ? 0 : 3);
    }
  }
  int ok = 0;
  for (int r = 0; r < 2; r++) {
    int status = 0;
    waitpid(kids[r], &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) ok++;
    T_CHECK(!WIFEXITED(status) || WEXITSTATUS(status) != 2);
  }
  return ok;
}

static int unused_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  socklen_t sl = sizeof sa;
  T_ASSERT(bind(fd, (struct sockaddr*)&sa, sizeof sa) == 0);
  T_ASSERT(getsockname(fd, (struct sockaddr*)&sa, &sl) == 0);
  close(fd);
  return ntohs(sa.sin_port);
}

static void test_env_pairs(void) {
  const char* a = "00112233445566778899aabbccddeeff";
  const char* b = "ffeeddccbbaa99887766554433221100";
  T_CHECK_EQ(env_pair(NULL, NULL, unused_port()), 2); /* the derived token agrees */
  T_CHECK_EQ(env_pair(a, a, unused_port()), 2);
  T_CHECK_EQ(env_pair(a, b, unused_port()), 0);    /* another job's token: refused */
  T_CHECK_EQ(env_pair(a, NULL, unused_port()), 0); /* launched and not: refused */
}

int main(void) {
  for (int i = 0; i < 32; i++) {
    k_key[i] = (unsigned char)(i * 7 + 1);
    k_key2[i] = (unsigned char)(i * 5 + 3);
  }
  test_group(1, NULL);
  test_group(2, NULL);
  test_group(5, NULL);
  test_group(4, k_key);
  test_intruders(NULL);
  test_intruders(k_key);
  test_flood();
  test_flood_slow_rank();
  test_flood_chatty();
  test_proven_dropped();
  test_large_world();
  test_timeouts();
  test_length_mismatch();
  test_duplicate_rank();
  test_env();
  test_env_pairs();
  return t_exit_status();
}
