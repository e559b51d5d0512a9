/* Fuzz target: mlxdist-launch's check of a user's hostfile
 * (tools/launch/hostfile_check.c: the ranks' parser plus the launcher's own
 * limits and agreement with -n and --connections). The first byte chooses -n
 * (0: not given, 1..3) and --connections (0: not given, 1..3); the rest is the
 * file. It must never crash or exit; what it accepts agrees with both options
 * and the launcher's limit, what it refuses says why. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backends/ring/ring_internal.h"
#include "launch/launch.h"

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  int n = data[0] & 3, k = (data[0] >> 2) & 3;
  mlxd_ring_hosts h;
  char why[1024];
  why[0] = '\0';
  int rc = launch_hostfile_check((const char*)data + 1, size - 1, "fuzz.json", n, k, &h, why,
                                 sizeof why);
  if (rc != 0) {
    if (!why[0] || h.addrs) abort();
    return 0;
  }
  if (h.size < 1 || h.size > LAUNCH_MAX_RANKS || (n && h.size != n) || (k && h.nconn != k)) abort();
  mlxd_ring_hosts_free(&h);
  return 0;
}
