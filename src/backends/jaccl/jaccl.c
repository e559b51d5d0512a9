/* The jaccl backend kind (MLX's RDMA backend): its configuration
 * (jaccl_config.c) and this machine's devices (rdma/probe.c). The verbs
 * transport is not built yet in this release, so create always fails, with
 * the first of: the configuration's error, a device the matrix names that
 * this machine does not have, why the devices cannot be used (no library,
 * no device, no active port), else that the transport is not built.
 * See docs/jaccl.md. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backends/jaccl/jaccl_config.h"
#include "rdma/probe.h"
#include "distributed/group_impl.h"

#define TAG "jaccl"

static bool jaccl_available(char* why, size_t len) {
  mlxd_verbs_probe* p = malloc(sizeof *p);
  if (!p) {
    if (why && len) snprintf(why, len, "[jaccl] out of memory probing the RDMA devices");
    return false;
  }
  mlxd_verbs_probe_run(p);
  char w[MLXD_MSG_MAX];
  bool ok = mlxd_verbs_usable(p, w, sizeof w);
  if (!ok && why && len) snprintf(why, len, "[jaccl] %s", w);
  free(p);
  return ok;
}

static bool jaccl_configured(bool with_bootstrap) { return mlxd_jaccl_env_present(with_bootstrap); }

/* The devices /sys/class/infiniband lists (what the kernel has, library or not). */
static bool sysfs_has(const char* name) {
  char path[128];
  struct stat sb;
  snprintf(path, sizeof path, "/sys/class/infiniband/%s", name);
  return stat(path, &sb) == 0;
}

static void list_devices(const mlxd_verbs_probe* p, char* buf, size_t len) {
  size_t used = 0;
  buf[0] = '\0';
  if (p->lib == MLXD_VERBS_OK) {
    for (int i = 0; i < p->ndev; i++) {
      int w = snprintf(buf + used, len - used, "%s%s", i ? ", " : "", p->devs[i].name);
      if (w < 0 || (size_t)w >= len - used) break;
      used += (size_t)w;
    }
  } else {
    DIR* d = opendir("/sys/class/infiniband");
    struct dirent* e;
    while (d && (e = readdir(d)) != NULL) {
      if (e->d_name[0] == '.') continue;
      int w = snprintf(buf + used, len - used, "%s%s", used ? ", " : "", e->d_name);
      if (w < 0 || (size_t)w >= len - used) break;
      used += (size_t)w;
    }
    if (d) closedir(d);
  }
  if (!buf[0]) snprintf(buf, len, "none");
}

/* This rank's row: every device it names must exist here and have an active port. */
static int check_row(const mlxd_jaccl_config* c, const mlxd_verbs_probe* p, mlxd_status* st) {
  char have[400];
  for (int j = 0; j < c->size; j++) {
    int n = mlxd_jaccl_cell_count(&c->m, c->rank, j);
    for (int k = 0; k < n; k++) {
      const char* name = mlxd_jaccl_cell_name(&c->m, c->rank, j, k);
      bool exists = p->lib == MLXD_VERBS_OK ? mlxd_verbs_find(p, name) != NULL : sysfs_has(name);
      if (exists) continue;
      list_devices(p, have, sizeof have);
      return mlxd_fail(st, MLXD_EINVAL,
                       "[jaccl] %s: the device matrix '%s' names '%s' at row %d, column %d (rank "
                       "%d's device to rank %d), but this machine has no such RDMA device "
                       "(devices here: %s; mlxdist-info lists them)",
                       c->devices_var, c->path, name, c->rank, j, c->rank, j, have);
    }
  }
  if (p->lib != MLXD_VERBS_OK) return 0; /* the probe's reason comes next */
  for (int j = 0; j < c->size; j++) {
    int n = mlxd_jaccl_cell_count(&c->m, c->rank, j);
    for (int k = 0; k < n; k++) {
      const mlxd_verbs_dev* d = mlxd_verbs_find(p, mlxd_jaccl_cell_name(&c->m, c->rank, j, k));
      if (mlxd_verbs_active_port(d)) continue;
      char ports[300];
      size_t used = 0;
      ports[0] = '\0';
      for (int q = 0; q < d->nports; q++) {
        int w = snprintf(ports + used, sizeof ports - used, "%sport %d %s", q ? ", " : "",
                         d->ports[q].num, mlxd_verbs_port_word(&d->ports[q]));
        if (w < 0 || (size_t)w >= sizeof ports - used) break;
        used += (size_t)w;
      }
      return mlxd_fail(
          st, MLXD_EUNAVAIL,
          "[jaccl] device '%s' (row %d, column %d of '%s') has no active port (%s%s%s)", d->name,
          c->rank, j, c->path, ports[0] ? ports : "no port", d->err[0] ? "; " : "", d->err);
    }
  }
  return 0;
}

static int jaccl_create(mlxd_bootstrap* bs, mlxd_backend** out, mlxd_status* st) {
  *out = NULL;
  mlxd_verbs_probe* p = malloc(sizeof *p);
  if (!p) return mlxd_fail(st, MLXD_ENOMEM, "[jaccl] out of memory probing the RDMA devices");
  mlxd_verbs_probe_run(p);
  char why[MLXD_MSG_MAX];
  bool usable = mlxd_verbs_usable(p, why, sizeof why);
  mlxd_jaccl_config cfg;
  int rc = mlxd_jaccl_config_load(bs != NULL, &cfg, st);
  if (rc) { /* 1. the configuration */
    mlxd_status_render(st, TAG);
    if (!usable) {
      /* the probe's reason in short ("no libibverbs", "no RDMA device", "no active port"):
       * messages are at most MLXD_MSG_MAX bytes and the configuration's error comes first */
      char tmp[2 * MLXD_MSG_MAX];
      snprintf(tmp, sizeof tmp, "%s (and this machine could not run jaccl anyway: %.*s)", st->msg,
               (int)strcspn(why, ":"), why);
      snprintf(st->msg, sizeof st->msg, "%.*s", (int)sizeof st->msg - 1, tmp);
    }
    free(p);
    return rc;
  }
  rc = check_row(&cfg, p, st); /* 2. the devices this rank's row names */
  if (rc == 0 && !usable)      /* 3. the probe */
    rc = mlxd_fail(st, MLXD_EUNAVAIL, "[jaccl] %s", why);
  /* 4. Everything present and valid. This cannot be reached on a machine without an active
   * RDMA port (the test machines outside a VM); it is what a real RDMA host sees until the
   * verbs transport exists. */
  if (rc == 0)
    rc = mlxd_fail(st, MLXD_EUNAVAIL,
                   "[jaccl] rank %d of %d (%s), devices active, configuration valid, but the "
                   "verbs transport is not built yet in this release (docs/jaccl.md)",
                   cfg.rank, cfg.size, cfg.size > 1 ? mlxd_jaccl_topo_name(cfg.topo) : "alone");
  mlxd_jaccl_config_free(&cfg);
  free(p);
  return rc;
}

const mlxd_backend_kind mlxd_jaccl_kind = {
    .name = "jaccl",
    .is_available = jaccl_available,
    .is_configured = jaccl_configured,
    .create = jaccl_create,
    .supports_bootstrap = true,
    .diagnose_unavailable = true,
};
