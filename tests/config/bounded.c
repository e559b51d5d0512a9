#include "bounded.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct child_spec {
  int (*fn)(void*);
  void* arg;
  char* const* argv;
  const char* const* env;
} child_spec;

static void run_child(const child_spec* c, bounded_result* r) {
  int p[2];
  T_ASSERT(pipe(p) == 0);
  fflush(stdout);
  fflush(stderr);
  double t0 = now_s();
  pid_t pid = fork();
  T_ASSERT(pid >= 0);
  if (pid == 0) {
    close(p[0]);
    dup2(p[1], 1);
    dup2(p[1], 2);
    close(p[1]);
    if (c->fn) {
      int rc = c->fn(c->arg);
      fflush(stdout);
      fflush(stderr);
      _exit(rc);
    }
    for (const char* const* e = c->env; e && *e; e++) putenv((char*)*e);
    execv(c->argv[0], c->argv);
    fprintf(stderr, "exec %s: %s\n", c->argv[0], strerror(errno));
    _exit(127);
  }
  close(p[1]);
  size_t n = 0;
  bool killed = false;
  for (;;) {
    double left = BOUND_S - (now_s() - t0);
    if (left <= 0) {
      kill(pid, SIGKILL);
      killed = true;
      break;
    }
    struct pollfd pf = {p[0], POLLIN, 0};
    int pr = poll(&pf, 1, (int)(left * 1000) + 1);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) continue;
    ssize_t k = read(p[0], r->out + n, sizeof r->out - 1 - n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    n += (size_t)k;
    if (n == sizeof r->out - 1) break;
  }
  r->out[n] = '\0';
  close(p[0]);
  int ws = 0;
  while (waitpid(pid, &ws, 0) < 0 && errno == EINTR) {
  }
  r->seconds = now_s() - t0;
  r->status = killed ? -1 : WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

void bounded_call(int (*fn)(void* arg), void* arg, bounded_result* r) {
  child_spec c = {fn, arg, NULL, NULL};
  run_child(&c, r);
}

void bounded_exec(char* const argv[], const char* const env[], bounded_result* r) {
  child_spec c = {NULL, NULL, argv, env};
  run_child(&c, r);
}

void write_file(const char* path, const char* text, size_t len) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  T_ASSERT(fd >= 0);
  size_t done = 0;
  while (done < len) {
    ssize_t k = write(fd, text + done, len - done);
    T_ASSERT(k > 0);
    done += (size_t)k;
  }
  close(fd);
}
