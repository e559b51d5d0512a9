/* Private: what an mlx_array handle points to.
 *
 * An array is immutable once ready. A pending array is produced by a task
 * queued on a stream; mlxd_array_wait blocks until the task completes it
 * (ready or failed). The wait is bounded by the task itself: every task
 * has a bounded run time (network waits use MLXDIST_TIMEOUT). */
#ifndef MLXD_ARRAY_IMPL_H
#define MLXD_ARRAY_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "mlx/c/array.h"
#include "util/status.h"

#define MLXD_ALIGN 64
/* Small arrays live in one block with their header (core/pool.h): up to
 * MLXD_ARRAY_INLINE_NDIM dimensions and MLXD_ARRAY_INLINE_BYTES bytes of
 * owned data need no allocation of their own. */
#define MLXD_ARRAY_INLINE_NDIM 4
#define MLXD_ARRAY_INLINE_BYTES 128

typedef enum { MLXD_ARRAY_READY, MLXD_ARRAY_PENDING, MLXD_ARRAY_FAILED } mlxd_array_state;

typedef struct mlxd_array {
  atomic_int refs; /* first: the pool's link overlays it while the block is free */
  mlx_dtype dtype;
  int ndim;
  int* shape;      /* ndim entries (NULL when ndim == 0) */
  size_t* strides; /* ndim entries, in elements, row-major */
  size_t size;     /* elements */
  size_t nbytes;
  void* data;          /* MLXD_ALIGN-aligned when owned; may be NULL when nbytes == 0 */
  void (*dtor)(void*); /* managed data: dtor(dtor_arg) once at the end; NULL: owned data */
  void* dtor_arg;
  bool data_inline; /* owned data in small[] */
  /* completion */
  atomic_int state;   /* mlxd_array_state */
  atomic_int waiters; /* threads blocked on cv (under mu); complete signals only if > 0 */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  mlxd_status* error; /* when FAILED: the failure (owned, or a static out-of-memory one) */
  /* While PENDING: the stream whose queued task will complete this array
   * (retained unless it is the built-in default stream, which lives until
   * exit). A thread that waits for the array may run that task itself if
   * it has not started yet (see mlxd_stream_help). Written only by the
   * producing side (set at submit, cleared at completion); replacing a
   * retained stream takes mu, so a helper's read-and-retain under mu is
   * safe. */
  _Atomic(struct mlxd_stream*) producer;
  /* The process that made it (core/fork.h): a forked child's copy of a
   * pending array can never complete, and waiting for it there fails. */
  pid_t pid;
  int shape_inline[MLXD_ARRAY_INLINE_NDIM];
  size_t strides_inline[MLXD_ARRAY_INLINE_NDIM];
  _Alignas(MLXD_ALIGN) unsigned char small[MLXD_ARRAY_INLINE_BYTES];
} mlxd_array;

/* Allocate an array with owned, aligned, uninitialised data.
 * pending: the array starts PENDING (a task will complete it). */
mlxd_array* mlxd_array_alloc(const int* shape, int ndim, mlx_dtype dtype, bool pending,
                             mlxd_status* st);
mlxd_array* mlxd_array_retain(mlxd_array* a);
void mlxd_array_release(mlxd_array* a);
/* Block until a is not pending. 0 if ready; else copies the failure to st (may be NULL) and returns its code.
 * A pending array of the parent in a forked child fails at once (core/fork.h). */
int mlxd_array_wait(mlxd_array* a, mlxd_status* st);
/* Mark a pending array ready (st == NULL or st->code == 0) or failed; wakes waiters. */
void mlxd_array_complete(mlxd_array* a, const mlxd_status* st);

static inline mlxd_array* mlxd_array_of(mlx_array h) { return (mlxd_array*)h.ctx; }
static inline mlx_array mlxd_array_handle(mlxd_array* a) {
  mlx_array h = {a};
  return h;
}

/* Validate a dtype value; 0 if known. */
int mlxd_dtype_check(int dtype, mlxd_status* st);
const char* mlxd_dtype_name(mlx_dtype dtype);

#endif
