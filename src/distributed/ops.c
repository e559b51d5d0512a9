/* The eight distributed ops: check the arguments on the caller's thread,
 * pick the group (empty: the default group) and stream (empty: the group's
 * communication stream), take a sequence number and queue a task that runs
 * the backend op and completes the pending result.
 *
 * This file owns the backend contract of backend.h: before a task is queued
 * it has checked everything a backend is promised (a valid dtype and reduce
 * op, a peer in [0, size) other than the caller, byte counts that fit in
 * size_t), so no backend re-checks them. The size-one case is not handled
 * here: a group of one always holds the size-one backend (group.c), whose
 * collectives copy the input (spec: the input unchanged); send/recv have no
 * valid peer there and fail in check_peer. */
#include <assert.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/array_impl.h"
#include "core/error.h"
#include "core/oprec.h"
#include "core/stream_impl.h"
#include "distributed/group_impl.h"
#include "mlx/c/distributed.h"

#define MAX_NDIM 1024

typedef enum { OP_REDUCE, OP_GATHER, OP_SCATTER, OP_ALL_TO_ALL, OP_SEND, OP_RECV } op_kind;

typedef struct op_task {
  mlxd_group* g;
  mlxd_stream* s; /* the stream it is queued on (alive while it runs there) */
  op_kind kind;
  mlxd_reduce_op rop;
  uint64_t seq;
  int peer;
  mlxd_array* in;   /* held by the stream task (its input); NULL for recv */
  mlxd_array* out;  /* held by the stream task (its output) */
  uint64_t rec;     /* the operation record's handle (core/oprec.h) */
  const char* name; /* the record's op name */
  bool ended;       /* the record has its end */
} op_task;

_Static_assert(sizeof(op_task) <= MLXD_TASK_ARG_MAX,
               "an op_task is copied into its stream task (mlxd_stream_submit_copy)");

static const char* dev_name(mlx_device_type t) { return t == MLX_GPU ? "gpu" : "cpu"; }

static void op_run(void* arg, mlxd_status* st) {
  op_task* t = arg;
  mlxd_backend* b = t->g->backend;
  /* Checked before queueing (check_dtype, check_peer, collective). */
  assert(t->rop == MLXD_SUM || t->rop == MLXD_MAX || t->rop == MLXD_MIN);
  assert(t->kind == OP_SEND || t->kind == OP_RECV || (size_t)mlx_dtype_size(t->in->dtype) > 0);
  assert((t->kind != OP_SEND && t->kind != OP_RECV) ||
         (t->peer >= 0 && t->peer < b->size && t->peer != b->rank));
  assert(b->size >= 2 || b->ops == mlxd_single_ops());
  mlxd_oprec_running(t->rec);
  int rc = 0;
  /* A backend with the *_ref ops (backend.h) is also told the arrays, so it
   * may keep their memory alive past its return (the task holds both now). */
  const mlxd_backend_ops* o = b->ops;
  const mlxd_op_arrays arr = {.in = t->in, .out = t->out, .stream = t->s};
  switch (t->kind) {
    case OP_REDUCE:
      rc = o->all_reduce_ref ? o->all_reduce_ref(b, t->seq, t->in->data, t->out->data, t->in->size,
                                                 t->in->dtype, t->rop, &arr, st)
                             : o->all_reduce(b, t->seq, t->in->data, t->out->data, t->in->size,
                                             t->in->dtype, t->rop, st);
      break;
    case OP_GATHER:
      rc = o->all_gather_ref ? o->all_gather_ref(b, t->seq, t->in->data, t->out->data,
                                                 t->in->nbytes, t->in->dtype, &arr, st)
                             : o->all_gather(b, t->seq, t->in->data, t->out->data, t->in->nbytes,
                                             t->in->dtype, st);
      break;
    case OP_SCATTER:
      rc = o->reduce_scatter_ref
               ? o->reduce_scatter_ref(b, t->seq, t->in->data, t->out->data, t->out->size,
                                       t->in->dtype, MLXD_SUM, &arr, st)
               : o->reduce_scatter(b, t->seq, t->in->data, t->out->data, t->out->size, t->in->dtype,
                                   MLXD_SUM, st);
      break;
    case OP_ALL_TO_ALL: /* parts of equal bytes: checked in collective() */
      rc = o->all_to_all_ref
               ? o->all_to_all_ref(b, t->seq, t->in->data, t->out->data,
                                   t->in->nbytes / (size_t)b->size, t->in->dtype, &arr, st)
               : o->all_to_all(b, t->seq, t->in->data, t->out->data,
                               t->in->nbytes / (size_t)b->size, t->in->dtype, st);
      break;
    case OP_SEND:
      rc = o->send_ref
               ? o->send_ref(b, t->seq, t->in->data, t->in->nbytes, t->in->dtype, t->peer, &arr, st)
               : o->send(b, t->seq, t->in->data, t->in->nbytes, t->in->dtype, t->peer, st);
      break;
    case OP_RECV:
      rc = o->recv_ref
               ? o->recv_ref(b, t->seq, t->out->data, t->out->nbytes, t->out->dtype, t->peer, &arr,
                             st)
               : o->recv(b, t->seq, t->out->data, t->out->nbytes, t->out->dtype, t->peer, st);
      break;
  }
  if (rc != 0 && st->code == 0)
    mlxd_fail(st, rc, "[%s] the operation failed without a message (code %d)", b->ops->name, rc);
  else if (rc == 0 && st->code != 0)
    mlxd_status_clear(st);
  mlxd_oprec_end(t->rec, st->code);
  t->ended = true;
  /* A timeout or a lost peer: show where this rank stands (once for the
   * whole cascade of ops failing with it). */
  if (st->code == MLXD_ETIMEDOUT || st->code == MLXD_EREMOTE) mlxd_oprec_dump_failure();
}

static void op_cleanup(void* arg) {
  op_task* t = arg;
  if (!t->ended) mlxd_oprec_end(t->rec, MLXD_EABORTED); /* the stream dropped it */
  atomic_fetch_add_explicit(&t->g->finished, 1, memory_order_release);
  mlxd_group_release(t->g);
}

/* *res = a (passed on), releasing what *res held. */
static void set_result(mlx_array* res, mlxd_array* a) {
  mlxd_array* old = mlxd_array_of(*res);
  res->ctx = a;
  if (old) mlxd_array_release(old);
}

/* Group and stream for an op. On success *g is the caller's group
 * (borrowed: the caller's handle keeps it alive during the call) or, for
 * the empty handle, a new reference to the default group (*own set: drop
 * it with unresolve). */
static int resolve(const char* op, mlx_distributed_group group, mlx_stream s, mlxd_group** gout,
                   mlxd_stream** sout, bool* own) {
  mlxd_group* g = mlxd_group_of(group);
  *own = !g;
  if (!g) {
    mlxd_status st;
    mlxd_status_clear(&st);
    g = mlxd_group_default(&st);
    if (!g) return mlxd_error_status(&st);
  }
  if (mlxd_group_foreign(g)) { /* a forked child's copy: fails before anything else */
    bool p2p = strcmp(op, "send") == 0 || strncmp(op, "recv", 4) == 0;
    int rc = mlxd_group_refuse(g, op, !p2p);
    if (*own) mlxd_group_release(g);
    return rc;
  }
  mlxd_stream* str = mlxd_stream_of(s);
  mlx_device_type want = g->backend->comm_device;
  if (!str) {
    str = g->comm_stream;
    if (!str) {
      mlxd_error(
          "[distributed] %s: the %s backend communicates on the %s, which is not "
          "available in this process",
          op, g->kind, dev_name(want));
      if (*own) mlxd_group_release(g);
      return MLXD_EUNAVAIL;
    }
  } else if (mlxd_stream_device_type(str) != want) {
    mlxd_error(
        "[distributed] %s: the stream is on the %s but the group's %s backend "
        "communicates on the %s (pass a %s stream, or the null stream)",
        op, dev_name(mlxd_stream_device_type(str)), g->kind, dev_name(want), dev_name(want));
    if (*own) mlxd_group_release(g);
    return MLXD_EINVAL;
  }
  *gout = g;
  *sout = str;
  return 0;
}

static void unresolve(mlxd_group* g, bool own) {
  if (own) mlxd_group_release(g);
}

static int check_res_x(const char* op, mlx_array* res, const mlx_array* x) {
  if (!res) {
    mlxd_error("[distributed] %s: res is NULL (expected a pointer to an mlx_array handle)", op);
    return MLXD_EINVAL;
  }
  if (x && !mlxd_array_of(*x)) {
    mlxd_error("[distributed] %s: x is an empty array handle (expected an array)", op);
    return MLXD_EINVAL;
  }
  return 0;
}

static int check_peer(const char* op, const char* what, int peer, const mlxd_group* g) {
  const mlxd_backend* b = g->backend;
  if (b->size < 2) {
    mlxd_error(
        "[distributed] %s: send/recv need a group of at least two processes (this group "
        "has one)",
        op);
    return MLXD_EINVAL;
  }
  if (peer < 0 || peer >= b->size) {
    mlxd_error("[distributed] %s: %s is %d, not a rank of this group (expected 0 <= %s < %d)", op,
               what, peer, what, b->size);
    return MLXD_EINVAL;
  }
  if (peer == b->rank) {
    mlxd_error("[distributed] %s: %s is %d, this process's own rank (expected another rank)", op,
               what, peer);
    return MLXD_EINVAL;
  }
  return 0;
}

/* The element type of an array that reaches a backend (arrays made by this
 * library always have a valid one; this is the contract's check). */
static int check_dtype(const char* op, const char* what, mlx_dtype dtype) {
  if (mlxd_dtype_check((int)dtype, NULL) != 0 || mlx_dtype_size(dtype) == 0) {
    mlxd_error(
        "[distributed] %s: %s dtype %d is not a valid mlx_dtype (expected MLX_BOOL .. "
        "MLX_COMPLEX64)",
        op, what, (int)dtype);
    return MLXD_EINVAL;
  }
  return 0;
}

/* Called by the stream under its lock, once the task is sure to be queued
 * and before it joins the queue (mlxd_stream_submit_copy's on_queue): take
 * the sequence number and begin the operation record. Two submits to one
 * stream come here in queue order, so every stream sees one group's work in
 * seq order without a group-wide lock; the counters are atomic because
 * submits to two streams of one group hold two different locks. The task's
 * copy of the op_task is updated: nothing reads it before it is queued. */
static void op_queued(void* arg) {
  op_task* t = arg;
  mlxd_group* g = t->g;
  _Atomic uint64_t* counter = t->kind == OP_SEND   ? &g->send_seq[t->peer]
                              : t->kind == OP_RECV ? &g->recv_seq[t->peer]
                                                   : &g->coll_seq;
  t->seq = atomic_fetch_add_explicit(counter, 1, memory_order_relaxed);
  const mlxd_array* data = t->in ? t->in : t->out;
  t->rec = mlxd_oprec_begin(g->id, g->backend->rank, g->backend->size, t->seq, t->name,
                            (int)data->dtype, data->nbytes, t->peer);
  atomic_fetch_add_explicit(&g->queued, 1, memory_order_relaxed);
}

/* Queue the task (its sequence number is taken in op_queued); on success
 * *res = out. Consumes out. The op_task is copied into the stream's task (no
 * allocation of its own). */
static int submit(const char* op, mlxd_group* g, mlxd_stream* s, op_kind kind, mlxd_reduce_op rop,
                  int peer, mlxd_array* in, mlxd_array* out, mlx_array* res) {
  mlxd_status st;
  mlxd_status_reset(&st);
  op_task t = {.g = g,
               .s = s,
               .kind = kind,
               .rop = rop,
               .peer = peer,
               .in = in,
               .out = out,
               .name = kind == OP_RECV ? "recv" : op}; /* recv_like: a recv, as the backend says */
  mlxd_group_retain(g); /* the task's reference, dropped by op_cleanup */
  int rc = mlxd_stream_submit_copy(s, op_run, op_cleanup, op_queued, &t, sizeof t, in ? &in : NULL,
                                   in ? 1 : 0, &out, 1, &st);
  if (rc != 0) { /* nothing was queued: no number was taken, no record begun */
    mlxd_group_release(g);
    mlxd_array_release(out);
    if (!st.msg[0]) mlxd_fail(&st, rc, "[distributed] %s: could not queue the operation", op);
    return mlxd_error_status(&st);
  }
  set_result(res, out);
  return 0;
}

static mlxd_array* alloc_pending(const char* op, const int* shape, int ndim, mlx_dtype dtype) {
  mlxd_status st;
  mlxd_status_reset(&st);
  mlxd_array* a = mlxd_array_alloc(shape, ndim, dtype, true, &st);
  if (!a) {
    if (!st.msg[0])
      mlxd_fail(&st, MLXD_ENOMEM, "[distributed] %s: could not allocate the result", op);
    mlxd_error_status(&st);
  }
  return a;
}

/* "(6, 3)" for messages; cut with "..." where it does not fit. */
static void shape_str(const mlxd_array* a, char* buf, size_t len) {
  size_t n = (size_t)snprintf(buf, len, "(");
  for (int i = 0; i < a->ndim && n < len; i++)
    n += (size_t)snprintf(buf + n, len - n, "%s%d", i ? ", " : "", a->shape[i]);
  if (n + 2 < len) {
    snprintf(buf + n, len - n, ")");
  } else if (len >= 5) {
    memcpy(buf + len - 5, "...)", 5);
  }
}

/* ------------------------------------------------------------------ */

static int collective(const char* op, op_kind kind, mlxd_reduce_op rop, mlx_array* res,
                      const mlx_array x, const mlx_distributed_group group, const mlx_stream s) {
  int rc = check_res_x(op, res, &x);
  if (rc) return rc;
  mlxd_array* in = mlxd_array_of(x);
  if ((kind == OP_SCATTER || kind == OP_ALL_TO_ALL) && in->ndim < 1) {
    mlxd_error("[distributed] %s: x is 0-dimensional (expected at least one axis to %s)", op,
               kind == OP_SCATTER ? "scatter along" : "cut into one part per rank");
    return MLXD_EINVAL;
  }
  mlxd_group* g;
  mlxd_stream* str;
  bool own;
  rc = resolve(op, group, s, &g, &str, &own);
  if (rc) return rc;
  int size = g->backend->size;

  int ndim = in->ndim;
  int oshape_small[8];
  int* oshape = ndim <= 8 ? oshape_small : malloc(sizeof(int) * (size_t)(ndim > 0 ? ndim : 1));
  if (!oshape) {
    unresolve(g, own);
    mlxd_error("[distributed] %s: out of memory", op);
    return MLXD_ENOMEM;
  }
  if (ndim > 0) memcpy(oshape, in->shape, sizeof(int) * (size_t)ndim);

  if ((kind == OP_SCATTER || kind == OP_ALL_TO_ALL) && in->shape[0] % size != 0) {
    char sh[96];
    shape_str(in, sh, sizeof sh);
    mlxd_error(
        "[distributed] %s: x has shape %s; its axis 0 has %d entries, which does not divide by "
        "the group size %d (expected a multiple of %d)",
        op, sh, in->shape[0], size, size);
    rc = MLXD_EINVAL;
    goto out;
  }
  rc = check_dtype(op, "x's", in->dtype);
  if (rc) goto out;
  /* An op the backend cannot run at all (all_to_all on a plugin of ABI
   * v1-v3) is refused here, before it takes a sequence number (backend.h). */
  if (kind == OP_ALL_TO_ALL && g->backend->ops->op_supported) {
    mlxd_status ust;
    mlxd_status_reset(&ust);
    if (g->backend->ops->op_supported(g->backend, op, &ust) != 0) {
      if (!ust.msg[0]) mlxd_fail(&ust, MLXD_EUNAVAIL, "[%s] %s is not supported", g->kind, op);
      rc = mlxd_error_status(&ust);
      goto out;
    }
  }
  if (kind == OP_GATHER && size > 1) { /* a group of one gives the input unchanged */
    if (in->nbytes > SIZE_MAX / (size_t)size) {
      mlxd_error("[distributed] %s: the result (%zu bytes x %d ranks) does not fit in memory", op,
                 in->nbytes, size);
      rc = MLXD_EINVAL;
      goto out;
    }
    if (ndim == 0) {
      ndim = 1;
      oshape[0] = size;
    } else if (oshape[0] > INT_MAX / size) {
      mlxd_error("[distributed] %s: the result's axis 0 (%d x %d ranks) does not fit in an int", op,
                 oshape[0], size);
      rc = MLXD_EINVAL;
      goto out;
    } else {
      oshape[0] *= size;
    }
  } else if (kind == OP_SCATTER) {
    oshape[0] /= size;
  }
  mlxd_array* o = alloc_pending(op, oshape, ndim, in->dtype);
  if (!o) {
    rc = MLXD_ENOMEM;
    goto out;
  }
  rc = submit(op, g, str, kind, rop, -1, in, o, res);
out:
  if (oshape != oshape_small) free(oshape);
  unresolve(g, own);
  return rc;
}

int mlx_distributed_all_sum(mlx_array* res, const mlx_array x, const mlx_distributed_group group,
                            const mlx_stream s) {
  return collective("all_sum", OP_REDUCE, MLXD_SUM, res, x, group, s);
}

int mlx_distributed_all_max(mlx_array* res, const mlx_array x, const mlx_distributed_group group,
                            const mlx_stream s) {
  return collective("all_max", OP_REDUCE, MLXD_MAX, res, x, group, s);
}

int mlx_distributed_all_min(mlx_array* res, const mlx_array x, const mlx_distributed_group group,
                            const mlx_stream s) {
  return collective("all_min", OP_REDUCE, MLXD_MIN, res, x, group, s);
}

int mlx_distributed_all_gather(mlx_array* res, const mlx_array x, const mlx_distributed_group group,
                               const mlx_stream S) {
  return collective("all_gather", OP_GATHER, MLXD_SUM, res, x, group, S);
}

int mlx_distributed_sum_scatter(mlx_array* res, const mlx_array x,
                                const mlx_distributed_group group, const mlx_stream s) {
  return collective("sum_scatter", OP_SCATTER, MLXD_SUM, res, x, group, s);
}

/* The result has x's shape: part j of this rank's x goes to rank j, part i
 * of the result came from rank i (a group of one: x, copied). */
int mlx_distributed_all_to_all(mlx_array* res, const mlx_array x, const mlx_distributed_group group,
                               const mlx_stream s) {
  return collective("all_to_all", OP_ALL_TO_ALL, MLXD_SUM, res, x, group, s);
}

/* ------------------------------------------------------------------ */

static void release_array(void* a) { mlxd_array_release(a); }

int mlx_distributed_send(mlx_array* res, const mlx_array x, int dst,
                         const mlx_distributed_group group, const mlx_stream s) {
  const char* op = "send";
  int rc = check_res_x(op, res, &x);
  if (rc) return rc;
  mlxd_array* in = mlxd_array_of(x);
  mlxd_group* g;
  mlxd_stream* str;
  bool own;
  rc = resolve(op, group, s, &g, &str, &own);
  if (rc) return rc;
  rc = check_peer(op, "dst", dst, g);
  if (rc == 0) rc = check_dtype(op, "x's", in->dtype);
  if (rc) goto out;

  /* The result is x itself: a pending array over x's data that keeps x
   * alive, completed when the data has left. */
  mlx_array h = mlx_array_new_data_managed_payload(in->data, in->shape, in->ndim, in->dtype,
                                                   mlxd_array_retain(in), release_array);
  mlxd_array* o = mlxd_array_of(h);
  if (!o) { /* the constructor reported why; it did not take the reference */
    mlxd_array_release(in);
    rc = MLXD_ENOMEM;
    goto out;
  }
  atomic_store(&o->state, MLXD_ARRAY_PENDING);
  rc = submit(op, g, str, OP_SEND, MLXD_SUM, dst, in, o, res);
out:
  unresolve(g, own);
  return rc;
}

static int recv_impl(const char* op, mlx_array* res, const int* shape, size_t shape_num,
                     mlx_dtype dtype, int src, const mlx_distributed_group group,
                     const mlx_stream s) {
  int rc = check_res_x(op, res, NULL);
  if (rc) return rc;
  if (shape_num > MAX_NDIM) {
    mlxd_error("[distributed] %s: shape_num is %zu (expected at most %d dimensions)", op, shape_num,
               MAX_NDIM);
    return MLXD_EINVAL;
  }
  if (shape_num > 0 && !shape) {
    mlxd_error("[distributed] %s: shape is NULL but shape_num is %zu (expected %zu dimensions)", op,
               shape_num, shape_num);
    return MLXD_EINVAL;
  }
  size_t count = 1;
  bool overflow = false;
  for (size_t i = 0; i < shape_num; i++) {
    if (shape[i] < 0) {
      mlxd_error("[distributed] %s: shape[%zu] is %d (expected dimensions >= 0)", op, i, shape[i]);
      return MLXD_EINVAL;
    }
    if (shape[i] != 0 && count > SIZE_MAX / (size_t)shape[i]) overflow = true;
    count *= (size_t)shape[i];
  }
  mlxd_status dst;
  if (mlxd_dtype_check((int)dtype, &dst) != 0 || mlx_dtype_size(dtype) == 0) {
    mlxd_error(
        "[distributed] %s: dtype %d is not a valid mlx_dtype (expected MLX_BOOL .. "
        "MLX_COMPLEX64)",
        op, (int)dtype);
    return MLXD_EINVAL;
  }
  bool has_zero = false;
  for (size_t i = 0; i < shape_num; i++) has_zero |= shape[i] == 0;
  if (!has_zero && (overflow || count > SIZE_MAX / mlx_dtype_size(dtype))) {
    mlxd_error("[distributed] %s: the shape has more elements than fit in memory", op);
    return MLXD_EINVAL;
  }
  mlxd_group* g;
  mlxd_stream* str;
  bool own;
  rc = resolve(op, group, s, &g, &str, &own);
  if (rc) return rc;
  rc = check_peer(op, "src", src, g);
  if (rc) goto out;
  mlxd_array* o = alloc_pending(op, shape, (int)shape_num, dtype);
  if (!o) {
    rc = MLXD_ENOMEM;
    goto out;
  }
  rc = submit(op, g, str, OP_RECV, MLXD_SUM, src, NULL, o, res);
out:
  unresolve(g, own);
  return rc;
}

int mlx_distributed_recv(mlx_array* res, const int* shape, size_t shape_num, mlx_dtype dtype,
                         int src, const mlx_distributed_group group, const mlx_stream s) {
  return recv_impl("recv", res, shape, shape_num, dtype, src, group, s);
}

int mlx_distributed_recv_like(mlx_array* res, const mlx_array x, int src,
                              const mlx_distributed_group group, const mlx_stream s) {
  int rc = check_res_x("recv_like", res, &x);
  if (rc) return rc;
  mlxd_array* a = mlxd_array_of(x);
  return recv_impl("recv_like", res, a->shape, (size_t)a->ndim, a->dtype, src, group, s);
}
