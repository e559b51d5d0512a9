/* The measurement rule shared by mlxdist-bench and mpi_ref_bench (see
 * bench_common.h and docs/performance.md, "How a row is measured"): the same
 * warm-up, calibration, batches and statistics on both sides, so that the
 * two differ only in the library under the op. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* cpu_set_t, sched_setaffinity */
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#endif

#include "bench_common.h"

double mlxd_bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double mlxd_bench_cpu(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int mlxd_cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

double mlxd_bench_median(double* v, int n) {
  if (n <= 0) return 0;
  qsort(v, (size_t)n, sizeof *v, mlxd_cmp_double);
  return (n % 2) ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int mlxd_bench_warm_rest(const mlxd_bench_opts* o, double first_s) {
  int rest = o->warmup > 1 ? o->warmup - 1 : 0;
  if (rest == 0 || o->min_time_ms <= 0 || first_s <= 0) return rest;
  /* a slow op (Open MPI's 64 MiB all-reduce here: 0.3-0.6 s) need not be
   * repeated five times to be warm: keep to half the timed budget, but run
   * at least one more after the first */
  double fit = 0.5 * o->min_time_ms * 1e-3 / first_s;
  if (fit < 1) return 1;
  return fit < rest ? (int)fit : rest;
}

long mlxd_bench_batch_iters(const mlxd_bench_opts* o, double est_s) {
  if (o->min_time_ms <= 0) return o->iters;
  double want = est_s > 0 ? ceil(o->min_time_ms * 1e-3 / o->batches / est_s) : (double)o->max_iters;
  if (want > o->max_iters) want = o->max_iters;
  if (want < o->iters) want = o->iters;
  return (long)want;
}

int mlxd_bench_batch_limit(const mlxd_bench_opts* o) {
  int lim = o->max_batches > 0 ? o->max_batches : 3 * o->batches;
  return lim < o->batches ? o->batches : lim;
}

bool mlxd_bench_unsettled(const double* t, int n) {
  if (n < 2) return true;
  double* s = malloc((size_t)n * sizeof *s);
  if (!s) return false;
  memcpy(s, t, (size_t)n * sizeof *s);
  double med = mlxd_bench_median(s, n);
  for (int i = 0; i < n; i++) s[i] = fabs(s[i] - med);
  double mad = mlxd_bench_median(s, n);
  free(s);
  return 1.2533 * 1.4826 * mad / sqrt((double)n) > MLXD_BENCH_SETTLED * med;
}

/* ---- --account: the counters ---- */

/* The perf counters: user-space instructions and system calls. */
enum { MLXD_PERF_INSTR, MLXD_PERF_SYSCALL, MLXD_PERF_N };

static struct {
  bool opened, reported;
  int fd[MLXD_PERF_N];        /* -1: n/a */
  char why[MLXD_PERF_N][320]; /* why n/a */
} mlxd_acct = {false, false, {-1, -1}, {"", ""}};

bool mlxd_bench_parse_tp_id(const char* s, unsigned long long* id) {
  if (!s || *s < '0' || *s > '9') return false;
  char* end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s) return false;
  if (*end == '\n') end++;
  if (*end != '\0' || v == 0) return false;
  *id = v;
  return true;
}

#ifdef __linux__
/* The id of raw_syscalls:sys_enter from tracefs (mounted, or under debugfs);
 * 0 after writing why into why. */
static unsigned long long mlxd_acct_tp_id(char* why, size_t cap) {
  static const char* const paths[] = {"/sys/kernel/tracing/events/raw_syscalls/sys_enter/id",
                                      "/sys/kernel/debug/tracing/events/raw_syscalls/sys_enter/id"};
  size_t used = 0;
  for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
    char buf[32];
    int fd = open(paths[i], O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    int err = errno;
    if (fd >= 0) close(fd);
    const char* reason = NULL;
    if (n < 0) {
      reason = strerror(err);
    } else {
      buf[n] = '\0';
      unsigned long long id = 0;
      if (mlxd_bench_parse_tp_id(buf, &id)) return id;
      reason = "not a positive integer";
    }
    int w = snprintf(why + used, cap - used, "%s%s: %s", i ? "; " : "", paths[i], reason);
    if (w > 0) used += (size_t)w < cap - used ? (size_t)w : cap - used - 1;
  }
  return 0;
}

/* user: count user space only (the instructions; not the tracepoint, which
 * fires in the kernel, on the way into a system call) */
static int mlxd_acct_perf_open(uint32_t type, unsigned long long config, bool user) {
  struct perf_event_attr a;
  memset(&a, 0, sizeof a);
  a.size = sizeof a;
  a.type = type;
  a.config = config;
  a.disabled = 1;
  a.inherit = 1; /* the threads made later count too */
  a.exclude_kernel = user;
  a.exclude_hv = user;
  a.read_format = PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING;
  /* this process (its threads through inherit), any CPU */
  return (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
}
#endif

void mlxd_bench_acct_open(void) {
  if (mlxd_acct.opened) return;
  mlxd_acct.opened = true;
#ifdef __linux__
  mlxd_acct.fd[MLXD_PERF_INSTR] =
      mlxd_acct_perf_open(PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS, true);
  if (mlxd_acct.fd[MLXD_PERF_INSTR] < 0)
    snprintf(mlxd_acct.why[MLXD_PERF_INSTR], sizeof mlxd_acct.why[0],
             "perf_event_open(PERF_COUNT_HW_INSTRUCTIONS): %s", strerror(errno));
  char tp[256] = "";
  unsigned long long id = mlxd_acct_tp_id(tp, sizeof tp);
  if (id == 0) {
    snprintf(mlxd_acct.why[MLXD_PERF_SYSCALL], sizeof mlxd_acct.why[0],
             "no id for the tracepoint raw_syscalls:sys_enter (%s)", tp);
  } else {
    mlxd_acct.fd[MLXD_PERF_SYSCALL] = mlxd_acct_perf_open(PERF_TYPE_TRACEPOINT, id, false);
    if (mlxd_acct.fd[MLXD_PERF_SYSCALL] < 0)
      snprintf(mlxd_acct.why[MLXD_PERF_SYSCALL], sizeof mlxd_acct.why[0],
               "perf_event_open(tracepoint raw_syscalls:sys_enter, id %llu): %s", id,
               strerror(errno));
  }
#else
  for (int i = 0; i < MLXD_PERF_N; i++)
    snprintf(mlxd_acct.why[i], sizeof mlxd_acct.why[0], "perf_event_open is Linux only");
#endif
}

void mlxd_bench_acct_report(void) {
  static const char* const what[MLXD_PERF_N] = {"user-space instructions", "system calls"};
  if (!mlxd_acct.opened || mlxd_acct.reported) return;
  mlxd_acct.reported = true;
  for (int i = 0; i < MLXD_PERF_N; i++)
    if (mlxd_acct.fd[i] < 0)
      fprintf(stderr, "[bench] --account: %s are not counted (n/a): %s.\n", what[i],
              mlxd_acct.why[i]);
}

void mlxd_bench_acct_scale(mlxd_bench_result* r, double f) {
  for (int i = 0; i < MLXD_ACCT_N; i++) {
    if (r->acct[i] > 0) r->acct[i] *= f;
    if (r->acct_max[i] > 0) r->acct_max[i] *= f;
  }
}

/* A row's counts: sums over its timed batches. */
typedef struct mlxd_acct_sum {
  double ru[3];                /* minflt, majflt, csw */
  double val[MLXD_PERF_N];     /* perf counts */
  double enabled[MLXD_PERF_N]; /* perf time enabled, ns (all threads) */
  double running[MLXD_PERF_N]; /* perf time counting, ns (multiplexing when < enabled) */
  bool failed[MLXD_PERF_N];    /* a read or ioctl failed: n/a in this row */
  struct rusage ru0;           /* at the batch's start */
  uint64_t v0[MLXD_PERF_N][3]; /* perf value, enabled, running at the batch's start */
} mlxd_acct_sum;

static bool mlxd_acct_read(int fd, uint64_t v[3]) {
  return read(fd, v, 3 * sizeof v[0]) == (ssize_t)(3 * sizeof v[0]);
}

#ifdef __linux__
static bool mlxd_acct_ioctl(int fd, unsigned long req) { return ioctl(fd, req, 0) == 0; }
#define MLXD_ACCT_ENABLE PERF_EVENT_IOC_ENABLE
#define MLXD_ACCT_DISABLE PERF_EVENT_IOC_DISABLE
#else
static bool mlxd_acct_ioctl(int fd, unsigned long req) {
  (void)fd;
  (void)req;
  return false;
}
#define MLXD_ACCT_ENABLE 0
#define MLXD_ACCT_DISABLE 0
#endif

/* Just before a batch's ops: the counters' values, then enable them (the
 * system call counter last, so that its own ioctl is not counted). */
static void mlxd_acct_start(mlxd_acct_sum* a) {
  getrusage(RUSAGE_SELF, &a->ru0);
  for (int i = 0; i < MLXD_PERF_N; i++) {
    int fd = mlxd_acct.fd[i];
    if (fd < 0 || a->failed[i]) continue;
    if (!mlxd_acct_read(fd, a->v0[i]) || !mlxd_acct_ioctl(fd, MLXD_ACCT_ENABLE))
      a->failed[i] = true;
  }
}

/* Right after them: disable (the system call counter first: its ioctl is the
 * one system call of its own it counts, taken off below) and add up. */
static void mlxd_acct_stop(mlxd_acct_sum* a) {
  for (int i = MLXD_PERF_N - 1; i >= 0; i--) {
    int fd = mlxd_acct.fd[i];
    if (fd >= 0 && !a->failed[i] && !mlxd_acct_ioctl(fd, MLXD_ACCT_DISABLE)) a->failed[i] = true;
  }
  struct rusage ru1;
  getrusage(RUSAGE_SELF, &ru1);
  a->ru[0] += (double)(ru1.ru_minflt - a->ru0.ru_minflt);
  a->ru[1] += (double)(ru1.ru_majflt - a->ru0.ru_majflt);
  a->ru[2] += (double)((ru1.ru_nvcsw - a->ru0.ru_nvcsw) + (ru1.ru_nivcsw - a->ru0.ru_nivcsw));
  for (int i = 0; i < MLXD_PERF_N; i++) {
    uint64_t v1[3];
    int fd = mlxd_acct.fd[i];
    if (fd < 0 || a->failed[i]) continue;
    if (!mlxd_acct_read(fd, v1)) {
      a->failed[i] = true;
      continue;
    }
    a->val[i] += (double)(v1[0] - a->v0[i][0]);
    a->enabled[i] += (double)(v1[1] - a->v0[i][1]);
    a->running[i] += (double)(v1[2] - a->v0[i][2]);
  }
  if (mlxd_acct.fd[MLXD_PERF_SYSCALL] >= 0 && !a->failed[MLXD_PERF_SYSCALL])
    a->val[MLXD_PERF_SYSCALL] -= 1; /* the disabling ioctl */
}

/* The row's counts per op into r->acct, and their maximum over the ranks
 * into r->acct_max (through the benchmark's all_max, after the timed part). */
static int mlxd_acct_finish(const mlxd_bench_hooks* h, const mlxd_acct_sum* a, long ops,
                            mlxd_bench_result* r) {
  double v[2 * MLXD_ACCT_N]; /* the counts, then 1 where n/a */
  for (int i = 0; i < 3; i++) {
    v[i] = a->ru[i] / (double)ops;
    v[MLXD_ACCT_N + i] = 0;
  }
  for (int i = 0; i < MLXD_PERF_N; i++) {
    int k = MLXD_ACCT_INSTR + i;
    bool na = mlxd_acct.fd[i] < 0 || a->failed[i] || (a->enabled[i] > 0 && a->running[i] <= 0);
    double c = a->val[i] < 0 ? 0 : a->val[i];
    /* the counter shared the hardware with others part of the time: scale up */
    if (!na && a->running[i] > 0 && a->running[i] < a->enabled[i])
      c *= a->enabled[i] / a->running[i];
    v[k] = na ? 0 : c / (double)ops;
    v[MLXD_ACCT_N + k] = na ? 1 : 0;
  }
  for (int i = 0; i < MLXD_ACCT_N; i++) r->acct[i] = v[MLXD_ACCT_N + i] != 0 ? -1 : v[i];
  if (h->all_max(h->ctx, v, 2 * MLXD_ACCT_N) != 0) return -1;
  for (int i = 0; i < MLXD_ACCT_N; i++) r->acct_max[i] = v[MLXD_ACCT_N + i] != 0 ? -1 : v[i];
  return 0;
}

/* k ops back to back; *per_op: the slowest rank's time per op. acc: count
 * the ops (not the all_max) into it, or NULL. */
static int mlxd_timed_ops(const mlxd_bench_hooks* h, long k, double* per_op, mlxd_acct_sum* acc) {
  if (acc) mlxd_acct_start(acc);
  double t0 = mlxd_bench_now();
  for (long i = 0; i < k; i++)
    if (h->run_op(h->ctx) != 0) {
      if (acc) mlxd_acct_stop(acc);
      return -1;
    }
  *per_op = (mlxd_bench_now() - t0) / (double)k;
  if (acc) mlxd_acct_stop(acc);
  return h->all_max(h->ctx, per_op, 1);
}

int mlxd_bench_measure(const mlxd_bench_opts* o, const mlxd_bench_hooks* h, mlxd_bench_result* r) {
  memset(r, 0, sizeof *r);
  /* warm-up: the first op alone (whatever it carries stays out of the
   * estimate), then the rest together; each step gives the slowest rank's
   * time per op */
  double est = 0;
  bool first = o->warmup > 0 || o->min_time_ms > 0;
  if (first && mlxd_timed_ops(h, 1, &est, NULL) != 0) return -1;
  long last = first ? mlxd_bench_warm_rest(o, est) : 0;
  if (last > 0 && mlxd_timed_ops(h, last, &est, NULL) != 0) return -1;
  /* calibration, untimed too: until a step takes a tenth of a batch, a
   * longer step (a handful of ops right after a size change can be much
   * slower than the steady state, so the warm-up's few ops alone misjudge) */
  if (o->min_time_ms > 0) {
    double step = 0.1 * o->min_time_ms * 1e-3 / o->batches;
    while ((double)last * est < step && last < o->max_iters) {
      double want = est > 0 ? ceil(1.5 * step / est) : (double)o->max_iters;
      if (want < 2.0 * (double)last) want = 2.0 * (double)last;
      if (want < 1) want = 1;
      if (want > o->max_iters) want = o->max_iters;
      last = (long)want;
      if (mlxd_timed_ops(h, last, &est, NULL) != 0) return -1;
    }
  }
  long k = mlxd_bench_batch_iters(o, est);
  int limit = mlxd_bench_batch_limit(o);
  double* bt = malloc((size_t)limit * sizeof *bt);
  if (!bt) return -1;
  /* timed batches; the all_max after each one lines the ranks up for the
   * next. A batch that ran faster than the estimate raises the iterations of
   * the next ones (never lowers them); batches are added while the timed
   * total is under min_time_ms, or while the median is unsettled and the
   * total is under twice that (within the batch limit either way). */
  int nb = 0;
  long total = 0;
  double timed = 0, cpu = 0;
  mlxd_acct_sum acct;
  memset(&acct, 0, sizeof acct);
  if (o->account) mlxd_bench_acct_open();
  while (nb < o->batches ||
         (nb < limit && (timed < 1e-3 * o->min_time_ms ||
                         (timed < 2e-3 * o->min_time_ms && mlxd_bench_unsettled(bt, nb))))) {
    double c0 = mlxd_bench_cpu(), v = 0;
    if (mlxd_timed_ops(h, k, &v, o->account ? &acct : NULL) != 0) {
      free(bt);
      return -1;
    }
    cpu += mlxd_bench_cpu() - c0;
    bt[nb++] = v;
    timed += v * (double)k;
    total += k;
    long next = mlxd_bench_batch_iters(o, v);
    if (next > k) k = next;
  }
  r->iters = total / nb;
  r->batches = nb;
  r->cpu_s = cpu / (double)total;
  r->time_s = mlxd_bench_median(bt, nb); /* sorts bt */
  r->min_s = bt[0];
  r->max_s = bt[nb - 1];
  free(bt);
  return o->account ? mlxd_acct_finish(h, &acct, total, r) : 0;
}

int mlxd_bench_bind(int rank) {
#ifdef __linux__
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  if (ncpu < 1) ncpu = 1;
  int cpu = (int)(rank % ncpu);
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  /* every thread there is now (the libraries' helper threads included);
   * threads made later inherit the mask of the thread that makes them */
  DIR* d = opendir("/proc/self/task");
  if (!d) {
    fprintf(stderr, "[bench] --bind: cannot list /proc/self/task: %s.\n", strerror(errno));
    return -1;
  }
  int rc = 0;
  for (struct dirent* e; (e = readdir(d)) != NULL;) {
    if (e->d_name[0] == '.') continue;
    pid_t tid = (pid_t)atol(e->d_name);
    if (sched_setaffinity(tid, sizeof set, &set) != 0 && errno != ESRCH) {
      fprintf(stderr, "[bench] --bind: cannot pin thread %ld to CPU %d: %s.\n", (long)tid, cpu,
              strerror(errno));
      rc = -1;
      break;
    }
  }
  closedir(d);
  return rc;
#else
  (void)rank;
  fprintf(stderr, "[bench] --bind is only implemented on Linux.\n");
  return -1;
#endif
}
