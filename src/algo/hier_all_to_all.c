/* The two-level all_to_all (hier.h). Every part crosses between hosts at
 * most once in both forms; what differs is how many messages carry them
 * and how many copies they take.
 *
 * Flat (large parts): mlxd_algo_all_to_all on the group's transport, each
 * part straight from its sender's input into its reader's output; a host of
 * c ranks pushes c x (n - c) messages through its uplink each way.
 *
 * Gathered per host (small parts, mlxd_hier_a2a_gathered), with the host's
 * first rank as its leader (views, tag phases):
 *   1  each other rank of the host sends its whole input (n parts, one
 *      message) to the leader;
 *   2  the leaders exchange one message per pair of hosts: leader g sends
 *      leader h every part that a rank of g holds for a rank of h, packed
 *      as [local index on g][local index on h] (c_g x c_h parts);
 *   3  the leader assembles each of its host's ranks' output (n parts, in
 *      group rank order: from its host's inputs and the other leaders'
 *      messages) and sends it whole, one message per rank; its own output
 *      it writes in place.
 * A host's uplink then carries hosts - 1 messages each way. A host of one
 * rank has no phases 1 and 3. The result is exact: parts are only copied. */
#include <stdlib.h>
#include <string.h>

#include "algo/algo_impl.h"
#include "algo/hier.h"
#include "core/buffer.h"
#include "transport/view.h"

enum { PH_A2A_GATHER = 1, PH_A2A_LEADERS = 2, PH_A2A_SPREAD = 3 };

/* A phase failed on this rank: fail the group's transport with it, so no
 * rank of another phase waits for this one (as hier.c). */
static int a2a_failed(mlxd_transport* t, mlxd_status* st) {
  if (st->code) t->ops->abort(t, st);
  return st->code;
}

/* A rank other than its host's leader: its input to the leader (phase 1),
 * its output from it (phase 3, received in place, posted first). */
static int member(mlxd_transport* t, const mlxd_hier* h, uint64_t seq, const mlxd_sig* sig,
                  const void* in, void* out, size_t whole, mlxd_status* st) {
  const int* mine = h->by_host + h->host_start[h->host];
  mlxd_view gv, sv;
  mlxd_view_init(&gv, t, mine, h->nlocal, h->local_rank, PH_A2A_GATHER);
  mlxd_view_init(&sv, t, mine, h->nlocal, h->local_rank, PH_A2A_SPREAD);
  uint64_t tag = mlxd_tag(MLXD_TAG_COLL, seq, 0);
  mlxd_req* reqs[2] = {NULL, NULL};
  int rc = sv.base.ops->irecv(&sv.base, 0, tag, sig, out, whole, &reqs[0], st);
  if (!rc) rc = gv.base.ops->isend(&gv.base, 0, tag, sig, in, whole, &reqs[1], st);
  if (rc) a2a_failed(t, st); /* what was posted completes at once, failed */
  mlxd_algo_drain(t, reqs, 2, st);
  return a2a_failed(t, st);
}

/* The leader's buffers, one allocation: the inputs of its host's other
 * ranks (c - 1 of n parts), the packed parts for every other host and those
 * from every other host (c x (n - c) parts each way), the outputs of its
 * host's other ranks (c - 1 of n parts). */
typedef struct leader_bufs {
  char* inputs; /* [local i - 1][n parts] */
  char* to;     /* host h's message at to + off[h] */
  char* from;   /* host h's message at from + off[h] */
  char* outs;   /* [local j - 1][n parts] */
  size_t* off;  /* [nhosts] offsets of the hosts' messages, in parts (0 for this host) */
  size_t bytes;
  char* base;
} leader_bufs;

/* Input of this host's rank of local index i (0: the leader's own). */
static const char* input_of(const leader_bufs* b, const void* in, int i, size_t whole) {
  return i == 0 ? in : b->inputs + (size_t)(i - 1) * whole;
}

static int leader(mlxd_transport* t, const mlxd_hier* h, uint64_t seq, const mlxd_sig* sig,
                  const void* in, void* out, size_t P, mlxd_status* st) {
  int n = h->size, H = h->nhosts, g = h->host, c = h->nlocal;
  size_t whole = mlxd_algo_mul(P, (size_t)n), remote = (size_t)c * (size_t)(n - c);
  leader_bufs b = {0};
  b.off = calloc((size_t)H, sizeof *b.off);
  int nreq = 2 * (c - 1) + 2 * (H - 1);
  mlxd_req** reqs = calloc((size_t)nreq, sizeof *reqs);
  b.bytes = mlxd_algo_mul(whole, 2 * (size_t)(c - 1)) + mlxd_algo_mul(P, 2 * remote);
  b.base = b.bytes ? mlxd_buffer_alloc(b.bytes) : NULL;
  if (!b.off || !reqs || (b.bytes && !b.base)) {
    free(b.off);
    free(reqs);
    mlxd_buffer_free(b.base, b.bytes);
    mlxd_algo_fail(st, MLXD_ENOMEM, "out of memory for %zu bytes", b.bytes);
    return a2a_failed(t, st);
  }
  b.inputs = b.base;
  b.to = b.inputs + (size_t)(c - 1) * whole;
  b.from = b.to + remote * P;
  b.outs = b.from + remote * P;
  for (int x = 0, at = 0; x < H; x++) {
    b.off[x] = (size_t)at;
    if (x != g) at += c * h->host_count[x];
  }
  const int* mine = h->by_host + h->host_start[g];
  mlxd_view hv, lv;
  mlxd_view_init(&lv, t, h->leaders, H, g, PH_A2A_LEADERS);
  uint64_t tag = mlxd_tag(MLXD_TAG_COLL, seq, 0);
  mlxd_req** in_r = reqs;             /* [c - 1] phase 1 */
  mlxd_req** from_r = in_r + (c - 1); /* [H - 1] phase 2 in */
  mlxd_req** to_r = from_r + (H - 1); /* [H - 1] phase 2 out */
  mlxd_req** out_r = to_r + (H - 1);  /* [c - 1] phase 3 */
  int rc = 0;
  /* every receive first: the members' inputs, then the other leaders' parts */
  mlxd_view_init(&hv, t, mine, c, 0, PH_A2A_GATHER);
  for (int i = 1; i < c && !rc; i++)
    rc = hv.base.ops->irecv(&hv.base, i, tag, sig, b.inputs + (size_t)(i - 1) * whole, whole,
                            &in_r[i - 1], st);
  for (int k = 1; k < H && !rc; k++) {
    int x = (g - k + H) % H; /* in the order the other leaders send to this one */
    rc = lv.base.ops->irecv(&lv.base, x, tag, sig, b.from + b.off[x] * P,
                            (size_t)h->host_count[x] * (size_t)c * P, &from_r[k - 1], st);
  }
  if (!rc) rc = mlxd_algo_drain(t, in_r, c - 1, st);
  /* phase 2: to host x, part [i][j] = part (x's rank j) of input i */
  for (int k = 1; k < H && !rc; k++) {
    int x = (g + k) % H, cx = h->host_count[x];
    const int* theirs = h->by_host + h->host_start[x];
    char* dst = b.to + b.off[x] * P;
    for (int i = 0; i < c; i++) {
      const char* src = input_of(&b, in, i, whole);
      for (int j = 0; j < cx; j++, dst += P) memcpy(dst, src + (size_t)theirs[j] * P, P);
    }
    rc = lv.base.ops->isend(&lv.base, x, tag, sig, b.to + b.off[x] * P, (size_t)cx * (size_t)c * P,
                            &to_r[k - 1], st);
  }
  /* this host's parts of every output meanwhile: output j, part (rank i) = part j of input i */
  if (!rc)
    for (int j = 0; j < c; j++) {
      char* o = j == 0 ? out : b.outs + (size_t)(j - 1) * whole;
      for (int i = 0; i < c; i++)
        memcpy(o + (size_t)mine[i] * P, input_of(&b, in, i, whole) + (size_t)mine[j] * P, P);
    }
  if (!rc) rc = mlxd_algo_drain(t, from_r, H - 1, st);
  /* the other hosts' parts: output j, part (host x's rank i) = [i][j] of x's message */
  if (!rc)
    for (int x = 0; x < H; x++) {
      if (x == g) continue;
      const int* theirs = h->by_host + h->host_start[x];
      const char* m = b.from + b.off[x] * P;
      for (int i = 0; i < h->host_count[x]; i++)
        for (int j = 0; j < c; j++) {
          char* o = j == 0 ? out : b.outs + (size_t)(j - 1) * whole;
          memcpy(o + (size_t)theirs[i] * P, m + ((size_t)i * (size_t)c + (size_t)j) * P, P);
        }
    }
  mlxd_view_init(&hv, t, mine, c, 0, PH_A2A_SPREAD);
  for (int j = 1; j < c && !rc; j++)
    rc = hv.base.ops->isend(&hv.base, j, tag, sig, b.outs + (size_t)(j - 1) * whole, whole,
                            &out_r[j - 1], st);
  if (rc) a2a_failed(t, st); /* no posted receive waits for a message that will not come */
  mlxd_algo_drain(t, reqs, nreq, st);
  free(reqs);
  free(b.off);
  mlxd_buffer_free(b.base, b.bytes);
  return a2a_failed(t, st);
}

int mlxd_algo_hier_all_to_all_gathered(mlxd_transport* t, const mlxd_hier* h, uint64_t seq,
                                       const mlxd_sig* sig, const void* in, void* out,
                                       size_t part_bytes, mlxd_status* st) {
  mlxd_status_clear(st);
  assert(mlxd_hier_applies(h) && t->rank == h->rank && t->size == h->size);
  assert(part_bytes == 0 || (in && out && in != out));
  size_t whole = mlxd_algo_mul(part_bytes, (size_t)h->size);
  if (part_bytes == 0) return mlxd_algo_empty(t, seq, sig, st);
  return h->local_rank == 0 ? leader(t, h, seq, sig, in, out, part_bytes, st)
                            : member(t, h, seq, sig, in, out, whole, st);
}

int mlxd_algo_hier_all_to_all(mlxd_transport* t, const mlxd_hier* h, uint64_t seq,
                              const mlxd_sig* sig, const void* in, void* out, size_t part_bytes,
                              mlxd_status* st) {
  if (mlxd_hier_a2a_gathered(h, part_bytes))
    return mlxd_algo_hier_all_to_all_gathered(t, h, seq, sig, in, out, part_bytes, st);
  return mlxd_algo_all_to_all(t, seq, sig, in, out, part_bytes, st);
}
