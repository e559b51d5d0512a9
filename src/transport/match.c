/* Tag matching and failure wording shared by the transports (match.h). */
#include "transport/match.h"

#include <inttypes.h>
#include <stdio.h>

#include "core/array_impl.h"
#include "util/bytes.h"

void mlxd_match_tag_str(uint64_t tag, char* out, size_t n) {
  static const char* kinds[] = {"?", "p2p", "collective", "split", "bootstrap"};
  unsigned kind = mlxd_tag_kind(tag), phase = mlxd_tag_phase(tag);
  unsigned segment = mlxd_tag_segment(tag), group = mlxd_tag_group(tag);
  char ph[64] = "";
  int k = group ? snprintf(ph, sizeof ph, " group %u", group) : 0;
  if (phase && k >= 0) k += snprintf(ph + k, sizeof ph - (size_t)k, " phase %u", phase);
  if (segment && k >= 0) snprintf(ph + k, sizeof ph - (size_t)k, " segment %u", segment);
  snprintf(out, n, "%s #%" PRIu64 "%s step %u",
           kind < 5                ? kinds[kind]
           : kind == MLXD_TAG_CTRL ? "control"
                                   : "?",
           mlxd_tag_seq(tag), ph, (unsigned)(tag & 0xFFFF));
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

/* ---- signatures ---- */

void mlxd_sig_encode(unsigned char out[MLXD_SIG_BYTES], const mlxd_sig* s) {
  out[0] = s->op;
  out[1] = s->dtype;
  out[2] = 0;
  out[3] = 0;
  mlxd_put32(out + 4, s->size);
  mlxd_put64(out + 8, s->count);
}

void mlxd_sig_decode(const unsigned char in[MLXD_SIG_BYTES], mlxd_sig* s) {
  s->op = in[0];
  s->dtype = in[1];
  s->pad = 0;
  s->size = mlxd_get32(in + 4);
  s->count = mlxd_get64(in + 8);
}

mlxd_sig mlxd_sig_or_none(const mlxd_sig* s) { return s ? *s : (mlxd_sig){0}; }

bool mlxd_sig_agree(const mlxd_sig* sent, const mlxd_sig* posted) {
  if (sent->op == MLXD_SIG_NONE || posted->op == MLXD_SIG_NONE) return true;
  bool ops = sent->op == posted->op || (sent->op == MLXD_SIG_SEND && posted->op == MLXD_SIG_RECV) ||
             (sent->op == MLXD_SIG_RECV && posted->op == MLXD_SIG_SEND);
  return ops && sent->dtype == posted->dtype && sent->size == posted->size &&
         sent->count == posted->count;
}

static const char* sig_op_name(unsigned op) {
  static const char* names[MLXD_SIG_COUNT] = {[MLXD_SIG_NONE] = "an unchecked call",
                                              [MLXD_SIG_ALL_SUM] = "all_sum",
                                              [MLXD_SIG_ALL_MAX] = "all_max",
                                              [MLXD_SIG_ALL_MIN] = "all_min",
                                              [MLXD_SIG_ALL_GATHER] = "all_gather",
                                              [MLXD_SIG_SUM_SCATTER] = "sum_scatter",
                                              [MLXD_SIG_MAX_SCATTER] = "max_scatter",
                                              [MLXD_SIG_MIN_SCATTER] = "min_scatter",
                                              [MLXD_SIG_SEND] = "send",
                                              [MLXD_SIG_RECV] = "recv",
                                              [MLXD_SIG_SPLIT] = "split",
                                              [MLXD_SIG_ALL_TO_ALL] = "all_to_all"};
  return op < MLXD_SIG_COUNT ? names[op] : NULL;
}

void mlxd_sig_str(const mlxd_sig* s, char* out, size_t n) {
  const char* name = sig_op_name(s->op);
  char unknown[32];
  if (!name) {
    snprintf(unknown, sizeof unknown, "an unknown op (%u)", (unsigned)s->op);
    name = unknown;
  }
  if (s->op == MLXD_SIG_NONE) {
    snprintf(out, n, "%s", name);
    return;
  }
  char dt[32];
  int esz = 0;
  if (s->dtype == MLXD_SIG_NO_DTYPE) {
    dt[0] = 0;
  } else if (s->dtype <= MLX_COMPLEX64) {
    snprintf(dt, sizeof dt, "%s", mlxd_dtype_name((mlx_dtype)s->dtype));
    esz = (int)mlx_dtype_size((mlx_dtype)s->dtype);
  } else {
    snprintf(dt, sizeof dt, "dtype %u", (unsigned)s->dtype);
  }
  if (s->op == MLXD_SIG_SEND || s->op == MLXD_SIG_RECV || s->op == MLXD_SIG_SPLIT) {
    if (esz > 0 && s->count % (uint64_t)esz == 0)
      snprintf(out, n, "%s(%s x %" PRIu64 ", %" PRIu64 " bytes)", name, dt,
               s->count / (uint64_t)esz, s->count);
    else if (dt[0])
      snprintf(out, n, "%s(%s, %" PRIu64 " bytes)", name, dt, s->count);
    else
      snprintf(out, n, "%s(%" PRIu64 " bytes)", name, s->count);
  } else {
    snprintf(out, n, "%s(%s x %" PRIu64 ")", name, dt[0] ? dt : "?", s->count);
  }
}

int mlxd_sig_mismatch(mlxd_status* st, mlxd_layer layer, int rank, const mlxd_sig* mine, int peer,
                      const char* addr, const mlxd_sig* theirs) {
  char a[96], b[96], sz[64] = "";
  mlxd_sig_str(mine, a, sizeof a);
  mlxd_sig_str(theirs, b, sizeof b);
  if (mine->size != theirs->size)
    snprintf(sz, sizeof sz, " (rank %d sees a group of %u, rank %d of %u)", rank,
             (unsigned)mine->size, peer, (unsigned)theirs->size);
  bool me_first = rank < peer;
  int code = mlxd_fail_at(st, MLXD_EINVAL, layer,
                          "mismatched calls: rank %d called %s, rank %d called %s%s",
                          me_first ? rank : peer, me_first ? a : b, me_first ? peer : rank,
                          me_first ? b : a, sz);
  mlxd_status_set_peer(st, peer, addr);
  return code;
}

int mlxd_sig_check(mlxd_status* st, mlxd_layer layer, int rank, const mlxd_sig* mine, int peer,
                   const char* addr, const mlxd_sig* theirs) {
  if (!mine || !theirs || mlxd_sig_agree(theirs, mine)) return 0;
  return mlxd_sig_mismatch(st, layer, rank, mine, peer, addr, theirs);
}
