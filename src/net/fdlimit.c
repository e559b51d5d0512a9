/* File descriptor limits (net.h, sock.h): RLIMIT_NOFILE raised to what a
 * group's connections need, and the limit's text for the messages of a
 * socket() or accept() that ran short. */
#include <errno.h>
#include <stdio.h>
#include <sys/resource.h>

#include "net/net.h"
#include "net/sock.h"

/* The open-file limit, for the messages of a failed socket() or accept(). */
void mlxd_net_nofile_text(char* buf, size_t n) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
    snprintf(buf, n, "RLIMIT_NOFILE unknown");
    return;
  }
  snprintf(buf, n, "RLIMIT_NOFILE soft %llu, hard %llu", (unsigned long long)rl.rlim_cur,
           (unsigned long long)rl.rlim_max);
}

bool mlxd_net_short_of_fds(int e) {
  return e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM;
}

int mlxd_net_nofile(int size, int nconn, bool lazy, mlxd_status* st) {
  long pend = (long)size * nconn;
  if (pend < MAX_PENDING) pend = MAX_PENDING;
  if (pend > PENDING_CAP) pend = PENDING_CAP;
  /* every connection, the pending handshakes, listeners, and room for the rest of the process */
  rlim_t need = (rlim_t)size * (rlim_t)nconn + (rlim_t)pend + 256;
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0; /* unknown: socket() will say */
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur >= need) return 0;
  if (rl.rlim_cur == RLIM_INFINITY) return 0;
  rlim_t want = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need ? need : rl.rlim_max;
  if (want > rl.rlim_cur) {
    struct rlimit nl = {want, rl.rlim_max};
    if (setrlimit(RLIMIT_NOFILE, &nl) == 0) {
      mlxd_net_log("raised RLIMIT_NOFILE from %llu to %llu (%d ranks x %d connection(s))",
                   (unsigned long long)rl.rlim_cur, (unsigned long long)want, size, nconn);
      rl.rlim_cur = want;
    }
  }
  if (rl.rlim_cur >= need || lazy) return 0; /* lazy: only the connections used count */
  return mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP,
                      "a full mesh of %d ranks x %d connection(s) needs about %llu file "
                      "descriptors, but RLIMIT_NOFILE allows %llu (hard limit %llu): raise it "
                      "(ulimit -n) or use MLXDIST_CONNECT=lazy",
                      size, nconn, (unsigned long long)need, (unsigned long long)rl.rlim_cur,
                      (unsigned long long)rl.rlim_max);
}
