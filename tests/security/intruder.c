/* intruder.h: helpers shared by the trust tests. */
#include "intruder.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

char* read_text(const char* path) {
  FILE* f = fopen(path, "r");
  if (!f) return calloc(1, 1);
  char* buf = calloc(1, 1 << 20);
  T_ASSERT(buf);
  size_t n = fread(buf, 1, (1 << 20) - 1, f);
  buf[n] = '\0';
  fclose(f);
  return buf;
}

int wait_child(pid_t p, double limit) {
  double until = now_s() + limit;
  for (;;) {
    int st;
    if (waitpid(p, &st, WNOHANG) == p) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (now_s() > until) {
      kill(p, SIGKILL);
      waitpid(p, &st, 0);
      return -1;
    }
    sleep_s(0.01);
  }
}

int dial(int port) {
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  for (int i = 0; i < 200; i++) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    T_ASSERT(fd >= 0);
    if (connect(fd, (struct sockaddr*)&a, sizeof a) == 0) return fd;
    close(fd);
    sleep_s(0.01);
  }
  T_FAIL("cannot connect to port %d", port);
}

#define KEEP_MAX 1024
static int g_open[KEEP_MAX];
static int g_nopen;

void keep(int fd) {
  T_ASSERT(g_nopen < KEEP_MAX);
  g_open[g_nopen++] = fd;
}

void close_kept(void) {
  for (int i = 0; i < g_nopen; i++) close(g_open[i]);
  g_nopen = 0;
}

void send_all(int fd, const void* b, size_t n) {
  T_ASSERT(send(fd, b, n, MSG_NOSIGNAL) == (ssize_t)n);
}

void send_garbage(int port) {
  int a = dial(port);
  send_all(a, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27);
  keep(a);
  int b = dial(port);
  unsigned char junk[300];
  for (size_t i = 0; i < sizeof junk; i++) junk[i] = (unsigned char)(i * 131 + 7);
  send_all(b, junk, sizeof junk);
  keep(b);
}

int own_socket_inodes(long* out, int max) {
  int n = 0;
  DIR* d = opendir("/proc/self/fd");
  if (!d) return 0;
  struct dirent* e;
  while ((e = readdir(d)) && n < max) {
    char p[300], l[64];
    snprintf(p, sizeof p, "/proc/self/fd/%s", e->d_name);
    ssize_t k = readlink(p, l, sizeof l - 1);
    if (k <= 0) continue;
    l[k] = '\0';
    long ino;
    if (sscanf(l, "socket:[%ld]", &ino) == 1) out[n++] = ino;
  }
  closedir(d);
  return n;
}
