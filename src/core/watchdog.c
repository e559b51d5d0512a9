/* The process's watchdog thread (watchdog.h). */
#include "core/watchdog.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/clock.h"
#include "util/env.h"

typedef struct watch {
  int handle;
  mlxd_watch_fn fn;
  void* ctx;
  double period, due;
  bool running;
} watch;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv; /* CLOCK_MONOTONIC; initialised once */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static watch* g_w;
static int g_n, g_cap, g_next = 1;
static bool g_started, g_stop, g_joining, g_warned;
static pthread_t g_thread;

/* A forked child has the registrations but not the thread: start afresh
 * (its transports are copies it cannot use for heartbeats anyway). */
static void after_fork_child(void) {
  pthread_mutex_init(&g_mu, NULL);
  free(g_w);
  g_w = NULL;
  g_n = g_cap = 0;
  g_started = g_stop = g_joining = false;
}

static void init_once(void) {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(&g_cv, &a);
  pthread_condattr_destroy(&a);
  pthread_atfork(NULL, NULL, after_fork_child);
}

static void* run(void* arg) {
  (void)arg;
  pthread_mutex_lock(&g_mu);
  while (!g_stop) {
    double now = mlxd_now(), next = now + 1.0;
    for (int i = 0; i < g_n && !g_stop; i++) {
      watch* w = &g_w[i];
      if (w->due > now) {
        if (w->due < next) next = w->due;
        continue;
      }
      w->running = true;
      mlxd_watch_fn fn = w->fn;
      void* ctx = w->ctx;
      int h = w->handle;
      pthread_mutex_unlock(&g_mu);
      fn(ctx, now);
      pthread_mutex_lock(&g_mu);
      /* The table may have moved while unlocked: find the entry again. */
      for (int j = 0; j < g_n; j++)
        if (g_w[j].handle == h) {
          g_w[j].running = false;
          g_w[j].due = now + g_w[j].period;
          if (g_w[j].due < next) next = g_w[j].due;
        }
      pthread_cond_broadcast(&g_cv);
      now = mlxd_now();
    }
    if (g_stop) break;
    double wait = next - mlxd_now();
    if (wait <= 0) continue;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    long ns = ts.tv_nsec + (long)((wait - (double)(long)wait) * 1e9);
    ts.tv_sec += (time_t)wait + ns / 1000000000L;
    ts.tv_nsec = ns % 1000000000L;
    pthread_cond_timedwait(&g_cv, &g_mu, &ts);
  }
  pthread_mutex_unlock(&g_mu);
  return NULL;
}

int mlxd_watchdog_add(mlxd_watch_fn fn, void* ctx, double period_s) {
  pthread_once(&g_once, init_once);
  if (period_s < 0.01) period_s = 0.01;
  pthread_mutex_lock(&g_mu);
  while (g_joining) pthread_cond_wait(&g_cv, &g_mu);
  int h = 0;
  if (g_n == g_cap) {
    int cap = g_cap ? 2 * g_cap : 8;
    watch* w = realloc(g_w, sizeof *w * (size_t)cap);
    if (!w) goto out;
    g_w = w;
    g_cap = cap;
  }
  if (!g_started) {
    g_stop = false;
    int err = mlxd_thread_start(&g_thread, "watchdog", run, NULL);
    if (err) {
      if (!g_warned)
        fprintf(stderr,
                "[mlxdist] warning: no watchdog thread (pthread_create: %s): this rank "
                "sends no heartbeats while it is not waiting on its peers\n",
                strerror(err));
      g_warned = true;
      goto out;
    }
    g_started = true;
  }
  h = g_next++;
  if (g_next <= 0) g_next = 1;
  g_w[g_n++] = (watch){h, fn, ctx, period_s, mlxd_now() + period_s, false};
  pthread_cond_broadcast(&g_cv);
out:
  pthread_mutex_unlock(&g_mu);
  return h;
}

void mlxd_watchdog_remove(int handle) {
  if (handle <= 0) return;
  pthread_once(&g_once, init_once);
  pthread_mutex_lock(&g_mu);
  for (;;) {
    int i = 0;
    while (i < g_n && g_w[i].handle != handle) i++;
    if (i == g_n) break; /* unknown (or a forked child's stale handle) */
    if (g_w[i].running) {
      pthread_cond_wait(&g_cv, &g_mu);
      continue;
    }
    g_w[i] = g_w[--g_n];
    break;
  }
  if (g_n == 0 && g_started && !g_joining) {
    g_stop = true;
    g_joining = true;
    pthread_t th = g_thread;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
    pthread_join(th, NULL);
    pthread_mutex_lock(&g_mu);
    g_started = false;
    g_joining = false;
    pthread_cond_broadcast(&g_cv);
  }
  pthread_mutex_unlock(&g_mu);
}
