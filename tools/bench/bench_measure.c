/* The measurement rule shared by mlxdist-bench and mpi_ref_bench (see
 * bench_common.h and docs/performance.md, "How a row is measured"): the same
 * warm-up, calibration, batches and statistics on both sides, so that the
 * two differ only in the library under the op. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* cpu_set_t, sched_setaffinity */
#endif
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

/* k ops back to back; *per_op: the slowest rank's time per op. */
static int mlxd_timed_ops(const mlxd_bench_hooks* h, long k, double* per_op) {
  double t0 = mlxd_bench_now();
  for (long i = 0; i < k; i++)
    if (h->run_op(h->ctx) != 0) return -1;
  *per_op = (mlxd_bench_now() - t0) / (double)k;
  return h->all_max(h->ctx, per_op, 1);
}

int mlxd_bench_measure(const mlxd_bench_opts* o, const mlxd_bench_hooks* h, mlxd_bench_result* r) {
  memset(r, 0, sizeof *r);
  /* warm-up: the first op alone (whatever it carries stays out of the
   * estimate), then the rest together; each step gives the slowest rank's
   * time per op */
  double est = 0;
  bool first = o->warmup > 0 || o->min_time_ms > 0;
  if (first && mlxd_timed_ops(h, 1, &est) != 0) return -1;
  long last = first ? mlxd_bench_warm_rest(o, est) : 0;
  if (last > 0 && mlxd_timed_ops(h, last, &est) != 0) return -1;
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
      if (mlxd_timed_ops(h, last, &est) != 0) return -1;
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
  while (nb < o->batches ||
         (nb < limit && (timed < 1e-3 * o->min_time_ms ||
                         (timed < 2e-3 * o->min_time_ms && mlxd_bench_unsettled(bt, nb))))) {
    double c0 = mlxd_bench_cpu(), v = 0;
    if (mlxd_timed_ops(h, k, &v) != 0) {
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
  return 0;
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
