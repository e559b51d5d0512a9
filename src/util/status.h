/* Private: the status of one operation, filled where it fails.
 *
 * Two kinds of failure share this struct:
 *  - plain (layer == MLXD_LAYER_NONE): msg is the whole text users see,
 *    e.g. from the front-end or the core ("mlx_array is empty");
 *  - structured (layer != NONE): the layer that detected the failure
 *    (a transport, the algorithms, a backend's bootstrap) fills the fields
 *    it knows and a short detail in msg, without any "[tag]" prefix. The
 *    backend that owns the group renders the text once, at its boundary,
 *    with mlxd_status_render(); lower layers never format each other's
 *    messages and nothing re-parses text.
 *
 * Rendered form (each piece only when set):
 *   [<tag>] <op> #<seq> on rank S: <detail> (<peer_addr>; <syscall>: <strerror>; reported by rank R)
 * ("[<tag>] rank S: <detail> ..." without an op). S, this process's rank in
 * the group, is for backends whose ranks' output is interleaved by their
 * launcher (mpirun); the ring leaves it unset.
 * The detail names the peer in prose where the sentence needs it ("lost
 * connection to rank 2"); the peer field is there for programs (liveness,
 * mismatch reports), not for re-parsing.
 *
 * A status is zero-initialised ({0}) or cleared with mlxd_status_clear(). */
#ifndef MLXD_STATUS_H
#define MLXD_STATUS_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum mlxd_code {
  MLXD_OK = 0,
  MLXD_EINVAL,    /* bad argument or configuration */
  MLXD_ETIMEDOUT, /* a bounded wait ran out */
  MLXD_EREMOTE,   /* a peer closed, reset or died */
  MLXD_ESYS,      /* a system call failed (syscall/sys_errno say which) */
  MLXD_ENOMEM,    /* allocation failed */
  MLXD_EUNAVAIL,  /* backend / device / plugin not available */
  MLXD_EABORTED,  /* the group failed earlier; this op was not attempted */
  MLXD_ECALLBACK, /* the caller's callback returned non-zero */
} mlxd_code;

/* Where a structured failure was detected. */
typedef enum mlxd_layer {
  MLXD_LAYER_NONE = 0,  /* plain: msg is the final text */
  MLXD_LAYER_TCP,       /* transport/tcp.c */
  MLXD_LAYER_SHM,       /* transport/shm.c */
  MLXD_LAYER_ALGO,      /* algo/ */
  MLXD_LAYER_BOOTSTRAP, /* a backend's connection set-up (hostfile, connect, records) */
  MLXD_LAYER_BACKEND,   /* a backend's own logic */
  MLXD_LAYER_VERBS, /* transport/verbs.c and rdma/ (added last: values travel in failure records) */
} mlxd_layer;
#define MLXD_LAYER_LAST MLXD_LAYER_VERBS

#define MLXD_MSG_MAX 512
#define MLXD_ADDR_MAX 64

typedef struct mlxd_status {
  int code;                      /* mlxd_code; 0 = success */
  int layer;                     /* mlxd_layer */
  bool rendered;                 /* msg already holds the final text */
  bool has_peer;                 /* peer is set */
  bool has_reporter;             /* reporter is set: another rank saw it first */
  bool has_self;                 /* self is set */
  int peer;                      /* the peer rank involved */
  int reporter;                  /* the rank that first detected the failure */
  int self;                      /* the rank that renders it (this process's) */
  int sys_errno;                 /* errno of the failing system call; 0 = none */
  const char* syscall;           /* static name of that call ("recv"); NULL = none */
  const char* op;                /* static name of the operation ("all_sum"); NULL = none */
  uint64_t seq;                  /* its sequence number (when op is set) */
  char peer_addr[MLXD_ADDR_MAX]; /* "10.0.0.2:41000"; "" = unknown */
  char msg[MLXD_MSG_MAX];        /* plain: the text; structured: the detail */
} mlxd_status;

/* Plain failure: set code and the whole printf-style text; returns code
 * (so: return mlxd_fail(...)). */
int mlxd_fail(mlxd_status* st, int code, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
int mlxd_vfail(mlxd_status* st, int code, const char* fmt, va_list ap);

/* Structured failure: code, layer and the detail; the other fields are
 * reset (set them after with the setters below). Returns code. */
int mlxd_fail_at(mlxd_status* st, int code, mlxd_layer layer, const char* fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Setters for the fields of a structured failure (no-ops on NULL st). */
void mlxd_status_set_peer(mlxd_status* st, int peer, const char* addr);
void mlxd_status_set_sys(mlxd_status* st, const char* syscall, int err);
void mlxd_status_set_op(mlxd_status* st, const char* op, uint64_t seq);
void mlxd_status_set_reporter(mlxd_status* st, int reporter);
void mlxd_status_set_self(mlxd_status* st, int self);

/* Render a structured status into its final text in msg, prefixed "[tag]".
 * Idempotent; a plain status is left as it is. */
void mlxd_status_render(mlxd_status* st, const char* tag);

static inline void mlxd_status_clear(mlxd_status* st) { *st = (mlxd_status){0}; }
/* The same for every reader (each field cleared, both texts empty) without
 * writing the text buffers past their first byte: for the hot path, where
 * a status is set up for every op and filled only when one fails. */
static inline void mlxd_status_reset(mlxd_status* st) {
  st->code = 0;
  st->layer = 0;
  st->rendered = st->has_peer = st->has_reporter = st->has_self = false;
  st->peer = st->reporter = st->self = st->sys_errno = 0;
  st->syscall = st->op = NULL;
  st->seq = 0;
  st->peer_addr[0] = '\0';
  st->msg[0] = '\0';
}

#endif
