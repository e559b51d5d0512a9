/* Streams: one worker thread per stream runs its tasks in queue order.
 *
 * Queue: a singly linked FIFO under the stream's mutex. One task runs at a
 * time (`running`), popped from the head, so tasks run in queue order.
 * Usually the worker runs it; but a thread that waits for a result whose
 * task has not started yet runs the queued tasks up to it itself
 * (mlxd_stream_help) — the common "queue an op, then eval it" costs no
 * thread hand-off and leaves one busy thread per process, not two (on a
 * host with as many ranks as cores, a second spinning thread steals the
 * core the peer needs). An idle worker sleeps on a condition variable (no
 * CPU when idle); a submit wakes it, so queued work progresses on its own
 * when nobody waits for it. Workers run at idle priority (SCHED_IDLE,
 * MLXDIST_WORKER_IDLE): waking one for every submit otherwise preempts the
 * spinning rank on a host with as many ranks as cores (docs/performance.md
 * has the measurement).
 *
 * Lifetime: the default CPU stream (index 0) is created on first use and
 * lives in static storage; a stream made by mlx_stream_new_device is freed
 * when its last reference goes, after its queue has drained and its worker
 * has been joined. At process exit the default streams (CPU and GPU, and
 * any stream made default with mlx_set_default_stream) are drained and
 * joined, within MLXDIST_TIMEOUT; exit() from a worker thread or from a
 * forked child skips this (there is nothing it could wait for safely). After fork() the child
 * gets a fresh default CPU stream (see child_after_fork); any other stream
 * belongs to the process that made it (core/fork.h): in a forked child its
 * use fails at once, and its last release there only forgets it (the
 * worker thread it would join does not exist there). */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/core_internal.h"
#include "core/error.h"
#include "core/fork.h"
#include "core/gpu.h"
#include "core/pool.h"
#include "core/stream_impl.h"
#include "util/clock.h"
#include "util/env.h"
#include "util/tunables.h"

#define INLINE_ARRAYS 6

typedef struct task {
  struct task* next; /* first: the pool's link overlays it while the block is free */
  mlxd_task_fn run;
  void (*cleanup)(void*);
  void* arg; /* the caller's pointer, or arg_copy (mlxd_stream_submit_copy) */
  int n_in, n_out;
  mlxd_array** arrays; /* n_in inputs, then n_out outputs */
  mlxd_array* inline_arrays[INLINE_ARRAYS];
  _Alignas(max_align_t) unsigned char arg_copy[MLXD_TASK_ARG_MAX];
} task;

struct mlxd_stream {
  atomic_int refs;
  mlx_device_type type;
  int index;
  bool is_static; /* the built-in default stream: never freed */
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t work_cv; /* worker: a task arrived or stop */
  pthread_cond_t done_cv; /* sync waiters and shutdown: a task finished or the worker ended */
  task* head;
  task* tail;
  atomic_uint_fast64_t submitted; /* written under mu; polled without it by the idle worker */
  uint64_t finished;              /* under mu */
  int sync_waiters;               /* under mu */
  int helpers;                    /* under mu: threads in mlxd_stream_help waiting for the worker */
  bool sleeping;                  /* under mu: the worker waits on work_cv */
  bool woken;                     /* under mu: work_cv was signalled since the worker slept */
  bool running;                   /* under mu: a task of this stream is running (any thread) */
  bool worker_runs;               /* under mu: ... and the thread running it is the worker */
  bool stop;                      /* under mu: accept no more tasks; worker ends when empty */
  bool dead;                      /* under mu: the worker has ended */
  bool joined;                    /* the worker thread has been joined */
  bool free_on_exit;              /* under mu: last reference dropped on the worker itself */
  _Atomic pid_t pid;              /* the process that made it (core/fork.h; released once set up) */
  task* current;                  /* under mu: the task running now, or NULL */
  struct mlxd_stream* forgotten;  /* next on the forgotten list (a forked child's copies) */
  void* native;                   /* GPU streams: the cudaStream_t (core/gpu.h); else NULL */
  int gpu_device;                 /* GPU streams: the device index */
};

static _Thread_local mlxd_stream* tls_current; /* the stream whose worker this thread is */

/* Whether s was made by another process (a forked child's copy, core/fork.h). */
static inline bool foreign(mlxd_stream* s) {
  return mlxd_fork_foreign(atomic_load_explicit(&s->pid, memory_order_acquire));
}

/* ---------- tasks ---------- */

static void task_free(task* t) {
  for (int i = 0; i < t->n_in + t->n_out; i++) mlxd_array_release(t->arrays[i]);
  if (t->arrays != t->inline_arrays) free(t->arrays);
  mlxd_pool_put(MLXD_POOL_TASK, t, sizeof *t, NULL);
}

static void task_run(task* t) {
  mlxd_status st;
  mlxd_status_reset(&st);
  for (int i = 0; i < t->n_in; i++)
    if (t->arrays[i] && mlxd_array_wait(t->arrays[i], &st)) break;
  if (!st.code) t->run(t->arg, &st);
  if (st.code && !st.msg[0])
    mlxd_fail(&st, st.code, "[stream] a task failed with code %d and no message", st.code);
  for (int i = 0; i < t->n_out; i++) {
    mlxd_array* out = t->arrays[t->n_in + i];
    if (out) mlxd_array_complete(out, st.code ? &st : NULL);
  }
  if (t->cleanup) t->cleanup(t->arg);
  task_free(t);
}

/* Pop the head task and run it (s->mu held on entry and on return). */
static void run_head_locked(mlxd_stream* s) {
  task* t = s->head;
  s->head = t->next;
  if (!s->head) s->tail = NULL;
  s->running = true;
  s->worker_runs = tls_current == s;
  s->current = t; /* so that a forked child's copy still reaches it */
  pthread_mutex_unlock(&s->mu);
  mlxd_stream* prev = tls_current;
  tls_current = s;
  task_run(t);
  tls_current = prev;
  pthread_mutex_lock(&s->mu);
  s->running = false;
  s->current = NULL;
  s->finished++;
  if (s->sync_waiters || s->helpers) pthread_cond_broadcast(&s->done_cv);
  /* A sleeping worker takes over what is left, or ends after a stop. */
  if (s->sleeping && (s->head || s->stop) && !s->helpers) pthread_cond_signal(&s->work_cv);
}

/* With s->mu held on entry and return (released meanwhile): spin a short
 * while (HELP_SPIN_S, at most MLXDIST_SPIN_US) for a to complete. On a
 * CPU of its own the worker finishes a small op in far less; on ours it
 * cannot run until we sleep, and this spin is all it costs. True when a
 * completed. */
#define HELP_SPIN_S 20e-6
static bool spin_briefly(mlxd_array* a, mlxd_stream* s) {
  double budget = mlxd_core_spin_s();
  if (budget > HELP_SPIN_S) budget = HELP_SPIN_S;
  if (budget <= 0) return false;
  pthread_mutex_unlock(&s->mu);
  double deadline = mlxd_now() + budget;
  bool done = false;
  for (unsigned i = 1; !done; i++) {
    mlxd_cpu_relax();
    done = atomic_load_explicit(&a->state, memory_order_acquire) != MLXD_ARRAY_PENDING;
    if ((i & 15) == 0 && mlxd_now() >= deadline) break;
  }
  pthread_mutex_lock(&s->mu);
  return done;
}

bool mlxd_stream_is_static(const mlxd_stream* s) { return s->is_static; }

void mlxd_stream_help(mlxd_array* a) {
  mlxd_stream* s = mlxd_array_producer_retain(a);
  if (!s) return;
  if (foreign(s)) { /* its worker and queue are the parent's */
    if (!s->is_static) mlxd_stream_release(s);
    return;
  }
  /* A task of this stream waiting for a later task of the same stream must
   * not run it (that would break queue order); it just waits. */
  if (tls_current != s) {
    bool spun = false;
    pthread_mutex_lock(&s->mu);
    while (atomic_load_explicit(&a->state, memory_order_acquire) == MLXD_ARRAY_PENDING) {
      if (s->running && s->worker_runs && !s->dead) {
        /* The worker took a task between our submit and now (the submit
         * woke it, or it had not yet let go of the stream when its last
         * result woke us). Wait for it to finish that task: a short spin,
         * then asleep. A long spin starves the worker when it shares our
         * CPU (at idle priority it gets almost none of it): each op would
         * cost the whole spin (MLXDIST_SPIN_US, 1 ms) and the worker would
         * keep the stream op after op. While we wait the worker leaves the
         * queue to us; the wait is bounded by the running task. */
        if (!spun) {
          spun = true;
          if (spin_briefly(a, s)) break;
          continue; /* the stream may have moved on meanwhile */
        }
        s->helpers++;
        pthread_cond_wait(&s->done_cv, &s->mu);
        s->helpers--;
      } else if (s->head && !s->running) {
        run_head_locked(s);
      } else {
        break; /* another caller's thread runs it, or it is not queued here */
      }
    }
    /* What we leave in the queue is the worker's again. */
    if (s->sleeping && s->head && !s->running && !s->helpers) pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
  }
  if (!s->is_static) mlxd_stream_release(s);
}

/* ---------- worker ---------- */

static void stream_free(mlxd_stream* s) {
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->work_cv);
  pthread_cond_destroy(&s->done_cv);
  mlxd_gpu_stream_destroy(s->native);
  if (!s->is_static) free(s);
}

static void* worker_main(void* p) {
  mlxd_stream* s = p;
  tls_current = s;
  if (mlxd_tunable_long(MLXD_T_WORKER_IDLE) != 0) {
    /* Idle priority: a waiting thread usually runs the task itself (see the
     * top of this file); the worker should only take the CPU nobody else
     * wants, never preempt a rank's spinning thread on a full host. */
    struct sched_param sp = {0};
    pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp);
  }
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->head || s->running || s->helpers) {
      if (s->stop && !s->head && !s->running) goto out;
      s->sleeping = true;
      pthread_cond_wait(&s->work_cv, &s->mu);
      s->sleeping = s->woken = false;
    }
    run_head_locked(s);
  }
out:
  s->dead = true;
  pthread_cond_broadcast(&s->done_cv);
  bool self_free = s->free_on_exit;
  pthread_mutex_unlock(&s->mu);
  tls_current = NULL;
  if (self_free) stream_free(s);
  return NULL;
}

static int stream_init(mlxd_stream* s, mlx_device_type type, int index, bool is_static,
                       mlxd_status* st) {
  atomic_init(&s->refs, 1);
  s->type = type;
  s->index = index;
  s->is_static = is_static;
  s->head = s->tail = NULL;
  atomic_init(&s->submitted, 0);
  s->finished = 0;
  s->sync_waiters = s->helpers = 0;
  s->sleeping = s->woken = s->running = s->worker_runs = s->stop = s->dead = s->joined =
      s->free_on_exit = false;
  s->current = NULL;
  s->forgotten = NULL;
  s->native = NULL;
  s->gpu_device = 0;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->work_cv, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&s->done_cv, &ca);
  pthread_condattr_destroy(&ca);
  /* Workers take no signals: they go to the application's threads. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  atomic_store_explicit(&s->pid, mlxd_self_pid(), memory_order_release);
  /* The worker reads its settings from the snapshot (util/env.h): fill it on
   * this, the caller's, thread. */
  mlxd_env_refresh();
  int rc = mlxd_thread_start(&s->thread, "worker", worker_main, s);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc) {
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work_cv);
    pthread_cond_destroy(&s->done_cv);
    return mlxd_fail(st, MLXD_ESYS, "[stream] cannot start the worker thread of stream %d: %s",
                     index, strerror(rc));
  }
  return 0;
}

/* Ask the worker to finish its queue and end. */
static void stream_stop(mlxd_stream* s) {
  pthread_mutex_lock(&s->mu);
  s->stop = true;
  s->woken = true;
  pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
}

/* Wait (at most until deadline, if > 0) for the worker to end, then join it. */
static bool stream_join(mlxd_stream* s, double deadline) {
  if (s->joined) return true;
  if (deadline > 0) {
    pthread_mutex_lock(&s->mu);
    while (!s->dead) {
      double left = deadline - mlxd_now();
      if (left <= 0) break;
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      double w = left > 1.0 ? 1.0 : left;
      ts.tv_sec += (time_t)w;
      ts.tv_nsec += (long)((w - (double)(time_t)w) * 1e9);
      if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
      }
      pthread_cond_timedwait(&s->done_cv, &s->mu, &ts);
    }
    bool dead = s->dead;
    pthread_mutex_unlock(&s->mu);
    if (!dead) return false;
  }
  pthread_join(s->thread, NULL);
  s->joined = true;
  return true;
}

/* ---------- default streams ---------- */

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static mlxd_stream g_cpu_static; /* the default CPU stream, index 0 */
static mlxd_status g_init_status;
static _Atomic(mlxd_stream*) g_cpu_default; /* what mlxd_default_stream(MLX_CPU) returns */
static pid_t g_pid;
static atomic_int g_next_index = 1;

/* Streams made default with mlx_set_default_stream: retained until exit so a
 * pointer handed out by mlxd_default_stream stays valid. */
static pthread_mutex_t g_kept_mu = PTHREAD_MUTEX_INITIALIZER;
static mlxd_stream** g_kept;
static size_t g_kept_n, g_kept_cap;
static atomic_bool g_exiting;
static mlxd_stream** volatile g_kept_forgotten; /* a forked child's copy of the parent's kept list */

static void (*_Atomic g_exit_hook)(void);

void mlxd_stream_set_exit_hook(void (*fn)(void)) { atomic_store(&g_exit_hook, fn); }

static void at_exit_teardown(void) {
  atomic_store(&g_exiting, true);
  if (tls_current) return;       /* exit() from a worker: it cannot wait for itself */
  if (getpid() != g_pid) return; /* a forked child has no worker threads */
  pthread_mutex_lock(&g_kept_mu);
  mlxd_stream** kept = g_kept;
  size_t n = g_kept_n;
  g_kept = NULL;
  g_kept_n = g_kept_cap = 0;
  pthread_mutex_unlock(&g_kept_mu);

  double timeout = mlxd_tunable_double(MLXD_T_TIMEOUT);
  if (!(timeout > 0)) timeout = 60;
  double deadline = mlxd_now() + timeout;
  bool all_joined = true;
  if (g_init_status.code == 0) {
    stream_stop(&g_cpu_static);
    for (size_t i = 0; i < n; i++) stream_stop(kept[i]);
    /* Ops still pending after a short grace wait for something that will
     * not come (a receive nobody sends): the hook fails them at once. */
    void (*hook)(void) = atomic_load(&g_exit_hook);
    double grace = mlxd_now() + (MLXD_EXIT_GRACE_S < timeout ? MLXD_EXIT_GRACE_S : timeout);
    bool drained = stream_join(&g_cpu_static, grace);
    for (size_t i = 0; i < n && drained; i++) drained = stream_join(kept[i], grace);
    if (!drained && hook) hook();
    if (stream_join(&g_cpu_static, deadline)) {
      /* The struct stays valid (static); later submits fail cleanly. */
    } else {
      all_joined = false;
    }
  }
  for (size_t i = 0; i < n; i++) {
    if (stream_join(kept[i], deadline))
      mlxd_stream_release(kept[i]);
    else
      all_joined = false;
  }
  free(kept);
  if (!all_joined)
    fprintf(stderr,
            "mlxdist: warning: a stream's queued work did not finish within MLXDIST_TIMEOUT "
            "(%g s) at exit; exiting without it\n",
            timeout);
}

/* In a child made by fork() only the forking thread exists. The default
 * CPU stream is restarted there, with a fresh, empty queue and a worker of
 * its own, by the child's first submit to it (child_restart), not in the
 * atfork handler: a child that never queues work (one that execs, or only
 * finds its parent's group refused) starts no thread. Work queued in the
 * parent is not run again in the child, and streams other than the
 * built-in default are not usable in the child (core/fork.h). */
/* a forked child's copy of the parent's queue and running task */
static task* volatile g_cpu_forgotten[2];
static pthread_mutex_t g_restart_mu = PTHREAD_MUTEX_INITIALIZER;

static void child_after_fork(void) {
  mlxd_stream* s = &g_cpu_static;
  /* The parent's tasks stay reachable (not run, not freed): their outputs
   * are pending arrays of the parent, which fail when waited for here. */
  g_cpu_forgotten[0] = s->head;
  g_cpu_forgotten[1] = s->current;
  tls_current = NULL;
  pthread_mutex_init(&g_restart_mu, NULL);
  /* the kept streams' workers do not exist here: forget them (not freed) */
  pthread_mutex_init(&g_kept_mu, NULL);
  g_kept_forgotten = g_kept; /* stays reachable */
  g_kept = NULL;
  g_kept_n = g_kept_cap = 0;
  atomic_store(&g_cpu_default, s);
}

/* The first submit to the default CPU stream in a forked child: start it
 * afresh in this process. 0, or non-zero with st set (the stream is then
 * this process's and shut down: later submits fail at once). */
static int child_restart(mlxd_status* st) {
  mlxd_stream* s = &g_cpu_static;
  int rc = 0;
  pthread_mutex_lock(&g_restart_mu);
  if (foreign(s)) {
    g_pid = getpid(); /* at exit: this process's worker is joined */
    rc = stream_init(s, MLX_CPU, 0, true, st);
    if (rc) {
      /* no worker: submits fail with a clear message instead of hanging */
      pthread_mutex_init(&s->mu, NULL);
      pthread_cond_init(&s->work_cv, NULL);
      pthread_cond_init(&s->done_cv, NULL);
      s->stop = s->dead = s->joined = true;
      atomic_store_explicit(&s->pid, mlxd_self_pid(), memory_order_release);
    }
  }
  pthread_mutex_unlock(&g_restart_mu);
  return rc;
}

static void default_init(void) {
  g_pid = getpid();
  mlxd_status_clear(&g_init_status);
  if (stream_init(&g_cpu_static, MLX_CPU, 0, true, &g_init_status) == 0) {
    atomic_store(&g_cpu_default, &g_cpu_static);
    atexit(at_exit_teardown);
    pthread_atfork(NULL, NULL, child_after_fork);
  }
}

/* The reason GPU streams cannot be had here (the GPU provider's, core/gpu.h). */
static int no_gpu(mlxd_status* st) {
  mlxd_status why;
  mlxd_gpu_unavailable(&why, "[stream]");
  return mlxd_fail(st, MLXD_EUNAVAIL, "%.400s; use a CPU stream (Device(cpu, 0))", why.msg);
}

static mlxd_stream* stream_new(mlx_device_type type, int device, mlxd_status* st);

/* The default GPU stream (Device(gpu, 0)): made on first use where a GPU
 * exists, then kept for the life of the process. At exit it is drained and
 * joined as the default CPU streams are (gpu_at_exit); its CUDA stream is
 * left to the process's end. */
static pthread_once_t g_gpu_once = PTHREAD_ONCE_INIT;
static mlxd_stream* g_gpu_default;
static mlxd_status g_gpu_status;
static pid_t g_gpu_pid;

/* Registered with atexit after the probe has loaded and initialised the
 * CUDA runtime, so it runs before the runtime's own exit handlers (atexit
 * runs them in reverse): no op (an nccl one) is still running on the
 * stream's worker while CUDA and NCCL shut down. Bounded as at_exit_teardown:
 * a short grace, then the exit hook fails pending ops, then the rest of
 * MLXDIST_TIMEOUT. */
static void gpu_at_exit(void) {
  mlxd_stream* s = g_gpu_default;
  if (!s || tls_current || getpid() != g_gpu_pid) return;
  double timeout = mlxd_tunable_double(MLXD_T_TIMEOUT);
  if (!(timeout > 0)) timeout = 60;
  double deadline = mlxd_now() + timeout;
  double grace = mlxd_now() + (MLXD_EXIT_GRACE_S < timeout ? MLXD_EXIT_GRACE_S : timeout);
  stream_stop(s);
  if (!stream_join(s, grace)) {
    void (*hook)(void) = atomic_load(&g_exit_hook);
    if (hook) hook();
    if (!stream_join(s, deadline))
      fprintf(stderr,
              "mlxdist: warning: the default GPU stream's queued work did not finish within "
              "MLXDIST_TIMEOUT (%g s) at exit; exiting without it\n",
              timeout);
  }
}

static void gpu_default_init(void) {
  mlxd_status_clear(&g_gpu_status);
  if (mlxd_gpu_count() <= 0) {
    no_gpu(&g_gpu_status);
    return;
  }
  g_gpu_default = stream_new(MLX_GPU, 0, &g_gpu_status);
  if (g_gpu_default) {
    g_gpu_pid = getpid();
    atexit(gpu_at_exit);
  }
}

mlxd_stream* mlxd_default_stream(mlx_device_type type, mlxd_status* st) {
  if (type == MLX_GPU) {
    pthread_once(&g_gpu_once, gpu_default_init);
    if (!g_gpu_default && st) *st = g_gpu_status;
    return g_gpu_default;
  }
  if (type != MLX_CPU) {
    mlxd_fail(st, MLXD_EINVAL, "[stream] unknown device type %d (expected MLX_CPU or MLX_GPU)",
              (int)type);
    return NULL;
  }
  pthread_once(&g_once, default_init);
  if (g_init_status.code) {
    if (st) *st = g_init_status;
    return NULL;
  }
  return atomic_load_explicit(&g_cpu_default, memory_order_acquire);
}

/* ---------- streams ---------- */

mlxd_stream* mlxd_stream_retain(mlxd_stream* s) {
  if (s) atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
  return s;
}

/* A forked child's copies of streams whose last reference went there: kept,
 * not freed (their worker, queue and locks are the parent's), and reachable
 * (a leak checker at the child's exit sees them). */
static _Atomic(mlxd_stream*) g_forgotten;

static void forget(mlxd_stream* s) {
  mlxd_stream* head = atomic_load(&g_forgotten);
  do s->forgotten = head;
  while (!atomic_compare_exchange_weak(&g_forgotten, &head, s));
}

void mlxd_stream_release(mlxd_stream* s) {
  if (!s || atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1) return;
  if (s->is_static) return; /* never freed (over-release of the default stream) */
  if (foreign(s)) {
    forget(s);
    return;
  }
  stream_stop(s);
  if (!s->joined && pthread_equal(pthread_self(), s->thread)) {
    /* The last reference went from one of this stream's own tasks: the worker
     * frees the stream once its queue is empty. */
    pthread_mutex_lock(&s->mu);
    s->free_on_exit = true;
    pthread_mutex_unlock(&s->mu);
    pthread_detach(s->thread);
    return;
  }
  stream_join(s, 0);
  stream_free(s);
}

mlx_device_type mlxd_stream_device_type(const mlxd_stream* s) { return s->type; }
int mlxd_stream_index(const mlxd_stream* s) { return s->index; }

void mlxd_stream_sync(mlxd_stream* s) {
  if (!s || tls_current == s) return; /* a task cannot wait for itself */
  if (foreign(s)) return;             /* nothing runs it here */
  pthread_mutex_lock(&s->mu);
  uint64_t target = atomic_load_explicit(&s->submitted, memory_order_relaxed);
  s->sync_waiters++;
  /* Bounded by the queued tasks themselves (each has a bounded run time). */
  while (s->finished < target && !s->dead) pthread_cond_wait(&s->done_cv, &s->mu);
  s->sync_waiters--;
  pthread_mutex_unlock(&s->mu);
}

/* The failure of any use of s in a forked child (s is not its default stream). */
static int fork_refuse(mlxd_status* st, mlxd_stream* s, const char* doing) {
  char prefix[96];
  snprintf(prefix, sizeof prefix, "[stream] %s on stream %d", doing, s->index);
  return mlxd_fork_refuse(st, prefix, "stream", atomic_load(&s->pid),
                          "its worker thread runs in that process only (use the default stream, "
                          "or a stream made in this process)");
}

/* Queue a task; copy: arg points to arg_size bytes to copy into the task
 * (run and cleanup get the copy). */
static int submit_task(mlxd_stream* s, mlxd_task_fn run, void (*cleanup)(void*),
                       void (*on_queue)(void*), void* arg, size_t arg_size, bool copy,
                       mlxd_array* const* inputs, int n_inputs, mlxd_array* const* outputs,
                       int n_outputs, mlxd_status* st_out) {
  mlxd_status local;
  mlxd_status* st = st_out ? st_out : &local;
  int code = 0;
  if (!s)
    code = mlxd_fail(st, MLXD_EINVAL, "[stream] cannot queue a task on a NULL stream");
  else if (!run)
    code = mlxd_fail(st, MLXD_EINVAL, "[stream] cannot queue a task without a run function");
  else if (n_inputs < 0 || n_outputs < 0 || (n_inputs > 0 && !inputs) ||
           (n_outputs > 0 && !outputs))
    code = mlxd_fail(st, MLXD_EINVAL,
                     "[stream] bad task arrays (%d inputs, %d outputs; expected counts >= 0 "
                     "with non-NULL lists)",
                     n_inputs, n_outputs);
  else if (copy && (arg_size > MLXD_TASK_ARG_MAX || (arg_size > 0 && !arg)))
    code = mlxd_fail(st, MLXD_EINVAL,
                     "[stream] a task's argument of %zu bytes does not fit in the task (at most "
                     "%d bytes, non-NULL)",
                     arg_size, MLXD_TASK_ARG_MAX);
  /* after the checks: the default stream starts afresh in a forked child */
  if (!code && foreign(s))
    code = s->is_static ? child_restart(st) : fork_refuse(st, s, "queueing a task");
  task* t = NULL;
  if (!code) {
    int fresh;
    t = mlxd_pool_get(MLXD_POOL_TASK, sizeof *t, &fresh);
    int n = n_inputs + n_outputs;
    if (t) {
      t->arrays = n <= INLINE_ARRAYS ? t->inline_arrays : malloc((size_t)n * sizeof(mlxd_array*));
      if (!t->arrays) {
        mlxd_pool_put(MLXD_POOL_TASK, t, sizeof *t, NULL);
        t = NULL;
      }
    }
    if (!t) code = mlxd_fail(st, MLXD_ENOMEM, "[stream] out of memory queueing a task");
  }
  if (!code) {
    t->next = NULL;
    t->run = run;
    t->cleanup = cleanup;
    if (copy) {
      if (arg_size) memcpy(t->arg_copy, arg, arg_size);
      t->arg = t->arg_copy;
    } else {
      t->arg = arg;
    }
    t->n_in = n_inputs;
    t->n_out = n_outputs;
    for (int i = 0; i < n_inputs; i++) t->arrays[i] = mlxd_array_retain(inputs[i]);
    for (int i = 0; i < n_outputs; i++) {
      t->arrays[n_inputs + i] = mlxd_array_retain(outputs[i]);
      if (outputs[i]) mlxd_array_set_producer(outputs[i], s);
    }
    pthread_mutex_lock(&s->mu);
    if (s->stop) {
      pthread_mutex_unlock(&s->mu);
      code = mlxd_fail(st, MLXD_EUNAVAIL,
                       "[stream] stream %d has shut down (the process is exiting or the stream "
                       "was released); the task was not queued",
                       s->index);
      task_free(t);
    } else {
      if (on_queue) on_queue(t->arg);
      if (s->tail)
        s->tail->next = t;
      else
        s->head = t;
      s->tail = t;
      atomic_store_explicit(&s->submitted,
                            atomic_load_explicit(&s->submitted, memory_order_relaxed) + 1,
                            memory_order_relaxed);
      /* Wake a sleeping worker once (not again for every task queued
       * before it runs), so queued work progresses when nobody waits. */
      if (s->sleeping && !s->woken) {
        s->woken = true;
        pthread_cond_signal(&s->work_cv);
      }
      pthread_mutex_unlock(&s->mu);
      return 0;
    }
  }
  /* Nothing was queued: fail the outputs too, so nobody waits on them forever. */
  if (outputs && n_outputs > 0)
    for (int i = 0; i < n_outputs; i++)
      if (outputs[i] && atomic_load(&outputs[i]->state) == MLXD_ARRAY_PENDING)
        mlxd_array_complete(outputs[i], st);
  return code;
}

int mlxd_stream_submit(mlxd_stream* s, mlxd_task_fn run, void (*cleanup)(void*), void* arg,
                       mlxd_array* const* inputs, int n_inputs, mlxd_array* const* outputs,
                       int n_outputs, mlxd_status* st) {
  return submit_task(s, run, cleanup, NULL, arg, 0, false, inputs, n_inputs, outputs, n_outputs,
                     st);
}

int mlxd_stream_submit_copy(mlxd_stream* s, mlxd_task_fn run, void (*cleanup)(void*),
                            void (*on_queue)(void*), const void* arg, size_t arg_size,
                            mlxd_array* const* inputs, int n_inputs, mlxd_array* const* outputs,
                            int n_outputs, mlxd_status* st) {
  return submit_task(s, run, cleanup, on_queue, (void*)arg, arg_size, true, inputs, n_inputs,
                     outputs, n_outputs, st);
}

/* A new stream; device: the GPU's index for a GPU stream (which gets a CUDA
 * stream of its own), unused for the CPU. */
static mlxd_stream* stream_new(mlx_device_type type, int device, mlxd_status* st) {
  void* native = NULL;
  if (type == MLX_GPU && mlxd_gpu_stream_create(device, &native, st)) return NULL;
  mlxd_stream* s = malloc(sizeof *s);
  if (!s) {
    mlxd_gpu_stream_destroy(native);
    mlxd_fail(st, MLXD_ENOMEM, "[stream] out of memory creating a stream");
    return NULL;
  }
  int index = atomic_fetch_add(&g_next_index, 1);
  if (stream_init(s, type, index, false, st)) {
    mlxd_gpu_stream_destroy(native);
    free(s);
    return NULL;
  }
  s->native = native; /* set before any task can run: the worker reads it only through tasks */
  s->gpu_device = device;
  return s;
}

void* mlxd_stream_native(const mlxd_stream* s) { return s->native; }

/* ---------- public API ---------- */

static mlx_stream handle(mlxd_stream* s) {
  mlx_stream h = {s};
  return h;
}

static int read_stream(mlx_stream stream, const char* fn, mlxd_status* st) {
  if (stream.ctx) return 0;
  return mlxd_fail(st, MLXD_EINVAL,
                   "[stream] %s got the null stream handle (expected a stream from "
                   "mlx_stream_new_device or mlx_get_default_stream)",
                   fn);
}

mlx_stream mlx_stream_new(void) { return handle(NULL); }

mlx_stream mlx_stream_new_device(mlx_device dev) {
  mlxd_status st;
  mlx_device_type type;
  int index;
  if (mlxd_device_read(dev, &type, &index, &st)) {
    mlxd_error_status(&st);
    return handle(NULL);
  }
  if (type == MLX_GPU && mlxd_gpu_count() <= 0) {
    no_gpu(&st);
    mlxd_error_status(&st);
    return handle(NULL);
  }
  if (mlxd_device_check_available(type, index, &st)) {
    mlxd_error_status(&st);
    return handle(NULL);
  }
  mlxd_stream* s = stream_new(type, index, &st);
  if (!s) mlxd_error_status(&st);
  return handle(s);
}

int mlx_stream_set(mlx_stream* stream, const mlx_stream src) {
  if (!stream) {
    mlxd_error("[stream] mlx_stream_set got a NULL destination pointer");
    return 1;
  }
  mlxd_stream_retain(mlxd_stream_of(src));
  mlxd_stream_release(mlxd_stream_of(*stream));
  *stream = src;
  return 0;
}

int mlx_stream_free(mlx_stream stream) {
  mlxd_stream_release(mlxd_stream_of(stream));
  return 0;
}

int mlx_stream_tostring(mlx_string* str, mlx_stream stream) {
  mlxd_status st;
  if (read_stream(stream, "mlx_stream_tostring", &st)) return mlxd_error_status(&st);
  mlxd_stream* s = mlxd_stream_of(stream);
  char buf[96];
  snprintf(buf, sizeof buf, "Stream(Device(%s, 0), %d)", mlxd_device_type_name(s->type), s->index);
  return mlxd_string_put(str, buf, "[stream] mlx_stream_tostring");
}

bool mlx_stream_equal(mlx_stream lhs, mlx_stream rhs) { return lhs.ctx == rhs.ctx; }

int mlx_stream_get_device(mlx_device* dev, mlx_stream stream) {
  mlxd_status st;
  if (!dev) {
    mlxd_error("[stream] mlx_stream_get_device got a NULL result pointer");
    return 1;
  }
  if (read_stream(stream, "mlx_stream_get_device", &st)) return mlxd_error_status(&st);
  mlxd_stream* s = mlxd_stream_of(stream);
  mlx_device d = mlxd_device_make(s->type, s->type == MLX_GPU ? s->gpu_device : 0, &st);
  if (!d.ctx) return mlxd_error_status(&st);
  mlx_device_free(*dev);
  *dev = d;
  return 0;
}

int mlx_stream_get_index(int* index, mlx_stream stream) {
  mlxd_status st;
  if (!index) {
    mlxd_error("[stream] mlx_stream_get_index got a NULL result pointer");
    return 1;
  }
  if (read_stream(stream, "mlx_stream_get_index", &st)) return mlxd_error_status(&st);
  *index = mlxd_stream_of(stream)->index;
  return 0;
}

int mlx_synchronize(mlx_stream stream) {
  mlxd_status st;
  mlxd_stream* s = mlxd_stream_of(stream);
  if (!s) {
    mlx_device dev = mlx_device_new();
    mlx_device_type type = MLX_CPU;
    if (mlx_get_default_device(&dev)) return 1;
    mlxd_device_read(dev, &type, NULL, &st);
    mlx_device_free(dev);
    s = mlxd_default_stream(type, &st);
    if (!s) return mlxd_error_status(&st);
  }
  if (foreign(s)) {
    if (s->is_static) return 0; /* a forked child's, not started yet: nothing queued */
    return mlxd_error_status((fork_refuse(&st, s, "mlx_synchronize"), &st));
  }
  if (tls_current == s) {
    mlxd_error(
        "[stream] mlx_synchronize was called from a task running on stream %d itself; "
        "it would wait for itself forever",
        s->index);
    return 1;
  }
  mlxd_stream_sync(s);
  if (s->native && mlxd_gpu_stream_sync(s->native, &st)) return mlxd_error_status(&st);
  return 0;
}

int mlx_get_default_stream(mlx_stream* stream, mlx_device dev) {
  mlxd_status st;
  mlx_device_type type;
  int index;
  if (!stream) {
    mlxd_error("[stream] mlx_get_default_stream got a NULL result pointer");
    return 1;
  }
  if (mlxd_device_read(dev, &type, &index, &st)) return mlxd_error_status(&st);
  if (type == MLX_CPU && mlxd_device_check_available(type, index, &st))
    return mlxd_error_status(&st);
  if (type == MLX_GPU && mlxd_gpu_count() > 0) {
    if (mlxd_device_check_available(type, index, &st)) return mlxd_error_status(&st);
    if (index != 0) {
      mlxd_error(
          "[stream] the default GPU stream is Device(gpu, 0)'s; for Device(gpu, %d) make "
          "a stream with mlx_stream_new_device",
          index);
      return 1;
    }
  }
  mlxd_stream* s = mlxd_default_stream(type, &st);
  if (!s) return mlxd_error_status(&st);
  mlxd_stream_retain(s);
  mlxd_stream_release(mlxd_stream_of(*stream));
  *stream = handle(s);
  return 0;
}

int mlx_set_default_stream(mlx_stream stream) {
  mlxd_status st;
  if (read_stream(stream, "mlx_set_default_stream", &st)) return mlxd_error_status(&st);
  mlxd_stream* s = mlxd_stream_of(stream);
  if (s->type != MLX_CPU) {
    if (mlxd_gpu_count() <= 0) return mlxd_error_status((no_gpu(&st), &st));
    mlxd_error(
        "[stream] mlx_set_default_stream: only a CPU stream can be made the default "
        "stream (the default GPU stream is mlx_default_gpu_stream_new's)");
    return 1;
  }
  if (foreign(s) && !s->is_static)
    return mlxd_error_status((fork_refuse(&st, s, "mlx_set_default_stream"), &st));
  if (!mlxd_default_stream(MLX_CPU, &st)) return mlxd_error_status(&st);
  if (!s->is_static) {
    int err = 0;
    pthread_mutex_lock(&g_kept_mu);
    bool found = false;
    for (size_t i = 0; i < g_kept_n; i++) found = found || g_kept[i] == s;
    if (!found) {
      if (atomic_load(&g_exiting)) {
        err = 2;
      } else if (g_kept_n == g_kept_cap) {
        size_t cap = g_kept_cap ? 2 * g_kept_cap : 4;
        mlxd_stream** p = realloc(g_kept, cap * sizeof *p);
        if (p) {
          g_kept = p;
          g_kept_cap = cap;
        } else {
          err = 1;
        }
      }
      if (!err) g_kept[g_kept_n++] = mlxd_stream_retain(s);
    }
    pthread_mutex_unlock(&g_kept_mu);
    if (err == 1) {
      mlxd_error("[stream] out of memory setting the default stream");
      return 1;
    }
    if (err == 2) {
      mlxd_error("[stream] cannot change the default stream while the process is exiting");
      return 1;
    }
  }
  atomic_store_explicit(&g_cpu_default, s, memory_order_release);
  return 0;
}

mlx_stream mlx_default_cpu_stream_new(void) {
  mlxd_status st;
  mlxd_stream* s = mlxd_default_stream(MLX_CPU, &st);
  if (!s) mlxd_error_status(&st);
  return handle(mlxd_stream_retain(s));
}

mlx_stream mlx_default_gpu_stream_new(void) {
  mlxd_status st;
  mlxd_stream* s = mlxd_default_stream(MLX_GPU, &st);
  if (!s) mlxd_error_status(&st);
  return handle(mlxd_stream_retain(s));
}
