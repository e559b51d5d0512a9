/* Private: the verbs transport's cache of memory registrations for
 * zero-copy messages (transport/verbs_pull.c, the pull path). Bookkeeping only:
 * the registering and deregistering are the caller's functions (the
 * device layer in the transport, fakes in the host unit test), so overlap,
 * invalidation and eviction are tested without RDMA.
 *
 * Entries are keyed by (device index, page-rounded address range). A
 * lookup hits an entry of the same device that covers the asked range and
 * is not invalidated. Bounds: at most max_entries entries and max_bytes
 * registered bytes; to make room the least recently used entries not in
 * use (refs == 0) are deregistered; if that is not enough the get fails
 * (the caller falls back to the staged path). Entries made with
 * cacheable == false (memory mlxdist does not own: its release is not
 * seen) are deregistered when their last user puts them. invalidate drops
 * every entry overlapping a released range: at once when unused, else it
 * is marked dead (never found again) and deregistered at its last put.
 * Not thread-safe: the caller serialises (the transport's mutex). */
#ifndef MLXD_VERBS_MR_H
#define MLXD_VERBS_MR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rdma/ibv.h"

typedef int (*mlxd_vbmr_reg_fn)(void* ctx, int dev, void* addr, size_t len, mlxd_ibv_mr* out,
                                mlxd_status* st);
typedef void (*mlxd_vbmr_dereg_fn)(void* ctx, mlxd_ibv_mr* mr);

typedef struct mlxd_vbmr_ent {
  int dev;
  uintptr_t lo, hi; /* the registered range, page-rounded */
  mlxd_ibv_mr mr;
  int refs;
  uint64_t stamp; /* last use */
  bool cacheable, dead;
} mlxd_vbmr_ent;

#define MLXD_VBMR_MAX 256
typedef struct mlxd_vbmr {
  mlxd_vbmr_ent* ent[MLXD_VBMR_MAX];
  int n, max_entries;
  size_t bytes, max_bytes;
  uint64_t clock;
  mlxd_vbmr_reg_fn reg;
  mlxd_vbmr_dereg_fn dereg;
  void* ctx;
  uint64_t hits, misses, evictions, invalidations; /* for tests and docs */
} mlxd_vbmr;

/* max_entries is clamped to 1..MLXD_VBMR_MAX. */
void mlxd_vbmr_init(mlxd_vbmr* c, int max_entries, size_t max_bytes, mlxd_vbmr_reg_fn reg,
                    mlxd_vbmr_dereg_fn dereg, void* ctx);
/* A registration of [addr, addr + len) on dev (len > 0), its refs counted:
 * the cached one or a new one. NULL with st set when it cannot be made
 * (bounds, the registration's own error). */
mlxd_vbmr_ent* mlxd_vbmr_get(mlxd_vbmr* c, int dev, const void* addr, size_t len, bool cacheable,
                             mlxd_status* st);
void mlxd_vbmr_put(mlxd_vbmr* c, mlxd_vbmr_ent* e); /* NULL: no-op */
/* Memory [addr, addr + len) is being released: drop what overlaps it. */
void mlxd_vbmr_invalidate(mlxd_vbmr* c, const void* addr, size_t len);
/* Deregister everything (teardown: no entry may be in use by the device). */
void mlxd_vbmr_clear(mlxd_vbmr* c);

#endif
