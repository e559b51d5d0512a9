/* The mpi plugin's entry point: the exported mlxdist_plugin_v4 (or _v1 to
 * _v3 in the test builds against the frozen older headers, mpi_abi.h) and
 * the plugin table it returns (mlx/c/plugin/plugin_v4.h). */
#include <stddef.h>

#include "backends/mpi/mpi_internal.h"

#define MPI_EXPORT __attribute__((visibility("default")))

/* ---------------------------------------------------------------------- */
/* The entry point. */

static const mpip_plugin k_plugin = {
    .struct_size = sizeof(mpip_plugin),
    .version = MPIP_VERSION,
    .name = "mpi",
    .is_available = mlxd_mpi_is_available,
    .is_configured = mlxd_mpi_is_configured,
    .supports_bootstrap = false, /* MPI bootstraps through its launcher only */
    .create = mlxd_mpi_create,
};

MPI_EXPORT const mpip_plugin* MPIP_ENTRY(const mpip_host* host);

const mpip_plugin* MPIP_ENTRY(const mpip_host* host) {
  /* Every host member this plugin calls must be in the host's table. */
  if (!host || host->version < MPIP_VERSION ||
      host->struct_size < offsetof(mpip_host, spin_us) + sizeof(host->spin_us) || !host->reduce ||
      !host->dtype_size || !host->timeout_s || !host->spin_us)
    return NULL;
  mlxd_mpi_set_host(host);
  mlxd_mpi_progress_init();
  return &k_plugin;
}
