/* Private: monotonic time and deadlines. */
#ifndef MLXD_CLOCK_H
#define MLXD_CLOCK_H

#include <time.h>

/* Seconds since an arbitrary point, CLOCK_MONOTONIC. */
static inline double mlxd_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Milliseconds left until deadline (>= 0, capped to INT32 range) for poll(). */
static inline int mlxd_ms_left(double deadline) {
  double left = (deadline - mlxd_now()) * 1000.0;
  if (left <= 0) return 0;
  if (left > 2e9) return 2000000000;
  return (int)left + 1;
}

#endif
