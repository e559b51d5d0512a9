/* mlxdist backend plugin ABI, version 4: version 3 plus one op for every
 * data movement, run(b, call, st), told what each op is by a descriptor
 * (mlxdist_v4_call: its kind, sequence number, dtype, reduction, count,
 * peer, the input and output buffers with their memory kind, the arrays
 * behind them and the native handle of the caller's stream), the kinds an
 * instance runs that way (run_kinds, which brings all_to_all) and
 * abort(b, reason). A later op is a new kind value and members appended to
 * the descriptor, never a new entry point.
 *
 * FROZEN. Never edit this file: plugins built against it are loaded by
 * every later libmlxdist. A change is a new file, plugin_v<N+1>.h
 * (docs/plugin-abi.md says how). It includes only the C standard headers
 * below, so a plugin needs nothing else from mlxdist to build.
 *
 * A plugin is a shared object libmlxdist-<name>.so that exports
 *
 *   const mlxdist_v4_plugin* mlxdist_plugin_v4(const mlxdist_v4_host* host);
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
 *    reaches a plugin), with a dtype in MLXDIST_V4_DTYPE_*, an op in
 *    MLXDIST_V4_OP_*, a peer in [0, size) other than the caller's rank, and
 *    byte counts (count * dtype size, nbytes * size) that fit in size_t.
 *    A plugin may assert these; it need not report them.
 *  - Several threads may call ops on one instance at once. Each op carries a
 *    sequence number: collectives and split get consecutive numbers from the
 *    group's counter, in the order the caller queued them (the same on every
 *    rank); send/recv get consecutive numbers per peer and direction (the
 *    k-th send to dst matches the k-th recv from src on dst). The numbers
 *    have no gaps: a call the core refuses itself (all_to_all on an
 *    instance whose run does not take it) takes none.
 *  - Every op returns 0, or an MLXDIST_V4_E* code with st filled (msg is
 *    the whole text users see, e.g. "[mpi] MPI_Isend failed: ..."). No op
 *    may block without a bound.
 *  - destroy releases everything and never blocks unbounded. */
#ifndef MLXDIST_PLUGIN_V4_H
#define MLXDIST_PLUGIN_V4_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MLXDIST_PLUGIN_V4_SYMBOL "mlxdist_plugin_v4"
#define MLXDIST_PLUGIN_V4_VERSION 4u

/* Status codes (0 = success). */
enum {
  MLXDIST_V4_OK = 0,
  MLXDIST_V4_EINVAL = 1,    /* bad argument or configuration */
  MLXDIST_V4_ETIMEDOUT = 2, /* a bounded wait ran out */
  MLXDIST_V4_EREMOTE = 3,   /* a peer closed, reset or died */
  MLXDIST_V4_ESYS = 4,      /* a system call failed (sys_errno says how) */
  MLXDIST_V4_ENOMEM = 5,    /* allocation failed */
  MLXDIST_V4_EUNAVAIL = 6,  /* not available / not configured */
  MLXDIST_V4_EABORTED = 7,  /* the group failed earlier; this op was not attempted */
  MLXDIST_V4_ECALLBACK = 8, /* the caller's all-gather callback failed (bootstrap) */
};

/* Element types (fixed values; mlx-c's mlx_dtype). */
typedef int32_t mlxdist_v4_dtype;
enum {
  MLXDIST_V4_DTYPE_BOOL = 0,
  MLXDIST_V4_DTYPE_UINT8 = 1,
  MLXDIST_V4_DTYPE_UINT16 = 2,
  MLXDIST_V4_DTYPE_UINT32 = 3,
  MLXDIST_V4_DTYPE_UINT64 = 4,
  MLXDIST_V4_DTYPE_INT8 = 5,
  MLXDIST_V4_DTYPE_INT16 = 6,
  MLXDIST_V4_DTYPE_INT32 = 7,
  MLXDIST_V4_DTYPE_INT64 = 8,
  MLXDIST_V4_DTYPE_FLOAT16 = 9,
  MLXDIST_V4_DTYPE_FLOAT32 = 10,
  MLXDIST_V4_DTYPE_FLOAT64 = 11,
  MLXDIST_V4_DTYPE_BFLOAT16 = 12,
  MLXDIST_V4_DTYPE_COMPLEX64 = 13,
  MLXDIST_V4_DTYPE_COUNT = 14,
};

/* Reduction ops. */
typedef int32_t mlxdist_v4_op;
enum {
  MLXDIST_V4_OP_SUM = 0,
  MLXDIST_V4_OP_MAX = 1,
  MLXDIST_V4_OP_MIN = 2,
  MLXDIST_V4_OP_COUNT = 3
};

/* Where an instance's ops run. */
enum { MLXDIST_V4_DEVICE_CPU = 0, MLXDIST_V4_DEVICE_GPU = 1 };

#define MLXDIST_V4_MSG_MAX 512

/* The status of one call, filled by the plugin on failure. The core hands
 * every op a zeroed status; all-zero means "no failure, nothing known". */
typedef struct mlxdist_v4_status {
  int32_t code;                 /* MLXDIST_V4_OK or MLXDIST_V4_E* */
  int32_t has_peer;             /* 1: peer is set (e.g. the rank that was lost) */
  int32_t peer;                 /* the peer rank involved */
  int32_t sys_errno;            /* errno of a failed system call, or 0 */
  char msg[MLXDIST_V4_MSG_MAX]; /* the whole text, "[name] ..."; NUL-terminated */
} mlxdist_v4_status;

/* What the core lends the plugin. Filled by the core. */
typedef struct mlxdist_v4_host {
  uint32_t struct_size; /* sizeof(mlxdist_v4_host) as the core was built */
  uint32_t version;     /* the highest ABI version the core speaks (>= 1) */
  /* acc[i] = acc[i] OP in[i] for i < count (mlxdist's kernels: bool sum is or,
   * float16/bfloat16 through float32, complex max/min by real then imaginary). */
  void (*reduce)(mlxdist_v4_op op, mlxdist_v4_dtype dtype, void* acc, const void* in, size_t count);
  size_t (*dtype_size)(mlxdist_v4_dtype dtype); /* 0 for an unknown dtype */
  double (*timeout_s)(void);                    /* MLXDIST_TIMEOUT */
  double (*spin_us)(void);                      /* MLXDIST_SPIN_US */
} mlxdist_v4_host;

/* An out-of-band all-gather (the caller's callback of init_with_all_gather),
 * given to create when the plugin supports it. The plugin sets rank and size
 * before its first call; every rank calls it in the same sequence with the
 * same n; dst receives size * n bytes, rank r's src at r * n. It stays valid
 * until the instance created with it (and every split of it) is destroyed,
 * but may only be called on the thread that is inside create or split. */
typedef struct mlxdist_v4_bootstrap {
  uint32_t struct_size; /* sizeof(mlxdist_v4_bootstrap), filled by the core */
  int32_t rank;         /* set by the plugin */
  int32_t size;         /* set by the plugin */
  int32_t (*all_gather)(struct mlxdist_v4_bootstrap* bs, void* dst, const void* src, size_t n,
                        mlxdist_v4_status* st);
} mlxdist_v4_bootstrap;

struct mlxdist_v4_ops;

/* New in v3. A hold on the buffers of one op: the host's words, opaque to
 * the plugin, which stores it by value (copy it freely; release it once). */
#define MLXDIST_V4_HOLD_WORDS 4
typedef struct mlxdist_v4_hold {
  void* word[MLXDIST_V4_HOLD_WORDS];
} mlxdist_v4_hold;

/* New in v3. The arrays behind one op's buffers (in and out), given to the
 * *_ref ops and to run. The buffers are the caller's memory; they are valid while the
 * op runs and, under a hold, until the hold is released (the host keeps the
 * arrays alive: their memory is not freed, unmapped or handed to another
 * array, whatever the caller does with its arrays meanwhile). The caller
 * does not write them while a hold is taken: the input is immutable, the
 * output of an op that failed is never read. The table itself (and ctx) is
 * valid only until the op returns. */
typedef struct mlxdist_v4_bufref {
  uint32_t struct_size; /* sizeof(mlxdist_v4_bufref), filled by the core */
  void* ctx;            /* the host's; the plugin passes the table back untouched */
  /* Take a hold on every buffer of the op into *h. Only while the op has not
   * returned (any thread); may be called more than once, each hold released
   * once. Never fails and never blocks: no lock, no allocation (an atomic
   * increment per array); never calls into the plugin. */
  void (*hold)(const struct mlxdist_v4_bufref* ref, mlxdist_v4_hold* h);
  /* Release a hold (*h is not used afterwards). Any thread, any time: after
   * the op returned, after the instance was destroyed, at exit. It may free
   * the memory and run the destructor the caller gave a managed array (the
   * caller's code), so the plugin calls it holding none of its own locks.
   * Never fails; takes only the host's allocator locks. A hold that is never
   * released is a leak, never an error (the plugin's choice when its
   * transport never completes). */
  void (*release)(mlxdist_v4_hold* h);
} mlxdist_v4_bufref;

/* New in v4. What one call of run does. Values are fixed; later headers
 * add kinds after these (never renumbered). */
typedef int32_t mlxdist_v4_kind;
enum {
  MLXDIST_V4_KIND_ALL_REDUCE = 0,     /* out[i] = reduce over ranks of in[i] */
  MLXDIST_V4_KIND_ALL_GATHER = 1,     /* out = every rank's in, in rank order */
  MLXDIST_V4_KIND_REDUCE_SCATTER = 2, /* out = block `rank` of the all_reduce of in */
  MLXDIST_V4_KIND_SEND = 3,           /* in to peer */
  MLXDIST_V4_KIND_RECV = 4,           /* out from peer */
  MLXDIST_V4_KIND_ALL_TO_ALL = 5,     /* part j of in to rank j; part i of out from rank i */
  MLXDIST_V4_KIND_COUNT = 6           /* the kinds this header names (at most 64 ever) */
};
/* The bit of run_kinds (mlxdist_v4_ops) that says run handles kind k. */
#define MLXDIST_V4_KIND_BIT(k) ((uint64_t)1 << (k))

/* New in v4. Where a buffer's memory is. */
typedef int32_t mlxdist_v4_mem;
enum {
  MLXDIST_V4_MEM_HOST = 0,    /* host memory (pageable or pinned); device is -1 */
  MLXDIST_V4_MEM_MANAGED = 1, /* CUDA managed memory, addressable by the host and the
                                 GPUs; device: the GPU it was allocated on */
  MLXDIST_V4_MEM_DEVICE = 2,  /* memory of GPU `device` only: the host must not touch it */
  MLXDIST_V4_MEM_COUNT = 3    /* the kinds this header names; later headers may add more */
};

/* New in v4. One buffer of a call. */
typedef struct mlxdist_v4_buf {
  void* data;          /* NULL only when bytes == 0; an input is never written */
  size_t bytes;        /* its size (the table in mlxdist_v4_call) */
  mlxdist_v4_mem mem;  /* MLXDIST_V4_MEM_* */
  int32_t device;      /* the GPU's index for MANAGED and DEVICE, -1 for HOST */
} mlxdist_v4_buf;

/* New in v4. The descriptor of one op, filled by the core, valid (like
 * everything it points to except the buffers under a hold) only until run
 * returns. count is the elements of one rank's block; with the group's
 * size n and b = count * dtype size:
 *
 *   kind            in.bytes   out.bytes  peer
 *   ALL_REDUCE      b          b          -1
 *   ALL_GATHER      b          n * b      -1   (rank r's in at r * b)
 *   REDUCE_SCATTER  n * b      b          -1
 *   ALL_TO_ALL      n * b      n * b      -1   (part j of in goes to rank j;
 *                                               part i of out came from rank i)
 *   SEND            b          0          the destination
 *   RECV            0          b          the source
 *
 * The empty buffer of SEND and RECV has data NULL. in and out are distinct
 * arrays and never overlap; ref is the arrays behind them, held and released
 * exactly as for the *_ref ops (for SEND it also holds the op's result). A
 * later header appends members here: a plugin reads a member only when it
 * fits in struct_size, and a core never sets a member a plugin cannot
 * know of to a value that changes what an older member means. */
typedef struct mlxdist_v4_call {
  uint32_t struct_size;   /* sizeof(mlxdist_v4_call) as the core was built */
  mlxdist_v4_kind kind;   /* always one whose bit is in the instance's run_kinds */
  uint64_t seq;           /* the op's sequence number (as the other ops') */
  mlxdist_v4_dtype dtype; /* the element type (data of every kind moves as bytes
                             except where reduced; the dtype is for checks too) */
  mlxdist_v4_op reduce;   /* ALL_REDUCE, REDUCE_SCATTER: the reduction; SUM otherwise */
  size_t count;           /* elements of one rank's block (above) */
  int32_t peer;           /* SEND, RECV: the other rank; -1 otherwise */
  int32_t stream_device;  /* the GPU of stream; -1 for a CPU stream */
  /* The native handle of the stream the caller queued the op on: a
   * cudaStream_t for a GPU stream, NULL for a CPU stream. A GPU plugin may
   * queue its work on it (after whatever the caller queued there before)
   * instead of a stream of its own. */
  void* stream;
  mlxdist_v4_buf in;
  mlxdist_v4_buf out;
  const mlxdist_v4_bufref* ref;
} mlxdist_v4_call;

/* One instance (one group). Plugins embed it as the first member of their own
 * struct and keep rank, size and device constant for its life. */
typedef struct mlxdist_v4_backend {
  const struct mlxdist_v4_ops* ops;
  int32_t rank;
  int32_t size;
  int32_t device; /* MLXDIST_V4_DEVICE_* */
} mlxdist_v4_backend;

/* The ops of an instance. split and destroy are required; so is each data
 * op up to recv unless run_kinds names its kind (then it may be NULL); the
 * rest is optional. */
typedef struct mlxdist_v4_ops {
  uint32_t struct_size; /* sizeof(mlxdist_v4_ops) as the plugin was built */
  /* out[i] = OP over ranks of in[i]; in == out allowed. */
  int32_t (*all_reduce)(mlxdist_v4_backend* b, uint64_t seq, const void* in, void* out,
                        size_t count, mlxdist_v4_dtype dtype, mlxdist_v4_op op,
                        mlxdist_v4_status* st);
  /* out = concatenation over ranks of in (nbytes each). */
  int32_t (*all_gather)(mlxdist_v4_backend* b, uint64_t seq, const void* in, void* out,
                        size_t nbytes, mlxdist_v4_status* st);
  /* in has size * count elements; out (count) = block `rank` of the all_reduce. */
  int32_t (*reduce_scatter)(mlxdist_v4_backend* b, uint64_t seq, const void* in, void* out,
                            size_t count, mlxdist_v4_dtype dtype, mlxdist_v4_op op,
                            mlxdist_v4_status* st);
  int32_t (*send)(mlxdist_v4_backend* b, uint64_t seq, const void* buf, size_t nbytes, int32_t dst,
                  mlxdist_v4_status* st);
  int32_t (*recv)(mlxdist_v4_backend* b, uint64_t seq, void* buf, size_t nbytes, int32_t src,
                  mlxdist_v4_status* st);
  /* Collective over b: ranks with the same color (>= 0) form *out, ordered by
   * (key, parent rank); key is never negative (the core passes the parent
   * rank for a negative key). *out may have size 1. */
  int32_t (*split)(mlxdist_v4_backend* b, uint64_t seq, int32_t color, int32_t key,
                   mlxdist_v4_backend** out, mlxdist_v4_status* st);
  void (*destroy)(mlxdist_v4_backend* b);
  /* New in v2. One line (no newline) describing the instance for people:
   * the library behind it, its version and mode, e.g. "Open MPI v4.1.4,
   * MPI_THREAD_MULTIPLE, communicator of 2". Always NUL-terminates buf
   * (len > 0); truncates to fit; never fails or blocks. mlxdist-info
   * prints it. */
  void (*describe)(mlxdist_v4_backend* b, char* buf, size_t len);
  /* New in v3, each optional: NULL (or beyond struct_size) and the core calls
   * the op above of the same name instead. The same ops, also given ref,
   * the arrays behind in/out (buf for send and recv). A plugin may hand in
   * and out to its transport directly (no copy), but whenever it returns
   * while the transport may still read in or write out (a timed-out MPI
   * request, which MPI cannot cancel; a send completed in the background),
   * it must first take a hold (ref->hold) and release it once the
   * transport is done with the memory (ref->release, with none of its locks
   * held). The core guarantees that in and out are distinct arrays that do
   * not overlap, and the contract of the plain op otherwise holds: several
   * threads may call at once; each may block, bounded by MLXDIST_TIMEOUT
   * (the host's timeout_s), taking only the plugin's own locks; it returns
   * 0, or MLXDIST_V4_ETIMEDOUT (the wait ran out: the group is failed),
   * MLXDIST_V4_EREMOTE (the transport failed), MLXDIST_V4_ENOMEM,
   * MLXDIST_V4_EABORTED (the group failed earlier), MLXDIST_V4_EUNAVAIL
   * (exiting) or MLXDIST_V4_EINVAL, with st filled. */
  int32_t (*all_reduce_ref)(mlxdist_v4_backend* b, uint64_t seq, const void* in, void* out,
                            size_t count, mlxdist_v4_dtype dtype, mlxdist_v4_op op,
                            const mlxdist_v4_bufref* ref, mlxdist_v4_status* st);
  int32_t (*all_gather_ref)(mlxdist_v4_backend* b, uint64_t seq, const void* in, void* out,
                            size_t nbytes, const mlxdist_v4_bufref* ref, mlxdist_v4_status* st);
  int32_t (*reduce_scatter_ref)(mlxdist_v4_backend* b, uint64_t seq, const void* in, void* out,
                                size_t count, mlxdist_v4_dtype dtype, mlxdist_v4_op op,
                                const mlxdist_v4_bufref* ref, mlxdist_v4_status* st);
  /* buf is the input array's memory; ref holds it (and the result). */
  int32_t (*send_ref)(mlxdist_v4_backend* b, uint64_t seq, const void* buf, size_t nbytes,
                      int32_t dst, const mlxdist_v4_bufref* ref, mlxdist_v4_status* st);
  /* buf is the result array's memory. */
  int32_t (*recv_ref)(mlxdist_v4_backend* b, uint64_t seq, void* buf, size_t nbytes, int32_t src,
                      const mlxdist_v4_bufref* ref, mlxdist_v4_status* st);
  /* New in v4. The kinds run handles: MLXDIST_V4_KIND_BIT(k) for each kind
   * k. The core calls run for those kinds only, and the member op above of
   * the same name for the others (for a kind with no such member, such as
   * ALL_TO_ALL, it refuses the call itself with MLXDIST_V4_EUNAVAIL, "not
   * supported by this plugin", and nothing is sent). 0 (or beyond
   * struct_size): run is never called. */
  uint64_t run_kinds;
  /* New in v4, optional (required when run_kinds is not 0). Run one op as
   * the descriptor says, under the contract of the *_ref ops: several
   * threads at once; bounded by MLXDIST_TIMEOUT; returns 0 once the result
   * is complete in out (for a GPU stream: the work queued on call->stream
   * has finished), or an MLXDIST_V4_E* code with st filled, naming the op
   * and its number. A buffer in a memory kind the plugin cannot address
   * (MLXDIST_V4_MEM_DEVICE for a plugin that moves host memory) is
   * MLXDIST_V4_EINVAL naming it, before anything is sent. */
  int32_t (*run)(mlxdist_v4_backend* b, const mlxdist_v4_call* call, mlxdist_v4_status* st);
  /* New in v4, optional. Fail the instance for good: ops running now return
   * promptly and every later op at once, with MLXDIST_V4_EABORTED and a
   * message that contains reason (one line, valid during the call only);
   * the peers are told where the transport can (ncclCommAbort). Any
   * thread, concurrently with ops; never blocks beyond a short lock; never
   * after destroy, which still follows. The core calls it when the process
   * exits with ops of the instance still pending. */
  void (*abort)(mlxdist_v4_backend* b, const char* reason);
} mlxdist_v4_ops;

/* What the plugin offers. Returned by mlxdist_plugin_v4. */
typedef struct mlxdist_v4_plugin {
  uint32_t struct_size; /* sizeof(mlxdist_v4_plugin) as the plugin was built */
  uint32_t version;     /* MLXDIST_PLUGIN_V4_VERSION */
  const char* name;     /* the backend's name, e.g. "mpi" (must match the file name) */
  /* Can it be used in this process at all? If not, a sentence saying why. */
  bool (*is_available)(char* why, size_t why_len);
  /* Is its launch configuration present (with a caller's all-gather or not)? */
  bool (*is_configured)(bool with_bootstrap);
  /* Whether create accepts a non-NULL bootstrap. */
  bool supports_bootstrap;
  /* Start an instance. bs == NULL: the plugin's own side channel. When not
   * configured it starts nothing and returns MLXDIST_V4_EUNAVAIL naming what
   * is missing. */
  int32_t (*create)(mlxdist_v4_bootstrap* bs, mlxdist_v4_backend** out, mlxdist_v4_status* st);
} mlxdist_v4_plugin;

typedef const mlxdist_v4_plugin* (*mlxdist_v4_entry)(const mlxdist_v4_host* host);

#endif
