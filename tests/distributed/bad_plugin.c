/* A backend plugin built against a different ABI version: the loader must
 * refuse it with a message naming the file and the versions. */
#include "distributed/plugin_abi.h"

static bool bad_available(char* why, size_t n) {
  (void)why;
  (void)n;
  return true;
}
static bool bad_configured(bool b) {
  (void)b;
  return true;
}
static int bad_create(mlxd_bootstrap* bs, mlxd_backend** out, mlxd_status* st) {
  (void)bs;
  (void)st;
  *out = NULL;
  return MLXD_EUNAVAIL;
}

static const mlxd_plugin k_plugin = {
    MLXD_PLUGIN_ABI_VERSION + 98u,
    sizeof(mlxd_plugin),
    {"mpi", bad_available, bad_configured, bad_create, false},
};

__attribute__((visibility("default"))) const mlxd_plugin* mlxdist_plugin_v1(
    const mlxd_host_api* host) {
  (void)host;
  return &k_plugin;
}
