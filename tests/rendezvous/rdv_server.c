/* Drives the launcher's rendezvous server (tools/launch/rendezvous.c) on its
 * own, for the tests of tests/rendezvous:
 *
 *   rdv_server N TOKEN BIND_IP PORT_RANGE|- TIMEOUT_S [HOST_OF_RANK...]
 *       start it, print "ADDR ip:port" on stdout, wait until every rank got
 *       the result (exit 0) or the server gave up (exit 1, after TIMEOUT_S +
 *       a little), then stop it; with RDV_LINGER=S, keep serving (ranks that
 *       init again, late ranks) until SIGTERM or S seconds.
 *   rdv_server hold IP PORT_LO PORT_HI SECONDS
 *       listen on every port of PORT_LO..PORT_HI of IP (busy ports for the
 *       MLXDIST_PORT_RANGE tests), print "HELD", sleep, exit. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "launch.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int hold(const char* ip, int lo, int hi, int seconds) {
  for (int p = lo; p <= hi; p++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p)};
    if (fd < 0 || inet_pton(AF_INET, ip, &a.sin_addr) != 1 ||
        bind(fd, (struct sockaddr*)&a, sizeof a) != 0 || listen(fd, 1) != 0) {
      fprintf(stderr, "rdv_server hold: cannot listen on %s:%d\n", ip, p);
      return 1;
    }
  }
  printf("HELD\n");
  fflush(stdout);
  sleep((unsigned)seconds);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 6 && strcmp(argv[1], "hold") == 0)
    return hold(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
  if (argc < 6) {
    fprintf(stderr,
            "usage: rdv_server N TOKEN BIND_IP PORT_RANGE|- TIMEOUT_S [HOST...]\n"
            "       rdv_server hold IP PORT_LO PORT_HI SECONDS\n");
    return 2;
  }
  int n = atoi(argv[1]);
  double timeout = atof(argv[5]);
  const char* const* hosts = argc > 6 ? (const char* const*)(argv + 6) : NULL;
  if (hosts && argc - 6 != n) {
    fprintf(stderr, "rdv_server: %d hosts for %d ranks\n", argc - 6, n);
    return 2;
  }
  char addr[128];
  const char* range = strcmp(argv[4], "-") == 0 ? NULL : argv[4];
  double t0 = now_s();
  launch_rdv* r = launch_rdv_start(n, argv[2], argv[3], range, timeout, hosts, addr, sizeof addr);
  if (!r) return 1;
  printf("ADDR %s\n", addr);
  fflush(stdout);
  while (!launch_rdv_done(r) && !launch_rdv_failed(r) && now_s() - t0 < timeout + 1.5)
    usleep(10000);
  if (launch_rdv_failed(r)) fprintf(stderr, "rdv_server: failed after %.2f s\n", now_s() - t0);
  bool done = launch_rdv_done(r);
  fprintf(stderr, "rdv_server: %s after %.2f s\n", done ? "done" : "not done", now_s() - t0);
  /* RDV_LINGER=S: keep serving (ranks that init again, or late ones after a failure) until
   * SIGTERM, at most S seconds */
  const char* linger = getenv("RDV_LINGER");
  if (linger) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigprocmask(SIG_BLOCK, &set, NULL);
    struct timespec ts = {atoi(linger), 0};
    sigtimedwait(&set, NULL, &ts);
  }
  launch_rdv_stop(r);
  return done ? 0 : 1;
}
