/* The ring backend: MLX's "ring" distributed backend.
 *
 * Configuration (as MLX's launcher writes it): MLX_RANK and MLX_HOSTFILE
 * (hostfile.c), or MLX_RANK and MLX_WORLD_SIZE with a caller's all-gather
 * (bootstrap.c). The TCP transport starts with the group's address book and
 * makes a connection the first time an op names a peer (MLXDIST_CONNECT=lazy,
 * connect.c's dialer), or gets the full mesh at init (eager); select.c (MLXDIST_TRANSPORT) then picks shared memory between
 * ranks on one host and keeps TCP to the others (per peer). Every op maps to
 * the collective algorithms in src/algo.
 * split() bootstraps the child group's connections over the parent's
 * transport, per peer again; a child whose ranks all share this rank's host
 * gets shared memory only, without a TCP mesh. See docs/ring.md. */
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo/algo.h"
#include "algo/hier.h"
#include "backends/common/xgroup.h"
#include "backends/ring/handshake.h"
#include "backends/ring/ring_internal.h"
#include "transport/shm.h"
#include "transport/tcp.h"
#include "util/bytes.h"
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
  if (r->g.t && mlxd_ring_verbose()) {
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
      mlxd_ring_log("rank %d: %d TCP connection(s) at close, to ranks %s%s", b->rank, n,
                    shown ? list : "(none)", len + 16 >= sizeof list ? ",..." : "");
    }
    free(on);
  }
  if (r->g.t) r->g.t->ops->destroy(r->g.t);
  mlxd_ring_auth_clear(&r->auth);
  mlxd_hier_free(r->g.hier);
  free(r->host_of);
  free(r);
}

/* ---- split: all-gather (color, key, address records) over the parent ---- */

typedef struct {
  int color, key, prank;
} split_ent;

static int split_cmp(const void* a, const void* b) {
  const split_ent* x = a;
  const split_ent* y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return (x->prank > y->prank) - (x->prank < y->prank);
}

/* A child whose ranks are all on this rank's host: shared memory only, no
 * TCP mesh. Its session's name is the parent's with this split's sequence
 * number and color, the same on every member and unique per split. */
static int split_one_host(const mlxd_ring* r, uint64_t seq, int color, int me, int m,
                          const mlxd_ring_auth* child, mlxd_backend** out, mlxd_status* st) {
  char name[MLXD_RING_SESSION_MAX + 48];
  snprintf(name, sizeof name, "%s-s%llu-c%d", r->session, (unsigned long long)seq, color);
  mlxd_transport* shm = mlxd_shm_transport_new(me, m, name, st);
  if (!shm) return st->code ? st->code : MLXD_ESYS;
  mlxd_ring* c = calloc(1, sizeof *c);
  int* host_of = calloc((size_t)m, sizeof *host_of); /* all on host 0 */
  if (!c || !host_of) {
    shm->ops->destroy(shm);
    free(c);
    free(host_of);
    return mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BACKEND, "out of memory creating the group");
  }
  c->g.base = (mlxd_backend){.ops = r->g.base.ops, .rank = me, .size = m, .comm_device = MLX_CPU};
  c->g.tag = "ring";
  c->nconn = r->nconn;
  c->self = r->self;
  c->auth = *child;
  c->g.t = shm;
  c->host_of = host_of;
  c->g.verbose = mlxd_ring_verbose();
  snprintf(c->session, sizeof c->session, "%.*s", (int)sizeof c->session - 1, name);
  bool* on = calloc((size_t)m, sizeof *on);
  if (on) {
    for (int p = 0; p < m; p++) on[p] = p != me;
    mlxd_ring_log_transports(me, m, on);
    free(on);
  }
  mlxd_ring_log("rank %d of %d ready (shm transport, split on one host: no TCP mesh)", me, m);
  *out = &c->g.base;
  return 0;
}

static int split_run(mlxd_backend* b, uint64_t seq, int color, int key, mlxd_backend** out,
                     mlxd_status* st) {
  mlxd_ring* r = (mlxd_ring*)b;
  *out = NULL;
  const int n = b->size, k = r->nconn;
  /* The child's connections prove the parent's secret and a token of their own:
   * derived from the parent's, this split's sequence number and the color, so
   * two splits (or two colors) never take each other's connections. */
  mlxd_ring_auth child = r->auth;
  mlxd_hs_token_split(r->auth.token, seq, color, child.token);
  if (!r->g.t) {
    int none = -1;
    int rc0 = mlxd_ring_backend_new(0, 1, k, &r->self, &child, &none, out, st);
    mlxd_ring_auth_clear(&child);
    return rc0;
  }
  int mode;
  if (mlxd_ring_transport_mode(&mode, st)) return st->code;
  const size_t per = 8 + (size_t)k * MLXD_RING_REC_BYTES;
  int* lfds = malloc(sizeof(int) * (size_t)k);
  mlxd_ring_addr* mine = calloc((size_t)k, sizeof *mine);
  unsigned char* src = calloc(1, per);
  unsigned char* all = calloc((size_t)n, per);
  split_ent* ents = calloc((size_t)n, sizeof *ents);
  int* fds = NULL;
  mlxd_ring_hosts hosts = {0, k, NULL};
  int rc = 0;
  if (lfds)
    for (int c = 0; c < k; c++) lfds[c] = -1;
  if (!lfds || !mine || !src || !all || !ents) {
    rc = mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BACKEND, "out of memory");
    goto done;
  }
  if ((rc = mlxd_ring_listen_many(&r->self, k, lfds, mine, st))) goto done;
  mlxd_put32(src, (uint32_t)color);
  mlxd_put32(src + 4, (uint32_t)key);
  for (int c = 0; c < k; c++)
    mlxd_ring_rec_encode(src + 8 + (size_t)c * MLXD_RING_REC_BYTES, b->rank, n, c, k, &mine[c],
                         NULL);
  mlxd_sig sig = mlxd_xg_sig(b, MLXD_SIG_SPLIT, MLX_UINT8, per);
  sig.dtype = MLXD_SIG_NO_DTYPE;
  if ((rc = mlxd_algo_all_gather(r->g.t, seq, &sig, src, all, per, st))) goto done;

  int m = 0;
  for (int p = 0; p < n; p++) {
    const unsigned char* e = all + (size_t)p * per;
    if ((int)mlxd_get32(e) != color) continue;
    ents[m].color = color;
    ents[m].key = (int)mlxd_get32(e + 4);
    ents[m].prank = p;
    m++;
  }
  qsort(ents, (size_t)m, sizeof *ents, split_cmp);
  int me = -1;
  for (int i = 0; i < m; i++)
    if (ents[i].prank == b->rank) me = i;
  if (me < 0) {
    rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BACKEND,
                      "this rank is missing from its own group in the exchanged records");
    goto done;
  }
  mlxd_ring_log("split: parent rank %d, color %d, key %d -> rank %d of %d", b->rank, color, key, me,
                m);
  if (m == 1) {
    int none = -1;
    rc = mlxd_ring_backend_new(0, 1, k, &r->self, &child, &none, out, st);
    goto done;
  }
  /* (a parent on plain TCP has no shared memory that works here: TCP was
   * forced, or shm could not start, or this rank is alone on its host) */
  bool one_host = mode != MLXD_RING_T_TCP && strcmp(r->g.t->ops->name, "tcp") != 0;
  for (int i = 0; i < m && one_host; i++)
    one_host = r->host_of[ents[i].prank] == r->host_of[b->rank];
  if (one_host) {
    rc = split_one_host(r, seq, color, me, m, &child, out, st);
    goto done;
  }
  hosts.size = m;
  hosts.addrs = calloc((size_t)m * (size_t)k, sizeof *hosts.addrs);
  fds = malloc(sizeof(int) * (size_t)m * (size_t)k);
  if (!hosts.addrs || !fds) {
    rc = mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BACKEND, "out of memory");
    goto done;
  }
  for (int i = 0; i < m; i++) {
    int p = ents[i].prank;
    for (int c = 0; c < k; c++)
      if ((rc = mlxd_ring_rec_decode(all + (size_t)p * per + 8 + (size_t)c * MLXD_RING_REC_BYTES, p,
                                     n, c, k, "split's exchange", &hosts.addrs[i * k + c], st)))
        goto done;
  }
  if ((rc = mlxd_ring_mesh(me, &hosts, lfds, &child, fds, st))) goto done;
  rc = mlxd_ring_backend_new(me, m, k, &r->self, &child, fds, out, st);
done:
  mlxd_ring_auth_clear(&child);
  if (lfds) mlxd_ring_close_all(lfds, k);
  free(lfds);
  free(mine);
  free(src);
  free(all);
  free(ents);
  free(fds);
  mlxd_ring_hosts_free(&hosts);
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
    .send = mlxd_xg_send,
    .recv = mlxd_xg_recv,
    .split = ring_split,
    .destroy = ring_destroy,
    .abort = mlxd_xg_abort,
    .forget = mlxd_xg_forget,
    /* no *_ref ops: the ring's ops never use a buffer after they return */
};

int mlxd_ring_tcp_open(int rank, const mlxd_ring_hosts* hosts, int* lfds,
                       const mlxd_ring_auth* auth, mlxd_transport** out, mlxd_status* st) {
  const int n = hosts->size, k = hosts->nconn;
  *out = NULL;
  bool lazy = mlxd_ring_connect_lazy();
  if (mlxd_ring_nofile(n, k, lazy, st)) return st->code;
  if (lazy) {
    struct mlxd_tcp_dialer* d = mlxd_ring_dialer_new(rank, hosts, lfds, auth, st);
    if (!d) return st->code;
    *out = mlxd_tcp_transport_lazy(rank, n, k, d, st); /* owns d, also on failure */
    return *out ? 0 : st->code;
  }
  int* fds = malloc(sizeof(int) * (size_t)n * (size_t)k);
  if (!fds)
    return mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory connecting %d ranks",
                        n);
  int rc = mlxd_ring_mesh(rank, hosts, lfds, auth, fds, st);
  if (rc == 0) {
    *out = mlxd_tcp_transport_new(rank, n, fds, k, st); /* owns the fds, also on failure */
    if (!*out) rc = st->code ? st->code : MLXD_ESYS;
  }
  free(fds);
  return rc;
}

int mlxd_ring_backend_new(int rank, int size, int nconn, const mlxd_ring_addr* self,
                          const mlxd_ring_auth* auth, int* fds, mlxd_backend** out,
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

int mlxd_ring_backend_new_t(int rank, int size, int nconn, const mlxd_ring_addr* self,
                            const mlxd_ring_auth* auth, mlxd_transport* t, mlxd_backend** out,
                            mlxd_status* st) {
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
    if (!r->host_of || mlxd_ring_select_transport(&r->g.t, r->host_of, r->session, st) != 0) {
      r->g.t->ops->destroy(r->g.t);
      mlxd_ring_auth_clear(&r->auth);
      free(r->host_of);
      free(r);
      if (!st->code)
        mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP, "cannot choose the transport");
      return st->code;
    }
    r->g.verbose = mlxd_ring_verbose();
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
      mlxd_ring_log("rank %d: two-level collectives (%s; MLXDIST_ALGO=%s)", rank, where,
                    mlxd_tunable_str(MLXD_T_ALGO));
    }
  }
  mlxd_ring_log("rank %d of %d ready (%s transport, %d TCP connection(s) per peer at set-up)", rank,
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
  const char* v = getenv(name);
  return v && *v;
}

static bool ring_configured(bool with_bootstrap) {
  if (with_bootstrap) return env_set("MLX_RANK") && env_set("MLX_WORLD_SIZE");
  /* started by mlxdist-launch across hosts: the launcher is the all-gather (rendezvous.c) */
  if (mlxd_ring_rendezvous_configured()) return env_set("MLX_RANK");
  if (env_set("MLX_RANK") && env_set("MLX_HOSTFILE")) return true;
  /* a PMIx server's job (ring_pmix.c): for init("any") only with MLXDIST_PMIX=on */
  return mlxd_ring_pmix_for_any() && mlxd_ring_config_choice() == MLXD_RING_CFG_PMIX;
}

static int ring_create_hostfile(mlxd_backend** out, mlxd_status* st) {
  const char* rs = getenv("MLX_RANK");
  const char* path = getenv("MLX_HOSTFILE");
  if (!rs || !*rs || !path || !*path)
    return mlxd_fail_at(st, MLXD_EUNAVAIL, MLXD_LAYER_BOOTSTRAP,
                        "not configured: MLX_RANK and MLX_HOSTFILE must be set (MLX_RANK=%s, "
                        "MLX_HOSTFILE=%s)",
                        rs && *rs ? rs : "(unset)", path && *path ? path : "(unset)");
  char* end = NULL;
  errno = 0;
  long rank = strtol(rs, &end, 10);
  if (*end != '\0' || errno || rank < 0 || rank > (1 << 20))
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "MLX_RANK='%s' is not a non-negative integer", rs);
  int mode;
  if (mlxd_ring_transport_mode(&mode, st)) return st->code; /* before anyone waits on us */
  mlxd_ring_hosts hosts;
  if (mlxd_ring_hostfile_load(path, &hosts, st)) return st->code;
  const int n = hosts.size, k = hosts.nconn;
  int rc = 0;
  /* The job's identity: mlxdist-launch's random token, else one derived from the
   * hostfile (every rank of the job has the same file); and the secret, if any. */
  mlxd_ring_auth auth;
  bool have_token = false;
  if ((rc = mlxd_ring_auth_load(&auth, st)) ||
      (rc = mlxd_ring_auth_env_token(&auth, &have_token, st))) {
    mlxd_ring_hosts_free(&hosts);
    mlxd_ring_auth_clear(&auth);
    return rc;
  }
  if (!have_token) mlxd_hs_token_hosts(&hosts, auth.token);
  int* lfds = NULL;
  mlxd_transport* t = NULL;
  if (rank >= n) {
    rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                      "MLX_RANK=%ld is outside the hostfile '%s', which lists %d rank(s) "
                      "(expected a rank in [0, %d))",
                      rank, path, n, n);
    goto done;
  }
  mlxd_ring_log("rank %ld of %d from hostfile '%s', %d connection(s) per peer", rank, n, path, k);
  mlxd_ring_addr self = hosts.addrs[rank * k];
  if (n == 1) {
    int none = -1;
    rc = mlxd_ring_backend_new(0, 1, k, &self, &auth, &none, out, st);
    goto done;
  }
  lfds = malloc(sizeof(int) * (size_t)k);
  if (lfds)
    for (int c = 0; c < k; c++) lfds[c] = -1;
  if (!lfds) {
    rc =
        mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory connecting %d ranks", n);
    goto done;
  }
  for (int c = 0; c < k; c++) {
    mlxd_ring_addr a = hosts.addrs[rank * k + c];
    if ((rc = mlxd_ring_listen(&a, &lfds[c], st))) goto done;
  }
  if ((rc = mlxd_ring_tcp_open((int)rank, &hosts, lfds, &auth, &t, st))) goto done;
  rc = mlxd_ring_backend_new_t((int)rank, n, k, &self, &auth, t, out, st);
done:
  mlxd_ring_auth_clear(&auth);
  if (lfds) mlxd_ring_close_all(lfds, k);
  free(lfds);
  mlxd_ring_hosts_free(&hosts);
  return rc;
}

static int ring_create(mlxd_bootstrap* bs, mlxd_backend** out, mlxd_status* st) {
  *out = NULL;
  int cfg = bs ? -1 : mlxd_ring_config_choice();
  bool pmix = cfg == MLXD_RING_CFG_PMIX && (!mlxd_init_for_any() || mlxd_ring_pmix_for_any());
  int rc = bs                                ? mlxd_ring_create_bootstrap(bs, out, st)
           : cfg == MLXD_RING_CFG_RENDEZVOUS ? mlxd_ring_create_rendezvous(out, st)
           : pmix                            ? mlxd_ring_create_pmix(out, st)
           : cfg == MLXD_RING_CFG_PMIX
               ? mlxd_fail_at(st, MLXD_EUNAVAIL, MLXD_LAYER_BOOTSTRAP,
                              "not configured for init(\"any\"): a PMIx server started this "
                              "process, which the ring uses for init(\"ring\"), or for "
                              "init(\"any\") with MLXDIST_PMIX=on")
           : mlxd_ring_slurm_without_pmix(st) ? st->code
                                              : ring_create_hostfile(out, st);
  return ring_done(rc, st, NULL, 0);
}

const mlxd_backend_kind mlxd_ring_kind = {"ring",      ring_available, ring_configured,
                                          ring_create, true,           false};
