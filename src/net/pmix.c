/* The PMIx client (pmix.h): libpmix by dlopen, one PMIx_Init per process,
 * the job's rank, size and local ranks, and an all-gather over
 * PMIx_Put/Commit/Fence/Get.
 *
 * Every wait is bounded here, not only by the server: the fence and the gets
 * are PMIx's non-blocking forms, waited for on a condition variable until a
 * deadline (PMIX_TIMEOUT is passed as well, so a server that honours it
 * answers first with its own error). A call abandoned at the deadline
 * leaves its small state block to the callback, which frees it if it ever
 * runs. Everything PMIx returns is checked before use: the namespace's
 * length, the job size and ranks against their ranges, each value's type
 * and byte count against what this round expects. */
#include "net/pmix.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/fork.h"
#include "net/pmix_abi.h"
#include "util/dl.h"
#include "util/env.h"
#include "util/tunables.h"

#define MAX_RANKS (1 << 20) /* as MLX_WORLD_SIZE with a caller's all-gather */
#define MAX_VALUE_BYTES (1u << 20)
#define FINALIZE_BOUND_S 10.0

typedef struct pmix_lib {
  char name[256];
  mlxd_pmix_init_fn init;
  mlxd_pmix_finalize_fn finalize;
  mlxd_pmix_put_fn put;
  mlxd_pmix_commit_fn commit;
  mlxd_pmix_fence_nb_fn fence_nb;
  mlxd_pmix_get_nb_fn get_nb;
  mlxd_pmix_error_string_fn error_string;
  mlxd_pmix_get_version_fn get_version;
} pmix_lib;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pmix_lib g_lib;
static bool g_loaded, g_inited, g_exit_hooked;
static long g_init_pid;
static mlxd_pmix_proc g_self;
static atomic_uint g_round; /* all-gather rounds of this process: the keys */

bool mlxd_pmix_present(void) {
  const char* ns = mlxd_env_get("PMIX_NAMESPACE");
  const char* rk = mlxd_env_get("PMIX_RANK");
  return ns && *ns && rk && *rk;
}

static const char* perr(mlxd_pmix_status s) {
  const char* t = g_lib.error_string ? g_lib.error_string(s) : NULL;
  return t ? t : "unknown PMIx status";
}

/* ---- loading ---- */

static int load_locked(mlxd_status* st) {
  if (g_loaded) return 0;
  const char* want = mlxd_tunable_str(MLXD_T_PMIX_LIB);
  const char* names[2] = {"libpmix.so.2", "libpmix.so"};
  int nn = 2;
  if (want && *want) {
    names[0] = want;
    nn = 1;
  }
  char errs[600] = "";
  const char* used = NULL;
  /* the library only: its functions are resolved below, where a missing one
   * leaves it loaded (util/dl.c would close it) */
  void* h = mlxd_dl_open(names, (size_t)nn, NULL, 0, &used, errs, sizeof errs);
  if (!h)
    return mlxd_fail_at(st, MLXD_EUNAVAIL, MLXD_LAYER_BOOTSTRAP,
                        "a PMIx server started this process (PMIX_NAMESPACE is set), but libpmix "
                        "cannot be loaded (%s); install it (Debian: libpmix2) or name it with "
                        "MLXDIST_PMIX_LIB",
                        errs);
  pmix_lib L;
  memset(&L, 0, sizeof L);
  snprintf(L.name, sizeof L.name, "%s", used);
  struct {
    const char* name;
    void** slot;
  } want_syms[] = {
      {"PMIx_Init", (void**)&L.init},         {"PMIx_Finalize", (void**)&L.finalize},
      {"PMIx_Put", (void**)&L.put},           {"PMIx_Commit", (void**)&L.commit},
      {"PMIx_Fence_nb", (void**)&L.fence_nb}, {"PMIx_Get_nb", (void**)&L.get_nb},
  };
  for (size_t i = 0; i < sizeof want_syms / sizeof want_syms[0]; i++) {
    *want_syms[i].slot = dlsym(h, want_syms[i].name);
    if (!*want_syms[i].slot)
      /* h stays loaded: another part of the process (an MPI library) may use it */
      return mlxd_fail_at(st, MLXD_EUNAVAIL, MLXD_LAYER_BOOTSTRAP,
                          "%s is not a usable libpmix: it has no %s", used, want_syms[i].name);
  }
  *(void**)&L.error_string = dlsym(h, "PMIx_Error_string");
  *(void**)&L.get_version = dlsym(h, "PMIx_Get_version");
  g_lib = L;
  g_loaded = true;
  return 0;
}

/* ---- bounded waits on the non-blocking calls ---- */

/* One call in flight. Owned by the waiter until it gives up (abandoned),
 * then by the callback, which frees it. info and procs live here because
 * PMIx reads them until it calls back. */
typedef struct pend {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done, abandoned;
  mlxd_pmix_status status;
  /* a get's value, checked in the callback (PMIx owns kv only for the callback) */
  size_t want; /* bytes expected (byte objects) */
  unsigned char* bytes;
  mlxd_pmix_data_type type;
  size_t got;             /* the byte object's size, as PMIx said */
  unsigned long long num; /* an integer value */
  bool num_ok;
  mlxd_pmix_proc procs[1];
  mlxd_pmix_info info[2];
} pend;

static pend* pend_new(size_t want) {
  pend* p = calloc(1, sizeof *p);
  if (!p) return NULL;
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&p->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_mutex_init(&p->mu, NULL);
  p->want = want;
  if (want && !(p->bytes = malloc(want))) {
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
    return NULL;
  }
  return p;
}

static void pend_free(pend* p) {
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->mu);
  free(p->bytes);
  free(p);
}

/* Finish p from a callback: record, wake, or free when the waiter has gone. */
static void pend_finish(pend* p, mlxd_pmix_status s) {
  pthread_mutex_lock(&p->mu);
  p->status = s;
  p->done = true;
  bool gone = p->abandoned;
  pthread_cond_signal(&p->cv);
  pthread_mutex_unlock(&p->mu);
  if (gone) pend_free(p);
}

static void on_op(mlxd_pmix_status s, void* cbdata) { pend_finish(cbdata, s); }

static void on_value(mlxd_pmix_status s, mlxd_pmix_value* kv, void* cbdata) {
  pend* p = cbdata;
  if (s == MLXD_PMIX_SUCCESS && kv) {
    p->type = kv->type;
    switch (kv->type) {
      case MLXD_PMIX_BYTE_OBJECT:
        p->got = kv->data.bo.size;
        if (p->bytes && kv->data.bo.bytes && kv->data.bo.size == p->want)
          memcpy(p->bytes, kv->data.bo.bytes, p->want);
        break;
      case MLXD_PMIX_UINT16: p->num = kv->data.uint16, p->num_ok = true; break;
      case MLXD_PMIX_UINT32:
      case MLXD_PMIX_PROC_RANK: p->num = kv->data.uint32, p->num_ok = true; break;
      case MLXD_PMIX_SIZE: p->num = kv->data.size, p->num_ok = true; break;
      case MLXD_PMIX_INT:
        if (kv->data.integer >= 0) p->num = (unsigned)kv->data.integer, p->num_ok = true;
        break;
      default: break;
    }
  } else if (s == MLXD_PMIX_SUCCESS) {
    s = MLXD_PMIX_ERR_NOT_FOUND;
  }
  pend_finish(p, s);
}

/* Wait for p until deadline. 0: done (p->status says how); -1: timed out,
 * p now belongs to its callback (never touch it again). */
static int pend_wait(pend* p, double deadline) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  double now = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
  double left = deadline - now;
  if (left < 0) left = 0;
  ts.tv_sec += (time_t)left;
  ts.tv_nsec += (long)((left - (double)(time_t)left) * 1e9);
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&p->mu);
  while (!p->done) {
    int rc = pthread_cond_timedwait(&p->cv, &p->mu, &ts);
    if (rc == ETIMEDOUT && !p->done) {
      p->abandoned = true;
      pthread_mutex_unlock(&p->mu);
      return -1;
    }
  }
  pthread_mutex_unlock(&p->mu);
  return 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void info_set_timeout(mlxd_pmix_info* in, double timeout_s) {
  memset(in, 0, sizeof *in);
  snprintf(in->key, sizeof in->key, "%s", MLXD_PMIX_KEY_TIMEOUT);
  in->value.type = MLXD_PMIX_INT;
  in->value.data.integer = timeout_s >= 86400 ? 86400 : (int)timeout_s + 1;
}

/* Get key of proc (rank) into a fresh pend (want: bytes expected of a byte object, else 0).
 * Returns the pend (done, status 0) or NULL with st set. */
static pend* get_value(const mlxd_pmix_job* job, mlxd_pmix_rank rank, const char* key, size_t want,
                       double deadline, mlxd_status* st) {
  pend* p = pend_new(want);
  if (!p)
    return mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory (PMIx_Get)"), NULL;
  mlxd_pmix_proc who;
  memset(&who, 0, sizeof who);
  memcpy(who.nspace, job->nspace, sizeof who.nspace);
  who.rank = rank;
  info_set_timeout(&p->info[0], deadline - now_s());
  mlxd_pmix_status s = g_lib.get_nb(&who, key, p->info, 1, on_value, p);
  char whom[32];
  if (rank == MLXD_PMIX_RANK_WILDCARD)
    snprintf(whom, sizeof whom, "the job");
  else
    snprintf(whom, sizeof whom, "rank %u", (unsigned)rank);
  if (s != MLXD_PMIX_SUCCESS) {
    pend_free(p);
    mlxd_fail_at(st, s == MLXD_PMIX_ERR_NOT_FOUND ? MLXD_EREMOTE : MLXD_EUNAVAIL,
                 MLXD_LAYER_BOOTSTRAP, "PMIx_Get(%s of %s) failed: %s (%d)", key, whom, perr(s), s);
    return NULL;
  }
  if (pend_wait(p, deadline) != 0) {
    mlxd_fail_at(st, MLXD_ETIMEDOUT, MLXD_LAYER_BOOTSTRAP,
                 "PMIx_Get(%s of %s) did not complete within %.0f s (MLXDIST_LAUNCH_TIMEOUT, else "
                 "MLXDIST_TIMEOUT)",
                 key, whom, job->timeout_s);
    return NULL;
  }
  if (p->status != MLXD_PMIX_SUCCESS) {
    mlxd_fail_at(st, p->status == MLXD_PMIX_ERR_TIMEOUT ? MLXD_ETIMEDOUT : MLXD_EREMOTE,
                 MLXD_LAYER_BOOTSTRAP, "PMIx_Get(%s of %s) failed: %s (%d)", key, whom,
                 perr(p->status), p->status);
    pend_free(p);
    return NULL;
  }
  return p;
}

/* An integer of the job (or of this rank) in [lo, hi]; *v = -1 when the server
 * does not have it and !required. */
static int get_int(const mlxd_pmix_job* job, mlxd_pmix_rank rank, const char* key, long lo, long hi,
                   bool required, double deadline, long* v, mlxd_status* st) {
  *v = -1;
  pend* p = get_value(job, rank, key, 0, deadline, st);
  if (!p) {
    if (required || st->code == MLXD_ETIMEDOUT) return st->code;
    mlxd_status_clear(st);
    return 0;
  }
  bool ok = p->num_ok && p->num >= (unsigned long long)lo && p->num <= (unsigned long long)hi;
  unsigned long long num = p->num;
  bool num_ok = p->num_ok;
  mlxd_pmix_data_type type = p->type;
  pend_free(p);
  if (!ok) {
    if (num_ok)
      return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                          "the PMIx server says %s = %llu, outside [%ld, %ld]", key, num, lo, hi);
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "the PMIx server's %s is not an integer (PMIx type %u)", key,
                        (unsigned)type);
  }
  *v = (long)num;
  return 0;
}

/* ---- the all-gather ---- */

static int pmix_all_gather(mlxd_bootstrap* bs, void* dst, const void* src, size_t n,
                           mlxd_status* st) {
  mlxd_pmix_job* job = (mlxd_pmix_job*)bs;
  if (n == 0 || n > MAX_VALUE_BYTES)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "PMIx all-gather of %zu bytes per rank (at most %u)", n, MAX_VALUE_BYTES);
  const double deadline = now_s() + job->timeout_s;
  char key[64];
  unsigned round = atomic_fetch_add(&g_round, 1);
  snprintf(key, sizeof key, "mlxdist.ag.%u", round);
  mlxd_pmix_value v;
  memset(&v, 0, sizeof v);
  v.type = MLXD_PMIX_BYTE_OBJECT;
  v.data.bo.bytes = (char*)(uintptr_t)src; /* PMIx_Put copies it */
  v.data.bo.size = n;
  mlxd_pmix_status s = g_lib.put(MLXD_PMIX_GLOBAL, key, &v);
  if (s == MLXD_PMIX_SUCCESS) s = g_lib.commit();
  if (s != MLXD_PMIX_SUCCESS)
    return mlxd_fail_at(st, MLXD_EUNAVAIL, MLXD_LAYER_BOOTSTRAP,
                        "PMIx_Put/PMIx_Commit of this rank's %zu bytes failed: %s (%d)", n, perr(s),
                        s);
  /* the fence over the whole namespace, collecting everyone's data */
  pend* f = pend_new(0);
  if (!f) return mlxd_fail_at(st, MLXD_ENOMEM, MLXD_LAYER_BOOTSTRAP, "out of memory (PMIx_Fence)");
  memcpy(f->procs[0].nspace, job->nspace, sizeof f->procs[0].nspace);
  f->procs[0].rank = MLXD_PMIX_RANK_WILDCARD;
  snprintf(f->info[0].key, sizeof f->info[0].key, "%s", MLXD_PMIX_KEY_COLLECT_DATA);
  f->info[0].value.type = MLXD_PMIX_BOOL;
  f->info[0].value.data.flag = true;
  info_set_timeout(&f->info[1], job->timeout_s);
  s = g_lib.fence_nb(f->procs, 1, f->info, 2, on_op, f);
  if (s == MLXD_PMIX_OPERATION_SUCCEEDED) {
    pend_free(f); /* done at once: no callback */
  } else if (s != MLXD_PMIX_SUCCESS) {
    pend_free(f);
    return mlxd_fail_at(st, MLXD_EUNAVAIL, MLXD_LAYER_BOOTSTRAP, "PMIx_Fence failed: %s (%d)",
                        perr(s), s);
  } else if (pend_wait(f, deadline + 1.0) != 0) {
    return mlxd_fail_at(st, MLXD_ETIMEDOUT, MLXD_LAYER_BOOTSTRAP,
                        "PMIx_Fence (round %u): not every rank of the job arrived within %.0f s "
                        "(MLXDIST_LAUNCH_TIMEOUT, else MLXDIST_TIMEOUT)",
                        round, job->timeout_s);
  } else {
    s = f->status;
    pend_free(f);
    if (s != MLXD_PMIX_SUCCESS)
      return mlxd_fail_at(st, s == MLXD_PMIX_ERR_TIMEOUT ? MLXD_ETIMEDOUT : MLXD_EREMOTE,
                          MLXD_LAYER_BOOTSTRAP, "PMIx_Fence (round %u) failed: %s (%d)%s", round,
                          perr(s), s,
                          s == MLXD_PMIX_ERR_TIMEOUT ? ": not every rank of the job arrived" : "");
  }
  for (int r = 0; r < bs->size; r++) {
    if (r == bs->rank) {
      memcpy((unsigned char*)dst + (size_t)r * n, src, n);
      continue;
    }
    pend* p = get_value(job, (mlxd_pmix_rank)r, key, n, deadline + 1.0, st);
    if (!p) return st->code;
    bool ok = p->type == MLXD_PMIX_BYTE_OBJECT && p->got == n;
    if (ok) memcpy((unsigned char*)dst + (size_t)r * n, p->bytes, n);
    mlxd_pmix_data_type type = p->type;
    size_t got = p->got;
    pend_free(p);
    if (!ok)
      return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                          "rank %d's value for %s from the PMIx server is %s%zu bytes, expected "
                          "a byte object of %zu bytes",
                          r, key, type == MLXD_PMIX_BYTE_OBJECT ? "" : "not a byte object, or ",
                          type == MLXD_PMIX_BYTE_OBJECT ? got : (size_t)0, n);
  }
  return 0;
}

/* ---- init and exit ---- */

typedef struct fin_wait {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done, abandoned;
} fin_wait;

static void* finalize_main(void* arg) {
  fin_wait* w = arg;
  g_lib.finalize(NULL, 0);
  pthread_mutex_lock(&w->mu);
  w->done = true;
  bool gone = w->abandoned;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
  if (gone) free(w); /* (mutex and cv need no destroy on Linux once unused) */
  return NULL;
}

/* At exit, in the process that initialised PMIx: PMIx_Finalize (the server
 * counts a client that exits without it as failed), on a thread, waited for
 * at most FINALIZE_BOUND_S. */
static void pmix_at_exit(void) {
  pthread_mutex_lock(&g_mu);
  bool mine = g_inited && g_init_pid == mlxd_self_pid();
  g_inited = false;
  pthread_mutex_unlock(&g_mu);
  if (!mine) return;
  fin_wait* w = calloc(1, sizeof *w);
  if (!w) return;
  pthread_mutex_init(&w->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&w->cv, &ca);
  pthread_condattr_destroy(&ca);
  pthread_t th;
  if (mlxd_thread_start(&th, "pmix-fin", finalize_main, w) != 0) {
    free(w);
    return;
  }
  pthread_detach(th);
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_sec += (time_t)FINALIZE_BOUND_S;
  pthread_mutex_lock(&w->mu);
  while (!w->done)
    if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) == ETIMEDOUT) break;
  bool done = w->done;
  if (!done) w->abandoned = true;
  pthread_mutex_unlock(&w->mu);
  if (done)
    free(w);
  else
    fprintf(stderr, "[pmix] PMIx_Finalize did not return within %.0f s; exiting without it\n",
            FINALIZE_BOUND_S);
}

static int init_locked(mlxd_status* st) {
  long self = mlxd_self_pid();
  if (g_inited && g_init_pid != self)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "PMIx was initialised by process %ld, of which this one (%ld) is a forked "
                        "child: a child cannot use its parent's PMIx connection",
                        g_init_pid, self);
  if (g_inited) return 0;
  mlxd_pmix_proc me;
  memset(&me, 0, sizeof me);
  mlxd_pmix_status s = g_lib.init(&me, NULL, 0);
  if (s != MLXD_PMIX_SUCCESS)
    return mlxd_fail_at(st, MLXD_EUNAVAIL, MLXD_LAYER_BOOTSTRAP,
                        "PMIx_Init failed: %s (%d) (PMIX_NAMESPACE=%.64s: the server that started "
                        "this process is gone, or refused it)",
                        perr(s), s,
                        mlxd_env_get("PMIX_NAMESPACE") ? mlxd_env_get("PMIX_NAMESPACE") : "");
  g_self = me;
  g_inited = true;
  g_init_pid = self;
  if (!g_exit_hooked) {
    g_exit_hooked = true;
    atexit(pmix_at_exit);
  }
  return 0;
}

int mlxd_pmix_open(mlxd_pmix_job* job, double timeout_s, mlxd_status* st) {
  memset(job, 0, sizeof *job);
  job->local_rank = job->local_size = -1;
  job->timeout_s = timeout_s;
  pthread_mutex_lock(&g_mu);
  int rc = load_locked(st);
  if (!rc) rc = init_locked(st);
  mlxd_pmix_proc me = g_self;
  pthread_mutex_unlock(&g_mu);
  if (rc) return rc;
  if (memchr(me.nspace, '\0', sizeof me.nspace) == NULL || me.nspace[0] == '\0')
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "PMIx_Init gave an empty or unterminated namespace");
  memcpy(job->nspace, me.nspace, sizeof job->nspace);
  const double deadline = now_s() + timeout_s;
  long size, lsize, lrank;
  if ((rc = get_int(job, MLXD_PMIX_RANK_WILDCARD, MLXD_PMIX_KEY_JOB_SIZE, 1, MAX_RANKS, true,
                    deadline, &size, st)))
    return rc;
  if (me.rank >= (mlxd_pmix_rank)size)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "PMIx_Init gave rank %u, outside the job's size %ld (%s)",
                        (unsigned)me.rank, size, MLXD_PMIX_KEY_JOB_SIZE);
  if ((rc = get_int(job, MLXD_PMIX_RANK_WILDCARD, MLXD_PMIX_KEY_LOCAL_SIZE, 1, size, false,
                    deadline, &lsize, st)))
    return rc;
  if ((rc = get_int(job, me.rank, MLXD_PMIX_KEY_LOCAL_RANK, 0, size - 1, false, deadline, &lrank,
                    st)))
    return rc;
  if (lsize > 0 && lrank >= lsize)
    return mlxd_fail_at(st, MLXD_EINVAL, MLXD_LAYER_BOOTSTRAP,
                        "the PMIx server says this rank is local rank %ld of %ld on its node",
                        lrank, lsize);
  job->bs.rank = (int)me.rank;
  job->bs.size = (int)size;
  job->bs.all_gather = pmix_all_gather;
  job->local_rank = (int)lrank;
  job->local_size = (int)lsize;
  return 0;
}
