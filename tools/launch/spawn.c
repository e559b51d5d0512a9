/* mlxdist-launch: making the children's processes. What each child of a job
 * is started with: the open-file limit it inherits (launch_nofile), the
 * check that the host's process and thread limits hold the job (launch_procs), the
 * signals the launcher takes through a signalfd and gives back to the
 * children (launch_block_signals), the environment with MLX_RANK's slot and
 * the gate, the process attributes, and posix_spawn of the program or of its
 * ssh command. The children's pipes and what happens to them after: supervise.c. */
#include <errno.h>
#include <signal.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "launch.h"

/* ---- the open-file limit ---- */

#define LAUNCH_NOFILE_SLACK 64L       /* the launcher's own: std streams, signalfd, files */
#define LAUNCH_NOFILE_RANK_SLACK 256L /* a rank's own besides one per peer connection */

int launch_nofile(int ranks, int conns) {
  struct rlimit rl;
  if (ranks <= 0 || getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  long mine = (3L + (conns > 0 ? conns : 0)) * ranks + LAUNCH_NOFILE_SLACK;
  long theirs = (1L + (conns > 0 ? conns : 1)) * ranks + LAUNCH_NOFILE_RANK_SLACK;
  rlim_t want = (rlim_t)(mine > theirs ? mine : theirs);
  if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < (rlim_t)mine) {
    launch_msg(
        "%d ranks need about %ld open files in the launcher (pipes and ports), but the hard "
        "limit RLIMIT_NOFILE is %llu (ulimit -Hn); raise it (limits.conf nofile, systemd's "
        "LimitNOFILE=, or ulimit -Hn as root) or start fewer ranks.",
        ranks, mine, (unsigned long long)rl.rlim_max);
    return -1;
  }
  if (rl.rlim_max != RLIM_INFINITY && want > rl.rlim_max) want = rl.rlim_max;
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < want) {
    rl.rlim_cur = want;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
      launch_msg("cannot raise the open-file limit (RLIMIT_NOFILE) to %llu for %d ranks: %s.",
                 (unsigned long long)want, ranks, strerror(errno));
      return -1;
    }
  }
  return 0;
}

/* ---- processes and threads ---- */

#define LAUNCH_THREADS_PER_RANK 3L /* main, the stream's worker, the watchdog (docs/scale.md) */
#define LAUNCH_TASK_SLACK 64L      /* the launcher's own, and a rank's short-lived helpers */

/* The first decimal number in file path (-1: unreadable, none, or "max"). */
static long file_long(const char* path) {
  FILE* f = fopen(path, "re");
  if (!f) return -1;
  char buf[64] = "";
  bool got = fgets(buf, sizeof buf, f) != NULL;
  fclose(f);
  char* end = NULL;
  errno = 0;
  long v = got ? strtol(buf, &end, 10) : -1;
  return got && end != buf && !errno && v >= 0 ? v : -1;
}

/* Tasks (threads) on the system now: /proc/loadavg's "running/total". -1: unknown. */
static long tasks_now(void) {
  FILE* f = fopen("/proc/loadavg", "re");
  if (!f) return -1;
  long total = -1;
  if (fscanf(f, "%*s %*s %*s %*d/%ld", &total) != 1) total = -1;
  fclose(f);
  return total;
}

/* This process's cgroup (v2) directory under /sys/fs/cgroup into dir; false if none. */
static bool cgroup_dir(char* dir, size_t n) {
  FILE* f = fopen("/proc/self/cgroup", "re");
  if (!f) return false;
  char line[512];
  bool ok = false;
  while (!ok && fgets(line, sizeof line, f)) {
    if (strncmp(line, "0::", 3) != 0) continue;
    line[strcspn(line, "\n")] = '\0';
    int w = snprintf(dir, n, "/sys/fs/cgroup%s", line + 3);
    ok = w > 0 && (size_t)w < n && !strstr(line, "..");
  }
  fclose(f);
  return ok;
}

int launch_procs(int ranks) {
  if (ranks <= 1) return 0;
  long need = LAUNCH_THREADS_PER_RANK * ranks + LAUNCH_TASK_SLACK;
  long now = tasks_now();
  const char* what = NULL;
  long left = 0;
  char hint[480] = "";
  long pid_max = file_long("/proc/sys/kernel/pid_max");
  long threads_max = file_long("/proc/sys/kernel/threads-max");
  if (now >= 0 && pid_max >= 0 && pid_max - now < need) {
    what = "kernel.pid_max";
    left = pid_max - now;
    snprintf(hint, sizeof hint, "sysctl -w kernel.pid_max=%ld", now + need + 4096);
  } else if (now >= 0 && threads_max >= 0 && threads_max - now < need) {
    what = "kernel.threads-max";
    left = threads_max - now;
    snprintf(hint, sizeof hint, "sysctl -w kernel.threads-max=%ld", now + need + 4096);
  }
  char dir[400], path[440];
  if (!what && cgroup_dir(dir, sizeof dir)) {
    snprintf(path, sizeof path, "%s/pids.max", dir);
    long max = file_long(path); /* -1: "max", no limit */
    snprintf(path, sizeof path, "%s/pids.current", dir);
    long cur = file_long(path);
    if (max >= 0 && cur >= 0 && max - cur < need) {
      what = "the cgroup's pids.max";
      left = max - cur;
      snprintf(hint, sizeof hint, "%.400s/pids.max, or systemd's TasksMax=", dir);
    }
  }
  struct rlimit rl;
  if (!what && geteuid() != 0 && getrlimit(RLIMIT_NPROC, &rl) == 0 &&
      rl.rlim_cur != RLIM_INFINITY && (long)rl.rlim_cur < need) {
    /* (the user's other processes count too: this is the most the job could have) */
    what = "RLIMIT_NPROC";
    left = (long)rl.rlim_cur;
    snprintf(hint, sizeof hint, "ulimit -u, or limits.conf nproc");
  }
  if (!what) return 0;
  launch_msg(
      "%d ranks need about %ld processes and threads (%ld a rank), but %s leaves room "
      "for %ld; raise it (%s) or start fewer ranks.",
      ranks, need, LAUNCH_THREADS_PER_RANK, what, left > 0 ? left : 0, hint);
  return -1;
}

/* ---- signals ---- */

static sigset_t old_mask; /* restored in the children */

int launch_block_signals(void) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  if (sigprocmask(SIG_BLOCK, &set, &old_mask) != 0) return -1;
  signal(SIGPIPE, SIG_IGN);
  return signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
}

/* ---- starting a child ---- */

extern char** environ;

/* name=... of kv in envp[0..n): its index, -1 if absent. */
static int env_find(char* const* envp, int n, const char* kv) {
  size_t nl = strcspn(kv, "=");
  for (int i = 0; i < n; i++)
    if (strncmp(envp[i], kv, nl) == 0 && envp[i][nl] == '=') return i;
  return -1;
}

/* envp[n] = kv, or in place of the variable of the same name; returns its index. */
static int env_put(char** envp, int* n, const char* kv) {
  int i = env_find(envp, *n, kv);
  if (i < 0) i = (*n)++;
  envp[i] = (char*)kv;
  envp[*n] = NULL;
  return i;
}

#define GATE_ENV "MLXDIST_LAUNCH_GATE="

int launch_spawn_env_make(launch_spawn_env* se, const launch_spawn* sp, bool ranks) {
  int n = 0, ne = 0;
  while (environ && environ[ne]) ne++;
  se->rank_slot = -1;
  se->envp = malloc((size_t)(ne + sp->n_env + 4) * sizeof *se->envp);
  if (!se->envp) return -1;
  for (int i = 0; i < ne; i++)
    if (strchr(environ[i], '=') && strncmp(environ[i], GATE_ENV, strlen(GATE_ENV)) != 0)
      se->envp[n++] = environ[i];
  se->envp[n] = NULL;
  if (ranks) {
    se->rank_slot = env_put(se->envp, &n, "MLX_RANK=");
    /* the record on SIGUSR1; the user's value wins */
    if (env_find(se->envp, n, "MLXDIST_DUMP_SIGNAL=") < 0)
      env_put(se->envp, &n, "MLXDIST_DUMP_SIGNAL=1");
  }
  for (int i = 0; i < sp->n_env; i++) {
    if (!strchr(sp->set_env[i], '=') || strncmp(sp->set_env[i], GATE_ENV, strlen(GATE_ENV)) == 0)
      continue;
    int at = env_put(se->envp, &n, sp->set_env[i]);
    if (at == se->rank_slot) se->rank_slot = -1;
  }
  if (ranks && se->gate >= 0) {
    struct stat sb;
    if (fstat(se->gate, &sb) != 0) return -1;
    snprintf(se->gate_kv, sizeof se->gate_kv, GATE_ENV "%d:%llu", se->gate,
             (unsigned long long)sb.st_ino);
    env_put(se->envp, &n, se->gate_kv);
  }
  /* like a shell's child: its own group, the signals the launcher ignores or blocks as they
   * were before it */
  sigset_t def;
  sigemptyset(&def);
  sigaddset(&def, SIGPIPE);
  sigaddset(&def, SIGINT);
  sigaddset(&def, SIGTERM);
  int e = posix_spawnattr_init(&se->attr);
  if (e == 0) {
    se->attr_ok = true;
    e = posix_spawnattr_setflags(&se->attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF |
                                                POSIX_SPAWN_SETSIGMASK);
  }
  if (e == 0) e = posix_spawnattr_setpgroup(&se->attr, 0);
  if (e == 0) e = posix_spawnattr_setsigdefault(&se->attr, &def);
  if (e == 0) e = posix_spawnattr_setsigmask(&se->attr, &old_mask);
  if (e != 0) {
    errno = e;
    return -1;
  }
  return 0;
}

void launch_spawn_env_free(launch_spawn_env* se) {
  free(se->envp);
  se->envp = NULL;
  if (se->attr_ok) posix_spawnattr_destroy(&se->attr);
  se->attr_ok = false;
}

/* argv[0], a file without "#!" that the kernel cannot run, run by /bin/sh (what execvp did). */
static int spawn_sh(pid_t* pid, const posix_spawn_file_actions_t* fa, launch_spawn_env* se,
                    char* const* argv) {
  int n = 0;
  while (argv[n]) n++;
  char** sh = malloc((size_t)(n + 2) * sizeof *sh);
  if (!sh) return ENOMEM;
  sh[0] = (char*)"/bin/sh";
  for (int i = 0; i <= n; i++) sh[i + 1] = argv[i];
  int e = posix_spawn(pid, "/bin/sh", fa, &se->attr, sh, se->envp);
  free(sh);
  return e;
}

int launch_spawn_child(const launch_spawn* sp, launch_spawn_env* se, int rank, int out_fd,
                       int err_fd, int in_fd, pid_t* pid) {
  posix_spawn_file_actions_t fa;
  int e = posix_spawn_file_actions_init(&fa);
  if (e != 0) return e;
  e = posix_spawn_file_actions_adddup2(&fa, out_fd, 1);
  if (e == 0) e = posix_spawn_file_actions_adddup2(&fa, err_fd, 2);
  if (e == 0 && in_fd >= 0) e = posix_spawn_file_actions_adddup2(&fa, in_fd, 0);
  char** argv = rank >= 0 && sp->rank_argv && sp->rank_argv[rank] ? sp->rank_argv[rank] : sp->argv;
  if (e == 0 && argv != sp->argv && se->gate >= 0)
    e = posix_spawn_file_actions_addclose(&fa, se->gate);
  if (e == 0) {
    if (argv != sp->argv) { /* ssh: the rank's variables travel in its script, not here */
      e = posix_spawnp(pid, argv[0], &fa, &se->attr, argv, environ);
    } else {
      if (rank >= 0 && se->rank_slot >= 0) {
        snprintf(se->rank_kv, sizeof se->rank_kv, "MLX_RANK=%d", rank);
        se->envp[se->rank_slot] = se->rank_kv; /* read by the child before posix_spawn returns */
      }
      e = posix_spawnp(pid, sp->argv[0], &fa, &se->attr, sp->argv, se->envp);
      if (e == ENOEXEC && strchr(sp->argv[0], '/')) /* a script without #!: sh, as execvp did */
        e = spawn_sh(pid, &fa, se, sp->argv);
    }
  }
  posix_spawn_file_actions_destroy(&fa);
  return e;
}

bool launch_spawn_program_error(int e) {
  return e != EAGAIN && e != ENOMEM && e != EMFILE && e != ENFILE && e != ENOSPC;
}

int launch_spawn_cannot_run(const launch_spawn* sp, int rank, int e) {
  if (rank >= 0 && sp->rank_argv && sp->rank_argv[rank]) {
    launch_msg("rank %d: cannot run the ssh command '%s': %s.", rank, sp->rank_argv[rank][0],
               strerror(e));
    return 255;
  }
  if (rank >= 0)
    launch_msg("rank %d: cannot run '%s': %s.", rank, sp->argv[0], strerror(e));
  else
    launch_msg("cannot run '%s': %s.", sp->argv[0], strerror(e));
  return e == ENOENT ? 127 : 126;
}
