/* Buffer cache: see buffer.h for why. Small buffers (up to 4 KiB) come
 * from per-thread lists in power-of-two size classes (core/pool.h): a
 * collective's scratch space costs no allocator call. Large buffers are private anonymous
 * mappings with a 64-byte header in front (so the data stays 64-byte
 * aligned) recording the mapping's length. Freed mappings wait in a small
 * best-fit list; the oldest are unmapped when the cache would exceed its
 * limit. */
#include "core/buffer.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/array_impl.h"
#include "core/fork.h"
#include "core/pool.h"
#include "util/tunables.h"

#define LARGE_MIN ((size_t)64 << 10) /* below this: the C heap */
#define HEADER MLXD_ALIGN
#define HUGE_MIN ((size_t)2 << 20)
#define MAX_ENTRIES 64

typedef struct {
  void* base;
  size_t len;
} entry;

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
__attribute__((constructor)) static void buffer_fork_guard(void) { mlxd_fork_guard(&cache_mu); }
static entry cache[MAX_ENTRIES]; /* oldest first */
static int cache_n;
static size_t cache_bytes;
static size_t cache_limit = SIZE_MAX; /* SIZE_MAX: not read yet */

static size_t page_round(size_t n) {
  size_t page = 4096;
  return (n + page - 1) / page * page;
}

static size_t limit_locked(void) {
  if (cache_limit == SIZE_MAX) {
    long mb = mlxd_tunable_long(MLXD_T_BUFFER_CACHE_MB);
    cache_limit = mb > 0 ? (size_t)mb << 20 : 0;
  }
  return cache_limit;
}

static void drop_locked(int i) {
  munmap(cache[i].base, cache[i].len);
  cache_bytes -= cache[i].len;
  for (int j = i + 1; j < cache_n; j++) cache[j - 1] = cache[j];
  cache_n--;
}

/* The size class of a small buffer of n bytes (64 << class >= n), or -1. */
static int small_class(size_t n) {
  if (n > ((size_t)64 << (MLXD_POOL_BUF_CLASSES - 1))) return -1;
  int c = 0;
  while (((size_t)64 << c) < n) c++;
  return c;
}

void* mlxd_buffer_alloc(size_t n) {
  if (n < LARGE_MIN) {
    int c = small_class(n);
    if (c >= 0) {
      int fresh;
      return mlxd_pool_get(MLXD_POOL_BUF + c, (size_t)64 << c, &fresh);
    }
    return aligned_alloc(MLXD_ALIGN, (n + MLXD_ALIGN - 1) / MLXD_ALIGN * MLXD_ALIGN);
  }
  if (n > SIZE_MAX - HEADER - 4096) return NULL;
  size_t len = page_round(n + HEADER);
  void* base = NULL;
  pthread_mutex_lock(&cache_mu);
  int best = -1;
  for (int i = 0; i < cache_n; i++) {
    /* Best fit, wasting at most a quarter of the mapping. */
    if (cache[i].len >= len && cache[i].len - len <= cache[i].len / 4 &&
        (best < 0 || cache[i].len < cache[best].len))
      best = i;
  }
  if (best >= 0) {
    base = cache[best].base;
    len = cache[best].len;
    cache_bytes -= len;
    for (int j = best + 1; j < cache_n; j++) cache[j - 1] = cache[j];
    cache_n--;
  }
  pthread_mutex_unlock(&cache_mu);
  if (!base) {
    base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return NULL;
#ifdef MADV_HUGEPAGE
    if (len >= HUGE_MIN) madvise(base, len, MADV_HUGEPAGE);
#endif
  }
  *(size_t*)base = len;
  return (char*)base + HEADER;
}

void mlxd_buffer_free(void* p, size_t n) {
  if (!p) return;
  if (n < LARGE_MIN) {
    int c = small_class(n);
    if (c >= 0)
      mlxd_pool_put(MLXD_POOL_BUF + c, p, (size_t)64 << c, NULL);
    else
      free(p);
    return;
  }
  void* base = (char*)p - HEADER;
  size_t len = *(size_t*)base;
  pthread_mutex_lock(&cache_mu);
  size_t limit = limit_locked();
  if (len > limit) {
    pthread_mutex_unlock(&cache_mu);
    munmap(base, len);
    return;
  }
  while (cache_n > 0 && (cache_n == MAX_ENTRIES || cache_bytes + len > limit)) drop_locked(0);
  cache[cache_n].base = base;
  cache[cache_n].len = len;
  cache_n++;
  cache_bytes += len;
  pthread_mutex_unlock(&cache_mu);
}

void mlxd_buffer_trim(void) {
  pthread_mutex_lock(&cache_mu);
  while (cache_n > 0) drop_locked(cache_n - 1);
  pthread_mutex_unlock(&cache_mu);
}

__attribute__((destructor)) static void buffer_cache_exit(void) { mlxd_buffer_trim(); }
