/* The jaccl backend (MLX's RDMA backend) over the verbs transport.
 *
 * create: the configuration (jaccl_config.c) and this machine's devices
 * (rdma/probe.c) are checked first, and a failure names the first of: the
 * configuration's error, a device the matrix names that this machine does
 * not have, why the devices cannot be used (no library, no device, no active
 * port). Then this rank's row of the matrix gives each peer's rails (the
 * devices of its cell; several: multi-rail) and the verbs transport
 * (transport/verbs.h) is built, its queue pair addresses exchanged through
 * the side channel (jaccl_side.h: the coordinator's TCP star) or, with
 * mlx_distributed_init_with_all_gather, through the caller's all-gather (no
 * coordinator read or opened). The side channel is closed once the group is
 * built.
 *
 * Routes (build): the router (transport/router.h) gives the ranks of one host
 * shared memory, the pairs the matrix links verbs, the others TCP; every
 * rank on one host: shm alone, no queue pair. Topologies (across hosts).
 * Mesh: every pair has a link, the group is the verbs transport alone.
 * Ring (MLX_JACCL_RING, or a matrix with only the neighbour cells):
 * only neighbours have devices, yet every op works between any two ranks
 * (send/recv to any peer, the small-message algorithms that talk to every
 * rank): a group in which some pair has no link also gets a TCP mesh,
 * built through the same all-gather (address records, the networking layer's
 * handshake), and the router's composite routes the linked
 * peers over verbs and the others over TCP. The TCP mesh joins every pair
 * (the TCP transport wants every peer connected; the linked pairs' sockets
 * then carry only heartbeats): one socket per pair is cheap beside a queue
 * pair. Rings of 2 and 3 ranks link every pair, so they need no TCP.
 *
 * The ops are the shared ones over one transport (backends/common/xgroup.h);
 * split all-gathers (color, key) over the parent (net/split.c) and builds the child's own
 * transport (its own queue pairs) with an all-gather over the PARENT's
 * transport restricted to the child's ranks (a view, transport/view.h).
 * See docs/jaccl.md. */
#include <dirent.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "algo/algo.h"
#include "backends/common/xgroup.h"
#include "backends/jaccl/jaccl_config.h"
#include "backends/jaccl/jaccl_side.h"
#include "distributed/group_impl.h"
#include "net/net.h"
#include "rdma/probe.h"
#include "security/secret.h"
#include "transport/router.h"
#include "transport/shm.h"
#include "transport/tcp.h"
#include "transport/verbs.h"
#include "transport/view.h"
#include "util/bytes.h"
#include "util/tunables.h"

#define TAG "jaccl"
/* A wait on several transports (router.h) sleeps in shm's doorbell or TCP's poll() 100 us at
 * a time, doubling while idle up to this: verbs messages wait at most that long then. */
#define MIXED_IDLE_MAX_S 2e-3

static bool jaccl_available(char* why, size_t len) {
  mlxd_verbs_probe* p = malloc(sizeof *p);
  if (!p) {
    if (why && len) snprintf(why, len, "[jaccl] out of memory probing the RDMA devices");
    return false;
  }
  mlxd_verbs_probe_run(p);
  char w[MLXD_MSG_MAX];
  bool ok = mlxd_verbs_usable(p, w, sizeof w);
  if (!ok && why && len) snprintf(why, len, "[jaccl] %s", w);
  free(p);
  return ok;
}

static bool jaccl_configured(bool with_bootstrap) { return mlxd_jaccl_env_present(with_bootstrap); }

/* The devices /sys/class/infiniband lists (what the kernel has, library or not). */
static bool sysfs_has(const char* name) {
  char path[128];
  struct stat sb;
  snprintf(path, sizeof path, "/sys/class/infiniband/%s", name);
  return stat(path, &sb) == 0;
}

static void list_devices(const mlxd_verbs_probe* p, char* buf, size_t len) {
  size_t used = 0;
  buf[0] = '\0';
  if (p->lib == MLXD_VERBS_OK) {
    for (int i = 0; i < p->ndev; i++) {
      int w = snprintf(buf + used, len - used, "%s%s", i ? ", " : "", p->devs[i].name);
      if (w < 0 || (size_t)w >= len - used) break;
      used += (size_t)w;
    }
  } else {
    DIR* d = opendir("/sys/class/infiniband");
    struct dirent* e;
    while (d && (e = readdir(d)) != NULL) {
      if (e->d_name[0] == '.') continue;
      int w = snprintf(buf + used, len - used, "%s%s", used ? ", " : "", e->d_name);
      if (w < 0 || (size_t)w >= len - used) break;
      used += (size_t)w;
    }
    if (d) closedir(d);
  }
  if (!buf[0]) snprintf(buf, len, "none");
}

/* This rank's row: every device it names must exist here and have an active port. */
static int check_row(const mlxd_jaccl_config* c, const mlxd_verbs_probe* p, mlxd_status* st) {
  char have[400];
  for (int j = 0; j < c->size; j++) {
    int n = mlxd_jaccl_cell_count(&c->m, c->rank, j);
    for (int k = 0; k < n; k++) {
      const char* name = mlxd_jaccl_cell_name(&c->m, c->rank, j, k);
      bool exists = p->lib == MLXD_VERBS_OK ? mlxd_verbs_find(p, name) != NULL : sysfs_has(name);
      if (exists) continue;
      list_devices(p, have, sizeof have);
      return mlxd_fail(st, MLXD_EINVAL,
                       "[jaccl] %s: the device matrix '%s' names '%s' at row %d, column %d (rank "
                       "%d's device to rank %d), but this machine has no such RDMA device "
                       "(devices here: %s; mlxdist-info lists them)",
                       c->devices_var, c->path, name, c->rank, j, c->rank, j, have);
    }
  }
  if (p->lib != MLXD_VERBS_OK) return 0; /* the probe's reason comes next */
  for (int j = 0; j < c->size; j++) {
    int n = mlxd_jaccl_cell_count(&c->m, c->rank, j);
    for (int k = 0; k < n; k++) {
      const mlxd_verbs_dev* d = mlxd_verbs_find(p, mlxd_jaccl_cell_name(&c->m, c->rank, j, k));
      if (mlxd_verbs_active_port(d)) continue;
      char ports[300];
      size_t used = 0;
      ports[0] = '\0';
      for (int q = 0; q < d->nports; q++) {
        int w = snprintf(ports + used, sizeof ports - used, "%sport %d %s", q ? ", " : "",
                         d->ports[q].num, mlxd_verbs_port_word(&d->ports[q]));
        if (w < 0 || (size_t)w >= sizeof ports - used) break;
        used += (size_t)w;
      }
      return mlxd_fail(
          st, MLXD_EUNAVAIL,
          "[jaccl] device '%s' (row %d, column %d of '%s') has no active port (%s%s%s)", d->name,
          c->rank, j, c->path, ports[0] ? ports : "no port", d->err[0] ? "; " : "", d->err);
    }
  }
  return 0;
}

/* ---- the group ---- */

typedef char jaccl_dev[MLXD_JACCL_DEV_MAX + 1];

typedef struct jaccl {
  mlxd_xgroup g;      /* first: the ops over g.t, tag "jaccl" */
  int* rails;         /* size * size: the rails of every pair (the matrix's cell counts) */
  jaccl_dev* row;     /* size * MLXD_VERBS_MAX_RAILS: this rank's devices to each peer */
  mlxd_net_auth auth; /* the secret's key (and the token split derives its children's from) */
  mlxd_net_addr host; /* the address a TCP mesh listens on (port 0) */
} jaccl;

static const mlxd_backend_ops jaccl_ops;

static int jaccl_done(int rc, mlxd_status* st, const char* op, uint64_t seq) {
  return mlxd_xg_done(TAG, rc, st, op, seq);
}

static void jaccl_destroy(mlxd_backend* b) {
  jaccl* j = (jaccl*)b;
  if (!j) return;
  if (j->g.t) j->g.t->ops->destroy(j->g.t);
  mlxd_net_auth_clear(&j->auth);
  free(j->rails);
  free(j->row);
  free(j);
}

static jaccl* jaccl_alloc(int rank, int size, mlxd_status* st) {
  jaccl* j = calloc(1, sizeof *j);
  if (j) {
    j->rails = calloc((size_t)size * (size_t)size, sizeof *j->rails);
    j->row = calloc((size_t)size * MLXD_VERBS_MAX_RAILS, sizeof *j->row);
  }
  if (!j || !j->rails || !j->row) {
    if (j) jaccl_destroy(&j->g.base);
    mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BACKEND, "out of memory creating the group");
    return NULL;
  }
  j->g.base = (mlxd_backend){.ops = &jaccl_ops, .rank = rank, .size = size, .comm_device = MLX_CPU};
  j->g.tag = TAG;
  return j;
}

/* The all-gather the set-up runs through: the side channel, the caller's
 * callback, or (split) the parent's transport. */
typedef struct bs_ctx {
  mlxd_bootstrap* bs;
} bs_ctx;

static int bs_allgather(void* ctx, const void* src, void* dst, size_t n, mlxd_status* st) {
  mlxd_bootstrap* bs = ((bs_ctx*)ctx)->bs;
  int rc = bs->all_gather(bs, dst, src, n, st);
  if (rc && !st->code)
    mlxd_fail_at(st, MLXD_ECALLBACK, MLXD_LAYER_BOOTSTRAP, "the all-gather callback failed");
  return rc ? st->code : 0;
}

/* A TCP mesh of the group through ag: listen on host, all-gather the address
 * records (each with a fresh nonce), connect every pair with the networking
 * layer's handshake (the token derived from every record, the secret's key
 * from auth), hand the sockets to a TCP transport. */
static int tcp_mesh(int rank, int size, const mlxd_net_addr* host, const mlxd_net_auth* auth,
                    mlxd_verbs_allgather_fn ag, void* ctx, mlxd_transport** out, mlxd_status* st) {
  *out = NULL;
  mlxd_net_auth a = *auth;
  int lfd = -1, rc = 0;
  int* fds = malloc(sizeof(int) * (size_t)size);
  unsigned char* all = calloc((size_t)size, MLXD_NET_REC_BYTES);
  mlxd_net_hosts hosts = {size, 1, calloc((size_t)size, sizeof(mlxd_net_addr))};
  unsigned char rec[MLXD_NET_REC_BYTES], nonce[MLXD_NET_REC_NONCE_BYTES];
  mlxd_net_addr mine;
  if (!fds || !all || !hosts.addrs) {
    rc = mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory");
    goto done;
  }
  if ((rc = mlxd_net_listen_many(host, 1, &lfd, &mine, st))) goto done;
  if ((rc = mlxd_random_bytes(nonce, sizeof nonce, st))) goto done;
  mlxd_net_rec_encode(rec, rank, size, 0, 1, &mine, nonce);
  if ((rc = ag(ctx, rec, all, sizeof rec, st))) goto done;
  for (int r = 0; r < size; r++)
    if ((rc = mlxd_net_rec_decode(all + (size_t)r * MLXD_NET_REC_BYTES, r, size, 0, 1,
                                  "the set-up's all-gather", &hosts.addrs[r], st)))
      goto done;
  if ((rc = mlxd_crypto_init(st))) goto done; /* the token is a digest */
  mlxd_hs_token_records(all, (size_t)size * MLXD_NET_REC_BYTES, a.token);
  mlxd_net_mesh_opts o = {.tag = TAG, .link = NULL, .what = "device matrix"};
  if ((rc = mlxd_net_mesh_with(rank, &hosts, &lfd, &a, &o, fds, st))) goto done;
  *out = mlxd_tcp_transport_new(rank, size, fds, 1, st); /* owns the fds, also on failure */
  if (!*out) rc = st->code ? st->code : MLXD_ESYS;
done:
  mlxd_net_auth_clear(&a);
  if (lfd >= 0) close(lfd);
  free(fds);
  free(all);
  free(hosts.addrs);
  return rc;
}

/* What a rank all-gathers before the router chooses: 0 its host key (router.h; MLXDIST_HOST_ID
 * when set), 8 its machine (the boot id's hash), 16 its pid (u32) and 20 a random u64 (its
 * host's shared-memory session is named after its host's first rank's), 28 zero. */
#define HOST_REC_BYTES 32

/* Build j's transport (collective) through the router (transport/router.h): shm to the
 * ranks on this rank's host, verbs to the peers the matrix links it to, TCP to the others;
 * the verbs transport and the TCP mesh are built only when some pair of the group takes
 * them (every rank computes the same routes from the same facts). */
static int build(jaccl* j, mlxd_verbs_allgather_fn ag, void* ctx, mlxd_status* st) {
  const int rank = j->g.base.rank, size = j->g.base.size;
  mlxd_verbs_peer* peers = calloc((size_t)size, sizeof *peers);
  uint64_t* hosts = calloc((size_t)size, sizeof *hosts);
  unsigned char* recs = calloc((size_t)size, HOST_REC_BYTES);
  unsigned char* oks = calloc((size_t)size, 8);
  int* members = calloc((size_t)size, sizeof *members);
  mlxd_route_kind* kind_of = calloc((size_t)size, sizeof *kind_of);
  mlxd_transport* parts[MLXD_ROUTE_KINDS] = {NULL};
  int rc = 0;
  if (!peers || !hosts || !recs || !oks || !members || !kind_of) {
    rc = mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BACKEND, "out of memory");
    goto done;
  }
  /* 1. every rank's host */
  const char* host_id = NULL;
  unsigned char hrec[MLXD_ROUTE_HOST_BYTES], mine[HOST_REC_BYTES] = {0};
  uint64_t rnd = 0;
  if ((rc = mlxd_route_host_id(&host_id, st))) goto done;
  if ((rc = mlxd_random_bytes(&rnd, sizeof rnd, st))) goto done;
  mlxd_route_host_record(hrec, host_id);
  mlxd_put64(mine, mlxd_route_hash(MLXD_ROUTE_HASH_START, hrec, sizeof hrec));
  mlxd_put64(mine + 8, mlxd_route_machine_key());
  mlxd_put32(mine + 16, (uint32_t)getpid());
  mlxd_put64(mine + 20, rnd);
  if ((rc = ag(ctx, mine, recs, HOST_REC_BYTES, st))) goto done;
  int machine = 0; /* the group's ranks on this machine's CPUs (spin.h) */
  for (int p = 0; p < size; p++) {
    hosts[p] = mlxd_get64(recs + (size_t)p * HOST_REC_BYTES);
    machine += mlxd_get64(recs + (size_t)p * HOST_REC_BYTES + 8) == mlxd_get64(mine + 8);
  }
  mlxd_route_facts f = {.rank = rank, .size = size, .host = hosts, .rails = j->rails};
  for (int k = 0; k < MLXD_ROUTE_KINDS; k++) f.allow[k] = true;
  /* 2. the shared-memory session of this host's ranks; every rank says whether it joined */
  int me = -1;
  int nloc = mlxd_route_shm_members(&f, members, &me);
  mlxd_status sst = {0};
  if (nloc >= 2) {
    const unsigned char* first = recs + (size_t)members[0] * HOST_REC_BYTES;
    char name[96];
    snprintf(name, sizeof name, "mlxdist-j%lu-%016llx-h%d", (unsigned long)mlxd_get32(first + 16),
             (unsigned long long)mlxd_get64(first + 20), members[0]);
    parts[MLXD_ROUTE_SHM] =
        nloc == size ? mlxd_shm_transport_new(rank, size, name, &sst)
                     : mlxd_shm_transport_new_named(me, nloc, name, members, size, machine, &sst);
  }
  unsigned char ok[8] = {parts[MLXD_ROUTE_SHM] || nloc < 2 ? 1 : 0};
  if ((rc = ag(ctx, ok, oks, sizeof ok, st))) goto done;
  int bad = -1;
  for (int p = 0; p < size && bad < 0; p++)
    if (oks[(size_t)p * 8] != 1) bad = p;
  if (bad >= 0) { /* no shm anywhere: its pairs take verbs or TCP */
    f.allow[MLXD_ROUTE_SHM] = false;
    if (parts[MLXD_ROUTE_SHM]) parts[MLXD_ROUTE_SHM]->ops->destroy(parts[MLXD_ROUTE_SHM]);
    parts[MLXD_ROUTE_SHM] = NULL;
    if (mlxd_net_verbose()) {
      if (bad == rank) mlxd_status_render(&sst, NULL);
      fprintf(stderr,
              "[jaccl] rank %d: shared memory could not start on rank %d%s%s; verbs or TCP "
              "carry the pairs of its host\n",
              rank, bad, bad == rank ? ": " : "", bad == rank ? sst.msg : "");
    }
  }
  /* 3. the routes, and the transports the group's routes take */
  unsigned group = mlxd_route_group_kinds(&f);
  for (int p = 0; p < size; p++) {
    kind_of[p] = p == rank ? MLXD_ROUTE_KINDS : mlxd_route_pick(&f, rank, p);
    int n = kind_of[p] == MLXD_ROUTE_VERBS ? j->rails[rank * size + p] : 0;
    peers[p].nrails = n;
    for (int k = 0; k < n; k++) peers[p].dev[k] = j->row[p * MLXD_VERBS_MAX_RAILS + k];
  }
  if (group & (1u << MLXD_ROUTE_VERBS)) {
    parts[MLXD_ROUTE_VERBS] = mlxd_verbs_transport_new(rank, size, peers, ag, ctx, st);
    if (!parts[MLXD_ROUTE_VERBS]) {
      rc = st->code ? st->code : MLXD_ESYS;
      goto done;
    }
  }
  if ((group & (1u << MLXD_ROUTE_TCP)) &&
      (rc = tcp_mesh(rank, size, &j->host, &j->auth, ag, ctx, &parts[MLXD_ROUTE_TCP], st)))
    goto done;
  if (mlxd_net_verbose()) mlxd_route_log(TAG, rank, size, kind_of);
  /* a wait on several parts sleeps on shm or TCP (their wake-ups), never on verbs */
  mlxd_router_opts o = {.max_idle_s = MIXED_IDLE_MAX_S,
                        .pipeline_chunk =
                            parts[MLXD_ROUTE_VERBS] ? parts[MLXD_ROUTE_VERBS]->pipeline_chunk : 0,
                        .machine_ranks = machine,
                        .stats_tag = mlxd_net_verbose() ? TAG : NULL};
  j->g.t = mlxd_router_new(&f, parts, &o, st);
  if (!j->g.t) rc = st->code ? st->code : MLXD_ENOMEM;
done:
  if (!j->g.t)
    for (int k = 0; k < MLXD_ROUTE_KINDS; k++)
      if (parts[k]) parts[k]->ops->destroy(parts[k]);
  free(peers);
  free(hosts);
  free(recs);
  free(oks);
  free(members);
  free(kind_of);
  return rc;
}

/* Every pair's rails must agree: cell (i, j) and cell (j, i) have as many
 * devices (both empty: no link). */
static int check_pairs(const mlxd_jaccl_config* c, mlxd_status* st) {
  for (int i = 0; i < c->size; i++)
    for (int k = i + 1; k < c->size; k++) {
      int a = mlxd_jaccl_cell_count(&c->m, i, k), b = mlxd_jaccl_cell_count(&c->m, k, i);
      if (a != b)
        return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                            "%s: the device matrix '%s' has %d device(s) at row %d, column %d but "
                            "%d at row %d, column %d: both ends of a link need as many "
                            "(one queue pair per device, paired in order)",
                            c->devices_var, c->path, a, i, k, b, k, i);
    }
  return 0;
}

/* The address a TCP mesh listens on: MLXDIST_RING_ADDR or MLXDIST_IFNAME
 * when set; else, with a side channel, this rank's end of it (the interface
 * that reaches rank 0; rank 0: the coordinator's address); else the ring's
 * default (endpoint.c). */
static int mesh_host(const mlxd_jaccl_config* c, const mlxd_jaccl_side* sc, mlxd_net_addr* out,
                     mlxd_status* st) {
  const char* a = mlxd_tunable_str(MLXD_T_RING_ADDR);
  const char* f = mlxd_tunable_str(MLXD_T_IFNAME);
  if ((a && *a) || (f && *f) || !sc || !sc->fds) return mlxd_net_default_addr(out, st);
  memset(out, 0, sizeof *out);
  if (c->rank == 0) {
    *out = c->coord;
  } else {
    socklen_t len = sizeof out->sa;
    if (getsockname(sc->fds[0], (struct sockaddr*)&out->sa, &len) != 0)
      return mlxd_net_default_addr(out, st);
    out->len = len;
  }
  if (out->sa.ss_family == AF_INET)
    ((struct sockaddr_in*)(void*)&out->sa)->sin_port = 0;
  else if (out->sa.ss_family == AF_INET6)
    ((struct sockaddr_in6*)(void*)&out->sa)->sin6_port = 0;
  else
    return mlxd_net_default_addr(out, st);
  mlxd_net_format_addr((struct sockaddr*)&out->sa, out->text, sizeof out->text);
  return 0;
}

/* Everything checked: build the group from cfg through bs or the side channel. */
static int start(mlxd_bootstrap* bs, const mlxd_jaccl_config* c, mlxd_backend** out,
                 mlxd_status* st) {
  int rc;
  if ((rc = check_pairs(c, st))) return rc;
  jaccl* j = jaccl_alloc(c->rank, c->size, st);
  if (!j) return st->code;
  for (int p = 0; p < c->size; p++)
    for (int q = 0; q < c->size; q++)
      j->rails[p * c->size + q] = mlxd_jaccl_cell_count(&c->m, p, q);
  for (int p = 0; p < c->size; p++)
    for (int k = 0; k < j->rails[c->rank * c->size + p] && k < MLXD_VERBS_MAX_RAILS; k++)
      snprintf(j->row[p * MLXD_VERBS_MAX_RAILS + k], sizeof(jaccl_dev), "%s",
               mlxd_jaccl_cell_name(&c->m, c->rank, p, k));
  mlxd_jaccl_side sc = {0};
  bool side = false;
  if (bs) {
    bs->rank = c->rank;
    bs->size = c->size;
    rc = mlxd_net_auth_load(&j->auth, st); /* the secret, for a TCP mesh */
  } else {
    rc = mlxd_jaccl_side_auth(c, &j->auth, st);
    if (rc == 0 && c->size > 1) {
      rc = mlxd_jaccl_side_open(c, &j->auth, &sc, st);
      side = rc == 0;
    }
  }
  if (rc == 0 && c->size > 1) rc = mesh_host(c, side ? &sc : NULL, &j->host, st);
  if (rc == 0 && c->size > 1) {
    bs_ctx bc = {bs};
    rc = bs ? build(j, bs_allgather, &bc, st) : build(j, mlxd_jaccl_side_allgather, &sc, st);
  }
  if (side) mlxd_jaccl_side_close(&sc);
  if (rc) {
    jaccl_destroy(&j->g.base);
    return rc;
  }
  *out = &j->g.base;
  return 0;
}

/* ---- split: all-gather (color, key) over the parent, the child's transport
 * set up through the parent's transport ---- */

/* The child's set-up all-gathers: over a view of the parent's transport on
 * the child's ranks, under the split's sequence number, phase 1, one
 * segment per round (never matching the split's own exchange, phase 0, or
 * each other). */
typedef struct view_ag {
  mlxd_transport* parent;
  const int* ranks;
  int m, me;
  uint64_t seq;
  unsigned round;
} view_ag;

static int view_allgather(void* ctx, const void* src, void* dst, size_t n, mlxd_status* st) {
  view_ag* a = ctx;
  if (a->round >= MLXD_TAG_SEGMENTS)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BACKEND,
                        "split's set-up needs more than %d all-gathers", MLXD_TAG_SEGMENTS);
  mlxd_view v;
  mlxd_view_init(&v, a->parent, a->ranks, a->m, a->me, 1);
  mlxd_view_set_segment(&v, a->round++);
  return mlxd_algo_all_gather(&v.base, a->seq, NULL, src, dst, n, st);
}

static int split_run(jaccl* j, uint64_t seq, int color, int key, mlxd_backend** out,
                     mlxd_status* st) {
  const int n = j->g.base.size, rank = j->g.base.rank;
  int* ranks = calloc((size_t)n, sizeof *ranks);
  mlxd_net_split sp = {0, -1, NULL, NULL};
  jaccl* c = NULL;
  int rc = 0;
  if (!ranks) {
    rc = mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BACKEND, "out of memory");
    goto done;
  }
  if ((rc =
           mlxd_net_split_exchange(j->g.t, seq, rank, n, color, key, NULL, 0, NULL, NULL, &sp, st)))
    goto done;
  const int m = sp.m, me = sp.me;
  for (int i = 0; i < m; i++) ranks[i] = sp.members[i].prank;
  if ((rc = mlxd_crypto_init(st))) goto done; /* the child's token is a digest */
  if (!(c = jaccl_alloc(me, m, st))) {
    rc = st->code;
    goto done;
  }
  for (int a = 0; a < m; a++) {
    for (int b = 0; b < m; b++) c->rails[a * m + b] = j->rails[ranks[a] * n + ranks[b]];
    memcpy(c->row + (size_t)a * MLXD_VERBS_MAX_RAILS,
           j->row + (size_t)ranks[a] * MLXD_VERBS_MAX_RAILS,
           sizeof(jaccl_dev) * MLXD_VERBS_MAX_RAILS);
  }
  /* The child's connections prove the parent's secret; its TCP mesh's token comes from its own
   * records, and the split's from the parent's, this split's number and the color. */
  c->auth = j->auth;
  mlxd_hs_token_split(j->auth.token, seq, color, c->auth.token);
  c->host = j->host;
  if (m > 1) {
    view_ag va = {j->g.t, ranks, m, me, seq, 0};
    rc = build(c, view_allgather, &va, st);
  }
done:
  if (rc && c) {
    jaccl_destroy(&c->g.base);
    c = NULL;
  }
  if (c) *out = &c->g.base;
  mlxd_net_split_free(&sp);
  free(ranks);
  return rc;
}

static int jaccl_split(mlxd_backend* b, uint64_t seq, int color, int key, mlxd_backend** out,
                       mlxd_status* st) {
  *out = NULL;
  return jaccl_done(split_run((jaccl*)b, seq, color, key, out, st), st, "split", seq);
}

static const mlxd_backend_ops jaccl_ops = {
    .name = "jaccl",
    .all_reduce = mlxd_xg_all_reduce,
    .all_gather = mlxd_xg_all_gather,
    .reduce_scatter = mlxd_xg_reduce_scatter,
    .all_to_all = mlxd_xg_all_to_all,
    .send = mlxd_xg_send,
    .recv = mlxd_xg_recv,
    .split = jaccl_split,
    .destroy = jaccl_destroy,
    .abort = mlxd_xg_abort,
    .forget = mlxd_xg_forget,
    /* no *_ref ops: the ops never use a buffer after they return */
};

static int jaccl_create(mlxd_bootstrap* bs, mlxd_backend** out, mlxd_status* st) {
  *out = NULL;
  mlxd_verbs_probe* p = malloc(sizeof *p);
  if (!p) return mlxd_fail(st, MLXD_ENOMEM, "[jaccl] out of memory probing the RDMA devices");
  mlxd_verbs_probe_run(p);
  char why[MLXD_MSG_MAX];
  bool usable = mlxd_verbs_usable(p, why, sizeof why);
  mlxd_jaccl_config cfg;
  int rc = mlxd_jaccl_config_load(bs != NULL, &cfg, st);
  if (rc) { /* 1. the configuration */
    mlxd_status_render(st, TAG);
    if (!usable) {
      /* the probe's reason in short ("no libibverbs", "no RDMA device", "no active port"):
       * messages are at most MLXD_MSG_MAX bytes and the configuration's error comes first */
      char tmp[2 * MLXD_MSG_MAX];
      snprintf(tmp, sizeof tmp, "%s (and this machine could not run jaccl anyway: %.*s)", st->msg,
               (int)strcspn(why, ":"), why);
      snprintf(st->msg, sizeof st->msg, "%.*s", (int)sizeof st->msg - 1, tmp);
    }
    free(p);
    return rc;
  }
  rc = check_row(&cfg, p, st); /* 2. the devices this rank's row names */
  if (rc == 0 && !usable)      /* 3. the probe */
    rc = mlxd_fail(st, MLXD_EUNAVAIL, "[jaccl] %s", why);
  free(p);
  if (rc == 0) { /* 4. the group */
    rc = jaccl_done(start(bs, &cfg, out, st), st, NULL, 0);
    if (rc == 0 && mlxd_net_verbose()) /* MLX_RING_VERBOSE, as the ring's set-up lines */
      fprintf(stderr, "[jaccl] rank %d of %d ready (%s, %s transport)\n", cfg.rank, cfg.size,
              cfg.size > 1 ? mlxd_jaccl_topo_name(cfg.topo) : "alone",
              ((jaccl*)*out)->g.t ? ((jaccl*)*out)->g.t->ops->name : "no");
  }
  mlxd_jaccl_config_free(&cfg);
  return rc;
}

const mlxd_backend_kind mlxd_jaccl_kind = {
    .name = "jaccl",
    .is_available = jaccl_available,
    .is_configured = jaccl_configured,
    .create = jaccl_create,
    .supports_bootstrap = true,
    .diagnose_unavailable = true,
};
