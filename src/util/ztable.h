/* A zeroed table whose pages cost nothing until used (issue 25: a rank of a
 * group of N touches memory for the peers it talks to, not for N).
 *
 * mlxd_ztable_new(n, size): n entries of size bytes, every byte zero. A
 * table of a page or more is anonymous mmap'ed memory, so a page is faulted
 * in (and zeroed by the kernel) only when an entry on it is first written;
 * reading an untouched page maps the shared zero page. calloc does not give
 * that: it writes zeros over heap memory that was used before. Smaller
 * tables come from calloc. So a caller must not write (nor scan) every
 * entry at creation: it encodes "none" as zero. Does not block; no locks.
 * NULL when out of memory or when n * size overflows (errno set).
 *
 * mlxd_ztable_free(p, n, size): frees a table made with the same n and size
 * (NULL: nothing). */
#ifndef MLXD_UTIL_ZTABLE_H
#define MLXD_UTIL_ZTABLE_H

#include <stddef.h>

void* mlxd_ztable_new(size_t n, size_t size);
void mlxd_ztable_free(void* p, size_t n, size_t size);

#endif
