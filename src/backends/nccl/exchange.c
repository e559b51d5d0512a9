/* The nccl side channel: a star all-gather authenticated by the ring's
 * handshake (exchange.h). */
#include "backends/nccl/exchange.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/net.h"
#include "security/secret.h"
#include "util/clock.h"
#include "util/env.h"

/* MLX_NCCL_TIMEOUT is in milliseconds, as MLX's (its default: 300000). */
#define NCCL_TIMEOUT_DEFAULT_S 300.0
#define NCCL_TIMEOUT_MAX_MS 86400000.0 /* one day */
#define LEN_BYTES 8                    /* the payload's length, u64 big-endian, after the confirm */
/* A failure with an errno: the message, then ": strerror" (none for 0). */
__attribute__((format(printf, 4, 5))) static int fail_sys(mlxd_status* st, int code, int err,
                                                          const char* fmt, ...) {
  char msg[MLXD_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  int rc = err ? mlxd_fail(st, code, "%s: %s", msg, strerror(err)) : mlxd_fail(st, code, "%s", msg);
  st->sys_errno = err;
  return rc;
}

#define HANDSHAKE_S 10.0 /* a connection must be proven within this (a squatter is dropped) */
#define MAX_PENDING 64   /* connections rank 0 keeps at once beyond the group's */
#define MAX_ACTIVE 256   /* ... and for the group's ranks still sending (finished ones: an fd) */
#define RETRY_S 0.05     /* a rank dropped by a full rank 0 reconnects after this */

static void put_u64(unsigned char* p, uint64_t v) {
  for (int i = 7; i >= 0; i--, v >>= 8) p[i] = (unsigned char)v;
}
static uint64_t get_u64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = v << 8 | p[i];
  return v;
}

static int env_long(const char* name, long lo, long hi, bool required, long* out, mlxd_status* st) {
  int rc = mlxd_env_long(name, lo, hi, out);
  if (rc > 0 && !required) return 1;
  if (rc > 0)
    return mlxd_fail(st, MLXD_EUNAVAIL,
                     "[nccl] %s is not set (the nccl backend needs MLX_RANK, "
                     "MLX_WORLD_SIZE, NCCL_HOST_IP and NCCL_PORT)",
                     name);
  if (rc < 0)
    return mlxd_fail(st, MLXD_EINVAL, "[nccl] %s='%.40s' is not an integer in [%ld, %ld]", name,
                     mlxd_env_get(name), lo, hi);
  return 0;
}

/* The all-gather as a bootstrap: whoever uses it (a plugin, through the
 * adapter) writes its idea of rank and size into bs first; they must be
 * the exchange's own. */
static int bs_gather(mlxd_bootstrap* bs, void* dst, const void* src, size_t n, mlxd_status* st) {
  mlxd_nccl_xchg* x = (mlxd_nccl_xchg*)bs;
  if (bs->rank != x->rank || bs->size != x->size)
    return mlxd_fail(st, MLXD_EINVAL,
                     "[nccl] the id exchange was set up for rank %d of %d, used as rank %d of %d",
                     x->rank, x->size, bs->rank, bs->size);
  return mlxd_nccl_xchg_gather(x, dst, src, n, st);
}

int mlxd_nccl_xchg_init(mlxd_nccl_xchg* x, int rank, int size, const char* root,
                        const unsigned char* token, const unsigned char* key, double timeout_s,
                        mlxd_status* st) {
  memset(x, 0, sizeof *x);
  x->listen_fd = -1;
  x->rank = x->bs.rank = rank;
  x->size = x->bs.size = size;
  x->bs.all_gather = bs_gather;
  x->timeout_s = timeout_s;
  if (size < 1 || rank < 0 || rank >= size)
    return mlxd_fail(st, MLXD_EINVAL, "[nccl] rank %d is outside [0, %d)", rank, size);
  char why[160];
  if (mlxd_net_parse_addr(root, rank == 0, &x->root, why, sizeof why) != 0)
    return mlxd_fail(st, MLXD_EINVAL, "[nccl] rank 0's address '%.80s': %s", root, why);
  memcpy(x->auth.token, token, MLXD_NET_TOKEN_BYTES);
  if (key) {
    memcpy(x->auth.key, key, sizeof x->auth.key);
    x->auth.have_key = true;
  }
  return 0;
}

int mlxd_nccl_xchg_from_env(mlxd_nccl_xchg* x, mlxd_status* st) {
  memset(x, 0, sizeof *x);
  x->listen_fd = -1;
  long size = 0, rank = 0, port = 0;
  if (env_long("MLX_WORLD_SIZE", 1, 1 << 20, true, &size, st) ||
      env_long("MLX_RANK", 0, (1 << 20) - 1, true, &rank, st))
    return st->code;
  if (rank >= size)
    return mlxd_fail(st, MLXD_EINVAL, "[nccl] MLX_RANK=%ld is outside [0, MLX_WORLD_SIZE=%ld)",
                     rank, size);
  const char* host = mlxd_env_get("NCCL_HOST_IP");
  if (!host || !*host)
    return mlxd_fail(st, MLXD_EUNAVAIL,
                     "[nccl] NCCL_HOST_IP is not set (rank 0's address: the nccl backend needs "
                     "MLX_RANK, MLX_WORLD_SIZE, NCCL_HOST_IP and NCCL_PORT)");
  if (env_long("NCCL_PORT", 1, 65535, true, &port, st)) return st->code;
  double timeout = NCCL_TIMEOUT_DEFAULT_S;
  const char* t = mlxd_env_get("MLX_NCCL_TIMEOUT");
  if (t && *t) {
    char* end = NULL;
    errno = 0;
    double v = strtod(t, &end);
    if (errno || end == t || *end || !(v > 0) || v > NCCL_TIMEOUT_MAX_MS)
      return mlxd_fail(st, MLXD_EINVAL,
                       "[nccl] MLX_NCCL_TIMEOUT='%.40s' is not a number of milliseconds in (0, "
                       "86400000] (as MLX's: 300000 is 5 minutes)",
                       t);
    timeout = v / 1000.0;
  }
  char root[300];
  bool v6 = strchr(host, ':') != NULL && host[0] != '[';
  snprintf(root, sizeof root, v6 ? "[%.250s]:%ld" : "%.250s:%ld", host, port);
  mlxd_net_auth auth;
  if (mlxd_net_auth_load(&auth, st)) {
    char msg[MLXD_MSG_MAX];
    snprintf(msg, sizeof msg, "%s", st->msg);
    return mlxd_fail(st, st->code, "[nccl] %s", msg);
  }
  bool found = false;
  if (mlxd_net_auth_env_token(&auth, &found, st)) {
    char msg[MLXD_MSG_MAX];
    snprintf(msg, sizeof msg, "%s", st->msg);
    mlxd_net_auth_clear(&auth);
    return mlxd_fail(st, st->code, "[nccl] %s", msg);
  }
  if (!found) {
    /* Cross-job protection only (as a hostfile's token): every rank of the
     * job derives the same one; another job on another port or size cannot. */
    char text[400];
    int w = snprintf(text, sizeof text, "mlxdist nccl token v1|%s|%ld", root, size);
    unsigned char h[32];
    if (mlxd_crypto_init(st)) {
      mlxd_net_auth_clear(&auth);
      return st->code;
    }
    mlxd_sha256(text, (size_t)w, h);
    memcpy(auth.token, h, MLXD_NET_TOKEN_BYTES);
  }
  int rc = mlxd_nccl_xchg_init(x, (int)rank, (int)size, root, auth.token,
                               auth.have_key ? auth.key : NULL, timeout, st);
  mlxd_net_auth_clear(&auth);
  return rc;
}

int mlxd_nccl_xchg_listen(mlxd_nccl_xchg* x, mlxd_status* st) {
  if (x->listen_fd >= 0) return 0;
  if (mlxd_net_listen(&x->root, &x->listen_fd, st)) {
    char msg[MLXD_MSG_MAX];
    snprintf(msg, sizeof msg, "%s", st->msg);
    return mlxd_fail(st, st->code ? st->code : MLXD_ESYS,
                     "[nccl] rank 0 cannot listen on NCCL_HOST_IP:NCCL_PORT (%s): %s", x->root.text,
                     msg);
  }
  x->own_listen = true;
  return 0;
}

void mlxd_nccl_xchg_close(mlxd_nccl_xchg* x) {
  if (x->own_listen && x->listen_fd >= 0) close(x->listen_fd);
  x->listen_fd = -1;
  x->own_listen = false;
  mlxd_net_auth_clear(&x->auth);
}

/* ---- blocking I/O, bounded by a deadline ---- */

/* Move n bytes (send when out) by poll + non-blocking calls. 0, or -1 with
 * *why: ETIMEDOUT, 0 (closed), or an errno. */
static int io_all(int fd, void* buf, size_t n, bool out, double deadline, int* why) {
  unsigned char* p = buf;
  size_t done = 0;
  while (done < n) {
    ssize_t r = out ? send(fd, p + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT)
                    : recv(fd, p + done, n - done, MSG_DONTWAIT);
    if (r > 0) {
      done += (size_t)r;
      continue;
    }
    if (r == 0) {
      *why = 0;
      return -1;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      *why = errno;
      return -1;
    }
    double left = deadline - mlxd_now();
    if (left <= 0) {
      *why = ETIMEDOUT;
      return -1;
    }
    struct pollfd pf = {.fd = fd, .events = out ? POLLOUT : POLLIN};
    int ms = left > 1.0 ? 1000 : (int)(left * 1000) + 1;
    (void)poll(&pf, 1, ms);
  }
  return 0;
}

static const char* io_why(int why) { return why == 0 ? "connection closed" : strerror(why); }

/* ---- rank 0 ---- */

enum { C_HELLO, C_CONFIRM, C_PAYLOAD };

typedef struct conn {
  int fd;
  int state;
  int rank;
  size_t got;
  unsigned char buf[MLXD_HS_HELLO_BYTES > MLXD_HS_CONFIRM_BYTES + LEN_BYTES
                        ? MLXD_HS_HELLO_BYTES
                        : MLXD_HS_CONFIRM_BYTES + LEN_BYTES];
  unsigned char expect_mac[MLXD_HS_MAC_BYTES];
  char peer[MLXD_ADDR_MAX];
  double since; /* accepted at (mlxd_now) */
} conn;

static int refuse(conn* c, const char* fmt, const char* detail) {
  char line[300];
  snprintf(line, sizeof line, fmt, detail);
  fprintf(stderr, "[nccl] rank 0 refused a connection from %s: %s\n", c->peer, line);
  close(c->fd);
  c->fd = -1;
  return -1;
}

/* Close fd with a reset, not a FIN: the peer learns it was dropped for want
 * of room (it retries), not refused (a clean close: it fails at once). */
static void close_reset(int fd) {
  struct linger lg = {.l_onoff = 1, .l_linger = 0};
  (void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
  close(fd);
}

/* The connection to drop when the table is full: one still in its hello
 * (it has not shown this job's token), the oldest that sent nothing at all
 * first, else the oldest; -1 when every one is past the hello (only the
 * job's own get there). A connection whose hello was accepted is never
 * dropped, so a rank between its hello and its confirm stays; one dropped before
 * (a reset) reconnects (peer_gather). */
static int victim(const conn* cs, int cap) {
  int quiet = -1, any = -1;
  for (int i = 0; i < cap; i++) {
    if (cs[i].fd < 0 || cs[i].state != C_HELLO) continue;
    int pending = 0;
    bool silent = cs[i].got == 0 && ioctl(cs[i].fd, FIONREAD, &pending) == 0 && pending == 0;
    if (silent && (quiet < 0 || cs[i].since < cs[quiet].since)) quiet = i;
    if (any < 0 || cs[i].since < cs[any].since) any = i;
  }
  return quiet >= 0 ? quiet : any;
}

/* The hello is complete in c->buf: check it, answer with the reply. */
static int on_hello(mlxd_nccl_xchg* x, conn* c, conn* all, int nall) {
  mlxd_hs_expect e = {
      .self = 0, .size = x->size, .nconn = 1, .token = x->auth.token, .secret = x->auth.have_key};
  mlxd_hs_msg h;
  mlxd_hs_err err = mlxd_hs_check_hello(c->buf, MLXD_HS_HELLO_BYTES, &e, &h);
  if (err != MLXD_HS_OK) return refuse(c, "%s", mlxd_hs_reason(err));
  /* Several connections may claim one rank until one proves it (confirm):
   * a squatter that stops after the hello must not lock the real rank out. */
  (void)all;
  (void)nall;
  c->rank = (int)h.rank;
  mlxd_hs_msg r = {.rank = 0,
                   .size = (uint32_t)x->size,
                   .conn = 0,
                   .nconn = 1,
                   .flags = x->auth.have_key ? MLXD_HS_FLAG_SECRET : 0u};
  memcpy(r.token, x->auth.token, sizeof r.token);
  mlxd_status st;
  mlxd_status_clear(&st);
  if (mlxd_random_bytes(r.nonce, sizeof r.nonce, &st) != 0) return refuse(c, "%.200s", st.msg);
  const unsigned char* key = x->auth.have_key ? x->auth.key : NULL;
  if (mlxd_hs_mac(key, false, x->auth.token, x->size, 1, 0, c->rank, 0, h.nonce, r.nonce, r.mac) !=
          0 ||
      mlxd_hs_mac(key, true, x->auth.token, x->size, 1, 0, c->rank, 0, h.nonce, r.nonce,
                  c->expect_mac) != 0)
    return refuse(c, "%s", "libcrypto failed computing the handshake's MAC");
  unsigned char out[MLXD_HS_REPLY_BYTES];
  mlxd_hs_encode_reply(out, &r);
  int why = 0;
  /* 104 bytes into an idle socket's buffer: immediate, bounded by 1 s anyway. */
  if (io_all(c->fd, out, sizeof out, true, mlxd_now() + 1.0, &why) != 0)
    return refuse(c, "cannot send the reply: %s", io_why(why));
  c->state = C_CONFIRM;
  c->got = 0;
  return 0;
}

/* What rank 0 knows of each rank > 0, a few bytes per rank (MLX_WORLD_SIZE
 * may be large): the connection state itself is per connection (cs). */
enum { R_NONE, R_PROVED, R_DONE };

static int root_gather(mlxd_nccl_xchg* x, unsigned char* dst, const void* src, size_t n,
                       double deadline, mlxd_status* st) {
  int size = x->size;
  memcpy(dst, src, n);
  if (size == 1) return 0;
  if (mlxd_nccl_xchg_listen(x, st)) return st->code;
  int cap = (size - 1 < MAX_ACTIVE ? size - 1 : MAX_ACTIVE) + MAX_PENDING;
  conn* cs = calloc((size_t)cap, sizeof *cs);
  int* done_fd = malloc((size_t)size * sizeof *done_fd); /* a finished rank's connection */
  unsigned char* rs = calloc((size_t)size, 1);           /* R_NONE, R_PROVED, R_DONE */
  struct pollfd* pf = calloc((size_t)cap + 1, sizeof *pf);
  if (!cs || !done_fd || !rs || !pf) {
    free(cs), free(done_fd), free(rs), free(pf);
    return mlxd_fail(st, MLXD_ENOMEM, "[nccl] out of memory for the id exchange");
  }
  for (int i = 0; i < cap; i++) cs[i].fd = -1;
  for (int r = 0; r < size; r++) done_fd[r] = -1;
  int done = 0;
  int rc = 0;
  while (done < size - 1) {
    double left = deadline - mlxd_now();
    if (left <= 0) {
      /* Two lists: ranks never proven, and ranks proven whose part never
       * came whole (their connection dropped or stalled while sending it). */
      char never[200] = "", partial[200] = "";
      size_t un = 0, up = 0;
      for (int r = 1; r < size; r++) {
        if (rs[r] == R_DONE) continue;
        char* into = rs[r] == R_PROVED ? partial : never;
        size_t* used = rs[r] == R_PROVED ? &up : &un;
        if (*used >= sizeof never - 16) continue;
        int w = snprintf(into + *used, sizeof never - *used, "%s%d", *used ? ", " : "", r);
        if (w > 0) *used += (size_t)w;
      }
      char both[460];
      snprintf(both, sizeof both, "%s%s%s%s%s", un ? "ranks that never proved this job: " : "",
               never, un && up ? "; " : "",
               up ? "ranks that proved this job but whose part never arrived whole (their "
                    "connection dropped or stalled): "
                  : "",
               partial);
      rc =
          mlxd_fail(st, MLXD_ETIMEDOUT, "[nccl] rank 0 waited %g s (MLX_NCCL_TIMEOUT) on %s for %s",
                    x->timeout_s, x->root.text, both);
      break;
    }
    int np = 0;
    pf[np++] = (struct pollfd){.fd = x->listen_fd, .events = POLLIN};
    for (int i = 0; i < cap; i++)
      if (cs[i].fd >= 0) pf[np++] = (struct pollfd){.fd = cs[i].fd, .events = POLLIN};
    int ms = left > 1.0 ? 1000 : (int)(left * 1000) + 1;
    if (poll(pf, (nfds_t)np, ms) < 0 && errno != EINTR) {
      rc = fail_sys(st, MLXD_ESYS, errno, "[nccl] rank 0's id exchange: poll failed");
      break;
    }
    if (pf[0].revents & POLLIN) {
      for (;;) {
        struct sockaddr_storage sa;
        socklen_t sl = sizeof sa;
        int fd = accept4(x->listen_fd, (struct sockaddr*)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        int slot = -1;
        for (int i = 0; i < cap && slot < 0; i++)
          if (cs[i].fd < 0) slot = i;
        if (slot < 0) {
          /* Full: drop one that has not shown the job's token, so a flood
           * of silent ones cannot keep the group's own ranks out. */
          slot = victim(cs, cap);
          if (slot < 0) {
            close_reset(fd);
            continue;
          }
          fprintf(stderr,
                  "[nccl] rank 0 dropped a connection from %s: too many connections at once, and "
                  "it had not shown this job's token\n",
                  cs[slot].peer);
          close_reset(cs[slot].fd);
          cs[slot].fd = -1;
        }
        int one = 1;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        conn* c = &cs[slot];
        memset(c, 0, sizeof *c);
        c->fd = fd;
        c->state = C_HELLO;
        c->rank = -1;
        c->since = mlxd_now();
        mlxd_net_format_addr((struct sockaddr*)&sa, c->peer, sizeof c->peer);
      }
    }
    double now = mlxd_now();
    for (int i = 0; i < cap; i++) {
      conn* c = &cs[i];
      if (c->fd < 0) continue;
      if (c->state != C_PAYLOAD && now - c->since > HANDSHAKE_S) {
        refuse(c, "%s", "no complete handshake within 10 s");
        continue;
      }
      for (;;) {
        size_t want = c->state == C_HELLO     ? MLXD_HS_HELLO_BYTES
                      : c->state == C_CONFIRM ? MLXD_HS_CONFIRM_BYTES + LEN_BYTES
                                              : n;
        unsigned char* into = c->state == C_PAYLOAD ? dst + (size_t)c->rank * n : c->buf;
        if (c->got < want) {
          ssize_t r = recv(c->fd, into + c->got, want - c->got, MSG_DONTWAIT);
          if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            if (c->state == C_PAYLOAD)
              refuse(c, "%s",
                     r == 0 ? "its proven rank closed the connection while sending its part"
                            : "the connection failed while its proven rank sent its part");
            else
              refuse(c, "%s",
                     r == 0 ? "it closed the connection mid-handshake"
                            : "the connection failed mid-handshake");
            break;
          }
          if (r < 0) break;
          c->got += (size_t)r;
          if (c->got < want) continue;
        }
        if (c->state == C_HELLO) {
          on_hello(x, c, cs, cap);
          if (c->fd < 0) break;
        } else if (c->state == C_CONFIRM) {
          mlxd_hs_err err = mlxd_hs_check_confirm(c->buf, MLXD_HS_CONFIRM_BYTES, c->expect_mac);
          if (err != MLXD_HS_OK) {
            refuse(c, "%s", mlxd_hs_reason(err));
            break;
          }
          /* One connection per rank past the confirm: a second one proving
           * the same rank would be counted twice and stand in for a rank
           * that never came. */
          bool taken = rs[c->rank] == R_DONE;
          for (int j = 0; j < cap && !taken; j++)
            taken = j != i && cs[j].fd >= 0 && cs[j].rank == c->rank && cs[j].state == C_PAYLOAD;
          if (taken) {
            refuse(c, "%s", "its rank has already proved itself on another connection");
            break;
          }
          uint64_t len = get_u64(c->buf + MLXD_HS_CONFIRM_BYTES);
          if (len != (uint64_t)n) {
            /* a proven member of this job disagrees: the job is broken, say so */
            rc = mlxd_fail(st, MLXD_EINVAL,
                           "[nccl] rank %d sent %llu bytes to the id exchange, rank 0 expects %zu "
                           "(mismatched mlxdist versions?)",
                           c->rank, (unsigned long long)len, n);
            goto out;
          }
          rs[c->rank] = R_PROVED;
          c->state = C_PAYLOAD;
          c->got = 0;
          if (n == 0) continue;
        } else {
          /* whole: the rank's connection leaves the table (its slot is free) */
          rs[c->rank] = R_DONE;
          done_fd[c->rank] = c->fd;
          c->fd = -1;
          done++;
          break;
        }
      }
    }
  }
  if (rc == 0) {
    for (int r = 1; r < size; r++) {
      int why = 0;
      if (io_all(done_fd[r], dst, (size_t)size * n, true, deadline, &why) != 0) {
        rc = mlxd_fail(st, why == ETIMEDOUT ? MLXD_ETIMEDOUT : MLXD_EREMOTE,
                       "[nccl] rank 0 could not send the id exchange's result to rank %d (%s)", r,
                       io_why(why));
        break;
      }
    }
  }
out:
  for (int i = 0; i < cap; i++)
    if (cs[i].fd >= 0) close(cs[i].fd);
  for (int r = 0; r < size; r++)
    if (done_fd[r] >= 0) close(done_fd[r]);
  free(cs), free(done_fd), free(rs), free(pf);
  return rc;
}

/* ---- ranks > 0 ---- */

static int connect_root(mlxd_nccl_xchg* x, double deadline, int* fd_out, mlxd_status* st) {
  int last = 0;
  for (;;) {
    int fd = socket(x->root.sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return fail_sys(st, MLXD_ESYS, errno, "[nccl] cannot create a socket");
    int r = connect(fd, (struct sockaddr*)&x->root.sa, x->root.len);
    if (r != 0 && errno == EINPROGRESS) {
      struct pollfd pf = {.fd = fd, .events = POLLOUT};
      double left = deadline - mlxd_now();
      int ms = left > 1.0 ? 1000 : left > 0 ? (int)(left * 1000) + 1 : 0;
      if (poll(&pf, 1, ms) == 1) {
        int err = 0;
        socklen_t el = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
        r = err ? -1 : 0;
        errno = err ? err : ETIMEDOUT;
      } else {
        r = -1;
        errno = ETIMEDOUT;
      }
    }
    if (r == 0) {
      int one = 1;
      (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      *fd_out = fd;
      return 0;
    }
    last = errno;
    close(fd);
    if (mlxd_now() + 0.1 >= deadline)
      return fail_sys(st, MLXD_ETIMEDOUT, last,
                      "[nccl] rank %d could not reach rank 0 at %s (NCCL_HOST_IP:NCCL_PORT) "
                      "within %g s (MLX_NCCL_TIMEOUT); last connect",
                      x->rank, x->root.text, x->timeout_s);
    usleep(100 * 1000); /* rank 0 may not listen yet */
  }
}

static int peer_gather(mlxd_nccl_xchg* x, unsigned char* dst, const void* src, size_t n,
                       double deadline, mlxd_status* st) {
  int fd = -1;
  int rc = 0, why = 0;
  const char* step = "";
  mlxd_hs_msg h = {.rank = (uint32_t)x->rank,
                   .size = (uint32_t)x->size,
                   .conn = 0,
                   .nconn = 1,
                   .flags = x->auth.have_key ? MLXD_HS_FLAG_SECRET : 0u};
  memcpy(h.token, x->auth.token, sizeof h.token);
  unsigned char hello[MLXD_HS_HELLO_BYTES], reply[MLXD_HS_REPLY_BYTES];
  unsigned char tail[MLXD_HS_CONFIRM_BYTES + LEN_BYTES];
  /* Rank 0 resets a connection it had no room for before reading its hello
   * (a flood of others): connect again, until MLX_NCCL_TIMEOUT. A refusal
   * (another job's token, a bad hello) is a clean close: no retry. */
  for (;;) {
    if (connect_root(x, deadline, &fd, st)) return st->code;
    if (mlxd_random_bytes(h.nonce, sizeof h.nonce, st) != 0) {
      close(fd);
      return st->code;
    }
    mlxd_hs_encode_hello(hello, &h);
    step = "sending the hello";
    if (io_all(fd, hello, sizeof hello, true, deadline, &why) == 0) {
      step = "waiting for rank 0's reply";
      if (io_all(fd, reply, sizeof reply, false, deadline, &why) == 0) break;
    }
    if ((why != ECONNRESET && why != EPIPE) || mlxd_now() + RETRY_S >= deadline) goto io_fail;
    close(fd);
    fd = -1;
    usleep((useconds_t)(RETRY_S * 1e6));
  }
  mlxd_hs_expect e = {.self = x->rank,
                      .size = x->size,
                      .nconn = 1,
                      .token = x->auth.token,
                      .secret = x->auth.have_key};
  mlxd_hs_msg r;
  mlxd_hs_err err = mlxd_hs_check_reply(reply, sizeof reply, &e, 0, 0, &r);
  const unsigned char* key = x->auth.have_key ? x->auth.key : NULL;
  unsigned char mac[MLXD_HS_MAC_BYTES];
  if (err == MLXD_HS_OK) {
    if (mlxd_hs_mac(key, false, x->auth.token, x->size, 1, 0, x->rank, 0, h.nonce, r.nonce, mac) !=
        0)
      err = MLXD_HS_MAC_E;
    else if (!mlxd_hs_mac_equal(mac, r.mac))
      err = MLXD_HS_MAC_E;
  }
  if (err != MLXD_HS_OK) {
    close(fd);
    return mlxd_fail(st, MLXD_EREMOTE,
                     "[nccl] rank %d: the server at %s (NCCL_HOST_IP:NCCL_PORT) is not this job's "
                     "rank 0: %s",
                     x->rank, x->root.text, mlxd_hs_reason(err));
  }
  if (mlxd_hs_mac(key, true, x->auth.token, x->size, 1, 0, x->rank, 0, h.nonce, r.nonce, mac) !=
      0) {
    close(fd);
    return mlxd_fail(st, MLXD_ESYS, "[nccl] libcrypto failed computing the handshake's MAC");
  }
  mlxd_hs_encode_confirm(tail, mac);
  put_u64(tail + MLXD_HS_CONFIRM_BYTES, (uint64_t)n);
  step = "sending the confirm";
  if (io_all(fd, tail, sizeof tail, true, deadline, &why)) goto io_fail;
  step = "sending this rank's part";
  if (n && io_all(fd, (void*)src, n, true, deadline, &why)) goto io_fail;
  step = "waiting for the result (rank 0 waits for every rank)";
  if (io_all(fd, dst, (size_t)x->size * n, false, deadline, &why)) goto io_fail;
  close(fd);
  return 0;
io_fail:
  close(fd);
  rc = mlxd_fail(st, why == ETIMEDOUT ? MLXD_ETIMEDOUT : MLXD_EREMOTE,
                 "[nccl] rank %d, id exchange with rank 0 at %s: %s: %s%s", x->rank, x->root.text,
                 step, io_why(why),
                 why == 0 ? " (rank 0 refused this rank: another job's MLXDIST_JOB_TOKEN or "
                            "secret?)"
                          : "");
  return rc;
}

int mlxd_nccl_xchg_gather(mlxd_nccl_xchg* x, void* dst, const void* src, size_t n,
                          mlxd_status* st) {
  double deadline = mlxd_now() + x->timeout_s;
  if (x->rank == 0) return root_gather(x, dst, src, n, deadline, st);
  return peer_gather(x, dst, src, n, deadline, st);
}
