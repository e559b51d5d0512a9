/* Private: the part of a backend that runs the ops over one transport with
 * the collective algorithms of src/algo, shared by the backends built that
 * way (ring and jaccl: the transport the router chose, transport/router.h:
 * tcp, shm, verbs, or the composite of several, "mixed").
 *
 * A backend embeds mlxd_xgroup as the first member of its instance and puts
 * the mlxd_xg_* ops below into its ops table; the ops cast the instance to
 * mlxd_xgroup. What differs per backend is only the tag its messages are
 * rendered with ("[ring] all_sum #17: ...", "[jaccl] all_sum #17: ..."),
 * whether it has a two-level host map, and its own set-up, split and
 * destroy. */
#ifndef MLXD_XGROUP_H
#define MLXD_XGROUP_H

#include <stdbool.h>
#include <stdint.h>

#include "distributed/backend.h"
#include "transport/transport.h"

struct mlxd_hier;

typedef struct mlxd_xgroup {
  mlxd_backend base;      /* first: the front-end's view */
  const char* tag;        /* "ring", "jaccl": the prefix of every rendered message */
  mlxd_transport* t;      /* NULL only when size == 1 (no op is called then) */
  struct mlxd_hier* hier; /* the two-level collectives' host map (algo/hier.h), NULL: flat */
  bool verbose;           /* a line per collective on stderr naming its algorithm */
} mlxd_xgroup;

/* The boundary of such a backend: 0 stays 0; otherwise st gets the op's name
 * and sequence number (when op is not NULL) and is rendered once with tag.
 * A failure without a status (a callback, an older layer) gets a plain
 * message. Returns st->code. */
int mlxd_xg_done(const char* tag, int rc, mlxd_status* st, const char* op, uint64_t seq);
/* The names users call the reductions by (mlx_distributed_*): "all_sum", ... */
const char* mlxd_xg_reduce_name(mlxd_reduce_op op);
/* What this rank is calling, for every message of the op (transport.h). */
mlxd_sig mlxd_xg_sig(const mlxd_backend* b, mlxd_sig_op op, mlx_dtype dtype, size_t count);

/* The ops (backend.h's contract; b is an mlxd_xgroup with size >= 2). They
 * block only inside the transport's bounded waits. */
int mlxd_xg_all_reduce(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t count,
                       mlx_dtype dtype, mlxd_reduce_op op, mlxd_status* st);
int mlxd_xg_all_gather(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t nbytes,
                       mlx_dtype dtype, mlxd_status* st);
int mlxd_xg_reduce_scatter(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t count,
                           mlx_dtype dtype, mlxd_reduce_op op, mlxd_status* st);
int mlxd_xg_all_to_all(mlxd_backend* b, uint64_t seq, const void* in, void* out, size_t part_bytes,
                       mlx_dtype dtype, mlxd_status* st);
int mlxd_xg_send(mlxd_backend* b, uint64_t seq, const void* buf, size_t nbytes, mlx_dtype dtype,
                 int dst, mlxd_status* st);
int mlxd_xg_recv(mlxd_backend* b, uint64_t seq, void* buf, size_t nbytes, mlx_dtype dtype, int src,
                 mlxd_status* st);
/* The transport fails every pending op and tells the peers (its abort). */
void mlxd_xg_abort(mlxd_backend* b, const mlxd_status* st);
/* In a forked child: close the copies of the transport's descriptors. */
void mlxd_xg_forget(mlxd_backend* b);

#endif
