/* A transport over a subset of another one's ranks (view.h). */
#include "transport/view.h"

#include <assert.h>

static const mlxd_transport_ops view_ops;

static mlxd_view* as_view(mlxd_transport* t) {
  assert(t->ops == &view_ops);
  return (mlxd_view*)t;
}

/* The parent's tag of a message the view's caller tags tag. */
static uint64_t view_tag(const mlxd_view* v, uint64_t tag) {
  return mlxd_tag_with_segment(mlxd_tag_with_phase(tag, v->phase), v->segment);
}

static int view_isend(mlxd_transport* t, int peer, uint64_t tag, const mlxd_sig* sig,
                      const void* buf, size_t n, mlxd_req** req, mlxd_status* st) {
  mlxd_view* v = as_view(t);
  assert(peer >= 0 && peer < t->size && peer != t->rank);
  return v->parent->ops->isend(v->parent, v->ranks[peer], view_tag(v, tag), sig, buf, n, req, st);
}

static int view_irecv(mlxd_transport* t, int peer, uint64_t tag, const mlxd_sig* sig, void* buf,
                      size_t n, mlxd_req** req, mlxd_status* st) {
  mlxd_view* v = as_view(t);
  assert(peer >= 0 && peer < t->size && peer != t->rank);
  return v->parent->ops->irecv(v->parent, v->ranks[peer], view_tag(v, tag), sig, buf, n, req, st);
}

static int view_waitall(mlxd_transport* t, mlxd_req** reqs, int n, mlxd_status* st) {
  mlxd_view* v = as_view(t);
  return v->parent->ops->waitall(v->parent, reqs, n, st);
}

static int view_wait_slice(mlxd_transport* t, mlxd_req** reqs, int n, double max_s,
                           mlxd_wait_state* ws, mlxd_status* st) {
  mlxd_view* v = as_view(t);
  return v->parent->ops->wait_slice(v->parent, reqs, n, max_s, ws, st);
}

static void view_abort(mlxd_transport* t, const mlxd_status* st) {
  mlxd_view* v = as_view(t);
  v->parent->ops->abort(v->parent, st);
}

static void view_destroy(mlxd_transport* t) { (void)t; /* the view owns nothing */ }

static const mlxd_transport_ops view_ops = {
    .name = "view",
    .isend = view_isend,
    .irecv = view_irecv,
    .waitall = view_waitall,
    .wait_slice = view_wait_slice,
    .abort = view_abort,
    .destroy = view_destroy,
};

void mlxd_view_init(mlxd_view* v, mlxd_transport* parent, const int* ranks, int k, int me,
                    unsigned phase) {
  assert(parent && ranks && k >= 1 && k <= parent->size && me >= 0 && me < k);
  assert(ranks[me] == parent->rank);
  assert(phase >= 1 && phase < MLXD_TAG_PHASES);
  (void)me;
  v->base.ops = &view_ops;
  v->base.rank = me;
  v->base.size = k;
  v->base.ring_chunk = parent->ring_chunk;
  v->parent = parent;
  v->ranks = ranks;
  v->phase = phase;
  v->segment = 0;
}

void mlxd_view_set_segment(mlxd_view* v, unsigned segment) {
  assert(v->base.ops == &view_ops && segment < MLXD_TAG_SEGMENTS);
  v->segment = segment;
}
