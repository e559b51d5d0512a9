/* Placeholder until the ring backend lands: configured nowhere, never starts. */
#include <stdio.h>

#include "distributed/backend.h"

static bool ring_available(char* why, size_t n) {
  (void)why;
  (void)n;
  return true;
}
static bool ring_configured(bool with_bootstrap) {
  (void)with_bootstrap;
  return false;
}
static int ring_create(mlxd_bootstrap* bs, mlxd_backend** out, mlxd_status* st) {
  (void)bs;
  *out = NULL;
  return mlxd_fail(st, MLXD_EUNAVAIL, "[ring] not implemented yet");
}
const mlxd_backend_kind mlxd_ring_kind = {"ring", ring_available, ring_configured, ring_create,
                                          true};
