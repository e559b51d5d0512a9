/* The spin rule (spin.h): a rank that shares its CPUs with more ranks of its
 * group than there are CPUs must not hold one spinning while the peer it
 * waits for sits descheduled behind it. docs/performance.md, "Spinning on
 * a crowded machine", has the measurements behind the numbers.
 *
 * The single-copy rule (spin.h) has the same cause: a lane copy needs the
 * sender and the receiver on a CPU at the same time, a process_vm_readv only
 * the receiver. docs/performance.md, "Single copy by default on a crowded
 * host", has its measurements. */
#include "transport/spin.h"

#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include "transport/cma_calib.h"
#include "util/env.h"
#include "util/tunables.h"

int mlxd_usable_cpus(void) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 && n < 1 << 20 ? (int)n : 1;
}

mlxd_spin_rule mlxd_spin_rule_for(int local_ranks) {
  mlxd_spin_rule r = {0};
  r.cpus = mlxd_usable_cpus();
  r.crowded = local_ranks > r.cpus;
  r.yield = r.crowded;
  const char* set = mlxd_env_tunable(MLXD_T_SPIN_US);
  double us = set && *set ? mlxd_tunable_double(MLXD_T_SPIN_US)
              : r.crowded ? MLXD_SPIN_CROWDED_US
                          : mlxd_tunable_double(MLXD_T_SPIN_US);
  if (!(us > 0)) us = 0;
  if (us > 1e6) us = 1e6;
  r.spin_s = us * 1e-6;
  return r;
}

/* The threshold where MLXDIST_SHM_CMA_BYTES or the crowded rule decides it
 * (the same for both kinds of message): *n and what decided; else
 * MLXD_SHM_CMA_FROM_CALIBRATION, *n untouched. */
static mlxd_shm_cma_from cma_set_or_crowded(bool crowded, size_t* n) {
  const char* set = mlxd_env_tunable(MLXD_T_SHM_CMA_BYTES);
  if (set && *set) {
    long v = mlxd_tunable_long(MLXD_T_SHM_CMA_BYTES);
    *n = v > 0 ? (size_t)v : 0;
    return MLXD_SHM_CMA_FROM_ENV;
  }
  if (crowded) {
    *n = MLXD_SHM_CMA_CROWDED_BYTES;
    return MLXD_SHM_CMA_FROM_CROWDED;
  }
  return MLXD_SHM_CMA_FROM_CALIBRATION;
}

size_t mlxd_shm_cma_bytes_from(bool crowded, mlxd_shm_cma_from* from) {
  size_t n = 0;
  mlxd_shm_cma_from f = cma_set_or_crowded(crowded, &n);
  if (f == MLXD_SHM_CMA_FROM_CALIBRATION) n = mlxd_cma_calibrated()->bytes;
  if (from) *from = f;
  return n;
}

size_t mlxd_shm_cma_bytes_for(bool crowded) { return mlxd_shm_cma_bytes_from(crowded, NULL); }

size_t mlxd_shm_cma_p2p_bytes_for(bool crowded) {
  size_t n = 0; /* not set, not crowded: the lanes */
  cma_set_or_crowded(crowded, &n);
  return n;
}
