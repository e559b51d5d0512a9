/* Shared-memory transport tests with real processes (fork): tag matching in
 * any order, unexpected messages, both ranks sending 64 MiB first, zero-byte
 * messages, size mismatches, argument errors, concurrent threads, a peer
 * that dies, timeouts and failure propagation, CPU use while waiting, and
 * set-up errors; pairs' lanes made on first contact only (lazy), and a
 * first contact whose peer died, stalled or was impersonated, or that an
 * abort ends at once; which path a message of the single-copy threshold
 * takes by default on a crowded host and on one that is not (cma_*).
 * Usage: test_shm <section> <ranks>. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "algo/algo.h"
#include "ranks.h"
#include "test_shm.h"
#include "testutil.h"
#include "transport/shm.h"
#include "transport/shm_impl.h"
#include "transport/spin.h"

unsigned char val(int src, int dst, uint64_t tag, size_t i) {
  return (unsigned char)(src * 131 + dst * 31 + (int)(tag * 7) + (int)(i * 13) + (int)(i >> 9));
}

void fill(unsigned char* b, size_t n, int src, int dst, uint64_t tag) {
  for (size_t i = 0; i < n; i++) b[i] = val(src, dst, tag, i);
}

size_t first_bad(const unsigned char* b, size_t n, int src, int dst, uint64_t tag) {
  for (size_t i = 0; i < n; i++)
    if (b[i] != val(src, dst, tag, i)) return i;
  return (size_t)-1;
}

volatile pid_t* g_pids;

events* g_ev;

unsigned long long pidns(void) {
  struct stat sb;
  T_REQUIRE(stat("/proc/self/ns/pid", &sb) == 0);
  return (unsigned long long)sb.st_ino;
}

void pair_path(char* out, size_t n, const char* name, int lo, int hi) {
  snprintf(out, n, "%s~%d-%d~%d-%d~%llx", name, lo, hi, (int)g_pids[lo], (int)g_pids[hi], pidns());
}

mlxd_transport* join(int rank, int size, const char* name) {
  if (g_pids) g_pids[rank] = getpid();
  mlxd_status st;
  mlxd_status_clear(&st);
  mlxd_transport* t = mlxd_shm_transport_new(rank, size, name, &st);
  T_REQUIREF(t != NULL, "transport_new: %s", st.msg);
  T_REQUIREF(t->rank == rank && t->size == size, "rank/size %d/%d", t->rank, t->size);
  T_REQUIREF(strcmp(t->ops->name, "shm") == 0, "ops name %s", t->ops->name);
  return t;
}

int wait1(mlxd_transport* t, mlxd_req* r, mlxd_status* st) {
  mlxd_status_clear(st);
  return t->ops->waitall(t, &r, 1, st);
}

/* ---- raw: tag order, unexpected, zero bytes, big both-send-first, mismatch ---- */

static const size_t k_sizes[] = {0, 1, 100, 70000, 300000, 5, 65536, 65535};
#define NSZ (sizeof k_sizes / sizeof k_sizes[0])

static void exchange_round(mlxd_transport* t, uint64_t tagbase, int recv_first) {
  int rank = t->rank, size = t->size;
  int np = size - 1;
  mlxd_req** reqs = calloc((size_t)np * NSZ * 2, sizeof *reqs);
  unsigned char** rbufs = calloc((size_t)np * NSZ, sizeof *rbufs);
  unsigned char** sbufs = calloc((size_t)np * NSZ, sizeof *sbufs);
  T_REQUIREF(reqs && rbufs && sbufs, "calloc");
  mlxd_status st;
  mlxd_status_clear(&st);
  int nr = 0;
  /* receives in reverse tag order, sends in tag order */
  for (int pass = 0; pass < 2; pass++) {
    int do_recv = (pass == 0) == (recv_first != 0);
    for (int p = 0, k = 0; p < size; p++) {
      if (p == rank) continue;
      for (size_t j = 0; j < NSZ; j++) {
        size_t jj = do_recv ? NSZ - 1 - j : j;
        size_t idx = (size_t)k * NSZ + jj;
        uint64_t tag = tagbase + jj;
        size_t n = k_sizes[jj];
        if (do_recv) {
          rbufs[idx] = malloc(n ? n : 1);
          memset(rbufs[idx], 0xEE, n);
          T_REQUIREF(t->ops->irecv(t, p, tag, NULL, n ? rbufs[idx] : NULL, n, &reqs[nr++], &st) ==
                         0,
                     "%s", st.msg);
        } else {
          sbufs[idx] = malloc(n ? n : 1);
          fill(sbufs[idx], n, rank, p, tag);
          T_REQUIREF(t->ops->isend(t, p, tag, NULL, n ? sbufs[idx] : NULL, n, &reqs[nr++], &st) ==
                         0,
                     "%s", st.msg);
        }
      }
      k++;
    }
    if (!recv_first && pass == 0) {
      /* Sends complete on their own (buffered by the receiver), then wait a
       * little so that everything arrives before the receives are posted. */
      T_REQUIREF(t->ops->waitall(t, reqs, nr, &st) == 0, "%s", st.msg);
      nr = 0;
      struct timespec ts = {0, 20 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
  }
  T_REQUIREF(t->ops->waitall(t, reqs, nr, &st) == 0, "%s", st.msg);
  for (int i = 0; i < nr; i++) T_REQUIREF(reqs[i] == NULL, "waitall left request %d", i);
  for (int p = 0, k = 0; p < size; p++) {
    if (p == rank) continue;
    for (size_t j = 0; j < NSZ; j++) {
      size_t idx = (size_t)k * NSZ + j;
      size_t bad = first_bad(rbufs[idx], k_sizes[j], p, rank, tagbase + j);
      T_REQUIREF(bad == (size_t)-1, "message tag %llu (%zu bytes) from rank %d wrong at byte %zu",
                 (unsigned long long)(tagbase + j), k_sizes[j], p, bad);
      free(rbufs[idx]);
      free(sbufs[idx]);
    }
    k++;
  }
  free(reqs);
  free(rbufs);
  free(sbufs);
}

static void big_both_send_first(mlxd_transport* t, size_t n) {
  int rank = t->rank;
  if (rank > 1) return;
  int peer = 1 - rank;
  unsigned char* s = malloc(n);
  unsigned char* r = malloc(n);
  T_REQUIREF(s && r, "malloc %zu", n);
  fill(s, n, rank, peer, 900);
  memset(r, 0, n);
  mlxd_status st;
  mlxd_req* q = NULL;
  T_REQUIREF(t->ops->isend(t, peer, 900, NULL, s, n, &q, &st) == 0, "%s", st.msg);
  T_REQUIREF(wait1(t, q, &st) == 0, "both-send-first: send wait: %s", st.msg);
  memset(s, 0, n); /* the send is complete: its buffer is ours again */
  T_REQUIREF(t->ops->irecv(t, peer, 900, NULL, r, n, &q, &st) == 0, "%s", st.msg);
  T_REQUIREF(wait1(t, q, &st) == 0, "both-send-first: recv wait: %s", st.msg);
  size_t bad = first_bad(r, n, peer, rank, 900);
  T_REQUIREF(bad == (size_t)-1, "64 MiB message wrong at byte %zu", bad);
  free(s);
  free(r);
}

/* A message whose receive is not posted stays in its lane while the
 * receiver has other work; a message behind it that has its receive must
 * still arrive (the waiting rank buffers the first once it is idle), and
 * the first is then taken by its late receive. Ranks 0 -> 1, in both
 * sizes (one slot, and several slots so the second starts mid-lane). */
static void behind_unmatched(mlxd_transport* t, size_t n, uint64_t tag) {
  int rank = t->rank;
  if (rank > 1) return;
  unsigned char* a = malloc(n);
  unsigned char* b = malloc(n);
  T_REQUIREF(a && b, "malloc %zu", n);
  mlxd_status st;
  mlxd_req* q[2] = {NULL, NULL};
  if (rank == 0) {
    fill(a, n, 0, 1, tag);
    fill(b, n, 0, 1, tag + 1);
    T_REQUIREF(t->ops->isend(t, 1, tag, NULL, a, n, &q[0], &st) == 0, "%s", st.msg);
    T_REQUIREF(t->ops->isend(t, 1, tag + 1, NULL, b, n, &q[1], &st) == 0, "%s", st.msg);
    T_REQUIREF(t->ops->waitall(t, q, 2, &st) == 0, "behind-unmatched sends: %s", st.msg);
  } else {
    memset(a, 0, n);
    memset(b, 0, n);
    T_REQUIREF(t->ops->irecv(t, 0, tag + 1, NULL, b, n, &q[1], &st) == 0, "%s", st.msg);
    T_REQUIREF(wait1(t, q[1], &st) == 0, "the message behind an unmatched one: %s", st.msg);
    size_t bad = first_bad(b, n, 0, 1, tag + 1);
    T_REQUIREF(bad == (size_t)-1, "second message (%zu bytes) wrong at byte %zu", n, bad);
    T_REQUIREF(t->ops->irecv(t, 0, tag, NULL, a, n, &q[0], &st) == 0, "%s", st.msg);
    T_REQUIREF(wait1(t, q[0], &st) == 0, "the late receive: %s", st.msg);
    bad = first_bad(a, n, 0, 1, tag);
    T_REQUIREF(bad == (size_t)-1, "first message (%zu bytes) wrong at byte %zu", n, bad);
  }
  free(a);
  free(b);
}

static void mismatch(mlxd_transport* t) {
  int rank = t->rank;
  if (rank > 1) return;
  mlxd_status st;
  mlxd_req* q = NULL;
  static unsigned char s[300000], r[300000];
  /* sizes sent by rank 0, sizes expected by rank 1 */
  const size_t sent[] = {100, 200000, 10, 40};
  const size_t want[] = {50, 100000, 10, 40};
  for (int k = 0; k < 4; k++) {
    uint64_t tag = 500 + (uint64_t)k;
    if (rank == 0) {
      fill(s, sent[k], 0, 1, tag);
      T_REQUIREF(t->ops->isend(t, 1, tag, NULL, s, sent[k], &q, &st) == 0, "%s", st.msg);
      T_REQUIREF(wait1(t, q, &st) == 0, "%s", st.msg);
    } else {
      if (k == 1) { /* let this one arrive before its receive */
        struct timespec ts = {0, 30 * 1000 * 1000};
        nanosleep(&ts, NULL);
      }
      T_REQUIREF(t->ops->irecv(t, 0, tag, NULL, r, want[k], &q, &st) == 0, "%s", st.msg);
      int rc = wait1(t, q, &st);
      if (sent[k] != want[k]) {
        T_REQUIREF(rc == MLXD_EINVAL, "mismatch rc %d (%s)", rc, st.msg);
        char a[32];
        snprintf(a, sizeof a, "%zu-byte", sent[k]);
        T_REQUIREF(st.layer == MLXD_LAYER_SHM && st.has_peer && st.peer == 0, "fields: %d %d",
                   st.layer, st.peer);
        mlxd_status_render(&st, "ring");
        T_REQUIREF(strstr(st.msg, "[ring] size mismatch: rank 0 sent") && strstr(st.msg, a) &&
                       strstr(st.msg, "(pid "),
                   "message: %s", st.msg);
      } else {
        T_REQUIREF(rc == 0, "after a mismatch: %s", st.msg);
        size_t bad = first_bad(r, want[k], 0, 1, tag);
        T_REQUIREF(bad == (size_t)-1, "message after mismatch wrong at %zu", bad);
      }
    }
  }
}

/* Invalid peers and NULL buffers are the front-end's to reject (asserted
 * here, see transport.h); what is left to check is the empty waits. */
static void arg_errors(mlxd_transport* t) {
  mlxd_status st;
  mlxd_status_clear(&st);
  T_REQUIREF(t->ops->waitall(t, NULL, 0, &st) == 0, "empty waitall");
  mlxd_req* none[2] = {NULL, NULL};
  T_REQUIREF(t->ops->waitall(t, none, 2, &st) == 0, "waitall of NULLs");
}

static int rank_raw(int rank, int size, const char* name, void* arg) {
  (void)arg;
  mlxd_transport* t = join(rank, size, name);
  arg_errors(t);
  exchange_round(t, 100, 1);
  exchange_round(t, 200, 0);
  big_both_send_first(t, (size_t)64 << 20);
  behind_unmatched(t, 1000, 700);
  behind_unmatched(t, 200000, 710);
  mismatch(t);
  exchange_round(t, 300, 1);
  /* every rank has mapped the segment and talked: its name must be gone */
  char path[256];
  snprintf(path, sizeof path, "/dev/shm/%s", name);
  struct stat sb;
  T_REQUIREF(stat(path, &sb) != 0 && errno == ENOENT, "%s still exists", path);
  t->ops->destroy(t);
  return 0;
}

/* ---- threads: two threads per rank use the transport at once ---- */

typedef struct th_arg {
  mlxd_transport* t;
  int k;
} th_arg;

static void* th_main(void* p) {
  th_arg* a = p;
  mlxd_transport* t = a->t;
  int rank = t->rank, size = t->size;
  mlxd_status st;
  size_t maxn = 100000;
  unsigned char* s = malloc(maxn);
  unsigned char* r = malloc(maxn * (size_t)size);
  mlxd_req** reqs = calloc((size_t)size * 2, sizeof *reqs);
  T_REQUIREF(s && r && reqs, "malloc");
  for (int it = 0; it < 150; it++) {
    size_t n = (it % 5 == 4) ? maxn - (size_t)it : (size_t)(it * 37 % 300);
    uint64_t tag = ((uint64_t)(a->k + 1) << 32) | (uint64_t)it;
    int nr = 0;
    for (int p2 = 0; p2 < size; p2++) {
      if (p2 == rank) continue;
      T_REQUIREF(t->ops->irecv(t, p2, tag, NULL, r + (size_t)p2 * maxn, n, &reqs[nr++], &st) == 0,
                 "%s", st.msg);
    }
    fill(s, n, rank, -1, tag); /* same bytes for every destination */
    for (int p2 = 0; p2 < size; p2++) {
      if (p2 == rank) continue;
      T_REQUIREF(t->ops->isend(t, p2, tag, NULL, s, n, &reqs[nr++], &st) == 0, "%s", st.msg);
    }
    T_REQUIREF(t->ops->waitall(t, reqs, nr, &st) == 0, "thread %d iteration %d: %s", a->k, it,
               st.msg);
    for (int p2 = 0; p2 < size; p2++) {
      if (p2 == rank) continue;
      size_t bad = first_bad(r + (size_t)p2 * maxn, n, p2, -1, tag);
      T_REQUIREF(bad == (size_t)-1, "thread %d it %d from %d wrong at %zu", a->k, it, p2, bad);
    }
  }
  free(s);
  free(r);
  free(reqs);
  return NULL;
}

static int rank_threads(int rank, int size, const char* name, void* arg) {
  (void)arg;
  mlxd_transport* t = join(rank, size, name);
  pthread_t th[2];
  th_arg a[2] = {{t, 0}, {t, 1}};
  for (int k = 0; k < 2; k++)
    T_REQUIREF(pthread_create(&th[k], NULL, th_main, &a[k]) == 0, "create");
  for (int k = 0; k < 2; k++) pthread_join(th[k], NULL);
  t->ops->destroy(t);
  return 0;
}

/* ---- death: the last rank exits without a word; the others fail promptly ---- */

static int rank_death(int rank, int size, const char* name, void* arg) {
  (void)arg;
  mlxd_transport* t = join(rank, size, name);
  int victim = size - 1;
  mlxd_status st;
  mlxd_req* q;
  char b[64];
  if (rank == victim) {
    /* first make sure a message already sent still arrives after death */
    fill((unsigned char*)b, sizeof b, rank, 0, 7);
    T_REQUIREF(t->ops->isend(t, 0, 7, NULL, b, sizeof b, &q, &st) == 0, "%s", st.msg);
    T_REQUIREF(wait1(t, q, &st) == 0, "%s", st.msg);
    _exit(0);
  }
  if (rank == 0) {
    /* 50 ms, as before issue 37: waiting for the victim's exit instead made this receive
     * fail under TSan ("lost connection ... its process exited": a message sent before death
     * is not always delivered once the process is gone), a library question left open */
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
    T_REQUIREF(t->ops->irecv(t, victim, 7, NULL, b, sizeof b, &q, &st) == 0, "%s", st.msg);
    T_REQUIREF(wait1(t, q, &st) == 0, "a message sent before death: %s", st.msg);
  }
  double t0 = t_now();
  T_REQUIREF(t->ops->irecv(t, victim, 8, NULL, b, sizeof b, &q, &st) == 0, "%s", st.msg);
  int rc = wait1(t, q, &st);
  double dt = t_now() - t0;
  char want[64];
  snprintf(want, sizeof want, "[ring] lost connection to rank %d: its process exited", victim);
  T_REQUIREF(rc == MLXD_EREMOTE, "rc %d: %s", rc, st.msg);
  T_REQUIREF(st.layer == MLXD_LAYER_SHM && st.has_peer && st.peer == victim &&
                 strncmp(st.peer_addr, "pid ", 4) == 0,
             "fields: layer %d peer %d addr '%s'", st.layer, st.peer, st.peer_addr);
  mlxd_status_render(&st, "ring");
  T_REQUIREF(strstr(st.msg, want), "%s", st.msg);
  T_REQUIREF(dt < 3.0, "took %.2f s to notice", dt);
  /* later operations fail fast with the same message */
  char first[MLXD_MSG_MAX];
  snprintf(first, sizeof first, "%s", st.msg);
  mlxd_status_clear(&st);
  int other = rank == 0 ? (size > 2 ? 1 : -1) : 0;
  if (other >= 0) {
    T_REQUIREF(t->ops->isend(t, other, 9, NULL, b, 8, &q, &st) != 0,
               "send after failure succeeded");
    mlxd_status_render(&st, "ring");
    T_REQUIREF(strcmp(st.msg, first) == 0, "later error '%s' vs first '%s'", st.msg, first);
  }
  t->ops->destroy(t);
  return 0;
}

/* ---- timeout: rank 0 gives up on a peer that is alive but never gets
 * there (MLXDIST_OP_TIMEOUT), rank 1 learns it from the segment ---- */

static int rank_timeout(int rank, int size, const char* name, void* arg) {
  (void)arg;
  (void)size;
  setenv("MLXDIST_OP_TIMEOUT", rank == 0 ? "1" : "30", 1);
  mlxd_transport* t = join(rank, size, name);
  mlxd_status st;
  mlxd_req* q;
  char b[16];
  double t0 = t_now();
  T_REQUIREF(t->ops->irecv(t, 1 - rank, 1, NULL, b, sizeof b, &q, &st) == 0, "%s", st.msg);
  int rc = wait1(t, q, &st);
  double dt = t_now() - t0;
  if (rank == 0) {
    T_REQUIREF(rc == MLXD_ETIMEDOUT, "rc %d: %s", rc, st.msg);
    T_REQUIREF(st.layer == MLXD_LAYER_SHM && st.peer == 1 && !st.has_reporter, "fields");
    mlxd_status_render(&st, "ring");
    T_REQUIREF(strstr(st.msg,
                      "[ring] rank 1 is alive but did not get to this operation within 1 s") &&
                   strstr(st.msg, "MLXDIST_OP_TIMEOUT"),
               "%s", st.msg);
    T_REQUIREF(dt > 0.9 && dt < 3.0, "timed out after %.2f s", dt);
    /* stay alive until rank 1 has learnt it from the failure flag */
    t_wait_count(&g_ev->timeout_relayed, 1, "rank 1's failure", 20.0);
  } else {
    atomic_store(&g_ev->timeout_relayed, 1);
    T_REQUIREF(rc == MLXD_ETIMEDOUT, "rc %d: %s", rc, st.msg);
    /* rank 0's own status, relayed: its peer (this rank) and "reported by rank 0" */
    T_REQUIREF(st.layer == MLXD_LAYER_SHM && st.has_reporter && st.reporter == 0 && st.has_peer &&
                   st.peer == 1,
               "fields: layer %d reporter %d peer %d", st.layer, st.reporter, st.peer);
    mlxd_status_render(&st, "ring");
    T_REQUIREF(strstr(st.msg,
                      "[ring] rank 1 is alive but did not get to this operation within 1 s") &&
                   strstr(st.msg, "reported by rank 0)"),
               "%s", st.msg);
    T_REQUIREF(dt < 3.0, "took %.2f s", dt);
  }
  t->ops->destroy(t);
  return 0;
}

/* ---- idle: a rank waiting 1 s for a late peer uses little CPU ---- */

static double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int rank_idle(int rank, int size, const char* name, void* arg) {
  (void)arg;
  mlxd_transport* t = join(rank, size, name);
  mlxd_status st;
  mlxd_req* q;
  char b[16];
  if (rank == 1) {
    struct timespec ts = {1, 0};
    nanosleep(&ts, NULL);
    fill((unsigned char*)b, sizeof b, 1, 0, 3);
    T_REQUIREF(t->ops->isend(t, 0, 3, NULL, b, sizeof b, &q, &st) == 0, "%s", st.msg);
    T_REQUIREF(wait1(t, q, &st) == 0, "%s", st.msg);
  } else if (rank == 0) {
    double c0 = cpu_s(), t0 = t_now();
    T_REQUIREF(t->ops->irecv(t, 1, 3, NULL, b, sizeof b, &q, &st) == 0, "%s", st.msg);
    T_REQUIREF(wait1(t, q, &st) == 0, "%s", st.msg);
    double dt = t_now() - t0, dc = cpu_s() - c0;
    T_REQUIREF(first_bad((unsigned char*)b, sizeof b, 1, 0, 3) == (size_t)-1, "data");
    T_REQUIREF(dt > 0.8, "waited only %.2f s", dt);
    T_REQUIREF(dc < 0.1 * dt, "used %.3f s of CPU while waiting %.2f s", dc, dt);
    printf("idle wait %.3f s, cpu %.4f s\n", dt, dc);
  }
  t->ops->destroy(t);
  return 0;
}

/* ---- set-up errors ---- */

static int rank_connect(int rank, int size, const char* name, void* arg) {
  (void)arg;
  setenv("MLXDIST_CONNECT_TIMEOUT", "1", 1);
  mlxd_status st;
  mlxd_status_clear(&st);
  if (rank == size - 1) return 0; /* never shows up */
  double t0 = t_now();
  mlxd_transport* t = mlxd_shm_transport_new(rank, size, name, &st);
  double dt = t_now() - t0;
  T_REQUIREF(t == NULL, "set-up without rank %d succeeded", size - 1);
  T_REQUIREF(st.code == MLXD_ETIMEDOUT, "code %d: %s", st.code, st.msg);
  T_REQUIREF(st.layer == MLXD_LAYER_SHM && strstr(st.msg, "MLXDIST_CONNECT_TIMEOUT"), "%s", st.msg);
  if (size > 2) {
    char want[32];
    snprintf(want, sizeof want, "missing ranks: %d", size - 1);
    T_REQUIREF(strstr(st.msg, want), "%s", st.msg);
  }
  T_REQUIREF(dt < 4.0, "took %.2f s", dt);
  char path[256];
  snprintf(path, sizeof path, "/dev/shm/%s", name);
  struct stat sb;
  /* removed by whichever rank gives up last: polled for, within 10 s */
  for (double until = t_now() + 10; stat(path, &sb) == 0 && t_now() < until;) usleep(10000);
  T_REQUIREF(stat(path, &sb) != 0, "%s left behind after a failed set-up", path);
  return 0;
}

static void local_errors(void) {
  mlxd_status st;
  mlxd_status_clear(&st);
  T_REQUIREF(mlxd_shm_transport_new(0, 2, "a/b", &st) == NULL, "bad name");
  T_REQUIREF(st.code == MLXD_EINVAL && st.layer == MLXD_LAYER_SHM &&
                 strncmp(st.msg, "session name \"a/b\"", 17) == 0,
             "%s", st.msg);
  T_REQUIREF(mlxd_shm_transport_new(0, 2, NULL, &st) == NULL, "null name");
  T_REQUIREF(mlxd_shm_transport_new(0, 2, "", &st) == NULL, "empty name");
  T_REQUIREF(mlxd_shm_transport_new(2, 2, "ok", &st) == NULL, "rank == size");
  T_REQUIREF(strstr(st.msg, "rank 2 / size 2"), "%s", st.msg);
  T_REQUIREF(mlxd_shm_transport_new(0, 0, "ok", &st) == NULL, "size 0");
  /* size one: a valid (if useless) transport */
  char name[128];
  t_session_name(name, sizeof name, "one");
  mlxd_transport* t = mlxd_shm_transport_new(0, 1, name, &st);
  T_REQUIREF(t != NULL, "%s", st.msg);
  t->ops->destroy(t);
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr,
            "usage: %s "
            "raw|raw_nocma|threads|death|timeout|idle|connect|lazy|first_dead|first_stall|first_"
            "foreign|first_abort|leak|cma_crowded|cma_quiet|cma_off|whole_crowded|whole_split "
            "<ranks>\n",
            argv[0]);
    return 2;
  }
  const char* what = argv[1];
  int n = atoi(argv[2]);
  T_ASSERT(n >= 1 && n <= 16);
  g_pids =
      mmap(NULL, 16 * sizeof *g_pids, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  T_REQUIRE(g_pids != MAP_FAILED);
  g_ev = mmap(NULL, sizeof *g_ev, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  T_REQUIRE(g_ev != MAP_FAILED);
  atomic_init(&g_ev->timeout_relayed, 0);
  if (strcmp(what, "leak") == 0) {
    T_ASSERT(n == 2);
    run_leak();
    return 0;
  }
  if (strncmp(what, "cma_", 4) == 0) return run_cma(what, n);
  if (strncmp(what, "whole_", 6) == 0) return run_whole(what, n);
  t_rank_fn fn = NULL;
  double limit = 60;
  if (strcmp(what, "raw") == 0) { /* single-copy (CMA) path from 64 KiB on */
    setenv("MLXDIST_SHM_CMA_BYTES", "65536", 1);
    fn = rank_raw;
  } else if (strcmp(what, "raw_nocma") == 0) {
    setenv("MLXDIST_SHM_CMA_BYTES", "0", 1);
    fn = rank_raw;
  } else if (strcmp(what, "threads") == 0) {
    setenv("MLXDIST_SHM_CMA_BYTES", "65536", 1); /* both paths: messages up to 100 KB */
    fn = rank_threads;
  } else if (strcmp(what, "death") == 0) {
    fn = rank_death;
  } else if (strcmp(what, "timeout") == 0) {
    T_ASSERT(n == 2);
    fn = rank_timeout;
  } else if (strcmp(what, "idle") == 0) {
    fn = rank_idle;
  } else if (strcmp(what, "lazy") == 0) {
    fn = rank_lazy;
  } else if (strcmp(what, "first_abort") == 0) {
    T_ASSERT(n == 2);
    fn = rank_first_abort;
  } else if (strncmp(what, "first_", 6) == 0) {
    T_ASSERT(n == 2);
    fn = rank_first;
  } else if (strcmp(what, "connect") == 0) {
    local_errors();
    fn = rank_connect;
  } else {
    T_FAIL("unknown section %s", what);
  }
  t_ranks_opts o = {.timeout_s = limit, .what = what};
  int bad = t_run_ranks(n, fn, (void*)(uintptr_t)what, &o, NULL);
  if (bad) T_FAIL("%s with %d ranks: %d rank%s failed", what, n, bad, bad == 1 ? "" : "s");
  printf("%s with %d ranks: ok\n", what, n);
  return 0;
}
