/* The split exchange (net.h): what a group's split() learns from every rank
 * of its parent before it builds the child, written once for the ring and
 * jaccl backends. Every rank all-gathers one record over the parent's
 * transport (one MLXD_SIG_SPLIT message):
 *   0 color (u32)   4 key (u32)   8 the backend's own bytes (extra_len)
 * integers big-endian; the members of this rank's color are ordered by key,
 * then by parent rank, as MLX orders a split's ranks. */
#include <stdlib.h>
#include <string.h>

#include "algo/algo.h"
#include "net/net.h"
#include "util/bytes.h"

static int member_cmp(const void* a, const void* b) {
  const mlxd_net_member* x = a;
  const mlxd_net_member* y = b;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  return (x->prank > y->prank) - (x->prank < y->prank);
}

void mlxd_net_split_free(mlxd_net_split* s) {
  free(s->members);
  free(s->all);
  memset(s, 0, sizeof *s);
}

int mlxd_net_split_exchange(mlxd_transport* t, uint64_t seq, int rank, int size, int color, int key,
                            const void* extra, size_t extra_len, mlxd_net_split_check check,
                            void* ctx, mlxd_net_split* out, mlxd_status* st) {
  memset(out, 0, sizeof *out);
  out->me = -1;
  const size_t per = 8 + extra_len;
  unsigned char* src = malloc(per);
  out->all = calloc((size_t)size, per);
  out->members = calloc((size_t)size, sizeof *out->members);
  int rc = 0;
  if (!src || !out->all || !out->members) {
    rc = mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BACKEND, "out of memory");
    goto done;
  }
  mlxd_put32(src, (uint32_t)color);
  mlxd_put32(src + 4, (uint32_t)key);
  if (extra_len) memcpy(src + 8, extra, extra_len);
  mlxd_sig sig = {(uint8_t)MLXD_SIG_SPLIT, MLXD_SIG_NO_DTYPE, 0, (uint32_t)size, (uint64_t)per};
  if ((rc = mlxd_algo_all_gather(t, seq, &sig, src, out->all, per, st))) goto done;

  int m = 0;
  for (int p = 0; p < size; p++) {
    const unsigned char* e = out->all + (size_t)p * per;
    if ((int)mlxd_get32(e) != color) continue;
    if (check && (rc = check(ctx, src + 8, e + 8, p, st))) goto done;
    out->members[m].key = (int)mlxd_get32(e + 4);
    out->members[m].prank = p;
    out->members[m].extra = e + 8;
    m++;
  }
  qsort(out->members, (size_t)m, sizeof *out->members, member_cmp);
  out->m = m;
  for (int i = 0; i < m; i++)
    if (out->members[i].prank == rank) out->me = i;
  if (out->me < 0)
    rc = mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BACKEND,
                      "this rank is missing from its own group in the exchanged records");
done:
  free(src);
  return rc;
}
