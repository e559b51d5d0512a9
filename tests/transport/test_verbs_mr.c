/* The verbs transport's registration cache (transport/verbs_mr.h) as pure
 * bookkeeping: registrations are counted by a fake register/deregister
 * pair (no RDMA here), and core/buffer's release watchers are checked to
 * reach it. Cases: hits and misses by (device, range), invalidation of
 * overlapping entries (unused: dropped at once; in use: never found again,
 * dropped at the last put), LRU eviction of unused entries only, the byte
 * and count bounds, foreign (uncacheable) memory deregistered after use,
 * and a registration error passed through. */
#include <stdint.h>
#include <string.h>

#include "core/buffer.h"
#include "testutil.h"
#include "transport/verbs_mr.h"

static int g_live, g_regs, g_fail_next;

static int fake_reg(void* ctx, int dev, void* addr, size_t len, mlxd_ibv_mr* out, mlxd_status* st) {
  (void)ctx;
  (void)dev;
  if (g_fail_next) {
    g_fail_next = 0;
    return mlxd_fail_at(st, MLXD_EUNAVAIL, MLXD_LAYER_VERBS, "RLIMIT_MEMLOCK (fake)");
  }
  memset(out, 0, sizeof *out);
  out->addr = addr;
  out->len = len;
  out->handle = addr;
  g_live++;
  g_regs++;
  return 0;
}

static void fake_dereg(void* ctx, mlxd_ibv_mr* mr) {
  (void)ctx;
  T_CHECK(mr->handle != NULL);
  mr->handle = NULL;
  g_live--;
}

static void* A(uintptr_t x) { return (void*)x; }

static void watch_cb(void* ctx, const void* base, size_t len) {
  mlxd_vbmr_invalidate((mlxd_vbmr*)ctx, base, len);
}

int main(void) {
  mlxd_vbmr c;
  mlxd_status st;
  mlxd_vbmr_init(&c, 4, 1 << 20, fake_reg, fake_dereg, NULL);
  /* hit inside a registered range (page-rounded), miss on another device */
  mlxd_vbmr_ent* e1 = mlxd_vbmr_get(&c, 0, A(0x100010), 0x2000, true, &st);
  T_REQUIRE(e1 && e1->lo == 0x100000 && e1->hi == 0x103000);
  mlxd_vbmr_ent* e2 = mlxd_vbmr_get(&c, 0, A(0x101000), 0x1000, true, &st);
  T_CHECK(e2 == e1 && e1->refs == 2);
  mlxd_vbmr_ent* e3 = mlxd_vbmr_get(&c, 1, A(0x101000), 0x1000, true, &st);
  T_CHECK(e3 && e3 != e1 && g_live == 2);
  /* a range reaching past the entry misses */
  mlxd_vbmr_ent* e4 = mlxd_vbmr_get(&c, 0, A(0x102000), 0x2000, true, &st);
  T_CHECK(e4 && e4 != e1 && g_live == 3);
  mlxd_vbmr_put(&c, e2);
  mlxd_vbmr_put(&c, e3);
  mlxd_vbmr_put(&c, e4);
  T_CHECK(g_live == 3 && e1->refs == 1); /* cached: still registered */
  /* invalidation: e1 is in use -> dead, not found again, dropped at its put */
  mlxd_vbmr_invalidate(&c, A(0x102fff), 1);
  T_CHECK(e1->dead && g_live == 2); /* e4 (unused, overlapping) dropped at once; e3 kept */
  mlxd_vbmr_ent* e5 = mlxd_vbmr_get(&c, 0, A(0x100010), 0x10, true, &st);
  T_CHECK(e5 && e5 != e1 && g_live == 3);
  mlxd_vbmr_put(&c, e1);
  T_CHECK(g_live == 2 && c.n == 2); /* e1 gone at its last put; e3 and e5 stay */
  mlxd_vbmr_put(&c, e5);
  /* a non-overlapping release keeps everything */
  mlxd_vbmr_invalidate(&c, A(0x200000), 0x1000);
  T_CHECK(c.n == 2);
  /* count bound with LRU eviction: entries 0x300000.. fill the cache (max 4) */
  mlxd_vbmr_ent* busy = mlxd_vbmr_get(&c, 0, A(0x300000), 0x1000, true, &st);
  for (uintptr_t k = 1; k <= 4; k++) {
    mlxd_vbmr_ent* e = mlxd_vbmr_get(&c, 0, A(0x300000 + k * 0x10000), 0x1000, true, &st);
    T_REQUIRE(e);
    mlxd_vbmr_put(&c, e);
  }
  T_CHECK(c.n == 4 && busy->refs == 1); /* the one in use was never evicted */
  /* byte bound: 1 MiB; a 2 MiB range fails (falls back), nothing leaks */
  int before = g_live;
  T_CHECK(mlxd_vbmr_get(&c, 0, A(0x1000000), 2 << 20, true, &st) == NULL);
  T_CHECK(st.code == MLXD_EUNAVAIL && g_live == before);
  /* 1 MiB fits only after evicting every unused entry */
  mlxd_vbmr_ent* big = mlxd_vbmr_get(&c, 0, A(0x1000000), (1 << 20) - 0x1000, true, &st);
  T_REQUIRE(big);
  T_CHECK(c.n == 2 && c.bytes == (1u << 20)); /* busy + big */
  /* all in use: nothing to evict -> fails */
  T_CHECK(mlxd_vbmr_get(&c, 0, A(0x4000000), 0x1000, true, &st) == NULL);
  mlxd_vbmr_put(&c, big);
  mlxd_vbmr_put(&c, busy);
  /* foreign memory: deregistered at its last put, never hit */
  int regs = g_regs;
  mlxd_vbmr_ent* f = mlxd_vbmr_get(&c, 0, A(0x5000000), 0x1000, false, &st);
  T_REQUIRE(f);
  mlxd_vbmr_ent* f2 = mlxd_vbmr_get(&c, 0, A(0x5000000), 0x1000, false, &st);
  T_CHECK(f2 != f && g_regs == regs + 2);
  mlxd_vbmr_put(&c, f);
  mlxd_vbmr_put(&c, f2);
  T_CHECK(c.n == 0 && g_live == 0); /* (making room for them evicted the unused big and busy) */
  /* a registration error is passed through */
  g_fail_next = 1;
  T_CHECK(mlxd_vbmr_get(&c, 0, A(0x6000000), 0x1000, true, &st) == NULL);
  T_CHECK(strstr(st.msg, "RLIMIT_MEMLOCK") != NULL);
  /* core/buffer's release watcher reaches the cache: a registration of an
   * mlxdist buffer is dropped when the buffer is freed */
  mlxd_vbmr_clear(&c);
  T_CHECK(g_live == 0);
  int id = mlxd_buffer_watch(watch_cb, &c);
  T_REQUIRE(id > 0);
  size_t n = (size_t)512 << 10;
  char* b = mlxd_buffer_alloc(n);
  T_REQUIRE(b && mlxd_buffer_owns(b, n) && mlxd_buffer_owns(b + 10, 100));
  T_CHECK(!mlxd_buffer_owns(b, n + 8192));
  mlxd_vbmr_ent* eb = mlxd_vbmr_get(&c, 0, b, n, true, &st);
  T_REQUIRE(eb);
  mlxd_vbmr_put(&c, eb);
  T_CHECK(c.n == 1 && g_live == 1);
  mlxd_buffer_free(b, n);
  T_CHECK(c.n == 0 && g_live == 0);
  T_CHECK(!mlxd_buffer_owns(b, n));
  mlxd_buffer_unwatch(id);
  char* b2 = mlxd_buffer_alloc(n);
  mlxd_vbmr_ent* e6 = mlxd_vbmr_get(&c, 0, b2, n, true, &st);
  mlxd_vbmr_put(&c, e6);
  mlxd_buffer_free(b2, n); /* unwatched: no longer called */
  T_CHECK(c.n == 1);
  mlxd_vbmr_clear(&c);
  T_CHECK(g_live == 0);
  if (t_check_failures()) return 1;
  printf(
      "verbs registration cache: ok (%llu hits, %llu misses, %llu evictions, %llu "
      "invalidations)\n",
      (unsigned long long)c.hits, (unsigned long long)c.misses, (unsigned long long)c.evictions,
      (unsigned long long)c.invalidations);
  return 0;
}
