/* The nccl backend kind. This build has no CUDA, so it reports honestly
 * that it cannot be used; it still says whether its launch configuration is
 * present (so init("any") can explain what it skipped). jaccl is
 * backends/jaccl/jaccl.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "distributed/group_impl.h"
#include "mlx/c/device.h"

static bool env_set(const char* name) {
  const char* v = getenv(name);
  return v != NULL && *v != '\0';
}

/* Append the names of the unset variables among names[0..n) to buf. */
static void list_unset(char* buf, size_t len, const char* const* names, int n) {
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; i < n; i++) {
    if (env_set(names[i])) continue;
    int w = snprintf(buf + used, len - used, "%s%s", used ? ", " : "", names[i]);
    if (w < 0 || (size_t)w >= len - used) break;
    used += (size_t)w;
  }
}

bool mlxd_gpu_usable(void) {
  int n = 0;
  if (mlx_device_count(&n, MLX_GPU) != 0) return false;
  return n > 0;
}

/* ---- nccl ---- */

static const char* const k_nccl_env[] = {"MLX_RANK", "MLX_WORLD_SIZE", "NCCL_HOST_IP", "NCCL_PORT"};
#define NCCL_NOT_BUILT "[nccl] mlxdist was built without NCCL support (no CUDA here)"

static bool nccl_available(char* why, size_t len) {
  if (why && len) snprintf(why, len, "%s", NCCL_NOT_BUILT);
  return false;
}

static bool nccl_configured(bool with_bootstrap) {
  (void)with_bootstrap;
  for (int i = 0; i < 4; i++)
    if (!env_set(k_nccl_env[i])) return false;
  return true;
}

static int nccl_create(mlxd_bootstrap* bs, mlxd_backend** out, mlxd_status* st) {
  (void)bs;
  *out = NULL;
  char unset[256];
  list_unset(unset, sizeof unset, k_nccl_env, 4);
  if (unset[0])
    return mlxd_fail(st, MLXD_EUNAVAIL, "%s; its configuration is also missing (%s not set)",
                     NCCL_NOT_BUILT, unset);
  return mlxd_fail(st, MLXD_EUNAVAIL, "%s", NCCL_NOT_BUILT);
}

const mlxd_backend_kind mlxd_nccl_kind = {
    .name = "nccl",
    .is_available = nccl_available,
    .is_configured = nccl_configured,
    .create = nccl_create,
    .supports_bootstrap = false,
};
