#include "testutil.h"

#include <pthread.h>
#include <stdarg.h>

#include "mlx/c/error.h"

static pthread_mutex_t t_mu = PTHREAD_MUTEX_INITIALIZER;
static int t_count;
static char t_last[2048];

static void t_handler(const char* msg, void* data) {
  (void)data;
  pthread_mutex_lock(&t_mu);
  t_count++;
  snprintf(t_last, sizeof t_last, "%s", msg ? msg : "(null)");
  pthread_mutex_unlock(&t_mu);
}

void t_capture_errors(void) { mlx_set_error_handler(t_handler, NULL, NULL); }

int t_error_count(void) {
  pthread_mutex_lock(&t_mu);
  int n = t_count;
  pthread_mutex_unlock(&t_mu);
  return n;
}

const char* t_last_error(void) { return t_last; }

void t_clear_errors(void) {
  pthread_mutex_lock(&t_mu);
  t_count = 0;
  t_last[0] = '\0';
  pthread_mutex_unlock(&t_mu);
}

void t_expect_error(const char* file, int line, ...) {
  int n = t_error_count();
  if (n != 1) {
    fprintf(stderr, "%s:%d: FAILED: expected one error, got %d (last: '%s')\n", file, line, n,
            t_last);
    exit(1);
  }
  va_list ap;
  va_start(ap, line);
  const char* want;
  while ((want = va_arg(ap, const char*)) != NULL) {
    if (!strstr(t_last, want)) {
      fprintf(stderr, "%s:%d: FAILED: error '%s' does not contain '%s'\n", file, line, t_last,
              want);
      exit(1);
    }
  }
  va_end(ap);
  t_clear_errors();
}

void t_expect_no_error(const char* file, int line) {
  if (t_error_count() != 0) {
    fprintf(stderr, "%s:%d: FAILED: unexpected error: '%s'\n", file, line, t_last);
    exit(1);
  }
}

int t_env_int(const char* name, int dflt) {
  const char* v = getenv(name);
  return v && *v ? atoi(v) : dflt;
}
