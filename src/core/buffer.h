/* Private: memory for array data and communication scratch space.
 *
 * Touching fresh memory is the most expensive thing an op can do on a VM
 * (faulting in new pages costs far more than reusing mapped ones; the
 * figures are in docs/performance.md). So, like MLX's allocator, large buffers are
 * kept in a cache when freed and handed out again, up to
 * MLXDIST_BUFFER_CACHE_MB; large mappings also ask for transparent huge
 * pages. Small buffers (up to 4 KiB) are kept per thread in power-of-two
 * size classes (core/pool.h); the rest of the small ones come from the C
 * heap. */
#ifndef MLXD_BUFFER_H
#define MLXD_BUFFER_H

#include <stddef.h>

/* n bytes (n may be 0), MLXD_ALIGN-aligned, uninitialised; NULL when out of memory. */
void* mlxd_buffer_alloc(size_t n);
/* Give back a buffer from mlxd_buffer_alloc(n) with the same n. NULL is fine. */
void mlxd_buffer_free(void* p, size_t n);
/* Release every cached buffer to the system (also done at exit). */
void mlxd_buffer_trim(void);

/* Release watchers: fn(ctx, base, len) runs before a large buffer's
 * memory [base, base + len) is given back (to the reuse cache or to the
 * system), so a cache of RDMA registrations (transport/verbs_mr.h) drops
 * any registration overlapping it before the memory can be handed out
 * again: a stale registration would pin the old pages and alias new data.
 * fn may take its own lock and must not call back into this file. Cheap
 * when no watcher is set (one atomic load per large free). Returns an id
 * (> 0) for mlxd_buffer_unwatch, or 0 (the table of 16 is full). */
typedef void (*mlxd_buffer_watch_fn)(void* ctx, const void* base, size_t len);
int mlxd_buffer_watch(mlxd_buffer_watch_fn fn, void* ctx);
/* Remove a watcher (0: no-op); when it returns fn is not running and is
 * not called again. */
void mlxd_buffer_unwatch(int id);
/* Whether [p, p + n) lies inside one live large buffer of this file
 * (allocated, not yet freed): memory mlxdist owns and whose release the
 * watchers see. Foreign memory (the caller's) answers false. */
int mlxd_buffer_owns(const void* p, size_t n);

#endif
