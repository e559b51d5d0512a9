/* Fuzz target: mlxdist-launch's check of a user's hostfile
 * (tools/launch/hostfile_check.c: the ranks' parser plus the launcher's own
 * limits and agreement with -n and --connections). The first byte chooses -n
 * (0: not given, 1..3) and --connections (0: not given, 1..3); the rest is the
 * file. It must never crash or exit; what it accepts agrees with both options
 * and the launcher's limit, what it refuses says why.
 * The same bytes go to the reader of hostfiles of hosts (tools/launch/hosts.c:
 * MLX's launcher's list and object forms, "host:slots" lines), with -n as the
 * ranks per host: what it accepts has 1..LAUNCH_MAX_RANKS ranks in hosts
 * whose names pass the launcher's check (none starts with '-', so none is an
 * ssh option) and whose "ips" are addresses; host-major rank order covers
 * every rank; what it refuses says why and holds nothing. */
#include <arpa/inet.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "launch/launch.h"
#include "net/net.h"

static void check_hosts(const char* text, size_t len, int n) {
  launch_hosts hs;
  char why[1024];
  why[0] = '\0';
  int rc = launch_hosts_from_file(text, len, "fuzz.json", n, &hs, why, sizeof why);
  if (rc != 0) {
    if ((rc == -1 && !why[0]) || rc < -1 || rc > 1 || hs.h || hs.envs) abort();
    return;
  }
  if (hs.n < 1 || hs.ranks < 1 || hs.ranks > LAUNCH_MAX_RANKS || hs.backend < -1 || hs.backend > 1)
    abort();
  int sum = 0;
  for (int i = 0; i < hs.n; i++) {
    const launch_host* h = &hs.h[i];
    unsigned char b[16];
    if (h->slots < 1 || !launch_host_name_ok(h->name) || h->name[0] == '-') abort();
    if (h->ip[0] && inet_pton(AF_INET, h->ip, b) != 1 && inet_pton(AF_INET6, h->ip, b) != 1)
      abort();
    for (int s = 0; s < h->slots; s++)
      if (launch_hosts_of_rank(&hs, sum + s) != i) abort();
    sum += h->slots;
  }
  if (sum != hs.ranks || launch_hosts_of_rank(&hs, sum) != -1) abort();
  for (int i = 0; i < hs.n_envs; i++)
    if (!hs.envs[i] || !strchr(hs.envs[i], '=')) abort();
  launch_hosts_free(&hs);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  int n = data[0] & 3, k = (data[0] >> 2) & 3;
  check_hosts((const char*)data + 1, size - 1, n);
  mlxd_net_hosts h;
  char why[1024];
  why[0] = '\0';
  int rc = launch_hostfile_check((const char*)data + 1, size - 1, "fuzz.json", n, k, &h, why,
                                 sizeof why);
  if (rc != 0) {
    if (!why[0] || h.addrs) abort();
    return 0;
  }
  if (h.size < 1 || h.size > LAUNCH_MAX_RANKS || (n && h.size != n) || (k && h.nconn != k)) abort();
  mlxd_net_hosts_free(&h);
  return 0;
}
