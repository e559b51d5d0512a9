/* The nccl backend kind (docs/nccl.md). The backend itself is the plugin
 * libmlxdist-nccl.so (backends/nccl/plugin/), built where the CUDA and
 * NCCL headers were found; this kind loads it, gives it the ncclUniqueId
 * exchange (exchange.h: authenticated, over NCCL_HOST_IP:NCCL_PORT) or the
 * caller's all-gather, and explains why nccl cannot be used when the
 * plugin was not built or cannot load. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/nccl/exchange.h"
#include "core/gpu.h"
#include "distributed/group_impl.h"
#include "distributed/plugin.h"
#include "util/env.h"

bool mlxd_gpu_usable(void) { return mlxd_gpu_count() > 0; }

static bool env_set(const char* name) {
  const char* v = mlxd_env_get(name);
  return v != NULL && *v != '\0';
}

#ifdef MLXDIST_HAVE_NCCL_PLUGIN
#define NOT_LOADED "[nccl] the nccl backend plugin cannot be loaded: "
#else
#define NOT_LOADED                                                                      \
  "[nccl] mlxdist was built without NCCL support (no CUDA runtime and NCCL headers at " \
  "configure time), and no nccl plugin was found: "
#endif

/* The plugin's kind, or NULL with why set. */
static const mlxd_backend_kind* plugin(char* why, size_t len) {
  /* The GPU provider's probe first: it opens the CUDA runtime (MLXDIST_CUDART
   * as checked by the core, else the default names) and the plugin uses
   * that one, found loaded, instead of reading the variable itself. */
  (void)mlxd_gpu_probe();
  char inner[384];
  inner[0] = '\0';
  const mlxd_backend_kind* k = mlxd_plugin_load("nccl", inner, sizeof inner);
  if (!k && why && len) snprintf(why, len, "%s%s", NOT_LOADED, inner);
  return k;
}

static bool nccl_available(char* why, size_t len) {
  const mlxd_backend_kind* k = plugin(why, len);
  return k && k->is_available(why, len);
}

static const char* const k_env[] = {"MLX_RANK", "MLX_WORLD_SIZE", "NCCL_HOST_IP", "NCCL_PORT"};

/* MLX's variables: rank and size always; rank 0's address without a caller's all-gather. */
static bool nccl_configured(bool with_bootstrap) {
  int n = with_bootstrap ? 2 : 4;
  for (int i = 0; i < n; i++)
    if (!env_set(k_env[i])) return false;
  return true;
}

static int nccl_create(mlxd_bootstrap* bs, mlxd_backend** out, mlxd_status* st) {
  *out = NULL;
  char why[MLXD_MSG_MAX];
  const mlxd_backend_kind* k = plugin(why, sizeof why);
  if (!k) return mlxd_fail(st, MLXD_EUNAVAIL, "%s", why);
  if (bs) return k->create(bs, out, st);
  char unset[128] = "";
  size_t used = 0;
  for (int i = 0; i < 4; i++)
    if (!env_set(k_env[i])) {
      int w = snprintf(unset + used, sizeof unset - used, "%s%s", used ? ", " : "", k_env[i]);
      if (w > 0 && (size_t)w < sizeof unset - used) used += (size_t)w;
    }
  if (unset[0])
    return mlxd_fail(st, MLXD_EUNAVAIL,
                     "[nccl] not configured: %s not set (MLX's variables: "
                     "MLX_RANK, MLX_WORLD_SIZE, NCCL_HOST_IP, NCCL_PORT)",
                     unset);
  if (!k->is_available(why, sizeof why)) return mlxd_fail(st, MLXD_EUNAVAIL, "%s", why);
  mlxd_nccl_xchg x;
  if (mlxd_nccl_xchg_from_env(&x, st)) return st->code;
  /* Rank 0 listens before the plugin makes the id, so peers that start
   * early find the port as soon as possible. The exchange is used only
   * inside create (the plugin's contract), so it lives on this stack. */
  int rc = x.rank == 0 ? mlxd_nccl_xchg_listen(&x, st) : 0;
  if (rc == 0) rc = k->create(&x.bs, out, st);
  mlxd_nccl_xchg_close(&x);
  return rc;
}

const mlxd_backend_kind mlxd_nccl_kind = {
    .name = "nccl",
    .is_available = nccl_available,
    .is_configured = nccl_configured,
    .create = nccl_create,
    .supports_bootstrap = true,
};
