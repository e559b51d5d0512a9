/* Trust on the caller-bootstrap path (mlx_distributed_init_with_all_gather,
 * docs/bootstrap.md, docs/security.md): real rank processes on real sockets,
 * attacked while they bootstrap.
 *
 *   test_trust_bootstrap KIND N
 *
 * The test forks N ranks (MLX_RANK, MLX_WORLD_SIZE, no hostfile) whose
 * all-gather callback is a pair of pipes to this process: each rank writes its
 * address records and reads everyone's. This process is the rendezvous, so it
 * learns every rank's listening port from the gathered records, as anybody
 * who sees the rendezvous would. It hands the records to rank 0 first (rank 0
 * starts building its connections), attacks EVERY rank's listening port, then
 * hands them to the others. KIND:
 *   garbage  an HTTP request and 300 bytes of noise on each port
 *   silence  20 connections on each port that never say a word
 *   other    a well-formed hello of another job (wrong token) on each port
 *   flood    100 connections (silent, or 8 bytes of junk) on each port, more
 *            than its backlog, then 60 more each once every rank goes on; the
 *            first 20 refusals of a rank are logged, the rest counted. A rank
 *            still in the all-gather does not accept, so its backlog is full
 *            when its peers connect: their first SYN may be dropped; the
 *            connector gives that attempt up after 0.25 s (net/mesh_connect.c), so the
 *            set-up takes milliseconds or about 0.27 s (the kernel alone: 1 s)
 *   replay   (N = 2, a secret set on both ranks) the gathered records are
 *            rewritten so that rank 1 reaches rank 0 through a relay in this
 *            process (every rank gets the same records, so the same token);
 *            the relay holds rank 1's confirm, replays rank 1's hello and
 *            confirm on a connection of its own to rank 0, waits for rank 0 to
 *            drop it, then lets the real handshake finish and relays the job's
 *            traffic. The replay carries this very job's token and a proof
 *            that was valid once: only the fresh nonce stops it.
 * Every case: the job forms (its connection set-up, timed from the end of the
 * all-gather, stays under 2 s, where one silent intruder that held it would
 * cost HS_TIMEOUT_S = 3 s), an all_sum is right, every attacked rank names an
 * intruder in one "[ring] rank R: refused a connection from ADDR: WHY" line
 * with the expected WHY, and nothing hangs (every wait is bounded). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "intruder.h"
#include "mlx/c/mlx.h"
#include "net/net.h"
#include "testutil.h"

#define MAXN 4
#define REC 64 /* one address record (bootstrap.c), one connection per peer */

static char g_dir[256];
static char g_secret[300];
static const char* g_kind;
static int g_n;

/* Exactly n bytes from fd within limit seconds: 0, or -1. */
static int read_full(int fd, void* buf, size_t n, double limit) {
  double until = now_s() + limit;
  size_t got = 0;
  while (got < n) {
    int ms = (int)((until - now_s()) * 1000);
    struct pollfd pf = {fd, POLLIN, 0};
    if (ms <= 0 || poll(&pf, 1, ms) != 1) return -1;
    ssize_t k = read(fd, (char*)buf + got, n - got);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    got += (size_t)k;
  }
  return 0;
}

static int write_full(int fd, const void* buf, size_t n) {
  size_t put = 0;
  while (put < n) {
    ssize_t k = write(fd, (const char*)buf + put, n - put);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    put += (size_t)k;
  }
  return 0;
}

/* ---- the ranks ---- */

typedef struct pipe_gather {
  int to_parent, from_parent;
  double done_at; /* when the all-gather returned */
} pipe_gather;

static int pipe_all_gather(void* dst, const void* src, size_t n, int rank, int size, void* p) {
  (void)rank;
  pipe_gather* pg = p;
  if (n != REC) return 5; /* one connection per peer in this test */
  if (write_full(pg->to_parent, src, n) != 0) return 4;
  if (read_full(pg->from_parent, dst, n * (size_t)size, 15) != 0) return 3;
  pg->done_at = now_s();
  return 0;
}

static void check_sum(mlx_distributed_group g) {
  int size = mlx_distributed_group_size(g), rank = mlx_distributed_group_rank(g);
  int v[64];
  for (int i = 0; i < 64; i++) v[i] = 1000 + rank * 64 + i;
  int shape[1] = {64};
  mlx_array x = mlx_array_new_data(v, shape, 1, MLX_INT32), y = mlx_array_new();
  T_EQ_INT(mlx_distributed_all_sum(&y, x, g, mlx_stream_new()), 0);
  T_EQ_INT(mlx_array_eval(y), 0);
  const int32_t* d = mlx_array_data_int32(y);
  for (int i = 0; i < 64; i++) T_EQ_INT(d[i], size * (1000 + i) + 64 * size * (size - 1) / 2);
  mlx_array_free(x);
  mlx_array_free(y);
}

static int rank_main(int rank, pipe_gather* pg) {
  t_capture_errors();
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init_with_all_gather(&g, true, "ring", pipe_all_gather, pg, NULL) != 0) {
    fprintf(stderr, "rank %d: init failed: %s\n", rank, t_last_error());
    return 4;
  }
  double setup = now_s() - pg->done_at;
  fprintf(stderr, "rank %d: connection set-up took %.3f s after the all-gather\n", rank, setup);
  T_CHECKF(setup < 2, "rank %d: the set-up took %.2f s", rank, setup);
  T_EQ_INT(mlx_distributed_group_size(g), g_n);
  check_sum(g);
  mlx_distributed_group_free(g);
  mlx_distributed_clear_backends();
  fprintf(stderr, "rank %d: all_sum right\n", rank);
  return t_check_failures() ? 1 : 0;
}

static pid_t g_pid[MAXN];
static int g_to[MAXN], g_from[MAXN]; /* this process's ends: to rank r, from rank r */

static void start_rank(int rank) {
  int down[2], up[2];
  T_ASSERT(pipe(down) == 0 && pipe(up) == 0);
  fflush(NULL);
  pid_t p = fork();
  T_ASSERT(p >= 0);
  if (p == 0) {
    close(down[1]);
    close(up[0]);
    for (int r = 0; r < rank; r++) close(g_to[r]), close(g_from[r]);
    char path[300], rs[8], ns[8];
    snprintf(path, sizeof path, "%s/rank%d.err", g_dir, rank);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || dup2(fd, 2) < 0) _exit(99);
    snprintf(rs, sizeof rs, "%d", rank);
    snprintf(ns, sizeof ns, "%d", g_n);
    setenv("MLX_RANK", rs, 1);
    setenv("MLX_WORLD_SIZE", ns, 1);
    unsetenv("MLX_HOSTFILE");
    unsetenv("MLXDIST_JOB_TOKEN");
    setenv("MLXDIST_RING_ADDR", "127.0.0.1", 1);
    setenv("MLXDIST_RING_CONNECTIONS", "1", 1);
    setenv("MLXDIST_TRANSPORT", "tcp", 1);
    setenv("MLXDIST_CONNECT_TIMEOUT", "10", 1);
    if (!strcmp(g_kind, "replay"))
      setenv("MLXDIST_SECRET_FILE", g_secret, 1);
    else
      unsetenv("MLXDIST_SECRET_FILE");
    pipe_gather pg = {up[1], down[0], 0};
    int rc = rank_main(rank, &pg);
    fflush(NULL);
    exit(rc);
  }
  close(down[0]);
  close(up[1]);
  g_pid[rank] = p;
  g_to[rank] = down[1];
  g_from[rank] = up[0];
}

/* ---- intruders ---- */

static void attack(int port, int nranks) {
  if (!strcmp(g_kind, "garbage")) {
    send_garbage(port);
  } else if (!strcmp(g_kind, "silence")) {
    for (int i = 0; i < 20; i++) keep(dial(port));
  } else if (!strcmp(g_kind, "flood")) { /* 100 now, 60 more once every rank goes on */
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    static int round;
    for (int i = 0; i < (round < nranks ? 100 : 60); i++) {
      int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      T_ASSERT(s >= 0);
      if (connect(s, (struct sockaddr*)&a, sizeof a) == 0 && i % 3 == 0)
        (void)!send(s, "xxxxxxxx", 8, MSG_NOSIGNAL);
      keep(s);
    }
    round++;
  } else if (!strcmp(g_kind, "other")) {
    mlxd_hs_msg h;
    memset(&h, 0, sizeof h);
    h.rank = (uint32_t)(nranks - 1);
    h.size = (uint32_t)nranks;
    h.nconn = 1;
    memset(h.token, 0x5a, sizeof h.token);
    for (int i = 0; i < MLXD_HS_NONCE_BYTES; i++) h.nonce[i] = (unsigned char)(i * 7);
    unsigned char buf[MLXD_HS_HELLO_BYTES];
    mlxd_hs_encode_hello(buf, &h);
    int fd = dial(port);
    send_all(fd, buf, sizeof buf);
    keep(fd);
  }
}

/* ---- the replaying relay (KIND replay) ---- */

static uint32_t fnv1a(const unsigned char* p, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
  return h;
}

typedef struct relay {
  int lfd;        /* where rank 1 is sent */
  int target;     /* rank 0's real port */
  int replayed;   /* 1: rank 0 dropped the replay; -1: it did not */
  char why[200];  /* what went wrong, if anything */
  size_t relayed; /* bytes relayed after the handshake, both ways */
} relay;

/* Replay hello + confirm on a fresh connection to rank 0; wait (bounded) for
 * rank 0 to close it. */
static void replay_now(relay* r, const unsigned char* hello, const unsigned char* confirm) {
  int fd = dial(r->target);
  send_all(fd, hello, MLXD_HS_HELLO_BYTES);
  send_all(fd, confirm, MLXD_HS_CONFIRM_BYTES);
  unsigned char sink[256];
  r->replayed = -1;
  double until = now_s() + 5;
  while (now_s() < until) {
    struct pollfd pf = {fd, POLLIN, 0};
    if (poll(&pf, 1, 100) != 1) continue;
    ssize_t k = recv(fd, sink, sizeof sink, 0);
    if (k <= 0) {
      r->replayed = 1;
      break;
    }
  }
  close(fd);
}

/* A send of the relay: false when the other side has gone, noted while the
 * handshake runs (afterwards the ranks' own exit codes judge the job). */
static bool relay_send(relay* r, int fd, const void* b, size_t n, const char* to) {
  if (write_full(fd, b, n) == 0) return true;
  if (r->relayed == 0)
    snprintf(r->why, sizeof r->why, "%s closed its connection through the relay (%s)", to,
             strerror(errno));
  return false;
}

static void* relay_main(void* arg) {
  relay* r = arg;
  struct pollfd pf = {r->lfd, POLLIN, 0};
  if (poll(&pf, 1, 15000) != 1) {
    snprintf(r->why, sizeof r->why, "rank 1 never reached the relay");
    return NULL;
  }
  int a = accept(r->lfd, NULL, NULL); /* rank 1 */
  int b = dial(r->target);            /* rank 0 */
  unsigned char hello[MLXD_HS_HELLO_BYTES], up[1 << 16];
  size_t uphave = 0;
  bool held = true; /* rank 1 -> rank 0 is held after the hello until the replay is done */
  if (read_full(a, hello, sizeof hello, 10) != 0) {
    snprintf(r->why, sizeof r->why, "no hello from rank 1");
    goto out;
  }
  if (!relay_send(r, b, hello, sizeof hello, "rank 0")) goto out;
  double until = now_s() + 15;
  for (;;) {
    if (now_s() > until) {
      snprintf(r->why, sizeof r->why, "the relay ran out of time");
      break;
    }
    struct pollfd p2[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
    if (poll(p2, 2, 100) <= 0) continue;
    unsigned char buf[1 << 16];
    if (p2[0].revents) { /* rank 1 -> rank 0 */
      ssize_t k = recv(a, buf, sizeof buf, 0);
      if (k <= 0) break;
      if (held) {
        T_ASSERT(uphave + (size_t)k <= sizeof up);
        memcpy(up + uphave, buf, (size_t)k);
        uphave += (size_t)k;
        if (uphave >= MLXD_HS_CONFIRM_BYTES) {
          replay_now(r, hello, up); /* the first 40 bytes are the confirm */
          held = false;
          if (!relay_send(r, b, up, uphave, "rank 0")) break;
        }
      } else {
        if (!relay_send(r, b, buf, (size_t)k, "rank 0")) break;
        r->relayed += (size_t)k;
      }
    }
    if (p2[1].revents) { /* rank 0 -> rank 1 */
      ssize_t k = recv(b, buf, sizeof buf, 0);
      if (k <= 0) break;
      if (!relay_send(r, a, buf, (size_t)k, "rank 1")) break;
      if (!held) r->relayed += (size_t)k;
    }
  }
out:
  close(a);
  close(b);
  return NULL;
}

/* Point rank 0's record at port (the checksum recomputed). */
static void redirect_rank0(unsigned char* rec, int port) {
  rec[20] = (unsigned char)(port >> 8);
  rec[21] = (unsigned char)port;
  uint32_t h = fnv1a(rec, 60);
  rec[60] = (unsigned char)(h >> 24);
  rec[61] = (unsigned char)(h >> 16);
  rec[62] = (unsigned char)(h >> 8);
  rec[63] = (unsigned char)h;
}

/* ---- the case ---- */

static int run(void) {
  bool replay = !strcmp(g_kind, "replay");
  const char* want = !strcmp(g_kind, "garbage")   ? "not an mlxdist handshake (wrong magic)"
                     : !strcmp(g_kind, "silence") ? "it had sent nothing when the set-up ended"
                     : !strcmp(g_kind, "other")   ? "wrong job token"
                     : !strcmp(g_kind, "flood")   ? "too many connections waiting for a handshake"
                     : replay                     ? "or a replayed handshake"
                                                  : NULL;
  T_REQUIREF(want, "unknown kind '%s'", g_kind);
  T_REQUIREF(g_n >= 2 && g_n <= MAXN && (!replay || g_n == 2), "N=%d", g_n);
  if (replay) {
    snprintf(g_secret, sizeof g_secret, "%s/secret", g_dir);
    FILE* f = fopen(g_secret, "w");
    T_ASSERT(f);
    fputs("0123456789abcdef0123456789abcdef\n", f);
    fclose(f);
    T_ASSERT(chmod(g_secret, 0600) == 0);
  }
  double t0 = now_s();
  for (int r = 0; r < g_n; r++) start_rank(r);
  /* the rendezvous: every rank's record, then everyone's to everyone */
  unsigned char all[MAXN * REC];
  for (int r = 0; r < g_n; r++)
    T_REQUIREF(read_full(g_from[r], all + r * REC, REC, 15) == 0, "rank %d sent no record", r);
  int port[MAXN];
  for (int r = 0; r < g_n; r++) {
    const unsigned char* rec = all + r * REC;
    T_REQUIREF(!memcmp(rec, "MXRB", 4), "rank %d's record has no magic", r);
    port[r] = (rec[20] << 8) | rec[21];
    T_REQUIREF(rec[10] == 0 && rec[11] == 4 && !memcmp(rec + 24, "\x7f\0\0\x01", 4),
               "rank %d does not listen on 127.0.0.1", r);
    printf("rank %d listens on 127.0.0.1:%d\n", r, port[r]);
  }
  relay rl = {.lfd = -1};
  pthread_t th;
  if (replay) {
    rl.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    T_ASSERT(bind(rl.lfd, (struct sockaddr*)&a, sizeof a) == 0 && listen(rl.lfd, 4) == 0);
    T_ASSERT(getsockname(rl.lfd, (struct sockaddr*)&a, &len) == 0);
    rl.target = port[0];
    redirect_rank0(all, ntohs(a.sin_port));
    T_ASSERT(pthread_create(&th, NULL, relay_main, &rl) == 0);
  }
  /* rank 0 starts building its connections; then every port is attacked; then the rest go */
  T_ASSERT(write_full(g_to[0], all, (size_t)g_n * REC) == 0);
  if (!replay) {
    sleep_s(0.05);
    for (int r = 0; r < g_n; r++) attack(port[r], g_n);
    sleep_s(0.05);
  }
  for (int r = 1; r < g_n; r++) T_ASSERT(write_full(g_to[r], all, (size_t)g_n * REC) == 0);
  if (!strcmp(g_kind, "flood"))
    for (int r = 0; r < g_n; r++) attack(port[r], g_n);
  int code[MAXN];
  for (int r = 0; r < g_n; r++) code[r] = wait_child(g_pid[r], 20);
  double took = now_s() - t0;
  if (replay) {
    pthread_join(th, NULL);
    close(rl.lfd);
  }
  close_kept();
  for (int r = 0; r < g_n; r++) {
    char path[300];
    snprintf(path, sizeof path, "%s/rank%d.err", g_dir, r);
    char* e = read_text(path);
    printf("--- rank %d (exit %d):\n%s", r, code[r], e);
    T_CHECKF(code[r] == 0, "rank %d failed (exit %d)", r, code[r]);
    /* with the replay only rank 0 is attacked */
    if (!replay || r == 0) {
      char line[120];
      snprintf(line, sizeof line, "[ring] rank %d: refused a connection from 127.0.0.1:", r);
      const char* at = strstr(e, line);
      /* A flood that lands after a rank's lazy set-up has ended (its
       * listener is drained then, not filled) is refused as silent. */
      bool seen = at && (strstr(at, want) || (!strcmp(g_kind, "flood") &&
                                              strstr(at, "it had sent nothing when the set-up")));
      T_CHECKF(seen, "rank %d did not log the intruder ('%s')", r, want);
    }
    free(e);
  }
  if (replay) {
    T_CHECKF(!rl.why[0], "the relay: %s", rl.why);
    T_CHECKF(rl.replayed == 1, "rank 0 did not drop the replayed handshake");
    T_CHECKF(rl.relayed > 0, "no traffic of the job went through the relay");
    printf("relay: the replay was %s; %zu bytes of the job relayed\n",
           rl.replayed == 1 ? "dropped" : "NOT dropped", rl.relayed);
  }
  T_CHECKF(took < 10, "the job took %.1f s", took);
  printf("%s, %d ranks: %.2f s in all\n", g_kind, g_n, took);
  return t_exit_status();
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: test_trust_bootstrap garbage|silence|other|replay N\n");
    return 2;
  }
  g_kind = argv[1];
  g_n = atoi(argv[2]);
  signal(SIGPIPE, SIG_IGN);
  snprintf(g_dir, sizeof g_dir, "/tmp/mlxdist-trustbs-XXXXXX");
  T_ASSERT(mkdtemp(g_dir));
  int rc = run();
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", g_dir);
  if (rc == 0) printf("test_trust_bootstrap %s %s: passed\n", argv[1], argv[2]);
  return rc;
}
