/* Liveness policy and wording shared by the transports (liveness.h). */
#include "transport/liveness.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/oprec.h"
#include "transport/match.h"
#include "util/tunables.h"

void mlxd_live_cfg_load(mlxd_live_cfg* c) {
  c->dead_s = mlxd_tunable_double(MLXD_T_TIMEOUT);
  c->warn_s = mlxd_tunable_double(MLXD_T_WARN_AFTER);
  c->op_s = mlxd_tunable_double(MLXD_T_OP_TIMEOUT);
  double b = c->dead_s / 6;
  c->beat_s = b < 0.05 ? 0.05 : b > 1.0 ? 1.0 : b;
  double f = (c->warn_s > 0 && c->warn_s < c->dead_s ? c->warn_s : c->dead_s) / 6;
  c->frame_s = f < c->beat_s ? c->beat_s : f > 10.0 ? 10.0 : f;
}

void mlxd_live_note_clean(char* out, size_t n, const unsigned char* src, size_t len) {
  if (n == 0) return;
  size_t k = 0;
  for (; k < len && k + 1 < n && src[k]; k++)
    out[k] = (src[k] >= 0x20 && src[k] < 0x7F) ? (char)src[k] : '?';
  out[k] = 0;
}

int mlxd_live_dead(mlxd_status* st, mlxd_layer layer, int peer, const char* addr, double silent_s,
                   const char* note) {
  int code = mlxd_fail_at(st, MLXD_EREMOTE, layer,
                          "rank %d has shown no sign of life for %.1f s (no data, no heartbeat): "
                          "it is stopped, frozen or cut off from this host%s%s%s; MLXDIST_TIMEOUT "
                          "sets the limit",
                          peer, silent_s, note && note[0] ? " (it was " : "", note ? note : "",
                          note && note[0] ? ")" : "");
  mlxd_status_set_peer(st, peer, addr);
  return code;
}

int mlxd_live_op_timeout(mlxd_status* st, mlxd_layer layer, int peer, const char* addr, double op_s,
                         bool is_send, size_t n, uint64_t tag, const char* note) {
  char ts[64];
  mlxd_match_tag_str(tag, ts, sizeof ts);
  int code = mlxd_fail_at(st, MLXD_ETIMEDOUT, layer,
                          "rank %d is alive but did not get to this operation within %g s (a %s "
                          "of %zu bytes, %s)%s%s; MLXDIST_OP_TIMEOUT sets the limit",
                          peer, op_s, is_send ? "send" : "receive", n, ts,
                          note && note[0] ? "; it was " : "", note ? note : "");
  mlxd_status_set_peer(st, peer, addr);
  return code;
}

void mlxd_live_warn(mlxd_layer layer, int rank, int peer, const char* addr, double waited_s,
                    uint64_t tag, double heard_ago_s, const char* note) {
  char ts[64], line[512];
  mlxd_match_tag_str(tag, ts, sizeof ts);
  int k =
      snprintf(line, sizeof line,
               "[mlxdist] warning: rank %d has waited %.0f s for rank %d%s%s%s (%s, %s); it "
               "is alive (heard from %.1f s ago)%s%s; still waiting (MLXDIST_OP_TIMEOUT %g s)\n",
               rank, waited_s, peer, addr && addr[0] ? " (" : "", addr ? addr : "",
               addr && addr[0] ? ")" : "", ts,
               layer == MLXD_LAYER_SHM     ? "shm"
               : layer == MLXD_LAYER_VERBS ? "verbs"
                                           : "tcp",
               heard_ago_s, note && note[0] ? ", it was " : "", note ? note : "",
               mlxd_tunable_double(MLXD_T_OP_TIMEOUT));
  if (k > 0) {
    size_t len = (size_t)k < sizeof line ? (size_t)k : sizeof line - 1;
    ssize_t w = write(2, line, len);
    (void)w;
  }
  mlxd_oprec_dump(2, "warning");
}
