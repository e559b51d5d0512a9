/* mlxdist-launch: what the launcher requires of a user's hostfile, on top of
 * the ranks' own rules (src/net/hostfile.c). Pure (no files, no
 * name lookups, no exit), so that it can be fuzzed (tests/fuzz). */
#include <stdio.h>
#include <string.h>

#include "launch.h"
#include "net/net.h"

int launch_hostfile_check(const char* text, size_t len, const char* name, int n, int connections,
                          mlxd_net_hosts* out, char* why, size_t why_len) {
  mlxd_status st = {0};
  if (mlxd_net_hostfile_parse(text, len, name, out, &st) != 0) {
    mlxd_status_render(&st, NULL); /* the "[launch]" tag is added by the caller */
    snprintf(why, why_len, "%s", st.msg);
    return -1;
  }
  if (out->size > LAUNCH_MAX_RANKS)
    snprintf(why, why_len, "hostfile '%s' lists %d ranks; mlxdist-launch starts at most %d", name,
             out->size, LAUNCH_MAX_RANKS);
  else if (connections && out->nconn != connections)
    snprintf(why, why_len, "hostfile '%s' lists %d address%s per rank but --connections is %d",
             name, out->nconn, out->nconn == 1 ? "" : "es", connections);
  else if (n && n != out->size)
    snprintf(why, why_len, "-n %d does not match hostfile '%s', which lists %d rank%s", n, name,
             out->size, out->size == 1 ? "" : "s");
  else
    return 0;
  mlxd_net_hosts_free(out);
  return -1;
}
