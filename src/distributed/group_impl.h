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
 * one), so the caller's dtor can run on that thread.
 *
 * A group belongs to the process that made it (core/fork.h). In a child
 * made by fork() the atfork handler closes the child's copies of every
 * live group's descriptors (the backend's forget op); every use of such a
 * group there fails at once (mlxd_group_refuse), and its last release
 * there only forgets it: no backend destroy (which would shut the parent's
 * connections down), no dtor, no parent release, nothing freed. */
#ifndef MLXD_GROUP_IMPL_H
#define MLXD_GROUP_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/fork.h"
#include "core/stream_impl.h"
#include "distributed/backend.h"
#include "mlx/c/distributed_group.h"
#include "util/status.h"

/* The caller's all-gather of init_with_all_gather, as an mlxd_bootstrap. */
typedef struct mlxd_user_gather mlxd_user_gather;

typedef struct mlxd_group {
  atomic_int refs;
  mlxd_backend* backend;     /* owned */
  const char* kind;          /* "ring", "mpi", "single", ... (static string) */
  mlxd_user_gather* gather;  /* kept bootstrap, or NULL (one reference) */
  struct mlxd_group* parent; /* the group this one was split from, or NULL (one reference) */
  mlxd_stream*
      comm_stream; /* mlxd_default_stream(backend->comm_device); NULL if that device is unavailable */
  /* Sequence numbers (backend.h). An op takes its number under its
   * stream's lock as its task joins the queue (ops.c, op_queued), so that
   * every stream sees one group's work in seq order; atomic, as two streams
   * of one group hold two different locks (split takes one too). */
  _Atomic uint64_t coll_seq;  /* collectives and split */
  _Atomic uint64_t* send_seq; /* size entries, per destination */
  _Atomic uint64_t* recv_seq; /* size entries, per source */
  /* The operation record (core/oprec.h) and teardown at exit. */
  unsigned id; /* 1, 2, ... in the order groups were made (the record's g<id>) */
  /* Ops queued and finished (ops.c); queued - finished are pending. queued
   * is raised as a task joins its queue (before it can finish), finished
   * with an atomic add from whichever thread ends the task. */
  _Atomic uint64_t queued, finished;
  pid_t pid;                                /* the process that made it (core/fork.h) */
  bool aborted;                             /* under group.c's list mutex: abort was called */
  struct mlxd_group *live_prev, *live_next; /* the process's live groups (group.c) */
} mlxd_group;

static inline mlxd_group* mlxd_group_of(mlx_distributed_group h) { return (mlxd_group*)h.ctx; }
static inline mlx_distributed_group mlxd_group_handle(mlxd_group* g) {
  mlx_distributed_group h = {g};
  return h;
}

mlxd_group* mlxd_group_retain(mlxd_group* g);
/* Whether g was made by another process (this is a forked child's copy). */
static inline bool mlxd_group_foreign(const mlxd_group* g) { return mlxd_fork_foreign(g->pid); }
/* The failure of op on a foreign group, reported and returned (MLXD_EINVAL):
 * "[ring] all_sum #3: this group was made by process 1234; process 1240 (a
 * fork of it) cannot use it: ...". numbered: op takes a collective number
 * (shown as the next one); else (send, recv) no number. */
int mlxd_group_refuse(const mlxd_group* g, const char* op, bool numbered);
/* At process exit, after the streams had a short time to drain: abort
 * (backend abort op) every live group that still has ops pending, so they
 * fail at once ("[ring] recv #3: the group was closed with this operation
 * pending") instead of holding the exit for MLXDIST_TIMEOUT; their peers'
 * operations fail naming this rank. Groups with nothing pending are left
 * alone (their peers may still be finishing an op this rank completed). */
void mlxd_groups_abort_pending(void);
void mlxd_group_release(mlxd_group* g);

/* The default group for an op given an empty handle: what a non-strict
 * init("any") gives (the cached group, or a new try that falls back to a
 * size-one group). Returns a new reference; never NULL except on ENOMEM
 * (then st is set). Reports nothing. */
mlxd_group* mlxd_group_default(mlxd_status* st);

/* ---- the backend registry (distributed/registry.c) ----
 *
 * One table, one entry per backend name. Everything the front-end decides
 * about a backend comes from its entry and its kind (backend.h): whether it
 * can be used (is_available), whether its launch configuration is present
 * (is_configured: "any" only starts configured backends), whether it takes
 * the caller's all-gather (supports_bootstrap) and how to start it
 * (create). Adding a backend is adding an entry. */
typedef struct mlxd_registry_entry {
  const char* name;
  /* Built in: its kind. NULL: a plugin, libmlxdist-<name>.so, loaded on first use. */
  const mlxd_backend_kind* builtin;
  /* Position in init("any") (1 = tried first; 0 = never tried by "any"),
   * without and with a caller's all-gather (spec: nccl, ring, mpi, jaccl;
   * with an all-gather, jaccl before ring). */
  int any_order;
  int any_order_gather;
} mlxd_registry_entry;

#define MLXD_REGISTRY_MAX 16 /* entries at most (checked in registry.c) */

extern const mlxd_registry_entry mlxd_registry[];
extern const int mlxd_registry_size;

/* Index of a backend name: an entry of mlxd_registry, or a plugin of
 * another name added by mlxd_registry_add_plugin (indices
 * mlxd_registry_size .. MLXD_REGISTRY_MAX - 1); -1 for neither. */
int mlxd_registry_find(const char* name);
/* The name of an index of mlxd_registry_find (a static string). */
const char* mlxd_registry_name(int idx);
/* A backend out of the tree: a name outside mlxd_registry, loaded as the
 * plugin libmlxdist-<name>.so (docs/plugin-abi.md). Returns its index (the
 * same one every time), or -1 with why set: a name that cannot be a plugin's
 * (1-23 characters of a-z, 0-9, '_', '-', starting with a letter or digit),
 * no plugin of that name in the search path (every path tried), or no room
 * for another. Such a backend is started only by its name, never by "any". */
int mlxd_registry_add_plugin(const char* name, char* why, size_t why_len);
/* The entry's kind (loading its plugin the first time), or NULL with why set. */
const mlxd_backend_kind* mlxd_registry_kind(int idx, char* why, size_t why_len);
/* The entries "any" tries, in order, into idx (at most mlxd_registry_size);
 * returns how many. */
int mlxd_registry_any_order(bool with_gather, int* idx);

/* Built-in kinds whose backend may be missing here (backends/nccl/nccl_kind.c:
 * the nccl plugin; backends/jaccl/jaccl.c); they
 * still report is_configured honestly and explain why in is_available. */
extern const mlxd_backend_kind mlxd_nccl_kind;
extern const mlxd_backend_kind mlxd_jaccl_kind;

/* Whether this process can use a GPU (nccl needs one). */
bool mlxd_gpu_usable(void);

/* One line about a group for people: "mpi, rank 0 of 2: <the backend's
 * description>" (plugins: their describe op, built-in backends: "built in"). */
void mlxd_group_describe(const mlxd_group* g, char* buf, size_t len);

#endif
