/* Shared by the shm tests and the timing program: fork N real processes,
 * run one function per rank, collect exit statuses with a deadline. */
#ifndef MLXD_SHM_TEST_HARNESS_H
#define MLXD_SHM_TEST_HARNESS_H

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int (*h_rank_fn)(int rank, int size, const char* name, void* arg);

static inline double h_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A session name nobody else uses. */
static inline void h_session_name(char* buf, size_t n, const char* what) {
  static unsigned counter;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  snprintf(buf, n, "mlxdist-test-%s-%d-%u-%lx", what, (int)getpid(), counter++,
           (unsigned long)ts.tv_nsec ^ ((unsigned long)ts.tv_sec << 20));
}

/* Fork size ranks running fn; returns the exit status of each in codes[]
 * (128 + signal if killed). Ranks still alive after timeout_s are killed.
 * Returns 0 if every rank exited with 0. */
static inline int h_run(int size, double timeout_s, h_rank_fn fn, void* arg, int* codes) {
  char name[128];
  h_session_name(name, sizeof name, "s");
  pid_t pids[64];
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < size; r++) {
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      exit(1);
    }
    if (pid == 0) {
      int rc = fn(r, size, name, arg);
      fflush(stdout);
      fflush(stderr);
      _exit(rc);
    }
    pids[r] = pid;
    codes[r] = -1;
  }
  double deadline = h_now() + timeout_s;
  int left = size;
  while (left > 0) {
    int status;
    pid_t p = waitpid(-1, &status, WNOHANG);
    if (p > 0) {
      for (int r = 0; r < size; r++)
        if (pids[r] == p) {
          codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          left--;
        }
      continue;
    }
    if (h_now() > deadline) {
      for (int r = 0; r < size; r++)
        if (codes[r] == -1) {
          fprintf(stderr, "harness: rank %d (pid %d) still running after %g s; killing it\n", r,
                  (int)pids[r], timeout_s);
          kill(pids[r], SIGKILL);
        }
      timeout_s = 1e9;
      deadline = h_now() + 10;
    }
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, NULL);
  }
  int bad = 0;
  for (int r = 0; r < size; r++) bad |= codes[r] != 0;
  return bad;
}

#endif
