/* MLX_RING_VERBOSE's lines: whether they are on, and one "[ring] ..." line on
 * stderr (net.h). Every file of the networking layer and the ring backend logs
 * through these. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "net/net.h"
#include "util/env.h"

bool mlxd_net_verbose(void) {
  const char* v = mlxd_env_get("MLX_RING_VERBOSE");
  return v && *v && strcmp(v, "0") != 0;
}

void mlxd_net_log(const char* fmt, ...) {
  if (!mlxd_net_verbose()) return;
  char line[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "[ring] %s\n", line);
}
