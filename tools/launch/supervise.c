/* mlxdist-launch: the children and their supervision (their processes are
 * made by spawn.c).
 *
 * Each child leads its own process group (so a stop reaches what it started)
 * and writes into two pipes relayed line by line (relay.c). One epoll loop
 * waits on those pipes and on a signalfd for SIGCHLD and the user's signals:
 * the first child to fail stops the others (SIGTERM, then SIGKILL after
 * LAUNCH_GRACE_S) and gives the exit status; --timeout does the same and
 * exits 124; SIGINT/SIGTERM/SIGHUP are forwarded, a second one kills.
 *
 * Where everyone is (docs/troubleshooting.md): the ranks it starts itself
 * (launch_ranks: ring and jaccl, not mpirun's) get
 * MLXDIST_DUMP_SIGNAL=1 (unless the user set it), so an mlxdist rank with a
 * group prints its operation record on SIGUSR1. When --timeout expires the
 * launcher sends SIGUSR1 to every rank that catches it, relays the records
 * for LAUNCH_DUMP_WAIT_S, then stops the job and prints the records side by
 * side (watch.c). While the job runs it checks every LAUNCH_CHECK_S whether
 * a rank is stopped (state T in /proc/<pid>/stat: SIGSTOP, a debugger, ^Z)
 * and reports one stopped for LAUNCH_STOPPED_S, with the others' records;
 * a rank's long-wait warning (it prints its record) brings the table too.
 * On a failure the summary at the end names the first rank that failed and
 * its message before the cascade it caused.
 *
 * Across hosts (across.c) a remote rank is its ssh client: its stdin is a
 * pipe the launcher writes the token into and holds open; closing it (every
 * stop closes them all first) makes the rank's script on the host stop the
 * program (remote.c), and the SIGTERM/SIGKILL to the ssh client ends the
 * connection in a bounded time even when the host is gone. Its exit status
 * is read the ssh way: 255 before its script said it started is ssh's own
 * failure ("cannot reach host"), 127 a program missing on the host, 129..192
 * the program killed by a signal.
 * The record table and SIGUSR1 dump stay local: remote ranks are left out. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launch.h"
#include "util/clock.h"

#define LAUNCH_CHECK_S 0.5        /* how often /proc is read for stopped ranks */
#define LAUNCH_CHECK_MAX 128      /* ranks read per look: the others at the next (1,024: 4 s) */
#define LAUNCH_SETTLE_S 0.5       /* from the first failure to stopping the others */
#define LAUNCH_TABLE_EVERY_S 30.0 /* at most one table for warnings this often */
#define LAUNCH_RDV_CHECK_S 0.25   /* how often sp->failed is asked */
#define LAUNCH_REMOTE_SLACK_S 1.0 /* ssh: after the host's own grace, before SIGTERM, SIGKILL */

struct run;

typedef struct child {
  pid_t pid;
  bool alive;
  char prefix[300];
  int in_fd;        /* an ssh rank's stdin (held open until the job stops), -1 if none */
  bool remote;      /* started over ssh: its exit status is read the ssh way */
  bool started;     /* its script on the host said it started (LAUNCH_STARTED_LINE) */
  const char* host; /* NULL: this host, unnamed */
  launch_relay out, err;
  launch_view view; /* from its stderr and /proc (watch.c) */
  int code;         /* the launcher's code for its end (0: success) */
  bool by_us;       /* it ended after the launcher began to stop the job */
  bool deferred;    /* a remote rank that failed on its own: maybe not the cause (see defer) */
  double failed_at; /* when a deferred rank's end was seen */
  char how[LAUNCH_VIEW_LINE + 160]; /* a deferred rank's end, as child_exited described it */
  struct run* rn;
} child;

typedef struct run {
  child* kids;
  int n;
  int alive;
  int sfd; /* the signalfd */
  const launch_spawn* sp;
  double start_deadline;                 /* sp->started must hold by then (0: no bound) */
  double remote_term_at, remote_kill_at; /* ssh clients still there then get these (0: none) */
  double rdv_check_at;                   /* the next sp->failed() (0: none) */
  bool name_ranks;                       /* launch_ranks: messages name the rank that failed */
  int first_fail_rank;                   /* -1: none yet */
  int first_fail_code;
  bool stopping; /* SIGTERM (or the user's signal) sent */
  bool killed;   /* SIGKILL sent */
  double kill_at;
  int interrupted; /* signal forwarded from the user, 0 if none */
  double timeout;  /* 0: none */
  double deadline; /* mlxd_now() when the timeout expires; 0: none */
  bool timed_out;
  double drain_until;                     /* 0 until every child is gone */
  char first_how[LAUNCH_VIEW_LINE + 160]; /* how the first failing rank ended */
  double stop_at;         /* stop the job then (0: none): after the records, after a failure */
  double defer_until;     /* name the first failure then, if none was clear sooner (0: none) */
  double table_at;        /* print the table then (0: none) */
  double table_last;      /* when the last table for a stall or warning was printed */
  double next_check;      /* the next look at /proc */
  int check_from;         /* the first rank that look reads (LAUNCH_CHECK_MAX at a time) */
  int epfd;               /* epoll: the signalfd (data.ptr NULL) and every open pipe (its relay) */
  struct epoll_event* ev; /* epoll_wait's batch, LAUNCH_EVENTS */
  int* by_pid;            /* open addressing, pid_cap slots: child index + 1 by pid (0: empty) */
  int pid_cap;
} run;

#define LAUNCH_EVENTS 256 /* events taken per epoll_wait */

/* ---- which child a pid is: O(1), so reaping N children costs O(N) ---- */

static unsigned pid_hash(const run* rn, pid_t pid) {
  return ((unsigned)pid * 2654435761u) & (unsigned)(rn->pid_cap - 1);
}

static void pid_put(run* rn, pid_t pid, int i) {
  unsigned h = pid_hash(rn, pid);
  while (rn->by_pid[h] != 0) h = (h + 1) & (unsigned)(rn->pid_cap - 1);
  rn->by_pid[h] = i + 1;
}

/* The index of the live child with this pid, -1 if none. */
static int pid_find(const run* rn, pid_t pid) {
  unsigned h = pid_hash(rn, pid);
  for (int k = 0; k < rn->pid_cap && rn->by_pid[h] != 0; k++) {
    int i = rn->by_pid[h] - 1;
    if (rn->kids[i].pid == pid && rn->kids[i].alive) return i;
    h = (h + 1) & (unsigned)(rn->pid_cap - 1);
  }
  return -1;
}

/* A started child's pipes into the epoll set; -1 with errno. */
static int watch_child(run* rn, child* c) {
  launch_relay* rs[2] = {&c->out, &c->err};
  pid_put(rn, c->pid, (int)(c - rn->kids));
  for (int j = 0; j < 2; j++) {
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = rs[j]};
    if (epoll_ctl(rn->epfd, EPOLL_CTL_ADD, rs[j]->fd, &e) != 0) return -1;
    rs[j]->epfd = rn->epfd;
  }
  return 0;
}

/* ---- signals to the ranks ---- */

enum { ALL, LOCAL, REMOTE }; /* which ranks a signal is for */

static void signal_all_of(run* rn, int sig, int which) {
  for (int i = 0; i < rn->n; i++) {
    pid_t pid = rn->kids[i].pid;
    if (pid <= 0 || (which == LOCAL && rn->kids[i].remote) ||
        (which == REMOTE && !rn->kids[i].remote))
      continue;
    /* Each rank leads its own process group: reach its children too. A dead
     * rank's group may still hold orphans; its id cannot be reused meanwhile. */
    if (kill(-pid, sig) != 0 && rn->kids[i].alive) kill(pid, sig);
  }
}

static void signal_all(run* rn, int sig) { signal_all_of(rn, sig, ALL); }

/* The end of every ssh rank's stdin: its script on the host stops it. */
static void close_stdins(run* rn) {
  for (int i = 0; i < rn->n; i++)
    if (rn->kids[i].in_fd >= 0) {
      close(rn->kids[i].in_fd);
      rn->kids[i].in_fd = -1;
    }
}

/* The ssh ranks: their stdin ends now, so that their scripts stop the
 * programs on the hosts (SIGTERM, SIGKILL after the grace) and ssh exits
 * once they are gone; an ssh client still there after that (a host that
 * vanished) gets SIGTERM, then SIGKILL. */
static void stop_remote(run* rn, double now) {
  close_stdins(rn);
  bool any = false;
  for (int i = 0; i < rn->n; i++) any = any || (rn->kids[i].remote && rn->kids[i].alive);
  if (!any || rn->remote_term_at > 0) return;
  rn->remote_term_at = now + LAUNCH_GRACE_S + LAUNCH_REMOTE_SLACK_S;
  rn->remote_kill_at = rn->remote_term_at + LAUNCH_REMOTE_SLACK_S;
}

static void begin_stop(run* rn) {
  if (rn->stopping) return;
  rn->stopping = true;
  double now = mlxd_now();
  stop_remote(rn, now);
  rn->kill_at = now + LAUNCH_GRACE_S;
  signal_all_of(rn, SIGTERM, LOCAL);
  signal_all_of(rn, SIGCONT, LOCAL); /* a stopped rank acts on SIGTERM only once continued */
}

static void close_pair(int p[2]) {
  close(p[0]);
  close(p[1]);
}

/* Ask every live rank that catches SIGUSR1 for its record (the signal's
 * default would kill a rank that does not). Returns how many were asked. */
static int request_records(run* rn, int except) {
  int asked = 0;
  for (int i = 0; i < rn->n; i++) {
    child* c = &rn->kids[i];
    if (i == except || !c->alive || c->remote || c->view.stopped || !launch_catches_sigusr1(c->pid))
      continue;
    if (kill(c->pid, SIGUSR1) == 0) asked++;
  }
  return asked;
}

/* A rank's stderr line: remember what it says; a rank's long-wait warning
 * (it comes with its record) asks the others for theirs, for the table. */
static void on_err_line(void* ctx, const char* line, size_t len) {
  child* c = ctx;
  run* rn = c->rn;
  launch_view_line(&c->view, line, len);
  if (!rn || !rn->name_ranks || rn->stopping || rn->stop_at > 0 || rn->table_at > 0) return;
  if (!c->view.has_record || strcmp(c->view.why, "warning") != 0 ||
      c->view.record_at < mlxd_now() - 0.5)
    return;
  double now = mlxd_now();
  if (rn->table_last > 0 && now - rn->table_last < LAUNCH_TABLE_EVERY_S) return;
  snprintf(c->view.why, sizeof c->view.why, "warning seen");
  request_records(rn, (int)(c - rn->kids));
  rn->table_at = now + LAUNCH_DUMP_WAIT_S;
}

/* Spawn one child with its output relayed; -1 with errno on failure, *cannot_run set when
 * the error is the program's (launch_spawn_program_error: it cannot run) rather than the system's. */
static int start_child(const launch_spawn* sp, launch_spawn_env* se, child* c, int rank,
                       bool* cannot_run) {
  int po[2], pe[2], pi[2] = {-1, -1};
  const char* in = rank >= 0 && sp->rank_stdin ? sp->rank_stdin[rank] : NULL;
  c->in_fd = -1;
  if (pipe2(po, O_CLOEXEC) != 0) return -1;
  if (pipe2(pe, O_CLOEXEC) != 0) {
    int e = errno;
    close_pair(po);
    errno = e;
    return -1;
  }
  if (in && pipe2(pi, O_CLOEXEC) != 0) {
    int e = errno;
    close_pair(po);
    close_pair(pe);
    errno = e;
    return -1;
  }
  *cannot_run = false;
  pid_t pid = -1;
  int e = launch_spawn_child(sp, se, rank, po[1], pe[1], pi[0], &pid);
  if (e != 0) {
    close_pair(po);
    close_pair(pe);
    if (in) close_pair(pi);
    *cannot_run = launch_spawn_program_error(e);
    errno = e;
    return -1;
  }
  close(po[1]);
  close(pe[1]);
  if (in) {
    close(pi[0]);
    /* into an empty pipe, never blocking: a few bytes (the token, the secret), or jaccl's
     * device matrix, for which the pipe is grown first (Linux: up to pipe-max-size) */
    size_t len = strlen(in);
    if (len > 4096) fcntl(pi[1], F_SETPIPE_SZ, (int)(len < (1u << 30) ? len : (1u << 30)));
    fcntl(pi[1], F_SETFL, fcntl(pi[1], F_GETFL) | O_NONBLOCK);
    ssize_t put = write(pi[1], in, len);
    c->in_fd = pi[1];
    if (put >= 0 && (size_t)put < len) { /* the pipe cannot hold it: its end stops the rank */
      launch_msg(
          "rank %d: %zu bytes for its stdin, but the pipe to its ssh holds %zd; it will "
          "fail (is /proc/sys/fs/pipe-max-size smaller?).",
          rank, len, put);
      close(pi[1]);
      c->in_fd = -1;
    }
    c->remote = true;
  }
  if (rank >= 0 && sp->rank_host) c->host = sp->rank_host[rank];
  fcntl(po[0], F_SETFL, O_NONBLOCK); /* a pipe's read end: O_RDONLY, nothing else to keep */
  fcntl(pe[0], F_SETFL, O_NONBLOCK);
  c->pid = pid;
  c->alive = true;
  c->out = (launch_relay){.fd = po[0], .out_fd = 1, .prefix = c->prefix};
  c->err = (launch_relay){
      .fd = pe[0], .out_fd = 2, .prefix = c->prefix, .on_line = on_err_line, .ctx = c};
  if (c->remote) {
    c->err.swallow = LAUNCH_STARTED_LINE;
    c->err.swallowed = &c->started;
  }
  return 0;
}

/* ---- what happened to the children ---- */

/* The launcher's code for a wait status (128+signal when killed), described in how. */
static int exit_code(int st, char* how, size_t n) {
  if (WIFEXITED(st)) {
    snprintf(how, n, "exited with status %d", WEXITSTATUS(st));
    return WEXITSTATUS(st);
  }
  if (WIFSIGNALED(st)) {
    snprintf(how, n, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    return 128 + WTERMSIG(st);
  }
  snprintf(how, n, "stopped");
  return 0;
}

/* Read what the child left in its stderr pipe, so that its last line is known. */
static void drain_err(child* c) {
  for (int k = 0; k < 256 && c->err.fd >= 0; k++) {
    struct pollfd p = {.fd = c->err.fd, .events = POLLIN};
    if (poll(&p, 1, 0) <= 0) break;
    launch_relay_read(&c->err);
  }
}

/* How a remote rank ended, read the ssh way (see the top of this file). */
static int remote_code(child* c, int i, int st, char* how, size_t n) {
  drain_err(c); /* its last line, and whether its script said it started */
  char what[96];
  int code = exit_code(st, what, sizeof what);
  snprintf(how, n, "%s", what);
  if (!WIFEXITED(st)) {
    snprintf(how, n, "(its ssh client) %s", what);
    return code;
  }
  char last[LAUNCH_VIEW_LINE];
  snprintf(last, sizeof last, "%s", c->view.last_line);
  last[strcspn(last, "\r\n")] = '\0';
  if (code == 255 && !c->started) /* ssh's own failure: its script never ran */
    snprintf(how, n, "cannot reach host %s over ssh: %s (rank %d)", c->host,
             last[0] ? last : "ssh exited with status 255", i);
  else if (code == 127)
    snprintf(how, n, "program not found on host %s (rank %d): %s", c->host, i,
             last[0] ? last : "exit status 127");
  else if (code > 128 && code <= 128 + 64)
    snprintf(how, n, "was killed by signal %d (%s)", code - 128, strsignal(code - 128));
  return code;
}

static void first_failure(run* rn, int i, int code, const char* how, bool whole);

static void child_exited(run* rn, int i, int st) {
  child* c = &rn->kids[i];
  rn->kids[i].alive = false;
  rn->alive--;
  if (c->in_fd >= 0) {
    close(c->in_fd);
    c->in_fd = -1;
  }
  char how[LAUNCH_VIEW_LINE + 160];
  int code = c->remote ? remote_code(c, i, st, how, sizeof how) : exit_code(st, how, sizeof how);
  rn->kids[i].code = code;
  rn->kids[i].by_us = rn->stopping;
  if (code == 0 || rn->first_fail_rank >= 0) return;
  bool whole = c->remote && WIFEXITED(st) && (code == 127 || (code == 255 && !c->started));
  if (!rn->stopping && rn->name_ranks && c->remote && WIFEXITED(st) && !whole &&
      !(code > 128 && code <= 128 + 64)) {
    /* Over ssh, the order in which exits are seen is not the order they
     * happened in: a survivor that saw its peer's connection drop can exit,
     * and its ssh report it, before the killed rank's ssh does. A remote rank
     * that exited with a status of its own is named only if nothing more
     * telling (a signal, an unreachable host, a missing program) turns up
     * within LAUNCH_SETTLE_S. */
    c->deferred = true;
    c->failed_at = mlxd_now();
    snprintf(c->how, sizeof c->how, "%s", how);
    if (rn->defer_until == 0) rn->defer_until = c->failed_at + LAUNCH_SETTLE_S;
    return;
  }
  first_failure(rn, i, code, how, whole);
}

/* The deferred failures settle: name the earliest, unless one was named since. */
static void settle_deferred(run* rn) {
  rn->defer_until = 0;
  int j = -1;
  for (int i = 0; i < rn->n; i++)
    if (rn->kids[i].deferred && (j < 0 || rn->kids[i].failed_at < rn->kids[j].failed_at)) j = i;
  if (j < 0 || rn->first_fail_rank >= 0) return;
  first_failure(rn, j, rn->kids[j].code, rn->kids[j].how, false);
}

static void first_failure(run* rn, int i, int code, const char* how, bool whole) {
  child* c = &rn->kids[i];
  rn->first_fail_rank = i;
  rn->first_fail_code = code;
  snprintf(rn->first_how, sizeof rn->first_how, "%s", how);
  if (rn->stopping) return; /* stopped by us (timeout or forwarded signal) */
  if (rn->name_ranks) {
    char who[400];
    if (whole) /* the message names rank and host itself */
      who[0] = '\0';
    else if (c->host)
      snprintf(who, sizeof who, "rank %d on host %s ", i, c->host);
    else
      snprintf(who, sizeof who, "rank %d ", i);
    if (rn->alive > 0)
      launch_msg("%s%s; stopping the other %d rank%s in %.1f s.", who, how, rn->alive,
                 rn->alive == 1 ? "" : "s", LAUNCH_SETTLE_S);
    else
      launch_msg("%s%s.", who, how);
    /* A moment for the others to notice and say what they saw (the summary
     * tells the failures it caused from the ranks the launcher stopped). */
    rn->stop_at = mlxd_now() + LAUNCH_SETTLE_S;
    return;
  }
  begin_stop(rn);
}

/* Reap pid first (0: none), then whatever else has ended. The first
 * SIGCHLD's sender is the first child that ended (later ones merge into the
 * pending signal), so reaping it first keeps "the first rank to fail" right
 * when several ended before the launcher looked. */
static void reap(run* rn, pid_t first) {
  if (first > 0) {
    int st = 0;
    int i = pid_find(rn, first);
    if (i >= 0 && waitpid(first, &st, WNOHANG) == first) child_exited(rn, i, st);
  }
  for (;;) {
    int st = 0;
    pid_t pid = waitpid(-1, &st, WNOHANG);
    if (pid <= 0) return;
    int i = pid_find(rn, pid);
    if (i >= 0) child_exited(rn, i, st);
  }
}

/* The signalfd is readable: forward the user's signals (a second one kills), reap. */
static void on_signals(run* rn) {
  struct signalfd_siginfo si;
  pid_t first = 0;
  while (read(rn->sfd, &si, sizeof si) == (ssize_t)sizeof si) {
    int sig = (int)si.ssi_signo;
    if (sig == SIGCHLD && first == 0) first = (pid_t)si.ssi_pid;
    if (sig == SIGCHLD || rn->alive == 0) continue;
    if (rn->interrupted) {
      rn->killed = true;
      signal_all(rn, SIGKILL);
      continue;
    }
    rn->interrupted = sig;
    if (rn->name_ranks) launch_msg("received %s; forwarding it to the ranks.", strsignal(sig));
    stop_remote(rn, mlxd_now());
    signal_all_of(rn, sig, LOCAL);
    rn->stopping = true;
    rn->kill_at = mlxd_now() + LAUNCH_GRACE_S;
  }
  reap(rn, first);
}

/* ---- the supervision loop ---- */

static void child_views_table(run* rn, const char* title) {
  launch_view* v = calloc((size_t)rn->n, sizeof *v);
  if (!v) return;
  for (int i = 0; i < rn->n; i++) v[i] = rn->kids[i].view;
  launch_view_table(v, rn->n, title);
  free(v);
}

/* Act on the timeout and on the end of the grace period. */
/* Ranks stopped (state T) for LAUNCH_STOPPED_S are reported once per stop. A look
 * reads LAUNCH_CHECK_MAX ranks' /proc/<pid>/stat, round robin: at 1,024 ranks all
 * of them every 0.5 s cost the launcher ~15% of a core that the ranks want. */
static void check_stopped(run* rn, double now) {
  if (now < rn->next_check || rn->stopping || !rn->name_ranks || rn->n <= 0) return;
  rn->next_check = now + LAUNCH_CHECK_S;
  int k = rn->n < LAUNCH_CHECK_MAX ? rn->n : LAUNCH_CHECK_MAX;
  for (int j = 0; j < k; j++) {
    int i = (rn->check_from + j) % rn->n;
    child* c = &rn->kids[i];
    if (!c->alive) continue;
    char s = launch_proc_state(c->pid);
    if (s != 'T' && s != 't') {
      c->view.stopped = c->view.stopped_reported = false;
      c->view.stopped_since = 0;
      continue;
    }
    c->view.stopped = true;
    if (c->view.stopped_since == 0) c->view.stopped_since = now;
    if (c->view.stopped_reported || now - c->view.stopped_since < LAUNCH_STOPPED_S) continue;
    c->view.stopped_reported = true;
    launch_msg(
        "rank %d (pid %ld) is stopped (state %c in /proc/%ld/stat for %.1f s: SIGSTOP, a "
        "debugger or job control); it makes no progress and its peers will fail when "
        "MLXDIST_TIMEOUT finds it silent. Its last record: %s",
        i, (long)c->pid, s, (long)c->pid, now - c->view.stopped_since,
        c->view.has_record ? c->view.note : "none");
    if (rn->table_at == 0 && request_records(rn, i) > 0) rn->table_at = now + LAUNCH_DUMP_WAIT_S;
  }
  rn->check_from = (rn->check_from + k) % rn->n;
}

/* The job cannot start (or rendezvous again): stop it; exit status 1 when no rank failed. */
static void stop_for_start(run* rn, const char* why) {
  launch_msg("%s; stopping the job.", why);
  if (rn->first_fail_rank < 0) {
    rn->first_fail_rank = rn->n; /* none of the ranks: the start */
    rn->first_fail_code = 1;
  }
  begin_stop(rn);
}

static void check_timers(run* rn, double now) {
  if (rn->rdv_check_at > 0 && now >= rn->rdv_check_at) {
    rn->rdv_check_at = rn->stopping ? 0 : now + LAUNCH_RDV_CHECK_S;
    if (!rn->stopping && rn->alive > 0 && rn->sp->failed(rn->sp->started_ctx)) {
      rn->rdv_check_at = rn->start_deadline = 0;
      stop_for_start(rn, "the rendezvous failed (see above)");
    }
  }
  if (rn->start_deadline > 0 && now >= rn->start_deadline) {
    rn->start_deadline = 0;
    if (!rn->stopping && rn->alive > 0 && !rn->sp->started(rn->sp->started_ctx)) {
      char why[128];
      snprintf(why, sizeof why, "the ranks did not all reach the rendezvous within %.0f s",
               rn->sp->start_timeout);
      stop_for_start(rn, why);
    }
  }
  if (rn->deadline > 0 && !rn->timed_out && now >= rn->deadline && rn->alive > 0) {
    rn->timed_out = true;
    int asked = rn->name_ranks ? request_records(rn, -1) : 0;
    launch_msg(
        "timeout: the ranks ran longer than the %g s limit (--timeout or "
        "MLXDIST_LAUNCH_TIMEOUT); %skilling %d rank%s.",
        rn->timeout, asked ? "asking them for their records (SIGUSR1), then " : "", rn->alive,
        rn->alive == 1 ? "" : "s");
    rn->table_at = 0;
    if (asked)
      rn->stop_at = now + LAUNCH_DUMP_WAIT_S;
    else
      begin_stop(rn);
  }
  if (rn->defer_until > 0 && (now >= rn->defer_until || rn->alive == 0)) settle_deferred(rn);
  if (rn->stop_at > 0 && (now >= rn->stop_at || rn->alive == 0)) {
    rn->stop_at = 0;
    begin_stop(rn);
  }
  if (rn->table_at > 0 && now >= rn->table_at) {
    rn->table_at = 0;
    rn->table_last = now;
    child_views_table(rn, "where every rank is (their operation records):");
  }
  check_stopped(rn, now);
  if (rn->stopping && !rn->killed && now >= rn->kill_at && rn->alive > 0) {
    rn->killed = true;
    int local = 0;
    for (int i = 0; i < rn->n; i++) local += rn->kids[i].alive && !rn->kids[i].remote;
    if (rn->name_ranks && local > 0)
      launch_msg("%d rank%s still running %.0f s after SIGTERM; sending SIGKILL.", local,
                 local == 1 ? "" : "s", LAUNCH_GRACE_S);
    signal_all_of(rn, SIGKILL, LOCAL);
  }
  if (rn->remote_term_at > 0 && now >= rn->remote_term_at && rn->alive > 0) {
    rn->remote_term_at = 0;
    for (int i = 0; i < rn->n; i++)
      if (rn->kids[i].remote && rn->kids[i].alive && rn->name_ranks)
        launch_msg(
            "rank %d on host %s: its ssh is still there %.0f s after its stdin ended "
            "(host or link gone?); ending it.",
            i, rn->kids[i].host, LAUNCH_GRACE_S + LAUNCH_REMOTE_SLACK_S);
    signal_all_of(rn, SIGTERM, REMOTE);
  }
  if (rn->remote_kill_at > 0 && now >= rn->remote_kill_at && rn->alive > 0) {
    rn->remote_kill_at = 0;
    signal_all_of(rn, SIGKILL, REMOTE);
  }
}

/* poll()'s timeout: until the next timer, -1 (none) when only events matter. */
static int poll_ms(const run* rn) {
  double wake = -1;
  if (rn->deadline > 0 && !rn->timed_out && rn->alive > 0) wake = rn->deadline;
  if (rn->stopping && !rn->killed && rn->alive > 0 && (wake < 0 || rn->kill_at < wake))
    wake = rn->kill_at;
  if (rn->drain_until > 0 && (wake < 0 || rn->drain_until < wake)) wake = rn->drain_until;
  double more[8] = {rn->stop_at,
                    rn->defer_until,
                    rn->stopping ? 0 : rn->rdv_check_at,
                    rn->table_at,
                    rn->name_ranks && !rn->stopping && rn->alive > 0 ? rn->next_check : 0,
                    rn->start_deadline,
                    rn->alive > 0 ? rn->remote_term_at : 0,
                    rn->alive > 0 ? rn->remote_kill_at : 0};
  for (int i = 0; i < 8; i++)
    if (more[i] > 0 && (wake < 0 || more[i] < wake)) wake = more[i];
  return wake < 0 ? -1 : mlxd_ms_left(wake);
}

/* Wait for output, signals or the next timer, and handle them; -1 when epoll fails.
 * What it costs is what is ready, not the number of ranks. */
static int poll_once(run* rn) {
  int pr = epoll_wait(rn->epfd, rn->ev, LAUNCH_EVENTS, poll_ms(rn));
  if (pr < 0 && errno != EINTR) {
    launch_msg("epoll_wait failed: %s; killing the ranks.", strerror(errno));
    signal_all(rn, SIGKILL);
    return -1;
  }
  bool sig = false;
  /* output first, then the signals: a rank's last lines are read before its end is */
  for (int i = 0; i < pr; i++) {
    if (rn->ev[i].data.ptr)
      launch_relay_read(rn->ev[i].data.ptr); /* a pipe closed meanwhile: fd -1, no-op */
    else
      sig = true;
  }
  if (sig) on_signals(rn);
  return 0;
}

/* True once every child is gone and its pipes are closed, or the drain time
 * for pipes kept open by orphaned grandchildren is over. */
static bool all_done(run* rn, double now) {
  if (rn->alive > 0) return false;
  int open = 0;
  for (int i = 0; i < rn->n; i++) open += (rn->kids[i].out.fd >= 0) + (rn->kids[i].err.fd >= 0);
  if (open == 0) return true;
  if (rn->drain_until == 0) rn->drain_until = now + LAUNCH_DRAIN_S;
  return now >= rn->drain_until;
}

/* Make sure nothing is left running, reap everything, print what is left. */
static void finish(run* rn) {
  close_stdins(rn);
  if (rn->alive > 0) signal_all(rn, SIGKILL);
  while (rn->alive > 0) {
    pid_t pid = waitpid(-1, NULL, 0); /* bounded: every child was sent SIGKILL */
    if (pid < 0 && errno == EINTR) continue;
    if (pid < 0) break;
    int i = pid_find(rn, pid);
    if (i >= 0) {
      rn->kids[i].alive = false;
      rn->alive--;
    }
  }
  for (int i = 0; i < rn->n; i++) {
    launch_relay_finish(&rn->kids[i].out);
    launch_relay_finish(&rn->kids[i].err);
  }
}

/* Run the started children to completion; returns the launcher's exit status. */
static int supervise(run* rn, double timeout) {
  rn->timeout = timeout;
  rn->deadline = timeout > 0 ? mlxd_now() + timeout : 0;
  for (;;) {
    double now = mlxd_now();
    if (all_done(rn, now)) break;
    check_timers(rn, now);
    if (poll_once(rn) != 0) break;
  }
  finish(rn);
  if (rn->defer_until > 0) settle_deferred(rn);
  if (rn->timed_out && rn->name_ranks)
    child_views_table(rn, "where every rank was when the timeout expired (their records):");
  if (!rn->timed_out && !rn->interrupted && rn->first_fail_rank >= 0 &&
      rn->first_fail_rank < rn->n && rn->name_ranks && rn->n > 1) {
    int* codes = calloc((size_t)rn->n, sizeof *codes);
    bool* by_us = calloc((size_t)rn->n, sizeof *by_us);
    launch_view* v = calloc((size_t)rn->n, sizeof *v);
    if (codes && by_us && v) {
      for (int i = 0; i < rn->n; i++) {
        codes[i] = rn->kids[i].code;
        by_us[i] = rn->kids[i].by_us;
        v[i] = rn->kids[i].view;
        if (rn->kids[i].host) { /* the summary names hosts as the user gave them */
          snprintf(v[i].host, sizeof v[i].host, "%s", rn->kids[i].host);
          v[i].has_record = true;
        }
      }
      launch_view_summary(v, rn->n, rn->first_fail_rank, rn->first_how, codes, by_us);
    }
    free(codes);
    free(by_us);
    free(v);
  }
  if (rn->timed_out) return 124;
  if (rn->first_fail_rank >= 0) return rn->first_fail_code;
  if (rn->interrupted) return 128 + rn->interrupted;
  return 0;
}

/* ---- entry points ---- */

static int run_init(run* rn, int n, int sfd, bool name_ranks) {
  *rn = (run){.n = n, .sfd = sfd, .name_ranks = name_ranks, .first_fail_rank = -1, .epfd = -1};
  rn->pid_cap = 16;
  while (rn->pid_cap < 2 * n) rn->pid_cap *= 2;
  rn->kids = calloc((size_t)n, sizeof *rn->kids);
  rn->ev = calloc(LAUNCH_EVENTS, sizeof *rn->ev);
  rn->by_pid = calloc((size_t)rn->pid_cap, sizeof *rn->by_pid);
  if (!rn->kids || !rn->ev || !rn->by_pid) {
    launch_msg("out of memory");
    return -1;
  }
  for (int i = 0; i < n; i++) rn->kids[i].in_fd = -1;
  rn->epfd = epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event e = {.events = EPOLLIN, .data.ptr = NULL};
  if (rn->epfd < 0 || epoll_ctl(rn->epfd, EPOLL_CTL_ADD, sfd, &e) != 0) {
    launch_msg("cannot set up epoll: %s.", strerror(errno));
    return -1;
  }
  return 0;
}

static void run_free(run* rn) {
  if (rn->epfd >= 0) close(rn->epfd);
  free(rn->kids);
  free(rn->ev);
  free(rn->by_pid);
}

/* The ranks are spawned one after the other (posix_spawn: no copy of the launcher's page
 * tables), each with the gate's read end (MLXDIST_LAUNCH_GATE), and the gate opens (one byte,
 * then the launcher's end closed) once all are: the library's init waits for it before it
 * connects (src/distributed/launch_gate.h), so a rank started first does not spend its
 * connect bounds while the launcher, competing with the ranks already started for the CPU,
 * still starts the last of 1,024. A rank that cannot be started stops the others (SIGKILL)
 * and closes the gate without the byte, which fails the init of any that gets there first.
 * A program that never calls init just runs. docs/scale.md, "launcher"; docs/launch.md. */
int launch_ranks(const launch_spawn* sp, int n, int sfd, double timeout) {
  if (launch_nofile(n, 0) != 0) return 1;
  run rn;
  launch_spawn_env se = {.gate = -1};
  int gate[2] = {-1, -1};
  int ok = run_init(&rn, n, sfd, true) == 0; /* said why when not */
  /* the read end moved to an fd of 3 or above (0-2 are the ranks' stdio, and the library
   * takes no gate below 3) without O_CLOEXEC: every local rank inherits it (the ssh ranks
   * close it); the write end close-on-exec from its creation */
  if (ok && n > 1) {
    int rd = -1;
    if (pipe2(gate, O_CLOEXEC) != 0 || (rd = fcntl(gate[0], F_DUPFD, 3)) < 0) {
      launch_msg("cannot prepare the ranks' start: %s.", strerror(errno));
      ok = 0;
    } else {
      close(gate[0]);
      gate[0] = rd;
    }
  }
  se.gate = gate[0];
  if (ok && launch_spawn_env_make(&se, sp, true) != 0) {
    launch_msg("cannot prepare the ranks' start: %s.", strerror(errno));
    ok = 0;
  }
  if (!ok) {
    if (gate[0] >= 0) close_pair(gate);
    launch_spawn_env_free(&se);
    run_free(&rn);
    return 1;
  }
  fflush(NULL);
  int rc = -1;
  rn.sp = sp;
  for (int r = 0; r < n && rc < 0; r++) {
    if (sp->host_prefix && sp->rank_host)
      snprintf(rn.kids[r].prefix, sizeof rn.kids[r].prefix, "[%d %s] ", r, sp->rank_host[r]);
    else
      snprintf(rn.kids[r].prefix, sizeof rn.kids[r].prefix, "[%d] ", r);
    rn.kids[r].rn = &rn;
    bool cannot_run = false;
    if (start_child(sp, &se, &rn.kids[r], r, &cannot_run) == 0) {
      rn.alive++;
      if (watch_child(&rn, &rn.kids[r]) == 0) continue;
      rn.n = r + 1; /* it is started: stopped and reaped with the others */
    } else {
      rn.n = r;
    }
    int e = errno;
    signal_all(&rn, SIGKILL); /* before the gate opens: none of them gets past init */
    if (cannot_run) {
      rc = launch_spawn_cannot_run(sp, r, e);
      if (r > 0) launch_msg("stopping the %d rank%s started.", r, r == 1 ? "" : "s");
    } else {
      launch_msg("cannot start rank %d: %s; stopping the others.", r, strerror(e));
      rc = 1;
    }
    rn.name_ranks = false;
  }
  if (gate[1] >= 0) {
    if (rc < 0) { /* the gate opens: the ranks' init goes on */
      ssize_t w;
      do {
        w = write(gate[1], "g", 1);
      } while (w < 0 && errno == EINTR);
      if (w != 1) { /* cannot happen to an empty pipe whose read end is open (gate[0]) */
        launch_msg("cannot open the ranks' gate: %s; stopping them.", strerror(errno));
        signal_all(&rn, SIGKILL);
        rc = 1;
      }
    }
    close_pair(gate);
  }
  if (rc < 0) {
    if (sp->started && sp->start_timeout > 0) rn.start_deadline = mlxd_now() + sp->start_timeout;
    if (sp->failed) rn.rdv_check_at = mlxd_now() + LAUNCH_RDV_CHECK_S;
    rc = supervise(&rn, timeout);
  } else {
    supervise(&rn, 0);
  }
  launch_spawn_env_free(&se);
  run_free(&rn);
  return rc;
}

int launch_one(const launch_spawn* sp, int sfd, double timeout) {
  run rn;
  launch_spawn_env se = {.gate = -1};
  int ok = run_init(&rn, 1, sfd, false) == 0; /* said why when not */
  if (ok && launch_spawn_env_make(&se, sp, false) != 0) {
    launch_msg("cannot prepare the start of %s: %s.", sp->argv[0], strerror(errno));
    ok = 0;
  }
  if (!ok) {
    launch_spawn_env_free(&se);
    run_free(&rn);
    return 1;
  }
  fflush(NULL);
  int rc = 1;
  bool cannot_run = false;
  if (start_child(sp, &se, &rn.kids[0], -1, &cannot_run) != 0) {
    if (cannot_run)
      rc = launch_spawn_cannot_run(sp, -1, errno);
    else
      launch_msg("cannot start %s: %s.", sp->argv[0], strerror(errno));
  } else {
    rn.alive = 1;
    if (watch_child(&rn, &rn.kids[0]) != 0) {
      launch_msg("cannot watch %s's output: %s.", sp->argv[0], strerror(errno));
      signal_all(&rn, SIGKILL);
      supervise(&rn, 0);
    } else {
      rc = supervise(&rn, timeout);
    }
  }
  launch_spawn_env_free(&se);
  run_free(&rn);
  return rc;
}
