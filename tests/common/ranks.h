/* The one way the tests below the API fork ranks: N child processes, each
 * told its rank, run one function and exit with its result; the parent
 * collects every exit status within a bounded wait (killing every rank
 * still alive when it runs out) and says which rank failed and how.
 *
 * In a child, reports carry the label "rank R" (see testutil.h), the
 * failed-check count starts at 0, and a rank whose function returned 0 but
 * recorded a failed T_CHECK exits 1. Children leave with exit(), so a
 * sanitizer's report at exit turns into a failure. On Linux a child is
 * killed when the parent dies (a ctest timeout leaves no orphan spinning). */
#ifndef MLXDIST_TEST_RANKS_H
#define MLXDIST_TEST_RANKS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#define T_MAX_RANKS 32

/* session: a name unique to this run (for transports that need one: the
 * shared-memory session name); arg: the caller's. */
typedef int (*t_rank_fn)(int rank, int size, const char* session, void* arg);

typedef struct t_ranks_opts {
  double timeout_s; /* every rank must have exited by then (0: 120 s) */
  /* Once a rank has failed, the others get at most this long before they
   * are killed (0: 20 s; < 0: no shortening). A rank expected to exit
   * early must exit 0. */
  double grace_s;
  /* Run in the parent once every rank is forked (to close the parent's
   * copies of descriptors the ranks own); may be NULL. */
  void (*after_fork)(void* arg);
  const char* what; /* names the run in reports ("all_reduce over tcp"); may be NULL */
} t_ranks_opts;

typedef struct t_rank_exit {
  int code;      /* exit status; 128 + signal when killed by one; -1: never reaped */
  int signal;    /* the signal that ended it, or 0 */
  int timed_out; /* killed by the harness at the deadline */
} t_rank_exit;

/* Fork size ranks (2..T_MAX_RANKS; 1 allowed) running fn and wait for them.
 * Prints one line per failed rank ("rank 2 (pid 123): killed by signal 11
 * (Segmentation fault)"). Fills exits[] when not NULL. Returns the number of
 * ranks that did not exit 0. */
int t_run_ranks(int size, t_rank_fn fn, void* arg, const t_ranks_opts* opts, t_rank_exit* exits);

/* This process's rank in a forked run; -1 in the parent. */
int t_rank(void);

/* Monotonic seconds. */
double t_now(void);

/* A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0 and
 * released), for hostfiles written by the tests. */
int t_free_port(void);

/* Write path: a ring hostfile of n ranks (n <= T_MAX_RANKS) on 127.0.0.1,
 * one connection each, every rank its own port from t_free_port (a port the
 * kernel handed out once may come again, so repeats are drawn anew). */
void t_write_loopback_hostfile(const char* path, int n);

/* In a rank forked to call the public API: the environment mlxdist-launch
 * gives rank of size. MLX_RANK, and MLX_HOSTFILE = hostfile with
 * MLX_WORLD_SIZE unset, or (hostfile NULL) MLX_WORLD_SIZE with MLX_HOSTFILE
 * unset. */
void t_rank_env(int rank, int size, const char* hostfile);

/* Marks: a rank tells the others it reached a point (an order of events the
 * tests wait for instead of sleeping): t_mark creates the empty file
 * DIR/NAME; t_wait_mark polls for it every 10 ms and fails the rank (fatal)
 * when it has not come within limit_s. */
void t_mark(const char* dir, const char* name);
void t_wait_mark(const char* dir, const char* name, double limit_s);

/* The processes of one job started by a launcher (mpiexec, srun), which are
 * not forked by this harness, share marks in a directory of their own:
 * /tmp/mlxdist-marks-<uid>-<job>, job from PMIX_NAMESPACE, else
 * OMPI_MCA_ess_base_jobid, else SLURM_JOB_ID.SLURM_STEPID, else the parent's pid
 * (the launcher's daemon on one host). Created when missing; the caller that
 * needs it last removes it with t_job_marks_remove (its marks NULL-terminated). */
void t_job_marks_dir(char* out, size_t n);
void t_job_marks_remove(const char* dir, ...);

/* Waits for an event in another rank or thread, never a sleep in its place:
 * t_wait_until polls cond(arg) every millisecond until it holds and fails the
 * caller (fatal, naming what) when it has not within limit_s. */
void t_wait_until(bool (*cond)(long), long arg, const char* what, double limit_s);
/* The same for a counter other ranks or threads add to (in shared memory):
 * polls until *c >= n. */
void t_wait_count(atomic_int* c, int n, const char* what, double limit_s);
/* Process pid has exited (a zombie, or reaped), by its /proc state. */
bool t_pid_gone(long pid);
/* This process's thread tid is blocked (asleep, state S in /proc). */
bool t_thread_asleep(long tid);

/* A name nobody else uses (for shared-memory sessions): mlxdist-test-<what>-... */
void t_session_name(char* buf, size_t n, const char* what);

#endif
