/* The environment as the library reads it, and the threads the library
 * starts: getenv only ever on a caller's thread (env.h says why and how). */
#include "util/env.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/tunables.h"

/* The variables the library reads besides the tunables (which are the first
 * MLXD_T_COUNT entries of the snapshot, in their order). A name missing here
 * is still known once a caller's thread has read it. */
static const char* const k_names[] = {"MLX_RANK",
                                      "MLX_WORLD_SIZE",
                                      "MLX_HOSTFILE",
                                      "MLX_RING_VERBOSE",
                                      "MLX_MPI_LIBNAME",
                                      "MLX_IBV_DEVICES",
                                      "MLX_JACCL_COORDINATOR",
                                      "MLX_JACCL_RING",
                                      "MLX_NCCL_TIMEOUT",
                                      "JACCL_RANK",
                                      "JACCL_IBV_DEVICES",
                                      "JACCL_COORDINATOR",
                                      "JACCL_RING",
                                      "NCCL_HOST_IP",
                                      "NCCL_PORT",
                                      "PMIX_NAMESPACE",
                                      "PMIX_RANK",
                                      "SLURM_JOB_ID",
                                      "SLURM_PROCID",
                                      "MLXDIST_ENV_REPORTED",
                                      "MLXDIST_RENDEZVOUS"};
#define N_NAMES (sizeof k_names / sizeof k_names[0])
#define MAX_ENTRIES ((int)(MLXD_T_COUNT + N_NAMES + 64))

/* One value a variable has had: kept for the life of the process. */
typedef struct env_value {
  struct env_value* next;
  char text[];
} env_value;

typedef struct env_entry {
  const char* name;           /* set before the entry is counted (g_count) */
  _Atomic(const char*) value; /* NULL: unset */
  atomic_bool filled;         /* read at least once on a caller's thread */
  env_value* seen;            /* every value it has had (g_mu) */
} env_entry;

static env_entry g_entries[MAX_ENTRIES];
static atomic_int g_count;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static atomic_ulong g_misses;
static atomic_bool g_miss_warned;
static _Thread_local bool tl_own;

static void add_locked(const char* name) {
  int n = atomic_load_explicit(&g_count, memory_order_relaxed);
  if (n == MAX_ENTRIES) return;
  g_entries[n].name = name;
  atomic_store_explicit(&g_count, n + 1, memory_order_release);
}

static void seed(void) {
  pthread_mutex_lock(&g_mu);
  for (int t = 0; t < MLXD_T_COUNT; t++) add_locked(mlxd_tunable_env_name((mlxd_tunable)t));
  for (size_t i = 0; i < N_NAMES; i++) add_locked(k_names[i]);
  pthread_mutex_unlock(&g_mu);
}

/* A name's entry, or NULL (a walk: the tunables' readers use their index). */
static env_entry* find(const char* name) {
  int n = atomic_load_explicit(&g_count, memory_order_acquire);
  for (int i = 0; i < n; i++)
    if (strcmp(g_entries[i].name, name) == 0) return &g_entries[i];
  return NULL;
}

/* The kept copy of v for e (g_mu held): an earlier identical value, or a new
 * one; NULL for unset, and on allocation failure (the snapshot keeps its old
 * value then). */
static const char* keep_locked(env_entry* e, const char* v, bool* ok) {
  *ok = true;
  if (!v) return NULL;
  for (env_value* s = e->seen; s; s = s->next)
    if (strcmp(s->text, v) == 0) return s->text;
  size_t len = strlen(v);
  env_value* s = malloc(sizeof *s + len + 1);
  if (!s) {
    *ok = false;
    return NULL;
  }
  memcpy(s->text, v, len + 1);
  s->next = e->seen;
  e->seen = s;
  return s->text;
}

/* Store v (just read by getenv on a caller's thread) as e's value; returns the
 * kept copy, or v itself when it could not be kept. */
static const char* store(env_entry* e, const char* v) {
  const char* cur = atomic_load_explicit(&e->value, memory_order_acquire);
  if (atomic_load_explicit(&e->filled, memory_order_relaxed) &&
      (cur == v || (cur && v && strcmp(cur, v) == 0)))
    return cur;
  pthread_mutex_lock(&g_mu);
  bool ok;
  const char* kept = keep_locked(e, v, &ok);
  if (ok) {
    atomic_store_explicit(&e->value, kept, memory_order_release);
    atomic_store_explicit(&e->filled, true, memory_order_release);
  }
  pthread_mutex_unlock(&g_mu);
  return ok ? kept : v;
}

/* What a read of name (its entry e, or NULL when the snapshot does not know
 * it yet) returns on this thread. */
static const char* get(env_entry* e, const char* name) {
  if (tl_own) {
    if (e && atomic_load_explicit(&e->filled, memory_order_acquire))
      return atomic_load_explicit(&e->value, memory_order_acquire);
    atomic_fetch_add(&g_misses, 1);
    bool expected = false;
    if (atomic_compare_exchange_strong(&g_miss_warned, &expected, true))
      fprintf(stderr,
              "mlxdist: internal: %s was read on a thread of mlxdist's own before any call of "
              "yours read it; it is taken as unset (a defect of mlxdist: please report it)\n",
              name);
    return NULL;
  }
  const char* v = getenv(name);
  if (!e) {
    pthread_mutex_lock(&g_mu);
    e = find(name); /* another caller's thread may have added it */
    if (!e) {
      int before = atomic_load_explicit(&g_count, memory_order_relaxed);
      char* copy = before < MAX_ENTRIES ? strdup(name) : NULL;
      if (copy) {
        add_locked(copy);
        e = &g_entries[before];
      }
    }
    pthread_mutex_unlock(&g_mu);
    if (!e) return v; /* the table is full (or no memory): read live, not kept */
  }
  return store(e, v);
}

const char* mlxd_env_get(const char* name) {
  pthread_once(&g_once, seed);
  return get(find(name), name);
}

int mlxd_env_long(const char* name, long lo, long hi, long* out) {
  const char* s = mlxd_env_get(name);
  if (!s || !*s) return 1;
  char* end = NULL;
  errno = 0;
  long x = strtol(s, &end, 10);
  if (errno || end == s || *end || x < lo || x > hi) return -1;
  *out = x;
  return 0;
}

const char* mlxd_env_tunable(int t) {
  pthread_once(&g_once, seed);
  const char* name = mlxd_tunable_env_name((mlxd_tunable)t);
  return get(t >= 0 && t < MLXD_T_COUNT ? &g_entries[t] : find(name), name);
}

const char* mlxd_env_tunable_kept(int t) {
  pthread_once(&g_once, seed);
  if (t < 0 || t >= MLXD_T_COUNT) return NULL;
  return atomic_load_explicit(&g_entries[t].value, memory_order_acquire);
}

void mlxd_env_refresh(void) {
  if (tl_own) return;
  pthread_once(&g_once, seed);
  int n = atomic_load_explicit(&g_count, memory_order_acquire);
  for (int i = 0; i < n; i++) store(&g_entries[i], getenv(g_entries[i].name));
}

unsigned long mlxd_env_misses(void) { return atomic_load(&g_misses); }

bool mlxd_thread_is_own(void) { return tl_own; }

/* ---- threads of the library's own ---- */

typedef struct thread_start {
  void* (*fn)(void*);
  void* arg;
  char name[16]; /* a thread's name holds 15 bytes */
} thread_start;

static void* thread_main(void* p) {
  thread_start s = *(thread_start*)p;
  free(p);
  tl_own = true;
  pthread_setname_np(pthread_self(), s.name);
  return s.fn(s.arg);
}

int mlxd_thread_start(pthread_t* th, const char* job, void* (*fn)(void*), void* arg) {
  thread_start* s = malloc(sizeof *s);
  if (!s) return ENOMEM;
  s->fn = fn;
  s->arg = arg;
  snprintf(s->name, sizeof s->name, "mlxd-%s", job);
  int rc = pthread_create(th, NULL, thread_main, s);
  if (rc) free(s);
  return rc;
}
