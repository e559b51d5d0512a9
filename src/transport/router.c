/* The per-peer router: one mlxd_transport over any number of others of one
 * group, each peer routed to the first transport that can reach it. The
 * algorithms see one transport (transport.h) and never know which part
 * carries a message.
 *
 * Choosing (as NCCL's p2p/shm/net transports do: a can-connect test per
 * transport per peer, tried in order). The kinds, in the order of
 * preference: shm (the peer is on this rank's host: the same host key, a
 * hash of the host record below, and the group allows shm), verbs (the
 * device matrix has rails between the pair, both ways), tcp (always, unless
 * not allowed). The tests read only facts every rank of the group has alike
 * (the host keys all-gathered, the matrix every rank loaded), so both ranks
 * of a pair pick the same kind and every rank knows which collective set-ups
 * (a verbs transport, a TCP mesh) the group runs (mlxd_route_group_kinds).
 * The ring backend (select.c) makes the shm and tcp parts, jaccl (jaccl.c)
 * all three; each says what it chose in one line per rank (mlxd_route_log).
 *
 * Routing. Peer p's kind is kind_of[p] and its name in that part idx_of[p]:
 * its index among this host's shm ranks (increasing group ranks: the
 * session's ranks, mlxd_shm_transport_new_named), its group rank over verbs
 * and tcp (those span the group). A request of part k is returned with k in
 * its two lowest pointer bits (requests are malloc'd, so those bits are
 * free), which lets waitall route it back without allocating anything per
 * request.
 *
 * Waiting on several parts. A wait whose requests all live in one part is
 * that part's own waitall. A wait with requests in several (a ring step that
 * sends over one and receives over another) alternates slices of them
 * (wait_slice): a non-blocking pass over each part that does not sleep, then
 * the sleeping one (the first of shm, tcp, verbs that has requests: shm's
 * doorbell and tcp's poll wake for their own peers; verbs has no cheaper
 * wake-up than a poll of its completion queue), without blocking while any
 * part saw an event within MLXDIST_SPIN_US, after that sleeping in the
 * sleeping part for at most ROUTER_IDLE_SLICE_S (100 us; a router made with
 * a larger max_idle_s doubles the slice after each idle one, up to it, and
 * starts again at 100 us after any event); what arrives over the other parts
 * waits at most that long. There is no sched_yield in the slices; the loop
 * yields between spinning passes when the group has more ranks on this
 * machine than it has CPUs (as tcp.c does), so the rank it waits for gets
 * the CPU. Once only one part is pending it waits alone, as in its own
 * waitall (its liveness clocks run from the wait's start). Each part's wait
 * then ends with its own waitall on its requests, which reports a size
 * mismatch and frees them. Heartbeats need nothing here: each part sends its
 * own from the watchdog thread.
 *
 * Failure. The first failure of any part (a wait, a post, or found at the
 * end of a wait) fails the other parts with the same status through their
 * abort (so their peers hear of it too), and the router reports it; abort()
 * fails them all. A size mismatch fails only its receive.
 *
 * The composite's name is "mixed" (views and logs name it so). */
#include "transport/router.h"

#include <assert.h>
#include <fcntl.h>
#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "transport/spin.h"
#include "util/clock.h"
#include "util/tunables.h"

#define ROUTER_IDLE_SLICE_S 100e-6 /* the longest sleep in one part with another pending */
#define TAG_MASK ((uintptr_t)3)    /* a request's part, in its low pointer bits */

_Static_assert(MLXD_ROUTE_KINDS <= 4, "a request's part fits in its two low pointer bits");

static const char* const k_kind_names[] = {"shm", "verbs", "tcp", "none"};

const char* mlxd_route_kind_name(mlxd_route_kind k) {
  return k >= MLXD_ROUTE_SHM && k <= MLXD_ROUTE_KINDS ? k_kind_names[k] : "?";
}

/* ---- choosing ---- */

static bool shm_can(const mlxd_route_facts* f, int a, int b) {
  return f->host && f->host[a] == f->host[b];
}
static bool verbs_can(const mlxd_route_facts* f, int a, int b) {
  return f->rails && f->rails[a * f->size + b] > 0 && f->rails[b * f->size + a] > 0;
}
static bool tcp_can(const mlxd_route_facts* f, int a, int b) {
  (void)f;
  (void)a;
  (void)b;
  return true;
}

/* The can-connect test of each kind, in the order of preference. */
static bool (*const k_can[MLXD_ROUTE_KINDS])(const mlxd_route_facts*, int,
                                             int) = {shm_can, verbs_can, tcp_can};

bool mlxd_route_can_connect(const mlxd_route_facts* f, mlxd_route_kind k, int a, int b) {
  assert(f && a >= 0 && a < f->size && b >= 0 && b < f->size && a != b);
  return k >= 0 && k < MLXD_ROUTE_KINDS && f->allow[k] && k_can[k](f, a, b);
}

mlxd_route_kind mlxd_route_pick(const mlxd_route_facts* f, int a, int b) {
  for (int k = 0; k < MLXD_ROUTE_KINDS; k++)
    if (mlxd_route_can_connect(f, (mlxd_route_kind)k, a, b)) return (mlxd_route_kind)k;
  return MLXD_ROUTE_KINDS;
}

unsigned mlxd_route_group_kinds(const mlxd_route_facts* f) {
  unsigned mask = 0;
  for (int a = 0; a < f->size; a++)
    for (int b = a + 1; b < f->size; b++) mask |= 1u << mlxd_route_pick(f, a, b);
  return mask;
}

int mlxd_route_shm_members(const mlxd_route_facts* f, int* members, int* me) {
  int n = 0;
  *me = -1;
  for (int p = 0; p < f->size; p++)
    if (p == f->rank || mlxd_route_pick(f, f->rank, p) == MLXD_ROUTE_SHM) {
      if (p == f->rank) *me = n;
      members[n++] = p;
    }
  return n;
}

void mlxd_route_log(const char* tag, int rank, int size, const mlxd_route_kind* kind_of) {
  char* line = malloc((size_t)size * 24 + 64);
  if (!line) return;
  size_t o = (size_t)sprintf(line, "rank %d: transports:", rank);
  bool printed = false;
  for (int k = 0; k < MLXD_ROUTE_KINDS; k++) {
    bool any = false;
    for (int p = 0; p < size; p++) {
      if (p == rank || kind_of[p] != (mlxd_route_kind)k) continue;
      if (!any)
        o += (size_t)sprintf(line + o, "%s %s with ranks ", printed ? ";" : "", k_kind_names[k]);
      printed = true;
      o += (size_t)sprintf(line + o, "%s%d", any ? "," : "", p);
      any = true;
    }
  }
  fprintf(stderr, "[%s] %s\n", tag, line);
  free(line);
}

/* ---- host identity ---- */

uint64_t mlxd_route_hash(uint64_t h, const unsigned char* p, size_t n) {
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

static uint64_t ns_inode(const char* path) {
  struct stat sb;
  return stat(path, &sb) == 0 ? (uint64_t)sb.st_ino : 0;
}

static void read_boot_id(char* buf, size_t n) {
  memset(buf, 0, n);
  int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ssize_t k = read(fd, buf, n - 1);
  close(fd);
  if (k <= 0) {
    memset(buf, 0, n);
    return;
  }
  for (ssize_t i = 0; i < k; i++)
    if (buf[i] == '\n') buf[i] = '\0';
}

static void put_u64(unsigned char* p, uint64_t v) {
  for (int i = 7; i >= 0; i--) {
    p[i] = (unsigned char)v;
    v >>= 8;
  }
}

void mlxd_route_host_record(unsigned char rec[MLXD_ROUTE_HOST_BYTES], const char* host_id) {
  memset(rec, 0, MLXD_ROUTE_HOST_BYTES);
  if (host_id && *host_id) {
    /* MLXDIST_HOST_ID: the id alone says which host this rank is on. */
    snprintf((char*)rec + 16, 48, "%s", MLXD_ROUTE_HOST_ID_MARK);
    snprintf((char*)rec + 64, 128, "%s", host_id);
    return;
  }
  put_u64(rec, ns_inode("/proc/self/ns/net"));
  put_u64(rec + 8, ns_inode("/proc/self/ns/ipc"));
  read_boot_id((char*)rec + 16, 48);
  char host[256] = "";
  if (gethostname(host, sizeof host) != 0) host[0] = '\0';
  host[sizeof host - 1] = '\0';
  snprintf((char*)rec + 64, 128, "%.127s", host); /* a longer host name is cut */
}

uint64_t mlxd_route_machine_key(void) {
  char boot[48];
  read_boot_id(boot, sizeof boot);
  return mlxd_route_hash(MLXD_ROUTE_HASH_START, (const unsigned char*)boot,
                         strnlen(boot, sizeof boot));
}

int mlxd_route_host_id(const char** out, mlxd_status* st) {
  const char* v = mlxd_tunable_str(MLXD_T_HOST_ID);
  *out = NULL;
  if (!v || !*v) return 0;
  if (strlen(v) > 127)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "MLXDIST_HOST_ID is %zu characters long; expected at most 127", strlen(v));
  *out = v;
  return 0;
}

/* ---- the composite ---- */

typedef struct router {
  mlxd_transport base;
  mlxd_transport* part[MLXD_ROUTE_KINDS]; /* NULL: no peer over that kind */
  unsigned char* kind_of;                 /* size: each peer's kind (kind_of[rank] unused) */
  int* idx_of;                            /* size: each peer's name in its part */
  double max_idle_s;                      /* the longest sleep slice, reached by doubling */
  double spin_s;
  bool yield; /* more ranks than CPUs: give the CPU away between spinning passes */
  const char* stats_tag;
  _Atomic uint64_t sent[MLXD_ROUTE_KINDS]; /* bytes posted to send over each part */
} router;

/* The order in which parts are chosen to sleep in a wait on several. */
static const int k_sleep_order[MLXD_ROUTE_KINDS] = {MLXD_ROUTE_SHM, MLXD_ROUTE_TCP,
                                                    MLXD_ROUTE_VERBS};

static mlxd_req* tag_req(mlxd_req* r, int k) { return (mlxd_req*)((uintptr_t)r | (uintptr_t)k); }
static int req_part(const mlxd_req* r) { return (int)((uintptr_t)r & TAG_MASK); }
static mlxd_req* untag(mlxd_req* r) { return (mlxd_req*)((uintptr_t)r & ~TAG_MASK); }

/* Part `from` failed with st: fail the others with it (abort is a no-op on a
 * transport that failed already). A size mismatch is not a failure of the
 * transport. */
static void spread(router* t, int from, const mlxd_status* st) {
  if (!st->code || st->code == MLXD_EINVAL || st->code == MLXD_ENOMEM) return;
  for (int k = 0; k < MLXD_ROUTE_KINDS; k++)
    if (k != from && t->part[k]) t->part[k]->ops->abort(t->part[k], st);
}

static int post(mlxd_transport* tt, bool send, int peer, uint64_t tag, const mlxd_sig* sig,
                void* buf, size_t n, mlxd_req** req, mlxd_status* st) {
  router* t = (router*)tt;
  assert(peer >= 0 && peer < tt->size && peer != tt->rank && req);
  int k = t->kind_of[peer];
  mlxd_transport* part = t->part[k];
  int p = t->idx_of[peer];
  int rc = send ? part->ops->isend(part, p, tag, sig, buf, n, req, st)
                : part->ops->irecv(part, p, tag, sig, buf, n, req, st);
  if (rc) {
    spread(t, k, st);
    return rc;
  }
  assert(((uintptr_t)*req & TAG_MASK) == 0);
  if (send) atomic_fetch_add_explicit(&t->sent[k], (uint64_t)n, memory_order_relaxed);
  *req = tag_req(*req, k);
  return 0;
}

static int router_isend(mlxd_transport* tt, int peer, uint64_t tag, const mlxd_sig* sig,
                        const void* buf, size_t n, mlxd_req** req, mlxd_status* st) {
  return post(tt, true, peer, tag, sig, (void*)(uintptr_t)buf, n, req, st);
}

static int router_irecv(mlxd_transport* tt, int peer, uint64_t tag, const mlxd_sig* sig, void* buf,
                        size_t n, mlxd_req** req, mlxd_status* st) {
  return post(tt, false, peer, tag, sig, buf, n, req, st);
}

/* Alternate slices of the parts with requests (seg[k], cnt[k]) until none
 * has a pending request or one failed. Returns 0 or the first failure (st
 * set). */
static int wait_many(router* t, mlxd_req** seg[], const int cnt[], mlxd_status* st) {
  int s = -1; /* the part that sleeps when idle */
  for (int i = 0; i < MLXD_ROUTE_KINDS && s < 0; i++)
    if (cnt[k_sleep_order[i]] > 0) s = k_sleep_order[i];
  mlxd_wait_state ws[MLXD_ROUTE_KINDS] = {{0}};
  int pending = 0;
  for (int k = 0; k < MLXD_ROUTE_KINDS; k++) {
    ws[k].done = cnt[k] == 0;
    pending += cnt[k] > 0;
  }
  bool idle = false;
  double slice = ROUTER_IDLE_SLICE_S; /* grows while idle, up to t->max_idle_s */
  for (;;) {
    for (int k = 0; k < MLXD_ROUTE_KINDS; k++) {
      if (k == s || ws[k].done) continue;
      mlxd_transport* q = t->part[k];
      int rc = q->ops->wait_slice(q, seg[k], cnt[k], pending == 1 ? INFINITY : 0, &ws[k], st);
      if (rc) {
        spread(t, k, st);
        return rc;
      }
      pending -= ws[k].done;
    }
    if (!ws[s].done) {
      double sl = pending == 1 ? INFINITY : idle ? slice : 0;
      mlxd_transport* q = t->part[s];
      int rc = q->ops->wait_slice(q, seg[s], cnt[s], sl, &ws[s], st);
      if (rc) {
        spread(t, s, st);
        return rc;
      }
      pending -= ws[s].done;
    }
    if (pending == 0) return 0;
    double last = 0;
    for (int k = 0; k < MLXD_ROUTE_KINDS; k++)
      if (cnt[k] > 0 && ws[k].last_event > last) last = ws[k].last_event;
    idle = mlxd_now() - last >= t->spin_s;
    if (!idle)
      slice = ROUTER_IDLE_SLICE_S;
    else if (slice < t->max_idle_s)
      slice = slice * 2 < t->max_idle_s ? slice * 2 : t->max_idle_s;
    if (!idle && t->yield) sched_yield(); /* the rank we wait for may need this CPU */
  }
}

static int router_waitall(mlxd_transport* tt, mlxd_req** reqs, int n, mlxd_status* st) {
  router* t = (router*)tt;
  /* Partition in place by part (kind order), then untag. */
  mlxd_req** seg[MLXD_ROUTE_KINDS];
  int cnt[MLXD_ROUTE_KINDS] = {0}, at = 0, parts = 0;
  for (int k = 0; k < MLXD_ROUTE_KINDS; k++) {
    seg[k] = reqs + at;
    for (int i = at; i < n; i++)
      if (reqs[i] && req_part(reqs[i]) == k) {
        mlxd_req* r = reqs[i];
        reqs[i] = reqs[at];
        reqs[at++] = r;
        cnt[k]++;
      }
    parts += cnt[k] > 0;
  }
  for (int i = 0; i < at; i++) reqs[i] = untag(reqs[i]);
  mlxd_status first = {0}, s = {0};
  int rc = 0;
  if (parts > 1) rc = wait_many(t, seg, cnt, &first);
  /* Each part ends its wait (returns at once when the loop above ran to the
   * end, frees the requests); a part without requests is checked (its
   * waitall on no request reports the transport's state). */
  for (int k = 0; k < MLXD_ROUTE_KINDS; k++) {
    if (!t->part[k]) continue;
    mlxd_status_clear(&s);
    int r = t->part[k]->ops->waitall(t->part[k], cnt[k] ? seg[k] : NULL, cnt[k], &s);
    if (!r) continue;
    spread(t, k, &s);
    if (!rc || (rc == MLXD_EINVAL && r != MLXD_EINVAL)) {
      rc = r;
      first = s;
    }
  }
  if (rc && st) *st = first;
  return rc;
}

static int router_wait_slice(mlxd_transport* tt, mlxd_req** reqs, int n, double max_s,
                             mlxd_wait_state* ws, mlxd_status* st) {
  /* A router is never a part of another one; a caller that slices it gets
   * whole waits of its parts' worth, one slice each. */
  (void)max_s;
  int rc = router_waitall(tt, reqs, n, st);
  ws->started = ws->done = true;
  return rc;
}

static void router_abort(mlxd_transport* tt, const mlxd_status* st) {
  router* t = (router*)tt;
  for (int k = 0; k < MLXD_ROUTE_KINDS; k++)
    if (t->part[k]) t->part[k]->ops->abort(t->part[k], st);
}

static void router_destroy(mlxd_transport* tt) {
  router* t = (router*)tt;
  if (!t) return;
  if (t->stats_tag) {
    uint64_t b[MLXD_ROUTE_KINDS];
    for (int k = 0; k < MLXD_ROUTE_KINDS; k++) b[k] = atomic_load(&t->sent[k]);
    fprintf(stderr, "[%s] rank %d: bytes sent: shm %llu, verbs %llu, tcp %llu\n", t->stats_tag,
            tt->rank, (unsigned long long)b[MLXD_ROUTE_SHM],
            (unsigned long long)b[MLXD_ROUTE_VERBS], (unsigned long long)b[MLXD_ROUTE_TCP]);
  }
  /* the order mixed.c had: the fast part first, TCP (whose close may block) last */
  for (int k = 0; k < MLXD_ROUTE_KINDS; k++)
    if (t->part[k]) t->part[k]->ops->destroy(t->part[k]);
  free(t->kind_of);
  free(t->idx_of);
  free(t);
}

static void router_forget(mlxd_transport* tt) {
  router* t = (router*)tt;
  for (int k = 0; k < MLXD_ROUTE_KINDS; k++)
    if (t->part[k] && t->part[k]->ops->forget) t->part[k]->ops->forget(t->part[k]);
}

static const mlxd_transport_ops router_ops = {
    .name = "mixed",
    .isend = router_isend,
    .irecv = router_irecv,
    .waitall = router_waitall,
    .wait_slice = router_wait_slice,
    .abort = router_abort,
    .destroy = router_destroy,
    .forget = router_forget,
};

mlxd_transport* mlxd_router_new(const mlxd_route_facts* f, mlxd_transport* parts[MLXD_ROUTE_KINDS],
                                const mlxd_router_opts* o, mlxd_status* st) {
  const int rank = f->rank, size = f->size;
  assert(size >= 2 && rank >= 0 && rank < size);
  router* t = calloc(1, sizeof *t);
  unsigned char* kind_of = calloc((size_t)size, 1);
  int* idx_of = calloc((size_t)size, sizeof *idx_of);
  if (!t || !kind_of || !idx_of) {
    free(t);
    free(kind_of);
    free(idx_of);
    mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory creating the transport");
    return NULL;
  }
  int used[MLXD_ROUTE_KINDS] = {0}, nshm = 0;
  for (int p = 0; p < size; p++) {
    mlxd_route_kind k = p == rank ? MLXD_ROUTE_SHM : mlxd_route_pick(f, rank, p);
    if (p != rank && (k == MLXD_ROUTE_KINDS || !parts[k])) {
      free(t);
      free(kind_of);
      free(idx_of);
      mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                   "no transport reaches rank %d from rank %d (its route: %s, not built)", p, rank,
                   mlxd_route_kind_name(k));
      mlxd_status_set_peer(st, p, NULL);
      return NULL;
    }
    kind_of[p] = (unsigned char)k;
    idx_of[p] = k == MLXD_ROUTE_SHM ? nshm++ : p; /* the shm session counts this rank too */
    if (p != rank) used[k]++;
  }
  int nused = 0, only = -1;
  for (int k = 0; k < MLXD_ROUTE_KINDS; k++)
    if (used[k]) {
      nused++;
      only = k;
    }
  unsigned group = mlxd_route_group_kinds(f);
  bool bare = nused == 1 && (o->bare_alone || (group & (group - 1)) == 0);
  /* Parts no peer takes are closed (the ring's TCP when every rank is on one host). */
  for (int k = 0; k < MLXD_ROUTE_KINDS; k++)
    if (parts[k] && !used[k]) {
      parts[k]->ops->destroy(parts[k]);
      parts[k] = NULL;
    }
  if (bare) {
    mlxd_transport* one = parts[only];
    parts[only] = NULL;
    free(t);
    free(kind_of);
    free(idx_of);
    return one;
  }
  t->base.ops = &router_ops;
  t->base.rank = rank;
  t->base.size = size;
  t->base.pipeline_chunk = o->pipeline_chunk;
  for (int k = 0; k < MLXD_ROUTE_KINDS; k++) {
    t->part[k] = parts[k];
    parts[k] = NULL;
  }
  t->kind_of = kind_of;
  t->idx_of = idx_of;
  t->max_idle_s = o->max_idle_s > ROUTER_IDLE_SLICE_S ? o->max_idle_s : ROUTER_IDLE_SLICE_S;
  mlxd_spin_rule spin = mlxd_spin_rule_for(o->machine_ranks > 0 ? o->machine_ranks : size);
  t->spin_s = spin.spin_s;
  t->yield = spin.yield;
  t->stats_tag = o->stats_tag;
  for (int k = 0; k < MLXD_ROUTE_KINDS; k++) atomic_init(&t->sent[k], 0);
  return &t->base;
}
