/* The nccl and jaccl backend kinds. This build has neither CUDA nor
 * ibverbs, so both report honestly that they cannot be used; they still
 * say whether their launch configuration is present (so init("any") can
 * explain what it skipped) and jaccl says whether an RDMA device exists. */
#include <dirent.h>
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

/* ---- jaccl ---- */

static const char* const k_jaccl_env[] = {"MLX_RANK", "MLX_IBV_DEVICES", "MLX_JACCL_COORDINATOR"};
#define JACCL_NOT_BUILT "[jaccl] mlxdist was built without ibverbs/RDMA support"

/* "; this machine has RDMA device(s) mlx5_0, ..." or "; this machine has no
 * RDMA device (/sys/class/infiniband is empty or absent)". */
static void jaccl_why(char* why, size_t len) {
  char devs[256];
  size_t used = 0;
  devs[0] = '\0';
  DIR* d = opendir("/sys/class/infiniband");
  if (d) {
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
      if (e->d_name[0] == '.') continue;
      int w = snprintf(devs + used, sizeof devs - used, "%s%s", used ? ", " : "", e->d_name);
      if (w < 0 || (size_t)w >= sizeof devs - used) break;
      used += (size_t)w;
    }
    closedir(d);
  }
  if (devs[0])
    snprintf(why, len,
             "%s, so the RDMA device(s) found in /sys/class/infiniband (%s) cannot be used",
             JACCL_NOT_BUILT, devs);
  else
    snprintf(why, len, "%s (and this machine has no RDMA device in /sys/class/infiniband)",
             JACCL_NOT_BUILT);
}

static bool jaccl_available(char* why, size_t len) {
  if (why && len) jaccl_why(why, len);
  return false;
}

static bool jaccl_configured(bool with_bootstrap) {
  /* With a caller's all-gather the coordinator is not needed. */
  int n = with_bootstrap ? 2 : 3;
  for (int i = 0; i < n; i++)
    if (!env_set(k_jaccl_env[i])) return false;
  return true;
}

static int jaccl_create(mlxd_bootstrap* bs, mlxd_backend** out, mlxd_status* st) {
  *out = NULL;
  char why[MLXD_MSG_MAX];
  jaccl_why(why, sizeof why);
  char unset[256];
  list_unset(unset, sizeof unset, k_jaccl_env, bs ? 2 : 3);
  if (unset[0])
    return mlxd_fail(st, MLXD_EUNAVAIL, "%.300s; its configuration is also missing (%s not set)",
                     why, unset);
  return mlxd_fail(st, MLXD_EUNAVAIL, "%s", why);
}

const mlxd_backend_kind mlxd_jaccl_kind = {
    .name = "jaccl",
    .is_available = jaccl_available,
    .is_configured = jaccl_configured,
    .create = jaccl_create,
    .supports_bootstrap = true,
};
