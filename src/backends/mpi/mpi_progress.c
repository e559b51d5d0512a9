/* The mpi plugin's progress: how waits poll MPI (spin, yield, then short
 * sleeps), group failure, the turnstile that issues collectives in sequence
 * order, the bounded wait on MPI requests, and the thread that completes
 * sends in the background (see mpi_internal.h for why). */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/mpi/mpi_internal.h"
#include "util/clock.h"

static double spin_s(void) {
  double us = mlxd_mpi_host.spin_us ? mlxd_mpi_host.spin_us() : 50.0;
  return us > 0 ? us * 1e-6 : 0.0;
}

/* How a waiting thread polls MPI. Non-blocking MPI advances only inside MPI
 * calls (every round of a collective, every fragment of a message), so a
 * poll that sleeps slows the op down. Three phases since the last completion:
 * MPI_Test back to back for MLXDIST_SPIN_US; then MPI_Test + sched_yield for
 * up to MPI_YIELD_S = 200 ms (gives the core to other ranks/threads on a busy host,
 * costs little latency); then sleeps of elapsed/64 (at most 1 ms), so an op
 * that has already taken long is slowed by ~2% at most and an idle wait for a
 * late peer uses almost no CPU. */
#define MPI_YIELD_S 0.2
typedef struct backoff {
  double start;
} backoff;
static void backoff_reset(backoff* b) { b->start = mlxd_now(); }
static void backoff_wait(backoff* b) {
  double el = mlxd_now() - b->start;
  if (el < spin_s()) return;
  if (el < MPI_YIELD_S) {
    sched_yield();
    return;
  }
  double d = el / 64;
  if (d > 1e-3) d = 1e-3;
  struct timespec ts = {0, (long)(d * 1e9)};
  nanosleep(&ts, NULL);
}

/* MPI_Testall without statuses. (MPICH marks the statuses argument as an
 * array to be written, so MPI_STATUSES_IGNORE draws a compiler warning.) */
int mlxd_mpi_test_all(int n, MPI_Request* reqs, int* flag) {
  *flag = 0;
  if (n <= 0) {
    *flag = 1;
    return MPI_SUCCESS;
  }
  MPI_Status* sts = malloc(sizeof(MPI_Status) * (size_t)n);
  if (!sts) return MPI_ERR_NO_MEM;
  int rc = MPI_Testall(n, reqs, flag, sts);
  free(sts);
  return rc;
}

/* ---------------------------------------------------------------------- */
/* Groups. */

void mlxd_mpi_group_fail(mpi_group* g, const mlxd_status* st) {
  pthread_mutex_lock(&g->mu);
  if (!g->failed) {
    g->failed = true;
    g->fail_st = *st;
    __atomic_store_n(&g->failed_flag, 1, __ATOMIC_RELEASE);
  }
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

int mlxd_mpi_group_done(mpi_group* g, int rc, mlxd_status* s, const char* op, uint64_t seq,
                        mpip_status* out) {
  if (rc == 0) return 0;
  if (s->code != MPIP_EABORTED) {
    /* This op failed the group: later ops name it (mlxd_mpi_done). */
    pthread_mutex_lock(&g->mu);
    if (g->failed && !g->fail_st.op && strcmp(g->fail_st.msg, s->msg) == 0)
      mlxd_status_set_op(&g->fail_st, op, seq);
    pthread_mutex_unlock(&g->mu);
  }
  return mlxd_mpi_done(rc, s, op, seq, g->base.rank, out);
}

/* 0, or the group's first failure (MPIP_EABORTED) copied to st. */
int mlxd_mpi_group_check(mpi_group* g, mlxd_status* st) {
  int rc = 0;
  pthread_mutex_lock(&g->mu);
  if (g->failed) {
    rc = MPIP_EABORTED;
    if (st) {
      *st = g->fail_st;
      st->code = MPIP_EABORTED;
    }
  }
  pthread_mutex_unlock(&g->mu);
  return rc;
}
/* The turnstile: wait until collective #seq may be issued on g. */
int mlxd_mpi_turn_wait(mpi_group* g, uint64_t seq, const char* what, mlxd_status* st) {
  double t = mlxd_mpi_timeout_s();
  double deadline = mlxd_now() + t;
  int rc = 0;
  pthread_mutex_lock(&g->mu);
  for (;;) {
    if (g->failed) {
      rc = MPIP_EABORTED;
      *st = g->fail_st;
      st->code = MPIP_EABORTED;
      break;
    }
    if (g->next_seq == seq) break;
    if (seq < g->next_seq) {
      rc = mlxd_mpi_fail(st, MPIP_EINVAL,
                         "%s was given collective sequence number %llu, which was already "
                         "used on this group (next expected: %llu)",
                         what, (unsigned long long)seq, (unsigned long long)g->next_seq);
      break;
    }
    struct timespec ts = mlxd_mpi_abs_monotonic(deadline);
    if (pthread_cond_timedwait(&g->cv, &g->mu, &ts) == ETIMEDOUT && mlxd_now() >= deadline) {
      mlxd_mpi_fail(st, MPIP_ETIMEDOUT,
                    "timed out after %g s in %s: collective #%llu on this rank never "
                    "started, so #%llu could not be issued",
                    t, what, (unsigned long long)g->next_seq, (unsigned long long)seq);
      g->failed = true;
      g->fail_st = *st;
      __atomic_store_n(&g->failed_flag, 1, __ATOMIC_RELEASE);
      pthread_cond_broadcast(&g->cv);
      rc = MPIP_ETIMEDOUT;
      break;
    }
  }
  pthread_mutex_unlock(&g->mu);
  return rc;
}
void mlxd_mpi_turn_done(mpi_group* g) {
  pthread_mutex_lock(&g->mu);
  g->next_seq++;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

/* Poll reqs[0..n) until all complete. The deadline moves whenever one
 * completes. On timeout (or an MPI error) the group fails; statuses
 * (may be NULL) receive the completed requests' statuses. */
int mlxd_mpi_wait_reqs(mpi_group* g, MPI_Request* reqs, int n, MPI_Status* statuses,
                       bool cancel_on_timeout, const char* what, int peer, mlxd_status* st) {
  return mlxd_mpi_wait_reqs_keep(g, reqs, n, statuses, cancel_on_timeout, NULL, what, peer, st);
}

/* keep == NULL: what is left after a failure is abandoned and kept forever
 * by the caller; else it is abandoned with keep (released once complete). */
static void abandon_left(const MPI_Request* reqs, int n, const mpi_keep* keep) {
  if (keep)
    mlxd_mpi_abandon_keep(reqs, n, keep);
  else
    mlxd_mpi_abandon(reqs, n);
}

/* A request completed with MPI error err: its MPI_Error_string; a receive
 * too small for its message (MPI_ERR_TRUNCATE) is said in words, with the
 * class's name whatever the library's text (Open MPI's names it, MPICH's
 * says "Message truncated" with no name). */
static int request_failed(mlxd_status* st, int err, const char* what, int peer) {
  /* (peer: a receive's source; collectives pass -1) */
  int cls = MPI_ERR_OTHER;
  if (MPI_Error_class(err, &cls) != MPI_SUCCESS) cls = MPI_ERR_OTHER;
  if (cls != MPI_ERR_TRUNCATE || peer < 0)
    return mlxd_mpi_fail_call(st, MPIP_EREMOTE, err, "MPI request", what);
  char text[MPI_MAX_ERROR_STRING + 1];
  int len = 0;
  if (MPI_Error_string(err, text, &len) != MPI_SUCCESS || len <= 0) len = 0;
  text[len > MPI_MAX_ERROR_STRING ? MPI_MAX_ERROR_STRING : len] = '\0';
  bool named = len && strstr(text, "MPI_ERR_TRUNCATE");
  return mlxd_mpi_fail(st, MPIP_EINVAL,
                       "%s: the message that arrived is larger (%s%s%s; shape and dtype of send "
                       "and recv must match)",
                       what, named ? "" : "MPI_ERR_TRUNCATE", !named && len ? ": " : "",
                       len ? text : "");
}

int mlxd_mpi_wait_reqs_keep(mpi_group* g, MPI_Request* reqs, int n, MPI_Status* statuses,
                            bool cancel_on_timeout, const mpi_keep* keep, const char* what,
                            int peer, mlxd_status* st) {
  if (n <= 0) return 0;
  int* idx = malloc(sizeof(int) * (size_t)n);
  MPI_Status* sts = malloc(sizeof(MPI_Status) * (size_t)n);
  if (!idx || !sts) {
    free(idx);
    free(sts);
    abandon_left(reqs, n, keep);
    mlxd_mpi_fail(st, MPIP_ENOMEM, "out of memory while waiting for %s", what);
    mlxd_mpi_group_fail(g, st);
    return MPIP_ENOMEM;
  }
  double t = mlxd_mpi_timeout_s();
  double deadline = mlxd_now() + t;
  int left = n;
  int rc = 0;
  backoff bo;
  backoff_reset(&bo);
  while (left > 0) {
    int outc = 0;
    mlxd_mpi_call_lock();
    int mrc = MPI_Testsome(n, reqs, &outc, idx, sts);
    mlxd_mpi_call_unlock();
    if (mrc != MPI_SUCCESS && mrc != MPI_ERR_IN_STATUS) {
      rc = mlxd_mpi_fail_call(st, MPIP_EREMOTE, mrc, "MPI_Testsome", what);
      break;
    }
    if (outc == MPI_UNDEFINED) break; /* no active request left */
    for (int i = 0; i < outc; i++) {
      if (statuses) statuses[idx[i]] = sts[i];
      if (mrc == MPI_ERR_IN_STATUS && sts[i].MPI_ERROR != MPI_SUCCESS && rc == 0)
        rc = request_failed(st, sts[i].MPI_ERROR, what, peer);
    }
    if (rc) break;
    if (outc > 0) {
      left -= outc;
      deadline = mlxd_now() + t;
      backoff_reset(&bo);
      continue;
    }
    /* With the check, a group that failed meanwhile (a mismatch found by
     * another op, e.g. a send's answer) ends the wait: its peers may never
     * get here. So does an abort (ABI v4): the core gives up on the group. */
    if ((g->check || __atomic_load_n(&g->abort_flag, __ATOMIC_ACQUIRE)) &&
        __atomic_load_n(&g->failed_flag, __ATOMIC_ACQUIRE)) {
      rc = mlxd_mpi_group_check(g, st);
      break;
    }
    if (mlxd_now() >= deadline) {
      rc = mlxd_mpi_fail(st, MPIP_ETIMEDOUT,
                         "timed out after %g s in %s: no progress for that long; %s may have "
                         "died or not called the same op (raise MLXDIST_TIMEOUT if it is just "
                         "slow)",
                         t, what, peer >= 0 ? "the peer" : "a peer");
      break;
    }
    backoff_wait(&bo);
  }
  if (rc) {
    if (peer >= 0 && rc != MPIP_EABORTED) mlxd_status_set_peer(st, peer, NULL);
    if (cancel_on_timeout) {
      /* Receives can be cancelled; give the cancellation a short, bounded while. */
      mlxd_mpi_call_lock();
      for (int i = 0; i < n; i++)
        if (reqs[i] != MPI_REQUEST_NULL) MPI_Cancel(&reqs[i]);
      mlxd_mpi_call_unlock();
      double until = mlxd_now() + 1.0;
      for (;;) {
        int flag = 0;
        mlxd_mpi_call_lock();
        mlxd_mpi_test_all(n, reqs, &flag);
        mlxd_mpi_call_unlock();
        if (flag || mlxd_now() >= until) break;
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
      }
    }
    abandon_left(reqs, n, keep); /* what is left: MPI may still complete it */
    mlxd_mpi_group_fail(g, st);
  }
  free(idx);
  free(sts);
  return rc;
}

/* ---------------------------------------------------------------------- */
/* Background completion of sends (see mpi_internal.h). */

static pthread_mutex_t g_send_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_send_cv; /* CLOCK_MONOTONIC: new work, or the list changed */
static pending_send* g_sends;
static bool g_prog_started, g_prog_stop;
static pthread_t g_prog_thread;
/* Abandoned requests (mlxd_mpi_lost_poll): polled every LOST_FAST_S for
 * LOST_FAST_FOR_S after one was abandoned or completed (a late peer's op
 * advances only while this rank calls MPI), then every LOST_SLOW_S (a peer
 * that never comes costs ~20 wake-ups a second). Under g_send_mu. */
#define LOST_FAST_S 1e-3
#define LOST_FAST_FOR_S 2.0
#define LOST_SLOW_S 50e-3
static double g_lost_next, g_lost_activity;

void mlxd_mpi_pending_free(pending_send* p) {
  free(p->reqs);
  if (!p->held) free(p->buf);
#if MPIP_HAS_REF
  else if (p->release)
    p->release(&p->hold);
#endif
  free(p);
}

/* Done sends whose hold is released off the lock (the release may run the
 * caller's destructor): under g_send_mu, drained by the progress thread. */
static pending_send* g_retired;

/* Free p now, or (held) once g_send_mu is let go. g_send_mu held. */
static void retire_locked(pending_send* p) {
  if (!p->held) {
    mlxd_mpi_pending_free(p);
    return;
  }
  p->next = g_retired;
  g_retired = p;
}

/* Free the retired sends with g_send_mu let go meanwhile. g_send_mu held. */
static void drain_retired_locked(void) {
  while (g_retired) {
    pending_send* list = g_retired;
    g_retired = NULL;
    pthread_mutex_unlock(&g_send_mu);
    while (list) {
      pending_send* p = list;
      list = p->next;
      mlxd_mpi_pending_free(p);
    }
    pthread_mutex_lock(&g_send_mu);
  }
}

/* A send failed on the progress thread (after the op returned): its group
 * fails with the send named, so the op that reports it says which. */
static void send_failed(pending_send* p, mlxd_status* st) {
  if (!st->op) mlxd_status_set_op(st, "send", p->seq);
  if (!st->has_peer) mlxd_status_set_peer(st, p->dst, NULL);
  if (p->g) mlxd_mpi_group_fail(p->g, st);
}

/* MLXDIST_CHECK=1: a send waiting for the receiver's answer (mpi_check.c).
 * Returns 0 (still waiting or data posted now) or 1: p is done with, and
 * was freed or (MPI may still use it) kept; the caller unlinks it. */
static int answer_poll_locked(pending_send* p, bool* progressed) {
  int flag = 0;
  MPI_Status sts[2];
  mlxd_mpi_call_lock();
  int mrc = MPI_Testall(2, p->check_reqs, &flag, sts);
  mlxd_mpi_call_unlock();
  if (mrc == MPI_SUCCESS && !flag && mlxd_now() < p->deadline) return 0; /* the common case */
  mlxd_status st;
  memset(&st, 0, sizeof st);
  int rc = 0;
  char what[128];
  snprintf(what, sizeof what, "send of %zu bytes to rank %d", p->nbytes, p->dst);
  if (mrc != MPI_SUCCESS) {
    rc = mlxd_mpi_fail_call(&st, MPIP_EREMOTE, mrc, "MPI_Isend", what);
  } else if (!flag) {
    rc = mlxd_mpi_fail(&st, MPIP_ETIMEDOUT,
                       "timed out after %g s in %s: the receiver never called recv "
                       "(MLXDIST_CHECK=1: the data leaves only once it has)",
                       mlxd_mpi_timeout_s(), what);
    mlxd_mpi_call_lock();
    if (p->check_reqs[1] != MPI_REQUEST_NULL) MPI_Cancel(&p->check_reqs[1]);
    mlxd_mpi_call_unlock();
  } else {
    *progressed = true;
    p->awaiting_answer = false;
    if (!p->g) { /* its group was destroyed (only after the answer: see forget_group) */
      retire_locked(p);
      return 1;
    }
    rc = mlxd_mpi_check_send_answer(p, p->g->base.rank, &st);
    if (rc) {
      send_failed(p, &st);
      retire_locked(p);
      return 1;
    }
    rc = mlxd_mpi_send_post_data(p, &st);
    if (rc == 0) {
      p->deadline = mlxd_now() + mlxd_mpi_timeout_s();
      return 0;
    }
    send_failed(p, &st);
    if (p->nreq) {
      mlxd_mpi_abandon(p->reqs, p->nreq); /* p is kept (and its hold: never released) */
    } else {
      retire_locked(p);
    }
    return 1;
  }
  /* Failed or timed out before the answer: p is kept (MPI may still use it). */
  *progressed = true;
  send_failed(p, &st);
  mlxd_mpi_abandon(p->check_reqs, 2);
  return 1;
}

/* One pass over the pending sends (g_send_mu held). Returns whether any progressed. */
static bool sends_poll_locked(void) {
  bool progressed = false;
  pending_send** pp = &g_sends;
  while (*pp) {
    pending_send* p = *pp;
    if (p->awaiting_answer) {
      pending_send* next = p->next; /* p may be freed */
      if (answer_poll_locked(p, &progressed)) {
        *pp = next;
        continue;
      }
      if (p->awaiting_answer) {
        pp = &p->next;
        continue;
      }
    }
    int outc = 0;
    int* idx = malloc(sizeof(int) * (size_t)p->nreq);
    MPI_Status* sts = malloc(sizeof(MPI_Status) * (size_t)p->nreq);
    int mrc = MPI_ERR_NO_MEM;
    if (idx && sts) {
      mlxd_mpi_call_lock();
      mrc = MPI_Testsome(p->nreq, p->reqs, &outc, idx, sts);
      mlxd_mpi_call_unlock();
    }
    int err = MPI_SUCCESS;
    if (mrc == MPI_ERR_IN_STATUS) {
      for (int i = 0; i < outc; i++)
        if (sts[i].MPI_ERROR != MPI_SUCCESS) err = sts[i].MPI_ERROR;
    } else if (mrc != MPI_SUCCESS) {
      err = mrc;
    }
    free(idx);
    free(sts);
    if (err == MPI_SUCCESS && outc != MPI_UNDEFINED && outc > 0) {
      p->left -= outc;
      p->deadline = mlxd_now() + mlxd_mpi_timeout_s();
      progressed = true;
    }
    bool done = err == MPI_SUCCESS && (outc == MPI_UNDEFINED || p->left <= 0);
    bool expired = err == MPI_SUCCESS && !done && mlxd_now() >= p->deadline;
    if (done || err != MPI_SUCCESS || expired) {
      if (p->g && !done) {
        mlxd_status st = {0};
        char what[128];
        snprintf(what, sizeof what, "send of %zu bytes to rank %d", p->nbytes, p->dst);
        if (err != MPI_SUCCESS)
          mlxd_mpi_fail_call(&st, MPIP_EREMOTE, err, "MPI_Isend", what);
        else
          mlxd_mpi_fail(&st, MPIP_ETIMEDOUT,
                        "timed out after %g s in %s: the receiver never took the data",
                        mlxd_mpi_timeout_s(), what);
        send_failed(p, &st);
      }
      *pp = p->next;
      if (done) {
        retire_locked(p);
      } else {
        /* MPI may still read the buffer: the plugin's copy is kept (a
         * deliberate leak); the caller's array stays held until MPI is
         * done with it. */
        mpi_keep keep = {.held = p->held ? &p->hold : NULL, .release = p->release};
        mlxd_mpi_abandon_keep(p->reqs, p->nreq, &keep);
        free(p->reqs);
        free(p);
      }
      progressed = true;
      continue;
    }
    pp = &p->next;
  }
  if (progressed) pthread_cond_broadcast(&g_send_cv);
  return progressed;
}

static void* progress_main(void* arg) {
  (void)arg;
  /* Named as the core's threads are (util/env.h): it reads no environment. */
  pthread_setname_np(pthread_self(), "mlxd-mpi-prog");
  backoff bo;
  backoff_reset(&bo);
  pthread_mutex_lock(&g_send_mu);
  while (!g_prog_stop) {
    bool lost = mlxd_mpi_lost_pending();
    if (lost && mlxd_now() >= g_lost_next) {
      pthread_mutex_unlock(&g_send_mu); /* releases run the caller's code: no lock held */
      bool completed = false;
      lost = mlxd_mpi_lost_poll(&completed);
      pthread_mutex_lock(&g_send_mu);
      double now = mlxd_now();
      if (completed) g_lost_activity = now;
      g_lost_next = now + (now - g_lost_activity < LOST_FAST_FOR_S ? LOST_FAST_S : LOST_SLOW_S);
      continue;
    }
    if (!g_sends) {
      if (lost) {
        struct timespec ts = mlxd_mpi_abs_monotonic(g_lost_next);
        pthread_cond_timedwait(&g_send_cv, &g_send_mu, &ts);
      } else {
        pthread_cond_wait(&g_send_cv, &g_send_mu);
      }
      backoff_reset(&bo);
      continue;
    }
    if (sends_poll_locked()) backoff_reset(&bo);
    drain_retired_locked();
    if (!g_sends) continue;
    pthread_mutex_unlock(&g_send_mu);
    backoff_wait(&bo);
    pthread_mutex_lock(&g_send_mu);
  }
  pthread_mutex_unlock(&g_send_mu);
  return NULL;
}

/* Start the progress thread if it is not running (g_send_mu held). */
static int start_locked(mlxd_status* st) {
  if (g_prog_started) return 0;
  if (g_prog_stop)
    return mlxd_mpi_fail(st, MPIP_EUNAVAIL,
                         "the progress thread has stopped (the process is exiting)");
  if (pthread_create(&g_prog_thread, NULL, progress_main, NULL) != 0)
    return mlxd_mpi_fail(st, MPIP_ESYS, "could not start the send progress thread: %s",
                         strerror(errno));
  g_prog_started = true;
  return 0;
}

void mlxd_mpi_progress_kick(void) {
  mlxd_status ignore = {0};
  pthread_mutex_lock(&g_send_mu);
  /* Without the thread (it could not start, or the exit hook stopped it),
   * the exit hook is the last to poll the abandoned requests. */
  start_locked(&ignore);
  g_lost_activity = mlxd_now();
  g_lost_next = 0;
  pthread_cond_broadcast(&g_send_cv);
  pthread_mutex_unlock(&g_send_mu);
}

/* Hand a started send to the progress thread (starting it if needed). */
int mlxd_mpi_sends_add(pending_send* p, mlxd_status* st) {
  pthread_mutex_lock(&g_send_mu);
  int rc = start_locked(st);
  if (rc == 0) {
    p->next = g_sends;
    g_sends = p;
    pthread_cond_broadcast(&g_send_cv);
  }
  pthread_mutex_unlock(&g_send_mu);
  return rc;
}

void mlxd_mpi_sends_forget_group(mpi_group* g) {
  pthread_mutex_lock(&g_send_mu);
  /* MLXDIST_CHECK=1: a send still waiting for its answer posts its data on
   * g's communicator once the answer comes; wait for those (each is
   * bounded by its deadline, which the progress thread enforces). */
  for (;;) {
    bool waiting = false;
    for (pending_send* p = g_sends; p && !waiting; p = p->next)
      waiting = p->g == g && p->awaiting_answer;
    if (!waiting) break;
    struct timespec ts = mlxd_mpi_abs_monotonic(mlxd_now() + 0.1);
    pthread_cond_timedwait(&g_send_cv, &g_send_mu, &ts);
  }
  for (pending_send* p = g_sends; p; p = p->next)
    if (p->g == g) p->g = NULL;
  pthread_mutex_unlock(&g_send_mu);
}

void mlxd_mpi_sends_stop(void) {
  /* Let pending sends finish (each is bounded by its own deadline), then stop the thread. */
  pthread_mutex_lock(&g_send_mu);
  while (g_sends) {
    struct timespec ts = mlxd_mpi_abs_monotonic(mlxd_now() + 0.1);
    pthread_cond_timedwait(&g_send_cv, &g_send_mu, &ts);
  }
  bool started = g_prog_started;
  g_prog_stop = true;
  pthread_cond_broadcast(&g_send_cv);
  pthread_mutex_unlock(&g_send_mu);
  if (started) pthread_join(g_prog_thread, NULL);
  pthread_mutex_lock(&g_send_mu);
  drain_retired_locked(); /* what the thread retired last */
  pthread_mutex_unlock(&g_send_mu);
}

void mlxd_mpi_progress_init(void) {
  pthread_mutex_lock(&g_send_mu);
  static bool cv_done;
  if (!cv_done) {
    mlxd_mpi_cv_init_monotonic(&g_send_cv);
    cv_done = true;
  }
  pthread_mutex_unlock(&g_send_mu);
}
