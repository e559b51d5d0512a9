/* Private: per-thread free lists of fixed-size blocks for the objects every
 * op makes and drops (array headers, stream tasks), so that the hot path of
 * a small op calls no allocator and takes no lock.
 *
 * Each thread keeps at most MLXD_POOL_KEEP blocks of each kind; a block
 * freed on one thread goes to that thread's list (a stream worker's list
 * fills with what it frees, the caller's with what the caller frees). A
 * thread's lists are given back to the C heap when it exits. Blocks are
 * MLXD_ALIGN-aligned and uninitialised: a reused block holds what its last
 * user left in it, except its first sizeof(void*) bytes (the list's link
 * while it waited in the list).
 *
 * Under AddressSanitizer the lists are off (every get is a fresh
 * allocation, every put a free), so use-after-free stays visible. */
#ifndef MLXD_POOL_H
#define MLXD_POOL_H

#include <stddef.h>

typedef enum { MLXD_POOL_ARRAY, MLXD_POOL_TASK, MLXD_POOL_KINDS } mlxd_pool_kind;

#define MLXD_POOL_KEEP 64

/* A block of `size` bytes for `kind` (every call for one kind must pass the
 * same size). *fresh tells whether it came from the heap (true) or from the
 * list (false: it was given back with mlxd_pool_put). NULL when out of
 * memory. */
void* mlxd_pool_get(mlxd_pool_kind kind, size_t size, int* fresh);
/* Give a block back. fini (may be NULL) is called on it before it goes to
 * the heap (when the list is full, at thread exit): undo what the user did
 * once when the block was fresh. */
void mlxd_pool_put(mlxd_pool_kind kind, void* p, void (*fini)(void*));

#endif
