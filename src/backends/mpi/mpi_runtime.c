/* The mpi plugin's runtime: process-wide state, status messages, launcher
 * detection (Open MPI, MPICH/Hydra, PMIx, Slurm, MVAPICH2), starting MPI
 * (MPI_Init_thread, thread level), finalising it at exit when we started it,
 * the live-op count the exit hook waits for, and the kind's functions
 * (available / configured / create). */
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/mpi/mpi_internal.h"
#include "util/clock.h"

/* ---------------------------------------------------------------------- */
/* Status messages: structured inside the plugin (util/status.h, compiled
 * into it), rendered once at the plugin ABI's boundary (mlxd_mpi_done). */

__attribute__((format(printf, 3, 4))) int mlxd_mpi_fail(mlxd_status* st, int code, const char* fmt,
                                                        ...) {
  va_list ap;
  va_start(ap, fmt);
  int rc = mlxd_vfail(st, code, fmt, ap);
  va_end(ap);
  if (st) {
    st->layer = MLXD_LAYER_BACKEND;
    st->rendered = false;
  }
  return rc;
}

/* MPI_Error_string of rc, always NUL-terminated. */
static void error_text(int mpi_rc, char* text, size_t n) {
  char buf[MPI_MAX_ERROR_STRING + 1];
  int len = 0;
  if (MPI_Error_string(mpi_rc, buf, &len) != MPI_SUCCESS || len <= 0) {
    snprintf(text, n, "MPI error code %d", mpi_rc);
    return;
  }
  buf[len > MPI_MAX_ERROR_STRING ? MPI_MAX_ERROR_STRING : len] = '\0';
  snprintf(text, n, "%s", buf);
}

int mlxd_mpi_fail_call(mlxd_status* st, int code, int mpi_rc, const char* call, const char* what) {
  char text[MPI_MAX_ERROR_STRING + 1];
  error_text(mpi_rc, text, sizeof text);
  if (what && *what) return mlxd_mpi_fail(st, code, "%s failed in %s: %s", call, what, text);
  return mlxd_mpi_fail(st, code, "%s failed: %s", call, text);
}

int mlxd_mpi_done(int rc, mlxd_status* s, const char* op, uint64_t seq, int rank,
                  mpip_status* out) {
  if (rc == 0) return 0;
  if (s->code == 0) mlxd_mpi_fail(s, rc, "the operation failed without a message (code %d)", rc);
  if (s->code == MPIP_EABORTED && s->op && op && (strcmp(s->op, op) != 0 || s->seq != seq)) {
    /* The group failed in an earlier op: say which (its detail follows). */
    size_t len = strlen(s->msg);
    if (len + 1 < sizeof s->msg)
      snprintf(s->msg + len, sizeof s->msg - len, " (the group failed in %s #%llu)", s->op,
               (unsigned long long)s->seq);
  }
  if (op) mlxd_status_set_op(s, op, seq);
  if (rank >= 0) mlxd_status_set_self(s, rank);
  mlxd_status_render(s, "mpi");
  memset(out, 0, sizeof *out);
  out->code = s->code;
  out->has_peer = s->has_peer ? 1 : 0;
  out->peer = s->has_peer ? s->peer : 0;
  out->sys_errno = s->sys_errno;
  snprintf(out->msg, sizeof out->msg, "%s", s->msg);
  return s->code;
}

/* ---------------------------------------------------------------------- */
/* Process-wide state. */

mpip_host mlxd_mpi_host;

/* g_mu guards the lifecycle flags below and the live-op count. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_mu_cv; /* CLOCK_MONOTONIC; signalled when g_in_flight drops */
static bool g_cv_ready;
static bool g_mpi_ready;      /* MPI usable by us (initialised, thread level checked) */
static bool g_we_initialized; /* we called MPI_Init_thread */
static pid_t g_init_pid;      /* the process that called it (a forked child must not finalize) */
static bool g_exiting;        /* the exit hook has started */
static bool g_abandoned;      /* some request was given up on (timeout): do not finalise */
static int g_in_flight;       /* ops currently inside MPI calls */
static bool g_serialize;      /* MPI_THREAD_SERIALIZED: one MPI call at a time */
static pthread_mutex_t g_call_mu = PTHREAD_MUTEX_INITIALIZER;

void mlxd_mpi_call_lock(void) {
  if (g_serialize) pthread_mutex_lock(&g_call_mu);
}
void mlxd_mpi_call_unlock(void) {
  if (g_serialize) pthread_mutex_unlock(&g_call_mu);
}

double mlxd_mpi_timeout_s(void) {
  double t = mlxd_mpi_host.timeout_s ? mlxd_mpi_host.timeout_s() : 60.0;
  return t > 0 ? t : 60.0;
}

void mlxd_mpi_cv_init_monotonic(pthread_cond_t* cv) {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(cv, &a);
  pthread_condattr_destroy(&a);
}

struct timespec mlxd_mpi_abs_monotonic(double deadline) {
  struct timespec ts;
  double whole = (double)(long long)deadline;
  ts.tv_sec = (time_t)whole;
  ts.tv_nsec = (long)((deadline - whole) * 1e9);
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec += 1;
    ts.tv_nsec -= 1000000000L;
  }
  return ts;
}

/* Requests given up on (a timeout): MPI may still complete them (a late
 * peer). Each abandoned batch is a set with what its requests still use
 * (mpi_keep): the progress thread tests the sets (mlxd_mpi_lost_poll) and
 * releases that once a whole set has completed. The exit hook tests them
 * once more (bounded) before it finalises; if some never complete it does
 * not finalise (MPI_Finalize could hang) and keeps what they use (reachable
 * from g_lost: a deliberate, bounded leak at exit). */
typedef struct lost_set {
  struct lost_set* next;
  void* own;                        /* freed once complete (NULL: none) */
  void (*release)(mpip_hold* hold); /* the host's release (NULL: no hold) */
  mpip_hold hold;                   /* the caller's arrays, held */
  int n;
  MPI_Request reqs[];
} lost_set;
static lost_set* g_lost; /* under g_mu; detached while mlxd_mpi_lost_poll tests it */
static int g_lost_busy;  /* sets detached by a poll in progress (under g_mu) */

static void lost_release(lost_set* s) {
#if MPIP_HAS_REF
  if (s->release) s->release(&s->hold);
#endif
  free(s->own);
  free(s);
}

void mlxd_mpi_abandon_keep(const MPI_Request* reqs, int n, const mpi_keep* keep) {
  int live = 0;
  for (int i = 0; i < n; i++) live += reqs[i] != MPI_REQUEST_NULL;
  void* own = keep ? keep->own : NULL;
  if (live == 0) { /* nothing of MPI uses it any more */
    free(own);
    return;
  }
  lost_set* s = calloc(1, sizeof *s + sizeof(MPI_Request) * (size_t)live);
#if MPIP_HAS_REF
  mpip_hold hold;
  const mpip_bufref* ref = keep ? keep->ref : NULL;
  /* Taken before returning to the caller, whether or not s exists: a hold
   * that cannot be recorded is never released (a leak, never a free). */
  if (ref) ref->hold(ref, &hold);
#endif
  /* (keep->held likewise: not recorded, never released.) */
  if (!s) {
    pthread_mutex_lock(&g_mu);
    g_abandoned = true; /* cannot track them: never finalise, keep everything */
    pthread_mutex_unlock(&g_mu);
    return;
  }
  s->own = own;
#if MPIP_HAS_REF
  if (ref) {
    s->hold = hold;
    s->release = ref->release;
  } else if (keep && keep->held) {
    s->hold = *keep->held;
    s->release = keep->release;
  }
#endif
  for (int i = 0; i < n; i++)
    if (reqs[i] != MPI_REQUEST_NULL) s->reqs[s->n++] = reqs[i];
  pthread_mutex_lock(&g_mu);
  s->next = g_lost;
  g_lost = s;
  pthread_mutex_unlock(&g_mu);
  if (keep && (keep->own || keep->ref)) mlxd_mpi_progress_kick();
}

void mlxd_mpi_abandon(const MPI_Request* reqs, int n) {
  /* No keep: only the requests are tracked, and the progress thread is not
   * woken (this runs on it, under its lock, for sends). */
  mlxd_mpi_abandon_keep(reqs, n, NULL);
}

bool mlxd_mpi_lost_pending(void) {
  pthread_mutex_lock(&g_mu);
  bool any = g_lost != NULL || g_lost_busy > 0;
  pthread_mutex_unlock(&g_mu);
  return any;
}

bool mlxd_mpi_lost_poll(bool* completed) {
  *completed = false;
  pthread_mutex_lock(&g_mu);
  lost_set* list = g_lost;
  g_lost = NULL;
  int fin = 0;
  MPI_Finalized(&fin);
  if (fin) { /* the application finalised MPI: nothing completes any more */
    g_lost = list;
    pthread_mutex_unlock(&g_mu);
    return false;
  }
  g_lost_busy++;
  pthread_mutex_unlock(&g_mu);
  lost_set *left = NULL, *done = NULL;
  while (list) {
    lost_set* s = list;
    list = s->next;
    int flag = 0;
    mlxd_mpi_call_lock();
    int mrc = mlxd_mpi_test_all(s->n, s->reqs, &flag);
    mlxd_mpi_call_unlock();
    /* An error in a status completes its request too (MPI_ERR_IN_STATUS). */
    if (flag && (mrc == MPI_SUCCESS || mrc == MPI_ERR_IN_STATUS)) {
      s->next = done;
      done = s;
    } else {
      s->next = left;
      left = s;
    }
  }
  pthread_mutex_lock(&g_mu);
  while (left) { /* back in front of the sets abandoned meanwhile */
    lost_set* s = left;
    left = s->next;
    s->next = g_lost;
    g_lost = s;
  }
  g_lost_busy--;
  bool any = g_lost != NULL;
  pthread_mutex_unlock(&g_mu);
  while (done) { /* no lock held: a release may run the caller's destructor */
    lost_set* s = done;
    done = s->next;
    lost_release(s);
    *completed = true;
  }
  return any;
}

/* Every op that calls MPI runs between mlxd_mpi_op_begin and
 * mlxd_mpi_op_end, so the exit hook never finalises under it. */
int mlxd_mpi_op_begin(mlxd_status* st) {
  int rc = 0;
  pthread_mutex_lock(&g_mu);
  int fin = 0;
  MPI_Finalized(&fin);
  if (g_exiting || fin)
    rc = mlxd_mpi_fail(st, MPIP_EUNAVAIL,
                       "MPI is being finalised (the process is exiting); the op was not started");
  else
    g_in_flight++;
  pthread_mutex_unlock(&g_mu);
  return rc;
}
void mlxd_mpi_op_end(void) {
  pthread_mutex_lock(&g_mu);
  g_in_flight--;
  pthread_cond_broadcast(&g_mu_cv);
  pthread_mutex_unlock(&g_mu);
}

/* ---------------------------------------------------------------------- */
/* Launcher detection, MPI start and finalisation. */

static const char* const k_launcher_env[] = {
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_RANK", /* Open MPI's mpirun */
    "PMI_RANK",
    "PMI_SIZE", /* MPICH/Hydra, Intel MPI, Slurm PMI-1/2 */
    "PMI_FD",
    "PMI_PORT", /* PMI wire-up (Hydra, Slurm --mpi=pmi2) */
    "PMIX_RANK",
    "PMIX_NAMESPACE", /* PMIx (Open MPI 5, Slurm --mpi=pmix, prrte) */
    "HYDRA_CONTROL_FD",
    "MPI_LOCALRANKID",     /* Hydra, Intel MPI */
    "MV2_COMM_WORLD_RANK", /* MVAPICH2 */
};
#define N_LAUNCHER_ENV (sizeof k_launcher_env / sizeof k_launcher_env[0])

static bool launched_by_mpi(void) {
  for (size_t i = 0; i < N_LAUNCHER_ENV; i++) {
    const char* v = getenv(k_launcher_env[i]);
    if (v && *v) return true;
  }
  return false;
}
static bool mpi_running(void) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

static const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown thread level";
}

/* Runs once at process exit when this plugin initialised MPI. */
static void mpi_exit_hook(void) {
  /* A forked child's exit: MPI, its progress thread and the requests are
   * the parent's (the child cannot use them: core/fork.h); finalizing or
   * joining here would disturb the parent or hang on a thread that is not
   * in this process. */
  if (getpid() != g_init_pid) return;
  double t = mlxd_mpi_timeout_s();
  pthread_mutex_lock(&g_mu);
  g_exiting = true;
  double deadline = mlxd_now() + t;
  while (g_in_flight > 0 && mlxd_now() < deadline) {
    struct timespec ts = mlxd_mpi_abs_monotonic(deadline);
    pthread_cond_timedwait(&g_mu_cv, &g_mu, &ts);
  }
  int busy = g_in_flight;
  pthread_mutex_unlock(&g_mu);

  mlxd_mpi_sends_stop();

  /* Requests given up on may have completed since (a late peer): wait for
   * them, bounded (the progress thread has stopped: poll here). What the
   * completed ones kept is released; the rest stays held. */
  pthread_mutex_lock(&g_mu);
  bool abandoned = g_abandoned;
  pthread_mutex_unlock(&g_mu);
  if (!abandoned && mlxd_mpi_lost_pending()) {
    double until = mlxd_now() + t;
    bool completed = false;
    while (mlxd_mpi_lost_poll(&completed)) {
      if (mlxd_now() >= until) {
        abandoned = true;
        break;
      }
      struct timespec ts = {0, 1000000L};
      nanosleep(&ts, NULL);
    }
  }
  if (busy > 0 || abandoned) {
    fprintf(stderr, "[mpi] not finalising MPI at exit: %s; MPI may still be using their buffers\n",
            busy > 0 ? "ops are still running on other threads"
                     : "an op timed out and its requests never completed");
    return;
  }
  if (!mpi_running()) return;
  mlxd_mpi_free_user_ops();
  MPI_Finalize();
}

/* Start MPI if needed and check its thread level. g_mu held. */
static int ensure_mpi_locked(mlxd_status* st) {
  if (g_mpi_ready) {
    if (mpi_running()) return 0;
    return mlxd_mpi_fail(st, MPIP_EUNAVAIL,
                         "MPI was finalised in this process and cannot be started again");
  }
  if (!g_cv_ready) {
    mlxd_mpi_cv_init_monotonic(&g_mu_cv);
    g_cv_ready = true;
  }
  int init = 0, fin = 0;
  MPI_Finalized(&fin);
  if (fin)
    return mlxd_mpi_fail(st, MPIP_EUNAVAIL,
                         "MPI was already finalised in this process; it cannot be started again");
  MPI_Initialized(&init);
  int provided = MPI_THREAD_SINGLE;
  if (!init) {
    /* Open MPI loads its components with dlopen and they expect the MPI
     * library's symbols to be global; we may have been loaded RTLD_LOCAL. */
    Dl_info info;
    int (*fn)(int*, char***, int, int*) = MPI_Init_thread;
    void* addr = NULL;
    memcpy(&addr, &fn, sizeof addr); /* ISO C has no function-to-object cast */
    if (dladdr(addr, &info) && info.dli_fname)
      (void)dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS)
      return mlxd_mpi_fail_call(st, MPIP_EUNAVAIL, rc, "MPI_Init_thread", NULL);
    g_we_initialized = true;
    g_init_pid = getpid();
    atexit(mpi_exit_hook);
    /* Our own calls on MPI_COMM_WORLD report errors instead of aborting. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_SERIALIZED)
    return mlxd_mpi_fail(st, MPIP_EUNAVAIL,
                         "the MPI library provides %s, but mlxdist runs MPI calls on stream "
                         "worker threads and needs MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE",
                         thread_level_name(provided));
  g_serialize = provided < MPI_THREAD_MULTIPLE;
  int rc = mlxd_mpi_create_user_ops(st);
  if (rc) return rc;
  g_mpi_ready = true;
  return 0;
}

#if MPIP_HAS_DESCRIBE
/* One line (mlxdist-info --group prints it): the first line of the MPI
 * library's version string up to its first comma ("Open MPI v4.1.4"), tabs
 * as spaces ("MPICH Version: 4.0"), the MPI version, the thread level and
 * the communicator size, and whether calls are checked (MLXDIST_CHECK). */
void mlxd_mpi_describe(mpip_backend* b, char* buf, size_t len) {
  if (!buf || len == 0) return;
  char lib[MPI_MAX_LIBRARY_VERSION_STRING + 1];
  int n = 0, major = 0, minor = 0, provided = MPI_THREAD_SINGLE;
  mlxd_mpi_call_lock();
  if (MPI_Get_library_version(lib, &n) != MPI_SUCCESS) n = 0;
  MPI_Get_version(&major, &minor);
  MPI_Query_thread(&provided);
  mlxd_mpi_call_unlock();
  lib[n < 0 ? 0 : (n > MPI_MAX_LIBRARY_VERSION_STRING ? MPI_MAX_LIBRARY_VERSION_STRING : n)] = '\0';
  lib[strcspn(lib, "\r\n,")] = '\0';
  for (char* c = lib; *c; c++)
    if (*c == '\t') *c = ' ';
  snprintf(buf, len, "%s (MPI-%d.%d), %s, communicator of %d%s",
           lib[0] ? lib : "unknown MPI library", major, minor, thread_level_name(provided),
           (int)b->size, ((const mpi_group*)b)->check ? ", call checks on (MLXDIST_CHECK)" : "");
}
#endif

void mlxd_mpi_set_host(const mpip_host* host) {
  pthread_mutex_lock(&g_mu);
  memcpy(&mlxd_mpi_host, host, offsetof(mpip_host, spin_us) + sizeof(host->spin_us));
  mlxd_mpi_host.struct_size = (uint32_t)sizeof mlxd_mpi_host;
  pthread_mutex_unlock(&g_mu);
}

/* ---------------------------------------------------------------------- */
/* The kind. */

bool mlxd_mpi_is_available(char* why, size_t why_len) {
  int major = 0, minor = 0;
  MPI_Get_version(&major, &minor);
  if (major < 3) {
    if (why && why_len)
      snprintf(why, why_len,
               "[mpi] the MPI library implements MPI-%d.%d, but the mpi backend needs MPI-3 "
               "(non-blocking collectives)",
               major, minor);
    return false;
  }
  if (why && why_len) why[0] = '\0';
  return true;
}

bool mlxd_mpi_is_configured(bool with_bootstrap) {
  if (with_bootstrap) return false; /* MPI bootstraps through its launcher only */
  return launched_by_mpi() || mpi_running();
}

static int create_impl(mpip_bootstrap* bs, mpip_backend** out, mlxd_status* st) {
  *out = NULL;
  if (bs)
    return mlxd_mpi_fail(st, MPIP_EINVAL,
                         "the mpi backend cannot use a caller's all-gather (it is set up by "
                         "its launcher, mpirun/mpiexec); use \"ring\" or \"jaccl\" for "
                         "init_with_all_gather");
  if (!mpi_running() && !launched_by_mpi())
    return mlxd_mpi_fail(st, MPIP_EUNAVAIL,
                         "this process was not started by an MPI launcher: none of "
                         "OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_RANK, PMI_RANK, PMI_SIZE, PMI_FD, "
                         "PMIX_RANK is set (run it with mpirun/mpiexec, or srun --mpi=pmix)");
  pthread_mutex_lock(&g_mu);
  int rc = ensure_mpi_locked(st);
  if (rc == 0 && g_exiting)
    rc = mlxd_mpi_fail(st, MPIP_EUNAVAIL, "the process is exiting; no new group can start");
  if (rc == 0) g_in_flight++;
  pthread_mutex_unlock(&g_mu);
  if (rc) return rc;

  /* Duplicate MPI_COMM_WORLD without blocking unboundedly. */
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request req = MPI_REQUEST_NULL;
  mlxd_mpi_call_lock();
  int mrc = MPI_Comm_idup(MPI_COMM_WORLD, &comm, &req);
  mlxd_mpi_call_unlock();
  if (mrc != MPI_SUCCESS) {
    rc = mlxd_mpi_fail_call(st, MPIP_EUNAVAIL, mrc, "MPI_Comm_idup", "init");
    mlxd_mpi_op_end();
    return rc;
  }
  /* A temporary group so mlxd_mpi_wait_reqs can report rank/size and be failed. */
  mpi_group tmp;
  memset(&tmp, 0, sizeof tmp);
  mlxd_mpi_call_lock();
  MPI_Comm_rank(MPI_COMM_WORLD, &tmp.base.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &tmp.base.size);
  mlxd_mpi_call_unlock();
  pthread_mutex_init(&tmp.mu, NULL);
  mlxd_mpi_cv_init_monotonic(&tmp.cv);
  rc = mlxd_mpi_wait_reqs(&tmp, &req, 1, NULL, false, "init (MPI_Comm_idup of MPI_COMM_WORLD)", -1,
                          st);
  pthread_mutex_destroy(&tmp.mu);
  pthread_cond_destroy(&tmp.cv);
  if (rc) {
    mlxd_mpi_op_end();
    return rc;
  }
  mpi_group* g = mlxd_mpi_group_new(comm, st);
  if (!g) {
    mlxd_mpi_op_end();
    mlxd_mpi_call_lock();
    MPI_Comm_free(&comm);
    mlxd_mpi_call_unlock();
    return MPIP_ENOMEM;
  }
  /* Whether the group checks every call (MLXDIST_CHECK): all ranks must agree. */
  rc = mlxd_mpi_check_agree(g, st);
  mlxd_mpi_op_end();
  if (rc) {
    g->base.ops->destroy(&g->base);
    return rc;
  }
  *out = &g->base;
  return 0;
}

/* The kind's create, at the ABI boundary: its failure rendered once, with
 * this process's rank in MPI_COMM_WORLD where MPI is running. */
int mlxd_mpi_create(mpip_bootstrap* bs, mpip_backend** out, mpip_status* st) {
  mlxd_status s = {0};
  /* Read on the caller's thread and kept: the ops that use it run on the
   * core's stream workers, which never read the environment (util/env.h). */
  (void)mlxd_mpi_chunk_bytes();
  int rc = create_impl(bs, out, &s);
  if (rc == 0) return 0;
  int rank = -1;
  if (mpi_running()) {
    mlxd_mpi_call_lock();
    if (MPI_Comm_rank(MPI_COMM_WORLD, &rank) != MPI_SUCCESS) rank = -1;
    mlxd_mpi_call_unlock();
  }
  return mlxd_mpi_done(rc, &s, NULL, 0, rank, st);
}
