/* A rank started by mlxdist-launch across hosts: the bootstrap of
 * bootstrap.c, with the all-gather done by the launcher (MLXDIST_RENDEZVOUS).
 *
 * Configuration: MLX_RANK, MLX_WORLD_SIZE, MLXDIST_RENDEZVOUS=<ip>:<port> (or
 * [v6]:port) and MLXDIST_JOB_TOKEN (required: it authenticates both ends),
 * with MLX_HOSTFILE unset. The rank listens as with init_with_all_gather
 * (MLXDIST_RING_ADDR, MLXDIST_IFNAME, MLXDIST_PORT_RANGE), then makes ONE
 * connection to the launcher: it reads the launcher's challenge, sends its
 * hello and address records, and waits for every rank's records, which it
 * accepts only with the launcher's MAC over its own nonce
 * (rendezvous_wire.h has the messages). Everything is bounded by
 * MLXDIST_LAUNCH_TIMEOUT if set (> 0), else MLXDIST_TIMEOUT; a launcher that
 * is not listening yet, or that closes before its challenge, is retried with
 * back-off within that bound. Each failure is one error naming the
 * rendezvous address and what went wrong. */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "net/handshake.h"
#include "net/net.h"
#include "net/rendezvous_wire.h"
#include "security/secret.h"
#include "util/env.h"
#include "util/tunables.h"

typedef struct rdv_boot {
  mlxd_bootstrap bs; /* first: the bootstrap sees only this */
  mlxd_net_addr where;
  unsigned char key[MLXD_RDV_KEY_BYTES];
  double timeout_s;
  double deadline;
} rdv_boot;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int rdv_fail(const rdv_boot* b, mlxd_status* st, int code, const char* what,
                    const char* call, int err) {
  mlxd_fail_at(st, code, MLXD_LAYER_BOOTSTRAP,
               "rendezvous with the launcher at %s (MLXDIST_RENDEZVOUS): %s", b->where.text, what);
  if (call && err) mlxd_status_set_sys(st, call, err);
  return code;
}

/* Wait until fd is ready for events or the deadline. 1 ready, 0 timed out, -1 error. */
static int wait_fd(int fd, short events, double deadline) {
  for (;;) {
    double left = deadline - now_s();
    if (left <= 0) return 0;
    struct pollfd p = {.fd = fd, .events = events};
    int ms = left > 1000.0 ? 1000000 : (int)(left * 1000) + 1;
    int k = poll(&p, 1, ms);
    if (k > 0) return 1;
    if (k < 0 && errno != EINTR) return -1;
  }
}

/* Read exactly n bytes by the deadline. 0; 1 the peer closed (after got bytes); -1 error
 * (errno), -2 timed out. */
static int read_full(int fd, void* buf, size_t n, double deadline, size_t* got) {
  *got = 0;
  while (*got < n) {
    int w = wait_fd(fd, POLLIN, deadline);
    if (w == 0) return -2;
    if (w < 0) return -1;
    ssize_t k = recv(fd, (char*)buf + *got, n - *got, MSG_DONTWAIT);
    if (k == 0) return 1;
    if (k < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      return -1;
    }
    *got += (size_t)k;
  }
  return 0;
}

static int write_full(int fd, const void* buf, size_t n, double deadline) {
  size_t done = 0;
  while (done < n) {
    int w = wait_fd(fd, POLLOUT, deadline);
    if (w == 0) return -2;
    if (w < 0) return -1;
    ssize_t k = send(fd, (const char*)buf + done, n - done, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      return -1;
    }
    done += (size_t)k;
  }
  return 0;
}

/* Connect and read the challenge, retrying (back-off) while the launcher is not
 * there yet or closes before its challenge. Returns the fd, or -1 with st set. */
static int connect_challenged(rdv_boot* b, unsigned char snonce[MLXD_RDV_NONCE_BYTES],
                              mlxd_status* st) {
  double backoff = 0.05;
  int last_err = 0;
  const char* last_what = "no attempt";
  for (int attempt = 0;; attempt++) {
    if (attempt > 0) {
      double left = b->deadline - now_s();
      if (left <= 0) break;
      double s = backoff < left ? backoff : left;
      struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
      nanosleep(&ts, NULL);
      backoff = backoff * 2 > 1.0 ? 1.0 : backoff * 2;
    }
    if (now_s() >= b->deadline) break;
    int fd = socket(b->where.sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      rdv_fail(b, st, MLXD_ESYS, "cannot create a socket", "socket", errno);
      return -1;
    }
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int err = 0;
    if (connect(fd, (struct sockaddr*)&b->where.sa, b->where.len) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        int w = wait_fd(fd, POLLOUT, b->deadline);
        socklen_t len = sizeof err;
        err = 0;
        if (w <= 0)
          err = w == 0 ? ETIMEDOUT : errno;
        else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
          err = errno;
      }
    }
    if (err) {
      close(fd);
      last_err = err;
      last_what = "cannot connect";
      continue;
    }
    unsigned char ch[MLXD_RDV_CHALLENGE_BYTES];
    size_t got = 0;
    int rc = read_full(fd, ch, sizeof ch, b->deadline, &got);
    if (rc == 0) {
      char why[200];
      if (mlxd_rdv_challenge_decode(ch, snonce, why, sizeof why) != 0) {
        close(fd);
        char what[300];
        snprintf(what, sizeof what, "its first message is not a challenge: %s", why);
        rdv_fail(b, st, MLXD_EREMOTE, what, NULL, 0);
        return -1;
      }
      return fd;
    }
    close(fd);
    last_err = rc == -1 ? errno : 0;
    last_what = rc == -2 ? "no challenge from the launcher"
                         : "the launcher closed the connection before its challenge";
  }
  char what[300];
  snprintf(what, sizeof what,
           "did not reach the launcher within %g s (MLXDIST_LAUNCH_TIMEOUT, else "
           "MLXDIST_TIMEOUT): %s%s%s",
           b->timeout_s, last_what, last_err ? ": " : "", last_err ? strerror(last_err) : "");
  return rdv_fail(b, st, MLXD_ETIMEDOUT, what, NULL, 0), -1;
}

static int rdv_all_gather(mlxd_bootstrap* bs, void* dst, const void* src, size_t n,
                          mlxd_status* st) {
  rdv_boot* b = (rdv_boot*)bs;
  if (n == 0 || n % MLXD_RDV_REC_UNIT || n > MLXD_RDV_MAX_REC_BYTES ||
      (uint64_t)n * (uint64_t)bs->size > MLXD_RDV_MAX_TOTAL)
    return rdv_fail(b, st, MLXD_EINVAL, "this rank's records do not fit the protocol", NULL, 0);
  unsigned char snonce[MLXD_RDV_NONCE_BYTES], cnonce[MLXD_RDV_NONCE_BYTES];
  if (mlxd_random_bytes(cnonce, sizeof cnonce, st)) return st->code;
  b->deadline = now_s() + b->timeout_s;
  int fd = connect_challenged(b, snonce, st);
  if (fd < 0) return st->code;
  unsigned char hello[MLXD_RDV_HELLO_BYTES], rep[MLXD_RDV_REPLY_BYTES];
  char what[MLXD_RDV_MAX_REASON + 300];
  size_t got = 0;
  int rc = 0;
  if (mlxd_rdv_hello_encode(hello, b->key, snonce, bs->rank, bs->size, cnonce, src, n) != 0) {
    rc = rdv_fail(b, st, MLXD_ESYS, "cannot compute the hello's MAC (libcrypto)", NULL, 0);
    goto out;
  }
  int w = write_full(fd, hello, sizeof hello, b->deadline);
  if (w == 0) w = write_full(fd, src, n, b->deadline);
  if (w != 0) {
    rc = rdv_fail(b, st, w == -2 ? MLXD_ETIMEDOUT : MLXD_ESYS,
                  w == -2 ? "sending the hello timed out" : "sending the hello failed", "send",
                  w == -1 ? errno : 0);
    goto out;
  }
  mlxd_net_log("rank %d of %d: posted %zu bytes of records to the rendezvous at %s", bs->rank,
               bs->size, n, b->where.text);
  rc = read_full(fd, rep, sizeof rep, b->deadline, &got);
  if (rc != 0) {
    if (rc == -2)
      snprintf(what, sizeof what,
               "no reply within %g s (MLXDIST_LAUNCH_TIMEOUT, else MLXDIST_TIMEOUT): the other "
               "ranks did not all arrive, or the launcher is stuck",
               b->timeout_s);
    else
      snprintf(what, sizeof what, "the launcher %s before its reply (%zu of %d bytes)",
               rc == 1 ? "closed the connection" : "connection failed", got, MLXD_RDV_REPLY_BYTES);
    rc = rdv_fail(b, st, rc == -2 ? MLXD_ETIMEDOUT : MLXD_EREMOTE, what, "recv",
                  rc == -1 ? errno : 0);
    goto out;
  }
  mlxd_rdv_reply r;
  char why[200];
  uint32_t expect = (uint32_t)(n * (size_t)bs->size);
  if (mlxd_rdv_reply_decode(rep, expect, &r, why, sizeof why) != 0) {
    snprintf(what, sizeof what, "malformed reply: %s", why);
    rc = rdv_fail(b, st, MLXD_EREMOTE, what, NULL, 0);
    goto out;
  }
  unsigned char reason[MLXD_RDV_MAX_REASON];
  void* payload = r.status == MLXD_RDV_OK ? dst : reason;
  rc = read_full(fd, payload, r.len, b->deadline, &got);
  if (rc != 0) {
    snprintf(what, sizeof what, "the launcher's reply was cut short (%zu of %u bytes: %s)", got,
             (unsigned)r.len, rc == -2 ? "timed out" : "connection closed");
    rc = rdv_fail(b, st, rc == -2 ? MLXD_ETIMEDOUT : MLXD_EREMOTE, what, NULL, 0);
    goto out;
  }
  bool authentic = mlxd_rdv_reply_verify(rep, &r, b->key, snonce, cnonce, payload);
  char text[MLXD_RDV_MAX_REASON + 1];
  if (r.status != MLXD_RDV_OK) mlxd_rdv_reason_text(reason, r.len, text, sizeof text);
  if (r.status == MLXD_RDV_REFUSED && !authentic) {
    snprintf(what, sizeof what,
             "the launcher refused this rank: MLXDIST_JOB_TOKEN is not the launcher's job token "
             "(a rank of another job?) (it says: %s)",
             text);
    rc = rdv_fail(b, st, MLXD_EINVAL, what, NULL, 0);
  } else if (!authentic) {
    rc = rdv_fail(b, st, MLXD_EINVAL,
                  "the reply does not authenticate with MLXDIST_JOB_TOKEN: not this job's "
                  "launcher (another job's, or someone else at that address)",
                  NULL, 0);
  } else if (r.status != MLXD_RDV_OK) {
    snprintf(what, sizeof what, "the launcher gave up: %s", text);
    rc = rdv_fail(b, st, MLXD_EREMOTE, what, NULL, 0);
  } else {
    rc = 0;
  }
out:
  close(fd);
  return rc;
}

bool mlxd_net_rendezvous_configured(void) {
  const char* h = mlxd_env_get("MLX_HOSTFILE");
  const char* v = mlxd_env_get("MLXDIST_RENDEZVOUS");
  return (!h || !*h) && v && *v;
}

int mlxd_net_bootstrap_rendezvous(const mlxd_net_maker* maker, mlxd_backend** out,
                                  mlxd_status* st) {
  rdv_boot b;
  memset(&b, 0, sizeof b);
  const char* v = mlxd_tunable_str(MLXD_T_RENDEZVOUS);
  char why[300];
  if (!v || !*v || mlxd_net_parse_addr(v, false, &b.where, why, sizeof why) != 0 ||
      b.where.sa.ss_family == AF_UNSPEC)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "MLXDIST_RENDEZVOUS='%.100s' is not the launcher's address (%s); "
                        "expected ip:port or [ipv6]:port, as mlxdist-launch sets it",
                        v ? v : "",
                        v && *v && b.where.sa.ss_family != AF_UNSPEC
                            ? why
                            : "a host name or nothing, not an IP literal");
  const char* tok = mlxd_tunable_str(MLXD_T_JOB_TOKEN);
  if (!tok || !*tok)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "MLXDIST_RENDEZVOUS is set (%s) but MLXDIST_JOB_TOKEN is not: the "
                        "rendezvous needs the job's token (32 hex digits, as mlxdist-launch "
                        "passes it)",
                        b.where.text);
  if (mlxd_hs_token_parse(tok, b.key) != 0)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "MLXDIST_JOB_TOKEN is not a job token (expected exactly %d hex digits, "
                        "as mlxdist-launch sets it)",
                        2 * MLXD_RDV_KEY_BYTES);
  double lt = mlxd_tunable_double(MLXD_T_LAUNCH_TIMEOUT);
  b.timeout_s = lt > 0 ? lt : mlxd_tunable_double(MLXD_T_TIMEOUT);
  b.bs.all_gather = rdv_all_gather;
  mlxd_net_log("rendezvous with the launcher at %s (bound %g s)", b.where.text, b.timeout_s);
  int rc = mlxd_net_bootstrap(&b.bs, maker, out, st);
  mlxd_wipe(b.key, sizeof b.key);
  return rc;
}
