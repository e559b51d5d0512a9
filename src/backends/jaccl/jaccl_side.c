/* The jaccl side channel: the coordinator's TCP star and its all-gather
 * (jaccl_side.h). The connections are made by the ring's mesh
 * (net/mesh.c, mlxd_net_mesh_with) restricted to the star's links, so they
 * get its handshake, its trust rules and its bounds; this file only moves
 * the all-gather's frames, non-blocking, under one deadline per round. */
#include "backends/jaccl/jaccl_side.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/net.h"
#include "security/secret.h"
#include "util/bytes.h"
#include "util/clock.h"
#include "util/tunables.h"

#define MAGIC_UP 0x4D584A55u   /* "MXJU": rank r -> rank 0 */
#define MAGIC_DOWN 0x4D584A44u /* "MXJD": rank 0 -> every rank */
#define VERSION 1u

int mlxd_jaccl_side_auth(const mlxd_jaccl_config* cfg, mlxd_net_auth* a, mlxd_status* st) {
  if (mlxd_net_auth_load(a, st)) return st->code;
  bool have = false;
  if (mlxd_net_auth_env_token(a, &have, st)) {
    mlxd_net_auth_clear(a);
    return st->code;
  }
  if (have) return 0;
  if (mlxd_crypto_init(st)) { /* the token below is a digest */
    mlxd_net_auth_clear(a);
    return st->code;
  }
  /* Every rank of the job has the same matrix and coordinator: its token is their digest
   * (cross-job protection only, as the ring's hostfile token). */
  size_t len = 16 + sizeof cfg->coord.text + (size_t)cfg->m.nnames * (MLXD_JACCL_DEV_MAX + 1) +
               ((size_t)cfg->size * (size_t)cfg->size + 1) * 4;
  unsigned char* buf = calloc(1, len);
  if (!buf) {
    mlxd_net_auth_clear(a);
    return mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory");
  }
  size_t k = 0;
  memcpy(buf, "jaccl matrix v1", 15);
  k = 16;
  memcpy(buf + k, cfg->coord.text, strnlen(cfg->coord.text, sizeof cfg->coord.text));
  k += sizeof cfg->coord.text;
  for (size_t c = 0; c <= (size_t)cfg->size * (size_t)cfg->size; c++, k += 4)
    mlxd_put32(buf + k, (uint32_t)cfg->m.off[c]);
  for (int i = 0; i < cfg->m.nnames; i++, k += MLXD_JACCL_DEV_MAX + 1)
    memcpy(buf + k, cfg->m.names[i], strnlen(cfg->m.names[i], MLXD_JACCL_DEV_MAX));
  mlxd_hs_token_records(buf, len, a->token);
  free(buf);
  return 0;
}

void mlxd_jaccl_side_close(mlxd_jaccl_side* sc) {
  if (sc->fds) {
    int n = sc->rank == 0 ? sc->size : 1;
    for (int i = 0; i < n; i++)
      if (sc->fds[i] >= 0) close(sc->fds[i]);
    free(sc->fds);
  }
  sc->fds = NULL;
}

int mlxd_jaccl_side_open(const mlxd_jaccl_config* cfg, const mlxd_net_auth* auth,
                         mlxd_jaccl_side* sc, mlxd_status* st) {
  memset(sc, 0, sizeof *sc);
  sc->rank = cfg->rank;
  sc->size = cfg->size;
  sc->budget = mlxd_tunable_double(MLXD_T_CONNECT_TIMEOUT);
  if (!(sc->budget > 0)) sc->budget = 30;
  snprintf(sc->coord, sizeof sc->coord, "%s", cfg->coord.text);
  if (cfg->size == 1) return 0;
  const int n = cfg->size;
  mlxd_net_hosts hosts = {n, 1, calloc((size_t)n, sizeof(mlxd_net_addr))};
  bool* link = calloc((size_t)n, sizeof *link);
  int* fds = malloc(sizeof(int) * (size_t)n);
  int lfd = -1, rc = 0;
  if (!hosts.addrs || !link || !fds) {
    rc = mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory");
    goto done;
  }
  mlxd_net_addr coord = cfg->coord;
  if (coord.sa.ss_family == AF_UNSPEC) { /* a host name: resolved as the hostfile's are */
    mlxd_net_hosts one = {1, 1, &coord};
    if ((rc = mlxd_net_hostfile_resolve(cfg->coord_var, &one, st))) goto done;
  }
  for (int r = 0; r < n; r++) {
    hosts.addrs[r] = coord;
    link[r] = cfg->rank == 0 ? r != 0 : r == 0;
  }
  if (cfg->rank == 0) {
    mlxd_net_addr a = coord;
    if ((rc = mlxd_net_listen(&a, &lfd, st))) {
      char msg[MLXD_MSG_MAX];
      snprintf(msg, sizeof msg, "%s", st->msg);
      snprintf(st->msg, sizeof st->msg,
               "%.*s (rank 0 listens on the coordinator's address, %s: it must be an address of "
               "this host, at a free port)",
               (int)sizeof st->msg / 2, msg, cfg->coord_var);
      goto done;
    }
  }
  char what[160];
  snprintf(what, sizeof what, "device matrix and coordinator (%s=%s)", cfg->coord_var,
           cfg->coord.text);
  mlxd_net_mesh_opts o = {.tag = "jaccl", .link = link, .what = what};
  if ((rc = mlxd_net_mesh_with(cfg->rank, &hosts, &lfd, auth, &o, fds, st))) goto done;
  for (int r = 0; r < n; r++) {
    if (fds[r] < 0) continue;
    int fl = fcntl(fds[r], F_GETFL);
    if (fl < 0 || fcntl(fds[r], F_SETFL, fl | O_NONBLOCK) < 0) {
      int e = errno;
      mlxd_net_close_all(fds, n);
      rc = mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP,
                        "cannot make the side channel's connection non-blocking");
      mlxd_status_set_sys(st, "fcntl", e);
      goto done;
    }
  }
  sc->fds = fds;
  fds = NULL;
done:
  if (lfd >= 0) close(lfd);
  free(fds);
  free(link);
  free(hosts.addrs);
  return rc;
}

/* A failed round: the channel is closed (peers see it at once). */
static int side_fail(mlxd_jaccl_side* sc, mlxd_status* st) {
  mlxd_jaccl_side_close(sc);
  return st->code ? st->code : MLXD_ESYS;
}

static void put_hdr(unsigned char* h, uint32_t magic, uint32_t round, uint32_t who, uint64_t n) {
  mlxd_put32(h, magic);
  mlxd_put16(h + 4, VERSION);
  mlxd_put16(h + 6, 0);
  mlxd_put32(h + 8, round);
  mlxd_put32(h + 12, who);
  mlxd_put64(h + 16, n);
}

static uint64_t get64(const unsigned char* p) {
  return ((uint64_t)mlxd_get32(p) << 32) | mlxd_get32(p + 4);
}

/* A header from peer (rank r's up frame at rank 0, or rank 0's down frame):
 * NULL when it is the one expected, else why not. */
static const char* check_hdr(const unsigned char* h, uint32_t magic, uint32_t round, uint32_t who,
                             uint64_t n, char* why, size_t len) {
  if (mlxd_get32(h) != magic) return "not a side-channel frame (bad magic)";
  if (mlxd_get16(h + 4) != VERSION) {
    snprintf(why, len, "protocol version %u, this rank speaks %u", mlxd_get16(h + 4), VERSION);
    return why;
  }
  if (mlxd_get16(h + 6) != 0) return "non-zero reserved bytes";
  if (mlxd_get32(h + 8) != round) {
    snprintf(why, len, "it is for all-gather #%u, this rank is at #%u", (unsigned)mlxd_get32(h + 8),
             (unsigned)round);
    return why;
  }
  if (mlxd_get32(h + 12) != who) {
    snprintf(why, len, magic == MAGIC_UP ? "it claims rank %u" : "it says the group has %u ranks",
             (unsigned)mlxd_get32(h + 12));
    return why;
  }
  if (get64(h + 16) != n) {
    snprintf(why, len,
             "it carries %llu bytes per rank, this rank %llu (every rank must make the same "
             "set-up calls: the same mlxdist version and configuration?)",
             (unsigned long long)get64(h + 16), (unsigned long long)n);
    return why;
  }
  return NULL;
}

typedef struct io {
  int fd;
  int peer;
  unsigned char hdr[MLXD_JACCL_SIDE_HDR];
  size_t hgot;       /* header bytes moved */
  unsigned char* p;  /* payload */
  size_t plen, pgot; /* payload bytes, moved */
  bool done;
} io;

/* One non-blocking step of a read (want_read) or write of io: 0 (progress or
 * not), 1 closed by the peer, -1 error (errno). */
static int io_step(io* x, bool reading) {
  for (;;) {
    unsigned char* b;
    size_t left;
    if (x->hgot < MLXD_JACCL_SIDE_HDR) {
      b = x->hdr + x->hgot;
      left = MLXD_JACCL_SIDE_HDR - x->hgot;
    } else if (x->pgot < x->plen) {
      b = x->p + x->pgot;
      left = x->plen - x->pgot;
    } else {
      x->done = true;
      return 0;
    }
    if (left > ((size_t)1 << 30)) left = (size_t)1 << 30;
    ssize_t k = reading ? recv(x->fd, b, left, 0) : send(x->fd, b, left, MSG_NOSIGNAL);
    if (k < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
    if (k == 0) return reading ? 1 : 0;
    if (x->hgot < MLXD_JACCL_SIDE_HDR) {
      x->hgot += (size_t)k;
      if (reading && x->hgot == MLXD_JACCL_SIDE_HDR) return 2; /* the caller checks it */
    } else {
      x->pgot += (size_t)k;
    }
  }
}

/* Drive ios (reads or writes) until all are done or deadline (span seconds
 * after the round began, named in the timeout's message). check: for reads,
 * called when a header is complete (sets plen/p or fails). */
static int run_ios(mlxd_jaccl_side* sc, io* ios, int nio, bool reading, double deadline,
                   double span, int (*check)(mlxd_jaccl_side*, io*, void*, mlxd_status*), void* arg,
                   const char* what, mlxd_status* st) {
  struct pollfd* pfd = calloc((size_t)nio, sizeof *pfd);
  if (!pfd) return mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory");
  int rc = 0;
  for (;;) {
    int left = 0;
    for (int i = 0; i < nio; i++) {
      pfd[i] = (struct pollfd){ios[i].done ? -1 : ios[i].fd, reading ? POLLIN : POLLOUT, 0};
      if (!ios[i].done) left++;
    }
    if (left == 0) break;
    if (mlxd_now() >= deadline) {
      int r = -1;
      for (int i = 0; i < nio && r < 0; i++)
        if (!ios[i].done) r = ios[i].peer;
      if (sc->rank == 0)
        rc = mlxd_fail_at(st, MLXD_ETIMEDOUT, MLXD_LAYER_BOOTSTRAP,
                          "the side channel's all-gather #%u: rank %d %s within %g s "
                          "(MLXDIST_CONNECT_TIMEOUT)",
                          (unsigned)sc->round, r, what, span);
      else
        rc = mlxd_fail_at(st, MLXD_ETIMEDOUT, MLXD_LAYER_BOOTSTRAP,
                          "the side channel's all-gather #%u: the coordinator (rank 0 at %s) %s "
                          "within %g s (%s)",
                          (unsigned)sc->round, sc->coord, what, span,
                          span > sc->budget
                              ? "twice MLXDIST_CONNECT_TIMEOUT: the coordinator answers "
                                "once every rank has sent"
                              : "MLXDIST_CONNECT_TIMEOUT");
      mlxd_status_set_peer(st, r, NULL);
      break;
    }
    int pr = poll(pfd, (nfds_t)nio, mlxd_ms_left(deadline));
    if (pr < 0 && errno != EINTR) {
      int e = errno;
      rc = mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP, "the side channel's poll failed");
      mlxd_status_set_sys(st, "poll", e);
      break;
    }
    for (int i = 0; i < nio && rc == 0; i++) {
      if (ios[i].done || !pfd[i].revents) continue;
      int k;
      while ((k = io_step(&ios[i], reading)) == 2)
        if ((rc = check(sc, &ios[i], arg, st))) break;
      if (rc) break;
      if (k == 1 || k == -1) {
        int e = k == -1 ? errno : 0;
        if (sc->rank == 0)
          rc = mlxd_fail_at(st, MLXD_EREMOTE, MLXD_LAYER_BOOTSTRAP,
                            "rank %d closed the side channel during all-gather #%u (it failed or "
                            "exited; its own error says why)",
                            ios[i].peer, (unsigned)sc->round);
        else
          rc = mlxd_fail_at(st, MLXD_EREMOTE, MLXD_LAYER_BOOTSTRAP,
                            "the coordinator (rank 0 at %s) closed the side channel during "
                            "all-gather #%u (it failed or exited; its own error says why)",
                            sc->coord, (unsigned)sc->round);
        mlxd_status_set_peer(st, ios[i].peer, NULL);
        if (e) mlxd_status_set_sys(st, reading ? "recv" : "send", e);
      }
    }
    if (rc) break;
  }
  free(pfd);
  return rc;
}

typedef struct up_arg {
  unsigned char* dst;
  size_t n;
} up_arg;

/* Rank 0: rank r's header is in: check it, then read its n bytes into place. */
static int check_up(mlxd_jaccl_side* sc, io* x, void* arg, mlxd_status* st) {
  up_arg* a = arg;
  char why[200];
  const char* bad =
      check_hdr(x->hdr, MAGIC_UP, sc->round, (uint32_t)x->peer, a->n, why, sizeof why);
  if (bad) {
    int rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                          "rank %d sent a malformed side-channel frame in all-gather #%u: %s",
                          x->peer, (unsigned)sc->round, bad);
    mlxd_status_set_peer(st, x->peer, NULL);
    return rc;
  }
  x->p = a->dst + (size_t)x->peer * a->n;
  x->plen = a->n;
  return 0;
}

/* Rank r: rank 0's header is in: check it, then read size * n bytes. */
static int check_down(mlxd_jaccl_side* sc, io* x, void* arg, mlxd_status* st) {
  up_arg* a = arg;
  char why[200];
  const char* bad =
      check_hdr(x->hdr, MAGIC_DOWN, sc->round, (uint32_t)sc->size, a->n, why, sizeof why);
  if (bad) {
    int rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                          "the coordinator (rank 0 at %s) sent a malformed side-channel frame in "
                          "all-gather #%u: %s",
                          sc->coord, (unsigned)sc->round, bad);
    mlxd_status_set_peer(st, 0, NULL);
    return rc;
  }
  x->p = a->dst;
  x->plen = a->n * (size_t)sc->size;
  return 0;
}

int mlxd_jaccl_side_allgather(void* ctx, const void* src, void* dst, size_t n, mlxd_status* st) {
  mlxd_jaccl_side* sc = ctx;
  const int size = sc->size;
  if (n > MLXD_JACCL_SIDE_MAX_BYTES / (size_t)size)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "the side channel's all-gather of %zu bytes per rank over %d ranks is "
                        "over its limit of %zu bytes",
                        n, size, MLXD_JACCL_SIDE_MAX_BYTES);
  if (n) memmove((unsigned char*)dst + (size_t)sc->rank * n, src, n);
  if (size == 1) {
    sc->round++;
    return 0;
  }
  if (!sc->fds)
    return mlxd_fail_at(st, MLXD_EREMOTE, MLXD_LAYER_BOOTSTRAP,
                        "the side channel is closed (an earlier all-gather failed)");
  /* A leaf waits twice the budget for the answer: the coordinator answers only
   * once every rank has sent, and waits up to the budget for the slowest, so a
   * leaf with one budget would time out first and hide the coordinator's
   * verdict (the closed channel naming the missing rank) behind its own. */
  const double begun = mlxd_now(), deadline = begun + sc->budget;
  const double leaf_deadline = begun + 2 * sc->budget;
  int nio = sc->rank == 0 ? size - 1 : 1;
  io* ios = calloc((size_t)nio, sizeof *ios);
  if (!ios) return mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory");
  up_arg a = {dst, n};
  int rc = 0;
  if (sc->rank == 0) {
    for (int r = 1; r < size; r++) ios[r - 1] = (io){.fd = sc->fds[r], .peer = r};
    rc = run_ios(sc, ios, nio, true, deadline, sc->budget, check_up, &a, "sent nothing", st);
    for (int r = 1; r < size && rc == 0; r++) {
      ios[r - 1] = (io){.fd = sc->fds[r], .peer = r, .p = dst, .plen = (size_t)size * n};
      put_hdr(ios[r - 1].hdr, MAGIC_DOWN, sc->round, (uint32_t)size, n);
    }
    if (rc == 0)
      rc = run_ios(sc, ios, nio, false, deadline, sc->budget, NULL, NULL, "took nothing", st);
  } else {
    unsigned char* mine = (unsigned char*)dst + (size_t)sc->rank * n;
    ios[0] = (io){.fd = sc->fds[0], .peer = 0, .p = mine, .plen = n};
    put_hdr(ios[0].hdr, MAGIC_UP, sc->round, (uint32_t)sc->rank, n);
    rc = run_ios(sc, ios, 1, false, deadline, sc->budget, NULL, NULL, "took nothing", st);
    unsigned char* copy = NULL;
    if (rc == 0 && n && !(copy = malloc(n)))
      rc = mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory");
    if (rc == 0) {
      if (n) memcpy(copy, mine, n);
      ios[0] = (io){.fd = sc->fds[0], .peer = 0};
      rc = run_ios(sc, ios, 1, true, leaf_deadline, 2 * sc->budget, check_down, &a,
                   "sent nothing back", st);
    }
    if (rc == 0 && n && memcmp(copy, mine, n) != 0) {
      rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "the coordinator (rank 0 at %s) returned this rank's own bytes changed in "
                        "all-gather #%u",
                        sc->coord, (unsigned)sc->round);
      mlxd_status_set_peer(st, 0, NULL);
    }
    free(copy);
  }
  free(ios);
  if (rc) return side_fail(sc, st);
  sc->round++;
  return 0;
}
