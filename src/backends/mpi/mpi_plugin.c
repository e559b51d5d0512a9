/* The mpi plugin's entry point: the exported mlxdist_plugin_v1 and the
 * kind table it returns (see distributed/plugin_abi.h). */
#include <stddef.h>

#include "backends/mpi/mpi_internal.h"

#define MPI_EXPORT __attribute__((visibility("default")))

/* ---------------------------------------------------------------------- */
/* The entry point. */

static const mlxd_plugin k_plugin = {
    MLXD_PLUGIN_ABI_VERSION,
    sizeof(mlxd_plugin),
    {"mpi", mlxd_mpi_is_available, mlxd_mpi_is_configured, mlxd_mpi_create, false},
};

MPI_EXPORT const mlxd_plugin* mlxdist_plugin_v1(const mlxd_host_api* host);

const mlxd_plugin* mlxdist_plugin_v1(const mlxd_host_api* host) {
  if (!host || host->abi_version != MLXD_PLUGIN_ABI_VERSION ||
      host->struct_size < offsetof(mlxd_host_api, spin_us) + sizeof(host->spin_us) ||
      !host->reduce || !host->dtype_size || !host->timeout_s || !host->spin_us)
    return NULL;
  mlxd_mpi_set_host(host);
  mlxd_mpi_progress_init();
  return &k_plugin;
}
