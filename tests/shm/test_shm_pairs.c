/* test_shm's pair sections (test_shm.h): a pair's lanes exist only once
 * the pair talked (lazy); a first contact whose peer died, stalled or was
 * impersonated, or that an abort ends at once (first_*); a pair whose ranks
 * both died, cleaned by the next session (leak). */
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

/* ---- lazy: a pair's lanes exist only once the pair talked ---- */

/* This process's mappings of /dev/shm/<prefix>*: how many, and their bytes. */
static int shm_maps(const char* prefix, size_t* bytes) {
  FILE* f = fopen("/proc/self/maps", "r");
  T_REQUIREF(f != NULL, "open /proc/self/maps");
  char line[1024], want[400];
  snprintf(want, sizeof want, "/dev/shm/%s", prefix);
  int n = 0;
  *bytes = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long a, b;
    if (!strstr(line, want) || sscanf(line, "%lx-%lx", &a, &b) != 2) continue;
    n++;
    *bytes += (size_t)(b - a);
  }
  fclose(f);
  return n;
}

static bool shm_exists(const char* name) {
  char path[400];
  snprintf(path, sizeof path, "/dev/shm/%s", name);
  struct stat sb;
  return stat(path, &sb) == 0;
}

/* Whether /dev/shm holds a name starting with prefix; the first in found. */
static bool shm_exists_prefix(const char* prefix, char* found, size_t n) {
  DIR* d = opendir("/dev/shm");
  T_REQUIREF(d != NULL, "opendir /dev/shm: %s", strerror(errno));
  struct dirent* e;
  bool any = false;
  while (!any && (e = readdir(d)) != NULL)
    if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) {
      any = true;
      if (found) snprintf(found, n, "%s", e->d_name);
    }
  closedir(d);
  return any;
}

int rank_lazy(int rank, int size, const char* name, void* arg) {
  (void)arg;
  mlxd_transport* t = join(rank, size, name);
  char pairs[300], mine[300];
  snprintf(pairs, sizeof pairs, "%s~", name);
  size_t host_bytes = 0, pair_bytes = 0;
  T_REQUIREF(shm_maps(name, &host_bytes) == 1, "more than the host segment mapped after set-up");
  T_REQUIREF(shm_maps(pairs, &pair_bytes) == 0, "a pair mapped before any message");
  T_REQUIREF(host_bytes <= 64 * 1024, "host segment of %zu bytes for %d ranks", host_bytes, size);
  /* pairs (0,1), (2,3): each rank talks to its partner only */
  int peer = rank ^ 1;
  if (peer < size) {
    size_t n = 300000;
    unsigned char* a = malloc(n);
    unsigned char* b = malloc(n);
    T_REQUIRE(a && b);
    fill(a, n, rank, peer, 5);
    mlxd_req* q[2];
    mlxd_status st;
    mlxd_status_clear(&st);
    if (rank & 1) { /* one side receives first, the other sends first */
      T_REQUIREF(t->ops->irecv(t, peer, 5, NULL, b, n, &q[0], &st) == 0, "%s", st.msg);
      T_REQUIREF(t->ops->isend(t, peer, 5, NULL, a, n, &q[1], &st) == 0, "%s", st.msg);
    } else {
      T_REQUIREF(t->ops->isend(t, peer, 5, NULL, a, n, &q[1], &st) == 0, "%s", st.msg);
      T_REQUIREF(t->ops->irecv(t, peer, 5, NULL, b, n, &q[0], &st) == 0, "%s", st.msg);
    }
    T_REQUIREF(t->ops->waitall(t, q, 2, &st) == 0, "%s", st.msg);
    T_REQUIREF(first_bad(b, n, peer, rank, 5) == (size_t)-1, "data from rank %d", peer);
    free(a);
    free(b);
    int lo = rank < peer ? rank : peer;
    snprintf(mine, sizeof mine, "%s~%d-%d~", name, lo, lo + 1);
    size_t mb = 0;
    T_REQUIREF(shm_maps(pairs, &pair_bytes) == 1 && shm_maps(mine, &mb) == 1,
               "expected exactly the pair with rank %d mapped", peer);
    T_REQUIREF(!shm_exists_prefix(mine, NULL, 0), "%s* still named after both ranks mapped it",
               mine);
    for (int q2 = 0; q2 < size; q2++) {
      if (q2 == rank || q2 == peer) continue;
      char other[300];
      snprintf(other, sizeof other, "%s~%d-%d~", name, rank < q2 ? rank : q2,
               rank < q2 ? q2 : rank);
      T_REQUIREF(!shm_exists_prefix(other, NULL, 0), "%s* exists but ranks %d and %d never talked",
                 other, rank, q2);
    }
    printf("rank %d: host segment %zu bytes, pair segment %zu bytes, %d ranks\n", rank, host_bytes,
           pair_bytes, size);
  } else {
    T_REQUIREF(shm_maps(pairs, &pair_bytes) == 0, "a rank that never talked mapped a pair");
  }
  t->ops->destroy(t);
  T_REQUIREF(shm_maps(name, &host_bytes) == 0, "still mapped after destroy");
  return 0;
}

/* ---- first contact: the pair's segment is there, but its maker died
 * (first_dead), stalls (first_stall: MLXDIST_CONNECT_TIMEOUT=1) or it is
 * not this user's 0600 segment (first_foreign) ---- */

/* Create a pair's segment and go no further (unsized, no magic): a creator
 * stopped between shm_open and its first store; foreign: not mode 0600. */
static void begin_pair(const char* pair, bool foreign) {
  int fd = shm_open(pair, O_CREAT | O_EXCL | O_RDWR, 0600);
  T_REQUIREF(fd >= 0, "shm_open %s: %s", pair, strerror(errno));
  if (foreign) T_REQUIRE(fchmod(fd, 0644) == 0);
  close(fd);
}

/* Wait (at most 30 s) until rank 1 has begun the pair: the segment exists
 * with mode (0600, or 0644 once a foreign one is changed). A fixed sleep
 * was not enough on a busy host: rank 0 then made the pair itself. */
static void await_pair(const char* pair, mode_t mode) {
  char path[400];
  snprintf(path, sizeof path, "/dev/shm/%s", pair);
  double until = t_now() + 30;
  struct stat sb;
  while (stat(path, &sb) != 0 || (sb.st_mode & 0777) != mode) {
    T_REQUIREF(t_now() < until, "rank 1 did not make %s (mode %o) within 30 s", pair,
               (unsigned)mode);
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

/* Rank 1's stall: the segment stays as begun until rank 0 is done and
 * removes it (at most 20 s), not for a fixed time that a slow rank 0 on a
 * busy host could outlast (its wait then found the segment gone). */
static void hold_pair(const char* pair) {
  for (int i = 0; i < 2000 && shm_exists(pair); i++) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  shm_unlink(pair);
}

int rank_first(int rank, int size, const char* name, void* arg) {
  const char* how = arg;
  (void)size;
  /* a failure "at once" (dead, foreign) is told from one after the bound
   * with a wide margin: 10 s; a stall waits out 1 s */
  bool stall = strcmp(how, "first_stall") == 0;
  setenv("MLXDIST_CONNECT_TIMEOUT", stall ? "1" : "10", 1);
  mlxd_transport* t = join(rank, size, name);
  char pair[300];
  pair_path(pair, sizeof pair, name, 0, 1);
  if (rank == 1) {
    /* as if this rank had begun making the pair and got no further */
    begin_pair(pair, strcmp(how, "first_foreign") == 0);
    if (strcmp(how, "first_dead") == 0) _exit(0);
    hold_pair(pair);
    t->ops->destroy(t);
    return 0;
  }
  await_pair(pair, strcmp(how, "first_foreign") == 0 ? 0644 : 0600);
  mlxd_status st;
  mlxd_status_clear(&st);
  mlxd_req* q = NULL;
  char b[8] = {0};
  double t0 = t_now();
  int rc = t->ops->isend(t, 1, 1, NULL, b, sizeof b, &q, &st);
  double dt = t_now() - t0;
  T_REQUIREF(rc != 0 && q == NULL, "first contact succeeded");
  T_REQUIREF(st.layer == MLXD_LAYER_SHM && st.has_peer && st.peer == 1, "fields: layer %d peer %d",
             st.layer, st.peer);
  mlxd_status_render(&st, "ring");
  if (strcmp(how, "first_dead") == 0) {
    T_REQUIREF(rc == MLXD_EREMOTE &&
                   strstr(st.msg,
                          "[ring] lost connection to rank 1: its process exited while "
                          "making the shared memory of this pair"),
               "rc %d: %s", rc, st.msg);
    T_REQUIREF(dt < 3.0, "took %.2f s (MLXDIST_CONNECT_TIMEOUT=10)", dt);
    T_REQUIREF(!shm_exists(pair), "%s of a dead rank left behind", pair);
  } else if (strcmp(how, "first_stall") == 0) {
    T_REQUIREF(rc == MLXD_ETIMEDOUT && strstr(st.msg, "rank 1 made shared memory") &&
                   strstr(st.msg, "MLXDIST_CONNECT_TIMEOUT"),
               "rc %d: %s", rc, st.msg);
    T_REQUIREF(dt > 0.9 && dt < 3.0, "took %.2f s (MLXDIST_CONNECT_TIMEOUT=1)", dt);
  } else {
    T_REQUIREF(rc == MLXD_EINVAL && strstr(st.msg, "is not theirs") && strstr(st.msg, "mode 644"),
               "rc %d: %s", rc, st.msg);
    T_REQUIREF(dt < 3.0, "took %.2f s (MLXDIST_CONNECT_TIMEOUT=10)", dt);
  }
  /* the transport failed with it: later operations fail the same way */
  char first[MLXD_MSG_MAX];
  snprintf(first, sizeof first, "%s", st.msg);
  mlxd_status_clear(&st);
  T_REQUIREF(t->ops->irecv(t, 1, 2, NULL, b, sizeof b, &q, &st) != 0, "later receive succeeded");
  mlxd_status_render(&st, "ring");
  T_REQUIREF(strcmp(st.msg, first) == 0, "later '%s' vs first '%s'", st.msg, first);
  shm_unlink(pair); /* rank 1 may go */
  t->ops->destroy(t);
  return 0;
}

/* ---- first_abort: while rank 1 stalls making the pair (a segment made but
 * never sized, until rank 0 is done and removes it), two threads of rank 0
 * wait in first contact with it (an isend, an irecv): they wait with the
 * transport's lock dropped, so an abort from the main thread returns at
 * once and ends both waits, long before MLXDIST_CONNECT_TIMEOUT (10 s) ---- */

typedef struct {
  mlxd_transport* t;
  int send;
  int rc;
  double returned;
  mlxd_status st;
  atomic_int tid;
} first_op;

static void* first_op_main(void* p) {
  first_op* o = p;
  atomic_store(&o->tid, (int)syscall(SYS_gettid));
  mlxd_req* q = NULL;
  char b[8] = {0};
  mlxd_status_clear(&o->st);
  o->rc = o->send ? o->t->ops->isend(o->t, 1, 1, NULL, b, sizeof b, &q, &o->st)
                  : o->t->ops->irecv(o->t, 1, 2, NULL, b, sizeof b, &q, &o->st);
  if (q) o->rc = wait1(o->t, q, &o->st);
  o->returned = t_now();
  return NULL;
}

int rank_first_abort(int rank, int size, const char* name, void* arg) {
  (void)arg;
  setenv("MLXDIST_CONNECT_TIMEOUT", "10", 1);
  mlxd_transport* t = join(rank, size, name);
  char pair[300];
  pair_path(pair, sizeof pair, name, 0, 1);
  if (rank == 1) {
    begin_pair(pair, false);
    hold_pair(pair);
    t->ops->destroy(t);
    return 0;
  }
  await_pair(pair, 0600);
  first_op ops[2] = {{.t = t, .send = 1}, {.t = t, .send = 0}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    T_REQUIRE(pthread_create(&th[i], NULL, first_op_main, &ops[i]) == 0);
    /* the first is waiting for rank 1 (blocked) before the second starts */
    t_wait_count(&ops[i].tid, 1, "the thread's start", 20.0);
    t_wait_until(t_thread_asleep, atomic_load(&ops[i].tid), "the thread's wait for rank 1", 20.0);
  }
  mlxd_status ab;
  mlxd_status_clear(&ab);
  mlxd_fail_at(&ab, MLXD_EABORTED, MLXD_LAYER_SHM, "test abort while first contact waits");
  double t0 = t_now();
  t->ops->abort(t, &ab);
  double dt = t_now() - t0;
  for (int i = 0; i < 2; i++) T_REQUIRE(pthread_join(th[i], NULL) == 0);
  shm_unlink(pair); /* rank 1 may go */
  T_REQUIREF(dt < 2.0, "abort took %.2f s (waited for first contact under the lock?)", dt);
  for (int i = 0; i < 2; i++) {
    first_op* o = &ops[i];
    T_REQUIREF(o->rc == MLXD_EABORTED && strstr(o->st.msg, "test abort while first contact"),
               "%s: rc %d: %s", o->send ? "isend" : "irecv", o->rc, o->st.msg);
    T_REQUIREF(o->returned - t0 < 3.0, "%s returned %.2f s after the abort",
               o->send ? "isend" : "irecv", o->returned - t0);
  }
  t->ops->destroy(t);
  return 0;
}

/* ---- leak: both ranks of a pair die (SIGKILL) after rank 1 made the pair
 * and before rank 0 mapped it: its name stays in /dev/shm (checked: the
 * test can fail), and the next session's set-up removes it; a pair name
 * with a live process, or not this user's 0600 file, stays ---- */

typedef struct {
  char session[128];
  char pair[300];
} leak_info;

static leak_info* g_leak;

static int rank_leak_die(int rank, int size, const char* name, void* arg) {
  (void)arg;
  mlxd_transport* t = join(rank, size, name);
  if (rank == 1) {
    mlxd_req* q = NULL;
    mlxd_status st;
    mlxd_status_clear(&st);
    char b[8] = {1};
    T_REQUIREF(t->ops->isend(t, 0, 1, NULL, b, sizeof b, &q, &st) == 0, "%s", st.msg);
    raise(SIGKILL); /* made the pair, sent into it, and dies */
  }
  snprintf(g_leak->session, sizeof g_leak->session, "%s", name);
  char prefix[300];
  snprintf(prefix, sizeof prefix, "%s~0-1~", name);
  double t0 = t_now();
  while (!shm_exists_prefix(prefix, g_leak->pair, sizeof g_leak->pair)) {
    T_REQUIREF(t_now() - t0 < 20, "rank 1 never made the pair %s*", prefix);
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  raise(SIGKILL); /* never mapped it */
  return 1;
}

static int rank_leak_next(int rank, int size, const char* name, void* arg) {
  (void)arg;
  mlxd_transport* t = join(rank, size, name); /* rank 0 sweeps here */
  int peer = rank ^ 1;
  char a[8] = {(char)rank}, b[8] = {0};
  mlxd_req* q[2];
  mlxd_status st;
  mlxd_status_clear(&st);
  T_REQUIREF(t->ops->irecv(t, peer, 3, NULL, b, sizeof b, &q[0], &st) == 0, "%s", st.msg);
  T_REQUIREF(t->ops->isend(t, peer, 3, NULL, a, sizeof a, &q[1], &st) == 0, "%s", st.msg);
  T_REQUIREF(t->ops->waitall(t, q, 2, &st) == 0, "%s", st.msg);
  T_REQUIREF(b[0] == (char)peer, "got %d from rank %d", b[0], peer);
  t->ops->destroy(t);
  return 0;
}

/* A pair name as shm_setup.c makes them, of a session that never ran, whose
 * ranks were in pid namespace ns. */
static void make_decoy(char* out, size_t n, const char* session, pid_t a, pid_t b, mode_t mode,
                       unsigned long long ns) {
  snprintf(out, n, "%s-decoy~2-3~%d-%d~%llx", session, (int)a, (int)b, ns);
  char path[320];
  snprintf(path, sizeof path, "/%s", out);
  int fd = shm_open(path, O_CREAT | O_EXCL | O_RDWR, 0600);
  T_REQUIREF(fd >= 0, "shm_open %s: %s", path, strerror(errno));
  T_REQUIRE(fchmod(fd, mode) == 0);
  close(fd);
}

void run_leak(void) {
  setenv("MLXDIST_CONNECT_TIMEOUT", "0.5", 1); /* stale once 1 s old */
  g_leak = mmap(NULL, sizeof *g_leak, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  T_REQUIRE(g_leak != MAP_FAILED);
  memset(g_leak, 0, sizeof *g_leak);
  t_rank_exit ex[2];
  t_ranks_opts o = {.timeout_s = 30, .grace_s = -1, .what = "leak: both ranks die"};
  t_run_ranks(2, rank_leak_die, NULL, &o, ex);
  for (int r = 0; r < 2; r++)
    T_REQUIREF(ex[r].signal == SIGKILL, "rank %d: exit %d signal %d (expected SIGKILL)", r,
               ex[r].code, ex[r].signal);
  T_REQUIREF(g_leak->pair[0] && shm_exists(g_leak->pair),
             "pair name %s not left behind by the two dead ranks", g_leak->pair);
  /* the dead ranks' pids in the pair's name */
  pid_t d0 = 0, d1 = 0;
  const char* tl = strchr(g_leak->pair, '~');
  T_REQUIRE(tl && sscanf(tl, "~0-1~%d-%d", &d0, &d1) == 2 && d0 > 0 && d1 > 0);
  char live[320], foreign[320], other_ns[320];
  make_decoy(live, sizeof live, g_leak->session, getpid(), d1, 0600, pidns());
  snprintf(foreign, sizeof foreign, "%s-f", g_leak->session);
  make_decoy(foreign, sizeof foreign, foreign, d0, d1, 0644, pidns());
  /* dead pids here, but of ranks in another pid namespace (a container sharing /dev/shm) */
  snprintf(other_ns, sizeof other_ns, "%s-n", g_leak->session);
  make_decoy(other_ns, sizeof other_ns, other_ns, d0, d1, 0600, pidns() + 1);
  struct timespec ts = {1, 300 * 1000 * 1000}; /* older than 2 x MLXDIST_CONNECT_TIMEOUT */
  nanosleep(&ts, NULL);
  T_REQUIREF(shm_exists(g_leak->pair), "%s gone before the next session", g_leak->pair);
  o.what = "leak: the next session";
  o.grace_s = 0;
  int bad = t_run_ranks(2, rank_leak_next, NULL, &o, NULL);
  T_REQUIREF(bad == 0, "the next session: %d ranks failed", bad);
  T_REQUIREF(!shm_exists(g_leak->pair), "%s of two dead ranks still there after the next session",
             g_leak->pair);
  T_REQUIREF(shm_exists(live), "%s (a live process) removed", live);
  T_REQUIREF(shm_exists(foreign), "%s (mode 644) removed", foreign);
  T_REQUIREF(shm_exists(other_ns), "%s (another pid namespace) removed", other_ns);
  char path[330];
  snprintf(path, sizeof path, "/%s", other_ns);
  shm_unlink(path);
  snprintf(path, sizeof path, "/%s", live);
  shm_unlink(path);
  snprintf(path, sizeof path, "/%s", foreign);
  shm_unlink(path);
  printf("leak: %s removed by the next session\n", g_leak->pair);
}
