/* The TCP transport's TLS (MLXDIST_TLS) and its header checks, with real
 * processes and real loopback TCP connections (docs/security.md).
 *
 *   test_tls secrets   same secret works; different secrets, no secret, a bad
 *                      MLXDIST_TLS value, and TLS on one side only all fail
 *                      fast, on both sides, with errors naming the problem; a
 *                      peer that never answers the handshake times out after
 *                      MLXDIST_CONNECT_TIMEOUT
 *   test_tls header    a raw peer sends hostile fragment headers (absurd
 *                      total, offset overflow, oversized fragment, duplicate
 *                      payload, a total beyond the unexpected budget, a huge
 *                      total for a posted receive): the op fails naming the
 *                      peer and the field, with no large allocation
 *                      (RLIMIT_AS and peak RSS)
 *   test_tls capture   tcpdump on lo while 2 ranks all_gather an ASCII pattern:
 *                      found in the capture with TLS off (the control), absent
 *                      with TLS on. Exit 77 (skipped) unless root with tcpdump.
 *
 * Ranks are forked by the rank harness (tests/common/ranks.h); the parent
 * makes the connections before the fork, so rank 1 is the end that
 * connected (the TLS client). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "algo/algo.h"
#include "ranks.h"
#include "testutil.h"
#include "transport/tcp.h"
#include "transport/tcp_wire.h"
#include "transports.h"

static char g_dir[64];
static char g_secret_a[128], g_secret_b[128];

/* A connected loopback TCP pair: fds[0] accepted (rank 0), fds[1] connected (rank 1). */
static void tcp_pair(int fds[2]) {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  T_REQUIRE(l >= 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  T_REQUIRE(bind(l, (struct sockaddr*)&a, sizeof a) == 0 && listen(l, 1) == 0);
  T_REQUIRE(getsockname(l, (struct sockaddr*)&a, &al) == 0);
  fds[1] = socket(AF_INET, SOCK_STREAM, 0);
  T_REQUIRE(fds[1] >= 0 && connect(fds[1], (struct sockaddr*)&a, sizeof a) == 0);
  fds[0] = accept(l, NULL, NULL);
  T_REQUIRE(fds[0] >= 0);
  close(l);
}

/* after_fork: the parent drops its copies, so a rank's close is seen at once. */
static void close_pair(void* arg) {
  int* pair = arg;
  close(pair[0]);
  close(pair[1]);
}

static void write_secret(const char* path, const char* text) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  T_REQUIRE(fd >= 0);
  T_REQUIRE(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
  close(fd);
}

/* Rank r's transport over its end of the pair (the other end is closed). */
static mlxd_transport* rank_transport(const int pair[2], int r, mlxd_status* st) {
  close(pair[1 - r]);
  int fds[2] = {-1, -1};
  fds[1 - r] = pair[r];
  return mlxd_tcp_transport_new(r, 2, fds, 1, st);
}

/* ------------------------------------------------------------ secrets */

typedef struct {
  int pair[2];           /* first: close_pair gets the case */
  const char* tls[2];    /* MLXDIST_TLS per rank (NULL: unset) */
  const char* secret[2]; /* MLXDIST_SECRET_FILE per rank (NULL: unset) */
  bool expect_ok;
  const char* expect[2][2]; /* words rank r's error must contain */
  bool silent[2]; /* rank r says nothing and holds its end until the other closes (<= 20 s) */
} secrets_case;

static int secrets_rank(int r, int size, const char* session, void* arg) {
  (void)size;
  (void)session;
  secrets_case* c = arg;
  if (c->tls[r])
    setenv("MLXDIST_TLS", c->tls[r], 1);
  else
    unsetenv("MLXDIST_TLS");
  if (c->secret[r])
    setenv("MLXDIST_SECRET_FILE", c->secret[r], 1);
  else
    unsetenv("MLXDIST_SECRET_FILE");
  setenv("MLXDIST_TIMEOUT", "5", 1);
  setenv("MLXDIST_CONNECT_TIMEOUT", "2", 1);
  if (c->silent[r]) {
    /* Held until the other rank gives up, not for a fixed time: then only
     * its own bound can end its wait, however slow a loaded host makes it. */
    close(c->pair[1 - r]);
    struct pollfd p = {.fd = c->pair[r], .events = POLLIN};
    char sink[4096];
    double until = t_now() + 20;
    while (t_now() < until && poll(&p, 1, 100) >= 0)
      if (p.revents && read(c->pair[r], sink, sizeof sink) <= 0) break;
    close(c->pair[r]);
    return 0;
  }
  mlxd_status st = {0};
  double t0 = t_now();
  mlxd_transport* t = rank_transport(c->pair, r, &st);
  int rc = 0;
  if (t) { /* exchange a message each way (a plain side notices only then) */
    char out[64], in[64] = {0};
    snprintf(out, sizeof out, "hello from rank %d", r);
    mlxd_req* q[2] = {NULL, NULL};
    rc = t->ops->irecv(t, 1 - r, 7, NULL, in, sizeof in, &q[0], &st);
    if (rc == 0) rc = t->ops->isend(t, 1 - r, 7, NULL, out, sizeof out, &q[1], &st);
    int w = t->ops->waitall(t, q, 2, rc == 0 ? &st : NULL);
    if (rc == 0) rc = w;
    if (rc == 0)
      T_CHECKF(strcmp(in, r ? "hello from rank 0" : "hello from rank 1") == 0, "got '%s'", in);
    t->ops->destroy(t);
  } else {
    rc = st.code;
  }
  double dt = t_now() - t0;
  if (c->expect_ok) {
    T_CHECKF(rc == 0, "rank %d: %s", r, st.msg);
  } else {
    T_CHECKF(rc != 0, "rank %d: succeeded where it must fail", r);
    T_CHECKF(dt < 8 || !c->silent[1 - r], "rank %d took %.1f s to time out (limit 2 s)", r, dt);
    for (int i = 0; i < 2; i++)
      if (c->expect[r][i])
        T_CHECKF(strstr(st.msg, c->expect[r][i]) != NULL, "rank %d: error lacks '%s': %s", r,
                 c->expect[r][i], st.msg);
    T_CHECKF(dt < 6 || c->silent[1 - r], "rank %d took %.1f s to fail", r, dt);
    fprintf(stderr, "rank %d failed as expected in %.2f s: %s\n", r, dt, st.msg);
  }
  return t_exit_status();
}

static void run_secrets(const char* what, secrets_case* c) {
  tcp_pair(c->pair);
  t_ranks_opts o = {.timeout_s = 30, .what = what, .after_fork = close_pair};
  int bad = t_run_ranks(2, secrets_rank, c, &o, NULL);
  T_CHECKF(bad == 0, "%s: %d rank(s) failed", what, bad);
}

static void test_secrets(void) {
  secrets_case same = {.tls = {"1", "1"}, .secret = {g_secret_a, g_secret_a}, .expect_ok = true};
  run_secrets("same secret", &same);
  secrets_case diff = {.tls = {"1", "1"},
                       .secret = {g_secret_a, g_secret_b},
                       .expect = {{"TLS handshake with rank 1", "MLXDIST_SECRET_FILE"},
                                  {"TLS handshake with rank 0", "MLXDIST_SECRET_FILE"}}};
  run_secrets("different secrets", &diff);
  secrets_case none = {.tls = {"1", "1"},
                       .expect = {{"MLXDIST_TLS", "MLXDIST_SECRET_FILE"},
                                  {"MLXDIST_TLS", "MLXDIST_SECRET_FILE"}}};
  run_secrets("no secret", &none);
  secrets_case bad = {.tls = {"yes", "yes"},
                      .secret = {g_secret_a, g_secret_a},
                      .expect = {{"MLXDIST_TLS=yes", "expected 0"},
                                 {"MLXDIST_TLS=yes", "expected 0"}}};
  run_secrets("bad MLXDIST_TLS", &bad);
  /* A peer that never answers the handshake: bounded by MLXDIST_CONNECT_TIMEOUT (2 s here). */
  secrets_case silent = {.tls = {"1", "1"},
                         .secret = {g_secret_a, g_secret_a},
                         .silent = {true, false},
                         .expect = {{NULL, NULL}, {"timed out", "MLXDIST_CONNECT_TIMEOUT"}}};
  run_secrets("silent peer", &silent);
  /* Rank 0 plain, rank 1 TLS: the plain side sees a bad header (the ClientHello). */
  secrets_case half = {.tls = {"0", "1"},
                       .secret = {g_secret_a, g_secret_a},
                       .expect = {{"rank 1", "header"}, {"TLS handshake with rank 0", NULL}}};
  run_secrets("TLS on one side only", &half);
}

/* ------------------------------------------------------------- header */

typedef struct {
  const char* name;
  mlxd_tcp_hdr h[2]; /* sent in turn (a zero total in the second: only one); unsigned */
  size_t payload[2]; /* bytes of payload sent after each header */
  bool posted;       /* rank 0 posts the receive for the tag first */
  int code;          /* expected failure */
  const char* word;  /* the error must contain it */
} hdr_case;

#define ATTACK_TAG 0x2000000000010001ull
#define CTRL_TAG 0xF000000000000000ull

static const hdr_case g_hdr_cases[] = {
    {"absurd total", {{ATTACK_TAG, 0, 16, 1ull << 60, {0}}}, {16}, false, MLXD_EREMOTE, "total"},
    {"total over the unexpected budget",
     {{ATTACK_TAG, 0, 16, 1ull << 36, {0}}},
     {16},
     false,
     MLXD_EREMOTE,
     "MLXDIST_TCP_UNEXPECTED_MB"},
    {"offset overflow", {{ATTACK_TAG, ~0ull - 7, 16, 64, {0}}}, {0}, false, MLXD_EREMOTE, "offset"},
    {"oversized fragment",
     {{ATTACK_TAG, 0, 2u << 20, 4u << 20, {0}}},
     {0},
     false,
     MLXD_EREMOTE,
     "length"},
    {"duplicate payload",
     {{ATTACK_TAG, 0, 32, 64, {0}}, {ATTACK_TAG, 0, 64, 64, {0}}},
     {32, 0},
     false,
     MLXD_EREMOTE,
     "past its total"},
    {"huge total for a posted receive",
     {{ATTACK_TAG, 0, 16, 1ull << 36, {0}}},
     {16},
     true,
     MLXD_EINVAL,
     "size mismatch"},
    /* control frames (tag kind 15: heartbeats, abort records; tcp_wire.h) */
    {"control frame of an unknown kind",
     {{CTRL_TAG | 7, 0, 8, 8, {0}}},
     {8},
     false,
     MLXD_EREMOTE,
     "control frame of unknown kind 7"},
    {"control frame with a sequence number",
     {{CTRL_TAG | (5u << 16) | 1, 0, 4, 4, {0}}},
     {4},
     false,
     MLXD_EREMOTE,
     "control frame with sequence number 5"},
    {"oversized heartbeat",
     {{CTRL_TAG | 1, 0, 64, 64, {0}}},
     {64},
     false,
     MLXD_EREMOTE,
     "kind 1 of 64"},
    {"abort record with an unknown code",
     {{CTRL_TAG | 2, 0, 28, 28, {0}}},
     {28},
     false,
     MLXD_EREMOTE,
     "unknown failure code 0"},
};

static long status_kb(const char* key) {
  FILE* f = fopen("/proc/self/status", "r");
  char line[256];
  long v = -1;
  size_t kl = strlen(key);
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, key, kl) == 0) v = strtol(line + kl, NULL, 10);
  if (f) fclose(f);
  return v;
}

typedef struct {
  int pair[2]; /* first: close_pair gets the run */
  hdr_case c;
} hdr_run;

static int header_rank(int r, int size, const char* session, void* arg) {
  (void)size;
  (void)session;
  const hdr_run* x = arg;
  const hdr_case* c = &x->c;
  const int* pair = x->pair;
  setenv("MLXDIST_TIMEOUT", "10", 1);
  unsetenv("MLXDIST_TLS");
  if (r == 1) { /* the hostile peer: raw bytes, then wait for rank 0 to hang up */
    close(pair[0]);
    int fd = pair[1];
    static unsigned char zeros[64];
    for (int i = 0; i < 2 && c->h[i].total; i++) {
      unsigned char raw[MLXD_TCP_HDR];
      mlxd_tcp_hdr_encode(raw, &c->h[i]);
      T_REQUIRE(write(fd, raw, sizeof raw) == (ssize_t)sizeof raw);
      if (c->payload[i]) T_REQUIRE(write(fd, zeros, c->payload[i]) == (ssize_t)c->payload[i]);
    }
    struct timeval tv = {15, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char b[256];
    while (read(fd, b, sizeof b) > 0) {
    }
    return 0;
  }
  if (!T_SANITIZED) { /* a big allocation would fail with ENOMEM: another error */
    long vm = status_kb("VmSize:");
    T_REQUIRE(vm > 0);
    struct rlimit rl = {.rlim_cur = (rlim_t)(vm + (512 << 10)) * 1024,
                        .rlim_max = (rlim_t)(vm + (512 << 10)) * 1024};
    T_REQUIRE(setrlimit(RLIMIT_AS, &rl) == 0);
  }
  mlxd_status st = {0};
  mlxd_transport* t = rank_transport(pair, 0, &st);
  T_REQUIREF(t, "%s", st.msg);
  static char buf[64];
  mlxd_req* q = NULL;
  double t0 = t_now();
  uint64_t tag = c->posted ? ATTACK_TAG : 1;
  int rc = t->ops->irecv(t, 1, tag, NULL, buf, sizeof buf, &q, &st);
  if (rc == 0) rc = t->ops->waitall(t, &q, 1, &st);
  double dt = t_now() - t0;
  T_CHECKF(rc == c->code, "%s: code %d, expected %d: %s", c->name, rc, c->code, st.msg);
  T_CHECKF(t_status_names_peer(&st, 1), "%s: the error does not name rank 1: %s", c->name, st.msg);
  T_CHECKF(strstr(st.msg, c->word) != NULL, "%s: the error lacks '%s': %s", c->name, c->word,
           st.msg);
  T_CHECKF(dt < 5, "%s: took %.1f s to fail", c->name, dt);
  long hwm = status_kb("VmHWM:");
  T_CHECKF(hwm > 0 && hwm < (T_SANITIZED ? 1 << 20 : 128 << 10), "%s: peak RSS %ld KiB", c->name,
           hwm);
  fprintf(stderr, "%s: failed as expected in %.3f s (peak RSS %ld KiB): %s\n", c->name, dt, hwm,
          st.msg);
  t->ops->destroy(t);
  return t_exit_status();
}

static void test_header(void) {
  for (size_t i = 0; i < sizeof g_hdr_cases / sizeof g_hdr_cases[0]; i++) {
    hdr_run x = {.c = g_hdr_cases[i]};
    tcp_pair(x.pair);
    t_ranks_opts o = {.timeout_s = 40, .what = x.c.name, .after_fork = close_pair};
    int bad = t_run_ranks(2, header_rank, &x, &o, NULL);
    T_CHECKF(bad == 0, "%s: %d rank(s) failed", x.c.name, bad);
  }
}

/* ------------------------------------------------------------ capture */

#define CANARY "MLXDIST-PLAINTEXT-CANARY:"
#define GATHER_BYTES ((size_t)1 << 20)

static int gather_rank(mlxd_transport* t, void* arg) {
  (void)arg;
  char* in = malloc(GATHER_BYTES);
  char* out = malloc(GATHER_BYTES * (size_t)t->size);
  T_REQUIRE(in && out);
  char unit[64];
  int ul = snprintf(unit, sizeof unit, "%s%d|", CANARY, t->rank);
  for (size_t i = 0; i < GATHER_BYTES; i++) in[i] = unit[i % (size_t)ul];
  mlxd_status st;
  T_REQUIREF(mlxd_algo_all_gather(t, 1, NULL, in, out, GATHER_BYTES, &st) == 0, "%s", st.msg);
  for (int r = 0; r < t->size; r++) {
    int l = snprintf(unit, sizeof unit, "%s%d|", CANARY, r);
    for (size_t i = 0; i < GATHER_BYTES; i += 4099)
      T_CHECKF(out[(size_t)r * GATHER_BYTES + i] == unit[i % (size_t)l], "block %d byte %zu", r, i);
  }
  free(in);
  free(out);
  return t_exit_status();
}

/* Occurrences of CANARY in the file at path; *bytes: its size. */
static size_t count_canary(const char* path, size_t* bytes) {
  FILE* f = fopen(path, "rb");
  T_REQUIREF(f, "cannot read the capture %s", path);
  size_t cap = 1 << 20, n = 0, hits = 0;
  char* b = malloc(cap);
  T_REQUIRE(b);
  size_t k;
  while ((k = fread(b + n, 1, cap - n, f)) > 0) {
    n += k;
    if (n == cap) {
      cap *= 2;
      b = realloc(b, cap);
      T_REQUIRE(b);
    }
  }
  fclose(f);
  for (const char* p = b; (p = memmem(p, n - (size_t)(p - b), CANARY, strlen(CANARY)));
       p += strlen(CANARY))
    hits++;
  free(b);
  *bytes = n;
  return hits;
}

typedef struct {
  int pair[2]; /* first: close_pair gets it */
  bool tls;
} gather_run;

static int gather_pair_rank(int r, int size, const char* session, void* arg) {
  (void)size;
  (void)session;
  gather_run* g = arg;
  setenv("MLXDIST_TLS", g->tls ? "1" : "0", 1);
  setenv("MLXDIST_SECRET_FILE", g_secret_a, 1);
  mlxd_status st = {0};
  mlxd_transport* t = rank_transport(g->pair, r, &st);
  T_REQUIREF(t, "%s", st.msg);
  int rc = gather_rank(t, NULL);
  t->ops->destroy(t);
  return rc;
}

/* A number tcpdump printed before `what` in its log ("12 packets dropped by kernel"); -1. */
static long tcpdump_count(const char* log, const char* what) {
  FILE* f = fopen(log, "r");
  char line[512];
  long v = -1;
  while (f && fgets(line, sizeof line, f))
    if (strstr(line, what)) v = strtol(line, NULL, 10);
  if (f) fclose(f);
  return v;
}

/* Capture the loopback traffic of one 2-rank all_gather (only its
 * connection's port: other processes' traffic stays out); returns the
 * pattern's occurrences, the capture's size in *bytes, and the packets the
 * kernel dropped from it in *dropped. */
static size_t capture_gather(bool tls, size_t* bytes, long* dropped) {
  char pcap[128], log[128], filter[64];
  snprintf(pcap, sizeof pcap, "%s/tls%d.pcap", g_dir, tls);
  snprintf(log, sizeof log, "%s/tcpdump%d.log", g_dir, tls);
  gather_run g = {.tls = tls};
  tcp_pair(g.pair);
  struct sockaddr_in a;
  socklen_t al = sizeof a;
  T_REQUIRE(getsockname(g.pair[0], (struct sockaddr*)&a, &al) == 0);
  snprintf(filter, sizeof filter, "tcp port %u", (unsigned)ntohs(a.sin_port));
  pid_t pid = fork();
  T_REQUIRE(pid >= 0);
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execlp("tcpdump", "tcpdump", "-i", "lo", "--immediate-mode", "-U", "-B", "32768", "-s", "0",
           "-w", pcap, filter, (char*)NULL);
    _exit(127);
  }
  bool ready = false; /* tcpdump says "listening on lo" once it captures */
  for (double t0 = t_now(); !ready && t_now() - t0 < 15; usleep(50000)) {
    FILE* f = fopen(log, "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
      if (strstr(line, "listening on")) ready = true;
    if (f) fclose(f);
  }
  if (!ready) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    T_FAIL("tcpdump did not start capturing within 15 s (see %s)", log);
  }
  t_ranks_opts o = {.timeout_s = 60,
                    .what = tls ? "all_gather over TLS" : "all_gather plain",
                    .after_fork = close_pair};
  int bad = t_run_ranks(2, gather_pair_rank, &g, &o, NULL);
  usleep(1200000); /* let tcpdump take the last packets (libpcap delivers in blocks) */
  kill(pid, SIGINT);
  int ws = 0;
  for (double t0 = t_now(); waitpid(pid, &ws, WNOHANG) == 0; usleep(20000)) {
    if (t_now() - t0 > 10) {
      kill(pid, SIGKILL);
      waitpid(pid, &ws, 0);
    }
  }
  T_REQUIREF(bad == 0, "the all_gather failed (TLS %s)", tls ? "on" : "off");
  *dropped = tcpdump_count(log, "dropped by kernel");
  return count_canary(pcap, bytes);
}

static int test_capture(void) {
  if (geteuid() != 0) {
    printf("capture: skipped: needs root to capture on lo\n");
    return 77;
  }
  if (system("command -v tcpdump >/dev/null 2>&1") != 0) {
    printf("capture: skipped: tcpdump is not installed (scripts/setup-debian.sh)\n");
    return 77;
  }
  size_t plain_bytes = 0, tls_bytes = 0, plain = 0, tls = 0;
  long plain_drop = -1, tls_drop = -1;
  for (int attempt = 0; attempt < 3; attempt++) { /* a busy machine may drop packets */
    plain = capture_gather(false, &plain_bytes, &plain_drop);
    tls = capture_gather(true, &tls_bytes, &tls_drop);
    printf(
        "capture: TLS off: %zu occurrences of the pattern in %zu captured bytes (%ld packets "
        "dropped); TLS on: %zu in %zu bytes (%ld dropped)\n",
        plain, plain_bytes, plain_drop, tls, tls_bytes, tls_drop);
    if (plain_drop == 0 && tls_drop == 0) break;
  }
  T_CHECKF(plain_drop == 0 && tls_drop == 0, "tcpdump dropped packets in every attempt");
  T_CHECKF(plain > 1000,
           "the control failed: the plaintext pattern is not in the capture of the "
           "unencrypted all_gather (%zu hits)",
           plain);
  T_CHECKF(tls_bytes > 2 * GATHER_BYTES, "the TLS capture holds only %zu bytes: traffic missed",
           tls_bytes);
  T_CHECKF(tls == 0, "the pattern appears %zu times in the capture with TLS on", tls);
  return t_exit_status();
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: test_tls secrets|header|capture\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  snprintf(g_dir, sizeof g_dir, "/tmp/mlxdist-tls-XXXXXX");
  T_REQUIRE(mkdtemp(g_dir) != NULL);
  snprintf(g_secret_a, sizeof g_secret_a, "%s/a.secret", g_dir);
  snprintf(g_secret_b, sizeof g_secret_b, "%s/b.secret", g_dir);
  write_secret(g_secret_a, "0123456789abcdef-the-first-secret");
  write_secret(g_secret_b, "0123456789abcdef-another-secret!!");
  int rc;
  if (strcmp(argv[1], "secrets") == 0) {
    test_secrets();
    rc = t_exit_status();
  } else if (strcmp(argv[1], "header") == 0) {
    test_header();
    rc = t_exit_status();
  } else if (strcmp(argv[1], "capture") == 0) {
    rc = test_capture();
  } else {
    fprintf(stderr, "test_tls: unknown scenario '%s'\n", argv[1]);
    rc = 2;
  }
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  if (getenv("TLS_TEST_KEEP")) cmd[0] = 0;
  if (cmd[0] && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
  if (rc == 0) printf("%s: ok\n", argv[1]);
  return rc;
}
