/* The plugin adapter: turns a plugin's table (ABI v4, or the frozen v3, v2,
 * v1) into a backend kind of the core, and the plugin's instances into
 * mlxd_backends.
 *
 * One reader for every version. Each ABI version is a frozen header whose
 * tables extend the previous version's at the end (docs/plugin-abi.md), so
 * the adapter reads every table through the newest version's types (v4)
 * and treats a member that does not fit in the table's struct_size as
 * absent. plugin_layout.h proves, member by member, that v1, v2 and v3 are
 * layout prefixes of v4 and that the ABI's fixed values equal the core's
 * enums. (The tables live in another shared object, so the core only ever
 * sees bytes laid out as the header says.)
 *
 * Which plugin function runs an op: a v4 instance's run for the kinds its
 * run_kinds names (told the op by a descriptor: buffers, memory kinds, the
 * stream's native handle); else the *_ref op of v3 when the table holds
 * it; else the plain op of v1. all_to_all has no op before run: an
 * instance whose run does not take it refuses it here, by name.
 *
 * A plugin's kind has context-free functions (backend.h), so each loaded
 * plugin gets a slot, and each slot its own create trampoline. */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/array_impl.h"
#include "core/stream_impl.h"
#include "distributed/plugin.h"
#include "distributed/plugin_layout.h" /* the ABI headers and the proof of their layouts */
#include "reduce/reduce.h"
#include "util/tunables.h"

/* Does member m of a table of type T fit in the table's struct_size? */
#define HAS_MEMBER(T, tab, m) ((tab)->struct_size >= offsetof(T, m) + sizeof((tab)->m))

/* ---- the host tables (one per version, same functions) ---- */

static void host_reduce(int32_t op, int32_t dtype, void* acc, const void* in, size_t count) {
  mlxd_reduce((mlxd_reduce_op)op, (mlx_dtype)dtype, acc, in, count);
}
static size_t host_dtype_size(int32_t dtype) {
  if (dtype < 0 || dtype >= MLXDIST_V4_DTYPE_COUNT) return 0;
  return mlx_dtype_size((mlx_dtype)dtype);
}
/* A plugin may call these from threads of its own, which mlxdist cannot mark
 * as its (util/env.h): they read the values kept at init, never getenv. */
static double host_timeout_s(void) { return mlxd_tunable_kept_double(MLXD_T_TIMEOUT); }
static double host_spin_us(void) { return mlxd_tunable_kept_double(MLXD_T_SPIN_US); }

#define HOST_TABLE(T)                                                                      \
  {                                                                                        \
    .struct_size = sizeof(T),                                                              \
    .version = MLXDIST_PLUGIN_V4_VERSION, /* the highest this core speaks */               \
        .reduce = host_reduce, .dtype_size = host_dtype_size, .timeout_s = host_timeout_s, \
    .spin_us = host_spin_us,                                                               \
  }
static const mlxdist_v4_host k_host_v4 = HOST_TABLE(mlxdist_v4_host);
static const mlxdist_v3_host k_host_v3 = HOST_TABLE(mlxdist_v3_host);
static const mlxdist_v2_host k_host_v2 = HOST_TABLE(mlxdist_v2_host);
static const mlxdist_v1_host k_host_v1 = HOST_TABLE(mlxdist_v1_host);

/* ---- loaded plugins ---- */

#define MAX_PLUGINS 8
#define PATH_MAX_TEXT 1024

typedef struct plugin_slot {
  mlxd_backend_kind kind; /* what the registry sees */
  mlxd_backend_ops ops;   /* the adapter's ops, named after the plugin */
  const mlxdist_v4_plugin* p;
  unsigned version; /* the ABI the plugin was loaded through (1 to 4) */
  char name[32];
  char path[PATH_MAX_TEXT];
} plugin_slot;

/* Slots are filled under plugin.c's lock and never change afterwards;
 * g_nslots is published after its slot is written (readers need no lock). */
static plugin_slot g_slots[MAX_PLUGINS];
static atomic_int g_nslots;

/* One instance of a plugin's backend. */
typedef struct adapted {
  mlxd_backend base; /* first */
  const plugin_slot* slot;
  mlxdist_v4_backend* inner;
  bool has_describe;
  bool has_ref;       /* v3: the instance's ops table may hold the *_ref members (REF_OP) */
  uint64_t run_kinds; /* v4: the kinds its run takes (MLXDIST_V4_KIND_BIT), 0: none */
  bool has_abort;     /* v4: its abort */
  struct bs_wrap* bs; /* owned: the bootstrap given to create, or NULL */
} adapted;

/* The core's bootstrap, as the plugin sees it. */
typedef struct bs_wrap {
  mlxdist_v4_bootstrap pub; /* first */
  mlxd_bootstrap* core;
} bs_wrap;

static void pstatus_clear(mlxdist_v4_status* ps) { memset(ps, 0, sizeof *ps); }

/* The plugin's failure as an mlxd_status (a plain one: the plugin's text is
 * final), with the peer and errno it reported. Returns the code. */
static int take_status(const plugin_slot* s, int32_t rc, mlxdist_v4_status* ps, mlxd_status* st) {
  if (rc == 0) {
    mlxd_status_clear(st);
    return 0;
  }
  ps->msg[sizeof ps->msg - 1] = '\0';
  int code = rc;
  if (rc < MLXD_EINVAL || rc > MLXD_ECALLBACK) {
    mlxd_fail(st, MLXD_EINVAL, "%.400s (the %s plugin returned an unknown code %d)",
              ps->msg[0] ? ps->msg : "(no message)", s->name, (int)rc);
    code = MLXD_EINVAL;
  } else if (ps->msg[0]) {
    mlxd_fail(st, code, "%s", ps->msg);
  } else {
    mlxd_fail(st, code, "[%s] the operation failed without a message (code %d)", s->name, code);
  }
  if (ps->has_peer) {
    st->has_peer = true;
    st->peer = ps->peer;
  }
  st->sys_errno = ps->sys_errno;
  return code;
}

static int32_t bs_gather(mlxdist_v4_bootstrap* pub, void* dst, const void* src, size_t n,
                         mlxdist_v4_status* ps) {
  bs_wrap* w = (bs_wrap*)pub;
  w->core->rank = pub->rank;
  w->core->size = pub->size;
  mlxd_status st;
  mlxd_status_clear(&st);
  int rc = w->core->all_gather(w->core, dst, src, n, &st);
  if (rc != 0) {
    pstatus_clear(ps);
    ps->code = rc;
    snprintf(ps->msg, sizeof ps->msg, "%s", st.msg);
  }
  return rc;
}

/* ---- the adapter's ops ---- */

static int a_all_reduce(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t count,
                        mlx_dtype dtype, mlxd_reduce_op op, mlxd_status* st) {
  adapted* a = (adapted*)b;
  mlxdist_v4_status ps;
  pstatus_clear(&ps);
  int32_t rc = a->inner->ops->all_reduce(a->inner, seq, in, out, count, (mlxdist_v4_dtype)dtype,
                                         (mlxdist_v4_op)op, &ps);
  return take_status(a->slot, rc, &ps, st);
}

/* Plugin ABI v2 moves all_gather/send/recv data as bytes: the dtype stays here. */
static int a_all_gather(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t nbytes,
                        mlx_dtype dtype, mlxd_status* st) {
  (void)dtype;
  adapted* a = (adapted*)b;
  mlxdist_v4_status ps;
  pstatus_clear(&ps);
  int32_t rc = a->inner->ops->all_gather(a->inner, seq, in, out, nbytes, &ps);
  return take_status(a->slot, rc, &ps, st);
}

static int a_reduce_scatter(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t count,
                            mlx_dtype dtype, mlxd_reduce_op op, mlxd_status* st) {
  adapted* a = (adapted*)b;
  mlxdist_v4_status ps;
  pstatus_clear(&ps);
  int32_t rc = a->inner->ops->reduce_scatter(a->inner, seq, in, out, count, (mlxdist_v4_dtype)dtype,
                                             (mlxdist_v4_op)op, &ps);
  return take_status(a->slot, rc, &ps, st);
}

/* ABI v1-v3 have no all_to_all, and a v4 instance has it only through run:
 * otherwise refused by name, nothing sent, the group stays usable (every
 * rank refuses it alike, before any byte moves). */
static int a_all_to_all_none(mlxd_backend* b, uint64_t seq, const void* in, void* out,
                             size_t part_bytes, mlx_dtype dtype, mlxd_status* st) {
  (void)seq, (void)in, (void)out, (void)part_bytes, (void)dtype;
  const adapted* a = (const adapted*)b;
  if (a->slot->version >= 4)
    return mlxd_fail(st, MLXD_EUNAVAIL,
                     "[%s] all_to_all is not supported by this plugin (%s speaks plugin ABI v%u, "
                     "but its run_kinds leaves out the all_to_all kind)",
                     a->slot->name, a->slot->path, a->slot->version);
  return mlxd_fail(st, MLXD_EUNAVAIL,
                   "[%s] all_to_all is not supported by this plugin (%s speaks plugin ABI v%u; "
                   "all_to_all needs v4)",
                   a->slot->name, a->slot->path, a->slot->version);
}

static int a_send(mlxd_backend* b, uint64_t seq, const void* buf, size_t nbytes, mlx_dtype dtype,
                  int dst, mlxd_status* st) {
  (void)dtype;
  adapted* a = (adapted*)b;
  mlxdist_v4_status ps;
  pstatus_clear(&ps);
  int32_t rc = a->inner->ops->send(a->inner, seq, buf, nbytes, dst, &ps);
  return take_status(a->slot, rc, &ps, st);
}

static int a_recv(mlxd_backend* b, uint64_t seq, void* buf, size_t nbytes, mlx_dtype dtype, int src,
                  mlxd_status* st) {
  (void)dtype;
  adapted* a = (adapted*)b;
  mlxdist_v4_status ps;
  pstatus_clear(&ps);
  int32_t rc = a->inner->ops->recv(a->inner, seq, buf, nbytes, src, &ps);
  return take_status(a->slot, rc, &ps, st);
}

/* ---- ABI v3: the ops that are told the arrays (backend.h's *_ref) ---- */

/* A hold (mlxdist_v4_hold) is the op's two arrays, retained: word[0] in,
 * word[1] out (either may be NULL). Taking it is two atomic increments. */
static void ref_hold(const mlxdist_v4_bufref* ref, mlxdist_v4_hold* h) {
  const mlxd_op_arrays* arr = ref->ctx;
  memset(h, 0, sizeof *h);
  h->word[0] = mlxd_array_retain(arr->in);
  h->word[1] = mlxd_array_retain(arr->out);
}
static void ref_release(mlxdist_v4_hold* h) {
  mlxd_array_release(h->word[0]);
  mlxd_array_release(h->word[1]);
  memset(h, 0, sizeof *h);
}
static mlxdist_v4_bufref make_ref(const mlxd_op_arrays* arr) {
  return (mlxdist_v4_bufref){.struct_size = (uint32_t)sizeof(mlxdist_v4_bufref),
                             .ctx = (void*)(uintptr_t)arr,
                             .hold = ref_hold,
                             .release = ref_release};
}
/* The instance's *_ref op m, or NULL (absent: the plain op is called). */
#define REF_OP(a, m) \
  ((a)->has_ref && HAS_MEMBER(mlxdist_v4_ops, (a)->inner->ops, m) ? (a)->inner->ops->m : NULL)

/* ---- ABI v4: one run op, told the op by a descriptor ---- */

/* Does the instance's run take kind k? */
#define RUNS(a, k) (((a)->run_kinds & MLXDIST_V4_KIND_BIT(k)) != 0)

/* Host memory today: the core allocates every array in host memory (a GPU
 * stream's results too, docs/nccl.md), so MANAGED and DEVICE are never sent
 * yet. */
static mlxdist_v4_buf host_buf(const void* data, size_t bytes) {
  return (mlxdist_v4_buf){.data = bytes ? (void*)(uintptr_t)data : NULL,
                          .bytes = bytes,
                          .mem = MLXDIST_V4_MEM_HOST,
                          .device = -1};
}

/* Run one op through the instance's run: count elements per rank's block,
 * sized as the table in plugin_v4.h says. */
static int a_run(adapted* a, mlxdist_v4_kind kind, uint64_t seq, const void* in, void* out,
                 size_t count, mlx_dtype dtype, mlxd_reduce_op op, int peer,
                 const mlxd_op_arrays* arr, mlxd_status* st) {
  size_t block = count * mlx_dtype_size(dtype), n = (size_t)a->base.size;
  size_t in_bytes = block, out_bytes = block;
  if (kind == MLXDIST_V4_KIND_ALL_GATHER) out_bytes = n * block;
  if (kind == MLXDIST_V4_KIND_REDUCE_SCATTER) in_bytes = n * block;
  if (kind == MLXDIST_V4_KIND_ALL_TO_ALL) in_bytes = out_bytes = n * block;
  if (kind == MLXDIST_V4_KIND_SEND) out_bytes = 0;
  if (kind == MLXDIST_V4_KIND_RECV) in_bytes = 0;
  mlxd_stream* s = arr->stream;
  bool gpu = s && mlxd_stream_device_type(s) == MLX_GPU;
  mlxdist_v4_bufref ref = make_ref(arr);
  mlxdist_v4_call call = {
      .struct_size = (uint32_t)sizeof(mlxdist_v4_call),
      .kind = kind,
      .seq = seq,
      .dtype = (mlxdist_v4_dtype)dtype,
      .reduce = (mlxdist_v4_op)op,
      .count = count,
      .peer = peer,
      .stream_device = gpu ? mlxd_stream_index(s) : -1,
      .stream = gpu ? mlxd_stream_native(s) : NULL,
      .in = in_bytes ? host_buf(in, in_bytes) : host_buf(NULL, 0),
      .out = out_bytes ? host_buf(out, out_bytes) : host_buf(NULL, 0),
      .ref = &ref,
  };
  mlxdist_v4_status ps;
  pstatus_clear(&ps);
  int32_t rc = a->inner->ops->run(a->inner, &call, &ps);
  return take_status(a->slot, rc, &ps, st);
}

static int a_all_to_all_ref(mlxd_backend* b, uint64_t seq, const void* in, void* out,
                            size_t part_bytes, mlx_dtype dtype, const mlxd_op_arrays* arr,
                            mlxd_status* st) {
  adapted* a = (adapted*)b;
  if (!RUNS(a, MLXDIST_V4_KIND_ALL_TO_ALL))
    return a_all_to_all_none(b, seq, in, out, part_bytes, dtype, st);
  return a_run(a, MLXDIST_V4_KIND_ALL_TO_ALL, seq, in, out, part_bytes / mlx_dtype_size(dtype),
               dtype, MLXD_SUM, -1, arr, st);
}

/* backend.h's op_supported: all_to_all needs a v4 instance whose run takes
 * it. Every rank's instance answers alike (the same plugin), and a refusal
 * takes no sequence number, so the plugin's later ops stay in step. */
static int a_op_supported(const mlxd_backend* b, const char* op, mlxd_status* st) {
  const adapted* a = (const adapted*)b;
  if (strcmp(op, "all_to_all") != 0 || RUNS(a, MLXDIST_V4_KIND_ALL_TO_ALL)) return 0;
  return a_all_to_all_none((mlxd_backend*)(uintptr_t)b, 0, NULL, NULL, 0, MLX_UINT8, st);
}

/* The instance's abort (v4), with the core's text as the reason. */
static void a_abort(mlxd_backend* b, const mlxd_status* st) {
  adapted* a = (adapted*)b;
  if (a->has_abort) a->inner->ops->abort(a->inner, st && st->msg[0] ? st->msg : "aborted");
}

static int a_all_reduce_ref(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t count,
                            mlx_dtype dtype, mlxd_reduce_op op, const mlxd_op_arrays* arr,
                            mlxd_status* st) {
  adapted* a = (adapted*)b;
  if (RUNS(a, MLXDIST_V4_KIND_ALL_REDUCE))
    return a_run(a, MLXDIST_V4_KIND_ALL_REDUCE, seq, in, out, count, dtype, op, -1, arr, st);
  if (!REF_OP(a, all_reduce_ref)) return a_all_reduce(b, seq, in, out, count, dtype, op, st);
  mlxdist_v4_status ps;
  pstatus_clear(&ps);
  mlxdist_v4_bufref ref = make_ref(arr);
  int32_t rc = a->inner->ops->all_reduce_ref(a->inner, seq, in, out, count, (mlxdist_v4_dtype)dtype,
                                             (mlxdist_v4_op)op, &ref, &ps);
  return take_status(a->slot, rc, &ps, st);
}

static int a_all_gather_ref(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t nbytes,
                            mlx_dtype dtype, const mlxd_op_arrays* arr, mlxd_status* st) {
  adapted* a = (adapted*)b;
  if (RUNS(a, MLXDIST_V4_KIND_ALL_GATHER))
    return a_run(a, MLXDIST_V4_KIND_ALL_GATHER, seq, in, out, nbytes / mlx_dtype_size(dtype), dtype,
                 MLXD_SUM, -1, arr, st);
  if (!REF_OP(a, all_gather_ref)) return a_all_gather(b, seq, in, out, nbytes, dtype, st);
  mlxdist_v4_status ps;
  pstatus_clear(&ps);
  mlxdist_v4_bufref ref = make_ref(arr);
  int32_t rc = a->inner->ops->all_gather_ref(a->inner, seq, in, out, nbytes, &ref, &ps);
  return take_status(a->slot, rc, &ps, st);
}

static int a_reduce_scatter_ref(mlxd_backend* b, uint64_t seq, const void* in, void* out,
                                size_t count, mlx_dtype dtype, mlxd_reduce_op op,
                                const mlxd_op_arrays* arr, mlxd_status* st) {
  adapted* a = (adapted*)b;
  if (RUNS(a, MLXDIST_V4_KIND_REDUCE_SCATTER))
    return a_run(a, MLXDIST_V4_KIND_REDUCE_SCATTER, seq, in, out, count, dtype, op, -1, arr, st);
  if (!REF_OP(a, reduce_scatter_ref))
    return a_reduce_scatter(b, seq, in, out, count, dtype, op, st);
  mlxdist_v4_status ps;
  pstatus_clear(&ps);
  mlxdist_v4_bufref ref = make_ref(arr);
  int32_t rc =
      a->inner->ops->reduce_scatter_ref(a->inner, seq, in, out, count, (mlxdist_v4_dtype)dtype,
                                        (mlxdist_v4_op)op, &ref, &ps);
  return take_status(a->slot, rc, &ps, st);
}

static int a_send_ref(mlxd_backend* b, uint64_t seq, const void* buf, size_t nbytes,
                      mlx_dtype dtype, int dst, const mlxd_op_arrays* arr, mlxd_status* st) {
  adapted* a = (adapted*)b;
  if (RUNS(a, MLXDIST_V4_KIND_SEND))
    return a_run(a, MLXDIST_V4_KIND_SEND, seq, buf, NULL, nbytes / mlx_dtype_size(dtype), dtype,
                 MLXD_SUM, dst, arr, st);
  if (!REF_OP(a, send_ref)) return a_send(b, seq, buf, nbytes, dtype, dst, st);
  mlxdist_v4_status ps;
  pstatus_clear(&ps);
  mlxdist_v4_bufref ref = make_ref(arr);
  int32_t rc = a->inner->ops->send_ref(a->inner, seq, buf, nbytes, dst, &ref, &ps);
  return take_status(a->slot, rc, &ps, st);
}

static int a_recv_ref(mlxd_backend* b, uint64_t seq, void* buf, size_t nbytes, mlx_dtype dtype,
                      int src, const mlxd_op_arrays* arr, mlxd_status* st) {
  adapted* a = (adapted*)b;
  if (RUNS(a, MLXDIST_V4_KIND_RECV))
    return a_run(a, MLXDIST_V4_KIND_RECV, seq, NULL, buf, nbytes / mlx_dtype_size(dtype), dtype,
                 MLXD_SUM, src, arr, st);
  if (!REF_OP(a, recv_ref)) return a_recv(b, seq, buf, nbytes, dtype, src, st);
  mlxdist_v4_status ps;
  pstatus_clear(&ps);
  mlxdist_v4_bufref ref = make_ref(arr);
  int32_t rc = a->inner->ops->recv_ref(a->inner, seq, buf, nbytes, src, &ref, &ps);
  return take_status(a->slot, rc, &ps, st);
}

static int wrap(const plugin_slot* s, mlxdist_v4_backend* inner, bs_wrap* bs, mlxd_backend** out,
                mlxd_status* st);

static int a_split(mlxd_backend* b, uint64_t seq, int color, int key, mlxd_backend** out,
                   mlxd_status* st) {
  adapted* a = (adapted*)b;
  *out = NULL;
  mlxdist_v4_status ps;
  pstatus_clear(&ps);
  mlxdist_v4_backend* inner = NULL;
  int32_t rc = a->inner->ops->split(a->inner, seq, color, key, &inner, &ps);
  if (rc != 0) {
    if (inner && inner->ops && inner->ops->destroy) inner->ops->destroy(inner);
    return take_status(a->slot, rc, &ps, st);
  }
  return wrap(a->slot, inner, NULL, out, st); /* the child uses the parent's bootstrap */
}

static void a_destroy(mlxd_backend* b) {
  adapted* a = (adapted*)b;
  a->inner->ops->destroy(a->inner);
  free(a->bs);
  free(a);
}

/* Check a plugin's instance and wrap it; destroys inner (and frees bs) on failure. */
static int wrap(const plugin_slot* s, mlxdist_v4_backend* inner, bs_wrap* bs, mlxd_backend** out,
                mlxd_status* st) {
  *out = NULL;
  int rc = 0;
  if (!inner) {
    rc = mlxd_fail(st, MLXD_EINVAL, "[%s] the plugin %s reported success but gave no instance",
                   s->name, s->path);
    goto fail;
  }
  const mlxdist_v4_ops* ops = inner->ops;
  if (!ops || !HAS_MEMBER(mlxdist_v1_ops, ops, destroy) || !ops->destroy) {
    /* Cannot even destroy it: leaked, but never called into again. */
    rc = mlxd_fail(st, MLXD_EINVAL,
                   "[%s] the plugin %s gave an instance whose ops table is %s (struct_size %u; "
                   "ABI v1 needs at least %zu bytes with every op set)",
                   s->name, s->path, ops ? "too small" : "missing", ops ? ops->struct_size : 0u,
                   sizeof(mlxdist_v1_ops));
    inner = NULL;
    goto fail;
  }
  /* v4: the kinds run takes (an instance whose table sets run_kinds without
   * run is refused). Each op of v1 must be reachable: through run or set. */
  uint64_t run_kinds = 0;
  if (s->version >= 4 && HAS_MEMBER(mlxdist_v4_ops, ops, run_kinds) && ops->run_kinds) {
    if (!HAS_MEMBER(mlxdist_v4_ops, ops, run) || !ops->run) {
      rc = mlxd_fail(st, MLXD_EINVAL,
                     "[%s] the plugin %s gave an instance whose ops table sets run_kinds but "
                     "no run op (struct_size %u)",
                     s->name, s->path, ops->struct_size);
      goto fail;
    }
    run_kinds = ops->run_kinds;
  }
#define REACH(m, k) (ops->m || (run_kinds & MLXDIST_V4_KIND_BIT(k)))
  if (!REACH(all_reduce, MLXDIST_V4_KIND_ALL_REDUCE) ||
      !REACH(all_gather, MLXDIST_V4_KIND_ALL_GATHER) ||
      !REACH(reduce_scatter, MLXDIST_V4_KIND_REDUCE_SCATTER) ||
      !REACH(send, MLXDIST_V4_KIND_SEND) || !REACH(recv, MLXDIST_V4_KIND_RECV) || !ops->split) {
#undef REACH
    rc = mlxd_fail(st, MLXD_EINVAL,
                   "[%s] the plugin %s gave an instance whose ops table lacks a required op "
                   "(struct_size %u)",
                   s->name, s->path, ops->struct_size);
    goto fail;
  }
  if (inner->size < 1 || inner->rank < 0 || inner->rank >= inner->size ||
      (inner->device != MLXDIST_V4_DEVICE_CPU && inner->device != MLXDIST_V4_DEVICE_GPU)) {
    rc = mlxd_fail(st, MLXD_EINVAL,
                   "[%s] the plugin %s gave an instance with rank %d, size %d, device %d "
                   "(expected 0 <= rank < size and device 0 or 1)",
                   s->name, s->path, (int)inner->rank, (int)inner->size, (int)inner->device);
    goto fail;
  }
  adapted* a = calloc(1, sizeof *a);
  if (!a) {
    rc = mlxd_fail(st, MLXD_ENOMEM, "[%s] out of memory wrapping a plugin instance", s->name);
    goto fail;
  }
  a->base.ops = &s->ops;
  a->base.rank = inner->rank;
  a->base.size = inner->size;
  a->base.comm_device = (mlx_device_type)inner->device;
  a->slot = s;
  a->inner = inner;
  /* An op the plugin's table is too short to hold is absent; v1 has no describe. */
  a->has_describe =
      s->version >= 2 && HAS_MEMBER(mlxdist_v4_ops, ops, describe) && ops->describe != NULL;
  /* v3's *_ref ops: each one the table holds and sets is used (REF_OP). */
  a->has_ref = s->version >= 3;
  /* v4's run and abort. */
  a->run_kinds = run_kinds;
  a->has_abort = s->version >= 4 && HAS_MEMBER(mlxdist_v4_ops, ops, abort) && ops->abort != NULL;
  a->bs = bs;
  *out = &a->base;
  return 0;
fail:
  if (inner) inner->ops->destroy(inner);
  free(bs);
  return rc;
}

/* create, for the plugin in slot i */
static int slot_create(int i, mlxd_bootstrap* core_bs, mlxd_backend** out, mlxd_status* st) {
  const plugin_slot* s = &g_slots[i];
  *out = NULL;
  bs_wrap* bs = NULL;
  if (core_bs) {
    bs = calloc(1, sizeof *bs);
    if (!bs) return mlxd_fail(st, MLXD_ENOMEM, "[%s] out of memory", s->name);
    bs->pub.struct_size = (uint32_t)sizeof bs->pub;
    bs->pub.rank = -1;
    bs->pub.size = 0;
    bs->pub.all_gather = bs_gather;
    bs->core = core_bs;
  }
  mlxdist_v4_status ps;
  pstatus_clear(&ps);
  mlxdist_v4_backend* inner = NULL;
  int32_t rc = s->p->create(bs ? &bs->pub : NULL, &inner, &ps);
  if (rc != 0) {
    if (inner && inner->ops && inner->ops->destroy) inner->ops->destroy(inner);
    free(bs);
    return take_status(s, rc, &ps, st);
  }
  return wrap(s, inner, bs, out, st);
}

#define SLOT_CREATE(i)                                                                  \
  static int slot_create_##i(mlxd_bootstrap* bs, mlxd_backend** out, mlxd_status* st) { \
    return slot_create(i, bs, out, st);                                                 \
  }
SLOT_CREATE(0)
SLOT_CREATE(1)
SLOT_CREATE(2)
SLOT_CREATE(3)
SLOT_CREATE(4)
SLOT_CREATE(5)
SLOT_CREATE(6)
SLOT_CREATE(7)
static int (*const k_slot_create[MAX_PLUGINS])(mlxd_bootstrap*, mlxd_backend**, mlxd_status*) = {
    slot_create_0, slot_create_1, slot_create_2, slot_create_3,
    slot_create_4, slot_create_5, slot_create_6, slot_create_7,
};

/* ---- loading ---- */

const mlxd_backend_kind* mlxd_plugin_adapt(void* handle, const char* path, const char* name,
                                           mlxd_text* t) {
  /* The newest entry point first: a plugin may export several. */
  static const char* const k_symbol[5] = {NULL, MLXDIST_PLUGIN_V1_SYMBOL, MLXDIST_PLUGIN_V2_SYMBOL,
                                          MLXDIST_PLUGIN_V3_SYMBOL, MLXDIST_PLUGIN_V4_SYMBOL};
  unsigned version = 4;
  void* sym = NULL;
  for (; version >= 1; version--) {
    dlerror();
    sym = dlsym(handle, k_symbol[version]);
    if (sym) break;
  }
  if (!sym) {
    mlxd_text_add(t, "%s (exports none of %s, %s, %s, %s: not an mlxdist plugin)", path,
                  MLXDIST_PLUGIN_V4_SYMBOL, MLXDIST_PLUGIN_V3_SYMBOL, MLXDIST_PLUGIN_V2_SYMBOL,
                  MLXDIST_PLUGIN_V1_SYMBOL);
    return NULL;
  }
  /* Each entry is called with its own version's host table; its table is
   * read through the v4 type (v1-v3 are its prefixes: plugin_layout.h). */
  const mlxdist_v4_plugin* p;
  if (version == 4) {
    mlxdist_v4_entry entry;
    memcpy(&entry, &sym, sizeof entry); /* object pointer to function pointer */
    p = entry(&k_host_v4);
  } else if (version == 3) {
    mlxdist_v3_entry entry;
    memcpy(&entry, &sym, sizeof entry);
    p = (const mlxdist_v4_plugin*)(const void*)entry(&k_host_v3);
  } else if (version == 2) {
    mlxdist_v2_entry entry;
    memcpy(&entry, &sym, sizeof entry);
    p = (const mlxdist_v4_plugin*)(const void*)entry(&k_host_v2);
  } else {
    mlxdist_v1_entry entry;
    memcpy(&entry, &sym, sizeof entry);
    p = (const mlxdist_v4_plugin*)(const void*)entry(&k_host_v1);
  }
  if (!p) {
    mlxd_text_add(t, "%s (its mlxdist_plugin_v%u refused this library's host table)", path,
                  version);
    return NULL;
  }
  if (p->struct_size < sizeof(mlxdist_v1_plugin)) {
    mlxd_text_add(t,
                  "%s (its ABI v%u plugin table is too small: struct_size %u, expected at least "
                  "%zu bytes)",
                  path, version, p->struct_size, sizeof(mlxdist_v1_plugin));
    return NULL;
  }
  if (p->version != version) {
    mlxd_text_add(t,
                  "%s (mlxdist_plugin_v%u returned a table of ABI version %u; expected version %u)",
                  path, version, p->version, version);
    return NULL;
  }
  if (!p->name || !p->is_available || !p->is_configured || !p->create) {
    mlxd_text_add(t, "%s (the plugin's table has a NULL entry)", path);
    return NULL;
  }
  if (strcmp(p->name, name) != 0) {
    mlxd_text_add(t, "%s (the plugin is the \"%.40s\" backend, not \"%s\")", path, p->name, name);
    return NULL;
  }
  int i = atomic_load(&g_nslots);
  if (i >= MAX_PLUGINS) {
    mlxd_text_add(t, "%s (too many plugins loaded: at most %d)", path, MAX_PLUGINS);
    return NULL;
  }
  plugin_slot* s = &g_slots[i];
  s->p = p;
  s->version = version;
  snprintf(s->name, sizeof s->name, "%s", name);
  snprintf(s->path, sizeof s->path, "%s", path);
  s->ops = (mlxd_backend_ops){
      .name = s->name,
      .all_reduce = a_all_reduce,
      .all_gather = a_all_gather,
      .reduce_scatter = a_reduce_scatter,
      .all_to_all = a_all_to_all_none,
      .send = a_send,
      .recv = a_recv,
      .split = a_split,
      .destroy = a_destroy,
      /* v4's abort (a_abort calls the instance's when it has one); v1-v3 have
       * none: such a plugin bounds its exit itself, as the mpi plugin does */
      .abort = version >= 4 ? a_abort : NULL,
      /* v3: the ops told the arrays (each falls back to the plain op when the
       * instance's table lacks it) */
      .all_reduce_ref = version >= 3 ? a_all_reduce_ref : NULL,
      .all_gather_ref = version >= 3 ? a_all_gather_ref : NULL,
      .reduce_scatter_ref = version >= 3 ? a_reduce_scatter_ref : NULL,
      .send_ref = version >= 3 ? a_send_ref : NULL,
      /* v4: run, when the instance's run takes the kind; refused otherwise */
      .all_to_all_ref = version >= 4 ? a_all_to_all_ref : NULL,
      .op_supported = a_op_supported,
      .recv_ref = version >= 3 ? a_recv_ref : NULL,
  };
  s->kind = (mlxd_backend_kind){
      .name = s->name,
      .is_available = p->is_available,
      .is_configured = p->is_configured,
      .create = k_slot_create[i],
      .supports_bootstrap = p->supports_bootstrap,
  };
  atomic_store(&g_nslots, i + 1);
  return &s->kind;
}

static bool is_adapted(const mlxd_backend* b) {
  int n = atomic_load(&g_nslots);
  for (int i = 0; i < n; i++)
    if (b->ops == &g_slots[i].ops) return true;
  return false;
}

bool mlxd_plugin_describe(const mlxd_backend* b, char* buf, size_t len) {
  if (!b || !buf || len == 0 || !is_adapted(b)) return false;
  const adapted* a = (const adapted*)b;
  const plugin_slot* s = a->slot;
  if (!a->has_describe) {
    snprintf(buf, len, "(plugin %s, ABI v%u: no describe op)", s->path, s->version);
    return true;
  }
  char text[256];
  text[0] = '\0';
  a->inner->ops->describe(a->inner, text, sizeof text);
  text[sizeof text - 1] = '\0';
  snprintf(buf, len, "%s (plugin %s, ABI v%u)", text[0] ? text : "(empty description)", s->path,
           s->version);
  return true;
}
