/* Inside the soft-RoCE VM (tests/vm/rxe_vm.sh): the verbs device layer
 * (rdma/ibv.h) on a real device, with real data between two processes.
 *   test_vm_ibv DEV [ROUNDS]
 * Two processes (fork) open DEV, register memory, make RC queue pairs,
 * exchange their addresses (mlxd_ibv_qp_info) over a socketpair, connect,
 * then: an RDMA write, a write with immediate data (the receive completion
 * carries it, the data is in place), a zero-byte write with immediate data,
 * a read; the completion channel wakes a poll() only when a completion
 * arrives; a write to the peer stopped (SIGSTOP) still completes; after the
 * peer is killed (SIGKILL) a signaled write completes with an error status
 * within 2 s (printed, with the time it took). ROUNDS (default 1) repeats
 * the two processes' part, for the spread of that time. Also:
 * a device that is not there, a malformed queue pair address, the memlock
 * check under a tiny RLIMIT_MEMLOCK, and ibv_reg_mr refused by it (without
 * CAP_IPC_LOCK) naming the limit. */
#include <errno.h>
#include <inttypes.h>
#include <linux/capability.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rdma/ibv.h"
#include "testutil.h"

#define BUF (1u << 20)
#define BOUND_MS 10000 /* every wait of this test */

static const char* g_dev = "rxe0";
static double g_dead_s[16]; /* how long each round's dead peer took to be reported */
static int g_rounds;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_us(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

/* ---- the socketpair between the two processes (bounded) ---- */

static int io_all(int fd, void* buf, size_t n, bool wr) {
  unsigned char* p = buf;
  double end = now_s() + BOUND_MS / 1000.0;
  while (n) {
    struct pollfd pf = {fd, wr ? POLLOUT : POLLIN, 0};
    int left = (int)((end - now_s()) * 1000);
    if (left <= 0 || poll(&pf, 1, left) <= 0) return -1;
    ssize_t k = wr ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
    if (k <= 0) {
      if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
      return -1;
    }
    p += k, n -= (size_t)k;
  }
  return 0;
}
static void say(int fd, char c) { T_REQUIREF(io_all(fd, &c, 1, true) == 0, "send '%c'", c); }
static void hear(int fd, char want) {
  char c = 0;
  T_REQUIREF(io_all(fd, &c, 1, false) == 0, "waiting for '%c': nothing", want);
  T_REQUIREF(c == want, "waiting for '%c', got '%c'", want, c);
}

/* ---- completions (bounded) ---- */

/* The next completion on d within ms: 1 got, 0 none in time. */
static int wait_wc(mlxd_ibv_dev* d, int ms, mlxd_ibv_wc* wc) {
  double end = now_s() + ms / 1000.0;
  mlxd_status st = {0};
  for (;;) {
    int n = mlxd_ibv_poll(d, wc, 1, &st);
    T_REQUIREF(n >= 0, "poll: %s", st.msg);
    if (n == 1) return 1;
    if (now_s() > end) return 0;
    sleep_us(200);
  }
}

static void expect_wc(mlxd_ibv_dev* d, uint64_t wr_id, int kind, const char* what,
                      mlxd_ibv_wc* out) {
  mlxd_ibv_wc wc;
  T_REQUIREF(wait_wc(d, BOUND_MS, &wc) == 1, "%s: no completion within %d ms", what, BOUND_MS);
  printf("  %s: completion wr_id %" PRIu64 ", status %d (%s), kind %d, imm %#x\n", what, wc.wr_id,
         wc.status, mlxd_ibv_wc_status_str(wc.status), wc.kind, wc.imm);
  T_CHECKF(wc.status == 0, "%s: status %s", what, mlxd_ibv_wc_status_str(wc.status));
  T_CHECKF(wc.wr_id == wr_id, "%s: wr_id %" PRIu64 ", want %" PRIu64, what, wc.wr_id, wr_id);
  T_CHECKF(wc.kind == kind, "%s: kind %d, want %d", what, wc.kind, kind);
  if (out) *out = wc;
}

static void fill(unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 31u + seed + (i >> 8));
}
static bool same(const unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != (unsigned char)(i * 31u + seed + (i >> 8))) return false;
  return true;
}

/* ---- one side ---- */

typedef struct side {
  mlxd_ibv_dev* d;
  mlxd_ibv_qp* q;
  mlxd_ibv_mr mr;
  unsigned char* buf;
  uint64_t peer_addr;
  uint32_t peer_rkey;
} side;

static void setup(side* s, int fd, const char* who) {
  mlxd_status st = {0};
  T_REQUIREF(mlxd_ibv_dev_open(g_dev, 64, &s->d, &st) == 0, "%s: open: %s", who, st.msg);
  T_CHECK_EQ(strcmp(mlxd_ibv_dev_name(s->d), g_dev), 0);
  s->buf = aligned_alloc(4096, BUF);
  T_REQUIRE(s->buf != NULL);
  memset(s->buf, 0, BUF);
  T_REQUIREF(mlxd_ibv_memlock_check(BUF, &st) == 0, "%s: memlock: %s", who, st.msg);
  T_REQUIREF(mlxd_ibv_reg(s->d, s->buf, BUF, MLXD_IBV_REMOTE_WRITE | MLXD_IBV_REMOTE_READ, &s->mr,
                          &st) == 0,
             "%s: reg: %s", who, st.msg);
  mlxd_ibv_qp_info self, peer;
  T_REQUIREF(mlxd_ibv_qp_create(s->d, 16, 16, &s->q, &self, &st) == 0, "%s: qp: %s", who, st.msg);
  T_CHECK_EQ(self.qpn, mlxd_ibv_qp_num(s->q));
  T_CHECK_EQ(self.global, 1); /* soft-RoCE: Ethernet */
  T_CHECK(self.psn <= 0xffffff);
  unsigned char msg[MLXD_IBV_QP_INFO_BYTES + 12];
  mlxd_ibv_qp_info_encode(msg, &self);
  uint64_t a = (uint64_t)(uintptr_t)s->buf;
  memcpy(msg + MLXD_IBV_QP_INFO_BYTES, &a, 8);
  memcpy(msg + MLXD_IBV_QP_INFO_BYTES + 8, &s->mr.rkey, 4);
  T_REQUIRE(io_all(fd, msg, sizeof msg, true) == 0);
  T_REQUIRE(io_all(fd, msg, sizeof msg, false) == 0);
  char what[64];
  snprintf(what, sizeof what, "%s's peer's queue pair", who);
  T_REQUIREF(mlxd_ibv_qp_info_decode(msg, what, &peer, &st) == 0, "%s", st.msg);
  memcpy(&s->peer_addr, msg + MLXD_IBV_QP_INFO_BYTES, 8);
  memcpy(&s->peer_rkey, msg + MLXD_IBV_QP_INFO_BYTES + 8, 4);
  T_REQUIREF(mlxd_ibv_qp_connect(s->q, &peer, &st) == 0, "%s: connect: %s", who, st.msg);
  printf("%s: queue pair %u (psn %u) connected to %u (psn %u), mtu %d\n", who, self.qpn, self.psn,
         peer.qpn, peer.psn, mlxd_ibv_dev_mtu(s->d));
}

/* B: the passive side (its memory is written and read), killed at the end. */
static int side_b(int fd) {
  side s = {0};
  mlxd_status st = {0};
  setup(&s, fd, "B");
  fill(s.buf + (128u << 10), 64u << 10, 7); /* for A's read */
  T_REQUIRE(mlxd_ibv_post_recv(s.q, 501, &st) == 0);
  T_REQUIRE(mlxd_ibv_post_recv(s.q, 502, &st) == 0);
  say(fd, 'r'); /* receives posted */
  mlxd_ibv_wc wc;
  expect_wc(s.d, 501, MLXD_IBV_WC_RECV_IMM, "B: write with immediate", &wc);
  T_CHECKF(wc.imm == 0xdeadbeefu, "imm %#x", wc.imm);
  T_CHECKF(same(s.buf, 64u << 10, 1), "B: the plain write's data is not in place");
  T_CHECKF(same(s.buf + (64u << 10), 4096, 2), "B: the write with immediate's data is not there");
  expect_wc(s.d, 502, MLXD_IBV_WC_RECV_IMM, "B: zero-byte write with immediate", &wc);
  T_CHECKF(wc.imm == 42, "imm %u", wc.imm);

  /* the completion channel: quiet until a completion arrives */
  int cfd = mlxd_ibv_fd(s.d);
  T_REQUIRE(cfd >= 0);
  T_REQUIRE(mlxd_ibv_post_recv(s.q, 503, &st) == 0);
  T_REQUIREF(mlxd_ibv_arm(s.d, &st) == 0, "arm: %s", st.msg);
  struct pollfd pf = {cfd, POLLIN, 0};
  int quiet = poll(&pf, 1, 200);
  T_CHECKF(quiet == 0, "the channel is readable with nothing sent (poll %d)", quiet);
  say(fd, 'a'); /* armed */
  double t0 = now_s();
  int woke = poll(&pf, 1, BOUND_MS);
  printf("B: completion channel: poll() woke after %.3f s (%d)\n", now_s() - t0, woke);
  T_CHECKF(woke == 1 && (pf.revents & POLLIN), "poll on the channel: %d, revents %#x", woke,
           pf.revents);
  mlxd_ibv_ack(s.d);
  expect_wc(s.d, 503, MLXD_IBV_WC_RECV_IMM, "B: after the wakeup", &wc);
  T_CHECK_EQ(wc.imm, 7u);
  pf.revents = 0;
  T_CHECKF(poll(&pf, 1, 0) == 0, "the channel is still readable after ack");

  say(fd, t_check_failures() ? 'F' : 'k'); /* ready to be killed ('F': B's checks failed) */
  for (;;) pause();
}

/* A: the active side. */
static void side_a(int fd, pid_t b) {
  side s = {0};
  mlxd_status st = {0};
  setup(&s, fd, "A");
  hear(fd, 'r');
  /* a plain RDMA write, then one with immediate data after it (RC keeps the order) */
  fill(s.buf, 64u << 10, 1);
  fill(s.buf + (64u << 10), 4096, 2);
  T_REQUIREF(mlxd_ibv_post_write(s.q, 1, s.buf, 64u << 10, s.mr.lkey, s.peer_addr, s.peer_rkey,
                                 true, &st) == 0,
             "write: %s", st.msg);
  expect_wc(s.d, 1, MLXD_IBV_WC_SEND_DONE, "A: write", NULL);
  T_REQUIREF(mlxd_ibv_post_write_imm(s.q, 2, s.buf + (64u << 10), 4096, s.mr.lkey,
                                     s.peer_addr + (64u << 10), s.peer_rkey, 0xdeadbeefu, true,
                                     &st) == 0,
             "write_imm: %s", st.msg);
  expect_wc(s.d, 2, MLXD_IBV_WC_SEND_DONE, "A: write with immediate", NULL);
  T_REQUIREF(mlxd_ibv_post_write_imm(s.q, 3, NULL, 0, 0, s.peer_addr, s.peer_rkey, 42, true, &st) ==
                 0,
             "write_imm 0: %s", st.msg);
  expect_wc(s.d, 3, MLXD_IBV_WC_SEND_DONE, "A: zero-byte write with immediate", NULL);
  /* a read of what B wrote into its own memory */
  T_REQUIREF(mlxd_ibv_post_read(s.q, 4, s.buf + (256u << 10), 64u << 10, s.mr.lkey,
                                s.peer_addr + (128u << 10), s.peer_rkey, &st) == 0,
             "read: %s", st.msg);
  expect_wc(s.d, 4, MLXD_IBV_WC_SEND_DONE, "A: read", NULL);
  T_CHECKF(same(s.buf + (256u << 10), 64u << 10, 7), "A: the read brought other data");
  /* an unsignaled write: no completion */
  T_REQUIRE(mlxd_ibv_post_write(s.q, 5, s.buf, 512, s.mr.lkey, s.peer_addr, s.peer_rkey, false,
                                &st) == 0);
  mlxd_ibv_wc wc;
  T_CHECKF(wait_wc(s.d, 300, &wc) == 0, "an unsignaled write completed (wr_id %" PRIu64 ")",
           wc.wr_id);
  /* wake B's poll() on its completion channel */
  hear(fd, 'a');
  sleep_us(300000);
  T_REQUIRE(mlxd_ibv_post_write_imm(s.q, 6, NULL, 0, 0, s.peer_addr, s.peer_rkey, 7, true, &st) ==
            0);
  expect_wc(s.d, 6, MLXD_IBV_WC_SEND_DONE, "A: write with immediate for the channel", NULL);

  /* B stopped (SIGSTOP): its kernel still answers, the write completes: a stopped peer is
   * not seen by the device layer (the transport's heartbeats tell it) */
  hear(fd, 'k'); /* 'F': B's checks failed (printed above) */
  T_REQUIRE(kill(b, SIGSTOP) == 0);
  int ws = 0;
  T_REQUIRE(waitpid(b, &ws, WUNTRACED) == b && WIFSTOPPED(ws));
  T_REQUIRE(mlxd_ibv_post_write(s.q, 70, s.buf, 4096, s.mr.lkey, s.peer_addr, s.peer_rkey, true,
                                &st) == 0);
  expect_wc(s.d, 70, MLXD_IBV_WC_SEND_DONE, "A: write to a stopped peer", NULL);
  /* B dies: the next signaled write completes with an error */
  T_REQUIRE(kill(b, SIGKILL) == 0);
  T_REQUIRE(waitpid(b, &ws, 0) == b);
  double t0 = now_s();
  T_REQUIREF(mlxd_ibv_post_write(s.q, 7, s.buf, 4096, s.mr.lkey, s.peer_addr, s.peer_rkey, true,
                                 &st) == 0,
             "write to a dead peer: %s", st.msg);
  int got = wait_wc(s.d, BOUND_MS, &wc);
  double dt = now_s() - t0;
  T_REQUIREF(got == 1, "no completion within %d ms after the peer died", BOUND_MS);
  printf("A: write to a killed peer: status %d (%s), vendor_err %u, after %.3f s\n", wc.status,
         mlxd_ibv_wc_status_str(wc.status), wc.vendor_err, dt);
  T_CHECKF(wc.status != 0, "the write to a dead peer succeeded");
  T_CHECKF(wc.wr_id == 7, "wr_id %" PRIu64, wc.wr_id);
  T_CHECKF(dt < 2.0, "the dead peer was reported after %.3f s (want < 2 s)", dt);
  g_dead_s[g_rounds++] = dt;
  /* the queue pair is in error: a posted write is flushed (or refused) */
  int rc = mlxd_ibv_post_write(s.q, 8, s.buf, 64, s.mr.lkey, s.peer_addr, s.peer_rkey, true, &st);
  if (rc == 0) {
    T_CHECK(wait_wc(s.d, BOUND_MS, &wc) == 1);
    printf("A: after the error, a write completes: %s\n", mlxd_ibv_wc_status_str(wc.status));
    T_CHECK(wc.status != 0);
  } else {
    printf("A: after the error, posting fails: %s\n", st.msg);
  }
  mlxd_ibv_qp_kill(s.q);
  mlxd_ibv_qp_destroy(s.q);
  mlxd_ibv_dereg(&s.mr);
  T_CHECK(s.mr.handle == NULL);
  mlxd_ibv_dereg(&s.mr); /* cleared: a no-op */
  mlxd_ibv_dev_close(s.d);
  free(s.buf);
}

static void data(void) {
  int sv[2];
  T_REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  fflush(stdout);
  pid_t b = fork();
  T_REQUIRE(b >= 0);
  if (b == 0) {
    close(sv[0]);
    alarm(60); /* never outlives the test */
    side_b(sv[1]);
    _exit(t_exit_status());
  }
  close(sv[1]);
  side_a(sv[0], b);
  close(sv[0]);
}

/* ---- errors ---- */

static void expect_has(const char* what, const char* msg, const char* part) {
  T_CHECKF(strstr(msg, part) != NULL, "%s: '%s' lacks '%s'", what, msg, part);
}

static void errors(void) {
  mlxd_status st = {0};
  mlxd_ibv_dev* d = NULL;
  T_CHECK(mlxd_ibv_dev_open("mlx5_9", 16, &d, &st) != 0 && d == NULL);
  printf("open mlx5_9: %s\n", st.msg);
  expect_has("no such device", st.msg, "no RDMA device 'mlx5_9' on this machine (devices here: ");
  expect_has("no such device", st.msg, g_dev);
  T_CHECK_EQ(st.layer, MLXD_LAYER_VERBS);

  /* a malformed queue pair address */
  mlxd_ibv_qp_info q = {.qpn = 0x1234, .psn = 5, .global = 1, .mtu = 3, .gid = {[10] = 0xff}};
  unsigned char rec[MLXD_IBV_QP_INFO_BYTES];
  mlxd_ibv_qp_info_encode(rec, &q);
  rec[2] = 9;
  mlxd_ibv_qp_info back;
  mlxd_status_clear(&st);
  T_CHECK(mlxd_ibv_qp_info_decode(rec, "rank 1's queue pair for rank 0, rail 0", &back, &st) != 0);
  printf("decode of a bad mtu: %s\n", st.msg);
  expect_has("bad mtu", st.msg, "rank 1's queue pair for rank 0, rail 0: mtu 9");

  /* connecting to an InfiniBand peer from an Ethernet port */
  mlxd_status_clear(&st);
  T_REQUIREF(mlxd_ibv_dev_open(g_dev, 16, &d, &st) == 0, "open: %s", st.msg);
  mlxd_ibv_qp* qp = NULL;
  mlxd_ibv_qp_info self;
  T_REQUIREF(mlxd_ibv_qp_create(d, 4, 4, &qp, &self, &st) == 0, "qp: %s", st.msg);
  mlxd_ibv_qp_info ib = {.qpn = 0x99, .psn = 1, .lid = 3, .global = 0, .mtu = 5};
  T_CHECK(mlxd_ibv_qp_connect(qp, &ib, &st) != 0);
  printf("connect to an InfiniBand peer: %s\n", st.msg);
  expect_has("link layers", st.msg, "is on InfiniBand but this port is on Ethernet (RoCE)");
  mlxd_ibv_qp_destroy(qp);
  mlxd_ibv_dev_close(d);
}

/* ---- RLIMIT_MEMLOCK ---- */

static void drop_ipc_lock(void) {
  struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct c[2];
  T_REQUIRE(syscall(SYS_capget, &h, c) == 0);
  c[0].effective &= ~(1u << CAP_IPC_LOCK);
  c[0].permitted &= ~(1u << CAP_IPC_LOCK);
  c[0].inheritable &= ~(1u << CAP_IPC_LOCK);
  T_REQUIREF(syscall(SYS_capset, &h, c) == 0, "capset: %s", strerror(errno));
}

static int memlock_child(void) {
  struct rlimit rl = {65536, 65536};
  T_REQUIRE(setrlimit(RLIMIT_MEMLOCK, &rl) == 0);
  mlxd_status st = {0};
  /* root, with CAP_IPC_LOCK: the kernel would pin past the limit, and so the check passes */
  T_CHECKF(mlxd_ibv_memlock_check(BUF, &st) == 0, "with CAP_IPC_LOCK: %s", st.msg);
  /* without it, the limit counts */
  drop_ipc_lock();
  T_CHECK(mlxd_ibv_memlock_check(4096, &st) == 0);
  T_CHECK(mlxd_ibv_memlock_check(BUF, &st) == MLXD_EUNAVAIL);
  printf("memlock check of %u bytes under a 64 KiB limit: %s\n", BUF, st.msg);
  expect_has("memlock", st.msg, "RDMA needs 1048576 bytes locked in memory");
  expect_has("memlock", st.msg, "RLIMIT_MEMLOCK (soft) allows 65536 bytes");
  expect_has("memlock", st.msg, "ulimit -l unlimited");
  expect_has("memlock", st.msg, "LimitMEMLOCK=infinity");
  expect_has("memlock", st.msg, "limits.conf");
  T_CHECK_EQ(st.layer, MLXD_LAYER_VERBS);
  /* the kernel enforces it too (without CAP_IPC_LOCK): register past it */
  mlxd_ibv_dev* d = NULL;
  mlxd_status_clear(&st);
  T_REQUIREF(mlxd_ibv_dev_open(g_dev, 16, &d, &st) == 0, "open: %s", st.msg);
  unsigned char* big = aligned_alloc(4096, BUF);
  T_REQUIRE(big != NULL);
  memset(big, 1, BUF);
  mlxd_ibv_mr mr;
  mlxd_status_clear(&st);
  int rc = mlxd_ibv_reg(d, big, BUF, MLXD_IBV_REMOTE_WRITE, &mr, &st);
  printf("ibv_reg_mr of %u bytes under a 64 KiB limit, no CAP_IPC_LOCK: rc %d: %s\n", BUF, rc,
         st.msg);
  T_CHECK(rc != 0);
  expect_has("reg", st.msg, ": ibv_reg_mr failed (registering 1048576 bytes): ");
  expect_has("reg", st.msg, "RLIMIT_MEMLOCK (soft) allows 65536 bytes");
  T_CHECKF(st.sys_errno == ENOMEM || st.sys_errno == EPERM, "errno %d", st.sys_errno);
  if (rc == 0) mlxd_ibv_dereg(&mr);
  mlxd_ibv_dev_close(d);
  free(big);
  return t_exit_status();
}

static void memlock(void) {
  fflush(stdout);
  pid_t p = fork();
  T_REQUIRE(p >= 0);
  if (p == 0) {
    alarm(60);
    _exit(memlock_child());
  }
  int ws = 0;
  T_REQUIRE(waitpid(p, &ws, 0) == p);
  T_CHECKF(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "the memlock child: status %#x", ws);
}

int main(int argc, char** argv) {
  if (argc >= 2) g_dev = argv[1];
  int rounds = argc >= 3 ? atoi(argv[2]) : 1;
  if (rounds < 1 || rounds > 16) {
    fprintf(stderr, "usage: test_vm_ibv DEV [ROUNDS (1..16)]\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  alarm(120); /* the whole program is bounded */
  printf("== errors\n");
  errors();
  for (int r = 0; r < rounds; r++) {
    printf("== data between two processes (round %d of %d)\n", r + 1, rounds);
    data();
  }
  if (g_rounds > 0) {
    double lo = g_dead_s[0], hi = g_dead_s[0], sum = 0;
    for (int i = 0; i < g_rounds; i++) {
      lo = g_dead_s[i] < lo ? g_dead_s[i] : lo;
      hi = g_dead_s[i] > hi ? g_dead_s[i] : hi;
      sum += g_dead_s[i];
    }
    printf("a killed peer reported after %.3f s on average over %d round(s) (%.3f..%.3f s)\n",
           sum / g_rounds, g_rounds, lo, hi);
  }
  printf("== RLIMIT_MEMLOCK\n");
  memlock();
  int rc = t_exit_status();
  printf("test_vm_ibv: %s\n", rc == 0 ? "passed" : "FAILED");
  return rc;
}
