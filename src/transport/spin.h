/* Private: what a transport does differently on a crowded host, decided
 * once per transport: how a waiting thread spends the time before it blocks,
 * and from what size shared memory moves a message in one copy (on a host
 * that is not crowded, as the machine's calibration decided: cma_calib.h). */
#ifndef MLXD_SPIN_H
#define MLXD_SPIN_H

#include <stdbool.h>
#include <stddef.h>

/* The spin budget of a rank on a crowded host (more of the group's ranks on
 * it than CPUs this process may run on), unless MLXDIST_SPIN_US is set. */
#define MLXD_SPIN_CROWDED_US 100.0

typedef struct mlxd_spin_rule {
  double spin_s; /* how long a wait polls after the last event before it blocks */
  bool yield;    /* sched_yield between polls (crowded: the peer may need this CPU) */
  bool crowded;  /* local_ranks > cpus */
  int cpus;      /* CPUs this process may run on (sched_getaffinity), >= 1 */
} mlxd_spin_rule;

/* CPUs this process may run on (sched_getaffinity; where that fails, the
 * online CPUs), >= 1. One system call; cannot fail. */
int mlxd_usable_cpus(void);

/* The rule for a rank whose host runs local_ranks of the group's ranks
 * (the transport's best knowledge; <= 0 counts as 1). Crowded: yield, and
 * spin MLXD_SPIN_CROWDED_US; otherwise poll without yielding for the
 * default MLXDIST_SPIN_US. A value of MLXDIST_SPIN_US set in the environment
 * is the budget in both cases (the yield still follows the crowding).
 * Never blocks (one sched_getaffinity call), takes no lock, cannot fail. */
mlxd_spin_rule mlxd_spin_rule_for(int local_ranks);

/* The single-copy threshold of the shared-memory transport on a crowded
 * host, unless MLXDIST_SHM_CMA_BYTES is set: 32 MiB. */
#define MLXD_SHM_CMA_CROWDED_BYTES ((size_t)32 << 20)

/* The shared-memory transport's single-copy threshold for collectives (shm.c: a message of
 * at least this many bytes is read by its receiver straight from the
 * sender's memory with process_vm_readv, where the pair's probe found that
 * allowed; 0: never) for a host that is crowded or not (mlxd_spin_rule's
 * `crowded`). MLXDIST_SHM_CMA_BYTES set in the environment (to anything
 * non-empty, 0 included: off) is the answer on every host; unset, it is
 * MLXD_SHM_CMA_CROWDED_BYTES when crowded, and otherwise what this
 * machine's calibration chose (cma_calib.h mlxd_cma_calibrated: 0 or one
 * of the sizes it measured). Neither the variable nor a crowded host runs
 * or reads the calibration. Reads the environment (values were validated
 * at init); cannot fail. The first call that needs the calibration in a
 * process blocks for it (this boot's cache file, or a measurement bounded
 * by MLXD_CMA_BUDGET_S); every other call returns at once. */
size_t mlxd_shm_cma_bytes_for(bool crowded);

/* The same threshold for point-to-point messages (tag kind MLXD_TAG_P2P),
 * which go one way: over the lanes the sender's copy and the receiver's
 * run on two cores at once, slot by slot, one copy per core, so a single
 * copy on the receiver's core alone saves no copy per core, and its page
 * pinning is extra (a 16 MiB ping-pong on the Intel Xeon VM: 1.4-1.6 ms
 * over the lanes, 1.6-1.9 ms read in one copy). MLXDIST_SHM_CMA_BYTES set:
 * its value; crowded: MLXD_SHM_CMA_CROWDED_BYTES (the receiver alone runs);
 * otherwise 0, the lanes. Collectives, where each rank sends while it
 * receives, use mlxd_shm_cma_bytes_for. Cannot fail, never blocks. */
size_t mlxd_shm_cma_p2p_bytes_for(bool crowded);

/* What decided mlxd_shm_cma_bytes_for's answer. */
typedef enum mlxd_shm_cma_from {
  MLXD_SHM_CMA_FROM_ENV = 1,        /* MLXDIST_SHM_CMA_BYTES */
  MLXD_SHM_CMA_FROM_CROWDED = 2,    /* the crowded host's MLXD_SHM_CMA_CROWDED_BYTES */
  MLXD_SHM_CMA_FROM_CALIBRATION = 3 /* mlxd_cma_calibrated (its source: cache or measured) */
} mlxd_shm_cma_from;

/* mlxd_shm_cma_bytes_for, and in *from (if not NULL) what decided it. */
size_t mlxd_shm_cma_bytes_from(bool crowded, mlxd_shm_cma_from* from);

/* The shared-memory transport's whole-block threshold
 * (mlxd_transport.whole_min) when every rank of the group is on a crowded
 * host: the single copy's default threshold, so that the blocks sent whole
 * are the ones that go in one copy where MLXDIST_SHM_CMA_BYTES is unset.
 * Not moved by MLXDIST_SHM_CMA_BYTES (the ranks would have to agree on it);
 * where that turns the single copy off, whole blocks take the lanes, all
 * peers at once, which measured no slower than the pipeline on a
 * crowded host (docs/performance.md). */
#define MLXD_SHM_WHOLE_CROWDED_BYTES MLXD_SHM_CMA_CROWDED_BYTES

#endif
