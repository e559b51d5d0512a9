/* Signature checks inside the transports (transport.h, mlxd_sig), below the
 * API: two ranks connected by a real transport (tcp or shm), rank 0 sends
 * collective #5 messages signed all_sum(float32 x 10), rank 1 posts
 * receives for #5 signed as the case says, in both orders (the message
 * arrives before the receive is posted, or after), for the same tag and for
 * another step of the same operation (the ring's steps differ when the
 * calls differ). Rank 1 must fail the transport with both calls named when
 * the signatures disagree, and receive normally when they agree or one side
 * is unsigned; unsigned messages keep the old rule (a size mismatch fails
 * only that receive).
 *
 *   test_sig_transport tcp|shm */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mlx/c/array.h"
#include "testutil.h"
#include "transport/match.h"
#include "transports.h"

#define SEQ 5
#define N 40 /* bytes: 10 float32 */

typedef struct sig_case {
  const char* name;
  unsigned send_step, recv_step;
  bool msg_first; /* the message is in before the receive is posted */
  mlxd_sig recv_sig;
  bool sign_send;
  bool fails; /* a signature mismatch is expected on rank 1 */
} sig_case;

static const mlxd_sig k_sum10 = {MLXD_SIG_ALL_SUM, MLX_FLOAT32, 0, 2, 10};
static const mlxd_sig k_gather10 = {MLXD_SIG_ALL_GATHER, MLX_FLOAT32, 0, 2, 10};
static const mlxd_sig k_sum11 = {MLXD_SIG_ALL_SUM, MLX_FLOAT32, 0, 2, 11};
static const mlxd_sig k_none = {0};

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static int sig_rank(mlxd_transport* t, void* arg) {
  const sig_case* c = arg;
  mlxd_status st = {0};
  char buf[N] = {0};
  uint64_t early = mlxd_tag(MLXD_TAG_COLL, SEQ - 1, 0); /* an earlier op: progress for rank 1 */
  uint64_t stag = mlxd_tag(MLXD_TAG_COLL, SEQ, c->send_step);
  uint64_t rtag = mlxd_tag(MLXD_TAG_COLL, SEQ, c->recv_step);
  const mlxd_sig* ssig = c->sign_send ? &k_sum10 : NULL;
  if (t->rank == 0) {
    mlxd_req* r[3] = {NULL, NULL, NULL};
    /* #5 first (the send's step, then the receive's), then #4: rank 1,
     * waiting for #4, reads #5 before it */
    T_REQUIREF(t->ops->isend(t, 1, stag, ssig, buf, N, &r[0], &st) == 0, "%s", st.msg);
    if (rtag != stag && !c->fails) /* a failing case must be caught without it */
      T_REQUIREF(t->ops->isend(t, 1, rtag, ssig, buf, N, &r[1], &st) == 0, "%s", st.msg);
    T_REQUIREF(t->ops->isend(t, 1, early, NULL, buf, 4, &r[2], &st) == 0, "%s", st.msg);
    int src = t->ops->waitall(t, r, 3, &st);
    if (c->fails && src != 0) {
      /* rank 1 found the mismatch before these sends were done: its failure
       * is relayed here (tcp: abort frame; shm: published in the segment) */
      T_CHECKF(strstr(st.msg, "mismatched calls") != NULL, "%s: rank 0's sends: %s", c->name,
               st.msg);
      return 0;
    }
    T_REQUIREF(src == 0, "%s", st.msg);
    mlxd_req* q = NULL;
    T_REQUIREF(t->ops->irecv(t, 1, mlxd_tag(MLXD_TAG_COLL, SEQ + 1, 0), NULL, buf, 1, &q, &st) == 0,
               "%s", st.msg);
    int rc = t->ops->waitall(t, &q, 1, &st); /* rank 1 says it is done (or failed) */
    T_CHECKF(c->fails ? rc != 0 : rc == 0, "%s: rank 0's wait for rank 1 returned %d: %s", c->name,
             rc, st.msg);
    return 0;
  }
  mlxd_req* r = NULL;
  int rc;
  if (c->msg_first) {
    mlxd_req* e = NULL;
    T_REQUIREF(t->ops->irecv(t, 0, early, NULL, buf, 4, &e, &st) == 0, "%s", st.msg);
    T_REQUIREF(t->ops->waitall(t, &e, 1, &st) == 0, "%s", st.msg);
    sleep_s(0.05);
    rc = t->ops->irecv(t, 0, rtag, &c->recv_sig, buf, N, &r, &st);
    if (rc == 0) rc = t->ops->waitall(t, &r, 1, &st);
  } else {
    T_REQUIREF(t->ops->irecv(t, 0, rtag, &c->recv_sig, buf, N, &r, &st) == 0, "%s", st.msg);
    mlxd_req* e = NULL;
    /* shm may find the mismatch while posting r (it drains its ring): then
     * this post fails, and r is still waited (every request is) */
    rc = t->ops->irecv(t, 0, early, NULL, buf, 4, &e, &st);
    mlxd_req* w[2] = {r, e};
    mlxd_status wst = {0};
    int wrc = t->ops->waitall(t, w, 2, &wst);
    if (rc == 0) {
      rc = wrc;
      st = wst;
    }
  }
  if (c->fails) {
    T_CHECKF(rc == MLXD_EINVAL, "%s: rc %d: %s", c->name, rc, st.msg);
    char want[200];
    char mine[96];
    mlxd_sig_str(&c->recv_sig, mine, sizeof mine);
    snprintf(want, sizeof want,
             "mismatched calls: rank 0 called all_sum(float32 x 10), rank 1 called %s", mine);
    T_CHECKF(strstr(st.msg, want) != NULL, "%s: %s", c->name, st.msg);
    T_CHECKF(t_status_names_peer(&st, 0), "%s: peer not named", c->name);
    /* for good: a later receive fails at once with the same status */
    mlxd_req* q = NULL;
    char one[1];
    int rc2 = t->ops->irecv(t, 0, mlxd_tag(MLXD_TAG_COLL, SEQ + 2, 0), NULL, one, 1, &q, &st);
    if (rc2 == 0) rc2 = t->ops->waitall(t, &q, 1, &st);
    T_CHECKF(rc2 == MLXD_EINVAL && strstr(st.msg, want), "%s: later op: rc %d: %s", c->name, rc2,
             st.msg);
    return 0;
  }
  T_CHECKF(rc == 0, "%s: rc %d: %s", c->name, rc, st.msg);
  if (stag != rtag) { /* the message of the other step, buffered meanwhile */
    mlxd_req* q = NULL;
    T_REQUIREF(t->ops->irecv(t, 0, stag, &c->recv_sig, buf, N, &q, &st) == 0, "%s", st.msg);
    T_CHECKF(t->ops->waitall(t, &q, 1, &st) == 0, "%s: the send's step: %s", c->name, st.msg);
  }
  mlxd_req* s = NULL;
  T_REQUIREF(t->ops->isend(t, 0, mlxd_tag(MLXD_TAG_COLL, SEQ + 1, 0), NULL, buf, 1, &s, &st) == 0,
             "%s", st.msg);
  T_CHECKF(t->ops->waitall(t, &s, 1, &st) == 0, "%s: %s", c->name, st.msg);
  return 0;
}

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  t_tp_spec spec;
  if (argc < 2 || !t_tp_parse(argv[1], &spec)) {
    fprintf(stderr, "usage: test_sig_transport tcp|unix|shm|mixed:HOSTS\n");
    return 2;
  }
  setenv("MLXDIST_TIMEOUT", "20", 1);
  const sig_case cases[] = {
      {"same tag, op differs, message first", 0, 0, true, k_gather10, true, true},
      {"same tag, op differs, receive first", 0, 0, false, k_gather10, true, true},
      {"same tag, count differs, message first", 0, 0, true, k_sum11, true, true},
      {"same tag, count differs, receive first", 0, 0, false, k_sum11, true, true},
      {"other step, op differs, message first", 3, 0, true, k_gather10, true, true},
      {"other step, op differs, receive first", 3, 0, false, k_gather10, true, true},
      {"other step, count differs, message first", 3, 0, true, k_sum11, true, true},
      {"other step, count differs, receive first", 3, 0, false, k_sum11, true, true},
      {"other step, agreeing, message first", 3, 0, true, k_sum10, true, false},
      {"other step, agreeing, receive first", 3, 0, false, k_sum10, true, false},
      {"same tag, agreeing, message first", 0, 0, true, k_sum10, true, false},
      {"same tag, agreeing, receive first", 0, 0, false, k_sum10, true, false},
      {"same tag, unsigned receive", 0, 0, false, k_none, true, false},
      {"same tag, unsigned message", 0, 0, true, k_gather10, false, false},
  };
  int bad = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    t_ranks_opts o = {.timeout_s = 60, .what = cases[i].name};
    printf("%s over %s\n", cases[i].name, t_tp_name(&spec));
    fflush(stdout);
    bad += t_run_transport(&spec, 2, sig_rank, (void*)&cases[i], &o, NULL) != 0;
  }
  return bad ? 1 : 0;
}
