/* The ring started by a PMIx server (srun --mpi=pmix, mpirun, PRRTE) with
 * no other configuration: the bootstrap of bootstrap.c with rank, size and
 * the all-gather from PMIx (backends/common/pmix.h). Also which
 * configuration the ring uses when several are present, and the error for
 * a Slurm job step without PMIx. See docs/pmix.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backends/common/pmix.h"
#include "backends/ring/ring_internal.h"
#include "util/tunables.h"

static bool env_set(const char* name) {
  const char* v = getenv(name);
  return v && *v;
}

static bool pmix_off(void) {
  const char* v = mlxd_tunable_str(MLXD_T_PMIX);
  return v && strcasecmp(v, "off") == 0;
}

bool mlxd_ring_pmix_for_any(void) {
  const char* v = mlxd_tunable_str(MLXD_T_PMIX);
  return v && strcasecmp(v, "on") == 0;
}

int mlxd_ring_config_choice(void) {
  if (mlxd_ring_rendezvous_configured()) return MLXD_RING_CFG_RENDEZVOUS;
  /* MLX's launcher (and mlxdist-launch) set these: they win, whatever else is there */
  if (env_set("MLX_RANK") || env_set("MLX_HOSTFILE")) return MLXD_RING_CFG_HOSTFILE;
  if (!pmix_off() && mlxd_pmix_present()) return MLXD_RING_CFG_PMIX;
  return MLXD_RING_CFG_HOSTFILE;
}

int mlxd_ring_slurm_without_pmix(mlxd_status* st) {
  const char* job = getenv("SLURM_JOB_ID");
  const char* proc = getenv("SLURM_PROCID");
  if (!(job && *job) && !(proc && *proc)) return 0;
  if (env_set("MLX_RANK") || env_set("MLX_HOSTFILE")) return 0; /* their own errors */
  if (mlxd_pmix_present() && pmix_off())
    return mlxd_fail_at(st, MLXD_EUNAVAIL, MLXD_LAYER_BOOTSTRAP,
                        "not configured: this is a Slurm job with PMIx, but MLXDIST_PMIX=off; "
                        "unset it, or set MLX_RANK and MLX_HOSTFILE");
  return mlxd_fail_at(
      st, MLXD_EUNAVAIL, MLXD_LAYER_BOOTSTRAP,
      "not configured: this process runs in a Slurm job (SLURM_JOB_ID=%.32s, SLURM_PROCID=%.16s) "
      "but not under PMIx (PMIX_NAMESPACE and PMIX_RANK are unset), so it cannot learn its peers; "
      "start it with `srun --mpi=pmix` (or set MpiDefault=pmix in slurm.conf), or give it "
      "MLX_RANK and MLX_HOSTFILE",
      job && *job ? job : "(unset)", proc && *proc ? proc : "(unset)");
}

int mlxd_ring_create_pmix(mlxd_backend** out, mlxd_status* st) {
  double lt = mlxd_tunable_double(MLXD_T_LAUNCH_TIMEOUT);
  double timeout = lt > 0 ? lt : mlxd_tunable_double(MLXD_T_TIMEOUT);
  mlxd_pmix_job job;
  if (mlxd_pmix_open(&job, timeout, st)) return st->code;
  mlxd_ring_log("PMIx: namespace %s, rank %d of %d, local rank %d of %d on this node (bound %g s)",
                job.nspace, job.bs.rank, job.bs.size, job.local_rank, job.local_size, timeout);
  return mlxd_ring_create_bootstrap_ranked(&job.bs, "PMIx", out, st);
}
