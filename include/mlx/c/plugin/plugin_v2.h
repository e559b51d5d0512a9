/* mlxdist backend plugin ABI, version 2: version 1 plus the describe op.
 *
 * FROZEN. Never edit this file: plugins built against it are loaded by
 * every later libmlxdist. A change is a new file, plugin_v<N+1>.h
 * (docs/plugin-abi.md says how). It includes only the C standard headers
 * below, so a plugin needs nothing else from mlxdist to build.
 *
 * A plugin is a shared object libmlxdist-<name>.so that exports
 *
 *   const mlxdist_v2_plugin* mlxdist_plugin_v2(const mlxdist_v2_host* host);
 *
 * It returns its table, or NULL when it cannot work with this host (then it
 * is not used). It does not link libmlxdist: what it needs from the core
 * (reduction kernels, dtype sizes, tunables) comes through the host table.
 *
 * Tables. Every table starts with struct_size (sizeof the table as the
 * side that filled it was built), so a reader can tell which members
 * exist: a member that does not fit in struct_size is absent. Fill tables
 * with designated initialisers.
 *
 * The contract of the ops (what the core guarantees, what a plugin must do):
 *  - The core calls ops only on instances of size >= 2 (a group of one never
 *    reaches a plugin), with a dtype in MLXDIST_V2_DTYPE_*, an op in
 *    MLXDIST_V2_OP_*, a peer in [0, size) other than the caller's rank, and
 *    byte counts (count * dtype size, nbytes * size) that fit in size_t.
 *    A plugin may assert these; it need not report them.
 *  - Several threads may call ops on one instance at once. Each op carries a
 *    sequence number: collectives and split get consecutive numbers from the
 *    group's counter, in the order the caller queued them (the same on every
 *    rank); send/recv get consecutive numbers per peer and direction (the
 *    k-th send to dst matches the k-th recv from src on dst).
 *  - Every op returns 0, or an MLXDIST_V2_E* code with st filled (msg is
 *    the whole text users see, e.g. "[mpi] MPI_Isend failed: ..."). No op
 *    may block without a bound.
 *  - destroy releases everything and never blocks unbounded. */
#ifndef MLXDIST_PLUGIN_V2_H
#define MLXDIST_PLUGIN_V2_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MLXDIST_PLUGIN_V2_SYMBOL "mlxdist_plugin_v2"
#define MLXDIST_PLUGIN_V2_VERSION 2u

/* Status codes (0 = success). */
enum {
  MLXDIST_V2_OK = 0,
  MLXDIST_V2_EINVAL = 1,    /* bad argument or configuration */
  MLXDIST_V2_ETIMEDOUT = 2, /* a bounded wait ran out */
  MLXDIST_V2_EREMOTE = 3,   /* a peer closed, reset or died */
  MLXDIST_V2_ESYS = 4,      /* a system call failed (sys_errno says how) */
  MLXDIST_V2_ENOMEM = 5,    /* allocation failed */
  MLXDIST_V2_EUNAVAIL = 6,  /* not available / not configured */
  MLXDIST_V2_EABORTED = 7,  /* the group failed earlier; this op was not attempted */
  MLXDIST_V2_ECALLBACK = 8, /* the caller's all-gather callback failed (bootstrap) */
};

/* Element types (fixed values; mlx-c's mlx_dtype). */
typedef int32_t mlxdist_v2_dtype;
enum {
  MLXDIST_V2_DTYPE_BOOL = 0,
  MLXDIST_V2_DTYPE_UINT8 = 1,
  MLXDIST_V2_DTYPE_UINT16 = 2,
  MLXDIST_V2_DTYPE_UINT32 = 3,
  MLXDIST_V2_DTYPE_UINT64 = 4,
  MLXDIST_V2_DTYPE_INT8 = 5,
  MLXDIST_V2_DTYPE_INT16 = 6,
  MLXDIST_V2_DTYPE_INT32 = 7,
  MLXDIST_V2_DTYPE_INT64 = 8,
  MLXDIST_V2_DTYPE_FLOAT16 = 9,
  MLXDIST_V2_DTYPE_FLOAT32 = 10,
  MLXDIST_V2_DTYPE_FLOAT64 = 11,
  MLXDIST_V2_DTYPE_BFLOAT16 = 12,
  MLXDIST_V2_DTYPE_COMPLEX64 = 13,
  MLXDIST_V2_DTYPE_COUNT = 14,
};

/* Reduction ops. */
typedef int32_t mlxdist_v2_op;
enum {
  MLXDIST_V2_OP_SUM = 0,
  MLXDIST_V2_OP_MAX = 1,
  MLXDIST_V2_OP_MIN = 2,
  MLXDIST_V2_OP_COUNT = 3
};

/* Where an instance's ops run. */
enum { MLXDIST_V2_DEVICE_CPU = 0, MLXDIST_V2_DEVICE_GPU = 1 };

#define MLXDIST_V2_MSG_MAX 512

/* The status of one call, filled by the plugin on failure. The core hands
 * every op a zeroed status; all-zero means "no failure, nothing known". */
typedef struct mlxdist_v2_status {
  int32_t code;                 /* MLXDIST_V2_OK or MLXDIST_V2_E* */
  int32_t has_peer;             /* 1: peer is set (e.g. the rank that was lost) */
  int32_t peer;                 /* the peer rank involved */
  int32_t sys_errno;            /* errno of a failed system call, or 0 */
  char msg[MLXDIST_V2_MSG_MAX]; /* the whole text, "[name] ..."; NUL-terminated */
} mlxdist_v2_status;

/* What the core lends the plugin. Filled by the core. */
typedef struct mlxdist_v2_host {
  uint32_t struct_size; /* sizeof(mlxdist_v2_host) as the core was built */
  uint32_t version;     /* the highest ABI version the core speaks (>= 1) */
  /* acc[i] = acc[i] OP in[i] for i < count (mlxdist's kernels: bool sum is or,
   * float16/bfloat16 through float32, complex max/min by real then imaginary). */
  void (*reduce)(mlxdist_v2_op op, mlxdist_v2_dtype dtype, void* acc, const void* in, size_t count);
  size_t (*dtype_size)(mlxdist_v2_dtype dtype); /* 0 for an unknown dtype */
  double (*timeout_s)(void);                    /* MLXDIST_TIMEOUT */
  double (*spin_us)(void);                      /* MLXDIST_SPIN_US */
} mlxdist_v2_host;

/* An out-of-band all-gather (the caller's callback of init_with_all_gather),
 * given to create when the plugin supports it. The plugin sets rank and size
 * before its first call; every rank calls it in the same sequence with the
 * same n; dst receives size * n bytes, rank r's src at r * n. It stays valid
 * until the instance created with it (and every split of it) is destroyed,
 * but may only be called on the thread that is inside create or split. */
typedef struct mlxdist_v2_bootstrap {
  uint32_t struct_size; /* sizeof(mlxdist_v2_bootstrap), filled by the core */
  int32_t rank;         /* set by the plugin */
  int32_t size;         /* set by the plugin */
  int32_t (*all_gather)(struct mlxdist_v2_bootstrap* bs, void* dst, const void* src, size_t n,
                        mlxdist_v2_status* st);
} mlxdist_v2_bootstrap;

struct mlxdist_v2_ops;

/* One instance (one group). Plugins embed it as the first member of their own
 * struct and keep rank, size and device constant for its life. */
typedef struct mlxdist_v2_backend {
  const struct mlxdist_v2_ops* ops;
  int32_t rank;
  int32_t size;
  int32_t device; /* MLXDIST_V2_DEVICE_* */
} mlxdist_v2_backend;

/* The ops of an instance (all required, describe included). */
typedef struct mlxdist_v2_ops {
  uint32_t struct_size; /* sizeof(mlxdist_v2_ops) as the plugin was built */
  /* out[i] = OP over ranks of in[i]; in == out allowed. */
  int32_t (*all_reduce)(mlxdist_v2_backend* b, uint64_t seq, const void* in, void* out,
                        size_t count, mlxdist_v2_dtype dtype, mlxdist_v2_op op,
                        mlxdist_v2_status* st);
  /* out = concatenation over ranks of in (nbytes each). */
  int32_t (*all_gather)(mlxdist_v2_backend* b, uint64_t seq, const void* in, void* out,
                        size_t nbytes, mlxdist_v2_status* st);
  /* in has size * count elements; out (count) = block `rank` of the all_reduce. */
  int32_t (*reduce_scatter)(mlxdist_v2_backend* b, uint64_t seq, const void* in, void* out,
                            size_t count, mlxdist_v2_dtype dtype, mlxdist_v2_op op,
                            mlxdist_v2_status* st);
  int32_t (*send)(mlxdist_v2_backend* b, uint64_t seq, const void* buf, size_t nbytes, int32_t dst,
                  mlxdist_v2_status* st);
  int32_t (*recv)(mlxdist_v2_backend* b, uint64_t seq, void* buf, size_t nbytes, int32_t src,
                  mlxdist_v2_status* st);
  /* Collective over b: ranks with the same color (>= 0) form *out, ordered by
   * (key, parent rank); key is never negative (the core passes the parent
   * rank for a negative key). *out may have size 1. */
  int32_t (*split)(mlxdist_v2_backend* b, uint64_t seq, int32_t color, int32_t key,
                   mlxdist_v2_backend** out, mlxdist_v2_status* st);
  void (*destroy)(mlxdist_v2_backend* b);
  /* New in v2. One line (no newline) describing the instance for people:
   * the library behind it, its version and mode, e.g. "Open MPI v4.1.4,
   * MPI_THREAD_MULTIPLE, communicator of 2". Always NUL-terminates buf
   * (len > 0); truncates to fit; never fails or blocks. mlxdist-info
   * prints it. */
  void (*describe)(mlxdist_v2_backend* b, char* buf, size_t len);
} mlxdist_v2_ops;

/* What the plugin offers. Returned by mlxdist_plugin_v2. */
typedef struct mlxdist_v2_plugin {
  uint32_t struct_size; /* sizeof(mlxdist_v2_plugin) as the plugin was built */
  uint32_t version;     /* MLXDIST_PLUGIN_V2_VERSION */
  const char* name;     /* the backend's name, e.g. "mpi" (must match the file name) */
  /* Can it be used in this process at all? If not, a sentence saying why. */
  bool (*is_available)(char* why, size_t why_len);
  /* Is its launch configuration present (with a caller's all-gather or not)? */
  bool (*is_configured)(bool with_bootstrap);
  /* Whether create accepts a non-NULL bootstrap. */
  bool supports_bootstrap;
  /* Start an instance. bs == NULL: the plugin's own side channel. When not
   * configured it starts nothing and returns MLXDIST_V2_EUNAVAIL naming what
   * is missing. */
  int32_t (*create)(mlxdist_v2_bootstrap* bs, mlxdist_v2_backend** out, mlxdist_v2_status* st);
} mlxdist_v2_plugin;

typedef const mlxdist_v2_plugin* (*mlxdist_v2_entry)(const mlxdist_v2_host* host);

#endif
