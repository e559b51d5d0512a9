/* The registration cache of the verbs transport: see verbs_mr.h. */
#include "transport/verbs_mr.h"

#include <stdlib.h>
#include <string.h>

#define PAGE ((uintptr_t)4096)

void mlxd_vbmr_init(mlxd_vbmr* c, int max_entries, size_t max_bytes, mlxd_vbmr_reg_fn reg,
                    mlxd_vbmr_dereg_fn dereg, void* ctx) {
  memset(c, 0, sizeof *c);
  c->max_entries = max_entries < 1 ? 1 : max_entries > MLXD_VBMR_MAX ? MLXD_VBMR_MAX : max_entries;
  c->max_bytes = max_bytes;
  c->reg = reg;
  c->dereg = dereg;
  c->ctx = ctx;
}

static void drop(mlxd_vbmr* c, int i) {
  mlxd_vbmr_ent* e = c->ent[i];
  c->dereg(c->ctx, &e->mr);
  c->bytes -= (size_t)(e->hi - e->lo);
  c->ent[i] = c->ent[--c->n];
  free(e);
}

/* Deregister unused entries, least recently used first, until `need` more
 * bytes and one more entry fit. */
static bool make_room(mlxd_vbmr* c, size_t need) {
  while (c->n >= c->max_entries || c->bytes + need > c->max_bytes) {
    int lru = -1;
    for (int i = 0; i < c->n; i++)
      if (c->ent[i]->refs == 0 && (lru < 0 || c->ent[i]->stamp < c->ent[lru]->stamp)) lru = i;
    if (lru < 0) return false;
    drop(c, lru);
    c->evictions++;
  }
  return true;
}

mlxd_vbmr_ent* mlxd_vbmr_get(mlxd_vbmr* c, int dev, const void* addr, size_t len, bool cacheable,
                             mlxd_status* st) {
  uintptr_t a = (uintptr_t)addr;
  if (len == 0 || a + len < a) {
    mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_VERBS, "cannot register %zu bytes at %p", len, addr);
    return NULL;
  }
  uintptr_t lo = a & ~(PAGE - 1), hi = (a + len + PAGE - 1) & ~(PAGE - 1);
  c->clock++;
  if (cacheable) {
    for (int i = 0; i < c->n; i++) {
      mlxd_vbmr_ent* e = c->ent[i];
      if (e->dev != dev || e->dead || !e->cacheable || e->lo > lo || e->hi < hi) continue;
      e->refs++;
      e->stamp = c->clock;
      c->hits++;
      return e;
    }
  }
  c->misses++;
  if ((size_t)(hi - lo) > c->max_bytes || !make_room(c, (size_t)(hi - lo))) {
    mlxd_fail_at(st, MLXD_EUNAVAIL, MLXD_LAYER_VERBS,
                 "registration cache full (%zu of %zu bytes in use, %zu more asked)", c->bytes,
                 c->max_bytes, (size_t)(hi - lo));
    return NULL;
  }
  mlxd_vbmr_ent* e = calloc(1, sizeof *e);
  if (!e) {
    mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_VERBS, "out of memory for a registration");
    return NULL;
  }
  if (c->reg(c->ctx, dev, (void*)lo, (size_t)(hi - lo), &e->mr, st)) {
    free(e);
    return NULL;
  }
  e->dev = dev;
  e->lo = lo;
  e->hi = hi;
  e->refs = 1;
  e->stamp = c->clock;
  e->cacheable = cacheable;
  c->ent[c->n++] = e;
  c->bytes += (size_t)(hi - lo);
  return e;
}

void mlxd_vbmr_put(mlxd_vbmr* c, mlxd_vbmr_ent* e) {
  if (!e) return;
  if (e->refs > 0) e->refs--;
  if (e->refs > 0 || (e->cacheable && !e->dead)) return;
  for (int i = 0; i < c->n; i++)
    if (c->ent[i] == e) {
      drop(c, i);
      return;
    }
}

void mlxd_vbmr_invalidate(mlxd_vbmr* c, const void* addr, size_t len) {
  uintptr_t lo = (uintptr_t)addr, hi = lo + len;
  for (int i = 0; i < c->n;) {
    mlxd_vbmr_ent* e = c->ent[i];
    if (e->lo < hi && lo < e->hi && !e->dead) {
      c->invalidations++;
      if (e->refs == 0) {
        drop(c, i);
        continue;
      }
      e->dead = true;
    }
    i++;
  }
}

void mlxd_vbmr_clear(mlxd_vbmr* c) {
  while (c->n > 0) drop(c, c->n - 1);
}
