/* Zeroed tables paid for by the page when used: ztable.h. */
#include "util/ztable.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static size_t page_bytes(void) {
  long p = sysconf(_SC_PAGESIZE);
  return p > 0 ? (size_t)p : 4096;
}

void* mlxd_ztable_new(size_t n, size_t size) {
  if (n == 0 || size == 0) n = size = 1;
  if (size > SIZE_MAX / n) {
    errno = ENOMEM;
    return NULL;
  }
  size_t bytes = n * size;
  if (bytes < page_bytes()) return calloc(n, size);
  void* p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

void mlxd_ztable_free(void* p, size_t n, size_t size) {
  if (!p) return;
  if (n == 0 || size == 0) n = size = 1;
  size_t bytes = n * size;
  if (bytes < page_bytes())
    free(p);
  else
    (void)munmap(p, bytes);
}
