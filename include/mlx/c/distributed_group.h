/* mlxdist: distributed groups (mlx-c's distributed_group.h, with the
 * additions of the maintainers' thread: clear_backends, init with a
 * caller-supplied all-gather, status-returning rank/size getters). */
#ifndef MLX_DISTRIBUTED_GROUP_H
#define MLX_DISTRIBUTED_GROUP_H

#include <stdbool.h>
#include <stddef.h>

#include "mlx/c/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A group of processes. ctx == NULL is the empty handle (for ops: the default group). */
typedef struct mlx_distributed_group_ {
  void* ctx;
} mlx_distributed_group;

/** An empty handle. */
MLXDIST_API mlx_distributed_group mlx_distributed_group_new(void);
/** Release one reference; the backend's resources go with the last one. */
MLXDIST_API int mlx_distributed_group_free(mlx_distributed_group group);

/**
 * Start (or return the cached group of) backend bk: "any" (also NULL),
 * "ring", "mpi", "nccl" or "jaccl". strict: failure is an error naming
 * what was missing; non-strict: failure gives a size-one group (rank 0,
 * size 1) that is not cached.
 */
MLXDIST_API int mlx_distributed_init(
    mlx_distributed_group* res,
    bool strict,
    const char* bk);

/**
 * Like mlx_distributed_init, but the backend exchanges its bootstrap data
 * through all_gather instead of its built-in side channel ("ring", "jaccl"
 * and "any"). all_gather must fill dst (size * n_bytes bytes) so that bytes
 * [r*n_bytes, (r+1)*n_bytes) hold rank r's src, and return 0; non-zero fails
 * the init. It is called from the calling thread, in the same sequence on
 * every rank. dtor(payload) (dtor may be NULL) runs exactly once: at once
 * when the callback is not kept, else when the last group keeping it goes.
 */
MLXDIST_API int mlx_distributed_init_with_all_gather(
    mlx_distributed_group* res,
    bool strict,
    const char* bk,
    int (*all_gather)(
        void* dst,
        const void* src,
        size_t n_bytes,
        int rank,
        int size,
        void* payload),
    void* payload,
    void (*dtor)(void* payload));

/** Forget every cached group. Held handles stay valid until freed. */
MLXDIST_API int mlx_distributed_clear_backends(void);

/** *res = the rank of this process in group. */
MLXDIST_API int mlx_distributed_group_get_rank(
    int* res,
    mlx_distributed_group group);
/** *res = the number of processes in group. */
MLXDIST_API int mlx_distributed_group_get_size(
    int* res,
    mlx_distributed_group group);
/** mlx-c legacy getter: the rank, 0 on error. */
MLXDIST_API int mlx_distributed_group_rank(mlx_distributed_group group);
/** mlx-c legacy getter: the size, 0 on error. */
MLXDIST_API int mlx_distributed_group_size(mlx_distributed_group group);

/**
 * Collective over group: processes passing the same color form a new group,
 * ordered by key (a negative key keeps the parent's rank order).
 */
MLXDIST_API int mlx_distributed_group_split(
    mlx_distributed_group* res,
    mlx_distributed_group group,
    int color,
    int key);

/** Whether backend bk ("any"/NULL, "ring", "mpi", "nccl", "jaccl") can be used in this process. */
MLXDIST_API bool mlx_distributed_is_available(const char* bk);

#ifdef __cplusplus
}
#endif
#endif /* MLX_DISTRIBUTED_GROUP_H */
