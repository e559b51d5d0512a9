/* Trust on a shared network (docs/security.md): real rank processes on real
 * sockets, attacked by foreign connections during init and during split.
 *
 *   test_trust init KIND    a 2-rank hostfile job; before rank 1 starts, rank 0's
 *                           port gets KIND: garbage, silence (20 at once), other
 *                           (a valid hello of another job), claim (the right
 *                           token claiming rank 1, without the secret), replay
 *                           (an earlier connection's bytes in their order: the
 *                           confirm after rank 0's reply; secret set), flood
 *                           (300 connections while the job forms)
 *   test_trust split        split opens no listener and no socket (its child is a
 *                           view of the parent's connections: nothing to attack),
 *                           and the child works after its parent was freed
 *   test_trust secret MODE  wrong: rank 1 has another secret; none: rank 1 has no
 *                           secret: rank 1 fails saying the secret did not match,
 *                           rank 0 fails within its bound and logs the refusal
 *   test_trust badtoken     MLXDIST_JOB_TOKEN not 32 hex digits: an error naming it
 *   test_trust launchsecret LAUNCHER   mlxdist-launch --secret: a private file, only
 *                           its path in the environment, removed at exit; a job runs
 *   test_trust twojobs LAUNCHER   two mlxdist-launch jobs with one hostfile, in
 *                           several start orders: never a mixed result
 *   test_trust twojobs_by_hand   two jobs started by hand with one hostfile, in the
 *                           four start orders of docs/security.md: with the derived token
 *                           the orders that pair A's and B's ranks mix data (the hazard the
 *                           docs describe); with a token or a secret per job, never
 *   test_trust job ID D0 D1 (a rank of twojobs, under the launcher or by hand)
 *
 * In every intruder case the job forms within its normal time, its results are
 * right, each intruder is named in one "[ring] rank R: refused a connection
 * from ADDR: WHY" line on stderr, and no listening socket is left afterwards. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
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
#include "ranks.h"
#include "security/secret.h"
#include "testutil.h"

#define TOKEN_HEX "00112233445566778899aabbccddeeff"

static char g_dir[256];
static char g_hostfile[300];
static int g_port[2];

static void write_file(const char* path, const char* text, mode_t mode) {
  FILE* f = fopen(path, "w");
  T_ASSERT(f);
  fputs(text, f);
  fclose(f);
  T_ASSERT(chmod(path, mode) == 0);
}

static void new_hostfile(void) {
  g_port[0] = t_free_port();
  do /* a port the kernel handed out once may come again */
    g_port[1] = t_free_port();
  while (g_port[1] == g_port[0]);
  char buf[200];
  snprintf(buf, sizeof buf, "[[\"127.0.0.1:%d\"], [\"127.0.0.1:%d\"]]\n", g_port[0], g_port[1]);
  snprintf(g_hostfile, sizeof g_hostfile, "%s/hostfile.json", g_dir);
  write_file(g_hostfile, buf, 0644);
}

/* ---- sockets of this process that listen (from /proc) ---- */

static int listening_sockets(void) {
  /* inodes of this process's sockets */
  long inodes[512];
  int ni = own_socket_inodes(inodes, 512);
  int count = 0;
  const char* tables[2] = {"/proc/self/net/tcp", "/proc/self/net/tcp6"};
  for (int t = 0; t < 2; t++) {
    FILE* f = fopen(tables[t], "r");
    if (!f) continue;
    char line[512];
    while (fgets(line, sizeof line, f)) {
      char st[8];
      long ino = 0;
      if (sscanf(line, " %*d: %*s %*s %7s %*s %*s %*s %*s %*s %ld", st, &ino) != 2) continue;
      if (strcmp(st, "0A") != 0) continue;
      for (int i = 0; i < ni; i++)
        if (inodes[i] == ino) count++;
    }
    fclose(f);
  }
  return count;
}

/* ---- the ranks ---- */

typedef struct job {
  const char* secret[2];   /* MLXDIST_SECRET_FILE per rank, or NULL */
  bool token;              /* MLXDIST_JOB_TOKEN=TOKEN_HEX on both ranks */
  const char* token_value; /* or this value */
  double delay[2];         /* before init */
  bool split;              /* split after init: no socket added, no listener */
  double connect_timeout;  /* 0: the default */
} job;

static void check_sum(mlx_distributed_group g, int base) {
  int size = mlx_distributed_group_size(g), rank = mlx_distributed_group_rank(g);
  int v[64];
  for (int i = 0; i < 64; i++) v[i] = base + rank * 64 + i;
  int shape[1] = {64};
  mlx_array x = mlx_array_new_data(v, shape, 1, MLX_INT32), y = mlx_array_new();
  T_EQ_INT(mlx_distributed_all_sum(&y, x, g, mlx_stream_new()), 0);
  T_EQ_INT(mlx_array_eval(y), 0);
  const int32_t* d = mlx_array_data_int32(y);
  for (int i = 0; i < 64; i++) T_EQ_INT(d[i], size * (base + i) + 64 * size * (size - 1) / 2);
  mlx_array_free(x);
  mlx_array_free(y);
}

static const job* g_job;
static atomic_bool g_split_done;

/* rank 0 during split: split makes no connection, so no socket may listen */
static void* split_watcher(void* arg) {
  (void)arg;
  int seen = 0;
  while (!atomic_load(&g_split_done)) {
    if (listening_sockets() > 0) seen++;
    sleep_s(0.001);
  }
  T_CHECKF(seen == 0, "split opened a listening socket (seen %d times)", seen);
  return NULL;
}

static int rank_main(int rank) {
  const job* j = g_job;
  if (j->delay[rank] > 0) sleep_s(j->delay[rank]);
  double t0 = now_s();
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init(&g, true, "ring") != 0) {
    fprintf(stderr, "rank %d: init failed after %.2f s: %s\n", rank, now_s() - t0, t_last_error());
    return 4;
  }
  double took = now_s() - t0;
  fprintf(stderr, "rank %d: init took %.3f s\n", rank, took);
  T_CHECKF(listening_sockets() == 0, "rank %d: a listening socket is left after init", rank);
  check_sum(g, 1000);
  bool freed = false;
  if (j->split) {
    pthread_t th;
    long ino[512];
    int before = own_socket_inodes(ino, 512);
    atomic_store(&g_split_done, false);
    T_ASSERT(pthread_create(&th, NULL, split_watcher, NULL) == 0);
    mlx_distributed_group h = mlx_distributed_group_new();
    double s0 = now_s();
    if (mlx_distributed_group_split(&h, g, 0, rank) != 0) T_FAIL("split: %s", t_last_error());
    double split_s = now_s() - s0;
    atomic_store(&g_split_done, true);
    pthread_join(th, NULL);
    fprintf(stderr, "rank %d: split took %.3f s\n", rank, split_s);
    T_CHECKF(split_s < 5, "rank %d: split took %.1f s", rank, split_s);
    int after = own_socket_inodes(ino, 512);
    T_CHECKF(after == before, "rank %d: split changed this rank's sockets (%d before, %d after)",
             rank, before, after);
    /* the parent freed first: the child keeps the connections it shares */
    mlx_distributed_group_free(g);
    freed = true;
    check_sum(h, 5000);
    mlx_distributed_group_free(h);
  }
  if (!freed) mlx_distributed_group_free(g);
  mlx_distributed_clear_backends();
  return t_check_failures() ? 1 : 0;
}

static pid_t start_rank(const job* j, int rank) {
  fflush(NULL);
  pid_t p = fork();
  T_ASSERT(p >= 0);
  if (p) return p;
  char path[300], rs[8];
  snprintf(path, sizeof path, "%s/rank%d.err", g_dir, rank);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || dup2(fd, 2) < 0) _exit(99);
  snprintf(rs, sizeof rs, "%d", rank);
  setenv("MLX_RANK", rs, 1);
  setenv("MLX_HOSTFILE", g_hostfile, 1);
  setenv("MLXDIST_TRANSPORT", "tcp", 1);
  unsetenv("MLX_WORLD_SIZE");
  if (j->secret[rank])
    setenv("MLXDIST_SECRET_FILE", j->secret[rank], 1);
  else
    unsetenv("MLXDIST_SECRET_FILE");
  if (j->token_value)
    setenv("MLXDIST_JOB_TOKEN", j->token_value, 1);
  else if (j->token)
    setenv("MLXDIST_JOB_TOKEN", TOKEN_HEX, 1);
  else
    unsetenv("MLXDIST_JOB_TOKEN");
  char ct[32];
  snprintf(ct, sizeof ct, "%g", j->connect_timeout > 0 ? j->connect_timeout : 10.0);
  setenv("MLXDIST_CONNECT_TIMEOUT", ct, 1);
  t_capture_errors();
  g_job = j;
  int rc = rank_main(rank);
  fflush(NULL);
  exit(rc);
}

/* Wait (bounded) for a rank; its exit status. */
static char* rank_err(int rank) {
  char path[300];
  snprintf(path, sizeof path, "%s/rank%d.err", g_dir, rank);
  return read_text(path);
}

/* ---- intruders ---- */

static void hello_bytes(unsigned char* out, const unsigned char* token, int rank, unsigned flags) {
  mlxd_hs_msg h;
  memset(&h, 0, sizeof h);
  h.rank = (uint32_t)rank;
  h.size = 2;
  h.conn = 0;
  h.nconn = 1;
  h.flags = flags;
  memcpy(h.token, token, MLXD_HS_TOKEN_BYTES);
  for (int i = 0; i < MLXD_HS_NONCE_BYTES; i++) h.nonce[i] = (unsigned char)(i * 7);
  mlxd_hs_encode_hello(out, &h);
}

static void attack_garbage(int port) { send_garbage(port); }

static void attack_silence(int port) {
  for (int i = 0; i < 20; i++) keep(dial(port));
}

static void attack_other(int port) {
  unsigned char other[MLXD_HS_TOKEN_BYTES], h[MLXD_HS_HELLO_BYTES];
  memset(other, 0x5a, sizeof other);
  hello_bytes(h, other, 1, 0);
  int fd = dial(port);
  send_all(fd, h, sizeof h);
  keep(fd);
}

/* Rank 0's reply to the hello sent on fd, read whole (what an honest peer
 * waits for before its confirm). */
static void read_reply(int fd, const char* who) {
  unsigned char reply[MLXD_HS_REPLY_BYTES];
  size_t got = 0;
  while (got < sizeof reply) {
    ssize_t k = recv(fd, reply + got, sizeof reply - got, 0);
    if (k <= 0) break;
    got += (size_t)k;
  }
  T_CHECKF(got == sizeof reply, "%s got no reply (%zu bytes)", who, got);
}

static void attack_claim(int port) {
  /* the right token (sniffed, say), claiming rank 1, without the secret */
  unsigned char tok[MLXD_HS_TOKEN_BYTES], h[MLXD_HS_HELLO_BYTES], c[MLXD_HS_CONFIRM_BYTES];
  T_ASSERT(mlxd_hs_token_parse(TOKEN_HEX, tok) == 0);
  hello_bytes(h, tok, 1, MLXD_HS_FLAG_SECRET);
  int fd = dial(port);
  send_all(fd, h, sizeof h);
  read_reply(fd, "the claim");
  unsigned char guess[MLXD_HS_MAC_BYTES];
  memset(guess, 0xab, sizeof guess);
  mlxd_hs_encode_confirm(c, guess);
  send_all(fd, c, sizeof c);
  keep(fd);
}

/* a rank-1 handshake recorded earlier: replayed as is */
static unsigned char g_rec[MLXD_HS_HELLO_BYTES + MLXD_HS_CONFIRM_BYTES];

/* The recorded bytes in the order rank 1 sent them: the hello, then, once
 * rank 0 has replied, the confirm. The hello carries no proof, so a replay
 * shows only in the confirm, checked against rank 0's fresh nonce after its
 * reply. Sent at once, the confirm could come before the reply, which rank 0
 * refuses as that, not as a replay, when it holds the hello unanswered (its
 * own dial to rank 1 open, P_DEFER in net/mesh.h): which refusal depended on
 * timing. */
static void attack_replay(int port) {
  int fd = dial(port);
  send_all(fd, g_rec, MLXD_HS_HELLO_BYTES);
  read_reply(fd, "the replay");
  send_all(fd, g_rec + MLXD_HS_HELLO_BYTES, MLXD_HS_CONFIRM_BYTES);
  keep(fd);
}

/* 300 connections as fast as they go, until the port closes (the job formed). */
static int g_flooded;
static void* flooder(void* arg) {
  int port = *(int*)arg;
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  for (int i = 0; i < 300; i++) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr*)&a, sizeof a) != 0) {
      if (fd >= 0) close(fd);
      break;
    }
    if (i % 3 == 0) (void)!send(fd, "xxxxxxxx", 8, MSG_NOSIGNAL);
    keep(fd);
    g_flooded++;
  }
  return NULL;
}

/* Play rank 0 for a real rank 1 once (with the secret), recording what it sends. */
static void record_handshake(const job* j) {
  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)g_port[0]),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  T_ASSERT(bind(lfd, (struct sockaddr*)&a, sizeof a) == 0 && listen(lfd, 4) == 0);
  pid_t r1 = start_rank(j, 1);
  int fd = accept(lfd, NULL, NULL);
  T_ASSERT(fd >= 0);
  T_ASSERT(recv(fd, g_rec, MLXD_HS_HELLO_BYTES, MSG_WAITALL) == MLXD_HS_HELLO_BYTES);
  mlxd_secret s;
  mlxd_status st = {0};
  T_ASSERT(mlxd_secret_load_path(j->secret[1], &s, &st) == 0);
  unsigned char key[32], tok[MLXD_HS_TOKEN_BYTES], buf[MLXD_HS_REPLY_BYTES];
  T_ASSERT(mlxd_secret_derive(&s, "handshake", key) == 0);
  T_ASSERT(mlxd_hs_token_parse(TOKEN_HEX, tok) == 0);
  mlxd_hs_expect e = {0, 2, 1, tok, true, false};
  mlxd_hs_msg h, r;
  T_EQ_INT(mlxd_hs_check_hello(g_rec, MLXD_HS_HELLO_BYTES, &e, &h), MLXD_HS_OK);
  memset(&r, 0, sizeof r);
  r.size = 2;
  r.nconn = 1;
  r.flags = MLXD_HS_FLAG_SECRET;
  memcpy(r.token, tok, sizeof tok);
  memset(r.nonce, 0x11, sizeof r.nonce);
  T_ASSERT(mlxd_hs_mac(key, false, tok, 2, 1, 0, 1, 0, h.nonce, r.nonce, r.mac) == 0);
  mlxd_hs_encode_reply(buf, &r);
  send_all(fd, buf, sizeof buf);
  T_ASSERT(recv(fd, g_rec + MLXD_HS_HELLO_BYTES, MLXD_HS_CONFIRM_BYTES, MSG_WAITALL) ==
           MLXD_HS_CONFIRM_BYTES);
  kill(r1, SIGKILL); /* it now waits for the rest of its group: no longer needed */
  wait_child(r1, 5);
  close(fd);
  close(lfd);
}

/* ---- the cases ---- */

static char g_secret[300], g_secret2[300];

static void make_secrets(void) {
  snprintf(g_secret, sizeof g_secret, "%s/secret", g_dir);
  snprintf(g_secret2, sizeof g_secret2, "%s/secret2", g_dir);
  write_file(g_secret, "0123456789abcdef0123456789abcdef\n", 0600);
  write_file(g_secret2, "fedcba9876543210fedcba9876543210\n", 0600);
}

/* Something listens on 127.0.0.1:port (/proc/self/net/tcp: this network
 * namespace's sockets, so a child's too), found without connecting to it. */
static bool port_listens(long port) {
  char want[32];
  snprintf(want, sizeof want, "0100007F:%04lX", (unsigned long)port);
  FILE* f = fopen("/proc/self/net/tcp", "r");
  if (!f) return false;
  char line[512];
  bool found = false;
  while (!found && fgets(line, sizeof line, f)) {
    char local[64], st[8];
    if (sscanf(line, " %*d: %63s %*s %7s", local, st) == 2 && !strcmp(local, want) &&
        !strcmp(st, "0A"))
      found = true;
  }
  fclose(f);
  return found;
}

/* Rank 0 first; attack; then rank 1; both must succeed in time and rank 0
 * must name the intruder with want. */
static void run_intruded(job* j, void (*attack)(int port), bool flood, const char* want) {
  new_hostfile();
  if (attack == attack_replay) record_handshake(j);
  double t0 = now_s();
  pid_t r0 = start_rank(j, 0);
  t_wait_until(port_listens, g_port[0], "rank 0 listening", 20);
  pthread_t th;
  pid_t r1;
  if (flood) { /* 100 silent ones first (more than the 64 pending allowed), then more */
    for (int i = 0; i < 100; i++) keep(dial(g_port[0]));
    /* rank 1 is forked before the flooding thread exists: a child forked from a
     * multi-threaded process may not start threads (ThreadSanitizer refuses it) */
    r1 = start_rank(j, 1);
    T_ASSERT(pthread_create(&th, NULL, flooder, &g_port[0]) == 0);
  } else {
    attack(g_port[0]);
    r1 = start_rank(j, 1);
  }
  int c1 = wait_child(r1, 20), c0 = wait_child(r0, 20);
  if (flood) {
    pthread_join(th, NULL);
    printf("flood: 100 + %d connections\n", g_flooded);
  }
  double took = now_s() - t0;
  close_kept();
  char* e0 = rank_err(0);
  char* e1 = rank_err(1);
  T_CHECKF(c0 == 0 && c1 == 0, "the job failed (rank 0: %d, rank 1: %d)\nrank 0:\n%s\nrank 1:\n%s",
           c0, c1, e0, e1);
  T_CHECKF(strstr(e0, "[ring] rank 0: refused a connection from 127.0.0.1:") && strstr(e0, want),
           "rank 0 did not log the intruder ('%s'):\n%s", want, e0);
  if (flood)
    T_CHECKF(strstr(e0, "more refused connections not shown"), "no count of the rest:\n%s", e0);
  T_CHECKF(took < 8, "the job took %.1f s", took);
  printf("--- rank 0's stderr (%.2f s in all):\n%s", took, e0);
  free(e0);
  free(e1);
}

/* A 2-rank job over TCP with a secret: split adds no socket, opens no
 * listener, and its child outlives its parent. */
static int case_split(void) {
  make_secrets();
  job j = {.token = true, .split = true};
  j.secret[0] = j.secret[1] = g_secret;
  new_hostfile();
  double t0 = now_s();
  pid_t r0 = start_rank(&j, 0), r1 = start_rank(&j, 1);
  int c1 = wait_child(r1, 30), c0 = wait_child(r0, 30);
  double took = now_s() - t0;
  char* e0 = rank_err(0);
  char* e1 = rank_err(1);
  T_CHECKF(c0 == 0 && c1 == 0, "split job failed (%d, %d):\nrank 0:\n%s\nrank 1:\n%s", c0, c1, e0,
           e1);
  T_CHECKF(took < 10, "the job took %.1f s", took);
  printf("--- rank 0's stderr (%.2f s in all):\n%s--- rank 1's stderr:\n%s", took, e0, e1);
  free(e0);
  free(e1);
  return t_exit_status();
}

static int case_init(const char* kind) {
  make_secrets();
  job j = {.token = true};
  if (!strcmp(kind, "garbage")) {
    run_intruded(&j, attack_garbage, false, "not an mlxdist handshake (wrong magic)");
  } else if (!strcmp(kind, "silence")) {
    run_intruded(&j, attack_silence, false, "it had sent nothing when the set-up ended");
  } else if (!strcmp(kind, "other")) {
    j.token = true;
    run_intruded(&j, attack_other, false, "wrong job token");
  } else if (!strcmp(kind, "other_hostfile")) { /* the token derived from the hostfile */
    j.token = false;
    run_intruded(&j, attack_other, false, "wrong job token");
  } else if (!strcmp(kind, "claim")) {
    j.secret[0] = j.secret[1] = g_secret;
    run_intruded(&j, attack_claim, false, "the proof does not match this rank's secret");
  } else if (!strcmp(kind, "replay")) {
    j.secret[0] = j.secret[1] = g_secret;
    run_intruded(&j, attack_replay, false, "or a replayed handshake");
  } else if (!strcmp(kind, "flood")) {
    run_intruded(&j, NULL, true, "too many connections waiting for a handshake");
  } else {
    T_FAIL("unknown kind '%s'", kind);
  }
  return t_exit_status();
}

static int case_secret(const char* mode) {
  make_secrets();
  job j = {.token = true, .connect_timeout = 3};
  j.secret[0] = g_secret;
  j.secret[1] = !strcmp(mode, "wrong") ? g_secret2 : NULL;
  new_hostfile();
  double t0 = now_s();
  pid_t r0 = start_rank(&j, 0), r1 = start_rank(&j, 1);
  int c1 = wait_child(r1, 20), c0 = wait_child(r0, 20);
  double took = now_s() - t0;
  char* e0 = rank_err(0);
  char* e1 = rank_err(1);
  T_CHECKF(c0 != 0 && c1 != 0, "a rank joined without the secret (%d, %d)", c0, c1);
  /* Lazy connections: both ranks dial. Whichever gets the other's answer
   * first says the secrets differ; the other either says so too or fails
   * to connect, naming the connection it refused and why (the secret). */
  T_CHECKF(strstr(e0, "the shared secret did not match") ||
               strstr(e1, "the shared secret did not match"),
           "no rank says the secrets differ:\n%s%s", e0, e1);
  const char* es[2] = {e0, e1};
  for (int r = 0; r < 2; r++)
    T_CHECKF(strstr(es[r], "the shared secret did not match") ||
                 (strstr(es[r], "refused") && strstr(es[r], "secret")),
             "rank %d's error does not name the secret:\n%s", r, es[r]);
  T_CHECKF(took < 8, "failing took %.1f s (bound: 3 s)", took);
  printf("--- rank 0:\n%s--- rank 1:\n%s", e0, e1);
  free(e0);
  free(e1);
  return t_exit_status();
}

/* MLXDIST_JOB_TOKEN that is not 32 hex digits: an error naming it, at once. */
static int case_badtoken(void) {
  const char* bad[3] = {"xyz", "00112233445566778899aabbccddeef",
                        "00112233445566778899aabbccddeefg"};
  for (int i = 0; i < 3; i++) {
    job j = {.token_value = bad[i]};
    new_hostfile();
    double t0 = now_s();
    int c = wait_child(start_rank(&j, 0), 10);
    char* e = rank_err(0);
    char want[120];
    snprintf(want, sizeof want, "MLXDIST_JOB_TOKEN='%s' ", bad[i]);
    T_CHECKF(c != 0 && strstr(e, want) && strstr(e, "expected empty, or exactly 32 hex digits"),
             "'%s': exit %d:\n%s", bad[i], c, e);
    /* "at once" on the rank's own clock (its init, printed by rank_main): the
     * fork and the exit (LeakSanitizer's scan under ASan) on a busy host are
     * not the refusal's; the wall clock only backs it up */
    double own = -1;
    const char* at = strstr(e, "init failed after ");
    if (at) sscanf(at, "init failed after %lf", &own);
    T_CHECKF(own >= 0 && own < 2, "'%s' took %.2f s in the rank to refuse", bad[i], own);
    T_CHECKF(now_s() - t0 < 8, "'%s': the rank ended %.1f s after its start", bad[i], now_s() - t0);
    if (i == 0) printf("%s", e);
    free(e);
  }
  return t_exit_status();
}

/* ---- mlxdist-launch --secret ---- */

/* Under the launcher: the secret file is private, only its path is in the
 * environment, the job token is 32 hex digits; prints the path. */
static int case_checkenv(void) {
  const char* path = getenv("MLXDIST_SECRET_FILE");
  const char* tok = getenv("MLXDIST_JOB_TOKEN");
  unsigned char t[MLXD_HS_TOKEN_BYTES];
  T_REQUIRE(path && tok);
  T_CHECKF(mlxd_hs_token_parse(tok, t) == 0, "MLXDIST_JOB_TOKEN='%s'", tok);
  struct stat sf, sd;
  char dir[300];
  snprintf(dir, sizeof dir, "%s", path);
  *strrchr(dir, '/') = '\0';
  T_REQUIRE(stat(path, &sf) == 0 && stat(dir, &sd) == 0);
  T_CHECKF((sf.st_mode & 0777) == 0600, "secret file mode %o", (unsigned)(sf.st_mode & 0777));
  T_CHECKF((sd.st_mode & 0777) == 0700, "secret dir mode %o", (unsigned)(sd.st_mode & 0777));
  char* secret = read_text(path);
  T_CHECKF(strlen(secret) == 65, "secret of %zu bytes", strlen(secret));
  secret[64] = '\0';
  extern char** environ;
  for (char** e = environ; *e; e++) T_CHECKF(!strstr(*e, secret), "the secret is in %s", *e);
  free(secret);
  printf("secret file: %s\n", path);
  return t_exit_status();
}

static int case_launchsecret(const char* launcher, const char* self) {
  char out[300];
  snprintf(out, sizeof out, "%s/launch.out", g_dir);
  fflush(NULL);
  pid_t p = fork();
  T_ASSERT(p >= 0);
  if (p == 0) {
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0) _exit(99);
    execl(launcher, launcher, "-n", "2", "--secret", "--timeout", "20", "--", self, "checkenv",
          (char*)NULL);
    _exit(127);
  }
  int c = wait_child(p, 30);
  char* text = read_text(out);
  printf("%s", text);
  T_CHECKF(c == 0, "the launcher exited %d", c);
  const char* at = strstr(text, "secret file: ");
  T_REQUIRE(at);
  char path[300];
  T_REQUIRE(sscanf(at + 13, "%299s", path) == 1);
  struct stat sb;
  T_CHECKF(stat(path, &sb) != 0 && errno == ENOENT, "%s is left after the launcher", path);
  *strrchr(path, '/') = '\0';
  T_CHECKF(stat(path, &sb) != 0 && errno == ENOENT, "%s is left after the launcher", path);
  free(text);
  /* and a job with it works */
  p = fork();
  T_ASSERT(p >= 0);
  if (p == 0) {
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0) _exit(99);
    execl(launcher, launcher, "-n", "2", "--secret", "--timeout", "20", "--", self, "job", "3", "0",
          "0", (char*)NULL);
    _exit(127);
  }
  c = wait_child(p, 30);
  text = read_text(out);
  printf("%s", text);
  T_CHECKF(c == 0 && strstr(text, "job 3 rank 1: sum 601 (right)"), "the --secret job failed");
  free(text);
  return t_exit_status();
}

/* ---- two launcher jobs, one hostfile ---- */

static int case_job(int id, double d0, double d1) {
  int rank = atoi(getenv("MLX_RANK"));
  sleep_s(rank == 0 ? d0 : d1);
  t_capture_errors();
  mlx_distributed_group g = mlx_distributed_group_new();
  if (mlx_distributed_init(&g, true, "ring") != 0) {
    fprintf(stderr, "job %d rank %d: init failed: %s\n", id, rank, t_last_error());
    return 4;
  }
  int v = id * 100 + rank, shape[1] = {1};
  mlx_array x = mlx_array_new_data(&v, shape, 1, MLX_INT32), y = mlx_array_new();
  T_EQ_INT(mlx_distributed_all_sum(&y, x, g, mlx_stream_new()), 0);
  T_EQ_INT(mlx_array_eval(y), 0);
  int got = mlx_array_data_int32(y)[0], want = 2 * id * 100 + 1;
  printf("job %d rank %d: sum %d (%s)\n", id, rank, got, got == want ? "right" : "WRONG");
  mlx_array_free(x);
  mlx_array_free(y);
  mlx_distributed_group_free(g);
  return got == want ? 0 : 3;
}

/* Fork a child whose stdout and stderr go to the file out: the child's pid in
 * the parent, 0 in the child (which _exits 99 if out cannot be its output). */
static pid_t fork_to(const char* out) {
  fflush(NULL);
  pid_t p = fork();
  T_ASSERT(p >= 0);
  if (p) return p;
  int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0) _exit(99);
  return 0;
}

static pid_t start_launcher(const char* launcher, const char* self, int id, double d0, double d1,
                            const char* out) {
  pid_t p = fork_to(out);
  if (p) return p;
  char ids[8], a0[16], a1[16];
  snprintf(ids, sizeof ids, "%d", id);
  snprintf(a0, sizeof a0, "%g", d0);
  snprintf(a1, sizeof a1, "%g", d1);
  execl(launcher, launcher, "--hostfile", g_hostfile, "--timeout", "20", "--env",
        "MLXDIST_CONNECT_TIMEOUT=4", "--env", "MLXDIST_TRANSPORT=tcp", "--", self, "job", ids, a0,
        a1, (char*)NULL);
  _exit(127);
}

static int case_twojobs(const char* launcher, const char* self) {
  /* start orders: (A's rank delays, B's start after A, B's rank delays) */
  struct {
    double a0, a1, b_after, b0, b1;
    const char* what;
  } orders[] = {
      {0, 0, 0.05, 0, 0, "A then B at once"},
      {0, 0.8, 0.2, 0.6, 0,
       "A0 first, then B1, then A1 and B0 (the order a hostfile token "
       "cannot tell apart)"},
      {0.8, 0, 0.2, 0, 0.6, "A1 first, then B0, then A0 and B1"},
      {0, 0, 2.5, 0, 0, "B after A has formed"},
  };
  for (size_t i = 0; i < sizeof orders / sizeof orders[0]; i++) {
    new_hostfile();
    char oa[300], ob[300];
    snprintf(oa, sizeof oa, "%s/jobA.out", g_dir);
    snprintf(ob, sizeof ob, "%s/jobB.out", g_dir);
    pid_t a = start_launcher(launcher, self, 1, orders[i].a0, orders[i].a1, oa);
    sleep_s(orders[i].b_after);
    pid_t b = start_launcher(launcher, self, 2, orders[i].b0, orders[i].b1, ob);
    int ca = wait_child(a, 30), cb = wait_child(b, 30);
    char* ta = read_text(oa);
    char* tb = read_text(ob);
    printf("=== %s: job A exit %d, job B exit %d\n--- A:\n%s--- B:\n%s", orders[i].what, ca, cb, ta,
           tb);
    T_CHECKF(!strstr(ta, "WRONG") && !strstr(tb, "WRONG"), "%s: a job mixed data with the other",
             orders[i].what);
    /* a job that succeeded has both ranks' right sums; one that failed says why */
    const char* texts[2] = {ta, tb};
    int codes[2] = {ca, cb};
    for (int k = 0; k < 2; k++) {
      if (codes[k] == 0) {
        char want[64];
        snprintf(want, sizeof want, "job %d rank 1: sum %d (right)", k + 1, 2 * (k + 1) * 100 + 1);
        T_CHECKF(strstr(texts[k], want), "%s: job %c exited 0 without '%s'", orders[i].what,
                 'A' + k, want);
      } else {
        T_CHECKF(strstr(texts[k], "init failed: [distributed]"),
                 "%s: job %c failed without a clear error", orders[i].what, 'A' + k);
      }
    }
    /* which job wins a race is up to the scheduler; once A has formed, both must succeed */
    if (i == 3) T_CHECKF(ca == 0, "%s: job A (first) failed", orders[i].what);
    if (i == 3) T_CHECKF(cb == 0, "%s: job B (after A) failed", orders[i].what);
    free(ta);
    free(tb);
  }
  return t_exit_status();
}

/* ---- two jobs started by hand with one hostfile (docs/security.md) ---- */

enum { BY_HAND_DERIVED, BY_HAND_TOKENS, BY_HAND_SECRETS };

/* Rank `rank` of job `id` (1: A, 2: B) started by hand (MLX_RANK, MLX_HOSTFILE) with the
 * identity `kind` gives it: the token derived from the hostfile (the same for both jobs), a
 * MLXDIST_JOB_TOKEN of the job's own, or a MLXDIST_SECRET_FILE of the job's own. */
static pid_t start_by_hand(const char* self, int kind, int id, int rank, const char* out) {
  pid_t p = fork_to(out);
  if (p) return p;
  char rs[16], ids[16], secret[300];
  snprintf(rs, sizeof rs, "%d", rank);
  snprintf(ids, sizeof ids, "%d", id);
  snprintf(secret, sizeof secret, "%s/secret%d", g_dir, id);
  const char* tokens[2] = {TOKEN_HEX, "ffeeddccbbaa99887766554433221100"};
  if (setenv("MLX_RANK", rs, 1) || setenv("MLX_HOSTFILE", g_hostfile, 1) ||
      setenv("MLXDIST_CONNECT_TIMEOUT", "4", 1) || unsetenv("MLXDIST_RENDEZVOUS") ||
      unsetenv("MLXDIST_SHM_SESSION") || unsetenv("MLXDIST_JOB_TOKEN") ||
      unsetenv("MLXDIST_SECRET_FILE") ||
      (kind == BY_HAND_TOKENS && setenv("MLXDIST_JOB_TOKEN", tokens[id - 1], 1)) ||
      (kind == BY_HAND_SECRETS && setenv("MLXDIST_SECRET_FILE", secret, 1)))
    _exit(98);
  execl(self, self, "job", ids, "0", "0", (char*)NULL);
  _exit(127);
}

/* How a rank of job id ended: 'r' its job's right sum, 'm' a sum mixing both jobs' data (A0
 * or A1 with B's other rank: 100 + 201), 'f' init failed with the library's error, '?' else. */
static char by_hand_outcome(int code, const char* text, int id) {
  const char* at = strstr(text, "job ");
  int got_id, rank, sum;
  if (code == 4 && strstr(text, "init failed: [distributed]")) return 'f';
  if (!at || sscanf(at, "job %d rank %d: sum %d", &got_id, &rank, &sum) != 3) return '?';
  if (code == 0 && sum == 2 * id * 100 + 1) return 'r';
  if (code == 3 && sum == 301) return 'm';
  return '?';
}

/* The four start orders of docs/security.md, each as two waves (the second starts once
 * every rank of the first has exited, so the first has formed or failed whatever the
 * machine's speed; a real second wave comes milliseconds after the first has connected, and
 * then goes the same way). With the derived token, the waves that pair A's and B's ranks
 * form groups that mix both jobs' data (pinned here: the documented hazard); with a token or
 * a secret of each job's own, no rank ever mixes data and every failure is named. */
static int case_twojobs_by_hand(const char* self) {
  /* ranks: 0 A0, 1 A1, 2 B0, 3 B1 */
  struct {
    int wave1[4], n1, wave2[4], n2;
    const char* what;
    const char* want; /* per kind, per rank: outcomes allowed ("rmf" any) */
  } orders[] = {
      {{0, 1, 2, 3}, 4, {0}, 0, "all four at once", NULL},
      {{0, 3}, 2, {1, 2}, 2, "A0 and B1, then A1 and B0", "mmmm"},
      {{1, 2}, 2, {0, 3}, 2, "A1 and B0, then A0 and B1", "mmmm"},
      {{0, 1}, 2, {2, 3}, 2, "A, then B", "rrrr"},
  };
  const char* kinds[] = {"the token derived from the hostfile",
                         "a MLXDIST_JOB_TOKEN of each job's own",
                         "a MLXDIST_SECRET_FILE of each job's own"};
  for (int id = 1; id <= 2; id++) {
    char path[300];
    snprintf(path, sizeof path, "%s/secret%d", g_dir, id);
    write_file(path,
               id == 1 ? "job A's secret, 32 bytes long...\n" : "job B's secret, another one...\n",
               0600);
  }
  for (int kind = BY_HAND_DERIVED; kind <= BY_HAND_SECRETS; kind++)
    for (size_t i = 0; i < sizeof orders / sizeof orders[0]; i++) {
      new_hostfile();
      char out[4][300];
      int code[4];
      for (int w = 0; w < 2; w++) {
        const int* wave = w ? orders[i].wave2 : orders[i].wave1;
        int n = w ? orders[i].n2 : orders[i].n1;
        pid_t pid[4];
        for (int k = 0; k < n; k++) {
          int r = wave[k];
          snprintf(out[r], sizeof out[r], "%s/rank%d.out", g_dir, r);
          pid[k] = start_by_hand(self, kind, 1 + r / 2, r % 2, out[r]);
        }
        for (int k = 0; k < n; k++) code[wave[k]] = wait_child(pid[k], 30);
      }
      char got[5] = {0};
      printf("=== %s, %s:\n", kinds[kind], orders[i].what);
      for (int r = 0; r < 4; r++) {
        char* text = read_text(out[r]);
        got[r] = by_hand_outcome(code[r], text, 1 + r / 2);
        printf("--- %c%d exit %d (%c):\n%s", 'A' + r / 2, r % 2, code[r], got[r], text);
        free(text);
      }
      for (int r = 0; r < 4; r++) {
        T_CHECKF(got[r] != '?', "%s, %s: %c%d ended neither right, mixed nor with a named error",
                 kinds[kind], orders[i].what, 'A' + r / 2, r % 2);
        if (kind != BY_HAND_DERIVED)
          T_CHECKF(got[r] != 'm', "%s, %s: %c%d mixed both jobs' data", kinds[kind], orders[i].what,
                   'A' + r / 2, r % 2);
      }
      /* a job's ranks end alike (both right, or both failed), the other job's aside */
      if (kind != BY_HAND_DERIVED)
        for (int j = 0; j < 2; j++)
          T_CHECKF(got[2 * j] == got[2 * j + 1], "%s, %s: job %c's ranks ended %c and %c",
                   kinds[kind], orders[i].what, 'A' + j, got[2 * j], got[2 * j + 1]);
      const char* want = orders[i].want;
      if (want && kind != BY_HAND_DERIVED) want = i == 3 ? "rrrr" : "ffff";
      if (want)
        T_CHECKF(!strcmp(got, want), "%s, %s: ended %s (A0 A1 B0 B1), expected %s", kinds[kind],
                 orders[i].what, got, want);
    }
  return t_exit_status();
}

int main(int argc, char** argv) {
  if (argc == 2 && !strcmp(argv[1], "checkenv")) return case_checkenv();
  if (argc >= 5 && !strcmp(argv[1], "job"))
    return case_job(atoi(argv[2]), atof(argv[3]), atof(argv[4]));
  snprintf(g_dir, sizeof g_dir, "/tmp/mlxdist-trust-XXXXXX");
  T_ASSERT(mkdtemp(g_dir));
  int rc = 2;
  if (argc == 3 && !strcmp(argv[1], "init"))
    rc = case_init(argv[2]);
  else if (argc == 2 && !strcmp(argv[1], "split"))
    rc = case_split();
  else if (argc == 3 && !strcmp(argv[1], "secret"))
    rc = case_secret(argv[2]);
  else if (argc == 2 && !strcmp(argv[1], "badtoken"))
    rc = case_badtoken();
  else if (argc == 3 && !strcmp(argv[1], "launchsecret"))
    rc = case_launchsecret(argv[2], argv[0]);
  else if (argc == 3 && !strcmp(argv[1], "twojobs"))
    rc = case_twojobs(argv[2], argv[0]);
  else if (argc == 2 && !strcmp(argv[1], "twojobs_by_hand"))
    rc = case_twojobs_by_hand(argv[0]);
  else
    fprintf(stderr,
            "usage: test_trust init KIND | split | secret wrong|none | twojobs LAUNCHER | "
            "twojobs_by_hand\n");
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", g_dir);
  if (rc == 0) printf("test_trust %s: passed\n", argv[1]);
  return rc;
}
