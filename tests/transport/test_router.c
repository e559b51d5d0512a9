/* The router's choice (transport/router.h), without any transport: the
 * can-connect tests and their order (shm on one host, verbs where the
 * matrix links the pair both ways, tcp otherwise), that both ends of a pair
 * pick the same kind, the kinds a group uses, this host's shm members, and
 * that a group whose shm session failed routes the host's pairs over verbs
 * or tcp. 4 ranks as 2 hosts (a: 0,1; b: 2,3) in a ring of rails
 * (0-1, 1-2, 2-3, 3-0), so every kind is taken. */
#include <stdint.h>
#include <string.h>

#include "testutil.h"
#include "transport/router.h"

int main(void) {
  const uint64_t hosts[4] = {7, 7, 9, 9};
  int rails[16] = {0};
  for (int i = 0; i < 4; i++) {
    rails[i * 4 + (i + 1) % 4] = 1;
    rails[i * 4 + (i + 3) % 4] = 1;
  }
  mlxd_route_facts f = {.rank = 0, .size = 4, .host = hosts, .rails = rails};
  for (int k = 0; k < MLXD_ROUTE_KINDS; k++) f.allow[k] = true;
  /* expected[a][b]: shm within a host (0-1 is also linked: shm wins), verbs
   * across on a link, tcp across without one */
  static const mlxd_route_kind want[4][4] = {
      {MLXD_ROUTE_KINDS, MLXD_ROUTE_SHM, MLXD_ROUTE_TCP, MLXD_ROUTE_VERBS},
      {MLXD_ROUTE_SHM, MLXD_ROUTE_KINDS, MLXD_ROUTE_VERBS, MLXD_ROUTE_TCP},
      {MLXD_ROUTE_TCP, MLXD_ROUTE_VERBS, MLXD_ROUTE_KINDS, MLXD_ROUTE_SHM},
      {MLXD_ROUTE_VERBS, MLXD_ROUTE_TCP, MLXD_ROUTE_SHM, MLXD_ROUTE_KINDS}};
  for (int a = 0; a < 4; a++)
    for (int b = 0; b < 4; b++) {
      if (a == b) continue;
      mlxd_route_kind k = mlxd_route_pick(&f, a, b);
      T_CHECKF(k == want[a][b], "pair (%d, %d) picks %s, expected %s", a, b,
               mlxd_route_kind_name(k), mlxd_route_kind_name(want[a][b]));
      T_CHECKF(k == mlxd_route_pick(&f, b, a), "pair (%d, %d) is not symmetric", a, b);
      T_CHECK(mlxd_route_can_connect(&f, MLXD_ROUTE_TCP, a, b));
    }
  T_CHECK(mlxd_route_group_kinds(&f) ==
          ((1u << MLXD_ROUTE_SHM) | (1u << MLXD_ROUTE_VERBS) | (1u << MLXD_ROUTE_TCP)));
  int members[4], me = -1;
  f.rank = 2;
  T_CHECK(mlxd_route_shm_members(&f, members, &me) == 2 && members[0] == 2 && members[1] == 3 &&
          me == 0);
  f.rank = 3;
  T_CHECK(mlxd_route_shm_members(&f, members, &me) == 2 && me == 1);
  /* a failed shm session: the host's pairs take their link, else tcp */
  f.allow[MLXD_ROUTE_SHM] = false;
  T_CHECK(mlxd_route_pick(&f, 0, 1) == MLXD_ROUTE_VERBS);
  T_CHECK(mlxd_route_pick(&f, 0, 2) == MLXD_ROUTE_TCP);
  T_CHECK(mlxd_route_shm_members(&f, members, &me) == 1 && members[0] == 3 && me == 0);
  /* no rails (the ring backend): shm on the host, tcp across; one host: shm only */
  f.allow[MLXD_ROUTE_SHM] = true;
  f.rails = NULL;
  T_CHECK(mlxd_route_pick(&f, 0, 3) == MLXD_ROUTE_TCP);
  T_CHECK(mlxd_route_group_kinds(&f) == ((1u << MLXD_ROUTE_SHM) | (1u << MLXD_ROUTE_TCP)));
  const uint64_t one[4] = {5, 5, 5, 5};
  f.host = one;
  T_CHECK(mlxd_route_group_kinds(&f) == (1u << MLXD_ROUTE_SHM));
  /* tcp not allowed and no other way: none */
  f.host = hosts;
  f.allow[MLXD_ROUTE_TCP] = false;
  T_CHECK(mlxd_route_pick(&f, 0, 2) == MLXD_ROUTE_KINDS);
  /* the host record: MLXDIST_HOST_ID alone decides */
  unsigned char r1[MLXD_ROUTE_HOST_BYTES], r2[MLXD_ROUTE_HOST_BYTES];
  mlxd_route_host_record(r1, "host-a");
  mlxd_route_host_record(r2, "host-a");
  T_CHECK(memcmp(r1, r2, sizeof r1) == 0);
  mlxd_route_host_record(r2, "host-b");
  T_CHECK(mlxd_route_hash(MLXD_ROUTE_HASH_START, r1, sizeof r1) !=
          mlxd_route_hash(MLXD_ROUTE_HASH_START, r2, sizeof r2));
  return t_check_failures() ? 1 : 0;
}
