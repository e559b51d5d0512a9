/* The ring backend: MLX's "ring" distributed backend.
 *
 * Configuration (as MLX's launcher writes it): MLX_RANK and MLX_HOSTFILE
 * (hostfile.c), or MLX_RANK and MLX_WORLD_SIZE with a caller's all-gather
 * (bootstrap.c). Connections form a full mesh (connect.c), handed to the TCP
 * transport; select.c (MLXDIST_TRANSPORT) then picks shared memory between
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
#include "backends/ring/handshake.h"
#include "backends/ring/ring_internal.h"
#include "transport/shm.h"
#include "transport/tcp.h"
#include "util/bytes.h"
#include "util/tunables.h"

/* The ring's boundary: every op and create returns with its message
 * rendered once, here ("[ring] all_sum #17: lost connection to rank 2
 * (...)"). Lower layers fill structured statuses; a plain one (the front-end's
 * callback, an older transport) passes through as it is. */
static int ring_done(int rc, mlxd_status* st, const char* op, uint64_t seq) {
  if (rc == 0) return 0;
  if (st->code == 0)
    mlxd_fail_at(st, rc, MLXD_LAYER_BACKEND, "the operation failed without a message (code %d)",
                 rc);
  if (op) mlxd_status_set_op(st, op, seq);
  mlxd_status_render(st, "ring");
  return st->code;
}

/* The names users call the ops by (mlx_distributed_*). */
static const char* reduce_name(mlxd_reduce_op op) {
  return op == MLXD_MAX ? "all_max" : op == MLXD_MIN ? "all_min" : "all_sum";
}

/* What this rank is calling, for every message of the op (transport.h). */
static mlxd_sig make_sig(const mlxd_backend* b, mlxd_sig_op op, mlx_dtype dtype, size_t count) {
  return (mlxd_sig){(uint8_t)op, (uint8_t)dtype, 0, (uint32_t)b->size, (uint64_t)count};
}

/* MLX_RING_VERBOSE: which algorithm a collective of nbytes (this rank's
 * input) runs: "[ring] rank 0: all_sum 1048576 B: hier (2 hosts x 2)". */
static void log_algo(const mlxd_ring* r, const char* op, size_t nbytes, size_t whole) {
  const mlxd_hier* h = r->hier;
  char where[96] = "";
  if (h) mlxd_hier_describe(h, where, sizeof where);
  mlxd_ring_log("rank %d: %s %zu B: %s%s%s%s", r->base.rank, op, nbytes, h ? "hier (" : "flat",
                where, h ? mlxd_hier_form_note(mlxd_hier_pick(h, whole)) : "", h ? ")" : "");
}

/* Every op runs on a group of two or more ranks (the front-end answers size
 * one itself) with the arguments backend.h guarantees: asserted, not
 * checked again. The two-level forms (algo/hier.h) wherever the group has a
 * host map (r->hier: MLXDIST_ALGO is not flat and the map applies), at every
 * size: measured at 2 x 2, 2 x 3 and 3 x 2 hosts x ranks, they were at least
 * the flat ones' speed at every size (docs/ring.md, "Two levels at every
 * size"). The same on every rank: the mode is checked at init. */
static int ring_all_reduce(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t count,
                           mlx_dtype dtype, mlxd_reduce_op op, mlxd_status* st) {
  mlxd_ring* r = (mlxd_ring*)b;
  assert(r->t);
  mlxd_sig sig = make_sig(b, MLXD_SIG_ALL_SUM + (op - MLXD_SUM), dtype, count);
  size_t nbytes = count * mlx_dtype_size(dtype);
  if (r->verbose) log_algo(r, reduce_name(op), nbytes, nbytes);
  const mlxd_hier* h = r->hier;
  int rc = h ? mlxd_algo_hier_all_reduce(r->t, h, seq, &sig, in, out, count, dtype, op, st)
             : mlxd_algo_all_reduce(r->t, seq, &sig, in, out, count, dtype, op, st);
  return ring_done(rc, st, reduce_name(op), seq);
}

static int ring_all_gather(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t nbytes,
                           mlx_dtype dtype, mlxd_status* st) {
  mlxd_ring* r = (mlxd_ring*)b;
  assert(r->t);
  mlxd_sig sig = make_sig(b, MLXD_SIG_ALL_GATHER, dtype, nbytes / mlx_dtype_size(dtype));
  if (r->verbose) log_algo(r, "all_gather", nbytes, nbytes * (size_t)b->size);
  const mlxd_hier* h = r->hier;
  int rc = h ? mlxd_algo_hier_all_gather(r->t, h, seq, &sig, in, out, nbytes, st)
             : mlxd_algo_all_gather(r->t, seq, &sig, in, out, nbytes, st);
  return ring_done(rc, st, "all_gather", seq);
}

static int ring_reduce_scatter(mlxd_backend* b, uint64_t seq, const void* in, void* out,
                               size_t count, mlx_dtype dtype, mlxd_reduce_op op, mlxd_status* st) {
  mlxd_ring* r = (mlxd_ring*)b;
  assert(r->t);
  mlxd_sig sig = make_sig(b, MLXD_SIG_SUM_SCATTER + (op - MLXD_SUM), dtype, count);
  const char* name = op == MLXD_SUM ? "sum_scatter" : "reduce_scatter";
  size_t nbytes = count * mlx_dtype_size(dtype) * (size_t)b->size;
  if (r->verbose) log_algo(r, name, nbytes, nbytes);
  const mlxd_hier* h = r->hier;
  int rc = h ? mlxd_algo_hier_reduce_scatter(r->t, h, seq, &sig, in, out, count, dtype, op, st)
             : mlxd_algo_reduce_scatter(r->t, seq, &sig, in, out, count, dtype, op, st);
  return ring_done(rc, st, name, seq);
}

static int ring_send(mlxd_backend* b, uint64_t seq, const void* buf, size_t nbytes, mlx_dtype dtype,
                     int dst, mlxd_status* st) {
  mlxd_ring* r = (mlxd_ring*)b;
  assert(r->t && dst >= 0 && dst < b->size && dst != b->rank);
  mlxd_sig sig = make_sig(b, MLXD_SIG_SEND, dtype, nbytes);
  return ring_done(mlxd_algo_send(r->t, seq, &sig, buf, nbytes, dst, st), st, "send", seq);
}

static int ring_recv(mlxd_backend* b, uint64_t seq, void* buf, size_t nbytes, mlx_dtype dtype,
                     int src, mlxd_status* st) {
  mlxd_ring* r = (mlxd_ring*)b;
  assert(r->t && src >= 0 && src < b->size && src != b->rank);
  mlxd_sig sig = make_sig(b, MLXD_SIG_RECV, dtype, nbytes);
  return ring_done(mlxd_algo_recv(r->t, seq, &sig, buf, nbytes, src, st), st, "recv", seq);
}

/* Closing is enough: the TCP transport treats a peer that closes after its
 * work as a normal shutdown (only operations still involving that peer fail),
 * so a rank that finishes early does not disturb its peers' last operations. */
static void ring_destroy(mlxd_backend* b) {
  mlxd_ring* r = (mlxd_ring*)b;
  if (!r) return;
  if (r->t) r->t->ops->destroy(r->t);
  mlxd_ring_auth_clear(&r->auth);
  mlxd_hier_free(r->hier);
  free(r->host_of);
  free(r);
}

/* In a forked child: close the copies of the connections (backend.h). */
static void ring_forget(mlxd_backend* b) {
  mlxd_ring* r = (mlxd_ring*)b;
  if (r->t && r->t->ops->forget) r->t->ops->forget(r->t);
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
  c->base = (mlxd_backend){.ops = r->base.ops, .rank = me, .size = m, .comm_device = MLX_CPU};
  c->nconn = r->nconn;
  c->self = r->self;
  c->auth = *child;
  c->t = shm;
  c->host_of = host_of;
  c->verbose = mlxd_ring_verbose();
  snprintf(c->session, sizeof c->session, "%.*s", (int)sizeof c->session - 1, name);
  bool* on = calloc((size_t)m, sizeof *on);
  if (on) {
    for (int p = 0; p < m; p++) on[p] = p != me;
    mlxd_ring_log_transports(me, m, on);
    free(on);
  }
  mlxd_ring_log("rank %d of %d ready (shm transport, split on one host: no TCP mesh)", me, m);
  *out = &c->base;
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
  if (!r->t) {
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
  mlxd_sig sig = make_sig(b, MLXD_SIG_SPLIT, MLX_UINT8, per);
  sig.dtype = MLXD_SIG_NO_DTYPE;
  if ((rc = mlxd_algo_all_gather(r->t, seq, &sig, src, all, per, st))) goto done;

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
  bool one_host = mode != MLXD_RING_T_TCP && strcmp(r->t->ops->name, "tcp") != 0;
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

/* The transport fails every pending op and tells the peers. */
static void ring_abort(mlxd_backend* b, const mlxd_status* st) {
  mlxd_ring* r = (mlxd_ring*)b;
  if (r->t) r->t->ops->abort(r->t, st);
}

static const mlxd_backend_ops ring_ops = {
    .name = "ring",
    .all_reduce = ring_all_reduce,
    .all_gather = ring_all_gather,
    .reduce_scatter = ring_reduce_scatter,
    .send = ring_send,
    .recv = ring_recv,
    .split = ring_split,
    .destroy = ring_destroy,
    .abort = ring_abort,
    .forget = ring_forget,
    /* no *_ref ops: the ring's ops never use a buffer after they return */
};

int mlxd_ring_backend_new(int rank, int size, int nconn, const mlxd_ring_addr* self,
                          const mlxd_ring_auth* auth, int* fds, mlxd_backend** out,
                          mlxd_status* st) {
  *out = NULL;
  mlxd_ring* r = calloc(1, sizeof *r);
  if (!r) {
    if (size > 1) mlxd_ring_close_all(fds, size * nconn);
    return mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BACKEND, "out of memory creating the group");
  }
  r->base.ops = &ring_ops;
  r->base.rank = rank;
  r->base.size = size;
  r->base.comm_device = MLX_CPU;
  r->nconn = nconn;
  r->self = *self;
  r->auth = *auth;
  if (size > 1) {
    r->t = mlxd_tcp_transport_new(rank, size, fds, nconn, st);
    for (int i = 0; i < size * nconn; i++) fds[i] = -1; /* owned (or closed) by the transport */
    if (!r->t) {
      mlxd_ring_auth_clear(&r->auth);
      free(r);
      if (!st->code)
        mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP, "cannot create the TCP transport");
      return st->code;
    }
    r->host_of = calloc((size_t)size, sizeof *r->host_of);
    if (!r->host_of)
      mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BACKEND, "out of memory creating the group");
    if (!r->host_of || mlxd_ring_select_transport(&r->t, r->host_of, r->session, st) != 0) {
      r->t->ops->destroy(r->t);
      mlxd_ring_auth_clear(&r->auth);
      free(r->host_of);
      free(r);
      if (!st->code)
        mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP, "cannot choose the transport");
      return st->code;
    }
    r->verbose = mlxd_ring_verbose();
    if (mlxd_hier_mode() != MLXD_ALGO_FLAT) {
      r->hier = mlxd_hier_new(rank, size, r->host_of, st);
      if (!r->hier) {
        ring_destroy(&r->base);
        return st->code;
      }
      if (!mlxd_hier_applies(r->hier)) {
        mlxd_hier_free(r->hier);
        r->hier = NULL;
      }
    }
    if (r->hier) {
      char where[96];
      mlxd_hier_describe(r->hier, where, sizeof where);
      mlxd_ring_log("rank %d: two-level collectives (%s; MLXDIST_ALGO=%s)", rank, where,
                    mlxd_tunable_str(MLXD_T_ALGO));
    }
  }
  mlxd_ring_log("rank %d of %d ready (%s transport, %d TCP connection(s) per peer at set-up)", rank,
                size, r->t ? r->t->ops->name : "no", nconn);
  *out = &r->base;
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
  return env_set("MLX_RANK") && env_set("MLX_HOSTFILE");
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
  int* fds = NULL;
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
  fds = malloc(sizeof(int) * (size_t)n * (size_t)k);
  if (lfds)
    for (int c = 0; c < k; c++) lfds[c] = -1;
  if (!lfds || !fds) {
    rc =
        mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory connecting %d ranks", n);
    goto done;
  }
  for (int c = 0; c < k; c++) {
    mlxd_ring_addr a = hosts.addrs[rank * k + c];
    if ((rc = mlxd_ring_listen(&a, &lfds[c], st))) goto done;
  }
  if ((rc = mlxd_ring_mesh((int)rank, &hosts, lfds, &auth, fds, st))) goto done;
  rc = mlxd_ring_backend_new((int)rank, n, k, &self, &auth, fds, out, st);
done:
  mlxd_ring_auth_clear(&auth);
  if (lfds) mlxd_ring_close_all(lfds, k);
  free(lfds);
  free(fds);
  mlxd_ring_hosts_free(&hosts);
  return rc;
}

static int ring_create(mlxd_bootstrap* bs, mlxd_backend** out, mlxd_status* st) {
  *out = NULL;
  int rc = bs                                  ? mlxd_ring_create_bootstrap(bs, out, st)
           : mlxd_ring_rendezvous_configured() ? mlxd_ring_create_rendezvous(out, st)
                                               : ring_create_hostfile(out, st);
  return ring_done(rc, st, NULL, 0);
}

const mlxd_backend_kind mlxd_ring_kind = {"ring",      ring_available, ring_configured,
                                          ring_create, true,           false};
