/* Listening sockets (net.h): a rank's listener on its address, the listeners
 * of a bootstrapped rank (ephemeral ports or MLXDIST_PORT_RANGE), and the
 * socket options every connection of the mesh gets (sock.h). */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/net.h"
#include "net/sock.h"

#define SOCK_BUF_BYTES (4 << 20)

void mlxd_net_close_all(int* fds, int n) {
  for (int i = 0; i < n; i++) {
    if (fds[i] >= 0) close(fds[i]);
    fds[i] = -1;
  }
}

void mlxd_net_sock_buffers(int fd) {
  int v = SOCK_BUF_BYTES;
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof v);
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof v);
}

void mlxd_net_sock_nodelay(int fd) {
  int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int mlxd_net_sock_nonblock(int fd, bool on) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0) return -1;
  return fcntl(fd, F_SETFL, on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK));
}

/* A failed system call while setting up this rank's own sockets. */
static int setup_fail_sys(mlxd_status* st, const char* what, const char* addr, const char* call,
                          int err) {
  mlxd_fail_at(st, MLXD_ESYS, MLXD_LAYER_BOOTSTRAP, "%s %s", what, addr);
  mlxd_status_set_sys(st, call, err);
  return MLXD_ESYS;
}

int mlxd_net_listen(mlxd_net_addr* addr, int* fd_out, mlxd_status* st) {
  *fd_out = -1;
  /* non-blocking: the mesh loop accepts until the queue is empty */
  int fd = socket(addr->sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return setup_fail_sys(st, "cannot create a socket to listen on", addr->text, "socket", errno);
  int one = 1;
  (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  mlxd_net_sock_buffers(
      fd); /* inherited by accepted sockets; must precede listen for window scaling */
  if (bind(fd, (struct sockaddr*)&addr->sa, addr->len) != 0) {
    int e = errno;
    close(fd);
    /* EADDRINUSE: another process listens there (another job with the same
     * hostfile?): the bind exclusivity that keeps two such jobs apart. */
    return setup_fail_sys(st, "cannot bind this rank's listen address", addr->text, "bind", e);
  }
  if (listen(fd, LISTEN_BACKLOG) != 0) {
    int e = errno;
    close(fd);
    return setup_fail_sys(st, "cannot listen on", addr->text, "listen", e);
  }
  socklen_t len = sizeof addr->sa;
  if (getsockname(fd, (struct sockaddr*)&addr->sa, &len) == 0) {
    addr->len = len;
    mlxd_net_format_addr((struct sockaddr*)&addr->sa, addr->text, sizeof addr->text);
  }
  mlxd_net_log("listening on %s", addr->text);
  *fd_out = fd;
  return 0;
}

int mlxd_net_listen_many(const mlxd_net_addr* host, int nconn, int* lfds, mlxd_net_addr* addrs,
                         mlxd_status* st) {
  for (int c = 0; c < nconn; c++) lfds[c] = -1;
  unsigned lo, hi; /* MLXDIST_PORT_RANGE (endpoint.c) */
  if (mlxd_net_port_range(&lo, &hi, st)) return st->code;
  for (int c = 0; c < nconn; c++) {
    addrs[c] = *host;
    if (addrs[c].sa.ss_family == AF_INET)
      ((struct sockaddr_in*)(void*)&addrs[c].sa)->sin_port = 0;
    else
      ((struct sockaddr_in6*)(void*)&addrs[c].sa)->sin6_port = 0;
    if ((lo ? mlxd_net_listen_in_range(&addrs[c], lo, hi, &lfds[c], st)
            : mlxd_net_listen(&addrs[c], &lfds[c], st)) != 0) {
      mlxd_net_close_all(lfds, nconn);
      return st->code;
    }
  }
  return 0;
}
