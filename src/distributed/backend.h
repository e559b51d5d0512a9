/* Private: the interface every backend implements (ring, mpi, size-one, ...).
 *
 * A backend instance is one group. The front-end (distributed/group.c)
 * owns instances and calls them from stream worker threads; several
 * workers may call one instance concurrently, so ops are told their
 * sequence number: collectives (and split) get consecutive numbers from
 * the group's counter in the order the caller queued them (the same on
 * every rank); send/recv get consecutive numbers per peer and direction
 * (the k-th send to dst matches the k-th recv from src on dst). Backends
 * use them to keep concurrent ops apart (tags) or to order them.
 *
 * Every op returns 0, or a non-zero mlxd_code with a status the backend has
 * rendered once at its boundary (mlxd_status_render: "[ring] all_sum #17:
 * lost connection to rank 2 (...)"). No op blocks without a bound.
 *
 * The front-end's guarantees (one owner per rule: distributed/ops.c and
 * group.c check these, on the caller's thread, before any op is queued;
 * backends, algorithms and transports may assert them and must not
 * re-check them with their own error messages):
 *  - size >= 2: a group of one always holds the size-one backend
 *    (single.c, the only code for groups of one), so no other backend's ops
 *    are called on an instance of size 1 (split may still return one; the
 *    front-end then swaps it for the size-one backend).
 *  - send/recv: the peer is in [0, size) and is not the caller's rank.
 *  - dtype is a valid mlx_dtype (mlx_dtype_size > 0) and op is one of
 *    MLXD_SUM, MLXD_MAX, MLXD_MIN.
 *  - byte counts fit in size_t: count * dtype size, nbytes * size (the
 *    all_gather output) and size * count * dtype size (the reduce_scatter
 *    input) do not overflow; all_to_all's input is size parts of equal
 *    bytes; buffers are at least that large (non-NULL
 *    when non-empty).
 *  - split: color >= 0 and key >= 0.
 * Plugins get the same guarantees (mlx/c/plugin/plugin_v<N>.h). */
#ifndef MLXD_BACKEND_H
#define MLXD_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mlx/c/array.h"
#include "mlx/c/device.h"
#include "reduce/reduce.h"
#include "util/status.h"

typedef struct mlxd_backend mlxd_backend;
struct mlxd_array;

/* The arrays behind an op's buffers, for the *_ref ops: in (NULL for recv)
 * and out (for send: the pending result over in's memory). The stream task
 * running the op holds both until the op returns; a backend that may still
 * use their memory after it returns keeps them alive with
 * mlxd_array_retain / mlxd_array_release (core/array_impl.h). */
typedef struct mlxd_op_arrays {
  struct mlxd_array* in;
  struct mlxd_array* out;
  /* The stream the op runs on (core/stream_impl.h: its device and native
   * handle, which plugin ABI v4 passes on to a GPU plugin). */
  struct mlxd_stream* stream;
} mlxd_op_arrays;

typedef struct mlxd_backend_ops {
  const char* name; /* "ring", "mpi", "single" ... */
  /* out[i] = OP over ranks of in[i]; in == out allowed. */
  int (*all_reduce)(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t count,
                    mlx_dtype dtype, mlxd_reduce_op op, mlxd_status* st);
  /* out = concat over ranks of in (nbytes each). dtype (here and in
   * send/recv): the element type the caller passed, for checks and messages
   * only (the data moves as bytes). */
  int (*all_gather)(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t nbytes,
                    mlx_dtype dtype, mlxd_status* st);
  /* in has size*count elements; out (count) = block `rank` of the all_reduce. */
  int (*reduce_scatter)(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t count,
                        mlx_dtype dtype, mlxd_reduce_op op, mlxd_status* st);
  /* in and out hold size parts of part_bytes each (distinct buffers, never
   * overlapping): part j of in goes to rank j, part i of out comes from
   * rank i (this rank's own part is copied). A backend that cannot run it
   * (a plugin of ABI v1-v3) says so through op_supported, so it is never
   * queued; if called anyway it fails with MLXD_EUNAVAIL naming itself. */
  int (*all_to_all)(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t part_bytes,
                    mlx_dtype dtype, mlxd_status* st);
  int (*send)(mlxd_backend* b, uint64_t seq, const void* buf, size_t nbytes, mlx_dtype dtype,
              int dst, mlxd_status* st);
  int (*recv)(mlxd_backend* b, uint64_t seq, void* buf, size_t nbytes, mlx_dtype dtype, int src,
              mlxd_status* st);
  /* Collective over b: ranks with the same color form *out, ordered by
   * (key, parent rank); the front-end passes key = parent rank when the
   * caller's key is negative. */
  int (*split)(mlxd_backend* b, uint64_t seq, int color, int key, mlxd_backend** out,
               mlxd_status* st);
  /* Release everything (sockets, threads, communicators). Never blocks unbounded. */
  void (*destroy)(mlxd_backend* b);
  /* Fail the group for good with st (code and detail; the backend renders
   * its own "[name] op #seq: " before it): every pending and later op
   * returns at once with it, and the peers are told where the backend can
   * (ring: the transport's abort). Any thread, concurrently with ops; never
   * blocks beyond a lock; not after destroy. NULL: the backend cannot
   * interrupt its ops (the size-one backend has nothing to wait for). Used
   * when the process exits with ops pending (group.c). */
  void (*abort)(mlxd_backend* b, const mlxd_status* st);
  /* Optional (NULL: distributed/ops.c calls the op of the same name above).
   * The same ops, also told the arrays behind their buffers (arr; in and out
   * are distinct arrays, so the buffers never overlap), for a backend that
   * hands the caller's memory to a transport which may still use it after
   * the op returned (the mpi plugin after a timeout): it retains the arrays
   * before returning and releases them once the transport is done (the
   * release may free the memory and run a managed array's destructor: no
   * backend lock held then). Contract otherwise as the plain op. Today only
   * plugins of ABI v3 and v4 (plugin_adapter.c) set them. */
  int (*all_reduce_ref)(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t count,
                        mlx_dtype dtype, mlxd_reduce_op op, const mlxd_op_arrays* arr,
                        mlxd_status* st);
  int (*all_gather_ref)(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t nbytes,
                        mlx_dtype dtype, const mlxd_op_arrays* arr, mlxd_status* st);
  int (*reduce_scatter_ref)(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t count,
                            mlx_dtype dtype, mlxd_reduce_op op, const mlxd_op_arrays* arr,
                            mlxd_status* st);
  int (*all_to_all_ref)(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t part_bytes,
                        mlx_dtype dtype, const mlxd_op_arrays* arr, mlxd_status* st);
  int (*send_ref)(mlxd_backend* b, uint64_t seq, const void* buf, size_t nbytes, mlx_dtype dtype,
                  int dst, const mlxd_op_arrays* arr, mlxd_status* st);
  int (*recv_ref)(mlxd_backend* b, uint64_t seq, void* buf, size_t nbytes, mlx_dtype dtype, int src,
                  const mlxd_op_arrays* arr, mlxd_status* st);
  /* Optional (NULL: every op is supported). 0 when this instance runs the
   * op named (today distributed/ops.c asks only for "all_to_all"), else
   * MLXD_EUNAVAIL with st saying why, naming the backend. Asked on the
   * caller's thread before a sequence number is taken, so a refused call
   * costs no number: a number the backend never sees would stall a backend
   * that issues collectives in number order (the mpi plugin's turnstile).
   * Never blocks; the answer never changes for an instance. */
  int (*op_supported)(const mlxd_backend* b, const char* op, mlxd_status* st);
  /* Optional (NULL: nothing to close). In a child made by fork(), from its
   * pthread_atfork handler (one thread; async-signal-safe calls only, no
   * lock taken): close the child's copies of this instance's descriptors
   * (ring: the transport's forget, transport.h), with no shutdown() and no
   * byte sent, so that the child holds none of the parent's connections.
   * The child never calls another op of the instance, destroy included:
   * group.c keeps it, unused (core/fork.h). */
  void (*forget)(mlxd_backend* b);
} mlxd_backend_ops;

/* Implementations embed this as their first member. */
struct mlxd_backend {
  const mlxd_backend_ops* ops;
  int rank;
  int size;
  mlx_device_type comm_device; /* where the backend's ops run: MLX_CPU for ring/mpi */
};

/* An out-of-band all-gather used to bootstrap a backend (the caller's
 * callback for init_with_all_gather). The backend sets rank and size
 * before its first call; every rank must call it in the same sequence
 * with the same n. dst receives size*n bytes, rank r's src at r*n. */
typedef struct mlxd_bootstrap mlxd_bootstrap;
struct mlxd_bootstrap {
  int rank;
  int size;
  int (*all_gather)(mlxd_bootstrap* bs, void* dst, const void* src, size_t n, mlxd_status* st);
};

/* A backend kind, as the registry sees it (built-in kinds are defined with
 * it; plugins are adapted to it, distributed/plugin_adapter.c). */
typedef struct mlxd_backend_kind {
  const char* name;
  /* Can it be used in this process at all? If not, why (a sentence). */
  bool (*is_available)(char* why, size_t why_len);
  /* Is its launch configuration present (e.g. MLX_RANK + MLX_HOSTFILE)?
   * init("any") starts only configured kinds; false must mean that create
   * would fail for lack of configuration. */
  bool (*is_configured)(bool with_bootstrap);
  /* Start it. bs == NULL: the built-in side channel. Returns MLXD_EUNAVAIL
   * with a message naming what is missing when not configured. */
  int (*create)(mlxd_bootstrap* bs, mlxd_backend** out, mlxd_status* st);
  /* Whether create accepts a non-NULL bootstrap. */
  bool supports_bootstrap;
  /* true: when is_available is false, an init by this kind's name (or a
   * strict init("any")) still calls create, which then fails naming the
   * configuration's error first and only then why the kind cannot be used
   * here (jaccl). A non-strict init("any") skips an unavailable kind either
   * way. false: is_available's reason is the init error. */
  bool diagnose_unavailable;
} mlxd_backend_kind;

/* During a built-in kind's create, on its thread: true when init("any") is
 * trying kinds in order, false when the kind was asked for by name. A
 * configuration that would take a launch away from a later kind (the ring
 * over PMIx, which mpirun also gives the mpi backend) is used by name only. */
bool mlxd_init_for_any(void);

/* Built-in kinds (the registry, distributed/registry.c, lists every backend). */
extern const mlxd_backend_kind mlxd_ring_kind; /* backends/ring/ring.c */
/* The size-one backend (rank 0, size 1); NULL only when out of memory. */
mlxd_backend* mlxd_single_backend_new(void);
/* Its ops table (to recognise it). */
const mlxd_backend_ops* mlxd_single_ops(void);

#endif
