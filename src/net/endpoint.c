/* Where a bootstrapped rank listens: MLXDIST_IFNAME (an interface's address,
 * like NCCL_SOCKET_IFNAME) and MLXDIST_PORT_RANGE (ports from A..B instead of
 * ephemeral ones, for firewalled sites). Used by bootstrap.c's default address
 * and by every listen of a bootstrapped group (listen.c's mlxd_net_listen_many). A
 * rank never listens on the wildcard address. */
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "net/net.h"
#include "net/rendezvous_wire.h"
#include "util/tunables.h"

bool mlxd_net_addr_is_wildcard(const mlxd_net_addr* a) {
  if (a->sa.ss_family == AF_INET)
    return ((const struct sockaddr_in*)(const void*)&a->sa)->sin_addr.s_addr == htonl(INADDR_ANY);
  if (a->sa.ss_family == AF_INET6)
    return IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6*)(const void*)&a->sa)->sin6_addr);
  return false;
}

/* The interfaces that exist, "lo, eth0, ..." (each once), into buf. */
static void list_interfaces(const struct ifaddrs* all, char* buf, size_t n) {
  size_t o = 0;
  buf[0] = '\0';
  for (const struct ifaddrs* i = all; i; i = i->ifa_next) {
    bool seen = false;
    for (const struct ifaddrs* j = all; j != i && !seen; j = j->ifa_next)
      seen = strcmp(i->ifa_name, j->ifa_name) == 0;
    if (seen || o + strlen(i->ifa_name) + 3 >= n) continue;
    o += (size_t)snprintf(buf + o, n - o, "%s%s", o ? ", " : "", i->ifa_name);
  }
  if (!buf[0]) snprintf(buf, n, "none");
}

int mlxd_net_ifname_addr(const char* name, mlxd_net_addr* out, mlxd_status* st) {
  struct ifaddrs* all = NULL;
  if (getifaddrs(&all) != 0) {
    mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP,
                 "cannot list the network interfaces for MLXDIST_IFNAME='%s'", name);
    mlxd_status_set_sys(st, "getifaddrs", errno);
    return MLXD_ESYS;
  }
  const struct ifaddrs* v4 = NULL;
  const struct ifaddrs* v6 = NULL;
  bool exists = false;
  for (const struct ifaddrs* i = all; i; i = i->ifa_next) {
    if (strcmp(i->ifa_name, name) != 0) continue;
    exists = true;
    if (!i->ifa_addr) continue;
    if (i->ifa_addr->sa_family == AF_INET && !v4) v4 = i;
    if (i->ifa_addr->sa_family == AF_INET6 && !v6) v6 = i;
  }
  const struct ifaddrs* pick = v4 ? v4 : v6;
  if (!pick) {
    char names[600];
    list_interfaces(all, names, sizeof names);
    freeifaddrs(all);
    if (exists)
      return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                          "MLXDIST_IFNAME='%s': the interface has no IPv4 or IPv6 address to "
                          "listen on",
                          name);
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "MLXDIST_IFNAME='%s': no such network interface on this host (it has: "
                        "%s)",
                        name, names);
  }
  memset(out, 0, sizeof *out);
  if (pick == v4) {
    memcpy(&out->sa, pick->ifa_addr, sizeof(struct sockaddr_in));
    ((struct sockaddr_in*)(void*)&out->sa)->sin_port = 0;
    out->len = sizeof(struct sockaddr_in);
  } else {
    struct sockaddr_in6* in6 = (void*)&out->sa;
    memcpy(in6, pick->ifa_addr, sizeof *in6);
    in6->sin6_port = 0;
    if (IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr) && !in6->sin6_scope_id)
      in6->sin6_scope_id = if_nametoindex(name);
    out->len = sizeof *in6;
  }
  freeifaddrs(all);
  mlxd_net_format_addr((struct sockaddr*)&out->sa, out->text, sizeof out->text);
  mlxd_net_log("MLXDIST_IFNAME=%s: listening on %s", name, out->text);
  return 0;
}

int mlxd_net_port_range(unsigned* lo, unsigned* hi, mlxd_status* st) {
  const char* v = mlxd_tunable_str(MLXD_T_PORT_RANGE);
  *lo = *hi = 0;
  if (!v || !*v) return 0;
  char why[200];
  if (mlxd_rdv_parse_port_range(v, lo, hi, why, sizeof why) != 0)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP, "MLXDIST_PORT_RANGE: %s", why);
  return 0;
}

static void set_port(mlxd_net_addr* a, unsigned port) {
  if (a->sa.ss_family == AF_INET)
    ((struct sockaddr_in*)(void*)&a->sa)->sin_port = htons((uint16_t)port);
  else
    ((struct sockaddr_in6*)(void*)&a->sa)->sin6_port = htons((uint16_t)port);
}

int mlxd_net_listen_in_range(mlxd_net_addr* addr, unsigned lo, unsigned hi, int* fd_out,
                             mlxd_status* st) {
  mlxd_net_addr base = *addr;
  for (unsigned p = lo; p <= hi; p++) {
    mlxd_net_addr a = base;
    set_port(&a, p);
    mlxd_net_format_addr((struct sockaddr*)&a.sa, a.text, sizeof a.text);
    mlxd_status tmp;
    memset(&tmp, 0, sizeof tmp);
    if (mlxd_net_listen(&a, fd_out, &tmp) == 0) {
      *addr = a;
      return 0;
    }
    if (tmp.sys_errno != EADDRINUSE && tmp.sys_errno != EACCES) {
      *st = tmp;
      return st->code;
    }
  }
  return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                      "no free port to listen on in MLXDIST_PORT_RANGE=%u-%u on %s (every "
                      "port is in use; widen the range)",
                      lo, hi, base.text);
}
