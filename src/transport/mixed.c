/* The mixed transport: one mlxd_transport over two others of one group,
 * routing each peer to one of them. The ring reaches the ranks on this
 * rank's host over a shared-memory session of those ranks only and every
 * other rank over TCP; jaccl in a ring topology reaches its neighbours over
 * verbs and the other ranks over TCP. The algorithms see one transport
 * (transport.h) and never know which part carries a message.
 *
 * Routing. local[p] is peer p's index in `part` (the shm session's ranks are
 * this host's group ranks in increasing order, and the session names them by
 * their group ranks: mlxd_shm_transport_new_named; jaccl's verbs transport
 * spans the group, so local[p] == p), or -1 for a peer reached over `rest`
 * (TCP, group ranks). A request of `part` is returned with its lowest
 * pointer bit set (requests are malloc'd, so that bit is free), which lets
 * waitall route it back without allocating anything per request.
 *
 * Waiting on both parts. A wait whose requests all live in one part is
 * that part's own waitall. A wait with requests in both (a ring step that
 * sends over one and receives over the other) alternates slices of the two
 * parts (wait_slice): a non-blocking pass over the part that does not
 * sleep, then the sleeping one, without blocking while either part saw an
 * event within MLXDIST_SPIN_US, after that sleeping in the sleeping part for
 * at most MIXED_IDLE_SLICE_S (100 us; a composite made with a larger
 * max_idle_s doubles the slice after each idle one, up to it, and starts
 * again at 100 us after any event): its own peers wake it at once (shm:
 * this rank's doorbell; tcp: poll on its sockets), and what arrives over the
 * other part waits at most that long. The ring sleeps on shm, jaccl on tcp
 * (its verbs part has no cheaper wake-up than a poll of the completion
 * queue). There is no sched_yield in
 * the slices; the loop yields between spinning passes when the group has
 * more ranks than the machine has CPUs (as tcp.c does), so the rank it
 * waits for gets the CPU. Once one part is done the other waits
 * alone, as in its own waitall (its liveness clocks run from the wait's
 * start). Each part's wait then ends with its own waitall on its requests,
 * which reports a size mismatch and frees them. Heartbeats need nothing
 * here: each part sends its own from the watchdog thread.
 *
 * Failure. The first failure of either part (a wait, a post, or found at
 * the end of a wait) fails the other part with the same status through
 * its abort (so its peers hear of it too), and the composite reports it;
 * abort() fails both. A size mismatch fails only its receive. */
#include "transport/mixed.h"

#include <assert.h>
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "transport/spin.h"
#include "util/clock.h"
#include "util/tunables.h"

#define MIXED_IDLE_SLICE_S 100e-6 /* the longest sleep in one part with the other pending */

typedef struct mixed_transport {
  mlxd_transport base;
  mlxd_transport* rest; /* every peer that part does not carry (tcp) */
  mlxd_transport* part; /* local[p] >= 0 (shm, verbs) */
  int* local;           /* local[p]: p's index in part, -1: over rest */
  bool sleep_on_part;   /* a wait on both sleeps in part (else in rest) */
  double max_idle_s;    /* the longest sleep slice, reached by doubling while idle */
  double spin_s;
  bool yield; /* more ranks than CPUs: give the CPU away between spinning passes */
} mixed_transport;

static const mlxd_transport_ops mixed_ops;

static mlxd_req* tag_part(mlxd_req* r) { return (mlxd_req*)((uintptr_t)r | 1u); }
static bool is_part(const mlxd_req* r) { return ((uintptr_t)r & 1u) != 0; }
static mlxd_req* untag(mlxd_req* r) { return (mlxd_req*)((uintptr_t)r & ~(uintptr_t)1u); }

/* One part failed with st: fail the other one with it (abort is a no-op
 * on a transport that failed already). A size mismatch is not a failure
 * of the transport. */
static void spread(mixed_transport* t, const mlxd_transport* from, const mlxd_status* st) {
  if (!st->code || st->code == MLXD_EINVAL || st->code == MLXD_ENOMEM) return;
  mlxd_transport* other = from == t->rest ? t->part : t->rest;
  other->ops->abort(other, st);
}

static int post(mlxd_transport* tt, bool send, int peer, uint64_t tag, const mlxd_sig* sig,
                void* buf, size_t n, mlxd_req** req, mlxd_status* st) {
  mixed_transport* t = (mixed_transport*)tt;
  assert(peer >= 0 && peer < tt->size && peer != tt->rank && req);
  int li = t->local[peer];
  mlxd_transport* part = li >= 0 ? t->part : t->rest;
  int p = li >= 0 ? li : peer;
  int rc = send ? part->ops->isend(part, p, tag, sig, buf, n, req, st)
                : part->ops->irecv(part, p, tag, sig, buf, n, req, st);
  if (rc) {
    spread(t, part, st);
    return rc;
  }
  assert(((uintptr_t)*req & 1u) == 0);
  if (li >= 0) *req = tag_part(*req);
  return 0;
}

static int mixed_isend(mlxd_transport* tt, int peer, uint64_t tag, const mlxd_sig* sig,
                       const void* buf, size_t n, mlxd_req** req, mlxd_status* st) {
  return post(tt, true, peer, tag, sig, (void*)(uintptr_t)buf, n, req, st);
}

static int mixed_irecv(mlxd_transport* tt, int peer, uint64_t tag, const mlxd_sig* sig, void* buf,
                       size_t n, mlxd_req** req, mlxd_status* st) {
  return post(tt, false, peer, tag, sig, buf, n, req, st);
}

/* Alternate slices of both parts until neither has a pending request or
 * one failed. Returns 0 or the first failure (st set). */
static int wait_both(mixed_transport* t, mlxd_req** rr, int nr, mlxd_req** pr, int np,
                     mlxd_status* st) {
  /* s: the part that sleeps when idle, q: the one polled without blocking */
  mlxd_transport* s = t->sleep_on_part ? t->part : t->rest;
  mlxd_transport* q = t->sleep_on_part ? t->rest : t->part;
  mlxd_req** sr = t->sleep_on_part ? pr : rr;
  mlxd_req** qr = t->sleep_on_part ? rr : pr;
  int ns = t->sleep_on_part ? np : nr, nq = t->sleep_on_part ? nr : np;
  mlxd_wait_state wq = {0}, ws = {0};
  bool idle = false;
  double slice = MIXED_IDLE_SLICE_S; /* grows while idle, up to t->max_idle_s */
  for (;;) {
    if (!wq.done) {
      int rc = q->ops->wait_slice(q, qr, nq, ws.done ? INFINITY : 0, &wq, st);
      if (rc) {
        spread(t, q, st);
        return rc;
      }
    }
    if (!ws.done) {
      double sl = wq.done ? INFINITY : idle ? slice : 0;
      int rc = s->ops->wait_slice(s, sr, ns, sl, &ws, st);
      if (rc) {
        spread(t, s, st);
        return rc;
      }
    }
    if (wq.done && ws.done) return 0;
    double last = wq.last_event > ws.last_event ? wq.last_event : ws.last_event;
    idle = mlxd_now() - last >= t->spin_s;
    if (!idle)
      slice = MIXED_IDLE_SLICE_S;
    else if (slice < t->max_idle_s)
      slice = slice * 2 < t->max_idle_s ? slice * 2 : t->max_idle_s;
    if (!idle && t->yield) sched_yield(); /* the rank we wait for may need this CPU */
  }
}

/* The failure of `part` found at the end of a wait, if any (its waitall
 * on no request reports the transport's state). */
static int check_part(mlxd_transport* part, mlxd_status* st) {
  return part->ops->waitall(part, NULL, 0, st);
}

static int mixed_waitall(mlxd_transport* tt, mlxd_req** reqs, int n, mlxd_status* st) {
  mixed_transport* t = (mixed_transport*)tt;
  /* Partition in place: rest's requests first, then part's untagged. */
  int nr = 0;
  for (int i = 0; i < n; i++)
    if (reqs[i] && !is_part(reqs[i])) {
      mlxd_req* r = reqs[i];
      reqs[i] = reqs[nr];
      reqs[nr++] = r;
    }
  int np = 0;
  for (int i = nr; i < n; i++)
    if (reqs[i]) {
      mlxd_req* r = untag(reqs[i]);
      reqs[i] = NULL;
      reqs[nr + np++] = r;
    }
  mlxd_req** rr = reqs;
  mlxd_req** pr = reqs + nr;
  mlxd_status first = {0}, s = {0};
  int rc = 0;
  if (nr > 0 && np > 0) rc = wait_both(t, rr, nr, pr, np, &first);
  /* Each part ends its wait (returns at once when the loop above ran to
   * the end, frees the requests); the part without requests is checked. */
  int rt = nr > 0 ? t->rest->ops->waitall(t->rest, rr, nr, &s) : check_part(t->rest, &s);
  if (rt) {
    spread(t, t->rest, &s);
    if (!rc) {
      rc = rt;
      first = s;
    }
  }
  mlxd_status_clear(&s);
  int rs = np > 0 ? t->part->ops->waitall(t->part, pr, np, &s) : check_part(t->part, &s);
  if (rs) {
    spread(t, t->part, &s);
    if (!rc || (rc == MLXD_EINVAL && rs != MLXD_EINVAL)) {
      rc = rs;
      first = s;
    }
  }
  if (rc && st) *st = first;
  return rc;
}

static int mixed_wait_slice(mlxd_transport* tt, mlxd_req** reqs, int n, double max_s,
                            mlxd_wait_state* ws, mlxd_status* st) {
  /* A mixed transport is never a part of another one; a caller that
   * slices it gets whole waits of its parts' worth, one slice each. */
  (void)max_s;
  int rc = mixed_waitall(tt, reqs, n, st);
  ws->started = ws->done = true;
  return rc;
}

static void mixed_abort(mlxd_transport* tt, const mlxd_status* st) {
  mixed_transport* t = (mixed_transport*)tt;
  t->rest->ops->abort(t->rest, st);
  t->part->ops->abort(t->part, st);
}

static void mixed_destroy(mlxd_transport* tt) {
  mixed_transport* t = (mixed_transport*)tt;
  if (!t) return;
  if (t->part) t->part->ops->destroy(t->part);
  if (t->rest) t->rest->ops->destroy(t->rest);
  free(t->local);
  free(t);
}

static void mixed_forget(mlxd_transport* tt) {
  mixed_transport* t = (mixed_transport*)tt;
  if (t->part && t->part->ops->forget) t->part->ops->forget(t->part);
  if (t->rest && t->rest->ops->forget) t->rest->ops->forget(t->rest);
}

static const mlxd_transport_ops mixed_ops = {
    .name = "mixed",
    .isend = mixed_isend,
    .irecv = mixed_irecv,
    .waitall = mixed_waitall,
    .wait_slice = mixed_wait_slice,
    .abort = mixed_abort,
    .destroy = mixed_destroy,
    .forget = mixed_forget,
};

mlxd_transport* mlxd_mixed_combine(mlxd_transport* rest, mlxd_transport* part, const int* local,
                                   bool sleep_on_part, double max_idle_s, size_t ring_chunk,
                                   mlxd_status* st) {
  assert(rest && part && local && rest->size >= 2);
  mixed_transport* t = calloc(1, sizeof *t);
  int* map = calloc((size_t)rest->size, sizeof *map);
  if (!t || !map) {
    free(t);
    free(map);
    mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory creating the transport");
    return NULL;
  }
  for (int p = 0; p < rest->size; p++) map[p] = p == rest->rank ? -1 : local[p];
  t->base.ops = &mixed_ops;
  t->base.rank = rest->rank;
  t->base.size = rest->size;
  t->base.pipeline_chunk = ring_chunk;
  t->rest = rest;
  t->part = part;
  t->local = map;
  t->sleep_on_part = sleep_on_part;
  t->max_idle_s = max_idle_s > MIXED_IDLE_SLICE_S ? max_idle_s : MIXED_IDLE_SLICE_S;
  /* The group's ranks on this host: the ring's part is this host's shm (this
   * rank and its part's peers); jaccl's links cross hosts, so all of them. */
  int here = sleep_on_part ? 1 : rest->size;
  for (int p = 0; p < rest->size && sleep_on_part; p++) here += map[p] >= 0;
  mlxd_spin_rule spin = mlxd_spin_rule_for(here);
  t->spin_s = spin.spin_s;
  t->yield = spin.yield;
  return &t->base;
}

void mlxd_mixed_set_local_ranks(mlxd_transport* tt, int machine_ranks) {
  mixed_transport* t = (mixed_transport*)tt;
  mlxd_spin_rule spin = mlxd_spin_rule_for(machine_ranks);
  t->spin_s = spin.spin_s;
  t->yield = spin.yield;
}

mlxd_transport* mlxd_mixed_transport_new(mlxd_transport* tcp, mlxd_transport* shm, const int* local,
                                         mlxd_status* st) {
  return mlxd_mixed_combine(tcp, shm, local, true, MIXED_IDLE_SLICE_S, 0, st);
}
