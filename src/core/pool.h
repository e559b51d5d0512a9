/* Private: per-thread free lists of fixed-size blocks for the objects every
 * op makes and drops (array headers, stream tasks), so that the hot path of
 * a small op calls no allocator and takes no lock.
 *
 * Each thread keeps a few blocks of each kind (below); a block
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

/* Small buffers (core/buffer.c) come in MLXD_POOL_BUF_CLASSES size classes
 * of 64 << i bytes, kinds MLXD_POOL_BUF + i. */
#define MLXD_POOL_BUF_CLASSES 7
typedef enum {
  MLXD_POOL_ARRAY,
  MLXD_POOL_TASK,
  MLXD_POOL_BUF,
  MLXD_POOL_KINDS = MLXD_POOL_BUF + MLXD_POOL_BUF_CLASSES
} mlxd_pool_kind;

/* A thread keeps at most MLXD_POOL_KEEP blocks of a kind, and of blocks
 * larger than 512 bytes at most MLXD_POOL_KEEP_BYTES bytes' worth. */
#define MLXD_POOL_KEEP 64
#define MLXD_POOL_KEEP_BYTES (32 << 10)

/* A block of `size` bytes for `kind` (every call for one kind must pass the
 * same size). *fresh tells whether it came from the heap (true) or from the
 * list (false: it was given back with mlxd_pool_put). NULL when out of
 * memory. */
void* mlxd_pool_get(mlxd_pool_kind kind, size_t size, int* fresh);
/* Give a block back (size: as passed to mlxd_pool_get). fini (may be NULL) is called on it before it goes to
 * the heap (when the list is full, at thread exit): undo what the user did
 * once when the block was fresh. */
void mlxd_pool_put(mlxd_pool_kind kind, void* p, size_t size, void (*fini)(void*));
/* Whether blocks are kept at all (false under AddressSanitizer). */
int mlxd_pool_keeps(void);

#endif
