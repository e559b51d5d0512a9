/* The mpi backend: a plugin (libmlxdist-mpi.so) that runs mlxdist's
 * collectives and point-to-point ops over an MPI library.
 *
 * It does not link libmlxdist: the reduction kernels, the dtype sizes and
 * the tunables come through the host table given to mlxdist_plugin_v1.
 *
 * Rules kept here (docs/mpi.md explains them for users):
 * - MPI is started only when the process was launched by an MPI launcher
 *   (or the application initialised MPI itself), never as a singleton.
 * - MPI_Init_thread asks for MPI_THREAD_MULTIPLE; with SERIALIZED every MPI
 *   call is made under one mutex; anything lower is refused.
 * - Each group owns a duplicate of MPI_COMM_WORLD (or a split of one) with
 *   MPI_ERRORS_RETURN. Collectives are issued in sequence-number order (a
 *   turnstile), so concurrent streams never issue them in different orders
 *   on different ranks.
 * - Every wait polls non-blocking MPI requests (spin, then sleep) against a
 *   deadline of MLXDIST_TIMEOUT seconds without progress. A timeout fails
 *   the group: later ops fail fast with the same message.
 * - A send copies its data and returns; the copy is handed to MPI and
 *   completed in the background, so sends posted before receives on both
 *   sides never deadlock.
 * - If this plugin initialised MPI, it finalises it once, at process exit. */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "distributed/backend.h"
#include "distributed/plugin_abi.h"
#include "util/clock.h"

#define MPI_EXPORT __attribute__((visibility("default")))

/* Tags for point-to-point messages: seq modulo a bound every MPI library
 * accepts (the standard guarantees MPI_TAG_UB >= 32767). */
#define MPI_P2P_TAG_MOD 32768u
/* Largest piece handed to one MPI call, in bytes (counts are int). */
/* Idle staging buffers kept per group. */
#define MPI_STAGE_POOL 2
#define MPI_DEFAULT_CHUNK_BYTES ((size_t)1 << 30)

/* ---------------------------------------------------------------------- */
/* Status messages (the core's mlxd_fail is not ours to call). */

__attribute__((format(printf, 3, 4))) static int mpi_fail(mlxd_status* st, int code,
                                                            const char* fmt, ...) {
  if (st) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->msg, sizeof st->msg, fmt, ap);
    va_end(ap);
    st->code = code;
  }
  return code;
}

/* "[mpi] <call> failed: <MPI_Error_string>" (+ what it was doing). */
static int mpi_fail_call(mlxd_status* st, int code, int mpi_rc, const char* call,
                         const char* what) {
  char text[MPI_MAX_ERROR_STRING + 1];
  int len = 0;
  text[0] = '\0';
  if (MPI_Error_string(mpi_rc, text, &len) != MPI_SUCCESS)
    snprintf(text, sizeof text, "MPI error code %d", mpi_rc);
  else
    text[len < 0 ? 0 : (len > MPI_MAX_ERROR_STRING ? MPI_MAX_ERROR_STRING : len)] = '\0';
  if (what && *what)
    return mpi_fail(st, code, "[mpi] %s failed in %s: %s", call, what, text);
  return mpi_fail(st, code, "[mpi] %s failed: %s", call, text);
}

/* ---------------------------------------------------------------------- */
/* Process-wide state. */

static mlxd_host_api g_host;

/* g_mu guards the lifecycle flags below and the live-op count. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_mu_cv; /* CLOCK_MONOTONIC; signalled when g_in_flight drops */
static bool g_cv_ready;
static bool g_mpi_ready;      /* MPI usable by us (initialised, thread level checked) */
static bool g_we_initialized; /* we called MPI_Init_thread */
static bool g_exiting;        /* the exit hook has started */
static bool g_abandoned;      /* some request was given up on (timeout): do not finalise */
static int g_in_flight;       /* ops currently inside MPI calls */
static bool g_serialize;      /* MPI_THREAD_SERIALIZED: one MPI call at a time */
static pthread_mutex_t g_call_mu = PTHREAD_MUTEX_INITIALIZER;

static MPI_Op g_uops[3][14]; /* user-defined ops (host->reduce), by [op][dtype] */

static void call_lock(void) {
  if (g_serialize) pthread_mutex_lock(&g_call_mu);
}
static void call_unlock(void) {
  if (g_serialize) pthread_mutex_unlock(&g_call_mu);
}

static double timeout_s(void) {
  double t = g_host.timeout_s ? g_host.timeout_s() : 60.0;
  return t > 0 ? t : 60.0;
}
static double spin_s(void) {
  double us = g_host.spin_us ? g_host.spin_us() : 50.0;
  return us > 0 ? us * 1e-6 : 0.0;
}

/* Test knob: MLXDIST_MPI_CHUNK_BYTES makes the "count above INT_MAX" paths
 * run on small arrays (docs/mpi.md). */
static size_t chunk_bytes(void) {
  static size_t cached;
  size_t c = __atomic_load_n(&cached, __ATOMIC_RELAXED);
  if (c) return c;
  c = MPI_DEFAULT_CHUNK_BYTES;
  const char* v = getenv("MLXDIST_MPI_CHUNK_BYTES");
  if (v && *v) {
    char* end = NULL;
    unsigned long long x = strtoull(v, &end, 10);
    if (end && *end == '\0' && x >= 16 && x <= MPI_DEFAULT_CHUNK_BYTES)
      c = (size_t)x;
    else
      fprintf(stderr,
              "[mpi] ignoring MLXDIST_MPI_CHUNK_BYTES=%s: expected a byte count in [16, %zu]\n",
              v, MPI_DEFAULT_CHUNK_BYTES);
  }
  __atomic_store_n(&cached, c, __ATOMIC_RELAXED);
  return c;
}
static size_t chunk_elems(size_t esz) {
  size_t c = chunk_bytes() / (esz ? esz : 1);
  return c ? c : 1;
}

static void cv_init_monotonic(pthread_cond_t* cv) {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(cv, &a);
  pthread_condattr_destroy(&a);
}

static struct timespec abs_monotonic(double deadline) {
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
static int test_all(int n, MPI_Request* reqs, int* flag) {
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

/* A staging buffer (see stage_get). */
typedef struct stage {
  void* p;
  size_t cap;
} stage;

typedef struct mpi_group {
  mlxd_backend base; /* first */
  MPI_Comm comm;
  pthread_mutex_t mu;
  pthread_cond_t cv;  /* CLOCK_MONOTONIC */
  uint64_t next_seq;  /* the collective allowed to be issued next */
  bool failed;
  mlxd_status fail_st;
  stage pool[MPI_STAGE_POOL]; /* idle staging buffers (under mu) */
} mpi_group;

static const mlxd_backend_ops k_mpi_ops;

static void group_fail(mpi_group* g, const mlxd_status* st) {
  pthread_mutex_lock(&g->mu);
  if (!g->failed) {
    g->failed = true;
    g->fail_st = *st;
  }
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

/* 0, or the group's first failure (MLXD_EABORTED) copied to st. */
static int group_check(mpi_group* g, mlxd_status* st) {
  int rc = 0;
  pthread_mutex_lock(&g->mu);
  if (g->failed) {
    rc = MLXD_EABORTED;
    if (st) {
      *st = g->fail_st;
      st->code = MLXD_EABORTED;
    }
  }
  pthread_mutex_unlock(&g->mu);
  return rc;
}

/* Requests given up on (a timeout): MPI may still complete them. The exit
 * hook waits for them (bounded) before it finalises; if they never complete
 * it does not finalise (MPI_Finalize could hang). */
static MPI_Request* g_lost;
static size_t g_nlost, g_caplost;

static void abandon(const MPI_Request* reqs, int n) {
  pthread_mutex_lock(&g_mu);
  for (int i = 0; i < n; i++) {
    if (reqs[i] == MPI_REQUEST_NULL) continue;
    if (g_nlost == g_caplost) {
      size_t cap = g_caplost ? 2 * g_caplost : 16;
      MPI_Request* p = realloc(g_lost, cap * sizeof *p);
      if (!p) {
        g_abandoned = true; /* cannot track it: never finalise */
        continue;
      }
      g_lost = p;
      g_caplost = cap;
    }
    g_lost[g_nlost++] = reqs[i];
  }
  pthread_mutex_unlock(&g_mu);
}

/* Every op that calls MPI runs between op_begin and op_end, so the exit
 * hook never finalises under it. */
static int op_begin(mlxd_status* st) {
  int rc = 0;
  pthread_mutex_lock(&g_mu);
  int fin = 0;
  MPI_Finalized(&fin);
  if (g_exiting || fin)
    rc = mpi_fail(st, MLXD_EUNAVAIL,
                  "[mpi] MPI is being finalised (the process is exiting); the op was not started");
  else
    g_in_flight++;
  pthread_mutex_unlock(&g_mu);
  return rc;
}
static void op_end(void) {
  pthread_mutex_lock(&g_mu);
  g_in_flight--;
  pthread_cond_broadcast(&g_mu_cv);
  pthread_mutex_unlock(&g_mu);
}

/* The turnstile: wait until collective #seq may be issued on g. */
static int turn_wait(mpi_group* g, uint64_t seq, const char* what, mlxd_status* st) {
  double t = timeout_s();
  double deadline = mlxd_now() + t;
  int rc = 0;
  pthread_mutex_lock(&g->mu);
  for (;;) {
    if (g->failed) {
      rc = MLXD_EABORTED;
      *st = g->fail_st;
      st->code = MLXD_EABORTED;
      break;
    }
    if (g->next_seq == seq) break;
    if (seq < g->next_seq) {
      rc = mpi_fail(st, MLXD_EINVAL,
                    "[mpi] %s was given collective sequence number %llu, which was already "
                    "used on this group (next expected: %llu)",
                    what, (unsigned long long)seq, (unsigned long long)g->next_seq);
      break;
    }
    struct timespec ts = abs_monotonic(deadline);
    if (pthread_cond_timedwait(&g->cv, &g->mu, &ts) == ETIMEDOUT && mlxd_now() >= deadline) {
      mpi_fail(st, MLXD_ETIMEDOUT,
               "[mpi] timed out after %g s in %s: collective #%llu on this rank never "
               "started, so #%llu could not be issued",
               t, what, (unsigned long long)g->next_seq, (unsigned long long)seq);
      g->failed = true;
      g->fail_st = *st;
      pthread_cond_broadcast(&g->cv);
      rc = MLXD_ETIMEDOUT;
      break;
    }
  }
  pthread_mutex_unlock(&g->mu);
  return rc;
}
static void turn_done(mpi_group* g) {
  pthread_mutex_lock(&g->mu);
  g->next_seq++;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

/* Poll reqs[0..n) until all complete. The deadline moves whenever one
 * completes. On timeout (or an MPI error) the group fails; statuses
 * (may be NULL) receive the completed requests' statuses. */
static int wait_reqs(mpi_group* g, MPI_Request* reqs, int n, MPI_Status* statuses,
                     bool cancel_on_timeout, const char* what, mlxd_status* st) {
  if (n <= 0) return 0;
  int* idx = malloc(sizeof(int) * (size_t)n);
  MPI_Status* sts = malloc(sizeof(MPI_Status) * (size_t)n);
  if (!idx || !sts) {
    free(idx);
    free(sts);
    abandon(reqs, n);
    mpi_fail(st, MLXD_ENOMEM, "[mpi] out of memory while waiting for %s", what);
    group_fail(g, st);
    return MLXD_ENOMEM;
  }
  double t = timeout_s();
  double deadline = mlxd_now() + t;
  int left = n;
  int rc = 0;
  backoff bo;
  backoff_reset(&bo);
  while (left > 0) {
    int outc = 0;
    call_lock();
    int mrc = MPI_Testsome(n, reqs, &outc, idx, sts);
    call_unlock();
    if (mrc != MPI_SUCCESS && mrc != MPI_ERR_IN_STATUS) {
      rc = mpi_fail_call(st, MLXD_EREMOTE, mrc, "MPI_Testsome", what);
      break;
    }
    if (outc == MPI_UNDEFINED) break; /* no active request left */
    for (int i = 0; i < outc; i++) {
      if (statuses) statuses[idx[i]] = sts[i];
      if (mrc == MPI_ERR_IN_STATUS && sts[i].MPI_ERROR != MPI_SUCCESS && rc == 0)
        rc = mpi_fail_call(st, MLXD_EREMOTE, sts[i].MPI_ERROR, "MPI request", what);
    }
    if (rc) break;
    if (outc > 0) {
      left -= outc;
      deadline = mlxd_now() + t;
      backoff_reset(&bo);
      continue;
    }
    if (mlxd_now() >= deadline) {
      rc = mpi_fail(st, MLXD_ETIMEDOUT,
                    "[mpi] timed out after %g s in %s (rank %d of %d): no progress; a peer "
                    "may have died or not called the same op (raise MLXDIST_TIMEOUT if it is "
                    "just slow)",
                    t, what, g->base.rank, g->base.size);
      break;
    }
    backoff_wait(&bo);
  }
  if (rc) {
    if (cancel_on_timeout) {
      /* Receives can be cancelled; give the cancellation a short, bounded while. */
      call_lock();
      for (int i = 0; i < n; i++)
        if (reqs[i] != MPI_REQUEST_NULL) MPI_Cancel(&reqs[i]);
      call_unlock();
      double until = mlxd_now() + 1.0;
      for (;;) {
        int flag = 0;
        call_lock();
        test_all(n, reqs, &flag);
        call_unlock();
        if (flag || mlxd_now() >= until) break;
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
      }
    }
    abandon(reqs, n); /* what is left: MPI may still complete it */
    group_fail(g, st);
  }
  free(idx);
  free(sts);
  return rc;
}

/* ---------------------------------------------------------------------- */
/* Datatypes and reduction ops. */

static MPI_Datatype dtype_mpi(mlx_dtype d) {
  switch (d) {
    case MLX_BOOL: return MPI_UINT8_T;
    case MLX_UINT8: return MPI_UINT8_T;
    case MLX_UINT16: return MPI_UINT16_T;
    case MLX_UINT32: return MPI_UINT32_T;
    case MLX_UINT64: return MPI_UINT64_T;
    case MLX_INT8: return MPI_INT8_T;
    case MLX_INT16: return MPI_INT16_T;
    case MLX_INT32: return MPI_INT32_T;
    case MLX_INT64: return MPI_INT64_T;
    case MLX_FLOAT16: return MPI_UINT16_T;
    case MLX_FLOAT32: return MPI_FLOAT;
    case MLX_FLOAT64: return MPI_DOUBLE;
    case MLX_BFLOAT16: return MPI_UINT16_T;
    case MLX_COMPLEX64: return MPI_C_FLOAT_COMPLEX;
  }
  return MPI_DATATYPE_NULL;
}

/* Only float32/float64 sums use MPI's own MPI_SUM (an IEEE add is an IEEE
 * add everywhere). Every other (dtype, op) is a user-defined op calling the
 * core's kernel, so results equal the ring backend's bit for bit. Native
 * integer ops are not used on purpose: Open MPI 4.1's AVX op component
 * saturates 8/16-bit sums instead of wrapping (open-mpi/ompi#8045) and
 * 4.1.2-4.1.4 get unsigned MPI_MIN wrong (open-mpi/ompi#10525); native
 * float max/min may treat NaN differently from the core's kernels. */
static bool op_native(mlx_dtype d, mlxd_reduce_op op) {
  return op == MLXD_SUM && (d == MLX_FLOAT32 || d == MLX_FLOAT64);
}

/* MPI's user function computes inout = in OP inout; every op here is commutative. */
#define MPI_UOP(DT, OPV, SUFFIX)                                                       \
  static void uop_##DT##_##SUFFIX(void* in, void* inout, int* len, MPI_Datatype* t) { \
    (void)t;                                                                          \
    if (*len > 0) g_host.reduce(OPV, DT, inout, in, (size_t)*len);                    \
  }
#define MPI_UOPS(DT) MPI_UOP(DT, MLXD_SUM, sum) MPI_UOP(DT, MLXD_MAX, max) MPI_UOP(DT, MLXD_MIN, min)
MPI_UOPS(MLX_BOOL)
MPI_UOPS(MLX_UINT8)
MPI_UOPS(MLX_UINT16)
MPI_UOPS(MLX_UINT32)
MPI_UOPS(MLX_UINT64)
MPI_UOPS(MLX_INT8)
MPI_UOPS(MLX_INT16)
MPI_UOPS(MLX_INT32)
MPI_UOPS(MLX_INT64)
MPI_UOPS(MLX_FLOAT16)
MPI_UOPS(MLX_FLOAT32)
MPI_UOPS(MLX_FLOAT64)
MPI_UOPS(MLX_BFLOAT16)
MPI_UOPS(MLX_COMPLEX64)
#define MPI_UOP_ROW(DT) {DT, {uop_##DT##_sum, uop_##DT##_max, uop_##DT##_min}}

/* Create the user-defined ops (after MPI is initialised; g_mu held). */
static int create_user_ops(mlxd_status* st) {
  static const struct {
    mlx_dtype d;
    MPI_User_function* f[3];
  } tab[] = {
      MPI_UOP_ROW(MLX_BOOL),    MPI_UOP_ROW(MLX_UINT8),    MPI_UOP_ROW(MLX_UINT16),
      MPI_UOP_ROW(MLX_UINT32),  MPI_UOP_ROW(MLX_UINT64),   MPI_UOP_ROW(MLX_INT8),
      MPI_UOP_ROW(MLX_INT16),   MPI_UOP_ROW(MLX_INT32),    MPI_UOP_ROW(MLX_INT64),
      MPI_UOP_ROW(MLX_FLOAT16), MPI_UOP_ROW(MLX_FLOAT32),  MPI_UOP_ROW(MLX_FLOAT64),
      MPI_UOP_ROW(MLX_BFLOAT16), MPI_UOP_ROW(MLX_COMPLEX64),
  };
  for (int o = 0; o < 3; o++)
    for (int d = 0; d < 14; d++) g_uops[o][d] = MPI_OP_NULL;
  for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
    for (int o = 0; o < 3; o++) {
      if (op_native(tab[i].d, (mlxd_reduce_op)o)) continue;
      int rc = MPI_Op_create(tab[i].f[o], 1, &g_uops[o][tab[i].d]);
      if (rc != MPI_SUCCESS) return mpi_fail_call(st, MLXD_EUNAVAIL, rc, "MPI_Op_create", NULL);
    }
  return 0;
}
static void free_user_ops(void) {
  for (int o = 0; o < 3; o++)
    for (int d = 0; d < 14; d++)
      if (g_uops[o][d] != MPI_OP_NULL) {
        MPI_Op_free(&g_uops[o][d]);
        g_uops[o][d] = MPI_OP_NULL;
      }
}

static MPI_Op op_mpi(mlx_dtype d, mlxd_reduce_op op) {
  if ((int)op < 0 || (int)op > 2 || (int)d < 0 || (int)d > 13) return MPI_OP_NULL;
  return op_native(d, op) ? MPI_SUM : g_uops[op][d];
}

static const char* reduce_name(mlxd_reduce_op op) {
  return op == MLXD_SUM ? "all_sum" : op == MLXD_MAX ? "all_max" : op == MLXD_MIN ? "all_min"
                                                                                  : "all_reduce";
}
static const char* scatter_name(mlxd_reduce_op op) {
  return op == MLXD_SUM ? "sum_scatter" : op == MLXD_MAX ? "max_scatter" : "min_scatter";
}

/* ---------------------------------------------------------------------- */
/* Background completion of sends (see the file comment). */

typedef struct pending_send {
  struct pending_send* next;
  mpi_group* g; /* NULL once the group is destroyed */
  MPI_Request* reqs;
  int nreq;
  int left;
  void* buf;
  size_t nbytes;
  int dst;
  double deadline;
} pending_send;

static pthread_mutex_t g_send_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_send_cv; /* CLOCK_MONOTONIC: new work, or the list changed */
static pending_send* g_sends;
static bool g_prog_started, g_prog_stop;
static pthread_t g_prog_thread;

static void pending_free(pending_send* p) {
  free(p->reqs);
  free(p->buf);
  free(p);
}

/* One pass over the pending sends (g_send_mu held). Returns whether any progressed. */
static bool sends_poll_locked(void) {
  bool progressed = false;
  pending_send** pp = &g_sends;
  while (*pp) {
    pending_send* p = *pp;
    int outc = 0;
    int* idx = malloc(sizeof(int) * (size_t)p->nreq);
    MPI_Status* sts = malloc(sizeof(MPI_Status) * (size_t)p->nreq);
    int mrc = MPI_ERR_NO_MEM;
    if (idx && sts) {
      call_lock();
      mrc = MPI_Testsome(p->nreq, p->reqs, &outc, idx, sts);
      call_unlock();
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
      p->deadline = mlxd_now() + timeout_s();
      progressed = true;
    }
    bool done = err == MPI_SUCCESS && (outc == MPI_UNDEFINED || p->left <= 0);
    bool expired = err == MPI_SUCCESS && !done && mlxd_now() >= p->deadline;
    if (done || err != MPI_SUCCESS || expired) {
      if (p->g && !done) {
        mlxd_status st;
        char what[96];
        snprintf(what, sizeof what, "send of %zu bytes to rank %d", p->nbytes, p->dst);
        if (err != MPI_SUCCESS)
          mpi_fail_call(&st, MLXD_EREMOTE, err, "MPI_Isend", what);
        else
          mpi_fail(&st, MLXD_ETIMEDOUT,
                   "[mpi] timed out after %g s in %s (rank %d of %d): the receiver never "
                   "took the data",
                   timeout_s(), what, p->g->base.rank, p->g->base.size);
        group_fail(p->g, &st);
      }
      *pp = p->next;
      if (done) {
        pending_free(p);
      } else {
        /* MPI may still read the buffer: keep it (a deliberate leak). */
        abandon(p->reqs, p->nreq);
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
  backoff bo;
  backoff_reset(&bo);
  pthread_mutex_lock(&g_send_mu);
  while (!g_prog_stop) {
    if (!g_sends) {
      pthread_cond_wait(&g_send_cv, &g_send_mu);
      backoff_reset(&bo);
      continue;
    }
    if (sends_poll_locked()) backoff_reset(&bo);
    if (!g_sends) continue;
    pthread_mutex_unlock(&g_send_mu);
    backoff_wait(&bo);
    pthread_mutex_lock(&g_send_mu);
  }
  pthread_mutex_unlock(&g_send_mu);
  return NULL;
}

/* Hand a started send to the progress thread (starting it if needed). */
static int sends_add(pending_send* p, mlxd_status* st) {
  int rc = 0;
  pthread_mutex_lock(&g_send_mu);
  if (!g_prog_started) {
    g_prog_stop = false;
    if (pthread_create(&g_prog_thread, NULL, progress_main, NULL) != 0)
      rc = mpi_fail(st, MLXD_ESYS, "[mpi] could not start the send progress thread: %s",
                    strerror(errno));
    else
      g_prog_started = true;
  }
  if (rc == 0) {
    p->next = g_sends;
    g_sends = p;
    pthread_cond_broadcast(&g_send_cv);
  }
  pthread_mutex_unlock(&g_send_mu);
  return rc;
}

/* ---------------------------------------------------------------------- */
/* Launcher detection, MPI start and finalisation. */

static const char* const k_launcher_env[] = {
    "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", /* Open MPI's mpirun */
    "PMI_RANK",             "PMI_SIZE",             /* MPICH/Hydra, Intel MPI, Slurm PMI-1/2 */
    "PMI_FD",               "PMI_PORT",             /* PMI wire-up (Hydra, Slurm --mpi=pmi2) */
    "PMIX_RANK",            "PMIX_NAMESPACE",       /* PMIx (Open MPI 5, Slurm --mpi=pmix, prrte) */
    "HYDRA_CONTROL_FD",     "MPI_LOCALRANKID",      /* Hydra, Intel MPI */
    "MV2_COMM_WORLD_RANK",                          /* MVAPICH2 */
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
  double t = timeout_s();
  pthread_mutex_lock(&g_mu);
  g_exiting = true;
  double deadline = mlxd_now() + t;
  while (g_in_flight > 0 && mlxd_now() < deadline) {
    struct timespec ts = abs_monotonic(deadline);
    pthread_cond_timedwait(&g_mu_cv, &g_mu, &ts);
  }
  int busy = g_in_flight;
  pthread_mutex_unlock(&g_mu);

  /* Let pending sends finish (each is bounded by its own deadline), then stop the thread. */
  pthread_mutex_lock(&g_send_mu);
  while (g_sends) {
    struct timespec ts = abs_monotonic(mlxd_now() + 0.1);
    pthread_cond_timedwait(&g_send_cv, &g_send_mu, &ts);
  }
  bool started = g_prog_started;
  g_prog_stop = true;
  pthread_cond_broadcast(&g_send_cv);
  pthread_mutex_unlock(&g_send_mu);
  if (started) pthread_join(g_prog_thread, NULL);

  /* Requests given up on may have completed since (a late peer): wait for them, bounded. */
  pthread_mutex_lock(&g_mu);
  bool abandoned = g_abandoned;
  MPI_Request* lost = g_lost;
  int nlost = (int)g_nlost;
  pthread_mutex_unlock(&g_mu);
  if (!abandoned && nlost > 0) {
    double until = mlxd_now() + t;
    for (;;) {
      int flag = 0;
      call_lock();
      int mrc = test_all(nlost, lost, &flag);
      call_unlock();
      if (flag || mrc != MPI_SUCCESS) break;
      if (mlxd_now() >= until) {
        abandoned = true;
        break;
      }
      struct timespec ts = {0, 1000000L};
      nanosleep(&ts, NULL);
    }
  }
  if (busy > 0 || abandoned) {
    fprintf(stderr,
            "[mpi] not finalising MPI at exit: %s; MPI may still be using their buffers\n",
            busy > 0 ? "ops are still running on other threads"
                     : "an op timed out and its requests never completed");
    return;
  }
  if (!mpi_running()) return;
  free_user_ops();
  MPI_Finalize();
}

/* Start MPI if needed and check its thread level. g_mu held. */
static int ensure_mpi_locked(mlxd_status* st) {
  if (g_mpi_ready) {
    if (mpi_running()) return 0;
    return mpi_fail(st, MLXD_EUNAVAIL,
                    "[mpi] MPI was finalised in this process and cannot be started again");
  }
  if (!g_cv_ready) {
    cv_init_monotonic(&g_mu_cv);
    g_cv_ready = true;
  }
  int init = 0, fin = 0;
  MPI_Finalized(&fin);
  if (fin)
    return mpi_fail(st, MLXD_EUNAVAIL,
                    "[mpi] MPI was already finalised in this process; it cannot be started again");
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
    if (rc != MPI_SUCCESS) return mpi_fail_call(st, MLXD_EUNAVAIL, rc, "MPI_Init_thread", NULL);
    g_we_initialized = true;
    atexit(mpi_exit_hook);
    /* Our own calls on MPI_COMM_WORLD report errors instead of aborting. */
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_SERIALIZED)
    return mpi_fail(st, MLXD_EUNAVAIL,
                    "[mpi] the MPI library provides %s, but mlxdist runs MPI calls on stream "
                    "worker threads and needs MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE",
                    thread_level_name(provided));
  g_serialize = provided < MPI_THREAD_MULTIPLE;
  int rc = create_user_ops(st);
  if (rc) return rc;
  g_mpi_ready = true;
  return 0;
}

static mpi_group* group_new(MPI_Comm comm, mlxd_status* st) {
  mpi_group* g = calloc(1, sizeof *g);
  if (!g) {
    mpi_fail(st, MLXD_ENOMEM, "[mpi] out of memory creating a group");
    return NULL;
  }
  int rank = 0, size = 1;
  call_lock();
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  call_unlock();
  g->base.ops = &k_mpi_ops;
  g->base.rank = rank;
  g->base.size = size;
  g->base.comm_device = MLX_CPU;
  g->comm = comm;
  pthread_mutex_init(&g->mu, NULL);
  cv_init_monotonic(&g->cv);
  return g;
}

/* ---------------------------------------------------------------------- */
/* The kind. */

static bool mpi_is_available(char* why, size_t why_len) {
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

static bool mpi_is_configured(bool with_bootstrap) {
  if (with_bootstrap) return false; /* MPI bootstraps through its launcher only */
  return launched_by_mpi() || mpi_running();
}

static int mpi_create(mlxd_bootstrap* bs, mlxd_backend** out, mlxd_status* st) {
  *out = NULL;
  if (bs)
    return mpi_fail(st, MLXD_EINVAL,
                    "[mpi] the mpi backend cannot use a caller's all-gather (it is set up by "
                    "its launcher, mpirun/mpiexec); use \"ring\" or \"jaccl\" for "
                    "init_with_all_gather");
  if (!mpi_running() && !launched_by_mpi())
    return mpi_fail(st, MLXD_EUNAVAIL,
                    "[mpi] this process was not started by an MPI launcher: none of "
                    "OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_RANK, PMI_RANK, PMI_SIZE, PMI_FD, "
                    "PMIX_RANK is set (run it with mpirun/mpiexec, or srun --mpi=pmix)");
  pthread_mutex_lock(&g_mu);
  int rc = ensure_mpi_locked(st);
  if (rc == 0 && g_exiting)
    rc = mpi_fail(st, MLXD_EUNAVAIL, "[mpi] the process is exiting; no new group can start");
  if (rc == 0) g_in_flight++;
  pthread_mutex_unlock(&g_mu);
  if (rc) return rc;

  /* Duplicate MPI_COMM_WORLD without blocking unboundedly. */
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request req = MPI_REQUEST_NULL;
  call_lock();
  int mrc = MPI_Comm_idup(MPI_COMM_WORLD, &comm, &req);
  call_unlock();
  if (mrc != MPI_SUCCESS) {
    rc = mpi_fail_call(st, MLXD_EUNAVAIL, mrc, "MPI_Comm_idup", "init");
    op_end();
    return rc;
  }
  /* A temporary group so wait_reqs can report rank/size and be failed. */
  mpi_group tmp;
  memset(&tmp, 0, sizeof tmp);
  call_lock();
  MPI_Comm_rank(MPI_COMM_WORLD, &tmp.base.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &tmp.base.size);
  call_unlock();
  pthread_mutex_init(&tmp.mu, NULL);
  cv_init_monotonic(&tmp.cv);
  rc = wait_reqs(&tmp, &req, 1, NULL, false, "init (MPI_Comm_idup of MPI_COMM_WORLD)", st);
  pthread_mutex_destroy(&tmp.mu);
  pthread_cond_destroy(&tmp.cv);
  if (rc) {
    op_end();
    return rc;
  }
  mpi_group* g = group_new(comm, st);
  op_end();
  if (!g) {
    call_lock();
    MPI_Comm_free(&comm);
    call_unlock();
    return MLXD_ENOMEM;
  }
  *out = &g->base;
  return 0;
}

/* ---------------------------------------------------------------------- */
/* Ops. */

/* Staging buffers. MPI works on the plugin's own memory, never on the
 * caller's arrays: after a timeout a request may still be pending (MPI has
 * no way to cancel a collective), and a late peer would then make MPI write
 * into an array the caller has freed. The staging buffer is simply kept
 * (leaked) in that case. A few buffers are pooled per group (grow-only). */
static int stage_get(mpi_group* g, size_t n, stage* out) {
  out->p = NULL;
  out->cap = 0;
  if (n == 0) n = 1;
  pthread_mutex_lock(&g->mu);
  int best = -1;
  for (int i = 0; i < MPI_STAGE_POOL; i++)
    if (g->pool[i].p && g->pool[i].cap >= n && (best < 0 || g->pool[i].cap < g->pool[best].cap))
      best = i;
  if (best >= 0) {
    *out = g->pool[best];
    g->pool[best].p = NULL;
    g->pool[best].cap = 0;
  }
  pthread_mutex_unlock(&g->mu);
  if (out->p) return 0;
  out->p = malloc(n);
  out->cap = n;
  return out->p ? 0 : MLXD_ENOMEM;
}

static void stage_put(mpi_group* g, stage* sgs) {
  if (!sgs->p) return;
  pthread_mutex_lock(&g->mu);
  int slot = -1;
  for (int i = 0; i < MPI_STAGE_POOL; i++) {
    if (!g->pool[i].p) {
      slot = i;
      break;
    }
    if (g->pool[i].cap < sgs->cap && (slot < 0 || g->pool[i].cap < g->pool[slot].cap)) slot = i;
  }
  stage old = {NULL, 0};
  if (slot >= 0) {
    old = g->pool[slot];
    g->pool[slot] = *sgs;
  } else {
    old = *sgs;
  }
  pthread_mutex_unlock(&g->mu);
  free(old.p);
  sgs->p = NULL;
}

/* Common tail of a collective: after issuing (turn still held), release the
 * turn, wait, and on success copy the result out of the staging buffer. */
static int coll_finish(mpi_group* g, MPI_Request* reqs, int issued, int rc, stage* sg,
                       const void* result, void* out, size_t out_bytes, const char* what,
                       mlxd_status* st) {
  turn_done(g);
  if (rc) {
    abandon(reqs, issued);
    group_fail(g, st);
  } else {
    rc = wait_reqs(g, reqs, issued, NULL, false, what, st);
  }
  if (rc == 0) {
    if (out_bytes) memcpy(out, result, out_bytes);
    stage_put(g, sg);
  } else if (issued == 0) {
    stage_put(g, sg);
  } else {
    sg->p = NULL; /* MPI may still use the staging buffer: keep it (leak) */
  }
  return rc;
}

static int mpi_all_reduce(mlxd_backend* b, uint64_t seq, const void* in, void* out,
                          size_t count, mlx_dtype dtype, mlxd_reduce_op op, mlxd_status* st) {
  mpi_group* g = (mpi_group*)b;
  char what[128];
  snprintf(what, sizeof what, "%s of %zu elements (collective #%llu)", reduce_name(op), count,
           (unsigned long long)seq);
  MPI_Datatype dt = ((int)dtype >= 0 && (int)dtype <= 13) ? dtype_mpi(dtype) : MPI_DATATYPE_NULL;
  MPI_Op mop = dt == MPI_DATATYPE_NULL ? MPI_OP_NULL : op_mpi(dtype, op);
  size_t esz = dt == MPI_DATATYPE_NULL ? 0 : g_host.dtype_size(dtype);
  size_t ch = chunk_elems(esz ? esz : 1);
  if (ch > (size_t)INT_MAX) ch = (size_t)INT_MAX;
  int nreq = count == 0 ? 0 : (int)((count + ch - 1) / ch);
  MPI_Request one = MPI_REQUEST_NULL;
  MPI_Request* reqs = nreq <= 1 ? &one : malloc(sizeof(MPI_Request) * (size_t)nreq);
  stage sg = {NULL, 0};
  bool nomem = !reqs || (count && esz && stage_get(g, count * esz, &sg) != 0);
  int rc = op_begin(st);
  if (rc) goto out_free;
  rc = turn_wait(g, seq, what, st);
  if (rc) goto out;
  if (mop == MPI_OP_NULL || esz == 0) {
    turn_done(g);
    rc = mpi_fail(st, MLXD_EINVAL,
                  "[mpi] %s: unsupported dtype %d or reduction op %d (expected a dtype 0..13 "
                  "and sum/max/min)",
                  reduce_name(op), (int)dtype, (int)op);
    goto out;
  }
  if (count == 0) {
    turn_done(g);
    goto out;
  }
  if (nomem) {
    turn_done(g);
    rc = mpi_fail(st, MLXD_ENOMEM, "[mpi] out of memory in %s", what);
    group_fail(g, st); /* the other ranks issued it: this group is out of step */
    goto out;
  }
  memcpy(sg.p, in, count * esz);
  int issued = 0;
  call_lock();
  for (size_t off = 0; off < count; off += ch) {
    size_t c = count - off < ch ? count - off : ch;
    int mrc = MPI_Iallreduce(MPI_IN_PLACE, (char*)sg.p + off * esz, (int)c, dt, mop, g->comm,
                             &reqs[issued]);
    if (mrc != MPI_SUCCESS) {
      rc = mpi_fail_call(st, MLXD_EREMOTE, mrc, "MPI_Iallreduce", what);
      break;
    }
    issued++;
  }
  call_unlock();
  rc = coll_finish(g, reqs, issued, rc, &sg, sg.p, out, count * esz, what, st);
out:
  op_end();
out_free:
  stage_put(g, &sg); /* no-op when kept or already returned */
  if (reqs && reqs != &one) free(reqs);
  return rc;
}

static int mpi_all_gather(mlxd_backend* b, uint64_t seq, const void* in, void* out,
                          size_t nbytes, mlxd_status* st) {
  mpi_group* g = (mpi_group*)b;
  char what[128];
  snprintf(what, sizeof what, "all_gather of %zu bytes per rank (collective #%llu)", nbytes,
           (unsigned long long)seq);
  size_t total = nbytes * (size_t)g->base.size;
  size_t ch = chunk_bytes();
  if (ch > (size_t)INT_MAX) ch = (size_t)INT_MAX;
  int nreq = nbytes == 0 ? 0 : (int)((nbytes + ch - 1) / ch);
  MPI_Request one = MPI_REQUEST_NULL;
  MPI_Request* reqs = nreq <= 1 ? &one : malloc(sizeof(MPI_Request) * (size_t)nreq);
  stage sg = {NULL, 0};
  bool nomem = !reqs || (nbytes && stage_get(g, total, &sg) != 0);
  int rc = op_begin(st);
  if (rc) goto out_free;
  rc = turn_wait(g, seq, what, st);
  if (rc) goto out;
  if (nbytes == 0) {
    turn_done(g);
    goto out;
  }
  if (nomem) {
    turn_done(g);
    rc = mpi_fail(st, MLXD_ENOMEM, "[mpi] out of memory in %s", what);
    group_fail(g, st);
    goto out;
  }
  memcpy((char*)sg.p + (size_t)g->base.rank * nbytes, in, nbytes);
  int issued = 0;
  call_lock();
  if (nreq == 1) {
    int mrc = MPI_Iallgather(MPI_IN_PLACE, (int)nbytes, MPI_BYTE, sg.p, (int)nbytes, MPI_BYTE,
                             g->comm, &reqs[0]);
    if (mrc != MPI_SUCCESS)
      rc = mpi_fail_call(st, MLXD_EREMOTE, mrc, "MPI_Iallgather", what);
    else
      issued = 1;
  } else {
    /* Piece [off, off+c) of every rank's block: a receive type of c bytes
     * whose extent is nbytes places rank r's piece at r * nbytes + off. */
    for (size_t off = 0; off < nbytes && rc == 0; off += ch) {
      size_t c = nbytes - off < ch ? nbytes - off : ch;
      MPI_Datatype piece = MPI_DATATYPE_NULL, strided = MPI_DATATYPE_NULL;
      int mrc = MPI_Type_contiguous((int)c, MPI_BYTE, &piece);
      if (mrc == MPI_SUCCESS) mrc = MPI_Type_create_resized(piece, 0, (MPI_Aint)nbytes, &strided);
      if (mrc == MPI_SUCCESS) mrc = MPI_Type_commit(&strided);
      if (mrc == MPI_SUCCESS)
        mrc = MPI_Iallgather(MPI_IN_PLACE, (int)c, MPI_BYTE, (char*)sg.p + off, 1, strided,
                             g->comm, &reqs[issued]);
      if (piece != MPI_DATATYPE_NULL) MPI_Type_free(&piece);
      if (strided != MPI_DATATYPE_NULL) MPI_Type_free(&strided);
      if (mrc != MPI_SUCCESS)
        rc = mpi_fail_call(st, MLXD_EREMOTE, mrc, "MPI_Iallgather", what);
      else
        issued++;
    }
  }
  call_unlock();
  rc = coll_finish(g, reqs, issued, rc, &sg, sg.p, out, total, what, st);
out:
  op_end();
out_free:
  stage_put(g, &sg);
  if (reqs && reqs != &one) free(reqs);
  return rc;
}

static int mpi_reduce_scatter(mlxd_backend* b, uint64_t seq, const void* in, void* out,
                              size_t count, mlx_dtype dtype, mlxd_reduce_op op,
                              mlxd_status* st) {
  mpi_group* g = (mpi_group*)b;
  char what[128];
  snprintf(what, sizeof what, "%s of %zu elements per rank (collective #%llu)",
           scatter_name(op), count, (unsigned long long)seq);
  MPI_Datatype dt = ((int)dtype >= 0 && (int)dtype <= 13) ? dtype_mpi(dtype) : MPI_DATATYPE_NULL;
  MPI_Op mop = dt == MPI_DATATYPE_NULL ? MPI_OP_NULL : op_mpi(dtype, op);
  size_t esz = dt == MPI_DATATYPE_NULL ? 0 : g_host.dtype_size(dtype);
  int size = g->base.size, rank = g->base.rank;
  size_t ch = chunk_elems(esz ? esz : 1);
  if (ch > (size_t)INT_MAX) ch = (size_t)INT_MAX;
  size_t npieces = count == 0 ? 0 : (count + ch - 1) / ch;
  int nreq = npieces <= 1 ? 1 : (int)(npieces * (size_t)size);
  MPI_Request one = MPI_REQUEST_NULL;
  MPI_Request* reqs = nreq == 1 ? &one : malloc(sizeof(MPI_Request) * (size_t)nreq);
  stage sg = {NULL, 0};
  bool nomem = !reqs || (count && esz && stage_get(g, count * esz * (size_t)size, &sg) != 0);
  int rc = op_begin(st);
  if (rc) goto out_free;
  rc = turn_wait(g, seq, what, st);
  if (rc) goto out;
  if (mop == MPI_OP_NULL || esz == 0) {
    turn_done(g);
    rc = mpi_fail(st, MLXD_EINVAL,
                  "[mpi] %s: unsupported dtype %d or reduction op %d (expected a dtype 0..13 "
                  "and sum/max/min)",
                  scatter_name(op), (int)dtype, (int)op);
    goto out;
  }
  if (count == 0) {
    turn_done(g);
    goto out;
  }
  if (nomem) {
    turn_done(g);
    rc = mpi_fail(st, MLXD_ENOMEM, "[mpi] out of memory in %s", what);
    group_fail(g, st);
    goto out;
  }
  memcpy(sg.p, in, count * esz * (size_t)size);
  const char* result = sg.p;
  int issued = 0;
  call_lock();
  if (npieces == 1) {
    /* In place: the result lands at the start of the buffer. */
    int mrc = MPI_Ireduce_scatter_block(MPI_IN_PLACE, sg.p, (int)count, dt, mop, g->comm,
                                        &reqs[0]);
    if (mrc != MPI_SUCCESS)
      rc = mpi_fail_call(st, MLXD_EREMOTE, mrc, "MPI_Ireduce_scatter_block", what);
    else
      issued = 1;
  } else {
    /* Piece by piece: reduce piece [off, off+c) of block r onto rank r, in
     * place there, so our result ends up in our own block. */
    result = (const char*)sg.p + (size_t)rank * count * esz;
    for (size_t off = 0; off < count && rc == 0; off += ch) {
      size_t c = count - off < ch ? count - off : ch;
      for (int r = 0; r < size && rc == 0; r++) {
        char* blk = (char*)sg.p + ((size_t)r * count + off) * esz;
        int mrc = r == rank
                      ? MPI_Ireduce(MPI_IN_PLACE, blk, (int)c, dt, mop, r, g->comm, &reqs[issued])
                      : MPI_Ireduce(blk, NULL, (int)c, dt, mop, r, g->comm, &reqs[issued]);
        if (mrc != MPI_SUCCESS)
          rc = mpi_fail_call(st, MLXD_EREMOTE, mrc, "MPI_Ireduce", what);
        else
          issued++;
      }
    }
  }
  call_unlock();
  rc = coll_finish(g, reqs, issued, rc, &sg, result, out, count * esz, what, st);
out:
  op_end();
out_free:
  stage_put(g, &sg);
  if (reqs && reqs != &one) free(reqs);
  return rc;
}

static int check_peer(mpi_group* g, int peer, const char* op, mlxd_status* st) {
  if (peer < 0 || peer >= g->base.size || peer == g->base.rank)
    return mpi_fail(st, MLXD_EINVAL,
                    "[mpi] %s: peer rank %d is invalid (expected 0 <= rank < %d and not this "
                    "process's rank %d)",
                    op, peer, g->base.size, g->base.rank);
  return 0;
}

static int mpi_send(mlxd_backend* b, uint64_t seq, const void* buf, size_t nbytes, int dst,
                    mlxd_status* st) {
  mpi_group* g = (mpi_group*)b;
  int rc = check_peer(g, dst, "send", st);
  if (rc) return rc;
  if ((rc = group_check(g, st))) return rc;
  rc = op_begin(st);
  if (rc) return rc;
  size_t ch = chunk_bytes();
  if (ch > (size_t)INT_MAX) ch = (size_t)INT_MAX;
  int nreq = nbytes == 0 ? 1 : (int)((nbytes + ch - 1) / ch);
  pending_send* p = calloc(1, sizeof *p);
  if (p) {
    p->reqs = malloc(sizeof(MPI_Request) * (size_t)nreq);
    p->buf = malloc(nbytes ? nbytes : 1);
  }
  if (!p || !p->reqs || !p->buf) {
    if (p) pending_free(p);
    rc = mpi_fail(st, MLXD_ENOMEM, "[mpi] out of memory copying %zu bytes for a send to rank %d",
                  nbytes, dst);
    goto out;
  }
  if (nbytes) memcpy(p->buf, buf, nbytes);
  p->g = g;
  p->nbytes = nbytes;
  p->dst = dst;
  int tag = (int)(seq % MPI_P2P_TAG_MOD);
  int issued = 0;
  call_lock();
  for (size_t off = 0; issued < nreq; off += ch) {
    size_t c = nbytes - off < ch ? nbytes - off : ch;
    int mrc = MPI_Isend((char*)p->buf + off, (int)c, MPI_BYTE, dst, tag, g->comm,
                        &p->reqs[issued]);
    if (mrc != MPI_SUCCESS) {
      char what[96];
      snprintf(what, sizeof what, "send of %zu bytes to rank %d", nbytes, dst);
      rc = mpi_fail_call(st, MLXD_EREMOTE, mrc, "MPI_Isend", what);
      break;
    }
    issued++;
  }
  call_unlock();
  if (rc) {
    if (issued) {
      abandon(p->reqs, issued); /* the issued pieces may still read p->buf */
      free(p->reqs);
      free(p);
    } else {
      pending_free(p);
    }
    group_fail(g, st);
    goto out;
  }
  p->nreq = issued;
  p->left = issued;
  p->deadline = mlxd_now() + timeout_s();
  rc = sends_add(p, st);
  if (rc) {
    /* No progress thread: complete it here, bounded. */
    rc = wait_reqs(g, p->reqs, p->nreq, NULL, false, "send", st);
    if (rc == 0) pending_free(p);
  }
out:
  op_end();
  return rc;
}

static int mpi_recv(mlxd_backend* b, uint64_t seq, void* buf, size_t nbytes, int src,
                    mlxd_status* st) {
  mpi_group* g = (mpi_group*)b;
  int rc = check_peer(g, src, "recv", st);
  if (rc) return rc;
  if ((rc = group_check(g, st))) return rc;
  rc = op_begin(st);
  if (rc) return rc;
  char what[96];
  snprintf(what, sizeof what, "recv of %zu bytes from rank %d", nbytes, src);
  size_t ch = chunk_bytes();
  if (ch > (size_t)INT_MAX) ch = (size_t)INT_MAX;
  int nreq = nbytes == 0 ? 1 : (int)((nbytes + ch - 1) / ch);
  MPI_Request one = MPI_REQUEST_NULL;
  MPI_Status one_st;
  MPI_Request* reqs = nreq == 1 ? &one : malloc(sizeof(MPI_Request) * (size_t)nreq);
  MPI_Status* sts = nreq == 1 ? &one_st : malloc(sizeof(MPI_Status) * (size_t)nreq);
  stage sg = {NULL, 0};
  if (!reqs || !sts || stage_get(g, nbytes, &sg) != 0) {
    rc = mpi_fail(st, MLXD_ENOMEM, "[mpi] out of memory in %s", what);
    goto done;
  }
  int tag = (int)(seq % MPI_P2P_TAG_MOD);
  int issued = 0;
  call_lock();
  for (size_t off = 0; issued < nreq; off += ch) {
    size_t c = nbytes - off < ch ? nbytes - off : ch;
    int mrc = MPI_Irecv((char*)sg.p + off, (int)c, MPI_BYTE, src, tag, g->comm, &reqs[issued]);
    if (mrc != MPI_SUCCESS) {
      rc = mpi_fail_call(st, MLXD_EREMOTE, mrc, "MPI_Irecv", what);
      break;
    }
    issued++;
  }
  call_unlock();
  if (rc) {
    if (issued) {
      /* Cancel the pieces already posted; the group is out of step now. */
      mlxd_status ignore;
      call_lock();
      for (int i = 0; i < issued; i++) MPI_Cancel(&reqs[i]);
      call_unlock();
      wait_reqs(g, reqs, issued, NULL, true, what, &ignore);
      for (int i = 0; i < issued; i++)
        if (reqs[i] != MPI_REQUEST_NULL) sg.p = NULL; /* keep it */
    }
    group_fail(g, st);
    goto done;
  }
  rc = wait_reqs(g, reqs, issued, sts, true, what, st);
  if (rc) {
    /* Cancelled requests are gone; one still pending keeps the staging buffer. */
    for (int i = 0; i < issued; i++)
      if (reqs[i] != MPI_REQUEST_NULL) sg.p = NULL;
    goto done;
  }
  size_t got = 0;
  for (int i = 0; i < issued; i++) {
    int n = 0;
    MPI_Get_count(&sts[i], MPI_BYTE, &n);
    got += n > 0 ? (size_t)n : 0;
  }
  if (got != nbytes)
    rc = mpi_fail(st, MLXD_EINVAL,
                  "[mpi] %s: the message from rank %d had %zu bytes, but %zu were expected "
                  "(shape and dtype of send and recv must match)",
                  what, src, got, nbytes);
  else if (nbytes)
    memcpy(buf, sg.p, nbytes);
done:
  stage_put(g, &sg);
  if (reqs && reqs != &one) free(reqs);
  if (sts && sts != &one_st) free(sts);
  op_end();
  return rc;
}

/* Split: exchange (color, key) with a bounded all-gather, then MPI_Comm_split
 * (every rank has arrived by then, so it returns promptly). Colors are
 * renumbered densely so any int works. */
static int cmp_int(const void* a, const void* b) {
  int x = *(const int*)a, y = *(const int*)b;
  return (x > y) - (x < y);
}

static int mpi_split(mlxd_backend* b, uint64_t seq, int color, int key, mlxd_backend** out,
                     mlxd_status* st) {
  mpi_group* g = (mpi_group*)b;
  *out = NULL;
  char what[96];
  snprintf(what, sizeof what, "split (color %d, key %d, collective #%llu)", color, key,
           (unsigned long long)seq);
  int size = g->base.size;
  int* all = malloc(sizeof(int) * 2 * (size_t)size);
  int* colors = malloc(sizeof(int) * (size_t)size);
  int rc = op_begin(st);
  if (rc) {
    free(all);
    free(colors);
    return rc;
  }
  rc = turn_wait(g, seq, what, st);
  if (rc) goto out;
  if (!all || !colors) {
    turn_done(g);
    rc = mpi_fail(st, MLXD_ENOMEM, "[mpi] out of memory in %s", what);
    group_fail(g, st);
    goto out;
  }
  /* The turn is held until MPI_Comm_split returns: both are collectives on g->comm. */
  int mine[2] = {color, key};
  MPI_Request req = MPI_REQUEST_NULL;
  call_lock();
  int mrc = MPI_Iallgather(mine, 2, MPI_INT, all, 2, MPI_INT, g->comm, &req);
  call_unlock();
  if (mrc != MPI_SUCCESS) {
    turn_done(g);
    rc = mpi_fail_call(st, MLXD_EREMOTE, mrc, "MPI_Iallgather", what);
    group_fail(g, st);
    goto out;
  }
  rc = wait_reqs(g, &req, 1, NULL, false, what, st);
  if (rc) {
    turn_done(g);
    goto out;
  }
  for (int r = 0; r < size; r++) colors[r] = all[2 * r];
  qsort(colors, (size_t)size, sizeof(int), cmp_int);
  int dense = 0;
  for (int r = 0; r < size; r++) {
    if (r > 0 && colors[r] != colors[r - 1]) dense++;
    if (colors[r] == color) break;
  }
  MPI_Comm nc = MPI_COMM_NULL;
  call_lock();
  mrc = MPI_Comm_split(g->comm, dense, key, &nc);
  call_unlock();
  turn_done(g);
  if (mrc != MPI_SUCCESS) {
    rc = mpi_fail_call(st, MLXD_EREMOTE, mrc, "MPI_Comm_split", what);
    group_fail(g, st);
    goto out;
  }
  mpi_group* child = group_new(nc, st);
  if (!child) {
    call_lock();
    MPI_Comm_free(&nc);
    call_unlock();
    rc = MLXD_ENOMEM;
    goto out;
  }
  *out = &child->base;
out:
  free(all);
  free(colors);
  op_end();
  return rc;
}

static void mpi_destroy(mlxd_backend* b) {
  if (!b) return;
  mpi_group* g = (mpi_group*)b;
  /* Sends still in flight finish in the background without the group. */
  pthread_mutex_lock(&g_send_mu);
  for (pending_send* p = g_sends; p; p = p->next)
    if (p->g == g) p->g = NULL;
  pthread_mutex_unlock(&g_send_mu);
  /* MPI_Comm_free only marks the communicator; pending operations go on. */
  int fin = 0;
  MPI_Finalized(&fin);
  if (!fin && g->comm != MPI_COMM_NULL) {
    call_lock();
    MPI_Comm_free(&g->comm);
    call_unlock();
  }
  for (int i = 0; i < MPI_STAGE_POOL; i++) free(g->pool[i].p);
  pthread_mutex_destroy(&g->mu);
  pthread_cond_destroy(&g->cv);
  free(g);
}

static const mlxd_backend_ops k_mpi_ops = {
    "mpi",    mpi_all_reduce, mpi_all_gather, mpi_reduce_scatter, mpi_send,
    mpi_recv, mpi_split,      mpi_destroy,
};

/* ---------------------------------------------------------------------- */
/* The entry point. */

static const mlxd_plugin k_plugin = {
    MLXD_PLUGIN_ABI_VERSION,
    sizeof(mlxd_plugin),
    {"mpi", mpi_is_available, mpi_is_configured, mpi_create, false},
};

MPI_EXPORT const mlxd_plugin* mlxdist_plugin_v1(const mlxd_host_api* host);

const mlxd_plugin* mlxdist_plugin_v1(const mlxd_host_api* host) {
  if (!host || host->abi_version != MLXD_PLUGIN_ABI_VERSION ||
      host->struct_size < offsetof(mlxd_host_api, spin_us) + sizeof(host->spin_us) ||
      !host->reduce || !host->dtype_size || !host->timeout_s || !host->spin_us)
    return NULL;
  pthread_mutex_lock(&g_mu);
  memcpy(&g_host, host, offsetof(mlxd_host_api, spin_us) + sizeof(host->spin_us));
  g_host.struct_size = (uint32_t)sizeof g_host;
  pthread_mutex_unlock(&g_mu);
  pthread_mutex_lock(&g_send_mu);
  static bool cv_done;
  if (!cv_done) {
    cv_init_monotonic(&g_send_cv);
    cv_done = true;
  }
  pthread_mutex_unlock(&g_send_mu);
  return &k_plugin;
}
