/* gcc -O2 -o copyrate docs/perf/gather/copyrate.c && ./copyrate */
/* memcpy vs process_vm_readv between two processes, per size: GB/s (best of reps). */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
int main(void) {
  size_t sizes[] = {4096, 65536, 131072, 1 << 20, 2 << 20, 16 << 20, 64 << 20};
  size_t maxs = 64 << 20;
  char* src = mmap(NULL, maxs, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  memset(src, 1, maxs);
  int pfd[2];
  pipe(pfd);
  pid_t c = fork();
  if (c == 0) {
    pause();
    _exit(0);
  } /* the child holds a copy-on-write-free shared view */
  char* dst = malloc(maxs);
  memset(dst, 2, maxs);
  char* dst2 = malloc(maxs);
  memset(dst2, 2, maxs);
  for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
    size_t n = sizes[k];
    int reps = (int)((256u << 20) / n);
    if (reps > 2000) reps = 2000;
    if (reps < 3) reps = 3;
    double bm = 1e9, bc = 1e9, bm2 = 1e9;
    for (int r = 0; r < reps; r++) {
      double t0 = now();
      memcpy(dst, src, n);
      double t1 = now();
      if (t1 - t0 < bm) bm = t1 - t0;
      t0 = now();
      memcpy(dst2, dst, n);
      memcpy(dst, dst2, n);
      t1 = now();
      if (t1 - t0 < bm2) bm2 = t1 - t0;
      struct iovec l = {dst, n}, rm = {src, n};
      t0 = now();
      ssize_t got = process_vm_readv(c, &l, 1, &rm, 1, 0);
      t1 = now();
      if (got != (ssize_t)n) {
        perror("process_vm_readv");
        return 1;
      }
      if (t1 - t0 < bc) bc = t1 - t0;
    }
    printf(
        "%9zu B: memcpy %6.2f us (%5.1f GB/s)  2x memcpy %6.2f us  process_vm_readv %6.2f us "
        "(%5.1f GB/s)\n",
        n, bm * 1e6, n / bm / 1e9, bm2 * 1e6, bc * 1e6, n / bc / 1e9);
  }
  kill(c, 9);
  waitpid(c, NULL, 0);
  return 0;
}
