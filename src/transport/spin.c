/* The spin rule (spin.h): a rank that shares its CPUs with more ranks of its
 * group than there are CPUs must not hold one spinning while the peer it
 * waits for sits descheduled behind it. docs/performance.md, "Spinning on
 * a crowded machine", has the measurements behind the numbers. */
#include "transport/spin.h"

#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include "util/tunables.h"

static int usable_cpus(void) {
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
  r.cpus = usable_cpus();
  r.crowded = local_ranks > r.cpus;
  r.yield = r.crowded;
  const char* set = getenv(mlxd_tunable_env_name(MLXD_T_SPIN_US));
  double us = set && *set ? mlxd_tunable_double(MLXD_T_SPIN_US)
              : r.crowded ? MLXD_SPIN_CROWDED_US
                          : mlxd_tunable_double(MLXD_T_SPIN_US);
  if (!(us > 0)) us = 0;
  if (us > 1e6) us = 1e6;
  r.spin_s = us * 1e-6;
  return r;
}
