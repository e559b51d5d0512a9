/* Transports for forked ranks (see transports.h). */
#include "transports.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "testutil.h"
#include "transport/router.h"
#include "transport/shm.h"
#include "transport/tcp.h"
#include "transport/verbs.h"

bool t_tp_parse(const char* text, t_tp_spec* out) {
  out->nconn = 1;
  out->hosts[0] = '\0';
  if (strncmp(text, "mixed:", 6) == 0) {
    size_t n = strlen(text + 6);
    if (n < 2 || n > T_MAX_RANKS || strspn(text + 6, "0123456789") != n) return false;
    out->kind = T_TP_MIXED;
    memcpy(out->hosts, text + 6, n + 1);
    return true;
  }
  const char* colon = strchr(text, ':');
  size_t len = colon ? (size_t)(colon - text) : strlen(text);
  if (len == 3 && strncmp(text, "tcp", 3) == 0)
    out->kind = T_TP_TCP;
  else if (len == 4 && strncmp(text, "unix", 4) == 0)
    out->kind = T_TP_UNIX;
  else if (len == 3 && strncmp(text, "shm", 3) == 0 && !colon)
    out->kind = T_TP_SHM;
  else if (len == 5 && strncmp(text, "verbs", 5) == 0)
    out->kind = T_TP_VERBS;
  else
    return false;
  if (colon) {
    char* end;
    long k = strtol(colon + 1, &end, 10);
    if (*end || end == colon + 1 || k < 1 || k > 8) return false;
    out->nconn = (int)k;
  }
  return true;
}

const char* t_tp_name(const t_tp_spec* spec) {
  static char buf[32];
  if (spec->kind == T_TP_SHM) return "shm";
  if (spec->kind == T_TP_MIXED) {
    snprintf(buf, sizeof buf, "mixed:%.24s", spec->hosts);
    return buf;
  }
  snprintf(buf, sizeof buf, "%s:%d",
           spec->kind == T_TP_TCP     ? "tcp"
           : spec->kind == T_TP_VERBS ? "verbs"
                                      : "unix",
           spec->nconn);
  return buf;
}

/* One connected pair of stream sockets: loopback TCP or AF_UNIX. */
static int connected_pair(bool tcp, int out[2]) {
  if (!tcp) return socketpair(AF_UNIX, SOCK_STREAM, 0, out);
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  if (ls < 0) return -1;
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof a;
  if (bind(ls, (struct sockaddr*)&a, sizeof a) || listen(ls, 1) ||
      getsockname(ls, (struct sockaddr*)&a, &al)) {
    close(ls);
    return -1;
  }
  int c = socket(AF_INET, SOCK_STREAM, 0);
  if (c < 0 || connect(c, (struct sockaddr*)&a, sizeof a)) {
    close(ls);
    if (c >= 0) close(c);
    return -1;
  }
  int s = accept(ls, NULL, NULL);
  close(ls);
  if (s < 0) {
    close(c);
    return -1;
  }
  out[0] = c;
  out[1] = s;
  return 0;
}

typedef struct run_ctx {
  t_tp_spec spec;
  int size;
  int* fds; /* fds[(r * size + p) * nconn + c]: rank r's connection c to p; -1 if none */
  t_tp_fn fn;
  void* arg;
} run_ctx;

static void close_all(void* p) {
  run_ctx* x = p;
  if (!x->fds) return;
  int total = x->size * x->size * x->spec.nconn;
  for (int i = 0; i < total; i++)
    if (x->fds[i] >= 0) close(x->fds[i]);
  free(x->fds);
  x->fds = NULL;
}

/* mixed: the router (transport/router.h) over the shm session of rank's
 * emulated host (named by group ranks) and the TCP transport tcp; NULL (st
 * set) on failure. */
static mlxd_transport* make_mixed(const t_tp_spec* spec, int rank, int size, const char* session,
                                  mlxd_transport* tcp, mlxd_status* st) {
  uint64_t hosts[T_MAX_RANKS];
  int members[T_MAX_RANKS], me = -1;
  for (int p = 0; p < size; p++) hosts[p] = (uint64_t)(unsigned char)spec->hosts[p];
  mlxd_route_facts f = {.rank = rank, .size = size, .host = hosts};
  f.allow[MLXD_ROUTE_SHM] = f.allow[MLXD_ROUTE_TCP] = true;
  int n = mlxd_route_shm_members(&f, members, &me);
  if (n < 2) return tcp; /* alone on its host: plain TCP, as the ring backend does */
  char name[256];
  snprintf(name, sizeof name, "%s-h%d", session, members[0]);
  mlxd_transport* shm = mlxd_shm_transport_new_named(me, n, name, members, size, size, st);
  mlxd_transport* parts[MLXD_ROUTE_KINDS] = {[MLXD_ROUTE_SHM] = shm, [MLXD_ROUTE_TCP] = tcp};
  mlxd_router_opts o = {.machine_ranks = n, .bare_alone = true};
  mlxd_transport* t = shm ? mlxd_router_new(&f, parts, &o, st) : NULL;
  if (!t) {
    if (shm) shm->ops->destroy(shm);
    tcp->ops->destroy(tcp);
  }
  return t;
}

/* verbs: the set-up all-gather over this rank's socketpairs to the others
 * (fds[p], one per peer): send ours to everyone, then read everyone's
 * (small records: the socket buffers take them whole). Bounded by a 60 s
 * receive timeout. */
typedef struct ag_ctx {
  int rank, size;
  const int* fds;
} ag_ctx;

static int sock_ag(void* ctx, const void* src, void* dst, size_t n, mlxd_status* st) {
  ag_ctx* a = ctx;
  memcpy((char*)dst + (size_t)a->rank * n, src, n);
  for (int p = 0; p < a->size; p++) {
    if (p == a->rank) continue;
    for (size_t off = 0; off < n;) {
      ssize_t w = write(a->fds[p], (const char*)src + off, n - off);
      if (w <= 0)
        return mlxd_fail(st, MLXD_ESYS, "all-gather: write to rank %d: %s", p, strerror(errno));
      off += (size_t)w;
    }
  }
  for (int p = 0; p < a->size; p++) {
    if (p == a->rank) continue;
    struct timeval tv = {60, 0};
    setsockopt(a->fds[p], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    for (size_t off = 0; off < n;) {
      ssize_t r = read(a->fds[p], (char*)dst + (size_t)p * n + off, n - off);
      if (r <= 0)
        return mlxd_fail(st, MLXD_ESYS, "all-gather: read from rank %d: %s", p,
                         r == 0 ? "closed" : strerror(errno));
      off += (size_t)r;
    }
  }
  return 0;
}

static mlxd_transport* make_verbs(int rank, int size, int rails, const int* fds, mlxd_status* st) {
  const char* dev = getenv("T_VERBS_DEV");
  if (!dev || !*dev) dev = "rxe0";
  mlxd_verbs_peer peers[T_MAX_RANKS];
  memset(peers, 0, sizeof peers);
  for (int p = 0; p < size; p++) {
    if (p == rank) continue;
    peers[p].nrails = rails;
    for (int r = 0; r < rails; r++) peers[p].dev[r] = dev;
  }
  ag_ctx a = {rank, size, fds};
  return mlxd_verbs_transport_new(rank, size, peers, sock_ag, &a, st);
}

static int rank_main(int rank, int size, const char* session, void* p) {
  run_ctx* x = p;
  mlxd_status st;
  mlxd_status_clear(&st);
  mlxd_transport* t;
  if (x->spec.kind == T_TP_SHM) {
    t = mlxd_shm_transport_new(rank, size, session, &st);
  } else {
    int k = x->spec.nconn, per = size * k;
    int mine[T_MAX_RANKS * 8];
    int total = size * per;
    memcpy(mine, x->fds + (size_t)rank * (size_t)per, sizeof(int) * (size_t)per);
    for (int i = 0; i < total; i++) /* other ranks' ends: closing them lets EOF be seen */
      if (i / per != rank && x->fds[i] >= 0) close(x->fds[i]);
    free(x->fds);
    x->fds = NULL;
    if (x->spec.kind == T_TP_VERBS) {
      int ag_fds[T_MAX_RANKS];
      for (int q = 0; q < size; q++) ag_fds[q] = mine[q * k];
      t = make_verbs(rank, size, k, ag_fds, &st);
      for (int i = 0; i < per; i++)
        if (mine[i] >= 0) close(mine[i]);
    } else {
      t = mlxd_tcp_transport_new(rank, size, mine, k, &st);
    }
    if (t && x->spec.kind == T_TP_MIXED) t = make_mixed(&x->spec, rank, size, session, t, &st);
  }
  T_REQUIREF(t != NULL, "creating the %s transport: %s", t_tp_name(&x->spec), st.msg);
  T_REQUIRE(t->rank == rank && t->size == size);
  int rc = x->fn(t, x->arg);
  t->ops->destroy(t);
  return rc;
}

int t_run_transport(const t_tp_spec* spec, int size, t_tp_fn fn, void* arg,
                    const t_ranks_opts* opts, t_rank_exit* exits) {
  T_REQUIRE(!opts || !opts->after_fork);
  T_REQUIRE(size >= 1 && size <= T_MAX_RANKS && spec->nconn >= 1 && spec->nconn <= 8);
  T_REQUIRE(spec->kind != T_TP_MIXED || strlen(spec->hosts) == (size_t)size);
  run_ctx x = {*spec, size, NULL, fn, arg};
  if (spec->kind != T_TP_SHM) {
    int k = spec->nconn, total = size * size * k;
    x.fds = malloc(sizeof(int) * (size_t)total);
    T_REQUIRE(x.fds != NULL);
    for (int i = 0; i < total; i++) x.fds[i] = -1;
    for (int i = 0; i < size; i++)
      for (int j = i + 1; j < size; j++)
        for (int c = 0; c < k; c++) {
          int pr[2];
          if (connected_pair(spec->kind != T_TP_UNIX && spec->kind != T_TP_VERBS, pr))
            T_FAIL("cannot connect %s sockets: %s", t_tp_name(spec), strerror(errno));
          x.fds[(i * size + j) * k + c] = pr[0];
          x.fds[(j * size + i) * k + c] = pr[1];
        }
  }
  t_ranks_opts o = opts ? *opts : (t_ranks_opts){0};
  o.after_fork = close_all;
  if (!o.what) o.what = t_tp_name(spec);
  int bad = t_run_ranks(size, rank_main, &x, &o, exits);
  close_all(&x);
  return bad;
}

bool t_status_names_peer(const mlxd_status* st, int peer) {
  if (st->has_peer) return st->peer == peer;
  char want[32];
  snprintf(want, sizeof want, "rank %d", peer);
  for (const char* p = strstr(st->msg, want); p; p = strstr(p + 1, want)) {
    char next = p[strlen(want)];
    if (next < '0' || next > '9') return true; /* not "rank 10" for rank 1 */
  }
  return false;
}
