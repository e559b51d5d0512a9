/* The rank harness itself (ranks.c, transports.c): exit statuses, signals,
 * failed checks, the bounded wait and the shortened wait after a failure
 * are each reported for the right rank; ranks over each transport can
 * exchange a message. (The "rank N ... failed" lines this prints are
 * expected.) */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "ranks.h"
#include "testutil.h"
#include "transports.h"

static int mixed(int rank, int size, const char* session, void* arg) {
  (void)size, (void)session, (void)arg;
  switch (rank) {
    case 1: return 3;
    case 2: raise(SIGABRT); return 0;
    case 3:
      T_CHECK(rank == 0); /* two failed checks: reported, the rank goes on */
      T_CHECK_EQ(rank, 4);
      return 0;
    default: return 0;
  }
}

static int hang(int rank, int size, const char* session, void* arg) {
  (void)size, (void)session;
  if (rank == 1 && arg) return 1; /* fails at once: the others' wait is shortened */
  for (int i = 0; i < 100; i++) sleep(1);
  return 0;
}

static int has_session(int rank, int size, const char* session, void* arg) {
  (void)rank, (void)size, (void)arg;
  return strncmp(session, "mlxdist-test-", 13) != 0;
}

static int exchange(mlxd_transport* t, void* arg) {
  (void)arg;
  int peer = 1 - t->rank, mine = 100 + t->rank, got = -1;
  mlxd_status st;
  mlxd_req* q[2] = {NULL, NULL};
  T_REQUIRE(t->ops->isend(t, peer, 1, NULL, &mine, sizeof mine, &q[0], &st) == 0);
  T_REQUIRE(t->ops->irecv(t, peer, 1, NULL, &got, sizeof got, &q[1], &st) == 0);
  T_REQUIREF(t->ops->waitall(t, q, 2, &st) == 0, "%s", st.msg);
  T_CHECK_EQ(got, 100 + peer);
  return 0;
}

int main(void) {
  t_rank_exit ex[T_MAX_RANKS];
  t_ranks_opts o = {.timeout_s = 30, .what = "expected"};
  T_CHECK_EQ(t_run_ranks(4, mixed, NULL, &o, ex), 3);
  T_CHECK_EQ(ex[0].code, 0);
  T_CHECK_EQ(ex[1].code, 3);
  T_CHECK(ex[2].signal == SIGABRT && ex[2].code == 128 + SIGABRT && !ex[2].timed_out);
  T_CHECK(ex[3].code == 1 && ex[3].signal == 0);

  /* the bound: ranks still running are killed and reported */
  o.timeout_s = 1;
  double t0 = t_now();
  T_CHECK_EQ(t_run_ranks(2, hang, NULL, &o, ex), 2);
  T_CHECKF(t_now() - t0 < 10, "took %.1f s", t_now() - t0);
  T_CHECK(ex[0].timed_out && ex[1].timed_out && ex[0].signal == SIGKILL);

  /* after a failure the others get grace_s, not the whole timeout */
  o.timeout_s = 60;
  o.grace_s = 0.5;
  t0 = t_now();
  T_CHECK_EQ(t_run_ranks(2, hang, "fail", &o, ex), 2);
  T_CHECKF(t_now() - t0 < 10, "took %.1f s", t_now() - t0);
  T_CHECK(ex[1].code == 1 && !ex[1].timed_out && ex[0].timed_out);

  o = (t_ranks_opts){.timeout_s = 30};
  T_CHECK_EQ(t_run_ranks(3, has_session, NULL, &o, ex), 0);

  const char* kinds[] = {"tcp", "tcp:3", "unix:2", "shm"};
  for (int k = 0; k < 4; k++) {
    t_tp_spec spec;
    T_REQUIRE(t_tp_parse(kinds[k], &spec));
    T_CHECKF(t_run_transport(&spec, 2, exchange, NULL, &o, NULL) == 0, "over %s", kinds[k]);
  }
  t_tp_spec spec;
  T_CHECK(!t_tp_parse("tcp:0", &spec) && !t_tp_parse("shm:2", &spec) && !t_tp_parse("x", &spec));
  int rc = t_exit_status();
  if (rc == 0) printf("rank harness: ok\n");
  return rc;
}
