/* The launcher's gate: see launch_gate.h. */
#include "distributed/launch_gate.h"

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/tunables.h"

#define GATE_FD_MAX (1 << 24) /* above any fd a process may have (fs.nr_open's ceiling) */

/* The first call's verdict: 0 not decided, 1 pass, -1 fail (with its status). */
static int g_state;
static mlxd_status g_verdict;

/* A decimal number of at most 19 digits at *p (advanced past it) into *out; -1 if none. */
static int parse_num(const char** p, uint64_t* out) {
  const char* s = *p;
  uint64_t v = 0;
  int k = 0;
  for (; *s >= '0' && *s <= '9'; s++, k++) {
    if (k >= 19) return -1; /* fits in 64 bits */
    v = v * 10 + (uint64_t)(*s - '0');
  }
  if (k == 0) return -1;
  *p = s;
  *out = v;
  return 0;
}

/* FD:INODE from text: 0, or -1 (not two decimal numbers, FD not in [3, GATE_FD_MAX]). */
static int parse_gate(const char* text, int* fd, uint64_t* ino) {
  uint64_t f;
  const char* p = text;
  if (parse_num(&p, &f) != 0 || *p++ != ':' || parse_num(&p, ino) != 0 || *p != '\0') return -1;
  if (f < 3 || f > GATE_FD_MAX) return -1;
  *fd = (int)f;
  return 0;
}

static int gate_wait(int fd, mlxd_status* st) {
  double to = MLXD_LAUNCH_GATE_TIMEOUTS * mlxd_tunable_double(MLXD_T_CONNECT_TIMEOUT);
  double deadline = mlxd_now() + to;
  for (;;) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, mlxd_ms_left(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      return mlxd_fail(st, MLXD_ESYS,
                       "[distributed] init: cannot wait for mlxdist-launch's gate "
                       "(MLXDIST_LAUNCH_GATE, fd %d): poll: %s",
                       fd, strerror(errno));
    if (r > 0 && (p.revents & POLLIN)) return 0; /* the byte: every rank is started */
    if (r > 0)
      return mlxd_fail(st, MLXD_EREMOTE,
                       "[distributed] init: mlxdist-launch closed its gate (MLXDIST_LAUNCH_GATE) "
                       "without opening it: the launcher died or could not start every rank "
                       "(see its messages), so this rank does not start its job");
    if (mlxd_now() >= deadline)
      return mlxd_fail(st, MLXD_ETIMEDOUT,
                       "[distributed] init: mlxdist-launch did not open its gate "
                       "(MLXDIST_LAUNCH_GATE: every rank started) within %g s (%d x "
                       "MLXDIST_CONNECT_TIMEOUT); is the launcher stopped?",
                       to, MLXD_LAUNCH_GATE_TIMEOUTS);
  }
}

static int gate_decide(mlxd_status* st) {
  const char* v = mlxd_tunable_str(MLXD_T_LAUNCH_GATE);
  if (!v || !*v) return 0;
  int fd;
  uint64_t ino;
  if (parse_gate(v, &fd, &ino) != 0)
    return mlxd_fail(st, MLXD_EINVAL,
                     "[distributed] init: MLXDIST_LAUNCH_GATE='%.60s' is not a launcher's gate "
                     "(expected FD:INODE, two decimal numbers with FD from 3 to %d, as "
                     "mlxdist-launch sets it)",
                     v, GATE_FD_MAX);
  struct stat sb;
  const char* why = NULL;
  if (fstat(fd, &sb) != 0)
    why = "is not open";
  else if (!S_ISFIFO(sb.st_mode))
    why = "is not a pipe";
  else if ((uint64_t)sb.st_ino != ino)
    why = "is another pipe";
  if (why) { /* not this process's gate: a program its rank started after init, say */
    fprintf(stderr,
            "mlxdist: warning: MLXDIST_LAUNCH_GATE='%s': fd %d %s, so it is not the launcher's "
            "gate; init goes on without waiting for it\n",
            v, fd, why);
    return 0;
  }
  /* the fd stays open: the byte stays in the pipe, so a process this rank starts later
   * (which inherits the fd and the variable) passes at once */
  return gate_wait(fd, st);
}

int mlxd_launch_gate_pass(mlxd_status* st) {
  if (g_state == 0) {
    mlxd_status_clear(&g_verdict);
    g_state = gate_decide(&g_verdict) == 0 ? 1 : -1;
  }
  if (g_state > 0) return 0;
  *st = g_verdict;
  return st->code;
}
