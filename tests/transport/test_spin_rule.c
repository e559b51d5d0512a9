/* The spin rule (transport/spin.h) on this process's real CPU affinity:
 * pinned to one CPU, one local rank is not crowded (the default budget, no
 * yield) and two are (the crowded budget, yield); MLXDIST_SPIN_US set wins
 * in both cases while the yield still follows the crowding; the full
 * affinity mask is counted, not the machine's CPUs. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"
#include "transport/spin.h"

static int near(double a, double b) { return a > b - 1e-9 && a < b + 1e-9; }

int main(void) {
  cpu_set_t all;
  CPU_ZERO(&all);
  T_REQUIRE(sched_getaffinity(0, sizeof all, &all) == 0);
  int n = CPU_COUNT(&all);
  unsetenv("MLXDIST_SPIN_US");

  mlxd_spin_rule r = mlxd_spin_rule_for(n);
  T_CHECK_EQ(r.cpus, n);
  T_CHECK(!r.crowded && !r.yield && near(r.spin_s, 1000e-6));
  r = mlxd_spin_rule_for(n + 1);
  T_CHECK(r.crowded && r.yield && near(r.spin_s, MLXD_SPIN_CROWDED_US * 1e-6));
  r = mlxd_spin_rule_for(0); /* unknown: one rank */
  T_CHECK(!r.crowded);

  /* Pinned to one CPU: two ranks crowd it. */
  int first = -1;
  for (int c = 0; c < CPU_SETSIZE && first < 0; c++)
    if (CPU_ISSET(c, &all)) first = c;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  T_REQUIRE(sched_setaffinity(0, sizeof one, &one) == 0);
  r = mlxd_spin_rule_for(1);
  T_CHECK(r.cpus == 1 && !r.crowded && !r.yield && near(r.spin_s, 1000e-6));
  r = mlxd_spin_rule_for(2);
  T_CHECK(r.cpus == 1 && r.crowded && r.yield && near(r.spin_s, MLXD_SPIN_CROWDED_US * 1e-6));

  /* Set by the user: the budget everywhere, the yield by crowding. */
  setenv("MLXDIST_SPIN_US", "200", 1);
  r = mlxd_spin_rule_for(2);
  T_CHECK(r.crowded && r.yield && near(r.spin_s, 200e-6));
  r = mlxd_spin_rule_for(1);
  T_CHECK(!r.crowded && !r.yield && near(r.spin_s, 200e-6));
  setenv("MLXDIST_SPIN_US", "0", 1);
  r = mlxd_spin_rule_for(2);
  T_CHECK(r.yield && r.spin_s == 0);
  setenv("MLXDIST_SPIN_US", "", 1); /* empty is unset */
  r = mlxd_spin_rule_for(2);
  T_CHECK(near(r.spin_s, MLXD_SPIN_CROWDED_US * 1e-6));

  T_REQUIRE(sched_setaffinity(0, sizeof all, &all) == 0);
  if (t_check_failures()) return 1;
  printf("spin rule: ok (%d CPUs in the affinity mask)\n", n);
  return 0;
}
