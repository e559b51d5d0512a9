/* Private: what an mlx_distributed_group handle points to, and the
 * front-end's registry of backend kinds (distributed/group.c).
 *
 * A group is ref-counted. It owns one backend instance and destroys it
 * when the last reference goes. Lifetimes, in the order they end:
 *   1. the backend (backend->ops->destroy),
 *   2. the parent group, for a group made by split: a split backend may use
 *      its parent's resources, so the parent backend is destroyed only after
 *      every group split from it,
 *   3. the kept bootstrap (init_with_all_gather): a backend may keep the
 *      mlxd_bootstrap* it was created with (e.g. to use it again in split),
 *      so the caller's callback stays valid until the backend is gone, and
 *      dtor(payload) runs right after.
 * The last reference may be dropped by a stream worker (a queued op holds
 * one), so the caller's dtor can run on that thread. */
#ifndef MLXD_GROUP_IMPL_H
#define MLXD_GROUP_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "core/status.h"
#include "core/stream_impl.h"
#include "distributed/backend.h"
#include "mlx/c/distributed_group.h"

/* The caller's all-gather of init_with_all_gather, as an mlxd_bootstrap. */
typedef struct mlxd_user_gather mlxd_user_gather;

typedef struct mlxd_group {
  atomic_int refs;
  mlxd_backend* backend;      /* owned */
  const char* kind;           /* "ring", "mpi", "single", ... (static string) */
  mlxd_user_gather* gather;   /* kept bootstrap, or NULL (one reference) */
  struct mlxd_group* parent;  /* the group this one was split from, or NULL (one reference) */
  mlxd_stream* comm_stream;   /* mlxd_default_stream(backend->comm_device); NULL if that device is unavailable */
  /* Sequence numbers (backend.h). Ops take them and queue their task while
   * holding mu, so that every stream sees one group's work in seq order. */
  pthread_mutex_t mu;
  uint64_t coll_seq;          /* collectives and split */
  uint64_t* send_seq;         /* size entries, per destination */
  uint64_t* recv_seq;         /* size entries, per source */
} mlxd_group;

static inline mlxd_group* mlxd_group_of(mlx_distributed_group h) { return (mlxd_group*)h.ctx; }
static inline mlx_distributed_group mlxd_group_handle(mlxd_group* g) {
  mlx_distributed_group h = {g};
  return h;
}

mlxd_group* mlxd_group_retain(mlxd_group* g);
void mlxd_group_release(mlxd_group* g);

/* The default group for an op given an empty handle: what a non-strict
 * init("any") gives (the cached group, or a new try that falls back to a
 * size-one group). Returns a new reference; never NULL except on ENOMEM
 * (then st is set). Reports nothing. */
mlxd_group* mlxd_group_default(mlxd_status* st);

/* Built-in kinds that this build cannot start (distributed/kinds.c); they
 * still report is_configured honestly and explain why in is_available. */
extern const mlxd_backend_kind mlxd_nccl_kind;
extern const mlxd_backend_kind mlxd_jaccl_kind;

/* Whether this process can use a GPU (nccl needs one). */
bool mlxd_gpu_usable(void);

#endif
