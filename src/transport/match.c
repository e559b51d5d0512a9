/* Tag matching and failure wording shared by the transports (match.h). */
#include "transport/match.h"

#include <inttypes.h>
#include <stdio.h>

void mlxd_match_tag_str(uint64_t tag, char* out, size_t n) {
  static const char* kinds[] = {"?", "p2p", "collective", "split", "bootstrap"};
  unsigned kind = (unsigned)(tag >> 60);
  snprintf(out, n, "%s #%" PRIu64 " step %u", kind < 5 ? kinds[kind] : "?",
           (uint64_t)((tag >> 16) & ((UINT64_C(1) << 44) - 1)), (unsigned)(tag & 0xFFFF));
}

int mlxd_match_mismatch(mlxd_status* st, mlxd_layer layer, int peer, const char* addr, uint64_t tag,
                        size_t sent, size_t expected) {
  char ts[64];
  mlxd_match_tag_str(tag, ts, sizeof ts);
  int code = mlxd_fail_at(st, MLXD_EINVAL, layer,
                          "size mismatch: rank %d sent a %zu-byte message (%s) but the receive "
                          "posted for it expects %zu bytes",
                          peer, sent, ts, expected);
  mlxd_status_set_peer(st, peer, addr);
  return code;
}

int mlxd_match_lost(mlxd_status* st, mlxd_layer layer, int peer, const char* addr, const char* why,
                    const char* syscall, int err) {
  int code =
      mlxd_fail_at(st, MLXD_EREMOTE, layer, "lost connection to rank %d%s", peer, why ? why : "");
  mlxd_status_set_peer(st, peer, addr);
  if (syscall || err) mlxd_status_set_sys(st, syscall, err);
  return code;
}

int mlxd_match_timeout(mlxd_status* st, mlxd_layer layer, double timeout_s, int peer,
                       const char* addr, bool is_send, size_t n, uint64_t tag, size_t moved) {
  char ts[64];
  mlxd_match_tag_str(tag, ts, sizeof ts);
  int code =
      mlxd_fail_at(st, MLXD_ETIMEDOUT, layer,
                   "timed out after %g s waiting for rank %d in a %s of %zu bytes (%s, "
                   "%zu bytes moved); is that rank alive and running the same "
                   "operations? MLXDIST_TIMEOUT sets the limit",
                   timeout_s, peer, is_send ? "send" : "receive", n, ts, moved > n ? n : moved);
  mlxd_status_set_peer(st, peer, addr);
  return code;
}

bool mlxd_match_fail_first(mlxd_status* first, const mlxd_status* st) {
  if (first->code) return false;
  *first = *st;
  if (!first->code) first->code = MLXD_EREMOTE; /* a failure always has a code */
  return true;
}

void mlxd_match_fail_posted(mlxd_match_peer* peer, void (*fail)(void* ctx, mlxd_match_link* l),
                            void* ctx) {
  mlxd_match_link* l;
  while ((l = mlxd_match_pop(&peer->posted))) fail(ctx, l);
}

int mlxd_match_result(mlxd_status* st, const mlxd_status* first, mlxd_layer layer,
                      struct mlxd_req* const* reqs, int n) {
  bool pending = false;
  for (int i = 0; i < n; i++) {
    const mlxd_match_req* r = (const mlxd_match_req*)(const void*)reqs[i];
    if (!r) continue;
    if (!r->complete) {
      pending = true;
    } else if (r->code) {
      if (r->mismatch)
        return mlxd_match_mismatch(st, layer, r->peer, r->addr, r->tag, r->sent, r->n);
      if (st) *st = *first;
      return first->code;
    }
  }
  if (!pending || !first->code) return 0;
  if (st) *st = *first;
  return first->code;
}
