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

#endif
