/* A transport over a subset of another one's ranks (view.h). */
#include "transport/view.h"

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

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
  v->base.pipeline_chunk = parent->pipeline_chunk;
  v->base.whole_min = parent->whole_min;
  v->parent = parent;
  v->ranks = ranks;
  v->phase = phase;
  v->segment = 0;
}

void mlxd_view_set_segment(mlxd_view* v, unsigned segment) {
  assert(v->base.ops == &view_ops && segment < MLXD_TAG_SEGMENTS);
  v->segment = segment;
}

/* ---- split children (view.h) ---- */

struct mlxd_tshare {
  mlxd_transport* t;
  atomic_int refs;
  pthread_mutex_t split_mu; /* one split over this root at a time on this rank */
  unsigned next_id;         /* the lowest id this rank has not taken (under split_mu) */
};

mlxd_tshare* mlxd_tshare_new(mlxd_transport* t, mlxd_status* st) {
  mlxd_tshare* s = calloc(1, sizeof *s);
  if (!s) {
    mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BACKEND, "out of memory sharing the transport");
    return NULL;
  }
  s->t = t;
  atomic_init(&s->refs, 1);
  pthread_mutex_init(&s->split_mu, NULL);
  s->next_id = 1;
  return s;
}

static void tshare_retain(mlxd_tshare* s) { atomic_fetch_add(&s->refs, 1); }

void mlxd_tshare_release(mlxd_tshare* s) {
  if (!s || atomic_fetch_sub(&s->refs, 1) != 1) return;
  s->t->ops->destroy(s->t);
  pthread_mutex_destroy(&s->split_mu);
  free(s);
}

mlxd_transport* mlxd_tshare_transport(const mlxd_tshare* s) { return s->t; }

unsigned mlxd_tshare_split_begin(mlxd_tshare* s) {
  pthread_mutex_lock(&s->split_mu);
  return s->next_id;
}

void mlxd_tshare_split_end(mlxd_tshare* s, unsigned id) {
  if (id >= s->next_id) s->next_id = id + 1;
  pthread_mutex_unlock(&s->split_mu);
}

typedef struct child_view {
  mlxd_transport base; /* rank: this rank's index in ranks; size: k */
  mlxd_tshare* share;
  mlxd_transport* root; /* share->t */
  unsigned id;
  int ranks[]; /* ranks[i]: the root's rank of the child's rank i */
} child_view;

static bool is_child_ops(const mlxd_transport_ops* ops);

static child_view* as_child(mlxd_transport* t) {
  assert(is_child_ops(t->ops));
  return (child_view*)t;
}

static int child_isend(mlxd_transport* t, int peer, uint64_t tag, const mlxd_sig* sig,
                       const void* buf, size_t n, mlxd_req** req, mlxd_status* st) {
  child_view* v = as_child(t);
  assert(peer >= 0 && peer < t->size && peer != t->rank && mlxd_tag_group(tag) == 0);
  return v->root->ops->isend(v->root, v->ranks[peer], mlxd_tag_with_group(tag, v->id), sig, buf, n,
                             req, st);
}

static int child_irecv(mlxd_transport* t, int peer, uint64_t tag, const mlxd_sig* sig, void* buf,
                       size_t n, mlxd_req** req, mlxd_status* st) {
  child_view* v = as_child(t);
  assert(peer >= 0 && peer < t->size && peer != t->rank && mlxd_tag_group(tag) == 0);
  return v->root->ops->irecv(v->root, v->ranks[peer], mlxd_tag_with_group(tag, v->id), sig, buf, n,
                             req, st);
}

static int child_waitall(mlxd_transport* t, mlxd_req** reqs, int n, mlxd_status* st) {
  child_view* v = as_child(t);
  return v->root->ops->waitall(v->root, reqs, n, st);
}

static int child_wait_slice(mlxd_transport* t, mlxd_req** reqs, int n, double max_s,
                            mlxd_wait_state* ws, mlxd_status* st) {
  child_view* v = as_child(t);
  return v->root->ops->wait_slice(v->root, reqs, n, max_s, ws, st);
}

static void child_abort(mlxd_transport* t, const mlxd_status* st) {
  child_view* v = as_child(t);
  v->root->ops->abort(v->root, st);
}

static void child_destroy(mlxd_transport* t) {
  if (!t) return;
  child_view* v = as_child(t);
  mlxd_tshare_release(v->share);
  free(v);
}

/* The root's descriptors: forget is idempotent on every transport that has it. */
static void child_forget(mlxd_transport* t) {
  child_view* v = as_child(t);
  if (v->root->ops->forget) v->root->ops->forget(v->root);
}

/* The child takes its root's name ("tcp", "shm", "mixed"): the algorithms
 * choose their forms by the kind of wire under them (algo/common.c). */
#define CHILD_OPS(var, nm)                \
  static const mlxd_transport_ops var = { \
      .name = nm,                         \
      .isend = child_isend,               \
      .irecv = child_irecv,               \
      .waitall = child_waitall,           \
      .wait_slice = child_wait_slice,     \
      .abort = child_abort,               \
      .destroy = child_destroy,           \
      .forget = child_forget,             \
  }
CHILD_OPS(child_ops_tcp, "tcp");
CHILD_OPS(child_ops_shm, "shm");
CHILD_OPS(child_ops_mixed, "mixed");
CHILD_OPS(child_ops_other, "view");

static bool is_child_ops(const mlxd_transport_ops* ops) {
  return ops == &child_ops_tcp || ops == &child_ops_shm || ops == &child_ops_mixed ||
         ops == &child_ops_other;
}

mlxd_transport* mlxd_view_child_new(mlxd_tshare* s, const int* root_ranks, int k, int me,
                                    unsigned id, mlxd_status* st) {
  mlxd_transport* root = s->t;
  assert(root_ranks && k >= 2 && k <= root->size && me >= 0 && me < k);
  assert(root_ranks[me] == root->rank && id >= 1 && id < MLXD_TAG_GROUPS);
  child_view* v = malloc(sizeof *v + sizeof(int) * (size_t)k);
  if (!v) {
    mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BACKEND, "out of memory creating the group's view");
    return NULL;
  }
  const char* nm = root->ops->name;
  v->base.ops = strcmp(nm, "tcp") == 0     ? &child_ops_tcp
                : strcmp(nm, "shm") == 0   ? &child_ops_shm
                : strcmp(nm, "mixed") == 0 ? &child_ops_mixed
                                           : &child_ops_other;
  v->base.rank = me;
  v->base.size = k;
  v->base.pipeline_chunk = root->pipeline_chunk;
  v->base.whole_min = root->whole_min;
  v->share = s;
  v->root = root;
  v->id = id;
  memcpy(v->ranks, root_ranks, sizeof(int) * (size_t)k);
  tshare_retain(s);
  return &v->base;
}

bool mlxd_view_is_child(const mlxd_transport* t) { return t && is_child_ops(t->ops); }

int mlxd_view_child_root_rank(const mlxd_transport* t, int i) {
  assert(is_child_ops(t->ops) && i >= 0 && i < t->size);
  return ((const child_view*)t)->ranks[i];
}

mlxd_tshare* mlxd_view_child_share(const mlxd_transport* t) {
  assert(is_child_ops(t->ops));
  return ((const child_view*)t)->share;
}
