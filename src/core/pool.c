/* Per-thread free lists of fixed-size blocks: see pool.h. */
#include "core/pool.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

#include "core/array_impl.h"

#if defined(__SANITIZE_ADDRESS__)
#define POOL_OFF 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define POOL_OFF 1
#endif
#endif
#ifndef POOL_OFF
#define POOL_OFF 0
#endif

typedef struct link {
  struct link* next;
} link;

typedef struct {
  link* head;
  int n;
  void (*fini)(void*); /* what the last put passed (the same for every put of a kind) */
} list;

typedef struct {
  list lists[MLXD_POOL_KINDS];
  bool keyed;  /* the exit destructor is registered for this thread */
  bool closed; /* the thread is exiting: no more keeping */
} thread_pool;

static _Thread_local thread_pool t_pool;
static pthread_key_t g_key;
static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;
static bool g_key_ok;

static void drain(void* unused) {
  (void)unused;
  t_pool.closed = true;
  for (int k = 0; k < MLXD_POOL_KINDS; k++) {
    list* l = &t_pool.lists[k];
    while (l->head) {
      link* b = l->head;
      l->head = b->next;
      if (l->fini) l->fini(b);
      free(b);
    }
    l->n = 0;
  }
}

static void key_init(void) { g_key_ok = pthread_key_create(&g_key, drain) == 0; }

static size_t round_up(size_t size) {
  if (size < sizeof(link)) size = sizeof(link);
  return (size + MLXD_ALIGN - 1) / MLXD_ALIGN * MLXD_ALIGN;
}

void* mlxd_pool_get(mlxd_pool_kind kind, size_t size, int* fresh) {
  list* l = &t_pool.lists[kind];
  if (l->head) {
    link* b = l->head;
    l->head = b->next;
    l->n--;
    *fresh = 0;
    return b;
  }
  *fresh = 1;
  return aligned_alloc(MLXD_ALIGN, round_up(size));
}

void mlxd_pool_put(mlxd_pool_kind kind, void* p, size_t size, void (*fini)(void*)) {
  if (!p) return;
  thread_pool* tp = &t_pool;
  list* l = &tp->lists[kind];
  int keep = size <= 512 ? MLXD_POOL_KEEP : (int)(MLXD_POOL_KEEP_BYTES / size);
  if (!POOL_OFF && !tp->closed && l->n < keep) {
    if (!tp->keyed) {
      /* Register the exit destructor once per thread; without it nothing is kept. */
      pthread_once(&g_key_once, key_init);
      tp->keyed = g_key_ok && pthread_setspecific(g_key, tp) == 0;
    }
    if (tp->keyed) {
      link* b = p;
      b->next = l->head;
      l->head = b;
      l->n++;
      l->fini = fini;
      return;
    }
  }
  if (fini) fini(p);
  free(p);
}

int mlxd_pool_keeps(void) { return !POOL_OFF; }
