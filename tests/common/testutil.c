#include "testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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

/* ---- reports and checks ---- */

static char t_label_buf[64];
static atomic_int t_failed_checks;
/* Reports printed per process before the rest are only counted (a wrong
 * buffer in a loop must not bury the first, most telling, failures). */
enum { T_MAX_REPORTS = 40 };

void t_set_label(const char* label) {
  snprintf(t_label_buf, sizeof t_label_buf, "%s", label ? label : "");
}

const char* t_label(void) { return t_label_buf; }

/* One line: "file:line: [label: ]WHAT: expr: detail". */
static void t_report(const char* file, int line, const char* what, const char* expr,
                     const char* fmt, va_list ap) {
  char detail[1024] = "";
  if (fmt) vsnprintf(detail, sizeof detail, fmt, ap);
  fprintf(stderr, "%s:%d: %s%s%s%s%s%s%s\n", file, line, t_label_buf, *t_label_buf ? ": " : "",
          what, expr ? ": " : "", expr ? expr : "", *detail ? ": " : "", detail);
  fflush(stderr);
}

void t_fatal(const char* file, int line, const char* expr, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  t_report(file, line, "FAILED", expr, fmt, ap);
  va_end(ap);
  exit(1);
}

void t_check_failed(const char* file, int line, const char* expr, const char* fmt, ...) {
  int n = atomic_fetch_add(&t_failed_checks, 1) + 1;
  if (n > T_MAX_REPORTS) return;
  va_list ap;
  va_start(ap, fmt);
  t_report(file, line, "CHECK FAILED", expr, fmt, ap);
  va_end(ap);
  if (n == T_MAX_REPORTS)
    fprintf(stderr, "%s%s(further failed checks are counted, not shown)\n", t_label_buf,
            *t_label_buf ? ": " : "");
}

int t_check_failures(void) { return atomic_load(&t_failed_checks); }

void t_checks_reset(void) { atomic_store(&t_failed_checks, 0); }

int t_exit_status(void) {
  int n = t_check_failures();
  if (n == 0) return 0;
  fprintf(stderr, "%s%s%d check%s failed\n", t_label_buf, *t_label_buf ? ": " : "", n,
          n == 1 ? "" : "s");
  return 1;
}

void t_rank_log_to(const char* dir, int rank) {
  char path[256];
  snprintf(path, sizeof path, "%s/rank%d.log", dir, rank);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  T_REQUIREF(fd >= 0, "cannot open %s: %s", path, strerror(errno));
  dup2(fd, 2);
  close(fd);
}

const char* t_rank_log(const char* dir, int rank) {
  static char buf[16384];
  char path[256];
  snprintf(path, sizeof path, "%s/rank%d.log", dir, rank);
  buf[0] = '\0';
  FILE* f = fopen(path, "r");
  if (f) {
    size_t k = fread(buf, 1, sizeof buf - 1, f);
    buf[k] = '\0';
    fclose(f);
  }
  return buf;
}
