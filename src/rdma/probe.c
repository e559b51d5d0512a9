/* The verbs probe (probe.h): libibverbs loaded at run time, its devices and
 * ports looked at. The ABI used is declared in abi.h. */
#include "rdma/probe.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rdma/abi.h"
#include "rdma/lib.h"
#include "util/tunables.h"

#define SYSFS "/sys/class/infiniband"

typedef mlxd_verbs_lib ibv_api;

/* The GID's type from sysfs ("RoCE v2", "IB/RoCE v1"); "" when unknown. */
static void gid_type(const char* dev, int port, int idx, char* out, size_t len) {
  out[0] = '\0';
  char path[256];
  snprintf(path, sizeof path, SYSFS "/%s/ports/%d/gid_attrs/types/%d", dev, port, idx);
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return;
  char buf[32];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return;
  buf[n] = '\0';
  size_t k = strcspn(buf, "\n");
  buf[k] = '\0';
  for (size_t i = 0; i < k; i++) /* a sysfs file is trusted to be text, but check */
    if ((unsigned char)buf[i] < 0x20 || (unsigned char)buf[i] > 0x7e) return;
  snprintf(out, len, "%.*s", (int)(len - 1), buf);
}

static bool gid_zero(const uint8_t g[16]) {
  for (int i = 0; i < 16; i++)
    if (g[i]) return false;
  return true;
}

/* The GID an Ethernet port would use: MLXDIST_IB_GID_INDEX, else the first
 * RoCE v2 entry with an IPv4-mapped address (an entry whose type sysfs
 * cannot tell is taken only when no RoCE v2 one exists). */
static void choose_gid(const ibv_api* api, struct mlxd_abi_context* ctx, const char* dev,
                       mlxd_verbs_port* pt) {
  long forced = mlxd_tunable_long(MLXD_T_IB_GID_INDEX);
  int n = pt->gid_tbl_len > 1024 ? 1024 : pt->gid_tbl_len;
  if (forced >= 0) {
    if (forced >= n) {
      snprintf(pt->err, sizeof pt->err,
               "MLXDIST_IB_GID_INDEX=%ld is past the port's GID table (%d entries)", forced, n);
      return;
    }
    if (api->query_gid(ctx, (uint8_t)pt->num, (int)forced, pt->gid) != 0) {
      snprintf(pt->err, sizeof pt->err, "ibv_query_gid of MLXDIST_IB_GID_INDEX=%ld failed", forced);
      return;
    }
    if (gid_zero(pt->gid)) { /* an unused entry: no address to be reached at */
      snprintf(pt->err, sizeof pt->err,
               "MLXDIST_IB_GID_INDEX=%ld is an empty entry of the port's GID table (unset it to "
               "choose by content)",
               forced);
      return;
    }
    pt->gid_index = (int)forced;
    gid_type(dev, pt->num, (int)forced, pt->gid_type, sizeof pt->gid_type);
    return;
  }
  int fallback = -1;
  uint8_t fb_gid[16];
  for (int i = 0; i < n; i++) {
    uint8_t g[16];
    if (api->query_gid(ctx, (uint8_t)pt->num, i, g) != 0 || gid_zero(g)) continue;
    if (!mlxd_verbs_gid_is_ipv4(g)) continue;
    char type[16];
    gid_type(dev, pt->num, i, type, sizeof type);
    if (strcmp(type, "RoCE v2") == 0) {
      pt->gid_index = i;
      memcpy(pt->gid, g, 16);
      snprintf(pt->gid_type, sizeof pt->gid_type, "%s", type);
      return;
    }
    if (fallback < 0 && type[0] == '\0') fallback = i, memcpy(fb_gid, g, 16);
  }
  if (fallback >= 0) {
    pt->gid_index = fallback;
    memcpy(pt->gid, fb_gid, 16);
    return;
  }
  snprintf(pt->err, sizeof pt->err,
           "no RoCE v2 GID with an IPv4 address (give the netdev an IPv4 address, or set "
           "MLXDIST_IB_GID_INDEX)");
}

void mlxd_verbs_query_port(const mlxd_verbs_lib* api, struct mlxd_abi_context* ctx, const char* dev,
                           int num, mlxd_verbs_port* pt) {
  mlxd_abi_port_attr_buf b;
  memset(&b, 0, sizeof b);
  memset(pt, 0, sizeof *pt);
  pt->num = num;
  pt->gid_index = -1;
  if (api->query_port(ctx, (uint8_t)pt->num, &b) != 0) {
    snprintf(pt->err, sizeof pt->err, "ibv_query_port failed");
    return;
  }
  pt->queried = true;
  pt->state = b.a.state;
  pt->active_mtu = mlxd_verbs_mtu_bytes(b.a.active_mtu);
  pt->link_layer = b.a.link_layer;
  pt->lid = b.a.lid;
  pt->gid_tbl_len = b.a.gid_tbl_len < 0 ? 0 : b.a.gid_tbl_len;
  /* InfiniBand without a global route uses the LID; Ethernet (RoCE) needs a GID */
  if (pt->link_layer != MLXD_ABI_LINK_LAYER_INFINIBAND) choose_gid(api, ctx, dev, pt);
}

void mlxd_verbs_probe_run(mlxd_verbs_probe* p) {
  memset(p, 0, sizeof *p);
  mlxd_verbs_lib_err le;
  const ibv_api* api = mlxd_verbs_lib_get(&le);
  snprintf(p->lib_name, sizeof p->lib_name, "%s", le.name);
  if (!api) {
    snprintf(p->lib_err, sizeof p->lib_err, "%s", le.err);
    p->lib = le.loaded ? MLXD_VERBS_BAD_LIBRARY : MLXD_VERBS_NO_LIBRARY;
    return;
  }
  int n = 0;
  struct mlxd_abi_device** list = api->get_device_list(&n);
  if (!list) {
    int e = errno;
    struct stat sb;
    p->lib = MLXD_VERBS_LIST_FAILED;
    snprintf(p->lib_err, sizeof p->lib_err, "ibv_get_device_list: %s%s", strerror(e),
             stat("/sys/class/infiniband_verbs", &sb) != 0
                 ? "; the kernel has no verbs support loaded (no /sys/class/infiniband_verbs)"
                 : "");
    return;
  }
  long only_port = mlxd_tunable_long(MLXD_T_IB_PORT);
  for (int i = 0; i < n && list[i] && p->ndev < MLXD_VERBS_MAX_DEVS; i++) {
    mlxd_verbs_dev* d = &p->devs[p->ndev++];
    const char* name = api->get_device_name(list[i]);
    snprintf(d->name, sizeof d->name, "%s", name ? name : "?");
    struct mlxd_abi_context* ctx = api->open_device(list[i]);
    if (!ctx) {
      snprintf(d->err, sizeof d->err, "ibv_open_device failed (permissions on /dev/infiniband?)");
      continue;
    }
    mlxd_abi_device_attr da;
    memset(&da, 0, sizeof da);
    if (api->query_device(ctx, &da) != 0) {
      snprintf(d->err, sizeof d->err, "ibv_query_device failed");
    } else {
      int np = da.phys_port_cnt > MLXD_VERBS_MAX_PORTS ? MLXD_VERBS_MAX_PORTS : da.phys_port_cnt;
      for (int k = 1; k <= np; k++) {
        if (only_port > 0 && k != only_port) continue;
        mlxd_verbs_query_port(api, ctx, d->name, k, &d->ports[d->nports++]);
      }
      if (only_port > np)
        snprintf(d->err, sizeof d->err, "MLXDIST_IB_PORT=%ld but the device has %d port(s)",
                 only_port, (int)da.phys_port_cnt);
    }
    api->close_device(ctx);
  }
  api->free_device_list(list);
}

const mlxd_verbs_dev* mlxd_verbs_find(const mlxd_verbs_probe* p, const char* name) {
  for (int i = 0; i < p->ndev; i++)
    if (strcmp(p->devs[i].name, name) == 0) return &p->devs[i];
  return NULL;
}

/* Active, and with an address to use: the LID on InfiniBand, else a GID
 * (none when the table has no RoCE v2 IPv4 entry or a forced index is empty). */
static bool port_usable(const mlxd_verbs_port* pt) {
  return pt->queried && pt->state == MLXD_ABI_PORT_ACTIVE &&
         (pt->link_layer == MLXD_ABI_LINK_LAYER_INFINIBAND || pt->gid_index >= 0);
}

const mlxd_verbs_port* mlxd_verbs_active_port(const mlxd_verbs_dev* d) {
  for (int k = 0; k < d->nports; k++)
    if (port_usable(&d->ports[k])) return &d->ports[k];
  return NULL;
}

const char* mlxd_verbs_port_word(const mlxd_verbs_port* pt) {
  if (!pt->queried) return "unknown";
  if (pt->state == MLXD_ABI_PORT_ACTIVE && !port_usable(pt)) return "ACTIVE but without a GID";
  return mlxd_verbs_state_name(pt->state);
}

bool mlxd_verbs_usable(const mlxd_verbs_probe* p, char* why, size_t len) {
  if (why && len) why[0] = '\0';
  switch (p->lib) {
    case MLXD_VERBS_NO_LIBRARY:
      if (why)
        snprintf(why, len,
                 "no libibverbs: cannot load %s (%s); install libibverbs1 (rdma-core) or set "
                 "MLXDIST_IBVERBS_LIB",
                 p->lib_name, p->lib_err);
      return false;
    case MLXD_VERBS_BAD_LIBRARY:
      if (why) snprintf(why, len, "%s is not a usable libibverbs: %s", p->lib_name, p->lib_err);
      return false;
    case MLXD_VERBS_LIST_FAILED:
      if (why)
        snprintf(why, len, "no RDMA device: libibverbs (%s) lists none (%s)", p->lib_name,
                 p->lib_err);
      return false;
    default: break;
  }
  if (p->ndev == 0) {
    if (why)
      snprintf(why, len,
               "no RDMA device: libibverbs (%s) lists none (for soft-RoCE: rdma link add rxe0 "
               "type rxe netdev <if>)",
               p->lib_name);
    return false;
  }
  for (int i = 0; i < p->ndev; i++)
    if (mlxd_verbs_active_port(&p->devs[i])) return true;
  if (!why) return false;
  size_t used = (size_t)snprintf(why, len, "no active port: ");
  for (int i = 0; i < p->ndev && used < len; i++) {
    const mlxd_verbs_dev* d = &p->devs[i];
    int w;
    if (d->err[0] && d->nports == 0)
      w = snprintf(why + used, len - used, "%s%s: %s", i ? "; " : "", d->name, d->err);
    else if (d->nports == 0)
      w = snprintf(why + used, len - used, "%s%s: no port", i ? "; " : "", d->name);
    else {
      w = snprintf(why + used, len - used, "%s%s", i ? "; " : "", d->name);
      for (int k = 0; k < d->nports && w >= 0 && used + (size_t)w < len; k++) {
        const mlxd_verbs_port* pt = &d->ports[k];
        int w2 = snprintf(why + used + (size_t)w, len - used - (size_t)w, " port %d %s%s", pt->num,
                          mlxd_verbs_port_word(pt), k + 1 < d->nports ? "," : "");
        if (w2 < 0) break;
        w += w2;
      }
    }
    if (w < 0) break;
    used += (size_t)w;
  }
  return false;
}

const char* mlxd_verbs_state_name(int state) {
  switch (state) {
    case 0: return "NOP";
    case 1: return "DOWN";
    case 2: return "INIT";
    case 3: return "ARMED";
    case 4: return "ACTIVE";
    case 5: return "ACTIVE_DEFER";
    default: return "UNKNOWN";
  }
}

int mlxd_verbs_mtu_bytes(int ibv_mtu) { return ibv_mtu >= 1 && ibv_mtu <= 5 ? 128 << ibv_mtu : 0; }

const char* mlxd_verbs_link_name(int link_layer) {
  return link_layer == MLXD_ABI_LINK_LAYER_INFINIBAND ? "InfiniBand"
         : link_layer == MLXD_ABI_LINK_LAYER_ETHERNET ? "Ethernet"
                                                      : "unspecified link layer";
}

bool mlxd_verbs_gid_is_ipv4(const uint8_t g[16]) {
  for (int i = 0; i < 10; i++)
    if (g[i]) return false;
  return g[10] == 0xff && g[11] == 0xff;
}

void mlxd_verbs_gid_text(const uint8_t g[16], char* buf, size_t len) {
  char t[INET6_ADDRSTRLEN];
  if (!inet_ntop(AF_INET6, g, t, sizeof t)) snprintf(t, sizeof t, "?");
  snprintf(buf, len, "%s", t);
}

void mlxd_verbs_port_line(const mlxd_verbs_dev* d, const mlxd_verbs_port* pt, char* buf,
                          size_t len) {
  if (!pt->queried) {
    snprintf(buf, len, "%s port %d: %s", d->name, pt->num, pt->err[0] ? pt->err : "not queried");
    return;
  }
  char addr[96];
  if (pt->link_layer == MLXD_ABI_LINK_LAYER_INFINIBAND) {
    snprintf(addr, sizeof addr, "LID %u", (unsigned)pt->lid);
  } else if (pt->gid_index >= 0) {
    char g[INET6_ADDRSTRLEN];
    mlxd_verbs_gid_text(pt->gid, g, sizeof g);
    snprintf(addr, sizeof addr, "GID %d %s (%s)", pt->gid_index, g,
             pt->gid_type[0] ? pt->gid_type : "type unknown");
  } else {
    snprintf(addr, sizeof addr, "no GID");
  }
  snprintf(buf, len, "%s port %d: %s, mtu %d, %s, %s%s%s", d->name, pt->num,
           mlxd_verbs_state_name(pt->state), pt->active_mtu, mlxd_verbs_link_name(pt->link_layer),
           addr, pt->err[0] ? ": " : "", pt->err);
}
