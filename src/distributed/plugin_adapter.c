/* The plugin adapter: turns a plugin's table (ABI v3, or the frozen v2, v1)
 * into a backend kind of the core, and the plugin's instances into
 * mlxd_backends.
 *
 * One reader for every version. Each ABI version is a frozen header whose
 * tables extend the previous version's at the end (docs/plugin-abi.md), so
 * the adapter reads every table through the newest version's types and
 * treats a member that does not fit in the table's struct_size as absent.
 * The assertions below check that v1 and v2 are layout prefixes of v3,
 * member by member, and that the fixed values of the ABI equal the core's enums. (The
 * tables live in another shared object, so the core only ever sees bytes
 * laid out as the header says.) v3 is the reading type; v1 and v2 get the
 * prefix checks. When v4 comes, it becomes the reading type and v3 gets them.
 *
 * A plugin's kind has context-free functions (backend.h), so each loaded
 * plugin gets a slot, and each slot its own create trampoline. */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mlx/c/plugin/plugin_v1.h>
#include <mlx/c/plugin/plugin_v2.h>
#include <mlx/c/plugin/plugin_v3.h>
#include "core/array_impl.h"
#include "distributed/plugin.h"
#include "reduce/reduce.h"
#include "util/tunables.h"

/* ---- the ABI's values are the core's ---- */

/* Compared as ints: the ABI's enums are not the core's enum types. */
#define EQ(a, b) ((int)(a) == (int)(b))
_Static_assert(EQ(MLXDIST_V3_OK, MLXD_OK) && EQ(MLXDIST_V3_EINVAL, MLXD_EINVAL) &&
                   EQ(MLXDIST_V3_ETIMEDOUT, MLXD_ETIMEDOUT) &&
                   EQ(MLXDIST_V3_EREMOTE, MLXD_EREMOTE) && EQ(MLXDIST_V3_ESYS, MLXD_ESYS) &&
                   EQ(MLXDIST_V3_ENOMEM, MLXD_ENOMEM) && EQ(MLXDIST_V3_EUNAVAIL, MLXD_EUNAVAIL) &&
                   EQ(MLXDIST_V3_EABORTED, MLXD_EABORTED) &&
                   EQ(MLXDIST_V3_ECALLBACK, MLXD_ECALLBACK),
               "plugin ABI status codes must equal mlxd_code");
_Static_assert(EQ(MLXDIST_V3_DTYPE_BOOL, MLX_BOOL) && EQ(MLXDIST_V3_DTYPE_UINT8, MLX_UINT8) &&
                   EQ(MLXDIST_V3_DTYPE_UINT16, MLX_UINT16) &&
                   EQ(MLXDIST_V3_DTYPE_UINT32, MLX_UINT32) &&
                   EQ(MLXDIST_V3_DTYPE_UINT64, MLX_UINT64) && EQ(MLXDIST_V3_DTYPE_INT8, MLX_INT8) &&
                   EQ(MLXDIST_V3_DTYPE_INT16, MLX_INT16) && EQ(MLXDIST_V3_DTYPE_INT32, MLX_INT32) &&
                   EQ(MLXDIST_V3_DTYPE_INT64, MLX_INT64) &&
                   EQ(MLXDIST_V3_DTYPE_FLOAT16, MLX_FLOAT16) &&
                   EQ(MLXDIST_V3_DTYPE_FLOAT32, MLX_FLOAT32) &&
                   EQ(MLXDIST_V3_DTYPE_FLOAT64, MLX_FLOAT64) &&
                   EQ(MLXDIST_V3_DTYPE_BFLOAT16, MLX_BFLOAT16) &&
                   EQ(MLXDIST_V3_DTYPE_COMPLEX64, MLX_COMPLEX64) &&
                   EQ(MLXDIST_V3_DTYPE_COUNT, MLX_COMPLEX64 + 1),
               "plugin ABI dtypes must equal mlx_dtype");
_Static_assert(EQ(MLXDIST_V3_OP_SUM, MLXD_SUM) && EQ(MLXDIST_V3_OP_MAX, MLXD_MAX) &&
                   EQ(MLXDIST_V3_OP_MIN, MLXD_MIN) && MLXDIST_V3_OP_COUNT == 3,
               "plugin ABI reduce ops must equal mlxd_reduce_op");
_Static_assert(EQ(MLXDIST_V3_DEVICE_CPU, MLX_CPU) && EQ(MLXDIST_V3_DEVICE_GPU, MLX_GPU),
               "plugin ABI devices must equal mlx_device_type");
_Static_assert(MLXDIST_V3_MSG_MAX <= MLXD_MSG_MAX, "a plugin's message must fit in mlxd_status");

/* v1 and v2 values are v3 values */
_Static_assert(EQ(MLXDIST_V1_ECALLBACK, MLXDIST_V3_ECALLBACK) &&
                   EQ(MLXDIST_V1_DTYPE_COMPLEX64, MLXDIST_V3_DTYPE_COMPLEX64) &&
                   EQ(MLXDIST_V1_OP_MIN, MLXDIST_V3_OP_MIN) &&
                   EQ(MLXDIST_V1_DEVICE_GPU, MLXDIST_V3_DEVICE_GPU) &&
                   EQ(MLXDIST_V1_MSG_MAX, MLXDIST_V3_MSG_MAX),
               "v1 values must equal v3 values");
_Static_assert(EQ(MLXDIST_V2_ECALLBACK, MLXDIST_V3_ECALLBACK) &&
                   EQ(MLXDIST_V2_DTYPE_COMPLEX64, MLXDIST_V3_DTYPE_COMPLEX64) &&
                   EQ(MLXDIST_V2_OP_MIN, MLXDIST_V3_OP_MIN) &&
                   EQ(MLXDIST_V2_DEVICE_GPU, MLXDIST_V3_DEVICE_GPU) &&
                   EQ(MLXDIST_V2_MSG_MAX, MLXDIST_V3_MSG_MAX),
               "v2 values must equal v3 values");

/* v1 and v2 tables are prefixes of v3 tables */
#define SAME_MEMBER(T1, T2, m)                                                                     \
  _Static_assert(offsetof(T1, m) == offsetof(T2, m) && sizeof(((T1*)0)->m) == sizeof(((T2*)0)->m), \
                 #T1 "." #m " must sit where " #T2 "." #m " does")
SAME_MEMBER(mlxdist_v1_status, mlxdist_v3_status, code);
SAME_MEMBER(mlxdist_v1_status, mlxdist_v3_status, has_peer);
SAME_MEMBER(mlxdist_v1_status, mlxdist_v3_status, peer);
SAME_MEMBER(mlxdist_v1_status, mlxdist_v3_status, sys_errno);
SAME_MEMBER(mlxdist_v1_status, mlxdist_v3_status, msg);
_Static_assert(sizeof(mlxdist_v1_status) == sizeof(mlxdist_v3_status), "status size");
SAME_MEMBER(mlxdist_v1_host, mlxdist_v3_host, struct_size);
SAME_MEMBER(mlxdist_v1_host, mlxdist_v3_host, version);
SAME_MEMBER(mlxdist_v1_host, mlxdist_v3_host, reduce);
SAME_MEMBER(mlxdist_v1_host, mlxdist_v3_host, dtype_size);
SAME_MEMBER(mlxdist_v1_host, mlxdist_v3_host, timeout_s);
SAME_MEMBER(mlxdist_v1_host, mlxdist_v3_host, spin_us);
SAME_MEMBER(mlxdist_v1_bootstrap, mlxdist_v3_bootstrap, struct_size);
SAME_MEMBER(mlxdist_v1_bootstrap, mlxdist_v3_bootstrap, rank);
SAME_MEMBER(mlxdist_v1_bootstrap, mlxdist_v3_bootstrap, size);
SAME_MEMBER(mlxdist_v1_bootstrap, mlxdist_v3_bootstrap, all_gather);
SAME_MEMBER(mlxdist_v1_backend, mlxdist_v3_backend, ops);
SAME_MEMBER(mlxdist_v1_backend, mlxdist_v3_backend, rank);
SAME_MEMBER(mlxdist_v1_backend, mlxdist_v3_backend, size);
SAME_MEMBER(mlxdist_v1_backend, mlxdist_v3_backend, device);
SAME_MEMBER(mlxdist_v1_ops, mlxdist_v3_ops, struct_size);
SAME_MEMBER(mlxdist_v1_ops, mlxdist_v3_ops, all_reduce);
SAME_MEMBER(mlxdist_v1_ops, mlxdist_v3_ops, all_gather);
SAME_MEMBER(mlxdist_v1_ops, mlxdist_v3_ops, reduce_scatter);
SAME_MEMBER(mlxdist_v1_ops, mlxdist_v3_ops, send);
SAME_MEMBER(mlxdist_v1_ops, mlxdist_v3_ops, recv);
SAME_MEMBER(mlxdist_v1_ops, mlxdist_v3_ops, split);
SAME_MEMBER(mlxdist_v1_ops, mlxdist_v3_ops, destroy);
SAME_MEMBER(mlxdist_v1_plugin, mlxdist_v3_plugin, struct_size);
SAME_MEMBER(mlxdist_v1_plugin, mlxdist_v3_plugin, version);
SAME_MEMBER(mlxdist_v1_plugin, mlxdist_v3_plugin, name);
SAME_MEMBER(mlxdist_v1_plugin, mlxdist_v3_plugin, is_available);
SAME_MEMBER(mlxdist_v1_plugin, mlxdist_v3_plugin, is_configured);
SAME_MEMBER(mlxdist_v1_plugin, mlxdist_v3_plugin, supports_bootstrap);
SAME_MEMBER(mlxdist_v1_plugin, mlxdist_v3_plugin, create);
_Static_assert(sizeof(mlxdist_v1_plugin) == sizeof(mlxdist_v3_plugin),
               "v2 and v3 added no plugin member");
_Static_assert(sizeof(mlxdist_v1_host) == sizeof(mlxdist_v3_host),
               "v2 and v3 added no host member");

SAME_MEMBER(mlxdist_v2_status, mlxdist_v3_status, code);
SAME_MEMBER(mlxdist_v2_status, mlxdist_v3_status, has_peer);
SAME_MEMBER(mlxdist_v2_status, mlxdist_v3_status, peer);
SAME_MEMBER(mlxdist_v2_status, mlxdist_v3_status, sys_errno);
SAME_MEMBER(mlxdist_v2_status, mlxdist_v3_status, msg);
SAME_MEMBER(mlxdist_v2_host, mlxdist_v3_host, struct_size);
SAME_MEMBER(mlxdist_v2_host, mlxdist_v3_host, version);
SAME_MEMBER(mlxdist_v2_host, mlxdist_v3_host, reduce);
SAME_MEMBER(mlxdist_v2_host, mlxdist_v3_host, dtype_size);
SAME_MEMBER(mlxdist_v2_host, mlxdist_v3_host, timeout_s);
SAME_MEMBER(mlxdist_v2_host, mlxdist_v3_host, spin_us);
SAME_MEMBER(mlxdist_v2_bootstrap, mlxdist_v3_bootstrap, struct_size);
SAME_MEMBER(mlxdist_v2_bootstrap, mlxdist_v3_bootstrap, rank);
SAME_MEMBER(mlxdist_v2_bootstrap, mlxdist_v3_bootstrap, size);
SAME_MEMBER(mlxdist_v2_bootstrap, mlxdist_v3_bootstrap, all_gather);
SAME_MEMBER(mlxdist_v2_backend, mlxdist_v3_backend, ops);
SAME_MEMBER(mlxdist_v2_backend, mlxdist_v3_backend, rank);
SAME_MEMBER(mlxdist_v2_backend, mlxdist_v3_backend, size);
SAME_MEMBER(mlxdist_v2_backend, mlxdist_v3_backend, device);
SAME_MEMBER(mlxdist_v2_ops, mlxdist_v3_ops, struct_size);
SAME_MEMBER(mlxdist_v2_ops, mlxdist_v3_ops, all_reduce);
SAME_MEMBER(mlxdist_v2_ops, mlxdist_v3_ops, all_gather);
SAME_MEMBER(mlxdist_v2_ops, mlxdist_v3_ops, reduce_scatter);
SAME_MEMBER(mlxdist_v2_ops, mlxdist_v3_ops, send);
SAME_MEMBER(mlxdist_v2_ops, mlxdist_v3_ops, recv);
SAME_MEMBER(mlxdist_v2_ops, mlxdist_v3_ops, split);
SAME_MEMBER(mlxdist_v2_ops, mlxdist_v3_ops, destroy);
SAME_MEMBER(mlxdist_v2_plugin, mlxdist_v3_plugin, struct_size);
SAME_MEMBER(mlxdist_v2_plugin, mlxdist_v3_plugin, version);
SAME_MEMBER(mlxdist_v2_plugin, mlxdist_v3_plugin, name);
SAME_MEMBER(mlxdist_v2_plugin, mlxdist_v3_plugin, is_available);
SAME_MEMBER(mlxdist_v2_plugin, mlxdist_v3_plugin, is_configured);
SAME_MEMBER(mlxdist_v2_plugin, mlxdist_v3_plugin, supports_bootstrap);
SAME_MEMBER(mlxdist_v2_plugin, mlxdist_v3_plugin, create);
SAME_MEMBER(mlxdist_v2_ops, mlxdist_v3_ops, describe);
_Static_assert(sizeof(mlxdist_v2_status) == sizeof(mlxdist_v3_status), "status size");
_Static_assert(sizeof(mlxdist_v2_plugin) == sizeof(mlxdist_v3_plugin), "v3 added no plugin member");
_Static_assert(sizeof(mlxdist_v2_host) == sizeof(mlxdist_v3_host), "v3 added no host member");
_Static_assert(sizeof(mlxdist_v2_bootstrap) == sizeof(mlxdist_v3_bootstrap),
               "v3 changed no bootstrap");
_Static_assert(sizeof(mlxdist_v2_backend) == sizeof(mlxdist_v3_backend), "v3 changed no backend");

/* Does member m of a table of type T fit in the table's struct_size? */
#define HAS_MEMBER(T, tab, m) ((tab)->struct_size >= offsetof(T, m) + sizeof((tab)->m))

/* ---- the host tables (one per version, same functions) ---- */

static void host_reduce(int32_t op, int32_t dtype, void* acc, const void* in, size_t count) {
  mlxd_reduce((mlxd_reduce_op)op, (mlx_dtype)dtype, acc, in, count);
}
static size_t host_dtype_size(int32_t dtype) {
  if (dtype < 0 || dtype >= MLXDIST_V3_DTYPE_COUNT) return 0;
  return mlx_dtype_size((mlx_dtype)dtype);
}
/* A plugin may call these from threads of its own, which mlxdist cannot mark
 * as its (util/env.h): they read the values kept at init, never getenv. */
static double host_timeout_s(void) { return mlxd_tunable_kept_double(MLXD_T_TIMEOUT); }
static double host_spin_us(void) { return mlxd_tunable_kept_double(MLXD_T_SPIN_US); }

static const mlxdist_v3_host k_host_v3 = {
    .struct_size = sizeof(mlxdist_v3_host),
    .version = MLXDIST_PLUGIN_V3_VERSION,
    .reduce = host_reduce,
    .dtype_size = host_dtype_size,
    .timeout_s = host_timeout_s,
    .spin_us = host_spin_us,
};
static const mlxdist_v2_host k_host_v2 = {
    .struct_size = sizeof(mlxdist_v2_host),
    .version = MLXDIST_PLUGIN_V3_VERSION, /* the highest this core speaks */
    .reduce = host_reduce,
    .dtype_size = host_dtype_size,
    .timeout_s = host_timeout_s,
    .spin_us = host_spin_us,
};
static const mlxdist_v1_host k_host_v1 = {
    .struct_size = sizeof(mlxdist_v1_host),
    .version = MLXDIST_PLUGIN_V3_VERSION, /* the highest this core speaks */
    .reduce = host_reduce,
    .dtype_size = host_dtype_size,
    .timeout_s = host_timeout_s,
    .spin_us = host_spin_us,
};

/* ---- loaded plugins ---- */

#define MAX_PLUGINS 8
#define PATH_MAX_TEXT 1024

typedef struct plugin_slot {
  mlxd_backend_kind kind; /* what the registry sees */
  mlxd_backend_ops ops;   /* the adapter's ops, named after the plugin */
  const mlxdist_v3_plugin* p;
  unsigned version; /* the ABI the plugin was loaded through (1, 2 or 3) */
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
  mlxdist_v3_backend* inner;
  bool has_describe;
  bool has_ref;       /* v3: the instance's ops table may hold the *_ref members (REF_OP) */
  struct bs_wrap* bs; /* owned: the bootstrap given to create, or NULL */
} adapted;

/* The core's bootstrap, as the plugin sees it. */
typedef struct bs_wrap {
  mlxdist_v3_bootstrap pub; /* first */
  mlxd_bootstrap* core;
} bs_wrap;

static void pstatus_clear(mlxdist_v3_status* ps) { memset(ps, 0, sizeof *ps); }

/* The plugin's failure as an mlxd_status (a plain one: the plugin's text is
 * final), with the peer and errno it reported. Returns the code. */
static int take_status(const plugin_slot* s, int32_t rc, mlxdist_v3_status* ps, mlxd_status* st) {
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

static int32_t bs_gather(mlxdist_v3_bootstrap* pub, void* dst, const void* src, size_t n,
                         mlxdist_v3_status* ps) {
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
  mlxdist_v3_status ps;
  pstatus_clear(&ps);
  int32_t rc = a->inner->ops->all_reduce(a->inner, seq, in, out, count, (mlxdist_v3_dtype)dtype,
                                         (mlxdist_v3_op)op, &ps);
  return take_status(a->slot, rc, &ps, st);
}

/* Plugin ABI v2 moves all_gather/send/recv data as bytes: the dtype stays here. */
static int a_all_gather(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t nbytes,
                        mlx_dtype dtype, mlxd_status* st) {
  (void)dtype;
  adapted* a = (adapted*)b;
  mlxdist_v3_status ps;
  pstatus_clear(&ps);
  int32_t rc = a->inner->ops->all_gather(a->inner, seq, in, out, nbytes, &ps);
  return take_status(a->slot, rc, &ps, st);
}

static int a_reduce_scatter(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t count,
                            mlx_dtype dtype, mlxd_reduce_op op, mlxd_status* st) {
  adapted* a = (adapted*)b;
  mlxdist_v3_status ps;
  pstatus_clear(&ps);
  int32_t rc = a->inner->ops->reduce_scatter(a->inner, seq, in, out, count, (mlxdist_v3_dtype)dtype,
                                             (mlxdist_v3_op)op, &ps);
  return take_status(a->slot, rc, &ps, st);
}

/* ABI v1-v3 have no all_to_all: refused by name, nothing sent, the group
 * stays usable (every rank refuses it alike, before any byte moves). */
static int a_all_to_all_none(mlxd_backend* b, uint64_t seq, const void* in, void* out,
                             size_t part_bytes, mlx_dtype dtype, mlxd_status* st) {
  (void)seq, (void)in, (void)out, (void)part_bytes, (void)dtype;
  const adapted* a = (const adapted*)b;
  return mlxd_fail(st, MLXD_EUNAVAIL,
                   "[%s] all_to_all is not supported by this plugin (%s speaks plugin ABI v%u; "
                   "all_to_all needs v4)",
                   a->slot->name, a->slot->path, a->slot->version);
}

static int a_send(mlxd_backend* b, uint64_t seq, const void* buf, size_t nbytes, mlx_dtype dtype,
                  int dst, mlxd_status* st) {
  (void)dtype;
  adapted* a = (adapted*)b;
  mlxdist_v3_status ps;
  pstatus_clear(&ps);
  int32_t rc = a->inner->ops->send(a->inner, seq, buf, nbytes, dst, &ps);
  return take_status(a->slot, rc, &ps, st);
}

static int a_recv(mlxd_backend* b, uint64_t seq, void* buf, size_t nbytes, mlx_dtype dtype, int src,
                  mlxd_status* st) {
  (void)dtype;
  adapted* a = (adapted*)b;
  mlxdist_v3_status ps;
  pstatus_clear(&ps);
  int32_t rc = a->inner->ops->recv(a->inner, seq, buf, nbytes, src, &ps);
  return take_status(a->slot, rc, &ps, st);
}

/* ---- ABI v3: the ops that are told the arrays (backend.h's *_ref) ---- */

/* A hold (mlxdist_v3_hold) is the op's two arrays, retained: word[0] in,
 * word[1] out (either may be NULL). Taking it is two atomic increments. */
static void ref_hold(const mlxdist_v3_bufref* ref, mlxdist_v3_hold* h) {
  const mlxd_op_arrays* arr = ref->ctx;
  memset(h, 0, sizeof *h);
  h->word[0] = mlxd_array_retain(arr->in);
  h->word[1] = mlxd_array_retain(arr->out);
}
static void ref_release(mlxdist_v3_hold* h) {
  mlxd_array_release(h->word[0]);
  mlxd_array_release(h->word[1]);
  memset(h, 0, sizeof *h);
}
static mlxdist_v3_bufref make_ref(const mlxd_op_arrays* arr) {
  return (mlxdist_v3_bufref){.struct_size = (uint32_t)sizeof(mlxdist_v3_bufref),
                             .ctx = (void*)(uintptr_t)arr,
                             .hold = ref_hold,
                             .release = ref_release};
}
/* The instance's *_ref op m, or NULL (absent: the plain op is called). */
#define REF_OP(a, m) \
  ((a)->has_ref && HAS_MEMBER(mlxdist_v3_ops, (a)->inner->ops, m) ? (a)->inner->ops->m : NULL)

static int a_all_reduce_ref(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t count,
                            mlx_dtype dtype, mlxd_reduce_op op, const mlxd_op_arrays* arr,
                            mlxd_status* st) {
  adapted* a = (adapted*)b;
  if (!REF_OP(a, all_reduce_ref)) return a_all_reduce(b, seq, in, out, count, dtype, op, st);
  mlxdist_v3_status ps;
  pstatus_clear(&ps);
  mlxdist_v3_bufref ref = make_ref(arr);
  int32_t rc = a->inner->ops->all_reduce_ref(a->inner, seq, in, out, count, (mlxdist_v3_dtype)dtype,
                                             (mlxdist_v3_op)op, &ref, &ps);
  return take_status(a->slot, rc, &ps, st);
}

static int a_all_gather_ref(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t nbytes,
                            mlx_dtype dtype, const mlxd_op_arrays* arr, mlxd_status* st) {
  adapted* a = (adapted*)b;
  if (!REF_OP(a, all_gather_ref)) return a_all_gather(b, seq, in, out, nbytes, dtype, st);
  mlxdist_v3_status ps;
  pstatus_clear(&ps);
  mlxdist_v3_bufref ref = make_ref(arr);
  int32_t rc = a->inner->ops->all_gather_ref(a->inner, seq, in, out, nbytes, &ref, &ps);
  return take_status(a->slot, rc, &ps, st);
}

static int a_reduce_scatter_ref(mlxd_backend* b, uint64_t seq, const void* in, void* out,
                                size_t count, mlx_dtype dtype, mlxd_reduce_op op,
                                const mlxd_op_arrays* arr, mlxd_status* st) {
  adapted* a = (adapted*)b;
  if (!REF_OP(a, reduce_scatter_ref))
    return a_reduce_scatter(b, seq, in, out, count, dtype, op, st);
  mlxdist_v3_status ps;
  pstatus_clear(&ps);
  mlxdist_v3_bufref ref = make_ref(arr);
  int32_t rc =
      a->inner->ops->reduce_scatter_ref(a->inner, seq, in, out, count, (mlxdist_v3_dtype)dtype,
                                        (mlxdist_v3_op)op, &ref, &ps);
  return take_status(a->slot, rc, &ps, st);
}

static int a_send_ref(mlxd_backend* b, uint64_t seq, const void* buf, size_t nbytes,
                      mlx_dtype dtype, int dst, const mlxd_op_arrays* arr, mlxd_status* st) {
  adapted* a = (adapted*)b;
  if (!REF_OP(a, send_ref)) return a_send(b, seq, buf, nbytes, dtype, dst, st);
  mlxdist_v3_status ps;
  pstatus_clear(&ps);
  mlxdist_v3_bufref ref = make_ref(arr);
  int32_t rc = a->inner->ops->send_ref(a->inner, seq, buf, nbytes, dst, &ref, &ps);
  return take_status(a->slot, rc, &ps, st);
}

static int a_recv_ref(mlxd_backend* b, uint64_t seq, void* buf, size_t nbytes, mlx_dtype dtype,
                      int src, const mlxd_op_arrays* arr, mlxd_status* st) {
  adapted* a = (adapted*)b;
  if (!REF_OP(a, recv_ref)) return a_recv(b, seq, buf, nbytes, dtype, src, st);
  mlxdist_v3_status ps;
  pstatus_clear(&ps);
  mlxdist_v3_bufref ref = make_ref(arr);
  int32_t rc = a->inner->ops->recv_ref(a->inner, seq, buf, nbytes, src, &ref, &ps);
  return take_status(a->slot, rc, &ps, st);
}

static int wrap(const plugin_slot* s, mlxdist_v3_backend* inner, bs_wrap* bs, mlxd_backend** out,
                mlxd_status* st);

static int a_split(mlxd_backend* b, uint64_t seq, int color, int key, mlxd_backend** out,
                   mlxd_status* st) {
  adapted* a = (adapted*)b;
  *out = NULL;
  mlxdist_v3_status ps;
  pstatus_clear(&ps);
  mlxdist_v3_backend* inner = NULL;
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
static int wrap(const plugin_slot* s, mlxdist_v3_backend* inner, bs_wrap* bs, mlxd_backend** out,
                mlxd_status* st) {
  *out = NULL;
  int rc = 0;
  if (!inner) {
    rc = mlxd_fail(st, MLXD_EINVAL, "[%s] the plugin %s reported success but gave no instance",
                   s->name, s->path);
    goto fail;
  }
  const mlxdist_v3_ops* ops = inner->ops;
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
  if (!ops->all_reduce || !ops->all_gather || !ops->reduce_scatter || !ops->send || !ops->recv ||
      !ops->split) {
    rc = mlxd_fail(st, MLXD_EINVAL,
                   "[%s] the plugin %s gave an instance whose ops table lacks a required op "
                   "(struct_size %u)",
                   s->name, s->path, ops->struct_size);
    goto fail;
  }
  if (inner->size < 1 || inner->rank < 0 || inner->rank >= inner->size ||
      (inner->device != MLXDIST_V3_DEVICE_CPU && inner->device != MLXDIST_V3_DEVICE_GPU)) {
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
      s->version >= 2 && HAS_MEMBER(mlxdist_v3_ops, ops, describe) && ops->describe != NULL;
  /* v3's *_ref ops: each one the table holds and sets is used (REF_OP). */
  a->has_ref = s->version >= 3;
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
  mlxdist_v3_status ps;
  pstatus_clear(&ps);
  mlxdist_v3_backend* inner = NULL;
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
  unsigned version = 3;
  dlerror();
  void* sym = dlsym(handle, MLXDIST_PLUGIN_V3_SYMBOL);
  if (!sym) {
    version = 2;
    dlerror();
    sym = dlsym(handle, MLXDIST_PLUGIN_V2_SYMBOL);
  }
  if (!sym) {
    version = 1;
    dlerror();
    sym = dlsym(handle, MLXDIST_PLUGIN_V1_SYMBOL);
  }
  if (!sym) {
    mlxd_text_add(t, "%s (exports none of %s, %s, %s: not an mlxdist plugin)", path,
                  MLXDIST_PLUGIN_V3_SYMBOL, MLXDIST_PLUGIN_V2_SYMBOL, MLXDIST_PLUGIN_V1_SYMBOL);
    return NULL;
  }
  const mlxdist_v3_plugin* p;
  if (version == 3) {
    mlxdist_v3_entry entry;
    memcpy(&entry, &sym, sizeof entry); /* object pointer to function pointer */
    p = entry(&k_host_v3);
  } else if (version == 2) {
    mlxdist_v2_entry entry;
    memcpy(&entry, &sym, sizeof entry);
    /* Read through the v3 type: v2 is its prefix (asserted above). */
    p = (const mlxdist_v3_plugin*)(const void*)entry(&k_host_v2);
  } else {
    mlxdist_v1_entry entry;
    memcpy(&entry, &sym, sizeof entry);
    /* Read through the v3 type: v1 is its prefix (asserted above). */
    p = (const mlxdist_v3_plugin*)(const void*)entry(&k_host_v1);
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
      .abort = NULL, /* the plugin ABI has no abort; the mpi plugin bounds its exit itself */
      /* v3: the ops told the arrays (each falls back to the plain op when the
       * instance's table lacks it) */
      .all_reduce_ref = version >= 3 ? a_all_reduce_ref : NULL,
      .all_gather_ref = version >= 3 ? a_all_gather_ref : NULL,
      .reduce_scatter_ref = version >= 3 ? a_reduce_scatter_ref : NULL,
      .send_ref = version >= 3 ? a_send_ref : NULL,
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
