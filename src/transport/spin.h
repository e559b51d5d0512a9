/* Private: how a waiting thread spends the time before it blocks, decided
 * once per transport from how crowded its host is. */
#ifndef MLXD_SPIN_H
#define MLXD_SPIN_H

#include <stdbool.h>

/* The spin budget of a rank on a crowded host (more of the group's ranks on
 * it than CPUs this process may run on), unless MLXDIST_SPIN_US is set. */
#define MLXD_SPIN_CROWDED_US 100.0

typedef struct mlxd_spin_rule {
  double spin_s; /* how long a wait polls after the last event before it blocks */
  bool yield;    /* sched_yield between polls (crowded: the peer may need this CPU) */
  bool crowded;  /* local_ranks > cpus */
  int cpus;      /* CPUs this process may run on (sched_getaffinity), >= 1 */
} mlxd_spin_rule;

/* The rule for a rank whose host runs local_ranks of the group's ranks
 * (the transport's best knowledge; <= 0 counts as 1). Crowded: yield, and
 * spin MLXD_SPIN_CROWDED_US; otherwise poll without yielding for the
 * default MLXDIST_SPIN_US. A value of MLXDIST_SPIN_US set in the environment
 * is the budget in both cases (the yield still follows the crowding).
 * Never blocks (one sched_getaffinity call), takes no lock, cannot fail. */
mlxd_spin_rule mlxd_spin_rule_for(int local_ranks);

#endif
