/* Private: a job's rank, size and all-gather from the PMIx server that
 * started this process (Slurm's `srun --mpi=pmix`, Open MPI's mpirun,
 * PRRTE). libpmix is opened at run time (never linked; MLXDIST_PMIX_LIB);
 * the ABI used is declared by hand in pmix_abi.h. See docs/pmix.md.
 *
 * PMIx is initialised once per process (PMIx_Init, on the first open) and
 * finalised once, at process exit, by the process that initialised it
 * (bounded: a server that does not answer does not hold the exit up). A
 * forked child never uses its parent's PMIx connection. */
#ifndef MLXD_PMIX_H
#define MLXD_PMIX_H

#include <stdbool.h>
#include <stddef.h>

#include "distributed/backend.h"
#include "util/status.h"

/* A PMIx server started this process: PMIX_NAMESPACE and PMIX_RANK are set
 * (every PMIx server puts them in its clients' environment). Reads the
 * environment only; loads nothing. */
bool mlxd_pmix_present(void);

/* The job as PMIx describes it. bs.rank, bs.size: this process's rank in
 * its namespace and the job's size (PMIX_JOB_SIZE); bs.all_gather: one
 * round of PMIx_Put (the round's key) + PMIx_Commit + PMIx_Fence collecting
 * the data + PMIx_Get of every rank's value, each wait bounded by
 * timeout_s (PMIX_TIMEOUT given to the server too). Every value that comes
 * back is checked (type, length) before it is copied. local_rank and
 * local_size: this rank's place among the job's ranks on its node (-1 when
 * the server does not say). */
typedef struct mlxd_pmix_job {
  mlxd_bootstrap bs; /* first: the bootstrap sees only this */
  int local_rank, local_size;
  char nspace[256];
  double timeout_s;
} mlxd_pmix_job;

/* Open the job: load libpmix, PMIx_Init (the first time in this process),
 * read rank, size and the local ranks and check them. Blocks at most
 * timeout_s (its own waits); PMIx_Init itself is bounded by the server's
 * connection handshake. Errors (MLXD_LAYER_BOOTSTRAP): the library cannot
 * be loaded (its name and why), the server refuses or is gone, a value out
 * of range (named), a forked child. Thread-safe; callers serialise init. */
int mlxd_pmix_open(mlxd_pmix_job* job, double timeout_s, mlxd_status* st);

#endif
