/* Private: streams and the tasks queued on them.
 *
 * Each stream has one worker thread that runs its tasks in queue order.
 * An idle worker blocks on a condition variable (uses no CPU) after
 * spinning for at most MLXDIST_SPIN_US. */
#ifndef MLXD_STREAM_IMPL_H
#define MLXD_STREAM_IMPL_H

#include <stdbool.h>
#include <stddef.h>

#include "core/array_impl.h"
#include "mlx/c/device.h"
#include "mlx/c/stream.h"
#include "util/status.h"

typedef struct mlxd_stream mlxd_stream;

/* A task: run(arg, st) does the work and sets st on failure.
 * cleanup(arg) (may be NULL) runs after, whatever happened. */
typedef void (*mlxd_task_fn)(void* arg, mlxd_status* st);

/* Queue a task. The worker first waits for every input to be ready (a failed
 * input fails the task with the input's message, run is not called), then
 * calls run, then completes every output (ready or failed with st), then
 * calls cleanup. Inputs and outputs are retained by the task until then.
 * Returns 0, or non-zero with st set (then nothing was queued and cleanup
 * was NOT called; outputs that were still pending are completed as failed
 * with st, so nothing waits on them forever). */
int mlxd_stream_submit(mlxd_stream* s, mlxd_task_fn run, void (*cleanup)(void*), void* arg,
                       mlxd_array* const* inputs, int n_inputs, mlxd_array* const* outputs,
                       int n_outputs, mlxd_status* st);

/* mlxd_stream_submit, but arg points to arg_size bytes (at most
 * MLXD_TASK_ARG_MAX) that are copied into the task: run and cleanup get a
 * pointer to the copy, which lives until cleanup returns. Saves the caller
 * an allocation per task. on_queue (may be NULL) is called with the copy
 * once the task is sure to be queued, under the stream's lock, just before
 * it joins the queue (no task of the stream can run meanwhile, and two
 * submits to one stream call it in queue order): the place to take a number
 * that must follow queue order. It must not block or call back into the
 * stream, and may take only leaf locks (the operation record's g_id_mu, on
 * a group's first op). Not called when the submit fails. */
#define MLXD_TASK_ARG_MAX 96
int mlxd_stream_submit_copy(mlxd_stream* s, mlxd_task_fn run, void (*cleanup)(void*),
                            void (*on_queue)(void*), const void* arg, size_t arg_size,
                            mlxd_array* const* inputs, int n_inputs, mlxd_array* const* outputs,
                            int n_outputs, mlxd_status* st);

/* The default stream of a device type (created on first use, lives until exit).
 * GPU: NULL with st set when no GPU backend is available. Not retained. */
mlxd_stream* mlxd_default_stream(mlx_device_type type, mlxd_status* st);
mlxd_stream* mlxd_stream_retain(mlxd_stream* s);
void mlxd_stream_release(mlxd_stream* s);
mlx_device_type mlxd_stream_device_type(const mlxd_stream* s);
int mlxd_stream_index(const mlxd_stream* s);
/* A GPU stream's native handle (its cudaStream_t, core/gpu.h); NULL for a CPU stream. */
void* mlxd_stream_native(const mlxd_stream* s);
/* Called by a thread about to wait for the pending array a: if the task
 * that produces a is still queued on its stream and nothing runs on that
 * stream, run the queued tasks up to it on this thread (in queue order), so
 * the waiter does the work instead of waking the worker and sleeping. */
void mlxd_stream_help(mlxd_array* a);
/* Record s as the producer of the pending array a (retains s unless it is
 * the built-in default stream, which lives until exit); cleared by
 * mlxd_array_complete. */
void mlxd_array_set_producer(mlxd_array* a, mlxd_stream* s);
/* The producer of a, or NULL: retained unless mlxd_stream_is_static (the
 * caller releases it only then). */
mlxd_stream* mlxd_array_producer_retain(mlxd_array* a);
/* The built-in default stream: never freed, references need not be held. */
bool mlxd_stream_is_static(const mlxd_stream* s);
/* Wait until every task queued so far has finished. */
void mlxd_stream_sync(mlxd_stream* s);

/* At process exit the default streams get MLXD_EXIT_GRACE_S seconds to
 * drain; then fn (set once, by the distributed front-end: abort the groups
 * with ops still pending, distributed/group.c) runs, and the joins go on
 * within what is left of MLXDIST_TIMEOUT. */
#define MLXD_EXIT_GRACE_S 1.0
void mlxd_stream_set_exit_hook(void (*fn)(void));

static inline mlxd_stream* mlxd_stream_of(mlx_stream h) { return (mlxd_stream*)h.ctx; }

#endif
