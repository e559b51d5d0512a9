/* What a lazy TCP group of many ranks costs a rank at creation (issue 25;
 * net/dialer.c, tcp_setup.c; util/ztable.h): its tables are sized by
 * the group but written only for the peers it uses, so creating a rank's
 * transport in a group of 4,096 touches a few pages, not one per peer.
 *
 * Two real processes with real listeners on 127.0.0.1 are ranks 0 and 4,095
 * of a group of 4,096 (the other ranks' addresses are never dialed). Each
 * creates its lazy transport (the dialer taking the address book over) and
 * counts the minor page faults that took (getrusage): at most 64 (1,024 under
 * ASan or TSan, whose shadow memory counts too).
 * Before, the dialer's outgoing and pending tables, its copy of the book and
 * the transport's per-peer table were written in full: ~1,300 pages per rank
 * at this size. A first, two-rank transport is made and destroyed before,
 * so that what a process pays once (the heartbeat thread, the tunables) is
 * not counted. Then the two exchange 64 KiB each way (right bytes, one
 * connection each, to the other), so the tables still work. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "net/net.h"
#include "ranks.h"
#include "testutil.h"
#include "transport/tcp.h"

#define G 4096 /* the group's size */
/* faults allowed for one rank's transport creation; a sanitizer's shadow memory counts too */
#define PAGES_MAX (T_SANITIZED ? 1024 : 64)

typedef struct {
  int lfd[2]; /* ranks 0 and G - 1 listen */
  mlxd_net_addr at[2];
  mlxd_net_auth auth;
} ctx;

static long minflt(void) {
  struct rusage ru;
  T_REQUIRE(getrusage(RUSAGE_SELF, &ru) == 0);
  return ru.ru_minflt;
}

/* A group of size ranks: rank `me` listens on *lfd at *mine (taken over),
 * `other` is at *theirs, everyone else at an address never dialed. */
static mlxd_transport* open_group(ctx* x, int size, int me, int* lfd, const mlxd_net_addr* mine,
                                  int other, const mlxd_net_addr* theirs, long* faults) {
  mlxd_net_hosts h = {size, 1, calloc((size_t)size, sizeof(mlxd_net_addr))};
  T_REQUIRE(h.addrs != NULL);
  char why[100];
  for (int r = 0; r < size; r++)
    T_REQUIRE(mlxd_net_parse_addr("127.0.0.1:9", true, &h.addrs[r], why, sizeof why) == 0);
  h.addrs[me] = *mine;
  h.addrs[other] = *theirs;
  mlxd_status st;
  mlxd_status_clear(&st);
  long f0 = minflt();
  struct mlxd_tcp_dialer* d = mlxd_net_dialer_take(me, &h, lfd, &x->auth, &st);
  T_REQUIREF(d != NULL, "dialer: %s", st.msg);
  mlxd_transport* t = mlxd_tcp_transport_lazy(me, size, 1, d, &st);
  T_REQUIREF(t != NULL, "lazy transport: %s", st.msg);
  *faults = minflt() - f0;
  T_CHECKF(h.addrs == NULL, "the address book was copied, not taken over");
  mlxd_net_hosts_free(&h);
  return t;
}

static int rank_fn(int rank, int size, const char* session, void* arg) {
  (void)size;
  (void)session;
  ctx* x = arg;
  int me = rank == 0 ? 0 : G - 1, other = rank == 0 ? G - 1 : 0;
  close(x->lfd[1 - rank]);
  /* the warm-up: a two-rank group, never used */
  char why[100];
  mlxd_net_addr a0, a1;
  int w = -1;
  mlxd_status st;
  mlxd_status_clear(&st);
  T_REQUIRE(mlxd_net_parse_addr("127.0.0.1:0", true, &a0, why, sizeof why) == 0);
  T_REQUIREF(mlxd_net_listen(&a0, &w, &st) == 0, "listen: %s", st.msg);
  T_REQUIRE(mlxd_net_parse_addr("127.0.0.1:9", true, &a1, why, sizeof why) == 0);
  long warm = 0, faults = 0;
  mlxd_transport* t = open_group(x, 2, 0, &w, &a0, 1, &a1, &warm);
  t->ops->destroy(t);

  t = open_group(x, G, me, &x->lfd[rank], &x->at[rank], other, &x->at[1 - rank], &faults);
  fprintf(stderr,
          "[test] rank %d of %d: %ld minor page faults creating its transport (%ld for "
          "a group of 2, the first)\n",
          me, G, faults, warm);
  T_CHECKF(faults <= PAGES_MAX,
           "rank %d's transport in a group of %d took %ld page faults to create, expected at "
           "most %d (tables written for every peer?)",
           me, G, faults, PAGES_MAX);

  enum { N = 65536 + 5 };
  static unsigned char out[N], in[N];
  for (int i = 0; i < N; i++) out[i] = (unsigned char)(me * 7 + i);
  mlxd_req* r[2] = {NULL, NULL};
  uint64_t tag = mlxd_tag(MLXD_TAG_P2P, 3, 1);
  T_REQUIREF(t->ops->irecv(t, other, tag, NULL, in, N, &r[0], &st) == 0, "irecv: %s", st.msg);
  T_REQUIREF(t->ops->isend(t, other, tag, NULL, out, N, &r[1], &st) == 0, "isend: %s", st.msg);
  int rc = t->ops->waitall(t, r, 2, &st);
  T_CHECKF(rc == 0, "rank %d: exchange with rank %d: %s", me, other, st.msg);
  for (int i = 0; rc == 0 && i < N; i++)
    if (in[i] != (unsigned char)(other * 7 + i)) {
      T_CHECKF(false, "rank %d: byte %d from rank %d is wrong", me, i, other);
      break;
    }
  static unsigned char on[G];
  int n = mlxd_tcp_connections(t, on);
  T_CHECKF(n == 1 && on[other], "rank %d holds %d connections, expected 1 (to rank %d)", me, n,
           other);
  t->ops->destroy(t);
  return t_exit_status();
}

static void close_parent(void* arg) {
  ctx* x = arg;
  for (int i = 0; i < 2; i++) close(x->lfd[i]);
}

int main(void) {
  ctx x;
  memset(&x, 0, sizeof x);
  memset(x.auth.token, 0x3c, sizeof x.auth.token);
  for (int i = 0; i < 2; i++) {
    char why[100];
    mlxd_status st;
    mlxd_status_clear(&st);
    x.lfd[i] = -1;
    T_REQUIRE(mlxd_net_parse_addr("127.0.0.1:0", true, &x.at[i], why, sizeof why) == 0);
    T_REQUIREF(mlxd_net_listen(&x.at[i], &x.lfd[i], &st) == 0, "listen: %s", st.msg);
  }
  t_ranks_opts o = {.timeout_s = 60, .grace_s = 15, .after_fork = close_parent, .what = "pages"};
  int bad = t_run_ranks(2, rank_fn, &x, &o, NULL);
  T_CHECKF(bad == 0, "%d rank(s) failed", bad);
  return t_exit_status();
}
