/* Buffer cache: see buffer.h for why. Small buffers (up to 4 KiB) come
 * from per-thread lists in power-of-two size classes (core/pool.h): a
 * collective's scratch space costs no allocator call. Large buffers are private anonymous
 * mappings with a 64-byte header in front (so the data stays 64-byte
 * aligned) recording the mapping's length. Freed mappings wait in a small
 * best-fit list; the oldest are unmapped when the cache would exceed its
 * limit. */
#include "core/buffer.h"

#include <pthread.h>
#include <stdatomic.h>
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

/* Live large mappings (handed out, not yet freed), for mlxd_buffer_owns. */
static entry* live;
static size_t live_n, live_cap;

static void live_add_locked(void* base, size_t len) {
  if (live_n == live_cap) {
    size_t cap = live_cap ? live_cap * 2 : 64;
    entry* nl = realloc(live, cap * sizeof *nl);
    if (!nl) return; /* not tracked: it reads as foreign, which is only slower */
    live = nl;
    live_cap = cap;
  }
  live[live_n].base = base;
  live[live_n].len = len;
  live_n++;
}

static void live_remove_locked(void* base) {
  for (size_t i = live_n; i-- > 0;) {
    if (live[i].base != base) continue;
    live[i] = live[--live_n];
    return;
  }
}

int mlxd_buffer_owns(const void* p, size_t n) {
  uintptr_t a = (uintptr_t)p;
  int yes = 0;
  pthread_mutex_lock(&cache_mu);
  for (size_t i = 0; i < live_n && !yes; i++) {
    uintptr_t b = (uintptr_t)live[i].base;
    yes = a >= b + HEADER && a - b <= live[i].len && live[i].len - (a - b) >= n;
  }
  pthread_mutex_unlock(&cache_mu);
  return yes;
}

/* Release watchers: a fixed table; watch_mu serialises changes and calls,
 * so unwatch returning means the watcher is not running. */
#define MAX_WATCH 16
static pthread_mutex_t watch_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  mlxd_buffer_watch_fn fn;
  void* ctx;
  int id;
} watchers[MAX_WATCH];
__attribute__((constructor)) static void watch_fork_guard(void) { mlxd_fork_guard(&watch_mu); }
static _Atomic int watch_count;
static int watch_next = 1;

int mlxd_buffer_watch(mlxd_buffer_watch_fn fn, void* ctx) {
  int id = 0;
  pthread_mutex_lock(&watch_mu);
  for (int i = 0; i < MAX_WATCH && !id; i++) {
    if (watchers[i].fn) continue;
    watchers[i].fn = fn;
    watchers[i].ctx = ctx;
    watchers[i].id = id = watch_next++;
    watch_count++;
  }
  pthread_mutex_unlock(&watch_mu);
  return id;
}

void mlxd_buffer_unwatch(int id) {
  if (id <= 0) return;
  pthread_mutex_lock(&watch_mu);
  for (int i = 0; i < MAX_WATCH; i++) {
    if (watchers[i].id != id) continue;
    watchers[i].fn = NULL;
    watchers[i].id = 0;
    watch_count--;
  }
  pthread_mutex_unlock(&watch_mu);
}

static void notify_release(const void* base, size_t len) {
  if (watch_count == 0) return;
  pthread_mutex_lock(&watch_mu);
  for (int i = 0; i < MAX_WATCH; i++)
    if (watchers[i].fn) watchers[i].fn(watchers[i].ctx, base, len);
  pthread_mutex_unlock(&watch_mu);
}

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
  pthread_mutex_lock(&cache_mu);
  live_add_locked(base, len);
  pthread_mutex_unlock(&cache_mu);
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
  live_remove_locked(base);
  pthread_mutex_unlock(&cache_mu);
  /* Before the memory can be handed out again (from the cache or by a new
   * mapping at the same address): registrations of it are dropped. */
  notify_release(base, len);
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
