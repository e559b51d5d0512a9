/* The process-wide error handler (mlx_set_error_handler) and the internal
 * reporting functions.
 *
 * The current handler is a small reference-counted record: a reporter takes
 * a reference under the lock, calls the handler without holding any lock
 * (so the handler may call back into mlxdist, replace itself, or exit), and
 * drops the reference. The record's dtor(data) runs exactly once, when the
 * record has been replaced and no reporter is still using it. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fork.h"
#include "mlx/c/error.h"

typedef struct handler_rec {
  mlx_error_handler_func fn;
  void* data;
  void (*dtor)(void*);
  int refs; /* protected by g_mu; 1 for being current + 1 per reporter */
} handler_rec;

static void default_handler(const char* msg, void* data) {
  (void)data;
  fprintf(stderr, "MLX error: %s\n", msg ? msg : "(no message)");
  fflush(stderr);
  exit(255);
}

static handler_rec g_default = {default_handler, NULL, NULL, 1};
static handler_rec* g_cur = &g_default;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
__attribute__((constructor)) static void error_fork_guard(void) { mlxd_fork_guard(&g_mu); }

/* Drop one reference; returns the record if it must now be destroyed. */
static handler_rec* rec_unref_locked(handler_rec* r) {
  if (r == &g_default) return NULL;
  return --r->refs == 0 ? r : NULL;
}

static void rec_destroy(handler_rec* r) {
  if (!r) return;
  if (r->dtor) r->dtor(r->data);
  free(r);
}

void mlx_set_error_handler(mlx_error_handler_func handler, void* data, void (*dtor)(void*)) {
  handler_rec* nr = &g_default;
  if (handler) {
    nr = malloc(sizeof *nr);
    if (!nr) {
      /* Cannot install it: keep the old handler, tell the new one's owner
       * nothing was kept by running its dtor, and report. */
      if (dtor) dtor(data);
      mlxd_error("[error] out of memory installing the error handler; the previous handler stays");
      return;
    }
    nr->fn = handler;
    nr->data = data;
    nr->dtor = dtor;
    nr->refs = 1;
  }
  pthread_mutex_lock(&g_mu);
  handler_rec* old = g_cur;
  g_cur = nr;
  handler_rec* dead = rec_unref_locked(old);
  pthread_mutex_unlock(&g_mu);
  rec_destroy(dead);
}

static void report(const char* msg) {
  pthread_mutex_lock(&g_mu);
  handler_rec* r = g_cur;
  if (r != &g_default) r->refs++;
  mlx_error_handler_func fn = r->fn;
  void* data = r->data;
  pthread_mutex_unlock(&g_mu);

  fn(msg, data);

  if (r != &g_default) {
    pthread_mutex_lock(&g_mu);
    handler_rec* dead = rec_unref_locked(r);
    pthread_mutex_unlock(&g_mu);
    rec_destroy(dead);
  }
}

/* Format into a heap buffer of the right size (messages are not truncated). */
static char* vformat(const char* fmt, va_list ap) {
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap2);
  va_end(ap2);
  if (n < 0) return NULL;
  char* buf = malloc((size_t)n + 1);
  if (!buf) return NULL;
  vsnprintf(buf, (size_t)n + 1, fmt, ap);
  return buf;
}

static void vreport(const char* fmt, va_list ap) {
  if (!fmt) fmt = "(no message)";
  char* msg = vformat(fmt, ap);
  report(msg ? msg : fmt);
  free(msg);
}

void mlxd_error(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vreport(fmt, ap);
  va_end(ap);
}

int mlxd_error_status(const mlxd_status* st) {
  if (!st) {
    report("[error] an operation failed without a status");
    return MLXD_EINVAL;
  }
  report(st->msg[0] ? st->msg : "[error] an operation failed without a message");
  return st->code ? st->code : 1;
}

void _mlx_error(const char* file, const int line, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char* msg = vformat(fmt ? fmt : "(no message)", ap);
  va_end(ap);
  if (!msg) {
    report(fmt ? fmt : "(no message)");
    return;
  }
  if (file) {
    size_t need = strlen(msg) + strlen(file) + 32;
    char* full = malloc(need);
    if (full) {
      snprintf(full, need, "%s at %s:%d", msg, file, line);
      free(msg);
      msg = full;
    }
  }
  report(msg);
  free(msg);
}
