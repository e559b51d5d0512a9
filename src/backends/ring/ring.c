/* The ring backend: MLX's "ring" distributed backend.
 *
 * Configuration (as MLX's launcher writes it): MLX_RANK and MLX_HOSTFILE
 * (net/hostfile_boot.c), or MLX_RANK and MLX_WORLD_SIZE with a caller's all-gather
 * (net/bootstrap.c), or mlxdist-launch's rendezvous, or PMIx: the networking
 * layer (net/net.h) finds and connects the ranks and hands the group to
 * mlxd_ring_backend_new_t (ring_maker). The TCP transport starts with the
 * group's address book and makes a connection the first time an op names a
 * peer (MLXDIST_CONNECT=lazy, net/dialer.c), or gets the full mesh at init
 * (eager); select.c (MLXDIST_TRANSPORT) then picks shared memory between
 * ranks on one host and keeps TCP to the others (per peer). Every op maps to
 * the collective algorithms in src/algo.
 * split() makes no connection: the child is a view of its parent's
 * transport over the child's ranks with a tag space of its own
 * (transport/view.h), sharing the connections of the group made at init;
 * its exchange is the networking layer's (net/split.c).
 * See docs/ring.md. */
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo/algo.h"
#include "algo/hier.h"
#include "backends/common/xgroup.h"
#include "backends/ring/ring_internal.h"
#include "net/net.h"
#include "security/secret.h"
#include "transport/shm.h"
#include "transport/tcp.h"
#include "transport/view.h"
#include "util/bytes.h"
#include "util/env.h"
#include "util/tunables.h"

/* The ring's boundary: create and split return with their message rendered
 * once ("[ring] split #4: ..."); the ops do it in backends/common/xgroup.c.
 * Lower layers fill structured statuses. */
static int ring_done(int rc, mlxd_status* st, const char* op, uint64_t seq) {
  return mlxd_xg_done("ring", rc, st, op, seq);
}

/* Closing is enough: the TCP transport treats a peer that closes after its
 * work as a normal shutdown (only operations still involving that peer fail),
 * so a rank that finishes early does not disturb its peers' last operations. */
static void ring_destroy(mlxd_backend* b) {
  mlxd_ring* r = (mlxd_ring*)b;
  if (!r) return;
  if (r->g.t && mlxd_net_verbose()) {
    /* "[ring] rank 3: 2 TCP connection(s) at close, to ranks 2,4" (tests count them) */
    unsigned char* on = calloc((size_t)b->size, 1);
    int n = on ? mlxd_tcp_connections(r->g.t, on) : -1;
    if (n >= 0) {
      char list[200] = "";
      size_t len = 0;
      int shown = 0;
      for (int p = 0; p < b->size && len + 16 < sizeof list; p++)
        if (on[p]) {
          len += (size_t)snprintf(list + len, sizeof list - len, "%s%d", shown ? "," : "", p);
          shown++;
        }
      mlxd_net_log("rank %d: %d TCP connection(s) at close, to ranks %s%s", b->rank, n,
                   shown ? list : "(none)", len + 16 >= sizeof list ? ",..." : "");
    }
    free(on);
  }
  /* a child's view drops its reference; a shared root transport is destroyed
   * by whichever group over it goes last (view.h) */
  if (r->share)
    mlxd_tshare_release(r->share);
  else if (r->g.t)
    r->g.t->ops->destroy(r->g.t);
  mlxd_net_auth_clear(&r->auth);
  mlxd_hier_free(r->g.hier);
  free(r->host_of);
  free(r);
}

/* ---- split: a view of the parent's connections ---- */

/* Serialises the first split of a group made at init, which shares its
 * transport from then on (mlxd_tshare). */
static pthread_mutex_t g_share_mu = PTHREAD_MUTEX_INITIALIZER;

/* The shared root transport of r's family, shared now if it was not yet. */
static mlxd_tshare* ring_share(mlxd_ring* r, mlxd_status* st) {
  if (mlxd_view_is_child(r->g.t)) return mlxd_view_child_share(r->g.t);
  pthread_mutex_lock(&g_share_mu);
  if (!r->share) {
    r->share = mlxd_tshare_new(r->g.t, st);
  }
  mlxd_tshare* sh = r->share;
  pthread_mutex_unlock(&g_share_mu);
  return sh;
}

/* The child r's split made: ranks[0..m) its members' ranks of the root
 * transport (this rank at me), prank[i] their parent ranks, id its group id. */
static int split_child(const mlxd_ring* r, mlxd_tshare* sh, const int* ranks, const int* prank,
                       int m, int me, unsigned id, mlxd_backend** out, mlxd_status* st) {
  mlxd_ring* c = calloc(1, sizeof *c);
  int* host_of = calloc((size_t)m, sizeof *host_of);
  mlxd_transport* v = c && host_of ? mlxd_view_child_new(sh, ranks, m, me, id, st) : NULL;
  if (!v) {
    free(c);
    free(host_of);
    return st->code ? st->code
                    : mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BACKEND,
                                   "out of memory creating the group");
  }
  /* host_of[i]: the lowest child rank on child rank i's host (hier.h) */
  for (int i = 0; i < m; i++)
    for (int j = 0; j <= i; j++)
      if (r->host_of[prank[j]] == r->host_of[prank[i]]) {
        host_of[i] = j;
        break;
      }
  c->g.base = (mlxd_backend){.ops = r->g.base.ops, .rank = me, .size = m, .comm_device = MLX_CPU};
  c->g.tag = "ring";
  c->g.t = v;
  c->g.verbose = mlxd_net_verbose();
  c->nconn = r->nconn;
  c->self = r->self;
  c->auth = r->auth;
  c->host_of = host_of;
  memcpy(c->session, r->session, sizeof c->session);
  if (mlxd_hier_mode() != MLXD_ALGO_FLAT) {
    c->g.hier = mlxd_hier_new(me, m, host_of, st);
    if (!c->g.hier) {
      ring_destroy(&c->g.base);
      return st->code;
    }
    if (!mlxd_hier_applies(c->g.hier)) {
      mlxd_hier_free(c->g.hier);
      c->g.hier = NULL;
    }
  }
  if (mlxd_net_verbose()) {
    /* the parent's wire per peer: shm to this host's ranks unless the root is tcp */
    bool local_shm = strcmp(v->ops->name, "tcp") != 0;
    bool* on = calloc((size_t)m, sizeof *on);
    if (on) {
      for (int p = 0; p < m; p++) on[p] = p != me && local_shm && host_of[p] == host_of[me];
      mlxd_ring_log_transports(me, m, on);
      free(on);
    }
    char where[96] = "";
    if (c->g.hier) mlxd_hier_describe(c->g.hier, where, sizeof where);
    mlxd_net_log(
        "rank %d of %d ready (a view of the parent's %s transport, group %u: no TCP "
        "mesh, no new connection)%s%s",
        me, m, v->ops->name, id, c->g.hier ? "; two-level collectives: " : "", where);
  }
  *out = &c->g.base;
  return 0;
}

/* The split exchange's check (mlxd_net_split_exchange): the ranks of the new
 * group agree on the settings its two-level choice reads now. extra: the
 * proposed group id, MLXDIST_ALGO, MLXDIST_HIER_SEGMENT (u32 each). */
static int split_check(void* ctx, const unsigned char* mine, const unsigned char* theirs, int p,
                       mlxd_status* st) {
  const mlxd_backend* b = ctx;
  static const char* const algos[] = {"auto", "flat", "hier"};
  uint32_t pa = mlxd_get32(theirs + 4), ma = mlxd_get32(mine + 4);
  if (pa != ma) {
    mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BACKEND,
                 "ranks of the new group disagree on MLXDIST_ALGO: rank %d has %s, rank %d "
                 "has %s (ranks of the parent); expected the same value on every rank",
                 b->rank, algos[ma % 3], p, pa < 3 ? algos[pa] : "?");
    mlxd_status_set_peer(st, p, NULL);
    return st->code;
  }
  if (mlxd_get32(theirs + 8) != mlxd_get32(mine + 8)) {
    mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BACKEND,
                 "ranks of the new group disagree on MLXDIST_HIER_SEGMENT: rank %d has %u, "
                 "rank %d has %u (ranks of the parent); expected the same value on every "
                 "rank",
                 b->rank, (unsigned)mlxd_get32(mine + 8), p, (unsigned)mlxd_get32(theirs + 8));
    mlxd_status_set_peer(st, p, NULL);
    return st->code;
  }
  return 0;
}

static int split_run(mlxd_backend* b, uint64_t seq, int color, int key, mlxd_backend** out,
                     mlxd_status* st) {
  mlxd_ring* r = (mlxd_ring*)b;
  *out = NULL;
  const int n = b->size, k = r->nconn;
  if (!r->g.t) {
    int none = -1;
    return mlxd_ring_backend_new(0, 1, k, &r->self, &r->auth, &none, out, st);
  }
  mlxd_tshare* sh = ring_share(r, st);
  if (!sh) return st->code;
  const bool child = mlxd_view_is_child(r->g.t);
  int* ranks = calloc((size_t)n, sizeof *ranks);
  int* prank = calloc((size_t)n, sizeof *prank);
  unsigned propose = mlxd_tshare_split_begin(sh), id = 0;
  mlxd_net_split sp = {0, -1, NULL, NULL};
  int rc = 0;
  if (!ranks || !prank) {
    rc = mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BACKEND, "out of memory");
    goto done;
  }
  /* The proposed id, MLXDIST_ALGO, MLXDIST_HIER_SEGMENT: the child's
   * two-level choice is read now, so its members must agree on it now */
  unsigned char extra[12];
  mlxd_put32(extra, propose);
  mlxd_put32(extra + 4, (uint32_t)mlxd_hier_mode());
  mlxd_put32(extra + 8, (uint32_t)mlxd_tunable_long(MLXD_T_HIER_SEGMENT));
  if ((rc = mlxd_net_split_exchange(r->g.t, seq, b->rank, n, color, key, extra, sizeof extra,
                                    split_check, b, &sp, st)))
    goto done;
  const int m = sp.m, me = sp.me;
  for (int i = 0; i < m; i++) {
    unsigned pid = mlxd_get32(sp.members[i].extra);
    if (pid > id) id = pid;
    prank[i] = sp.members[i].prank;
    ranks[i] = child ? mlxd_view_child_root_rank(r->g.t, prank[i]) : prank[i];
  }
  mlxd_net_log("split: parent rank %d, color %d, key %d -> rank %d of %d", b->rank, color, key, me,
               m);
  if (m == 1) {
    int none = -1;
    id = 0; /* no view, no tag: the id stays free */
    rc = mlxd_ring_backend_new(0, 1, k, &r->self, &r->auth, &none, out, st);
    goto done;
  }
  if (id >= MLXD_TAG_GROUPS) {
    rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BACKEND,
                      "no group id left: a rank of this group has made %d groups by split over "
                      "the connections of the group made at init (ids are never reused)",
                      MLXD_TAG_GROUPS - 1);
    goto done;
  }
  rc = split_child(r, sh, ranks, prank, m, me, id, out, st);
done:
  mlxd_tshare_split_end(sh, id < MLXD_TAG_GROUPS ? id : 0);
  mlxd_net_split_free(&sp);
  free(ranks);
  free(prank);
  return rc;
}

static int ring_split(mlxd_backend* b, uint64_t seq, int color, int key, mlxd_backend** out,
                      mlxd_status* st) {
  return ring_done(split_run(b, seq, color, key, out, st), st, "split", seq);
}

static const mlxd_backend_ops ring_ops = {
    .name = "ring",
    .all_reduce = mlxd_xg_all_reduce,
    .all_gather = mlxd_xg_all_gather,
    .reduce_scatter = mlxd_xg_reduce_scatter,
    .all_to_all = mlxd_xg_all_to_all,
    .send = mlxd_xg_send,
    .recv = mlxd_xg_recv,
    .split = ring_split,
    .destroy = ring_destroy,
    .abort = mlxd_xg_abort,
    .forget = mlxd_xg_forget,
    /* no *_ref ops: the ring's ops never use a buffer after they return */
};

int mlxd_ring_backend_new(int rank, int size, int nconn, const mlxd_net_addr* self,
                          const mlxd_net_auth* auth, int* fds, mlxd_backend** out,
                          mlxd_status* st) {
  *out = NULL;
  mlxd_transport* t = NULL;
  if (size > 1) {
    t = mlxd_tcp_transport_new(rank, size, fds, nconn, st);
    for (int i = 0; i < size * nconn; i++) fds[i] = -1; /* owned (or closed) by the transport */
    if (!t) {
      if (!st->code)
        mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP, "cannot create the TCP transport");
      return st->code;
    }
  }
  return mlxd_ring_backend_new_t(rank, size, nconn, self, auth, t, out, st);
}

static int backend_new(int rank, int size, int nconn, const mlxd_net_addr* self,
                       const mlxd_net_auth* auth, mlxd_transport* t, const char* chosen,
                       mlxd_backend** out, mlxd_status* st);

int mlxd_ring_backend_new_t(int rank, int size, int nconn, const mlxd_net_addr* self,
                            const mlxd_net_auth* auth, mlxd_transport* t, mlxd_backend** out,
                            mlxd_status* st) {
  return backend_new(rank, size, nconn, self, auth, t, NULL, out, st);
}

int mlxd_ring_backend_new_local(int rank, int size, int nconn, const mlxd_net_addr* self,
                                const mlxd_net_auth* auth, mlxd_transport* shm, const char* session,
                                mlxd_backend** out, mlxd_status* st) {
  return backend_new(rank, size, nconn, self, auth, shm, session, out, st);
}

/* chosen: t is final (mlxd_ring_select_local: one host, session chosen) */
static int backend_new(int rank, int size, int nconn, const mlxd_net_addr* self,
                       const mlxd_net_auth* auth, mlxd_transport* t, const char* chosen,
                       mlxd_backend** out, mlxd_status* st) {
  *out = NULL;
  mlxd_ring* r = calloc(1, sizeof *r);
  if (!r) {
    if (t) t->ops->destroy(t);
    return mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BACKEND, "out of memory creating the group");
  }
  r->g.base.ops = &ring_ops;
  r->g.base.rank = rank;
  r->g.base.size = size;
  r->g.base.comm_device = MLX_CPU;
  r->g.tag = "ring";
  r->nconn = nconn;
  r->self = *self;
  r->auth = *auth;
  if (size > 1) {
    r->g.t = t;
    r->host_of = calloc((size_t)size, sizeof *r->host_of);
    if (!r->host_of)
      mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BACKEND, "out of memory creating the group");
    if (r->host_of && chosen) /* every rank on one host: host_of is all 0 */
      snprintf(r->session, sizeof r->session, "%s", chosen);
    if (!r->host_of ||
        (!chosen && mlxd_ring_select_transport(&r->g.t, r->host_of, r->session, st) != 0)) {
      r->g.t->ops->destroy(r->g.t);
      mlxd_net_auth_clear(&r->auth);
      free(r->host_of);
      free(r);
      if (!st->code)
        mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP, "cannot choose the transport");
      return st->code;
    }
    r->g.verbose = mlxd_net_verbose();
    if (mlxd_hier_mode() != MLXD_ALGO_FLAT) {
      r->g.hier = mlxd_hier_new(rank, size, r->host_of, st);
      if (!r->g.hier) {
        ring_destroy(&r->g.base);
        return st->code;
      }
      if (!mlxd_hier_applies(r->g.hier)) {
        mlxd_hier_free(r->g.hier);
        r->g.hier = NULL;
      }
    }
    if (r->g.hier) {
      char where[96];
      mlxd_hier_describe(r->g.hier, where, sizeof where);
      mlxd_net_log("rank %d: two-level collectives (%s; MLXDIST_ALGO=%s)", rank, where,
                   mlxd_tunable_str(MLXD_T_ALGO));
    }
  }
  mlxd_net_log("rank %d of %d ready (%s transport, %d TCP connection(s) per peer at set-up)", rank,
               size, r->g.t ? r->g.t->ops->name : "no", nconn);
  *out = &r->g.base;
  return 0;
}

/* ---- the kind ---- */

static bool ring_available(char* why, size_t n) {
  (void)why;
  (void)n;
  return true;
}

static bool env_set(const char* name) {
  const char* v = mlxd_env_get(name);
  return v && *v;
}

static bool ring_configured(bool with_bootstrap) {
  if (with_bootstrap) return env_set("MLX_RANK") && env_set("MLX_WORLD_SIZE");
  /* started by mlxdist-launch across hosts: the launcher is the all-gather (rendezvous.c) */
  if (mlxd_net_rendezvous_configured()) return env_set("MLX_RANK");
  if (env_set("MLX_RANK") && env_set("MLX_HOSTFILE")) return true;
  /* a PMIx server's job (net/pmix_boot.c): for init("any") only with MLXDIST_PMIX=on */
  return mlxd_net_pmix_for_any() && mlxd_net_config_choice() == MLXD_NET_CFG_PMIX;
}

static int ring_check(mlxd_status* st) {
  int mode;
  return mlxd_ring_transport_mode(&mode, st);
}

/* A hostfile job's ranks that mlxdist-launch started on this host may need no
 * TCP at all: the group over the launcher's shared-memory session (select.c). */
static int ring_local(int rank, int size, int nconn, const mlxd_net_addr* self,
                      const mlxd_net_auth* auth, bool* made, mlxd_backend** out, mlxd_status* st) {
  char session[MLXD_RING_SESSION_MAX];
  mlxd_transport* t = NULL;
  *made = false;
  int rc = mlxd_ring_select_local(rank, size, auth, &t, session, st);
  if (rc || !t) return rc;
  *made = true;
  return mlxd_ring_backend_new_local(rank, size, nconn, self, auth, t, session, out, st);
}

/* The ring's part in the networking layer's bootstraps (net/net.h). */
static const mlxd_net_maker ring_maker = {ring_check, mlxd_ring_backend_new_t, ring_local};

static int ring_create(mlxd_bootstrap* bs, mlxd_backend** out, mlxd_status* st) {
  *out = NULL;
  int cfg = bs ? -1 : mlxd_net_config_choice();
  bool pmix = cfg == MLXD_NET_CFG_PMIX && (!mlxd_init_for_any() || mlxd_net_pmix_for_any());
  int rc = bs                               ? mlxd_net_bootstrap(bs, &ring_maker, out, st)
           : cfg == MLXD_NET_CFG_RENDEZVOUS ? mlxd_net_bootstrap_rendezvous(&ring_maker, out, st)
           : pmix                           ? mlxd_net_bootstrap_pmix(&ring_maker, out, st)
           : cfg == MLXD_NET_CFG_PMIX
               ? mlxd_fail_at(st, MLXD_EUNAVAIL, MLXD_LAYER_BOOTSTRAP,
                              "not configured for init(\"any\"): a PMIx server started this "
                              "process, which the ring uses for init(\"ring\"), or for "
                              "init(\"any\") with MLXDIST_PMIX=on")
           : mlxd_net_slurm_without_pmix(st) ? st->code
                                             : mlxd_net_bootstrap_hostfile(&ring_maker, out, st);
  return ring_done(rc, st, NULL, 0);
}

const mlxd_backend_kind mlxd_ring_kind = {"ring",      ring_available, ring_configured,
                                          ring_create, true,           false};
