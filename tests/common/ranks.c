/* The rank harness (see ranks.h). */
#include "ranks.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "testutil.h"

static int t_my_rank = -1;

int t_rank(void) { return t_my_rank; }

double t_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void t_rank_env(int rank, int size, const char* hostfile) {
  char rs[16], ns[16];
  snprintf(rs, sizeof rs, "%d", rank);
  snprintf(ns, sizeof ns, "%d", size);
  setenv("MLX_RANK", rs, 1);
  if (hostfile) {
    setenv("MLX_HOSTFILE", hostfile, 1);
    unsetenv("MLX_WORLD_SIZE");
  } else {
    setenv("MLX_WORLD_SIZE", ns, 1);
    unsetenv("MLX_HOSTFILE");
  }
}

void t_session_name(char* buf, size_t n, const char* what) {
  static unsigned counter;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  snprintf(buf, n, "mlxdist-test-%s-%d-%u-%lx", what, (int)getpid(), counter++,
           (unsigned long)ts.tv_nsec ^ ((unsigned long)ts.tv_sec << 20));
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static void child_main(int rank, int size, pid_t parent, const char* session, t_rank_fn fn,
                       void* arg) {
#ifdef __linux__
  /* die with the parent (a ctest timeout kills only the parent) */
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(125);
#else
  (void)parent;
#endif
  t_my_rank = rank;
  char label[32];
  snprintf(label, sizeof label, "rank %d", rank);
  t_set_label(label);
  t_checks_reset();
  int rc = fn(rank, size, session, arg);
  if (t_exit_status() != 0 && rc == 0) rc = 1;
  fflush(NULL);
  exit(rc); /* exit, not _exit: lets a sanitizer turn a report into a failure */
}

static void describe(int rank, pid_t pid, const t_rank_exit* e, double timeout_s,
                     const char* what) {
  char how[160];
  if (e->timed_out)
    snprintf(how, sizeof how, "still running after %.0f s: killed", timeout_s);
  else if (e->signal)
    snprintf(how, sizeof how, "killed by signal %d (%s)", e->signal, strsignal(e->signal));
  else if (e->code < 0)
    snprintf(how, sizeof how, "was never reaped");
  else
    snprintf(how, sizeof how, "exited with status %d", e->code);
  fprintf(stderr, "%s%srank %d (pid %d): %s\n", what ? what : "", what ? ": " : "", rank, (int)pid,
          how);
}

int t_run_ranks(int size, t_rank_fn fn, void* arg, const t_ranks_opts* opts, t_rank_exit* exits) {
  if (size < 1 || size > T_MAX_RANKS)
    T_FAIL("t_run_ranks: size %d not in [1, %d]", size, T_MAX_RANKS);
  double timeout_s = opts && opts->timeout_s > 0 ? opts->timeout_s : 120.0;
  double grace_s = opts && opts->grace_s != 0 ? opts->grace_s : 20.0;
  const char* what = opts ? opts->what : NULL;
  char session[128];
  t_session_name(session, sizeof session, "s");
  pid_t pids[T_MAX_RANKS];
  t_rank_exit ex[T_MAX_RANKS];
  pid_t parent = getpid();
  fflush(NULL);
  for (int r = 0; r < size; r++) {
    ex[r] = (t_rank_exit){-1, 0, 0};
    pid_t pid = fork();
    if (pid < 0) {
      int err = errno;
      for (int q = 0; q < r; q++) kill(pids[q], SIGKILL);
      for (int q = 0; q < r; q++) waitpid(pids[q], NULL, 0);
      T_FAIL("fork of rank %d: %s", r, strerror(err));
    }
    if (pid == 0) child_main(r, size, parent, session, fn, arg);
    pids[r] = pid;
  }
  if (opts && opts->after_fork) opts->after_fork(arg);

  double start = t_now(), deadline = start + timeout_s;
  int left = size, bad = 0;
  while (left > 0) {
    bool reaped = false;
    for (int r = 0; r < size; r++) {
      if (ex[r].code != -1 || ex[r].timed_out) continue;
      int status;
      pid_t w = waitpid(pids[r], &status, WNOHANG);
      if (w != pids[r]) continue;
      reaped = true;
      left--;
      if (WIFSIGNALED(status)) {
        ex[r].signal = WTERMSIG(status);
        ex[r].code = 128 + ex[r].signal;
      } else {
        ex[r].code = WEXITSTATUS(status);
      }
      if (ex[r].code != 0) {
        bad++;
        describe(r, pids[r], &ex[r], timeout_s, what);
        /* the others are likely blocked on the failed rank: bound their wait */
        if (grace_s > 0 && t_now() + grace_s < deadline) deadline = t_now() + grace_s;
      }
    }
    if (reaped) continue;
    if (t_now() > deadline) {
      for (int r = 0; r < size; r++)
        if (ex[r].code == -1) {
          ex[r].timed_out = 1;
          bad++;
          describe(r, pids[r], &ex[r], t_now() - start, what);
          kill(pids[r], SIGKILL);
        }
      for (int r = 0; r < size; r++)
        if (ex[r].timed_out) {
          int status;
          waitpid(pids[r], &status, 0); /* SIGKILL cannot be ignored: bounded */
          ex[r].signal = SIGKILL;
          ex[r].code = 128 + SIGKILL;
        }
      break;
    }
    sleep_ms(2);
  }
  if (exits)
    for (int r = 0; r < size; r++) exits[r] = ex[r];
  return bad;
}

int t_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  T_ASSERT(fd >= 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  T_ASSERT(bind(fd, (struct sockaddr*)&a, sizeof a) == 0);
  socklen_t len = sizeof a;
  T_ASSERT(getsockname(fd, (struct sockaddr*)&a, &len) == 0);
  close(fd);
  return ntohs(a.sin_port);
}

void t_write_loopback_hostfile(const char* path, int n) {
  T_ASSERT(n >= 1 && n <= T_MAX_RANKS);
  int ports[T_MAX_RANKS];
  char buf[40 * T_MAX_RANKS];
  size_t o = (size_t)snprintf(buf, sizeof buf, "[");
  for (int r = 0; r < n; r++) {
    bool dup;
    do {
      ports[r] = t_free_port();
      dup = false;
      for (int q = 0; q < r; q++) dup = dup || ports[q] == ports[r];
    } while (dup);
    o += (size_t)snprintf(buf + o, sizeof buf - o, "%s[\"127.0.0.1:%d\"]", r ? ", " : "", ports[r]);
  }
  snprintf(buf + o, sizeof buf - o, "]");
  FILE* f = fopen(path, "w");
  T_ASSERT(f && fputs(buf, f) >= 0 && fclose(f) == 0);
}

void t_mark(const char* dir, const char* name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  T_REQUIREF(fd >= 0, "cannot create the mark %s", path);
  close(fd);
}

void t_wait_mark(const char* dir, const char* name, double limit_s) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  double until = t_now() + limit_s;
  while (access(path, F_OK) != 0) {
    T_REQUIREF(t_now() < until, "%s not reached within %g s", name, limit_s);
    usleep(10000); /* the poll's step */
  }
}

void t_job_marks_dir(char* out, size_t n) {
  const char* ns = getenv("PMIX_NAMESPACE");
  if (!ns || !*ns) ns = getenv("OMPI_MCA_ess_base_jobid");
  char job[128];
  if (ns && *ns) {
    snprintf(job, sizeof job, "%s", ns);
  } else if (getenv("SLURM_JOB_ID")) {
    const char* step = getenv("SLURM_STEPID");
    snprintf(job, sizeof job, "%s.%s", getenv("SLURM_JOB_ID"), step ? step : "0");
  } else {
    snprintf(job, sizeof job, "ppid%ld", (long)getppid());
  }
  for (char* c = job; *c; c++)
    if (*c == '/') *c = '_';
  snprintf(out, n, "/tmp/mlxdist-marks-%ld-%s", (long)getuid(), job);
  T_REQUIREF(mkdir(out, 0700) == 0 || errno == EEXIST, "cannot make %s", out);
}

void t_job_marks_remove(const char* dir, ...) {
  va_list ap;
  va_start(ap, dir);
  char path[512];
  for (const char* m = va_arg(ap, const char*); m; m = va_arg(ap, const char*)) {
    snprintf(path, sizeof path, "%s/%s", dir, m);
    unlink(path);
  }
  va_end(ap);
  rmdir(dir);
}

void t_wait_until(bool (*cond)(long), long arg, const char* what, double limit_s) {
  double end = t_now() + limit_s;
  while (!cond(arg)) {
    T_REQUIREF(t_now() < end, "%s: not within %g s", what, limit_s);
    usleep(1000); /* the poll's step */
  }
}

void t_wait_count(atomic_int* c, int n, const char* what, double limit_s) {
  double end = t_now() + limit_s;
  while (atomic_load(c) < n) {
    T_REQUIREF(t_now() < end, "%s: %d of %d after %g s", what, atomic_load(c), n, limit_s);
    usleep(1000); /* the poll's step */
  }
}

/* The state letter of a /proc/.../stat file ('?' when it cannot be read). */
static char proc_state(const char* path) {
  char buf[512];
  FILE* f = fopen(path, "r");
  if (!f) return '?';
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char* p = strrchr(buf, ')');
  return p && p[1] == ' ' ? p[2] : '?';
}

bool t_pid_gone(long pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  char st = proc_state(path);
  return st == 'Z' || st == 'X' || st == '?';
}

bool t_thread_asleep(long tid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/task/%ld/stat", tid);
  return proc_state(path) == 'S';
}
